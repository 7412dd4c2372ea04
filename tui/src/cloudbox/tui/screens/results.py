"""Results: every run with its headline numbers; mark two or more to compare them side by side against
each run's bare-metal baseline in the studies' Table 1/2 layout; export to JSON, CSV or Markdown."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Static

from cloudbox.core.record.rows import Run
from cloudbox.core.record.stats import CV_FLAG
from cloudbox.core.views import compare, labels
from cloudbox.tui.screens.base import BaseScreen, toggled
from cloudbox.tui.screens.keys import screen_keys
from cloudbox.tui.widgets.dialogs import ConfirmDialog, ExportDialog
from cloudbox.tui.widgets.table import PlainTable


def headline(run: Run) -> str:
    """"W 55* MB/s (50%)  R 76* (71%)  TCP 667 Mb/s (71%)"; a figure that is the median of repeats with its % of
    bare metal's interval and its n, "W 74 MB/s (96% [94, 98]) n=8", marked "~" when its samples vary."""
    s = compare.run_summary(run)
    star = "*" if run.emulated else ""
    parts = []
    for key, value, head, unit in (("seq_write", "seq_write_mbps", "W", " MB/s"),
                                   ("seq_read", "seq_read_mbps", "R", ""),
                                   ("tcp_stream", "tcp_stream_mbits", "TCP", " Mb/s")):
        if s[value] is None:
            continue
        ci = s[f"{key}_pct_ci"]
        interval = " [{:.0f}, {:.0f}]".format(*ci) if ci else ""
        pct = f" ({s[f'{key}_pct']:.0f}%{interval})" if s[f"{key}_pct"] is not None else ""
        varies = labels.VARIES_MARK if s[f"{key}_flagged"] else ""
        n = f" n={s[f'{key}_n']}" if s[f"{key}_n"] > 1 else ""
        parts.append(f"{head} {s[value]:.0f}{star}{varies}{unit}{pct}{n}")
    return "  ".join(parts) or "-"


def suite_words(run: Run) -> str:
    """The run's suite, with its guest count when it ran several at once (its headline is then their sum)."""
    n = compare.guest_count(run)
    return (run.suite or "-") + (f", {n} guests" if n > 1 else "")


ACCEL_WORDS = {"tcg": "TCG*", "nested-kvm": "nested KVM", "kvm": "KVM", "xen": "Xen", None: "-"}


class ResultsScreen(BaseScreen[list[Run]]):
    MODE = "results"
    RELOAD_EVERY = 3.0
    HELP = ("Every stored run, newest first, with its headline numbers: guest sequential write and read "
            "(MB/s) and TCP stream (Mbit/s), each with its % of the same run's bare-metal baseline. "
            "* marks numbers measured under TCG emulation (not overhead figures). A run whose tests were repeated "
            "shows each figure's median, its % of bare metal's 95% interval [low, high] and n, the samples it is "
            f"of; {labels.VARIES_MARK} marks a figure whose samples vary by more than {CV_FLAG:.0%}; its comparison "
            "gives every interval, and a figure measured once says it has none. A run of N guests at once "
            "(Suite says how many) shows their sum; its comparison adds each guest, min / median / max and "
            "Jain's fairness index. Space marks runs; "
            "c compares the marked runs (or the highlighted one) in the studies' table layout; e exports "
            "them (JSON, CSV, Markdown); D deletes a finished run.")
    BINDINGS = screen_keys(MODE)
    # The headline numbers right after the profile: in 80 columns they were scrolled off to the right.
    COLUMNS = {"runs": ("Mk", "Run", "Profile", "Headline (guest, % of bare metal)", "Accel", "State", "Suite",
                        "When")}
    FOCUS = "runs"

    def __init__(self) -> None:
        super().__init__()
        self.runs: list[Run] = []
        self.drawn: list[Run] | None = None  # the runs the table shows
        self.marked: list[int] = []

    def body(self) -> ComposeResult:
        with Vertical(id="results-split"):
            yield PlainTable(id="runs", cursor_type="row")
            with VerticalScroll(id="compare-box"):
                yield Static("Mark runs with space and press c to compare them.", id="compare")

    def fetch(self) -> list[Run]:
        return self.app.backend.runs()

    def show(self, runs: list[Run]) -> None:
        if runs == self.drawn:
            return  # nothing changed: the table is not rebuilt
        self.runs = self.drawn = runs

        def row(r: Run) -> tuple[str, tuple[Any, ...]]:
            when = time.strftime("%m-%d %H:%M", time.localtime(r.started_at)) if r.started_at else "-"
            return str(r.id), ("x" if r.id in self.marked else "", str(r.id), r.profile_name or "-",
                               Text(headline(r)), ACCEL_WORDS.get(r.accelerator, r.accelerator or "-"), r.state,
                               suite_words(r), when)

        table = self.table("runs")
        table.set_rows((row(r) for r in runs), keep=table.highlighted_key())
        if not runs:
            self.query_one("#compare", Static).update("No runs stored yet: start one on the Tests screen (4).")

    def current_id(self) -> int | None:
        key = self.table("runs").highlighted_key()
        return None if key is None else int(key)

    def selection(self) -> list[int]:
        if self.marked:
            return sorted(self.marked)
        cur = self.current_id()
        return [cur] if cur is not None else []

    def action_mark(self) -> None:
        rid = self.current_id()
        if rid is None:
            return
        self.marked = toggled(self.marked, rid)
        table = self.table("runs")
        table.update_cell(str(rid), table.ordered_columns[0].key, "x" if rid in self.marked else "")
        table.action_cursor_down()

    def action_compare(self) -> None:
        ids = self.selection()
        if not ids:
            self.notify("no runs stored yet", severity="warning")
            return
        box = self.query_one("#compare-box")
        # Fit inside the box's padding and beside the scrollbar a long table brings: wider, every row wraps.
        width = max(60, box.size.width - box.styles.scrollbar_size_vertical)

        def done(text: str) -> None:
            self.query_one("#compare", Static).update(Text(text))
            self.query_one("#compare-box").add_class("open")

        self.app.work_in_thread(self.app.backend.compare_text, ids, width, done=done,
                                name=f"comparing runs {', '.join(map(str, ids))}")

    def action_close_compare(self) -> None:
        self.query_one("#compare-box").remove_class("open")

    def action_export(self) -> None:
        ids = self.selection()
        if not ids:
            self.notify("no runs to export", severity="warning")
            return
        stem = Path.cwd() / f"cloudbox-runs-{'-'.join(map(str, ids[:6]))}"

        def chosen(result: tuple[str, Path] | None) -> None:
            if result is None:
                return
            fmt, path = result
            self.app.work_in_thread(self.app.backend.export, ids, fmt, path, name="exporting",
                                    done=lambda p: self.notify(f"wrote {p} ({fmt}, runs {', '.join(map(str, ids))})",
                                                                title="results"))

        self.app.push_screen(ExportDialog(stem), chosen)

    def action_delete(self) -> None:
        rid = self.current_id()
        if rid is None:
            return

        def answer(yes: bool | None) -> None:
            if yes:
                self.marked = [m for m in self.marked if m != rid]
                self.app.work_in_thread(self.app.backend.delete_run, rid, name=f"deleting run {rid}",
                                        done=deleted)

        def deleted(_result: object) -> None:
            self.notify(f"deleted run {rid}", title="results")
            self.reload()

        self.app.push_screen(ConfirmDialog("Delete run", f"Delete run {rid} with its measurements, samples and "
                                           "events? This cannot be undone.", yes="Delete"), answer)
