"""Studies: the published studies found (studies/*.toml) with how much of each one's matrix the results database
holds and how its findings stand; for the highlighted study every cell (profile x test) with its state, our number
labelled as the report labels it (emulated, nested, quick, ...) and the paper's beside it. Enter or r shows the
study's Markdown report; s starts its missing cells at quick size in the background, as `cloudbox study run NAME
--size quick --detach` does."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import DataTable, Static, TextArea

from cloudbox.core.run.runs import Sweep
from cloudbox.core.studies import cellstates, evidence, planning, schema
from cloudbox.core.studies.wording import ours_text, paper_text
from cloudbox.tui.screens.base import BaseScreen
from cloudbox.tui.screens.keys import screen_keys
from cloudbox.tui.widgets.dialogs import TextDialog
from cloudbox.tui.widgets.table import PlainTable

QUICK = "quick"
TITLE_WIDTH = 44  # the title column is last: in 80 columns the counts before it stay in sight


def findings_text(s: evidence.StudySummary) -> str:
    if s.problem is not None:
        return "invalid"
    if not s.findings:
        return "none stated"
    return f"{s.checked}/{s.findings} checked, {s.reproduced} reproduced"


def summary_row(s: evidence.StudySummary) -> tuple[str, tuple[Any, ...]]:
    title = s.title if s.problem is None else f"INVALID: {s.problem.splitlines()[0]}"
    if len(title) > TITLE_WIDTH:
        title = title[:TITLE_WIDTH - 1] + "…"
    cells = "-" if s.problem is not None else str(s.cells)
    results = "-" if s.problem is not None else str(s.with_results)
    return s.name, (s.name, cells, results, findings_text(s), title)


def cell_row(study: schema.Study, c: cellstates.CellState) -> tuple[str, tuple[Any, ...]]:
    ours = ours_text(c.cell) if c.cell is not None else "-"
    unit = c.cell.metric if c.cell is not None else ""
    run = f"#{c.run_id}" if c.run_id is not None else "-"
    state = c.state
    note = "; ".join(n for n in (c.series_text, c.reason or "") if n)
    if c.state in (cellstates.FAILED, cellstates.RUNNING) and c.cell is not None:
        note = (note + "; " if note else "") + f"stored: #{c.cell.run_id}"
    return f"{c.profile}/{c.test}", (c.profile, c.test, state, ours, unit, paper_text(study, c.profile, c.test),
                                     run, note)


class ReportScreen(TextDialog):
    """A study's Markdown report, read-only and scrollable both ways (its tables are wider than the screen)."""

    BINDINGS = [Binding("escape,q", "close", "Close", id="report.close")]

    def __init__(self, name: str, text: str):
        super().__init__(f"cloudbox study report {name}", text)

    def body(self) -> ComposeResult:
        yield TextArea(self.text, read_only=True, soft_wrap=False, show_line_numbers=False, id="report")

    def on_mount(self) -> None:
        self.query_one("#report", TextArea).focus()


# The study list, the highlighted study's name and, when there is one, that study with each cell's state.
StudiesData = tuple[list[evidence.StudySummary], str | None, tuple[schema.Study, list[cellstates.CellState]] | None]


class StudiesScreen(BaseScreen[StudiesData]):
    MODE = "studies"
    RELOAD_EVERY = 3.0
    HELP = ("The published studies (studies/*.toml): the cells of each one's matrix, how many the results database "
            "holds a number for, and its findings checked (reproduced or not; the others are inconclusive). Below, "
            "the highlighted study's cells (profile x test): done with our number, failed, running, not run or "
            "cannot run here, the paper's number beside ours. Our numbers carry the report's labels: emulated (TCG), "
            "nested, quick, warm cache, loop device, profile changed; such cells cannot decide a finding. Enter or "
            "r shows the study's report; s starts its missing cells at quick size (cloudbox study run NAME --size "
            "quick --detach) and the cells fill in as the runs complete.")
    BINDINGS = screen_keys(MODE)
    COLUMNS = {"studies": ("Study", "Cells", "Results", "Findings", "Title"),
               "cells": ("Profile", "Test", "State", "Ours", "Unit", "Paper", "Run", "Note")}
    FOCUS = "studies"

    def __init__(self) -> None:
        super().__init__()
        self.current: str | None = None  # the highlighted study's name
        self.drawn: StudiesData | None = None

    def body(self) -> ComposeResult:
        with Vertical(id="studies-split"):
            yield PlainTable(id="studies", cursor_type="row")
            yield Static("", id="study-head")
            yield PlainTable(id="cells", cursor_type="row")

    def fetch(self) -> StudiesData:
        backend = self.app.backend
        summaries = backend.study_summaries()
        valid = [s.name for s in summaries if s.problem is None]
        name = self.current if self.current in valid else (valid[0] if valid else None)
        return summaries, name, backend.study_matrix(name) if name else None

    def show(self, data: StudiesData) -> None:
        if data == self.drawn:
            return
        self.drawn = data
        summaries, name, matrix = data
        self.table("studies").set_rows((summary_row(s) for s in summaries), keep=self.current)
        if self.current is None:
            self.current = name
        head = self.query_one("#study-head", Static)
        cells = self.table("cells")
        if not summaries:
            head.update("No studies found (studies/ in the checkout, /usr/share/cloudbox/studies, "
                        "CLOUDBOX_STUDY_DIR).")
        if matrix is None or name != self.current:
            cells.set_rows([])
            return
        study, states = matrix
        done = sum(1 for c in states if c.state == cellstates.DONE)
        head.update(f"{study.name}: {done} of {len(states)} cells done; sizes {', '.join(study.sizes)} (only "
                    f"{schema.DECISIVE_SIZE} size decides findings)")
        cells.set_rows(cell_row(study, c) for c in states)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id != "studies" or event.row_key.value is None:
            return
        name = str(event.row_key.value)
        if name != self.current:
            self.current = name
            self.reload()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_report()

    def action_report(self) -> None:
        name = self.current
        if name is None:
            self.notify("no study to report on", severity="warning")
            return
        self.app.work_in_thread(self.app.backend.study_report, name, name=f"the report of study {name}",
                                done=lambda text: self.app.push_screen(ReportScreen(name, text)))

    def action_start(self) -> None:
        name = self.current
        if name is None:
            self.notify("no study to run", severity="warning")
            return

        def started(result: tuple[planning.StudyRun, Sweep | None]) -> None:
            todo, sweep = result
            if sweep is None:
                self.notify(f"every cell this host can measure at {todo.size} size is stored; r shows the report",
                            title=f"study {name}")
            else:
                self.notify(f"{todo.headline()}: sweep {sweep.id} started in the background", title=f"study {name}")
            self.reload()

        self.app.work_in_thread(self.app.backend.start_study, name, QUICK, done=started,
                                name=f"starting study {name}")
