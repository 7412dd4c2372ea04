"""Real runs against real libvirtd and QEMU (TCG here): storage and network suites for two presets, results read
back from SQLite and checked for sane values; plus the run lock, cancel and detached runs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from real_runs import interrupt_cli_run, leftovers, work_files
from run_trouble import warn_run_trouble

from cloudbox.core.bench import iozone
from cloudbox.core.disks import hostraid
from cloudbox.core.errors import RunBusy
from cloudbox.core.record.events import RunEvent, StepEvent
from cloudbox.core.record.results import ResultStore
from cloudbox.core.run import launch, local, runs
from cloudbox.core.spec import addresses, catalogue
from cloudbox.core.spec.runspec import RunSpec
from cloudbox.core.virt.domain import read_domain

pytestmark = [pytest.mark.slow, pytest.mark.root]


@pytest.fixture(autouse=True)
def no_run_outlives_its_test(state):
    """Whatever a test starts detached is cancelled when it ends, pass or fail."""
    yield
    with ResultStore() as store:
        for run in store.active_runs():
            runs.cancel(store, run.id, timeout=120)


# make test keeps one real run (virtio-disk, every network tool); the other profile is in make test-full.
@pytest.mark.parametrize(("profile", "net_tests"), [
    ("virtio-disk", "both"),
    pytest.param("eucalyptus-default", "netperf", marks=pytest.mark.full),
])
def test_real_run_storage_and_network(profile, net_tests, state, libvirt_conn):
    # IOzone's read comes after other writes: it must lay its own data down again first
    tests = "iozone-write-1m,seq-write-64k,seq-read-64k,randread-4k-qd32,iozone-read-1m"
    spec = RunSpec(profile=profile, suite="all", size="32M", storage_tests=tests, net_tests=net_tests,
                   net_seconds=3, runtime=3)
    events: list[tuple[str, dict]] = []
    with ResultStore() as store:
        rid = runs.executor(spec, store, emit=lambda ev: events.append((ev.kind, ev.to_payload()))).execute()
    with ResultStore() as store:  # read back through a fresh connection
        run = store.get_run(rid)
        evs = store.events_since(rid, 0)
    assert run.state == "completed", run.reason
    assert run.accelerator in ("kvm", "nested-kvm", "tcg")
    if run.accelerator == "tcg":
        assert run.emulated
    prov = run.provenance.to_stored()  # the stored form, as `results export` shows it
    assert prov["backing"]["kind"] in ("sparse-file", "block-device")
    assert "<domain" in prov["domain_xml"] and prov["guest_kernel"]
    assert prov["versions"]["qemu"].startswith("QEMU")
    assert re.fullmatch(r"\d+\.\d+", prov["versions"]["iozone"]), prov["versions"]
    assert "iozone3" in prov["versions"]["guest_packages"], prov["versions"]["guest_packages"]
    for side in ("guest", "baseline"):
        for test in ("seq-write-64k", "seq-read-64k", "randread-4k-qd32"):
            m = run.measurement(side, test, "MB/s")
            assert m is not None, (side, test)
            assert m.value > 0
            # host-side metrics on the same timeline: request size and queue depth present
            assert m.host_avgrq_sectors is not None and m.host_avgrq_sectors > 0, (side, test)
            assert m.host_avgqu is not None and m.host_util is not None
            if side == "guest" and run.emulated:
                assert "emulated" in m.labels
            if side == "baseline":
                assert "emulated" not in m.labels
        # IOzone itself, in the guest as on the host: both passes, read from its own output
        for test, again in (("iozone-write-1m", "re-write MB/s"), ("iozone-read-1m", "re-read MB/s")):
            m = run.measurement(side, test, "MB/s")
            assert m is not None and m.value > 0 and "O_DIRECT feature enabled" in m.raw, (side, test)
            assert m.value == pytest.approx(iozone.parse_iozone(test, m.raw, test.split("-")[1]).mbps)
            second = run.measurement(side, test, again)
            assert second is not None and second.value > 0, (side, test)
        expected = [("tcp-stream", "Mbit/s"), ("tcp-maerts", "Mbit/s"), ("tcp-rr", "trans/s")]
        if net_tests == "both":
            expected += [("iperf3-tx", "Mbit/s"), ("iperf3-rx", "Mbit/s")]
        for test, metric in expected:
            m = run.measurement(side, test, metric)
            assert m is not None and m.value > 0, (side, test)
        if side == "baseline":
            assert "veth-netns" in run.measurement(side, "tcp-stream", "Mbit/s").labels
    warn_run_trouble(evs)
    # progress was streamed while running, not only at the end
    kinds = [e.kind for e in evs]
    assert kinds.count("progress") >= 3 and "sample" in kinds and kinds[-1] == "state"
    assert any(k == "step" for k, _ in events)
    steps = [p.get("text", "") for k, p in events if k == "step"]
    for side in ("bare metal", "guest"):
        assert f"{side}: laying down IOzone's data for iozone-read-1m" in steps, steps
    # nothing left behind
    assert leftovers(libvirt_conn, state) == {"guests": [], "bridge": False, "netns": False, "loops": []}
    assert work_files(state) == []


def test_second_run_refused_and_cancel(state, libvirt_conn):
    """A detached run holds the host; a second one is refused; cancel cleans up and stores `aborted`."""
    with ResultStore() as store:
        rid = runs.start_detached(RunSpec(profile="virtio-disk", suite="storage", size="64M",
                                          storage_tests="smoke", runtime=30), store)
        deadline = time.time() + 240
        while time.time() < deadline:  # wait until the executor holds the lock and the guest is up
            steps = [e.payload.get("text", "") for e in store.events_since(rid, 0) if e.kind == "step"]
            if any(s.startswith("launching guest") for s in steps):
                break
            assert store.get_run(rid).state == "running", store.get_run(rid).reason
            time.sleep(1)
        else:
            pytest.fail("detached run never launched its guest")
        with pytest.raises(RunBusy, match="another cloudbox run is active"):
            runs.executor(RunSpec(profile="eucalyptus-default", suite="storage"), store).execute()
        assert runs.cancel(store, rid, timeout=120) == "aborted"
        run = store.get_run(rid)
        assert "SIGTERM" in run.reason
    assert leftovers(libvirt_conn, state)["guests"] == []
    assert work_files(state) == []


def test_ctrl_c_in_foreground_cli(state, libvirt_conn):
    """SIGINT to a foreground `cloudbox run` aborts it cleanly: guest gone, store removed, run kept as aborted."""
    got = interrupt_cli_run(["--profile", "eucalyptus-default", "--suite", "storage", "--size", "64M",
                             "--tests", "smoke", "--runtime", "30"])
    assert got.returncode == 1, got.output
    assert "run aborted" in got.output
    assert got.run.state == "aborted" and "SIGINT" in (got.run.reason or ""), got.run.reason
    assert leftovers(libvirt_conn, state)["guests"] == []
    assert work_files(state) == []


def test_dead_guest_reason_quotes_its_console(state, libvirt_conn, monkeypatch):
    """A guest whose kernel panics at boot (fault injected on its command line: an init that does not exist):
    the run is stored as aborted and its reason ends with the guest's serial console, which virtlogd logged into
    the run's work directory; that directory is gone afterwards. Under TCG or nested KVM the guest is launched a
    second time first, announced with attempt 1's console."""
    monkeypatch.setattr(local, "CMDLINE", local.CMDLINE + " rdinit=/cloudbox-no-such-init")
    spec = RunSpec(profile="virtio-disk", suite="storage", size="16M", storage_tests="dd-write-64k",
                   agent_timeout=240)
    events: list[tuple[str, dict]] = []
    with ResultStore() as store:
        rid = runs.executor(spec, store, emit=lambda ev: events.append((ev.kind, ev.to_payload()))).execute()
    with ResultStore() as store:
        run = store.get_run(rid)
    assert run.state == "aborted"
    said = "\n".join(str(p.get("text", p)) for _, p in events)
    retried = "launching it again (attempt 2 of 2)" in said
    assert retried == (run.accelerator in ("tcg", "nested-kvm")), (run.accelerator, said)
    if retried:
        assert "stopped while booting" in said and "Kernel panic" in said, said
        assert "attempt 1's console:" in said and "console-attempt1.log" in said, said
    reason = run.reason or ""
    assert "stopped while booting" in reason, reason
    assert "lines of the guest's serial console:" in reason, reason
    assert "Kernel panic" in reason, reason
    quoted = [ln for ln in reason.splitlines() if ln.startswith("  | ")]
    assert 0 < len(quoted) <= launch.CONSOLE_TAIL_LINES
    # and libvirt's log of the QEMU process, which says why it stopped
    assert "lines of its QEMU log" in reason, reason
    assert any(ln.startswith("  : ") and "shutting down" in ln for ln in reason.splitlines()), reason
    assert leftovers(libvirt_conn, state) == {"guests": [], "bridge": False, "netns": False, "loops": []}
    assert work_files(state) == []


def test_cli_json_output(state, libvirt_conn):
    r = subprocess.run([sys.executable, "-m", "cloudbox.cli", "run", "--profile", "virtio-disk", "--suite",
                        "storage", "--size", "16M", "--tests", "dd-write-64k,dd-read-64k", "--json"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(r.stdout[r.stdout.index("\n{") + 1:] if not r.stdout.startswith("{") else r.stdout)
    assert data["state"] == "completed"
    tests = {(m["side"], m["test"]) for m in data["measurements"]}
    assert ("guest", "dd-write-64k") in tests and ("baseline", "dd-read-64k") in tests


def test_watch_follows_detached_run(state, libvirt_conn):
    with ResultStore() as store:
        rid = runs.start_detached(RunSpec(profile="virtio-disk", suite="storage", size="16M",
                                          storage_tests="seq-write-64k"), store)
    out: list[str] = []

    def watch() -> None:
        r = subprocess.run([sys.executable, "-m", "cloudbox.cli", "watch", str(rid)], capture_output=True,
                           text=True, timeout=600)
        out.append(r.stdout + r.stderr)

    t = threading.Thread(target=watch)
    t.start()
    t.join(610)
    assert out and "run completed" in out[0], out
    assert "seq-write-64k" in out[0]


@pytest.mark.full
def test_a_guest_whose_network_stays_stopped_is_relaunched_and_the_run_completes(state, libvirt_conn):
    """A real network run whose guest's frames are dropped by this host for good once its first test starts
    (an iptables rule on the guest NIC's MAC): the hang is found, the re-plug steps fail, the guest is launched
    afresh (a new MAC, so the rule no longer matches) and every test measures; provenance, log and raw say so."""
    import shutil

    from cloudbox.core.virt.guest import list_guests

    if shutil.which("iptables") is None:
        pytest.skip("iptables is not installed (make test installs it)")
    spec = RunSpec(profile="virtio-disk", suite="network", net_tests="tcp-maerts,tcp-rr", net_seconds=3)
    rules: list[list[str]] = []

    def on_event(ev: RunEvent) -> None:
        if isinstance(ev, StepEvent) and ev.text.startswith("guest: tcp-maerts") and not rules:
            (g,) = list_guests(libvirt_conn)
            iface = read_domain(libvirt_conn.lookupByName(g.name).XMLDesc(0)).interface
            assert iface is not None and iface.mac
            mac = iface.mac
            rules.append(["INPUT", "-i", addresses.BRIDGE, "-m", "mac", "--mac-source", mac, "-j", "DROP"])
            subprocess.run(["iptables", "-I", *rules[0]], check=True)

    try:
        with ResultStore() as store:
            rid = runs.executor(spec, store, emit=on_event).execute()
        with ResultStore() as store:
            run = store.get_run(rid)
            texts = [e.payload.get("text", "") for e in store.events_since(rid, 0)]
    finally:
        for r in rules:
            subprocess.run(["iptables", "-D", *r], check=False)
    assert rules, "the run never reached its first guest network test"
    assert run.state == "completed", run.reason
    (stall,) = run.provenance.to_stored()["nic_stalls"]
    assert stall["test"] == "tcp-maerts" and stall["remedy"] == "relaunch", stall
    assert any(t.startswith("guest: its network stopped and re-plugging the NIC did not help") and
               t.endswith("relaunching the guest (relaunch 1 of 1)") for t in texts), texts
    assert any(t.startswith("guest network: the path to 169.254.100.1 is dead; frames stop at ") for t in texts)
    for test, metric in (("tcp-maerts", "Mbit/s"), ("tcp-rr", "trans/s")):
        m = run.measurement("guest", test, metric)
        assert m is not None and m.value > 0, test
        assert "# cloudbox: measured on a guest relaunched after its network stopped" in m.raw, m.raw
    assert leftovers(libvirt_conn, state) == {"guests": [], "bridge": False, "netns": False, "loops": []}


@pytest.mark.full
def test_the_record_sweep_issues_each_record_size_in_the_guest_and_on_bare_metal(state, libvirt_conn):
    """Study C's sweep in a real run: on both sides every record size is one whole-file pass of direct requests of
    that size, one at a time, as fio itself reports it; the run records the host's CPUs for the cost columns."""

    size = 16 << 20
    spec = RunSpec(profile="virtio-disk", suite="storage", size="16M", storage_tests="records")
    with ResultStore() as store:
        rid = runs.executor(spec, store).execute()
    with ResultStore() as store:
        run = store.get_run(rid)
    assert run.state == "completed", run.reason
    assert run.provenance.host_cpus and run.provenance.host_cores
    for side in ("guest", "baseline"):
        for tid in catalogue.TEST_SETS["records"]:
            t = catalogue.TESTS[tid]
            m = run.measurement(side, tid, "MB/s")
            assert m is not None and m.value > 0, (side, tid)
            job = json.loads(m.raw)["jobs"][0]
            opts = job["job options"]
            assert (opts["bs"], opts["direct"], opts["iodepth"], opts["ioengine"]) == (t.bs, "1", "1", "psync")
            assert job[t.rw]["io_bytes"] == size and job[t.rw]["total_ios"] == size // catalogue.block_bytes(t.bs)
    assert leftovers(libvirt_conn, state) == {"guests": [], "bridge": False, "netns": False, "loops": []}


def _md_devices() -> list[str]:
    return sorted(p.name for p in Path("/sys/block").glob("md*"))


def test_raid0_preset_writes_through_md0_over_three_disks(state, libvirt_conn):
    """virtio-raid0 in a real guest: mdadm stripes the three virtio disks into /dev/md0, fio writes there, each
    member takes its share of the chunks, and no backing file, loop or md device is left."""

    size, chunk = 16 << 20, 64 << 10
    md_before = _md_devices()
    spec = RunSpec(profile="virtio-raid0", suite="storage", size="16M", storage_tests="seq-write-64k")
    with ResultStore() as store:
        rid = runs.executor(spec, store).execute()
    with ResultStore() as store:
        run = store.get_run(rid)
    assert run.state == "completed", run.reason
    prov = run.provenance
    assert prov.backing is not None and prov.backing.count == 3 and len(prov.backing.more_paths or []) == 2
    assert prov.domain_xml is not None and prov.domain_xml.count("<disk ") == 3
    raid = prov.raid
    assert raid is not None and (raid.device, raid.level, raid.chunk_kib) == ("/dev/md0", "0", 64)
    assert hostraid.mdstat_array(raid.mdstat) == ("raid0", ["vda", "vdb", "vdc"]) and "64k chunks" in raid.mdstat
    # the chunks of the 16 MiB write go round the members: 86, 85, 85 of 64 KiB
    share = size // chunk // 3 * chunk // 512
    assert set(raid.sectors_written) == {"vda", "vdb", "vdc"}
    assert all(v >= share for v in raid.sectors_written.values()), raid.sectors_written
    assert sum(raid.sectors_written.values()) >= size // 512
    guest = run.measurement("guest", "seq-write-64k", "MB/s")
    base = run.measurement("baseline", "seq-write-64k", "MB/s")
    assert guest is not None and guest.value > 0 and base is not None and base.value > 0
    job = json.loads(guest.raw)
    assert job["jobs"][0]["job options"]["filename"] == "/dev/md0" and job["jobs"][0]["write"]["io_bytes"] == size
    util = {d["name"]: d for d in job["disk_util"]}
    assert {"md0", "vda", "vdb", "vdc"} <= set(util) and all(util[d]["write_ios"] > 0 for d in ("vda", "vdb", "vdc"))
    if run.emulated:
        assert "emulated" in guest.labels
    # a storage run makes no bridge or namespace; other runs on a shared host may, so only its own things count
    left = leftovers(libvirt_conn, state)
    assert [g for g in left["guests"] if run.uuid[:8] in g] == [] and left["loops"] == []
    assert work_files(state) == []
    assert _md_devices() == md_before
