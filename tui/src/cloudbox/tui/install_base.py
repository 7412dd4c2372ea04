"""The installer app without its pages: the answers so far, checked by cloudbox.core.install at every page, the
plan, the install in a worker, stopping (Ctrl-C, q, SIGTERM) and the exit code.

install_app.py's InstallApp adds the pages in their order (PAGES). The pages reach the app through
`app = getters.app(InstallAppBase)` and import this module, never install_app.py, which imports them.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from textual.binding import Binding
from textual.screen import Screen

from cloudbox.core import paths
from cloudbox.core.install import (
    InstallPlan,
    Machine,
    Progress,
    Resolved,
    Sources,
    actions,
    apply,
    check_answers,
    find_sources,
    make_plan,
)
from cloudbox.core.install.answers import Answers, validate_data
from cloudbox.core.install.apply import reap_stale
from cloudbox.tui.background import BackgroundApp

log = logging.getLogger("cloudbox.tui.install")

EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130
SOURCE = "interactive answers"


@dataclass
class InstallBackend:
    """The core calls the installer makes (each may block: the app calls them from worker threads)."""

    probe: Callable[[], Machine] = actions.probe_machine
    sources: Callable[[Machine], Sources] = find_sources
    plan: Callable[[Resolved, Sources], InstallPlan] = make_plan
    apply: Callable[[InstallPlan, Progress], bool] = apply
    hash_password: Callable[[str], str] = actions.hash_password
    after: Callable[[str], str | None] = actions.after_install  # why it could not, or None
    answers_file: Path = field(default_factory=lambda: paths.run_dir() / "install" / "answers.toml")

    def machine(self) -> Machine:
        reap_stale()  # mounts left by an installer killed outright (as the CLI does first)
        return self.probe()


@dataclass
class Outcome:
    """How the install ended, for the last page."""

    kind: str  # "installed", "nothing" (already installed), "interrupted", "failed"
    message: str
    answers_file: Path | None = None


class InstallAppBase(BackgroundApp[int]):
    PAGES: tuple[type[Screen[None]], ...] = ()  # the wizard's pages in order (InstallApp's)

    ERROR_TITLE = "cloudbox install: error"
    ERROR_TIMEOUT = 15.0
    TRACEBACK_LOG = "install-tui.log"

    CSS_PATH = "install.tcss"
    TITLE = "cloudbox install"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [
        # Ctrl+C is a key in the TUI (no SIGINT): it leaves the installer, or stops a running install.
        Binding("ctrl+q", "quit_installer", "Quit", id="install.quit", priority=True),
        Binding("ctrl+c", "quit_installer", "Quit", id="install.ctrl-c", priority=True, show=False),
    ]

    def __init__(self, backend: InstallBackend | None = None, *, dry_run: bool = False,
                 machine: Machine | None = None):
        super().__init__()
        self.backend = backend or InstallBackend()
        self.dry_run = dry_run
        self.machine: Machine | None = machine
        # The answers so far, as an answer file's data (validated by the core at every page).
        self.data: dict[str, Any] = {"role": "all-in-one", "hostname": "", "disk": {}, "network": {}, "root": {},
                                     "after": "reboot"}
        self.password = ""  # hashed (openssl passwd -6) in the worker that plans, then forgotten
        self.plan: InstallPlan | None = None
        self.cancel = threading.Event()  # set by Ctrl-C / q / SIGTERM while the install runs
        self.installing = False
        self.outcome: Outcome | None = None
        self.after_done: str | None = None  # "reboot"/"poweroff"/"stay" once the user finished a complete install

    def on_mount(self) -> None:
        self.push_screen(self.PAGES[0]())
        self.set_interval(0.25, self._check_signal)

    def next_page(self, page: Screen[None], *args: Any, replace: bool = False) -> None:
        """Show the page after `page` (PAGES), made with `args`; `replace`: instead of it (no way back)."""
        nxt = self.PAGES[self.PAGES.index(type(page)) + 1](*args)
        if replace:
            self.switch_screen(nxt)
        else:
            self.push_screen(nxt)

    # -- answers ---------------------------------------------------------------------------------------
    def answers_data(self) -> dict[str, Any]:
        """A copy of the answers so far, without empty sections."""
        data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in self.data.items()}
        for section in ("network", "root"):
            if not data[section]:
                del data[section]
        return data

    def resolve(self, data: dict[str, Any]) -> tuple[Answers, Resolved]:
        """validate_data then check_answers on this machine: AnswerError with every problem otherwise."""
        assert self.machine is not None
        answers = validate_data(data, SOURCE)
        return answers, check_answers(answers, self.machine, SOURCE)

    def make_plan(self) -> InstallPlan:
        """In a worker: hash the password, check everything again, and plan (reads the boot medium's ESP)."""
        data = self.answers_data()
        if self.password:
            data.setdefault("root", {})["password_hash"] = self.backend.hash_password(self.password)
        _answers, resolved = self.resolve(data)
        assert self.machine is not None
        plan = self.backend.plan(resolved, self.backend.sources(self.machine))
        self.password = ""
        return plan

    def save_answers(self) -> Path | None:
        """The answers as an answer file (0600), for `cloudbox install --answers FILE` to resume with."""
        if self.plan is None:
            return None
        path = self.backend.answers_file
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(self.plan.resolved.answers.to_toml())
        except OSError as e:
            log.warning("cannot save the answers to %s: %s", path, e)
            return None
        return path

    # -- stopping ----------------------------------------------------------------------------------------
    def request_cancel(self) -> None:
        """Ctrl-C, q or SIGTERM: stop the install (the core removes its mounts), or leave when none runs."""
        if self.installing:
            self.cancel.set()
            stopping = getattr(self.screen, "show_stopping", None)
            if stopping is not None:
                stopping()
        else:
            self.exit(EXIT_FAILED if self.outcome is None else self.exit_code())

    def exit_code(self) -> int:
        if self.outcome is None:
            return EXIT_FAILED  # left before installing: nothing was written
        return {"installed": EXIT_OK, "nothing": EXIT_OK, "interrupted": EXIT_INTERRUPTED}.get(
            self.outcome.kind, EXIT_FAILED)

    def _check_signal(self) -> None:
        if self._sigterm.is_set():
            self._sigterm.clear()
            self.request_cancel()

    _sigterm = threading.Event()

    def action_quit_installer(self) -> None:
        self.request_cancel()
