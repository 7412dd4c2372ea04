"""Where each cell of a study's matrix stands: done, failed, running, not run or cannot run here, with a series'
repeats (the TUI's Studies screen)."""

from __future__ import annotations

import dataclasses
import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..record.rows import Run
from ..spec.catalogue import is_storage_test
from ..views.compare import guest_count
from .cells import Cell, CellKey
from .schema import Study, needs_node
from .series import Sample

NOT_RUN = "not run"
DONE = "done"
FAILED = "failed"
RUNNING = "running"
CANNOT_RUN = "cannot run"
CELL_STATES = (NOT_RUN, DONE, FAILED, RUNNING, CANNOT_RUN)


@dataclass(frozen=True)
class CellState:
    """Where one cell of the matrix stands: done (its selected `cell`); failed or running (the latest run of the
    profile that would measure it, newer than any stored number, in `run_id`, with its reason when failed); not run;
    or cannot run here (`reason`). A failed or running cell keeps the older number it has, if any, in `cell`."""

    profile: str
    test: str
    state: str
    cell: Cell | None = None
    run_id: int | None = None
    reason: str | None = None
    repeats: tuple[int, int] | None = None  # a series: (repeats stored, repeats planned at their size)

    @property
    def series_text(self) -> str:
        """"3 of 5 repeats" for a series cell, else empty."""
        return "" if self.repeats is None else f"{self.repeats[0]} of {self.repeats[1]} repeats"


def _covers(run: Run, test: str) -> bool:
    """Whether a run of `run.suite` would measure `test` (its measurements say so once it stored one). A front-end
    test only a run on a back-end measures: one on this host (its node is this host's name) does not."""
    if run.measurement("guest", test) is not None:
        return True
    if needs_node(test) and run.node in (None, "", platform.node()):
        return False
    if is_storage_test(test):
        return run.suite in ("storage", "all")
    return run.suite in ("network", "all")


def cell_states(study: Study, runs: Sequence[Run], cells: Mapping[CellKey, Cell], *,
                unavailable: Mapping[str, str] | None = None, size: str | None = None,
                series: Mapping[CellKey, Sequence[Sample]] | None = None) -> list[CellState]:
    """Every cell of the matrix (profiles in the study's order, then tests) with its state. `cells` is
    select_cells' choice; `runs` are the stored runs in any state: a running or failed run of the profile at one of
    the study's sizes (only `size` when given) that started after the selected cell's run, and would measure the
    test, decides the state."""
    sizes = [size] if size else list(study.sizes)
    out = _cell_states(study, runs, cells, unavailable or {}, sizes)
    if study.series is None:
        return out
    return [_with_repeats(study, c, (series or {}).get((c.profile, c.test), ()), sizes) for c in out]


def _cell_states(study: Study, runs: Sequence[Run], cells: Mapping[CellKey, Cell], unavailable: Mapping[str, str],
                 sizes: Sequence[str]) -> list[CellState]:
    latest: dict[str, list[Run]] = {}
    for run in sorted(runs, key=lambda r: (r.started_at or 0.0, r.id), reverse=True):
        if (run.profile_name in study.profile_names and run.size_label in sizes and run.state != "completed"
                and guest_count(run) == study.guests(run.size_label or "")):
            latest.setdefault(run.profile_name, []).append(run)
    out = []
    for profile in study.profile_names:
        for test in study.test_ids:
            cell = cells.get((profile, test))
            after = (cell.started_at or 0.0, cell.run_id) if cell else None
            newer = next((r for r in latest.get(profile, ())
                          if _covers(r, test) and (after is None or (r.started_at or 0.0, r.id) > after)), None)
            if newer is not None:
                state = RUNNING if newer.state == "running" else FAILED
                out.append(CellState(profile, test, state, cell, newer.id,
                                     newer.reason if state == FAILED else None))
            elif cell is not None:
                out.append(CellState(profile, test, DONE, cell, cell.run_id))
            elif profile in unavailable:
                out.append(CellState(profile, test, CANNOT_RUN, reason=unavailable[profile]))
            elif needs_node(test):
                out.append(CellState(profile, test, NOT_RUN, reason="only a run on a back-end (--node) measures it"))
            else:
                out.append(CellState(profile, test, NOT_RUN))
    return out


def _with_repeats(study: Study, c: CellState, samples: Sequence[Sample], sizes: Sequence[str]) -> CellState:
    size = samples[0].size_label if samples else sizes[0]
    plan = study.series_plan(size)
    return dataclasses.replace(c, repeats=(len({x.run_id for x in samples}), plan.repeats if plan else 0))
