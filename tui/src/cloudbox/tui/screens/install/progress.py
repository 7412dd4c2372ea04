"""Installer page 5: the install itself. The core's apply() runs in a worker thread and reports each step
through its progress callback (ProgressBar, current step, step log). Ctrl+C or q stops it as Ctrl-C stops
the CLI: the callback raises KeyboardInterrupt inside apply, which stops systemd-repart and removes its
mounts and work directory; what was written stays, and the same answers resume it."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import Label, Log, ProgressBar

from cloudbox.core.errors import CloudboxError
from cloudbox.core.install import STEPS, InstallPlan, ProgressEvent
from cloudbox.tui.install_base import Outcome
from cloudbox.tui.screens.install.page import InstallPage

# Share of the whole install per step: the copy (partition) is nearly all of it.
WEIGHT = {"partition": 0.85}
_REST = (1.0 - WEIGHT["partition"]) / (len(STEPS) - 1)


def overall(ev: ProgressEvent) -> float:
    """The install's overall fraction done at this event."""
    done = 0.0
    for step in STEPS[: ev.number - 1]:
        done += WEIGHT.get(step, _REST)
    return min(done + WEIGHT.get(ev.step, _REST) * (ev.fraction or 0.0), 1.0)


class _Cancelled(KeyboardInterrupt):
    """Raised inside apply() from the progress callback: the TUI's Ctrl-C."""


class ProgressPage(InstallPage):
    STEP = 4
    BINDINGS = [
        # Ctrl+C and Ctrl+Q are the app's (InstallApp.request_cancel): they stop the install too.
        Binding("q", "stop", "Stop the install (or Ctrl+C)", id="install.progress.stop"),
        Binding("escape", "noop", show=False, id="install.progress.escape"),
    ]

    def __init__(self, plan: InstallPlan):
        super().__init__()
        self.plan = plan

    def body(self) -> ComposeResult:
        a = self.plan.resolved.answers
        with Vertical(classes="install-body"):
            yield Label(f"Installing {a.role} {a.hostname} onto {self.plan.disk.identity}", id="progress-head",
                        markup=False)
            yield ProgressBar(total=1.0, show_eta=False, id="progress-bar")
            yield Label("starting", id="progress-step", markup=False)
            yield Log(id="progress-log", max_lines=500)
            yield Label("Ctrl+C or q stops the install (what was written stays; the same answers resume it)",
                        id="progress-hint", markup=False)

    def on_mount(self) -> None:
        app = self.app
        app.installing = True
        app.cancel.clear()
        app.work_in_thread(self._run, name="installing")

    # -- worker thread ------------------------------------------------------------------------------
    def _progress(self, ev: ProgressEvent) -> None:
        final = ev.step == "complete" and ev.fraction == 1.0
        if self.app.cancel.is_set() and not final:
            raise _Cancelled
        self.app.call_from_thread(self._event, ev)

    def _run(self) -> None:
        app = self.app
        try:
            installed = app.backend.apply(self.plan, self._progress)
        except KeyboardInterrupt:
            self.app.call_from_thread(self._ended, "interrupted", None)
        except CloudboxError as e:
            self.app.call_from_thread(self._ended, "failed", e)
        except Exception as e:
            self.app.call_from_thread(self._ended, "failed", e)
        else:
            self.app.call_from_thread(self._ended, "installed" if installed else "nothing", None)

    # -- UI thread ----------------------------------------------------------------------------------
    def _event(self, ev: ProgressEvent) -> None:
        self.query_one(ProgressBar).update(progress=overall(ev))
        self.query_one("#progress-step", Label).update(f"step {ev.number} of {ev.total}: {ev.step}: {ev.message}")
        self.query_one(Log).write_line(str(ev))

    def _ended(self, kind: str, err: BaseException | None) -> None:
        app = self.app
        app.installing = False
        plan = self.plan
        a = plan.resolved.answers
        saved = None
        if kind == "installed":
            msg = f"installed {a.role} {a.hostname} on {plan.disk.path}"
        elif kind == "nothing":
            msg = f"{plan.disk.path} already holds this install; nothing was written"
        else:
            saved = app.save_answers()
            again = f"cloudbox install --answers {saved}" if saved else "`cloudbox install` with the same answers"
            if kind == "interrupted":
                msg = f"interrupted; mounts removed. What was written stays: re-run {again} to resume"
            else:
                assert err is not None
                text = app.report_error(err, "the install")
                msg = f"the install failed: {text}\nre-run {again} to resume"
        app.outcome = Outcome(kind, msg, saved)
        self.query_one(Log).write_line(f"cloudbox: {msg}")
        self.app.next_page(self, replace=True)

    def action_stop(self) -> None:
        self.app.request_cancel()

    def show_stopping(self) -> None:
        self.query_one("#progress-hint", Label).update(
            "stopping: the running step is stopped and the mounts removed (a few seconds)...")

    def action_noop(self) -> None:
        pass

    def action_back(self) -> None:
        pass
