"""Network tests: netperf (TCP_STREAM, TCP_MAERTS, TCP_RR) or iperf3 between the guest and its host, and the
same tests between the host and a network namespace over veth as the bare-metal baseline.

The guest's NIC sits on a bridge cloudbox creates for the run, with the profile's MTU on the bridge, the
tap (libvirt <mtu>) and the guest's interface; a don't-fragment ping of full size proves the path
before any test. Addresses are IPv4 link-local (169.254.0.0/16): host-only links that never route.
Control of the guest goes through the guest agent, never this network.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .errors import Aborted, CloudboxError, GuestError, PermissionProblem

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
NET_SETS = {"netperf": ["tcp-stream", "tcp-maerts", "tcp-rr"], "iperf3": ["iperf3-tx", "iperf3-rx"],
            "both": ["tcp-stream", "tcp-maerts", "tcp-rr", "iperf3-tx", "iperf3-rx"]}


@dataclass
class NetResult:
    test: str
    value: float
    metric: str
    lat_us: float | None
    raw: str


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
    created: list[tuple[str, str]] = field(default_factory=list)
    procs: list[subprocess.Popen] = field(default_factory=list)

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
        r = subprocess.run(["ip", "netns", "exec", NS, "ping", "-M", "do", "-s", str(self.mtu - 28), "-c", "1",
                            "-W", "3", NS_HOST_IP], capture_output=True, text=True)
        if r.returncode != 0:
            raise CloudboxError(f"baseline path (veth) does not carry {self.mtu}-byte frames: {r.stdout.strip()}")

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


def _wait_port(addr: str, port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((addr, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise CloudboxError(f"server on {addr}:{port} did not start within {timeout:.0f} s")


def configure_guest(guest, mtu: int) -> str:
    """Give the guest's NIC its address and MTU; verify the path with a don't-fragment ping."""
    r = guest.sh("for d in /sys/class/net/*; do n=${d##*/}; [ $n = lo ] || echo $n; done", timeout=30).check()
    nics = r.stdout.split()
    if len(nics) != 1:
        raise GuestError(f"expected one NIC in the guest, found: {nics or 'none'}")
    nic = nics[0]
    guest.sh(f"ip link set dev {nic} mtu {mtu} && ip addr add {GUEST_IP}/{PREFIX} dev {nic} && "
             f"ip link set dev {nic} up", timeout=30, check=True)
    # The link may need a moment (carrier); retry the path check briefly.
    last = ""
    for _ in range(10):
        p = guest.run(["ping", "-M", "do", "-s", str(mtu - 28), "-c", "1", "-W", "2", HOST_IP], timeout=30)
        if p.exitcode == 0:
            return nic
        last = (p.stdout + p.stderr).strip()
        time.sleep(1)
    raise CloudboxError(
        f"MTU check failed: a {mtu}-byte don't-fragment ping from the guest to {HOST_IP} did not pass "
        f"(bridge {BRIDGE} mtu {link_mtu(BRIDGE) if link_exists(BRIDGE) else '?'}): {last[-300:]}")


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


def run_in_guest(guest, t: NetTest, port: int, seconds: int, progress: Callable[[dict], None],
                 cancelled: Callable[[], bool]) -> NetResult:
    args = (netperf_args if t.tool == "netperf" else iperf3_args)(t, HOST_IP, port, seconds)
    start = time.monotonic()

    def poll() -> None:
        if cancelled():
            raise Aborted("cancelled during a guest network test")
        el = time.monotonic() - start
        progress({"pct": min(99.0, 100 * el / seconds), "eta": f"{max(0, seconds - el):.0f}s"})

    r = guest.run(args, timeout=seconds * 3 + 60, poll=poll, interval=1.0)
    if r.exitcode != 0:
        raise GuestError(f"{t.tool} ({t.id}) in the guest exited {r.exitcode}: {(r.stderr or r.stdout)[-300:]}")
    return parse(t, r.stdout)


def run_baseline(t: NetTest, port: int, seconds: int, progress: Callable[[dict], None],
                 cancelled: Callable[[], bool]) -> NetResult:
    args = (netperf_args if t.tool == "netperf" else iperf3_args)(t, NS_HOST_IP, port, seconds)
    proc = subprocess.Popen(["ip", "netns", "exec", NS, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    start = time.monotonic()
    try:
        while proc.poll() is None:
            if cancelled():
                raise Aborted("cancelled during a bare-metal network test")
            el = time.monotonic() - start
            progress({"pct": min(99.0, 100 * el / seconds), "eta": f"{max(0, seconds - el):.0f}s"})
            time.sleep(0.5)
        out, err = proc.communicate()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    if proc.returncode != 0:
        raise CloudboxError(f"bare-metal {t.tool} ({t.id}) exited {proc.returncode}: {(err or out)[-300:]}")
    return parse(t, out)
