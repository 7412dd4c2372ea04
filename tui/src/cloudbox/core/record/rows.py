"""The results database's rows as records: a Run with its Measurements, an Event, a Sample; the values their
columns allow, and how a run is read back with its measurements."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..spec.catalogue import is_storage_test
from . import events
from .events import FINAL_STATES
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
    "labels", "raw", "started_at", "finished_at", "instance",
)


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

    @property
    def storage(self) -> bool:
        return is_storage_test(self.test)

    def as_dict(self, raw: bool = True) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in ("id", "run_id", *MEASUREMENT_COLUMNS)}
        d["labels"] = list(self.labels)
        if not raw:
            d.pop("raw")
        return d


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
        """The run's last measurement of `test` on `side` (in `metric` if given; the aggregate in a run of N guests),
        or None."""
        found = None
        for m in self.measurements:
            if m.side == side and m.test == test and (metric is None or m.metric == metric) and m.instance is None:
                found = m
        return found

    def instances(self, side: str, test: str, metric: str) -> list[Measurement]:
        """Each guest's (or bare-metal process's) own measurement of `test` in a run of N guests, by instance;
        [] in a run of one guest."""
        found = {m.instance: m for m in self.measurements
                 if m.side == side and m.test == test and m.metric == metric and m.instance is not None}
        return [found[k] for k in sorted(found)]

    def value(self, side: str, test: str, metric: str) -> float | None:
        m = self.measurement(side, test, metric)
        return None if m is None else m.value

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
