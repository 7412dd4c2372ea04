"""Profiles: presets and user profiles; every knob of one; the diff of two side by side; switch the active
profile; create a profile from another (form or $EDITOR), validated before it is saved."""

from __future__ import annotations

import os
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import DataTable, Static

from cloudbox.core.errors import CloudboxError, ProfileError
from cloudbox.core.spec import profiles
from cloudbox.core.virt import accel
from cloudbox.tui.screens.base import BaseScreen, toggled
from cloudbox.tui.screens.keys import screen_keys
from cloudbox.tui.screens.profile_form import ProfileForm
from cloudbox.tui.widgets.dialogs import ConfirmDialog, TextDialog
from cloudbox.tui.widgets.table import PlainTable


@dataclass
class ProfilesData:
    entries: list[profiles.ProfileEntry]
    active: str
    loaded: dict[str, profiles.Profile]  # parsed in the worker, so moving the cursor does no file I/O
    boot: accel.Boot  # what the box is booted into: profiles of the other hypervisor are greyed


def boot_line(boot: accel.Boot, entries: list[profiles.ProfileEntry]) -> Text:
    """The line above the list: the hypervisor the box is booted into, and why greyed profiles cannot run."""
    why = sorted({r for e in entries if e.problem is None and (r := boot.refusal(e.hypervisor, e.xen_type, e.raid_on))})
    line = Text("Booted into: ")
    line.append(boot.label, style="bold")
    if why:
        line.append(f".  Greyed: cannot run on this boot ({'; '.join(why)})", style="dim")
    return line


def knob_text(value: object) -> Text:
    """A knob's value as the profile's TOML spells it (true/false, not Python's True/False), never markup."""
    return Text(str(value).lower() if isinstance(value, bool) else str(value))


def detail_title(e: profiles.ProfileEntry) -> str:
    """The detail pane's first words: which profile it shows."""
    return f"{e.name} ({e.kind})"


def knob_table(p: profiles.Profile) -> Table:
    t = Table(show_header=True, header_style="bold", box=None, expand=False, pad_edge=False)
    t.add_column("knob")
    t.add_column("value")
    for k, v in p.knobs().items():
        t.add_row(k, knob_text(v))
    return t


def diff_table(a: profiles.Profile, b: profiles.Profile, width: int | None = None) -> Table:
    """Every knob side by side; differing rows are marked with '≠' (not only by colour). When `width` is too
    narrow for three columns (the detail pane at 80 columns), each differing knob gets two lines: A's value,
    then B's; narrower still (a long profile list beside it), the values go under the knob names, so no value is
    ever cut or folded."""
    # a table only one has (a Xen profile's [dom0], an NFS one's [nfs]) beside the other's defaults
    tables = tuple(t for t in profiles.SECTIONS if t in a.sections() or t in b.sections())
    every = "dom0" in tables  # Xen's guest type too
    ka, kb = a.knobs(every, tables), b.knobs(every, tables)
    va = {k: knob_text(v).plain for k, v in ka.items()}
    vb = {k: knob_text(v).plain for k, v in kb.items()}
    knob_w = max(map(len, ka))
    side_by_side = 2 + knob_w + 1 + max(len(a.name), *map(len, va.values())) + 1 + \
        max(len(b.name), *map(len, vb.values()))
    t = Table(show_header=True, header_style="bold", box=None, pad_edge=False, collapse_padding=True)
    t.add_column("", no_wrap=True)
    t.add_column("knob", no_wrap=True, min_width=knob_w)
    if width is None or width >= side_by_side:
        t.title = f"{a.name}  vs  {b.name}"
        t.add_column(a.name)
        t.add_column(b.name)
        for k in ka:
            differs = ka[k] != kb[k]
            t.add_row("≠" if differs else "", k, Text(va[k]), Text(vb[k]), style="bold" if differs else "dim")
    elif width < 2 + knob_w + 1 + max(*map(len, va.values()), *map(len, vb.values())):
        t.title = f"A: {a.name}\nB: {b.name}"
        for k in ka:
            if ka[k] != kb[k]:
                t.add_row("≠", Text(f"{k}\n A {va[k]}\n B {vb[k]}"), style="bold")
            else:
                t.add_row("", Text(f"{k}\n   {va[k]}"), style="dim")
    else:
        t.title = f"A: {a.name}\nB: {b.name}"
        t.add_column("A / B", overflow="fold")
        for k in ka:
            if ka[k] != kb[k]:
                t.add_row("≠", k, Text(f"{va[k]}\n{vb[k]}"), style="bold")
            else:
                t.add_row("", k, Text(va[k]), style="dim")
    n = sum(1 for k in ka if ka[k] != kb[k])
    t.caption = f"{n} knob{'s' if n != 1 else ''} differ" if n else "no knob differs"
    return t


class ProfilesScreen(BaseScreen[ProfilesData]):
    MODE = "profiles"
    RELOAD_EVERY = 5.0
    HELP = ("Tuning profiles: shipped presets (each reproduces a row of the studies) and your own. "
            "Enter shows a profile's knobs; u makes it the active profile (what new runs and guests use); "
            "space marks profiles and d shows the diff of the two marked (or the highlighted one against "
            "the active one); n creates a new profile from the highlighted one in a form; e edits a user "
            "profile in $EDITOR; x deletes a user profile. Everything is validated before it is saved.")
    BINDINGS = screen_keys(MODE)
    COLUMNS = {"profiles": ("Act", "Mk", "Name", "Kind")}
    FOCUS = "profiles"

    def __init__(self) -> None:
        super().__init__()
        self.entries: list[profiles.ProfileEntry] = []
        self.active = ""
        self.marked: list[str] = []
        self.loaded: dict[str, profiles.Profile] = {}
        self.boot: accel.Boot | None = None
        self.drawn: ProfilesData | None = None  # what the list shows

    def body(self) -> ComposeResult:
        yield Static("", id="boot-line")
        with Horizontal(id="profiles-split"):
            yield PlainTable(id="profiles", cursor_type="row")
            with VerticalScroll(id="profile-detail-box"):
                yield Static("", id="profile-detail")

    def fetch(self) -> ProfilesData:
        b = self.app.backend
        entries = b.profiles()
        loaded = {}
        for e in entries:
            if e.problem is None:
                try:
                    loaded[e.name] = profiles.load_profile(e.path)
                except CloudboxError:
                    pass
        return ProfilesData(entries, b.active_profile(), loaded, b.boot())

    def show(self, data: ProfilesData) -> None:
        if data == self.drawn:
            return  # nothing changed: the list, its cursor and the detail (or a diff) stay as they are
        self.drawn = data
        self.entries, self.active, self.loaded, self.boot = data.entries, data.active, data.loaded, data.boot
        self.query_one("#boot-line", Static).update(boot_line(data.boot, data.entries))

        def cells(e: profiles.ProfileEntry) -> tuple[Text, ...]:
            style = "dim" if e.problem is None and data.boot.refusal(e.hypervisor, e.xen_type, e.raid_on) else ""
            return tuple(Text(c, style=style, end="") for c in (
                "active" if e.name == self.active else "", "x" if e.name in self.marked else "", e.name,
                e.kind if e.problem is None else f"{e.kind} INVALID"))

        table = self.table("profiles")
        table.set_rows(((e.name, cells(e)) for e in self.entries), keep=table.highlighted_key())
        self.show_detail()

    def current_name(self) -> str | None:
        return self.table("profiles").highlighted_key()

    def entry(self, name: str | None) -> profiles.ProfileEntry | None:
        return next((e for e in self.entries if e.name == name), None)

    def on_data_table_row_highlighted(self, _event: DataTable.RowHighlighted) -> None:
        self.show_detail()

    def show_detail(self) -> None:
        detail = self.query_one("#profile-detail", Static)
        e = self.entry(self.current_name())
        if e is None:
            detail.update("no profiles found")
            return
        if e.problem:
            detail.update(Text(f"{e.path}\n\n{e.problem}"))
            return
        p = self.loaded.get(e.name)
        if p is None:
            detail.update(Text(f"{e.path}: not loaded yet"))
            return
        head = Text(f"{detail_title(e)}{'  [active]' if e.name == self.active else ''}\n", style="bold")
        head.append(f"{p.description}\n", style="")
        if p.reproduces:
            head.append(f"Reproduces: {p.reproduces}\n", style="italic")
        head.append(f"{e.path}\n", style="dim")
        why = self.boot.refusal(p.guest.hypervisor, profiles.xen_guest_type(p), p.disk.raid_on) if self.boot else None
        if why:
            head.append(f"Cannot run on this boot ({self.boot.label if self.boot else '?'}): {why}\n",
                        style="bold yellow")
        from rich.console import Group

        detail.update(Group(head, knob_table(p)))

    # -- actions -----------------------------------------------------------------------------------
    def action_use(self) -> None:
        name = self.current_name()
        if name is None:
            return

        def done(prof: profiles.Profile) -> None:
            self.notify(f"active profile: {prof.name}", title="profiles")
            self.reload()

        self.app.work_in_thread(self.app.backend.set_active_profile, name, done=done, name=f"switching to {name}")

    def action_mark(self) -> None:
        name = self.current_name()
        if name is None:
            return
        self.marked = toggled(self.marked, name, most=2)
        table = self.table("profiles")
        for e in self.entries:
            grey = e.problem is None and self.boot is not None and self.boot.refusal(e.hypervisor, e.xen_type,
                                                                                      e.raid_on)
            table.update_cell(e.name, table.ordered_columns[1].key,
                              Text("x" if e.name in self.marked else "", style="dim" if grey else "", end=""))

    def action_diff(self) -> None:
        pair: list[str | None] = list(self.marked)
        if len(pair) < 2:
            cur = self.current_name()
            pair = [self.active, cur] if len(pair) == 0 else [pair[0], cur]
        if len(pair) != 2 or None in pair or pair[0] == pair[1]:
            self.notify("mark two profiles with space (or highlight one to diff it against the active one)",
                        severity="warning")
            return
        a, b = (self.loaded.get(str(n)) for n in pair)
        if a is None or b is None:
            self.notify("cannot diff an invalid profile; see its detail for the problem", severity="warning")
            return
        box = self.query_one("#profile-detail-box")
        width = box.size.width - box.styles.scrollbar_size_vertical
        self.query_one("#profile-detail", Static).update(diff_table(a, b, width))

    def action_new(self) -> None:
        name = self.current_name()
        if name is None:
            return
        base = self.loaded.get(name)
        if base is None:
            self.notify(f"{name} is invalid; fix it before copying it", severity="warning")
            return
        taken = {e.name for e in self.entries}
        new = next(f"{name}-{i}" for i in range(2, 1000) if f"{name}-{i}" not in taken)

        def saved(result: str | None) -> None:
            if result:
                self.reload()

        self.app.push_screen(ProfileForm(base, new), saved)

    def action_edit(self) -> None:
        e = self.entry(self.current_name())
        if e is None:
            return
        if e.kind == "preset":
            self.notify(f"{e.name} is a shipped preset and cannot be changed; press n to make your own copy",
                        severity="warning")
            return
        self.edit_in_editor(e)

    def edit_in_editor(self, e: profiles.ProfileEntry) -> None:
        """Edit a draft in $EDITOR; it replaces the profile only if it validates. A draft that does not
        validate is kept (<state dir>/drafts/NAME.toml) and reopened by the next `e`, so no edit is lost."""
        from cloudbox.core import paths

        editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
        draft = paths.state_dir() / "drafts" / f"{e.name}.toml"
        draft.parent.mkdir(parents=True, exist_ok=True)
        resumed = draft.exists()
        if not resumed:
            draft.write_text(e.path.read_text())
        try:
            with self.app.suspend():
                rc = subprocess.call([*shlex.split(editor), str(draft)])
        except Exception:  # noqa: BLE001 - no terminal to hand over (headless): run the editor directly
            rc = subprocess.call([*shlex.split(editor), str(draft)], stdin=subprocess.DEVNULL)
        if rc != 0:
            self.notify(f"{editor} exited {rc}; {e.name} unchanged (your draft is kept in {draft})",
                        severity="warning")
            return
        try:
            prof = profiles.parse_profile(draft.read_text(), str(e.path), expect_name=e.name)
            profiles.save_user_profile(prof)
        except ProfileError as err:
            self.app.push_screen(TextDialog(
                f"{e.name} not saved; your edit is kept: press e to fix it", f"{err}\n\n(draft: {draft})"))
            return
        draft.unlink(missing_ok=True)
        self.notify(f"saved {e.path}" + (" (from your earlier draft)" if resumed else ""), title="profiles")
        self.reload()

    def action_delete(self) -> None:
        e = self.entry(self.current_name())
        if e is None:
            return
        if e.kind == "preset":
            self.notify(f"{e.name} is a shipped preset and cannot be deleted", severity="warning")
            return

        def answer(yes: bool | None) -> None:
            if yes:
                self.app.work_in_thread(self.app.backend.delete_user_profile, e.name, done=deleted)

        def deleted(path: Path) -> None:
            self.notify(f"deleted {path}", title="profiles")
            self.marked = [m for m in self.marked if m != e.name]
            self.reload()

        self.app.push_screen(ConfirmDialog("Delete profile", f"Delete the user profile {e.name} ({e.path})?",
                                           yes="Delete"), answer)
