"""Repetitions executed: `cloudbox run --repeats N --boots M --until-width W --max-repeats K` checked and planned
(bare metal and guest in turn, ABAB...), the plan's progress counting each repeat and taking a revised plan, the
adaptive stop on the ratio's interval (a fake measure function), the repeated body's order through the real store
with fake tools, the timed tests' warm-up, the caches and host state recorded and shown by `results show`, and
`results compare` naming what differs between two runs' hosts."""

from __future__ import annotations

import contextlib
import itertools
import json
import random
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from cloudbox import cli
from cloudbox.core.bench import fio, runners
from cloudbox.core.bench.result import FioResult
from cloudbox.core.errors import CloudboxError, UsageError
from cloudbox.core.record import stats
from cloudbox.core.record.events import MeasurementEvent, PlanProgress, ProgressEvent, StateEvent, progress_line
from cloudbox.core.record.hoststate import HostState, differences, read_host_state
from cloudbox.core.record.provenance import Provenance
from cloudbox.core.record.results import ResultStore
from cloudbox.core.record.rows import Repetition
from cloudbox.core.run import preflight, repeated
from cloudbox.core.run.context import RunContext, RunControl
from cloudbox.core.run.repeated import Policy, Stopped, repeat_test, stop_reason
from cloudbox.core.run.sink import EventSink
from cloudbox.core.spec import catalogue
from cloudbox.core.spec.profiles import resolve_profile
from cloudbox.core.spec.runspec import QUICK_SIZE, PlanStep, RunSpec
from cloudbox.core.views import compare, render, rundetail

B, G = "baseline", "guest"


# ------------------------------------------------------------------------------------------ the options
def test_the_repeat_options_are_run_options_with_their_checks():
    args = cli.build_parser().parse_args(["run", "-p", "virtio-disk", "--repeats", "3", "--boots", "2"])
    assert (args.repeats, args.boots, args.until_width, args.max_repeats) == (3, 2, 0.0, 0)
    spec = RunSpec(profile="virtio-disk", repeats=3, boots=2)
    spec.validate()
    assert spec.repeated and RunSpec.from_dict(spec.as_dict()) == spec
    # a run measured once stores (and sends a node) the settings it always did
    assert not {"repeats", "boots", "until_width", "max_repeats"} & set(RunSpec(profile="x").as_dict())
    assert RunSpec(profile="x", until_width=5).most_repeats == 10
    # --until-width alone asks for +-5%; given a W, that W
    alone = cli.build_parser().parse_args(["run", "-p", "virtio-disk", "--until-width", "--max-repeats", "6"])
    assert (alone.until_width, alone.max_repeats) == (5.0, 6)
    assert cli.build_parser().parse_args(["run", "-p", "virtio-disk", "--until-width", "2.5"]).until_width == 2.5
    assert RunSpec(profile="x", repeats=6, until_width=5, max_repeats=8).most_repeats == 8


@pytest.mark.parametrize(("settings", "message"), [
    (dict(repeats=0), r"--repeats 0 is not allowed; allowed: 1 to 100 samples a side"),
    (dict(boots=21), r"--boots 21 is not allowed; allowed: 1 to 20 guest boots"),
    (dict(until_width=0.01), r"--until-width 0.01 is not allowed; allowed: 0 \(off"),
    (dict(max_repeats=3, until_width=5), r"--max-repeats 3 is not allowed; allowed: 0 .* or 4 \(the fewest"),
    (dict(max_repeats=8), r"--max-repeats 8 caps --until-width's repeats; allowed: with --until-width W"),
    (dict(repeats=9, until_width=5, max_repeats=6), r"--max-repeats 6 is fewer than --repeats 9"),
    (dict(until_width=5, boots=2), r"--until-width 5 with --boots 2: the adaptive stop counts repeats within one"),
    (dict(repeats=3, guests=2), r"--repeats 3 with --guests 2: repeats of N guests at once are not supported yet"),
    (dict(repeats=3, suite="guest"), r"--repeats 3 repeats a run's tests; --suite guest has none to repeat"),
    (dict(repeats=100, boots=20), r"--repeats 100 in each of --boots 20 is 2000 samples a side of each test; "
                                  r"allowed: at most 1000"),
])
def test_a_repeat_setting_that_cannot_run_is_refused_naming_the_flag(settings, message):
    with pytest.raises(UsageError, match=message):
        RunSpec(profile="virtio-disk", **settings).validate()


def test_the_cli_help_shows_the_percent_options(capsys):
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["run", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--until-width [W]" in out and "95% interval is within +-W% of the ratio" in out
    assert "--until-width alone is W = 5" in out


def test_a_network_volume_profile_is_not_repeated():
    prof = resolve_profile("virtio-disk")
    assert repeated.repeat_problem(prof) == ""
    vol = prof.model_copy(update={"disk": prof.disk.model_copy(update={"backing": "network-volume"})})
    assert "attached by one initiator at a time" in repeated.repeat_problem(vol)


# ----------------------------------------------------------------------------------------------- plan
def _steps(spec: RunSpec) -> list[tuple[str, str, int, int]]:
    return [(s.side, s.test, s.repeat, s.boot) for s in spec.plan()]


def test_a_repeated_plan_alternates_bare_metal_and_guest_per_test_after_the_guests_boot():
    spec = RunSpec(profile="x", suite="storage", storage_tests="seq-write-64k,seq-read-64k", repeats=3)
    assert _steps(spec) == [
        (G, "boot", 1, 1),
        (B, "seq-write-64k", 1, 1), (G, "seq-write-64k", 1, 1), (B, "seq-write-64k", 2, 1), (G, "seq-write-64k", 2, 1),
        (B, "seq-write-64k", 3, 1), (G, "seq-write-64k", 3, 1),
        (B, "seq-read-64k", 1, 1), (G, "seq-read-64k", 1, 1), (B, "seq-read-64k", 2, 1), (G, "seq-read-64k", 2, 1),
        (B, "seq-read-64k", 3, 1), (G, "seq-read-64k", 3, 1)]
    # a run measured once keeps today's plan: bare metal before the guest boots
    once = RunSpec(profile="x", suite="storage", storage_tests="seq-write-64k")
    assert _steps(once) == [(B, "seq-write-64k", 1, 1), (G, "boot", 1, 1), (G, "seq-write-64k", 1, 1)]


def test_boots_repeat_the_group_and_number_the_repeats_through_them():
    spec = RunSpec(profile="x", suite="all", storage_tests="seq-write-64k", net_tests="tcp-rr", repeats=2, boots=2)
    assert _steps(spec) == [
        (G, "boot", 1, 1), (B, "seq-write-64k", 1, 1), (G, "seq-write-64k", 1, 1),
        (B, "seq-write-64k", 2, 1), (G, "seq-write-64k", 2, 1),
        (G, "tcp-rr", 1, 1), (B, "tcp-rr", 1, 1), (G, "tcp-rr", 2, 1), (B, "tcp-rr", 2, 1),
        (G, "boot", 1, 2), (B, "seq-write-64k", 3, 2), (G, "seq-write-64k", 3, 2),
        (B, "seq-write-64k", 4, 2), (G, "seq-write-64k", 4, 2),
        (G, "tcp-rr", 3, 2), (B, "tcp-rr", 3, 2), (G, "tcp-rr", 4, 2), (B, "tcp-rr", 4, 2)]
    # on a back-end each repeat also goes to the front-end, in the same turn
    peer = RunSpec(profile="x", suite="network", net_tests="tcp-rr", repeats=2, peer="10.73.0.1")
    assert _steps(peer)[1:5] == [(G, "tcp-rr", 1, 1), (B, "tcp-rr", 1, 1), (G, "tcp-rr-fe", 1, 1),
                                 (B, "tcp-rr-fe", 1, 1)]


def test_an_adaptive_plan_holds_the_most_repeats():
    spec = RunSpec(profile="x", suite="storage", storage_tests="seq-write-64k", until_width=5, max_repeats=6)
    assert [s.repeat for s in spec.plan() if s.side == G and s.test == "seq-write-64k"] == [1, 2, 3, 4, 5, 6]


# ------------------------------------------------------------------------------------------- progress
def test_progress_counts_each_repeat_and_takes_a_revised_plan():
    spec = RunSpec(profile="x", suite="storage", storage_tests="seq-write-64k", repeats=3)
    plan = tuple(spec.plan())  # boot + 6 samples
    p = PlanProgress()
    p.feed(StateEvent.from_payload(StateEvent("running", plan=plan).to_payload()))  # through the stored form
    assert p.plan == plan
    p.feed(ProgressEvent(G, "boot", 100))
    assert p.percent == pytest.approx(100 / 7)
    p.feed(ProgressEvent(B, "seq-write-64k", 50))
    assert p.where() == "repeat 1 of 3" and p.percent == pytest.approx(150 / 7)
    p.feed(MeasurementEvent(B, "seq-write-64k", "MB/s", 80.0))
    p.feed(MeasurementEvent(G, "seq-write-64k", "MB/s", 70.0))
    p.feed(ProgressEvent(B, "seq-write-64k", 10))  # the second repeat under way
    assert p.current == PlanStep(B, "seq-write-64k", 2) and p.where() == "repeat 2 of 3"
    line = progress_line(ProgressEvent(B, "seq-write-64k", 10.0, "00m:03s"), where=p.where())
    assert line.startswith("  [baseline] seq-write-64k (repeat 2 of 3)  10.0%")
    p.feed(MeasurementEvent(B, "seq-write-64k", "MB/s", 81.0, repeat=2, iteration=2))
    assert p.percent == pytest.approx(400 / 7)
    # the test needed two repeats: its third is dropped from the plan, and the run is further along
    revised = tuple(s for s in plan if s.repeat < 3)
    p.feed(StateEvent("running", plan=revised))
    p.feed(MeasurementEvent(G, "seq-write-64k", "MB/s", 71.0, repeat=2, iteration=2))
    assert p.percent == 100


def test_a_plan_of_boots_says_which_boot():
    spec = RunSpec(profile="x", suite="storage", storage_tests="seq-write-64k", repeats=2, boots=3)
    p = PlanProgress()
    p.feed(StateEvent("running", plan=tuple(spec.plan())))
    p.feed(ProgressEvent(G, "boot", 100))
    p.feed(ProgressEvent(G, "boot", 0, "booting"))  # the second boot's launch
    assert p.where() == "boot 2 of 3"
    old = StateEvent.from_payload({"state": "running", "plan": [{"side": "guest", "test": "boot"}]})
    assert old.plan == (PlanStep(G, "boot"),)  # a plan stored before repeats existed


# ------------------------------------------------------------------------------------ stopping adaptively
def _pair(bare: Iterator[float], guest: Iterator[float], seen: list[Repetition]):
    def pair(rep: Repetition) -> tuple[float | None, float | None]:
        seen.append(rep)
        return next(bare), next(guest)
    return pair


def test_a_fixed_count_stops_at_it_and_numbers_its_samples():
    seen: list[Repetition] = []
    stop = repeat_test(_pair(itertools.repeat(100.0), itertools.repeat(90.0), seen), Policy(3), boot=2, first=4)
    assert stop == Stopped(3, "the planned 3")
    assert seen == [Repetition(4, 2, 1), Repetition(5, 2, 2), Repetition(6, 2, 3)]


def test_a_steady_ratio_stops_once_its_interval_is_narrow_enough():
    rng = random.Random(7)
    seen: list[Repetition] = []
    bare = (100 * (1 + rng.gauss(0, 0.005)) for _ in itertools.count())
    guest = (90 * (1 + rng.gauss(0, 0.005)) for _ in itertools.count())
    stop = repeat_test(_pair(bare, guest, seen), Policy(1, width=5.0, most=10))
    assert stop.samples == 4 and len(seen) == 4  # the first count with a 95% interval of the ratio (4 + 4)
    assert stop.half_width is not None and stop.half_width <= 5.0
    assert stop.reason.startswith("its ratio's 95% interval +-") and stop.reason.endswith("within +-5% after 4")


def test_a_noisy_ratio_goes_on_to_the_most_and_says_how_wide_it_was():
    rng = random.Random(3)
    bare = (100 * (1 + rng.uniform(-0.4, 0.4)) for _ in itertools.count())
    guest = (90 * (1 + rng.uniform(-0.4, 0.4)) for _ in itertools.count())
    stop = repeat_test(_pair(bare, guest, []), Policy(1, width=1.0, most=7))
    assert stop.samples == 7 and stop.half_width is not None and stop.half_width > 1.0
    assert stop.reason.startswith("the most repeats (7) reached; its ratio's 95% interval was +-")
    assert stop.reason.endswith(", +-1% wanted")


def test_the_least_repeats_come_first_and_a_side_without_figures_is_judged_by_the_other():
    flat = Policy(6, width=5.0, most=10)
    assert stop_reason(flat, 5, [100.0] * 5, [90.0] * 5) is None  # --repeats is the fewest
    assert stop_reason(flat, 6, [100.0] * 6, [90.0] * 6) == Stopped(
        6, "its ratio's 95% interval +-0.0% is within +-5% after 6", 0.0)
    # no bare metal figure (the tool could not time it): the guest's median interval, from 6 samples
    only = stop_reason(Policy(1, 5.0, 10), 6, [], [90.0, 91.0, 89.0, 90.5, 89.5, 90.2])
    assert only is not None and only.reason.startswith("its median's 95% interval +-")
    none = stop_reason(Policy(1, 5.0, 4), 4, [], [])
    assert none is not None and none.reason == ("the most repeats (4) reached; no figure on either side: none yet, "
                                                "+-5% wanted")
    r = stats.ratio([90.0, 92.0, 91.0, 89.0], [100.0, 101.0, 99.0, 100.5])
    assert r is not None and r.half_width == pytest.approx((r.high - r.low) / 2 / r.percent * 100)


# ------------------------------------------------------------------------------- the body, fake tools
class FakeHost:
    def __init__(self, cancelled):
        self.log = TOOL_LOG

    def fill(self, target, size):
        self.log.append(("fill", B))

    def run(self, t, target, size, runtime, progress):
        self.log.append(("run", B, t.id))
        return FioResult(t.id, next(BARE), 0.0, 0.0, 1.0, "{}")


class FakeGuest:
    def __init__(self, guest, cancelled):
        self.log = TOOL_LOG

    def check_tools(self, tests):
        pass

    def disk(self):
        return "/dev/vdb"

    def fill(self, target, size):
        self.log.append(("fill", G))

    def run(self, t, target, size, runtime, progress, timeout=0.0):
        self.log.append(("run", G, t.id))
        return FioResult(t.id, next(GUEST), 0.0, 0.0, 1.0, "{}")

    def drop_caches(self):
        self.log.append(("drop", G))
        return True


TOOL_LOG: list[tuple[str, ...]] = []
BARE: Iterator[float] = iter(())
GUEST: Iterator[float] = iter(())


@pytest.fixture
def fake_tools(monkeypatch):
    global BARE, GUEST
    TOOL_LOG.clear()
    monkeypatch.setattr(repeated, "setup_steps", lambda: ())  # what a single pass does first, the guests' places
    monkeypatch.setattr(repeated, "plumb", lambda ctx: None)

    def launch(ctx):
        TOOL_LOG.append(("launch",))
        ctx.guest, ctx.boot_s = object(), 3.0

    def relaunch(ctx, why, old_console):
        TOOL_LOG.append(("relaunch", why))

    monkeypatch.setattr(repeated, "launch_guest", launch)
    monkeypatch.setattr(repeated, "relaunch_guest", relaunch)
    monkeypatch.setattr(repeated, "claim_baseline_file", lambda ctx, store: None)
    monkeypatch.setattr(runners, "HostRunner", FakeHost)
    monkeypatch.setattr(runners, "GuestRunner", FakeGuest)
    monkeypatch.setattr(runners, "drop_host_caches", lambda: TOOL_LOG.append(("drop", "host")) or True)
    rng = random.Random(11)
    BARE = (100 * (1 + rng.gauss(0, 0.003)) for _ in itertools.count())
    GUEST = (90 * (1 + rng.gauss(0, 0.003)) for _ in itertools.count())
    return TOOL_LOG


def _context(store: ResultStore, spec: RunSpec) -> RunContext:
    rid = store.create_run(uuid="0" * 32, profile_name=spec.profile, suite=spec.suite, state="running")
    ctx = RunContext(spec, resolve_profile(spec.profile), QUICK_SIZE, "quick", "0" * 32, rid, store,
                     EventSink(store, rid), RunControl(), contextlib.ExitStack(), Provenance(), labels=["emulated"])
    ctx.backing = SimpleNamespace(baseline_labels=[], baseline_target="/dev/null", host_device=None)  # type: ignore
    ctx.accelerator = SimpleNamespace(name="tcg", label="TCG")  # type: ignore[assignment]
    return ctx


def test_the_repeated_body_alternates_the_sides_and_drops_caches_before_each_read(tmp_path: Path, fake_tools):
    spec = RunSpec(profile="virtio-disk", suite="storage", storage_tests="seq-read-64k,seq-write-64k", repeats=3,
                   boots=2)
    with ResultStore(tmp_path / "r.db") as store:
        ctx = _context(store, spec)
        repeated.run_repeated(ctx)
        run = store.get_run(ctx.run_id)
        events = [e.record for e in store.events_since(ctx.run_id)]
    runs = [x for x in fake_tools if x[0] in ("run", "launch", "relaunch", "fill")]
    one_boot = [("fill", G), *[("run", side, t) for t in ("seq-read-64k", "seq-write-64k") for _ in range(3)
                              for side in (B, G)]]
    assert runs == [("fill", B), ("launch",), *one_boot,
                    ("relaunch", "boot 2 of 2 (its disk kept)"), *one_boot[1:]]  # the guest's disk kept its data
    # before every read sample on either side: the host's cache and the guest's
    reads = [i for i, x in enumerate(fake_tools) if x[:1] == ("run",) and x[2] == "seq-read-64k"]
    assert all(fake_tools[i - 2:i] == [("drop", "host"), ("drop", G)] for i in reads)
    f = run.figure(G, "seq-read-64k", "MB/s")
    assert f is not None and [(m.repeat, m.boot, m.iteration) for m in f.samples] == [
        (1, 1, 1), (2, 1, 2), (3, 1, 3), (4, 2, 1), (5, 2, 2), (6, 2, 3)]
    order = sorted((m for m in run.measurements if m.test == "seq-write-64k"), key=lambda m: m.id)
    assert [(m.side, m.repeat) for m in order] == [(s, r) for r in range(1, 7) for s in (B, G)]
    rec = run.provenance.repeats
    assert rec is not None and (rec.repeats, rec.boots, len(rec.boot_s)) == (3, 2, 2)
    assert [(t.test, t.samples, t.reason) for t in rec.tests] == [
        (test, 6, "the planned 3 in each of 2 boots") for test in ("seq-read-64k", "seq-write-64k")]
    steps = [e.text for e in events if e is not None and e.kind == "step"]
    assert "baseline: seq-write-64k (repeat 2 of 3, boot 1 of 2)" in steps, steps
    assert "guest: seq-read-64k (repeat 3 of 3, boot 2 of 2)" in steps
    p = PlanProgress()
    p.feed(StateEvent("running", plan=tuple(spec.plan())))  # what the lifecycle emits first
    p.feed(ProgressEvent(G, "boot", 100))  # the first launch's (the fake launch says nothing)
    for e in events:
        if e is not None:
            p.feed(e)
    assert p.percent == 100


def test_an_adaptive_body_stops_early_revises_its_plan_and_records_why(tmp_path: Path, fake_tools):
    spec = RunSpec(profile="virtio-disk", suite="storage", storage_tests="seq-write-64k", until_width=5,
                   max_repeats=10)
    with ResultStore(tmp_path / "r.db") as store:
        ctx = _context(store, spec)
        repeated.run_repeated(ctx)
        run = store.get_run(ctx.run_id)
        events = [e.record for e in store.events_since(ctx.run_id)]
    rec = run.provenance.repeats
    assert rec is not None and rec.until_width == 5 and rec.max_repeats == 10
    (tr,) = rec.tests
    assert tr.samples == 4 and "within +-5% after 4" in tr.reason
    plans = [e.plan for e in events if isinstance(e, StateEvent) and e.plan]
    assert plans and max(s.repeat for s in plans[-1]) == 4
    assert run.figure(G, "seq-write-64k", "MB/s").n == 4  # type: ignore[union-attr]
    shown = rundetail.how_measured_lines(run.provenance)
    assert any(line.startswith("  stopped      seq-write-64k: 4 a side, its ratio's 95% interval +-")
               for line in shown), shown
    assert rec.timing == "network tests 5 s, random I/O 5 s: quick size's 5 s"
    assert "  each sample  network tests 5 s, random I/O 5 s: quick size's 5 s" in shown


@pytest.mark.parametrize(("given", "size_label", "expect_net", "expect_runtime", "why"), [
    (dict(), "quick", 5, 5, "quick size's 5 s"),
    (dict(repeats=2), "quick", 3, 3, "quick size's 5 s shared by 2 samples a side, at least 2 s each"),
    (dict(repeats=3), "quick", 2, 2, "shared by 3 samples a side"),
    (dict(repeats=3, boots=2), "quick", 2, 2, "shared by 6 samples a side"),
    (dict(repeats=3, net_seconds=7), "quick", 7, 2, "--net-seconds 7 s as given"),
    (dict(repeats=3), "study", 30, 30, "the default at this size"),
])
def test_a_quick_runs_timed_tests_share_their_seconds_among_the_samples(tmp_path, given, size_label, expect_net,
                                                                         expect_runtime, why):
    spec = RunSpec(profile="virtio-disk", suite="all", **given)
    size = QUICK_SIZE if size_label == "quick" else 4 * 1024**3
    with ResultStore(tmp_path / "r.db") as store:
        ctx = _context(store, spec)
        ctx.size, ctx.size_label = size, size_label
        assert (ctx.net_seconds, ctx.runtime) == (expect_net, expect_runtime)
        assert why in ctx.timed_note()
        assert ctx.timed_note().startswith(f"network tests {expect_net} s, random I/O {expect_runtime} s")


def test_a_profile_on_a_network_volume_is_refused_before_the_run(monkeypatch):
    spec = RunSpec(profile="virtio-disk", suite="storage", repeats=3)
    prof = resolve_profile("virtio-disk")
    vol = prof.model_copy(update={"disk": prof.disk.model_copy(update={"backing": "network-volume"})})
    found = preflight.profile_problems(spec, [vol])
    assert found and found[0].usage and "cannot take turns" in str(found[0])
    with pytest.raises(CloudboxError, match="cannot take turns"):
        repeated.run_repeated(SimpleNamespace(profile=vol))  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------- warm-up, caches
def test_a_timed_fio_test_runs_a_warm_up_first_and_discards_it():
    qd1 = catalogue.TESTS["randread-4k-qd1"]
    args = fio.fio_args(qd1, "/dev/vdb", 1 << 30, 5)
    warm, measured = args[1:args.index("--name=randread-4k-qd1")], args[args.index("--name=randread-4k-qd1"):]
    assert warm[0] == "--name=warmup" and warm[-2:] == ["--runtime=1", "--time_based=1"]
    assert measured[1] == "--stonewall" and measured[-1] == "--runtime=5"
    assert "--runtime=6" in fio.fio_args(qd1, "/dev/vdb", 1 << 30, 30)
    for once in (fio.fio_args(catalogue.TESTS["seq-read-64k"], "/dev/vdb", 1 << 30, 5),
                 fio.fio_args(qd1, "/dev/vdb", 1 << 30, 5, fill=True)):
        assert "--name=warmup" not in once and "--stonewall" not in once
    assert "warmup" not in fio.fio_job_file(qd1, "/dev/vdb", 1 << 30, 5)
    # fio reports both jobs; the warm-up's figures are not the test's
    side = {"io_bytes": 4096, "bw_bytes": 4096, "iops": 1.0, "runtime": 1000, "clat_ns": {"mean": 1000.0}}
    two = {"jobs": [{"jobname": "warmup", "read": {**side, "iops": 99.0}}, {"jobname": qd1.id, "read": side}]}
    assert fio.parse_fio(qd1.id, json.dumps(two)).iops == 1.0
    with pytest.raises(CloudboxError, match=r"fio \(randread-4k-qd1\) reported no job besides its warm-up"):
        fio.parse_fio(qd1.id, json.dumps({"jobs": two["jobs"][:1]}))


def test_a_run_records_its_warm_up_and_caches(tmp_path: Path, monkeypatch):
    from cloudbox.core.run import measure

    with ResultStore(tmp_path / "r.db") as store:
        ctx = _context(store, RunSpec(profile="virtio-disk", suite="storage", storage_tests="standard"))
        ss = measure.steady_state(ctx)
        assert ss is not None and ss.method == "warmup" and ss.seconds == 1
        assert ss.tests == ["randwrite-4k-qd1", "randread-4k-qd1", "randwrite-4k-qd32", "randread-4k-qd32"]
        ctx.spec = RunSpec(profile="virtio-disk", suite="storage", storage_tests="study")
        assert measure.steady_state(ctx) is None
        monkeypatch.setattr(measure.os, "access", lambda path, mode: False)
        c = measure.caches(ctx)
        assert c.host.startswith("not dropped: this process cannot write /proc/sys/vm/drop_caches")
        assert c.server == ""


# ------------------------------------------------------------------------------------------ host state
def _tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text + "\n")


def _fake_host(root: Path, *, governor: str = "performance", thp: str = "always [madvise] never") -> tuple[Path, Path]:
    sysfs, proc = root / "sys", root / "proc"
    cpu = "devices/system/cpu"
    files = {
        f"{cpu}/cpu0/cpufreq/scaling_governor": governor, f"{cpu}/cpu1/cpufreq/scaling_governor": governor,
        f"{cpu}/cpu0/cpufreq/scaling_driver": "intel_pstate", f"{cpu}/cpu1/cpufreq/scaling_driver": "intel_pstate",
        f"{cpu}/intel_pstate/no_turbo": "0", f"{cpu}/smt/control": "on", f"{cpu}/smt/active": "1",
        f"{cpu}/cpuidle/current_driver": "intel_idle",
        f"{cpu}/cpu0/cpuidle/state0/name": "POLL", f"{cpu}/cpu0/cpuidle/state0/disable": "0",
        f"{cpu}/cpu0/cpuidle/state1/name": "C1E", f"{cpu}/cpu0/cpuidle/state1/disable": "0",
        f"{cpu}/cpu0/cpuidle/state1/latency": "10",
        f"{cpu}/cpu0/cpuidle/state2/name": "C6", f"{cpu}/cpu0/cpuidle/state2/disable": "1",
        f"{cpu}/cpu0/microcode/version": "0xde",
        f"{cpu}/vulnerabilities/meltdown": "Not affected", f"{cpu}/vulnerabilities/spectre_v2": "Mitigation: IBRS",
        f"{cpu}/vulnerabilities/mds": "Vulnerable: Clear CPU buffers attempted, no microcode",
        "kernel/mm/transparent_hugepage/enabled": thp, "kernel/mm/transparent_hugepage/defrag": "[never] always",
        "devices/system/node/node0/cpulist": "0-1", "devices/system/node/node0/meminfo":
            "Node 0 MemTotal:       32768000 kB",
        "class/block/sda/device/vendor": "ATA", "class/block/sda/device/model": "Samsung SSD 870",
        "class/block/sda/device/rev": "SVT02B6Q", "class/block/sda/queue/scheduler": "none [mq-deadline] kyber",
        "class/block/sda/sda1/partition": "1",
        "class/net/eno1/speed": "1000", "class/net/eno1/operstate": "up",
        "drivers/e1000e/.keep": "",
    }
    _tree(sysfs, files)
    _tree(proc, {"cmdline": "BOOT_IMAGE=/vmlinuz root=/dev/sda1 mitigations=auto intel_idle.max_cstate=1",
                 "net/route": "Iface\tDestination\tGateway\nlo\t0000007F\t00000000\neno1\t00000000\t0101A8C0"})
    (sysfs / "class/block/sda1").symlink_to(sysfs / "class/block/sda/sda1")  # a partition sits in its disk
    (sysfs / "class/net/eno1/device").mkdir(parents=True)
    (sysfs / "class/net/eno1/device/driver").symlink_to(sysfs / "drivers/e1000e")
    return sysfs, proc


ETHTOOL = {"-i": "driver: e1000e\nversion: 6.1\nfirmware-version: 0.13-4\n",
           "-k": "Features for eno1:\nrx-checksumming: on\ntx-checksumming: on\nscatter-gather: on\n"
                 "tcp-segmentation-offload: off\ngeneric-receive-offload: on\nlarge-receive-offload: off [fixed]\n"}


def test_the_host_state_is_read_from_sys_and_proc(tmp_path: Path):
    sysfs, proc = _fake_host(tmp_path)
    h = read_host_state(sysfs=sysfs, proc=proc, disk="sda1", ethtool=lambda args: ETHTOOL[args[0]])
    assert (h.governor, h.freq_driver, h.turbo, h.smt) == ("performance", "intel_pstate", "on", "on, active")
    assert (h.cstate_driver, h.deepest_cstate) == ("intel_idle", "C1E, exit 10 us (intel_idle.max_cstate=1)")
    assert (h.thp, h.microcode) == ("madvise, defrag never", "0xde")
    assert h.numa == "1 node: node0 CPUs 0-1 31.2 GiB"
    assert "mitigations=auto" in h.cmdline and h.mitigations["spectre_v2"] == "Mitigation: IBRS"
    (d,) = h.disks
    assert (d.name, d.model, d.firmware, d.scheduler) == ("sda", "ATA Samsung SSD 870", "SVT02B6Q", "mq-deadline")
    assert h.nic is not None and (h.nic.name, h.nic.driver, h.nic.firmware, h.nic.speed) == (
        "eno1", "e1000e", "0.13-4", "1000 Mb/s")
    assert h.nic.offloads == {"rx-checksumming": "on", "tx-checksumming": "on", "scatter-gather": "on",
                              "tcp-segmentation-offload": "off", "generic-receive-offload": "on",
                              "large-receive-offload": "off"}
    text = "\n".join(h.lines())
    assert "mitigations: 1 mitigated, 1 not affected, 1 vulnerable (mds)" in text
    # what a VM or a bare host without ethtool cannot tell is said so, not guessed
    bare = read_host_state(sysfs=tmp_path / "none", proc=tmp_path / "none", ethtool=lambda args: None)
    assert bare.governor == "no cpufreq" and bare.turbo.startswith("not read") and bare.nic is None
    assert "frequency no cpufreq (a VM, or no frequency driver)" in bare.lines()[0]
    no_tool = read_host_state(sysfs=sysfs, proc=proc, ethtool=lambda args: None)
    assert no_tool.nic is not None and no_tool.nic.firmware == "not read (no ethtool)"
    assert no_tool.nic.offloads == {} and no_tool.nic.offloads_note == "no ethtool on this host"
    assert "offloads not read (no ethtool on this host)" in "\n".join(no_tool.lines())


def _run_with_host(store: ResultStore, state: HostState, host: str) -> int:
    prov = Provenance(host=host, host_state=state)
    rid = store.create_run(uuid=f"{random.getrandbits(64):032x}", profile_name="virtio-disk", suite="storage",
                           state="completed", provenance=prov)
    for side, value in ((B, 100.0), (G, 90.0)):
        store.add_measurement(rid, side=side, test="seq-write-64k", metric="MB/s", value=value)
    return rid


def test_compare_names_what_differs_between_two_runs_hosts(tmp_path: Path):
    sysfs, proc = _fake_host(tmp_path / "a")
    a = read_host_state(sysfs=sysfs, proc=proc, disk="sda", ethtool=lambda args: ETHTOOL[args[0]])
    sysfs2, proc2 = _fake_host(tmp_path / "b", governor="powersave", thp="[always] madvise never")
    b = read_host_state(sysfs=sysfs2, proc=proc2, disk="sda", ethtool=lambda args: ETHTOOL[args[0]])
    assert differences(a, b) == ["CPU governor: performance / powersave", "THP: madvise, defrag never / always, "
                                 "defrag never"]
    assert differences(a, a) == []
    with ResultStore(tmp_path / "r.db") as store:
        r1, r2, r3 = (_run_with_host(store, s, "lab1") for s in (a, b, a))
        old = store.create_run(uuid="f" * 32, profile_name="virtio-disk", suite="storage", state="completed")
        store.add_measurement(old, side=G, test="seq-write-64k", metric="MB/s", value=80.0)
        runs = [store.get_run(i) for i in (r1, r2, r3, old)]
    text = render.to_text(compare.compare_table(runs))
    assert (f"Host state differs, #{r1} / #{r2}: CPU governor: performance / powersave; THP: madvise, defrag never "
            "/ always, defrag never") in " ".join(text.split())
    assert f"Host state the same in #{r1} and #{r3}" in text
    assert f"No host state recorded for #{old} (measured before cloudbox recorded it)" in " ".join(text.split())
    assert compare.host_notes(runs[:1]) == []
    shown = rundetail.how_measured_lines(runs[0].provenance)
    assert shown[0].startswith("  host state   governor performance (intel_pstate), turbo on, SMT on, active")
