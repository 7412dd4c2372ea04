"""Installer page 3: the node's settings (hostname, NICs, MTU, front-end, root access, what to do when done).
All answers are checked together by the core (validate_data, then check_answers against this machine); each
problem appears under its field with what is allowed. Then the plan is made in a worker."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.widget import Widget
from textual.widgets import Input, Label, Select

from cloudbox.core.errors import AnswerError
from cloudbox.core.install import InstallPlan
from cloudbox.tui.screens.install.page import InstallPage, err_id, field_id

NONE = "-"  # the Select value for "no campus NIC"
AFTER = [("reboot into the installed node", "reboot"), ("power off", "poweroff"), ("stay in the live system", "stay")]
# problem key -> the field it is shown under
FIELDS = {
    "hostname": "hostname",
    "network.private_nic": "network.private_nic",
    "network.campus_nic": "network.campus_nic",
    "network.private_mtu": "network.private_mtu",
    "network.frontend": "network.frontend",
    "root.ssh_authorized_keys": "root.ssh_authorized_keys",
    "root.password_hash": "root.password",
    "after": "after",
}


class NodePage(InstallPage):
    STEP = 2
    BINDINGS = [Binding("ctrl+n", "next", "Next: the plan", id="install.node.next")]

    @property
    def role(self) -> str:
        return str(self.app.data["role"])

    def _row(self, key: str, label: str, widget: Widget) -> ComposeResult:
        with Horizontal(classes="field-row"):
            yield Label(label, classes="field-label", markup=False)
            yield widget
        yield Label("", id=err_id(key), classes="field-error", markup=False)

    def body(self) -> ComposeResult:
        app = self.app
        assert app.machine is not None
        data, net, root = app.data, app.data["network"], app.data["root"]
        nics = [(Text(n.describe()), n.name) for n in app.machine.nics]
        role = self.role
        with VerticalScroll(classes="install-body", id="node-fields"):
            yield Label(f"Settings of this {role} node (Ctrl+N: check them and make the plan)",
                        classes="install-question", markup=False)
            yield from self._row("hostname", "hostname", Input(
                data.get("hostname") or f"cloudbox-{role.split('-')[0]}", id=field_id("hostname"), compact=True))
            if role in ("front-end", "back-end"):
                if nics:
                    yield from self._row("network.private_nic", "private network NIC", Select(
                        nics, value=net.get("private_nic", nics[0][1]), allow_blank=False, compact=True,
                        id=field_id("network.private_nic")))
                else:
                    yield Label("! this machine has no NIC; a front-end or back-end needs one", classes="problem")
                yield from self._row("network.private_mtu", "private network MTU", Input(
                    str(net.get("private_mtu", 9000)), id=field_id("network.private_mtu"), compact=True,
                    placeholder="1500..9000"))
            campus = nics + ([] if role == "front-end" else [(Text("none"), NONE)])
            if campus:
                default = net.get("campus_nic") or (nics[1][1] if role == "front-end" and len(nics) > 1 else
                                                    nics[0][1] if role == "all-in-one" and nics else NONE)
                if role == "front-end" and default == NONE:
                    default = nics[0][1]
                yield from self._row("network.campus_nic", "campus network NIC", Select(
                    campus, value=default, allow_blank=False, compact=True, id=field_id("network.campus_nic")))
            if role == "back-end":
                yield from self._row("network.frontend", "front-end address", Input(
                    str(net.get("frontend", "discover")), id=field_id("network.frontend"), compact=True,
                    placeholder='"discover" or an IP address'))
            keys = root.get("ssh_authorized_keys") or [""]
            yield from self._row("root.ssh_authorized_keys", "root's SSH key", Input(
                keys[0], id=field_id("root.ssh_authorized_keys"), compact=True,
                placeholder="ssh-ed25519 AAAA... (empty: none)"))
            yield from self._row("root.password", "root password", Input(
                "", id=field_id("root.password"), password=True, compact=True,
                placeholder="empty: none (SSH key, or asked at first login)"))
            yield from self._row("root.password2", "  again", Input(
                "", id=field_id("root.password2"), password=True, compact=True))
            yield from self._row("after", "when done", Select(
                [(Text(t), v) for t, v in AFTER], value=str(data.get("after", "reboot")), allow_blank=False,
                compact=True, id=field_id("after")))
            yield Label("", id="plan-status", markup=False)
            yield Label("", id="page-error", classes="field-error", markup=False)

    def on_mount(self) -> None:
        self.query_one(f"#{field_id('hostname')}", Input).focus()
        self.clear_problems()

    def _value(self, key: str) -> str:
        w = self.query(f"#{field_id(key)}")
        if not w:
            return ""
        widget = w.first()
        if isinstance(widget, Input):
            return widget.value.strip()
        if isinstance(widget, Select):
            return str(widget.value)
        return ""

    def collect(self) -> dict[str, Any]:
        """The page's fields as answer-file data (an MTU that is not a number is passed on as text: the core
        says "must be an integer" under the field)."""
        net: dict[str, Any] = {}
        private = self._value("network.private_nic")
        if private:
            net["private_nic"] = private
        campus = self._value("network.campus_nic")
        if campus and campus != NONE:
            net["campus_nic"] = campus
        if self.query(f"#{field_id('network.private_mtu')}"):
            raw = self._value("network.private_mtu")
            net["private_mtu"] = int(raw) if raw.isdigit() else raw
        if self.role == "back-end":
            net["frontend"] = self._value("network.frontend")
        root: dict[str, Any] = {}
        key = self._value("root.ssh_authorized_keys")
        if key:
            root["ssh_authorized_keys"] = [key]
        return {"hostname": self._value("hostname"), "network": net, "root": root, "after": self._value("after")}

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.action_next()

    def action_next(self) -> None:
        app = self.app
        self.clear_problems()
        app.data.update(self.collect())
        pw, pw2 = self._value("root.password"), self._value("root.password2")
        if pw != pw2:
            self.set_error(f"#{err_id('root.password2')}", "! the two passwords differ")
            self.set_error("#page-error", "1 problem, shown next to the fields")
            self.query_one(f"#{field_id('root.password2')}", Input).focus()
            return
        try:
            app.resolve(app.answers_data())
        except AnswerError as e:
            self.show_problems(e, FIELDS)
            return
        app.password = pw
        self.query_one("#plan-status", Label).update("making the plan (reading the boot medium)...")
        app.work_in_thread(app.make_plan, done=self._planned, failed=self._plan_failed, name="making the plan")

    def _planned(self, plan: InstallPlan) -> None:
        self.query_one("#plan-status", Label).update("")
        self.app.plan = plan
        self.app.next_page(self, plan)

    def _plan_failed(self, err: BaseException) -> None:
        self.query_one("#plan-status", Label).update("")
        if isinstance(err, AnswerError):
            self.show_problems(err, FIELDS)
            return
        text = self.app.report_error(err, "making the plan")
        self.set_error("#page-error", f"! no plan: {text}")
