"""What this box is and has: its role, the nodes it knows, the accelerator, disks and NICs (for the overview).

Everything here reads the system (lsblk, ip, /proc, the node settings file) and never changes it.
`gather()` is what the TUI's overview and `cloudbox host` show; each part degrades to an explanation
instead of failing, because an overview that crashes on a missing tool helps nobody.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from .. import paths
from ..cluster import health, registry
from ..errors import CloudboxError
from ..procs import process_exists
from ..spec.nodeconf import role
from ..virt import accel


@dataclass
class Disk:
    name: str
    size_bytes: int
    model: str
    rotational: bool
    transport: str
    mountpoints: list[str]

    @property
    def kind(self) -> str:
        if self.name.startswith("nvme"):
            return "NVMe"
        return "HDD" if self.rotational else "SSD/virtual"


@dataclass
class Nic:
    name: str
    mac: str
    mtu: int
    state: str
    addresses: list[str]


@dataclass
class Node:
    name: str
    role: str
    state: str  # "up" | "down" | "unknown"
    detail: str = ""  # this box: "this box"; an enrolled node: why it has that state (health.shown_state)
    address: str = ""  # an enrolled node's address (ADDR:PORT when its SSH port is not 22)
    last_seen: float | None = None  # an enrolled node's last good check
    enrolled: bool = False  # from the node registry (not this box)


@dataclass
class HostFacts:
    hostname: str
    role: str
    role_source: str  # where the role came from (the node settings file, or the default)
    nodes: list[Node]
    accelerator: accel.Accelerator | None
    accelerator_problem: str | None
    libvirtd: str
    disks: list[Disk] = field(default_factory=list)
    nics: list[Nic] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def disks() -> list[Disk]:
    out = subprocess.run(["lsblk", "--json", "--bytes", "--nodeps", "-o",
                          "NAME,SIZE,TYPE,MODEL,ROTA,TRAN,MOUNTPOINTS"],
                         capture_output=True, text=True, timeout=10)
    if out.returncode != 0:
        raise CloudboxError(f"lsblk failed: {out.stderr.strip()}")
    found = []
    for d in json.loads(out.stdout).get("blockdevices", []):
        if d.get("type") != "disk" or d["name"].startswith(("zram", "ram")):
            continue
        found.append(Disk(d["name"], int(d.get("size") or 0), (d.get("model") or "").strip() or "-",
                          bool(d.get("rota")), d.get("tran") or "-",
                          [m for m in (d.get("mountpoints") or []) if m]))
    return found


def nics() -> list[Nic]:
    out = subprocess.run(["ip", "-json", "address", "show"], capture_output=True, text=True, timeout=10)
    if out.returncode != 0:
        raise CloudboxError(f"ip address failed: {out.stderr.strip()}")
    found = []
    for n in json.loads(out.stdout):
        if n.get("link_type") == "loopback":
            continue
        addrs = [f"{a['local']}/{a['prefixlen']}" for a in n.get("addr_info", []) if a.get("family") == "inet"]
        found.append(Nic(n["ifname"], n.get("address", "-"), int(n.get("mtu", 0)), n.get("operstate", "?").lower(),
                         addrs))
    return found


def libvirtd_state() -> str:
    for name in ("libvirtd", "virtqemud"):
        try:
            pid = int(Path(f"/run/{name}.pid").read_text().strip())
        except (OSError, ValueError):
            continue
        if process_exists(pid):
            return f"{name} running (pid {pid})"
    return "not running (cloudbox starts it when a run needs it)"


def registry_nodes(this_role: str, problems: list[str]) -> list[Node]:
    """On a front-end (or an all-in-one that enrolled back-ends), the enrolled nodes from the node registry, as
    the last health check left them (a stale check shows 'unknown'). Nothing on a back-end, or before the
    registry exists."""
    if this_role not in ("front-end", "all-in-one"):
        return []
    if not registry.nodes_db().exists():
        return []
    try:
        with registry.Registry() as reg:
            found = reg.nodes()
    except CloudboxError as e:
        problems.append(f"nodes: {e}")
        return []
    out = []
    for n in found:
        state, reason = health.shown_state(n)
        out.append(Node(n.name, n.role, state, reason, n.address if n.ssh_port == 22 else f"{n.address}:{n.ssh_port}",
                        n.last_seen, True))
    return out


def boot() -> accel.Boot:
    """What this box is booted into, without probing KVM: Xen's dom0, or the cached probe's answer (else "not
    probed yet")."""
    acc = None
    if accel.booted_into_xen() or (paths.run_dir() / "accel.json").exists() or os.environ.get("CLOUDBOX_ACCEL"):
        with contextlib.suppress(CloudboxError):
            acc = accel.detect()
    return accel.boot_of(acc)


def gather(*, probe: bool = True) -> HostFacts:
    """This host's facts. `probe=False` skips the accelerator probe when it is not cached yet (it boots
    the guest kernel under KVM for up to 8 s)."""
    problems: list[str] = []
    hostname = socket.gethostname()
    r, src = role()
    acc, acc_problem = None, None
    try:
        if probe or (paths.run_dir() / "accel.json").exists() or os.environ.get("CLOUDBOX_ACCEL"):
            acc = accel.detect()
        else:
            acc_problem = "not probed yet"
    except CloudboxError as e:
        acc_problem = str(e)
    found_disks: list[Disk] = []
    found_nics: list[Nic] = []
    try:
        found_disks = disks()
    except (CloudboxError, OSError, ValueError, subprocess.TimeoutExpired) as e:
        problems.append(f"disks: {e}")
    try:
        found_nics = nics()
    except (CloudboxError, OSError, ValueError, subprocess.TimeoutExpired) as e:
        problems.append(f"NICs: {e}")
    nodes = [Node(hostname, r, "up", "this box")] + registry_nodes(r, problems)
    return HostFacts(hostname, r, src, nodes, acc, acc_problem, libvirtd_state(), found_disks, found_nics, problems)
