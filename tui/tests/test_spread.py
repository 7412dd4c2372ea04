"""One run's guests spread over several places (--node local,be1 --guests N): the option's checks and the split,
the locks, a place's hold and the coordination channel (`cloudbox node local coord`, a real subprocess), the rows
and the provenance merged from the places' runs, `results show`; and in make test one real coordinated run of two
TCG guests through this host's part (the SSH transport to a back-end is the cluster suite's: tests/image/
cluster.bats, "spread over fe1 and be1")."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cloudbox.core.disks.volumes import nfs
from cloudbox.core.errors import CloudboxError, RunBusy, UsageError
from cloudbox.core.record.events import StepEvent, describe, parse
from cloudbox.core.record.provenance import Guests, GuestStart, Place, Provenance
from cloudbox.core.record.results import ResultStore
from cloudbox.core.record.runlock import RunLock, check_not_busy, place_locks
from cloudbox.core.run import hold, preflight, spread
from cloudbox.core.run.multi import check_fits
from cloudbox.core.spec import addresses
from cloudbox.core.spec.profiles import resolve_profile
from cloudbox.core.spec.runspec import RunSpec, split_guests


# -- the option --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("kw", "message"), [
    (dict(node="local,be1", guests=1), r"--node local,be1 spreads the guests over 2 places; --guests 1 leaves one "
                                       r"empty; allowed: --guests 2 or more"),
    (dict(node="be1,be1", guests=2), r"--node 'be1,be1' names be1 twice; allowed: each place once"),
    (dict(node="local", guests=2), r"--node local alone is this host; allowed: no --node for a run here, or local "
                                   r"with enrolled nodes"),
    (dict(node="local,Be1", guests=2), r"--node 'local,Be1': 'Be1' is not a node name; allowed: lowercase"),
    (dict(node="local, be1", guests=2), r"' be1' is not a node name; allowed: lowercase .* in a comma list of places"),
    (dict(node="local,be1", guests=2, storage_tests="mpiio-fpp-1m"),
     r"a job across places \(MPI, fio.s client/server\) is not supported"),
    (dict(node="local,be1", guests=2, storage_tests="fiocs-seq-write-64k"), r"a job across places .* is not supported"),
    (dict(node=",".join(f"be{i}" for i in range(9)), guests=9), r"names 9 places; allowed: 1 to 8"),
])
def test_bad_places_name_the_option_and_what_is_allowed(kw, message):
    spec = RunSpec(profile="virtio-disk", **{"suite": "storage", **kw})
    with pytest.raises(UsageError, match=message):
        spec.validate()


def test_the_guests_split_evenly_the_first_places_taking_one_more():
    assert split_guests(2, 2) == [1, 1]
    assert split_guests(5, 2) == [3, 2]
    assert split_guests(7, 3) == [3, 2, 2]
    spec = RunSpec(profile="virtio-disk", suite="storage", guests=3, node="local,be1")
    spec.validate()
    assert spec.places == ["local", "be1"] and spec.spread
    assert not RunSpec(profile="virtio-disk", node="be1").spread
    assert "hold" not in RunSpec(profile="virtio-disk").as_dict()  # every other run's record reads as before
    assert "cpu_overcommit" not in RunSpec(profile="virtio-disk").as_dict()
    assert RunSpec(profile="virtio-disk", cpu_overcommit=2).as_dict()["cpu_overcommit"] == 2
    for suite in ("network", "all"):  # each guest's network tests go to its own place's host
        RunSpec(profile="virtio-disk", suite=suite, guests=2, node="local,be1").validate()


def test_a_parts_first_guest_number_is_checked_and_left_out_when_it_is_one():
    assert "first_guest" not in RunSpec(profile="virtio-disk").as_dict()
    RunSpec(profile="virtio-disk", suite="storage", guests=2, first_guest=63).validate()  # g63 and g64
    for bad in (0, 64, True, "2"):
        with pytest.raises(UsageError, match=r"first guest .* is not allowed; allowed: 1 to 63"):
            RunSpec(profile="virtio-disk", suite="storage", guests=2, first_guest=bad).validate()


def test_ended_parts_of_earlier_spread_runs_are_pruned_from_the_parts_store(state):
    assert spread.prune_parts() == 0  # no parts store yet: none made
    assert not (spread.parts_state_dir() / "results.db").exists()
    with ResultStore(spread.parts_state_dir() / "results.db") as parts:
        ids = {st: parts.create_run(uuid=f"{i}" * 32, profile_name="virtio-disk", suite="storage", state=st)
               for i, st in enumerate(("completed", "failed", "aborted", "running"), 1)}
    assert spread.prune_parts() == 3
    with ResultStore(spread.parts_state_dir() / "results.db") as parts:
        assert [r.id for r in parts.list_runs()] == [ids["running"]]  # a part still going is left alone


def test_an_nfs_spread_runs_the_storage_tests_only():
    p = resolve_profile("nfs-async-tcp")
    for suite in ("network", "all"):
        with pytest.raises(UsageError, match=rf"one NFS export runs the storage tests; --suite {suite} would also"):
            check_fits(RunSpec(profile="nfs-async-tcp", suite=suite, guests=2, node="be1,be2"), p,
                       available_mib=64000, host_cpus=8)


def test_a_held_key_names_bare_metals_tests_apart_from_the_guests():
    assert hold.key("guest", "seq-write-64k") == "seq-write-64k"
    assert hold.key("baseline", "seq-write-64k") == "baseline.seq-write-64k"
    assert hold.TEST_KEY.fullmatch(hold.key("baseline", "iozone-grid-4k"))


def test_this_hosts_share_is_checked_against_its_memory_and_cpus_and_an_nfs_export_is_shared():
    p = resolve_profile("virtio-disk")  # 1024 MiB, 1 vCPU
    spec = RunSpec(profile="virtio-disk", suite="storage", guests=5, node="local,be1")
    with pytest.raises(UsageError) as e:
        check_fits(spec, p, available_mib=3000, host_cpus=8)
    assert str(e.value).startswith("--guests 5 --node local,be1 puts 3 on this host: 3 x (1024 MiB")
    assert str(e.value).endswith("allowed: at most 1 here with profile virtio-disk")
    check_fits(spec, p, available_mib=64000, host_cpus=8)
    check_fits(RunSpec(profile="virtio-disk", suite="storage", guests=5, node="be2,be1"), p, available_mib=1,
               host_cpus=1)  # no share here: each node checks its own
    check_fits(spec, resolve_profile("nfs-async-tcp"), available_mib=64000, host_cpus=8)  # one export for all


def test_the_coordinator_locks_its_nodes_and_leaves_this_hosts_lock_to_its_part(state, monkeypatch):
    monkeypatch.setenv("CLOUDBOX_RUN_DIR", str(state / "run"))
    assert [lk.node for lk in place_locks("local,be1", coordinator=True)] == ["be1"]
    assert [lk.node for lk in place_locks("local,be1")] == ["", "be1"]
    held = RunLock("be1")
    held.acquire({"pid": os.getpid(), "run_id": 4, "profile": "virtio-disk"})
    try:
        with pytest.raises(RunBusy, match="node be1"):
            check_not_busy("local,be1")
        check_not_busy("local")  # this host's own lock is free; the one taken before the busy one was let go
        mine = RunLock("")
        mine.acquire({"probe": True})
        mine.release()
    finally:
        held.release()


# -- a place's hold and the coordination channel -----------------------------------------------------------------
def test_the_held_step_event_round_trips_and_reads_as_a_plain_step_without_it():
    ev = StepEvent("guest: seq-write-64k: 2 guests ready", "guest", "seq-write-64k", held=2)
    assert parse("step", ev.to_payload()) == ev
    assert parse("step", {"text": "x", "side": "guest", "test": "t"}) == StepEvent("x", "guest", "t")
    assert describe(ev) == "==> guest: seq-write-64k: 2 guests ready"


def _coord(state: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "CLOUDBOX_STATE_DIR": str(state / "parts"), "CLOUDBOX_RUN_DIR": str(state / "run")}
    return subprocess.Popen([sys.executable, "-m", "cloudbox.cli", "node", "local", "coord"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)


def _ask(ch: subprocess.Popen[str], line: str) -> str:
    assert ch.stdin is not None and ch.stdout is not None
    ch.stdin.write(line + "\n")
    ch.stdin.flush()
    return ch.stdout.readline().strip()


def test_the_channel_tells_the_time_and_writes_a_held_tests_instant(state, monkeypatch):
    monkeypatch.setenv("CLOUDBOX_RUN_DIR", str(state / "run"))
    ch = _coord(state)
    try:
        t0 = time.time()
        there = float(_ask(ch, "clock"))
        assert t0 - 0.01 <= there <= time.time() + 0.01
        assert _ask(ch, "go 7 seq-write-64k 123.5").startswith("error: run 7 holds no test here")
        hold.hold_dir(7).mkdir(parents=True)
        assert _ask(ch, "go 7 seq-write-64k 1795000000.25") == "ok"
        assert (hold.hold_dir(7) / "seq-write-64k").read_text() == "1795000000.250000\n"
        assert _ask(ch, "go 7 ../../etc 1.0").startswith("error: test '../../etc' is not a test id")
        assert _ask(ch, "go 7 seq-write-64k soon").startswith("error:")
        assert _ask(ch, "reboot") == "error: allowed: clock | go RUN TEST AT"
        assert _ask(ch, "go " + "7" * 5000) == "error: allowed: clock | go RUN TEST AT"  # one answer, then on
        assert float(_ask(ch, "clock")) > t0
    finally:
        assert ch.stdin is not None
        ch.stdin.close()
        assert ch.wait(timeout=10) == 0


def _ctx(store: ResultStore, spec: RunSpec):
    from cloudbox.core.run.context import RunContext, RunControl
    from cloudbox.core.run.sink import EventSink
    from cloudbox.core.spec.runspec import QUICK_SIZE

    rid = store.create_run(uuid="0" * 32, profile_name=spec.profile, suite=spec.suite, state="running")
    return RunContext(spec, resolve_profile(spec.profile), QUICK_SIZE, "quick", "0" * 32, rid, store,
                      EventSink(store, rid), RunControl(), contextlib.ExitStack(), Provenance())


def test_a_held_test_waits_for_the_instant_says_so_and_is_cleaned_up(state, monkeypatch):
    monkeypatch.setenv("CLOUDBOX_RUN_DIR", str(state / "run"))
    spec = RunSpec(profile="virtio-disk", suite="storage", guests=2, hold="fe1 run 3, local g1-g2 of 3 guests")
    with ResultStore() as store:
        ctx = _ctx(store, spec)
        at = time.time() + 3.0
        got: list[float] = []
        th = threading.Thread(target=lambda: got.append(hold.wait(ctx, "seq-write-64k", 2)))
        th.start()
        while not hold.hold_dir(ctx.run_id).is_dir():
            time.sleep(0.01)
        time.sleep(0.2)
        assert th.is_alive()  # held until the front-end's instant comes
        hold.release(ctx.run_id, "seq-write-64k", at)
        th.join(5)
        assert got == [pytest.approx(at, abs=1e-5)]
        steps = [e.record for e in store.events_since(ctx.run_id)]
        assert any(isinstance(r, StepEvent) and r.held == 2 and r.test == "seq-write-64k" for r in steps)
        ctx.stack.close()
        assert not hold.hold_dir(ctx.run_id).exists()
        with pytest.raises(CloudboxError, match=r"seq-write-64k: no start instant from the front-end \(fe1 run 3"):
            hold.wait(ctx, "seq-write-64k", 2, wait_s=0.1)
        ctx.stack.close()


# -- the places' runs merged -------------------------------------------------------------------------------------
def _part(name: str, guests: int, first: int, offset: float = 0.0) -> spread.Part:
    p = spread.Part(name, guests, first, spread.LocalShell(spread.local_record(), []))
    p.offset_s = offset
    return p


def _row(side: str, metric: str, value: float, instance: int | None, start: float, end: float,
         host_mbps: float | None = None) -> dict:
    """A row as a place's run exports it: the host disk's figures on its sum rows only (measure.storage_test_many)."""
    host = None if instance is not None else 1.0
    return {"side": side, "test": "seq-write-64k", "metric": metric, "value": value, "instance": instance,
            "labels": ["emulated"], "raw": "", "started_at": start, "finished_at": end, "host_mbps": host_mbps,
            "host_avgrq_sectors": host, "host_avgqu": host, "host_util": host}


def test_each_places_rows_are_renumbered_and_the_runs_row_is_the_sum_over_all():
    a, b = _part("local", 2, 1), _part("be1", 1, 3)
    rows_a = [_row("guest", "MB/s", 10.0, 1, 100.0, 110.0), _row("guest", "MB/s", 20.0, 2, 100.1, 111.0),
              _row("guest", "lat_us", 100.0, 1, 100.0, 110.0), _row("guest", "lat_us", 300.0, 2, 100.1, 111.0),
              _row("guest", "MB/s", 30.0, None, 100.0, 111.0, host_mbps=33.0),
              _row("guest", "lat_us", 200.0, None, 100.0, 111.0)]
    rows_b = [_row("guest", "MB/s", 5.0, 1, 99.9, 112.0), _row("guest", "lat_us", 500.0, 1, 99.9, 112.0),
              _row("guest", "MB/s", 5.0, None, 99.9, 112.0, host_mbps=6.0),
              _row("guest", "lat_us", 500.0, None, 99.9, 112.0)]
    out = spread.merged_rows([a, b], [rows_a, rows_b])
    mbps = [(r["instance"], r["value"]) for r in out if r["metric"] == "MB/s"]
    assert mbps == [(1, 10.0), (2, 20.0), (3, 5.0), (None, 35.0)]
    total = next(r for r in out if r["metric"] == "MB/s" and r["instance"] is None)
    assert (total["started_at"], total["finished_at"], total["host_mbps"]) == (99.9, 112.0, 39.0)
    assert total["host_avgqu"] is None and total["host_util"] is None  # each place's own disk: kept with the place
    lat = next(r for r in out if r["metric"] == "lat_us" and r["instance"] is None)
    assert lat["value"] == pytest.approx(300.0)  # the mean over the three guests, not over the two places


def test_the_start_skew_spans_the_places_on_this_hosts_clock():
    a, b = _part("local", 2, 1), _part("be1", 1, 3, offset=0.45)  # be1's clock 450 ms ahead of this host's
    front = Provenance(guests=Guests(count=3, places=[Place(name="local", guests=2, first=1),
                                                     Place(name="be1", guests=1, first=3)]))
    pa = Provenance(host="fe1", guests=Guests(count=2, guests=[GuestStart(name="g1"), GuestStart(name="g2")],
                                              started_at={"seq-write-64k": 100.0},
                                              start_offsets_s={"seq-write-64k": [0.0, 0.01]}, baseline_processes=2))
    pb = Provenance(host="be1", guests=Guests(count=1, guests=[GuestStart(name="g1")],
                                              started_at={"seq-write-64k": 100.48},
                                              start_offsets_s={"seq-write-64k": [0.0]}, baseline_processes=1,
                                              vcpus=2, host_cpus=1))
    datas = [{"accelerator": "kvm", "measurements": []}, {"accelerator": "tcg", "measurements": [
        {"side": "guest", "test": "seq-write-64k", "metric": "MB/s", "instance": None, "host_mbps": 6.0,
         "host_avgqu": 0.5, "host_util": 20.0}]}]
    merged = spread.merged_provenance(front, [a, b], [pa, pb], datas)
    g = merged.guests
    assert g is not None
    assert g.start_offsets_s["seq-write-64k"] == [0.0, 0.01, 0.03] and g.skew_s["seq-write-64k"] == 0.03
    assert [x.place for x in g.guests] == ["local", "local", "be1"] and g.baseline_processes == 3
    assert merged.host == "fe1, be1"
    assert [(pl.vcpus, pl.host_cpus) for pl in g.places] == [(None, None), (2, 1)]  # each place's own CPUs
    assert g.places[1].host_metrics == {"guest:seq-write-64k": {"host_mbps": 6.0, "host_avgqu": 0.5,
                                                                "host_util": 20.0}}
    assert spread.least_native(["kvm", "tcg"]) == "tcg" and spread.least_native(["kvm", "kvm"]) == "kvm"


def test_results_show_names_each_place_its_guests_and_its_clock(state, capsys):
    from cloudbox import cli

    prov = Provenance(guests=Guests(count=2, guests=[GuestStart(name="g1", disk="/dev/loop1", place="local"),
                                                     GuestStart(name="g2", disk="/dev/loop0", place="be1")],
                                    skew_s={"seq-write-64k": 0.012},
                                    places=[Place(name="local", guests=1, first=1, run_id=4, host="fe1",
                                                  accelerator="tcg", clock_offset_s=0.0, clock_rtt_s=0.0001),
                                            Place(name="be1", guests=1, first=2, run_id=9, host="be1",
                                                  accelerator="tcg", clock_offset_s=-0.0123, clock_rtt_s=0.0451,
                                                  vcpus=2, host_cpus=1)]))
    with ResultStore() as store:
        rid = store.create_run(uuid="1" * 32, profile_name="virtio-disk", suite="storage", state="completed",
                               node="local,be1", provenance=prov)
    assert cli.main(["results", "show", str(rid)]) == 0
    out = capsys.readouterr().out
    assert "g1 (/dev/loop1 on local), g2 (/dev/loop0 on be1)" in out
    assert "place        local: g1 on fe1 (tcg), its run 4; its clock +0.0 ms" in out
    assert "place        be1: g2 on be1 (tcg), its run 9; its clock -12.3 ms from the front-end's (round trip " \
           "45.1 ms); vCPUs 2 on 1 host CPU: overcommitted, the guests shared CPUs (vcpu-overcommit)" in out


# -- a real coordinated run --------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.root
def test_a_coordinated_run_holds_this_hosts_part_releases_it_and_merges_its_rows(state, libvirt_conn, monkeypatch,
                                                                                 tmp_path):
    """The coordinator, the hold, the channel and this host's part are real (two TCG guests, a detached run in the
    parts store); only the place list is one place (this host, with both guests): a second place needs a second
    host, which the cluster suite has. A mixed run: the part gets its guests' two profiles through the agent. One
    storage and one network test, each held and released."""
    from real_runs import leftovers, lsi_disk_profile

    from cloudbox.core.run.lifecycle import Execution

    def this_host_only(ctx):
        return [spread.Part("local", ctx.spec.guests, 1, spread.LocalShell(spread.local_record(), []))]

    monkeypatch.setattr(spread, "find_places", this_host_only)
    monkeypatch.setattr(preflight, "node_problems", lambda spec, **kw: [])  # be1 is a name the place list never uses
    lsi, _ = lsi_disk_profile(tmp_path)
    spec = RunSpec(profile=f"virtio-disk+{lsi}", suite="all", size="quick", storage_tests="seq-write-64k",
                   net_tests="tcp-stream", guests=2, node="local,be1")
    lines: list[str] = []
    with ResultStore() as store:
        rid = Execution(spec, store, spread.run_spread, emit=lambda ev: lines.append(describe(ev) or "")).execute()
        run = store.get_run(rid)
    assert run.state == "completed", run.reason
    for test, metric in (("seq-write-64k", "MB/s"), ("tcp-stream", "Mbit/s")):  # a network test is held too
        assert any(f"{test}: every place ready; released" in ln for ln in lines), test
        assert any(f"baseline.{test}: every place ready; released" in ln for ln in lines), test  # bare metal too
        assert any(f"local: {test}: the front-end's start instant is" in ln for ln in lines), test
        for side in ("guest", "baseline"):
            each = run.instances(side, test, metric)
            assert [m.instance for m in each] == [1, 2] and all(m.value > 0 for m in each), (side, test)
            total = run.measurement(side, test, metric)
            assert total is not None and total.value == pytest.approx(sum(m.value for m in each), rel=1e-9)
    info = run.provenance.guests
    assert info is not None and [g.place for g in info.guests] == ["local", "local"]
    assert [g.profile for g in info.guests] == ["virtio-disk", "lsi-disk"]
    assert run.profile_name == "virtio-disk+lsi-disk"
    assert "bus='scsi'" in info.domain_xml["lsi-disk"] and "bus='virtio'" in info.domain_xml["virtio-disk"]
    place = info.places[0]
    assert place.run_id is not None and place.clock_rtt_s is not None and abs(place.clock_offset_s or 0) < 0.05
    assert "guest:seq-write-64k" in place.host_metrics
    assert 0 <= info.skew_s["seq-write-64k"] < 0.5 and 0 <= info.skew_s["tcp-stream"] < 0.5
    assert "guest:tcp-stream" in place.host_metrics
    with ResultStore(spread.parts_state_dir() / "results.db") as parts:  # the part's own record, completed
        part = parts.get_run(place.run_id)
        assert part.state == "completed" and part.profile_name == "virtio-disk+lsi-disk"  # its profiles, as sent
    left = leftovers(libvirt_conn, state)
    assert not any(left.values()), left
    assert not (hold.hold_dir(place.run_id)).exists()
    work = spread.parts_state_dir() / "work"
    assert not work.exists() or list(work.iterdir()) == []


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.full  # 25 s under TCG; make test keeps the coordinated run above, cluster-full the shared export
@pytest.mark.skipif(bool(nfs.server_problem()), reason="needs nfs-ganesha, nfs-ganesha-vfs (make deps)")
def test_a_spread_runs_places_share_one_nfs_export_that_the_front_end_serves(state, libvirt_conn, monkeypatch):
    """nfs-async-tcp spread over places: the coordinator serves one export on its private address (here one end
    of a veth pair: this machine has no private network) to the private subnet and the run bridge's, and this
    host's part mounts it in its guests through their bridge, each guest's file named by its number in the whole
    run (the part here stands as a second place: g2 and g3). Without an NFSv4 client on this host (the build
    machines have none) its part has no baseline and passes bare metal's holds with nothing to run."""
    from real_runs import leftovers

    from cloudbox.core.disks.volumes.attach import kernel_module_available
    from cloudbox.core.run.lifecycle import Execution
    from cloudbox.core.spec import nodeconf
    from cloudbox.core.virt import network

    client_problem = nfs.host_client_problem(kernel_module_available)
    link, addr = "cbtst0", "10.99.77.1"
    monkeypatch.setattr(network, "private_address", lambda: addr)
    monkeypatch.setattr(nodeconf, "private_link", lambda settings: link)
    monkeypatch.setattr(spread, "find_places", lambda ctx: [
        spread.Part("local", ctx.spec.guests, 2, spread.LocalShell(spread.local_record(), []))])
    monkeypatch.setattr(preflight, "node_problems", lambda spec, **kw: [])  # be1 is a name the place list never uses
    spec = RunSpec(profile="nfs-async-tcp", suite="storage", size="16M", storage_tests="seq-write-64k", guests=2,
                   node="local,be1")
    lines: list[str] = []
    subprocess.run(["ip", "link", "add", link, "type", "veth", "peer", "name", f"{link}p"], check=True)
    try:
        subprocess.run(["ip", "addr", "add", f"{addr}/24", "dev", link], check=True)
        for dev in (link, f"{link}p"):
            subprocess.run(["ip", "link", "set", dev, "up"], check=True)
        with ResultStore() as store:
            rid = Execution(spec, store, spread.run_spread, emit=lambda ev: lines.append(describe(ev) or "")).execute()
            run = store.get_run(rid)
    finally:
        subprocess.run(["ip", "link", "del", link], check=False)
    assert run.state == "completed", run.reason
    assert any(f"serving nfs:share to the guests of local over NFSv4 (nfs-ganesha) on {addr}, to the private "
               f"network's subnet and {addresses.bridge_subnet()} only" in ln for ln in lines), lines
    assert any("baseline.seq-write-64k: every place ready; released" in ln for ln in lines)
    each = run.instances("guest", "seq-write-64k", "MB/s")
    assert [m.instance for m in each] == [2, 3] and all(m.value > 0 for m in each)
    files = [json.loads(m.raw)["jobs"][0]["job options"]["filename"] for m in each]
    assert files == [nfs.test_file(2), nfs.test_file(3)]  # no two places' guests on one file
    v = run.provenance.volume
    assert v is not None and addr in v.mount and " nfs4 " in v.mount, v  # the guest mounted the private address
    assert (v.server_bytes_written or 0) >= 2 * 16 * 2**20, v  # both guests' files reached the served disk
    base = run.value("baseline", "seq-write-64k", "MB/s")
    if client_problem:  # the part's host cannot mount the export: no bare-metal row, and the holds still passed
        assert base is None
    else:  # its host mounted the export over the private address, as a node's host does
        assert base is not None and base > 0
    assert subprocess.run(["pgrep", "-f", f"ganesha.nfsd .*{state}"], capture_output=True).returncode == 1  # stopped
    left = leftovers(libvirt_conn, state)
    assert not any(left.values()), left


# -- a place that misbehaves on its coordination channel ------------------------------------------------------------
@pytest.mark.parametrize(("script", "timeout", "message"), [
    # a place that answers with a line that never ends: stopped after CHANNEL_LINE_MAX bytes, not read for ever
    ("import sys, time; sys.stdin.readline(); sys.stdout.write('9' * 100000); sys.stdout.flush(); time.sleep(60)",
     30.0, "longer than 4096 bytes"),
    # a place that starts an answer and never finishes it: the read ends at the channel's time bound
    ("import sys, time; sys.stdin.readline(); sys.stdout.write('12'); sys.stdout.flush(); time.sleep(60)",
     1.0, "no answer to 'clock' on the coordination channel within 1 s"),
])
def test_a_place_cannot_hold_the_coordinator_with_an_endless_answer(script, timeout, message):
    import subprocess
    import sys
    import time

    p = _part("be1", 1, 1)
    p.channel = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        t0 = time.monotonic()
        with pytest.raises(CloudboxError, match=message):
            p.ask("clock", timeout=timeout)
        assert time.monotonic() - t0 < timeout + 5
    finally:
        p.channel.kill()
        p.channel.wait()


@pytest.mark.parametrize("answer", ["nan", "inf", "-inf", "1e999", "twelve"])
def test_a_place_clock_that_is_not_a_finite_number_is_refused(answer):
    import subprocess
    import sys

    p = _part("be1", 1, 1)
    script = f"import sys\nfor _ in sys.stdin: print({answer!r}, flush=True)"
    p.channel = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        with pytest.raises(CloudboxError, match="its clock: .* is not a finite number"):
            p.measure_clock(tries=1)
    finally:
        p.channel.kill()
        p.channel.wait()


def test_lines_after_an_answer_wait_for_the_next_question():
    import subprocess
    import sys

    p = _part("be1", 1, 1)
    script = "import sys\nsys.stdin.readline(); print('ok one\\nok two', flush=True); sys.stdin.readline()"
    p.channel = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert p.ask("first") == "ok one" and p.ask("second") == "ok two"
    finally:
        p.channel.kill()
        p.channel.wait()
