"""Verdicts: each rule of a study over the selected cells, reproduced, not reproduced or inconclusive with every
reason (a missing cell, emulated, nested, quick size, warm cache, a changed profile, a loop device); pure functions
of the cells, so they are tested without a guest."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..spec.catalogue import is_storage_test
from .cells import Cell, CellKey, Measured
from .schema import DECISIVE_SIZE, NATIVE, OP_SIGNS, OPS, Rule, Study, needs_node

REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
INCONCLUSIVE = "inconclusive"
VERDICTS = (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE)


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

    def figure(self, v: float | None) -> str:
        if v is None:
            return "-"
        if self.rule.relative:
            return f"{v:.1f}%"
        unit = "" if not self.rule.unit else (self.rule.unit if self.rule.unit == "%" else f" {self.rule.unit}")
        return (f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}") + unit

    def explain(self) -> str:
        """One line: the verdict and what it rests on."""
        need = f"{OP_SIGNS[self.rule.op]} " + (f"{self.rule.threshold:g}%" if self.rule.relative
                                               else self.figure(self.rule.threshold))
        paper = "" if self.paper is None else (
            f"; the paper: {self.figure(self.paper)}" + (" (computed from its numbers)" if self.paper_computed else ""))
        if self.status == INCONCLUSIVE:
            would = "" if self.ours is None else f"; ours would be {self.figure(self.ours)}"
            return f"{INCONCLUSIVE}: " + "; ".join(self.reasons) + would + paper
        return f"{self.status}: ours {self.figure(self.ours)}, the rule needs {need}{paper}"


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
    ours = _ours(rule, present) if len(present) == len(keys) else None
    run_ids = tuple(dict.fromkeys(c.run_id for c in present))
    if ours is None and not reasons:
        reasons.append("no figure could be computed from the cells")
    if reasons:
        return Verdict(rule, INCONCLUSIVE, tuple(dict.fromkeys(reasons)), ours, paper, computed, run_ids)
    assert ours is not None
    status = REPRODUCED if OPS[rule.op](ours, rule.threshold) else NOT_REPRODUCED
    return Verdict(rule, status, (), ours, paper, computed, run_ids)


def _ours(rule: Rule, cells: Sequence[Cell]) -> float | None:
    mine = quantity(rule, cells[0].guest)
    if mine is None:
        return None
    if not rule.relative:
        return mine
    if rule.against == NATIVE:
        base = cells[0].baseline
        other = None if base is None else quantity(rule, base)
    else:
        other = quantity(rule, cells[1].guest)
    if not other:
        return None
    return mine / other * 100.0


def evaluate(study: Study, cells: Mapping[CellKey, Cell], *, unavailable: Mapping[str, str] | None = None,
             size: str | None = None) -> list[Verdict]:
    """Every rule of the study, in file order."""
    return [evaluate_rule(study, r, cells, unavailable=unavailable, size=size) for r in study.rules]
