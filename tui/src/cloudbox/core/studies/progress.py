"""A study run's progress: its cells (each run's tests, measured on both sides) done of those planned, the time
elapsed and the time left, estimated from the plan (how long each step took in the stored runs at this size on
this node) at the pace so far.

The foreground `cloudbox study run` feeds it every event of the runs it starts, one run after the other, and
prints its line as each run starts and each cell is done.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

from ..record.events import MeasurementEvent, ProgressEvent, RunEvent, StepEvent, duration_text
from ..record.rows import Run
from ..spec.runspec import BOOT, PlanStep, RunSpec


def step_seconds(runs: Sequence[Run], size: str, node: str) -> dict[PlanStep, float]:
    """How long each step took in the completed runs of one guest at `size` on `node` (the median over them): a
    measurement's window, from its test's start to its end."""
    took: dict[PlanStep, list[float]] = {}
    for run in runs:
        if run.state != "completed" or run.size_label != size or run.node != node:
            continue
        seen: set[PlanStep] = set()
        for m in run.measurements:
            step = PlanStep(m.side, m.test)
            if m.instance is not None or step in seen or m.started_at is None or m.finished_at is None:
                continue
            seen.add(step)
            took.setdefault(step, []).append(max(0.0, m.finished_at - m.started_at))
    return {step: statistics.median(v) for step, v in took.items()}


def _cell(step: PlanStep) -> str:
    return step.test


class StudyProgress:
    """Where a study run stands: `specs` are its runs in order, `estimates` each step's expected seconds (those it
    lacks count as the mean of those it has, each 1 when there is none), `offsets` a series' start of each run in
    seconds from the first. A step is passed once a later one of its run has begun (or its run has ended); a cell
    (a test of a run) is done when its steps are."""

    def __init__(self, specs: Sequence[RunSpec], estimates: dict[PlanStep, float] | None = None,
                 offsets: Sequence[float] = (), clock: Callable[[], float] = time.monotonic) -> None:
        self.plans = [spec.plan() for spec in specs]
        known = [v for v in (estimates or {}).values() if v > 0]
        fallback = statistics.mean(known) if known else 1.0
        # a repeated test's every sample weighs as its one sample did in the stored runs
        self.weights = [[(estimates or {}).get(PlanStep(s.side, s.test)) or fallback for s in plan]
                        for plan in self.plans]
        self.offsets = list(offsets)
        self.clock = clock
        self.t0 = clock()
        self.run = -1  # the run under way, by its index in `specs`
        self.reached = 0  # the step of that run begun last, by its index in its plan
        self.pct = 0.0  # how far that step is

    @property
    def cells_planned(self) -> int:
        return sum(len({_cell(s) for s in plan if s.test != BOOT}) for plan in self.plans)

    @property
    def cells_done(self) -> int:
        done = sum(len({_cell(s) for s in plan if s.test != BOOT}) for plan in self.plans[:max(0, self.run)])
        if 0 <= self.run < len(self.plans):
            plan = self.plans[self.run]
            later = {_cell(s) for s in plan[self.reached:]}
            done += len({_cell(s) for s in plan[:self.reached] if s.test != BOOT} - later)
        return done

    def start_run(self, index: int) -> None:
        """Run `index` (0-based) starts: every step of the runs before it is passed."""
        self.run, self.reached, self.pct = index, 0, 0.0

    def feed(self, ev: RunEvent) -> bool:
        """Take one event of the run under way; true when it finished a cell."""
        if not 0 <= self.run < len(self.plans) or not isinstance(ev, StepEvent | ProgressEvent | MeasurementEvent):
            return False
        if ev.test is None or (isinstance(ev, MeasurementEvent) and ev.instance is not None) or (
                isinstance(ev, ProgressEvent) and (ev.instance or 1) > 1):
            return False  # in a run of N guests the run's own figure, and the first guest's progress, stand for all
        plan = self.plans[self.run]
        # a measurement is its own step (in a repeated run, its sample's); a step or progress event is the first
        # step of its test on its side not passed yet (the sample under way)
        at = next((i for i in range(self.reached, len(plan)) if plan[i] == ev.plan_step), None) \
            if isinstance(ev, MeasurementEvent) else None
        if at is None:
            at = next((i for i in range(self.reached, len(plan))
                       if (plan[i].side, plan[i].test) == (ev.side or "", ev.test)), None)
        if at is None:
            return False
        before = self.cells_done
        if isinstance(ev, MeasurementEvent):
            at += 1  # this step is measured: the next one is where the run stands
            self.pct = 0.0
        elif at > self.reached:
            self.pct = 0.0
        if isinstance(ev, ProgressEvent):
            self.pct = ev.pct
            if ev.test == BOOT and ev.pct >= 100:
                at += 1
                self.pct = 0.0
        self.reached = max(self.reached, at)
        return self.cells_done > before

    @property
    def fraction(self) -> float:
        """The share of the whole study run done, each step weighed by its expected seconds."""
        total = sum(sum(w) for w in self.weights)
        if total <= 0 or self.run < 0:
            return 0.0
        done = sum(sum(w) for w in self.weights[:self.run])
        if self.run < len(self.weights):
            w = self.weights[self.run]
            done += sum(w[:self.reached])
            if self.reached < len(w):
                done += w[self.reached] * min(100.0, self.pct) / 100
        return min(1.0, done / total)

    def eta(self) -> float | None:
        """Seconds left: the steps left at the pace so far, and no sooner than a series' last run can start."""
        elapsed, frac = self.clock() - self.t0, self.fraction
        total = sum(sum(w) for w in self.weights)
        if frac <= 0 or elapsed <= 0 or total <= 0:
            return None
        rate = elapsed / (frac * total)  # seconds per expected second so far
        left = (1 - frac) * total * rate
        if self.offsets:
            left = max(left, self.offsets[-1] - elapsed + sum(self.weights[-1]) * rate)
        return left

    def line(self, name: str) -> str:
        """"study a: 5 of 24 cells done (21%), 14m05s elapsed, eta 41m10s"."""
        eta = self.eta()
        return (f"study {name}: {self.cells_done} of {self.cells_planned} cells done ({100 * self.fraction:.0f}%), "
                f"{duration_text(self.clock() - self.t0)} elapsed"
                + (f", eta {duration_text(eta)}" if eta is not None else ""))
