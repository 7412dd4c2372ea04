"""The results database's rows as records: a Run with its Measurements, an Event, a Sample; the values their
columns allow, and how a run is read back with its measurements. A run's Figure is one (side, test, metric,
instance)'s samples in measured order with their summary (core.record.stats); `Run.ratio` and `ratio` set two figures
against each other (guest / bare metal, profile / profile); `Run.latency` merges a random test's latency histograms
(core.record.latency) over its samples."""

from __future__ import annotations

import json
import sqlite3
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from ..spec.catalogue import is_storage_test
from . import events, stats
from .events import FINAL_STATES
from .latency import METRIC as LATENCY_METRIC
from .latency import Added, Histogram, Latency, added, latency_of, loaded
from .provenance import Provenance

# "guest": an interactive guest session (launched, kept running until stopped; no tests).
# "propagation": study B's image-propagation sweep (its samples: measurements of the tests "propagate-<MiB>m").
SUITES = ("storage", "network", "all", "guest", "propagation")
SIZE_LABELS = ("quick", "study", "custom")
STATES = ("running", "completed", "aborted", "failed")
ACCELERATORS = ("kvm", "nested-kvm", "tcg", "xen")
EMULATED_ACCELERATORS = ("tcg", "nested-kvm")
SIDES = ("guest", "baseline")
METRICS = ("MB/s", "IOPS", "lat_us", "Mbit/s", "trans/s")  # the views know these; others are stored as-is

RUN_COLUMNS = (
    "uuid", "profile_name", "profile_hash", "profile_toml", "suite", "size_bytes", "size_label", "state",
    "reason", "accelerator", "emulated", "node", "pid", "started_at", "finished_at", "provenance",
)
MEASUREMENT_COLUMNS = (
    "side", "test", "metric", "value", "host_mbps", "host_avgrq_sectors", "host_avgqu", "host_util",
    "labels", "raw", "started_at", "finished_at", "instance", "repeat", "boot", "iteration", "clat_hist",
)
REPETITION_COLUMNS = ("repeat", "boot", "iteration")


@dataclass
class Measurement:
    """One number: `value` in `metric` for `test` on `side` ('guest' or 'baseline') of run `run_id`."""

    id: int
    run_id: int
    side: str
    test: str
    metric: str
    value: float
    host_mbps: float | None = None
    host_avgrq_sectors: float | None = None
    host_avgqu: float | None = None
    host_util: float | None = None
    labels: list[str] = field(default_factory=list)
    raw: str | None = None  # None also when loaded without raw (list_runs)
    started_at: float | None = None
    finished_at: float | None = None
    # A run of N guests: 1..N for one guest's (or one bare-metal process's) own figure; None for the run's figure
    # (its one guest, or the aggregate of the N).
    instance: int | None = None
    # Where this sample stands among its figure's (the rows of one side, test, metric and instance): its place in
    # measured order (1..n), the guest boot it was measured in, the repeat within that boot. 1, 1, 1: measured once.
    repeat: int = 1
    boot: int = 1
    iteration: int = 1
    # A random test's lat_us row: fio's completion-latency histogram of this sample, as stored (JSON text); `histogram`
    # reads it when asked, so runs listed by the hundred do not parse every one.
    clat_hist: str | None = None

    @property
    def storage(self) -> bool:
        return is_storage_test(self.test)

    @cached_property
    def histogram(self) -> Histogram | None:
        """The sample's completion-latency histogram (None without one, or when unreadable)."""
        return loaded(self.clat_hist)

    def as_dict(self, raw: bool = True) -> dict[str, Any]:
        """Its columns; the tool's raw output and the latency histogram (its stored form) only with `raw`."""
        d = {k: getattr(self, k) for k in ("id", "run_id", *MEASUREMENT_COLUMNS)}
        d["labels"] = list(self.labels)
        d["clat_hist"] = None if self.histogram is None else self.histogram.to_stored()
        if not raw:
            d.pop("raw")
            d.pop("clat_hist")
        return d


@dataclass(frozen=True)
class Repetition:
    """Where a sample is measured among its figure's repeats: `repeat` its place in the run's order (1..n), `boot` the
    guest boot it is measured in (1..M), `iteration` the repeat within that boot. The default: measured once."""

    repeat: int = 1
    boot: int = 1
    iteration: int = 1

    def __post_init__(self) -> None:
        for name in REPETITION_COLUMNS:
            check_position(name, getattr(self, name))

    def columns(self) -> dict[str, int]:
        """The measurement columns it sets (add_measurement's keywords)."""
        return {name: getattr(self, name) for name in REPETITION_COLUMNS}


def check_position(name: str, value: Any) -> None:
    """A repetition column's value: an int from 1, else a ValueError naming the column."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a whole number from 1 (got {value!r})")


@dataclass(frozen=True)
class Figure:
    """One figure of a run: the samples of (side, test, metric, instance) in measured order, and their summary."""

    side: str
    test: str
    metric: str
    instance: int | None
    samples: tuple[Measurement, ...]  # at least one, in measured order (repeat, then the order stored)

    @property
    def values(self) -> list[float]:
        return [m.value for m in self.samples]

    @property
    def n(self) -> int:
        return len(self.samples)

    @property
    def repeated(self) -> bool:
        return self.n > 1

    @cached_property
    def summary(self) -> stats.Summary:
        """Median, its 95% interval (from 6 samples), min, max, CV (core.record.stats)."""
        return stats.summarize(self.values)

    @property
    def median(self) -> float:
        return self.summary.median

    @property
    def last(self) -> Measurement:
        """The last sample measured (the host disk's metrics and the raw output of a figure measured once)."""
        return self.samples[-1]

    @property
    def labels(self) -> list[str]:
        """Every sample's labels, each once in first-seen order (a caveat of one repeat is the figure's)."""
        return list(dict.fromkeys(lab for m in self.samples for lab in m.labels))

    @property
    def boots(self) -> int:
        """How many guest boots its samples came from."""
        return len({m.boot for m in self.samples})

    def host(self, name: str) -> float | None:
        """A host disk metric (Measurement.host_*) over its samples: their median; None where none has it."""
        vals = [v for m in self.samples if (v := getattr(m, name)) is not None]
        return statistics.median(vals) if vals else None


def ratio(a: Figure | None, b: Figure | None) -> stats.Ratio | None:
    """a / b in percent with its interval (stats.ratio over both figures' samples): a guest against its bare metal, a
    profile against another; None when either is missing or not positive."""
    return None if a is None or b is None else stats.ratio(a.values, b.values)


@dataclass
class Run:
    """One benchmark run, with its measurements (both sides) in insertion order."""

    id: int
    uuid: str
    profile_name: str | None
    profile_hash: str | None
    profile_toml: str | None
    suite: str | None
    size_bytes: int | None
    size_label: str | None
    state: str
    reason: str | None
    accelerator: str | None
    emulated: bool
    node: str | None
    pid: int | None
    started_at: float | None
    finished_at: float | None
    provenance: Provenance = field(default_factory=Provenance)
    measurements: list[Measurement] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.state in FINAL_STATES

    @property
    def duration(self) -> float | None:
        """Seconds from start to finish (to now while running)."""
        if self.started_at is None:
            return None
        end = self.finished_at if self.finished_at is not None else time.time()
        return max(0.0, end - self.started_at)

    def measurement(self, side: str, test: str, metric: str | None = None) -> Measurement | None:
        """The run's last sample of `test` on `side` in measured order (in `metric` if given; the aggregate in a run
        of N guests), or None; `figure` gives them all."""
        found = None
        for m in self.measurements:
            if m.side == side and m.test == test and (metric is None or m.metric == metric) and m.instance is None:
                if found is None or m.repeat >= found.repeat:
                    found = m
        return found

    def figure(self, side: str, test: str, metric: str, instance: int | None = None) -> Figure | None:
        """`test` on `side` in `metric` (one guest's of N with `instance`, else the run's own figure): its samples in
        measured order; None when the run has none."""
        found = [m for m in self.measurements if m.side == side and m.test == test and m.metric == metric
                 and m.instance == instance]
        if not found:
            return None
        return Figure(side, test, metric, instance, tuple(sorted(found, key=lambda m: m.repeat)))

    def figures(self) -> list[Figure]:
        """Every figure of the run, in the order their first samples were stored."""
        keys = dict.fromkeys((m.side, m.test, m.metric, m.instance) for m in self.measurements)
        return [f for k in keys if (f := self.figure(*k)) is not None]

    def ratio(self, test: str, metric: str, instance: int | None = None) -> stats.Ratio | None:
        """The guest's figure as a percentage of the same run's bare metal, with its interval (stats.ratio)."""
        return ratio(self.figure("guest", test, metric, instance), self.figure("baseline", test, metric, instance))

    def instances(self, side: str, test: str, metric: str) -> list[Measurement]:
        """Each guest's (or bare-metal process's) own last sample of `test` in a run of N guests, by instance;
        [] in a run of one guest."""
        return [f.last for f in self.instance_figures(side, test, metric)]

    def instance_figures(self, side: str, test: str, metric: str) -> list[Figure]:
        """Each guest's (or bare-metal process's) own figure of `test` in a run of N guests, by instance; [] in a run
        of one guest."""
        found = sorted({m.instance for m in self.measurements if m.side == side and m.test == test
                        and m.metric == metric and m.instance is not None})
        return [f for k in found if (f := self.figure(side, test, metric, k)) is not None]

    def latency(self, side: str, test: str, instance: int | None = None) -> Latency | None:
        """`test`'s completion latency on `side`: its samples' histograms merged over every repeat and, in a run of N
        guests, over the guests (or processes) unless `instance` names one; None where no sample has a histogram."""
        rows = [m for m in self.measurements if m.side == side and m.test == test and m.metric == LATENCY_METRIC
                and m.histogram is not None]
        if instance is not None:
            rows = [m for m in rows if m.instance == instance]
        else:  # the N guests' own histograms; the run's aggregate row has one only in a run of one guest
            rows = [m for m in rows if m.instance is not None] or rows
        return latency_of(side, test, instance, [(m.repeat, m.histogram) for m in rows if m.histogram is not None])

    def added_latency(self, test: str) -> Added | None:
        """What the guest adds over the same run's bare metal at p50 of `test` (core.record.latency.added); None
        without both."""
        g, b = self.latency("guest", test), self.latency("baseline", test)
        return None if g is None or b is None else added(g, b)

    def value(self, side: str, test: str, metric: str) -> float | None:
        """The run's figure: the median of its samples (its one value when measured once), or None."""
        f = self.figure(side, test, metric)
        return None if f is None else f.median

    def tests(self, side: str | None = None) -> list[str]:
        """Test names measured in this run, first-seen order."""
        seen: dict[str, None] = {}
        for m in self.measurements:
            if side is None or m.side == side:
                seen.setdefault(m.test, None)
        return list(seen)

    def as_dict(self, raw: bool = False) -> dict[str, Any]:
        d: dict[str, Any] = {k: getattr(self, k) for k in ("id", *RUN_COLUMNS)}
        d["provenance"] = self.provenance.to_stored()
        d["measurements"] = [m.as_dict(raw=raw) for m in self.measurements]
        return d


@dataclass
class Event:
    """One entry of a run's live stream. `seq` counts from 1 per run, without gaps."""

    run_id: int
    seq: int
    t: float
    kind: str
    payload: dict[str, Any]

    @property
    def record(self) -> events.RunEvent | None:
        """The typed event (core.record.events); None for a kind this cloudbox does not know."""
        return events.parse(self.kind, self.payload)


@dataclass
class Sample:
    """One second of host disk metrics from the sampler."""

    run_id: int
    t: float
    device: str | None
    test: str | None
    read_mbps: float | None
    write_mbps: float | None
    avgrq_sectors: float | None
    avgrq_kb: float | None
    avgqu: float | None
    util: float | None


# --------------------------------------------------------------------------------------------------
# Reading and writing rows
# --------------------------------------------------------------------------------------------------


def dumps(value: Any) -> str:
    """A JSON column's text (a run's provenance, an event's payload)."""
    return json.dumps(value, sort_keys=True, default=str)


def loads(text: str | None, default: Any) -> Any:
    """A JSON column's value; `default` for an empty or unreadable one."""
    if not text:
        return default
    try:
        return json.loads(text)
    except ValueError:
        return default


def check(name: str, value: Any, allowed: Sequence[Any]) -> None:
    """A column's value: None or one of `allowed`, else a ValueError naming the column."""
    if value is not None and value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(map(str, allowed))} (got {value!r})")


def load_measurements(conn: sqlite3.Connection, run_ids: Sequence[int], raw: bool) -> dict[int, list[Measurement]]:
    """Each run's measurements in insertion order, by run id; raw tool output left out (None) unless `raw`."""
    out: dict[int, list[Measurement]] = {rid: [] for rid in run_ids}
    if not run_ids:
        return out
    raw_col = "raw" if raw else "NULL AS raw"
    cols = ", ".join(c for c in ("id", "run_id", *MEASUREMENT_COLUMNS) if c != "raw")
    for start in range(0, len(run_ids), 500):
        chunk = list(run_ids[start : start + 500])
        marks = ", ".join("?" for _ in chunk)
        for r in conn.execute(
            f"SELECT {cols}, {raw_col} FROM measurements WHERE run_id IN ({marks}) ORDER BY id", chunk
        ):
            d = dict(r)
            d["labels"] = loads(d["labels"], [])
            out[d["run_id"]].append(Measurement(**d))
    return out


def run_from_row(row: sqlite3.Row, measurements: list[Measurement]) -> Run:
    """The run a `runs` row holds, with its measurements."""
    d = dict(row)
    d["emulated"] = bool(d["emulated"])
    d["provenance"] = Provenance.from_stored(loads(d["provenance"], {}))
    return Run(**d, measurements=measurements)
