"""A series study's repeats (study D): per cell the samples of the stored runs, over time and over a run's guests,
and their distribution (percentiles, coefficient of variation, histogram bins, kernel density)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..record.rows import Measurement, Run
from ..spec.catalogue import primary_metric
from ..views.compare import guest_count
from .cells import CellKey, Measured, measured_side
from .schema import Study


def series_runs(runs: Sequence[Run], profile: str, profile_hash: str | None, tests: Sequence[str], size: str,
                node: str | None, guests: int | None = 1) -> list[Run]:
    """The completed runs of this profile (same hash), size, node (any when None) and guest count (any when None)
    holding both sides of every one of `tests`: the repeats of a series, oldest first."""
    out = [r for r in runs if r.state == "completed" and r.profile_name == profile and r.profile_hash == profile_hash
           and r.size_label == size and (node is None or r.node == node)
           and (guests is None or guest_count(r) == guests)
           and all(r.measurement("guest", t) is not None and r.measurement("baseline", t) is not None
                   for t in tests)]
    return sorted(out, key=lambda r: (r.started_at or 0.0, r.id))


@dataclass(frozen=True)
class Sample:
    """One repeat of a series: the run, when it started, the guest's number and the same run's bare-metal one."""

    run_id: int
    started_at: float
    value: float
    baseline: float | None
    metric: str
    size_label: str
    emulated: bool = False
    accelerator: str | None = None
    baseline_labels: tuple[str, ...] = ()  # e.g. virtualized-host: the bare-metal side ran on a virtual machine
    instance: int | None = None  # a run of N guests: the guest (its bare-metal process: the same number)


@dataclass(frozen=True)
class SeriesStats:
    """A series' distribution: count, median, 5th and 95th percentiles (linear between ranks), mean, standard
    deviation and coefficient of variation (stdev / mean, %; None below two samples or with a zero mean)."""

    n: int
    median: float
    p5: float
    p95: float
    mean: float
    stdev: float | None
    cv: float | None
    low: float
    high: float


def series_stats(values: Sequence[float]) -> SeriesStats | None:
    """The distribution of `values`, or None when there are none."""
    if not values:
        return None
    xs = sorted(values)
    mean = statistics.fmean(xs)
    if len(xs) == 1:
        return SeriesStats(1, xs[0], xs[0], xs[0], mean, None, None, xs[0], xs[0])
    q = statistics.quantiles(xs, n=20, method="inclusive")
    sd = statistics.stdev(xs)
    return SeriesStats(len(xs), statistics.median(xs), q[0], q[-1], mean, sd, sd / mean * 100.0 if mean else None,
                       xs[0], xs[-1])


def gather_series(study: Study, runs: Sequence[Run], hashes: Mapping[str, str], *, size: str | None = None,
                  node: str | None = None) -> dict[CellKey, list[Sample]]:
    """Per cell, every stored repeat (oldest first) at one size: `size`, else the first of the study's sizes holding
    any; each repeat is a completed run of the profile as it is today, on `node` when given, of the plan's guest
    count. A run of N guests gives N samples, one per guest beside its own bare-metal process (instances 1..N):
    the distribution is over time and over instances."""
    out: dict[CellKey, list[Sample]] = {}
    for profile in study.profile_names:
        for test in study.test_ids:
            for sz in [size] if size else study.sizes:
                guests = series_guests(study, runs, profile, hashes.get(profile), test, sz, node)
                found = series_runs(runs, profile, hashes.get(profile), [test], sz, node, guests)
                if not found:
                    continue
                samples = []
                for r in found:
                    samples += _samples(r, test, sz, guests)
                out[(profile, test)] = samples
                break
    return out


def series_guests(study: Study, runs: Sequence[Run], profile: str, profile_hash: str | None, test: str, size: str,
                   node: str | None) -> int:
    """The guest count whose repeats a cell's series shows: the plan's when it has any, else the count with the most
    repeats (a series run with `--guests`)."""
    counts: dict[int, int] = {}
    for r in series_runs(runs, profile, profile_hash, [test], size, node, guests=None):
        counts[guest_count(r)] = counts.get(guest_count(r), 0) + 1
    planned = study.guests(size)
    if planned in counts or not counts:
        return planned
    return max(counts, key=lambda n: (counts[n], n))


def _samples(r: Run, test: str, size: str, guests: int) -> list[Sample]:
    """A repeat's samples of `test`: the guest's number, or with N guests each guest's (instance k beside bare
    metal's process k)."""
    metric = primary_metric(test, [m.metric for m in r.measurements if m.test == test])

    def sample(value: float, base: Measured | Measurement | None, at: float | None, k: int | None) -> Sample:
        return Sample(r.id, at or r.started_at or 0.0, value, base.value if base else None, metric, size, r.emulated,
                      r.accelerator, tuple(base.labels) if base else (), k)

    if guests == 1:
        guest = measured_side(r, "guest", test, metric)
        return [] if guest is None else [sample(guest.value, measured_side(r, "baseline", test, metric), None, None)]
    bases = {m.instance: m for m in r.instances("baseline", test, metric)}
    return [sample(m.value, bases.get(m.instance), m.started_at, m.instance)
            for m in r.instances("guest", test, metric)]


def bins(values: Sequence[float], count: int | None = None) -> list[tuple[float, float, int]]:
    """Equal-width histogram bins over [min, max]: (low, high, how many); about sqrt(n) bins, at most 12, the last
    one closed. One bin when every value is the same."""
    if not values:
        return []
    lo, hi = min(values), max(values)
    if hi == lo:
        return [(lo, hi, len(values))]
    k = count or max(2, min(12, round(math.sqrt(len(values)))))
    width = (hi - lo) / k
    counts = [0] * k
    for v in values:
        counts[min(k - 1, int((v - lo) / width))] += 1
    return [(lo + i * width, lo + (i + 1) * width, n) for i, n in enumerate(counts)]


MIN_PEAK_SAMPLES = 3  # a bump of the curve over fewer samples is one or two runs' chance, not a group of runs


@dataclass(frozen=True)
class Density:
    """A Gaussian kernel density estimate of a series: its bandwidth, the curve over a grid (value, density per unit
    of the value) and the curve's peaks (more than one: the runs fell into groups, which a median hides), each with
    at least MIN_PEAK_SAMPLES samples in its basin (from the trough before it to the trough after); `minor` counts
    the bumps over fewer, which are drawn but not named."""
    bandwidth: float
    curve: list[tuple[float, float]]
    peaks: list[float]
    minor: int = 0


def density(values: Sequence[float], points: int = 81) -> Density | None:
    """The Gaussian kernel density of values, bandwidth by Silverman's rule of thumb (0.9 min(s, IQR / 1.34)
    n^-1/5), over min - 3h to max + 3h; None under three values or when they are all the same."""
    if len(values) < 3 or max(values) == min(values):
        return None
    n = len(values)
    s = statistics.stdev(values)
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    spread_ = min(s, (q3 - q1) / 1.34) if q3 > q1 else s
    h = 0.9 * spread_ * n ** -0.2
    kernel = statistics.NormalDist(0.0, h)
    lo, hi = min(values) - 3 * h, max(values) + 3 * h
    xs = [lo + (hi - lo) * i / (points - 1) for i in range(points)]
    curve = [(x, sum(kernel.pdf(x - v) for v in values) / n) for x in xs]
    tops = [i for i in range(1, points - 1) if curve[i][1] >= curve[i - 1][1] and curve[i][1] > curve[i + 1][1]]
    # each top's basin: from the lowest point of the curve between it and the top before to the one after
    troughs = [min(range(a, b + 1), key=lambda j: curve[j][1]) for a, b in zip(tops, tops[1:], strict=False)]
    edges = [-math.inf, *(curve[j][0] for j in troughs), math.inf]
    held = [sum(1 for v in values if lo < v <= hi) for lo, hi in zip(edges, edges[1:], strict=False)]
    peaks = [curve[i][0] for i, k in zip(tops, held, strict=True) if k >= MIN_PEAK_SAMPLES]
    if not peaks and tops:  # no group is large enough: the curve's highest point is still its one peak
        peaks = [curve[max(tops, key=lambda i: curve[i][1])][0]]
    return Density(h, curve, peaks, len(tops) - len(peaks))
