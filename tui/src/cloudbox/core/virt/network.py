"""The host's side of a run's network: the bridge cloudbox creates for the run (the profile's MTU on the bridge, the
tap and the guest's interface), the network namespace over veth that stands in for the bare-metal peer, the
netserver and iperf3 servers the tests connect to, the guest's NIC and its path (a don't-fragment ping of full
size before any test), this node's private link (its frames held to the guest's MTU while the host's own baseline
to the front-end runs), and the link statistics that tell a stalled NIC from a slow one.
Addresses are IPv4 link-local (169.254.0.0/16, spec.addresses): host-only links that never route. Control of the
guest goes through the guest agent, never this network. The tests themselves are bench.nettests.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .. import ledger
from ..errors import CloudboxError, GuestError, NicStalled, PermissionProblem
from ..procs import die_with_parent, free_port
from ..spec import nodeconf
from ..spec.addresses import (
    BRIDGE,
    GUEST_IP,
    HOST_IP,
    MACVLAN_HOST,
    MACVTAP_LINK,
    MACVTAP_PEER,
    NS,
    NS_HOST_IP,
    NS_IP,
    PREFIX,
    VETH_HOST,
    VETH_NS,
)
from .domain import read_domain
from .sriov import VirtualFunctions

if TYPE_CHECKING:
    from .guest import Guest


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise CloudboxError(f"ip {' '.join(args)} failed: {r.stderr.strip()}")
    return r


def link_exists(name: str) -> bool:
    return os.path.exists(f"/sys/class/net/{name}")


def link_mtu(name: str) -> int:
    with open(f"/sys/class/net/{name}/mtu") as f:
        return int(f.read())


@dataclass
class HostNetwork:
    """The run's bridge (guest side) and netns+veth (baseline side). Everything created is removed."""

    mtu: int
    bridge: str = BRIDGE
    host_ip: str = HOST_IP  # the host's address on the bridge (the far end of the guest -> host tests)
    created: list[ledger.Entry] = field(default_factory=list)  # links and the namespace, in the order made
    procs: list[subprocess.Popen] = field(default_factory=list)
    proc_entries: list[ledger.Entry] = field(default_factory=list)  # the servers, as the run's ledger holds them
    reaped: list[str] = field(default_factory=list)  # a dead run's leftovers removed by setup, for the run's log

    def use_bridge(self, name: str) -> None:
        """Attach the guest to an existing bridge (a back-end's private bridge, which the installer made and
        which holds the node's address), not a bridge of the run's own; it is left as it is afterwards."""
        if not link_exists(name) or not os.path.isdir(f"/sys/class/net/{name}/bridge"):
            raise CloudboxError(
                f"the private network's bridge {name} does not exist on this node; cloudbox installs a back-end's "
                "private NIC as a port of that bridge (reinstall the node with this cloudbox)")
        have = link_mtu(name)
        if self.mtu > have:
            raise CloudboxError(
                f"the profile's MTU {self.mtu} is larger than the private network's ({have} on bridge {name}, "
                f"install answer network.private_mtu); use a profile with network.mtu <= {have}")
        addr = ipv4_of(name)
        if addr is None:
            raise CloudboxError(f"bridge {name} has no IPv4 address (is the front-end's DHCP serving it? "
                                f"`networkctl status {name}`)")
        self.bridge, self.host_ip = name, addr

    def setup_bridge(self) -> None:
        if os.geteuid() != 0:
            raise PermissionProblem("the network suite needs root (it creates a bridge and a network namespace)")
        if link_exists(self.bridge):
            self._reap_bridge()
        self.created.append(ledger.hold(ledger.Link(self.bridge)))
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("link", "set", self.bridge, "mtu", str(self.mtu))
        _ip("addr", "add", f"{HOST_IP}/{PREFIX}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    def setup_macvtap(self) -> None:
        """network.attach = macvtap: a veth pair of the run's whose first end the guest's macvtap (libvirt's, bridge
        mode) and a macvlan holding HOST_IP both sit on; `bridge` is then that end, which the domain names."""
        if os.geteuid() != 0:
            raise PermissionProblem("a macvtap NIC needs root (the run makes a veth pair and a macvlan)")
        if link_exists(MACVTAP_LINK):  # a dead run's (the run holds this host's run lock)
            uppers = [p.name for p in Path(f"/sys/class/net/{MACVTAP_LINK}").glob("upper_*")]
            if any(u != f"upper_{MACVLAN_HOST}" for u in uppers):
                raise CloudboxError(f"link {MACVTAP_LINK} already exists with a guest's macvtap on it: another "
                                    f"cloudbox run is using it; remove it with: ip link del {MACVTAP_LINK}")
            _ip("link", "del", MACVTAP_LINK)
            self.reaped.append(f"link {MACVTAP_LINK} (no guest on it)")
        self.created.append(ledger.hold(ledger.Link(MACVTAP_LINK)))
        _ip("link", "add", MACVTAP_LINK, "mtu", str(self.mtu), "type", "veth", "peer", "name", MACVTAP_PEER,
            "mtu", str(self.mtu))
        self.created.append(ledger.hold(ledger.Link(MACVLAN_HOST)))
        _ip("link", "add", MACVLAN_HOST, "link", MACVTAP_LINK, "type", "macvlan", "mode", "bridge")
        _ip("link", "set", MACVLAN_HOST, "mtu", str(self.mtu))
        _ip("addr", "add", f"{HOST_IP}/{PREFIX}", "dev", MACVLAN_HOST)
        for link in (MACVTAP_LINK, MACVTAP_PEER, MACVLAN_HOST):
            _ip("link", "set", link, "up")
        self.bridge = MACVTAP_LINK

    def setup_sriov(self, vfs: VirtualFunctions) -> None:
        """network.attach = sriov: two VFs of the named NIC (their removal on the caller's stack first), the first
        the host's end with HOST_IP, the second the guest's; `bridge` is then its PCI address, which the domain
        names. Traffic between them goes through the NIC's own switch."""
        host, guest = vfs.create(2)
        if not host.netdev:
            raise CloudboxError(f"--nic {vfs.pf}: its first virtual function ({host.address}) has no network "
                                "interface on this host (no VF driver bound: iavf, ixgbevf, igbvf, mlx5_core...)")
        _ip("link", "set", host.netdev, "mtu", str(self.mtu))
        _ip("addr", "add", f"{HOST_IP}/{PREFIX}", "dev", host.netdev)
        _ip("link", "set", host.netdev, "up")
        self.bridge = guest.address

    def _reap_bridge(self) -> None:
        """The run holds this host's run lock, so an existing bridge of ours is a dead run's: removed when no
        guest is plugged into it, else refused naming its ports."""
        brif = f"/sys/class/net/{self.bridge}/brif"
        ports = sorted(os.listdir(brif)) if os.path.isdir(brif) else None
        if ports is None or ports:
            what = "is not a bridge" if ports is None else f"has ports {', '.join(ports)} (a guest is plugged in)"
            raise CloudboxError(
                f"link {self.bridge} already exists and {what}: another cloudbox run (with another run dir) is "
                f"using it, or something else made it; remove it with: ip link del {self.bridge}")
        _ip("link", "del", self.bridge)
        self.reaped.append(f"bridge {self.bridge} (no guest on it)")

    def setup_netns(self) -> None:
        if os.path.exists(f"/run/netns/{NS}"):
            pids = _ip("netns", "pids", NS, check=False).stdout.split()
            if pids:
                raise CloudboxError(f"network namespace {NS} already exists and processes {', '.join(pids)} run "
                                    f"in it: another cloudbox run is using it; remove it with: ip netns del {NS}")
            _ip("netns", "del", NS)
            self.reaped.append(f"network namespace {NS} (nothing running in it)")
        if link_exists(VETH_HOST):  # its namespace went, its host end stayed
            _ip("link", "del", VETH_HOST)
            self.reaped.append(f"link {VETH_HOST}")
        self.created.append(ledger.hold(ledger.Netns(NS)))
        _ip("netns", "add", NS)
        self.created.append(ledger.hold(ledger.Link(VETH_HOST)))
        _ip("link", "add", VETH_HOST, "mtu", str(self.mtu), "type", "veth", "peer", "name", VETH_NS,
            "mtu", str(self.mtu))
        _ip("link", "set", VETH_NS, "netns", NS)
        _ip("addr", "add", f"{NS_HOST_IP}/{PREFIX}", "dev", VETH_HOST)
        _ip("link", "set", VETH_HOST, "up")
        _ip("-n", NS, "addr", "add", f"{NS_IP}/{PREFIX}", "dev", VETH_NS)
        _ip("-n", NS, "link", "set", VETH_NS, "up")
        _ip("-n", NS, "link", "set", "lo", "up")
        # Prove the baseline path carries full-size frames, as for the guest.
        pc = check_path_mtu(NS_HOST_IP, self.mtu, netns=NS, where=f"namespace {NS}", to=f"this host ({VETH_HOST})")
        if not pc.ok:
            raise CloudboxError(f"baseline path (veth): {pc.message}")

    def start_netserver(self, addr: str) -> int:
        if shutil.which("netserver") is None:
            raise CloudboxError("netserver is not installed on this host (Debian package netperf, non-free)")
        return self._serve("netserver", addr, lambda port: ["netserver", "-D", "-L", addr, "-p", str(port)])

    def start_iperf3(self, addr: str) -> int:
        return self._serve("iperf3", addr, lambda port: ["iperf3", "-s", "-B", addr, "-p", str(port)])

    def _serve(self, name: str, addr: str, argv: Callable[[int], list[str]]) -> int:
        """Start a server on a free port of `addr`; another port when it exits at once (the port was taken
        between free_port() and its bind). Returns the port it answers on."""
        why = ""
        for _ in range(SERVER_TRIES):
            port = free_port()
            with tempfile.TemporaryFile() as err:
                # its own process group: netserver forks a child per test, which teardown must stop too; it dies
                # with the executor, and the run's ledger names it for a clean-up after a kill all the same
                p = subprocess.Popen(argv(port), stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
                                     preexec_fn=die_with_parent())  # noqa: PLW1509 - only prctl
                self.procs.append(p)
                self.proc_entries.append(ledger.hold(ledger.Process(name, p.pid, ledger.start_ticks(p.pid),
                                                                    group=True)))
                rc = _wait_port(addr, port, p)
                if rc is None:
                    return port
                err.seek(0)
                why = f"exited {rc} at once: {err.read().decode(errors='replace').strip()[-300:] or 'no message'}"
            self.procs.remove(p)
            self.proc_entries.pop().done()
        raise CloudboxError(f"{name} on {addr} did not start ({SERVER_TRIES} ports tried; the last {why})")

    def teardown(self) -> None:
        for p in self.procs:
            for sig in (signal.SIGTERM, signal.SIGKILL):  # the whole group: the server and its children
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, sig)
                try:
                    p.wait(timeout=5)
                    break
                except subprocess.TimeoutExpired:
                    continue
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)  # a child that outlived its parent's TERM
        self.procs.clear()
        while self.proc_entries:
            self.proc_entries.pop().done()
        while self.created:
            with contextlib.suppress(CloudboxError):  # left in the ledger, for the next clean-up
                self.created.pop().release()


def ipv4_of(link: str) -> str | None:
    """The first IPv4 address of a link that is not link-local (169.254/16), else None."""
    try:
        infos = json.loads(_ip("-j", "-4", "addr", "show", "dev", link, check=False).stdout or "[]")
    except (OSError, ValueError):  # no iproute2, or output it does not understand
        return None
    for info in infos:
        for a in info.get("addr_info", []):
            if a.get("family") == "inet" and not str(a.get("local", "")).startswith("169.254."):
                return str(a["local"])
    return None


@dataclass
class PathCheck:
    """A don't-fragment ping at full size from here to `target`: the private network's MTU, end to end."""

    target: str
    mtu: int
    ok: bool
    largest: int | None  # the largest frame (IP packet, bytes) that got through, when full size did not
    message: str


def _df_ping(target: str, packet: int, *, netns: str | None, count: int = 2, wait_s: int = 2) -> tuple[bool, str]:
    argv = [*(["ip", "netns", "exec", netns] if netns else []),
            "ping", "-n", "-M", "do", "-s", str(packet - 28), "-c", str(count), "-W", str(wait_s), target]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=count * wait_s + 30)
    return r.returncode == 0, (r.stdout + r.stderr).strip()


def check_path_mtu(target: str, mtu: int, *, netns: str | None = None, where: str = "this host",
                   to: str = "") -> PathCheck:
    """Do `mtu`-byte frames reach `target` with don't-fragment set? When they do not but small ones do, find
    the largest that does (a binary search) and say plainly that something on the path drops jumbo frames."""
    to = to or target
    ok, out = _df_ping(target, mtu, netns=netns)
    if ok:
        return PathCheck(target, mtu, True, mtu, f"{where} -> {to}: {mtu}-byte frames pass (don't-fragment ping)")
    if "message too long" in out.lower():
        local = re.search(r"mtu\s*=\s*(\d+)", out, re.I)
        return PathCheck(target, mtu, False, None,
                         f"{where} -> {to}: {mtu}-byte frames cannot leave this host: the local interface's MTU "
                         f"is {local.group(1) if local else 'smaller'} (the private NIC, its bridge or the route)")
    small, _ = _df_ping(target, 84, netns=netns)
    if not small:
        return PathCheck(target, mtu, False, None, f"{where} -> {to}: {to} does not answer pings at all: {out[-200:]}")
    lo, hi = 84, mtu  # lo passes, hi does not
    if mtu > 1500:  # the usual culprit: a switch at the standard 1500
        lo, hi = (1500, mtu) if _df_ping(target, 1500, netns=netns, count=1, wait_s=1)[0] else (84, 1500)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _df_ping(target, mid, netns=netns, count=1, wait_s=1)[0]:
            lo = mid
        else:
            hi = mid
    return PathCheck(target, mtu, False, lo,
                     f"{where} -> {to}: {mtu}-byte frames are dropped on the way, {lo}-byte frames get through: a "
                     f"switch or NIC between them does not pass jumbo frames. Enable an MTU of {mtu} on it, or "
                     f"install the nodes with network.private_mtu = {1500 if lo >= 1500 else lo}")


SERVER_TRIES = 3
SERVER_START_S = 30.0  # a server answers in well under a second; a loaded 2-core host has taken seconds


def _wait_port(addr: str, port: int, proc: subprocess.Popen, timeout: float = SERVER_START_S) -> int | None:
    """None once `proc` itself listens on addr:port (a connect could reach another program on that port); its exit
    status if it exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rc = proc.poll()
        if rc is not None:
            return rc
        ss = subprocess.run(["ss", "-Hltnp", f"sport = :{port}"], capture_output=True, text=True)
        if f"pid={proc.pid}," in ss.stdout:
            return None
        time.sleep(0.1)
    raise CloudboxError(f"the server on {addr}:{port} (pid {proc.pid}) did not listen within {timeout:.0f} s")


UDHCPC_SCRIPT = "/tmp/cloudbox-udhcpc"
_UDHCPC = ('#!/bin/sh\n[ "$1" = bound ] || exit 0\n'
           'ip addr add "$ip/$mask" dev "$interface" && echo "cloudbox-lease $ip/$mask from $serverid"\n')


def configure_guest(guest, mtu: int, *, host_ip: str = HOST_IP, dhcp: bool = False,
                    address: str = GUEST_IP) -> tuple[str, str]:
    """Give the guest's NIC its MTU and address (`address`, link-local on the run's bridge, or, on a back-end's
    private bridge, a lease from the front-end's DHCP server, busybox udhcpc); verify the path to the host with a
    don't-fragment ping. Returns the NIC's name and its address."""
    r = guest.sh("for d in /sys/class/net/*; do n=${d##*/}; [ $n = lo ] || echo $n; done", timeout=30).check()
    nics = r.stdout.split()
    if len(nics) != 1:
        raise GuestError(f"expected one NIC in the guest, found: {nics or 'none'}")
    nic = nics[0]
    if dhcp:
        guest.sh(f"printf '%s' '{_UDHCPC}' > {UDHCPC_SCRIPT} && chmod +x {UDHCPC_SCRIPT} && "
                 f"ip link set dev {nic} mtu {mtu} && ip link set dev {nic} up", timeout=30, check=True)
        p = guest.sh(f"udhcpc -i {nic} -f -q -n -t 10 -T 2 -s {UDHCPC_SCRIPT}", timeout=90)
        m = re.search(r"cloudbox-lease (\S+)/(\d+)", p.stdout)
        if p.exitcode != 0 or not m:
            raise GuestError(f"the guest got no address from the front-end's DHCP server on the private network "
                             f"(udhcpc on {nic} exited {p.exitcode}): {(p.stdout + p.stderr).strip()[-300:]}")
        address = m.group(1)
    else:
        guest.sh(f"ip link set dev {nic} mtu {mtu} && ip addr replace {address}/{PREFIX} dev {nic} && "
                 f"ip link set dev {nic} up", timeout=30, check=True)
    # The link may need a moment (carrier); retry the path check briefly.
    guest_path(guest, host_ip, mtu, tries=10)
    return nic, address


def guest_route(guest, target: str, via: str) -> None:
    """A route in the guest to `target`, another address of its host (off the bridge's subnet), through the host's
    bridge address `via`: the host takes it as its own."""
    guest.sh(f"ip route replace {target}/32 via {via}", timeout=30, check=True)


def guest_path(guest, target: str, mtu: int, *, tries: int = 2) -> None:
    """A don't-fragment ping at full size from the guest to `target` (its host, the front-end), tried up to
    `tries` times a second apart; a CloudboxError with ping's words when none passes."""
    last = ""
    for i in range(tries):
        p = guest.run(["ping", "-M", "do", "-s", str(mtu - 28), "-c", "1", "-W", "2", target], timeout=30)
        if p.exitcode == 0:
            return
        last = (p.stdout + p.stderr).strip()
        if i + 1 < tries:
            time.sleep(1)
    raise CloudboxError(
        f"MTU check failed: a {mtu}-byte don't-fragment ping from the guest to {target} did not pass: {last[-300:]}")


# ---- a stopped path: where frames stop, and what brings them back ---------------------------------------------

_STATS = ("tx_packets", "rx_packets", "tx_dropped", "rx_dropped")
_PORT_STATES = {0: "disabled", 1: "listening", 2: "learning", 3: "forwarding", 4: "blocking"}
PROBE_PINGS = 3


def link_stats(link: str) -> dict[str, int] | None:
    """A host link's packet counters (None when it is gone)."""
    try:
        return {k: int(Path(f"/sys/class/net/{link}/statistics/{k}").read_text()) for k in _STATS}
    except (OSError, ValueError):
        return None


def _tap_up(tap: str) -> bool:
    try:
        return bool(int(Path(f"/sys/class/net/{tap}/flags").read_text(), 16) & 1)  # IFF_UP
    except (OSError, ValueError):
        return False


def _port_state(tap: str) -> int | None:
    try:
        return int(Path(f"/sys/class/net/{tap}/brport/state").read_text())
    except (OSError, ValueError):
        return None


def _delta(a: dict[str, int] | None, b: dict[str, int] | None, key: str) -> int | None:
    return b[key] - a[key] if a is not None and b is not None else None


def _n(v: int | None) -> str:
    return "?" if v is None else f"+{v}"


@dataclass
class Rings:
    """QEMU's own counters of a virtio-net NIC's rings over a probe (Guest.virtio_net_queues), the hop inside QEMU
    that the host's and the guest's packet counters cannot see. Ring indices are 16-bit and wrap."""

    rx_delivered: int  # frames QEMU put in the guest's receive ring
    rx_free: int  # receive buffers the guest had posted that QEMU had not filled yet, at the end
    rx_used: int
    rx_signalled: int  # the ring's used index at QEMU's last interrupt to the guest
    tx_taken: int  # frames QEMU took off the guest's transmit ring
    tx_waiting: int  # frames the guest had queued that QEMU had not taken, at the end

    @classmethod
    def between(cls, a: dict[str, dict[str, int]] | None, b: dict[str, dict[str, int]] | None) -> Rings | None:
        if a is None or b is None:
            return None

        def d(x: int, y: int) -> int:
            return (y - x) & 0xFFFF

        rx, tx = b["rx"], b["tx"]
        return cls(rx_delivered=d(a["rx"]["used_idx"], rx["used_idx"]),
                   rx_free=d(rx["last_avail_idx"], rx["shadow_avail_idx"]),
                   rx_used=rx["used_idx"], rx_signalled=rx["signalled_used"],
                   tx_taken=d(a["tx"]["last_avail_idx"], tx["last_avail_idx"]),
                   tx_waiting=d(tx["last_avail_idx"], tx["shadow_avail_idx"]))

    def __str__(self) -> str:
        return (f"QEMU virtio-net: receive ring +{self.rx_delivered} filled, {self.rx_free} free buffers "
                f"(used {self.rx_used}, last interrupt at {self.rx_signalled}); transmit ring +{self.tx_taken} taken, "
                f"{self.tx_waiting} waiting")


@dataclass
class PathProbe:
    """PROBE_PINGS pings from the guest to the far end, with every hop's packet counters read before and after:
    the guest's NIC, the host's tap (frames from the guest arrive there as its rx; frames to the guest leave as
    its tx, or are dropped there when nobody reads its queue), and, when the far end is this host, the bridge
    (its rx: frames delivered up to this host's stack; its tx: what this host sent)."""

    ok: bool
    hop: str  # "" when ok; else where the frames stop, in words
    counters: str  # each hop's counters over the probe, in words
    guest_log: str = ""  # the guest's last kernel messages and /proc/net/dev, when the path is dead


@dataclass
class GuestLink:
    """A guest's NIC and its path to the far end of its network tests: probed hop by hop when a test hangs, and
    brought back by re-plugging (GuestLink.replug) when no frames pass."""

    guest: Guest
    nic: str  # the NIC's name in the guest
    target: str  # the far end (this host on the run's bridge, or the front-end beyond a back-end's bridge)
    bridge: str
    mtu: int
    local: bool = True  # target is this host's own address on `bridge`
    _tap: str | None = None

    @property
    def tap(self) -> str | None:
        if self._tap is None:
            iface = read_domain(self.guest.xml()).interface  # libvirt names the tap in the live XML
            self._tap = iface.tap if iface is not None else None
        return self._tap

    def _guest_stats(self) -> dict[str, int] | None:
        try:
            r = self.guest.sh(f"cd /sys/class/net/{self.nic}/statistics && cat {' '.join(_STATS)}",
                              timeout=20)
            vals = [int(v) for v in r.stdout.split()]
        except (GuestError, ValueError):
            return None
        return dict(zip(_STATS, vals, strict=True)) if len(vals) == len(_STATS) else None

    def probe(self) -> PathProbe:
        tap = self.tap
        g0, t0, b0 = self._guest_stats(), link_stats(tap) if tap else None, link_stats(self.bridge)
        q0 = self.guest.virtio_net_queues()
        p = self.guest.run(["ping", "-n", "-c", str(PROBE_PINGS), "-W", "2", self.target],
                           timeout=30)
        g1, t1, b1 = self._guest_stats(), link_stats(tap) if tap else None, link_stats(self.bridge)
        rings = Rings.between(q0, self.guest.virtio_net_queues())
        gtx, grx = _delta(g0, g1, "tx_packets"), _delta(g0, g1, "rx_packets")
        from_guest, to_guest = _delta(t0, t1, "rx_packets"), _delta(t0, t1, "tx_packets")
        dropped = _delta(t0, t1, "tx_dropped")
        brx, btx = _delta(b0, b1, "rx_packets"), _delta(b0, b1, "tx_packets")
        counters = (f"guest {self.nic}: sent {_n(gtx)}, received {_n(grx)}; host tap {tap or '?'}: from the guest "
                    f"{_n(from_guest)}, to the guest {_n(to_guest)}, dropped {_n(dropped)}")
        if self.local:
            counters += f"; bridge {self.bridge}: up to this host {_n(brx)}, from this host {_n(btx)}"
        if rings is not None:
            counters += f"; {rings}"
        if p.exitcode == 0:
            return PathProbe(True, "", counters)
        hop = self._where(tap, gtx, grx, from_guest, to_guest, dropped, brx, btx, rings)
        try:
            glog = self.guest.sh("dmesg | tail -n 6; cat /proc/net/dev", timeout=20).stdout.strip()
        except GuestError as e:
            glog = f"(not readable: {e})"
        return PathProbe(False, hop, counters, glog)

    def _where(self, tap, gtx, grx, from_guest, to_guest, dropped, brx, btx, rings: Rings | None = None) -> str:
        # A hop passes when at least as many frames crossed it as pings were sent; fewer are stray ARP or ND.
        def low(v: int | None) -> bool:
            return v is not None and v < PROBE_PINGS

        nic, br = self.nic, self.bridge
        if tap and not _tap_up(tap):
            return f"the host's tap {tap}: it is down"
        state = _port_state(tap) if tap else None
        if state is not None and state != 3:
            return f"the bridge {br}: its port {tap} is not forwarding (state {_PORT_STATES.get(state, state)})"
        if low(gtx):
            return f"the guest's NIC {nic}: it sent {gtx} frames for {PROBE_PINGS} pings (its transmit queue is stuck)"
        if low(from_guest):
            seen = f"the guest's {nic} sent {gtx} frames, the host's tap {tap} received {from_guest}"
            if rings is not None and rings.tx_taken < PROBE_PINGS:
                return (f"QEMU's virtio-net transmit side: {seen}; QEMU took {rings.tx_taken} of them off the "
                        f"guest's transmit ring ({rings.tx_waiting} still waiting there)")
            return f"QEMU's NIC, guest -> host: {seen}"
        if self.local and low(brx):
            return f"the bridge {br}: tap {tap} received {from_guest} frames from the guest, {brx} reached this host"
        if self.local and low(btx):
            return (f"this host: {brx} frames reached it over bridge {br}, it sent {btx} back (a firewall rule, or "
                    "the address is gone)")
        if low(to_guest) and not dropped:
            return (f"the way back to the guest: {to_guest} frames were sent to tap {tap}"
                    + ("" if self.local else f" (does {self.target} answer on the private network?)"))
        if low(grx):
            seen = (f"the host put {to_guest} frames on tap {tap}"
                    + (f" and dropped {dropped} more there (nobody read its queue)" if dropped else "")
                    + f", the guest's {nic} received {grx}")
            if rings is not None and rings.rx_free == 0:
                return (f"the guest's receive ring: {seen}; it has no free buffer for QEMU to fill (the guest's "
                        "driver stopped refilling it)")
            if rings is not None and rings.rx_delivered >= PROBE_PINGS:
                return (f"the guest's NIC driver: {seen}; QEMU put {rings.rx_delivered} frames in its receive ring "
                        f"and the guest took none (ring used {rings.rx_used}, last interrupt at "
                        f"{rings.rx_signalled})")
            return f"QEMU's NIC, host -> guest: {seen}"
        return "no single hop: frames moved both ways, yet no ping was answered"

    def path_ok(self, tries: int = 5) -> bool:
        try:
            guest_path(self.guest, self.target, self.mtu, tries=tries)
        except CloudboxError:
            return False
        return True

    def _cable(self) -> None:
        """Unplug the NIC's virtual cable and plug it again (libvirt's link state, QEMU's set_link)."""
        import libvirt

        dom = self.guest.dom
        iface = read_domain(dom.XMLDesc(0)).interface
        if iface is None:
            raise CloudboxError("the guest has no NIC in its domain XML")
        try:
            for state in ("down", "up"):
                iface.link = state
                dom.updateDeviceFlags(iface.xml(), libvirt.VIR_DOMAIN_AFFECT_LIVE)
                time.sleep(1)
        except libvirt.libvirtError as e:
            raise CloudboxError(f"libvirt could not change the NIC's link state: {e}") from e

    def _reset_device(self) -> None:
        """Reset the NIC's device from inside the guest: its driver unbound and bound again (the device's queues
        are reset on both sides, which brings back a transmit queue that stopped moving), then its MTU and
        IPv4 address put back."""
        nic = self.nic
        script = (
            f"set -e; addr=$(ip -o -4 addr show dev {nic} | awk '{{print $4}}' | head -n 1); "
            f"dev=$(basename \"$(readlink /sys/class/net/{nic}/device)\"); "
            f"drv=$(readlink -f /sys/class/net/{nic}/device/driver); "
            'echo "$dev" > "$drv/unbind"; echo "$dev" > "$drv/bind"; i=0; '
            f"while [ ! -e /sys/class/net/{nic} ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done; "
            f"ip link set dev {nic} mtu {self.mtu}; "
            f'[ -z "$addr" ] || ip addr add "$addr" dev {nic}; ip link set dev {nic} up')
        self.guest.sh(script, timeout=60, check=True)

    def replug(self, log: Callable[[str], None]) -> str | None:
        """Try, in order, what brings a stopped path back, each checked with a full-size ping: on the host, a tap
        that is down set up, a bridge port that does not forward set to forwarding; in the guest, the NIC taken down
        and up (its driver refills and re-arms its queues); the NIC's virtual cable unplugged and plugged again
        through libvirt; the NIC's device reset from the guest (GuestLink._reset_device). Returns what brought the
        path back, None if nothing did."""
        tap, nic = self.tap, self.nic
        steps: list[tuple[str, Callable[[], object]]] = []
        if tap and not _tap_up(tap):
            steps.append((f"the host's tap {tap} set up again", lambda: _ip("link", "set", "dev", str(tap), "up")))
        state = _port_state(tap) if tap else None
        if state is not None and state != 3:
            steps.append((f"bridge port {tap} set to forwarding",
                          lambda: subprocess.run(["bridge", "link", "set", "dev", str(tap), "state", "3"],
                                                 check=True, capture_output=True)))
        steps.append((f"the guest's {nic} taken down and up",
                      lambda: self.guest.sh(f"ip link set dev {nic} down && ip link set dev {nic} up",
                                            timeout=30, check=True)))
        steps.append(("the NIC's virtual cable unplugged and plugged again (libvirt link state)", self._cable))
        steps.append((f"the guest's {nic} device reset (its driver unbound and bound again)", self._reset_device))
        for what, act in steps:
            try:
                act()
            except (CloudboxError, OSError, subprocess.CalledProcessError) as e:
                log(f"guest network: {what}: failed ({e})")
                continue
            if self.path_ok():
                return what
            log(f"guest network: {what}: the path is still dead")
        return None

    def after_hang(self, what: str, log: Callable[[str], None]) -> str:
        """After `what` hung: probe the path; a dead one is logged with its counters and the guest's kernel
        messages, then re-plugged. Returns a note for the measurement's raw output; raises NicStalled when the
        path stays dead."""
        pr = self.probe()
        if pr.ok:
            return f"the path to {self.target} still answered pings ({pr.counters}): the tool or its server hung"
        log(f"guest network: the path to {self.target} is dead; frames stop at {pr.hop}. Counters over "
            f"{PROBE_PINGS} pings: {pr.counters}. The guest's kernel messages and /proc/net/dev:\n{pr.guest_log}")
        fixed = self.replug(log)
        if fixed is None:
            raise NicStalled(f"guest: {what} hung and the guest's network stopped: frames stop at {pr.hop} "
                             f"({pr.counters}); re-plugging the NIC did not bring it back", pr.hop)
        log(f"guest network: {fixed}: the path to {self.target} answers again")
        return (f"the path to {self.target} was dead, frames stopped at {pr.hop} ({pr.counters}); {fixed} brought "
                "it back")


def private_address() -> str:
    """The private link's IPv4 address, else 0.0.0.0. Link-local addresses (169.254/16, which networkd's
    LinkLocalAddressing can add beside the real one) are passed over."""
    link = nodeconf.private_link(nodeconf.settings())
    return (ipv4_of(link) if link else None) or "0.0.0.0"


@contextlib.contextmanager
def frames_to(target: str, mtu: int, log: Callable[[str], None] = lambda _s: None):
    """This host's connections to `target` at `mtu`-byte frames for the block's length, as the guest's are: a host
    route to it over the link (and gateway) the kernel picks, its MTU locked at `mtu` and the MSS it offers set to
    match (so the far end sends no larger segments either), when that link's MTU is larger; deleted afterwards.
    Yields the link's own MTU, or None when nothing had to change."""
    r = _ip("-j", "route", "get", target)
    routes = json.loads(r.stdout or "[]")
    dev = routes[0].get("dev", "") if routes else ""
    if not dev or link_mtu(dev) <= mtu:
        yield None
        return
    have = _ip("-j", "route", "show", "exact", f"{target}/32", check=False)
    if json.loads(have.stdout or "[]"):
        raise CloudboxError(f"this host already has a route of its own to {target} ({have.stdout.strip()[:200]}): "
                            f"cloudbox will not replace it to measure at the guest's MTU {mtu}")
    via = ["via", routes[0]["gateway"]] if routes[0].get("gateway") else []
    src = ["src", routes[0]["prefsrc"]] if routes[0].get("prefsrc") else []
    route = [f"{target}/32", *via, "dev", dev, *src]
    own = link_mtu(dev)
    _ip("route", "add", *route, "mtu", "lock", str(mtu), "advmss", str(mtu - 40))
    log(f"this host -> {target}: frames of {mtu} bytes as the guest's (a host route over {dev}, whose MTU is {own})")
    try:
        yield own
    finally:
        _ip("route", "del", *route, check=False)


def check_private_path(address: str, name: str = "") -> tuple[str, PathCheck] | None:
    """Full-size don't-fragment pings from this node's private link to `address` (another node): (the link,
    a PathCheck, which names a switch that drops jumbo frames), or None when this host has no private
    network."""
    link = nodeconf.private_link(nodeconf.settings())
    if not link or not link_exists(link):
        return None
    return link, check_path_mtu(address, link_mtu(link), where=f"{platform.node()} ({link})",
                                        to=f"{name} ({address})" if name else address)
