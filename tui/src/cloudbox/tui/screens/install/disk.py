"""Installer page 2: the target disk. Every disk is listed with what it is and why it may or may not be
written; the boot medium and disks in use are shown but never accepted; a disk holding data is accepted only
with its serial number typed. The rules are the core's: the choice is checked with check_answers."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable, Input, Label

from cloudbox.core.disks.backing import human_size
from cloudbox.core.errors import AnswerError
from cloudbox.core.install import Disk
from cloudbox.tui.screens.install.page import InstallPage, err_id, field_id

MARK = {"offered": "+", "confirm": "?", "refused": "-"}
STATUS = {"offered": "offered", "confirm": "confirm", "refused": "refused"}


def _cut(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 1] + "~"


def disk_target(d: Disk) -> str:
    return d.by_id[0] if d.by_id else d.path


class DiskPage(InstallPage):
    STEP = 1
    BINDINGS = [Binding("ctrl+n", "next", "Next", id="install.disk.next")]

    def body(self) -> ComposeResult:
        with Vertical(classes="install-body"):
            yield Label("Target disk (all it holds is replaced): + offered, ? confirm: type its serial, "
                        "- refused: never written", classes="install-question", markup=False)
            yield DataTable(id="f-disk-target", cursor_type="row", zebra_stripes=False)
            yield Label("", id="disk-why", markup=False)
            yield Label("", id=err_id("disk.target"), classes="field-error", markup=False)
            with Horizontal(id="serial-row"):
                yield Label("", id="serial-label", markup=False)
                yield Input("", id=field_id("disk.confirm_serial"), compact=True,
                            placeholder="serial number")
            yield Label("", id=err_id("disk.confirm_serial"), classes="field-error", markup=False)
            yield Label("", id="page-error", classes="field-error", markup=False)

    @property
    def disks(self) -> list[Disk]:
        assert self.app.machine is not None
        return self.app.machine.disks

    def on_mount(self) -> None:
        t = self.query_one(DataTable)
        t.add_columns("", "disk", "size", "model", "serial", "status")
        for d in self.disks:
            t.add_row(Text(MARK[d.status]), Text(d.path.removeprefix("/dev/")), Text(human_size(d.size)),
                      Text(_cut(d.model or "-", 22)), Text(_cut(d.serial or "-", 18)), Text(STATUS[d.status]),
                      key=d.path)
        if not self.disks:
            self.query_one("#disk-why", Label).update("this machine has no disk")
        chosen = self.app.data["disk"].get("target")
        rows = [disk_target(d) for d in self.disks]
        start = rows.index(chosen) if chosen in rows else next(
            (i for i, d in enumerate(self.disks) if d.status != "refused"), 0)
        if self.disks:
            t.move_cursor(row=start)
        self._show(start)
        t.focus()

    def current(self) -> Disk | None:
        t = self.query_one(DataTable)
        if not self.disks:
            return None
        return self.disks[min(t.cursor_row, len(self.disks) - 1)]

    def _show(self, row: int) -> None:
        if not self.disks:
            self.query_one("#serial-row").display = False
            return
        d = self.disks[row]
        ident = d.by_id[0] if d.by_id else "(no /dev/disk/by-id name)"
        self.query_one("#disk-why", Label).update(f"{d.identity}\n{ident}\n{d.why()}")
        needs = d.status == "confirm" and bool(d.serial)
        self.query_one("#serial-row").display = needs
        if needs:
            self.query_one("#serial-label", Label).update(f"Type the serial of {d.path} to erase it: ")
        self.clear_problems()

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show(event.cursor_row)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        d = self.current()
        if d is not None and d.status == "confirm" and d.serial and not self._serial():
            self.query_one(f"#{field_id('disk.confirm_serial')}", Input).focus()
            return
        self.action_next()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.action_next()

    def _serial(self) -> str:
        return self.query_one(f"#{field_id('disk.confirm_serial')}", Input).value.strip()

    def action_next(self) -> None:
        self.clear_problems()
        d = self.current()
        if d is None:
            self.set_error("#page-error", "! no disk to install onto")
            return
        disk: dict[str, str] = {"target": disk_target(d)}
        serial = self._serial()
        if d.status == "confirm" and serial:
            disk["confirm_serial"] = serial
        # The disk alone, checked by the core: an all-in-one needs no NIC, so only the disk's rules apply.
        try:
            self.app.resolve({"role": "all-in-one", "hostname": "x", "disk": disk})
        except AnswerError as e:
            self.show_problems(e, {"disk.target": "disk.target", "disk.confirm_serial": "disk.confirm_serial"})
            if any(p.key == "disk.confirm_serial" for p in e.problems):
                self.query_one(f"#{field_id('disk.confirm_serial')}", Input).focus()
            return
        self.app.data["disk"] = disk
        self.app.next_page(self)
