"""A study report's figures as inline SVG: per table the paper's % of native beside ours, the host disk over a test,
a series' histogram, density and timeline, the sweep's samples and line, IOzone's sweeps against file size."""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

from ..bench import iozone, propagation
from ..bench.propagation import Fit
from ..inputs import printable
from ..record import stats
from ..record.rows import Sample as HostSample
from ..spec import catalogue
from .cells import Cell, figures
from .evidence import Evidence
from .imagesweep import SweepEvidence, sweep_fit
from .plot import AXIS, LINE_STROKE, OURS_FILL, PAPER_FILL, Frame, Scale, dot, line, points, polyline, svg_open, y_title
from .series import Sample, bins, density
from .wording import host_qualifiers, qualified, sample_qualifiers, secs_text, sweep_qualifiers, value_text

FIG_WIDTH, FIG_LABEL, FIG_BAR, FIG_GAP = 760, 230, 13, 9
SERIES_W, SERIES_H, SERIES_PAD = 370, 200, 40
SWEEP_W, SWEEP_H, SWEEP_PAD = 620, 330, 56
IOZ_W, IOZ_H, IOZ_PAD, IOZ_LEGEND = 470, 260, 48, 112


def bars(ev: Evidence, test: str) -> list[tuple[str, float | None, stats.Ratio | None, str]]:
    """The figure's rows for one test: (profile, the paper's % of native, ours with its interval, our qualifiers),
    one per profile that has either number."""
    study = ev.study
    out = []
    for profile in study.profile_names:
        paper, _ = study.paper_percent(profile, test)
        cell = ev.cells.get((profile, test))
        ours = None if cell is None else cell.ratio()
        quals = "" if ours is None or cell is None else ", ".join(cell.qualifiers)
        if paper is not None or ours is not None:
            out.append((profile, paper, ours, quals))
    return out


def _ours_label(r: stats.Ratio, quals: str) -> str:
    """Our bar's words: its percentage, its interval where it has one, n, its qualifiers."""
    interval = f" [{r.low:.1f}, {r.high:.1f}]" if r.low is not None and r.high is not None else ""
    return f"{r.percent:.1f} %{interval} n={r.n_a}+{r.n_b}" + (f" ({quals})" if quals else "")


def _error_bar(x: Scale, r: stats.Ratio, y: float) -> str:
    """Our bar's interval as a whisker across its end: a line from the low to the high end with a tick at each."""
    assert r.low is not None and r.high is not None
    lo, hi = x(r.low), x(r.high)
    cover = f"{r.coverage:.0%}" if r.coverage is not None else ""
    title = escape(f"{cover} interval {r.low:.1f} to {r.high:.1f} %")
    return (f'<g stroke="{LINE_STROKE}" stroke-width="1.5"><title>{title}</title>'
            f'<line x1="{lo:.1f}" y1="{y:.1f}" x2="{hi:.1f}" y2="{y:.1f}"/>'
            f'<line x1="{lo:.1f}" y1="{y - 4:.1f}" x2="{lo:.1f}" y2="{y + 4:.1f}"/>'
            f'<line x1="{hi:.1f}" y1="{y - 4:.1f}" x2="{hi:.1f}" y2="{y + 4:.1f}"/></g>')


def figure(ev: Evidence, test: str) -> str:
    """An inline SVG bar chart of one test: per profile, the paper's % of native (grey) above ours (blue), the
    bare-metal 100 % as a dashed line; our bars carry their qualifiers (emulated, nested, quick, ...) in words.
    Empty when neither side has a number."""
    rows = bars(ev, test)
    if not rows:
        return ""
    ends = [v for _, p, o, _ in rows for v in (p, *((o.percent, o.high) if o else ())) if v is not None]
    top = max([100.0] + ends) * 1.15
    row_h = 2 * FIG_BAR + FIG_GAP
    height = 30 + row_h * len(rows) + 20
    x = Scale(0.0, top, FIG_LABEL, FIG_WIDTH - FIG_LABEL - 10)
    title = next(t.table for t in ev.study.tests if t.id == test)
    with_paper = any(p is not None for _, p, _, _ in rows)  # a paper that gives no % of native here has no bars
    legend = [f'<rect x="{FIG_LABEL}" y="6" width="10" height="10" fill="{PAPER_FILL}"/>'
              f'<text x="{FIG_LABEL + 14}" y="15">paper</text>'] if with_paper else []
    at = FIG_LABEL + (70 if with_paper else 0)
    parts = [*svg_open(f"{title}: % of native, " + ("paper and ours" if with_paper else "ours (the paper gives no "
                                                     "% of native here)"), FIG_WIDTH, height, font_size=11),
             *legend,
             f'<rect x="{at}" y="6" width="10" height="10" fill="{OURS_FILL}"/>'
             f'<text x="{at + 14}" y="15">ours (this lab)</text>']
    y = 30
    for profile, paper, ours, quals in rows:
        parts.append(f'<text x="{FIG_LABEL - 6}" y="{y + FIG_BAR + 4}" text-anchor="end">'
                     f"<title>{escape(printable(ev.study.row(profile)))}</title>{escape(printable(profile))}</text>")
        mine = (None, OURS_FILL, None) if ours is None else (ours.percent, OURS_FILL, _ours_label(ours, quals))
        for i, (value, fill, text) in enumerate(((paper, PAPER_FILL, None if paper is None else f"{paper:.1f} %"),
                                                 mine)):
            by = y + i * FIG_BAR
            if i == 0 and not with_paper:
                continue
            if value is None or text is None:
                parts.append(f'<text x="{FIG_LABEL + 4}" y="{by + FIG_BAR - 3}" fill="#777">no number</text>')
                continue
            end = x(value)
            parts.append(f'<rect x="{FIG_LABEL}" y="{by}" width="{end - FIG_LABEL:.1f}" height="{FIG_BAR - 2}" '
                         f'fill="{fill}"/>')
            if i == 1 and ours is not None and ours.has_interval:
                parts.append(_error_bar(x, ours, by + (FIG_BAR - 2) / 2))
                assert ours.high is not None
                end = max(end, x(ours.high))
            parts.append(f'<text x="{end + 4:.1f}" y="{by + FIG_BAR - 3}">{escape(printable(text))}</text>')
        y += row_h
    parts.append(f'<line x1="{x(100):.1f}" y1="24" x2="{x(100):.1f}" y2="{y}" {AXIS} '
                 f'stroke-dasharray="4 3"/><text x="{x(100):.1f}" y="{y + 14}" text-anchor="middle">'
                 "100 % = bare metal</text></svg>")
    return "\n".join(parts)


# The host disk's metrics plotted over a test: sample field, axis title.
HOST_PLOTS = {"avgrq_sectors": "request size (512-byte sectors)", "avgqu": "queue depth (requests)"}


def host_svg(profile: str, test: str, sides: dict[str, list[HostSample]], key: str) -> str:
    """An inline SVG line chart of one host disk metric over a test, seconds from the side's first sample: the
    guest's side (blue) and the bare-metal side (grey)."""
    lines = []
    for side, colour in (("guest", OURS_FILL), ("baseline", PAPER_FILL)):
        samples = sides.get(side) or []
        pts = [(x.t - samples[0].t, v) for x in samples if (v := getattr(x, key)) is not None]
        if pts:
            lines.append((side, colour, pts))
    top = max([v for _, _, pts in lines for _, v in pts] + [1.0]) * 1.1
    top = float(f"{top:.0f}") if top >= 10 else float(f"{top:.2g}")  # the axis says the scale it uses
    right = max([t for _, _, pts in lines for t, _ in pts] + [1.0])
    frame = Frame.padded(SERIES_W, SERIES_H, SERIES_PAD)
    x, y = frame.x_scale(0.0, right), frame.y_scale(0.0, top)
    what = HOST_PLOTS[key]
    parts = frame.open(f"{profile} {test}: host disk {what} over the test")
    parts.append(frame.heading(f"{escape(printable(f'{profile} {test}'))}: {escape(what)}") + frame.x_axis()
                 + frame.y_ends(f"{top:g}"))
    for side, colour, pts in lines:
        parts.append(polyline(points((x(t), y(v)) for t, v in pts), colour, side))
    if not lines:
        parts.append(frame.note("no samples"))
    parts.append(frame.caption(f"seconds into the test (up to {right:.0f} s)") + "</svg>")
    return "\n".join(parts)


def histogram_svg(profile: str, test: str, samples: Sequence[Sample]) -> str:
    """An inline SVG histogram of a series' guest numbers (bars over equal-width bins, counts on top)."""
    metric = samples[0].metric
    hist = bins([x.value for x in samples])
    top = max(n for _, _, n in hist)
    frame = Frame.padded(SERIES_W, SERIES_H, SERIES_PAD)
    bw = frame.plot_w / len(hist)
    quals = sample_qualifiers(samples)
    repeats = len({x.run_id for x in samples})
    what = f"{len(samples)} samples ({repeats} repeats x {len(samples) // repeats} guests)" \
        if len(samples) > repeats else f"{repeats} repeats"
    parts = frame.open(f"{profile} {test}: histogram of {what} ({metric})")
    parts.append(frame.heading(escape(printable(f"{profile} {test}"))
                               + (f" ({escape(', '.join(quals))})" if quals else "")))
    for i, (a, _b, n) in enumerate(hist):
        h = frame.plot_h * n / top
        x = frame.left + i * bw
        parts.append(f'<rect x="{x:.1f}" y="{frame.bottom - h:.1f}" width="{bw - 2:.1f}" height="{h:.1f}" '
                     f'fill="{OURS_FILL}"/><text x="{x + bw / 2:.1f}" y="{frame.bottom - h - 3:.1f}" '
                     f'text-anchor="middle">{n}</text>')
        if i == 0 or i == len(hist) - 1 or len(hist) <= 6:
            parts.append(f'<text x="{x:.1f}" y="{frame.bottom + 14}">{escape(value_text(a, metric))}</text>')
    parts.append(frame.caption(f"{escape(printable(metric))} (guest)") + "</svg>")
    return "\n".join(parts)


def density_svg(profile: str, test: str, samples: Sequence[Sample]) -> str:
    """An inline SVG of a series' density: the kernel estimate's curve (filled), a tick per sample under it and a
    dashed line at each peak; a note in place of the curve under three samples or when they are all equal."""
    metric = samples[0].metric
    values = [x.value for x in samples]
    d = density(values)
    frame = Frame.padded(SERIES_W, SERIES_H, SERIES_PAD)
    quals = sample_qualifiers(samples)
    parts = frame.open(f"{profile} {test}: density of {len(values)} samples ({metric})")
    parts.append(frame.heading(f"{escape(printable(f'{profile} {test}'))}: density"
                               + (f" ({escape(', '.join(quals))})" if quals else "")) + frame.x_axis())
    if d is None:
        parts.append(frame.note("too few distinct samples for a density") + "</svg>")
        return "\n".join(parts)
    lo, hi = d.curve[0][0], d.curve[-1][0]
    x, y = frame.x_scale(lo, hi), frame.y_scale(0.0, max(dv for _, dv in d.curve) * 1.1)
    base = y(0.0)
    parts.append(f'<polygon fill="{OURS_FILL}" fill-opacity="0.35" stroke="{OURS_FILL}" stroke-width="1.5" '
                 f'points="{x(lo):.1f},{base:.1f} {points((x(v), y(dv)) for v, dv in d.curve)} {x(hi):.1f},'
                 f'{base:.1f}"><title>density, bandwidth {escape(value_text(d.bandwidth, metric))} '
                 f"{escape(printable(metric))}</title></polygon>")
    for v in values:
        parts.append(line(x(v), base, x(v), base + 6, AXIS))
    for p in d.peaks:
        parts.append(line(x(p), frame.top, x(p), base, f'stroke="{LINE_STROKE}" stroke-dasharray="3,2"',
                          f"peak at {escape(value_text(p, metric))} {escape(printable(metric))}"))
    for v in (lo, hi):
        parts.append(f'<text x="{x(v):.1f}" y="{base + 18:.1f}" text-anchor="{"start" if v == lo else "end"}">'
                     f"{escape(value_text(v, metric))}</text>")
    parts.append(frame.caption(f"{escape(printable(metric))} (guest)") + "</svg>")
    return "\n".join(parts)


def timeline_svg(profile: str, test: str, samples: Sequence[Sample]) -> str:
    """An inline SVG of a series over time: the guest's number per repeat (blue dots) and the bare-metal one (grey)."""
    metric = samples[0].metric
    values = [x.value for x in samples] + [x.baseline for x in samples if x.baseline is not None]
    top = max(values) * 1.1 or 1.0
    t0, t1 = min(x.started_at for x in samples), max(x.started_at for x in samples)
    frame = Frame.padded(SERIES_W, SERIES_H, SERIES_PAD)
    x, y = frame.x_scale(t0, t1), frame.y_scale(0.0, top)
    parts = frame.open(f"{profile} {test}: {len({s.run_id for s in samples})} repeats over time ({metric})")
    parts.append(frame.x_axis() + frame.y_ends(escape(value_text(top, metric))))
    for s in samples:
        if s.baseline is not None:
            parts.append(dot(x(s.started_at), y(s.baseline), "3", f'fill="{PAPER_FILL}"'))
        who = f", guest {s.instance}" if s.instance is not None else ""
        parts.append(dot(x(s.started_at), y(s.value), "3.5", f'fill="{OURS_FILL}"',
                         f"run #{s.run_id}{who}: {escape(value_text(s.value, metric))} {escape(printable(metric))}"))
    minutes = (t1 - t0) / 60.0
    parts.append(frame.caption(f"time: {minutes:.1f} min from the first repeat to the last") + "</svg>")
    return "\n".join(parts)


def sweep_svg(sweep: SweepEvidence) -> str:
    """An inline SVG of the sweep: each sample's total seconds against its image's size in GB (blue dots, a title
    each) and the fitted line (red) across the sizes; the qualifiers (emulated, nested, quick, ...) in its heading."""
    samples = sweep.samples
    fit = sweep_fit(sweep)
    fitted = fit if isinstance(fit, Fit) else None
    right = max(x.size_gb for x in samples) * 1.08
    ys = [x.total_s for x in samples] + ([fitted.at(0.0), fitted.at(right)] if fitted else [])
    top = max(max(ys) * 1.1, 1e-3)
    bottom = min(0.0, min(ys) * 1.1)
    frame = Frame.padded(SWEEP_W, SWEEP_H, SWEEP_PAD)
    x, y = frame.x_scale(0.0, right), frame.y_scale(bottom, top)
    quals = sweep_qualifiers(samples)
    heading = f"{sweep.profile}: total seconds against image size" + (f" ({', '.join(quals)})" if quals else "")
    x0, x1, y0, ytop = x(0.0), x(right), y(bottom), y(top)
    parts = [*svg_open(heading, SWEEP_W, SWEEP_H, font_size=11), frame.heading(escape(printable(heading)), y=18),
             line(x0, y0, x1, y0, AXIS), line(x0, y0, x0, ytop, AXIS)]
    for frac in (0.0, 0.5, 1.0):
        gb = right / 1.08 * frac
        parts.append(f'<text x="{x(gb):.1f}" y="{y0 + 14:.1f}" text-anchor="middle">{gb:.3g}</text>')
        sec = bottom + (top - bottom) * frac
        parts.append(f'<text x="{x0 - 4:.1f}" y="{y(sec) + 4:.1f}" text-anchor="end">{sec:.3g}</text>')
    if bottom < 0:
        parts.append(line(x0, y(0.0), x1, y(0.0), 'stroke="#bbb" stroke-dasharray="3 3"'))
    if fitted is not None:
        words = f"fit: {secs_text(fitted.intercept_s)} s + {fitted.slope_s_per_gb:.3g} s/GB x size"
        parts.append(line(x0, y(fitted.at(0.0)), x1, y(fitted.at(right)),
                          f'stroke="{LINE_STROKE}" stroke-width="1.5"', escape(words)))
        parts.append(f'<text x="{SWEEP_W - SWEEP_PAD}" y="34" text-anchor="end" fill="{LINE_STROKE}">'
                     f"{escape(words)}</text>")
    else:
        parts.append(f'<text x="{SWEEP_W - SWEEP_PAD}" y="34" text-anchor="end" fill="#777">no line: '
                     f"{escape(printable(str(fit)))}</text>")
    weak = [x for x in samples if {"emulated", "nested"} & set(x.qualifiers)]
    if weak:
        parts.append(f'<text x="{SWEEP_PAD}" y="34" fill="#555">hollow dots: emulated or nested samples</text>')
    for s in samples:
        note = f" ({', '.join(s.qualifiers)})" if s.qualifiers else ""
        paint = (f'fill="none" stroke="{OURS_FILL}" stroke-width="1.5"' if s in weak
                 else f'fill="{OURS_FILL}" fill-opacity="0.75"')
        parts.append(dot(x(s.size_gb), y(s.total_s), "3.5", paint,
                         f"run #{s.run_id}: {escape(propagation.size_text(s.size_bytes))}, total "
                         f"{secs_text(s.total_s)} s (copy {secs_text(s.copy_s)} s, boot {secs_text(s.boot_s)} s)"
                         f"{escape(note)}"))
    parts.append(f'<text x="{(x0 + x1) / 2:.0f}" y="{SWEEP_H - 12}" text-anchor="middle">image size (GB)</text>'
                 + y_title(14, (y0 + ytop) / 2, "seconds to the guest's agent") + "</svg>")
    return "\n".join(parts)


PASS_COLOURS = {"write": "#1f5fa8", "re-write": "#79a6dc", "read": "#b03a2e", "re-read": "#e3968a"}
Line = tuple[str, str, list[tuple[int, float]]]  # label, colour, (file KiB, MB/s) by file size
# viridis from dark purple to green (its yellow end is unreadable on white): small records dark, large ones light
RAMP = ((0x44, 0x01, 0x54), (0x3b, 0x52, 0x8b), (0x21, 0x91, 0x8c), (0x5e, 0xc9, 0x62))


def _ramp(i: int, n: int) -> str:
    """The i-th of n colours along RAMP, evenly spaced."""
    f = i / max(1, n - 1) * (len(RAMP) - 1)
    k = min(int(f), len(RAMP) - 2)
    a, b = RAMP[k], RAMP[k + 1]
    return "#" + "".join(f"{round(x + (y - x) * (f - k)):02x}" for x, y in zip(a, b, strict=True))


def iozone_lines(test: str, figs: dict[str, float]) -> list[Line]:
    """One side's lines of an IOzone sweep's plot: a file sweep's four passes, or the grid's write pass per record
    size, each as MB/s by file size (the points the side stored)."""
    cells = iozone.iozone_sweep_cells(figs)

    def points(passname: str, record: int | None) -> list[tuple[int, float]]:
        return [(kib, figs[m]) for kib, rec in cells if rec == record
                and (m := iozone.iozone_file_metric(passname, kib, rec)) in figs]

    if test in catalogue.IOZONE_GRIDS:
        records = sorted({rec for _, rec in cells if rec})
        return [(f"{iozone.kib_text(rec)} records", _ramp(i, len(records)), points("write", rec))
                for i, rec in enumerate(records)]
    return [(p, PASS_COLOURS[p], pts) for p in iozone.IOZONE_FILE_PASSES if (pts := points(p, None))]


def iozone_svg(heading: str, lines: Sequence[Line]) -> str:
    """An inline SVG line chart of MB/s against file size, the file sizes on a log2 axis (IOzone doubles them): a
    polyline per line with its label as title and a dot per point, the legend on the right."""
    files = sorted({kib for _, _, pts in lines for kib, _ in pts})
    top = max([v for _, _, pts in lines for _, v in pts] + [1.0]) * 1.1
    top = float(f"{top:.2g}")  # the axis says the scale it uses
    frame = Frame(IOZ_W, IOZ_H, IOZ_PAD, IOZ_PAD, IOZ_W - IOZ_PAD - IOZ_LEGEND - 10, IOZ_H - 2 * IOZ_PAD)
    log_x = frame.x_scale(*((math.log2(files[0]), math.log2(files[-1])) if files else (0.0, 0.0)))
    y = frame.y_scale(0.0, top)

    def x(kib: int) -> float:
        return log_x(math.log2(kib))

    y0 = frame.bottom
    parts = [*frame.open(f"{heading}: MB/s by file size"), frame.heading(escape(printable(heading))), frame.x_axis(),
             frame.y_axis()]
    for frac in (0.0, 0.5, 1.0):
        parts.append(f'<text x="{IOZ_PAD - 4}" y="{y0 - frame.plot_h * frac + 4:.1f}" text-anchor="end">'
                     f"{top * frac:g}</text>")
    step = max(1, math.ceil(len(files) / 6))  # at most six labels under the axis
    for kib in files[::step]:
        parts.append(f'<text x="{x(kib):.1f}" y="{y0 + 14}" text-anchor="middle">{iozone.kib_text(kib)}</text>')
    for i, (label, colour, pts) in enumerate(lines):
        parts.append(polyline(points((x(k), y(v)) for k, v in pts), colour, escape(label)))
        for k, v in pts:
            parts.append(dot(x(k), y(v), "2", f'fill="{colour}"',
                             f"{escape(label)}, {iozone.kib_text(k)} file: {value_text(v, 'MB/s')} MB/s"))
        ly = IOZ_PAD + 14 * i
        parts.append(f'<line x1="{IOZ_W - IOZ_LEGEND}" y1="{ly - 3}" x2="{IOZ_W - IOZ_LEGEND + 14}" y2="{ly - 3}" '
                     f'stroke="{colour}" stroke-width="2"/><text x="{IOZ_W - IOZ_LEGEND + 18}" y="{ly}">'
                     f"{escape(label)}</text>")
    if not lines:
        parts.append(frame.note("nothing stored"))
    parts.append(frame.caption("file size (log2 scale)", above=10) + y_title(12, frame.top + frame.plot_h / 2, "MB/s")
                 + "</svg>")
    return "\n".join(parts)


def iozone_figure(ev: Evidence, cell: Cell) -> str:
    """An IOzone sweep's cell as two plots, bare metal's and the guest's (each on its own scale), their qualifiers in
    their headings as the tables write them, and a caption."""
    base_q = host_qualifiers([cell.baseline.labels] if cell.baseline else [], cell.qualifiers)
    what = ("the write pass, a line per record size" if cell.test in catalogue.IOZONE_GRIDS
            else "a line per pass")
    base = dict(cell.baseline_figures)
    svgs = [iozone_svg(qualified(f"{cell.profile}, bare metal", base_q), iozone_lines(cell.test, base)),
            iozone_svg(qualified(f"{cell.profile}, guest", cell.qualifiers),
                       iozone_lines(cell.test, figures(cell.guest)))]
    return (f"<figure>{''.join(svgs)}<figcaption>{escape(printable(cell.profile))}, {escape(cell.test)} (run "
            f"#{cell.run_id}): IOzone's MB/s against file size, {what}; bare metal (left) and the guest (right) each "
            "on its own scale.</figcaption></figure>")
