"""The Textual application: screens as modes, global keys, the command palette, and the one place where
errors from background work become notifications (never a traceback on the screen).

`create_app()` is the factory shared by the `cloudbox` command, the tests and the screenshot script.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable, Iterable
from typing import Any

from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.screen import Screen
from textual.worker import Worker, WorkerState

from cloudbox.core import paths
from cloudbox.core.errors import CloudboxError
from cloudbox.tui.backend import Backend
from cloudbox.tui.screens.guests import GuestsScreen
from cloudbox.tui.screens.help import HelpScreen
from cloudbox.tui.screens.overview import OverviewScreen
from cloudbox.tui.screens.profiles import ProfilesScreen
from cloudbox.tui.screens.results import ResultsScreen
from cloudbox.tui.screens.tests import TestsScreen
from cloudbox.tui.widgets.navbar import SCREENS

log = logging.getLogger("cloudbox.tui")


class CloudboxApp(App[None]):
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
        super().__init__()
        self.backend = backend or Backend()
        self.start_mode = mode or self.DEFAULT_MODE
        self.poll_interval = poll_interval
        self.errors: list[str] = []  # every error shown to the user, newest last (tests read it)

    def on_mount(self) -> None:
        self.switch_mode(self.start_mode)

    def on_unmount(self) -> None:
        self.backend.close()

    # -- background work -------------------------------------------------------------------------
    def work_in_thread(self, fn: Callable[..., Any], *args: Any, done: Callable[[Any], object] | None = None,
                       group: str = "tasks", exclusive: bool = False, name: str = "") -> Worker:
        """Run blocking `fn(*args)` off the UI thread; `done(result)` runs back on the UI thread.
        Failures land in on_worker_state_changed (one place), never on screen as a traceback."""

        def job() -> Any:
            result = fn(*args)
            if done is not None:
                self.call_from_thread(done, result)
            return result

        return self.run_worker(job, thread=True, group=group, exclusive=exclusive, name=name or fn.__name__,
                               exit_on_error=False)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.state == WorkerState.ERROR and event.worker.error is not None:
            self.report_error(event.worker.error, event.worker.name)

    def report_error(self, err: BaseException, what: str = "") -> None:
        if isinstance(err, CloudboxError):
            text = str(err)
        else:
            text = f"internal error in {what or 'a background task'}: {err.__class__.__name__}: {err}"
            self._log_traceback(err)
        self.errors.append(text)
        self.notify(text, title="cloudbox: error", severity="error", timeout=12, markup=False)

    def _log_traceback(self, err: BaseException) -> None:
        try:
            d = paths.state_dir() / "logs"
            d.mkdir(parents=True, exist_ok=True)
            with open(d / "tui.log", "a") as f:
                f.write("".join(traceback.format_exception(err)))
        except OSError:
            pass

    # -- actions -----------------------------------------------------------------------------------
    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self.screen))

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
