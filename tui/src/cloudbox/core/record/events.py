"""A run's live events as typed records, their stored form, the one way each is written as a line, and the
whole-run progress a watcher computes from them.

The executor emits these records; the results store keeps each as (kind, JSON payload) in its events table, and
any watcher (`cloudbox watch`, the TUI, a front-end following a node's run) turns the stored form back into a
record with `parse`. `describe` is the line the CLI prints and the TUI's log shows (the TUI puts the time before
it); `progress_line` is the CLI's live status line.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, ClassVar

from ..inputs import printable
from ..spec.runspec import BOOT, PlanStep
from . import stats
from .fairness import Spread, spread

KINDS = ("state", "step", "progress", "log", "sample", "measurement")
FINAL_STATES = ("completed", "aborted", "failed")


def _str(v: Any) -> str | None:
    return None if v is None else str(v)


def _float(v: Any) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _instance(v: Any) -> int | None:
    """One of N guests' (or bare-metal processes') number, 1..N; None for the run's own figure."""
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 1 else None


def _dropped_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


@dataclass(frozen=True)
class StateEvent:
    """The run's state: 'running' first (with the profile, the suite and the plan), a final state last."""

    kind: ClassVar[str] = "state"
    state: str
    reason: str | None = None
    profile: str | None = None
    suite: str | None = None
    plan: tuple[PlanStep, ...] | None = None

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES

    def to_payload(self) -> dict[str, Any]:
        out: dict[str, Any] = {"state": self.state}
        if self.final or self.reason is not None:
            out["reason"] = self.reason
        out.update(_dropped_none({"profile": self.profile, "suite": self.suite}))
        if self.plan is not None:
            out["plan"] = [_plan_payload(s) for s in self.plan]
        return out

    @classmethod
    def from_payload(cls, p: dict[str, Any]) -> StateEvent:
        plan = p.get("plan")
        return cls(str(p.get("state") or "?"), _str(p.get("reason")), _str(p.get("profile")), _str(p.get("suite")),
                   tuple(_plan_step(s) for s in plan) if isinstance(plan, list) else None)


def _plan_payload(s: PlanStep) -> dict[str, Any]:
    """A plan step's stored form: its side and test, and its repeat and boot where not 1 (a run measured once
    stores its plan as before repeats existed)."""
    out: dict[str, Any] = {"side": s.side, "test": s.test}
    out.update({k: v for k in ("repeat", "boot") if (v := getattr(s, k)) != 1})
    return out


def _plan_step(s: Any) -> PlanStep:
    if isinstance(s, dict):
        return PlanStep(str(s.get("side", "")), str(s.get("test", "")), _instance(s.get("repeat")) or 1,
                        _instance(s.get("boot")) or 1)
    side, _, test = str(s).partition(":")  # the 'side:test' form of runs recorded before the plan was typed
    return PlanStep(side, test)


@dataclass(frozen=True)
class StepEvent:
    """The run moved on to a new step; side and test when it is one of the plan's."""

    kind: ClassVar[str] = "step"
    text: str
    side: str | None = None
    test: str | None = None
    # a part of a spread run at this test's start barrier with this many guests ready: the front-end gives the
    # instant once every place is (core.run.hold)
    held: int | None = None

    def to_payload(self) -> dict[str, Any]:
        return _dropped_none({"text": self.text, "side": self.side, "test": self.test, "held": self.held})

    @classmethod
    def from_payload(cls, p: dict[str, Any]) -> StepEvent:
        return cls(str(p.get("text", "")), _str(p.get("side")), _str(p.get("test")), _instance(p.get("held")))


@dataclass(frozen=True)
class LogEvent:
    """Something worth a line in the run's log."""

    kind: ClassVar[str] = "log"
    text: str

    def to_payload(self) -> dict[str, Any]:
        return {"text": self.text}

    @classmethod
    def from_payload(cls, p: dict[str, Any]) -> LogEvent:
        return cls(str(p.get("text", "")))


@dataclass(frozen=True)
class ProgressEvent:
    """How far the current test (or the guest's boot) is: percent, throughput so far, time left; in a run of N guests
    each guest's (and each bare-metal process's) own, numbered `instance` 1..N. `done` says in words what of the
    test's plan is done (IOzone's cells, dd's bytes, Bonnie++'s phases: core.bench.progress), `elapsed` the seconds
    since the test started."""

    kind: ClassVar[str] = "progress"
    side: str
    test: str
    pct: float = 0.0
    eta: str | None = None
    mbps: float | None = None
    instance: int | None = None
    done: str | None = None
    elapsed: float | None = None

    @property
    def step(self) -> PlanStep:
        return PlanStep(self.side, self.test)

    def to_payload(self) -> dict[str, Any]:
        return _dropped_none({"side": self.side, "test": self.test, "pct": self.pct, "mbps": self.mbps,
                              "eta": self.eta, "instance": self.instance, "done": self.done,
                              "elapsed": self.elapsed})

    @classmethod
    def from_payload(cls, p: dict[str, Any]) -> ProgressEvent:
        elapsed = _float(p.get("elapsed"))
        return cls(str(p.get("side", "")), str(p.get("test", "")), _float(p.get("pct")) or 0.0, _str(p.get("eta")),
                   _float(p.get("mbps")), _instance(p.get("instance")), _str(p.get("done")),
                   None if elapsed is None or elapsed < 0 else elapsed)


@dataclass(frozen=True)
class MeasurementEvent:
    """A number just stored (its measurement row holds the rest), with the host disk's metrics of a storage test; in a
    run of N guests one per guest (`instance` 1..N, without host metrics) before the run's own, their sum. A repeated
    test's sample says where it stands: `repeat` (its place in measured order), `boot` and `iteration` (the repeat
    within that guest boot), each 1 for a test measured once and then left out of the stored payload."""

    kind: ClassVar[str] = "measurement"
    side: str
    test: str
    metric: str
    value: float
    labels: tuple[str, ...] = ()
    iops: float | None = None
    host_mbps: float | None = None
    host_avgrq_sectors: float | None = None
    host_avgqu: float | None = None
    host_util: float | None = None
    instance: int | None = None
    repeat: int = 1
    boot: int = 1
    iteration: int = 1

    @property
    def step(self) -> PlanStep:
        return PlanStep(self.side, self.test)

    @property
    def repeated(self) -> bool:
        """A sample of a test measured more than once so far (its second repeat or later, or of a later boot)."""
        return self.repeat > 1 or self.boot > 1

    @property
    def plan_step(self) -> PlanStep:
        """The plan's step this sample is (its repeat and boot: a repeated run plans each one)."""
        return PlanStep(self.side, self.test, self.repeat, self.boot)

    def to_payload(self) -> dict[str, Any]:
        out = {"side": self.side, "test": self.test, "metric": self.metric, "value": self.value}
        out.update(_dropped_none({"iops": self.iops, "host_mbps": self.host_mbps,
                                  "host_avgrq_sectors": self.host_avgrq_sectors, "host_avgqu": self.host_avgqu,
                                  "host_util": self.host_util, "instance": self.instance}))
        out.update({k: v for k in ("repeat", "boot", "iteration") if (v := getattr(self, k)) != 1})
        out["labels"] = list(self.labels)
        return out

    @classmethod
    def from_payload(cls, p: dict[str, Any]) -> MeasurementEvent:
        labels = p.get("labels")
        return cls(str(p.get("side", "")), str(p.get("test", "")), str(p.get("metric", "")),
                   _float(p.get("value")) or 0.0, tuple(map(str, labels)) if isinstance(labels, list) else (),
                   _float(p.get("iops")), _float(p.get("host_mbps")), _float(p.get("host_avgrq_sectors")),
                   _float(p.get("host_avgqu")), _float(p.get("host_util")), _instance(p.get("instance")),
                   _instance(p.get("repeat")) or 1, _instance(p.get("boot")) or 1, _instance(p.get("iteration")) or 1)


SAMPLE_FIELDS = ("t", "device", "test", "read_mbps", "write_mbps", "avgrq_sectors", "avgrq_kb", "avgqu", "util")


@dataclass(frozen=True)
class SampleEvent:
    """One second of the host disk's metrics (the sampler's row, also kept in the samples table)."""

    kind: ClassVar[str] = "sample"
    t: float
    device: str | None = None
    test: str | None = None  # the plan step running then, as "side:test", or "idle"
    read_mbps: float | None = None
    write_mbps: float | None = None
    avgrq_sectors: float | None = None
    avgrq_kb: float | None = None
    avgqu: float | None = None
    util: float | None = None

    def to_payload(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in SAMPLE_FIELDS}

    @classmethod
    def from_payload(cls, p: dict[str, Any]) -> SampleEvent:
        return cls(_float(p.get("t")) or 0.0, _str(p.get("device")), _str(p.get("test")),
                   *(_float(p.get(k)) for k in SAMPLE_FIELDS[3:]))


RunEvent = StateEvent | StepEvent | LogEvent | ProgressEvent | MeasurementEvent | SampleEvent
_BY_KIND: dict[str, type[RunEvent]] = {c.kind: c for c in (StateEvent, StepEvent, LogEvent, ProgressEvent,
                                                            MeasurementEvent, SampleEvent)}


def parse(kind: str, payload: dict[str, Any]) -> RunEvent | None:
    """The record of a stored event (None for a kind this cloudbox does not know)."""
    cls = _BY_KIND.get(kind)
    return cls.from_payload(payload if isinstance(payload, dict) else {}) if cls else None


# ------------------------------------------------------------------------------------------------ lines
def _number(v: float) -> str:
    return f"{v:.2f}".rstrip("0").rstrip(".")


def describe(ev: RunEvent) -> str | None:
    """The event as one line of the run's log (None for progress, samples and the start), with every control
    character made visible (inputs.printable): its text comes from nodes, guests' consoles and servers' logs."""
    line = _describe(ev)
    return None if line is None else printable(line)


def _describe(ev: RunEvent) -> str | None:
    if isinstance(ev, StepEvent):
        return f"==> {ev.text}"
    if isinstance(ev, LogEvent):
        return f"    {ev.text}"
    if isinstance(ev, MeasurementEvent):
        labels = f" [{', '.join(ev.labels)}]" if ev.labels else ""
        host = ""
        if ev.host_avgrq_sectors is not None:
            host = (f"  (host: {ev.host_mbps or 0:.1f} MB/s, avgrq {ev.host_avgrq_sectors:.0f} sectors, "
                    f"avgqu {ev.host_avgqu or 0:.2f}, util {ev.host_util or 0:.0f}%)")
        who = f" {instance_name(ev.side, ev.instance)}" if ev.instance is not None else ""
        return f"  = {ev.side} {ev.test}{who}{repetition_words(ev)}: {_number(ev.value)} {ev.metric}{labels}{host}"
    if isinstance(ev, StateEvent) and ev.final:
        return f"==> run {ev.state}" + (f": {ev.reason}" if ev.reason else "")
    return None


def repetition_words(ev: MeasurementEvent) -> str:
    """" (repeat 3)", " (repeat 5, boot 2 #1)": where a repeated test's sample stands; "" for a test measured once."""
    if not ev.repeated:
        return ""
    return f" (repeat {ev.repeat}" + (f", boot {ev.boot} iteration {ev.iteration})" if ev.boot > 1 else ")")


def counted(n: int, noun: str, nouns: str = "") -> str:
    """"1 guest", "2 guests": a count in words a person reads (a spread run's part may hold one guest)."""
    return f"{n} {noun if n == 1 else nouns or noun + 's'}"


def instance_name(side: str, instance: int) -> str:
    """g1, g2, ... for the guests of a run of N; p1, p2, ... for its bare-metal processes (as `results show`)."""
    return f"{'g' if side == 'guest' else 'p'}{instance}"


def duration_text(seconds: float) -> str:
    """"45s", "6m05s", "2h03m": a test's (or a study's) time so far or left, as a status line shows it."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def stamped(t: float, line: str) -> str:
    """A log line with the local time of its event before it (the TUI's log)."""
    return f"{time.strftime('%H:%M:%S', time.localtime(t))} {line}"


def progress_line(ev: ProgressEvent, sample: SampleEvent | None = None, where: str = "") -> str:
    """The live status line of the current test, with the host disk's last second when there is one and `where` the
    step stands in a repeated run (PlanProgress.where: "repeat 2 of 8"); control characters made visible, as
    describe's."""
    return printable(_progress_line(ev, sample, where))


def _progress_line(ev: ProgressEvent, sample: SampleEvent | None = None, where: str = "") -> str:
    at = f" ({where})" if where else ""
    if ev.test == BOOT:  # no percentage: the text says what the launch is doing and for how long
        return f"  [{ev.side}] {ev.test}{at}: {ev.eta}" if ev.eta else f"  [{ev.side}] {ev.test}{at}"
    who = f" {instance_name(ev.side, ev.instance)}" if ev.instance is not None else ""
    line = f"  [{ev.side}] {ev.test}{who}{at} {ev.pct:5.1f}%"
    if ev.mbps is not None:
        line += f"  {ev.mbps:8.1f} MB/s"
    if ev.elapsed is not None:
        line += f"  {duration_text(ev.elapsed)} elapsed"
    if ev.eta:
        line += f"  eta {ev.eta}"
    if ev.done:
        line += f"  ({ev.done})"
    if sample is not None and ev.test != BOOT:
        line += (f" | host {sample.device} {(sample.read_mbps or 0) + (sample.write_mbps or 0):.1f} MB/s rq "
                 f"{sample.avgrq_sectors or 0:.0f} sect qu {sample.avgqu or 0:.1f} util {sample.util or 0:.0f}%")
    return line


# --------------------------------------------------------------------------------------------- progress
class PlanProgress:
    """Whole-run progress from a run's events: the plan (from the first state event; a later one revises it, as a
    repeated run does when a test needed fewer repeats than it might have), the steps done (measurements, each
    sample of a repeated test its own, and the guest's boots), the current step's own percentage."""

    def __init__(self) -> None:
        self.plan: tuple[PlanStep, ...] = ()
        self.done: set[PlanStep] = set()
        self.current: PlanStep | None = None
        self.current_pct = 0.0

    def feed(self, ev: RunEvent) -> None:
        if isinstance(ev, StateEvent) and ev.plan:
            self.plan = ev.plan
        elif isinstance(ev, ProgressEvent):
            if (ev.instance or 1) > 1:
                return  # in a run of N at once the first guest's (or process's) progress stands for the step's
            self.current, self.current_pct = self._next(ev.side, ev.test), ev.pct
            if ev.test == BOOT and ev.pct >= 100:
                self.done.add(self.current)
        elif isinstance(ev, MeasurementEvent):
            self.done.add(ev.plan_step)

    def _next(self, side: str, test: str) -> PlanStep:
        """The plan's first step of `test` on `side` not done yet: the sample (or the boot) now under way."""
        return next((s for s in self.plan if s.side == side and s.test == test and s not in self.done),
                    PlanStep(side, test))

    @property
    def percent(self) -> float | None:
        if not self.plan:
            return None
        planned = set(self.plan)
        part = self.current_pct / 100 if self.current in planned and self.current not in self.done else 0
        return min(100.0, 100.0 * (len(self.done & planned) + part) / len(self.plan))

    def where(self, step: PlanStep | None = None) -> str:
        """Where `step` (the current one) stands among its test's planned samples, "repeat 2 of 8", or among the
        guest's boots, "boot 2 of 3"; "" when the plan has it once."""
        step = step or self.current
        if step is None:
            return ""
        if step.test == BOOT:
            boots = sum(1 for s in self.plan if s.side == step.side and s.test == BOOT)
            return f"boot {step.boot} of {boots}" if boots > 1 else ""
        n = sum(1 for s in self.plan if s.side == step.side and s.test == step.test)
        return f"repeat {step.repeat} of {n}" if n > 1 else ""


FIGURE_METRICS = ("MB/s", "Mbit/s", "trans/s")  # a test's own figure: storage, network throughput, request/response


class InstanceFigures:
    """What each of N guests (or bare-metal processes) of a run at once is doing, from the run's events: the current
    test's MB/s per instance so far (progress) and their sum; each finished test's per-instance figures (MB/s, or a
    network test's Mbit/s or trans/s) and their spread (core.record.fairness). A run of one guest has no instances and
    leaves it empty."""

    def __init__(self) -> None:
        self.count = 0  # the most instances seen in one test: N
        self.step: PlanStep | None = None  # the test the live figures belong to
        self.now: dict[int, float] = {}  # instance -> MB/s so far in `step`
        self.finals: dict[PlanStep, dict[int, float]] = {}
        # finished tests: spread, the run row's labels, the figures' unit
        self.done: list[tuple[PlanStep, Spread, tuple[str, ...], str]] = []

    @property
    def many(self) -> bool:
        return self.count > 1

    def feed(self, ev: RunEvent) -> bool:
        """Take one event; true if it changed the figures."""
        if isinstance(ev, ProgressEvent) and ev.instance is not None and ev.test != BOOT:
            if ev.step != self.step:
                self.step, self.now = ev.step, {}
            if ev.mbps is None:
                return False
            self.now[ev.instance] = ev.mbps
            self.count = max(self.count, ev.instance)
            return True
        if isinstance(ev, MeasurementEvent) and ev.metric in FIGURE_METRICS:
            if ev.instance is not None:
                self.finals.setdefault(ev.step, {})[ev.instance] = ev.value
                self.count = max(self.count, ev.instance)
                return True
            each = self.finals.get(ev.step)
            if each:
                self.done.append((ev.step, spread([each[k] for k in sorted(each)]), ev.labels, ev.metric))
                if ev.step == self.step:
                    self.now = {}  # the test is over: its spread replaces the figures so far
                return True
        return False

    def total(self) -> float | None:
        """The sum of the instances' MB/s so far in the current test (each one's latest figure)."""
        return sum(self.now.values()) if self.now else None

    def line(self, most: int = 8) -> str:
        """While a test runs, its figures so far per instance (at most `most` by name) and their sum; between tests,
        the last finished test's sum and spread; "" before either."""
        if self.step is not None and self.now:
            ks = sorted(self.now)
            each = "  ".join(f"{instance_name(self.step.side, k)} {self.now[k]:.1f}" for k in ks[:most])
            more = f"  (+{len(ks) - most} more)" if len(ks) > most else ""
            return f"{self.step.side} {self.step.test} now: {each}{more}  sum {sum(self.now.values()):.1f} MB/s"
        if self.done:
            step, g, labels, unit = self.done[-1]
            tag = f" [{', '.join(labels)}]" if labels else ""
            who = "guest" if step.side == "guest" else "process"
            return (f"{step.side} {step.test} done: sum {g.total:.1f} {unit}, per {who} min {g.min:.1f} / median "
                    f"{g.median:.1f} / max {g.max:.1f}, Jain {g.jain:.3f}{tag}")
        return ""


class RepeatFigures:
    """Each repeated test's figures so far, from the run's measurement events: per test and unit the guest's and the
    bare metal's samples in measured order, their summaries and the guest's % of bare metal (core.record.stats). A
    run whose tests are each measured once has no repeated figure, and shows none."""

    def __init__(self) -> None:
        self.samples: dict[tuple[str, str, str], list[float]] = {}  # (side, test, metric) -> values in order
        self.tests: dict[tuple[str, str], None] = {}  # (test, metric) in first-measured order
        self.last: tuple[str, str] | None = None

    @property
    def repeated(self) -> bool:
        return any(len(v) > 1 for v in self.samples.values())

    def feed(self, ev: RunEvent) -> bool:
        """Take one event; true if it changed the figures (a run's own figure: not one of N guests')."""
        if not isinstance(ev, MeasurementEvent) or ev.instance is not None or ev.metric not in FIGURE_METRICS:
            return False
        self.samples.setdefault((ev.side, ev.test, ev.metric), []).append(ev.value)
        self.tests.setdefault((ev.test, ev.metric), None)
        self.last = (ev.test, ev.metric)
        return True

    def summary(self, side: str, test: str, metric: str) -> stats.Summary | None:
        values = self.samples.get((side, test, metric))
        return stats.summarize(values) if values else None

    def ratio(self, test: str, metric: str) -> stats.Ratio | None:
        """The guest's % of bare metal so far, with its interval."""
        g, b = self.samples.get(("guest", test, metric)), self.samples.get(("baseline", test, metric))
        return stats.ratio(g, b) if g and b else None

    def line(self, test: str, metric: str) -> str:
        """"seq-write-64k MB/s: guest 74.2 [71.0, 76.9] n=8, bare metal 77.0 [75.2, 78.1] n=8, 96.3% [95.1, 97.2]
        n=8+8 of bare metal", a side's figure flagged "(CV 14%)" when its samples vary more than stats.CV_FLAG."""
        parts = []
        for side, name in (("guest", "guest"), ("baseline", "bare metal")):
            s = self.summary(side, test, metric)
            if s is not None:
                parts.append(f"{name} {s.text()}" + (f" (CV {s.cv * 100:.0f}%)" if s.flagged and s.cv else ""))
        r = self.ratio(test, metric)
        if r is not None:
            parts.append(f"{r.text()} of bare metal")
        return f"{test} {metric}: " + ", ".join(parts)

    def lines(self, most: int = 4) -> list[str]:
        """The repeated tests' lines, the latest measured last (at most `most`); [] while nothing is repeated."""
        keys = [k for k in self.tests if any(len(self.samples.get((side, *k), ())) > 1
                                             for side in ("guest", "baseline"))]
        if self.last in keys:  # the test being repeated now comes last, nearest the live charts
            keys.remove(self.last)
            keys.append(self.last)
        return [self.line(*k) for k in keys[-most:]]
