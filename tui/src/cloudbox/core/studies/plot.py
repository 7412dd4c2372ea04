"""The drawing the SVG figures share: a figure's opening, its plot area (axes, end labels, caption, a note in place of
the data), linear scales from data to the drawing, marks (lines, dots) and the colours."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from html import escape

from ..inputs import printable

PAPER_FILL, OURS_FILL = "#9e9e9e", "#1f5fa8"
LINE_STROKE = "#b03a2e"
AXIS = 'stroke="#333"'


def svg_open(title: str, width: int, height: int, font_size: int = 10) -> list[str]:
    """A figure's opening tag and its title (what a screen reader says)."""
    return [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" font-family="sans-serif" font-size="{font_size}">',
            f"<title>{escape(printable(title))}</title>"]


@dataclass(frozen=True)
class Scale:
    """A linear map from data values [lo, hi] onto the drawing's [start, start + length]; `flip` puts lo at the far
    end (a y axis: the drawing's y grows downwards); every value at the middle when hi is not above lo."""

    lo: float
    hi: float
    start: float
    length: float
    flip: bool = False

    def __call__(self, v: float) -> float:
        if not self.hi > self.lo:
            return self.start + self.length / 2
        off = self.length * (v - self.lo) / (self.hi - self.lo)
        return self.start + self.length - off if self.flip else self.start + off


@dataclass(frozen=True)
class Frame:
    """A figure of `width` x `height` and its plot area, `plot_w` x `plot_h` from (`left`, `top`); the x axis runs
    along the plot's bottom."""

    width: int
    height: int
    left: int
    top: int
    plot_w: int
    plot_h: int

    @classmethod
    def padded(cls, width: int, height: int, pad: int) -> Frame:
        """The plot area `pad` inside each edge."""
        return cls(width, height, pad, pad, width - 2 * pad, height - 2 * pad)

    @property
    def bottom(self) -> int:
        return self.top + self.plot_h

    def x_scale(self, lo: float, hi: float) -> Scale:
        """Data from lo to hi across the plot, left to right."""
        return Scale(lo, hi, self.left, self.plot_w)

    def y_scale(self, lo: float, hi: float) -> Scale:
        """Data from lo to hi up the plot, bottom to top."""
        return Scale(lo, hi, self.top, self.plot_h, flip=True)

    def open(self, title: str) -> list[str]:
        return svg_open(title, self.width, self.height)

    def heading(self, markup: str, y: int = 16) -> str:
        """The heading above the plot (`markup` already escaped)."""
        return f'<text x="{self.left}" y="{y}">{markup}</text>'

    def x_axis(self) -> str:
        return f'<line x1="{self.left}" y1="{self.bottom}" x2="{self.left + self.plot_w}" y2="{self.bottom}" {AXIS}/>'

    def y_axis(self) -> str:
        return f'<line x1="{self.left}" y1="{self.top}" x2="{self.left}" y2="{self.bottom}" {AXIS}/>'

    def y_ends(self, top_text: str) -> str:
        """The y axis's labels at its top (`top_text`) and at 0."""
        return (f'<text x="{self.left - 4}" y="{self.top + 4}" text-anchor="end">{top_text}</text>'
                f'<text x="{self.left - 4}" y="{self.bottom}" text-anchor="end">0</text>')

    def note(self, text: str) -> str:
        """Grey words in the middle of the plot, in place of data it does not have."""
        return (f'<text x="{self.left + self.plot_w / 2:.0f}" y="{self.top + self.plot_h / 2:.0f}" '
                f'text-anchor="middle" fill="#777">{text}</text>')

    def caption(self, markup: str, above: int = 6) -> str:
        """What the x axis measures, centred under the plot `above` the figure's bottom edge."""
        return (f'<text x="{self.left + self.plot_w / 2:.0f}" y="{self.height - above}" text-anchor="middle">'
                f"{markup}</text>")


def y_title(x: int, y: float, markup: str) -> str:
    """What the y axis measures, turned to run up the axis, centred at height `y`."""
    return f'<text x="{x}" y="{y:.0f}" text-anchor="middle" transform="rotate(-90 {x} {y:.0f})">{markup}</text>'


def points(xys: Iterable[tuple[float, float]]) -> str:
    """(x, y) pairs of the drawing as a polyline's or polygon's points."""
    return " ".join(f"{x:.1f},{y:.1f}" for x, y in xys)


def polyline(where: str, colour: str, title: str) -> str:
    """A data line through `where` (points()), `title` (markup) naming it."""
    return (f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{where}">'
            f"<title>{title}</title></polyline>")


def line(x1: float, y1: float, x2: float, y2: float, paint: str, title: str = "") -> str:
    """A line between two points of the drawing; `title` (markup) for a pointer's hover."""
    tag = f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" {paint}'
    return f"{tag}><title>{title}</title></line>" if title else f"{tag}/>"


def dot(x: float, y: float, r: str, paint: str, title: str = "") -> str:
    """A dot of radius `r` at a point of the drawing; `title` (markup) for a pointer's hover."""
    tag = f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r}" {paint}'
    return f"{tag}><title>{title}</title></circle>" if title else f"{tag}/>"
