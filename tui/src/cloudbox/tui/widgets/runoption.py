"""The run form's controls, built from the run options' one declaration (core.spec.runspec.run_option)."""

from __future__ import annotations

from textual.widgets import Input, Select

from cloudbox.core.spec.runspec import RunOption


def run_control(opt: RunOption, *, id: str, tooltip: str | None = None) -> Select[str] | Input:
    """The control the option declares: a select of its offered choices, or an input holding its value as the CLI
    writes it; either starts at the form's initial value."""
    if opt.control == "select":
        return Select(opt.offered(), value=opt.initial, allow_blank=False, id=id, tooltip=tooltip)
    if opt.control == "input":
        return Input(opt.text(opt.initial), id=id, compact=True, tooltip=tooltip)
    raise ValueError(f"run option {opt.field} declares no control for the form")
