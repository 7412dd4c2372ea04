"""The profile form: a new profile from an existing one, every knob a field; validated by the core before
it is saved, each problem shown next to its field."""

from __future__ import annotations

from textual import getters
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select

from cloudbox.core.errors import CloudboxError, ProfileError
from cloudbox.core.spec import profiles
from cloudbox.tui.app_base import CloudboxAppBase


def _field_id(key: str) -> str:
    return "f-" + key.replace(".", "-")


def _err_id(key: str) -> str:
    return "e-" + key.replace(".", "-")


class ProfileForm(ModalScreen[str | None]):
    """Returns the saved profile's name, or None when cancelled."""

    BINDINGS = [
        Binding("ctrl+s", "save", "Save", id="form.save"),
        Binding("escape", "cancel", "Cancel", id="form.cancel"),
    ]

    app = getters.app(CloudboxAppBase)

    def __init__(self, base: profiles.Profile, new_name: str):
        super().__init__()
        self.base = base
        self.new_name = new_name

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog form"):
            yield Label(f"New profile from {self.base.name}   (Ctrl+S save, Esc cancel)", classes="dialog-title")
            yield Label("", id="form-error", classes="field-error", markup=False)
            with VerticalScroll(id="form-fields"):
                yield from self._row("name", "name", Input(self.new_name, id=_field_id("name")))
                yield from self._row("description", "description",
                                     Input(f"{self.base.description} (copy)"[:200], id=_field_id("description")))
                for key, value in self.base.knobs().items():
                    kind, choices = profiles.knob_kind(key)
                    w: Select[str] | Input
                    if kind in ("choice", "bool"):
                        current = str(value).lower() if kind == "bool" else str(value)
                        w = Select([(c, c) for c in choices], value=current, allow_blank=False, id=_field_id(key))
                    else:
                        w = Input(str(value), id=_field_id(key), type="integer" if kind == "int" else "text")
                    allowed = profiles.allowed_for(key) or ""
                    yield from self._row(key, f"{key}  [{allowed}]" if allowed else key, w)
            with Horizontal(classes="dialog-buttons"):
                yield Button("Save (Ctrl+S)", id="save", variant="primary")
                yield Button("Cancel (Esc)", id="cancel")

    def _row(self, key: str, label: str, widget):
        yield Label(label, classes="field-label", markup=False)
        yield widget
        yield Label("", id=_err_id(key), classes="field-error", markup=False)

    def on_mount(self) -> None:
        self.query_one(f"#{_field_id('name')}", Input).focus()

    def collect(self) -> dict:
        """The form's values as a profile document (types as the schema wants them where they parse)."""
        data: dict = {"name": self.query_one(f"#{_field_id('name')}", Input).value.strip(),
                      "description": self.query_one(f"#{_field_id('description')}", Input).value.strip()}
        if self.base.reproduces:
            data["reproduces"] = self.base.reproduces
        for key in self.base.knobs():
            section, name = key.split(".")
            kind, _ = profiles.knob_kind(key)
            if kind in ("choice", "bool"):
                raw = str(self.query_one(f"#{_field_id(key)}", Select).value)
                val: object = (raw == "true") if kind == "bool" else raw
            else:
                raw = self.query_one(f"#{_field_id(key)}", Input).value.strip()
                val = raw
                if kind == "int":
                    try:
                        val = int(raw)
                    except ValueError:
                        val = raw  # the core reports "must be an integer" next to the field
            data.setdefault(section, {})[name] = val
        return data

    def action_save(self) -> None:
        for lab in self.query(".field-error"):
            lab.update("")  # type: ignore[attr-defined]
        data = self.collect()
        try:
            path = self.app.backend.save_profile(data, f"new profile {data['name']!r}")
        except ProfileError as e:
            self.show_problems(e)
            return
        except CloudboxError as e:
            self.query_one("#form-error", Label).update(str(e))
            return
        self.app.notify(f"saved profile {data['name']} to {path}", title="profiles")
        self.dismiss(data["name"])

    def show_problems(self, err: ProfileError) -> None:
        unplaced = []
        first = None
        per_field: dict[str, list[str]] = {}
        for p in err.problems:
            key = p.key if p.key in ("name", "description") or p.key in self.base.knobs() else None
            if key is None:
                unplaced.append(str(p))
                continue
            msg = f"{p.message} (got {p.value!r})" + (f"; allowed: {p.allowed}" if p.allowed else "")
            per_field.setdefault(key, []).append(msg)
            first = first or key
        for key, msgs in per_field.items():
            self.query_one(f"#{_err_id(key)}", Label).update("! " + "; ".join(msgs))
        n = len(err.problems)
        head = f"not saved: {n} problem{'s' if n != 1 else ''}, shown next to the fields"
        self.query_one("#form-error", Label).update("\n".join([head, *unplaced]))
        if first:
            self.query_one(f"#{_field_id(first)}").focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "save":
            self.action_save()
        else:
            self.dismiss(None)

    def action_cancel(self) -> None:
        self.dismiss(None)
