"""Installer page 4: the plan (the dry run: what will be written where), and the explicit confirmation:
the word "yes" typed, as the CLI asks. In a dry run there is nothing to confirm."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Input, Label, Log

from cloudbox.core.install import InstallPlan
from cloudbox.tui.screens.install.page import InstallPage


class ReviewPage(InstallPage):
    STEP = 3
    BINDINGS = [Binding("ctrl+n", "next", "Install", id="install.review.next")]

    def __init__(self, plan: InstallPlan):
        super().__init__()
        self.plan = plan

    def body(self) -> ComposeResult:
        plan = self.plan
        with Vertical(classes="install-body"):
            yield Label("\n".join(plan.summary()), id="plan-summary", markup=False)
            yield Log(id="plan-text", max_lines=None)
            if self.app.dry_run:
                yield Label("dry run: nothing will be written. Esc: back, Ctrl+Q: leave", id="confirm-hint",
                            markup=False)
            elif plan.mode == "done":
                yield Label(f"{plan.disk.path} already holds this install: nothing will be written. "
                            "Ctrl+N: finish", id="confirm-hint", markup=False)
            else:
                with Horizontal(id="confirm-row"):
                    what = "ERASE" if plan.mode == "fresh" else "write to"
                    yield Label(f'Type yes to {what} {plan.disk.path} and install: ', id="confirm-label",
                                markup=False)
                    yield Input("", id="f-confirm", compact=True, placeholder="yes")
            yield Label("", id="page-error", classes="field-error", markup=False)

    def on_mount(self) -> None:
        self.clear_problems()
        log = self.query_one("#plan-text", Log)
        # Log drops empty lines: keep the plan's paragraphs apart with a space.
        log.write_lines([ln or " " for ln in self.plan.describe().rstrip("\n").splitlines()])
        log.scroll_home(animate=False)
        inputs = self.query("#f-confirm")
        if inputs:
            inputs.first().focus()
        else:
            self.query_one("#plan-text").focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.action_next()

    def action_next(self) -> None:
        if self.app.dry_run:
            self.set_error("#page-error", "! dry run: nothing is written (run `cloudbox install` to install)")
            return
        inputs = self.query("#f-confirm")
        if inputs:
            confirm = inputs.first(Input)
            if confirm.value.strip().lower() != "yes":
                self.set_error("#page-error", f'! not confirmed: type yes to install onto {self.plan.disk.path} '
                               "(Esc: back to change the answers)")
                confirm.focus()
                return
        self.app.next_page(self, self.plan)
