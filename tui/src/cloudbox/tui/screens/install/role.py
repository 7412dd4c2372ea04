"""Installer page 1: the node's role. Meanwhile the machine's disks and NICs are probed in a worker."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import Label, OptionList
from textual.widgets.option_list import Option

from cloudbox.core.install import Machine
from cloudbox.core.install.answers import ROLES
from cloudbox.tui.screens.install.page import InstallPage

ROLE_TEXT = {
    "front-end": "the controller: node registry, guest images, results, private network services, "
                 "block-volume exports",
    "back-end": "a hypervisor node (libvirt with QEMU/KVM or Xen) that runs the guests",
    "all-in-one": "both, on this one machine",
}


class RolePage(InstallPage):
    STEP = 0
    BINDINGS = [Binding("enter", "next", "Next", id="install.role.next", show=True)]

    def body(self) -> ComposeResult:
        with Vertical(classes="install-body"):
            yield Label("What is this machine's role in the cloud?", classes="install-question")
            options = []
            for role in ROLES:
                t = Text()
                t.append(role, style="bold")
                t.append(f"\n  {ROLE_TEXT[role]}")
                options.append(Option(t, id=role))
            yield OptionList(*options, id="f-role")
            yield Label("Nothing is written before you confirm the plan. Ctrl+Q leaves.", classes="install-hint")
            yield Label("probing the disks and NICs...", id="probe-status", markup=False)
            yield Label("", id="page-error", classes="field-error", markup=False)

    def on_mount(self) -> None:
        self.clear_problems()
        ol = self.query_one(OptionList)
        ol.highlighted = ROLES.index(self.app.data.get("role", "all-in-one"))
        ol.focus()
        if self.app.machine is None:
            self.app.work_in_thread(self.app.backend.machine, done=self._probed, failed=self._probe_failed,
                                    name="probing the machine")
        else:
            self._probed(self.app.machine)

    def _probed(self, machine: Machine) -> None:
        self.app.machine = machine
        usable = sum(d.status != "refused" for d in machine.disks)
        self.query_one("#probe-status", Label).update(
            f"{len(machine.disks)} disks ({usable} may be written), {len(machine.nics)} NICs found")

    def _probe_failed(self, err: BaseException) -> None:
        text = self.app.report_error(err, "probing the machine")
        self.query_one("#probe-status", Label).update(f"! cannot probe this machine: {text}")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.action_next()

    def action_next(self) -> None:
        if self.app.machine is None:
            self.set_error("#page-error", "! still probing the machine's disks; a moment")
            return
        ol = self.query_one(OptionList)
        role = ROLES[ol.highlighted or 0]
        self.app.data["role"] = role
        self.app.next_page(self)
