"""How a study's report writes its numbers, in its tables and its figures alike: ours with the interval of their
samples where there is one and the reasons they are weaker than the paper's in brackets ("21.4 [20.9, 22.0]
(emulated, quick)"), a percentage of native with its interval, how many samples each rests on, the paper's as it
published them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ..bench import propagation
from ..record import stats
from .cells import Cell
from .schema import Study
from .series import Sample


def value_text(v: float | None, metric: str) -> str:
    """A number in `metric` as the report writes it: whole IOPS, Mbit/s and transactions, one decimal else."""
    if v is None:
        return "-"
    return f"{v:.0f}" if metric in ("IOPS", "Mbit/s", "trans/s") else f"{v:.1f}"


def qualified(text: str, qualifiers: Sequence[str]) -> str:
    """`text` with its qualifiers in brackets, "21.4 (emulated, quick)"; a missing number ("-") carries none."""
    return f"{text} ({', '.join(qualifiers)})" if qualifiers and text != "-" else text


def ours_text(cell: Cell, metric: str | None = None, *, drop: Sequence[str] = ()) -> str:
    """A cell's number as the report's tables write it: the median of its samples, their median's 95% interval when
    there are enough (6), and the reasons it is weaker than the paper's in brackets: "21.4 [20.9, 22.0] (emulated,
    quick)", "21.4 (emulated, quick)" measured once. `metric` picks the number's format (the cell's own by
    default); `drop` leaves out the qualifiers a table states once for all its figures."""
    m = metric or cell.metric
    s = cell.guest.summary
    ci = "" if s.low is None or s.high is None else f" [{value_text(s.low, m)}, {value_text(s.high, m)}]"
    return qualified(value_text(cell.guest.value, m) + ci, [q for q in cell.qualifiers if q not in drop])


def ratio_text(r: stats.Ratio | None) -> str:
    """A percentage of native (or of another cell) as the tables write it, without the % their heading gives: "96.3
    [95.1, 97.2]", with the coverage where it is below 95% ("96.3 [90.2, 99.1] (90%)"), "96.3" without an
    interval; "-" for none."""
    if r is None:
        return "-"
    if not r.has_interval:
        return f"{r.percent:.1f}"
    cover = f" ({r.coverage:.0%})" if r.method == "range" and r.coverage is not None else ""
    return f"{r.percent:.1f} [{r.low:.1f}, {r.high:.1f}]{cover}"


def n_text(cell: Cell) -> str:
    """How many samples a cell's row rests on: "8+8" (guest + bare metal), "8" without a bare-metal figure."""
    return f"{cell.guest.n}+{cell.baseline.n}" if cell.baseline is not None else str(cell.guest.n)


def paper_text(study: Study, profile: str, test: str) -> str:
    """The paper's number for a cell as the report's tables write it, "-" when it published none."""
    pc = study.paper_cell(profile, test)
    return published_text(pc.value if pc else None)


def sample_qualifiers(samples: Sequence[Sample]) -> list[str]:
    """Why a series' numbers are weaker than a study-sized one on bare hardware, in a word each."""
    out = []
    if any(x.accelerator == "nested-kvm" for x in samples):
        out.append("nested")
    elif any(x.emulated for x in samples):
        out.append("emulated")
    if any(x.size_label == "quick" for x in samples):
        out.append("quick")
    return out


def host_qualifiers(labels: Iterable[Sequence[str]], guest_qualifiers: Sequence[str] = ()) -> list[str]:
    """The bare-metal side's qualifiers: "virtualized host" when any of its figures (`labels`) ran on a virtual
    machine, and of the guest side's only the size: it ran without the guest's accelerator."""
    return ((["virtualized host"] if any("virtualized-host" in ls for ls in labels) else [])
            + [q for q in guest_qualifiers if q == "quick"])


QUALIFIER_ORDER = ("nested", "emulated", "quick", "warm cache", "profile changed")


def sweep_qualifiers(samples: Sequence[propagation.Sample]) -> list[str]:
    """The qualifiers any of these samples carries, in the report's order."""
    present = {q for x in samples for q in x.qualifiers}
    return [q for q in QUALIFIER_ORDER if q in present]


def secs_text(v: float) -> str:
    """Seconds as the sweep's table and plot write them: two decimals under 100 s."""
    return f"{v:.2f}" if abs(v) < 100 else f"{v:.0f}"


def published_text(v: float | None) -> str:
    """A published number as the paper writes it (111, 1.3, 0.57)."""
    return "-" if v is None else f"{v:g}"
