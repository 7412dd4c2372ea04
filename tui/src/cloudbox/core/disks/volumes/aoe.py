"""One AoE export of a volume: vblade on one network interface, as a child of the run's process, killed with it.

ATA over Ethernet is layer 2 and has no authentication: any host on the segment can read and write the volume. So
cloudbox serves it only on the bridge the run's guest is plugged into (the run's own bridge, or a front-end's private
link), never on a NIC with a route out, and vblade answers only the MACs of the run's initiators (-m): the guest's,
which the run chooses (`guest_mac`, from the run's shelf, so a back-end's run gives its guest the MAC the front-end
allowed), and the host's that attaches it. A MAC is no secret (any host on the segment can send from one), so this
keeps other initiators from finding and using the volume by accident, not an attacker out. vblade opens the file
with O_DIRECT (-d: the server's page cache is not part of the volume) and answers as shelf.slot; the initiator (the
guest's `aoe` driver) finds it by broadcast.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from ... import ledger, procs
from ...errors import CloudboxError

START_TIMEOUT = 30.0  # a server on an emulated, busy host can take its time to start
MAX_SHELF = 65534  # 0xffff is the broadcast shelf
MAX_SLOT = 254  # 0xff is the broadcast slot
_MAC = re.compile(r"[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}")


@dataclass
class AoeExport(procs.ServedByChild):
    """A running export: e<shelf>.<slot> on interface `iface`."""

    name: str
    path: str
    iface: str
    shelf: int
    slot: int
    server: str = "vblade"
    child: procs.Child | None = field(default=None, repr=False)

    @property
    def target(self) -> str:
        return f"e{self.shelf}.{self.slot}"

    @property
    def uri(self) -> str:
        return f"aoe:{self.target}@{self.iface}"


def _packet_socket_open(pid: int) -> bool:
    """True once process `pid` holds a packet socket (vblade has bound its interface)."""
    try:
        inodes = {f"socket:[{line.split()[-1]}]" for line in Path("/proc/net/packet").read_text().splitlines()[1:]}
        return any(os.readlink(fd) in inodes for fd in Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False


def _pin_bridge_address(iface: str) -> None:
    """A bridge takes the lowest address of its ports unless one was set; vblade answers from the address the
    interface had when it started, so a guest plugged in later would send its requests to an address that is
    gone. Setting the bridge's own address again keeps it whatever joins."""
    base = Path(f"/sys/class/net/{iface}")
    if not (base / "bridge").is_dir():
        return
    addr = (base / "address").read_text().strip()
    r = subprocess.run(["ip", "link", "set", "dev", iface, "address", addr], capture_output=True, text=True)
    if r.returncode != 0:
        raise CloudboxError(f"cannot fix bridge {iface}'s address {addr} for vblade: {r.stderr.strip()}")


def guest_mac(shelf: int) -> str:
    """The MAC of the guest that attaches the AoE target of `shelf`: QEMU's prefix (locally administered), then
    0xae and the shelf, so the server and the run that launches the guest (on a back-end too) agree on it."""
    return f"52:54:00:ae:{shelf >> 8:02x}:{shelf & 0xff:02x}"


def link_mac(iface: str) -> str:
    """The MAC of this host's interface `iface`."""
    try:
        return Path(f"/sys/class/net/{iface}/address").read_text().strip()
    except OSError as e:
        raise CloudboxError(f"cannot read the MAC of {iface} for vblade's allow-list: {e.strerror or e}") from None


def neighbour_mac(address: str, iface: str) -> str:
    """The MAC that answers for `address` on `iface` (a back-end's private link, as its host's aoe driver sends
    from it): the neighbour table, after one ping when the entry is missing."""
    for attempt in range(2):
        r = subprocess.run(["ip", "-j", "neigh", "show", "to", address, "dev", iface], capture_output=True,
                           text=True)
        try:
            found = [n.get("lladdr", "") for n in json.loads(r.stdout or "[]")]
        except ValueError:
            found = []
        if found and found[0]:
            return str(found[0]).lower()
        if attempt == 0:
            subprocess.run(["ping", "-c", "1", "-W", "1", "-I", iface, address], capture_output=True)
    raise CloudboxError(f"cannot learn the MAC of {address} on {iface} (no neighbour entry after a ping), which "
                        "vblade must allow for that node's host to attach its AoE volume")


def shelf_for(run_uuid: str) -> int:
    """A shelf number of the run's own, so two runs' exports on one segment never answer as the same target."""
    return int.from_bytes(hashlib.sha256(run_uuid.encode()).digest()[:4], "big") % (MAX_SHELF + 1)


def start(name: str, path: str, iface: str, *, shelf: int, slot: int = 0, log: Path,
          macs: tuple[str, ...]) -> AoeExport:
    """Export `path` as e<shelf>.<slot> on `iface` to the initiators with the MACs `macs` only; returns once vblade
    has bound the interface. On failure nothing runs and the error names what vblade said."""
    if shutil.which("vblade") is None:
        raise CloudboxError("vblade is not installed (Debian package vblade): run 'make deps' (scripts/install-deps)")
    if not 0 <= shelf <= MAX_SHELF or not 0 <= slot <= MAX_SLOT:
        raise CloudboxError(f"AoE target e{shelf}.{slot} is out of range; allowed: shelf 0..{MAX_SHELF}, slot "
                            f"0..{MAX_SLOT}")
    if not Path(f"/sys/class/net/{iface}").exists():
        raise CloudboxError(f"cannot serve AoE volume {name!r}: no network interface {iface!r} on this host")
    bad = [m for m in macs if not _MAC.fullmatch(m)]
    if not macs or bad:
        raise CloudboxError(f"AoE volume {name!r}: vblade's allow-list {', '.join(bad) or 'is empty'}; allowed: one "
                            "MAC or more, six colon-separated hex bytes each")
    _pin_bridge_address(iface)
    child = procs.Child.start(["vblade", "-d", "-m", ",".join(m.lower() for m in macs), str(shelf), str(slot), iface,
                               path], log=log,
                              ready=_packet_socket_open, serving=f"volume {name} on {iface}",
                              ready_is=f"bind {iface}", timeout=START_TIMEOUT)
    return AoeExport(name, path, iface, shelf, slot, child=child)


def running(path: str) -> list[int]:
    """The pids of every vblade serving `path` (a test's check that nothing is left)."""
    return [int(d.name) for d, argv in procs.programs("vblade") if path.encode() in argv]


def attach_in_guest(guest, target: str, *, timeout: float = 60.0) -> str:
    """In the benchmark guest: its NIC up (no address: AoE is layer 2), the `aoe` driver loaded for that NIC only,
    and the volume `target` (eS.N) found; returns its device, /dev/etherd/eS.N. Raises CloudboxError naming what
    the guest lacks or did not see."""
    r = guest.sh("for d in /sys/class/net/*; do n=${d##*/}; [ $n = lo ] || echo $n; done", timeout=30).check()
    nics = r.stdout.split()
    if len(nics) != 1:
        raise CloudboxError(f"disk.attach = guest: the guest reaches its volume through one NIC on the volume's "
                            f"bridge; it has {nics or 'none'}")
    nic = nics[0]
    p = guest.sh(f"ip link set dev {nic} up && modprobe aoe aoe_iflist={nic}", timeout=60)
    if p.exitcode != 0:
        raise CloudboxError(f"the guest could not load its aoe driver on {nic} (exit {p.exitcode}): "
                            f"{(p.stdout + p.stderr).strip()[-300:]}; rebuild the guest image (make guest-image) "
                            "if it has no aoe module")
    dev = f"/dev/etherd/{target}"

    def found() -> bool:
        # Ask again each round: the first query may have left before the link had its carrier.
        p = guest.sh(f"[ -b {dev} ] && cat '/sys/block/etherd!{target}/size' || "
                     "{ echo > /dev/etherd/discover; exit 1; } 2>/dev/null", timeout=30)
        return p.exitcode == 0 and p.stdout.strip().isdigit() and int(p.stdout) > 0

    def failure() -> str:
        seen = guest.sh("ls /sys/block | grep etherd", timeout=30).stdout.split()
        said = guest.sh(f"ls /sys/block /dev/etherd; dmesg | tail -n 8; cat /sys/class/net/{nic}/operstate "
                        f"/sys/class/net/{nic}/statistics/rx_packets", timeout=30).stdout
        return (f"the guest's aoe driver did not find {target} on {nic} within {timeout:.0f} s (it has: "
                f"{', '.join(seen) or 'no AoE disk'}; the guest's kernel said: "
                f"{' | '.join(said.split(chr(10)))[-400:]}); is vblade serving on the guest's bridge?")

    procs.wait_for(found, timeout, failure, interval=1)
    return dev


VETH_PREFIX = "cbv"
# The veth pair's MTU: jumbo frames, as study A's private network carried AoE (one AoE request per frame, so a 9000-byte
# frame carries 8 KiB of data where a 1500-byte one carries 1 KiB), and as a back-end's private network does.
VETH_MTU = 9000


def _veth_names(run_uuid: str) -> tuple[str, str]:
    tag = run_uuid.replace("-", "")[:8]
    return f"{VETH_PREFIX}{tag}s", f"{VETH_PREFIX}{tag}h"


def veth_pair(run_uuid: str) -> tuple[str, str]:
    """A veth pair of the run's own at VETH_MTU, both ends up, no addresses: (vblade's end, this host's aoe driver's
    end). The aoe driver never sees frames sent from its own interface, so a target on the same host needs a link of
    its own; nothing else is on it."""
    server, host = _veth_names(run_uuid)
    ledger.hold(ledger.Link(server))  # remove_veth marks it released
    r = subprocess.run(["ip", "link", "add", server, "mtu", str(VETH_MTU), "type", "veth", "peer", "name", host,
                        "mtu", str(VETH_MTU)], capture_output=True, text=True)
    if r.returncode != 0:
        ledger.active().done(ledger.Link(server))
        raise CloudboxError(f"cannot make the veth pair {server}/{host} for an AoE target on this host: "
                            f"{r.stderr.strip()}")
    for name in (server, host):
        r = subprocess.run(["ip", "link", "set", "dev", name, "up"], capture_output=True, text=True)
        if r.returncode != 0:
            remove_veth(server)
            raise CloudboxError(f"cannot bring up {name}: {r.stderr.strip()}")
    return server, host


def remove_veth(name: str) -> None:
    """Delete a veth pair by either end (gone already is fine)."""
    subprocess.run(["ip", "link", "del", "dev", name], capture_output=True)
    if not Path("/sys/class/net", name).exists():
        ledger.active().done(ledger.Link(name))


def reap_veths(live_runs: set[str]) -> list[str]:
    """Delete the veth pairs of runs that are not live (a run killed outright leaves its pair); returns them."""
    live = {_veth_names(u)[0] for u in live_runs}
    gone = []
    for d in Path("/sys/class/net").glob(f"{VETH_PREFIX}*s"):
        if len(d.name) == len(VETH_PREFIX) + 9 and d.name not in live:
            remove_veth(d.name)
            gone.append(d.name)
    return gone
