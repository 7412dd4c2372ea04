"""The Textual application: screens as modes, global keys, the command palette, and the one place where
errors from background work become notifications (never a traceback on the screen).

`create_app()` is the factory shared by the `cloudbox` command, the tests and the screenshot script.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterable
from contextlib import ExitStack
from functools import partial
from weakref import WeakKeyDictionary

from textual import events
from textual.app import SystemCommand
from textual.binding import Binding
from textual.screen import Screen
from textual.widget import AwaitMount

from cloudbox.tui.app_base import CloudboxAppBase
from cloudbox.tui.backend import Backend
from cloudbox.tui.screens.guests import GuestsScreen
from cloudbox.tui.screens.help import HelpScreen
from cloudbox.tui.screens.overview import OverviewScreen
from cloudbox.tui.screens.profiles import ProfilesScreen
from cloudbox.tui.screens.results import ResultsScreen
from cloudbox.tui.screens.studies import StudiesScreen
from cloudbox.tui.screens.tests import TestsScreen
from cloudbox.tui.screens.volumes import VolumesScreen
from cloudbox.tui.widgets.navbar import SCREENS

log = logging.getLogger("cloudbox.tui")


class CloudboxApp(CloudboxAppBase):
    CSS_PATH = "app.tcss"
    TITLE = "cloudbox"
    MODES = {
        "overview": OverviewScreen,
        "profiles": ProfilesScreen,
        "guests": GuestsScreen,
        "tests": TestsScreen,
        "results": ResultsScreen,
        "studies": StudiesScreen,
        "volumes": VolumesScreen,
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
        self._switch_hold: ExitStack | None = None  # set while switch_mode runs for a screen shown before
        self._styled_for: WeakKeyDictionary[Screen, tuple[frozenset[str], frozenset[str]]] = WeakKeyDictionary()

    # Drawing allocates fast: at CPython's (700, 10, 10) frames' short-lived cycles outlive gen 0 and the full
    # collections that follow took 130 ms of a key's answer; gen 0 of 20k, emptied into gen 1 every second
    # collection, kept every pause under 25 ms and no full one during the keys (tests/key_latency.py).
    GC_THRESHOLD = (20_000, 2, 10)

    def on_mount(self) -> None:
        self.switch_mode(self.start_mode)
        self._gc_threshold = gc.get_threshold()
        gc.set_threshold(*self.GC_THRESHOLD)
        # What exists once the first screen is drawn (modules, classes, that screen) lives as long as the app:
        # out of the collector's reach, a full collection walks about half the objects it did (make bench, "tui").
        self.call_after_refresh(gc.freeze)

    def on_unmount(self) -> None:
        gc.set_threshold(*self._gc_threshold)

    # -- screen switches ----------------------------------------------------------------------------
    # Textual holds frames for a fixed 50 ms after a screen switch (switch_mode calls delay_update) to mask
    # the transition. A screen shown before is complete once it has handled its ScreenResume, so its hold is a
    # batch update that a callback queued on it behind the resume ends (SWITCH_HOLD_MAX_S at the latest).
    SWITCH_HOLD_MAX_S = 0.5

    # Textual restyles every node of a screen it switches back to (most of the Tests screen's answer), in case
    # the app's classes (focus, dark, ...) changed while it was hidden: those restyle only the screen on show.
    # A widget's own class changes restyle it at once and a new stylesheet is applied by switch_mode, so a
    # screen is restyled on resume only when the app's classes differ from those it was last shown with.
    def _app_style_state(self) -> tuple[frozenset[str], frozenset[str]]:
        return self.pseudo_classes, frozenset(self.classes)

    def switch_mode(self, mode: str) -> AwaitMount:
        try:
            held = mode != self.current_mode and bool(self.get_screen_stack(mode))
            first = False
        except KeyError:  # never shown: Textual's own hold covers its first build
            held, first = False, True
        if mode != self.current_mode and self.is_running:
            self._styled_for[self.screen] = self._app_style_state()
        hold = ExitStack()
        self._switch_hold = hold if held else None
        try:
            if held:
                with self.prevent(events.ScreenResume):
                    switched = super().switch_mode(mode)
                self.screen.post_message(events.ScreenResume(
                    refresh_styles=self._styled_for.get(self.screen) != self._app_style_state()))
            else:
                switched = super().switch_mode(mode)
        finally:
            self._switch_hold = None
        if held:
            end = partial(self._end_switch_hold, hold)
            hold.callback(self.set_timer(self.SWITCH_HOLD_MAX_S, end, name="switch hold").stop)
            self.screen.call_later(end)
        elif first and self.is_running:
            # Textual applies the stylesheet to a new screen before it is mounted and counts it applied only
            # once mounted, so the key that showed it again reparsed every stylesheet (60-130 ms): done here,
            # after the first build's frame, instead.
            self.screen.call_after_refresh(self._restyle_new_screen, self.screen)
        return switched

    def _restyle_new_screen(self, screen: Screen) -> None:
        if self.screen is screen:
            self.refresh_css(animate=False)

    def delay_update(self, delay: float = 0.05) -> None:
        if self._switch_hold is None:
            super().delay_update(delay)
        else:
            self._switch_hold.enter_context(self.batch_update())

    def _end_switch_hold(self, hold: ExitStack) -> None:
        screen = self.screen
        # A layout queued during the hold is drawn before the repaint, as a frame of its own regions over the
        # old screen; with the whole screen dirty in the compositor that first frame is the whole new screen.
        screen._compositor.update_widgets({screen})
        hold.close()  # the batch update and the fallback timer, once: a second call finds nothing to close
        screen.refresh()

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
