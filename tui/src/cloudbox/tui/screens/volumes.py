"""Volumes: the network block volumes this box serves (core.disks.volumes), the run each is attached to, how this host
can
export them; n makes one (name and size, checked by core's own rules), D deletes the highlighted one (asks first;
core refuses while a live run has it attached)."""

from __future__ import annotations

from collections.abc import Callable

from textual import getters
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, DataTable, Input, Label, Static

from cloudbox.core.disks.backing import human_size
from cloudbox.core.disks.volumes.attach import Export
from cloudbox.core.disks.volumes.store import Volume, check_name, parse_size
from cloudbox.core.errors import CloudboxError
from cloudbox.tui.backend import Volumes
from cloudbox.tui.background import BackgroundApp
from cloudbox.tui.screens.base import BaseScreen
from cloudbox.tui.screens.keys import screen_keys
from cloudbox.tui.screens.overview import seen
from cloudbox.tui.widgets.dialogs import ConfirmDialog
from cloudbox.tui.widgets.table import PlainTable

SCHEME_WORDS = {"nbd": "NBD", "aoe": "AoE", "iscsi": "iSCSI"}
EMPTY = ("No volumes yet: n makes one (a name such as ebs and a size such as 1G), as `cloudbox volume create ebs "
         "--size 1G` does. A profile then names it as disk.volume = \"nbd:ebs\" (docs/volumes.md).")


def exports_line(exports: list[Export]) -> str:
    """How this host exports volumes: each scheme's server and who attaches it, or why it cannot here."""
    parts = []
    for e in exports:
        word = SCHEME_WORDS.get(e.scheme, e.scheme)
        if e.problem:
            parts.append(f"{word}: not here, {e.problem}")
        elif not e.attach:
            parts.append(f"{word}: no attach mode works on this host")
        else:
            tls = {"nbd": " with TLS", "iscsi": " with CHAP"}.get(
                e.scheme, ", no authentication (the guest's bridge only)")
            parts.append(f"{word} by {e.server}{tls}, disk.attach = {' or '.join(e.attach)}")
    return "Exports here: " + "; ".join(parts) + "." if parts else "Exports here: none."


def attached_to(v: Volume, data: Volumes) -> str:
    if not v.attached_run:
        return "none"
    run = data.runs.get(v.attached_run)
    if run is None:  # a run of another results store (or one just recorded): its uuid is what is known
        return f"run {v.attached_run[:8]}"
    return f"run {run.id} {run.profile_name or ''}".rstrip()


def volume_detail(v: Volume, data: Volumes) -> str:
    usable = [e.scheme for e in data.exports if e.usable]
    names = " or ".join(f'"{s}:{v.name}"' for s in usable) or "none here"
    made = f"a logical volume in {v.vg}" if v.vg else "pre-allocated"
    text = (f"{v.name}: {human_size(v.size_bytes)} {made} at {v.path}; a profile names it as disk.volume = "
            f"{names} with disk.backing = \"network-volume\".")
    if v.attached_run:
        text += f" Attached by {attached_to(v, data)}: deleting it is refused until that run ends."
    return text


class VolumeDialog(ModalScreen[Volume | None]):
    """A new volume: name, size and an optional volume group, name and size checked by core's check_name and
    parse_size before `create(name, bytes, vg)` runs in a worker thread; core's refusal (a name taken, no space, no
    such group) shows in the form, which stays open."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="volume-form.cancel")]

    app = getters.app(BackgroundApp)

    def __init__(self, create: Callable[[str, int, str | None], Volume]):
        super().__init__()
        self.create = create
        self.busy = False

    def compose(self) -> ComposeResult:
        # Compact fields, and error lines only while they say something: the form fits 80x24 with both errors.
        with Vertical(classes="dialog", id="volume-form"):
            yield Label("New volume", classes="dialog-title")
            yield Label("Name: lowercase letters, digits and '-', at most 63 characters", classes="field-label")
            yield Input("", placeholder="ebs", id="v-name", compact=True)
            yield Label("", id="e-name", classes="field-error", markup=False)
            yield Label("Size: 4M to 64T in whole MiB, powers of 1024 (512M, 4G, 1TiB)", classes="field-label")
            yield Input("1G", id="v-size", compact=True)
            yield Label("", id="e-size", classes="field-error", markup=False)
            # no label line of its own: the form still fits 80x24 with both errors and its hint
            yield Input("", placeholder="Volume group: empty for a file, else an LV cloudbox-NAME in it", id="v-vg",
                        compact=True, tooltip="an existing LVM volume group (vgs lists them); empty: a file")
            yield Label("", id="volume-form-error", classes="field-error", markup=False)
            with Horizontal(classes="dialog-buttons"):
                yield Button("Create", id="ok", variant="primary", compact=True)
                yield Button("Cancel", id="cancel", compact=True)
            yield Label("Enter: create   Esc: cancel   (a file is pre-allocated whole)", classes="dialog-hint")

    def on_mount(self) -> None:
        for field in ("e-name", "e-size", "volume-form-error"):
            self._error(field, "")
        self.query_one("#v-name", Input).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "cancel":
            self.action_cancel()
        else:
            self.submit()

    def on_input_submitted(self, _event: Input.Submitted) -> None:
        self.submit()

    def _error(self, field: str, text: str) -> None:
        label = self.query_one(f"#{field}", Label)
        label.update(text)
        label.display = bool(text)

    def submit(self) -> None:
        if self.busy:
            return
        name = self.query_one("#v-name", Input).value.strip()
        size = self.query_one("#v-size", Input).value.strip()
        vg = self.query_one("#v-vg", Input).value.strip() or None
        for field in ("e-name", "e-size", "volume-form-error"):
            self._error(field, "")
        ok = True
        try:
            check_name(name)
        except CloudboxError as e:
            self._error("e-name", str(e))
            ok = False
        try:
            size_bytes = parse_size(size, "size")
        except CloudboxError as e:
            self._error("e-size", str(e))
            return
        if not ok:
            return
        self.busy = True
        self._error("volume-form-error", f"creating {name} ({human_size(size_bytes)}{f' in {vg}' if vg else ''})…")
        self.app.work_in_thread(self.create, name, size_bytes, vg, done=self._created, failed=self._failed,
                                name=f"creating volume {name}")

    def _created(self, vol: Volume) -> None:
        self.busy = False
        if self.is_attached:
            self.dismiss(vol)

    def _failed(self, err: BaseException) -> None:
        self.busy = False
        if not isinstance(err, CloudboxError):
            self.app.report_error(err, "creating a volume")
        if self.is_attached:
            self._error("volume-form-error", str(err))

    def action_cancel(self) -> None:
        if self.busy:  # the file is being allocated: its outcome is shown here, then Esc closes
            self.notify("the volume is being created; wait for it", severity="warning")
            return
        self.dismiss(None)


class VolumesScreen(BaseScreen[Volumes]):
    MODE = "volumes"
    RELOAD_EVERY = 3.0
    HELP = ("The network block volumes this box serves to runs (docs/volumes.md): each a pre-allocated file, its "
            "size, the live run it is attached to (a volume serves one run at a time), how it is exported and when "
            "it was made. The line above the table says which schemes this host can export (NBD with TLS through "
            "qemu-nbd, AoE through vblade) and who attaches each; the line below names the highlighted volume's file "
            "and how a profile names it. n makes a volume (name and size), D deletes the highlighted one after "
            "asking; a volume attached to a live run is not deleted.")
    BINDINGS = screen_keys(MODE)
    COLUMNS = {"volumes": ("Volume", "Size", "Backing", "Attached to", "Exports", "Created")}
    FOCUS = "volumes"

    def __init__(self) -> None:
        super().__init__()
        self.data: Volumes | None = None
        self.volumes: dict[str, Volume] = {}

    def body(self) -> ComposeResult:
        with Vertical(id="volumes-split"):
            yield Static("", id="volume-exports", markup=False)
            yield PlainTable(id="volumes", cursor_type="row")
            yield Static("", id="volume-detail", markup=False)

    def fetch(self) -> Volumes:
        return self.app.backend.volumes()

    def show(self, data: Volumes) -> None:
        self.data = data
        self.query_one("#volume-exports", Static).update(exports_line(data.exports))
        usable = ", ".join(SCHEME_WORDS.get(e.scheme, e.scheme) for e in data.exports if e.usable) or "none here"
        table = self.table("volumes")
        self.volumes = {v.name: v for v in data.volumes}
        table.set_rows(((v.name, (v.name, human_size(v.size_bytes), v.backing, attached_to(v, data), usable,
                                  seen(v.created))) for v in data.volumes), keep=table.highlighted_key())
        self._show_detail()

    def current_name(self) -> str | None:
        return self.table("volumes").highlighted_key()

    def _show_detail(self) -> None:
        detail = self.query_one("#volume-detail", Static)
        v = self.volumes.get(self.current_name() or "")
        if self.data is None:
            detail.update("")
        elif v is None:
            detail.update(EMPTY)
        else:
            detail.update(volume_detail(v, self.data))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id == "volumes":
            self._show_detail()

    def action_reload(self) -> None:
        self.app.backend.forget_exports()
        self.reload()

    def action_new(self) -> None:
        def made(vol: Volume | None) -> None:
            if vol is not None:
                made_as = f"a logical volume in {vol.vg}" if vol.vg else "pre-allocated"
                self.notify(f"volume {vol.name}: {human_size(vol.size_bytes)} {made_as} at {vol.path}",
                            title="volumes", markup=False)
            self.reload()

        self.app.push_screen(VolumeDialog(self.app.backend.create_volume), made)

    def action_delete(self) -> None:
        v = self.volumes.get(self.current_name() or "")
        if v is None:
            self.notify("no volume to delete: n makes one", title="volumes", severity="warning")
            return
        name = v.name

        def deleted(gone: Volume) -> None:
            self.notify(f"volume {gone.name} deleted ({human_size(gone.size_bytes)}, {gone.path} removed)",
                        title="volumes", markup=False)
            self.reload()

        def answer(yes: bool | None) -> None:
            if yes:
                self.app.work_in_thread(self.app.backend.delete_volume, name, done=deleted,
                                        name=f"deleting volume {name}")
            else:
                self.reload()

        self.app.push_screen(ConfirmDialog(
            "Delete volume", f"Delete volume {name} ({human_size(v.size_bytes)})? Its file {v.path} is removed with "
            "everything written to it, and profiles naming it cannot run until a volume of that name exists again.",
            yes="Delete"), answer)
