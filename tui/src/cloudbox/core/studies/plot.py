"""The drawing the SVG figures share: a figure's opening, its plot area (axis, labels, caption, a note in place of
the data), linear scales from data to the drawing, marks (lines, dots) and the colours."""

from __future__ import annotations

from html import escape

from ..inputs import printable

PAPER_FILL, OURS_FILL = "#9e9e9e", "#1f5fa8"
LINE_STROKE = "#b03a2e"


def svg_open(title: str, width: int, height: int) -> list[str]:
    return [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" font-family="sans-serif" font-size="10">',
            f"<title>{escape(printable(title))}</title>"]
