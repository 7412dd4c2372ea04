"""The join code dialog (Overview, key j): the code large and spaced, its expiry, the enrolment server's
address and the command to type on the back-end; it follows the code until a back-end uses it."""

from __future__ import annotations

import time
from collections.abc import Callable

from textual import getters
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, Static

from cloudbox.core.cluster.frontend import CodeOffer
from cloudbox.core.cluster.registry import JoinCode
from cloudbox.tui.background import BackgroundApp

POLL_EVERY_S = 1.0


def spaced(code: str) -> str:
    """7K3M-Q9XD-… as '7 K 3 M  -  Q 9 X D  -  …': each character stands apart, the groups stay visible."""
    return "  -  ".join(" ".join(group) for group in code.split("-"))


def clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def code_status(rec: JoinCode, now: float | None = None) -> str:
    """One line on where the code stands: waiting (with the time left), used (by which node), expired, revoked."""
    now = time.time() if now is None else now
    status = rec.status(now)
    if status == "used":
        return (f"USED by {rec.used_by} at {clock(rec.used_at or now)}: the node is enrolled (Esc, and it is in "
                "the Nodes table)")
    if status == "revoked":
        return f"REVOKED at {clock(rec.revoked_at or now)} ({rec.revoked_reason}): no back-end can use it"
    if status == "expired":
        return f"EXPIRED at {clock(rec.expires_at)}: press j on the Overview for a new code"
    left = int(rec.expires_at - now)
    return f"waiting for the back-end: open for {left // 60} min {left % 60:02d} s more"


class JoinCodeDialog(ModalScreen[None]):
    """Shows a new join code once (only its scrypt key is stored). `poll(code_id)` (run in a worker thread every
    second) returns the code's record; without it the dialog does not follow the code (screenshots)."""

    BINDINGS = [
        Binding("escape,enter", "close", "Close", id="code.close"),
        Binding("v", "revoke", "Revoke this code", id="code.revoke"),
    ]

    def __init__(self, offer: CodeOffer, *, poll: Callable[[int], JoinCode] | None = None,
                 revoke: Callable[[int], list[int]] | None = None):
        super().__init__()
        self.offer = offer
        self.poll = poll
        self.revoke = revoke
        self.record = offer.record

    app = getters.app(BackgroundApp)

    def compose(self) -> ComposeResult:
        o = self.offer
        with Vertical(classes="dialog code"):
            yield Label(f"Join code {o.record.id}: enrols one back-end", classes="dialog-title", markup=False)
            code = Static(spaced(o.code), id="code", markup=False)
            code.border_title = f"valid until {clock(o.record.expires_at)} ({o.minutes:g} min), one node only"
            code.border_subtitle = "0 and 1 are digits: there is no I, L, O or U"
            yield code
            yield Label("On the back-end, as root:", classes="field-label")
            yield Static(f"  {o.join_command}", id="code-command", markup=False)
            yield Static(self.server_line(), id="code-server", markup=False)
            yield Static("waiting for the back-end", id="code-status", markup=False)
            yield Static("The code is shown only now: cloudbox keeps only a key derived from it.\n"
                         "v: revoke this code   Esc: close", classes="dialog-hint", markup=False)

    def server_line(self) -> str:
        o = self.offer
        at = f"{o.bind}:{o.port}"
        where = ("; ADDRESS is this front-end's address on the private network (it listens on all of them)"
                 if o.front_end.startswith("ADDRESS") else "")
        if o.server == "started":
            return f"Enrolment server: {at}, pid {o.pid}, listens while a code is open{where}."
        if o.server == "running":
            return f"Enrolment server: already running, listens while a code is open{where}."
        return f"Enrolment server: not started ({o.server}){where}."

    def on_mount(self) -> None:
        if self.poll is not None:
            self.set_interval(POLL_EVERY_S, self._refresh_status)
            self._refresh_status()

    def _refresh_status(self) -> None:
        if self.poll is None:
            return
        self.app.work_in_thread(self.poll, self.record.id, done=self._show, group="join-code-status",
                                exclusive=True, name=f"following join code {self.record.id}")

    def _show(self, rec: JoinCode) -> None:
        if not self.is_attached:
            return
        self.record = rec
        status = self.query_one("#code-status", Static)
        status.update(code_status(rec))
        status.set_class(rec.status() == "used", "done")

    def action_revoke(self) -> None:
        if self.revoke is None:
            return
        if self.record.status() != "open":
            self.notify(f"join code {self.record.id} is {self.record.status()}: nothing to revoke")
            return
        self.app.work_in_thread(self.revoke, self.record.id, name=f"revoking join code {self.record.id}",
                                done=lambda _ids: self._refresh_status())

    def action_close(self) -> None:
        self.dismiss(None)
