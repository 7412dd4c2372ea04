"""The screens' own keys in one table: each key's action, footer word and tooltip, and the id a keymap knows it
by (SCREEN.NAME), so a key taken twice or an id spelt two ways shows in one place."""

from __future__ import annotations

from typing import NamedTuple

from textual.binding import Binding, BindingType


class Key(NamedTuple):
    key: str
    action: str
    description: str  # the footer's word
    tooltip: str = ""
    name: str = ""  # the id's second half; the action's name when empty
    show: bool = True  # in the footer and the help screen


SCREEN_KEYS: dict[str, tuple[Key, ...]] = {
    "profiles": (
        Key("u", "use", "Use", "make the highlighted profile the active one"),
        Key("space", "mark", "Mark", "mark for diff"),
        Key("d", "diff", "Diff", "diff the two marked profiles"),
        Key("n", "new", "New from", "new profile from the highlighted one"),
        Key("e", "edit", "Edit ($EDITOR)"),
        Key("x", "delete", "Delete", "delete a user profile"),
    ),
    "guests": (
        Key("l", "launch", "Launch", "launch a guest with a profile"),
        Key("s", "stop", "Stop", "stop the guest and clean up (confirm)"),
        Key("D", "destroy", "Destroy", "power off at once (confirm)"),
        Key("x", "xml", "XML", "show the domain XML"),
        Key("r", "reload", "Refresh", name="refresh"),
    ),
    "tests": (
        Key("s", "start", "Start", "start the run or sweep set up here"),
        Key("c", "cancel_run", "Cancel run", name="cancel"),
        Key("a", "attach_pick", "Attach", "watch another run in progress", name="attach"),
        Key("l", "show_log", "Full log", name="log"),
        # off the footer and the Tab order (scripts count Shift+Tabs to the fields): its label names the key
        Key("m", "toggle_mix", "Mix profiles", "run the ticked profiles mixed in one run instead of a sweep",
            name="mix", show=False),
    ),
    "results": (
        Key("space", "mark", "Mark"),
        Key("c", "compare", "Compare", "compare the marked runs"),
        Key("e", "export", "Export", "export the marked runs"),
        Key("D", "delete", "Delete", "delete the highlighted run"),
        Key("escape", "close_compare", "Close table", name="close", show=False),
    ),
    "studies": (
        Key("r", "report", "Report", "the study's Markdown report (also Enter)"),
        Key("s", "start", "Start quick run", "run the study's missing cells at quick size in the background"),
    ),
    "volumes": (
        Key("n", "new", "New volume", "a new pre-allocated volume: name and size"),
        Key("D", "delete", "Delete",
            "delete the highlighted volume and its file (asks first; refused while a run has it)"),
        Key("r", "reload", "Refresh", name="refresh"),
    ),
}


def screen_keys(mode: str) -> list[BindingType]:
    """The BINDINGS of the screen `mode`, in the table's order."""
    return [Binding(k.key, k.action, k.description, show=k.show, id=f"{mode}.{k.name or k.action}",
                    tooltip=k.tooltip) for k in SCREEN_KEYS[mode]]
