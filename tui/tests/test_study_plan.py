"""A study's plan per size ([plan.study], [plan.quick]: repeats, or until the ratio's interval is narrow enough):
parsed and refused like the other keys, passed to each profile's run by prepare_run, one sample for a profile whose
runs cannot be repeated (said in the plan's lines), a stored cell counted only when its run took the planned samples;
and the profiles' runs in an order shuffled by a seed that the runs record and the report shows."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

from cloudbox.core.errors import StudyError, UsageError
from cloudbox.core.record import provenance as prov
from cloudbox.core.record.provenance import Provenance, Repeats
from cloudbox.core.record.results import ResultStore
from cloudbox.core.spec import profiles
from cloudbox.core.spec.runspec import RunSpec
from cloudbox.core.studies import evidence, loading, markdown, planning, schema

pytestmark = pytest.mark.usefixtures("isolated")

REPO = Path(__file__).resolve().parents[2]


def study_a_text() -> str:
    return (REPO / "studies" / "a.toml").read_text()


def with_plan(table: str) -> str:
    """Study A's file with its [plan] tables replaced by `table`."""
    text = study_a_text()
    start = text.index("[plan.quick]")
    end = text.index("[documents]")
    return text[:start] + table + "\n" + text[end:]


# ------------------------------------------------------------------------------------------------- the schema
def test_the_plan_per_size_is_read_and_a_size_without_one_takes_the_default():
    s = loading.parse_study(with_plan("[plan.quick]\nrepeats = 2\nboots = 2\n"), "a.toml", expect_name="a")
    assert s.repeat_plan("quick") == schema.RepeatPlan(repeats=2, boots=2)
    assert s.repeat_plan("quick").words() == "2 repeats in each of 2 boots"
    assert s.repeat_plan("study") == schema.DEFAULT_PLANS["study"]  # no [plan.study]: the default
    assert s.repeat_plan("study").words() == "until +-5% (4 to 10 repeats)"
    bare = loading.parse_study(with_plan(""), "a.toml")
    assert bare.plan is None and bare.repeat_plan("quick").words() == "3 repeats"
    assert loading.find_study("d").repeat_plan("study") == schema.SINGLE  # a series: its repeats are runs
    for name in ("a", "b", "c", "c-nfs", "ladder"):  # each shipped study states its plan
        assert loading.find_study(name).plan is not None, name


@pytest.mark.parametrize(("table", "key", "value", "allowed"), [
    ("[plan.quick]\nrepeats = 0\n", "plan.quick.repeats", "0", "samples a side of each test in one guest boot, 1..100"),
    ("[plan.quick]\nrepeats = \"3\"\n", "plan.quick.repeats", "'3'", "1..100"),
    ("[plan.study]\nuntil_width = 80\n", "plan.study.until_width", "80", "0 (off) or 0.1..50"),
    ("[plan.study]\nuntil_width = 0.01\n", "plan.study.until_width", "0.01", "0 (off) or 0.1..50"),
    ("[plan.quick]\nmax_repeats = 6\n", "plan.quick.max_repeats", "6", "with until_width, the most repeats"),
    ("[plan.study]\nuntil_width = 5\nmax_repeats = 3\n", "plan.study.max_repeats", "3", "at least repeats"),
    ("[plan.study]\nuntil_width = 5\nboots = 2\n", "plan.study.boots", "2", "more than 1 only without until_width"),
    ("[plan.quick]\nrepeat = 3\n", "plan.quick.repeat", "3", "known keys: repeats, until_width, max_repeats, boots"),
    ("[plan]\nquick = 3\n", "plan.quick", "3", "a table with keys repeats, until_width, max_repeats, boots"),
])
def test_a_bad_plan_is_refused_naming_the_file_key_value_and_what_is_allowed(table, key, value, allowed):
    with pytest.raises(StudyError) as e:
        loading.parse_study(with_plan(table), "a.toml")
    text = str(e.value)
    assert text.startswith("a.toml: invalid study")
    line = next(ln for ln in text.splitlines() if ln.strip().startswith(f"{key}:"))
    assert f"(got {value})" in line and allowed in line, line


def test_a_plan_for_a_size_not_offered_or_in_a_series_study_is_refused():
    text = with_plan("[plan.quick]\nrepeats = 2\n").replace('sizes = ["study", "quick"]', 'sizes = ["study"]')
    with pytest.raises(StudyError, match=r"plan.quick: a plan for a size the study does not offer \(got 'quick'\)"):
        loading.parse_study(text, "a.toml")
    d = (REPO / "studies" / "d.toml").read_text()
    with pytest.raises(StudyError, match=r"plan: a series study's repeats are runs spaced in time"):
        loading.parse_study(d.replace("[documents]", "[plan.quick]\nrepeats = 2\n\n[documents]", 1), "d.toml")


# ------------------------------------------------------------------------------------------ the planned runs
def test_prepare_run_gives_each_profile_s_run_the_planned_repeats():
    a = loading.find_study("a")
    quick = planning.prepare_run(a, [], size="quick", seed=1)
    assert quick.specs and all((s.repeats, s.until_width, s.max_repeats, s.boots) == (3, 0, 0, 1)
                               for s in quick.specs)
    study = planning.prepare_run(a, [], size="study", seed=1)
    assert all((s.repeats, s.until_width, s.max_repeats) == (1, 5.0, 10) for s in study.specs)
    assert all(s.repeated and s.most_repeats == 10 for s in study.specs)
    # `study run --repeats/--until-width/...` replace the plan, as `cloudbox run` takes them
    mine = planning.with_repeat_plan(a, "study", repeats=2, boots=3)
    assert all((s.repeats, s.until_width, s.boots) == (2, 0, 3)
               for s in planning.prepare_run(mine, [], size="study", seed=1).specs)
    assert mine.repeat_plan("quick") == a.repeat_plan("quick")  # the other size keeps the file's
    with pytest.raises(UsageError, match="--until-width 5 with --boots 2"):
        planning.with_repeat_plan(a, "study", until_width=5.0, boots=2)
    with pytest.raises(UsageError, match="--repeats 0 is not allowed"):
        planning.with_repeat_plan(a, "study", repeats=0)


def test_a_profile_whose_runs_cannot_be_repeated_takes_one_sample_and_its_plan_line_says_why():
    a = loading.find_study("a")
    hashes, _ = evidence.profile_facts(a, here=False)
    # kvm-ebs-aoe's disk is a network volume (one initiator at a time): never repeated, whatever this host has
    plan = planning.plan_run(a, [], hashes, size="quick", node=platform.node(), backend=False, unavailable={})
    by = {p.profile: p for p in plan}
    aoe = by["kvm-ebs-aoe"]
    assert aoe.sampling == schema.SINGLE and aoe.single.startswith("not 3 repeats: disk.backing = network-volume")
    spec = aoe.spec("quick")
    assert not spec.repeated
    spec.validate()  # never a spec a run would refuse
    line = next(ln for ln in planning.plan_lines(plan) if ln.startswith("  kvm-ebs-aoe: "))
    assert "dd-read-64k, tcp-stream, tcp-maerts, one sample: not 3 repeats: disk.backing = network-volume is " \
           "attached by one initiator at a time" in line
    assert by["virtio-file"].sampling.repeats == 3 and by["virtio-file"].single == ""
    assert "tcp-maerts, 3 repeats; needs --node" in next(ln for ln in planning.plan_lines(plan)
                                                         if ln.startswith("  virtio-file: "))


def record(store: ResultStore, profile: str, test: str, samples: int, *, size: str = "quick",
           provenance: Provenance | None = None) -> int:
    prof = profiles.find_profile(profile)
    rid = store.create_run(profile_name=profile, profile_hash=prof.hash, suite="storage", size_label=size,
                           accelerator="kvm", started_at=1_700_000_000.0, node=platform.node(), provenance=provenance)
    for _ in range(samples):
        store.add_measurement(rid, side="baseline", test=test, metric="MB/s", value=100.0)
        store.add_measurement(rid, side="guest", test=test, metric="MB/s", value=90.0)
    store.finish_run(rid, "completed")
    return rid


def test_a_stored_cell_counts_only_when_its_run_took_the_planned_samples():
    a = loading.find_study("a")
    w = "dd-write-64k"
    with ResultStore() as store:
        once = record(store, "eucalyptus-default", w, 1)
        runs = store.list_runs()
    hashes, _ = evidence.profile_facts(a, here=False)
    plan = {p.profile: p for p in planning.plan_run(a, runs, hashes, size="quick", node=platform.node(),
                                                    backend=False, unavailable={})}
    assert w in plan["eucalyptus-default"].run and w not in plan["eucalyptus-default"].stored  # 1 of the 3 planned
    # ... yet the old run's cell still loads, and shows as measured once
    cell = evidence.gather(a, runs, size="quick").cells[("eucalyptus-default", w)]
    assert cell.run_id == once and cell.guest.n == 1 and cell.baseline is not None and cell.baseline.n == 1
    assert "| 1+1 |" in markdown.to_markdown(evidence.gather(a, runs, size="quick"))
    with ResultStore() as store:
        three = record(store, "eucalyptus-default", w, 3)
        runs = store.list_runs()
    plan = {p.profile: p for p in planning.plan_run(a, runs, hashes, size="quick", node=platform.node(),
                                                    backend=False, unavailable={})}
    assert plan["eucalyptus-default"].stored == {w: three}
    # at study size: an adaptive stop recorded with its reason counts, at the planned width or narrower
    stopped = Provenance(repeats=Repeats(repeats=1, until_width=5.0, max_repeats=10,
                                         tests=[prov.TestRepeats(test=w, samples=4, reason="its ratio's 95% interval "
                                                            "+-2.0% is within +-5% after 4", half_width=2.0)]))
    wider = Provenance(repeats=Repeats(repeats=1, until_width=10.0, max_repeats=10,
                                       tests=[prov.TestRepeats(test=w, samples=4, reason="within +-10% after 4")]))
    with ResultStore() as store:
        record(store, "virtio-file", w, 4, size="study", provenance=wider)
        adaptive = record(store, "eucalyptus-default", w, 4, size="study", provenance=stopped)
        record(store, "eucalyptus-prealloc", w, 4, size="study")  # 4 fixed repeats: fewer than the most, 10
        runs = store.list_runs()
    plan = {p.profile: p for p in planning.plan_run(a, runs, hashes, size="study", node=platform.node(),
                                                    backend=False, unavailable={})}
    assert plan["eucalyptus-default"].stored == {w: adaptive}
    assert w in plan["virtio-file"].run and w in plan["eucalyptus-prealloc"].run


# -------------------------------------------------------------------------------------------- the order
def test_the_seed_gives_the_order_of_the_profiles_runs_and_each_run_records_it():
    a = loading.find_study("a")
    one = planning.prepare_run(a, [], size="quick", seed=11)
    again = planning.prepare_run(a, [], size="quick", seed=11)
    assert [s.profile for s in one.specs] == [s.profile for s in again.specs] == one.order
    assert sorted(one.order) == sorted(p.profile for p in one.plan if p.run)
    orders = {tuple(planning.prepare_run(a, [], size="quick", seed=seed).order) for seed in range(6)}
    assert len(orders) > 1  # other seeds, other orders
    other = next(planning.prepare_run(a, [], size="quick", seed=seed) for seed in range(1, 50)
                 if planning.prepare_run(a, [], size="quick", seed=seed).order != one.order)
    for todo in (one, other):
        for spec in todo.specs:
            assert spec.study_run == {"study": "a", "seed": todo.seed, "order": todo.order}
            assert RunSpec.from_dict(spec.as_dict()).study_run == spec.study_run  # as a detached sweep keeps it
    assert f"  order: {', '.join(one.order)} (shuffled by seed 11: --seed 11 gives this order again)" in one.lines()
    drawn = planning.prepare_run(a, [], size="quick")
    assert 0 <= drawn.seed < planning.SEED_DRAWN and drawn.order == planning.prepare_run(
        a, [], size="quick", seed=drawn.seed).order
    with pytest.raises(UsageError, match="--seed -1 is not allowed; allowed: a whole number from 0 to 4294967295"):
        planning.prepare_run(a, [], size="quick", seed=-1)
    with pytest.raises(UsageError, match="study run"):
        RunSpec(profile="virtio-file", study_run={"seed": 1}).validate()


def test_the_report_shows_each_study_run_s_seed_and_order():
    a = loading.find_study("a")
    first = planning.prepare_run(a, [], size="quick", seed=3)
    second = next(t for seed in range(4, 60)
                  if (t := planning.prepare_run(a, [], size="quick", seed=seed)).order != first.order)
    w = "dd-write-64k"
    with ResultStore() as store:
        r1 = record(store, "eucalyptus-default", w, 3, provenance=Provenance(spec=first.specs[0]))
        r2 = record(store, "virtio-file", w, 3, provenance=Provenance(spec=second.specs[0]))
        r3 = record(store, "eucalyptus-prealloc", w, 3)  # `cloudbox run`: no study run
        ev = evidence.gather(a, store.list_runs(), size="quick")
    report = markdown.to_markdown(ev)
    assert f"- seed 3: {', '.join(first.order)} (run #{r1} used here)" in report
    assert f"- seed {second.seed}: {', '.join(second.order)} (run #{r2} used here)" in report
    assert f"- run #{r3}: no order recorded" in report
    from cloudbox.core.studies import html

    assert f"seed {second.seed}: {', '.join(second.order)}" in html.to_html(ev)


# ------------------------------------------------------------------------------------------------ the bench
def test_the_bench_runs_the_study_single_pass_then_as_planned_and_writes_both_times(tmp_path):
    """`python -m cloudbox.bench --only study`'s code path with a stand-in executor: each run stores its planned
    samples and costs a boot plus a unit per sample on a fake clock."""
    from cloudbox import bench

    now = [0.0]
    seen: list[tuple[int, str]] = []

    def execute(spec: RunSpec, store: ResultStore) -> int:
        seen.append((spec.repeats, spec.profile))
        now[0] += 20.0 + 10.0 * spec.repeats
        return record(store, spec.profile, "dd-write-64k", spec.repeats)

    st = bench.bench_study("a", "quick", seed=5, execute=execute, clock=lambda: now[0])
    order = planning.prepare_run(loading.find_study("a"), [], size="quick", seed=5).order
    assert seen == [(1, p) for p in order] + [(3, p) for p in order]  # single-pass, then as planned, same order
    assert st["single"]["wall_s"] == 30.0 * len(order) and st["planned"]["wall_s"] == 50.0 * len(order)
    assert st["single"]["samples"] == [1] and st["planned"]["samples"] == [3]
    doc = tmp_path / "benchmarks.md"
    bench.update_section(doc, "study-plan", bench.study_section(st))
    text = doc.read_text()
    assert "<!-- bench:study-plan -->" in text and "| **planned / single-pass** | | | | **1.67x** | <= 2x |" in text
    assert f"| single-pass (`--repeats 1`) | {len(order)} of {len(order)} | 1 | 5 s | {30 * len(order)} s | - |" in text
    assert f"| as planned (3 repeats) | {len(order)} of {len(order)} | 3 | 2 s | {50 * len(order)} s | - |" in text
    assert "as planned (3 repeats)" in text and text.rstrip().endswith("Target met.\n<!-- /bench:study-plan -->")


# ------------------------------------------------------------------------------------------- a run's bug
def test_a_bug_in_one_run_of_a_study_is_shown_and_the_study_goes_on(cli_run, monkeypatch):
    """A run that stops on an internal error (recorded and cleaned up by the executor) does not end the study: the
    traceback is shown, the next run starts, and the study exits 1 saying how many completed."""
    from cloudbox.core.run import runs

    started: list[str] = []

    class Stand:
        def __init__(self, spec: RunSpec, store: ResultStore, **_: object) -> None:
            self.spec, self.store = spec, store

        def execute(self) -> int:
            started.append(self.spec.profile)
            if len(started) == 1:
                raise ValueError("a bug in the first run")
            return record(self.store, self.spec.profile, "dd-write-64k", 1)

        def cancelled(self) -> bool:
            return False

    monkeypatch.setattr(runs, "executor", Stand)
    monkeypatch.setattr(runs, "check_guests_fit", lambda spec: None)
    r = cli_run(["study", "run", "a", "--size", "quick", "--repeats", "1", "--seed", "4"])
    order = planning.prepare_run(loading.find_study("a"), [], size="quick", seed=4).order
    assert started == list(order), started  # every run started, the first one's bug notwithstanding
    assert "ValueError: a bug in the first run" in r.err and "the study goes on with the next" in r.err
    assert r.code == 1 and f"{len(order) - 1} of {len(order)} runs completed" in r.out
