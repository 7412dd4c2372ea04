"""N guests of one profile at once on this host (--guests N): the aggregation (sum, min/median/max, Jain's index),
the option's checks and the host's capacity, the per-guest rows in the results store and the tables, the start
barrier's shell; and real runs of two TCG guests (one in make test, the Ctrl-C cleanup under `full`)."""

from __future__ import annotations

import io
import json
import os
import sqlite3
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cloudbox import cli
from cloudbox.cli.run import Printer
from cloudbox.core.bench import barrier, nettests
from cloudbox.core.disks import hostraid
from cloudbox.core.errors import UsageError
from cloudbox.core.record import events, schema
from cloudbox.core.record.events import InstanceFigures, MeasurementEvent, PlanProgress, ProgressEvent
from cloudbox.core.record.fairness import jain_index, spread
from cloudbox.core.record.provenance import Guests, GuestStart, Provenance
from cloudbox.core.record.results import ResultStore
from cloudbox.core.record.rows import Run
from cloudbox.core.run.multi import QEMU_OVERHEAD_MIB, check_fits, serve_many
from cloudbox.core.spec import addresses, catalogue
from cloudbox.core.spec.profiles import mix_hash, resolve_profile
from cloudbox.core.spec.runspec import MAX_GUESTS, RunSpec
from cloudbox.core.views import compare, labels, render


# -- aggregation -------------------------------------------------------------------------------------------------
def test_jain_index_is_one_for_equal_shares_and_one_over_n_when_one_takes_all():
    assert jain_index([50.0, 50.0, 50.0]) == pytest.approx(1.0)
    assert jain_index([90.0, 0.0, 0.0]) == pytest.approx(1 / 3)
    assert jain_index([30.0, 10.0]) == pytest.approx(40**2 / (2 * (900 + 100)))  # 0.8
    assert jain_index([0.0, 0.0]) == 1.0
    with pytest.raises(ValueError, match="non-negative"):
        jain_index([1.0, -1.0])
    with pytest.raises(ValueError, match="no values"):
        jain_index([])


def test_spread_sums_and_takes_min_median_max():
    s = spread([28.5, 43.25, 30.0, 10.0])
    assert (s.n, s.total, s.min, s.median, s.max) == (4, 111.75, 10.0, 29.25, 43.25)
    assert s.jain == pytest.approx(111.75**2 / (4 * (28.5**2 + 43.25**2 + 30**2 + 10**2)))
    assert spread([7.0]).jain == 1.0 and spread([7.0]).median == 7.0
    assert "2 guests: sum 3.0 MB/s" in spread([1.0, 2.0]).describe()


# -- the option --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("kw", "message"), [
    ({"guests": 0}, rf"--guests 0 is not allowed; allowed: 1 to {MAX_GUESTS} guests"),
    ({"guests": -2}, r"--guests -2 is not allowed"),
    ({"guests": MAX_GUESTS + 1}, rf"--guests {MAX_GUESTS + 1} is not allowed"),
    ({"guests": 3, "suite": "guest"}, r"--guests 3 runs the storage and network tests of N guests at once; --suite "
                                      r"guest runs one guest; allowed with --guests > 1: --suite storage, network or "
                                      r"all"),
    ({"guests": 2, "suite": "storage", "device": "/dev/sdb"}, r"--guests 2 with --device '/dev/sdb': one device"),
])
def test_bad_guest_counts_and_combinations_name_the_flag(kw, message):
    with pytest.raises(UsageError, match=message):
        RunSpec(profile="virtio-disk", **kw).validate()


def test_guests_is_a_run_flag_and_only_in_the_stored_spec_when_more_than_one(isolated, cli_run):
    spec = RunSpec(profile="virtio-disk", suite="storage", guests=2)
    spec.validate()
    assert spec.as_dict()["guests"] == 2 and RunSpec.from_dict(spec.as_dict()) == spec
    assert "guests" not in RunSpec(profile="virtio-disk").as_dict()  # an older node reads a one-guest request
    code, _, err = cli_run(["run", "--profile", "virtio-disk", "--guests", "0"])
    assert code == 2 and "--guests 0 is not allowed" in err
    code, _, err = cli_run(["run", "--profile", "virtio-disk", "--guests", "2", "--suite", "guest"])
    assert code == 2 and "--suite guest runs one guest" in err
    for suite in ("network", "all"):  # both suites run with N guests
        RunSpec(profile="virtio-disk", suite=suite, guests=2).validate()
    assert not isolated.exists()


def test_a_list_of_guest_counts_is_one_run_per_count(isolated, cli_run):
    from cloudbox.cli.run import _specs

    args = cli.build_parser().parse_args(["run", "-p", "virtio-disk", "-s", "storage", "--guests", "1, 2,4"])
    assert [(s.guests, s.suite) for s in _specs(args)] == [(1, "storage"), (2, "storage"), (4, "storage")]
    assert [s.guests for s in _specs(cli.build_parser().parse_args(["run", "-p", "x"]))] == [1]
    for given, message in (("1,x", "--guests '1,x': 'x' is not understood; allowed: one value or a comma-separated "
                                    "list such as 1,2,4 (one run each)"),
                           ("2,2", "--guests '2,2': 2 is given twice; allowed: each value once"),
                           ("1,0", "--guests 0 is not allowed; allowed: 1 to 64")):
        code, _, err = cli_run(["run", "-p", "virtio-disk", "-s", "storage", "--guests", given])
        assert code == 2 and message in err
    assert not isolated.exists()


def test_the_sweep_table_has_a_row_per_guest_count(tmp_path):
    with ResultStore(tmp_path / "r.db") as store:
        one = store.create_run(profile_name="virtio-disk", suite="storage", accelerator="tcg")
        store.add_measurement(one, side="baseline", test="seq-write-64k", metric="MB/s", value=150.0)
        store.add_measurement(one, side="guest", test="seq-write-64k", metric="MB/s", value=20.0, host_avgqu=0.5)
        two = _run_of_two(store)
        runs = [store.get_run(one), store.get_run(two)]
    table = compare.guest_sweep_table(runs)
    (section,) = table.sections
    cells = [{k: r.cells[k] for k in ("run", "guests", "value", "min", "median", "max", "skew", "base", "avgqu")}
             for r in section.rows]
    assert cells == [
        {"run": "#1 *", "guests": 1, "value": 20.0, "min": 20.0, "median": 20.0, "max": 20.0, "skew": None,
         "base": 150.0, "avgqu": 0.5},
        {"run": "#2 *", "guests": 2, "value": 40.0, "min": 10.0, "median": 20.0, "max": 30.0,
         "skew": pytest.approx(12.0), "base": 203.0, "avgqu": 1.5}]
    assert [r.cells["jain"] for r in section.rows] == [1.0, pytest.approx(0.8)]
    text = render.to_text(table, width=120)
    assert "sum MB/s" in text and "0.800" in text and "measured under TCG emulation" in text


def test_more_guests_than_memory_or_cpus_hold_is_refused_with_the_arithmetic():
    p = resolve_profile("virtio-disk")  # 1024 MiB, 1 vCPU
    spec = RunSpec(profile="virtio-disk", suite="storage", guests=4)
    with pytest.raises(UsageError) as e:
        check_fits(spec, p, available_mib=4000, host_cpus=8)
    assert str(e.value) == (f"--guests 4: 4 x (1024 MiB guest.memory_mib + {QEMU_OVERHEAD_MIB} MiB QEMU) + 512 MiB for "
                            f"the host = 5632 MiB, but this host has 4000 MiB available; allowed: --guests 1 to 2 with "
                            "profile virtio-disk")
    with pytest.raises(UsageError, match=r"--guests 4: 4 x 1 guest.vcpus = 4 vCPUs, but this host has 2 CPUs; "
                                         r"allowed: --guests 1 to 2"):
        check_fits(spec, p, available_mib=64000, host_cpus=2)
    check_fits(spec, p, available_mib=64000, host_cpus=4)
    with pytest.raises(UsageError, match=r"--guests 4: 4 x \(1024 MiB guest.memory_mib"):  # every suite alike
        check_fits(RunSpec(profile="virtio-disk", suite="network", guests=4), p, available_mib=4000, host_cpus=8)
    check_fits(RunSpec(profile="virtio-disk", guests=1), p, available_mib=1, host_cpus=1)  # one guest: not checked
    # on a node, the node's memory and CPUs count: its own start checks them (agent.local_start_run)
    on_node = RunSpec(profile="virtio-disk", suite="storage", guests=4, node="be1")
    on_node.validate()
    check_fits(on_node, p, available_mib=1, host_cpus=1)
    with pytest.raises(UsageError, match="disk.backing = network-volume exports one volume"):  # the profile still is
        check_fits(on_node, p.model_copy(update={"disk": p.disk.model_copy(
            update={"backing": "network-volume", "volume": "v1"})}), available_mib=1, host_cpus=1)


def test_cpu_overcommit_lets_guests_share_host_cpus_up_to_the_ratio_and_no_further():
    p = resolve_profile("virtio-disk")  # 1 vCPU
    with pytest.raises(UsageError) as e:
        check_fits(RunSpec(profile="virtio-disk", suite="storage", guests=2), p, available_mib=64000, host_cpus=1)
    assert str(e.value) == ("--guests 2: 2 x 1 guest.vcpus = 2 vCPUs, but this host has 1 CPU; allowed: --guests 1 "
                            "to 1 with profile virtio-disk (each vCPU gets a host CPU, else the figures measure the "
                            "scheduler), or --cpu-overcommit 2 to share the host's CPUs (the figures then carry the "
                            "vcpu-overcommit caveat)")
    check_fits(RunSpec(profile="virtio-disk", suite="storage", guests=2, cpu_overcommit=2), p, available_mib=64000,
               host_cpus=1)
    with pytest.raises(UsageError) as e:  # 1.5 x 2 CPUs = 3 vCPUs: the fourth guest is one too many
        check_fits(RunSpec(profile="virtio-disk", suite="storage", guests=4, cpu_overcommit=1.5), p,
                   available_mib=64000, host_cpus=2)
    assert str(e.value).startswith("--guests 4: 4 x 1 guest.vcpus = 4 vCPUs, but this host has 2 CPUs x "
                                   "--cpu-overcommit 1.5 = 3 vCPUs; allowed: --guests 1 to 3 with profile virtio-disk, "
                                   "or --cpu-overcommit 2 ")
    with pytest.raises(UsageError) as e:  # 64 vCPUs on 2 CPUs is beyond the largest ratio: no ratio offered
        check_fits(RunSpec(profile="virtio-disk", suite="storage", guests=64), p, available_mib=10**7, host_cpus=2)
    assert "--cpu-overcommit" not in str(e.value)
    for bad in (0.5, 17, 0):
        with pytest.raises(UsageError, match=rf"--cpu-overcommit {bad!r} is not allowed; allowed: 1 .* to 16 guest "
                                             "vCPUs per host CPU"):
            RunSpec(profile="virtio-disk", suite="storage", guests=2, cpu_overcommit=bad).validate()


def test_a_profile_that_cannot_run_n_guests_is_refused():
    p = resolve_profile("virtio-disk")
    vol = p.model_copy(update={"disk": p.disk.model_copy(update={"backing": "network-volume", "volume": "v1"})})
    spec = RunSpec(profile="virtio-disk", suite="storage", guests=2)
    with pytest.raises(UsageError, match="disk.backing = network-volume exports one volume for one guest"):
        check_fits(spec, vol, available_mib=64000, host_cpus=8)
    check_fits(spec, resolve_profile("nfs-async-tcp"), available_mib=64000, host_cpus=8)  # one export, all mount it
    xen = p.model_copy(update={"guest": p.guest.model_copy(update={"hypervisor": "xen"})})
    with pytest.raises(UsageError, match="guest.hypervisor = xen: --guests 2 runs KVM/QEMU guests only"):
        check_fits(spec, xen, available_mib=64000, host_cpus=8)


# -- the barrier's shell, run by this host's busybox (the guest image's shell) -----------------------------------
def test_the_barrier_holds_until_the_uptime_and_stamps_when_it_let_go(tmp_path, monkeypatch):
    if not any(Path(d, "busybox").exists() for d in os.environ.get("PATH", "").split(":")):
        pytest.skip("busybox is not installed (the guest image's shell)")
    stamp = tmp_path / "start"
    monkeypatch.setattr(barrier, "START_STAMP", str(stamp))
    up = float(Path("/proc/uptime").read_text().split()[0]) + 0.7
    t0 = time.monotonic()
    subprocess.run(["busybox", "sh", "-c", barrier.barrier_script(up) + "true"], check=True, timeout=10)
    held = time.monotonic() - t0
    left = barrier.parse_start_stamp(stamp.read_text())
    assert 0.5 < held < 1.5, held
    assert up - 0.01 <= left < up + 0.1, (up, left)


# -- stored and shown --------------------------------------------------------------------------------------------
def _run_of_two(store: ResultStore) -> int:
    rid = store.create_run(profile_name="virtio-disk", suite="storage", accelerator="tcg",
                           provenance=Provenance(guests=Guests(count=2, guests=[GuestStart(name="g1"),
                                                                                GuestStart(name="g2")],
                                                               skew_s={"seq-write-64k": 0.012})))
    for k, v in ((1, 30.0), (2, 10.0)):
        store.add_measurement(rid, side="guest", test="seq-write-64k", metric="MB/s", value=v, instance=k)
        store.add_measurement(rid, side="baseline", test="seq-write-64k", metric="MB/s", value=100.0 + k, instance=k)
    store.add_measurement(rid, side="guest", test="seq-write-64k", metric="MB/s", value=40.0, host_avgqu=1.5)
    store.add_measurement(rid, side="baseline", test="seq-write-64k", metric="MB/s", value=203.0)
    return rid


def test_each_guest_and_the_sum_are_stored_and_read_apart(tmp_path):
    with ResultStore(tmp_path / "r.db") as store:
        rid = _run_of_two(store)
        run = store.get_run(rid)
    assert run.value("guest", "seq-write-64k", "MB/s") == 40.0  # the run's figure: the sum
    assert [m.value for m in run.instances("guest", "seq-write-64k", "MB/s")] == [30.0, 10.0]
    assert [m.instance for m in run.instances("baseline", "seq-write-64k", "MB/s")] == [1, 2]
    assert all(m.labels == ["emulated"] for m in run.instances("guest", "seq-write-64k", "MB/s"))
    assert run.provenance.guests is not None and run.provenance.guests.count == 2
    with ResultStore(tmp_path / "r.db") as store, pytest.raises(ValueError, match="instance must be None or"):
        store.add_measurement(rid, side="guest", test="t", metric="MB/s", value=1, instance=0)


def test_the_tables_show_the_sum_each_guest_and_the_spread(tmp_path):
    with ResultStore(tmp_path / "r.db") as store:
        one = store.create_run(profile_name="virtio-disk", suite="storage", accelerator="tcg")
        store.add_measurement(one, side="baseline", test="seq-write-64k", metric="MB/s", value=150.0)
        store.add_measurement(one, side="guest", test="seq-write-64k", metric="MB/s", value=20.0)
        two = _run_of_two(store)
        runs = [store.get_run(one), store.get_run(two)]
    table = compare.compare_table(runs)
    rows = [(r.kind, r.cells["run"], r.cells["value"], r.cells["pct"]) for r in table.sections[0].rows]
    # each run against its own baseline: one process's is never averaged with two processes'
    assert rows == [("baseline", "#1", 150.0, None), ("guest", "#1", 20.0, pytest.approx(20 / 150 * 100)),
                    ("baseline", "#2 sum", 203.0, None), ("baseline", "#2 p1", 101.0, None),
                    ("baseline", "#2 p2", 102.0, None), ("guest", "#2 sum", 40.0, pytest.approx(40 / 203 * 100)),
                    ("guest", "#2 g1", 30.0, None), ("guest", "#2 g2", 10.0, None)]
    text = render.to_text(table, width=200)
    assert ("#2 seq-write-64k: 2 guests, sum 40.0 MB/s; per guest min 10.0 / median 20.0 / max 30.0; Jain's "
            "fairness index 0.800; start skew 12 ms. Bare metal, 2 processes: sum 203.0") in text
    assert "2 guests at once (rows: their sum, then each guest;" in table.legend[1] and "guests" not in table.legend[0]


def test_a_schema_3_database_gains_the_instance_column(tmp_path):
    db = tmp_path / "v3.db"
    with sqlite3.connect(db) as c:
        for n in range(3):
            schema.MIGRATIONS[n](c)
        c.execute("PRAGMA user_version = 3")
        c.execute("INSERT INTO runs (id, uuid, suite, state) VALUES (4, 'u4', 'storage', 'completed')")
        c.execute("INSERT INTO measurements (run_id, side, test, metric, value) VALUES (4, 'guest', 't', 'MB/s', 5)")
    with ResultStore(db) as s:
        assert s.schema_version == schema.SCHEMA_VERSION
        run = s.get_run(4)
        assert run.value("guest", "t", "MB/s") == 5 and run.measurements[0].instance is None
    with sqlite3.connect(db) as c, pytest.raises(sqlite3.IntegrityError):
        c.execute("INSERT INTO measurements (run_id, side, test, metric, value, instance) "
                  "VALUES (4, 'guest', 't', 'MB/s', 1, 0)")


# -- live events -------------------------------------------------------------------------------------------------
def test_each_guests_events_carry_its_number_through_the_store(tmp_path):
    recs = [ProgressEvent("guest", "seq-write-64k", 40.0, "00m:03s", 26.5, instance=2),
            MeasurementEvent("baseline", "seq-write-64k", "MB/s", 101.0, ("quick-size",), 1616.0, instance=1)]
    with ResultStore(tmp_path / "r.db") as store:
        rid = store.create_run(profile_name="x")
        for rec in recs:
            store.add_event(rid, rec.kind, rec.to_payload())
        assert [ev.record for ev in store.events_since(rid)] == recs
    assert "instance" not in ProgressEvent("guest", "t", 1.0).to_payload()  # one guest's events read as before
    assert events.parse("progress", {"side": "guest", "test": "t", "instance": 0}).instance is None  # type: ignore[union-attr]
    assert events.parse("progress", {"side": "guest", "test": "t", "instance": True}).instance is None  # type: ignore[union-attr]
    assert events.describe(recs[1]) == "  = baseline seq-write-64k p1: 101 MB/s [quick-size]"
    assert events.progress_line(recs[0]) == "  [guest] seq-write-64k g2  40.0%      26.5 MB/s  eta 00m:03s"


def test_each_guests_progress_is_thinned_on_its_own_and_the_cli_prints_the_first(tmp_path):
    from cloudbox.core.run.sink import EventSink

    got: list[events.RunEvent] = []
    sink = EventSink(ResultStore(tmp_path / "r.db"), None, got.append)
    for k in (1, 2, 1, 2):  # within half a second: the second of each guest is dropped, not the other guest's
        sink.progress("guest", "seq-write-64k", k)({"pct": 10.0, "mbps": 5.0 * k})
    assert [(e.instance, e.mbps) for e in got if isinstance(e, ProgressEvent)] == [(1, 5.0), (2, 10.0)]
    out = io.StringIO()
    printer = Printer(out)
    printer.last_plain = -1e9
    printer(ProgressEvent("guest", "seq-write-64k", 10.0, None, 10.0, instance=2))
    assert out.getvalue() == ""
    printer(ProgressEvent("guest", "seq-write-64k", 10.0, None, 5.0, instance=1))
    assert "seq-write-64k g1" in out.getvalue()


def test_the_figures_of_n_guests_live_and_done():
    fig = InstanceFigures()
    plan = PlanProgress()
    seq = [ProgressEvent("guest", "seq-write-64k", 50.0, None, 20.0, instance=1),
           ProgressEvent("guest", "seq-write-64k", 30.0, None, 14.0, instance=2),
           ProgressEvent("guest", "seq-write-64k", 90.0, None, 22.0, instance=1)]
    for rec in seq:
        assert fig.feed(rec)
        plan.feed(rec)
    assert fig.many and fig.total() == 36.0
    assert plan.current_pct == 90.0  # the first guest's progress stands for the step
    assert fig.line() == "guest seq-write-64k now: g1 22.0  g2 14.0  sum 36.0 MB/s"
    for k, v in ((1, 30.0), (2, 10.0)):
        assert fig.feed(MeasurementEvent("guest", "seq-write-64k", "MB/s", v, ("emulated",), instance=k))
    assert fig.feed(MeasurementEvent("guest", "seq-write-64k", "MB/s", 40.0, ("emulated",)))
    assert fig.line() == ("guest seq-write-64k done: sum 40.0 MB/s, per guest min 10.0 / median 20.0 / max "
                          "30.0, Jain 0.800 [emulated]")  # the test is over: its spread, not its last figures
    assert fig.total() is None
    assert not fig.feed(ProgressEvent("guest", "boot", 0.0, "12 s"))
    one = InstanceFigures()  # a run of one guest: nothing to show
    assert not one.feed(ProgressEvent("guest", "seq-write-64k", 50.0, None, 20.0))
    assert not one.feed(MeasurementEvent("guest", "seq-write-64k", "MB/s", 20.0))
    assert not one.many and one.line() == ""
    wide = InstanceFigures()
    for k in range(1, 11):
        wide.feed(ProgressEvent("guest", "t", 1.0, None, 1.0, instance=k))
    assert wide.line(most=8).endswith("g8 1.0  (+2 more)  sum 10.0 MB/s")


# -- the network tests of N guests -------------------------------------------------------------------------------
def test_each_guest_has_its_own_address_on_the_runs_bridge():

    assert addresses.guest_ip(1) == addresses.GUEST_IP
    assert [addresses.guest_ip(k) for k in (2, MAX_GUESTS)] == ["169.254.100.3", f"169.254.100.{MAX_GUESTS + 1}"]
    assert addresses.HOST_IP not in {addresses.guest_ip(k) for k in range(1, MAX_GUESTS + 1)}
    with pytest.raises(ValueError, match="guest number 0 has no address"):
        addresses.guest_ip(0)


def _listening(port: int) -> bool:
    return f":{port} " in subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True).stdout


def test_one_netserver_serves_every_client_and_each_iperf3_client_gets_a_server():
    """netserver forks a child per client: one for N; iperf3 serves one client at a time: N servers. All go with
    the run's network."""
    import shutil

    from cloudbox.core.virt.network import HostNetwork

    if not (shutil.which("netserver") and shutil.which("iperf3")):
        pytest.skip("netserver or iperf3 is not installed on this host")
    hn = HostNetwork(1500)
    try:
        nports = serve_many(hn, "netperf", "127.0.0.1", 3)
        iports = serve_many(hn, "iperf3", "127.0.0.1", 3)
        assert len(set(nports)) == 1 and len(nports) == 3
        assert len(set(iports)) == 3 and not set(iports) & set(nports)
        assert all(_listening(p) for p in {*nports, *iports})
        assert len(hn.procs) == 4
    finally:
        hn.teardown()
    assert not any(_listening(p) for p in {*nports, *iports})


class _LocalGuest:
    """A guest whose agent runs programs on this host (busybox sh, as in the guest image): the barrier's shell and
    the real netperf, without booting anything."""

    name = "local"

    def run(self, argv, *, timeout=120.0, **_kw):
        from cloudbox.core.virt.guest import ExecResult

        if argv[:2] == ["/bin/sh", "-c"]:
            argv = ["busybox", "sh", "-c", argv[2]]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        return ExecResult(argv, p.returncode, p.stdout, p.stderr)

    def sh(self, script, **kw):
        return self.run(["/bin/sh", "-c", script], **kw)


def test_a_guest_network_test_waits_for_the_barrier_and_says_when_it_left(tmp_path, monkeypatch):
    import shutil

    from cloudbox.core.virt import network

    if not (shutil.which("netserver") and shutil.which("netperf") and shutil.which("busybox")):
        pytest.skip("netserver, netperf or busybox is not installed on this host")
    monkeypatch.setattr(barrier, "START_STAMP", str(tmp_path / "start"))
    hn = network.HostNetwork(1500)
    try:
        port = hn.start_netserver("127.0.0.1")
        up = float(Path("/proc/uptime").read_text().split()[0]) + 0.8
        t0 = time.monotonic()
        res = nettests.run_in_guest(_LocalGuest(), catalogue.NET_TESTS["tcp-rr"], port, 1, lambda _p: None,
                                   lambda: False, target="127.0.0.1", start_uptime=up)
        took = time.monotonic() - t0
    finally:
        hn.teardown()
    assert res.value > 0 and res.metric == "trans/s" and res.lat_us is not None
    assert res.started_uptime is not None and up - 0.01 <= res.started_uptime < up + 0.2, (up, res.started_uptime)
    assert took >= 0.7 + 1.0, took  # held at the barrier, then the 1 s test


def _net_ctx(store: ResultStore, spec: RunSpec):
    import contextlib

    from cloudbox.core.run.context import RunContext, RunControl
    from cloudbox.core.run.sink import EventSink
    from cloudbox.core.spec.runspec import QUICK_SIZE

    rid = store.create_run(uuid="0" * 32, profile_name=spec.profile, suite=spec.suite, state="running")
    return RunContext(spec, resolve_profile(spec.profile), QUICK_SIZE, "quick", "0" * 32, rid, store,
                      EventSink(store, rid), RunControl(), contextlib.ExitStack(), Provenance())


def test_a_network_test_of_n_is_stored_per_instance_with_the_sum_and_the_mean_latency(tmp_path):
    from cloudbox.core.run.measure import NetRan, net_test_many

    rr = catalogue.NET_TESTS["tcp-rr"]
    spec = RunSpec(profile="virtio-disk", suite="network", net_tests="tcp-rr", guests=3)
    figures = [(900.0, 1100.0), (1000.0, 1000.0), (800.0, 1300.0)]

    def part(k: int, cancelled) -> NetRan:
        v, lat = figures[k - 1]
        res = nettests.NetResult("tcp-rr", v, "trans/s", lat, f"{v},Trans/s,{lat}\n", hung=1 if k == 2 else 0)
        return NetRan(res, 100.0 + k / 100, 104.0 + k)

    import functools

    with ResultStore(tmp_path / "r.db") as store:
        ctx = _net_ctx(store, spec)
        net_test_many(ctx, "guest", rr, [functools.partial(part, k) for k in (1, 2, 3)], ["emulated"])
        run = store.get_run(ctx.run_id)
        recs = [e.record for e in store.events_since(ctx.run_id)]
    assert [m.value for m in run.instances("guest", "tcp-rr", "trans/s")] == [900.0, 1000.0, 800.0]
    assert [m.value for m in run.instances("guest", "tcp-rr", "lat_us")] == [1100.0, 1000.0, 1300.0]
    total = run.measurement("guest", "tcp-rr", "trans/s")
    assert total is not None and total.value == 2700.0 and total.instance is None
    assert (total.started_at, total.finished_at) == (100.01, 107.0)  # the first start to the last finish
    assert run.value("guest", "tcp-rr", "lat_us") == pytest.approx(1133.333, abs=1e-3)
    assert "measured on attempt 2" in run.instances("guest", "tcp-rr", "trans/s")[1].raw
    meas = [(r.instance, r.metric, r.value) for r in recs if isinstance(r, MeasurementEvent)]
    assert meas == [(1, "trans/s", 900.0), (2, "trans/s", 1000.0), (3, "trans/s", 800.0), (None, "trans/s", 2700.0)]
    fig = InstanceFigures()
    for r in recs:
        fig.feed(r)
    assert fig.line() == ("guest tcp-rr done: sum 2700.0 trans/s, per guest min 800.0 / median 900.0 / max "
                          "1000.0, Jain 0.992 [emulated]")
    text = render.to_text(compare.compare_table([run]), width=200)
    assert "#1 tcp-rr: 3 guests, sum 2700.0 trans/s; per guest min 800.0 / median 900.0 / max 1000.0" in text


def test_one_instance_failing_fails_the_network_test_and_stores_nothing(tmp_path):
    from cloudbox.core.errors import CloudboxError
    from cloudbox.core.run.measure import NetRan, net_test_many
    from cloudbox.core.virt import network

    t = catalogue.NET_TESTS["iperf3-tx"]
    spec = RunSpec(profile="virtio-disk", suite="network", net_tests="iperf3-tx", guests=2)
    stopped: list[bool] = []

    def slow(cancelled) -> NetRan:
        while not cancelled():
            time.sleep(0.01)
        stopped.append(True)
        raise network.Aborted("stopped")

    def broken(cancelled) -> NetRan:
        raise CloudboxError("iperf3 (iperf3-tx) in the guest exited 1: unable to connect")

    with ResultStore(tmp_path / "r.db") as store:
        ctx = _net_ctx(store, spec)
        with pytest.raises(CloudboxError, match="unable to connect"):
            net_test_many(ctx, "guest", t, [slow, broken], [])
        run = store.get_run(ctx.run_id)
    assert stopped == [True] and run.measurements == []


def test_the_runs_reason_quotes_the_console_of_the_first_guest_to_fail(tmp_path):
    """A guest lost mid-test names the run's console; another guest failing after the others were told to stop
    (its agent gone with the same libvirtd, say) does not replace it."""
    from cloudbox.core.errors import GuestUnreachable
    from cloudbox.core.run.multi import _guest_net_part
    from cloudbox.core.virt import network

    class Lost(_LocalGuest):
        def __init__(self, name: str) -> None:
            self.name = name

        def run(self, argv, **_kw):
            raise GuestUnreachable(f"guest agent in {self.name} stopped answering")

    spec = RunSpec(profile="virtio-disk", suite="network", net_tests="tcp-stream", guests=2)
    with ResultStore(tmp_path / "r.db") as store:
        ctx = _net_ctx(store, spec)
        for name, stopping in (("g2", False), ("g1", True)):
            link = network.GuestLink(Lost(name), "eth0", addresses.HOST_IP, "cbbr0", 1500, _tap="none")  # type: ignore[arg-type]
            with pytest.raises(GuestUnreachable, match=name):
                _guest_net_part(ctx, catalogue.NET_TESTS["tcp-stream"], link, 1, 0.0, 0.0, 1, lambda s=stopping: s)
        assert ctx.guest is not None and ctx.guest.name == "g2"


# -- real runs: two TCG guests -----------------------------------------------------------------------------------
SKEW_BOUND_S = 0.5  # the barrier's start skew of two guests; measured 10-80 ms under TCG on 2 cores


def _ours(conn, run_uuid: str) -> list[str]:
    from cloudbox.core.virt.guest import list_guests

    return [g.name for g in list_guests(conn) if run_uuid[:8] in g.name]


def _loops_under(state: Path) -> list[str]:
    out = subprocess.run(["losetup", "--list", "--noheadings", "--output", "NAME,BACK-FILE"], capture_output=True,
                         text=True).stdout
    return [ln for ln in out.splitlines() if str(state) in ln]


def _servers() -> list[str]:
    """netserver and iperf3 servers on the run's link-local addresses (cloudbox's: 169.254.100.1, 169.254.101.1)."""
    out = subprocess.run(["ps", "-eo", "args="], capture_output=True, text=True).stdout
    return [ln for ln in out.splitlines() if ln.split()[:1] in (["netserver"], ["iperf3"]) and " 169.254.10" in ln]


@pytest.fixture
def nothing_left(state, libvirt_conn) -> Callable[[Run], None]:
    """The check every real run of two guests ends with: neither guest, no loop device over this test's files, no
    work files, no bridge, namespace or network test server."""
    from real_runs import leftovers

    def check(run: Run) -> None:
        assert _ours(libvirt_conn, run.uuid) == []
        assert _loops_under(state) == []
        work = state / "state" / "work"
        assert not work.exists() or list(work.iterdir()) == []
        left = leftovers(libvirt_conn, state)
        assert not left["bridge"] and not left["netns"], left
        assert _servers() == []

    return check


@pytest.mark.slow
@pytest.mark.root
def test_two_guests_write_at_once_and_their_sum_is_stored(nothing_left, tmp_path, capsys):
    """Also a mixed run (test_mixed): the second guest under a profile of its own, an emulated LSI SCSI disk with
    the host cache off and two vCPUs, beside the first's virtio-blk; 3 vCPUs, which on a 2-CPU host is an
    overcommitted run (--cpu-overcommit 2), its guest figures labelled so."""
    from real_runs import lsi_disk_profile

    from cloudbox.core.run import runs
    from cloudbox.core.run.local import cpu_counts

    path, lsi = lsi_disk_profile(tmp_path, vcpus=2)
    spec = RunSpec(profile=f"virtio-disk+{path}", suite="storage", size="quick", storage_tests="seq-write-64k",
                   guests=2, cpu_overcommit=2)
    with ResultStore() as store:
        rid = runs.executor(spec, store).execute()
        run = store.get_run(rid)
    assert run.state == "completed", run.reason
    assert run.profile_name == "virtio-disk+lsi-disk"
    assert run.profile_hash == mix_hash([resolve_profile("virtio-disk"), lsi])
    assert [g.profile for g in run.provenance.guests.guests] == ["virtio-disk", "lsi-disk"]
    assert labels.bus_label(run) == "virtio-blk / scsi-lsi"
    xmls = run.provenance.guests.domain_xml  # each profile's guest as libvirt ran it
    assert "bus='virtio'" in xmls["virtio-disk"] and "bus='scsi'" not in xmls["virtio-disk"]
    assert "bus='scsi'" in xmls["lsi-disk"] and "model='lsilogic'" in xmls["lsi-disk"]
    assert "cache='none'" in xmls["lsi-disk"] and "cache='none'" not in xmls["virtio-disk"]
    assert ">2</vcpu>" in xmls["lsi-disk"] and ">1</vcpu>" in xmls["virtio-disk"]
    cpus = cpu_counts()[0]
    over = 3 > cpus
    info = run.provenance.guests
    assert (info.vcpus, info.host_cpus) == (3, cpus)
    for side in ("guest", "baseline"):
        labelled = {"vcpu-overcommit" in m.labels for m in run.measurements if m.side == side}
        assert labelled == {over and side == "guest"}, (side, cpus)
    assert cli.main(["results", "show", str(rid)]) == 0
    shown = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("  vCPUs")]
    assert shown == [f"  vCPUs        3 on {cpus} host CPUs" + (": overcommitted, the guests shared CPUs "
                                                                 "(vcpu-overcommit)" if over else "")]
    for table in (compare.compare_table([run]), compare.guest_sweep_table([run])):
        text = render.to_text(table, width=160)
        assert ("vcpu-overcommit: the" in text) == over, text
    for side in ("guest", "baseline"):
        each = run.instances(side, "seq-write-64k", "MB/s")
        assert [m.instance for m in each] == [1, 2], side
        assert all(m.value > 0 and m.started_at and m.finished_at for m in each), side
        total = run.measurement(side, "seq-write-64k", "MB/s")
        assert total is not None and total.value == pytest.approx(sum(m.value for m in each), rel=1e-9)
        assert total.host_avgqu is not None and total.host_util is not None  # the host disk over the window
    info = run.provenance.guests
    assert info is not None and info.count == 2 and len(info.guests) == 2
    assert all(g.clock_rtt_s is not None and g.clock_rtt_s < 1.0 for g in info.guests)
    skew = info.skew_s["seq-write-64k"]
    starts = [m.started_at for m in run.instances("guest", "seq-write-64k", "MB/s")]
    assert skew == pytest.approx(max(starts) - min(starts), abs=1e-3)
    assert 0 <= skew < SKEW_BOUND_S, skew
    assert run.provenance.spec is not None and run.provenance.spec.guests == 2
    with ResultStore() as store:  # each guest's and process's figure went to watchers too, numbered
        recs = [e.record for e in store.events_since(rid)]
    for side in ("guest", "baseline"):
        each = {r.instance: r.value for r in recs if isinstance(r, MeasurementEvent) and r.side == side}
        assert each.keys() == {1, 2, None} and each[None] == pytest.approx(each[1] + each[2], abs=0.02), each
    nothing_left(run)


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.full  # 20 s under TCG; make test keeps two guests writing at once (cluster-full runs fio's servers too)
def test_fios_own_client_server_mode_drives_a_server_in_every_guest(nothing_left):
    """fiocs-seq-write-64k with --guests 2: a fio --server in each guest on its bridge address, the first guest's
    fio --client sending both their jobs; each server's figure stored as its guest's, fio's own aggregate as the
    run's row (at most their sum: all bytes over the longest job); bare metal, two plain fio processes."""
    from cloudbox.core.run import runs

    size = 16 << 20
    spec = RunSpec(profile="virtio-disk", suite="storage", size="16M", storage_tests="fiocs-seq-write-64k", guests=2)
    with ResultStore() as store:
        rid = runs.executor(spec, store).execute()
        run = store.get_run(rid)
    assert run.state == "completed", run.reason
    each = run.instances("guest", "fiocs-seq-write-64k", "MB/s")
    assert [m.instance for m in each] == [1, 2] and all(m.value > 0 for m in each)
    job = run.measurement("guest", "fiocs-seq-write-64k", "MB/s")
    assert job is not None and 0 < job.value <= sum(m.value for m in each) * 1.0001
    stats = json.loads(job.raw)["client_stats"]
    servers = {c["hostname"]: c for c in stats if c["jobname"] != "All clients"}
    assert sorted(servers) == [addresses.guest_ip(1), addresses.guest_ip(2)]  # a server in each guest
    assert all(c["write"]["io_bytes"] == size and c["job options"]["filename"] == "/dev/vda"
               for c in servers.values())
    bytes_, secs = (sum(c["write"]["io_bytes"] for c in servers.values()),
                    max(c["write"]["runtime"] for c in servers.values()) / 1000)
    assert job.value == pytest.approx(bytes_ / 1e6 / secs, rel=0.01)  # fio's "All clients", or the same sum
    base = run.instances("baseline", "fiocs-seq-write-64k", "MB/s")
    assert [m.instance for m in base] == [1, 2] and all(m.value > 0 for m in base)
    assert compare.compare_table([run]).sections[0].rows[3].cells["run"] == f"#{rid} job"
    nothing_left(run)


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.full
def test_two_guests_each_stripe_their_own_three_disks(nothing_left, capsys):
    """virtio-raid0 with --guests 2: each guest builds its own md0 over its three disks, both write there through
    the barrier, each array's members take their share of the chunks, and everything is gone after."""
    from cloudbox.core.run import runs

    size, chunk = 16 << 20, 64 << 10
    spec = RunSpec(profile="virtio-raid0", suite="storage", size="16M", storage_tests="seq-write-64k", guests=2)
    with ResultStore() as store:
        rid = runs.executor(spec, store).execute()
        run = store.get_run(rid)
    assert run.state == "completed", run.reason
    info = run.provenance.guests
    assert info is not None and len(info.guests) == 2
    share = size // chunk // 3 * chunk // 512  # 86, 85, 85 chunks of 64 KiB
    for g in info.guests:
        raid = g.raid
        assert raid is not None and (raid.device, raid.level, raid.chunk_kib) == ("/dev/md0", "0", 64), g.name
        assert hostraid.mdstat_array(raid.mdstat) == ("raid0", ["vda", "vdb", "vdc"]), raid.mdstat
        assert set(raid.sectors_written) == {"vda", "vdb", "vdc"}
        assert all(v >= share for v in raid.sectors_written.values()), (g.name, raid.sectors_written)
    assert run.provenance.raid == info.guests[0].raid
    assert len({g.disk for g in info.guests}) == 2  # a store of its own each
    each = run.instances("guest", "seq-write-64k", "MB/s")
    assert [m.instance for m in each] == [1, 2] and all(m.value > 0 for m in each)
    for m in each:
        job = json.loads(m.raw)["jobs"][0]
        assert job["job options"]["filename"] == "/dev/md0" and job["write"]["io_bytes"] == size
    total = run.measurement("guest", "seq-write-64k", "MB/s")
    assert total is not None and total.value == pytest.approx(sum(m.value for m in each), rel=1e-9)
    assert len(run.instances("baseline", "seq-write-64k", "MB/s")) == 2
    assert cli.main(["results", "show", str(rid)]) == 0
    shown = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("  guest RAID")]
    assert [ln.split(":")[0].split()[-1] for ln in shown] == [g.name for g in info.guests], shown
    nothing_left(run)


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.full
def test_ctrl_c_while_two_guests_write_leaves_nothing(nothing_left):
    from real_runs import interrupt_cli_run

    def into_the_test() -> None:
        time.sleep(5)  # past the clocks' reading and the barrier: both guests write

    got = interrupt_cli_run(["--profile", "virtio-disk", "--guests", "2", "--suite", "storage", "--size", "256M",
                             "--tests", "seq-write-64k,randwrite-4k-qd32", "--runtime", "60"], into_the_test)
    assert got.returncode == 1, got.output
    assert "guest: seq-write-64k (2 at once)" in got.output, got.output
    run = got.run
    assert run.state == "aborted" and "SIGINT" in (run.reason or ""), run.reason
    nothing_left(run)


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.full
def test_a_guest_dying_mid_test_fails_the_run_naming_it_and_leaves_nothing(libvirt_conn, nothing_left):
    """Guest 2 destroyed under libvirt while both write: guest 1's test is stopped, the run is aborted naming guest
    2, and both guests, their loop devices and files are gone."""
    import threading

    from cloudbox.core.record.events import RunEvent, StepEvent
    from cloudbox.core.run import runs
    from cloudbox.core.virt.guest import list_guests

    killed: list[str] = []

    def kill_g2() -> None:
        time.sleep(3)  # past the barrier, inside the test
        (name,) = [g.name for g in list_guests(libvirt_conn) if g.name.endswith("-g2") and g.profile == "virtio-disk"]
        libvirt_conn.lookupByName(name).destroy()
        killed.append(name)

    def on_event(ev: RunEvent) -> None:
        if isinstance(ev, StepEvent) and ev.text.startswith("guest: seq-write-64k (2 at once)"):
            threading.Thread(target=kill_g2, daemon=True).start()

    spec = RunSpec(profile="virtio-disk", suite="storage", size="256M", storage_tests="seq-write-64k", guests=2)
    with ResultStore() as store:
        rid = runs.executor(spec, store, emit=on_event).execute()
        run = store.get_run(rid)
    assert killed, "guest 2 was never found to be destroyed"
    assert run.state == "aborted", run.reason
    assert killed[0] in (run.reason or ""), run.reason
    assert run.instances("guest", "seq-write-64k", "MB/s") == []  # no half-measured test stored
    nothing_left(run)


def _check_sums(run: Run, test: str, metric: str) -> None:
    """Each guest's and each bare-metal process's figure stored as instances 1 and 2, the run's row their sum."""
    for side in ("guest", "baseline"):
        each = run.instances(side, test, metric)
        assert [m.instance for m in each] == [1, 2], side
        assert all(m.value > 0 and m.started_at and m.finished_at for m in each), side
        total = run.measurement(side, test, metric)
        assert total is not None and total.value == pytest.approx(sum(m.value for m in each), rel=1e-9)
    info = run.provenance.guests
    assert info is not None and info.count == 2 and info.baseline_processes == 2
    skew = info.skew_s[test]
    starts = [m.started_at for m in run.instances("guest", test, metric)]
    assert skew == pytest.approx(max(starts) - min(starts), abs=1e-3)
    assert 0 <= skew < SKEW_BOUND_S, skew


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.full  # 28 s under TCG; make test keeps two guests writing at once, the same sum over N guests
def test_two_guests_stream_to_the_host_at_once_and_their_sum_is_stored(nothing_left):
    from cloudbox.core.run import runs

    spec = RunSpec(profile="virtio-disk", suite="network", size="quick", net_tests="tcp-stream", net_seconds=3,
                   guests=2)
    with ResultStore() as store:
        rid = runs.executor(spec, store).execute()
        run = store.get_run(rid)
        recs = [e.record for e in store.events_since(rid)]
    assert run.state == "completed", run.reason
    _check_sums(run, "tcp-stream", "Mbit/s")
    assert all("emulated" in m.labels for m in run.instances("guest", "tcp-stream", "Mbit/s"))
    assert all("veth-netns" in m.labels for m in run.instances("baseline", "tcp-stream", "Mbit/s"))
    for side in ("guest", "baseline"):  # each guest's and process's figure went to watchers, numbered
        each = {r.instance: r.value for r in recs if isinstance(r, MeasurementEvent) and r.side == side}
        assert each.keys() == {1, 2, None} and each[None] == pytest.approx(each[1] + each[2], abs=0.02), each
    fig = InstanceFigures()
    for r in recs:
        fig.feed(r)
    assert fig.line().startswith("baseline tcp-stream done: sum ") and " Mbit/s, per process min " in fig.line()
    summary = compare.run_summary(run)  # the Results screen's headline: the guests' sum
    assert summary["tcp_stream_mbits"] == run.value("guest", "tcp-stream", "Mbit/s") and summary["tcp_stream_pct"]
    nothing_left(run)


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.full
def test_two_guests_run_every_network_test_at_once(nothing_left):
    """netperf's three tests and iperf3's two, each by two guests at once against the host's servers (one iperf3
    server per guest and per bare-metal process), the request/response latency averaged."""
    from cloudbox.core.run import runs

    spec = RunSpec(profile="virtio-disk", suite="network", size="quick", net_tests="both", net_seconds=3, guests=2)
    with ResultStore() as store:
        rid = runs.executor(spec, store).execute()
        run = store.get_run(rid)
    assert run.state == "completed", run.reason
    for test, metric in (("tcp-stream", "Mbit/s"), ("tcp-maerts", "Mbit/s"), ("tcp-rr", "trans/s"),
                         ("iperf3-tx", "Mbit/s"), ("iperf3-rx", "Mbit/s")):
        _check_sums(run, test, metric)
    lat = [m.value for m in run.instances("guest", "tcp-rr", "lat_us")]
    total = run.measurement("guest", "tcp-rr", "lat_us")
    assert len(lat) == 2 and total is not None and total.value == pytest.approx(sum(lat) / 2)
    nothing_left(run)


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.full
def test_ctrl_c_while_two_guests_stream_leaves_nothing(nothing_left):
    from real_runs import interrupt_cli_run

    def into_the_test() -> None:
        time.sleep(4)  # past the clocks' reading and the barrier: both guests send

    got = interrupt_cli_run(["--profile", "virtio-disk", "--guests", "2", "--suite", "network", "--size", "quick",
                             "--net-tests", "iperf3-tx", "--net-seconds", "30"], into_the_test,
                            phase=("guest: iperf3-tx",))
    assert got.returncode == 1, got.output
    run = got.run
    assert run.state == "aborted" and "SIGINT" in (run.reason or ""), run.reason
    assert run.instances("guest", "iperf3-tx", "Mbit/s") == []
    nothing_left(run)
