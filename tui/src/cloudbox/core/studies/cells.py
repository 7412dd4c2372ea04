"""A cell of a study's matrix as a stored run measured it: the guest's figure beside the same run's bare-metal one,
each the median of its samples with the samples kept (for the intervals of core.record.stats), with the host disk's
metrics and the reasons it is weaker than the paper's (emulated, nested, quick, ...)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from ..record import stats
from ..record.rows import Run


@dataclass(frozen=True)
class Measured:
    """One side's figure of a cell: the median of its samples (the one value of a figure measured once), the host
    disk's metrics over its window (their medians), its labels, and every sample of each, in measured order."""

    value: float
    avgrq: float | None = None
    avgqu: float | None = None
    util: float | None = None
    labels: tuple[str, ...] = ()
    others: tuple[tuple[str, float], ...] = ()  # the test's other figures on this side (Bonnie++'s), by metric
    # the samples behind each number above, by name ("value", "avgrq", ..., or another figure's metric); a name
    # left out was measured once: its number is its one sample
    samples: tuple[tuple[str, tuple[float, ...]], ...] = ()

    def metric(self, name: str) -> float | None:
        return self.value if name == "value" else getattr(self, name)

    def samples_of(self, name: str, *, other: bool = False) -> tuple[float, ...]:
        """The samples of `name` (the number, a host metric, or with `other` another figure of the test); () when
        this side has none."""
        kept = dict(self.samples).get(name)
        if kept:
            return kept
        one = dict(self.others).get(name) if other else self.metric(name)
        return () if one is None else (one,)

    @property
    def n(self) -> int:
        """How many samples its number is the median of."""
        return len(self.samples_of("value"))

    @property
    def summary(self) -> stats.Summary:
        """Its number's median with its interval (from 6 samples), min, max and CV."""
        return stats.summarize(self.samples_of("value"))


@dataclass(frozen=True)
class StudyRunTag:
    """The study run a run was one of, as its spec recorded it (RunSpec.study_run): the seed that shuffled the
    profiles and the order they ran in."""

    study: str
    seed: int
    order: tuple[str, ...]

    @classmethod
    def of(cls, run: Run) -> StudyRunTag | None:
        """`run`'s tag; None for a run that no study run started (or one of a cloudbox that recorded none)."""
        spec = run.provenance.spec
        tag = spec.study_run if spec is not None else {}
        try:
            return cls(str(tag["study"]), int(tag["seed"]), tuple(str(p) for p in tag["order"]))
        except (KeyError, TypeError, ValueError):
            return None


@dataclass(frozen=True)
class Cell:
    """What a stored run measured for one (profile, test): the guest's number and the same run's bare-metal one."""

    profile: str
    test: str
    run_id: int
    guest: Measured
    baseline: Measured | None = None
    metric: str = ""  # the unit of `value` (MB/s, Mbit/s, ...)
    size_label: str | None = None
    accelerator: str | None = None
    emulated: bool = False
    node: str | None = None
    started_at: float | None = None
    profile_changed: bool = False  # the run's profile hash is not the profile's hash today
    host_cores: int | None = None  # physical cores of the host that ran it, as the run recorded them
    guest_memory_mib: int | None = None  # the guest's RAM, from the profile stored with the run
    # every figure the run's bare metal stored for the test (by metric), the cell's own metric or not (Bonnie++'s)
    baseline_figures: tuple[tuple[str, float], ...] = ()
    guests: int = 1  # a series' run of N guests: its numbers are their sum (and N bare-metal processes')
    study_run: StudyRunTag | None = None  # the study run (seed, order) that started the cell's run

    def ratio(self) -> stats.Ratio | None:
        """The guest's number as a percentage of the same run's bare metal, with its interval over both sides'
        samples (stats.ratio); None without a positive bare-metal number."""
        if self.baseline is None or not self.baseline.value:
            return None
        return stats.ratio(self.guest.samples_of("value"), self.baseline.samples_of("value"))

    def drift(self) -> stats.Drift | None:
        """The guest's samples' first half against their second half in measured order (stats.drift: from 6
        samples): a machine that warmed up or slowed down over the repeats."""
        return stats.drift(self.guest.samples_of("value"))

    def per_host_core(self, value: float | None) -> float | None:
        """`value` (this cell's guest or bare-metal number) per physical core of the host; None when the run
        recorded no core count."""
        return None if value is None or not self.host_cores else value / self.host_cores

    @property
    def guest_per_gib(self) -> float | None:
        """The guest's number per GiB of its RAM; None when the stored profile gives no memory size."""
        return None if not self.guest_memory_mib else self.guest.value / (self.guest_memory_mib / 1024)

    @property
    def qualifiers(self) -> list[str]:
        """Why this number is weaker than the paper's, in a word each: emulated, nested, quick, ..."""
        out = []
        if self.accelerator == "nested-kvm":
            out.append("nested")
        elif self.emulated:
            out.append("emulated")
        if self.size_label == "quick":
            out.append("quick")
        labels = set(self.guest.labels) | set(self.baseline.labels if self.baseline else ())
        if "warm-cache" in labels:
            out.append("warm cache")
        if "loop-device" in labels:
            out.append("loop device")
        if self.profile_changed:
            out.append("profile changed")
        if self.guests > 1:
            out.append(f"sum of {self.guests} guests")
        return out


CellKey = tuple[str, str]  # (profile, test)


HOST_FIELDS = {"avgrq": "host_avgrq_sectors", "avgqu": "host_avgqu", "util": "host_util"}


def measured_side(run: Run, side: str, test: str, metric: str) -> Measured | None:
    """`run`'s figure of `test` in `metric` on `side` (guest or baseline): the median of its samples with its host
    disk metrics, labels and the test's other figures on that side, and the samples of each; None when the run
    stored none."""
    f = run.figure(side, test, metric)
    if f is None:
        return None
    kept: list[tuple[str, tuple[float, ...]]] = [("value", tuple(f.values))]
    host: dict[str, float | None] = {}
    for name, field_name in HOST_FIELDS.items():
        vals = tuple(v for m in f.samples if (v := getattr(m, field_name)) is not None)
        host[name] = f.host(field_name)
        if vals:
            kept.append((name, vals))
    others: dict[str, list[float]] = {}  # the test's other figures on this side, in measured order
    for m in sorted((m for m in run.measurements if m.side == side and m.test == test and m.metric != metric
                     and m.instance is None), key=lambda m: m.repeat):
        others.setdefault(m.metric, []).append(m.value)
    kept += [(name, tuple(vals)) for name, vals in others.items()]
    return Measured(f.median, host["avgrq"], host["avgqu"], host["util"], tuple(f.labels),
                    tuple((name, statistics.median(vals)) for name, vals in others.items()), tuple(kept))


def figures(m: Measured) -> dict[str, float]:
    """Every figure of a side by metric: its other figures (Bonnie++'s, IOzone's sweeps) and its number as MB/s."""
    return {**dict(m.others), "MB/s": m.value}
