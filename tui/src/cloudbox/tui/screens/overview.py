"""Overview: this box's role, the nodes it knows (with join codes and node removal on a front-end), the
accelerator (with the TCG warning), the active profile, runs in progress, the disks and NICs, and its readiness:
what it measures natively and what only emulated, IOMMU, Secure Boot, the private link, and per study and size the
cells it can run (the answers of `cloudbox host readiness`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Label, Static

from cloudbox.core.cluster import frontend
from cloudbox.core.disks import backing
from cloudbox.core.record.rows import Run
from cloudbox.core.studies import capability
from cloudbox.core.views import readiness
from cloudbox.core.views.host import HostFacts, Node
from cloudbox.tui.backend import Cluster
from cloudbox.tui.screens.base import BaseScreen
from cloudbox.tui.screens.join_code import JoinCodeDialog
from cloudbox.tui.screens.tests import TestsScreen
from cloudbox.tui.widgets.dialogs import ConfirmDialog
from cloudbox.tui.widgets.table import PlainTable

THIS_BOX = "this-box"  # the nodes table's row key of this box (enrolled nodes are keyed node:NAME)


@dataclass
class OverviewData:
    facts: HostFacts
    active_profile: str
    runs: list[Run]
    cluster: Cluster = field(default_factory=Cluster)


def seen(t: float | None, now: float | None = None) -> str:
    """A last-seen time: the clock today, the date and minute before (so it fits 80 columns), '-' for never."""
    if t is None:
        return "-"
    now = time.time() if now is None else now
    fmt = "%H:%M:%S" if time.localtime(t)[:3] == time.localtime(now)[:3] else "%Y-%m-%d %H:%M"
    return time.strftime(fmt, time.localtime(t))


def cluster_line(facts: HostFacts, cluster: Cluster) -> str:
    """One sentence under the Nodes heading: join codes and the enrolment server, or (back-end) the front-end."""
    if cluster.problem:
        return f"Cluster: {cluster.problem}"
    if facts.role == "back-end":
        fe = cluster.front_end
        if fe is None:
            return ("Not enrolled yet: make a join code on the front-end (key j there, or `cloudbox node code`), "
                    "then run here: cloudbox node join --front-end ADDRESS --code CODE")
        return (f"Managed by front-end {fe.get('name', '?')} at {fe.get('address', '?')} (its host key "
                f"{fe.get('host_key_fingerprint', '?')} is pinned). Join codes, health checks and removing nodes "
                "happen there.")
    enrolled = sum(1 for n in facts.nodes if n.enrolled)
    codes = cluster.open_codes
    if codes:
        until = time.strftime("%H:%M:%S", time.localtime(max(c.expires_at for c in codes)))
        server = ("the enrolment server is listening" if cluster.server_running
                  else "but no enrolment server runs (j makes a new code and starts it)")
        return (f"Join codes: {len(codes)} open (until {until}), {server}; v revokes them. "
                f"{enrolled} node{'s' if enrolled != 1 else ''} enrolled.")
    if not enrolled:
        return "No back-end enrolled yet: j makes a one-time join code and shows the command to type on it."
    return (f"{enrolled} node{'s' if enrolled != 1 else ''} enrolled; no join code open (j makes one). "
            "x removes the highlighted node.")


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


def _grid(rows: list[tuple[str, str]]) -> Table:
    """Label-value rows as a grid, not a DataTable: long values (the accelerator's reason, problems) wrap instead of
    being cut off behind a horizontal scrollbar."""
    box = Table.grid(padding=(0, 2))
    box.add_column(no_wrap=True)
    box.add_column()
    for what, value in rows:
        box.add_row(what, Text(value))
    return box


class OverviewScreen(BaseScreen[OverviewData]):
    MODE = "overview"
    HELP = ("What this box is: its role, the nodes it knows and their state, the accelerator guests get "
            "(KVM, nested KVM, or TCG emulation, whose numbers are not overhead figures), the active "
            "profile, runs in progress, the disks and NICs a run can use, and the box's readiness (as `cloudbox "
            "host readiness --fio-seconds 0 --link-seconds 0` reports it: what it measures natively and what only "
            "emulated, IOMMU, Secure Boot, the private link and the nodes' pings, and for each study and size how "
            "many of its cells can run here and what the others need; checked once, r checks again). On a "
            "front-end (or all-in-one) "
            "the Nodes table lists the enrolled back-ends as `cloudbox node check --watch` last found them "
            "(UNKNOWN when nobody checked for 30 s); j shows a one-time join code and the command to type on "
            "the back-end, v revokes the open codes, x removes the highlighted node.")
    BINDINGS = [
        Binding("r", "reload", "Refresh", id="overview.refresh", tooltip="read everything again, readiness too"),
        Binding("w", "watch", "Watch", id="overview.watch", tooltip="show the run in progress on the Tests screen"),
        Binding("j", "join_code", "Join code", id="overview.join-code",
                tooltip="a one-time code a back-end joins with; starts the enrolment server (front-end)"),
        Binding("v", "revoke_codes", "Revoke", id="overview.revoke-codes",
                tooltip="revoke every open join code; the enrolment server stops (front-end)"),
        Binding("x", "remove_node", "Remove", id="overview.remove-node",
                tooltip="take the front-end's key off the highlighted node, then forget it (asks first)"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.data: OverviewData | None = None
        self.nodes: dict[str, Node] = {}  # by row key
        self.answers: capability.Answers | None = None  # the readiness report, once checked
        self._readiness_asked = False

    def body(self) -> ComposeResult:
        with VerticalScroll(id="overview"):
            yield Static("", id="accel-banner", markup=False)
            yield Static("", id="box")
            yield Label("Nodes", classes="section")
            yield Static("", id="cluster", markup=False)
            yield PlainTable(id="nodes", cursor_type="row")
            yield Static("", id="node-detail", markup=False)
            yield Label("Runs in progress", classes="section")
            yield PlainTable(id="active-runs", cursor_type="row")
            yield Label("Disks", classes="section")
            yield PlainTable(id="disks", cursor_type="none")
            yield Label("NICs", classes="section")
            yield PlainTable(id="nics", cursor_type="none")
            yield Label("Readiness", classes="section", id="readiness-head")
            yield Static("checking this box (no disk is read, nothing is written)…", id="readiness", markup=False)
            yield Static("", id="answers")

    def on_mount(self) -> None:
        self.query_one("#nodes", DataTable).add_columns("Node", "Role", "State", "Address", "Last seen", "Reason")
        self.query_one("#active-runs", DataTable).add_columns("Run", "Profile", "Suite", "Elapsed", "Started")
        self.query_one("#disks", DataTable).add_columns("Disk", "Size", "Kind", "Model", "Bus", "Mounted")
        self.query_one("#nics", DataTable).add_columns("NIC", "State", "MTU", "MAC", "IPv4")
        super().on_mount()

    def fetch(self) -> OverviewData:
        b = self.app.backend
        facts = b.facts()
        return OverviewData(facts, b.active_profile(), b.active_runs(), b.cluster(facts.role))

    def show(self, data: OverviewData) -> None:
        self.data = data
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
        self.query_one("#box", Static).update(_grid(rows))
        self.query_one("#cluster", Static).update(cluster_line(f, data.cluster))
        self._show_nodes(f.nodes)
        self.query_one("#active-runs", PlainTable).set_rows(
            (str(r.id), (str(r.id), r.profile_name or "-", r.suite or "-", f"{(r.duration or 0):.0f} s",
                         time.strftime("%Y-%m-%d %H:%M", time.localtime(r.started_at)) if r.started_at else "-"))
            for r in data.runs)
        self.query_one("#disks", PlainTable).set_rows(
            (d.name, (d.name, backing.human_size(d.size_bytes), d.kind, d.model, d.transport,
                      ", ".join(d.mountpoints) or "-"))
            for d in f.disks)
        self.query_one("#nics", PlainTable).set_rows(
            (nic.name, (nic.name, nic.state, str(nic.mtu), nic.mac, ", ".join(nic.addresses) or "-"))
            for nic in f.nics)
        if not self._readiness_asked:  # after the first facts: the accelerator has been probed by then
            self.check_readiness()

    # -- readiness -------------------------------------------------------------------------------------------
    def check_readiness(self) -> None:
        """The readiness report in a thread (lsblk, SMART, the nodes' pings: seconds, so not every reload)."""
        self._readiness_asked = True
        self.app.work_in_thread(self.app.backend.readiness, done=self.show_readiness, group="load-readiness",
                                exclusive=True, name="checking this box's readiness")

    def show_readiness(self, found: capability.Answers) -> None:
        if not self.is_attached:
            return
        self.answers = found
        r = found.facts
        virt = {"vmx": "Intel VT-x", "svm": "AMD-V"}.get(r.virt_flag, "no VT-x or AMD-V shown")
        rows = [*((what.capitalize(), how) for what, how in readiness.measures(r)),
                ("IOMMU", r.iommu), ("Secure Boot", r.secure_boot),
                ("CPUs, memory", f"{r.cpus} CPUs ({virt}), {r.memory_bytes / 1024**3:.1f} GiB, {r.numa_nodes} NUMA "
                                 f"node{'s' if r.numa_nodes > 1 else ''}"),
                *([("Private link", readiness.link_line(r.private_link))] if r.private_link else []),
                *((f"Link to {lk.node}", readiness.check_line(lk)) for lk in r.links),
                *([("Links", r.link_note)] if r.link_note else []),
                *(("Problem", p) for p in r.problems)]
        self.query_one("#readiness", Static).update(_grid(rows))
        answers = Table(box=None, padding=(0, 1), pad_edge=False, header_style="bold")
        answers.add_column("Study", no_wrap=True)
        answers.add_column("Size", no_wrap=True)
        answers.add_column("Cells here", no_wrap=True)
        answers.add_column("What the others need")
        for c in found.studies:
            answers.add_row(c.study, c.size, f"all {c.cells}" if c.whole else f"{c.runnable} of {c.cells}",
                            Text("\n".join(capability.needs(c)) or "-"))
        self.query_one("#answers", Static).update(answers)

    def _show_nodes(self, nodes: list[Node]) -> None:
        keep = self._highlighted_key()
        self.nodes = {}
        for n in nodes:
            key = f"node:{n.name}" if n.enrolled else THIS_BOX
            self.nodes.setdefault(key, n)  # a second "this box" in odd fixed facts: shown once
        rows = ((key, (n.name, n.role, n.state.upper(), n.address or "-",
                       seen(n.last_seen) if n.enrolled else "-", n.detail)) for key, n in self.nodes.items())
        self.query_one("#nodes", PlainTable).set_rows(rows, keep=keep)
        self._show_node_detail()

    def _highlighted_key(self) -> str | None:
        return self.query_one("#nodes", PlainTable).highlighted_key()

    def _show_node_detail(self) -> None:
        """The highlighted enrolled node's reason in full (the table cuts long ones off at the screen's edge)."""
        detail = self.query_one("#node-detail", Static)
        n = self.nodes.get(self._highlighted_key() or "")
        detail.display = n is not None and n.enrolled
        if n is not None and n.enrolled:
            detail.update(f"{n.name}: {n.state.upper()}, {n.detail or 'no reason recorded'}")

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id == "nodes":
            self._show_node_detail()

    def action_reload(self) -> None:
        self.reload()
        self.check_readiness()

    # -- the cluster ---------------------------------------------------------------------------------------
    def _refused(self, what: str) -> bool:
        """Say why `what` is not available here (still loading, or the role); True when it is not."""
        if self.data is None:
            self.notify(f"{what}: the overview is still loading; try again in a moment", severity="warning")
            return True
        f = self.data.facts
        why = frontend.role_refusal(f.role, f.role_source, what)
        if why:
            self.notify(why, title="nodes", severity="warning", markup=False)
        return why is not None

    def action_join_code(self) -> None:
        if self._refused("making join codes"):
            return
        b = self.app.backend
        self.notify("making a join code and starting the enrolment server…", title="nodes", timeout=3)

        def made(offer: frontend.CodeOffer) -> None:
            self.app.push_screen(JoinCodeDialog(offer, poll=b.join_code, revoke=b.revoke_codes),
                                 lambda _r: self.reload())
            self.reload()

        self.app.work_in_thread(b.make_join_code, done=made, group="join-code", exclusive=True,
                                name="making a join code")

    def action_revoke_codes(self) -> None:
        if self._refused("revoking join codes"):
            return

        def revoked(ids: list[int]) -> None:
            if ids:
                self.notify(f"revoked join code{'s' if len(ids) > 1 else ''} {', '.join(map(str, ids))}; the "
                            "enrolment server stops", title="nodes")
            else:
                self.notify("no join code is open: nothing to revoke", title="nodes")
            self.reload()

        self.app.work_in_thread(self.app.backend.revoke_codes, done=revoked, name="revoking join codes")

    def action_remove_node(self) -> None:
        if self._refused("removing nodes"):
            return
        n = self.nodes.get(self._highlighted_key() or "")
        if n is None or not n.enrolled:
            enrolled = [x.name for x in self.nodes.values() if x.enrolled]
            self.notify("highlight the node to remove in the Nodes table (this box is not removed); enrolled: "
                        f"{', '.join(enrolled) or 'none'}", title="nodes", severity="warning", markup=False)
            return
        name = n.name

        def removed(r: frontend.Removal) -> None:
            if r.cleaned:
                self.notify(f"{r.forgotten}; {r.on_node}", title="nodes", markup=False)
            else:
                self.notify(f"{r.forgotten}. {r.on_node}", title=f"{name}: key left on the node", markup=False,
                            severity="warning", timeout=30)
            self.reload()

        def answer(yes: bool | None) -> None:
            if yes:
                self.notify(f"removing {name}…", title="nodes", timeout=3)
                self.app.work_in_thread(self.app.backend.remove_node, name, done=removed,
                                        name=f"removing node {name}")

        self.app.push_screen(ConfirmDialog(
            "Remove node", f"Remove node {name} ({n.address})? The front-end's key is taken off {name} over SSH "
            f"(when it answers), then {name} and its pinned host key are forgotten here. To use it again, join "
            "it with a new code.", yes="Remove"), answer)

    def action_watch(self) -> None:
        run = self.query_one("#active-runs", PlainTable).highlighted_key()
        if run is None:
            self.notify("no run in progress; start one on the Tests screen (4)")
            return
        self.app.switch_mode("tests")
        tests = self.app.screen
        if isinstance(tests, TestsScreen):
            tests.call_after_refresh(tests.action_attach, int(run))
