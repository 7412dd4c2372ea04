"""The statistics behind every interval cloudbox shows (core.record.stats), against known distributions: the median's
interval and a ratio's interval cover the true value 93-97% of the time over 1,000 simulated samples of 8 from skewed
and bimodal distributions (seeded, so the counts are the same every run); the drift test finds a shift and not noise;
the small-sample cases say what they can."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from cloudbox.core.record import stats

TRIALS = 1000


def lognormal(rng: random.Random) -> float:
    return math.exp(rng.gauss(0.0, 0.5)) * 100.0


def bimodal(rng: random.Random) -> float:
    """Seven in ten near 100, three in ten near 130: a disk whose cache sometimes holds the file."""
    return rng.gauss(100.0, 4.0) if rng.random() < 0.7 else rng.gauss(130.0, 4.0)


def exponential_tail(rng: random.Random) -> float:
    return 100.0 + rng.expovariate(1 / 10.0)


DISTRIBUTIONS = {"lognormal": lognormal, "bimodal": bimodal, "exponential tail": exponential_tail}


def true_median(gen) -> float:
    rng = random.Random(1)
    xs = sorted(gen(rng) for _ in range(200_001))
    return xs[100_000]


@pytest.mark.parametrize("name", DISTRIBUTIONS)
def test_the_medians_interval_covers_the_true_median_93_to_97_percent_of_the_time(name):
    gen = DISTRIBUTIONS[name]
    truth = true_median(gen)
    rng = random.Random(42)
    hits = 0
    for _ in range(TRIALS):
        s = stats.summarize([gen(rng) for _ in range(8)])
        assert s.low is not None and s.high is not None and s.low <= s.median <= s.high
        hits += s.low <= truth <= s.high
    assert 0.93 <= hits / TRIALS <= 0.97, hits


@pytest.mark.parametrize("name", DISTRIBUTIONS)
def test_the_ratios_interval_covers_the_true_ratio_93_to_97_percent_of_the_time(name):
    """The guest's figure is 0.9 x bare metal's in distribution: the interval of guest / bare metal holds 90%."""
    gen = DISTRIBUTIONS[name]
    rng = random.Random(7)
    hits = 0
    for _ in range(TRIALS):
        r = stats.ratio([0.9 * gen(rng) for _ in range(8)], [gen(rng) for _ in range(8)])
        assert r is not None and r.method == "rank-sum" and r.low <= r.percent <= r.high
        hits += r.low <= 90.0 <= r.high
    assert 0.93 <= hits / TRIALS <= 0.97, hits


def test_the_median_interval_needs_six_samples_and_its_ranks_are_the_binomial_ones():
    assert stats.median_ci_ranks(5) is None and stats.median_ci_ranks(6) == (1, 6)
    assert stats.median_ci_ranks(9) == (2, 8) and stats.median_ci_ranks(20) == (6, 15)
    assert stats.median_ci_coverage(6) == pytest.approx(1 - 2 / 64)
    five = stats.summarize([1, 2, 3, 4, 5])
    assert (five.median, five.low, five.high, five.n) == (3, None, None, 5)
    assert five.text() == "3.0 n=5 (no interval below 6 samples)"
    one = stats.summarize([7.25])
    assert (one.cv, one.text()) == (None, "7.2 n=1")
    six = stats.summarize([10, 11, 12, 13, 14, 100])
    assert six.low is not None and 10 <= six.low < 11 and 14 < six.high <= 100 and six.median == 12.5
    assert six.flagged and six.minimum == 10 and six.maximum == 100


def test_the_cv_flags_a_figure_that_varies_more_than_ten_percent():
    steady = stats.summarize([100, 101, 99, 100, 102, 98])
    assert steady.cv == pytest.approx(statistics.stdev([100, 101, 99, 100, 102, 98]) / 100) and not steady.flagged
    assert stats.summarize([80, 120, 100, 90, 110, 100]).flagged


def test_a_ratio_below_four_samples_a_side_gives_the_pairwise_range_and_says_its_coverage():
    r = stats.ratio([90, 92, 94], [100, 101, 99])
    assert r is not None and r.method == "range" and r.coverage == pytest.approx(0.9)
    assert r.low == pytest.approx(90 / 101 * 100) and r.high == pytest.approx(94 / 99 * 100)
    assert r.text().startswith(f"{r.percent:.1f}% [") and r.text().endswith("(90%) n=3+3")
    two = stats.ratio([90, 95], [100, 101])
    assert two is not None and two.coverage == pytest.approx(2 / 3)
    single = stats.ratio([96.3], [100.0])
    assert single is not None and single.percent == pytest.approx(96.3) and not single.has_interval
    assert single.text() == "96.3% n=1+1 (no interval)"
    assert stats.ratio([1.0], [0.0]) is None and stats.ratio([], [1.0]) is None


def test_a_ratio_from_eight_a_side_reads_as_percent_interval_and_counts():
    rng = random.Random(3)
    r = stats.ratio([96 + rng.random() for _ in range(8)], [100 + rng.random() for _ in range(8)])
    assert r is not None and r.has_interval and r.coverage == 0.95
    assert r.text() == f"{r.percent:.1f}% [{r.low:.1f}, {r.high:.1f}] n=8+8"
    assert 95 < r.low < r.percent < r.high < 97.5


def test_drift_finds_a_machine_that_slowed_and_not_one_that_wobbled():
    rng = random.Random(5)
    wobble = [100 + rng.gauss(0, 2) for _ in range(12)]
    slowed = [100 + rng.gauss(0, 2) for _ in range(6)] + [90 + rng.gauss(0, 2) for _ in range(6)]
    assert stats.drift(slowed).detected and stats.drift(slowed).second < stats.drift(slowed).first
    assert not stats.drift(wobble).detected
    assert stats.drift([1, 2, 3, 4, 5]) is None
    assert "Mann-Whitney p = " in stats.drift(slowed).text()


def test_the_exact_mann_whitney_matches_its_table():
    # n = 4 + 4: the smallest two-sided p is 2/70; complete separation reaches it
    assert stats.mann_whitney_p([1, 2, 3, 4], [5, 6, 7, 8]) == pytest.approx(2 / 70)
    assert stats.mann_whitney_p([1, 2, 3, 4], [1, 2, 3, 4]) == pytest.approx(1.0)
    assert stats.mann_whitney_p([1, 2], [3, 4, 5]) is None


def test_the_fast_ratio_check_agrees_with_the_ratios_own_interval():
    """repeats_needed counts pairs instead of sorting them: over random samples it decides exactly as stats.ratio's
    interval does (wholly above 100%, or not)."""
    rng = random.Random(7)
    for n in (4, 6, 9, 13, 20):
        k = stats._rank_sum_k(n, n)
        for _ in range(60):
            a = [math.exp(rng.gauss(0.03, 0.05)) for _ in range(n)]
            b = [math.exp(rng.gauss(0.0, 0.05)) for _ in range(n)]
            r = stats.ratio(a, b)
            assert r is not None and r.low is not None and r.method == "rank-sum"
            assert stats._ratio_clears([math.log(x) for x in a], sorted(math.log(x) for x in b), k) == (r.low > 100.0)


def test_repeats_needed_grows_as_the_figure_nears_its_threshold_and_the_spread_widens():
    """Far from the threshold the first 95% interval decides (4 a side; 6 for a median); at 5% from it a 3% CV
    needs 8 a side; a 10% CV needs about (10/3)^2 times the samples of a 3% one, as the interval's width goes
    with cv / sqrt(n); a fixed seed makes every answer the same on every call."""
    assert stats.repeats_needed(0.03, 50) == 4 and stats.repeats_needed(0.03, 50, of="median") == 6
    assert stats.repeats_needed(0.03, 5) == 8
    near, wide = stats.repeats_needed(0.03, 10), stats.repeats_needed(0.10, 10)
    assert near == 4 and wide is not None and 15 <= wide <= 25
    assert stats.repeats_needed(0.10, 10) == wide
    assert stats.repeats_needed(0.10, 1, max_n=50) is None
    with pytest.raises(ValueError, match="allowed: 'ratio', 'median'"):
        stats.repeats_needed(0.03, 5, of="mean")
    with pytest.raises(ValueError, match="cv=0"):
        stats.repeats_needed(0, 5)
