"""Guests: launch a guest with a profile (it keeps running after the TUI closes), list guests with state,
uptime and profile, stop or destroy one after confirmation, show its domain XML."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from textual.app import ComposeResult
from textual.widgets import Static

from cloudbox.core.record.rows import Run
from cloudbox.core.virt.guest import GuestInfo
from cloudbox.tui.screens.base import BaseScreen
from cloudbox.tui.screens.keys import screen_keys
from cloudbox.tui.widgets.dialogs import ConfirmDialog, PickDialog, TextDialog
from cloudbox.tui.widgets.table import PlainTable


@dataclass
class GuestsData:
    guests: list[GuestInfo]
    problem: str | None
    runs: dict[str, Run]  # live runs by uuid
    active_profile: str


def fmt_uptime(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class GuestsScreen(BaseScreen[GuestsData]):
    MODE = "guests"
    HELP = ("Guests libvirt runs for cloudbox. l launches a guest with a profile: it gets the profile's disk "
            "(a scratch backing store) and NIC on the cloudbox bridge, and keeps running after you close "
            "the TUI. s stops the highlighted guest cleanly (its disk and network are removed, as after "
            "Ctrl-C in the CLI); D powers it off at once; x shows its libvirt domain XML. A guest whose run "
            "is gone is an orphan: stop it to clean up.")
    BINDINGS = screen_keys(MODE)
    COLUMNS = {"guests": ("Guest", "State", "Uptime", "Profile", "Run")}
    FOCUS = "guests"

    def __init__(self) -> None:
        super().__init__()
        self.data: GuestsData | None = None

    def body(self) -> ComposeResult:
        yield Static("", id="guests-status", markup=False)
        yield PlainTable(id="guests", cursor_type="row")

    def fetch(self) -> GuestsData:
        b = self.app.backend
        guests, problem = b.guests()
        runs = {r.uuid: r for r in b.active_runs()}
        return GuestsData(guests, problem, runs, b.active_profile())

    def show(self, data: GuestsData) -> None:
        self.data = data

        def row(g: GuestInfo) -> tuple[str, tuple[str, ...]]:
            run = data.runs.get(g.run_uuid or "")
            run_text = f"{run.id} ({run.suite})" if run else "none: orphan"
            return g.name, (g.name, g.state, fmt_uptime(g.uptime()), g.profile or "-", run_text)

        table = self.table("guests")
        table.set_rows((row(g) for g in data.guests), keep=table.highlighted_key())
        status = self.query_one("#guests-status", Static)
        if data.problem:
            status.update(f"libvirt: {data.problem}")
        elif not data.guests:
            status.update(f"No cloudbox guests. Press l to launch one (active profile: {data.active_profile}).")
        else:
            status.update(f"{len(data.guests)} guest{'s' if len(data.guests) != 1 else ''}; "
                          f"active profile: {data.active_profile}")

    def current(self) -> GuestInfo | None:
        if self.data is None:
            return None
        name = self.table("guests").highlighted_key()
        return next((g for g in self.data.guests if g.name == name), None)

    def action_launch(self) -> None:
        b = self.app.backend

        blocked: dict[str, str] = {}

        def got(found) -> None:
            entries, boot = found
            valid = [e for e in entries if e.problem is None]
            blocked.update({e.name: why for e in valid if (why := boot.refusal(e.hypervisor, e.xen_type, e.raid_on))})
            options = [(e.name, f"cannot run on this boot ({boot.label}): {blocked[e.name]}" if e.name in blocked
                        else e.description) for e in valid]
            self.app.push_screen(PickDialog("Launch a guest with profile", options, b.active_profile(),
                                            frozenset(blocked)), chosen)

        def chosen(name: str | None) -> None:
            if not name:
                return
            if name in blocked:
                self.notify(f"{name} cannot run on this boot: {blocked[name]}", severity="warning")
                return
            self.notify(f"launching a guest with {name}; it appears here when libvirt has started it",
                        title="guests")
            self.app.work_in_thread(b.launch_guest, name, done=launched, name=f"launching a {name} guest")

        def launched(run_id: int) -> None:
            self.notify(f"guest session started as run {run_id} (stop it here with s)", title="guests")
            self.reload()

        self.app.work_in_thread(lambda: (b.profiles(), b.boot()), done=got, name="listing profiles")

    def action_stop(self) -> None:
        self._confirm("stop", "Stop guest", "Stop {}? The guest is destroyed and its disk and network are removed.",
                      self.app.backend.stop_guest, lambda g, r: f"{g.name}: {r}", announce=True)

    def action_destroy(self) -> None:
        self._confirm("destroy", "Destroy guest", "Power off {} at once (like pulling the plug)? Its run then "
                      "cleans up the disk and network.", self.app.backend.destroy_guest,
                      lambda g, _r: f"{g.name} destroyed")

    def _confirm(self, verb: str, title: str, question: str, act: Callable[[GuestInfo], Any],
                 said: Callable[[GuestInfo, Any], str], announce: bool = False) -> None:
        """Ask `question` about the highlighted guest; on yes `act` on it in a thread, then say what `said`."""
        g = self.current()
        if g is None:
            self.notify(f"no guest to {verb}", severity="warning")
            return
        doing = {"stop": "stopping", "destroy": "destroying"}[verb]

        def answer(yes: bool | None) -> None:
            if yes:
                if announce:
                    self.notify(f"{doing} {g.name}…", title="guests")
                self.app.work_in_thread(act, g, name=f"{doing} {g.name}", done=lambda r: self.after(said(g, r)))

        self.app.push_screen(ConfirmDialog(title, question.format(g.name), yes=verb.capitalize()), answer)

    def after(self, message: str) -> None:
        self.notify(message, title="guests")
        self.reload()

    def action_xml(self) -> None:
        g = self.current()
        if g is None:
            self.notify("no guest selected", severity="warning")
            return
        self.app.work_in_thread(self.app.backend.guest_xml, g.name, name=f"reading {g.name}'s XML",
                                done=lambda xml: self.app.push_screen(TextDialog(f"{g.name}: domain XML", xml)))
