"""The private network's checks and the cross-node network tests, on this one host with real parts.

- A "switch" that drops jumbo frames: three network namespaces, the middle one a Linux bridge whose port towards
  the far node has an MTU of 1500 (a bridge drops frames larger than the egress port's MTU, as such a switch
  does). `network.check_path_mtu` must say so, with the largest frame that passes.
- A back-end's run for a front-end: the host gets a private bridge (as the installer makes cbpriv0) with a veth
  port to a network namespace standing in for the front-end, which serves DHCP (busybox udhcpd, as networkd's
  DHCP server does on a real front-end) and netserver. A real TCG guest joins the bridge, takes a lease, and the
  guest -> front-end tests run beside the back-end host -> front-end baseline.
"""

from __future__ import annotations

import ipaddress
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from run_trouble import warn_run_trouble

from cloudbox.core.errors import CloudboxError, UsageError
from cloudbox.core.record.provenance import PrivateNetwork, Provenance
from cloudbox.core.record.results import ResultStore
from cloudbox.core.run import runs
from cloudbox.core.run.context import host_labels
from cloudbox.core.run.network_steps import check_private_network
from cloudbox.core.run.sink import EventSink
from cloudbox.core.spec import addresses, catalogue
from cloudbox.core.spec.runspec import RunSpec
from cloudbox.core.virt import network

pytestmark = [pytest.mark.root]


def ip(*args: str, ns: str | None = None) -> None:
    r = subprocess.run([*(["ip", "netns", "exec", ns] if ns else []), "ip", *args], capture_output=True, text=True)
    assert r.returncode == 0, f"ip {' '.join(args)}: {r.stderr}"


def _need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: it makes network namespaces, veths and bridges")


@pytest.fixture
def switch():
    """A --[9000]-- SW(bridge) --[1500 port]-- B; A is 10.198.0.1, B 10.198.0.2. Yields a function that sets the
    MTU of the switch's port towards B."""
    _need_root()
    tag = f"{os.getpid() % 10000}"
    a, sw, b = f"cbtA{tag}", f"cbtS{tag}", f"cbtB{tag}"
    for ns in (a, sw, b):
        ip("netns", "add", ns)
    try:
        ip("link", "add", "a0", "netns", a, "mtu", "9000", "type", "veth", "peer", "a1", "netns", sw, "mtu", "9000")
        ip("link", "add", "b0", "netns", b, "mtu", "9000", "type", "veth", "peer", "b1", "netns", sw, "mtu", "1500")
        ip("link", "add", "sw0", "type", "bridge", ns=sw)
        ip("link", "set", "sw0", "mtu", "9000", ns=sw)
        for port in ("a1", "b1"):
            ip("link", "set", port, "master", "sw0", "up", ns=sw)
        ip("link", "set", "sw0", "up", ns=sw)
        ip("addr", "add", "10.198.0.1/24", "dev", "a0", ns=a)
        ip("addr", "add", "10.198.0.2/24", "dev", "b0", ns=b)
        for ns, dev in ((a, "a0"), (b, "b0")):
            ip("link", "set", dev, "up", ns=ns)
        deadline = time.monotonic() + 10  # the bridge ports need a moment to forward
        while time.monotonic() < deadline and subprocess.run(
                ["ip", "netns", "exec", a, "ping", "-c1", "-W1", "10.198.0.2"], capture_output=True).returncode:
            time.sleep(0.2)

        def set_port_mtu(mtu: int) -> None:
            ip("link", "set", "b1", "mtu", str(mtu), ns=sw)

        yield a, set_port_mtu
    finally:
        for ns in (a, sw, b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_a_switch_that_drops_jumbo_frames_is_named_with_the_largest_frame_that_passes(switch):
    ns, set_port_mtu = switch
    pc = network.check_path_mtu("10.198.0.2", 9000, netns=ns, where="be1 (cbpriv0)", to="the front-end 10.198.0.2")
    assert not pc.ok
    assert pc.largest == 1500, pc
    assert "9000-byte frames are dropped on the way, 1500-byte frames get through" in pc.message
    assert "does not pass jumbo frames" in pc.message and "network.private_mtu = 1500" in pc.message
    assert pc.message.startswith("be1 (cbpriv0) -> the front-end 10.198.0.2:")
    # A switch that passes them.
    set_port_mtu(9000)
    pc = network.check_path_mtu("10.198.0.2", 9000, netns=ns)
    assert pc.ok and pc.largest == 9000 and "9000-byte frames pass" in pc.message
    # Nobody there at all is not called a jumbo-frame problem.
    pc = network.check_path_mtu("10.198.0.77", 9000, netns=ns)
    assert not pc.ok and pc.largest is None and "does not answer pings at all" in pc.message
    # This end's own interface too small: said as such (ping refuses locally).
    ip("link", "set", "a0", "mtu", "1500", ns=ns)
    pc = network.check_path_mtu("10.198.0.2", 9000, netns=ns)
    assert not pc.ok and "cannot leave this host" in pc.message and "1500" in pc.message


def test_the_private_links_address_passes_over_link_local_ones(tmp_path: Path, monkeypatch):
    """networkd can put a 169.254/16 address beside the real one: the enrolment server binds to the real one, and
    a back-end's bridge address (the far end of guest -> host) is the real one too. A real link (a bridge)."""
    _need_root()
    link = f"cbtd{os.getpid() % 10000}"
    ip("link", "add", link, "type", "bridge")
    try:
        ip("link", "set", link, "up")
        assert network.ipv4_of(link) is None
        ip("addr", "add", "169.254.240.1/16", "dev", link)
        assert network.ipv4_of(link) is None
        ip("addr", "add", "10.197.0.1/24", "dev", link)
        assert network.ipv4_of(link) == "10.197.0.1"
        mac = Path(f"/sys/class/net/{link}/address").read_text().strip()
        settings = tmp_path / "node.toml"
        settings.write_text(f'role = "front-end"\n[network]\nprivate_nic = "{link}"\nprivate_mac = "{mac}"\n')
        monkeypatch.setenv("CLOUDBOX_NODE_CONFIG", str(settings))
        assert network.private_address() == "10.197.0.1"
        monkeypatch.setenv("CLOUDBOX_NODE_CONFIG", str(tmp_path / "absent.toml"))
        assert network.private_address() == "0.0.0.0"  # no private network: every address
    finally:
        subprocess.run(["ip", "link", "del", link], capture_output=True)
    assert network.ipv4_of(link) is None  # a link that is gone


# ---------------------------------------------------------------------------------------------- the run
BRIDGE, FE_NS, FE_IP, NODE_IP = "cbtpriv0", "cbtfe", "10.199.0.1", "10.199.0.2"


@pytest.fixture
def private_network(tmp_path: Path, monkeypatch, state):
    """This host as a back-end: bridge cbtpriv0 (10.199.0.2, MTU 9000) whose port cbtfe0 leads to the namespace
    cbtfe (10.199.0.1), the front-end, serving DHCP and netserver. The node settings name cbtfe0 by its MAC."""
    _need_root()
    procs: list[subprocess.Popen] = []
    for left in (BRIDGE, "cbtfe0"):
        subprocess.run(["ip", "link", "del", left], capture_output=True)
    subprocess.run(["ip", "netns", "del", FE_NS], capture_output=True)
    try:
        ip("link", "add", BRIDGE, "mtu", "9000", "type", "bridge")
        ip("addr", "add", f"{NODE_IP}/24", "dev", BRIDGE)
        ip("netns", "add", FE_NS)
        ip("link", "add", "cbtfe0", "mtu", "9000", "type", "veth", "peer", "cbtfe1", "netns", FE_NS, "mtu", "9000")
        ip("link", "set", "cbtfe0", "master", BRIDGE, "up")
        ip("link", "set", BRIDGE, "up")
        ip("addr", "add", f"{FE_IP}/24", "dev", "cbtfe1", ns=FE_NS)
        ip("link", "set", "cbtfe1", "up", ns=FE_NS)
        ip("link", "set", "lo", "up", ns=FE_NS)
        conf = tmp_path / "udhcpd.conf"
        conf.write_text(f"start 10.199.0.100\nend 10.199.0.150\ninterface cbtfe1\nlease_file {tmp_path}/leases\n"
                        f"pidfile {tmp_path}/udhcpd.pid\noption subnet 255.255.255.0\noption lease 600\n")
        (tmp_path / "leases").touch()
        procs.append(subprocess.Popen(["ip", "netns", "exec", FE_NS, "busybox", "udhcpd", "-f", str(conf)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        port = 12000 + os.getpid() % 1000
        procs.append(subprocess.Popen(["ip", "netns", "exec", FE_NS, "netserver", "-D", "-L", FE_IP, "-p",
                                       str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        mac = Path("/sys/class/net/cbtfe0/address").read_text().strip()
        settings = tmp_path / "node.toml"
        settings.write_text(f'role = "back-end"\nhostname = "be-test"\n[network]\nprivate_nic = "cbtfe0"\n'
                            f'private_mac = "{mac}"\nprivate_mtu = 9000\nfrontend = "{FE_IP}"\n')
        monkeypatch.setenv("CLOUDBOX_NODE_CONFIG", str(settings))
        yield {"peer": FE_IP, "peer_netperf_port": port}
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=10)
        subprocess.run(["ip", "netns", "del", FE_NS], capture_output=True)
        for left in ("cbtfe0", BRIDGE):
            subprocess.run(["ip", "link", "del", left], capture_output=True)


@pytest.mark.slow
def test_a_back_ends_guest_joins_the_private_bridge_and_measures_to_the_front_end(private_network, libvirt_conn):
    # One scheme (make test's tiers); the two-guest test below adds iperf3's path to the front-end (full tier).
    spec = RunSpec(profile="virtio-disk", suite="network", size="quick", net_tests="tcp-stream", net_seconds=3,
                   **private_network)
    assert [(s.side, s.test) for s in spec.plan()[-4:]] == [("guest", "tcp-stream"), ("baseline", "tcp-stream"),
                                                           ("guest", "tcp-stream-fe"), ("baseline", "tcp-stream-fe")]
    with ResultStore() as store:
        rid = runs.executor(spec, store).execute()
    with ResultStore() as store:
        run = store.get_run(rid)
        evs = store.events_since(rid, 0)
    steps = [e.payload.get("text", "") for e in evs if e.kind == "step"]
    warn_run_trouble(evs)
    assert run.state == "completed", run.reason
    net = run.provenance.private_network
    assert net is not None and "network" not in run.provenance.to_stored()  # the NIC's knobs are the profile's
    assert net.bridge == BRIDGE and net.host_ip == NODE_IP and net.peer == FE_IP and net.mtu == 9000
    # The guest's address is the front-end's DHCP lease, from its pool.
    lease = ipaddress.IPv4Address(net.guest_ip)
    assert ipaddress.IPv4Address("10.199.0.100") <= lease <= ipaddress.IPv4Address("10.199.0.150"), lease
    assert any("checking the private network to the front-end 10.199.0.1" in s for s in steps), steps
    for t in ("tcp-stream", "tcp-stream-fe"):
        for side in ("guest", "baseline"):
            m = run.measurement(side, t, "Mbit/s")
            assert m is not None and m.value > 0, (side, t)
    assert "veth-netns" in run.measurement("baseline", "tcp-stream", "Mbit/s").labels
    fe_base = run.measurement("baseline", "tcp-stream-fe", "Mbit/s")
    assert "private-network" in fe_base.labels and "emulated" not in fe_base.labels
    # This host being a VM (as here) is said on the bare-metal side, not hidden.
    assert run.provenance.accelerator is not None
    assert ("virtualized-host" in fe_base.labels) is run.provenance.accelerator.nested
    if run.emulated:
        assert "emulated" in run.measurement("guest", "tcp-stream-fe", "Mbit/s").labels
    # The private bridge is the node's: it stays, with the guest's tap gone; the run's own bridge was never made.
    assert network.link_exists(BRIDGE) and os.listdir(f"/sys/class/net/{BRIDGE}/brif") == ["cbtfe0"]
    assert not network.link_exists(addresses.BRIDGE)


def test_a_run_for_a_front_end_on_a_host_without_a_private_network_says_so(state, monkeypatch, tmp_path):
    """Refused before anything is made, naming the settings file."""
    monkeypatch.setenv("CLOUDBOX_NODE_CONFIG", str(tmp_path / "absent.toml"))
    with ResultStore() as store, pytest.raises(CloudboxError, match=r"absent\.toml\) name no private NIC: it is "
                                                                    "not an installed back-end"):
        check_private_network(EventSink(store), "10.199.0.1")


def test_the_host_side_says_when_the_host_is_itself_a_virtual_machine():
    assert host_labels(["nested", "emulated", "quick-size"]) == ["quick-size", "virtualized-host"]
    assert host_labels(["emulated", "quick-size"]) == ["quick-size"]
    assert host_labels([]) == []


def test_comparison_rows_name_the_far_end_of_network_tests():
    from types import SimpleNamespace

    from cloudbox.core.record.rows import Measurement
    from cloudbox.core.views.labels import net_target

    run = SimpleNamespace(provenance=Provenance(private_network=PrivateNetwork(bridge="cbpriv0", peer="10.73.0.1")))

    def m(test: str, labels: list[str]) -> Measurement:
        return Measurement(id=1, run_id=1, side="baseline", test=test, metric="Mbit/s", value=1.0, labels=labels)

    assert net_target(run, [m("tcp-stream-fe", ["private-network"])]) == "front-end"
    assert net_target(run, [m("tcp-stream", ["veth-netns"])]) == "own host"
    assert net_target(run, [m("tcp-stream", ["loopback"])]) == "loopback"


@pytest.mark.slow
@pytest.mark.full
def test_two_back_end_guests_measure_to_the_front_end_at_once(private_network, libvirt_conn):
    """--guests 2 on a back-end: each guest takes a lease on the private bridge, then both send to the front-end's
    servers through the barrier (netperf's one netserver, an iperf3 each), and the back-end host's two clients do
    the same as the baseline; every figure kept per guest and per process beside their sum."""
    ports = [private_network["peer_netperf_port"] + k for k in (1, 2)]
    iperf = [subprocess.Popen(["ip", "netns", "exec", FE_NS, "iperf3", "-s", "-B", FE_IP, "-p", str(p)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for p in ports]
    try:
        spec = RunSpec(profile="virtio-disk", suite="network", size="quick", net_tests="tcp-stream,iperf3-tx",
                       net_seconds=3, guests=2, peer_iperf3_port=ports[0], peer_iperf3_ports=ports,
                       **private_network)
        spec.validate()
        assert [(s.side, s.test) for s in spec.plan()[-4:]] == [
            ("guest", "iperf3-tx"), ("baseline", "iperf3-tx"), ("guest", "iperf3-tx-fe"), ("baseline", "iperf3-tx-fe")]
        with ResultStore() as store:
            rid = runs.executor(spec, store).execute()
        with ResultStore() as store:
            run = store.get_run(rid)
            warn_run_trouble(store.events_since(rid, 0))
    finally:
        for p in iperf:
            p.terminate()
            p.wait(timeout=10)
    assert run.state == "completed", run.reason
    info = run.provenance.guests
    assert info is not None and info.count == 2
    for test in ("tcp-stream", "iperf3-tx"):
        fe = test + catalogue.FRONTEND_SUFFIX
        for t, far in ((test, NODE_IP), (fe, FE_IP)):
            for side in ("guest", "baseline"):
                each = run.instances(side, t, "Mbit/s")
                assert [m.instance for m in each] == [1, 2] and all(m.value > 0 for m in each), (side, t)
                total = run.measurement(side, t, "Mbit/s")
                assert total is not None and total.value == pytest.approx(sum(m.value for m in each), rel=1e-9)
            if t.startswith("iperf3"):  # the far end iperf3 names in its JSON (netperf -P 0 prints figures only)
                raws = [m.raw for m in run.instances("guest", t, "Mbit/s")]
                assert all(re.search(rf'"remote_host":\s*"{re.escape(far)}"', r) for r in raws), (t, raws[0][:600])
        base = run.measurement("baseline", fe, "Mbit/s")
        assert "private-network" in base.labels and "veth-netns" not in base.labels
        assert 0 <= info.skew_s[fe] < 1.0, info.skew_s
    # Both guests' NICs left with the guests: the node's bridge keeps only its own port.
    assert os.listdir(f"/sys/class/net/{BRIDGE}/brif") == ["cbtfe0"]
    assert not network.link_exists(addresses.BRIDGE)


def test_n_guests_on_a_back_end_test_to_the_front_end_too():
    """The plan of a back-end's run of N guests has the front-end steps; its iperf3 ports are one per guest."""
    spec = RunSpec(profile="virtio-disk", suite="network", net_tests="iperf3-tx", guests=2, peer="10.73.0.1",
                   peer_iperf3_port=5201, peer_iperf3_ports=[5201, 5202])
    spec.validate()
    assert [(s.side, s.test) for s in spec.plan()] == [
        ("guest", "boot"), ("guest", "iperf3-tx"), ("baseline", "iperf3-tx"), ("guest", "iperf3-tx-fe"),
        ("baseline", "iperf3-tx-fe")]
    assert spec.as_dict()["peer_iperf3_ports"] == [5201, 5202]
    assert "peer_iperf3_ports" not in RunSpec(profile="virtio-disk").as_dict()  # other runs' records as before
    for bad in ([5201], [5201, 0], [5201, True], "5201,5202"):
        spec.peer_iperf3_ports = bad  # type: ignore[assignment]
        with pytest.raises(UsageError, match=r"iperf3 ports .* one port from 1 to 65535 for each of the run's 2 gu"):
            spec.validate()


def test_the_front_end_serves_an_iperf3_per_guest_of_a_back_ends_run(monkeypatch):
    """serve_peer on the front-end: one netserver, and an iperf3 server for each of N guests (iperf3 serves one
    client at a time), all on its private address and stopped with the run."""
    import contextlib
    import socket
    from types import SimpleNamespace

    from cloudbox.core.run import mirror
    from cloudbox.core.spec.profiles import resolve_profile

    monkeypatch.setattr(network, "private_address", lambda: "127.0.0.1")
    logs: list[str] = []
    with contextlib.ExitStack() as stack:
        spec = RunSpec(profile="virtio-disk", suite="network", net_tests="tcp-stream,iperf3-tx", guests=3)
        ctx = SimpleNamespace(spec=spec, profile=resolve_profile("virtio-disk"), stack=stack,
                              sink=SimpleNamespace(log=logs.append))
        peer = mirror.serve_peer(ctx)  # type: ignore[arg-type]
        assert peer is not None and peer.peer == "127.0.0.1" and peer.peer_netperf_port
        ports = peer.peer_iperf3_ports or []
        assert len(set(ports)) == 3 and peer.peer_iperf3_port == ports[0]
        for port in (peer.peer_netperf_port, *ports):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
        assert "iperf3 ports " + ", ".join(map(str, ports)) in logs[-1], logs
    for port in ports:  # stopped with the run
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_the_baseline_to_the_front_end_runs_at_the_guest_s_mtu(private_network):
    """A guest at 1500 bytes on a 9000-byte private network: the host's own connections to the front-end go at 1500
    (a locked host route, the MSS it offers to match) while the baseline runs, and the route is gone after."""
    logged: list[str] = []

    def df_ping(size: int) -> bool:
        return subprocess.run(["ping", "-M", "do", "-c", "1", "-W", "2", "-s", str(size - 28), FE_IP],
                              capture_output=True).returncode == 0

    with network.frames_to(FE_IP, 1500, logged.append) as own:
        assert own == 9000
        route = subprocess.run(["ip", "route", "get", FE_IP], capture_output=True, text=True).stdout
        assert "mtu lock 1500" in route and "advmss 1460" in route, route
        assert df_ping(1500) and not df_ping(1501)
    assert logged == [f"this host -> {FE_IP}: frames of 1500 bytes as the guest's (a host route over {BRIDGE}, "
                      "whose MTU is 9000)"]
    assert "mtu lock" not in subprocess.run(["ip", "route", "get", FE_IP], capture_output=True, text=True).stdout
    assert df_ping(9000)
    with network.frames_to(FE_IP, 9000) as own:  # the guest's MTU is the link's: nothing to change
        assert own is None
