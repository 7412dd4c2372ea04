"""The bar at the top: which screens exist, their keys, and which one is shown (marked, not only coloured)."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

SCREENS = (("overview", "1", "Overview"), ("profiles", "2", "Profiles"), ("guests", "3", "Guests"),
           ("tests", "4", "Tests"), ("results", "5", "Results"), ("studies", "6", "Studies"),
           ("volumes", "7", "Volumes"))


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
        """The bar as wide as fits: screens two spaces apart; else one; else (80 columns) without "? help", which
        the key bar below shows on every screen."""
        for compact, helps in ((False, True), (True, True), (True, False)):
            t = self._bar(compact=compact, helps=helps)
            if not width or t.cell_len <= width:
                return t
        return t

    def _bar(self, *, compact: bool, helps: bool = True) -> Text:
        t = Text(" cloudbox " if helps else " cloudbox", style="bold reverse")
        for mode, key, title in SCREENS:
            if mode == self.current:
                if compact:
                    t.append(" ")
                t.append(f"[{key} {title}]", style="bold reverse")
            else:
                t.append(f" {key} {title}" if compact else f" {key} {title} ")
        if helps:
            t.append(" ? help")
        return t
