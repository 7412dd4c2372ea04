"""The installer as a Textual app (`cloudbox install` on a terminal): role, disk, node settings, the plan, the
install's progress, and the end ("remove the boot medium, reboot").

Every answer is checked by cloudbox.core.install (validate_data, check_answers: the rules of an answer file)
and the plan, the writing and the cleanup on Ctrl-C are the core's too, as for the line-based interview.
`InstallBackend` is the one place that calls the core; tests replace parts of it (a fake ESP, an apply that
only reports progress). All blocking work (probing disks, planning, writing) runs in worker threads.

InstallApp is install_base.InstallAppBase (answers, plan, install, stopping) with its pages in order.
`create_install_app()` is the factory shared by `cloudbox install` and the tests.
"""

from __future__ import annotations

import signal
import sys

from cloudbox.core.install import Machine
from cloudbox.tui.install_base import EXIT_FAILED, EXIT_OK, InstallAppBase, InstallBackend
from cloudbox.tui.screens.install.disk import DiskPage
from cloudbox.tui.screens.install.done import DonePage
from cloudbox.tui.screens.install.node import NodePage
from cloudbox.tui.screens.install.progress import ProgressPage
from cloudbox.tui.screens.install.review import ReviewPage
from cloudbox.tui.screens.install.role import RolePage

__all__ = ["InstallApp", "InstallBackend", "create_install_app", "run_install_tui"]


class InstallApp(InstallAppBase):
    # The wizard's pages in order: each page hands over to the next through next_page.
    PAGES = (RolePage, DiskPage, NodePage, ReviewPage, ProgressPage, DonePage)


def create_install_app(backend: InstallBackend | None = None, *, dry_run: bool = False,
                       machine: Machine | None = None) -> InstallApp:
    return InstallApp(backend, dry_run=dry_run, machine=machine)


def run_install_tui(backend: InstallBackend | None = None, *, dry_run: bool = False) -> int:
    """`cloudbox install` on a terminal. SIGTERM (systemctl stop, a closed console) stops the install as Ctrl-C
    does; the exit codes are the CLI's (0 installed or nothing to do, 1 failed or left, 130 interrupted)."""
    app = create_install_app(backend, dry_run=dry_run)
    old = signal.signal(signal.SIGTERM, lambda signum, frame: InstallApp._sigterm.set())
    try:
        code = app.run()
    finally:
        signal.signal(signal.SIGTERM, old)
    outcome = app.outcome
    if outcome is not None:
        print(f"cloudbox: {outcome.message}")
    elif code != EXIT_OK:
        print("cloudbox: left the installer; nothing was written")
    if app.after_done and app.after_done != "stay":
        print(f"cloudbox: {app.after_done}")
        sys.stdout.flush()
        problem = app.backend.after(app.after_done)
        if problem is not None:
            print(f"cloudbox: {problem}", file=sys.stderr)
    return EXIT_FAILED if code is None else int(code)
