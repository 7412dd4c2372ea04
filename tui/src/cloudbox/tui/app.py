"""The Textual application: screens as modes, global keys, the command palette, and the one place where
errors from background work become notifications (never a traceback on the screen).

`create_app()` is the factory shared by the `cloudbox` command, the tests and the screenshot script.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from textual.app import SystemCommand
from textual.binding import Binding
from textual.screen import Screen

from cloudbox.tui.app_base import CloudboxAppBase
from cloudbox.tui.backend import Backend
from cloudbox.tui.screens.guests import GuestsScreen
from cloudbox.tui.screens.help import HelpScreen
from cloudbox.tui.screens.overview import OverviewScreen
from cloudbox.tui.screens.profiles import ProfilesScreen
from cloudbox.tui.screens.results import ResultsScreen
from cloudbox.tui.screens.tests import TestsScreen
from cloudbox.tui.widgets.navbar import SCREENS

log = logging.getLogger("cloudbox.tui")


class _SwitchHold:
    """One screen switch's hold on frames (see CloudboxApp.switch_mode); ended once, by whichever comes first."""

    ended = False
    ended_by = ""  # "resume" (the new screen is ready) or "timer" (SWITCH_HOLD_MAX_S passed first)


class CloudboxApp(CloudboxAppBase):
    CSS_PATH = "app.tcss"
    TITLE = "cloudbox"
    MODES = {
        "overview": OverviewScreen,
        "profiles": ProfilesScreen,
        "guests": GuestsScreen,
        "tests": TestsScreen,
        "results": ResultsScreen,
    }
    DEFAULT_MODE = "overview"
    BINDINGS = [
        # Not in the footer: the screen bar at the top shows these keys, and the footer has no room for
        # them next to a screen's own keys in 80 columns (it clipped Quit and the palette key).
        *[Binding(key, f"switch_mode('{mode}')", title, id=f"app.screen.{mode}", show=False)
          for mode, key, title in SCREENS],
        Binding("question_mark", "help", "Help", id="app.help"),
        Binding("q", "quit", "Quit", id="app.quit"),
    ]

    def __init__(self, backend: Backend | None = None, *, mode: str | None = None, poll_interval: float = 1.0):
        super().__init__(backend, poll_interval=poll_interval)
        self.start_mode = mode or self.DEFAULT_MODE
        self._switching = False
        self._switch_hold: _SwitchHold | None = None
        self.last_switch_hold: _SwitchHold | None = None  # the latest screen switch's hold (tests read it)

    def on_mount(self) -> None:
        self.switch_mode(self.start_mode)

    # -- screen switches ----------------------------------------------------------------------------
    # Textual holds frames for a fixed 50 ms after a screen switch (App.switch_mode calls delay_update) to
    # mask the transition: that hold alone was most of a screen key's answer time (make bench, "tui"). Here
    # the hold ends as soon as the new screen has handled its ScreenResume (styles, layout): a callback queued
    # on that screen behind the resume ends it, so the first frame is the complete new screen, written as
    # soon as it is ready; a timer ends it anyway after SWITCH_HOLD_MAX_S.
    SWITCH_HOLD_MAX_S = 0.5

    def switch_mode(self, mode: str) -> Any:
        self._switching = True
        try:
            result = super().switch_mode(mode)
        finally:
            self._switching = False
        hold, self._switch_hold = self._switch_hold, None
        if hold is not None:
            self.last_switch_hold = hold
            if not self.screen.call_later(self._end_switch_hold, hold, "resume"):
                self._end_switch_hold(hold, "resume")
        return result

    def delay_update(self, delay: float = 0.05) -> None:
        if not getattr(self, "_switching", False):
            super().delay_update(delay)
            return
        hold = _SwitchHold()
        self._begin_batch()
        self._switch_hold = hold
        self.set_timer(self.SWITCH_HOLD_MAX_S, lambda: self._end_switch_hold(hold, "timer"), name="switch_hold")

    def _end_switch_hold(self, hold: _SwitchHold, by: str) -> None:
        if hold.ended:
            return
        hold.ended, hold.ended_by = True, by
        self._end_batch()
        if not self._batch_count:
            self.screen.refresh()

    # -- actions -----------------------------------------------------------------------------------
    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self.screen, self.MODES))

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """Every action is in the command palette: the screens, then the current screen's keys."""
        for mode, key, title in SCREENS:
            yield SystemCommand(f"Go to {title}", f"show the {title} screen (key {key})",
                                lambda m=mode: self.switch_mode(m))
        yield SystemCommand("Help", "keys and what each screen does (key ?)", self.action_help)
        seen = set()
        for active in screen.active_bindings.values():
            b = active.binding
            if b.id and b.id.startswith("app.") or not b.description or b.action in seen:
                continue
            seen.add(b.action)
            node = active.node
            yield SystemCommand(b.description, f"{b.tooltip or b.description} (key {b.key_display or b.key})",
                                lambda n=node, a=b.action: self.call_later(n.run_action, a))
        yield from super().get_system_commands(screen)


def create_app(backend: Backend | None = None, *, mode: str | None = None,
               poll_interval: float = 1.0) -> CloudboxApp:
    return CloudboxApp(backend, mode=mode, poll_interval=poll_interval)
