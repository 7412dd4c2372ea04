"""A list of names to tick, where the tick is a visible "[x]" (not only a colour): space or Enter toggles. A name
that cannot be used here is greyed with its reason written beside it."""

from __future__ import annotations

from rich.text import Text
from textual.binding import Binding
from textual.widgets import OptionList
from textual.widgets.option_list import Option


class CheckList(OptionList):
    BINDINGS = [Binding("space", "tick", "Tick", id="checklist.tick", show=False)]

    def __init__(self, **kw):
        super().__init__(**kw)
        self.items: list[tuple[str, str]] = []  # (name, description)
        self.checked: set[str] = set()
        self.blocked: dict[str, str] = {}  # name -> why it cannot be used here
        self._follow = 0  # tries left to scroll the first fill's cursor into view once the list is laid out

    def set_items(self, items: list[tuple[str, str]], checked: set[str],
                  blocked: dict[str, str] | None = None) -> None:
        keep = self.highlighted
        self.items = list(items)
        self.blocked = dict(blocked or {})
        self.checked = {c for c in checked if c in {n for n, _ in items}}
        self.clear_options()
        self.add_options([Option(self._prompt(n), id=n) for n, _ in self.items])
        if self.items and keep is None:  # first fill: the cursor on (and the list scrolled to) the first ticked name
            self.highlighted = next((i for i, (n, _) in enumerate(self.items) if n in self.checked), 0)
            self._follow = 50
            self.call_after_refresh(self._follow_cursor)  # once laid out: before, it has no height to scroll
        elif self.items:
            self.highlighted = min(keep or 0, len(self.items) - 1)

    def _follow_cursor(self) -> None:
        """Scroll the cursor into view, again after each refresh (and resize) until the list has a size and the
        cursor shows: on a loaded machine the first refresh can come before the list's layout."""
        if not self._follow or not self.is_mounted:
            return
        self._follow -= 1
        self.scroll_to_highlight()
        # laid out: a height of its own and every option's line in its virtual size (scrolling then lands)
        if self.scrollable_content_region.height and self.virtual_size.height >= self.option_count:
            self._follow = 0
        else:
            self.call_after_refresh(self._follow_cursor)

    def on_resize(self) -> None:
        if self._follow:
            self.call_after_refresh(self._follow_cursor)

    def _prompt(self, name: str) -> Text:
        text = Text(f"[{'x' if name in self.checked else ' '}] {name}")
        if name in self.blocked:
            text.stylize("dim")
            text.append(f"  ({self.blocked[name]})", style="dim italic")
        return text

    @property
    def selected(self) -> list[str]:
        return [n for n, _ in self.items if n in self.checked]

    def action_tick(self) -> None:
        if self.highlighted is None or not self.items:
            return
        name = self.items[self.highlighted][0]
        self.checked.symmetric_difference_update({name})
        self.replace_option_prompt(name, self._prompt(name))

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.action_tick()
