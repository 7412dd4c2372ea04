"""What the store holds for a study: for each cell the best completed run (select_cells), and with the verdicts, a
series' repeats and a sweep's samples, one Evidence (gather) that the reports and the summary read."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..record.rows import Run
from ..record.rows import Sample as HostSample
from ..spec import profiles
from ..spec.catalogue import is_storage_test, primary_metric
from ..views.compare import guest_count
from ..views.labels import knobs
from ..virt import accel
from .cells import Cell, CellKey, Measured, StudyRunTag, measured_side
from .imagesweep import SweepEvidence, gather_sweep
from .loading import cannot_run, cannot_run_here
from .schema import Study
from .series import Sample, gather_series, series_guests
from .verdicts import NOT_REPRODUCED, REPRODUCED, VERDICTS, Verdict, evaluate


def select_cells(study: Study, runs: Sequence[Run], hashes: Mapping[str, str], *, size: str | None = None,
                 node: str | None = None) -> dict[CellKey, Cell]:
    """For each (profile, test) of the study, the cell of the best completed run measuring it: a run of the profile
    as it is today (`hashes`: name -> hash) before one of an older version of it, the study size before quick
    (only `size` when given), then the latest; only runs on `node` when given. Only runs of one guest (a run of N
    stores their sum, which no paper's one-instance figure compares with), but in a series those of the guest
    count its variability section shows."""
    sizes: list[str] = [size] if size else list(study.sizes)
    best: dict[CellKey, tuple[tuple[Any, ...], Cell]] = {}
    wanted: dict[tuple[str, str, str], int] = {}

    def guests_for(profile: str, test: str, sz: str) -> int:
        if study.series is None:
            return 1
        if (profile, test, sz) not in wanted:
            wanted[(profile, test, sz)] = series_guests(study, runs, profile, hashes.get(profile), test, sz, node)
        return wanted[(profile, test, sz)]

    for run in runs:
        if run.state != "completed" or run.profile_name not in study.profile_names or run.size_label not in sizes:
            continue
        if node and run.node != node:
            continue
        current = hashes.get(run.profile_name)
        changed = bool(current and run.profile_hash and run.profile_hash != current)
        n = guest_count(run)
        for test in study.test_ids:
            if n != guests_for(run.profile_name, test, run.size_label or ""):
                continue
            metric = primary_metric(test, [m.metric for m in run.measurements if m.test == test])
            guest = measured_side(run, "guest", test, metric)
            if guest is None:
                continue
            rank = (not changed, -sizes.index(run.size_label or ""), run.started_at or 0.0, run.id)
            key = (run.profile_name, test)
            if key in best and best[key][0] >= rank:
                continue
            best[key] = (rank, _cell(run, run.profile_name, test, metric, guest, changed=changed, guests=n))
    return {k: v[1] for k, v in best.items()}


def _cell(run: Run, profile: str, test: str, metric: str, guest: Measured, *, changed: bool, guests: int) -> Cell:
    """`run`'s cell of (`profile`, `test`): the guest's number (`guest`), bare metal's beside it with every figure
    bare metal stored, and the facts of the run its qualifiers and cost columns read."""
    return Cell(profile, test, run.id, guest, measured_side(run, "baseline", test, metric), metric=metric,
                size_label=run.size_label, accelerator=run.accelerator, emulated=run.emulated, node=run.node,
                started_at=run.started_at, profile_changed=changed, host_cores=run.provenance.host_cores,
                guest_memory_mib=knobs(run).memory_mib,
                baseline_figures=_medians(run, "baseline", test),
                guests=guests, study_run=StudyRunTag.of(run))


def _medians(run: Run, side: str, test: str) -> tuple[tuple[str, float], ...]:
    """Every figure `run` stored for `test` on `side` (not one guest's of N), by metric: the median of its samples."""
    by: dict[str, list[float]] = {}
    for m in run.measurements:
        if m.side == side and m.test == test and m.instance is None:
            by.setdefault(m.metric, []).append(m.value)
    return tuple((metric, statistics.median(vals)) for metric, vals in by.items())


@dataclass
class Evidence:
    """What the store holds for a study: the profiles' hashes today, which profiles cannot run here yet (and why),
    the selected cells and the verdicts."""

    study: Study
    hashes: dict[str, str]
    unavailable: dict[str, str]
    cells: dict[CellKey, Cell]
    verdicts: list[Verdict]
    size: str | None = None
    node: str | None = None
    series: dict[CellKey, list[Sample]] = field(default_factory=dict)  # a series study's repeats per cell
    host: dict[CellKey, dict[str, list[HostSample]]] = field(default_factory=dict)  # attach_host_samples
    sweep: SweepEvidence | None = None  # a study with an image-propagation sweep: its stored samples


def profile_facts(study: Study, *, here: bool = True) -> tuple[dict[str, str], dict[str, str]]:
    """(name -> hash today, name -> why it cannot run yet) for the study's profiles; `here`: also why not on the
    hypervisor this host is booted into (a Xen profile on Linux, a KVM one on Xen's dom0)."""
    hashes: dict[str, str] = {}
    unavailable: dict[str, str] = {}
    boot = accel.boot_of(None) if here else None
    for name in study.profile_names:
        prof = profiles.find_profile(name)
        hashes[name] = prof.hash
        booted = boot.refusal(prof.guest.hypervisor, profiles.xen_guest_type(prof), prof.disk.raid_on) if boot else None
        why = cannot_run(prof) or booted or (cannot_run_here(prof) if here else None)
        if why:
            unavailable[name] = why
    return hashes, unavailable


def gather(study: Study, runs: Sequence[Run], *, size: str | None = None, node: str | None = None) -> Evidence:
    """The evidence for `study` in `runs` (ResultStore.list_runs(): cells and series come from the completed runs
    among them, a sweep's samples from every finished propagation run)."""
    hashes, unavailable = profile_facts(study, here=node is None)
    cells = select_cells(study, runs, hashes, size=size, node=node)
    verdicts = evaluate(study, cells, unavailable=unavailable, size=size)
    series = gather_series(study, runs, hashes, size=size, node=node) if study.series else {}
    sweep = gather_sweep(study, runs, hashes, size=size, node=node)
    return Evidence(study, hashes, unavailable, cells, verdicts, size, node, series, sweep=sweep)


def attach_host_samples(ev: Evidence, fetch: Callable[[int, str], Sequence[HostSample]]) -> Evidence:
    """Fill `ev.host`: per storage cell, the host disk's samples (one a second) of its run while the guest's and
    while the bare-metal test ran, by side; `fetch(run_id, "side:test")` reads them (ResultStore.samples)."""
    for (profile, test), cell in ev.cells.items():
        if not is_storage_test(test):
            continue
        sides = {side: list(fetch(cell.run_id, f"{side}:{test}")) for side in ("guest", "baseline")}
        if any(sides.values()):
            ev.host[(profile, test)] = sides
    return ev


@dataclass(frozen=True)
class StudySummary:
    """A study in one line: its matrix's size, the cells holding a number, and the findings by verdict."""

    name: str
    title: str
    cells: int
    with_results: int
    verdicts: dict[str, int]
    problem: str | None = None

    @property
    def checked(self) -> int:
        """Findings with a verdict other than inconclusive."""
        return self.verdicts.get(REPRODUCED, 0) + self.verdicts.get(NOT_REPRODUCED, 0)

    @property
    def reproduced(self) -> int:
        return self.verdicts.get(REPRODUCED, 0)

    @property
    def findings(self) -> int:
        return sum(self.verdicts.values())


def summarize(ev: Evidence) -> StudySummary:
    """The summary of gathered evidence."""
    study = ev.study
    counts = {s: sum(1 for v in ev.verdicts if v.status == s) for s in VERDICTS}
    return StudySummary(study.name, study.title, len(study.profiles) * len(study.tests), len(ev.cells), counts)
