"""A study's report as one self-contained HTML page: the Markdown report's text and tables, each table followed by
its figures; and the report's formats by name (FORMATS, `study report --format`)."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from markdown_it import MarkdownIt

from ..inputs import printable
from .evidence import Evidence
from .markdown import findings, intro, notes, series_rows, sources, sweep_section, table, to_markdown, variability
from .schema import is_iozone_sweep
from .series import Sample
from .svg import HOST_PLOTS, density_svg, figure, histogram_svg, host_svg, iozone_figure, sweep_svg, timeline_svg

HTML_STYLE = """body{font-family:system-ui,sans-serif;max-width:75em;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:.9em}th,td{border:1px solid #ccc;padding:.25em .5em}
th{background:#f2f2f2}td:nth-child(n+3){text-align:right}code{background:#f4f4f4;padding:0 .2em}
figure{margin:1em 0 2em}figcaption{font-size:.85em;color:#555}"""


def to_html(ev: Evidence) -> str:
    """The whole report as one self-contained HTML page: the Markdown report's text and tables, and after each
    table its figure. Raw HTML in a study's text is shown as text, never passed through."""
    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    body = [md.render("\n".join(intro(ev)))]
    for test in ev.study.test_ids:
        body.append(md.render("\n".join(table(ev, test))))
        body += _table_figures(ev, test)
    section = sweep_section(ev)
    if section:
        body.append(md.render("\n".join(section)))
        assert ev.sweep is not None
        if ev.sweep.samples:
            body.append(f"<figure>{sweep_svg(ev.sweep)}<figcaption>Each sample's total seconds (provisioning to the "
                        "guest's agent) against its image's size, and the least-squares line through them."
                        "</figcaption></figure>")
    section = variability(ev)
    if section:
        body.append(md.render("\n".join(section)))
        body += [_series_figure(profile, test, samples) for profile, test, samples, _st in series_rows(ev)]
    body.append(md.render("\n".join(findings(ev) + notes(ev) + sources(ev))))
    title = escape(printable(ev.study.title))
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            f"<title>{title}</title>\n<style>\n{HTML_STYLE}\n</style>\n</head>\n<body>\n"
            + "\n".join(body) + "</body>\n</html>\n")


def _table_figures(ev: Evidence, test: str) -> list[str]:
    """The figures after a test's table: % of native per profile, the host disk over each cell whose run kept its
    samples, and each IOzone sweep's cell."""
    out = []
    svg = figure(ev, test)
    if svg:
        out.append(f"<figure>{svg}<figcaption>% of native: each guest number divided by the bare-metal "
                   "number of the same run (ours) or of the paper's bare-metal row (paper).</figcaption></figure>")
    for profile in ev.study.profile_names:
        sides = ev.host.get((profile, test))
        if sides:
            out.append("<figure>" + "".join(host_svg(profile, test, sides, key) for key in HOST_PLOTS)
                       + f"<figcaption>{escape(printable(profile))}, {escape(test)}: the host disk each second "
                       "while the guest's test ran (blue) and while the same test ran on bare metal (grey), "
                       f"from run #{ev.cells[(profile, test)].run_id}'s sampler.</figcaption></figure>")
    if is_iozone_sweep(test):
        out += [iozone_figure(ev, ev.cells[(p, test)]) for p in ev.study.profile_names if (p, test) in ev.cells]
    return out


def _series_figure(profile: str, test: str, samples: Sequence[Sample]) -> str:
    """A series cell's three plots: its histogram, its density and its repeats over time."""
    return (f"<figure>{histogram_svg(profile, test, samples)}{density_svg(profile, test, samples)}"
            f"{timeline_svg(profile, test, samples)}"
            "<figcaption>First: how often each range of the guest's number came up over the repeats. "
            "Second: the same samples as a density (Gaussian kernel, Silverman's bandwidth), a tick per "
            "sample under the curve. Third: each repeat at its start time, with the same run's "
            "bare-metal number (grey).</figcaption></figure>")


FORMATS = {"md": to_markdown, "html": to_html}
