"""Decides which accelerator guests get: KVM only if a real kernel makes progress under it, else TCG.

/dev/kvm existing (and even KVM_CREATE_VM succeeding) proves nothing: on some hosts a vCPU never
leaves the kernel. So the probe boots the benchmark guest's own kernel under QEMU with -accel kvm:
no output at all (SeaBIOS's debug port, the serial port) within 30 s is a stuck vCPU; once the guest
runs, it may take minutes (nested, on a slow host) to print its banner. The answer is cached per boot.
Nested virtualization (this host itself a guest) is detected and recorded: numbers measured there
are labelled, as are TCG ones.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from .. import paths
from ..errors import CloudboxError
from ..procs import die_with_parent

# How long the test guest may show no sign of running (firmware or kernel output) before KVM counts as broken (a
# vCPU that never leaves the host kernel shows none); once it has spoken, twice that without a new byte (PVM's KVM on
# Intel hosts runs SeaBIOS and the kernel's decompressor, then spins; a loaded TCG host's decompression was silent
# for over 20 s). CLOUDBOX_KVM_PROBE_TIMEOUT overrides it (seconds).
PROBE_TIMEOUT_S = 30.0
# While it keeps printing, how long it may take to print its banner: nested KVM inside an emulated host can take
# minutes, and falling back to TCG there (emulation inside emulation) would leave the benchmark guest unable to boot.
PROBE_BANNER_LIMIT_S = 300.0
BANNER = b"Linux version"
_TCG_SUFFIX = "; using TCG emulation"


@dataclass
class Accelerator:
    name: str  # "kvm" | "nested-kvm" | "tcg" | "xen" (this host is Xen's dom0)
    domain_type: str  # libvirt <domain type=...>: "kvm" | "qemu" | "xen"
    emulated: bool  # True for TCG: numbers are not overhead figures
    nested: bool  # this host is itself a VM
    reason: str  # one line: why this accelerator was chosen
    probe_seconds: float | None = None

    @property
    def label(self) -> str:
        if self.name == "xen":
            return "Xen (in a VM, emulated)" if self.emulated else "Xen"
        if self.name == "tcg":
            return "TCG (emulated)"
        if self.name == "nested-kvm":
            return "KVM (nested)"
        return self.name.upper()

    @property
    def kvm_usable(self) -> bool:
        return self.domain_type == "kvm"

    @property
    def verdict(self) -> str:
        """One line for the appliance's console and self-test (cloudbox-kvm-probe.service writes it per boot)."""
        if self.kvm_usable:
            return f"kvm: usable ({self.label}: {self.reason})"
        if self.name == "xen":
            return f"kvm: not used ({self.reason}; runs take Xen profiles)"
        why = self.reason.removesuffix(_TCG_SUFFIX)
        return f"kvm: unusable ({why}), guests fall back to TCG (emulated)"


def host_is_virtualized() -> bool:
    """True when this host runs under a hypervisor (CPUID hypervisor bit, seen as a cpuinfo flag)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return " hypervisor" in line
    except OSError:
        pass
    return False


XEN_CAPABILITIES = Path("/proc/xen/capabilities")
DMI_DIR = Path("/sys/class/dmi/id")
# DMI vendors and products of virtual machines (sys_vendor, product_name): Xen under them runs on a virtual CPU.
_VM_DMI = ("QEMU", "KVM", "Bochs", "VMware", "VirtualBox", "innotek", "Microsoft Corporation", "Xen", "Amazon EC2",
           "Google", "OpenStack", "Parallels")


def booted_into_xen(capabilities: Path = XEN_CAPABILITIES) -> bool:
    """True on Xen's control domain (dom0): the appliance booted through its Xen entry."""
    try:
        return "control_d" in capabilities.read_text()
    except OSError:
        return False


def dmi_virtual_machine(dmi: Path = DMI_DIR) -> str | None:
    """'vendor product' when the firmware's DMI tables name a virtual machine, else None. Under Xen the CPUID
    hypervisor bit is Xen's own (dom0 is a PV guest), so the tables are what tells whether Xen itself runs in a VM."""
    def read(name: str) -> str:
        try:
            return (dmi / name).read_text().strip()
        except OSError:
            return ""

    vendor, product = read("sys_vendor"), read("product_name")
    if any(v.lower() in f"{vendor} {product}".lower() for v in _VM_DMI):
        return f"{vendor} {product}".strip()
    return None


def xen_accelerator(dmi: Path = DMI_DIR) -> Accelerator:
    """The accelerator of a host booted into Xen: its guests are Xen domains. When Xen itself runs in a virtual
    machine (QEMU TCG in the tests: an emulated CPU with emulated SVM) its guests' figures measure that emulation,
    and are labelled emulated and nested (the dom0 baseline then says virtualized-host)."""
    vm = dmi_virtual_machine(dmi)
    if vm:
        return Accelerator("xen", "xen", True, True,
                           f"booted into Xen (dom0), which itself runs in a virtual machine ({vm}): its guests run "
                           "on a virtual CPU (emulated under QEMU TCG), labelled emulated")
    return Accelerator("xen", "xen", False, False, "booted into Xen (dom0): guests are Xen domains (libxl)")


def dom0_facts() -> dict[str, str]:
    """dom0's vCPUs and memory (its own view: dom0 is a guest of Xen), and Xen's, as `xl info` (root) tells."""
    facts = {"dom0_vcpus": str(os.cpu_count() or "?")}
    try:
        kib = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemTotal:"))
        facts["dom0_memory"] = f"{kib // 1024} MiB"
    except (OSError, StopIteration, ValueError, IndexError):
        pass
    xl = shutil.which("xl")
    if xl is None:
        return facts
    try:
        out = subprocess.run([xl, "info"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return facts
    return {**facts, **parse_xl_info(out)}


def parse_xl_info(text: str) -> dict[str, str]:
    """The facts `cloudbox host` shows of `xl info`'s answer: Xen's version, total and free memory, dom0's share."""
    got = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            got[key.strip()] = value.strip()
    facts = {}
    if "xen_version" in got:
        facts["xen"] = got["xen_version"]
    if "total_memory" in got:
        facts["xen_memory"] = f"{got['total_memory']} MiB, {got.get('free_memory', '?')} MiB free for guests"
    if "nr_cpus" in got:
        facts["xen_cpus"] = got["nr_cpus"]
    if "virt_caps" in got:
        facts["xen_virt_caps"] = got["virt_caps"]
        lack = xen_hvm_lack(got["virt_caps"])
        facts["xen_guests"] = f"pv only ({lack}: pvh and hvm profiles are refused)" if lack else "pv, pvh, hvm"
    if "xen_commandline" in got:
        dom0 = [w for w in got["xen_commandline"].split() if w.startswith(("dom0_mem=", "dom0_max_vcpus="))]
        if dom0:
            facts["dom0_boot"] = " ".join(dom0)
    return facts


XEN_CAPS_SYSFS = Path("/sys/hypervisor/properties/capabilities")
# Xen guest types that run in a hardware-virtualized container (VT-x/AMD-V): PV alone needs none.
HVM_CLASS = ("pvh", "hvm")


def xen_hvm_lack(virt_caps: str) -> str:
    """What `xl info`'s virt_caps ("pv hvm hap shadow ...") lack for HVM-class guests, in a few words; "" when
    nothing. They need the hvm word (VT-x/AMD-V) and a paging mode for the guest's memory: hap (EPT/NPT) or shadow.
    Debian's Xen is built without shadow paging, so on a CPU with VT-x/AMD-V but no EPT/NPT (QEMU TCG's AMD
    qemu64,+svm) Xen lists hvm and libxl still refuses every such guest ("neither hap nor shadow paging
    available")."""
    words = virt_caps.split()
    if "hvm" not in words:
        return "no VT-x/AMD-V"
    if "hap" not in words and "shadow" not in words:
        return "VT-x/AMD-V without EPT/NPT, and no shadow paging"
    return ""


def xen_hvm_from(virt_caps: str | None = None, xen_caps: str | None = None) -> bool | None:
    """Whether Xen can run HVM-class guests, from `xl info`'s virt_caps (xen_hvm_lack: hvm, and hap or shadow) or
    else Xen's capabilities ("xen-3.0-x86_64 hvm-3.0-x86_64 ...": an hvm- entry, which says nothing of paging);
    None when neither is known."""
    if virt_caps is not None:
        return not xen_hvm_lack(virt_caps)
    if xen_caps is not None:
        return any(c.startswith("hvm-") for c in xen_caps.split())
    return None


def xen_hvm(sysfs: Path = XEN_CAPS_SYSFS) -> bool | None:
    """Whether this Xen runs HVM-class guests (PVH, HVM): `xl info`'s virt_caps (root), which also say whether Xen
    has a paging mode for them, else Xen's capabilities as dom0's kernel shows them to anyone; None off Xen or when
    neither answers."""
    got = xen_hvm_from(virt_caps=dom0_facts().get("xen_virt_caps"))
    if got is not None:
        return got
    try:
        return xen_hvm_from(xen_caps=sysfs.read_text())
    except OSError:
        return None


def xen_type_refusal(profile_name: str, xen_type: str, hvm: bool | None) -> str | None:
    """Why a Xen profile whose guest type is `xen_type` (pv, pvh, hvm) cannot run on a Xen without hardware
    virtualization or a paging mode for it (`hvm` False), naming where it can; None when it can or when that is not
    known."""
    if xen_type not in HVM_CLASS or hvm is not False:
        return None
    kind = {"pvh": "a PVH", "hvm": "an HVM"}[xen_type]
    return (f"profile {profile_name} runs {kind} guest, which needs hardware virtualization (Intel VT-x or AMD-V) "
            "with nested paging (EPT or NPT: Xen's HAP; Debian's Xen has no shadow paging to stand in) under Xen, and "
            "this Xen lacks it (xl info: virt_caps without hvm, or without hap and shadow; Xen's capabilities list "
            "no hvm-*): VT-x/AMD-V is off in the firmware, or Xen runs nested in a virtual CPU without them (under "
            "QEMU TCG only -cpu qemu64,+svm,+npt has both). Run it on real hardware with VT-x/AMD-V enabled, or "
            "choose a PV profile (xen-xvd-phy, xen-xvd-file)")


@dataclass(frozen=True)
class Boot:
    """What this box is booted into, as far as choosing a profile goes: Xen's dom0, or Linux with KVM or TCG."""

    xen: bool
    label: str  # "kvm", "kvm (nested)", "tcg (emulated)", "xen dom0", "xen dom0 (in a VM, emulated)", ...
    xen_hvm: bool | None = None  # on Xen: whether it runs HVM-class guests (PVH, HVM); None when not known
    host_raid: str = ""  # why this host cannot build a RAID of its own (core.disks.hostraid.problem); "" when it can

    def refusal(self, hypervisor: str, xen_type: str = "", raid_on: str = "guest") -> str | None:
        """Why a profile for `hypervisor` (and, for Xen, guest type `xen_type`: pv, pvh, hvm; a RAID built where
        `raid_on` says) cannot run on this boot, in a few words (the run's own refusals, hypervisor_mismatch,
        xen_type_refusal and check_fits, say it at length); None when it can."""
        if hypervisor == "xen" and not self.xen:
            return "Xen profile: boot the appliance's Xen entry"
        if hypervisor != "xen" and self.xen:
            return f"{hypervisor.upper()} profile: boot the appliance's default Linux entry"
        if self.xen and xen_type in HVM_CLASS and self.xen_hvm is False:
            return f"Xen {xen_type.upper()}: needs VT-x/AMD-V with EPT/NPT, which this Xen lacks"
        if raid_on == "host" and self.host_raid:
            return f"host RAID: {self.host_raid.split(' (')[0]}"
        return None


def boot_of(acc: Accelerator | None, xen: bool | None = None) -> Boot:
    """The Boot of a host whose accelerator is `acc` (None: not probed yet). `xen`, when not given, is read from
    the accelerator, or from /proc/xen when there is none."""
    if xen is None:
        xen = acc.name == "xen" if acc is not None else booted_into_xen()
    if xen:
        if acc is None or acc.name != "xen":
            acc = xen_accelerator()
        return Boot(True, "xen dom0 (in a VM, emulated)" if acc.emulated else "xen dom0", xen_hvm())
    if acc is None:
        return Boot(False, "linux (kvm or tcg: not probed yet)")
    return Boot(False, {"kvm": "kvm", "nested-kvm": "kvm (nested)", "tcg": "tcg (emulated)"}.get(acc.name, acc.name))


def hypervisor_mismatch(profile_name: str, hypervisor: str, xen_booted: bool) -> str | None:
    """Why a profile for `hypervisor` cannot run on this boot (Xen's dom0 when `xen_booted`, else Linux with
    KVM/QEMU), naming the boot entry that runs it; None when it can."""
    if hypervisor == "xen" and not xen_booted:
        return (f"profile {profile_name} needs the Xen hypervisor, but this host runs Linux without Xen "
                "(/proc/xen/capabilities does not say control_d): boot the appliance's \"cloudbox on Xen\" entry "
                "(or `bootctl set-oneshot cloudbox-xen.conf` and reboot), or choose a KVM profile "
                "(cloudbox profile list)")
    if hypervisor != "xen" and xen_booted:
        return (f"profile {profile_name} is for {hypervisor.upper()}/QEMU, but this host is booted into Xen (dom0), "
                "where KVM cannot run: boot the appliance's default Linux entry (`bootctl set-oneshot` with the "
                "cloudbox-<kernel> entry, or pick it in the boot menu), or choose a Xen profile "
                "(xen-xvd-phy, xen-default)")
    return None


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def probe_kvm(kernel: Path, timeout: float = PROBE_TIMEOUT_S,
              banner_limit: float = PROBE_BANNER_LIMIT_S) -> tuple[bool, str, float]:
    """Boot `kernel` under QEMU with KVM; True if its banner reaches the serial port. No output (firmware or kernel)
    for `timeout`, or none new for twice that once it has spoken, is a stuck vCPU; while output keeps coming it gets up
    to `banner_limit` for the banner."""
    if not os.path.exists("/dev/kvm"):
        return False, "/dev/kvm does not exist (no KVM module loaded or no hardware virtualization)", 0.0
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return False, "/dev/kvm is not accessible to this user (needs root or the kvm group)", 0.0
    if pvm_only():
        return False, ("this host's KVM is PVM (module kvm_pvm, no kvm_intel or kvm_amd), which runs only guest "
                       "kernels built for PVM"), 0.0
    return boot_probe(kernel, ["-accel", "kvm", "-cpu", "host"], "KVM", timeout, banner_limit)


def pvm_only(modules: Path = Path("/sys/module")) -> bool:
    """True when the loaded KVM is PVM alone: a vCPU of an ordinary kernel never gets past its decompressor there."""
    return (modules / "kvm_pvm").exists() and not any((modules / m).exists() for m in ("kvm_intel", "kvm_amd"))


def boot_probe(kernel: Path, accel_args: list[str], what: str, timeout: float,
               banner_limit: float) -> tuple[bool, str, float]:
    """The probe's boot of `kernel` with `accel_args`; (banner seen, why, seconds)."""
    qemu = shutil.which("qemu-system-x86_64")
    if qemu is None:
        return False, "qemu-system-x86_64 not installed", 0.0
    with tempfile.TemporaryDirectory(prefix="cloudbox-kvmprobe-") as tmp:
        serial, debug = Path(tmp) / "serial.log", Path(tmp) / "firmware.log"
        cmd = [
            qemu, *accel_args, "-m", "128", "-nodefaults", "-display", "none", "-no-reboot",
            "-serial", f"file:{serial}", "-kernel", str(kernel),
            # SeaBIOS writes its first lines to this port: proof that the vCPU runs, long before the banner
            "-chardev", f"file,id=fw,path={debug}", "-device", "isa-debugcon,iobase=0x402,chardev=fw",
            "-append", "console=ttyS0 earlyprintk=ttyS0 panic=-1 loglevel=4",
        ]
        start = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                preexec_fn=die_with_parent(signal.SIGKILL))  # noqa: PLW1509 - only prctl
        ok, ran, seen, progress = False, False, (0, 0), start
        try:
            while ((now := time.monotonic()) - progress < (2 * timeout if ran else timeout)
                   and now - start < banner_limit):
                out = serial.read_bytes() if serial.exists() else b""
                if BANNER in out:
                    ok = True
                    break
                sizes = (len(out), debug.stat().st_size if debug.exists() else 0)
                if sizes != seen:
                    seen, progress, ran = sizes, now, True
                if proc.poll() is not None:
                    break
                time.sleep(0.05)
        finally:
            proc.kill()
            _, err = proc.communicate()
        took = time.monotonic() - start
        if ok:
            return True, f"a test kernel printed its banner under {what} in {took:.2f} s", took
        if proc.returncode not in (None, -9) and err:
            msg = err.decode(errors="replace").strip().splitlines()[-1]
            return False, f"QEMU with {what} failed: {msg}", took
        if took >= banner_limit:
            return False, (f"a test kernel ran under {what} but printed no banner within {banner_limit:.0f} s "
                           "(too slow to use)"), took
        if ran:
            return False, (f"a test kernel started under {what} (firmware {seen[1]} bytes, serial {seen[0]} bytes) "
                           f"but printed nothing more for {2 * timeout:.0f} s and no banner (vCPU stuck)"), took
        return False, f"a test kernel made no progress under {what} within {timeout:.0f} s (vCPU stuck)", took


def _probe_timeout() -> float:
    raw = os.environ.get("CLOUDBOX_KVM_PROBE_TIMEOUT")
    if not raw:
        return PROBE_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if value <= 0:
        raise CloudboxError(f"CLOUDBOX_KVM_PROBE_TIMEOUT={raw!r}: expected a number of seconds greater than 0")
    return value


def _cache_file() -> Path:
    return paths.run_dir() / "accel.json"


def detect(kernel: Path | None = None, *, use_cache: bool = True) -> Accelerator:
    """The accelerator for guests on this host. `CLOUDBOX_ACCEL=tcg|kvm` forces a choice."""
    if booted_into_xen():
        return xen_accelerator()
    forced = os.environ.get("CLOUDBOX_ACCEL")
    nested = host_is_virtualized()
    if forced == "tcg":
        return Accelerator("tcg", "qemu", True, nested, "forced by CLOUDBOX_ACCEL=tcg")
    if forced == "kvm":
        return Accelerator("nested-kvm" if nested else "kvm", "kvm", False, nested,
                           "forced by CLOUDBOX_ACCEL=kvm")
    cache = _cache_file()
    if use_cache and cache.exists():
        try:
            data = json.loads(cache.read_text())
            if data.get("boot_id") == _boot_id():
                data.pop("boot_id")
                return Accelerator(**data)
        except (ValueError, TypeError):
            pass
    if kernel is None:
        from .guestimage import GuestImage

        kernel = GuestImage.locate().kernel
    ok, why, took = probe_kvm(kernel, _probe_timeout())
    if ok:
        acc = Accelerator("nested-kvm" if nested else "kvm", "kvm", False, nested, why, took)
    else:
        acc = Accelerator("tcg", "qemu", True, nested, why + _TCG_SUFFIX, took)
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps({**asdict(acc), "boot_id": _boot_id()}))
    except OSError:
        pass
    return acc
