"""What both Textual apps (the cloudbox TUI and the installer) share: blocking work off the UI thread, and the
one place where its errors become notifications (a traceback only in the log, never on the screen)."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import TypeVar, TypeVarTuple

from textual.app import App
from textual.worker import Worker, WorkerState

from cloudbox.core import paths
from cloudbox.core.errors import CloudboxError

ReturnType = TypeVar("ReturnType")
Result = TypeVar("Result")
Args = TypeVarTuple("Args")


class BackgroundApp(App[ReturnType]):
    ERROR_TITLE = "cloudbox: error"
    ERROR_TIMEOUT = 12.0  # seconds an error notification stays
    TRACEBACK_LOG = "tui.log"  # under <state dir>/logs

    def __init__(self) -> None:
        super().__init__()
        self.errors: list[str] = []  # every error shown to the user, newest last (tests read it)

    def work_in_thread(self, fn: Callable[[*Args], Result], *args: *Args,
                       done: Callable[[Result], object] | None = None,
                       failed: Callable[[BaseException], object] | None = None, group: str = "tasks",
                       exclusive: bool = False, name: str = "") -> Worker[Result | None]:
        """Run blocking `fn(*args)` off the UI thread; `done(result)` or `failed(error)` run back on the UI
        thread. Without `failed`, a failure lands in on_worker_state_changed and is reported there. mypy checks
        `args` against `fn` and `done` against what `fn` returns."""

        def job() -> Result | None:
            try:
                result = fn(*args)
            except Exception as e:
                if failed is None:
                    raise
                self.call_from_thread(failed, e)
                return None
            if done is not None:
                self.call_from_thread(done, result)
            return result

        return self.run_worker(job, thread=True, group=group, exclusive=exclusive, name=name or fn.__name__,
                               exit_on_error=False)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.state == WorkerState.ERROR and event.worker.error is not None:
            self.report_error(event.worker.error, event.worker.name)

    def report_error(self, err: BaseException, what: str = "") -> str:
        if isinstance(err, CloudboxError):
            text = str(err)
        else:
            text = f"internal error in {what or 'a background task'}: {err.__class__.__name__}: {err}"
            self._log_traceback(err)
        self.errors.append(text)
        self.notify(text, title=self.ERROR_TITLE, severity="error", timeout=self.ERROR_TIMEOUT, markup=False)
        return text

    def _log_traceback(self, err: BaseException) -> None:
        try:
            d = paths.state_dir() / "logs"
            d.mkdir(parents=True, exist_ok=True)
            with open(d / self.TRACEBACK_LOG, "a") as f:
                f.write("".join(traceback.format_exception(err)))
        except OSError:
            pass
