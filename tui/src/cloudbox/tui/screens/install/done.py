"""Installer page 6: how the install ended. Installed: remove the boot medium, then reboot (or what the
answers' `after` says). Interrupted or failed: what was written stays, and what to re-run to resume."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import Label

from cloudbox.tui.screens.install.page import InstallPage

AFTER_TEXT = {"reboot": "reboot into the installed node", "poweroff": "power off", "stay": "leave the installer"}


class DonePage(InstallPage):
    STEP = 4
    BINDINGS = [
        Binding("enter", "finish", "Finish", id="install.done.finish"),
        Binding("q", "leave", "Leave (no reboot)", id="install.done.leave"),
        Binding("escape", "noop", show=False, id="install.done.escape"),
    ]

    def body(self) -> ComposeResult:
        app = self.app
        outcome = app.outcome
        assert outcome is not None and app.plan is not None
        after = app.plan.resolved.answers.after
        ok = outcome.kind in ("installed", "nothing")
        with Vertical(classes="install-body"):
            yield Label(("DONE: " if ok else "NOT INSTALLED: ") + outcome.message, id="done-message",
                        classes="done-ok" if ok else "done-bad", markup=False)
            if outcome.kind == "nothing":
                yield Label("Remove the boot medium and reboot into the installed node.\n"
                            "Enter or q: leave the installer.", id="done-next", markup=False)
            elif ok:
                yield Label(f"Remove the boot medium (the USB stick) now, then press Enter to {AFTER_TEXT[after]}.\n"
                            "With the stick still first in the boot order the live system comes up again.\n"
                            "q: leave the installer without rebooting.", id="done-next", markup=False)
            else:
                yield Label("Enter or q: leave the installer. Nothing more is written.", id="done-next",
                            markup=False)

    def action_finish(self) -> None:
        """Leave; after a completed install, what the answers' `after` says follows (run_install_tui does it
        once the terminal is restored). A disk that already held the install is not rebooted into (as the CLI)."""
        app = self.app
        if app.outcome is not None and app.outcome.kind == "installed" and app.plan is not None:
            app.after_done = app.plan.resolved.answers.after
        app.exit(app.exit_code())

    def action_leave(self) -> None:
        self.app.exit(self.app.exit_code())

    def action_noop(self) -> None:
        pass

    def action_back(self) -> None:
        pass
