"""Tail latency from fio's completion-latency histograms (core.record.latency): fio's bin layout, one real job's
percentiles against fio's own, two real jobs' merged histograms against the percentiles of their pooled latencies
(fio's per-I/O latency logs), the store keeping each sample's histogram (old stores unchanged), and the merged
percentiles and the latency a queue-depth-1 guest adds shown by `results show`, `results compare` and the exports."""

from __future__ import annotations

import csv
import io
import json
import math
import random
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest

from cloudbox.core.bench import fio
from cloudbox.core.bench.result import FioResult
from cloudbox.core.errors import CloudboxError
from cloudbox.core.record import latency, schema, stats
from cloudbox.core.record.latency import Histogram, bin_index, bin_low, bin_value, bin_width
from cloudbox.core.record.results import ResultStore
from cloudbox.core.record.rows import Repetition, Run
from cloudbox.core.spec import catalogue
from cloudbox.core.views import compare, render, rundetail

DATA = Path(__file__).parent / "data"
needs_fio = pytest.mark.skipif(shutil.which("fio") is None, reason="needs fio")


# ------------------------------------------------------------------------------------------------ fio's bins
def test_the_bins_are_fios_log_linear_layout():
    # below 128 ns a bin per ns; then 64 bins per power of two, named by their midpoint
    assert [bin_index(v) for v in (0, 1, 63, 64, 127)] == [0, 1, 63, 64, 127]
    assert (bin_index(128), bin_low(128), bin_width(128), bin_value(128)) == (128, 128, 2, 129)
    assert bin_index(129) == 128 and bin_index(130) == 129
    # 1000 ns: highest bit 512, the 6 bits under it 111101 (61), 3 bits dropped: 512 + 61 x 8, 8 ns wide
    assert (bin_index(1000), bin_low(bin_index(1000)), bin_width(bin_index(1000))) == (4 * 64 + 61, 1000, 8)
    assert bin_value(bin_index(1000)) == 1004
    # every bin: its values map back to it, the next one starts where it ends, its name is inside it
    for i in range(latency.PLAT_NR):
        lo, w = bin_low(i), bin_width(i)
        assert bin_index(lo) == i and bin_index(lo + w - 1) == i and bin_index(bin_value(i)) == i
        if i < latency.PLAT_NR - 1:
            assert bin_low(i + 1) == lo + w
        assert w / max(lo, 1) <= 1 / 64 or i < 2 * latency.PLAT_VAL
    assert bin_index(10**12) == latency.PLAT_NR - 1  # 1000 s: the last bin takes everything above
    with pytest.raises(ValueError, match="not negative"):
        bin_index(-1)


def test_fios_bins_read_merge_store_and_refuse_another_layout():
    h = Histogram.from_fio({"129": 3, "1004": 1, "5": 2})
    assert h.bins == ((5, 2), (128, 3), (317, 1)) and h.total == 6
    assert Histogram.from_stored(h.to_stored()) == h == Histogram.from_stored(json.dumps(h.to_stored()))
    assert Histogram.merged([h, h]).bins == ((5, 4), (128, 6), (317, 2))
    with pytest.raises(ValueError, match="'130' is not the midpoint"):
        Histogram.from_fio({"130": 1})  # a bin of fio 2.x's microsecond layout, or of another build
    with pytest.raises(ValueError, match="whole number"):
        Histogram.from_fio({"129": -1})
    with pytest.raises(ValueError, match='"unit": "ns"'):
        Histogram.from_stored({"unit": "us", "bins": {}})
    assert latency.loaded("not json") is None and latency.loaded(None) is None


def test_a_percentile_is_the_first_bin_whose_running_count_reaches_it():
    h = Histogram.from_counts({10: 50, 20: 49, 30: 1})  # 100 I/Os
    assert [h.percentile(p) for p in (1, 50, 50.5, 99, 99.9, 100)] == [10, 10, 20, 20, 30, 30]
    with pytest.raises(ValueError, match="empty"):
        Histogram(()).percentile(50)


def test_merging_is_not_averaging_percentiles():
    """A repeat whose tail is slow: averaging its p99 with a quiet one's halves the tail; the merged histogram keeps
    it where the pooled I/Os put it."""
    quiet = Histogram.from_counts({bin_index(40_000): 990, bin_index(60_000): 10})
    slow = Histogram.from_counts({bin_index(40_000): 900, bin_index(5_000_000): 100})
    merged = Histogram.merged([quiet, slow])
    pooled = sorted([40_000] * 1890 + [60_000] * 10 + [5_000_000] * 100)
    assert bin_index(pooled[math.ceil(0.99 * len(pooled)) - 1]) == merged.percentile_bin(99)
    assert merged.percentile(99) == bin_value(bin_index(5_000_000))
    assert (quiet.percentile(99) + slow.percentile(99)) / 2 < merged.percentile(99) / 1.9


# ------------------------------------------------------------------------------------------------ real fio
def _fio(tmp_path: Path, name: str, bs: str, io_size: str, log: Path | None = None) -> dict:
    """One real fio job (random reads through the page cache of a file in tmp_path), its json+ job."""
    args = ["fio", f"--name={name}", f"--filename={tmp_path / 'data'}", "--size=16m", "--rw=randread", f"--bs={bs}",
            f"--io_size={io_size}", "--ioengine=psync", "--output-format=json+"]
    if log is not None:
        args += [f"--write_lat_log={log}", "--log_avg_msec=0"]
    out = subprocess.run(args, capture_output=True, text=True, check=True, timeout=120).stdout
    return json.loads(out[out.index("{"):])["jobs"][0]


def _logged(prefix: Path) -> list[int]:
    """fio's per-I/O completion latencies (ns) from its clat log: time, value, direction, size, offset a line."""
    (path,) = prefix.parent.glob(prefix.name + "_clat.*.log")
    return [int(line.split(",")[1]) for line in path.read_text().splitlines() if line.strip()]


@needs_fio
def test_one_jobs_percentiles_are_fios_own(tmp_path: Path):
    clat = _fio(tmp_path, "one", "4k", "40m")["read"]["clat_ns"]
    h = Histogram.from_fio(clat["bins"])
    assert h.total == clat["N"] > 10_000
    own = {float(p): v for p, v in clat["percentile"].items()}
    assert {50.0, 99.0, 99.9} <= set(own)
    for p, v in own.items():  # within one bin's width of fio's (read as fio reads it: the same bin)
        assert abs(h.percentile(p) - v) <= bin_width(bin_index(v)), p
        assert h.percentile(p) == v, p
    res = fio.parse_fio("randread-4k-qd1", json.dumps({"jobs": [_fio(tmp_path, "again", "4k", "4m")]}))
    assert res.latency is not None and res.latency.total == 1024


@needs_fio
def test_two_jobs_merged_are_their_pooled_latencies_percentiles(tmp_path: Path):
    """Two real jobs of different request sizes (two repeats, two guests): their histograms summed give, for p50,
    p99 and p99.9, the bin of the pooled I/Os' own percentile, as fio's logs of every I/O's latency give it."""
    logs = [tmp_path / "a", tmp_path / "b"]
    jobs = [_fio(tmp_path, "a", "4k", "40m", logs[0]), _fio(tmp_path, "b", "64k", "160m", logs[1])]
    hists = [Histogram.from_fio(j["read"]["clat_ns"]["bins"]) for j in jobs]
    values = [_logged(p) for p in logs]
    assert [h.total for h in hists] == [len(v) for v in values] == [j["read"]["total_ios"] for j in jobs]
    merged = Histogram.merged(hists)
    pooled = sorted(values[0] + values[1])
    for p in (*latency.PERCENTILES, 1.0, 90.0):
        truth = pooled[math.ceil(p / 100 * len(pooled)) - 1]  # the smallest latency with p% of I/Os at or below
        assert abs(merged.percentile(p) - truth) <= bin_width(merged.percentile_bin(p)), p
        assert merged.percentile_bin(p) == bin_index(truth), p


@needs_fio
def test_a_random_test_runs_with_json_plus_on_bare_metal_and_a_sequential_one_without(tmp_path: Path):
    from cloudbox.core.bench import runners

    t = catalogue.TESTS["randread-4k-qd1"]
    assert "--output-format=json+" in fio.fio_args(t, "/dev/vdb", 1 << 20, 5)
    assert "--output-format=json" in fio.fio_args(catalogue.TESTS["seq-write-64k"], "/dev/vdb", 1 << 20, 5)
    assert "--output-format=json" in fio.fio_args(t, "/dev/vdb", 1 << 20, 5, fill=True)
    assert "output-format" not in fio.fio_job_file(t, "/dev/vdb", 1 << 20, 5)
    try:
        res = runners.HostRunner(lambda: False).run(t, str(tmp_path / "file"), 4 << 20, 1, lambda _p: None)
    except CloudboxError as e:  # a file system without O_DIRECT (tmpfs before Linux 6.6)
        pytest.skip(f"fio with O_DIRECT in {tmp_path}: {e}")
    (job,) = [j["read"] for j in json.loads(res.raw)["jobs"] if j["jobname"] != fio.WARMUP_JOB]  # after its warm-up
    assert res.latency is not None and res.latency.total == job["total_ios"] > 0
    assert res.latency.percentile(50) == job["clat_ns"]["percentile"]["50.000000"]


def test_fios_json_without_bins_has_no_histogram_and_bad_bins_name_the_test():
    side = {"io_bytes": 4096, "bw_bytes": 4096, "iops": 1.0, "runtime": 1000, "clat_ns": {"mean": 1000.0}}
    assert fio.parse_fio("randread-4k-qd1", json.dumps({"jobs": [{"read": side}]})).latency is None
    bad = {**side, "clat_ns": {"mean": 1.0, "bins": {"130": 1}}}
    with pytest.raises(CloudboxError, match=r"fio \(randread-4k-qd1\) read: clat_ns.bins: '130'"):
        fio.parse_fio("randread-4k-qd1", json.dumps({"jobs": [{"read": bad}]}))


# ------------------------------------------------------------------------------------------------ stored
def _hist(rng: random.Random, median_us: float, n: int = 4000) -> Histogram:
    """n latencies around `median_us` with a long right tail, counted in fio's bins."""
    counts: dict[int, int] = {}
    for _ in range(n):
        idx = bin_index(int(median_us * 1000 * math.exp(rng.gauss(0.0, 0.25)) + rng.expovariate(1 / 3000.0)))
        counts[idx] = counts.get(idx, 0) + 1
    return Histogram.from_counts(counts)


QD1, QD32, SEQ = "randread-4k-qd1", "randwrite-4k-qd32", "seq-write-64k"


def add_latency_run(store: ResultStore, repeats: int = 3, guests: int = 1, seed: int = 5) -> tuple[int, dict]:
    """A run of `guests` guests measuring QD1 and QD32 random tests `repeats` times a side (ABAB), guest latencies
    about 50 µs over bare metal's 40 at QD1, each sample with its histogram; and a sequential test. Returns the run
    and every stored histogram by (side, test, repeat, instance)."""
    rng = random.Random(seed)
    rid = store.create_run(profile_name="virtio-disk", suite="storage", size_label="quick", accelerator="kvm",
                           state="completed")
    kept: dict = {}
    for k in range(1, repeats + 1):
        rep = Repetition(k, 1, k).columns()
        for side in ("baseline", "guest"):
            for test, base_us in ((QD1, 40.0), (QD32, 300.0)):
                us = base_us + (50.0 if side == "guest" else 0.0) + rng.uniform(-2, 2)
                hists = [_hist(rng, us) for _ in range(guests)]
                for g, h in enumerate(hists, 1):
                    inst = g if guests > 1 else None
                    kept[(side, test, k, inst)] = h
                    store.add_measurement(rid, side=side, test=test, metric="IOPS", value=1e6 / us, instance=inst,
                                          **rep)
                    store.add_measurement(rid, side=side, test=test, metric="lat_us", value=us, instance=inst,
                                          clat_hist=h, **rep)
                if guests > 1:  # the run's own rows: the sum, the mean latency, no histogram
                    store.add_measurement(rid, side=side, test=test, metric="IOPS", value=guests * 1e6 / us, **rep)
                    store.add_measurement(rid, side=side, test=test, metric="lat_us", value=us, **rep)
            store.add_measurement(rid, side=side, test=SEQ, metric="MB/s", value=100.0 + k, **rep)
    return rid, kept


def test_each_samples_histogram_is_stored_and_merged_over_repeats_and_guests(tmp_path: Path):
    with ResultStore(tmp_path / "r.db") as store:
        rid, kept = add_latency_run(store, repeats=3, guests=2)
        run = store.get_run(rid)
        listed = store.list_runs()[0]
    lat = run.latency("guest", QD1)
    assert lat is not None and lat.n == 3
    want = Histogram.merged(h for (side, test, _, _), h in kept.items() if (side, test) == ("guest", QD1))
    assert lat.merged == want and lat.ios == 6 * 4000
    assert lat.repeats[1] == Histogram.merged([kept[("guest", QD1, 2, 1)], kept[("guest", QD1, 2, 2)]])
    one = run.latency("guest", QD1, instance=2)
    assert one is not None and one.merged == Histogram.merged(kept[("guest", QD1, k, 2)] for k in (1, 2, 3))
    assert run.latency("guest", SEQ) is None
    assert listed.latency("guest", QD1) == lat  # a listed run reads the same histograms
    # the export with --raw carries each sample's histogram; re-adding it (a node's run mirrored) keeps it
    rows = [m.as_dict(raw=True) for m in run.measurements if m.clat_hist]
    assert rows and all(r["clat_hist"]["unit"] == "ns" for r in rows)
    assert "clat_hist" not in run.measurements[0].as_dict(raw=False)
    with ResultStore(tmp_path / "front.db") as front:
        again = front.create_run(suite="storage")
        for m in rows:
            front.add_measurement(again, **{k: m[k] for k in ("side", "test", "metric", "value", "instance",
                                                              "repeat", "boot", "iteration", "clat_hist")})
        assert front.get_run(again).latency("guest", QD1) == lat
    with pytest.raises(ValueError, match="clat_hist"):
        ResultStore(tmp_path / "r.db").add_measurement(rid, side="guest", test=QD1, metric="lat_us", value=1.0,
                                                       clat_hist={"bins": {}})


def test_the_measurement_path_stores_a_random_tests_histogram_on_its_latency_row(tmp_path: Path):
    import contextlib

    from cloudbox.core.record.provenance import Provenance
    from cloudbox.core.run.context import RunContext, RunControl
    from cloudbox.core.run.measure import Ran, storage_test, storage_test_many
    from cloudbox.core.run.sink import EventSink
    from cloudbox.core.spec.profiles import resolve_profile
    from cloudbox.core.spec.runspec import QUICK_SIZE, RunSpec

    t, t32 = catalogue.TESTS[QD1], catalogue.TESTS[QD32]
    h = _hist(random.Random(1), 40.0, 500)
    res = FioResult(t.id, 1.0, 250.0, 41.0, 1.0, "{}", latency=h)
    res32 = FioResult(t32.id, 1.0, 250.0, 41.0, 1.0, "{}", latency=h)
    with ResultStore(tmp_path / "r.db") as store:
        spec = RunSpec(profile="virtio-disk", guests=2)
        rid = store.create_run(uuid="0" * 32, profile_name=spec.profile, suite="storage", state="running")
        ctx = RunContext(spec, resolve_profile(spec.profile), QUICK_SIZE, "quick", "0" * 32, rid, store,
                         EventSink(store, rid), RunControl(), contextlib.ExitStack(), Provenance())
        storage_test(ctx, "guest", t, lambda: res)
        storage_test_many(ctx, "guest", t32, [lambda _c: Ran(res32, 1.0, 2.0)] * 2)
        run = store.get_run(rid)
    hist_rows = [(m.test, m.metric, m.instance) for m in run.measurements if m.histogram is not None]
    assert hist_rows == [(QD1, "lat_us", None), (QD32, "lat_us", 1), (QD32, "lat_us", 2)]
    one, two = run.latency("guest", QD1), run.latency("guest", QD32)
    assert one is not None and one.merged == h
    assert two is not None and two.merged == Histogram.merged([h, h])  # the guests', not the sum row's


def test_an_old_store_upgrades_and_reads_without_histograms(tmp_path: Path):
    copy = tmp_path / "results.db"
    shutil.copy(DATA / "results-2026-12.db", copy)
    with sqlite3.connect(f"file:{DATA / 'results-2026-12.db'}?mode=ro", uri=True) as c:
        assert c.execute("PRAGMA user_version").fetchone()[0] < 6
    with ResultStore(copy) as store:
        assert store.schema_version == schema.SCHEMA_VERSION == 6
        runs = [store.get_run(i) for i in store.run_ids()]
    assert any(m.test == "randread-4k-qd32" for r in runs for m in r.measurements)  # a random test, before them
    for run in runs:
        assert all(m.clat_hist is None and m.histogram is None for m in run.measurements)
        assert all(run.latency(side, t) is None for side in ("guest", "baseline") for t in run.tests())
        table = compare.compare_table([run])
        assert all(not s.latency for s in table.sections)
        assert "completion latency" not in render.to_text(table) + rundetail.run_detail(run, [])
        body = list(csv.reader(io.StringIO(render.to_csv(table))))[1:]
        assert all(r[-7:] == [""] * 7 for r in body)


# ------------------------------------------------------------------------------------------------ shown
@pytest.fixture
def latency_run(tmp_path: Path) -> tuple[Path, Run]:
    with ResultStore(tmp_path / "results.db") as store:
        rid, _ = add_latency_run(store, repeats=4)
        return store.path, store.get_run(rid)


def test_compare_shows_a_latency_line_per_random_test_with_the_qd1_latency_added(latency_run):
    _, run = latency_run
    table = compare.compare_table([run])
    g, b = run.latency("guest", QD1), run.latency("baseline", QD1)
    assert g is not None and b is not None
    add = run.added_latency(QD1)
    assert add is not None and add.us == g.p50 - b.p50 and 40 < add.us < 60
    # the interval: the rank-sum one over the four repeats' own p50s a side (exact 95% from 4 + 4)
    assert add.shift == stats.shift(g.repeat_us(50.0), b.repeat_us(50.0))
    assert add.shift is not None and add.shift.method == "rank-sum" and add.shift.low < add.us < add.shift.high
    qd1 = table.section(QD1)
    assert qd1 is not None and qd1.metric == "IOPS"
    assert qd1.latency == [
        compare.LATENCY_HEAD + ":",
        f"#{run.id}: bare metal {b.text()} (n=4), guest {g.text()} (n=4); added at p50 {add.text()}"]
    assert add.text().startswith(f"+{add.us:.1f} µs [+") and add.text().endswith("] n=4+4")
    qd32 = table.section(QD32)
    assert qd32 is not None and len(qd32.latency) == 2 and "added" not in qd32.latency[1]
    seq = table.section(SEQ)
    assert seq is not None and seq.latency == []
    text = render.to_text(table)
    assert max(len(line) for line in text.splitlines()) <= 80
    flat = " ".join(text.split())
    assert f"bare metal {b.text()} (n=4), guest {g.text()} (n=4); added at p50 {add.text()}" in flat
    # beside IOPS: the latency lines follow their test's rows, before the next section
    after = text[text.index(catalogue.test_title(QD1)):]
    assert after.index(f"#{run.id}: bare metal") < after.index("\n\n")
    md = render.to_markdown(table)
    assert f"- #{run.id}: bare metal {b.text()} (n=4), guest {g.text()} (n=4); added at p50 {add.text()}" in (
        md.replace("\\+", "+"))


def test_show_and_the_exports_carry_the_merged_percentiles(latency_run, cli_run):
    path, run = latency_run
    g, b = run.latency("guest", QD1), run.latency("baseline", QD1)
    add = run.added_latency(QD1)
    assert g is not None and b is not None and add is not None
    code, out, _ = cli_run(["results", "--db", str(path), "show", str(run.id)])
    assert code == 0 and f"guest {g.text()} (n=4); added at p50" in " ".join(out.split())
    code, out, _ = cli_run(["results", "--db", str(path), "compare", str(run.id), "--format", "csv"])
    rows = {(r["test"], r["row"]): r for r in csv.DictReader(io.StringIO(out))}
    assert tuple(render.CSV_FIELDS[-7:]) == ("lat_p50_us", "lat_p99_us", "lat_p99_9_us", "lat_ios", "added_p50_us",
                                             "added_low_us", "added_high_us")
    guest, base = rows[(QD1, "guest")], rows[(QD1, "baseline")]
    assert float(guest["lat_p50_us"]) == round(g.p50, 3) and float(guest["lat_p99_9_us"]) == round(g.p999, 3)
    assert float(base["lat_p99_us"]) == round(b.p99, 3) and int(base["lat_ios"]) == b.ios == 4 * 4000
    assert float(guest["added_p50_us"]) == round(add.us, 3) and add.shift is not None
    assert float(guest["added_low_us"]) == round(add.shift.low or 0, 3) and base["added_p50_us"] == ""
    assert rows[(QD32, "guest")]["lat_p50_us"] and rows[(QD32, "guest")]["added_p50_us"] == ""
    assert rows[(SEQ, "guest")]["lat_p50_us"] == ""
    code, out, _ = cli_run(["results", "--db", str(path), "export", str(run.id)])
    figs = {(f["side"], f["test"], f["metric"]): f for f in json.loads(out)["runs"][0]["figures"]}
    lat = figs[("guest", QD1, "lat_us")]["latency"]
    assert (lat["p50_us"], lat["p99_us"], lat["p99_9_us"], lat["n"]) == (g.p50, g.p99, g.p999, 4)
    assert lat["repeat_p50_us"] == g.repeat_us(50.0)
    assert lat["added_p50"]["us"] == add.us and lat["added_p50"]["method"] == "rank-sum"
    assert "added_p50" not in figs[("baseline", QD1, "lat_us")]["latency"]
    assert "added_p50" not in figs[("guest", QD32, "lat_us")]["latency"]
    assert "latency" not in figs[("guest", QD1, "IOPS")]


def test_n_guests_latency_merges_the_guests_and_each_guests_row_has_its_own(tmp_path: Path):
    with ResultStore(tmp_path / "r.db") as store:
        rid, _ = add_latency_run(store, repeats=1, guests=3)
        run = store.get_run(rid)
    table = compare.compare_table([run])
    section = table.section(QD1)
    assert section is not None
    g = run.latency("guest", QD1)
    assert g is not None and g.n == 1 and g.ios == 3 * 4000
    assert f"guest {g.text()} (3 guests)" in section.latency[1] and "bare metal" in section.latency[1]
    assert "(3 processes)" in section.latency[1]
    each = [r for r in section.rows if r.kind == "guest" and r.cells["run"].startswith(f"#{rid} g")]
    assert [r.latency for r in each] == [run.latency("guest", QD1, k) for k in (1, 2, 3)]
    add = run.added_latency(QD1)
    assert add is not None and add.text() == f"{add.us:+.1f} µs"  # one sample a side: no interval to give


def test_a_shift_interval_covers_the_true_shift_93_to_97_percent_of_the_time():
    """The latency added's interval (stats.shift over the repeats' p50s): guest = bare metal + 50 in distribution,
    8 + 8 skewed samples, 1,000 times."""
    rng = random.Random(11)
    hits = 0
    for _ in range(1000):
        base = [40 * math.exp(rng.gauss(0, 0.3)) for _ in range(8)]
        guest = [50 + 40 * math.exp(rng.gauss(0, 0.3)) for _ in range(8)]
        s = stats.shift(guest, base)
        assert s is not None and s.method == "rank-sum" and s.low is not None and s.high is not None
        hits += s.low <= 50 <= s.high
    assert 0.93 <= hits / 1000 <= 0.97, hits
    few = stats.shift([5.0, 6.0], [1.0, 2.0])
    assert few is not None and few.method == "range" and (few.low, few.high) == (3.0, 5.0)
    assert few.coverage == pytest.approx(1 - 2 / 6)
    assert stats.shift([5.0], [1.0]) == stats.Shift(4.0, None, None, 1, 1, "")
    assert stats.shift([], [1.0]) is None
