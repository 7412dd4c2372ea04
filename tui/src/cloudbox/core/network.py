"""Network tests: netperf (TCP_STREAM, TCP_MAERTS, TCP_RR) or iperf3 between the guest and its host, and the
same tests between the host and a network namespace over veth as the bare-metal baseline. On a back-end run
for a front-end, the guest joins the node's private bridge and the same tests also go to the front-end (test ids
with "-fe"), beside the bare-metal baseline back-end host -> front-end: study A's guest -> other host.

The guest's NIC sits on a bridge cloudbox creates for the run, with the profile's MTU on the bridge, the
tap (libvirt <mtu>) and the guest's interface; a don't-fragment ping of full size proves the path
before any test. Addresses are IPv4 link-local (169.254.0.0/16): host-only links that never route.
Control of the guest goes through the guest agent, never this network.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .errors import Aborted, CloudboxError, GuestError, GuestTimeout, PermissionProblem

BRIDGE = "cbbr0"
HOST_IP = "169.254.100.1"
GUEST_IP = "169.254.100.2"
NS = "cbns0"
VETH_HOST, VETH_NS = "cbveth0", "cbveth1"
NS_HOST_IP, NS_IP = "169.254.101.1", "169.254.101.2"
PREFIX = 24


@dataclass(frozen=True)
class NetTest:
    id: str
    tool: str  # netperf | iperf3
    kind: str  # TCP_STREAM | TCP_MAERTS | TCP_RR | tx | rx
    metric: str
    direction: str


NET_TESTS: dict[str, NetTest] = {t.id: t for t in [
    NetTest("tcp-stream", "netperf", "TCP_STREAM", "Mbit/s", "guest -> host"),
    NetTest("tcp-maerts", "netperf", "TCP_MAERTS", "Mbit/s", "host -> guest"),
    NetTest("tcp-rr", "netperf", "TCP_RR", "trans/s", "request/response"),
    NetTest("iperf3-tx", "iperf3", "tx", "Mbit/s", "guest -> host"),
    NetTest("iperf3-rx", "iperf3", "rx", "Mbit/s", "host -> guest"),
]}
FRONTEND_SUFFIX = "-fe"
_FE_DIRECTIONS = {"guest -> host": "guest -> front-end", "host -> guest": "front-end -> guest",
                  "request/response": "request/response with the front-end"}


def frontend_test(t: NetTest) -> NetTest:
    """The same test with the front-end as the far end (its baseline: this node's host -> the front-end)."""
    return NetTest(t.id + FRONTEND_SUFFIX, t.tool, t.kind, t.metric, _FE_DIRECTIONS.get(t.direction, t.direction))


NET_SETS = {"netperf": ["tcp-stream", "tcp-maerts", "tcp-rr"], "iperf3": ["iperf3-tx", "iperf3-rx"],
            "both": ["tcp-stream", "tcp-maerts", "tcp-rr", "iperf3-tx", "iperf3-rx"]}


@dataclass
class NetResult:
    test: str
    value: float
    metric: str
    lat_us: float | None
    raw: str
    hung: int = 0  # attempts before this one that hung and were killed (see _retrying)


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class HostNetwork:
    """The run's bridge (guest side) and netns+veth (baseline side). Everything created is removed."""

    mtu: int
    bridge: str = BRIDGE
    host_ip: str = HOST_IP  # the host's address on the bridge (the far end of the guest -> host tests)
    created: list[tuple[str, str]] = field(default_factory=list)
    procs: list[subprocess.Popen] = field(default_factory=list)

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
            raise CloudboxError(
                f"bridge {self.bridge} already exists: another cloudbox run is using it, or a crashed run "
                f"left it behind (remove it with: ip link del {self.bridge})")
        _ip("link", "add", self.bridge, "type", "bridge")
        self.created.append(("link", self.bridge))
        _ip("link", "set", self.bridge, "mtu", str(self.mtu))
        _ip("addr", "add", f"{HOST_IP}/{PREFIX}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    def setup_netns(self) -> None:
        if os.path.exists(f"/run/netns/{NS}"):
            raise CloudboxError(f"network namespace {NS} already exists (remove it with: ip netns del {NS})")
        _ip("netns", "add", NS)
        self.created.append(("netns", NS))
        _ip("link", "add", VETH_HOST, "mtu", str(self.mtu), "type", "veth", "peer", "name", VETH_NS,
            "mtu", str(self.mtu))
        self.created.append(("link", VETH_HOST))
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
        port = free_port()
        p = subprocess.Popen(["netserver", "-D", "-L", addr, "-p", str(port)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        self.procs.append(p)
        _wait_port(addr, port)
        return port

    def start_iperf3(self, addr: str) -> int:
        port = free_port()
        p = subprocess.Popen(["iperf3", "-s", "-B", addr, "-p", str(port)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        self.procs.append(p)
        _wait_port(addr, port)
        return port

    def teardown(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        self.procs.clear()
        while self.created:
            kind, name = self.created.pop()
            if kind == "link" and link_exists(name):
                _ip("link", "del", name, check=False)
            elif kind == "netns":
                _ip("netns", "del", name, check=False)


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


def _wait_port(addr: str, port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((addr, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise CloudboxError(f"server on {addr}:{port} did not start within {timeout:.0f} s")


UDHCPC_SCRIPT = "/tmp/cloudbox-udhcpc"
_UDHCPC = ('#!/bin/sh\n[ "$1" = bound ] || exit 0\n'
           'ip addr add "$ip/$mask" dev "$interface" && echo "cloudbox-lease $ip/$mask from $serverid"\n')


def configure_guest(guest, mtu: int, *, host_ip: str = HOST_IP, dhcp: bool = False) -> tuple[str, str]:
    """Give the guest's NIC its MTU and address (a fixed link-local one on the run's bridge, or, on a back-end's
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
        guest.sh(f"ip link set dev {nic} mtu {mtu} && ip addr add {GUEST_IP}/{PREFIX} dev {nic} && "
                 f"ip link set dev {nic} up", timeout=30, check=True)
        address = GUEST_IP
    # The link may need a moment (carrier); retry the path check briefly.
    guest_path(guest, host_ip, mtu, tries=10)
    return nic, address


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


def netperf_args(t: NetTest, host: str, port: int, seconds: int) -> list[str]:
    return ["netperf", "-H", host, "-p", str(port), "-t", t.kind, "-l", str(seconds), "-P", "0", "--",
            "-o", "THROUGHPUT,THROUGHPUT_UNITS,MEAN_LATENCY"]


def iperf3_args(t: NetTest, host: str, port: int, seconds: int) -> list[str]:
    return ["iperf3", "-c", host, "-p", str(port), "-t", str(seconds), "-J", *(["-R"] if t.kind == "rx" else [])]


def parse_netperf(t: NetTest, text: str) -> NetResult:
    for line in reversed(text.strip().splitlines()):
        parts = line.strip().split(",")
        if len(parts) >= 3:
            try:
                value, lat = float(parts[0]), float(parts[2])
            except ValueError:
                continue
            return NetResult(t.id, value, t.metric, lat, text)
    raise CloudboxError(f"netperf ({t.id}) output not understood: {text.strip()[-300:]}")


def parse_iperf3(t: NetTest, text: str) -> NetResult:
    try:
        data = json.loads(text)
    except ValueError as e:
        raise CloudboxError(f"iperf3 ({t.id}) printed invalid JSON: {text.strip()[-300:]}") from e
    if "error" in data:
        raise CloudboxError(f"iperf3 ({t.id}): {data['error']}")
    bps = data["end"]["sum_received"]["bits_per_second"]
    return NetResult(t.id, bps / 1e6, "Mbit/s", None, text)


def parse(t: NetTest, text: str) -> NetResult:
    return parse_netperf(t, text) if t.tool == "netperf" else parse_iperf3(t, text)


ATTEMPTS = 2  # a test tool that hangs is killed and the test run once more


def hang_limit(seconds: int) -> float:
    """How long a network test of `seconds` may take before it counts as hung: twice its length plus 40 s for
    the tool's start and end under emulation (a 3 s netperf takes about 5 s in a TCG guest)."""
    return seconds * 2 + 40


class _Hung(Exception):
    """One attempt did not finish within its limit and was killed; the text says what was seen at the time."""


def _retrying(where: str, t: NetTest, target: str, port: int, limit: float, attempts: int,
              log: Callable[[str], None], once: Callable[[], str]) -> NetResult:
    """Run `once` (one attempt, its output) up to `attempts` times while it hangs. A test tool can hang for good
    (seen once in CI: netperf TCP_MAERTS in a TCG guest never ended, where a dozen repeats of the same run did
    not hang); a hang is logged with the sockets it held, then the test runs again. The result says how many
    attempts hung (NetResult.hung); hanging every time is an error naming the tool, the test and the server."""
    seen: list[str] = []
    for attempt in range(1, attempts + 1):
        try:
            out = once()
        except _Hung as e:
            seen.append(str(e))
            log(f"{where}: {t.tool} ({t.id}) to {target} port {port} hung: no end after {limit:.0f} s, killed "
                f"(attempt {attempt} of {attempts}){'; running it again' if attempt < attempts else ''}. "
                f"Sockets then: {e}")
            continue
        res = parse(t, out)
        res.hung = len(seen)
        return res
    raise CloudboxError(f"{where}: {t.tool} ({t.id}) to {target} port {port} hung {attempts} times (killed after "
                        f"{limit:.0f} s each): is the server there still answering? Sockets at the last hang: "
                        f"{seen[-1] if seen else '-'}")


def _progress_of(seconds: int, progress: Callable[[dict], None]) -> Callable[[float], None]:
    def report(start: float) -> None:
        el = time.monotonic() - start
        progress({"pct": min(99.0, 100 * el / seconds), "eta": f"{max(0, seconds - el):.0f}s"})
    return report


def run_in_guest(guest, t: NetTest, port: int, seconds: int, progress: Callable[[dict], None],
                 cancelled: Callable[[], bool], target: str = HOST_IP, *, hang_s: float | None = None,
                 attempts: int = ATTEMPTS, log: Callable[[str], None] = lambda _: None) -> NetResult:
    """The test from the guest to `target`, through the guest agent; a hang (no end after `hang_s`, by default
    hang_limit(seconds)) is killed in the guest and the test run again (see _retrying)."""
    args = (netperf_args if t.tool == "netperf" else iperf3_args)(t, target, port, seconds)
    limit = hang_s if hang_s is not None else hang_limit(seconds)
    report = _progress_of(seconds, progress)

    def once() -> str:
        start = time.monotonic()

        def poll() -> None:
            if cancelled():
                raise Aborted("cancelled during a guest network test")
            report(start)

        seen = ["not looked at"]

        def look() -> None:  # the hung tool's sockets, before it is killed (busybox netstat: no ss there)
            try:
                ns = guest.sh(f"netstat -tn 2>&1 | grep -F ' {target}:'", timeout=20)
                seen[0] = " | ".join(" ".join(ln.split()) for ln in ns.stdout.strip().splitlines()) or "none"
            except GuestError as e:
                seen[0] = f"not readable ({e})"

        try:
            r = guest.run(args, timeout=limit, poll=poll, interval=1.0, on_timeout=look)
        except GuestTimeout as e:
            raise _Hung(f"in the guest: {seen[0]}") from e
        if r.exitcode != 0:
            raise GuestError(f"{t.tool} ({t.id}) in the guest exited {r.exitcode}: {(r.stderr or r.stdout)[-300:]}")
        return r.stdout

    return _retrying("guest", t, target, port, limit, attempts, log, once)


def run_baseline(t: NetTest, port: int, seconds: int, progress: Callable[[dict], None],
                 cancelled: Callable[[], bool], target: str = NS_HOST_IP, netns: str | None = NS, *,
                 hang_s: float | None = None, attempts: int = ATTEMPTS,
                 log: Callable[[str], None] = lambda _: None) -> NetResult:
    """The bare-metal side: from the namespace to the host over veth, or (netns None) from the host itself to
    `target` (a back-end host -> the front-end). A hang is killed and retried as in the guest."""
    args = (netperf_args if t.tool == "netperf" else iperf3_args)(t, target, port, seconds)
    limit = hang_s if hang_s is not None else hang_limit(seconds)
    report = _progress_of(seconds, progress)
    prefix = ["ip", "netns", "exec", netns] if netns else []

    def once() -> str:
        proc = subprocess.Popen([*prefix, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        start = time.monotonic()
        try:
            while proc.poll() is None:
                if cancelled():
                    raise Aborted("cancelled during a bare-metal network test")
                if time.monotonic() - start > limit:
                    ss = subprocess.run([*prefix, "ss", "-tn", "dst", target], capture_output=True, text=True)
                    seen = " | ".join(" ".join(ln.split()) for ln in ss.stdout.strip().splitlines()[1:]) or "none"
                    raise _Hung(f"on {'namespace ' + netns if netns else 'this host'}: {seen}")
                report(start)
                time.sleep(0.5)
            out, err = proc.communicate()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        if proc.returncode != 0:
            raise CloudboxError(f"bare-metal {t.tool} ({t.id}) exited {proc.returncode}: {(err or out)[-300:]}")
        return out

    return _retrying("bare metal", t, target, port, limit, attempts, log, once)
