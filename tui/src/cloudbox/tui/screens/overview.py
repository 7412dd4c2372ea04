"""Overview: this box's role, the nodes it knows, the accelerator (with the TCG warning), the active
profile, runs in progress, and the disks and NICs."""

from __future__ import annotations

import time
from dataclasses import dataclass

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Label, Static

from cloudbox.core import backing
from cloudbox.core.host import HostFacts
from cloudbox.core.results import Run
from cloudbox.tui.screens.base import BaseScreen
from cloudbox.tui.widgets.table import PlainTable


@dataclass
class OverviewData:
    facts: HostFacts
    active_profile: str
    runs: list[Run]


def accel_banner(facts: HostFacts) -> tuple[str, str]:
    """(text, css class) of the accelerator warning; the words carry the warning, not the colour."""
    acc = facts.accelerator
    if acc is None:
        return (f"Accelerator: unknown ({facts.accelerator_problem}). Runs probe it before they start.", "info")
    if acc.emulated:
        return ("WARNING: TCG emulation. Guests run without hardware virtualization: their numbers show "
                "emulation cost, not virtualization overhead. Results are marked * (emulated).", "warning")
    if acc.nested:
        return ("NOTE: nested KVM. This host is itself a VM: guest numbers include a second layer of "
                "virtualization and are marked as nested.", "note")
    return (f"Accelerator: {acc.label}. Guest numbers are virtualization-overhead figures.", "ok")


class OverviewScreen(BaseScreen):
    MODE = "overview"
    HELP = ("What this box is: its role, the nodes it knows and their state, the accelerator guests get "
            "(KVM, nested KVM, or TCG emulation, whose numbers are not overhead figures), the active "
            "profile, runs in progress, and the disks and NICs a run can use.")
    BINDINGS = [
        Binding("r", "reload", "Refresh", id="overview.refresh"),
        Binding("w", "watch", "Watch run", id="overview.watch", tooltip="show the run in progress on the Tests screen"),
    ]

    def body(self) -> ComposeResult:
        with VerticalScroll(id="overview"):
            yield Static("", id="accel-banner", markup=False)
            yield Static("", id="box")
            yield Label("Nodes", classes="section")
            yield PlainTable(id="nodes", cursor_type="none")
            yield Label("Runs in progress", classes="section")
            yield PlainTable(id="active-runs", cursor_type="row")
            yield Label("Disks", classes="section")
            yield PlainTable(id="disks", cursor_type="none")
            yield Label("NICs", classes="section")
            yield PlainTable(id="nics", cursor_type="none")

    def on_mount(self) -> None:
        self.query_one("#nodes", DataTable).add_columns("Node", "Role", "State", "Detail")
        self.query_one("#active-runs", DataTable).add_columns("Run", "Profile", "Suite", "Elapsed", "Started")
        self.query_one("#disks", DataTable).add_columns("Disk", "Size", "Kind", "Model", "Bus", "Mounted")
        self.query_one("#nics", DataTable).add_columns("NIC", "State", "MTU", "MAC", "IPv4")
        super().on_mount()

    def fetch(self) -> OverviewData:
        b = self.capp.backend
        return OverviewData(b.facts(), b.active_profile(), b.active_runs())

    def show(self, data: OverviewData) -> None:
        f = data.facts
        text, cls = accel_banner(f)
        banner = self.query_one("#accel-banner", Static)
        banner.update(text)
        banner.set_classes(f"banner {cls}")
        acc = f.accelerator
        rows = [("Host", f.hostname), ("Role", f"{f.role}  ({f.role_source})"),
                ("Accelerator", f"{acc.label}: {acc.reason}" if acc else f"unknown: {f.accelerator_problem}"),
                ("libvirt", f.libvirtd), ("Active profile", data.active_profile),
                ("Runs in progress", str(len(data.runs)) if data.runs else "none"),
                *(("Problem", p) for p in f.problems)]
        # A grid, not a DataTable: long values (the accelerator's reason, problems) wrap instead of
        # being cut off behind a horizontal scrollbar.
        box = Table.grid(padding=(0, 2))
        box.add_column(no_wrap=True)
        box.add_column()
        for what, value in rows:
            box.add_row(what, Text(value))
        self.query_one("#box", Static).update(box)
        nodes = self.query_one("#nodes", DataTable)
        nodes.clear()
        for n in f.nodes:
            nodes.add_row(n.name, n.role, n.state.upper(), n.detail)
        runs = self.query_one("#active-runs", DataTable)
        runs.clear()
        for r in data.runs:
            started = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.started_at)) if r.started_at else "-"
            runs.add_row(str(r.id), r.profile_name or "-", r.suite or "-", f"{(r.duration or 0):.0f} s", started,
                         key=str(r.id))
        disks = self.query_one("#disks", DataTable)
        disks.clear()
        for d in f.disks:
            disks.add_row(d.name, backing.human_size(d.size_bytes), d.kind, d.model, d.transport,
                          ", ".join(d.mountpoints) or "-")
        nics = self.query_one("#nics", DataTable)
        nics.clear()
        for nic in f.nics:
            nics.add_row(nic.name, nic.state, str(nic.mtu), nic.mac, ", ".join(nic.addresses) or "-")

    def action_reload(self) -> None:
        self.reload()

    def action_watch(self) -> None:
        table = self.query_one("#active-runs", DataTable)
        if table.row_count == 0:
            self.notify("no run in progress; start one on the Tests screen (4)")
            return
        row = table.coordinate_to_cell_key(table.cursor_coordinate).row_key
        self.capp.switch_mode("tests")
        self.capp.screen.call_after_refresh(self.capp.screen.action_attach, int(str(row.value)))  # type: ignore[attr-defined]
