"""A study measured as a series over time (study D): its [series] plan validated, the repeats still missing planned
and spaced, the distribution computed (median, percentiles, CV, histogram bins) against hand-computed values, the
report's variability section and figures, and each cell's "n of N repeats", over runs recorded in a real results
store through its own API."""

from __future__ import annotations

import math
import platform
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from cloudbox.core.errors import StudyError
from cloudbox.core.record.results import ResultStore
from cloudbox.core.spec import profiles
from cloudbox.core.studies import cellstates, evidence, html, loading, markdown, planning, series

T0 = 1_700_000_000.0
REPO = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.usefixtures("isolated")


def record(store: ResultStore, values: dict[str, float], *, started_at: float, size: str = "quick",
           accelerator: str = "tcg", profile: str = "virtio-file", base_labels: tuple[str, ...] = ()) -> int:
    prof = profiles.find_profile(profile)
    rid = store.create_run(profile_name=profile, profile_hash=prof.hash, suite="storage", size_label=size,
                           accelerator=accelerator, started_at=started_at, node=platform.node(),
                           emulated=accelerator == "tcg")
    for test, value in values.items():
        store.add_measurement(rid, side="baseline", test=test, metric="MB/s", value=100.0, labels=list(base_labels))
        store.add_measurement(rid, side="guest", test=test, metric="MB/s", value=value)
    store.finish_run(rid, "completed")
    return rid


D_TEXT = (REPO / "studies" / "d.toml").read_text()
D_TESTS = ("seq-write-2m", "seq-write-2m-buffered", "seq-read-2m", "seq-read-2m-buffered")  # study D's, in order


def problems_of(text: str) -> dict[str, str]:
    with pytest.raises(StudyError) as exc:
        loading.parse_study(text, "d.toml")
    return {p.key: f"{p.message} | {p.allowed}" for p in exc.value.problems}


def test_the_shipped_study_d_is_a_series_per_size():
    d = loading.find_study("d")
    assert [r.id for r in d.rules] == ["D.vm", "D.buf.w", "D.buf.r"] and d.paper == []
    assert d.test_ids == ["seq-write-2m", "seq-write-2m-buffered", "seq-read-2m", "seq-read-2m-buffered"]
    quick, full = d.series_plan("quick"), d.series_plan("study")
    assert quick is not None and full is not None
    assert (quick.repeats, quick.every_s, quick.guests) == (5, 60.0, 2)
    assert full.words() == "17 repeats every 15 min (over 4 h), 4 guests at once"
    assert (d.guests("study"), loading.find_study("a").guests("study")) == (4, 1)
    assert loading.find_study("a").series_plan("quick") is None


def test_a_bad_series_plan_names_the_key_and_what_is_allowed():
    no_quick = D_TEXT.replace("[series.quick]\nevery_minutes = 1\nrepeats = 5\nguests = 2\n", "")
    assert "a plan for each of its sizes" in problems_of(no_quick)["series.quick"]
    one = D_TEXT.replace("repeats = 5", "repeats = 1")
    assert "2..1000" in problems_of(one)["series.quick.repeats"]
    hours = D_TEXT.replace("every_minutes = 1\n", "every_minutes = 1\nhours = 2\n")
    assert "known keys: every_minutes, repeats, guests" in problems_of(hours)["series.quick.hours"]
    for bad in ("0", "65", "1.5", '"2"'):
        many = D_TEXT.replace("guests = 2\n", f"guests = {bad}\n")
        assert "guests of each run at once (instances), 1..64" in problems_of(many)["series.quick.guests"], bad
    negative = D_TEXT.replace("every_minutes = 1\n", "every_minutes = -1\n")
    assert "0..1440" in problems_of(negative)["series.quick.every_minutes"]
    study_only = D_TEXT.replace('sizes = ["study", "quick"]', 'sizes = ["study"]')
    assert "does not offer" in problems_of(study_only)["series.quick"]


def test_a_series_run_plans_the_repeats_still_missing_spaced_by_the_plan():
    d = loading.find_study("d")
    with ResultStore() as store:
        first = record(store, dict(zip(D_TESTS, (50.0, 80.0, 40.0, 45.0), strict=True)), started_at=T0)
        record(store, {"seq-write-2m": 52.0}, started_at=T0 + 60)  # lacks a test: not a whole repeat
        record(store, dict(zip(D_TESTS, (51.0, 81.0, 41.0, 46.0), strict=True)), started_at=T0 + 120, size="study")
        done = store.list_runs(state="completed")
        todo = planning.prepare_run(d, done, size="quick")
        again = planning.prepare_run(d, done, size="quick", again=True)
    # the one-guest repeat is not one of this plan's (two guests at once): five to do
    assert len(todo.specs) == 5 and todo.offsets == [0.0, 60.0, 120.0, 180.0, 240.0]
    assert all(s.size == "quick" and s.storage_tests == ",".join(D_TESTS) and s.guests == 2 for s in todo.specs)
    assert todo.plan[0].have == 0 and todo.plan[0].repeats == 5
    one = planning.prepare_run(planning.with_series_plan(d, "quick", guests=1), done, size="quick")
    assert one.plan[0].have == 1 and one.plan[0].repeats == 4 and all(s.guests == 1 for s in one.specs)
    assert one.lines() == [f"  virtio-file: 1 of 5 repeats stored; run {', '.join(D_TESTS)} x4"]
    assert one.headline().endswith("4 run(s) to do, a series of 5 repeats every 1 min (over 4 min)")
    assert todo.headline().endswith("a series of 5 repeats every 1 min (over 4 min), 2 guests at once")
    assert len(again.specs) == 5
    assert [r.id for r in series.series_runs(done, "virtio-file", profiles.find_profile("virtio-file").hash,
                                              list(D_TESTS), "quick", None)] == [first]


def test_series_stats_match_hand_computed_values():
    st = series.series_stats([10.0, 12.0, 11.0, 13.0, 14.0])
    assert st is not None
    assert (st.n, st.median, st.low, st.high, st.mean) == (5, 12.0, 10.0, 14.0, 12.0)
    # sample standard deviation: sqrt((4+0+1+1+4)/4) = sqrt(2.5) = 1.5811; CV = 1.5811 / 12 = 13.18 %
    assert st.stdev == pytest.approx(1.58114, abs=1e-5) and st.cv == pytest.approx(13.176, abs=1e-3)
    # 5th / 95th percentiles, linear between ranks: 10 + 0.2 * 1 = 10.2 and 13 + 0.8 * 1 = 13.8
    assert st.p5 == pytest.approx(10.2) and st.p95 == pytest.approx(13.8)
    one = series.series_stats([7.0])
    assert one is not None and (one.median, one.stdev, one.cv) == (7.0, None, None)
    assert series.series_stats([]) is None


def test_histogram_bins_cover_every_value_once():
    values = [1.0, 2.0, 2.5, 3.0, 9.0, 10.0]
    hist = series.bins(values, 3)
    assert hist == [(1.0, 4.0, 4), (4.0, 7.0, 0), (7.0, 10.0, 2)]
    assert sum(n for _, _, n in series.bins(values)) == len(values)
    assert series.bins([5.0, 5.0]) == [(5.0, 5.0, 2)]


def test_density_matches_hand_computed_values_and_finds_two_groups():
    values = [10.0, 12.0, 11.0, 13.0, 14.0]
    d = series.density(values)
    assert d is not None
    # Silverman: s = 1.5811, IQR = 13 - 11 = 2 -> 2 / 1.34 = 1.4925 (the smaller); 0.9 * 1.4925 * 5^-0.2 = 0.97357
    assert d.bandwidth == pytest.approx(0.97357, abs=1e-4)
    h = d.bandwidth
    # at 12 (the grid's middle point) the estimate is the mean of the five samples' normal pdfs of width h
    phi = [math.exp(-((12.0 - v) / h) ** 2 / 2) / (h * math.sqrt(2 * math.pi)) for v in values]
    at12 = next(y for x, y in d.curve if x == pytest.approx(12.0))
    assert at12 == pytest.approx(sum(phi) / 5)
    assert d.curve[0][0] == pytest.approx(10.0 - 3 * h) and d.curve[-1][0] == pytest.approx(14.0 + 3 * h)
    step = d.curve[1][0] - d.curve[0][0]
    area = sum((a[1] + b[1]) / 2 * step for a, b in zip(d.curve, d.curve[1:], strict=False))
    assert area == pytest.approx(1.0, abs=0.01)  # a density: it integrates to one over +-3h
    assert d.peaks == [pytest.approx(12.0)]
    two = series.density([1.0, 1.1, 0.9, 10.0, 10.1, 9.9])
    assert two is not None and len(two.peaks) == 2
    assert two.peaks[0] == pytest.approx(1.0, abs=0.5) and two.peaks[1] == pytest.approx(10.0, abs=0.5)
    assert "2 peaks, at 1.0 and 10.0 MB/s" in markdown.density_words(two, "MB/s")
    three = series.Density(1.0, [], [1.0, 10.0, 20.0])
    assert "3 peaks, at 1.0, 10.0 and 20.0 MB/s." in markdown.density_words(three, "MB/s")
    assert series.density([5.0, 5.0, 5.0]) is None and series.density([1.0, 2.0]) is None


def test_a_density_peak_is_named_only_over_enough_samples():
    # four samples near 1 and one at 10: the lone sample's bump is drawn but not named a peak
    d = series.density([1.0, 1.1, 0.9, 1.05, 10.0])
    assert d is not None and d.peaks == [pytest.approx(1.0, abs=0.5)] and d.minor == 1
    assert markdown.density_words(d, "MB/s").endswith(
        f"one peak, at 1.0 MB/s (1 smaller bump of fewer than {series.MIN_PEAK_SAMPLES} samples not named as peaks).")
    # two groups of two: neither is a group of runs, the curve's highest point is still named
    two = series.density([1.0, 1.1, 10.0, 10.05])
    assert two is not None and len(two.peaks) == 1 and two.minor == 1


def test_the_report_gives_the_spread_labelled_and_its_figures_parse():
    d = loading.find_study("d")  # its plan has two guests; repeats of one (`--guests 1`) are what is stored
    ids = []
    with ResultStore() as store:
        for i, v in enumerate([10.0, 12.0, 11.0]):
            ids.append(record(store, dict(zip(D_TESTS, (v, 5 * v, 2 * v, 3 * v), strict=True)), started_at=T0 + 60 * i,
                              base_labels=("virtualized-host",) if i == 1 else ()))
        done = store.list_runs(state="completed")
        stored = store.list_runs()
    ev = evidence.gather(d, done)
    assert [x.run_id for x in ev.series[("virtio-file", "seq-write-2m")]] == ids
    md = markdown.to_markdown(ev)
    assert "## Variability over time" in md
    row = next(line for line in md.splitlines() if line.startswith("| virtio-file | seq-write-2m |"))
    # 3 of the quick plan's 5 repeats; median 11.0 labelled emulated and quick; p5 10.1, p95 11.9; CV 1/11 = 9.1 %;
    # bare metal is not emulated, but one of its runs was on a virtual machine
    assert row.startswith("| virtio-file | seq-write-2m | 3 of 5 (quick) | 11.0 (emulated, quick) MB/s | 10.1 | 11.9 "
                          "| 9.1% | 10.0 - 12.0 | 100.0 (virtualized host, quick) |")
    assert f"runs #{ids[0]}, #{ids[1]}, #{ids[2]}" in md
    page = html.to_html(ev)
    svgs = [chunk.split("</svg>")[0] + "</svg>" for chunk in page.split("<svg")[1:]]
    for svg in svgs:
        ET.fromstring("<svg" + svg)
    # beside each table's % of native bars, a histogram and a timeline per cell of the series
    assert sum("histogram of 3 repeats" in svg for svg in svgs) == len(d.tests)
    assert sum("3 repeats over time" in svg for svg in svgs) == len(d.tests)
    dens = [ET.fromstring("<svg" + svg) for svg in svgs if "density of 3 samples" in svg]
    assert len(dens) == len(d.tests)
    ns = "{http://www.w3.org/2000/svg}"
    assert all(len(x.findall(f"{ns}polygon")) == 1 for x in dens)  # the curve
    assert all(len(x.findall(f"{ns}line")) >= 1 + 3 for x in dens)  # its axis and a tick per sample
    assert "Density (Gaussian kernel, bandwidth" in md
    assert "(emulated, quick)" in page
    cells = {(c.profile, c.test): c for c in cellstates.cell_states(d, stored, ev.cells, series=ev.series)}
    assert cells[("virtio-file", "seq-write-2m-buffered")].series_text == "3 of 5 repeats"


def test_a_study_without_a_series_has_no_variability_section():
    a = loading.find_study("a")
    with ResultStore() as store:
        record(store, {"dd-write-64k": 2.0}, started_at=T0, profile="eucalyptus-default")
        done = store.list_runs(state="completed")
    ev = evidence.gather(a, done)
    assert ("eucalyptus-default", "dd-write-64k") in ev.cells
    assert ev.series == {} and "Variability" not in markdown.to_markdown(ev)


def test_a_sweep_waits_for_each_runs_start_and_stops_at_once_when_cancelled(request):
    from cloudbox.core.run import runs
    from cloudbox.core.spec.runspec import RunSpec

    specs = [RunSpec(profile="virtio-file", size="quick"), RunSpec(profile="virtio-file", size="quick")]
    with ResultStore() as store:
        with pytest.raises(runs.CloudboxError, match="one per run"):
            runs.start_sweep(specs, store, offsets=[0.0])
        with pytest.raises(runs.CloudboxError, match="in order"):
            runs.start_sweep(specs, store, offsets=[60.0, 0.0])
        sweep = runs.start_sweep(specs, store, offsets=[3600.0, 3660.0])
        request.addfinalizer(lambda: runs.cancel_sweep(sweep.id, timeout=10))  # never left waiting an hour
        # wait_until is False when its stop condition came first: here, the sweep saying it waits
        assert not runs.wait_until(time.time() + 30, lambda: any(
            s.id == sweep.id and s.waiting_until for s in runs.list_sweeps())), "the sweep never said it waits"
        [now] = [s for s in runs.list_sweeps() if s.id == sweep.id]
        assert now.state == "running" and now.waiting_until == pytest.approx(sweep.started_at + 3600.0)
        assert runs.cancel_sweep(sweep.id, timeout=30) == "cancelled"
        assert store.list_runs() == []  # nothing started
        with pytest.raises(runs.NotFound, match="no sweep 'sweep-nope'"):
            runs.cancel_sweep("sweep-nope")
        with pytest.raises(runs.NotFound):  # an id is never a path
            runs.cancel_sweep(f"../sweeps/{sweep.id}")


def test_repeats_and_every_change_the_plan_of_a_series_study_only(capsys):
    from cloudbox import cli
    from cloudbox.core.errors import UsageError

    d = loading.find_study("d")
    short = planning.with_series_plan(d, "quick", repeats=3, every_minutes=0)
    assert short.series_plan("quick").words() == "3 repeats back to back, 2 guests at once"
    assert short.series_plan("study") == d.series_plan("study")  # the other size keeps the file's plan
    assert planning.with_series_plan(d, "study", every_minutes=30).series_plan("study").repeats == 17
    with pytest.raises(UsageError, match=r"--repeats 1 is out of range; allowed: .*2\.\.1000"):
        planning.with_series_plan(d, "quick", repeats=1)
    with pytest.raises(UsageError, match=r"--every 2000 is out of range; allowed: .*0\.\.1440"):
        planning.with_series_plan(d, "quick", every_minutes=2000)
    with pytest.raises(UsageError, match="study a is not a series: each cell is one guest's run, sampled as its "
                                         "plan says .* series studies: d"):
        planning.with_series_plan(loading.find_study("a"), "quick", every_minutes=3)
    with pytest.raises(UsageError, match="--until-width: study d is a series, its repeats are runs spaced in time"):
        planning.with_repeat_plan(d, "quick", until_width=5.0)
    with pytest.raises(UsageError, match=r"--guests 0 is out of range; allowed: guests of each run at once "
                                         r"\(instances\), 1\.\.64"):
        planning.with_series_plan(d, "quick", guests=0)
    assert planning.with_series_plan(d, "quick", guests=3).series_plan("quick").guests == 3

    assert cli.main(["study", "run", "d", "--size", "quick", "--repeats", "3", "--every", "2", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "3 run(s) to do, a series of 3 repeats every 2 min (over 4 min)" in out
    assert cli.main(["study", "run", "a", "--size", "quick", "--every", "5", "--dry-run"]) == 2
    assert "series studies: d" in capsys.readouterr().err
    # more guests than this host holds: refused before anything is recorded, with the arithmetic
    assert cli.main(["study", "run", "d", "--size", "quick", "--guests", "64", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "--guests 64: " in err and "allowed: --guests 1 to " in err
    with ResultStore() as store:
        assert store.list_runs() == []


def record_guests(store: ResultStore, values: dict[str, list[float]], *, started_at: float,
                  profile: str = "virtio-file") -> int:
    """A completed run of N guests as the executor stores it: each guest's and bare-metal process's figure as
    instances 1..N, the run's rows their sums."""
    from cloudbox.core.record.provenance import Guests, GuestStart, Provenance

    prof = profiles.find_profile(profile)
    n = len(next(iter(values.values())))
    rid = store.create_run(profile_name=profile, profile_hash=prof.hash, suite="storage", size_label="quick",
                           accelerator="tcg", started_at=started_at, node=platform.node(), emulated=True,
                           provenance=Provenance(guests=Guests(count=n, guests=[GuestStart(name=f"g{k}")
                                                                                for k in range(1, n + 1)])))
    for test, each in values.items():
        for k, v in enumerate(each, 1):
            store.add_measurement(rid, side="baseline", test=test, metric="MB/s", value=100.0 + k, instance=k,
                                  started_at=started_at + k / 100)
            store.add_measurement(rid, side="guest", test=test, metric="MB/s", value=v, instance=k,
                                  started_at=started_at + k / 100)
        store.add_measurement(rid, side="baseline", test=test, metric="MB/s", value=sum(100.0 + k for k in
                                                                                      range(1, n + 1)))
        store.add_measurement(rid, side="guest", test=test, metric="MB/s", value=sum(each))
    store.finish_run(rid, "completed")
    return rid


def test_a_series_of_two_guests_spreads_over_time_and_over_instances():
    """Study D's quick plan runs two guests at once: each guest's number is a sample beside its own bare-metal
    process's, the table counts repeats (not samples), and the report adds each guest over time and the spread
    between the guests within a repeat. A run of one guest is not one of this series' repeats."""
    d = loading.find_study("d")
    tests = D_TESTS
    with ResultStore() as store:
        lone = record(store, dict.fromkeys(tests, 99.0), started_at=T0 - 60)
        a = record_guests(store, dict.fromkeys(tests, [10.0, 14.0]), started_at=T0)
        b = record_guests(store, dict.fromkeys(tests, [12.0, 12.0]), started_at=T0 + 60)
        done = store.list_runs(state="completed")
    ev = evidence.gather(d, done)
    samples = ev.series[("virtio-file", "seq-write-2m")]
    assert [(x.run_id, x.instance, x.value, x.baseline) for x in samples] == [
        (a, 1, 10.0, 101.0), (a, 2, 14.0, 102.0), (b, 1, 12.0, 101.0), (b, 2, 12.0, 102.0)]
    assert lone not in {x.run_id for x in samples}
    # the test's table takes the latest repeat of the series' guest count, labelled as the two guests' sum
    cell = ev.cells[("virtio-file", "seq-write-2m")]
    assert cell.run_id == b and cell.guest.value == 24.0 and "sum of 2 guests" in cell.qualifiers
    with ResultStore() as store:
        states = {(c.profile, c.test): c for c in cellstates.cell_states(d, store.list_runs(), ev.cells,
                                                                      series=ev.series)}
    assert states[("virtio-file", "seq-write-2m")].series_text == "2 of 5 repeats"  # repeats, not samples
    md = markdown.to_markdown(ev)
    row = next(line for line in md.splitlines() if line.startswith("| virtio-file | seq-write-2m |"))
    # 2 of 5 repeats of 2 guests: 4 samples, median 12.0, range 10 - 14; bare metal's median of 101, 102, 101, 102
    assert row.startswith("| virtio-file | seq-write-2m | 2 of 5 (quick, 2 guests each) | 12.0 (emulated, quick) "
                          "MB/s |"), row
    assert "| 10.0 - 14.0 | 101.5 (quick) |" in row
    assert "over those instances: each guest's number is one sample" in md
    # g1: 10, 12 (median 11, CV 1.414/11 = 12.9 %); g2: 14, 12 (13, 10.9 %); within repeat a: 4 / 12 = 33.3 %,
    # b: 0 %: median 16.7 %; Jain's index a: 24^2 / (2 * 296) = 0.973, b: 1: median 0.986
    assert ("virtio-file seq-write-2m by guest over time (MB/s): g1 median 11.0, CV 12.9%; g2 median 13.0, CV "
            "10.9%. Within a repeat, (max - min) / mean of the guests: median 16.7% (largest 33.3%); Jain's "
            "fairness index median 0.986.") in md
    assert f"runs #{a}, #{b}, 2 guests each" in md
    assert "| 24.0 (emulated, quick, sum of 2 guests) |" in md and "203.0 (quick, sum of 2 processes)" not in md
    assert "| 203.0 (sum of 2 processes) |" in md and "(sum of 2 guests): the run had 2 guests at once" in md
    page = html.to_html(ev)
    assert "2 repeats over time" in page and f"run #{a}, guest 2: 14.0" in page
    assert "histogram of 4 samples (2 repeats x 2 guests)" in page
    # a matrix study's cells never take a run of N guests: its rows are sums, the papers' one instance's
    a_study = loading.find_study("a")
    with ResultStore() as store:
        record_guests(store, {"dd-write-64k": [5.0, 6.0]}, started_at=T0, profile="eucalyptus-default")
        assert ("eucalyptus-default", "dd-write-64k") not in evidence.gather(a_study, store.list_runs()).cells
        one = record(store, {"dd-write-64k": 2.0}, started_at=T0 + 1, profile="eucalyptus-default")
        assert evidence.gather(a_study, store.list_runs()).cells[("eucalyptus-default", "dd-write-64k")].run_id == one
