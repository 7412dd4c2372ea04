"""Statistics over a figure's repeated samples: the median with its distribution-free interval, a ratio's and a
shift's interval, the spread (CV, min, max), and a test for drift between the first and second half of a cell's samples.

Performance samples are rarely normal (Maricq et al., OSDI 2018), so nothing here assumes a distribution:
- the median's 95% interval comes from order statistics, the two samples whose ranks a Binomial(n, 1/2) puts
  outside with at most 2.5% each, interpolated towards the next pair to cover 95% rather than the binomial step
  above it; it exists from n = 6 on (n = 5 would cover only 93.75%);
- a ratio (guest / bare metal, profile / profile) is the Hodges-Lehmann estimate of the factor between the two
  sides with the interval that inverts the rank-sum test on the log scale: distribution-free, asymmetric where
  the figures are, inside (0, inf); below 4 + 4 samples, where no rank-based interval reaches 95%, the range of the
  pairwise ratios with the coverage it does have (67% at 2 + 2, 90% at 3 + 3), said beside it;
- a shift (a latency added: guest minus bare metal, in the figures' unit) is the same estimate and interval on the
  linear scale, exact for a figure that moves by an amount (guest = bare metal + c);
- `drift` compares the first and the second half of a series of samples in their measured order with the exact
  Mann-Whitney test: a machine that warms up or slows down over a study shows there, not in the interval;
- `repeats_needed` says, by simulation with a fixed seed, how many samples a side a figure at a given distance from
  a rule's threshold needs for its interval to lie wholly on one side of it, at a given run-to-run CV.
"""

from __future__ import annotations

import bisect
import functools
import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

CONFIDENCE = 0.95
Z95 = 1.959963984540054
MIN_N_MEDIAN_CI = 6  # below it no pair of order statistics covers the median with 95%
CV_FLAG = 0.10  # a figure whose samples vary more than this (run to run) is flagged


def _binom_cdf(k: int, n: int) -> float:
    """P(X <= k) for X ~ Binomial(n, 1/2)."""
    if k < 0:
        return 0.0
    return sum(math.comb(n, i) for i in range(0, min(k, n) + 1)) / 2**n


def median_ci_ranks(n: int, confidence: float = CONFIDENCE) -> tuple[int, int] | None:
    """The 1-based ranks (l, u) of the order statistics that bound the median's interval for n samples: the
    largest l with P(Bin(n, 1/2) <= l - 1) <= (1 - confidence) / 2, and u = n + 1 - l. None when no l >= 1 does."""
    alpha2 = (1 - confidence) / 2
    best = None
    for lo in range(1, n // 2 + 1):
        if _binom_cdf(lo - 1, n) <= alpha2:
            best = lo
        else:
            break
    return None if best is None else (best, n + 1 - best)


def median_ci_coverage(n: int) -> float | None:
    """The exact coverage of median_ci_ranks(n): 1 - 2 P(Bin(n, 1/2) <= l - 1)."""
    r = median_ci_ranks(n)
    return None if r is None else 1 - 2 * _binom_cdf(r[0] - 1, n)


@dataclass(frozen=True)
class Summary:
    """One figure over its samples."""

    n: int
    median: float
    low: float | None  # the median's 95% interval, from n = 6 on
    high: float | None
    minimum: float
    maximum: float
    cv: float | None  # the sample standard deviation over the mean, from n = 2 on

    @property
    def half_width(self) -> float | None:
        """The median's interval's half-width as a percentage of the median; None without an interval."""
        if self.low is None or self.high is None or self.median <= 0:
            return None
        return (self.high - self.low) / 2 / self.median * 100.0

    @property
    def flagged(self) -> bool:
        """Its samples vary more than CV_FLAG from run to run."""
        return self.cv is not None and self.cv > CV_FLAG

    def text(self, fmt: str = "{:.1f}") -> str:
        """"74.2 [71.0, 76.9] n=8" (or "74.2 n=3 (no interval below 6 samples)", or "74.2 n=1")."""
        head = fmt.format(self.median)
        if self.low is not None and self.high is not None:
            return f"{head} [{fmt.format(self.low)}, {fmt.format(self.high)}] n={self.n}"
        if self.n == 1:
            return f"{head} n=1"
        return f"{head} n={self.n} (no interval below {MIN_N_MEDIAN_CI} samples)"


def median_ci(xs: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """The median's interval from the sorted samples `xs`: the order statistics of median_ci_ranks, drawn in
    towards the next pair by Hettmansperger and Sheather's interpolation (1986) so that the coverage is the
    confidence asked for instead of the first binomial step above it (99.2% for n = 8 without it)."""
    n = len(xs)
    ranks = median_ci_ranks(n, confidence)
    if ranks is None:
        return None
    d = ranks[0]
    if d + 1 > n + 1 - (d + 1):  # no inner pair to interpolate towards
        return xs[d - 1], xs[n - d]
    cover_d = 1 - 2 * _binom_cdf(d - 1, n)
    cover_in = 1 - 2 * _binom_cdf(d, n)
    frac = (cover_d - confidence) / (cover_d - cover_in)
    lam = (n - d) * frac / (d + (n - 2 * d) * frac)
    low = (1 - lam) * xs[d - 1] + lam * xs[d]
    high = (1 - lam) * xs[n - d] + lam * xs[n - d - 1]
    return low, high


def summarize(samples: Sequence[float]) -> Summary:
    """The median, its interval, min, max and CV of `samples` (at least one)."""
    xs = sorted(float(x) for x in samples)
    if not xs:
        raise ValueError("no samples to summarize")
    n = len(xs)
    ci = median_ci(xs)
    low, high = ci if ci else (None, None)
    mean = statistics.fmean(xs)
    cv = statistics.stdev(xs) / mean if n >= 2 and mean > 0 else None
    return Summary(n, statistics.median(xs), low, high, xs[0], xs[-1], cv)


# ------------------------------------------------------------------------------------------------- ratios
@dataclass(frozen=True)
class Ratio:
    """a / b as a percentage, with its interval when both sides have at least two samples."""

    percent: float
    low: float | None
    high: float | None
    n_a: int
    n_b: int
    method: str  # "rank-sum" (95%), "range" (every a_i / b_j: fewer samples, less coverage), "" (no interval)

    @property
    def has_interval(self) -> bool:
        return self.low is not None and self.high is not None

    @property
    def half_width(self) -> float | None:
        """The interval's half-width as a percentage of the ratio itself: "+-2.1%" of 96.3% is [94.3, 98.3]; None
        without an interval."""
        if self.low is None or self.high is None or self.percent <= 0:
            return None
        return (self.high - self.low) / 2 / self.percent * 100.0

    @property
    def coverage(self) -> float | None:
        """How often the interval holds the true factor: 95%, or for the range the most any interval from these
        samples can, 1 - 2 / C(n_a + n_b, n_a)."""
        return _coverage(self.method, self.n_a, self.n_b)

    def text(self) -> str:
        """"96.3% [95.1, 97.2] n=8+8", "96.3% [90.2, 99.1] (90%) n=3+3", or "96.3% n=1+1 (no interval)"."""
        if self.has_interval:
            cover = f" ({self.coverage * 100:.0f}%)" if self.method == "range" and self.coverage else ""
            return f"{self.percent:.1f}% [{self.low:.1f}, {self.high:.1f}]{cover} n={self.n_a}+{self.n_b}"
        return f"{self.percent:.1f}% n={self.n_a}+{self.n_b} (no interval)"


def _rank_sum_k(n1: int, n2: int, confidence: float = CONFIDENCE) -> int:
    """How many of the n1 x n2 pairwise differences lie outside the interval on each side: the largest k with
    P(U <= k - 1) <= (1 - confidence) / 2 for the Mann-Whitney U (exact up to 12 a side, normal above); 0 when
    no interval exists at that confidence."""
    alpha2 = (1 - confidence) / 2
    if n1 <= 12 and n2 <= 12:
        k = 0
        while k < n1 * n2 and _mw_exact_cdf(k, n1, n2) <= alpha2:
            k += 1
        return k
    sd = math.sqrt(n1 * n2 * (n1 + n2 + 1) / 12)
    return max(0, int(math.floor(n1 * n2 / 2 - statistics.NormalDist().inv_cdf(1 - alpha2) * sd)))


def ratio(a: Sequence[float], b: Sequence[float]) -> Ratio | None:
    """a / b in percent: the Hodges-Lehmann estimate (the median of every a_i / b_j; with one sample a side, a / b)
    with the distribution-free interval that inverts the rank-sum test on the log scale, exact at 95% for a
    figure that moves by a factor (guest = c x bare metal), as Kalibera and Jones want a ratio's effect size.
    Below 4 + 4 samples (or 3 + 5) no rank-based interval reaches 95%: the range of every a_i / b_j stands in, with
    the coverage it has (Ratio.coverage: 67% at 2 + 2, 90% at 3 + 3). None when a value is not positive."""
    xa, xb = sorted(float(x) for x in a), sorted(float(x) for x in b)
    if not xa or not xb or xa[0] <= 0 or xb[0] <= 0:
        return None
    n_a, n_b = len(xa), len(xb)
    if n_a == n_b == 1:  # the one quotient, as it is divided (the log round trip would move its last digit)
        return Ratio(xa[0] / xb[0] * 100.0, None, None, 1, 1, "")
    est, low, high, method = _hodges_lehmann([math.log(x) - math.log(y) for x in xa for y in xb], n_a, n_b)
    if low is None or high is None:
        return Ratio(math.exp(est) * 100.0, None, None, n_a, n_b, "")
    return Ratio(math.exp(est) * 100.0, math.exp(low) * 100.0, math.exp(high) * 100.0, n_a, n_b, method)


def _hodges_lehmann(diffs: list[float], n_a: int, n_b: int) -> tuple[float, float | None, float | None, str]:
    """The median of the n_a x n_b pairwise differences with its interval (ratio's and shift's): (estimate, low,
    high, method), the interval the rank-sum test's inversion ("rank-sum"), below 4 + 4 samples the range of the
    differences ("range"), none with one sample a side."""
    d = sorted(diffs)
    est = statistics.median(d)
    if n_a < 2 or n_b < 2:
        return est, None, None, ""
    k = _rank_sum_k(n_a, n_b)
    if k >= 1:
        return est, d[k - 1], d[-k], "rank-sum"
    return est, d[0], d[-1], "range"


def _coverage(method: str, n_a: int, n_b: int) -> float | None:
    """How often an interval of `method` holds the true value: 95% for the rank-sum's, the range's
    1 - 2 / C(n_a + n_b, n_a) (the most any interval from these samples can), None without one."""
    if method == "rank-sum":
        return CONFIDENCE
    if method == "range":
        return 1 - 2 / math.comb(n_a + n_b, n_a)
    return None


@dataclass(frozen=True)
class Shift:
    """a - b in the samples' unit (a latency added over bare metal), with its interval when both sides have at
    least two samples."""

    value: float
    low: float | None
    high: float | None
    n_a: int
    n_b: int
    method: str  # as Ratio's

    @property
    def has_interval(self) -> bool:
        return self.low is not None and self.high is not None

    @property
    def coverage(self) -> float | None:
        return _coverage(self.method, self.n_a, self.n_b)

    def text(self, unit: str = "", fmt: str = "{:+.1f}") -> str:
        """"+53.8 µs [50.1, 57.0] n=8+8", "+53.8 µs [49.0, 58.2] (90%) n=3+3", "+53.8 µs n=1+1 (no interval)"."""
        head = fmt.format(self.value) + (f" {unit}" if unit else "")
        if self.has_interval:
            cover = f" ({self.coverage * 100:.0f}%)" if self.method == "range" and self.coverage else ""
            return f"{head} [{fmt.format(self.low)}, {fmt.format(self.high)}]{cover} n={self.n_a}+{self.n_b}"
        return f"{head} n={self.n_a}+{self.n_b} (no interval)"


def shift(a: Sequence[float], b: Sequence[float]) -> Shift | None:
    """a - b: the Hodges-Lehmann estimate (the median of every a_i - b_j; with one sample a side, a - b) with the
    distribution-free interval that inverts the rank-sum test, exact at 95% from 4 + 4 samples for a figure that moves
    by an amount; below that the range of every a_i - b_j with the coverage it has (Shift.coverage), as `ratio`.
    None when a side has no sample."""
    xa, xb = [float(x) for x in a], [float(x) for x in b]
    if not xa or not xb:
        return None
    est, low, high, method = _hodges_lehmann([x - y for x in xa for y in xb], len(xa), len(xb))
    return Shift(est, low, high, len(xa), len(xb), method)


# ------------------------------------------------------------------------------------------------- drift
@functools.lru_cache(maxsize=256)
def _mw_counts(n1: int, n2: int) -> tuple[int, ...]:
    """How many orderings of n1 + n2 distinct values give each Mann-Whitney U = 0 .. n1 n2 (U counts the pairs
    in which the first sample's value is the larger): the largest value is the first sample's (U grows by n2) or
    the second's."""
    if n1 == 0 or n2 == 0:
        return (1,)
    out = [0] * (n1 * n2 + 1)
    for k, c in enumerate(_mw_counts(n1 - 1, n2)):
        out[k + n2] += c
    for k, c in enumerate(_mw_counts(n1, n2 - 1)):
        out[k] += c
    return tuple(out)


def _mw_exact_cdf(u: int, n1: int, n2: int) -> float:
    """P(U <= u) under the null for the Mann-Whitney U of samples of n1 and n2 (no ties)."""
    counts = _mw_counts(n1, n2)
    return sum(counts[: u + 1]) / sum(counts)


def mann_whitney_p(x: Sequence[float], y: Sequence[float]) -> float | None:
    """The two-sided p-value of the Mann-Whitney test of x against y: exact (ties counted as halves) up to 12
    samples a side, the normal approximation with continuity correction above. None below 3 samples a side."""
    n1, n2 = len(x), len(y)
    if n1 < 3 or n2 < 3:
        return None
    u = sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in x for b in y)
    u_small = min(u, n1 * n2 - u)
    if n1 <= 12 and n2 <= 12:
        return min(1.0, 2 * _mw_exact_cdf(int(math.floor(u_small)), n1, n2))
    mu = n1 * n2 / 2
    sigma = math.sqrt(n1 * n2 * (n1 + n2 + 1) / 12)
    z = (abs(u - mu) - 0.5) / sigma
    return min(1.0, 2 * (1 - statistics.NormalDist().cdf(z)))


@dataclass(frozen=True)
class Drift:
    """The first half of a series of samples against its second half, in measured order."""

    first: float  # the halves' medians
    second: float
    p: float

    @property
    def detected(self) -> bool:
        return self.p < 0.05

    def text(self) -> str:
        change = (self.second / self.first - 1) * 100 if self.first else float("nan")
        return (f"{'drift' if self.detected else 'no drift'}: first half {self.first:.1f}, second half "
                f"{self.second:.1f} ({change:+.1f}%), Mann-Whitney p = {self.p:.3f}")


def drift(samples_in_order: Sequence[float]) -> Drift | None:
    """Whether a series moved between its first and second half (None below 6 samples)."""
    n = len(samples_in_order)
    if n < 6:
        return None
    h = n // 2
    first, second = list(samples_in_order[:h]), list(samples_in_order[n - h:])
    p = mann_whitney_p(first, second)
    if p is None:
        return None
    return Drift(statistics.median(first), statistics.median(second), p)


# ------------------------------------------------------------------------------------------------- repeats needed
def _ratio_clears(la: list[float], lb: list[float], k: int) -> bool:
    """Whether the ratio's rank-sum interval (stats.ratio's, k pairwise differences outside it on each side) of the
    samples whose logs are `la` and sorted `lb` lies wholly above 1: its low end, the k-th smallest log a_i - log b_j,
    is above 0 exactly when fewer than k differences are at or below 0. Counting them is the rank-sum statistic,
    O(n log n), where sorting every difference is O(n^2)."""
    at_or_below = sum(len(lb) - bisect.bisect_left(lb, x) for x in la)
    return at_or_below < k


def repeats_needed(cv: float, distance_percent: float, *, of: str = "ratio", power: float = 0.8,
                   trials: int = 1000, seed: int = 1, max_n: int = 2000) -> int | None:
    """The fewest samples a side (of = "ratio": guest and bare metal, or two profiles, n each) or in all (of =
    "median": a cell's own number) for which the 95% interval of a figure whose true value is `distance_percent`
    beyond a rule's threshold (threshold x (1 + d / 100)) lies wholly on that side in at least `power` of `trials`
    simulated evenings: the verdict is decided then, and otherwise inconclusive. Each sample varies run to run
    log-normally with coefficient of variation `cv` (0.03 for 3%), every side alike; the seed is fixed, so the answer
    is the same on every call. The count starts where the interval first covers 95% (4 a side for a ratio, 6 for a
    median); None when `max_n` does not reach `power`."""
    if of not in ("ratio", "median"):
        raise ValueError(f"repeats_needed: of={of!r}; allowed: 'ratio', 'median'")
    if cv <= 0 or distance_percent <= 0 or not 0 < power < 1 or trials < 1:
        raise ValueError(f"repeats_needed: cv={cv}, distance_percent={distance_percent}, power={power}, "
                         f"trials={trials}; each must be positive, power below 1")
    sigma = math.sqrt(math.log(1 + cv * cv))
    shift_log = math.log(1 + distance_percent / 100)

    def decided(n: int) -> bool:
        rng = random.Random(seed)
        hits = 0
        if of == "ratio":
            k = _rank_sum_k(n, n)
            for _ in range(trials):
                la = [rng.gauss(shift_log, sigma) for _ in range(n)]
                lb = sorted(rng.gauss(0.0, sigma) for _ in range(n))
                hits += _ratio_clears(la, lb, k)
        else:
            for _ in range(trials):
                ci = median_ci(sorted(math.exp(rng.gauss(shift_log, sigma)) for _ in range(n)))
                hits += ci is not None and ci[0] > 1.0
        return hits >= power * trials

    lo = 4 if of == "ratio" else MIN_N_MEDIAN_CI
    if decided(lo):
        return lo
    hi = lo
    while not decided(hi):  # doubling, then halving the gap: about 2 log2(n) evaluations
        lo, hi = hi, hi * 2
        if lo >= max_n:
            return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if decided(mid) else (mid, hi)
    return hi if hi <= max_n else None
