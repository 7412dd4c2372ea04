"""What every installer page shares: a title line naming the step, the key bar, Esc to go back, and
placing the core's problems (AnswerError) next to their fields."""

from __future__ import annotations

from rich.text import Text
from textual import getters
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Label

from cloudbox.core.errors import AnswerError
from cloudbox.tui.install_base import InstallAppBase
from cloudbox.tui.widgets.keybar import KeyBar

STEPS = ("Role", "Disk", "Node", "Review", "Install")


def err_id(key: str) -> str:
    return "e-" + key.replace(".", "-").replace("_", "-")


def field_id(key: str) -> str:
    return "f-" + key.replace(".", "-").replace("_", "-")


def problem_text(p: object) -> str:
    """One problem as the CLI prints it: message, the value given, what is allowed."""
    message, value, allowed = getattr(p, "message", ""), getattr(p, "value", None), getattr(p, "allowed", None)
    got = f" (got {value!r})" if value is not None else ""
    return f"! {message}{got}" + (f"; allowed: {allowed}" if allowed else "")


class InstallPage(Screen[None]):
    STEP = 0  # index in STEPS
    BINDINGS = [Binding("escape", "back", "Back", id="install.back")]

    app = getters.app(InstallAppBase)

    def compose(self) -> ComposeResult:
        t = Text(no_wrap=True, overflow="ellipsis")
        t.append(" cloudbox install", style="bold")
        t.append("  " + ("(dry run)  " if self.app.dry_run else ""))
        for i, name in enumerate(STEPS):
            t.append(f"[{name}]" if i == self.STEP else f" {name} ", style="bold reverse" if i == self.STEP else "")
            if i < len(STEPS) - 1:
                t.append(">")
        yield Label(t, id="install-steps", markup=False)
        yield from self.body()
        yield KeyBar()

    def body(self) -> ComposeResult:
        yield from ()

    def action_back(self) -> None:
        if len(self.app.screen_stack) > 2:
            self.app.pop_screen()

    def set_error(self, selector: str, text: str) -> None:
        """Show `text` in an error label (hidden while empty, so it takes no line)."""
        lab = self.query_one(selector, Label)
        lab.update(text)
        lab.display = bool(text)

    def clear_problems(self) -> None:
        for lab in self.query(".field-error"):
            if isinstance(lab, Label):
                lab.update("")
                lab.display = False

    def show_problems(self, err: AnswerError, keys: dict[str, str], general: str = "#page-error") -> bool:
        """Each problem of `err` under its field (`keys`: problem key -> field key); the rest in `general`.
        Focuses the first field with a problem. Returns True when there was any problem."""
        per: dict[str, list[str]] = {}
        rest: list[str] = []
        for p in err.problems:
            fk = keys.get(p.key)
            if fk is None or not self.query(f"#{err_id(fk)}"):
                rest.append(f"{p.key}: {problem_text(p)[2:]}")
                continue
            per.setdefault(fk, []).append(problem_text(p))
        for fk, msgs in per.items():
            self.set_error(f"#{err_id(fk)}", "; ".join(msgs))
        n = len(err.problems)
        head = f"{n} problem{'s' if n != 1 else ''}" + (", shown next to the fields" if per else "")
        self.set_error(general, "\n".join([head, *rest]))
        first = next(iter(per), None)
        if first and self.query(f"#{field_id(first)}"):
            self.query_one(f"#{field_id(first)}").focus()
        return bool(err.problems)
