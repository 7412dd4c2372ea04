"""Help (?): what each screen is for and every key, generated from the screens' own bindings."""

from __future__ import annotations

from collections.abc import Mapping

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Label, Markdown

from cloudbox.tui.screens.base import BaseScreen


def help_markdown(current: Screen, modes: Mapping[str, object]) -> str:
    """The help text for the app's `modes` (name: screen class), `current` marked."""
    screens = sum(1 for cls in modes.values() if isinstance(cls, type) and issubclass(cls, BaseScreen))
    lines = ["# cloudbox", "",
             f"Keys: **1**–**{screens}** switch screens, **?** this help, **Ctrl+P** the command palette (every "
             "action), **q** quit. Runs keep going when you quit.", "",
             "Numbers measured under TCG emulation are marked **\\*** and are not virtualization-overhead "
             "figures; nested KVM is labelled *nested*. The Studies screen labels them as the study report does: "
             "(emulated) and (nested).", ""]
    for mode, cls in modes.items():
        if not (isinstance(cls, type) and issubclass(cls, BaseScreen)):
            continue
        here = " (this screen)" if isinstance(current, cls) else ""
        lines += [f"## {mode.capitalize()}{here}", "", cls.HELP, ""]
        for b in cls.BINDINGS:
            if isinstance(b, Binding) and b.show:
                tip = f": {b.tooltip}" if b.tooltip else ""
                lines.append(f"- **{b.key_display or b.key}** {b.description}{tip}")
        lines.append("")
    return "\n".join(lines)


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,question_mark,q", "close", "Close", id="help.close")]

    def __init__(self, current: Screen, modes: Mapping[str, object]):
        super().__init__()
        self.current = current
        self.modes = modes

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide"):
            with VerticalScroll(classes="dialog-scroll"):
                yield Markdown(help_markdown(self.current, self.modes), id="help-text")
            yield Label("Esc: close", classes="dialog-hint")

    def action_close(self) -> None:
        self.dismiss(None)
