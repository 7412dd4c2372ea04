"""fio's completion-latency histograms: its log-linear bins, histograms merged over samples (repeats, guests), the
percentiles read from the merged counts, and the latency a guest adds over bare metal.

fio counts each I/O's completion latency in nanoseconds in 29 groups of 64 bins (FIO_IO_U_PLAT_BITS = 6,
FIO_IO_U_PLAT_VAL = 64, FIO_IO_U_PLAT_GROUP_NR = 29 in its stat.h): a value below 128 ns is its own bin; above, the
value's highest set bit picks the group and the 6 bits below it the bin, so a bin spans 1/64 to 1/128 of its values
and everything from 2^33 + 63 x 2^27 ns (about 16 s) up falls in the last. fio names a bin by its midpoint, and
`--output-format=json+` writes each non-empty one as {midpoint in ns: count} (`clat_ns.bins`). fio's own percentiles
(`clat_ns.percentile`) are the midpoint of the first bin whose running count reaches p% of all I/Os; read the same
way from one job's bins they are fio's, to the bin.

Histograms of one layout add bin by bin, so a figure measured several times (repeats, a run's N guests) is read from
the sum of its samples' histograms: the percentiles of every I/O those samples completed, within one bin of the
pooled latencies' own. Averaging each sample's p99 instead is the p99 of nothing (one slow repeat's tail is diluted
by the others' and a sample of 100 I/Os weighs as much as one of a million).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from typing import Any

from . import stats

PLAT_BITS = 6  # fio's FIO_IO_U_PLAT_BITS: bits below the highest set one that pick a bin within its group
PLAT_VAL = 1 << PLAT_BITS  # bins per group
PLAT_GROUPS = 29  # fio's FIO_IO_U_PLAT_GROUP_NR since fio 3.0 (nanoseconds; 2.x counted microseconds in 19)
PLAT_NR = PLAT_GROUPS * PLAT_VAL  # bins in all
UNIT = "ns"
PERCENTILES = (50.0, 99.0, 99.9)  # what the tables show
METRIC = "lat_us"  # the measurement row of a random test that carries its sample's histogram


def bin_index(ns: int) -> int:
    """The bin of a latency of `ns` nanoseconds: the value itself below 2 x PLAT_VAL; above, its group (its highest
    set bit) and the PLAT_BITS bits under that bit; everything past the last bin counted in it."""
    if ns < 0:
        raise ValueError(f"a latency is not negative (got {ns} ns)")
    msb = ns.bit_length() - 1
    if msb <= PLAT_BITS:
        return ns
    dropped = msb - PLAT_BITS  # the low bits a bin of this group does not tell apart
    return min((dropped + 1) * PLAT_VAL + ((ns >> dropped) & (PLAT_VAL - 1)), PLAT_NR - 1)


def bin_low(idx: int) -> int:
    """The smallest latency (ns) bin `idx` counts."""
    _check_index(idx)
    if idx < 2 * PLAT_VAL:
        return idx
    dropped = idx // PLAT_VAL - 1
    return (1 << (dropped + PLAT_BITS)) + (idx % PLAT_VAL << dropped)


def bin_width(idx: int) -> int:
    """How many nanoseconds bin `idx` spans (the last bin: as wide as the bins of its group, though it takes all
    above)."""
    _check_index(idx)
    return 1 if idx < 2 * PLAT_VAL else 1 << (idx // PLAT_VAL - 1)


def bin_value(idx: int) -> int:
    """The value fio names bin `idx` by, in its JSON and its percentiles: the bin's midpoint (its one value below
    2 x PLAT_VAL ns), a whole number of ns."""
    w = bin_width(idx)
    return bin_low(idx) + (w // 2 if w > 1 else 0)


def _check_index(idx: int) -> None:
    if not 0 <= idx < PLAT_NR:
        raise ValueError(f"fio's latency bins are numbered 0 to {PLAT_NR - 1} (got {idx})")


@dataclass(frozen=True)
class Histogram:
    """Completion latencies counted in fio's bins: (bin index, count) for each non-empty bin, in bin order."""

    bins: tuple[tuple[int, int], ...]

    @property
    def total(self) -> int:
        """How many I/Os it counts."""
        return sum(c for _, c in self.bins)

    @classmethod
    def from_counts(cls, counts: Mapping[int, int]) -> Histogram:
        """From {bin index: count}; empty bins left out."""
        for idx, c in counts.items():
            _check_index(idx)
            if isinstance(c, bool) or not isinstance(c, int) or c < 0:
                raise ValueError(f"bin {bin_value(idx)} ns: a count is a whole number from 0 (got {c!r})")
        return cls(tuple(sorted((i, c) for i, c in counts.items() if c)))

    @classmethod
    def from_fio(cls, bins: Mapping[str, Any]) -> Histogram:
        """From fio's json+ `clat_ns.bins` ({bin midpoint in ns: count}); a key that is not one of fio's midpoints
        (another layout than PLAT_BITS/PLAT_GROUPS) is a ValueError naming it."""
        counts: dict[int, int] = {}
        for key, c in bins.items():
            try:
                ns = int(key)
            except (TypeError, ValueError):
                raise ValueError(f"clat_ns.bins: {key!r} is not a latency in ns") from None
            idx = bin_index(ns) if ns >= 0 else -1
            if idx < 0 or bin_value(idx) != ns:
                raise ValueError(f"clat_ns.bins: {key!r} is not the midpoint of one of fio's bins ({PLAT_GROUPS} "
                                 f"groups of {PLAT_VAL}): a fio older than 3.0 or built with other bins")
            if isinstance(c, bool) or not isinstance(c, int) or c < 0:
                raise ValueError(f"clat_ns.bins[{key!r}]: a count is a whole number from 0 (got {c!r})")
            counts[idx] = counts.get(idx, 0) + c
        return cls.from_counts(counts)

    @classmethod
    def merged(cls, hists: Iterable[Histogram]) -> Histogram:
        """The sum of `hists`, bin by bin: every I/O any of them counted."""
        counts: dict[int, int] = {}
        for h in hists:
            for idx, c in h.bins:
                counts[idx] = counts.get(idx, 0) + c
        return cls(tuple(sorted(counts.items())))

    def percentile_bin(self, p: float) -> int:
        """The bin of the p-th percentile as fio reads it: the first bin whose running count reaches p% of the
        total (compared exactly, as fio's long double does for its percentile list)."""
        if not 0 < p <= 100:
            raise ValueError(f"a percentile is above 0 and at most 100 (got {p})")
        if not self.bins:
            raise ValueError("an empty histogram has no percentiles")
        need = Fraction(p) / 100 * self.total
        seen = 0
        for idx, c in self.bins:
            seen += c
            if seen >= need:
                return idx
        return self.bins[-1][0]

    def percentile(self, p: float) -> int:
        """The p-th percentile in ns: its bin's midpoint (fio's clat percentile)."""
        return bin_value(self.percentile_bin(p))

    def to_stored(self) -> dict[str, Any]:
        """Its stored form (measurements.clat_hist): fio's own, {bin midpoint in ns: count}, with the unit."""
        return {"unit": UNIT, "bins": {str(bin_value(i)): c for i, c in self.bins}}

    @classmethod
    def from_stored(cls, obj: Any) -> Histogram:
        """A stored histogram (to_stored's form, or its JSON text); a ValueError says what is wrong with it."""
        if isinstance(obj, str):
            try:
                obj = json.loads(obj)
            except ValueError as e:
                raise ValueError(f"clat_hist is not JSON: {e}") from None
        if not isinstance(obj, dict) or obj.get("unit") != UNIT or not isinstance(obj.get("bins"), dict):
            raise ValueError(f'clat_hist must be {{"unit": "{UNIT}", "bins": {{midpoint: count}}}} '
                             f"(got {str(obj)[:80]!r})")
        return cls.from_fio(obj["bins"])


def stored_text(hist: Histogram | Mapping[str, Any] | str | None) -> str | None:
    """A histogram as the clat_hist column holds it (JSON text), checked; None stays None."""
    if hist is None:
        return None
    h = hist if isinstance(hist, Histogram) else Histogram.from_stored(hist)
    return json.dumps(h.to_stored(), separators=(",", ":"))


def loaded(text: str | None) -> Histogram | None:
    """The clat_hist column's histogram; None for none, and for an unreadable one (as a stored provenance key of
    the wrong type is left out: the row's other figures still read)."""
    if not text:
        return None
    try:
        return Histogram.from_stored(text)
    except ValueError:
        return None


def micros(ns: float) -> float:
    return ns / 1000.0


@dataclass(frozen=True)
class Latency:
    """A random test's completion latency on one side of a run (one guest's or process's with `instance`): the
    histograms of its samples merged over every repeat and, for the run's own figure of N guests, over the guests;
    `repeats` each repeat's histogram (over the guests), in measured order."""

    side: str
    test: str
    instance: int | None
    repeats: tuple[Histogram, ...]

    @cached_property
    def merged(self) -> Histogram:
        return Histogram.merged(self.repeats)

    @property
    def n(self) -> int:
        """How many repeats it merges."""
        return len(self.repeats)

    @property
    def ios(self) -> int:
        return self.merged.total

    def us(self, p: float) -> float:
        """The p-th percentile of the merged histogram, in µs."""
        return micros(self.merged.percentile(p))

    @property
    def p50(self) -> float:
        return self.us(50.0)

    @property
    def p99(self) -> float:
        return self.us(99.0)

    @property
    def p999(self) -> float:
        return self.us(99.9)

    def repeat_us(self, p: float) -> list[float]:
        """Each repeat's own p-th percentile in µs, in measured order (the samples an interval is made from)."""
        return [micros(h.percentile(p)) for h in self.repeats if h.total]

    def text(self) -> str:
        """"41.2 / 120 / 451" (p50 / p99 / p99.9 in µs)."""
        return " / ".join(us_text(self.us(p)) for p in PERCENTILES)

    def as_dict(self) -> dict[str, Any]:
        """The export's: the merged histogram's percentiles in µs, the I/Os and repeats merged, each repeat's p50."""
        return {"p50_us": self.p50, "p99_us": self.p99, "p99_9_us": self.p999, "ios": self.ios, "n": self.n,
                "repeat_p50_us": self.repeat_us(50.0)}


def us_text(v: float) -> str:
    """A latency in µs as the tables show it: one decimal below 1000 µs (fio's bins are 1/64 to 1/128 wide), whole
    µs above."""
    return f"{v:.1f}" if abs(v) < 1000 else f"{v:.0f}"


def latency_of(side: str, test: str, instance: int | None,
               samples: Sequence[tuple[int, Histogram]]) -> Latency | None:
    """A Latency from (repeat, histogram) pairs, several per repeat in a run of N guests: merged within each repeat,
    the repeats in measured order; None without samples."""
    by: dict[int, list[Histogram]] = {}
    for repeat, h in samples:
        by.setdefault(repeat, []).append(h)
    if not by:
        return None
    return Latency(side, test, instance, tuple(Histogram.merged(by[k]) for k in sorted(by)))


@dataclass(frozen=True)
class Added:
    """The latency a guest adds over bare metal at the median: the merged guest p50 minus the merged bare-metal p50
    (µs), and the interval of the shift between their repeats' own p50s (stats.shift) when there are repeats."""

    us: float
    shift: stats.Shift | None

    def text(self) -> str:
        """"+53.8 µs [50.1, 57.0] n=8+8", "+53.8 µs [49.0, 58.2] (90%) n=3+3", "+53.8 µs" measured once a side."""
        head = f"{self.us:+.1f} µs"
        s = self.shift
        if s is None or s.n_a == s.n_b == 1:
            return head
        if not s.has_interval:
            return f"{head} n={s.n_a}+{s.n_b}"
        assert s.low is not None and s.high is not None and s.coverage is not None
        cover = f" ({s.coverage * 100:.0f}%)" if s.method == "range" else ""
        return f"{head} [{s.low:+.1f}, {s.high:+.1f}]{cover} n={s.n_a}+{s.n_b}"


    def as_dict(self) -> dict[str, Any]:
        """The export's: the µs added with its interval, how many repeats a side, the interval's method and coverage."""
        s = self.shift
        return {"us": self.us, "low": s.low if s else None, "high": s.high if s else None,
                "n_guest": s.n_a if s else None, "n_baseline": s.n_b if s else None,
                "method": (s.method or None) if s else None, "coverage": s.coverage if s else None}


def added(guest: Latency, base: Latency) -> Added:
    """What `guest` adds over `base` at p50. The interval is the rank-sum one of the per-repeat p50s (distribution
    free, 95% from 4 + 4 repeats, the range of the pairwise differences below): repeats, not I/Os, are the
    independent samples, since the I/Os of one repeat share its cache, its host's state and its guest's boot."""
    return Added(guest.p50 - base.p50, stats.shift(guest.repeat_us(50.0), base.repeat_us(50.0)))
