"""What every cloudbox screen shares: the screen bar, the footer, its tables' columns, and a periodic reload done
off the UI thread.

A screen is `BaseScreen[Data]`: its `fetch()` (a worker thread) returns a `Data` and its `show(data)` (the UI
thread) takes one, so mypy checks that the two agree.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from textual import getters
from textual.app import ComposeResult
from textual.screen import Screen

from cloudbox.tui.app_base import CloudboxAppBase
from cloudbox.tui.widgets.keybar import KeyBar
from cloudbox.tui.widgets.navbar import NavBar
from cloudbox.tui.widgets.table import PlainTable

Data = TypeVar("Data")
Key = TypeVar("Key")


def toggled(marked: list[Key], key: Key, most: int | None = None) -> list[Key]:
    """`marked` without `key` when it is there, else with `key` added last (keeping the last `most` marked)."""
    if key in marked:
        return [m for m in marked if m != key]
    return [*(marked[max(0, len(marked) - most + 1):] if most else marked), key]


class BaseScreen(Screen[None], Generic[Data]):
    MODE = ""
    HELP = ""  # what the screen is for, shown by ? (HelpScreen)
    RELOAD_EVERY: float | None = 2.0  # seconds; None: only on demand
    COLUMNS: dict[str, tuple[str, ...]] = {}  # each table's id and column headings, set when the screen mounts
    FOCUS: str | None = None  # the id of the table that has the focus once the screen is mounted

    app = getters.app(CloudboxAppBase)

    def compose(self) -> ComposeResult:
        yield NavBar(self.MODE)
        yield from self.body()
        yield KeyBar()

    def body(self) -> ComposeResult:
        yield from ()

    def on_mount(self) -> None:
        for table, columns in self.COLUMNS.items():
            self.table(table).add_columns(*columns)
        self.reload()
        if self.RELOAD_EVERY:
            self.set_interval(max(self.RELOAD_EVERY, self.app.poll_interval), self._periodic_reload)
        if self.FOCUS:
            self.table(self.FOCUS).focus()

    def table(self, table_id: str) -> PlainTable:
        return self.query_one(f"#{table_id}", PlainTable)

    def action_reload(self) -> None:
        self.reload()

    def on_screen_resume(self) -> None:
        self.reload()

    def _periodic_reload(self) -> None:
        # Only a screen the user sees reloads on its own: hidden screens rebuilding their tables took the UI
        # thread from the one on show (make bench, "tui"); a screen reloads when it is shown again anyway.
        if self.is_current:
            self.reload()

    def reload(self) -> None:
        """Fetch this screen's data in a thread (one at a time per screen) and show it."""
        self.app.work_in_thread(self.fetch, done=self._show, group=f"load-{self.MODE}", exclusive=True,
                                name=f"loading the {self.MODE} screen")

    def _show(self, data: Data) -> None:
        if self.is_attached:
            self.show(data)

    def fetch(self) -> Data:  # runs in a worker thread
        raise NotImplementedError

    def show(self, data: Data) -> None:  # runs on the UI thread
        raise NotImplementedError
