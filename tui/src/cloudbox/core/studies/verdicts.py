"""Verdicts: each rule of a study over the selected cells, reproduced, not reproduced or inconclusive with every
reason (a missing cell, emulated, nested, quick size, warm cache, a changed profile, a loop device, an interval
across the threshold); pure functions of the cells, so they are tested without a guest.

Our figure is a rule's quantity with its interval (core.record.stats): a cell's own number as the median of its
samples (its 95% interval from 6 samples), a percentage as the ratio of both sides' samples (its interval from 2 + 2,
with the coverage it has). A rule is reproduced when the whole interval lies on the finding's side of the threshold,
not reproduced when the whole of it lies on the other side, and inconclusive when it straddles the threshold. Where
there is no interval (one sample a side; a number of fewer than 6 samples) the figure alone decides, and the verdict
says so: one run's figure does not say how it would fall on a second evening."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..record import stats
from ..spec.catalogue import is_storage_test
from .cells import Cell, CellKey, Measured
from .schema import DECISIVE_SIZE, NATIVE, OP_SIGNS, OPS, Rule, Study, needs_node

REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
INCONCLUSIVE = "inconclusive"
VERDICTS = (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE)


@dataclass(frozen=True)
class Estimate:
    """Our figure for a rule: the median or ratio, its interval where the samples give one (with its coverage), and
    how many samples it rests on ("8" for a number, "8+8" for a ratio of two sides)."""

    value: float
    low: float | None = None
    high: float | None = None
    n: str = "1"
    coverage: float | None = None

    @property
    def has_interval(self) -> bool:
        return self.low is not None and self.high is not None

    @property
    def single(self) -> bool:
        """Every side measured once."""
        return all(part == "1" for part in self.n.split("+"))

    def no_interval(self) -> str:
        """Why there is none, in words."""
        if self.single:
            return "one sample a side: no interval" if "+" in self.n else "one sample: no interval"
        return "too few samples for an interval" if "+" in self.n else \
            f"no interval below {stats.MIN_N_MEDIAN_CI} samples"


def estimate_of_number(samples: Sequence[float]) -> Estimate:
    """A cell's own number: the median of its samples with the median's 95% interval (stats.summarize)."""
    s = stats.summarize(samples)
    cover = stats.CONFIDENCE if s.low is not None else None
    return Estimate(s.median, s.low, s.high, str(s.n), cover)


def estimate_of_ratio(a: Sequence[float], b: Sequence[float]) -> Estimate | None:
    """a / b in percent with its interval (stats.ratio: 95% from 4 + 4, the range of the pairwise ratios with less
    below); a side with a sample at or below 0 gets the ratio of the medians without an interval. None when b's
    median is not positive."""
    r = stats.ratio(a, b)
    if r is not None:
        return Estimate(r.percent, r.low, r.high, f"{r.n_a}+{r.n_b}", r.coverage)
    mid_b = stats.summarize(b).median
    if mid_b <= 0:
        return None
    return Estimate(stats.summarize(a).median / mid_b * 100.0, n=f"{len(a)}+{len(b)}")


@dataclass(frozen=True)
class Verdict:
    """One rule evaluated: its status, why it is inconclusive, our figure and the paper's (in the rule's unit: % or
    the metric), and the runs it used."""

    rule: Rule
    status: str
    reasons: tuple[str, ...] = ()
    ours: float | None = None
    paper: float | None = None
    paper_computed: bool = False
    run_ids: tuple[int, ...] = ()
    estimate: Estimate | None = None  # ours with its interval and n

    def figure(self, v: float | None) -> str:
        if v is None:
            return "-"
        if self.rule.relative:
            return f"{v:.1f}%"
        unit = "" if not self.rule.unit else (self.rule.unit if self.rule.unit == "%" else f" {self.rule.unit}")
        return self.number(v) + unit

    def number(self, v: float) -> str:
        """`v` as `figure` writes it, without its unit (an interval's ends)."""
        if self.rule.relative:
            return f"{v:.1f}"
        return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}"

    def interval(self, brief: bool = False) -> str:
        """Our figure's interval and n as the report writes them after the figure: " [4.1, 5.9] n=8+8", with the
        coverage where it is not 95% (" [4.1, 5.9] (90%) n=3+3"), " n=1+1 (one sample a side: no interval)" (" n=1+1"
        `brief`, in a table)."""
        e = self.estimate
        if e is None:
            return ""
        if e.has_interval:
            cover = "" if e.coverage is None or round(e.coverage, 3) == stats.CONFIDENCE else f" ({e.coverage:.0%})"
            assert e.low is not None and e.high is not None
            return f" [{self.number(e.low)}, {self.number(e.high)}]{cover} n={e.n}"
        return f" n={e.n}" if brief else f" n={e.n} ({e.no_interval()})"

    def ours_text(self, brief: bool = False) -> str:
        """Our figure with its interval and n: "5.0% [4.1, 5.9] n=8+8", "-" when there is none."""
        return "-" if self.ours is None else self.figure(self.ours) + self.interval(brief)

    def need(self) -> str:
        return f"{OP_SIGNS[self.rule.op]} " + (f"{self.rule.threshold:g}%" if self.rule.relative
                                               else self.figure(self.rule.threshold))

    def explain(self) -> str:
        """One line: the verdict and what it rests on."""
        paper = "" if self.paper is None else (
            f"; the paper: {self.figure(self.paper)}" + (" (computed from its numbers)" if self.paper_computed else ""))
        if self.status == INCONCLUSIVE:
            would = "" if self.ours is None else f"; ours would be {self.ours_text()}"
            return f"{INCONCLUSIVE}: " + "; ".join(self.reasons) + would + paper
        whole = " (the whole interval)" if self.estimate is not None and self.estimate.has_interval else ""
        return f"{self.status}: ours {self.ours_text()}, the rule needs {self.need()}{whole}{paper}"


def _missing(profile: str, test: str, size: str | None, unavailable: Mapping[str, str]) -> str:
    at = f" at {size} size" if size else ""
    why = f"no completed run of {profile} with {test}{at}"
    if profile in unavailable:
        return f"{why}: {unavailable[profile]}"
    if needs_node(test):
        return f"{why}: only a run on a back-end (--node) measures it"
    return why


def quantity(rule: Rule, m: Measured) -> float | None:
    """What the rule reads on one side of a cell: its stored `figure`, else its number or host metric."""
    if rule.figure is not None:
        return dict(m.others).get(rule.figure)
    return m.metric(rule.metric)


def _cell_reasons(cell: Cell, rule: Rule, *, native: bool) -> list[str]:
    metric = rule.figure if rule.figure is not None else rule.metric
    what = f"figure {metric!r}" if rule.figure is not None else f"host {metric}"
    name = f"{cell.profile}/{cell.test} (run #{cell.run_id})"
    out = []
    if cell.accelerator == "nested-kvm":
        out.append(f"{name} was measured under nested virtualization: not an overhead figure")
    elif cell.emulated:
        how = "TCG emulation" if cell.accelerator == "tcg" else "emulation"
        out.append(f"{name} was measured under {how}: not an overhead figure")
    if cell.size_label == "quick" and is_storage_test(cell.test):
        out.append(f"{name} is quick-size: the page and device caches weigh more than in the study")
    elif cell.size_label == "quick":
        out.append(f"{name} is a quick run's: a 5-second stream, where a study-size run streams for 30 s")
    elif cell.size_label != DECISIVE_SIZE:
        out.append(f"{name} was measured at {cell.size_label or 'an unknown'} size, not the study's")
    if "warm-cache" in cell.guest.labels or (native and cell.baseline and "warm-cache" in cell.baseline.labels):
        out.append(f"{name}: the page cache was not dropped before the test")
    if is_storage_test(cell.test) and ("loop-device" in cell.guest.labels
                                        or (native and cell.baseline and "loop-device" in cell.baseline.labels)):
        out.append(f"{name} ran on a loop device over a file, not a whole disk (study run --device names one)")
    if cell.profile_changed:
        out.append(f"{name}: the profile {cell.profile} changed since this run")
    if quantity(rule, cell.guest) is None:
        out.append(f"{name} has no {what}" + ("" if rule.figure is not None else
                                              " (no host metrics for this backing)"))
    if native:
        if cell.baseline is None:
            out.append(f"{name} has no bare-metal number")
        else:
            if "virtualized-host" in cell.baseline.labels:
                out.append(f"{name}: its bare-metal side ran on a virtual machine")
            base = quantity(rule, cell.baseline)
            if base is None:
                out.append(f"{name} has no {what} for its bare-metal side")
            elif base == 0:
                out.append(f"{name}: bare metal measured 0")
    return out


def paper_figure(study: Study, rule: Rule) -> tuple[float | None, bool]:
    """The paper's figure for the rule's quantity: stated in the rule, or computed from its published cells."""
    if rule.paper is not None:
        return rule.paper, False
    if rule.figure is not None:  # the papers publish no stored figure but a test's own number
        return None, False
    own = study.paper_cell(rule.profile, rule.test)
    if own is None:
        return None, False
    mine = own.value if rule.metric == "value" else getattr(own, rule.metric)
    if not rule.relative:
        return mine, False
    if rule.against == NATIVE:
        if rule.metric == "value":
            return study.paper_percent(rule.profile, rule.test)
        base = study.paper_cell(NATIVE, rule.test)
        other = None if base is None else getattr(base, rule.metric)
    else:
        profile, test = rule.other or ("", "")
        cell = study.paper_cell(profile, test)
        other = None if cell is None else (cell.value if rule.metric == "value" else getattr(cell, rule.metric))
    if mine is None or not other:
        return None, False
    return mine / other * 100.0, True


def evaluate_rule(study: Study, rule: Rule, cells: Mapping[CellKey, Cell], *,
                  unavailable: Mapping[str, str] | None = None, size: str | None = None) -> Verdict:
    """One rule over the selected cells. Inconclusive, with every reason, when a cell is missing or was measured where
    it cannot speak for virtualization overhead (emulated, nested, quick size, warm cache, a changed profile);
    otherwise reproduced or not reproduced."""
    unavailable = unavailable or {}
    paper, computed = paper_figure(study, rule)
    native = rule.against == NATIVE
    keys = [(rule.profile, rule.test)]
    if rule.other is not None:
        keys.append(rule.other)
    reasons: list[str] = []
    for key in keys:
        if key not in cells:
            reasons.append(_missing(*key, size, unavailable))
        else:
            reasons += _cell_reasons(cells[key], rule, native=native)
    present = [cells[k] for k in keys if k in cells]
    est = _ours(rule, present) if len(present) == len(keys) else None
    ours = None if est is None else est.value
    run_ids = tuple(dict.fromkeys(c.run_id for c in present))
    if est is None and not reasons:
        reasons.append("no figure could be computed from the cells")
    status = None if est is None else side_of(est, rule)
    if status == INCONCLUSIVE:
        assert est is not None
        unit = "%" if rule.relative else ""
        reasons.append(f"our interval{_interval_words(rule, est)} lies across the threshold "
                       f"({OP_SIGNS[rule.op]} {rule.threshold:g}{unit}): more repeats narrow it")
    if reasons or status is None:
        return Verdict(rule, INCONCLUSIVE, tuple(dict.fromkeys(reasons)), ours, paper, computed, run_ids, est)
    return Verdict(rule, status, (), ours, paper, computed, run_ids, est)


def side_of(est: Estimate, rule: Rule) -> str:
    """Where our figure lies against the rule's threshold: reproduced when its whole interval is on the finding's
    side, not reproduced when the whole of it is on the other, inconclusive when it straddles; without an interval
    the figure alone decides."""
    holds = OPS[rule.op]
    if not est.has_interval:
        return REPRODUCED if holds(est.value, rule.threshold) else NOT_REPRODUCED
    assert est.low is not None and est.high is not None
    ends = (holds(est.low, rule.threshold), holds(est.high, rule.threshold))
    if all(ends):
        return REPRODUCED
    return NOT_REPRODUCED if not any(ends) else INCONCLUSIVE


def _interval_words(rule: Rule, est: Estimate) -> str:
    unit = "%" if rule.relative else ""
    return f" [{est.low:.3g}{unit}, {est.high:.3g}{unit}] (n={est.n})"


def _ours(rule: Rule, cells: Sequence[Cell]) -> Estimate | None:
    other = rule.figure is not None
    name = rule.figure if rule.figure is not None else rule.metric
    mine = cells[0].guest.samples_of(name, other=other)
    if not mine:
        return None
    if not rule.relative:
        return estimate_of_number(mine)
    if rule.against == NATIVE:
        base = cells[0].baseline
        theirs = () if base is None else base.samples_of(name, other=other)
    else:
        theirs = cells[1].guest.samples_of(name, other=other)
    if not theirs:
        return None
    return estimate_of_ratio(mine, theirs)


def evaluate(study: Study, cells: Mapping[CellKey, Cell], *, unavailable: Mapping[str, str] | None = None,
             size: str | None = None) -> list[Verdict]:
    """Every rule of the study, in file order."""
    return [evaluate_rule(study, r, cells, unavailable=unavailable, size=size) for r in study.rules]
