"""Live line charts (textual-plotext): series keep the last N points; each series has its own marker,
so they stay apart in a 16-colour terminal or without colour at all."""

from __future__ import annotations

from collections import deque

from textual.app import RenderResult
from textual_plotext import PlotextPlot

MARKERS = ("braille", "dot", "+", "x")


class LiveChart(PlotextPlot):
    DEFAULT_CSS = """
    LiveChart { height: 1fr; min-height: 8; }
    """

    def __init__(self, title: str, series: list[str], ylabel: str = "", keep: int = 240, **kw):
        super().__init__(**kw)
        self.chart_title = title
        self.names = list(series)
        self.ylabel = ylabel
        self.data: dict[str, deque[tuple[float, float]]] = {n: deque(maxlen=keep) for n in series}
        self.t0: float | None = None
        self.stale = False  # points were added since the last redraw
        self._drawn: tuple[tuple[object, ...], RenderResult] | None = None  # (size and theme, the plot)

    def on_mount(self) -> None:
        self.redraw()

    def clear(self) -> None:
        for d in self.data.values():
            d.clear()
        self.t0 = None
        self.redraw()

    def add_series(self, name: str) -> None:
        """One more line, once (a run of N guests: each guest's and their sum)."""
        if name not in self.data:
            self.names.append(name)
            self.data[name] = deque(maxlen=next(iter(self.data.values())).maxlen if self.data else 240)

    def add(self, name: str, t: float, value: float | None) -> None:
        if value is None or name not in self.data:
            return
        if self.t0 is None:
            self.t0 = t
        self.data[name].append((t - self.t0, float(value)))
        self.stale = True

    def redraw(self) -> None:
        self.stale = False
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title(self.chart_title)
        plt.xlabel("seconds")
        if self.ylabel:
            plt.ylabel(self.ylabel)
        drawn = False
        top = 0.0
        for i, name in enumerate(self.names):
            pts = self.data[name]
            if pts:
                plt.plot([p[0] for p in pts], [p[1] for p in pts], label=name, marker=MARKERS[i % len(MARKERS)])
                drawn = True
                top = max(top, *(p[1] for p in pts))
        if drawn and top > 0 and min(p[1] for pts in self.data.values() for p in pts) >= 0:
            # From 0 (so series compare by height), with room above for the legend, which plotext draws in
            # the top left corner: the bare-metal baseline runs first and is the highest, exactly there.
            plt.ylim(0, top * 1.35)
        if not drawn:
            plt.text("waiting for data", 0, 0)
            plt.xlim(-1, 1)
            plt.ylim(-1, 1)
        self._drawn = None
        self.refresh()

    def render(self) -> RenderResult:
        # plotext builds the whole plot on each call; a screen shown again repaints charts whose data and
        # size are unchanged.
        key = (self.size, self.app.theme, self.theme)
        if self._drawn is None or self._drawn[0] != key:
            self._drawn = (key, super().render())
        return self._drawn[1]
