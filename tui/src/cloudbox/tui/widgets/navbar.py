"""The bar at the top: which screens exist, their keys, and which one is shown (marked, not only coloured)."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

SCREENS = (("overview", "1", "Overview"), ("profiles", "2", "Profiles"), ("guests", "3", "Guests"),
           ("tests", "4", "Tests"), ("results", "5", "Results"))


class NavBar(Static):
    DEFAULT_CSS = """
    NavBar { height: 1; background: $panel; }
    """

    def __init__(self, current: str, **kw):
        super().__init__(**kw)
        self.current = current

    def on_mount(self) -> None:
        self.update(self.render_bar())

    def render_bar(self) -> Text:
        t = Text(" cloudbox ", style="bold reverse")
        for mode, key, title in SCREENS:
            if mode == self.current:
                t.append(f"[{key} {title}]", style="bold reverse")
            else:
                t.append(f" {key} {title} ")
        t.append(" ? help")
        return t
