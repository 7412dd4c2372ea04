"""The comparison tables rendered: to_text (fixed width, wraps text columns to fit 80 columns), to_markdown, to_csv
(one rectangular table, raw numbers); and to_json, whole runs with their provenance (the export)."""

from __future__ import annotations

import csv
import io
import json
import re
import textwrap
import time
from collections.abc import Sequence
from typing import Any

from ..record.rows import Run
from .compare import Column, Row, Section, Table, run_summary

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
        if metric in ("IOPS", "Mbit/s", "trans/s"):
            return f"{v:.0f}"
        return f"{v:.1f}"
    return f"{v:g}"


def _display(section: Section, row: Row) -> list[str]:
    out = []
    for c in section.columns:
        text = _fmt(c.key, row.cells.get(c.key), section.metric)
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


def _wrap(text: str, width: int) -> list[str]:
    return textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False) or [""]


def _text_row(
    cells: list[str], columns: list[Column], widths: list[int], wrappable: list[bool], gap: str
) -> list[str]:
    wrapped = [_wrap(cells[i], widths[i]) if wrappable[i] else [cells[i]] for i in range(len(cells))]
    out = []
    for k in range(max(len(w) for w in wrapped)):
        parts = []
        for i, c in enumerate(columns):
            s = wrapped[i][k] if k < len(wrapped[i]) else ""
            parts.append(s.rjust(widths[i]) if c.numeric else s.ljust(widths[i]))
        out.append(gap.join(parts).rstrip())
    return out


def to_text(table: Table, width: int = 80) -> str:
    """Fixed-width text; the VMM/target/driver columns wrap onto extra lines to keep within `width`."""
    lines = [table.title, "=" * min(len(table.title), width)]
    for entry in table.legend:
        lines.extend(textwrap.wrap(entry, width, subsequent_indent="    ", break_on_hyphens=False) or [entry])
    if not table.sections:
        lines.append("(no measurements)")
    gap = "  "
    for section in table.sections:
        header = [c.short for c in section.columns]
        body = [_display(section, r) for r in section.rows]
        ncol = len(header)
        natural = [max(len(x) for x in [header[i], *(b[i] for b in body)]) for i in range(ncol)]
        wrappable = [c.key in ("vmm", "target", "driver") for c in section.columns]
        minimums = [
            max([len(w) for x in [header[i], *(b[i] for b in body)] for w in x.split()] or [1])
            if wrappable[i] else natural[i]
            for i in range(ncol)
        ]
        budget = width - len(gap) * (ncol - 1)
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
    if table.footnotes:
        lines.append("")
        for note in table.footnotes:
            lines.extend(textwrap.wrap(note, width, subsequent_indent="  ", break_on_hyphens=False) or [note])
    return "\n".join(lines) + "\n"


def _md_escape(text: str) -> str:
    return re.sub(r"([|*_\\`^+])", r"\\\1", text)


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
    for note in table.footnotes:
        out += [_md_escape(note), ""]
    return "\n".join(out).rstrip("\n") + "\n"


CSV_FIELDS = (
    "test", "metric", "row", "run", "vmm", "target", "driver", "value", "pct_of_baseline",
    "avgrq_sectors", "avgqu", "util_pct", "emulated", "marker", "labels", "note",
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
                " | ".join(notes[m] for m in r.markers if m in notes),
            ])
    return buf.getvalue()


def to_json(runs: Sequence[Run], raw: bool = False, indent: int | None = 2) -> str:
    """Whole runs (profile TOML, provenance, every measurement; raw tool output if raw=True)."""
    doc = {
        "format": JSON_FORMAT,
        "version": JSON_VERSION,
        "exported_at": time.time(),
        "runs": [dict(r.as_dict(raw=raw), summary=run_summary(r)) for r in runs],
    }
    return json.dumps(doc, indent=indent, sort_keys=False, default=str) + "\n"
