"""Two measurements of one study side by side (`cloudbox study compare`): per rule, where each one's interval lies
against the rule's threshold, with the reasons that make every verdict of a box inconclusive (emulation, quick
size, a loop device) set aside, and the rules whose intervals lie wholly on opposite sides: a verdict that would
not hold on a second evening."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .evidence import Evidence
from .verdicts import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, Verdict, side_of

# Where our figure lies against a rule's threshold, in words (side_of's answer, or why there is none).
FINDING_SIDE = "on the finding's side"
OTHER_SIDE = "on the other side"
ACROSS = "across the threshold"
NO_INTERVAL = "no interval"
NO_FIGURE = "no figure"
_WORDS = {REPRODUCED: FINDING_SIDE, NOT_REPRODUCED: OTHER_SIDE, INCONCLUSIVE: ACROSS}


def position(v: Verdict) -> str:
    """Where `v`'s interval lies against its rule's threshold, whatever else makes the verdict inconclusive: the
    finding's side, the other side, across it; no interval (one sample a side, or too few) or no figure."""
    if v.estimate is None:
        return NO_FIGURE
    if not v.estimate.has_interval:
        return NO_INTERVAL
    return _WORDS[side_of(v.estimate, v.rule)]


@dataclass(frozen=True)
class Pair:
    """One rule in both measurements."""

    first: Verdict
    second: Verdict

    @property
    def rule_id(self) -> str:
        return self.first.rule.id

    @property
    def positions(self) -> tuple[str, str]:
        return position(self.first), position(self.second)

    @property
    def opposite(self) -> bool:
        """Each interval wholly on its own side of the threshold, and the sides differ."""
        return set(self.positions) == {FINDING_SIDE, OTHER_SIDE}

    @property
    def straddles(self) -> bool:
        """Either interval lies across the threshold: more repeats are needed to decide the rule."""
        return ACROSS in self.positions

    @property
    def agrees(self) -> bool:
        """Both intervals wholly on the same side."""
        a, b = self.positions
        return a == b and a in (FINDING_SIDE, OTHER_SIDE)


def pair(first: Evidence, second: Evidence) -> list[Pair]:
    """Each rule of the study (in file order) with its verdict in `first` and in `second`."""
    if first.study.name != second.study.name:
        raise ValueError(f"two different studies: {first.study.name} and {second.study.name}")
    by_id = {v.rule.id: v for v in second.verdicts}
    return [Pair(v, by_id[v.rule.id]) for v in first.verdicts if v.rule.id in by_id]


def lines(pairs: Sequence[Pair], names: tuple[str, str] = ("first", "second")) -> list[str]:
    """The comparison in words: a table of each rule's figure in both with where its interval lies, then the rules
    on opposite sides, those that straddle, and those without an interval."""
    out = [f"| rule | {names[0]} | {names[1]} | |", "|---|---|---|---|"]
    for p in pairs:
        a, b = p.positions
        mark = "OPPOSITE" if p.opposite else ("same side" if p.agrees else "")
        out.append(f"| {p.rule_id} | {p.first.ours_text(brief=True)} ({a}) | {p.second.ours_text(brief=True)} ({b}) "
                   f"| {mark} |")
    opposite = [p.rule_id for p in pairs if p.opposite]
    across = [p.rule_id for p in pairs if p.straddles]
    bare = [p.rule_id for p in pairs if NO_INTERVAL in p.positions]
    missing = [p.rule_id for p in pairs if NO_FIGURE in p.positions]
    out.append("")
    out.append(f"{len(pairs)} rules; both intervals on the same side: "
               f"{sum(1 for p in pairs if p.agrees)}; on opposite sides: {len(opposite)}"
               + (f" ({', '.join(opposite)})" if opposite else ""))
    if across:
        out.append(f"across the threshold in one or both (more repeats decide them): {', '.join(across)}")
    if bare:
        out.append(f"without an interval in one or both (one sample a side, or too few): {', '.join(bare)}")
    if missing:
        out.append(f"without a figure in one or both: {', '.join(missing)}")
    out.append("The positions set aside what makes a verdict of this box inconclusive (emulation, quick size, a "
               "loop device); they compare where the intervals lie, not verdicts.")
    return out
