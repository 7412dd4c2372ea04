"""The comparison tables rendered: to_text (fixed width, wraps text columns, and a repeated figure's interval, to fit
80 columns), to_markdown, to_csv (one rectangular table, raw numbers, each figure's samples, a random test's latency
percentiles); and to_json, whole runs with their provenance, every sample and each figure's summary, a random test's
latency with the percentiles of its merged histograms (the export)."""

from __future__ import annotations

import csv
import io
import json
import re
import textwrap
import time
from collections.abc import Sequence
from typing import Any

from ..record.latency import METRIC as LATENCY_METRIC
from ..record.rows import Run
from .compare import Column, Row, Section, Table, qd1, run_summary
from .labels import figure_text, ratio_text, value_format

JSON_FORMAT = "cloudbox-results"
JSON_VERSION = 1


def _fmt(key: str, value: Any, metric: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    v = float(value)
    if key == "pct":
        return f"{v:.1f}%"
    if key == "util":
        return f"{v:.0f}%"
    if key == "avgrq":
        return f"{v:.0f}" if v >= 10 else f"{v:.1f}"
    if key == "avgqu":
        return f"{v:.2f}" if v < 10 else (f"{v:.1f}" if v < 100 else f"{v:.0f}")
    if key == "jain":
        return f"{v:.3f}"
    if key in ("skew", "guests"):
        return f"{v:.0f}"
    if key in ("value", "min", "median", "max", "base"):
        return value_format(metric).format(v)
    return f"{v:g}"


def _cell(section: Section, row: Row, key: str) -> str:
    """A cell as shown: a repeated figure with its interval and n, a ratio over repeats with its own."""
    if key == "value" and row.summary is not None and row.summary.n > 1:
        return figure_text(row.summary, value_format(section.metric))
    if key == "pct" and row.ratio is not None:
        return ratio_text(row.ratio)
    return _fmt(key, row.cells.get(key), section.metric)


def _display(section: Section, row: Row) -> list[str]:
    out = []
    for c in section.columns:
        text = _cell(section, row, c.key)
        if c.key == "vmm" and row.marker:
            text = f"{text} {row.marker}"
        out.append(text)
    return out


def _fit(widths: list[int], minimums: list[int], wrappable: list[bool], budget: int) -> list[int]:
    widths = list(widths)
    while sum(widths) > budget:
        candidates = [i for i, w in enumerate(widths) if wrappable[i] and w > minimums[i]]
        if not candidates:
            break
        i = max(candidates, key=lambda j: widths[j])
        widths[i] -= 1
    return widths


NBSP = "\xa0"  # holds an interval's "[low, high]" on one line while the rest of its cell wraps


def _wrap(text: str, width: int) -> list[str]:
    return [line.replace(NBSP, " ") for line in
            textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False) or [""]]


def _glued(text: str) -> str:
    """An interval's brackets kept whole: "74.2 [71.0, 76.9] n=8" breaks only before "[" and "n="."""
    return re.sub(r"\[[^\]]*\]", lambda m: m.group(0).replace(" ", NBSP), text)


def _text_row(
    cells: list[str], columns: list[Column], widths: list[int], wrappable: list[bool], gap: str
) -> list[str]:
    wrapped = [_wrap(cells[i], widths[i]) if wrappable[i] else [cells[i].replace(NBSP, " ")]
               for i in range(len(cells))]
    out = []
    for k in range(max(len(w) for w in wrapped)):
        parts = []
        for i, c in enumerate(columns):
            s = wrapped[i][k] if k < len(wrapped[i]) else ""
            parts.append(s.rjust(widths[i]) if c.numeric else s.ljust(widths[i]))
        out.append(gap.join(parts).rstrip())
    return out


def _minimums(header: list[str], body: list[list[str]], columns: list[Column], wrappable: list[bool],
              natural: list[int]) -> list[int]:
    """Each column's narrowest: a wrapping column its longest word (a glued interval is one), and a figure's column
    its header on one line; any other its natural width."""
    return [max([len(w) for x in [header[i], *(b[i] for b in body)] for w in x.split(" ") if w] or [1]
                + ([len(header[i])] if columns[i].numeric else []))
            if wrappable[i] else natural[i] for i in range(len(header))]


def to_text(table: Table, width: int = 80) -> str:
    """Fixed-width text; the VMM/target/driver columns, and a repeated figure's interval and n, wrap onto extra lines
    to keep within `width`."""
    lines = [table.title, "=" * min(len(table.title), width)]
    for entry in table.legend:
        lines.extend(textwrap.wrap(entry, width, subsequent_indent="    ", break_on_hyphens=False) or [entry])
    if not table.sections:
        lines.append("(no measurements)")
    gap = "  "
    for section in table.sections:
        header = [c.short for c in section.columns]
        shown = [_display(section, r) for r in section.rows]
        body = [[_glued(x) for x in b] for b in shown]
        ncol = len(header)
        natural = [max(len(x) for x in [header[i], *(b[i] for b in body)]) for i in range(ncol)]
        # text columns wrap; a figure's column only where a repeated figure has an interval and n beside it
        wrappable = [c.key in ("vmm", "target", "driver") or (c.numeric and any(" " in b[i] for b in body))
                     for i, c in enumerate(section.columns)]
        budget = width - len(gap) * (ncol - 1)
        minimums = _minimums(header, body, section.columns, wrappable, natural)
        if sum(minimums) > budget:  # too narrow to keep each interval on one line: it may break after its comma
            body = shown
            minimums = _minimums(header, body, section.columns, wrappable, natural)
        widths = _fit(natural, minimums, wrappable, budget)
        # a wrapped column only needs its longest wrapped line; spend what that frees on unwrapping others
        for i in range(ncol):
            if wrappable[i] and widths[i] < natural[i]:
                widths[i] = max(
                    len(line) for x in [header[i], *(b[i] for b in body)] for line in _wrap(x, widths[i])
                )
        for i in sorted(range(ncol), key=lambda j: natural[j] - widths[j]):
            slack = budget - sum(widths)
            if wrappable[i] and 0 < natural[i] - widths[i] <= slack:
                widths[i] = natural[i]
        lines.append("")
        lines.extend(textwrap.wrap(section.title, width, break_on_hyphens=False) or [section.title])

        lines.extend(_text_row(header, section.columns, widths, wrappable, gap))
        lines.append(gap.join("-" * w for w in widths))
        for b in body:
            lines.extend(_text_row(b, section.columns, widths, wrappable, gap))
        for k, line in enumerate(section.latency):
            lines.extend(textwrap.wrap(line, width, initial_indent="" if k == 0 else "  ",
                                       subsequent_indent="    ", break_on_hyphens=False) or [line])
    if table.footnotes:
        lines.append("")
        for note in table.footnotes:
            lines.extend(textwrap.wrap(note, width, subsequent_indent="  ", break_on_hyphens=False) or [note])
    return "\n".join(lines) + "\n"


def _md_escape(text: str) -> str:
    return re.sub(r"([|*_\\`^+~])", r"\\\1", text)


def to_markdown(table: Table) -> str:
    """GitHub-flavoured markdown: a heading and a pipe table per section, footnotes last."""
    out = [f"## {_md_escape(table.title)}", ""]
    if table.legend:
        out += [f"- {_md_escape(entry)}" for entry in table.legend] + [""]
    if not table.sections:
        out += ["(no measurements)", ""]
    for section in table.sections:
        out += [f"### {_md_escape(section.title)}", ""]
        out.append("| " + " | ".join(_md_escape(c.title) for c in section.columns) + " |")
        out.append("|" + "|".join("---:" if c.numeric else "---" for c in section.columns) + "|")
        for row in section.rows:
            out.append("| " + " | ".join(_md_escape(x) for x in _display(section, row)) + " |")
        out.append("")
        if section.latency:
            out += [_md_escape(section.latency[0]), ""] + [f"- {_md_escape(x)}" for x in section.latency[1:]] + [""]
    for note in table.footnotes:
        out += [_md_escape(note), ""]
    return "\n".join(out).rstrip("\n") + "\n"


CSV_FIELDS = (
    "test", "metric", "row", "run", "vmm", "target", "driver", "value", "pct_of_baseline",
    "avgrq_sectors", "avgqu", "util_pct", "emulated", "marker", "labels", "note",
    # a figure over its samples (value is their median): n, the median's interval, CV, min, max, the samples in
    # measured order (space-separated); the % of bare metal's interval and its n (guest+bare metal)
    "n", "low", "high", "cv", "min", "max", "samples", "pct_low", "pct_high", "pct_n",
    # a random test's completion latency in µs, read from its histograms merged over every repeat (and guest), the
    # I/Os they count; a queue-depth-1 guest row's latency added over its bare metal at p50, with its interval
    "lat_p50_us", "lat_p99_us", "lat_p99_9_us", "lat_ios", "added_p50_us", "added_low_us", "added_high_us",
)


def _num(v: Any, digits: int = 3) -> str:
    if v is None:
        return ""
    return str(round(float(v), digits))


def to_csv(table: Table) -> str:
    """One rectangular CSV (header CSV_FIELDS) of every section's rows; numbers unformatted.
    Emulated rows carry marker '*' and the footnote text in `note`."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_FIELDS)
    notes = {n[0]: n for n in table.footnotes}
    for s in table.sections:
        for r in s.rows:
            c = r.cells
            w.writerow([
                s.test, s.metric, r.kind, c.get("run"), c.get("vmm"), c.get("target"), c.get("driver"),
                _num(c.get("value")), _num(c.get("pct"), 2), _num(c.get("avgrq"), 1), _num(c.get("avgqu"), 2),
                _num(c.get("util"), 1), "yes" if r.emulated else "no", r.marker, " ".join(r.labels),
                " | ".join(notes[m] for m in r.markers if m in notes), *_csv_stats(r), *_csv_latency(r),
            ])
    return buf.getvalue()


def _csv_stats(r: Row) -> list[str]:
    """A row's figure over its samples and its ratio's interval, as CSV_FIELDS's last columns ("" where none)."""
    s, q = r.summary, r.ratio
    head = ["", "", "", "", "", "", ""] if s is None else [
        str(s.n), _num(s.low), _num(s.high), _num(s.cv, 4), _num(s.minimum), _num(s.maximum),
        " ".join(_num(v) for v in r.samples)]
    return head + (["", "", ""] if q is None else [_num(q.low, 2), _num(q.high, 2), f"{q.n_a}+{q.n_b}"])


def _csv_latency(r: Row) -> list[str]:
    """A row's latency percentiles and latency added, as CSV_FIELDS's last columns ("" where none)."""
    lat, add = r.latency, r.added
    head = ["", "", "", ""] if lat is None else [_num(lat.p50), _num(lat.p99), _num(lat.p999), str(lat.ios)]
    if add is None:
        return head + ["", "", ""]
    s = add.shift
    low, high = (s.low, s.high) if s is not None and s.has_interval else (None, None)
    return head + [_num(add.us), _num(low), _num(high)]


def to_json(runs: Sequence[Run], raw: bool = False, indent: int | None = 2) -> str:
    """Whole runs (profile TOML, provenance, every measurement: each a sample with its repeat, boot and iteration;
    raw tool output if raw=True), each with its headline summary and its figures: every (side, test, metric,
    instance)'s samples in measured order, median, interval, CV, min, max, and the guest's % of bare metal with its
    interval; a random test's lat_us figures with the percentiles of their merged latency histograms."""
    doc = {
        "format": JSON_FORMAT,
        "version": JSON_VERSION,
        "exported_at": time.time(),
        "runs": [dict(r.as_dict(raw=raw), summary=run_summary(r), figures=figures(r)) for r in runs],
    }
    return json.dumps(doc, indent=indent, sort_keys=False, default=str) + "\n"


def figures(run: Run) -> list[dict[str, Any]]:
    """Each figure of the run over its samples (the JSON export's), a guest's with its % of the run's bare metal."""
    out = []
    for f in run.figures():
        s = f.summary
        d: dict[str, Any] = {
            "side": f.side, "test": f.test, "metric": f.metric, "instance": f.instance, "n": s.n,
            "median": s.median, "low": s.low, "high": s.high, "cv": s.cv, "min": s.minimum, "max": s.maximum,
            "flagged": s.flagged, "boots": f.boots, "samples": f.values}
        if f.side == "guest" and (q := run.ratio(f.test, f.metric, f.instance)) is not None:
            d["pct_of_baseline"] = {"percent": q.percent, "low": q.low, "high": q.high, "n_guest": q.n_a,
                                    "n_baseline": q.n_b, "method": q.method or None, "coverage": q.coverage}
        if f.metric == LATENCY_METRIC and (lat := run.latency(f.side, f.test, f.instance)) is not None:
            d["latency"] = lat.as_dict()
            if f.side == "guest" and f.instance is None and qd1(f.test) and (a := run.added_latency(f.test)):
                d["latency"]["added_p50"] = a.as_dict()
        out.append(d)
    return out
