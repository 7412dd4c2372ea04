"""The key bar at the bottom: the active bindings as one line of text ("key Description"), clickable.

Textual's Footer builds one widget per key and rebuilds them all whenever bindings change (every focus change
and screen switch); with ~15 keys that took hundreds of milliseconds per screen switch on a busy 2-core box.
This bar renders the same information as a single Text, so a key press stays well under the 100 ms target.
"""

from __future__ import annotations

from rich.text import Text
from textual import events
from textual.screen import Screen
from textual.widgets import Static


class KeyBar(Static):
    DEFAULT_CSS = """
    KeyBar { height: 1; dock: bottom; background: $panel; }
    """

    def __init__(self, **kw):
        super().__init__("", markup=False, **kw)
        self.spans: list[tuple[int, int, object, str]] = []  # (start, end, node, action) for clicks
        self._last: tuple = ()

    def on_mount(self) -> None:
        self.screen.bindings_updated_signal.subscribe(self, self._changed)
        self._draw()

    def _changed(self, screen: Screen) -> None:
        if screen is self.screen:
            self._draw()

    def _draw(self) -> None:
        items = []
        seen = set()
        for node, binding, enabled, _tooltip in self.screen.active_bindings.values():
            if not binding.show or binding.action in seen:
                continue
            seen.add(binding.action)
            items.append((self.app.get_key_display(binding), binding.description, enabled, node, binding.action))
        palette = "^p palette" if self.app.ENABLE_COMMAND_PALETTE else ""
        sig = (tuple((k, d, e) for k, d, e, _n, _a in items), palette)
        if sig == self._last:
            return
        self._last = sig
        t = Text(no_wrap=True, overflow="ellipsis")
        self.spans = []
        for key, desc, enabled, node, action in items:
            start = len(t)
            t.append(f" {key} ", style="bold reverse" if enabled else "dim reverse")
            t.append(f"{desc} ", style="" if enabled else "dim")
            self.spans.append((start, len(t), node, action))
        if palette:
            t.append(f" {palette}", style="dim")
        self.update(t)

    async def on_click(self, event: events.Click) -> None:
        for start, end, node, action in self.spans:
            if start <= event.x < end:
                await node.run_action(action)  # type: ignore[attr-defined]
                return
