"""One test, measured and stored: its step, the tool run, its measurement rows and the measurement event; a
storage test also with the host disk's counters over exactly the test's window (iostat over the whole test), a
random one with its completion-latency histogram (each guest's of N, their merge being the views'), a read
test after the page caches were dropped. A repeated test passes each sample's Repetition (its place, guest boot
and iteration), stored with its rows and event; without one a test is its figure's next sample (its only one, in a
run that measures each test once). What a run records of how its samples start (the caches, the timed tests'
warm-up) is said here too."""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ..bench import nettests, runners
from ..bench.fio import warmup_s
from ..bench.result import FioResult
from ..disks.diskstats import Counters, delta, read_counters
from ..record import latency
from ..record.events import MeasurementEvent
from ..record.latency import Histogram
from ..record.provenance import Caches, SteadyState
from ..record.rows import Repetition
from ..spec import catalogue
from .context import RunContext, host_labels

T = TypeVar("T")
Drop = Callable[[], object]  # drops a guest's page cache; False when it could not


def _test_labels_after_drops(ctx: RunContext, side: str, t: catalogue.StorageTest, drops: Sequence[Drop]) -> list[str]:
    """A storage test's labels on `side`; before a read, the host's and the guests' (`drops`) page caches dropped,
    a drop that fails labelled warm-cache."""
    ctx.control.check()
    tl = list(dict.fromkeys([*ctx.labels, *t.labels]))
    if side == "baseline":
        tl = host_labels([*tl, *ctx.backing.baseline_labels], dom0=ctx.dom0)
    if "read" in t.rw:
        warm = not runners.drop_host_caches()
        for drop in drops:
            warm = drop() is False or warm
        if warm:
            tl.append("warm-cache")
    return tl


DROP_CACHES = "/proc/sys/vm/drop_caches"


def caches(ctx: RunContext) -> Caches:
    """How the run's read tests start: this host's page cache (and with it a volume's server's on this host) and the
    guest's dropped before every read sample, or why one is not."""
    if os.access(DROP_CACHES, os.W_OK):
        host = (f"dropped before every read sample, bare metal's and the guest's (sync, then 3 > {DROP_CACHES}); a "
                "drop that fails labels the sample warm-cache")
    else:
        host = f"not dropped: this process cannot write {DROP_CACHES} (not root); read samples are labelled warm-cache"
    guest = ("dropped before every read sample through its agent (sync, then 3 > drop_caches)"
             + (", and before bare metal's while it idles" if ctx.spec.repeated else "")
             + "; a guest that cannot labels the sample warm-cache")
    v, server = ctx.volume, ""
    if v is not None:
        elsewhere = ctx.spec.volume_uri or ctx.spec.nfs_host or v.served_by_front_end
        server = (f"the volume's server ({v.server or v.scheme}) is the front-end: its page cache under the volume is "
                  "not dropped from here, so a read of data it still holds is served from its memory"
                  if elsewhere else
                  f"the volume's server ({v.server or v.scheme}) runs on this host: its page cache is dropped with "
                  "the host's")
    return Caches(host=host, guest=guest, server=server)


def steady_state(ctx: RunContext) -> SteadyState | None:
    """The timed tests' warm-up (a fio job of its own, core.bench.fio.warmup_s), or None when the run has none."""
    timed = [t.id for t in catalogue.resolve_tests(ctx.spec.storage_tests) if t.timed and t.tool == "fio"] \
        if ctx.spec.wants_storage else []
    if not timed:
        return None
    ramp = warmup_s(ctx.runtime)
    return SteadyState(method="warmup", seconds=ramp, tests=timed,
                       note=f"each sample runs the same I/O for {ramp} s first (a fio job of its own, not counted), "
                            f"then its measured job over the whole size for at most {ctx.runtime} s")


def _at(rep: Repetition | None) -> dict[str, Any]:
    """The repetition columns of a sample's rows and event: none for a test measured once (the store numbers it).
    (Any: mypy would check these ints against every keyword add_measurement has, its histogram's among them.)"""
    return {} if rep is None else rep.columns()


HOST_METRICS = ("host_mbps", "host_avgrq_sectors", "host_avgqu", "host_util")


def _disk_counters(ctx: RunContext) -> tuple[str | None, Counters | None]:
    """The host disk's counters at a test's start (the 1 s sampler feeds the live timeline; a measurement gets the
    counters over exactly its window). None for a device the host no longer has: an NVMe controller handed to the
    guest (disk.backing = nvme-pci) leaves the host with it."""
    device = ctx.sampler.device if ctx.sampler else None
    try:
        return device, read_counters(device) if device else None
    except KeyError:
        return device, None


def _host_metrics(device: str | None, c0: Counters | None) -> dict[str, float | None]:
    """The host disk's MB/s, request size, queue depth and utilisation since `c0` (all None without a device, or
    when it went during the window)."""
    if not device or c0 is None:
        return dict.fromkeys(HOST_METRICS)
    try:
        c1 = read_counters(device)
    except KeyError:
        return dict.fromkeys(HOST_METRICS)
    d = delta(c0, c1, device)
    return {"host_mbps": d.read_mbps + d.write_mbps, "host_avgrq_sectors": d.avgrq_sectors, "host_avgqu": d.avgqu,
            "host_util": d.util}


def _in_window(ctx: RunContext, side: str, t: catalogue.StorageTest, step: str,
               work: Callable[[], T]) -> tuple[T, float, float, dict[str, float | None]]:
    """`work` as `t`'s step on `side`, the run's current test meanwhile: what it returned, its window in host time, and
    the host disk's metrics over that window."""
    ctx.current_test = f"{side}:{t.id}"
    ctx.sink.step(step, side=side, test=t.id)
    device, c0 = _disk_counters(ctx)
    start = time.time()
    out = work()
    end = time.time()
    ctx.current_test = "idle"
    return out, start, end, _host_metrics(device, c0)


def _rounded(host: dict[str, float | None]) -> tuple[float | None, float | None, float | None, float | None]:
    """The host disk's metrics as a MeasurementEvent carries them: HOST_METRICS in order, to two decimals."""
    r = {k: None if v is None else round(v, 2) for k, v in host.items()}
    return r["host_mbps"], r["host_avgrq_sectors"], r["host_avgqu"], r["host_util"]


def storage_test(ctx: RunContext, side: str, t: catalogue.StorageTest, run: Callable[[], FioResult],
                 guest_drop: Drop = lambda: None, note: str = "", labels: Sequence[str] = (),
                 rep: Repetition | None = None, where: str = "") -> FioResult:
    """`run` measures `t` on `side`; read tests start with the page caches dropped (else labelled warm-cache).
    `note` (why it was measured again) goes into the raw output; `labels` (how this test was measured) join the
    run's; `rep` is where this sample stands among the test's repeats, `where` says so in its step ("repeat 2 of
    8"). Returns what the tool measured."""
    tl = [*_test_labels_after_drops(ctx, side, t, (guest_drop,)), *labels]
    res, start, end, host = _in_window(ctx, side, t, f"{side}: {t.id}" + (f" ({where})" if where else ""), run)

    def record(metric: str, value: float, raw: str, hist: Histogram | None = None) -> None:
        ctx.store.add_measurement(ctx.run_id, side=side, test=t.id, metric=metric, value=value, raw=raw, labels=tl,
                                  started_at=start, finished_at=end, host_mbps=host["host_mbps"],
                                  host_avgrq_sectors=host["host_avgrq_sectors"], host_avgqu=host["host_avgqu"],
                                  host_util=host["host_util"], clat_hist=hist, **_at(rep))

    raw = res.raw + (f"\n# cloudbox: {note}\n" if note else "")
    for metric, value in measured(res):
        record(metric, value, raw)
        raw = ""
    if t.timed:
        record("IOPS", res.iops, "")
        record(latency.METRIC, res.lat_us, "", res.latency)
    if not math.isnan(res.mbps):
        ctx.sink.emit(MeasurementEvent(side, t.id, "MB/s", round(res.mbps, 2), tuple(tl), round(res.iops, 1),
                                       *_rounded(host), **_at(rep)))
    return res


def measured(res: FioResult) -> list[tuple[str, float]]:
    """The figures a test stores: MB/s, then `extra` (IOzone's second pass; Bonnie++'s other figures), leaving out
    what the tool could not time (NaN, None: Bonnie++'s "+++++")."""
    rows = [("MB/s", res.mbps), *res.extra.items()]
    return [(m, v) for m, v in rows if v is not None and not math.isnan(v)]


def _net_raw(res: nettests.NetResult, notes: Sequence[str] = ()) -> str:
    """`res`'s raw output with "# cloudbox:" lines after it: a retry after hangs (the run's log says what was seen; the
    measurement keeps that it is a retry), then the result's notes and `notes`."""
    raw = res.raw
    if res.hung:
        raw += f"\n# cloudbox: measured on attempt {res.hung + 1}; {res.hung} before it hung and was killed\n"
    for n in [*res.notes, *notes]:
        raw += f"# cloudbox: {n}\n"
    return raw


def net_test(ctx: RunContext, side: str, t: catalogue.NetTest, run: Callable[[], nettests.NetResult],
             labels: list[str], note: str = "", rep: Repetition | None = None, where: str = "") -> nettests.NetResult:
    """`run` measures `t` on `side`; a retry after a hang, and what was seen and done, go into the raw output; `rep`
    is where this sample stands among the test's repeats, `where` says so in its step. Returns what was measured."""
    ctx.control.check()
    ctx.sink.step(f"{side}: {t.id} ({t.direction}" + (f", {where})" if where else ")"), side=side, test=t.id)
    start = time.time()
    res = run()
    end = time.time()
    tl = list(dict.fromkeys(labels))
    raw = _net_raw(res, [note] if note else [])

    def record(metric: str, value: float, raw: str) -> None:
        ctx.store.add_measurement(ctx.run_id, side=side, test=t.id, metric=metric, value=value, raw=raw, labels=tl,
                                  started_at=start, finished_at=end, **_at(rep))

    record(res.metric, res.value, raw)
    if res.lat_us is not None and t.kind == "TCP_RR":
        record("lat_us", res.lat_us, "")
    ctx.sink.emit(MeasurementEvent(side, t.id, res.metric, round(res.value, 2), tuple(tl), **_at(rep)))
    return res


@dataclass
class Ran:
    """One guest's (or bare-metal process's) part of a test run by N at once: its result and its window in host
    time (a guest's start is when its barrier let it go, on the host's clock)."""

    result: FioResult
    started_at: float
    finished_at: float


def storage_test_many(ctx: RunContext, side: str, t: catalogue.StorageTest,
                      runs: Sequence[Callable[[Callable[[], bool]], Ran]],
                      drops: tuple[Drop, ...] = (), rep: Repetition | None = None) -> list[Ran]:
    """`t` on `side` by N at once (runs[k](cancelled) measures instance k + 1 in a thread of its own): one row per
    instance, and the run's row: the sum of their MB/s and IOPS, their mean latency, the host disk's counters over
    the whole window. Any instance failing (or the run cancelled) stops the others and fails the test. `rep`: where
    this sample stands among the test's repeats (every instance's and the sum's)."""
    tl = _test_labels_after_drops(ctx, side, t, drops)
    parts, _, _, host = _in_window(ctx, side, t, f"{side}: {t.id} ({len(runs)} at once)", lambda: together(ctx, runs))

    def record(metric: str, value: float, raw: str, start: float, end: float, instance: int | None,
               metrics: dict[str, float | None], hist: Histogram | None = None) -> None:
        ctx.store.add_measurement(ctx.run_id, side=side, test=t.id, metric=metric, value=value, raw=raw, labels=tl,
                                  started_at=start, finished_at=end, instance=instance,
                                  host_mbps=metrics["host_mbps"], host_avgrq_sectors=metrics["host_avgrq_sectors"],
                                  host_avgqu=metrics["host_avgqu"], host_util=metrics["host_util"], clat_hist=hist,
                                  **_at(rep))

    none = dict.fromkeys(host)
    for k, p in enumerate(parts, 1):
        record("MB/s", p.result.mbps, p.result.raw, p.started_at, p.finished_at, k, none)
        for metric, value in p.result.extra.items():  # IOzone's second pass: re-write, re-read
            record(metric, value, "", p.started_at, p.finished_at, k, none)
        if t.timed:
            record("IOPS", p.result.iops, "", p.started_at, p.finished_at, k, none)
            record(latency.METRIC, p.result.lat_us, "", p.started_at, p.finished_at, k, none, p.result.latency)
    start, end = min(p.started_at for p in parts), max(p.finished_at for p in parts)
    mbps = sum(p.result.mbps for p in parts)
    record("MB/s", mbps, "", start, end, None, host)
    for metric in parts[0].result.extra:
        record(metric, sum(p.result.extra.get(metric, 0.0) for p in parts), "", start, end, None, host)
    if t.timed:
        record("IOPS", sum(p.result.iops for p in parts), "", start, end, None, host)
        record("lat_us", sum(p.result.lat_us for p in parts) / len(parts), "", start, end, None, host)
    for k, p in enumerate(parts, 1):
        ctx.sink.emit(MeasurementEvent(side, t.id, "MB/s", round(p.result.mbps, 2), tuple(tl),
                                       round(p.result.iops, 1), instance=k, **_at(rep)))
    ctx.sink.emit(MeasurementEvent(side, t.id, "MB/s", round(mbps, 2), tuple(tl),
                                   round(sum(p.result.iops for p in parts), 1), *_rounded(host), **_at(rep)))
    return parts


def storage_job(ctx: RunContext, side: str, t: catalogue.StorageTest,
                run: Callable[[], tuple[FioResult, list[FioResult]]],
                drops: tuple[Drop, ...] = (), what: str = "", rep: Repetition | None = None) -> FioResult:
    """`t` on `side` as one job of N processes (an MPI job: `run` returns its aggregate and each rank's figures):
    one row per rank, and the run's row with the job's own aggregate (not their sum: the job's bytes over its whole
    window), with the host disk's counters over that window; `rep`: where this sample stands among the test's
    repeats."""
    tl = _test_labels_after_drops(ctx, side, t, drops)
    ranks_note = f"{ctx.spec.guests} ranks" if side == "baseline" else f"{ctx.spec.guests} guests"
    step = f"{side}: {t.id} ({what or f'one MPI job, {ranks_note}'})"
    (total, ranks), start, end, host = _in_window(ctx, side, t, step, run)
    for k, r in enumerate(ranks, 1):
        for metric, value in measured(r):
            ctx.store.add_measurement(ctx.run_id, side=side, test=t.id, metric=metric, value=value, raw="", labels=tl,
                                      started_at=start, finished_at=end, instance=k, **_at(rep))
    raw = total.raw
    for metric, value in measured(total):
        ctx.store.add_measurement(ctx.run_id, side=side, test=t.id, metric=metric, value=value, raw=raw, labels=tl,
                                  started_at=start, finished_at=end, instance=None, host_mbps=host["host_mbps"],
                                  host_avgrq_sectors=host["host_avgrq_sectors"], host_avgqu=host["host_avgqu"],
                                  host_util=host["host_util"], **_at(rep))
        raw = ""
    for k, r in enumerate(ranks, 1):
        ctx.sink.emit(MeasurementEvent(side, t.id, "MB/s", round(r.mbps, 2), tuple(tl), instance=k, **_at(rep)))
    ctx.sink.emit(MeasurementEvent(side, t.id, "MB/s", round(total.mbps, 2), tuple(tl), None, *_rounded(host),
                                   **_at(rep)))
    return total


@dataclass
class NetRan:
    """One guest's (or bare-metal process's) part of a network test run by N at once, as Ran is for storage."""

    result: nettests.NetResult
    started_at: float
    finished_at: float


def net_test_many(ctx: RunContext, side: str, t: catalogue.NetTest,
                  runs: Sequence[Callable[[Callable[[], bool]], NetRan]], labels: list[str],
                  rep: Repetition | None = None) -> list[NetRan]:
    """`t` on `side` by N at once (runs[k](cancelled) measures instance k + 1 in a thread of its own): one row per
    instance, and the run's row: the sum of their throughput (Mbit/s, trans/s), their mean latency. Any instance
    failing (or the run cancelled) stops the others and fails the test. `rep`: where this sample stands among the
    test's repeats."""
    ctx.control.check()
    ctx.current_test = f"{side}:{t.id}"
    ctx.sink.step(f"{side}: {t.id} ({t.direction}, {len(runs)} at once)", side=side, test=t.id)
    parts = together(ctx, runs)
    ctx.current_test = "idle"
    tl = list(dict.fromkeys(labels))

    def record(metric: str, value: float, raw: str, start: float, end: float, instance: int | None) -> None:
        ctx.store.add_measurement(ctx.run_id, side=side, test=t.id, metric=metric, value=value, raw=raw, labels=tl,
                                  started_at=start, finished_at=end, instance=instance, **_at(rep))

    rr = t.kind == "TCP_RR"
    for k, p in enumerate(parts, 1):
        res = p.result
        record(res.metric, res.value, _net_raw(res), p.started_at, p.finished_at, k)
        if rr and res.lat_us is not None:
            record("lat_us", res.lat_us, "", p.started_at, p.finished_at, k)
    start, end = min(p.started_at for p in parts), max(p.finished_at for p in parts)
    metric, total = parts[0].result.metric, sum(p.result.value for p in parts)
    record(metric, total, "", start, end, None)
    lats = [p.result.lat_us for p in parts if p.result.lat_us is not None]
    if rr and lats:
        record("lat_us", sum(lats) / len(lats), "", start, end, None)
    for k, p in enumerate(parts, 1):
        ctx.sink.emit(MeasurementEvent(side, t.id, p.result.metric, round(p.result.value, 2), tuple(tl), instance=k,
                                       **_at(rep)))
    ctx.sink.emit(MeasurementEvent(side, t.id, metric, round(total, 2), tuple(tl), **_at(rep)))
    return parts


JOIN_EVERY_S = 0.2  # the run's thread looks for a cancellation this often while the instances run
STOP_GRACE_S = 60.0  # how long stopped instances get to notice and return before the run goes on without them


def together(ctx: RunContext, jobs: Sequence[Callable[[Callable[[], bool]], T]]) -> list[T]:
    """Run every job in a thread of its own at once and return their results in order. A job is given the
    `cancelled` it must poll: true once the run is cancelled or another job failed. The first failure is raised
    once every job has returned (or STOP_GRACE_S has passed)."""
    stop = threading.Event()
    results: list[T | None] = [None] * len(jobs)
    errors: list[BaseException] = []

    def cancelled() -> bool:
        return stop.is_set() or ctx.control.cancelled()

    def work(i: int, job: Callable[[Callable[[], bool]], T]) -> None:
        try:
            results[i] = job(cancelled)
        except BaseException as e:  # noqa: BLE001 - handed to the run's thread
            errors.append(e)
            stop.set()

    threads = [threading.Thread(target=work, args=(i, j), name=f"cloudbox-instance-{i + 1}", daemon=True)
               for i, j in enumerate(jobs)]
    for th in threads:
        th.start()
    try:
        while any(th.is_alive() for th in threads):
            ctx.control.check()
            for th in threads:
                th.join(JOIN_EVERY_S / len(threads))
    except BaseException:
        stop.set()
        _join(threads)
        raise
    if errors:
        raise errors[0]
    return [r for r in results if r is not None]


def _join(threads: list[threading.Thread]) -> None:
    deadline = time.monotonic() + STOP_GRACE_S
    for th in threads:
        th.join(max(0.0, deadline - time.monotonic()))
