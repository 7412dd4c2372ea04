"""A network test tool that hangs (a netperf TCP_MAERTS in a TCG guest can stall with its path) is killed, logged
with the sockets it held, and run once more; hanging every time is an error naming the tool, the test and the
server, with nothing left running. The hang is real: a real netserver stopped with SIGSTOP (the kernel still
accepts the connection, nothing answers), from this host and from a real guest."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import warnings
from pathlib import Path

import pytest
from guest_session import wait_up

from cloudbox.core.bench import nettests
from cloudbox.core.errors import CloudboxError, NicStalled
from cloudbox.core.record.provenance import Provenance
from cloudbox.core.record.results import ResultStore
from cloudbox.core.run import runs
from cloudbox.core.run.context import RunContext, RunControl
from cloudbox.core.run.measure import net_test
from cloudbox.core.run.sink import EventSink
from cloudbox.core.spec import addresses, catalogue
from cloudbox.core.spec.profiles import resolve_profile
from cloudbox.core.spec.runspec import QUICK_SIZE, RunSpec
from cloudbox.core.virt import network

MAERTS, RR = catalogue.NET_TESTS["tcp-maerts"], catalogue.NET_TESTS["tcp-rr"]


@pytest.fixture
def stopped_netserver():
    """Yields a function addr -> (pid, port): a real netserver on addr started as a run starts it
    (HostNetwork.start_netserver), then stopped (SIGSTOP). Resumed and removed at the end (HostNetwork.teardown)."""
    if shutil.which("netserver") is None or shutil.which("netperf") is None:
        pytest.skip("netperf is not installed (make test installs it)")
    hn = network.HostNetwork(9000)

    def start(addr: str) -> tuple[int, int]:
        port = hn.start_netserver(addr)
        hn.procs[-1].send_signal(signal.SIGSTOP)
        return hn.procs[-1].pid, port

    yield start
    for p in hn.procs:
        with contextlib.suppress(ProcessLookupError):
            p.send_signal(signal.SIGCONT)
    hn.teardown()


def _resume_after(pid: int, seconds: float) -> threading.Timer:
    timer = threading.Timer(seconds, lambda: os.kill(pid, signal.SIGCONT))
    timer.start()
    return timer


def _clients_to(port: int) -> list[str]:
    out = subprocess.run(["pgrep", "-af", f"netperf .*-p {port} "], capture_output=True, text=True).stdout
    return out.splitlines()


def test_a_bare_metal_test_that_hangs_is_killed_and_run_again(stopped_netserver):
    pid, port = stopped_netserver("127.0.0.1")
    logs: list[str] = []
    timer = _resume_after(pid, 4.5)  # during the second attempt
    try:
        res = nettests.run_baseline(MAERTS, port, 1, lambda _: None, lambda: False, target="127.0.0.1", netns=None,
                                   hang_s=3, log=logs.append)
    finally:
        timer.cancel()
    assert res.hung == 1 and res.metric == "Mbit/s" and res.value > 0, res
    (line,) = logs
    assert line.startswith(f"bare metal: netperf (tcp-maerts) to 127.0.0.1 port {port} hung: no end after 3 s, "
                           "killed (attempt 1 of 2); running it again. Sockets then: on this host: "), line
    assert f"127.0.0.1:{port}" in line, line  # the control connection the stopped server never answered
    assert not _clients_to(port)


def test_a_bare_metal_test_that_always_hangs_fails_naming_the_server(stopped_netserver):
    _, port = stopped_netserver("127.0.0.1")
    logs: list[str] = []
    with pytest.raises(CloudboxError, match=rf"bare metal: netperf \(tcp-rr\) to 127\.0\.0\.1 port {port} hung 2 "
                                            r"times \(no end after 2 s, killed\): is the server there still answering"):
        nettests.run_baseline(RR, port, 1, lambda _: None, lambda: False, target="127.0.0.1", netns=None, hang_s=2,
                             log=logs.append)
    assert len(logs) == 2 and "(attempt 2 of 2). Sockets then" in logs[1], logs
    assert not _clients_to(port)


def test_a_server_whose_port_was_taken_starts_on_another(monkeypatch):
    """free_port() then the server's bind race: a netserver whose port is taken exits at once, and the next port
    is tried; every port taken fails naming the server and its own message."""
    if shutil.which("netserver") is None:
        pytest.skip("netperf is not installed (make test installs it)")
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        ports = iter([taken, network.free_port()])
        monkeypatch.setattr(network, "free_port", lambda: next(ports))
        hn = network.HostNetwork(9000)
        try:
            port = hn.start_netserver("127.0.0.1")
            assert port != taken and len(hn.procs) == 1 and hn.procs[0].poll() is None
            monkeypatch.setattr(network, "free_port", lambda: taken)
            with pytest.raises(CloudboxError, match=r"netserver on 127\.0\.0\.1 did not start \(3 ports tried; "
                                                    r"the last exited \d+ at once: .+\)"):
                hn.start_netserver("127.0.0.1")
            assert len(hn.procs) == 1
        finally:
            hn.teardown()


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"  # a zombie has ended
    except (OSError, IndexError):
        return False


def test_teardown_stops_the_server_and_the_child_serving_a_test():
    """netserver forks a child per test: a test still running at teardown (a hung one) must not leave it behind."""
    if shutil.which("netserver") is None or shutil.which("netperf") is None:
        pytest.skip("netperf is not installed (make test installs it)")
    hn = network.HostNetwork(9000)
    port = hn.start_netserver("127.0.0.1")
    server = hn.procs[0].pid
    client = subprocess.Popen(["netperf", "-H", "127.0.0.1", "-p", str(port), "-l", "60", "-t", "TCP_RR"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while not (children := subprocess.run(["pgrep", "-P", str(server)], capture_output=True,
                                              text=True).stdout.split()):
            assert time.monotonic() < deadline, "netserver forked no child for the test"
            time.sleep(0.1)
        hn.teardown()
        time.sleep(0.5)
        assert [c for c in children if _running(int(c))] == [], "the child serving the test still runs"
    finally:
        client.kill()
        client.wait()
        hn.teardown()


@pytest.mark.parametrize("test_id", ["tcp-stream", "tcp-maerts", "tcp-rr"])
def test_each_netperf_tests_data_socket_listens_on_the_servers_address_only(test_id):
    """netserver's -L binds its control port; the data socket of each test is bound where netperf asks (its
    test-specific -H), which without it is the wildcard address, reachable from every link of the host."""
    if shutil.which("netserver") is None or shutil.which("netperf") is None:
        pytest.skip("netperf is not installed (make test installs it)")
    hn = network.HostNetwork(9000)
    port = hn.start_netserver("127.0.0.1")
    server = hn.procs[0].pid
    client = subprocess.Popen(nettests.netperf_args(catalogue.NET_TESTS[test_id], "127.0.0.1", port, 2),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: set[str] = set()
    try:
        while client.poll() is None:
            children = set(subprocess.run(["pgrep", "-P", str(server)], capture_output=True, text=True).stdout.split())
            for line in subprocess.run(["ss", "-Htlnp"], capture_output=True, text=True).stdout.splitlines():
                if any(f"pid={pid}," in line for pid in children | {str(server)}):
                    seen.add(line.split()[3])
            time.sleep(0.05)
        out = client.stdout.read() if client.stdout else ""
        assert client.returncode == 0, out
    finally:
        client.kill()
        client.wait()
        hn.teardown()
    data = seen - {f"127.0.0.1:{port}"}
    assert data, f"no data socket of netserver seen during the test ({seen})"
    assert all(addr.startswith("127.0.0.1:") for addr in data), data


QUEUE_STATUS = """/machine/peripheral/net0/virtio-backend:
  device_name:          virtio-net
  queue_index:          0
  inuse:                0
  used_idx:             23
  signalled_used:       23
  signalled_used_valid: true
  last_avail_idx:       23
  shadow_avail_idx:     256
  VRing:
    num:          256
"""


def test_qemus_view_of_the_rings_names_the_hop_inside_qemu():
    """QEMU's virtqueue counters (info virtio-queue-status) tell a guest that stopped refilling its receive ring
    from one that stopped taking what QEMU delivered, and QEMU's stuck transmit side from a lost frame."""
    from cloudbox.core.virt.guest import parse_virtqueue_status

    q = parse_virtqueue_status(QUEUE_STATUS)
    assert q == {"used_idx": 23, "signalled_used": 23, "last_avail_idx": 23, "shadow_avail_idx": 256}
    assert parse_virtqueue_status("Error: no such queue") is None

    def queues(rx_used, rx_sig, rx_last, rx_shadow, tx_last, tx_shadow):
        return {"rx": {"used_idx": rx_used, "signalled_used": rx_sig, "last_avail_idx": rx_last,
                       "shadow_avail_idx": rx_shadow},
                "tx": {"used_idx": tx_last, "signalled_used": tx_last, "last_avail_idx": tx_last,
                       "shadow_avail_idx": tx_shadow}}

    link = network.GuestLink(None, "eth0", addresses.HOST_IP, addresses.BRIDGE, 9000)
    # the ring wraps at 65536: 65534 -> 2 is 4 frames
    full = network.Rings.between(queues(65534, 65534, 65534, 65534, 7, 7), queues(2, 2, 2, 2, 10, 10))
    assert full is not None and (full.rx_delivered, full.rx_free, full.tx_taken) == (4, 0, 3)
    hop = link._where(None, 3, 0, 3, 3, 0, 3, 3, full)
    assert hop.startswith("the guest's receive ring: ") and "no free buffer" in hop, hop
    unread = network.Rings.between(queues(10, 10, 10, 200, 7, 7), queues(13, 10, 13, 200, 10, 10))
    hop = link._where(None, 3, 0, 3, 3, 0, 3, 3, unread)
    assert hop.startswith("the guest's NIC driver: ") and "last interrupt at 10" in hop, hop
    stuck = network.Rings.between(queues(10, 10, 10, 200, 7, 7), queues(10, 10, 10, 200, 7, 10))
    hop = link._where(None, 3, 0, 0, 0, 0, 0, 0, stuck)
    assert hop.startswith("QEMU's virtio-net transmit side: ") and "3 still waiting" in hop, hop
    assert link._where(None, 3, 0, 0, 0, 0, 0, 0, None).startswith("QEMU's NIC, guest -> host: ")
    assert str(full).startswith("QEMU virtio-net: receive ring +4 filled, 0 free buffers")


def test_a_retried_measurement_says_so_in_its_raw_output(state):
    """The executor keeps the retry with the number: the log line is in the events, the note in `raw`."""
    spec = RunSpec(profile="virtio-disk", suite="network", net_tests="tcp-rr")
    with ResultStore() as store:
        rid = store.create_run(uuid="0" * 32, profile_name=spec.profile, suite=spec.suite, state="running",
                               node="here", started_at=time.time())
        ctx = RunContext(spec, resolve_profile(spec.profile), QUICK_SIZE, "quick", "0" * 32, rid, store,
                         EventSink(store, rid), RunControl(), contextlib.ExitStack(), Provenance())
        clean = nettests.NetResult("tcp-rr", 900.0, "trans/s", 1111.0, "900,Trans/s,1111\n")
        again = nettests.NetResult("tcp-rr", 800.0, "trans/s", 1250.0, "800,Trans/s,1250\n", hung=1)
        net_test(ctx, "baseline", RR, lambda: clean, ["x"])
        net_test(ctx, "guest", RR, lambda: again, ["x"])
        run = store.get_run(rid)
    assert run.measurement("baseline", "tcp-rr", "trans/s").raw == "900,Trans/s,1111\n"
    raw = run.measurement("guest", "tcp-rr", "trans/s").raw
    assert raw.startswith("800,Trans/s,1250\n") and "measured on attempt 2; 1 before it hung and was killed" in raw


class _Session:
    """The module's real guest session (a run of suite "guest": the profile's guest on bridge cbbr0, its NIC
    configured). `ready()` gives its guest and a link whose path works; when an earlier test left the path dead,
    the session is relaunched once and that is warned, so one failure does not fail the tests after it."""

    def __init__(self, conn) -> None:
        self.conn, self.rid, self.guest = conn, None, None

    def start(self) -> None:
        from cloudbox.core.virt.guest import Guest, list_guests

        with ResultStore() as store:
            self.rid = runs.start_detached(RunSpec(profile="virtio-disk", suite="guest"), store)
            wait_up(store, self.rid, "the module's guest session")
            (info,) = [g for g in list_guests(self.conn) if g.run_uuid == store.get_run(self.rid).uuid]
        self.guest = Guest(self.conn, self.conn.lookupByName(info.name))

    def stop(self) -> str:
        with ResultStore() as store:
            return runs.cancel(store, self.rid, timeout=120) if self.rid is not None else "completed"

    def ready(self) -> tuple:
        link = _link(self.guest)
        if link.path_ok(tries=2):
            return self.guest, link
        warnings.warn(f"the guest session's path to {addresses.HOST_IP} was dead at the start of this test (an "
                      "earlier test left it so): relaunched it", stacklevel=2)
        assert self.stop() == "completed", "the dead session did not stop"
        self.start()
        link = _link(self.guest)
        assert link.path_ok(tries=2), "the relaunched guest session's path did not work"
        return self.guest, link


@pytest.fixture(scope="module")
def session(libvirt_conn):
    """The module's guest session, in a state dir of its own; cancelled at the end, nothing left behind."""
    import tempfile

    from cloudbox.core.virt.guest import list_guests

    base = tempfile.mkdtemp(prefix="cloudbox-test-", dir="/var/tmp")
    os.chmod(base, 0o755)
    saved = os.environ.get("CLOUDBOX_STATE_DIR")
    os.environ["CLOUDBOX_STATE_DIR"] = os.path.join(base, "state")
    sess = _Session(libvirt_conn)
    try:
        try:
            sess.start()
            yield sess
        finally:
            assert sess.stop() == "completed"
        assert not list_guests(libvirt_conn)
    finally:
        if saved is None:
            os.environ.pop("CLOUDBOX_STATE_DIR", None)
        else:
            os.environ["CLOUDBOX_STATE_DIR"] = saved
        shutil.rmtree(base, ignore_errors=True)


def _link(guest) -> network.GuestLink:
    (nic,) = guest.sh("ls /sys/class/net | grep -vx lo", timeout=20).stdout.split()
    link = network.GuestLink(guest, nic, addresses.HOST_IP, addresses.BRIDGE, 9000)
    assert link.tap and network.link_exists(link.tap), link.tap
    return link


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.full  # 49 s under TCG; make test keeps the bare-metal hangs (killed and run again) and the stopped path
def test_a_guest_test_that_hangs_is_killed_in_the_guest_and_run_again(session, stopped_netserver):
    """From a real guest (a guest session) to a stopped netserver on the session's bridge address."""
    guest, link = session.ready()
    pid, port = stopped_netserver(addresses.HOST_IP)
    logs: list[str] = []
    timer = _resume_after(pid, 22)  # the first attempt is killed at 15 s; the second one then finishes
    try:
        res = nettests.run_in_guest(guest, MAERTS, port, 2, lambda _: None, lambda: False, hang_s=15,
                                   log=logs.append)
    finally:
        timer.cancel()
    assert res.hung == 1 and res.value > 0, res
    (line,) = logs
    assert line.startswith(f"guest: netperf (tcp-maerts) to {addresses.HOST_IP} port {port} hung: no end "
                           "after 15 s, killed (attempt 1 of 2); running it again. Sockets then: in the "
                           "guest: "), line
    # busybox netstat in the guest, before the kill: the connection to the stopped server
    assert re.search(rf"tcp \d+ \d+ \S+ {re.escape(addresses.HOST_IP)}:{port} ESTABLISHED", line), line

    # With the NIC watched: the stopped server leaves the NIC quiet, the path still answers pings.
    _, port2 = stopped_netserver(addresses.HOST_IP)
    logs.clear()
    with pytest.raises(CloudboxError, match=rf"guest: netperf \(tcp-rr\) to {re.escape(addresses.HOST_IP)} "
                                            rf"port {port2} hung 2 times \(no frame reached the guest's NIC "
                                            r"for \d+ s, killed\)"):
        nettests.run_in_guest(guest, RR, port2, 1, lambda _: None, lambda: False, hang_s=60,
                             log=logs.append, link=link, quiet_s=6)
    assert len(logs) == 2, logs
    assert guest.sh("pidof netperf", timeout=20).exitcode != 0, "a killed netperf still runs in the guest"


@pytest.fixture
def host_servers():
    """Real test servers started as a run starts them (HostNetwork.start_netserver), removed at the end."""
    if shutil.which("netserver") is None:
        pytest.skip("netperf is not installed (make test installs it)")
    hn = network.HostNetwork(9000)
    yield hn
    hn.teardown()


def _later(seconds: float, argv: list[str]) -> threading.Timer:
    timer = threading.Timer(seconds, lambda: subprocess.run(argv, check=True, capture_output=True))
    timer.start()
    return timer


@pytest.mark.slow
@pytest.mark.root
def test_a_stopped_path_is_found_hop_by_hop_and_brought_back(session, host_servers):
    """The path stopped deliberately at a hop (the host's tap of the guest's NIC set down in the middle of a
    netperf TCP_MAERTS): the NIC goes quiet, the tool is killed early, the probe names the tap, the tap is set up
    again, and the test's second attempt measures; the raw output keeps what happened."""
    guest, link = session.ready()
    host_netserver = host_servers.start_netserver(addresses.HOST_IP)
    logs: list[str] = []
    timer = _later(3, ["ip", "link", "set", "dev", str(link.tap), "down"])
    try:
        res = nettests.run_in_guest(guest, MAERTS, host_netserver, 8, lambda _: None, lambda: False,
                                   log=logs.append, link=link, quiet_s=5)
    finally:
        timer.cancel()
        subprocess.run(["ip", "link", "set", "dev", str(link.tap), "up"], check=False)
    assert res.hung == 1 and res.value > 0, (res, logs)
    assert logs[0].startswith(f"guest: netperf (tcp-maerts) to {addresses.HOST_IP} port {host_netserver} hung: "
                              "no frame reached the guest's NIC for 5 s, killed (attempt 1 of 2)"), logs
    assert f"frames stop at the host's tap {link.tap}: it is down" in logs[1], logs
    assert re.search(r"QEMU virtio-net: receive ring \+\d+ filled, \d+ free buffers", logs[1]), logs
    assert re.search(rf"guest {link.nic}: sent \+\d+, received \+0; host tap {link.tap}: from the guest \+0",
                     logs[1]), logs
    # The tap set up again brings the path back, unless the guest's transmit queue stopped while the tap was down
    # (the guest then sends +0): then only the device reset does.
    fixes = (f"the host's tap {link.tap} set up again", f"the guest's {link.nic} device reset (its driver unbound "
             "and bound again)")
    fixed = next((f for f in fixes if logs[-1] == f"guest network: {f}: the path to {addresses.HOST_IP} answers "
                  "again"), None)
    assert fixed is not None, logs
    (note,) = res.notes
    assert note.startswith(f"attempt 1 hung: the path to {addresses.HOST_IP} was dead, frames stopped at the "
                           f"host's tap {link.tap}: it is down (") and note.endswith(f"{fixed} brought it back"), note


@pytest.mark.slow
@pytest.mark.root
def test_a_nic_device_reset_keeps_its_address_and_mtu(session):
    """The last re-plug step (GuestLink._reset_device) in a real guest: the NIC comes back under its name with its
    address and MTU, and full-size frames pass."""
    guest, link = session.ready()
    before = guest.sh(f"ip -o -4 addr show dev {link.nic}", timeout=20).stdout.split()
    link._reset_device()
    after = guest.sh(f"ip -o -4 addr show dev {link.nic}; cat /sys/class/net/{link.nic}/mtu",
                     timeout=20).stdout.split()
    # "N: eth0 inet ADDR/PREFIX ...": the interface index N is new after a rebind; name and address stay.
    assert after[1:4] == before[1:4] and after[-1] == "9000", (before, after)
    assert link.path_ok(tries=5), "the path did not come back after the device reset"


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.full
def test_a_path_that_stays_stopped_fails_naming_the_hop(session, host_servers):
    """The path stopped where no re-plug reaches (this host drops everything it sends to the guest, an iptables
    OUTPUT rule): the test fails at its first hang with NicStalled naming this host as the hop, after the
    re-plug steps were tried; nothing keeps running in the guest."""
    if shutil.which("iptables") is None:
        pytest.skip("iptables is not installed (make test installs it)")
    rule = ["OUTPUT", "-o", addresses.BRIDGE, "-d", addresses.GUEST_IP, "-j", "DROP"]
    guest, link = session.ready()
    host_netserver = host_servers.start_netserver(addresses.HOST_IP)
    logs: list[str] = []
    timer = _later(3, ["iptables", "-I", *rule])
    try:
        with pytest.raises(NicStalled) as err:
            nettests.run_in_guest(guest, MAERTS, host_netserver, 8, lambda _: None, lambda: False,
                                 log=logs.append, link=link, quiet_s=5)
    finally:
        timer.cancel()
        timer.join()
        subprocess.run(["iptables", "-D", *rule], check=False)
    assert err.value.hop.startswith("this host: ") and f"frames reached it over bridge {addresses.BRIDGE}, it " \
        "sent" in err.value.hop, err.value.hop
    assert str(err.value).startswith(f"guest: netperf (tcp-maerts) to {addresses.HOST_IP} port {host_netserver} "
                                     "hung and the guest's network stopped: frames stop at this host: "), err.value
    assert "re-plugging the NIC did not bring it back" in str(err.value)
    tried = [ln for ln in logs if ln.startswith("guest network: ") and "still dead" in ln]
    assert [t.split(":")[1].strip() for t in tried] == [f"the guest's {link.nic} taken down and up",
                                                        "the NIC's virtual cable unplugged and plugged again "
                                                        "(libvirt link state)",
                                                        f"the guest's {link.nic} device reset (its driver unbound "
                                                        "and bound again)"], logs
    assert guest.sh("pidof netperf", timeout=20).exitcode != 0, "a killed netperf still runs in the guest"
    assert link.path_ok(tries=2), "the path did not come back once the rule was gone"
