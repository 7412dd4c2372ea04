"""Modal dialogs: confirm, choose a profile, show text (domain XML, logs), export results."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, OptionList, Select, Static


class ConfirmDialog(ModalScreen[bool]):
    """Yes/no. `y`/Enter on Yes confirms, `n`/Escape cancels; the question says what will happen."""

    BINDINGS = [
        Binding("y", "answer(True)", "Yes", id="confirm.yes"),
        Binding("n,escape", "answer(False)", "No", id="confirm.no"),
    ]

    def __init__(self, title: str, question: str, yes: str = "Yes", no: str = "No"):
        super().__init__()
        self.title_text, self.question, self.yes, self.no = title, question, yes, no

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.title_text, classes="dialog-title", markup=False)
            yield Static(self.question, classes="dialog-body", markup=False)
            with Horizontal(classes="dialog-buttons"):
                yield Button(f"{self.yes} (y)", id="yes", variant="error")
                yield Button(f"{self.no} (n)", id="no", variant="primary")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, value: bool) -> None:
        self.dismiss(value)


class PickDialog(ModalScreen[str | None]):
    """Choose one of several names (e.g. the profile to launch a guest with)."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="pick.cancel")]

    def __init__(self, title: str, options: list[tuple[str, str]], selected: str | None = None,
                 greyed: frozenset[str] = frozenset()):
        super().__init__()
        self.title_text, self.options, self.selected, self.greyed = title, options, selected, greyed

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.title_text, classes="dialog-title", markup=False)
            yield OptionList(*[Text(f"{name}  {desc}", style="dim" if name in self.greyed else "")
                               for name, desc in self.options], id="pick")
            yield Label("Enter: choose   Esc: cancel", classes="dialog-hint")

    def on_mount(self) -> None:
        ol = self.query_one(OptionList)
        names = [n for n, _ in self.options]
        if self.selected in names:
            ol.highlighted = names.index(self.selected)
        ol.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(self.options[event.option_index][0])

    def action_cancel(self) -> None:
        self.dismiss(None)


class TextDialog(ModalScreen[None]):
    """Read-only text in a scrollable box (domain XML, a run's log)."""

    BINDINGS = [Binding("escape,q", "close", "Close", id="text.close")]

    def __init__(self, title: str, text: str):
        super().__init__()
        self.title_text, self.text = title, text

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide"):
            yield Label(self.title_text, classes="dialog-title", markup=False)
            yield from self.body()
            yield Label("Esc: close", classes="dialog-hint")

    def body(self) -> ComposeResult:
        with VerticalScroll(classes="dialog-scroll"):
            yield Static(self.text, markup=False, id="text")

    def action_close(self) -> None:
        self.dismiss(None)


class ExportDialog(ModalScreen[tuple[str, Path] | None]):
    """Choose the export format and the file to write."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="export.cancel")]
    FORMATS = (("JSON (whole runs, provenance, raw output)", "json"), ("CSV (the comparison table)", "csv"),
               ("Markdown (the comparison table)", "markdown"))
    EXT = {"json": "json", "csv": "csv", "markdown": "md"}

    def __init__(self, default_stem: Path):
        super().__init__()
        self.stem = default_stem

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label("Export results", classes="dialog-title")
            yield Select(self.FORMATS, value="markdown", allow_blank=False, id="format")
            yield Input(str(self.stem.with_suffix(".md")), id="path")
            yield Label("", id="export-error", classes="field-error", markup=False)
            with Horizontal(classes="dialog-buttons"):
                yield Button("Export", id="ok", variant="primary")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#path", Input).focus()

    def on_select_changed(self, event: Select.Changed) -> None:
        inp = self.query_one("#path", Input)
        p = Path(inp.value or str(self.stem))
        inp.value = str(p.with_suffix("." + self.EXT[str(event.value)]))

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "cancel":
            self.dismiss(None)
            return
        self._submit()

    def on_input_submitted(self, _event: Input.Submitted) -> None:
        self._submit()

    def _submit(self) -> None:
        value = self.query_one("#path", Input).value.strip()
        if not value:
            self.query_one("#export-error", Label).update("give a file name to write")
            return
        self.dismiss((str(self.query_one("#format", Select).value), Path(value)))

    def action_cancel(self) -> None:
        self.dismiss(None)
