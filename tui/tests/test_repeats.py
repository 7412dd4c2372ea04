"""A figure's repeated samples: stored with their place and level through the real store, read back in measured
order with their summary and the guest's ratio to bare metal (core.record.stats), shown with their intervals by
`results show`, `results compare` (text, Markdown, CSV, JSON) and the export; a figure measured once (every run of
the stores the previous releases wrote) shows no interval and the tables say so once."""

from __future__ import annotations

import contextlib
import csv
import functools
import io
import json
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest_results import (
    REPEATED_READ_BARE,
    REPEATED_READ_GUEST,
    REPEATED_TCP_BARE,
    REPEATED_TCP_GUEST,
    REPEATED_WRITE_BARE,
    REPEATED_WRITE_GUEST,
    add_repeated_virtio,
    add_study_a_default,
)

from cloudbox.core.bench import nettests
from cloudbox.core.bench.result import FioResult
from cloudbox.core.record import schema, stats
from cloudbox.core.record.events import MeasurementEvent, RepeatFigures, describe, parse
from cloudbox.core.record.provenance import Provenance
from cloudbox.core.record.results import ResultStore
from cloudbox.core.record.rows import Repetition, Run, ratio
from cloudbox.core.spec import catalogue
from cloudbox.core.spec.profiles import resolve_profile
from cloudbox.core.spec.runspec import QUICK_SIZE, RunSpec
from cloudbox.core.views import compare, labels, render, rundetail

DATA = Path(__file__).parent / "data"
OLD_STORES = ("results-2026-12.db", "provenance-2026-11.db")


@pytest.fixture
def stored(tmp_path: Path) -> tuple[Run, Run]:
    """(the study A default run measured once, the repeated virtio run), read back from a store."""
    with ResultStore(tmp_path / "results.db") as store:
        once, rep = add_study_a_default(store), add_repeated_virtio(store)
        return store.get_run(once), store.get_run(rep)


def _row(table: compare.Table, test: str, run_id: int, kind: str) -> compare.Row:
    section = table.section(test)
    assert section is not None, test
    (row,) = [r for r in section.rows if r.kind == kind and r.run_ids == [run_id]]
    return row


# ------------------------------------------------------------------------------------------------ the store
def test_samples_read_back_in_measured_order_with_their_place_and_level(stored):
    _, run = stored
    f = run.figure("guest", "seq-write-64k", "MB/s")
    assert f is not None and f.n == 8 and f.values == list(REPEATED_WRITE_GUEST)
    assert [(m.repeat, m.boot, m.iteration) for m in f.samples] == [(k, 1, k) for k in range(1, 9)]
    assert f.summary == stats.summarize(REPEATED_WRITE_GUEST)
    assert run.value("guest", "seq-write-64k", "MB/s") == f.summary.median  # a figure is its samples' median
    assert run.measurement("guest", "seq-write-64k", "MB/s") is f.last  # the last one measured
    assert f.last.value == REPEATED_WRITE_GUEST[-1]
    # the guest against the same run's bare metal, and any two figures against each other (profile vs profile)
    r = run.ratio("seq-write-64k", "MB/s")
    assert r == stats.ratio(REPEATED_WRITE_GUEST, REPEATED_WRITE_BARE)
    assert r is not None and r.method == "rank-sum" and (r.n_a, r.n_b) == (8, 8)
    assert r.low is not None and r.high is not None and r.low < r.percent < r.high
    read = run.figure("guest", "seq-read-64k", "MB/s")
    assert ratio(read, f) == stats.ratio(REPEATED_READ_GUEST, REPEATED_WRITE_GUEST)
    assert ratio(read, None) is None
    # every figure of the run, each side's in the order first stored
    assert [(x.side, x.test, x.n) for x in run.figures()] == [
        ("baseline", "seq-write-64k", 8), ("guest", "seq-write-64k", 8), ("baseline", "seq-read-64k", 8),
        ("guest", "seq-read-64k", 8), ("baseline", "tcp-stream", 3), ("guest", "tcp-stream", 3)]


def test_the_store_numbers_a_figures_samples_and_refuses_a_place_taken(tmp_path: Path):
    with ResultStore(tmp_path / "r.db") as store:
        rid = store.create_run()
        add = functools.partial(store.add_measurement, rid, side="guest", test="seq-write-64k", metric="MB/s")
        add(value=3.0, repeat=3, boot=2, iteration=1)  # stored out of order: read back in measured order
        add(value=1.0, repeat=1, boot=1, iteration=1)
        add(value=2.0, repeat=2, boot=1, iteration=2)
        add(value=4.0, boot=2)  # the next place, the next iteration of its boot
        add(value=9.0, instance=1)  # one of N guests: a figure of its own
        with pytest.raises(ValueError, match="already has repeat 2 of guest seq-write-64k MB/s"):
            add(value=5.0, repeat=2)
        for bad in (0, -1, True, 1.5):
            with pytest.raises(ValueError, match="repeat must be a whole number from 1"):
                add(value=5.0, repeat=bad)
        with pytest.raises(ValueError, match="boot must be a whole number from 1"):
            Repetition(boot=0)
        run = store.get_run(rid)
    f = run.figure("guest", "seq-write-64k", "MB/s")
    assert f is not None and f.values == [1.0, 2.0, 3.0, 4.0]
    assert [(m.repeat, m.boot, m.iteration) for m in f.samples] == [(1, 1, 1), (2, 1, 2), (3, 2, 1), (4, 2, 2)]
    assert f.boots == 2 and run.instance_figures("guest", "seq-write-64k", "MB/s")[0].values == [9.0]
    assert Repetition(3, 2, 1).columns() == {"repeat": 3, "boot": 2, "iteration": 1}


@pytest.mark.parametrize("name", OLD_STORES)
def test_the_stores_of_earlier_releases_load_as_one_sample_per_figure(tmp_path: Path, name: str):
    copy = tmp_path / name
    shutil.copy(DATA / name, copy)  # opening it upgrades it: never the committed file
    with ResultStore(copy) as store:
        assert store.schema_version == schema.SCHEMA_VERSION
        runs = [store.get_run(i) for i in store.run_ids()]
    measured = [r for r in runs if r.measurements]
    assert measured
    for run in measured:
        assert {(m.repeat, m.boot, m.iteration) for m in run.measurements} == {(1, 1, 1)}, run.id
        assert {f.n for f in run.figures()} == {1}, run.id
        # shown as before: no interval, no n=, and said once
        table = compare.compare_table([run])
        text = render.to_text(table)
        cells = [x for s in table.sections for r in s.rows for x in render._display(s, r)]
        assert not [x for x in cells if "[" in x or "n=" in x]
        assert "n=" not in text.replace(labels.ONCE_NOTE, "")
        assert table.footnotes[-1] == labels.ONCE_NOTE and text.count(labels.ONCE_NOTE) == 1
        assert all(r.summary is None or r.summary.n == 1 for s in table.sections for r in s.rows)
        assert "Repeated figures" not in rundetail.run_detail(run, [])


def test_a_figure_stored_several_times_before_repeats_existed_becomes_its_samples(tmp_path: Path):
    """A schema 4 database whose propagation run stored each size's samples as rows of one figure (one guest boot
    each): its rows are numbered in stored order, each in a boot of its own; a storage run's one figure stays n=1."""
    db = tmp_path / "v4.db"
    with sqlite3.connect(db) as c:
        for n in range(4):
            schema.MIGRATIONS[n](c)
        c.execute("PRAGMA user_version = 4")
        c.execute("INSERT INTO runs (id, uuid, suite, state) VALUES (1, 'p', 'propagation', 'completed')")
        c.execute("INSERT INTO runs (id, uuid, suite, state) VALUES (2, 's', 'storage', 'completed')")
        for v in (9.0, 8.0, 10.0):
            c.execute("INSERT INTO measurements (run_id, side, test, metric, value) "
                      "VALUES (1, 'guest', 'propagate-64m', 'total_s', ?)", (v,))
        c.execute("INSERT INTO measurements (run_id, side, test, metric, value) "
                  "VALUES (1, 'guest', 'propagate-128m', 'total_s', 12.0)")
        c.execute("INSERT INTO measurements (run_id, side, test, metric, value) "
                  "VALUES (2, 'guest', 'seq-write-64k', 'MB/s', 50.0)")
    with ResultStore(db) as store:
        prop, storage = store.get_run(1), store.get_run(2)
    f = prop.figure("guest", "propagate-64m", "total_s")
    assert f is not None and f.values == [9.0, 8.0, 10.0]
    assert [(m.repeat, m.boot, m.iteration) for m in f.samples] == [(1, 1, 1), (2, 2, 1), (3, 3, 1)]
    assert prop.figure("guest", "propagate-128m", "total_s").n == 1  # type: ignore[union-attr]
    assert [(m.repeat, m.boot, m.iteration) for m in storage.measurements] == [(1, 1, 1)]


# ------------------------------------------------------------------------------------------------ the views
def test_compare_shows_each_repeated_figure_with_its_interval_and_n(stored):
    once, rep = stored
    table = compare.compare_table([once, rep])
    guest = _row(table, "seq-write-64k", rep.id, "guest")
    s = stats.summarize(REPEATED_WRITE_GUEST)
    q = stats.ratio(REPEATED_WRITE_GUEST, REPEATED_WRITE_BARE)
    assert s.low is not None and s.high is not None and q is not None and q.low is not None and q.high is not None
    assert guest.summary == s and guest.ratio == q and guest.samples == REPEATED_WRITE_GUEST
    assert guest.cells["value"] == s.median and guest.cells["pct"] == q.percent
    bare = _row(table, "seq-write-64k", rep.id, "baseline")
    assert bare.summary == stats.summarize(REPEATED_WRITE_BARE) and bare.ratio is None
    # the run measured once keeps its one value and its plain %
    plain = _row(table, "seq-write-64k", once.id, "guest")
    assert plain.summary is not None and plain.summary.n == 1 and plain.cells["pct"] == 1.3 / 111 * 100
    figure = f"{s.median:.1f} [{s.low:.1f}, {s.high:.1f}] n=8"
    pct = f"{q.percent:.1f}% [{q.low:.1f}, {q.high:.1f}] n=8+8"
    md = render.to_markdown(table)
    assert f"| {figure} | {pct.replace('+', chr(92) + '+')} |" in md
    text = render.to_text(table)
    assert max(len(line) for line in text.splitlines()) <= 80
    flat = " ".join(text.split())
    assert f"{s.median:.1f}" in flat and f"[{s.low:.1f}, {s.high:.1f}]" in text and "n=8+8" in text
    assert f"[{q.low:.1f}, {q.high:.1f}]" in text  # an interval is never split across lines
    narrow = render.to_text(table, width=70)  # too narrow for a whole interval: it breaks after its comma
    assert max(len(line) for line in narrow.splitlines()) <= 70
    assert f"[{s.low:.1f}," in narrow and f" {s.high:.1f}]" in narrow
    # the notes: what an interval is, too few for one, a range's coverage, and which figures were measured once
    assert labels.INTERVAL_NOTE in table.footnotes and labels.ONCE_SOME_NOTE in table.footnotes
    assert labels.FEW_NOTE in table.footnotes and labels.RANGE_NOTE in table.footnotes
    assert labels.ONCE_NOTE not in table.footnotes
    # three samples a side: the medians without an interval, the ratio with the range of its pairs (90%)
    tcp = _row(table, "tcp-stream", rep.id, "guest")
    assert render._cell(table.section("tcp-stream"), tcp, "value") == "905 n=3"  # type: ignore[arg-type]
    assert render._cell(table.section("tcp-stream"), tcp, "pct") == stats.ratio(  # type: ignore[arg-type]
        REPEATED_TCP_GUEST, REPEATED_TCP_BARE).text()  # type: ignore[union-attr]
    assert "(90%) n=3+3" in tcp.ratio.text()  # type: ignore[union-attr]


def test_a_figure_whose_samples_vary_is_flagged_and_footnoted(stored):
    _, rep = stored
    table = compare.compare_table([rep])
    read = _row(table, "seq-read-64k", rep.id, "guest")
    assert read.summary is not None and read.summary.cv is not None and read.summary.cv > stats.CV_FLAG
    assert labels.VARIES_MARK in read.markers
    for test, kind in (("seq-write-64k", "guest"), ("seq-read-64k", "baseline"), ("seq-write-64k", "baseline")):
        assert labels.VARIES_MARK not in _row(table, test, rep.id, kind).markers, (test, kind)
    assert labels.VARIES_NOTE in table.footnotes
    assert "KVM ~" in " ".join(render.to_text(table).split()) or "~" in render.to_text(table)
    assert "KVM \\~" in render.to_markdown(table)
    rows = list(csv.DictReader(io.StringIO(render.to_csv(table))))
    (flagged,) = [r for r in rows if r["test"] == "seq-read-64k" and r["row"] == "guest"]
    assert flagged["marker"] == "~" and flagged["note"] == labels.VARIES_NOTE
    # the steady runs of study A have no flag and no note
    assert labels.VARIES_NOTE not in compare.compare_table([stored[0]]).footnotes


def test_csv_and_json_export_every_sample(stored):
    once, rep = stored
    table = compare.compare_table([once, rep])
    rows = list(csv.DictReader(io.StringIO(render.to_csv(table))))
    assert list(rows[0]) == list(render.CSV_FIELDS)
    (g,) = [r for r in rows if r["test"] == "seq-write-64k" and r["run"] == f"#{rep.id}" and r["row"] == "guest"]
    s = stats.summarize(REPEATED_WRITE_GUEST)
    assert g["n"] == "8" and [float(x) for x in g["samples"].split()] == list(REPEATED_WRITE_GUEST)
    assert float(g["low"]) == pytest.approx(s.low, abs=1e-3) and float(g["high"]) == pytest.approx(s.high, abs=1e-3)
    assert (float(g["min"]), float(g["max"])) == (71.0, 76.9) and float(g["cv"]) == pytest.approx(s.cv, abs=1e-4)
    assert g["pct_n"] == "8+8" and float(g["pct_low"]) < float(g["pct_of_baseline"]) < float(g["pct_high"])
    (one,) = [r for r in rows if r["test"] == "seq-write-64k" and r["run"] == f"#{once.id}" and r["row"] == "guest"]
    assert (one["n"], one["low"], one["high"], one["samples"], one["pct_low"], one["pct_n"]) == (
        "1", "", "", "1.3", "", "1+1")

    doc = json.loads(render.to_json([once, rep]))
    exported = doc["runs"][1]
    samples = [m for m in exported["measurements"] if (m["side"], m["test"]) == ("guest", "seq-write-64k")]
    assert [(m["value"], m["repeat"], m["boot"], m["iteration"]) for m in samples] == [
        (v, k, 1, k) for k, v in enumerate(REPEATED_WRITE_GUEST, 1)]
    (fig,) = [f for f in exported["figures"] if (f["side"], f["test"]) == ("guest", "seq-write-64k")]
    assert fig["samples"] == list(REPEATED_WRITE_GUEST) and fig["n"] == 8 and fig["median"] == s.median
    assert (fig["low"], fig["high"], fig["min"], fig["max"], fig["cv"]) == (s.low, s.high, 71.0, 76.9, s.cv)
    q = stats.ratio(REPEATED_WRITE_GUEST, REPEATED_WRITE_BARE)
    assert q is not None and fig["pct_of_baseline"] == {
        "percent": q.percent, "low": q.low, "high": q.high, "n_guest": 8, "n_baseline": 8, "method": "rank-sum",
        "coverage": stats.CONFIDENCE}
    summary = exported["summary"]
    assert summary["seq_write_n"] == 8 and summary["seq_write_ci"] == [s.low, s.high]
    assert summary["seq_write_pct_ci"] == [q.low, q.high] and summary["tcp_stream_n"] == 3
    assert summary["tcp_stream_ci"] is None  # 3 samples: no interval for their median
    plain = doc["runs"][0]
    assert {f["n"] for f in plain["figures"]} == {1} and plain["summary"]["seq_write_ci"] is None
    assert all((m["repeat"], m["boot"], m["iteration"]) == (1, 1, 1) for m in plain["measurements"])


def test_results_show_gives_each_repeated_figures_samples(stored, tmp_path):
    once, rep = stored
    text = rundetail.run_detail(rep, [])
    s = stats.summarize(REPEATED_READ_GUEST)
    assert s.low is not None and s.high is not None and s.cv is not None
    assert "Repeated figures: median [95% interval] n, CV, min, max, samples in order" in text
    lines = text.splitlines()
    i = lines.index("  seq-read-64k MB/s")
    assert lines[i + 1] == (f"    guest       {s.median:.1f} [{s.low:.1f}, {s.high:.1f}] n=8  CV {s.cv * 100:.1f}% ~"
                            f"  min 68.5  max 99.0")
    assert lines[i + 2].split() == [f"{v:.1f}" for v in REPEATED_READ_GUEST]
    assert lines[i + 3].startswith("    bare metal  108.0 [") and lines[i + 4].split()[0] == "108.0"
    q = stats.ratio(REPEATED_READ_GUEST, REPEATED_READ_BARE)
    assert q is not None and lines[i + 5] == f"    % of bare   {q.text()}"
    assert "  tcp-stream Mbit/s" in lines and "    guest       905 n=3  CV 0.7%  min 900  max 912" in lines
    assert max(len(line) for line in lines[lines.index("Repeated figures: median [95% interval] n, CV, min, max, "
                                                       "samples in order"):]) <= 80
    # a run measured once: its table as before, with the one note, and no samples section
    plain = rundetail.run_detail(once, [])
    assert "Repeated figures" not in plain and labels.ONCE_NOTE in plain and "n=" not in plain.replace(
        labels.ONCE_NOTE, "")


def test_results_show_groups_the_samples_of_several_boots(tmp_path: Path):
    with ResultStore(tmp_path / "r.db") as store:
        rid = store.create_run(accelerator="kvm")
        for k, (boot, it) in enumerate(((1, 1), (1, 2), (2, 1), (2, 2)), 1):
            store.add_measurement(rid, side="baseline", test="seq-write-64k", metric="MB/s", value=100.0 + k,
                                  repeat=k, boot=boot, iteration=it)
            store.add_measurement(rid, side="guest", test="seq-write-64k", metric="MB/s", value=90.0 + k,
                                  repeat=k, boot=boot, iteration=it)
        run = store.get_run(rid)
    text = rundetail.run_detail(run, [])
    assert "boot 1: 91.0 92.0; boot 2: 93.0 94.0" in text and "boot 1: 101.0 102.0; boot 2: 103.0 104.0" in text


# ------------------------------------------------------------------------------------------------ the executor
def _ctx(store: ResultStore, spec: RunSpec):
    from cloudbox.core.run.context import RunContext, RunControl
    from cloudbox.core.run.sink import EventSink

    rid = store.create_run(uuid="0" * 32, profile_name=spec.profile, suite=spec.suite, state="running")
    return RunContext(spec, resolve_profile(spec.profile), QUICK_SIZE, "quick", "0" * 32, rid, store,
                      EventSink(store, rid), RunControl(), contextlib.ExitStack(), Provenance())


def test_the_measurement_path_stores_a_repeat_and_its_level_and_defaults_to_once(tmp_path: Path):
    from cloudbox.core.run.measure import net_test, storage_test

    t = catalogue.TESTS["seq-write-64k"]
    stream = catalogue.NET_TESTS["tcp-stream"]

    def fio(mbps: float) -> FioResult:
        return FioResult(t.id, mbps, mbps * 16, 900.0, 2.0, '{"fio": 1}')

    with ResultStore(tmp_path / "r.db") as store:
        ctx = _ctx(store, RunSpec(profile="virtio-disk"))
        storage_test(ctx, "guest", t, lambda: fio(50.0))  # today's call: its figure's only sample
        storage_test(ctx, "guest", t, lambda: fio(52.0), rep=Repetition(2, 1, 2))
        storage_test(ctx, "guest", t, lambda: fio(51.0), rep=Repetition(3, 2, 1))
        net = functools.partial(nettests.NetResult, "tcp-stream", metric="Mbit/s", lat_us=None, raw="")
        net_test(ctx, "guest", stream, lambda: net(value=900.0), [], rep=Repetition(1, 1, 1))
        net_test(ctx, "guest", stream, lambda: net(value=910.0), [], rep=Repetition(2, 2, 1))
        run = store.get_run(ctx.run_id)
        recs = [e.record for e in store.events_since(ctx.run_id)]
        payloads = [e.payload for e in store.events_since(ctx.run_id) if e.kind == "measurement"]
    f = run.figure("guest", "seq-write-64k", "MB/s")
    assert f is not None and [(m.value, m.repeat, m.boot, m.iteration) for m in f.samples] == [
        (50.0, 1, 1, 1), (52.0, 2, 1, 2), (51.0, 3, 2, 1)]
    assert f.median == 51.0
    n = run.figure("guest", "tcp-stream", "Mbit/s")
    assert n is not None and [(m.repeat, m.boot) for m in n.samples] == [(1, 1), (2, 2)]
    events = [r for r in recs if isinstance(r, MeasurementEvent)]
    assert [(e.test, e.value, e.repeat, e.boot, e.iteration) for e in events] == [
        ("seq-write-64k", 50.0, 1, 1, 1), ("seq-write-64k", 52.0, 2, 1, 2), ("seq-write-64k", 51.0, 3, 2, 1),
        ("tcp-stream", 900.0, 1, 1, 1), ("tcp-stream", 910.0, 2, 2, 1)]
    # a sample measured once stores the payload it always had; a repeat says where it stands
    assert not {"repeat", "boot", "iteration"} & set(payloads[0])
    assert (payloads[1]["repeat"], payloads[1]["iteration"], "boot" in payloads[1]) == (2, 2, False)
    assert describe(events[0]) == "  = guest seq-write-64k: 50 MB/s"
    assert describe(events[1]) == "  = guest seq-write-64k (repeat 2): 52 MB/s"
    assert describe(events[2]) == "  = guest seq-write-64k (repeat 3, boot 2 iteration 1): 51 MB/s"


def test_n_guests_and_an_mpi_job_store_each_instance_and_their_aggregate_as_the_repeat_given(tmp_path: Path):
    from cloudbox.core.run.measure import Ran, storage_job, storage_test_many

    t, t2 = catalogue.TESTS["seq-write-64k"], catalogue.TESTS["seq-write-1m"]

    def ran(mbps: float) -> Callable[[Callable[[], bool]], Ran]:
        return lambda cancelled: Ran(FioResult(t.id, mbps, mbps * 16, 900.0, 2.0, ""), 10.0, 12.0)

    def job(total: float, ranks: tuple[float, ...]) -> Callable[[], tuple[FioResult, list[FioResult]]]:
        return lambda: (FioResult(t2.id, total, 0.0, 0.0, 2.0, "{}"),
                        [FioResult(t2.id, v, 0.0, 0.0, 2.0, "") for v in ranks])

    with ResultStore(tmp_path / "r.db") as store:
        ctx = _ctx(store, RunSpec(profile="virtio-disk", guests=2))
        storage_test_many(ctx, "guest", t, [ran(30.0), ran(20.0)])  # today's call: each figure's only sample
        storage_test_many(ctx, "guest", t, [ran(32.0), ran(22.0)], rep=Repetition(2, 1, 2))
        storage_job(ctx, "guest", t2, job(90.0, (45.0, 44.0)))
        storage_job(ctx, "guest", t2, job(96.0, (48.0, 47.0)), rep=Repetition(2, 2, 1))
        run = store.get_run(ctx.run_id)
    total = run.figure("guest", t.id, "MB/s")
    assert total is not None and [(m.value, m.repeat, m.iteration) for m in total.samples] == [(50.0, 1, 1),
                                                                                               (54.0, 2, 2)]
    assert [f.values for f in run.instance_figures("guest", t.id, "MB/s")] == [[30.0, 32.0], [20.0, 22.0]]
    assert [(m.repeat, m.boot) for m in run.instance_figures("guest", t.id, "MB/s")[1].samples] == [(1, 1), (2, 1)]
    agg = run.figure("guest", t2.id, "MB/s")
    assert agg is not None and [(m.value, m.repeat, m.boot) for m in agg.samples] == [(90.0, 1, 1), (96.0, 2, 2)]
    assert [f.values for f in run.instance_figures("guest", t2.id, "MB/s")] == [[45.0, 48.0], [44.0, 47.0]]


def test_a_measurement_events_repetition_round_trips_and_old_payloads_read_as_once():
    ev = MeasurementEvent("guest", "seq-write-64k", "MB/s", 50.0, ("quick-size",), repeat=4, boot=2, iteration=2)
    assert parse("measurement", ev.to_payload()) == ev
    old = {"side": "guest", "test": "seq-write-64k", "metric": "MB/s", "value": 50.0, "labels": []}
    back = parse("measurement", old)
    assert isinstance(back, MeasurementEvent) and (back.repeat, back.boot, back.iteration) == (1, 1, 1)
    assert not back.repeated
    bad = parse("measurement", {**old, "repeat": 0, "boot": "x"})
    assert isinstance(bad, MeasurementEvent) and (bad.repeat, bad.boot) == (1, 1)


def test_the_live_figures_of_a_repeated_test():
    live = RepeatFigures()
    assert not live.repeated and live.lines() == []
    for k, (g, b) in enumerate(zip(REPEATED_WRITE_GUEST, REPEATED_WRITE_BARE, strict=True), 1):
        live.feed(MeasurementEvent("baseline", "seq-write-64k", "MB/s", b, repeat=k, iteration=k))
        live.feed(MeasurementEvent("guest", "seq-write-64k", "MB/s", g, repeat=k, iteration=k))
        live.feed(MeasurementEvent("guest", "seq-write-64k", "MB/s", 1.0, instance=1, repeat=k))  # not the run's
    live.feed(MeasurementEvent("guest", "seq-read-64k", "MB/s", 70.0))  # measured once so far: no line
    assert live.repeated
    s, q = stats.summarize(REPEATED_WRITE_GUEST), stats.ratio(REPEATED_WRITE_GUEST, REPEATED_WRITE_BARE)
    assert q is not None
    assert live.lines() == [f"seq-write-64k MB/s: guest {s.text()}, bare metal "
                            f"{stats.summarize(REPEATED_WRITE_BARE).text()}, {q.text()} of bare metal"]
    once = RepeatFigures()
    once.feed(MeasurementEvent("guest", "seq-write-64k", "MB/s", 50.0))
    once.feed(MeasurementEvent("baseline", "seq-write-64k", "MB/s", 100.0))
    assert not once.repeated and once.lines() == []
