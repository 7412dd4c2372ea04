"""The DataTable every screen uses: cells given as str are plain text, and the header stays aligned.

Textual's DataTable parses str cells as Rich markup, so a disk model, a guest name or an error message
containing "[...]" would be restyled, lose text, or raise MarkupError while rendering (a crash).

It also measures auto-width columns on idle, after add_row; a frame drawn in between caches the header
(and cells) rendered at the old widths under cache keys that do not include the width, so the header
could stay misaligned with the rows until the next change (seen in snapshot tests, timing-dependent).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rich.text import Text
from textual.widgets import DataTable
from textual.widgets.data_table import CellType, ColumnKey, RowKey


def plain(value: Any) -> Any:
    return Text(value, end="") if isinstance(value, str) else value


class PlainTable(DataTable[Any]):
    def add_row(self, *cells: CellType, height: int | None = 1, key: str | None = None,
                label: Any = None) -> RowKey:
        return super().add_row(*(plain(c) for c in cells), height=height, key=key, label=label)

    def update_cell(self, row_key: RowKey | str, column_key: ColumnKey | str, value: CellType, *,
                    update_width: bool = False) -> None:
        super().update_cell(row_key, column_key, plain(value), update_width=update_width)

    def _update_dimensions(self, new_rows: Iterable[RowKey]) -> None:
        # Runs on idle once the new rows' column widths are known (textual 8.2): drop what was rendered
        # before with the old widths. Overrides a private method; textual is pinned (<9, lock file).
        super()._update_dimensions(new_rows)
        self._clear_caches()
        self.refresh()
