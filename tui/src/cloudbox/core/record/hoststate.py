"""The host's state that moves figures on real hardware, read from /sys and /proc (and `ethtool` where there is one)
for a run's provenance, and what differs between two runs' hosts.

What is read: the CPU frequency governor and driver, turbo (boost), SMT, the C-state (cpuidle) driver and the
deepest idle state allowed, transparent huge pages, the NUMA layout, the kernel command line with the CPU
vulnerabilities' mitigations, the microcode revision, the run's disk (model, firmware, I/O scheduler, of each disk
under a partition, an LVM or an md array) and the NIC of the default route (driver, firmware, link speed,
offloads). A fact the host does not expose (no cpufreq in a VM, no ethtool) reads "not read" with the reason,
never a guess.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict

NOT_READ = "not read"
NO_CPUFREQ = "no cpufreq"  # a VM, or no frequency driver loaded: no governor, no frequency driver
# The offloads that change a network figure (ethtool -k's names), in the order shown.
OFFLOADS = ("rx-checksumming", "tx-checksumming", "scatter-gather", "tcp-segmentation-offload",
            "generic-segmentation-offload", "generic-receive-offload", "large-receive-offload")

Ethtool = Callable[[list[str]], str | None]  # ethtool's output for these arguments; None where it cannot run


class _Fact(BaseModel):
    model_config = ConfigDict(extra="ignore")


class DiskState(_Fact):
    """One disk under the run's store: its kernel name, model, firmware revision and I/O scheduler."""

    name: str
    model: str = NOT_READ
    firmware: str = NOT_READ
    scheduler: str = NOT_READ


class NicState(_Fact):
    """The NIC of the host's default route: its driver, firmware, link speed and offloads."""

    name: str
    driver: str = NOT_READ
    firmware: str = NOT_READ
    speed: str = NOT_READ
    offloads: dict[str, str] = {}  # ethtool -k's OFFLOADS; empty when ethtool could not tell
    offloads_note: str = ""  # why the offloads were not read


class HostState(_Fact):
    """The host's state as a run found it."""

    governor: str = NOT_READ
    freq_driver: str = NOT_READ
    turbo: str = NOT_READ
    smt: str = NOT_READ
    cstate_driver: str = NOT_READ
    deepest_cstate: str = NOT_READ
    thp: str = NOT_READ
    numa: str = NOT_READ
    cmdline: str = NOT_READ
    mitigations: dict[str, str] = {}  # /sys/devices/system/cpu/vulnerabilities: each one's state
    microcode: str = NOT_READ
    disks: list[DiskState] = []
    nic: NicState | None = None

    def lines(self) -> list[str]:
        """The state as `results show` lists it: (what, value) pairs joined per line."""
        freq = (f"frequency {NO_CPUFREQ} (a VM, or no frequency driver)" if self.governor == NO_CPUFREQ
                else f"governor {self.governor} ({self.freq_driver})")
        cpu = (f"{freq}, turbo {self.turbo}, SMT {self.smt}, idle "
               f"{self.cstate_driver} (deepest allowed: {self.deepest_cstate}), microcode {self.microcode}")
        out = [cpu, f"THP {self.thp}; NUMA {self.numa}", f"kernel command line: {self.cmdline}"]
        if self.mitigations:
            out.append("mitigations: " + mitigation_summary(self.mitigations))
        for d in self.disks:
            out.append(f"disk {d.name}: {d.model}, firmware {d.firmware}, scheduler {d.scheduler}")
        if self.nic is not None:
            n = self.nic
            off = (", ".join(f"{k} {v}" for k, v in n.offloads.items()) if n.offloads
                   else f"{NOT_READ}" + (f" ({n.offloads_note})" if n.offloads_note else ""))
            out.append(f"NIC {n.name}: {n.driver}, firmware {n.firmware}, {n.speed}; offloads {off}")
        return out

    def flat(self) -> dict[str, str]:
        """Every fact by the name `differences` gives it: "governor", "disk sda scheduler", "NIC eno1 tso"."""
        out = {name: getattr(self, key) for key, name in _NAMES.items()}
        out.update({f"mitigation {k}": v for k, v in self.mitigations.items()})
        for d in self.disks:
            out.update({f"disk {d.name} {k}": getattr(d, k) for k in ("model", "firmware", "scheduler")})
        if self.nic is not None:
            n = self.nic
            out.update({f"NIC {k}": getattr(n, k) for k in ("name", "driver", "firmware", "speed")})
            out.update({f"NIC offload {k}": v for k, v in n.offloads.items()})
        return out


_NAMES = {"governor": "CPU governor", "freq_driver": "CPU frequency driver", "turbo": "turbo", "smt": "SMT",
          "cstate_driver": "C-state driver", "deepest_cstate": "deepest C-state", "thp": "THP", "numa": "NUMA",
          "cmdline": "kernel command line", "microcode": "microcode"}


def differences(a: HostState, b: HostState) -> list[str]:
    """What differs between two hosts' states, one "what: a / b" each (a fact one of them did not read counts as
    differing only when the other read it)."""
    fa, fb = a.flat(), b.flat()
    out = []
    for key in dict.fromkeys([*fa, *fb]):
        va, vb = fa.get(key, "-"), fb.get(key, "-")
        if va != vb:
            out.append(f"{key}: {va} / {vb}")
    return out


def mitigation_summary(vulns: dict[str, str]) -> str:
    """"11 mitigated, 5 not affected, 1 vulnerable (mmio_stale_data)": the vulnerabilities' states counted."""
    groups: dict[str, list[str]] = {"mitigated": [], "not affected": [], "vulnerable": []}
    for name, state in sorted(vulns.items()):
        word = state.split(":")[0].strip().lower()
        kind = "mitigated" if word == "mitigation" else "not affected" if word == "not affected" else \
            "vulnerable" if word.startswith("vulnerable") else word or "unknown"
        groups.setdefault(kind, []).append(name)
    return ", ".join(f"{len(names)} {kind}" + (f" ({', '.join(names)})" if kind == "vulnerable" else "")
                     for kind, names in groups.items() if names)


# --------------------------------------------------------------------------------------------- reading
def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return None


def _bracketed(text: str | None) -> str | None:
    """The selected value of a sysfs choice line: "always [madvise] never" -> "madvise"."""
    if text is None:
        return None
    m = re.search(r"\[([^\]]+)\]", text)
    return m.group(1) if m else text


def read_host_state(*, sysfs: Path = Path("/sys"), proc: Path = Path("/proc"), disk: str | None = None,
                    ethtool: Ethtool | None = None) -> HostState:
    """This host's state; `disk` the run's block device (its kernel name: the disks under it are read), `ethtool`
    what runs ethtool (default: the host's, when installed)."""
    cpu = sysfs / "devices/system/cpu"
    cmdline = _read(proc / "cmdline") or NOT_READ
    return HostState(
        governor=_per_cpu(cpu, "cpufreq/scaling_governor", NO_CPUFREQ),
        freq_driver=_per_cpu(cpu, "cpufreq/scaling_driver", NO_CPUFREQ),
        turbo=_turbo(cpu), smt=_smt(cpu), cstate_driver=_read(cpu / "cpuidle/current_driver") or "no cpuidle",
        deepest_cstate=_deepest_cstate(cpu, cmdline),
        thp=_thp(sysfs / "kernel/mm/transparent_hugepage"), numa=_numa(sysfs / "devices/system/node"),
        cmdline=cmdline, mitigations=_mitigations(cpu / "vulnerabilities"), microcode=_microcode(cpu, proc),
        disks=[_disk(sysfs, d) for d in under_disks(sysfs, disk)] if disk else [],
        nic=_nic(sysfs, proc, ethtool if ethtool is not None else _ethtool))


def _cpus(cpu: Path) -> list[Path]:
    return sorted((p for p in cpu.glob("cpu[0-9]*") if p.name[3:].isdigit()), key=lambda p: int(p.name[3:]))


def _per_cpu(cpu: Path, rel: str, none: str) -> str:
    """A per-CPU setting: its one value, or each value with how many CPUs have it ("performance 6, powersave 2")."""
    counts: dict[str, int] = {}
    for c in _cpus(cpu):
        v = _read(c / rel)
        if v is not None:
            counts[v] = counts.get(v, 0) + 1
    if not counts:
        return none
    if len(counts) == 1:
        return next(iter(counts))
    return ", ".join(f"{v} on {n} CPUs" for v, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def _turbo(cpu: Path) -> str:
    no_turbo = _read(cpu / "intel_pstate/no_turbo")
    if no_turbo is not None:
        return "off" if no_turbo == "1" else "on"
    boost = _read(cpu / "cpufreq/boost")
    if boost is not None:
        return "on" if boost == "1" else "off"
    return f"{NOT_READ} (no intel_pstate/no_turbo or cpufreq/boost)"


def _smt(cpu: Path) -> str:
    control, active = _read(cpu / "smt/control"), _read(cpu / "smt/active")
    if control is None:
        return f"{NOT_READ} (no smt/control)"
    return control + (f", {'active' if active == '1' else 'inactive'}" if active is not None else "")


def _deepest_cstate(cpu: Path, cmdline: str) -> str:
    """The deepest idle state cpu0 may enter (its last state not disabled), and a limit the command line sets."""
    states = sorted((cpu / "cpu0/cpuidle").glob("state[0-9]*"), key=lambda p: int(p.name[5:]))
    allowed = [s for s in states if _read(s / "disable") != "1"]
    limits = [w for w in cmdline.split() if w.startswith(("intel_idle.max_cstate=", "processor.max_cstate=",
                                                            "idle=", "cpuidle.off="))]
    if not states:
        return "no idle states" + (f" ({', '.join(limits)})" if limits else "")
    last = allowed[-1] if allowed else None
    name = (_read(last / "name") or last.name) if last is not None else "none (all disabled)"
    latency = _read(last / "latency") if last is not None else None
    return name + (f", exit {latency} us" if latency else "") + (f" ({', '.join(limits)})" if limits else "")


def _thp(base: Path) -> str:
    enabled, defrag = _bracketed(_read(base / "enabled")), _bracketed(_read(base / "defrag"))
    if enabled is None:
        return f"{NOT_READ} (no transparent_hugepage)"
    return enabled + (f", defrag {defrag}" if defrag else "")


def _numa(nodes: Path) -> str:
    found = sorted((p for p in nodes.glob("node[0-9]*") if p.name[4:].isdigit()), key=lambda p: int(p.name[4:]))
    if not found:
        return f"{NOT_READ} (no /sys/devices/system/node)"
    parts = []
    for n in found:
        cpus = _read(n / "cpulist") or "?"
        mem = re.search(r"MemTotal:\s+(\d+) kB", _read(n / "meminfo") or "")
        parts.append(f"{n.name} CPUs {cpus}" + (f" {int(mem.group(1)) / 2**20:.1f} GiB" if mem else ""))
    return f"{len(found)} node{'s' if len(found) > 1 else ''}: " + "; ".join(parts)


def _mitigations(vulns: Path) -> dict[str, str]:
    return {p.name: v for p in sorted(vulns.glob("*")) if (v := _read(p)) is not None}


def _microcode(cpu: Path, proc: Path) -> str:
    version = _read(cpu / "cpu0/microcode/version")
    if version:
        return version
    for line in (_read(proc / "cpuinfo") or "").splitlines():
        if line.startswith("microcode"):
            return line.split(":", 1)[1].strip()
    return f"{NOT_READ} (no microcode in /proc/cpuinfo: a VM or a CPU that does not say)"


def under_disks(sysfs: Path, name: str) -> list[str]:
    """The disks under a block device: a partition's disk, an LVM's or md array's members' disks, else itself."""
    seen: list[str] = []

    def walk(n: str, depth: int = 0) -> None:
        base = sysfs / "class/block" / n
        if depth > 8 or not base.exists():
            if n not in seen and depth == 0:
                seen.append(n)
            return
        if (base / "partition").exists():
            walk(base.resolve().parent.name, depth + 1)
            return
        slaves = sorted(p.name for p in (base / "slaves").glob("*"))
        if slaves:
            for s in slaves:
                walk(s, depth + 1)
        elif n not in seen:
            seen.append(n)

    walk(name)
    return seen


def _disk(sysfs: Path, name: str) -> DiskState:
    base = sysfs / "class/block" / name
    model = " ".join(v for f in ("device/vendor", "device/model") if (v := _read(base / f)))
    if not model and name.startswith("loop"):
        model = "loop over " + (_read(base / "loop/backing_file") or "?")
    firmware = next((v for f in ("device/firmware_rev", "device/rev", "device/fw_rev") if (v := _read(base / f))),
                    None)
    scheduler = _bracketed(_read(base / "queue/scheduler"))
    return DiskState(name=name, model=model or f"{NOT_READ} (no device/model)",
                     firmware=firmware or f"{NOT_READ} (no device/firmware_rev or device/rev)",
                     scheduler=scheduler or NOT_READ)


def default_route_nic(proc: Path) -> str | None:
    """The interface of the IPv4 default route (/proc/net/route), or None."""
    for line in (_read(proc / "net/route") or "").splitlines()[1:]:
        f = line.split()
        if len(f) > 2 and f[1] == "00000000":
            return f[0]
    return None


def _nic(sysfs: Path, proc: Path, ethtool: Ethtool) -> NicState | None:
    name = default_route_nic(proc)
    if name is None:
        return None
    base = sysfs / "class/net" / name
    driver_link = base / "device/driver"
    driver = driver_link.resolve().name if driver_link.exists() else f"{NOT_READ} (no device driver: virtual)"
    speed = _read(base / "speed")
    speed_text = f"{speed} Mb/s" if speed and speed.lstrip("-").isdigit() and int(speed) > 0 else \
        f"link speed {NOT_READ}" + (" (the link is down)" if _read(base / "operstate") == "down" else "")
    info = ethtool(["-i", name])
    firmware = None
    if info is not None:
        firmware = next((ln.split(":", 1)[1].strip() for ln in info.splitlines()
                         if ln.startswith("firmware-version:")), None)
    features = ethtool(["-k", name])
    offloads: dict[str, str] = {}
    if features is not None:
        for ln in features.splitlines():
            key, _, value = ln.strip().partition(":")
            if key in OFFLOADS:
                offloads[key] = value.split()[0] if value.split() else "?"
    note = "" if offloads else ("no ethtool on this host" if info is None and features is None
                                else "ethtool -k named none of them")
    return NicState(name=name, driver=driver,
                    firmware=firmware or (f"{NOT_READ} (no ethtool)" if info is None else "none given"),
                    speed=speed_text, offloads={k: offloads[k] for k in OFFLOADS if k in offloads},
                    offloads_note=note)


def _ethtool(args: list[str]) -> str | None:
    """ethtool's output for `args`, or None where it is not installed or fails."""
    exe = shutil.which("ethtool") or next((p for p in ("/usr/sbin/ethtool", "/sbin/ethtool") if Path(p).exists()),
                                          None)
    if exe is None:
        return None
    try:
        r = subprocess.run([exe, *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout if r.returncode == 0 else None

