"""Views over stored runs: the studies' comparison tables (Study A, Tables 1 and 2), and a run's headline numbers.

compare_table(runs) builds a Table: one Section per test, storage first (all writes, then all reads,
64 kB requests first, as Table 1 then Table 2), then network. Each section holds, per group of runs
sharing a node and target, a bare-metal row ("none", target, "-") and then one row per run:

    run  VMM                 target      driver                 MB/s  % of bare metal  avgrq  avgqu  util

"% of bare metal" (network: "% of baseline") always divides by the baseline measured in the SAME run.
Rows measured under emulation (TCG, or KVM nested in a TCG guest) carry the marker "*" and the table a
footnote saying so: such numbers are not overhead figures. A figure is the median of its samples (a test repeated in
the run), each row keeping its Summary and its % of bare metal's Ratio (core.record.stats) to be shown with their
intervals; a figure measured once is its one value, and a footnote says it has no interval. A random test's section
ends with a latency line per run: p50 / p99 / p99.9 in µs, bare metal and guest, read from fio's histograms merged
over every repeat and guest (core.record.latency), and at queue depth 1 the latency the guest adds. What the columns
say of a run and the markers are core.views.labels'; core.views.render renders a Table. run_summary(run) gives the
headline numbers for list views.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..record.fairness import spread
from ..record.hoststate import differences
from ..record.latency import Added, Latency
from ..record.rows import Figure, Run
from ..record.stats import Ratio, Summary
from ..spec.catalogue import (
    FIO_CS_TESTS,
    JOB_TESTS,
    MPI_TESTS,
    TESTS,
    base_test,
    is_storage_test,
    primary_metric,
    test_sort_key,
    test_title,
)
from .labels import (
    CAVEAT_LABELS,
    CAVEAT_MARK,
    EMULATED_MARK,
    EMULATED_NOTE,
    FEW_NOTE,
    INTERVAL_NOTE,
    MEAN_BASELINE_MARK,
    NESTED_NOTE,
    NFS_BASELINE_LABEL,
    ONCE_NOTE,
    ONCE_SOME_NOTE,
    RANGE_NOTE,
    VARIES_MARK,
    VARIES_NOTE,
    VOLUME_BASELINE_LABEL,
    driver_label,
    net_target,
    nic_label,
    target_label,
    vmm_label,
    volume_baseline_driver,
)

# --------------------------------------------------------------------------------------------------
# The table model
# --------------------------------------------------------------------------------------------------


@dataclass
class Column:
    key: str  # key into Row.cells
    title: str  # full title (markdown, csv header is the key)
    short: str  # title in the fixed-width text rendering
    numeric: bool = False


@dataclass
class Row:
    kind: str  # "baseline" | "guest"
    run_ids: list[int]
    cells: dict[str, Any]  # run, vmm, target, driver (str); value, pct, avgrq, avgqu, util (float | None)
    markers: list[str] = field(default_factory=list)
    emulated: bool = False
    labels: list[str] = field(default_factory=list)
    summary: Summary | None = None  # the figure in `value` over its samples; None where it is no one figure's
    ratio: Ratio | None = None  # `pct` with its interval
    samples: tuple[float, ...] = ()  # the figure's samples in measured order
    latency: Latency | None = None  # a random test's completion latency, its histograms merged (core.record.latency)
    added: Added | None = None  # a queue-depth-1 test's guest row: the latency it adds over its own bare metal

    @property
    def marker(self) -> str:
        return "".join(self.markers)


@dataclass
class Section:
    test: str
    title: str
    metric: str
    columns: list[Column]
    rows: list[Row] = field(default_factory=list)
    latency: list[str] = field(default_factory=list)  # a random test's latency lines, shown under its rows

    @property
    def storage(self) -> bool:
        return is_storage_test(self.test)


@dataclass
class Table:
    title: str
    run_ids: list[int]
    sections: list[Section] = field(default_factory=list)
    footnotes: list[str] = field(default_factory=list)
    legend: list[str] = field(default_factory=list)  # one line per run: id, profile, suite, size, accelerator

    def section(self, test: str) -> Section | None:
        return next((s for s in self.sections if s.test == test), None)


# --------------------------------------------------------------------------------------------------
# Building the table
# --------------------------------------------------------------------------------------------------


def _columns(test: str, metric: str) -> list[Column]:
    head = [
        Column("run", "run", "run"),
        Column("vmm", "VMM", "VMM"),
        Column("target", "target", "target"),
        Column("driver", "driver", "driver"),
        Column("value", metric, metric, True),
    ]
    if is_storage_test(test):
        return head + [
            Column("pct", "% of bare metal", "% bare", True),
            Column("avgrq", "avgrq (sectors)", "avgrq", True),
            Column("avgqu", "avgqu", "avgqu", True),
            Column("util", "util %", "util", True),
        ]
    return head + [Column("pct", "% of baseline", "% base", True)]


def _mean(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def percent_of_baseline(run: Run, test: str, metric: str) -> float | None:
    """guest / baseline * 100, both from this run (with repeats the ratio's estimate, Run.ratio); None if either is
    missing or baseline is 0."""
    r = run.ratio(test, metric)
    if r is not None:
        return r.percent
    g = run.value("guest", test, metric)
    b = run.value("baseline", test, metric)
    if g is None or not b:
        return None
    return g / b * 100.0  # a guest figure of 0 (a collapse) has no ratio interval, but its 0%


def _host_cells(f: Figure | None) -> dict[str, float | None]:
    """The host disk's metrics over the figure's windows (with repeats, each one's median)."""
    if f is None:
        return {"avgrq": None, "avgqu": None, "util": None}
    return {"avgrq": f.host("host_avgrq_sectors"), "avgqu": f.host("host_avgqu"), "util": f.host("host_util")}


def _figure_cells(row: Row, f: Figure, notes: _Notes, r: Run | None = None) -> Row:
    """`row` holding figure `f` (its median in `value`; `r`'s ratio in `pct`): its summary, samples and the marker
    of a figure that varies, each noted for the footnotes."""
    row.summary, row.samples = f.summary, tuple(f.values)
    row.cells["value"] = f.median
    if r is not None:
        row.ratio = r.ratio(f.test, f.metric, f.instance)
        if row.ratio is not None:
            row.cells["pct"] = row.ratio.percent
    notes.figure(row)
    if f.summary.flagged:
        row.markers.append(VARIES_MARK)
    return row


def _legend(r: Run) -> str:
    acc = {"tcg": "TCG (emulated)", "nested-kvm": "nested KVM"}.get(r.accelerator or "", r.accelerator or "?")
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.started_at)) if r.started_at else "?"
    n = guest_count(r)
    many = f", {n} guests at once ({_rows_note(r)}; bare metal: {n} processes)" if n > 1 else ""
    return (f"run #{r.id}: profile {r.profile_name or '?'}, suite {r.suite or '?'}, {r.size_label or '?'} size, "
            f"{acc}{many}, {when}, {r.state}")


def _rows_note(r: Run) -> str:
    """What the first row of a run of N guests holds: the guests' sum, or an MPI job's own aggregate (IOR's)."""
    mpi = {base_test(m.test) in MPI_TESTS for m in r.measurements}
    fio = any(base_test(m.test) in FIO_CS_TESTS for m in r.measurements)
    if mpi == {True}:
        return "rows: the MPI job's aggregate, then each rank"
    if True in mpi:
        return "rows: their sum (an MPI job: its aggregate), then each guest or rank"
    if fio:
        return "rows: their sum (fio --client: its aggregate over the servers), then each guest"
    return "rows: their sum, then each guest"


def guest_count(r: Run) -> int:
    """The guests the run ran at once (1 for a run of one guest)."""
    g = r.provenance.guests
    return g.count if g is not None else 1


def guest_profiles(r: Run) -> dict[int, str]:
    """A mixed run's guests' profiles by instance number (1-based); {} for a run of one profile."""
    g = r.provenance.guests
    if g is None or not g.profiles:
        return {}
    return {k: x.profile for k, x in enumerate(g.guests, 1) if x.profile}


def instance_rows(r: Run, side: str, test: str, metric: str, storage: bool, notes: _Notes | None = None) -> list[Row]:
    """A run of N guests: one row per guest (side guest) or bare-metal process (side baseline), under its sum; a
    mixed run's guest rows name each guest's profile."""
    out = []
    mixed = guest_profiles(r) if side == "guest" else {}
    for f in r.instance_figures(side, test, metric):
        row = Row(kind=side, run_ids=[r.id],
                  cells={"run": f"#{r.id} {'g' if side == 'guest' else 'p'}{f.instance}",
                         "vmm": "",
                         "target": "", "driver": mixed.get(f.instance or 0, ""), "value": f.median, "pct": None},
                  emulated=r.emulated and side == "guest")
        if storage:
            row.cells.update(avgrq=None, avgqu=None, util=None)
        row.latency = r.latency(side, test, f.instance)
        out.append(_figure_cells(row, f, notes or _Notes()))
    return out


def spread_note(r: Run, test: str, metric: str) -> str | None:
    """A run of N guests: how `test`'s figure split among them (core.record.fairness), and the guests' start skew."""
    guests = r.instance_figures("guest", test, metric)
    if not guests:
        return None
    g = spread([f.median for f in guests])
    if base_test(test) in JOB_TESTS:  # one job: its own aggregate, each rank timed over its own share
        job = r.figure("guest", test, metric)
        mpi = base_test(test) in MPI_TESTS
        one = "one MPI job, a rank" if mpi else "one fio --client job, a fio --server"
        note = (f"#{r.id} {test}: {one} in each of {g.n} guests, "
                f"{'-' if job is None else f'{job.median:.1f}'} {metric} (all bytes over the job's time); per "
                f"{'rank' if mpi else 'server'} "
                f"(over its own time) min {g.min:.1f} / median {g.median:.1f} / max {g.max:.1f}; Jain's fairness "
                f"index {g.jain:.3f}")
    else:
        note = (f"#{r.id} {test}: {g.n} guests, sum {g.total:.1f} {metric}; per guest min {g.min:.1f} / median "
                f"{g.median:.1f} / max {g.max:.1f}; Jain's fairness index {g.jain:.3f}")
    mixed = guest_profiles(r)
    if mixed and base_test(test) not in JOB_TESTS:
        by: dict[str, list[float]] = {}
        for f in guests:
            by.setdefault(mixed.get(f.instance or 0, "?"), []).append(f.median)
        note += "; by profile: " + ", ".join(f"{name} {statistics.median(v):.1f}"
                                             + (f" (median of {len(v)})" if len(v) > 1 else "")
                                             for name, v in by.items())
    info = r.provenance.guests
    if info is not None and test in info.skew_s:
        note += f"; start skew {info.skew_s[test] * 1000:.0f} ms"
    base = r.instance_figures("baseline", test, metric)
    if base:
        b = spread([f.median for f in base])
        if base_test(test) in MPI_TESTS:
            job = r.figure("baseline", test, metric)
            note += (f". Bare metal, one job of {b.n} ranks: {'-' if job is None else f'{job.median:.1f}'}, per rank "
                     f"min {b.min:.1f} / median {b.median:.1f} / max {b.max:.1f}, Jain {b.jain:.3f}")
        else:
            note += (f". Bare metal, {b.n} processes: sum {b.total:.1f}, min {b.min:.1f} / median {b.median:.1f} / "
                     f"max {b.max:.1f}, Jain {b.jain:.3f}")
    return note


@dataclass
class _Notes:
    """What a table's rows call for in its footnotes, gathered while the rows are built."""

    emulated: bool = False
    nested: bool = False
    mean_baselines: list[str] = field(default_factory=list)
    spreads: list[str] = field(default_factory=list)
    caveats: dict[int, set[str]] = field(default_factory=dict)  # labels in CAVEAT_LABELS, by run
    once: bool = False  # a figure measured once (no interval)
    repeated: bool = False  # a figure of several samples, or a ratio over them
    interval: bool = False  # an interval shown (a median's or a ratio's)
    few: bool = False  # a median of 2-5 samples: no interval
    ranged: bool = False  # a ratio's interval that is the range of its pairs
    varies: bool = False  # a figure flagged for its spread

    def figure(self, row: Row) -> None:
        """Note what a row's figure and ratio call for: an interval, too few samples for one, one sample."""
        s, r = row.summary, row.ratio
        if s is not None:
            self.once = self.once or s.n == 1
            self.repeated = self.repeated or s.n > 1
            self.interval = self.interval or s.low is not None
            self.few = self.few or (s.n > 1 and s.low is None)
            self.varies = self.varies or s.flagged
        if r is not None and (r.n_a > 1 or r.n_b > 1):
            self.repeated = True
            self.interval = self.interval or r.has_interval
            self.ranged = self.ranged or r.method == "range"

    def caveat(self, r: Run, labels: Iterable[str]) -> bool:
        """Note the caveats among a figure's labels; whether it has any."""
        cav = [lab for lab in labels if lab in CAVEAT_LABELS]
        if cav:
            self.caveats.setdefault(r.id, set()).update(cav)
        return bool(cav)

    def footnotes(self) -> list[str]:
        out = [NESTED_NOTE if self.nested else EMULATED_NOTE] if self.emulated else []
        out += self.mean_baselines + self.spreads
        if self.caveats:
            out.append(_caveat_note(self.caveats))
        out += [note for note, wanted in ((VARIES_NOTE, self.varies), (INTERVAL_NOTE, self.interval),
                                          (RANGE_NOTE, self.ranged), (FEW_NOTE, self.few)) if wanted]
        if self.once:
            out.append(ONCE_SOME_NOTE if self.repeated else ONCE_NOTE)
        return out


def _caveat_note(caveats: dict[int, set[str]]) -> str:
    """The footnote naming each run's caveats and what each means."""
    present = set().union(*caveats.values())
    return (f"{CAVEAT_MARK} caveats: "
            + "; ".join(f"#{rid}: {', '.join(sorted(labs))}" for rid, labs in sorted(caveats.items()))
            + " (" + "; ".join(f"{lab}: {CAVEAT_LABELS[lab]}" for lab in CAVEAT_LABELS if lab in present) + ")")


def _tests(runs: Sequence[Run], side: str | None = None) -> list[str]:
    """Every test the runs measured (on `side`, or on either), in the tables' order."""
    tests: dict[str, None] = {}
    for r in runs:
        for t in r.tests(side):
            tests.setdefault(t, None)
    return sorted(tests, key=test_sort_key)


def _metric(test: str, runs: Sequence[Run]) -> str:
    """The metric `test`'s section shows, of those the runs measured it in."""
    return primary_metric(test, [m.metric for r in runs for m in r.measurements if m.test == test])


def compare_table(runs: Sequence[Run], title: str | None = None) -> Table:
    """The Table 1/2 layout for these runs (order kept within each node/target group)."""
    runs = list(runs)
    table = Table(
        title=title or ("Run " if len(runs) == 1 else "Runs ") + ", ".join(f"#{r.id}" for r in runs),
        run_ids=[r.id for r in runs],
        legend=[_legend(r) for r in runs],
    )
    notes = _Notes()
    for test in _tests(runs):
        # an MPI job's read phase is a figure of its own (its write is the primary)
        for metric in [_metric(test, runs), *(["read MB/s"] if base_test(test) in MPI_TESTS else [])]:
            section = _section(runs, test, metric, notes)
            if section.rows:
                table.sections.append(section)
    table.footnotes.extend(notes.footnotes())
    table.footnotes.extend(host_notes(runs))
    return table


def host_notes(runs: Sequence[Run]) -> list[str]:
    """What differs between the runs' hosts, each run against the first that recorded its host's state (CPU
    frequency and idle states, THP, NUMA, kernel command line, microcode, disk, NIC): one note per run that differs,
    one when none does, and the runs that recorded none. [] for one run."""
    if len(runs) < 2:
        return []
    known = [(r, h) for r in runs if (h := r.provenance.host_state) is not None]
    missing = [r for r in runs if r.provenance.host_state is None]
    out = []
    if len(known) >= 2:
        first, ref = known[0]
        same = []
        for r, h in known[1:]:
            diffs = differences(ref, h)
            if (a := first.provenance.host) != (b := r.provenance.host):
                diffs.insert(0, f"host {a or '?'} / {b or '?'}")
            if diffs:
                out.append(f"Host state differs, #{first.id} / #{r.id}: " + "; ".join(diffs))
            else:
                same.append(r)
        if same:
            out.append(f"Host state the same in #{first.id} and " + ", ".join(f"#{r.id}" for r in same)
                       + " (CPU frequency and idle states, SMT, THP, NUMA, kernel command line, microcode, disk, NIC)")
    if missing and known:
        out.append("No host state recorded for " + ", ".join(f"#{r.id}" for r in missing)
                   + " (measured before cloudbox recorded it): what differs there is not known")
    return out


def _section(runs: Sequence[Run], test: str, metric: str, notes: _Notes) -> Section:
    """`test` in `metric`: per group of runs, its bare-metal row, then each run's own row, each followed by the rows
    of its N guests (or bare-metal processes)."""
    section = Section(test, test_title(test) + (" - the read job" if metric == "read MB/s" else ""), metric,
                      _columns(test, metric))
    storage = is_storage_test(test)
    for (_node, target, host, n), members in _groups(runs, test, metric, storage).items():
        bases = [(r, bf) for r in members if (bf := r.figure("baseline", test, metric)) is not None]
        if bases:
            section.rows.append(_baseline_row(bases, test, target, host, n, storage, notes))
            for r, _ in bases:
                section.rows += instance_rows(r, "baseline", test, metric, storage, notes)
        for r in members:
            f = r.figure("guest", test, metric)
            if f is None:
                continue
            section.rows.append(_guest_row(r, f, target, storage, notes))
            section.rows += instance_rows(r, "guest", test, metric, storage, notes)
            if (spread_line := spread_note(r, test, metric)) is not None:
                notes.spreads.append(spread_line)
    section.latency = latency_lines(runs, test)
    return section


LATENCY_HEAD = ("completion latency, µs, p50 / p99 / p99.9 of fio's histograms merged over every repeat and guest "
                "(never percentiles averaged)")


def qd1(test: str) -> bool:
    """A random test at queue depth 1: its latency is one request's round trip, what a guest adds to it shows."""
    t = TESTS.get(base_test(test))
    return t is not None and t.rw.startswith("rand") and t.iodepth == 1


def latency_lines(runs: Sequence[Run], test: str) -> list[str]:
    """A random test's latency: a head, then per run its bare metal's and guest's p50 / p99 / p99.9 (and how many
    samples and guests each merges), at queue depth 1 the latency the guest adds at p50; [] without histograms."""
    out = []
    for r in runs:
        parts = []
        for side, name in (("baseline", "bare metal"), ("guest", "guest")):
            lat = r.latency(side, test)
            if lat is not None:
                parts.append(f"{name} {lat.text()}{_merged(r, lat)}")
        if not parts:
            continue
        add = r.added_latency(test) if qd1(test) else None
        out.append(f"#{r.id}: " + ", ".join(parts) + ("" if add is None else f"; added at p50 {add.text()}"))
    return [LATENCY_HEAD + ":", *out] if out else []


def _merged(r: Run, lat: Latency) -> str:
    """What a latency line's figures merge: " (n=3)", " (n=3, 4 guests)", "" for one sample of one guest."""
    many = len({m.instance for m in r.measurements if m.side == lat.side and m.test == lat.test
                and m.instance is not None and m.histogram is not None})
    what = [f"n={lat.n}"] if lat.n > 1 else []
    if many > 1:
        what.append(f"{many} {'guests' if lat.side == 'guest' else 'processes'}")
    return f" ({', '.join(what)})" if what else ""


def _groups(runs: Sequence[Run], test: str, metric: str, storage: bool) -> dict[tuple[str, str, str, int], list[Run]]:
    """The runs that measured `test` in `metric`, by what one bare-metal row stands for: node, target, the host
    that ran the baseline and the number of guests."""
    groups: dict[tuple[str, str, str, int], list[Run]] = {}
    for r in runs:
        if r.measurement("guest", test, metric) or r.measurement("baseline", test, metric):
            ms = [m for m in r.measurements if m.test == test]
            target = target_label(r) if storage else net_target(r, ms)
            bm = r.measurement("baseline", test, metric)
            host = "dom0" if bm is not None and "dom0" in bm.labels else "none"
            # a baseline of N processes is never averaged with one of another N
            groups.setdefault((r.node or "", target, host, guest_count(r)), []).append(r)
    return groups


def _baseline_row(bases: list[tuple[Run, Figure]], test: str, target: str, host: str, n: int, storage: bool,
                  notes: _Notes) -> Row:
    """A group's bare-metal row: its run's figure, or the mean of its runs' own baselines (each run's % uses its
    own)."""
    agg = "job" if base_test(test) in MPI_TESTS else "sum"  # fio --client's bare metal: N processes
    fs_b = [f for _, f in bases]
    labels = {lab for f in fs_b for lab in f.labels}
    from_host = storage and VOLUME_BASELINE_LABEL in labels
    if from_host:
        driver = volume_baseline_driver(bases[0][0], labels)
    elif storage and NFS_BASELINE_LABEL in labels:
        driver = "the export's directory, no NFS"
    else:
        driver = "-"
    row = Row(
        kind="baseline",
        run_ids=[r.id for r, _ in bases],
        cells={
            "run": ",".join(f"#{r.id}" for r, _ in bases) + (f" {agg}" if n > 1 else ""),
            "vmm": host if host != "none" else ("host domain" if from_host else "none"),
            "target": target,
            "driver": driver,
            "value": _mean(f.median for f in fs_b),
            "pct": None,
        },
        labels=sorted(labels - {"emulated"}),
    )
    if storage:
        row.cells.update(
            avgrq=_mean(f.host("host_avgrq_sectors") for f in fs_b),
            avgqu=_mean(f.host("host_avgqu") for f in fs_b),
            util=_mean(f.host("host_util") for f in fs_b),
        )
    lats = [lat for r, _ in bases if (lat := r.latency("baseline", test)) is not None]
    if lats:  # several runs' baselines: every repeat of each merged
        row.latency = Latency("baseline", test, None, tuple(h for lat in lats for h in lat.repeats))
    if len(bases) == 1:
        _figure_cells(row, fs_b[0], notes)
    else:
        row.markers.append(MEAN_BASELINE_MARK)
        note = (
            f"{MEAN_BASELINE_MARK} bare-metal row of {', '.join(f'#{r.id}' for r, _ in bases)}: "
            "mean of those runs' own baselines; each run's % uses its own baseline"
        )
        if note not in notes.mean_baselines:
            notes.mean_baselines.append(note)
    return row


def _guest_row(r: Run, f: Figure, target: str, storage: bool, notes: _Notes) -> Row:
    """A run's own row: its guest's figure (of N guests, their sum or the job's own aggregate) and the % of its own
    bare metal."""
    test, metric = f.test, f.metric
    row = Row(
        kind="guest",
        run_ids=[r.id],
        cells={
            "run": f"#{r.id}",
            "vmm": vmm_label(r),
            "target": target,
            "driver": driver_label(r) if storage else nic_label(r),
            "value": f.median,
            "pct": percent_of_baseline(r, test, metric),
        },
        emulated=r.emulated,
        labels=[lab for lab in f.labels if lab != "emulated"],
    )
    if storage:
        row.cells.update(_host_cells(f))
    if r.emulated:
        row.markers.append(EMULATED_MARK)
        notes.emulated = True
        notes.nested = notes.nested or r.accelerator == "nested-kvm"
    if notes.caveat(r, f.labels):
        row.markers.append(CAVEAT_MARK)
    _figure_cells(row, f, notes, r)
    row.latency = r.latency("guest", test)
    row.added = r.added_latency(test) if qd1(test) else None
    if guest_count(r) > 1:
        row.cells["run"] = f"#{r.id} {'job' if base_test(test) in JOB_TESTS else 'sum'}"
    return row


def guest_sweep_table(runs: Sequence[Run]) -> Table:
    """Runs of 1, 2, 4... guests side by side, per test: the guests' sum, each guest's min/median/max, Jain's index,
    the start skew, the sum as % of bare metal with the same number of processes, and the host disk's queue."""
    runs = list(runs)
    table = Table(title="Guests at once: runs " + ", ".join(f"#{r.id}" for r in runs), run_ids=[r.id for r in runs],
                  legend=[_legend(r) for r in runs])
    notes = _Notes()
    for test in _tests(runs, "guest"):
        metric = _metric(test, runs)
        section = Section(test, test_title(test), metric, _sweep_columns(test, metric))
        for r in runs:
            total = r.figure("guest", test, metric)
            if total is not None:
                section.rows.append(_sweep_row(r, total, test, metric, notes))
        if section.rows:
            table.sections.append(section)
    table.footnotes.extend(notes.footnotes())
    return table


def _sweep_columns(test: str, metric: str) -> list[Column]:
    agg = "job" if base_test(test) in JOB_TESTS else "sum"  # a job's own aggregate, not its ranks' sum
    return [Column("run", "run", "run"), Column("guests", "guests", "N", True),
            Column("value", f"{agg} {metric}", f"{agg} {metric}", True), Column("min", "min", "min", True),
            Column("median", "median", "median", True), Column("max", "max", "max", True),
            Column("jain", "Jain's index", "Jain", True), Column("skew", "start skew ms", "skew ms", True),
            Column("base", f"bare metal {metric}", "bare", True),
            Column("pct", "% of bare metal", "% bare", True),
            Column("avgqu", "avgqu", "avgqu", True), Column("util", "util %", "util", True)]


def _sweep_row(r: Run, total: Figure, test: str, metric: str, notes: _Notes) -> Row:
    """A run of N guests in the sweep: their sum, how it split among them (each guest's median), and its bare metal."""
    each = r.instance_figures("guest", test, metric) or [total]
    g = spread([f.median for f in each])
    info = r.provenance.guests
    skew = info.skew_s.get(test) if info is not None else None
    row = Row(kind="guest", run_ids=[r.id], emulated=r.emulated,
              cells={"run": f"#{r.id}", "guests": guest_count(r), "value": total.median, "min": g.min,
                     "median": g.median, "max": g.max, "jain": g.jain,
                     "skew": None if skew is None else skew * 1000,
                     "base": r.value("baseline", test, metric), "pct": percent_of_baseline(r, test, metric),
                     "avgqu": total.host("host_avgqu"), "util": total.host("host_util")},
              labels=[lab for lab in total.labels if lab != "emulated"])
    _figure_cells(row, total, notes, r)
    if r.emulated:
        row.cells["run"] += f" {EMULATED_MARK}"
        notes.emulated = True
    if notes.caveat(r, total.labels):
        row.cells["run"] += f" {CAVEAT_MARK}"
    if total.summary.flagged:  # the sweep has no VMM column: its markers follow the run
        row.cells["run"] += f" {VARIES_MARK}"
    return row


# --------------------------------------------------------------------------------------------------
# A run's headline numbers
# --------------------------------------------------------------------------------------------------


def run_summary(run: Run) -> dict[str, Any]:
    """Headline numbers for list views: sequential write/read MB/s with % of this run's baseline,
    TCP stream Mbit/s. Missing numbers are None; 'emulated' says how to label them. Each figure's `_n` says how
    many samples it is the median of; `_ci` and `_pct_ci` are the figure's and its % of bare metal's intervals
    ([low, high]; None without one); `_flagged` that its samples vary more than stats.CV_FLAG."""

    def pick(name: str, unit: str, candidates: Sequence[str], metric: str) -> dict[str, Any]:
        for t in candidates:
            f = run.figure("guest", t, metric)
            if f is not None:
                r, s = run.ratio(t, metric), f.summary
                return {f"{name}_test": t, f"{name}_{unit}": f.median,
                        f"{name}_pct": percent_of_baseline(run, t, metric), f"{name}_n": f.n,
                        f"{name}_ci": None if s.low is None else [s.low, s.high],
                        f"{name}_pct_ci": [r.low, r.high] if r is not None and r.has_interval else None,
                        f"{name}_flagged": s.flagged}
        return {f"{name}_test": None, f"{name}_{unit}": None, f"{name}_pct": None, f"{name}_n": 0, f"{name}_ci": None,
                f"{name}_pct_ci": None, f"{name}_flagged": False}

    return {
        "id": run.id,
        "uuid": run.uuid,
        "profile": run.profile_name,
        "state": run.state,
        "reason": run.reason,
        "suite": run.suite,
        "size_label": run.size_label,
        "accelerator": run.accelerator,
        "emulated": run.emulated,
        "vmm": vmm_label(run),
        "node": run.node,
        "started_at": run.started_at,
        "duration": run.duration,
        **pick("seq_write", "mbps", ("seq-write-64k", "dd-write-64k", "seq-write-1m", "rec-write-1m"), "MB/s"),
        **pick("seq_read", "mbps", ("seq-read-64k", "dd-read-64k", "seq-read-1m", "rec-read-1m"), "MB/s"),
        **pick("tcp_stream", "mbits", ("tcp-stream", "iperf3-tx"), "Mbit/s"),
    }
