"""Whether this box is ready for cloudbox, read before anything is installed or measured: CPU virtualization and the
IOMMU, Secure Boot, CPUs, memory and NUMA nodes, each disk (model, firmware, size, rotational, SMART health, and a
short read-only fio at queue depth 1 and 32 on the raw device), each NIC (driver, link speed, the MTU it takes,
SR-IOV virtual functions), and the private link to the front-end when one is known.

Nothing here writes to a disk: fio runs with --readonly (it refuses any write job and opens the device read-only),
on block devices lsblk lists, and only for the seconds asked. What the box can then answer (which studies, which
steps of the ladder) is core.studies' part; this module gathers the facts.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import stat
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..bench import fio

SECURE_BOOT_VAR = "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
FIO_SECONDS = 3
SYS = Path("/sys")


@dataclass
class DiskReadiness:
    name: str
    model: str
    firmware: str
    serial: str
    size_bytes: int
    rotational: bool
    transport: str
    mountpoints: list[str]
    smart: str  # "passed", "FAILED: ...", or why it was not checked
    qd1_iops: float | None = None  # 4 kB random reads, read-only, the raw device
    qd32_iops: float | None = None
    read_note: str = ""  # why the reads were not measured, when they were not

    @property
    def in_use(self) -> bool:
        """It holds a mounted file system (the running system, or data): never a whole-disk run's target."""
        return bool(self.mountpoints)


@dataclass
class NicReadiness:
    name: str
    driver: str
    state: str
    speed_mbps: int | None  # None: the link reports none (down, or a virtual NIC)
    mtu: int
    max_mtu: int | None
    sriov_vfs: int | None  # the virtual functions the NIC offers (SR-IOV), None when it offers none
    addresses: list[str]

    @property
    def jumbo(self) -> bool | None:
        return None if self.max_mtu is None else self.max_mtu >= 9000


@dataclass
class LinkCheck:
    """The private link to another node: a full-size don't-fragment ping, and an iperf3 stream where measured."""

    node: str
    address: str
    mtu: int
    jumbo_ok: bool | None
    detail: str
    iperf3_mbps: float | None = None
    iperf3_note: str = ""


@dataclass
class Readiness:
    hostname: str
    cpu_model: str
    cpus: int
    virt_flag: str  # "vmx" (Intel VT-x), "svm" (AMD-V), or "" when the CPU shows neither
    kvm: str  # the accelerator guests would get, in words
    iommu: str  # "enabled (N groups)", "present, not enabled: ...", "none found"
    iommu_enabled: bool
    secure_boot: str  # "on", "off", "legacy BIOS boot (no UEFI)"
    memory_bytes: int
    numa_nodes: int
    disks: list[DiskReadiness] = field(default_factory=list)
    nics: list[NicReadiness] = field(default_factory=list)
    links: list[LinkCheck] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# ------------------------------------------------------------------------------------------------- CPU, memory
def cpu_facts(cpuinfo: str) -> tuple[str, str]:
    """(model name, "vmx" | "svm" | "") from /proc/cpuinfo's text."""
    model, flags = "", set[str]()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and not model:
            model = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = set(value.split())
    return model or "unknown", "vmx" if "vmx" in flags else "svm" if "svm" in flags else ""


def secure_boot_state(sys_root: Path = SYS) -> str:
    """"on" or "off" from the firmware's SecureBoot variable, "legacy BIOS boot (no UEFI)" without EFI."""
    efi = sys_root / "firmware" / "efi"
    if not efi.is_dir():
        return "legacy BIOS boot (no UEFI)"
    try:
        data = (efi / "efivars" / SECURE_BOOT_VAR).read_bytes()
    except OSError:
        return "off (the firmware has no SecureBoot variable)"
    return "on" if len(data) >= 5 and data[4] == 1 else "off"


def iommu_state(sys_root: Path = SYS) -> tuple[str, bool]:
    """Whether the IOMMU (VT-d, AMD-Vi) is on: its groups exist; present but off when the firmware's table (DMAR,
    IVRS) is there without groups."""
    try:
        groups = len(os.listdir(sys_root / "kernel" / "iommu_groups"))
    except OSError:
        groups = 0
    if groups:
        return f"enabled ({groups} groups)", True
    tables = [t for t in ("DMAR", "IVRS") if (sys_root / "firmware" / "acpi" / "tables" / t).exists()]
    if tables:
        how = "intel_iommu=on" if "DMAR" in tables else "amd_iommu=on"
        return (f"present ({tables[0]} table), not enabled: turn on VT-d/AMD-Vi in the firmware and boot with "
                f"{how} iommu=pt"), False
    return "none found (no IOMMU groups, no DMAR or IVRS table): PCI passthrough and SR-IOV need one", False


def memory_bytes(meminfo: str) -> int:
    for line in meminfo.splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return 0


def numa_nodes(sys_root: Path = SYS) -> int:
    try:
        return max(1, sum(1 for p in (sys_root / "devices" / "system" / "node").iterdir()
                          if p.name.startswith("node") and p.name[4:].isdigit()))
    except OSError:
        return 1


# ------------------------------------------------------------------------------------------------- disks
def list_disks(named: set[str] | None = None) -> list[DiskReadiness]:
    """The disks lsblk lists (not RAM disks, zram or empty ones); a device in `named` too when it is another kind
    of block device (a loop device a lab names on purpose)."""
    r = subprocess.run(["lsblk", "--json", "--bytes", "--nodeps", "-o",
                        "NAME,SIZE,TYPE,MODEL,REV,SERIAL,ROTA,TRAN,MOUNTPOINTS"],
                       capture_output=True, text=True, timeout=20)
    if r.returncode != 0:
        return []
    out = []
    for d in json.loads(r.stdout).get("blockdevices", []):
        size = int(d.get("size") or 0)
        if (d.get("type") != "disk" and d["name"] not in (named or ())) or d["name"].startswith(("zram", "ram")) \
                or size == 0:
            continue
        out.append(DiskReadiness(d["name"], (d.get("model") or "").strip() or "-", (d.get("rev") or "").strip()
                                 or "-", (d.get("serial") or "").strip() or "-", size, bool(d.get("rota")),
                                 d.get("tran") or "-", [m for m in (d.get("mountpoints") or []) if m],
                                 smart=""))
    return out


def smart_health(device: str) -> str:
    """SMART's overall verdict (smartctl -H), or why it was not read."""
    if shutil.which("smartctl") is None:
        return "not checked (smartctl is not installed: Debian's smartmontools)"
    r = subprocess.run(["smartctl", "-H", "-j", device], capture_output=True, text=True, timeout=60)
    try:
        data = json.loads(r.stdout)
    except ValueError:
        return f"not read (smartctl exited {r.returncode})"
    status = data.get("smart_status")
    if not isinstance(status, dict):
        msgs = [m.get("string", "") for m in data.get("smartctl", {}).get("messages", []) if isinstance(m, dict)]
        return "not available" + (f": {msgs[0]}" if msgs and msgs[0] else "")
    return "passed" if status.get("passed") else "FAILED: back up this disk and do not measure on it"


def read_only_fio_args(device: str, iodepth: int, seconds: int) -> list[str]:
    """fio's 4 kB random reads on the raw device at `iodepth`: --readonly makes fio refuse any write and open the
    device read-only; O_DIRECT so the page cache does not answer."""
    return ["fio", f"--name=readiness-qd{iodepth}", f"--filename={device}", "--readonly", "--rw=randread",
            "--bs=4k", f"--iodepth={iodepth}", "--direct=1", "--ioengine=libaio", f"--runtime={seconds}",
            "--time_based=1", "--randrepeat=0", "--norandommap=1", "--output-format=json"]


def read_iops(device: str, iodepth: int, seconds: int) -> float:
    st = os.stat(device)
    if not stat.S_ISBLK(st.st_mode):
        raise ValueError(f"{device} is not a block device")
    r = subprocess.run(read_only_fio_args(device, iodepth, seconds), capture_output=True, text=True,
                       timeout=seconds + 60)
    if r.returncode != 0:
        err = re.search(r"error=([^\n]+)", r.stderr or r.stdout)
        raise ValueError(f"fio could not read {device}"
                         + (f" ({err.group(1).strip()})" if err else f" (exit {r.returncode})"))
    return fio.parse_fio(f"readiness-qd{iodepth}", r.stdout).iops


# ------------------------------------------------------------------------------------------------- NICs
def list_nics(sys_root: Path = SYS) -> list[NicReadiness]:
    r = subprocess.run(["ip", "-details", "-json", "address", "show"], capture_output=True, text=True, timeout=20)
    if r.returncode != 0:
        return []
    out = []
    for n in json.loads(r.stdout):
        name = n.get("ifname", "")
        dev = sys_root / "class" / "net" / name / "device"
        if n.get("link_type") == "loopback" or not dev.exists():
            continue  # bridges, veths, taps: not hardware the lab chose
        driver = os.path.basename(os.readlink(dev / "driver")) if (dev / "driver").exists() else "-"
        try:
            speed: int | None = int((sys_root / "class" / "net" / name / "speed").read_text().strip())
        except (OSError, ValueError):
            speed = None
        vfs = None
        try:
            vfs = int((dev / "sriov_totalvfs").read_text().strip()) or None
        except (OSError, ValueError):
            pass
        out.append(NicReadiness(name, driver, (n.get("operstate") or "?").lower(),
                                speed if speed and speed > 0 else None, int(n.get("mtu", 0)),
                                int(n["max_mtu"]) if n.get("max_mtu") else None, vfs,
                                [f"{a['local']}/{a['prefixlen']}" for a in n.get("addr_info", [])
                                 if a.get("family") == "inet"]))
    return out


# ------------------------------------------------------------------------------------------------- all
def gather(*, fio_seconds: int = FIO_SECONDS, devices: list[str] | None = None,
           accelerator: str = "") -> Readiness:
    """The box's readiness. `devices` (kernel names or /dev paths) limits the disks measured (default: every disk
    lsblk lists); `fio_seconds` = 0 measures none. `accelerator` is the KVM probe's verdict in words, when the
    caller has it (the probe boots a tiny guest)."""
    model, flag = cpu_facts(Path("/proc/cpuinfo").read_text())
    iommu, iommu_on = iommu_state()
    ready = Readiness(platform.node(), model, os.cpu_count() or 1, flag, accelerator or "not probed", iommu,
                      iommu_on, secure_boot_state(), memory_bytes(Path("/proc/meminfo").read_text()), numa_nodes())
    if not flag:
        ready.problems.append("the CPU shows no VT-x (vmx) or AMD-V (svm): turn virtualization on in the firmware, "
                              "or guests run under emulation (TCG) and no figure is an overhead figure")
    wanted = {os.path.basename(d) for d in devices} if devices else None
    for d in list_disks(wanted):
        if wanted is not None and d.name not in wanted:
            continue
        path = f"/dev/{d.name}"
        d.smart = smart_health(path)
        if fio_seconds <= 0:
            d.read_note = "not measured (--fio-seconds 0)"
        elif shutil.which("fio") is None:
            d.read_note = "not measured: fio is not installed"
        else:
            try:
                d.qd1_iops = read_iops(path, 1, fio_seconds)
                d.qd32_iops = read_iops(path, 32, fio_seconds)
            except (OSError, ValueError, subprocess.TimeoutExpired) as e:
                d.read_note = f"not measured: {e}"
        ready.disks.append(d)
    if wanted is not None:
        missing = sorted(wanted - {d.name for d in ready.disks})
        if missing:
            ready.problems.append(f"no such disk: {', '.join(missing)}; allowed: "
                                  f"{', '.join(d.name for d in list_disks()) or 'none found'}")
    ready.nics = list_nics()
    return ready


def lines(r: Readiness) -> list[str]:
    """The report as text, one fact per line."""
    gib = 1024**3
    out = [f"host         {r.hostname}",
           f"CPU          {r.cpu_model}, {r.cpus} CPUs, virtualization: "
           + {"vmx": "Intel VT-x", "svm": "AMD-V"}.get(r.virt_flag, "none shown"),
           f"guests       {r.kvm}",
           f"IOMMU        {r.iommu}",
           f"Secure Boot  {r.secure_boot}",
           f"memory       {r.memory_bytes / gib:.1f} GiB, {r.numa_nodes} NUMA node{'s' if r.numa_nodes > 1 else ''}"]
    for d in r.disks:
        kind = "HDD" if d.rotational else "SSD" if d.transport != "-" or d.name.startswith("nvme") else "disk"
        reads = (f"4k random reads {d.qd1_iops:.0f} IOPS at QD1, {d.qd32_iops:.0f} at QD32 (read-only)"
                 if d.qd1_iops is not None and d.qd32_iops is not None else d.read_note)
        use = f"; in use: {', '.join(d.mountpoints)}" if d.in_use else "; not mounted"
        out.append(f"disk {d.name:<8}{d.size_bytes / gib:.0f} GiB {kind}, {d.model}, firmware {d.firmware}, "
                   f"SMART {d.smart}{use}; {reads}")
    for n in r.nics:
        speed = f"{n.speed_mbps} Mb/s" if n.speed_mbps else "no link speed"
        mtu = f"MTU {n.mtu} (takes up to {n.max_mtu})" if n.max_mtu else f"MTU {n.mtu}"
        vfs = f", SR-IOV: {n.sriov_vfs} VFs" if n.sriov_vfs else ", no SR-IOV"
        out.append(f"NIC {n.name:<9}{n.driver}, {n.state}, {speed}, {mtu}{vfs}"
                   + (f", {', '.join(n.addresses)}" if n.addresses else ""))
    for lk in r.links:
        iperf = f"; iperf3 {lk.iperf3_mbps:.0f} Mb/s" if lk.iperf3_mbps is not None else \
            (f"; iperf3 {lk.iperf3_note}" if lk.iperf3_note else "")
        out.append(f"link to {lk.node} ({lk.address}): {lk.detail}{iperf}")
    out += [f"problem      {p}" for p in r.problems]
    return out
