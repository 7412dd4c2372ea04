"""The bar at the top: which screens exist, their keys, and which one is shown (marked, not only coloured)."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

SCREENS = (("overview", "1", "Overview"), ("profiles", "2", "Profiles"), ("guests", "3", "Guests"),
           ("tests", "4", "Tests"), ("results", "5", "Results"), ("studies", "6", "Studies"))


class NavBar(Static):
    DEFAULT_CSS = """
    NavBar { height: 1; background: $panel; }
    """

    def __init__(self, current: str, **kw):
        super().__init__(**kw)
        self.current = current

    def on_mount(self) -> None:
        self.update(self.render_bar(self.size.width))

    def on_resize(self) -> None:
        self.update(self.render_bar(self.size.width))

    def render_bar(self, width: int = 0) -> Text:
        """The bar; in a terminal narrower than its full text (80 columns) the screens are one space apart, not two."""
        t = self._bar(compact=False)
        return self._bar(compact=True) if width and t.cell_len > width else t

    def _bar(self, *, compact: bool) -> Text:
        t = Text(" cloudbox ", style="bold reverse")
        for mode, key, title in SCREENS:
            if mode == self.current:
                if compact:
                    t.append(" ")
                t.append(f"[{key} {title}]", style="bold reverse")
            else:
                t.append(f" {key} {title}" if compact else f" {key} {title} ")
        t.append(" ? help")
        return t
