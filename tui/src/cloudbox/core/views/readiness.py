"""Whether this box is ready for cloudbox, read before anything is installed or measured: CPU virtualization and the
IOMMU, Secure Boot, CPUs, memory and NUMA nodes, each disk (model, firmware, size, rotational, SMART health, and a
short read-only fio at queue depth 1 and 32 on the raw device), each NIC (driver, link speed, the MTU it takes,
SR-IOV virtual functions), the private link (its state, speed, duplex, MTU and whether it takes jumbo frames), and
the path to each node it knows: a full-size don't-fragment ping and a short iperf3 stream.

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
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..bench import fio, nettests
from ..cluster import client, enrol, registry
from ..errors import CloudboxError
from ..spec import catalogue, nodeconf
from ..virt import network

SECURE_BOOT_VAR = "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
FIO_SECONDS = 3
LINK_SECONDS = 3  # the iperf3 stream to each node
IPERF3_PORT = 5299  # the one-shot iperf3 server the readiness check starts on a node (a run's servers use others)
IPERF3_CONNECT_S = 10.0  # how long the client retries while the node's server starts
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
class LinkFacts:
    """A network link as the kernel reports it: the private network's, or any NIC's."""

    name: str  # where the address lives: the NIC, or the bridge over it (a back-end's cbpriv0)
    nic: str  # the NIC itself (speed, duplex and the largest MTU are the NIC's, not the bridge's)
    state: str  # the link's operational state: up, down, ...
    speed_mbps: int | None  # None: the NIC reports none (no carrier, or a virtual NIC that does not say)
    duplex: str  # full, half, or unknown
    mtu: int
    max_mtu: int | None  # the largest MTU the NIC's driver takes

    @property
    def jumbo(self) -> bool | None:
        """Whether 9000-byte frames are possible on this NIC (None: its driver does not say)."""
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
    private_link: LinkFacts | None = None
    links: list[LinkCheck] = field(default_factory=list)
    link_note: str = ""  # why a link was not checked (no private NIC in the node settings, no node enrolled)
    problems: list[str] = field(default_factory=list)
    emulated: bool | None = None  # guests here run under TCG emulation; None: the KVM probe's verdict is not known
    nested: bool = False  # guests here run under nested KVM (this box is itself a VM)

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


# ------------------------------------------------------------------------------------------------- links
def _sys_value(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:  # a NIC without carrier refuses to say its speed (EINVAL)
        return None


def link_facts(name: str, sys_root: Path = SYS) -> LinkFacts:
    """The link `name` as sysfs and ip report it; for a bridge, the speed, duplex and largest MTU of the NIC under
    it (a bridge has one port on the private network: the installer's private NIC)."""
    net = sys_root / "class" / "net"
    base = net / name
    if not base.exists():
        names = sorted(p.name for p in net.iterdir()) if net.is_dir() else []
        raise ValueError(f"no network link {name}; links here: {', '.join(names) or 'none'}")
    nic = name
    if (base / "bridge").is_dir():
        ports = sorted(p.name for p in (base / "brif").iterdir()) if (base / "brif").is_dir() else []
        hardware = [p for p in ports if (net / p / "device").exists()]
        nic = (hardware or ports or [name])[0]
    speed = _sys_value(net / nic / "speed")
    duplex = _sys_value(net / nic / "duplex")
    max_mtu = None
    r = subprocess.run(["ip", "-details", "-json", "link", "show", "dev", nic], capture_output=True, text=True,
                       timeout=20)
    if r.returncode == 0:
        info = (json.loads(r.stdout) or [{}])[0]
        max_mtu = int(info["max_mtu"]) if info.get("max_mtu") else None
    return LinkFacts(name, nic, (_sys_value(base / "operstate") or "unknown").lower(),
                     int(speed) if speed and speed.lstrip("-").isdigit() and int(speed) > 0 else None,
                     duplex if duplex in ("full", "half") else "unknown",
                     int(_sys_value(base / "mtu") or 0), max_mtu)


def private_link() -> tuple[LinkFacts | None, str]:
    """This node's private link (the NIC the installer recorded, or the bridge over it), or why there is none."""
    conf = nodeconf.settings()
    link = nodeconf.private_link(conf)
    if link is None:
        return None, (f"no private NIC in the node settings ({nodeconf.node_settings_file()}): the install names "
                      "one for a two-node lab")
    try:
        return link_facts(link), ""
    except (OSError, ValueError) as e:
        return None, f"the private link of the node settings is not here: {e}"


def iperf3_mbps(address: str, seconds: int, server: Callable[[list[str]], subprocess.Popen[bytes]],
                port: int = IPERF3_PORT) -> float:
    """Mbit/s of a `seconds`-long iperf3 stream from here to `address`: `server` starts the far end's one-shot
    server (over SSH on a node; ip netns exec in a test), which is ended afterwards whatever happened."""
    proc = server(["timeout", str(seconds + 30), "iperf3", "--server", "--one-off", "--bind", address,
                   "--port", str(port)])
    test = catalogue.NET_TESTS["iperf3-tx"]
    deadline = time.monotonic() + IPERF3_CONNECT_S
    try:
        while True:
            r = subprocess.run(nettests.iperf3_args(test, address, port, seconds), capture_output=True, text=True,
                               timeout=seconds + 30)
            try:
                return nettests.parse_iperf3(test, r.stdout).value
            except (CloudboxError, KeyError) as e:
                # the server may not listen yet: the client tries again while it runs
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise ValueError(f"iperf3 to {address} port {port}: {e}") from None
                time.sleep(0.3)
    finally:
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def check_node(name: str, address: str, seconds: int,
               server: Callable[[list[str]], subprocess.Popen[bytes]] | None) -> LinkCheck:
    """The path to one node: a full-size don't-fragment ping from the private link, then `seconds` of iperf3 when
    `server` can start its far end (None: it cannot from here, the note says why)."""
    found = network.check_private_path(address, name)
    if found is None:
        check = LinkCheck(name, address, 0, None, "not pinged: this host has no private link")
    else:
        _, path = found
        check = LinkCheck(name, address, path.mtu, path.ok, path.message)
    if seconds <= 0:
        check.iperf3_note = "not measured (--link-seconds 0)"
    elif server is None:
        check.iperf3_note = "measured from the front-end (`cloudbox host readiness` there)"
    elif shutil.which("iperf3") is None:
        check.iperf3_note = "not measured: iperf3 is not installed here"
    else:
        try:
            check.iperf3_mbps = iperf3_mbps(address, seconds, server)
        except (OSError, ValueError, CloudboxError, subprocess.TimeoutExpired) as e:
            check.iperf3_note = f"not measured: {e}"
    return check


def _server_on(shell: client.NodeShell) -> Callable[[list[str]], subprocess.Popen[bytes]]:
    def start(argv: list[str]) -> subprocess.Popen[bytes]:
        return shell.popen(*argv)
    return start


def node_links(seconds: int) -> tuple[list[LinkCheck], str]:
    """The path to each node this box knows (a front-end: its enrolled back-ends; a back-end: its front-end, pinged
    only), or why there is none to check."""
    role, _ = nodeconf.role()
    if role == "back-end":
        pin, _ = enrol.pin_paths()
        try:
            fe = json.loads(pin.read_text())
        except (OSError, ValueError):
            return [], "not enrolled with a front-end yet: the ping and iperf3 to it are skipped"
        return [check_node(str(fe.get("name", "front-end")), str(fe.get("address", "")), seconds, None)], ""
    if not registry.nodes_db().exists():
        return [], "no node enrolled: the jumbo-frame ping and iperf3 to another node are skipped"
    with registry.Registry() as reg:
        nodes = reg.nodes()
        if not nodes:
            return [], "no node enrolled: the jumbo-frame ping and iperf3 to another node are skipped"
        out = []
        for n in nodes:
            out.append(check_node(n.name, n.address, seconds, _server_on(client.NodeShell.for_node(reg, n))))
    return out, ""


# ------------------------------------------------------------------------------------------------- all
def gather(*, fio_seconds: int = FIO_SECONDS, devices: list[str] | None = None, accelerator: str = "",
           emulated: bool | None = None, nested: bool = False, link_seconds: int | None = LINK_SECONDS) -> Readiness:
    """The box's readiness. `devices` (kernel names or /dev paths) limits the disks measured (default: every disk
    lsblk lists); `fio_seconds` = 0 measures none. `accelerator` is the KVM probe's verdict in words, when the
    caller has it (the probe boots a tiny guest), `emulated` and `nested` what it found. `link_seconds`: the iperf3
    stream to each node (0: pinged only; None: neither the private link nor the nodes are looked at)."""
    model, flag = cpu_facts(Path("/proc/cpuinfo").read_text())
    iommu, iommu_on = iommu_state()
    ready = Readiness(platform.node(), model, os.cpu_count() or 1, flag, accelerator or "not probed", iommu,
                      iommu_on, secure_boot_state(), memory_bytes(Path("/proc/meminfo").read_text()), numa_nodes(),
                      emulated=emulated, nested=nested)
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
    if link_seconds is not None:
        ready.private_link, note = private_link()
        try:
            ready.links, nodes_note = node_links(link_seconds)
        except CloudboxError as e:
            ready.links, nodes_note = [], f"the nodes could not be read: {e}"
        ready.link_note = "; ".join(n for n in (note, nodes_note) if n)
    return ready


def measures(r: Readiness) -> list[tuple[str, str]]:
    """What this box measures natively and what only emulated: ("natively", ...), ("emulated", ...)."""
    native = "the bare-metal rows (this box's disks, its network namespace)"
    if r.emulated is None:
        return [("natively", native), ("emulated", "not known: the KVM probe has not run (`cloudbox host` runs it)")]
    if r.emulated:
        return [("natively", native + " only"),
                ("emulated", "every guest row: guests run under TCG, their figures are emulation cost, not "
                             "virtualization overhead (marked *)")]
    guests = ("guests under nested KVM (a second layer of virtualization in their figures)" if r.nested else
              "guests under KVM: virtualization-overhead figures")
    return [("natively", f"{native} and {guests}"), ("emulated", "nothing")]


def lines(r: Readiness) -> list[str]:
    """The report as text, one fact per line."""
    gib = 1024**3
    out = [f"host         {r.hostname}",
           f"CPU          {r.cpu_model}, {r.cpus} CPUs, virtualization: "
           + {"vmx": "Intel VT-x", "svm": "AMD-V"}.get(r.virt_flag, "none shown"),
           f"guests       {r.kvm}",
           *(f"{what:<13}{how}" for what, how in measures(r)),
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
    if r.private_link is not None:
        out.append(f"private link {link_line(r.private_link)}")
    out += [f"link to {lk.node} ({lk.address}): {check_line(lk)}" for lk in r.links]
    if r.link_note:
        out.append(f"links        {r.link_note}")
    out += [f"problem      {p}" for p in r.problems]
    return out


def link_line(lk: LinkFacts) -> str:
    """A link's facts in one line: `eno2: up, 10000 Mb/s full duplex, MTU 9000, jumbo frames possible (...)`."""
    name = lk.name if lk.nic == lk.name else f"{lk.name} (over {lk.nic})"
    speed = f"{lk.speed_mbps} Mb/s {lk.duplex} duplex" if lk.speed_mbps else "no link speed reported"
    jumbo = ("jumbo frames: the driver does not say" if lk.jumbo is None else
             f"jumbo frames possible (takes up to {lk.max_mtu})" if lk.jumbo else
             f"no jumbo frames (takes up to {lk.max_mtu})")
    return f"{name}: {lk.state}, {speed}, MTU {lk.mtu}, {jumbo}"


def check_line(lk: LinkCheck) -> str:
    """The path to one node in one line: the ping's outcome, then iperf3's figure or why there is none."""
    iperf = f"; iperf3 {lk.iperf3_mbps:.0f} Mb/s" if lk.iperf3_mbps is not None else \
        (f"; iperf3 {lk.iperf3_note}" if lk.iperf3_note else "")
    return f"{lk.detail}{iperf}"
