"""A cell of a study's matrix as a stored run measured it: the guest's number beside the same run's bare-metal one,
with the host disk's metrics and the reasons it is weaker than the paper's (emulated, nested, quick, ...)."""

from __future__ import annotations

from dataclasses import dataclass

from ..record.rows import Run


@dataclass(frozen=True)
class Measured:
    """One side's number of a cell with the host disk's metrics over its window and its labels."""

    value: float
    avgrq: float | None = None
    avgqu: float | None = None
    util: float | None = None
    labels: tuple[str, ...] = ()
    others: tuple[tuple[str, float], ...] = ()  # the test's other figures on this side (Bonnie++'s), by metric

    def metric(self, name: str) -> float | None:
        return self.value if name == "value" else getattr(self, name)


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


def measured_side(run: Run, side: str, test: str, metric: str) -> Measured | None:
    """`run`'s number of `test` in `metric` on `side` (guest or baseline), with its host disk metrics, labels and the
    test's other figures on that side; None when the run stored none."""
    m = run.measurement(side, test, metric)
    if m is None:
        return None
    others = tuple((o.metric, o.value) for o in run.measurements
                   if o.side == side and o.test == test and o.metric != metric and o.instance is None)
    return Measured(m.value, m.host_avgrq_sectors, m.host_avgqu, m.host_util, tuple(m.labels), others)


def figures(m: Measured) -> dict[str, float]:
    """Every figure of a side by metric: its other figures (Bonnie++'s, IOzone's sweeps) and its number as MB/s."""
    return {**dict(m.others), "MB/s": m.value}
