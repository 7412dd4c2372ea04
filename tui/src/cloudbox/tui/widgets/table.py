"""The DataTable every screen uses: cells given as str are plain text, and the header stays aligned.

Textual's DataTable parses str cells as Rich markup, so a disk model, a guest name or an error message
containing "[...]" would be restyled, lose text, or raise MarkupError while rendering (a crash).

It also measures auto-width columns on idle, after add_row; a frame drawn in between caches the header
(and cells) rendered at the old widths under cache keys that do not include the width, so the header
could stay misaligned with the rows until the next change (seen in snapshot tests, timing-dependent).

Textual re-applies the CSS to every widget of a screen each time the screen is shown, and DataTable then
drops every cell it has rendered; here they are kept unless a style they were drawn with changed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Self

from rich.text import Text
from textual.geometry import Region
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import DataTable
from textual.widgets.data_table import CellDoesNotExist, CellType, ColumnKey, RowKey


def plain(value: Any) -> Any:
    return Text(value, end="") if isinstance(value, str) else value


class PlainTable(DataTable[Any]):
    _styles_drawn: tuple[Any, ...] | None = None  # the styles the cached cells were rendered with
    _styles_check = False
    _shown: list[tuple[str, tuple[Any, ...]]] | None = None  # what set_rows last put in the table

    def set_rows(self, rows: Iterable[tuple[str, Sequence[Any]]], keep: str | None = None) -> bool:
        """Show `rows`, each (key, cells). When the keys are the ones shown, in the same order, only the cells
        that changed are updated (the cursor and the rendered rows stay); else the table is rebuilt, the cursor
        goes back to the row keyed `keep` when there is one, and True is returned."""
        new = [(key, tuple(cells)) for key, cells in rows]
        old = self._shown
        if old is not None and self.row_count == len(old) and [k for k, _ in old] == [k for k, _ in new]:
            columns = [c.key for c in self.ordered_columns]
            for (key, cells), (_, before) in zip(new, old, strict=True):
                for column, value, was in zip(columns, cells, before, strict=True):
                    if value != was:  # DataTable's own: _shown is replaced whole below
                        DataTable.update_cell(self, key, column, plain(value), update_width=True)
            self._shown = new
            return False
        self.clear()
        for key, cells in new:
            self.add_row(*cells, key=key)
        self._shown = new
        keys = [key for key, _ in new]
        if keep in keys:
            self.move_cursor(row=keys.index(keep))
        return True

    def highlighted_key(self) -> str | None:
        """The key of the row under the cursor; None when the table has no rows."""
        if self.row_count == 0:
            return None
        try:
            key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        except CellDoesNotExist:
            return None
        return None if key is None else str(key)

    def clear(self, columns: bool = False) -> Self:
        self._shown = None
        super().clear(columns)
        return self

    def add_row(self, *cells: CellType, height: int | None = 1, key: str | None = None,
                label: Any = None) -> RowKey:
        return super().add_row(*(plain(c) for c in cells), height=height, key=key, label=label)

    def update_cell(self, row_key: RowKey | str, column_key: ColumnKey | str, value: CellType, *,
                    update_width: bool = False) -> None:
        super().update_cell(row_key, column_key, plain(value), update_width=update_width)
        if self._shown is not None:  # what set_rows compares with stays what the table shows
            key = row_key.value if isinstance(row_key, RowKey) else row_key
            column = column_key if isinstance(column_key, ColumnKey) else ColumnKey(column_key)
            index = [c.key for c in self.ordered_columns].index(column)
            self._shown = [(k, cells[:index] + (value,) + cells[index + 1:] if k == key else cells)
                           for k, cells in self._shown]

    def _update_dimensions(self, new_rows: Iterable[RowKey]) -> None:
        # Runs on idle once the new rows' column widths are known (textual 8.2): drop what was rendered
        # before with the old widths. Overrides a private method; textual is pinned (<9, lock file).
        super()._update_dimensions(new_rows)
        self._clear_caches()
        self.refresh()

    def notify_style_update(self) -> None:
        # Textual's documented hook for dropping cached data when the CSS is re-applied. Component styles
        # (cursor, header, rows) are applied after this call, so the comparison waits for the next render.
        Widget.notify_style_update(self)
        self._styles_check = True
        self.refresh()

    def render_lines(self, crop: Region) -> list[Strip]:
        if self._styles_check:
            self._styles_check = False
            drawn = self._render_styles()
            if drawn != self._styles_drawn:
                self._styles_drawn = drawn
                self._clear_caches()
        return super().render_lines(crop)

    def _render_styles(self) -> tuple[Any, ...]:
        return (self.rich_style, self.background_colors,
                *(self.get_component_rich_style(name, partial=partial)
                  for name in sorted(self.COMPONENT_CLASSES) for partial in (False, True)))
