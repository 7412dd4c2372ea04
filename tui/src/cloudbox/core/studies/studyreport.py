"""A study's report in Markdown (or HTML with a figure per table): its tables in the paper's layout with the paper's
number beside ours in every cell (and, when the study asks for cost, ours per host core and per GiB of guest RAM),
then for a study with an image-propagation sweep (B) its samples per image size and the line fitted through them,
then each finding with its verdict and the reason.

Made only from stored runs (`studies.gather`), so it can be regenerated and exported at any time; it carries no
time of its own, only the runs it used. Our numbers measured where they cannot stand for the paper's (emulated,
nested, quick size, warm cache, a changed profile, a loop device) carry the reason in brackets, and the
findings resting on them are inconclusive (studies.evaluate_rule).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from html import escape

from markdown_it import MarkdownIt

from ..bench import bonnie, iozone, propagation
from ..bench.propagation import Fit, NoFit
from ..inputs import printable
from ..record.fairness import spread
from ..record.rows import Sample as HostSample
from ..spec import catalogue
from ..spec.catalogue import is_storage_test, test_title
from .studies import (
    INCONCLUSIVE,
    NATIVE,
    NOT_REPRODUCED,
    REPRODUCED,
    Cell,
    Evidence,
    Measured,
    Sample,
    SeriesStats,
    Study,
    SweepEvidence,
    needs_node,
    series_stats,
)

QUALIFIER_NOTES = {
    "emulated": "measured under TCG emulation: not an overhead figure",
    "nested": "measured under nested virtualization (KVM inside a virtual machine): not an overhead figure",
    "quick": "quick size (128 MiB): the page and device caches weigh more than in the study",
    "warm cache": "the page cache was not dropped before the test",
    "loop device": "the whole-disk profile ran on a loop device over a file, not on a disk (no --device given)",
    "profile changed": "the profile changed since the run: it measured another configuration",
}


def _md(text: object) -> str:
    """Text for a table cell: printable, pipes escaped."""
    return printable(text).replace("\\", "\\\\").replace("|", "\\|")


def _g(v: float | None) -> str:
    """A published number as the paper writes it (111, 1.3, 0.57)."""
    return "-" if v is None else f"{v:g}"


def value_text(v: float | None, metric: str) -> str:
    if v is None:
        return "-"
    return f"{v:.0f}" if metric in ("IOPS", "Mbit/s", "trans/s") else f"{v:.1f}"


def pct_text(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def host_text(key: str, v: float | None) -> str:
    if v is None:
        return "-"
    if key == "avgrq":
        return f"{v:.0f}" if v >= 10 else f"{v:.1f}"
    if key == "avgqu":
        return f"{v:.2f}" if v < 10 else (f"{v:.1f}" if v < 100 else f"{v:.0f}")
    return f"{v:.0f}"


def _with(text: str, qualifiers: Sequence[str]) -> str:
    return f"{text} ({', '.join(qualifiers)})" if qualifiers and text != "-" else text


def ours_text(cell: Cell, metric: str | None = None) -> str:
    """A cell's number as the report's tables write it, with the reasons it is weaker than the paper's in brackets:
    "21.4 (emulated, quick)". `metric` picks the number's format (the cell's own by default)."""
    return _with(value_text(cell.guest.value, metric or cell.metric), cell.qualifiers)


def paper_text(study: Study, profile: str, test: str) -> str:
    """The paper's number for a cell as the report's tables write it, "-" when it published none."""
    pc = study.paper_cell(profile, test)
    return _g(pc.value if pc else None)


def _mean(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def native_row(cells: Sequence[Cell]) -> tuple[Measured | None, list[int]]:
    """The bare-metal row of a table: the mean of the baselines of the runs its guest cells come from (each guest's %
    uses its own run's baseline), and those runs."""
    by_run: dict[int, Measured] = {}
    for c in cells:
        if c.baseline is not None:
            by_run.setdefault(c.run_id, c.baseline)
    if not by_run:
        return None, []
    bs = list(by_run.values())
    value = _mean([b.value for b in bs])
    assert value is not None
    return Measured(value, _mean([b.avgrq for b in bs]), _mean([b.avgqu for b in bs]), _mean([b.util for b in bs]),
                    tuple(sorted({lab for b in bs for lab in b.labels}))), sorted(by_run)


def native_per_core(cells: Sequence[Cell]) -> float | None:
    """The bare-metal row's number per host core: the mean over the runs it comes from of each baseline divided by
    its own host's cores; None unless every one of those runs recorded its cores."""
    by_run: dict[int, Cell] = {}
    for c in cells:
        if c.baseline is not None:
            by_run.setdefault(c.run_id, c)
    per = [c.per_host_core(c.baseline.value if c.baseline else None) for c in by_run.values()]
    return None if not per or None in per else _mean(per)


def _runs(ids: Sequence[int]) -> str:
    return ", ".join(f"#{i}" for i in ids) + (" (mean)" if len(ids) > 1 else "")


def _missing_note(ev: Evidence, profile: str, test: str) -> str:
    if profile in ev.unavailable:
        return f"not run: {ev.unavailable[profile]}"
    if needs_node(test):
        return "not run: needs a run on a back-end (--node)"
    return "not run yet"


def table(ev: Evidence, test: str) -> list[str]:
    """One test's table in the paper's layout: the bare-metal row, then a row per profile in the study's order."""
    study = ev.study
    title = next(t.table for t in study.tests if t.id == test)
    cells = [ev.cells[(p, test)] for p in study.profile_names if (p, test) in ev.cells]
    metric = cells[0].metric if cells else ("MB/s" if is_storage_test(test) else "Mbit/s")
    storage = is_storage_test(test)
    head = ["configuration", "profile", f"paper {metric}", f"ours {metric}", "paper % of native", "ours % of native"]
    if study.cost:
        head += [f"ours {metric} per host core", f"ours {metric} per GiB guest RAM"]
    if storage:
        head += ["avgrq paper / ours", "avgqu paper / ours", "util % paper / ours"]
    head.append("run")
    out = [f"## {_md(title)}", "", f"`{test}`: {_md(test_title(test))}", "",
           "| " + " | ".join(head) + " |",
           "|" + "|".join("---" if i < 2 or i == len(head) - 1 else "---:" for i in range(len(head))) + "|"]

    paper_native = study.paper_cell(NATIVE, test)
    native, native_runs = native_row(cells)
    native_q = host_qualifiers([native.labels] if native else [])
    many = {c.guests for c in cells if c.baseline is not None and c.guests > 1}
    native_q += [f"sum of {n} processes" for n in sorted(many)]  # a series' runs of N guests: N at once
    row = ["none, bare metal", "-", _g(paper_native.value if paper_native else None),
           _with(value_text(native.value if native else None, metric), native_q), "100" if paper_native else "-",
           "100" if native else "-"]
    if study.cost:
        row += [_with(value_text(native_per_core(cells), metric), native_q), "-"]
    if storage:
        for key in ("avgrq", "avgqu", "util"):
            row.append(f"{_g(getattr(paper_native, key) if paper_native else None)} / "
                       f"{host_text(key, getattr(native, key) if native else None)}")
    row.append(_runs(native_runs) if native_runs else "-")
    out.append("| " + " | ".join(_md(x) for x in row) + " |")

    for profile in study.profile_names:
        pc = study.paper_cell(profile, test)
        cell = ev.cells.get((profile, test))
        p_pct, computed = study.paper_percent(profile, test)
        p_pct_text = pct_text(p_pct) if computed or p_pct is None else f"{_g(p_pct)} (published)"
        if pc is not None and pc.native is not None and p_pct is not None:
            p_pct_text += f" (of {_g(pc.native)})"
        q = cell.qualifiers if cell else []
        ours = ours_pct = "-"
        if cell is not None:
            ours = ours_text(cell, metric)
            if cell.baseline is not None and cell.baseline.value:
                ours_pct = _with(pct_text(cell.guest.value / cell.baseline.value * 100.0), q)
        row = [study.row(profile), f"`{profile}`", paper_text(study, profile, test), ours, p_pct_text, ours_pct]
        if study.cost:
            row += [_with(value_text(cell.per_host_core(cell.guest.value) if cell else None, metric), q),
                    _with(value_text(cell.guest_per_gib if cell else None, metric), q)]
        if storage:
            for key in ("avgrq", "avgqu", "util"):
                row.append(f"{_g(getattr(pc, key) if pc else None)} / "
                           f"{host_text(key, getattr(cell.guest, key) if cell else None)}")
        row.append(f"#{cell.run_id}" if cell else _missing_note(ev, profile, test))
        out.append("| " + " | ".join(_md(x) for x in row) + " |")
    out.append("")
    if test == "bonnie":
        out += bonnie_table(ev, cells)
    if is_iozone_sweep(test):
        out += file_sweep_table(ev, cells)
    return out


def is_iozone_sweep(test: str) -> bool:
    """A test whose run is IOzone's automatic mode: a file sweep (one record size) or the grid (every record size)."""
    return test.startswith("iozone-files-") or test in catalogue.IOZONE_GRIDS


def file_sweep_table(ev: Evidence, cells: Sequence[Cell]) -> list[str]:
    """IOzone's sweeps: per file size (and, in the grid, per record size), each pass's MB/s on both sides of each
    cell's run."""
    grid = any(c.test in catalogue.IOZONE_GRIDS for c in cells)
    what = "file and record size" if grid else "file size"
    out = [f"Each {what} of the sweep, each side of the cell's run (MB/s; \"-\": not stored):", "",
           "| configuration | run | file | " + ("records | " if grid else "")
           + " | ".join(iozone.IOZONE_FILE_PASSES) + " |",
           "|---|---|---:|" + "---:|" * (len(iozone.IOZONE_FILE_PASSES) + grid)]
    for cell in cells:
        for side, figs in _sides(ev, cell):
            for kib, rec in iozone.iozone_sweep_cells(figs):
                vals = [value_text(figs.get(iozone.iozone_file_metric(p, kib, rec)), "MB/s")
                        for p in iozone.IOZONE_FILE_PASSES]
                records = [iozone.kib_text(rec) if rec else "-"] if grid else []
                out.append("| " + " | ".join(_md(x) for x in [side, f"#{cell.run_id}", iozone.kib_text(kib),
                                                               *records, *vals]) + " |")
    out.append("")
    return out


def _figures(m: Measured) -> dict[str, float]:
    return {**dict(m.others), "MB/s": m.value}


def _sides(ev: Evidence, cell: Cell) -> list[tuple[str, dict[str, float]]]:
    """A cell's run's figures of the test by metric: bare metal's, then the guest's under the profile's row."""
    return [("bare metal", dict(cell.baseline_figures)), (ev.study.row(cell.profile), _figures(cell.guest))]


def bonnie_table(ev: Evidence, cells: Sequence[Cell]) -> list[str]:
    """Every figure Bonnie++ gave, per side of each cell's run: block write, rewrite and read MB/s with their %CPU,
    file creations and deletions per second, and the seconds its whole run took."""
    names = {"MB/s": "write MB/s", "creates/s": "creates/s", "deletes/s": "deletes/s",
             "random creates/s": "random creates/s", "random deletes/s": "random deletes/s"}
    cols = list(bonnie.BONNIE_METRICS)
    out = ["Bonnie++'s figures, each side of the cell's run (\"-\": a pass Bonnie++ could not time, which it "
           "prints as \"+++++\" when it takes under half a second, as small files through a page cache can):", "",
           "| configuration | run | " + " | ".join(names.get(c, c) for c in cols) + " |",
           "|---|---|" + "---:|" * len(cols)]
    for cell in cells:
        for side, figs in _sides(ev, cell):
            vals = [value_text(figs.get(c), "IOPS" if "/s" in c and "MB" not in c else c) for c in cols]
            out.append("| " + " | ".join(_md(x) for x in [side, f"#{cell.run_id}", *vals]) + " |")
    out.append("")
    return out


def _accelerator_text(accelerator: str | None) -> str:
    return {"tcg": "TCG (emulated)", "nested-kvm": "nested KVM"}.get(accelerator or "", accelerator or "?")


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t)) if t else "?"


def _legend(ev: Evidence) -> list[str]:
    seen: dict[int, Cell] = {}
    for c in ev.cells.values():
        seen.setdefault(c.run_id, c)
    out = []
    for rid in sorted(seen):
        c = seen[rid]
        out.append(f"- run #{rid}: profile `{c.profile}`, {_md(c.size_label or '?')} size, "
                   f"{_md(_accelerator_text(c.accelerator))}, node {_md(c.node or '?')}, started {_when(c.started_at)}")
    sweep = ev.sweep
    profile = sweep.profile if sweep is not None else ""
    for r in sweep.runs if sweep is not None else ():
        why = (r.reason or "no reason recorded").splitlines()[0]  # a dead guest's console follows: not for a legend
        ended = "" if r.state == "completed" else f", {_md(r.state)} ({_md(why)}): the samples it stored before count"
        out.append(f"- run #{r.run_id}: image-propagation sweep of `{profile}`, {_md(r.size_label or '?')} size, "
                   f"{_md(_accelerator_text(r.accelerator))}, node {_md(r.node or '?')}, started "
                   f"{_when(r.started_at)}{ended}")
    return out


def findings(ev: Evidence) -> list[str]:
    """The findings: a summary table, then each rule with its verdict, the reason and why its threshold is there."""
    if not ev.verdicts:
        return ["## Findings", "", "This study states no findings as rules.", ""]
    counts = {s: sum(1 for v in ev.verdicts if v.status == s) for s in (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE)}
    out = ["## Findings", "", ", ".join(f"{n} {s}" for s, n in counts.items()) + ".", "",
           "| finding | rule | paper | ours | verdict |", "|---|---|---:|---:|---|"]
    for v in ev.verdicts:
        paper = v.figure(v.paper) + (" (computed)" if v.paper_computed else "")
        out.append(f"| {_md(v.rule.id)} | {_md(v.rule.statement())} | {_md(paper)} | {_md(v.figure(v.ours))} | "
                   f"**{v.status}** |")
    out.append("")
    for v in ev.verdicts:
        out += [f"### {_md(v.rule.id)}: {v.status}", "", _md(v.rule.finding), "",
                f"- rule: {_md(v.rule.statement())}",
                f"- verdict: {_md(v.explain())}",
                f"- runs: {', '.join(f'#{i}' for i in v.run_ids) or 'none'}",
                f"- why this threshold: {_md(v.rule.why)}", ""]
    return out


def _intro(ev: Evidence) -> list[str]:
    """The title, what the study is, how cells were chosen, and the runs used."""
    study: Study = ev.study
    size = f"{ev.size} size" if ev.size else " or ".join(f"{s} size" for s in study.sizes) + " (in that order)"
    out = [f"# {_md(study.title)}", "", _md(study.description), "",
           f"Each cell is the latest completed run of its profile with that test at {size}"
           + (f" on node {_md(ev.node)}" if ev.node else "")
           + ", preferring a run of the profile as it is today. \"paper\" is the study's published figure, \"ours\" "
           "this lab's; \"% of native\" divides each guest number by the bare-metal baseline measured in the same run "
           "(the paper's: by its bare-metal row unless a row says otherwise). Paper percentages are computed from the "
           "published numbers unless marked published. Host columns: avgrq in 512-byte sectors, avgqu in requests.",
           ""]
    if study.cost:
        out += ["Cost columns: each number divided by the physical cores of the host that ran it, as its run "
                "recorded them, and the guest's by its RAM in GiB, from the profile stored with its run; the "
                "bare-metal row has no guest RAM. \"-\" where a run did not record its host's cores.", ""]
    legend = _legend(ev)
    out += ["Runs used:", "", *legend, ""] if legend else ["No stored run matches this study yet "
                                                           f"(`cloudbox study run {study.name}`).", ""]
    return out


def _notes(ev: Evidence) -> list[str]:
    """What each qualifier in brackets means, for those the report uses."""
    out: list[str] = []
    present = {q for c in ev.cells.values() for q in c.qualifiers}
    present |= {q for x in (ev.sweep.samples if ev.sweep else ()) for q in x.qualifiers}
    if any(c.baseline and "virtualized-host" in c.baseline.labels for c in ev.cells.values()):
        out += ["(virtualized host): the bare-metal side ran on a virtual machine, not on bare metal", ""]
    for q, note in QUALIFIER_NOTES.items():
        if q in present:
            out += [f"({q}): {note}", ""]
    for n in sorted({c.guests for c in ev.cells.values() if c.guests > 1}):
        out += [f"(sum of {n} guests): the run had {n} guests at once (the series' instances): its figure is their "
                f"sum, beside {n} bare-metal processes at once (sum of {n} processes); each guest's own figures are in "
                "the variability section", ""]
    return out


# ------------------------------------------------------------------------------------------------- series
def sample_qualifiers(samples: Sequence[Sample]) -> list[str]:
    """Why a series' numbers are weaker than a study-sized one on bare hardware, in a word each."""
    out = []
    if any(x.accelerator == "nested-kvm" for x in samples):
        out.append("nested")
    elif any(x.emulated for x in samples):
        out.append("emulated")
    if any(x.size_label == "quick" for x in samples):
        out.append("quick")
    return out


def bins(values: Sequence[float], count: int | None = None) -> list[tuple[float, float, int]]:
    """Equal-width histogram bins over [min, max]: (low, high, how many); about sqrt(n) bins, at most 12, the last
    one closed. One bin when every value is the same."""
    if not values:
        return []
    lo, hi = min(values), max(values)
    if hi == lo:
        return [(lo, hi, len(values))]
    k = count or max(2, min(12, round(math.sqrt(len(values)))))
    width = (hi - lo) / k
    counts = [0] * k
    for v in values:
        counts[min(k - 1, int((v - lo) / width))] += 1
    return [(lo + i * width, lo + (i + 1) * width, n) for i, n in enumerate(counts)]


@dataclass(frozen=True)
class Density:
    """A Gaussian kernel density estimate of a series: its bandwidth, the curve over a grid (value, density per unit
    of the value) and the curve's peaks (more than one: the runs fell into groups, which a median hides)."""
    bandwidth: float
    curve: list[tuple[float, float]]
    peaks: list[float]


def density(values: Sequence[float], points: int = 81) -> Density | None:
    """The Gaussian kernel density of values, bandwidth by Silverman's rule of thumb (0.9 min(s, IQR / 1.34)
    n^-1/5), over min - 3h to max + 3h; None under three values or when they are all the same."""
    if len(values) < 3 or max(values) == min(values):
        return None
    n = len(values)
    s = statistics.stdev(values)
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    spread_ = min(s, (q3 - q1) / 1.34) if q3 > q1 else s
    h = 0.9 * spread_ * n ** -0.2
    kernel = statistics.NormalDist(0.0, h)
    lo, hi = min(values) - 3 * h, max(values) + 3 * h
    xs = [lo + (hi - lo) * i / (points - 1) for i in range(points)]
    curve = [(x, sum(kernel.pdf(x - v) for v in values) / n) for x in xs]
    peaks = [curve[i][0] for i in range(1, points - 1)
             if curve[i][1] >= curve[i - 1][1] and curve[i][1] > curve[i + 1][1]]
    return Density(h, curve, peaks)


def density_words(d: Density, metric: str) -> str:
    """One line for the Markdown report: the bandwidth and where the curve peaks."""
    texts = [value_text(p, metric) for p in d.peaks]
    where = " and ".join([", ".join(texts[:-1]), texts[-1]] if len(texts) > 1 else texts)
    peaks = f"one peak, at {where}" if len(d.peaks) == 1 else f"{len(d.peaks)} peaks, at {where}"
    return (f"Density (Gaussian kernel, bandwidth {value_text(d.bandwidth, metric)} {metric} by Silverman's rule): "
            f"{peaks} {metric}.")


def _series_rows(ev: Evidence) -> list[tuple[str, str, list[Sample], SeriesStats]]:
    out = []
    for (profile, test), samples in ev.series.items():
        st = series_stats([x.value for x in samples])
        if st is not None:
            out.append((profile, test, samples, st))
    return out


def variability(ev: Evidence) -> list[str]:
    """A series study's section: per cell, the distribution of the guest's number over the stored repeats (median,
    5th and 95th percentiles, coefficient of variation, range), the bare-metal median beside it, and a text
    histogram."""
    study = ev.study
    if study.series is None:
        return []
    plans = "; ".join(f"{size} size: {plan.words()}" for size in study.sizes
                      if (plan := study.series_plan(size)) is not None)
    over = ("its stored repeats (completed runs of the profile as it is today) and, where a run had several guests "
            "at once, over those instances: each guest's number is one sample") if _instances(ev) else \
        "its stored repeats (completed runs of the profile as it is today)"
    out = ["## Variability over time", "",
           f"The same tests repeated as a series ({_md(plans)}). Each row is one cell's distribution over {over}: p5 "
           "and p95 are the 5th and 95th percentiles, CV the coefficient of variation (standard deviation / mean). "
           "One short run describes one moment; the spread is the finding.", ""]
    rows = _series_rows(ev)
    if not rows:
        return out + [f"No repeats stored yet (`cloudbox study run {study.name}`).", ""]
    out += ["| profile | test | repeats | median | p5 | p95 | CV | range | bare-metal median | from - to |",
            "|---|---|---:|---:|---:|---:|---:|---|---:|---|"]
    for profile, test, samples, st in rows:
        metric = samples[0].metric
        plan = study.series_plan(samples[0].size_label)
        want = f" of {plan.repeats}" if plan else ""
        repeats = len({x.run_id for x in samples})
        guests = len({x.instance for x in samples})
        base = series_stats([x.baseline for x in samples if x.baseline is not None])
        quals = sample_qualifiers(samples)
        base_quals = host_qualifiers([x.baseline_labels for x in samples], quals)
        cv = "-" if st.cv is None else f"{st.cv:.1f}%"
        span = " - ".join(time.strftime("%Y-%m-%d %H:%M", time.localtime(t))
                          for t in dict.fromkeys((samples[0].started_at, samples[-1].started_at)))
        each = f", {guests} guests each" if guests > 1 else ""
        out.append(f"| {_md(profile)} | {_md(test)} | {repeats}{want} ({_md(samples[0].size_label)}{each}) | "
                   f"{_md(_with(value_text(st.median, metric), quals))} {_md(metric)} | "
                   f"{value_text(st.p5, metric)} | {value_text(st.p95, metric)} | {cv} | "
                   f"{value_text(st.low, metric)} - {value_text(st.high, metric)} | "
                   f"{_md(_with(value_text(base.median if base else None, metric), base_quals))} | {span} |")
    out.append("")
    out += _between_guests(rows)
    for profile, test, samples, _st in rows:
        metric = samples[0].metric
        hist = bins([x.value for x in samples])
        top = max(n for _, _, n in hist)
        ids = list(dict.fromkeys(x.run_id for x in samples))
        per = f", {len(samples) // len(ids)} guests each" if len(samples) > len(ids) else ""
        out += [f"Histogram of {_md(profile)} {_md(test)} ({_md(metric)}, runs "
                f"{', '.join(f'#{i}' for i in ids)}{per}):", "", "```"]
        out += [f"{value_text(a, metric):>8} - {value_text(b, metric):<8} {'#' * round(20 * n / top):<20} {n}"
                for a, b, n in hist]
        out += ["```", ""]
        if (d := density([x.value for x in samples])) is not None:
            out += [_md(density_words(d, metric)), ""]
    return out


def _instances(ev: Evidence) -> bool:
    return any(x.instance is not None for samples in ev.series.values() for x in samples)


def _between_guests(rows: Sequence[tuple[str, str, list[Sample], SeriesStats]]) -> list[str]:
    """For cells measured by several guests at once: each guest over time, and the guests within one repeat (the
    spread between instances, which one guest's series cannot show)."""
    out = []
    for profile, test, samples, _st in rows:
        by_guest: dict[int, list[float]] = {}
        by_run: dict[int, list[float]] = {}
        for x in samples:
            if x.instance is not None:
                by_guest.setdefault(x.instance, []).append(x.value)
                by_run.setdefault(x.run_id, []).append(x.value)
        if len(by_guest) < 2:
            continue
        metric = samples[0].metric
        guests = "; ".join(f"g{k} median {value_text(statistics.median(v), metric)}"
                           + (f", CV {st.cv:.1f}%" if (st := series_stats(v)) and st.cv is not None else "")
                           for k, v in sorted(by_guest.items()))
        spreads = [spread(v) for v in by_run.values() if len(v) > 1]
        within = [(sp.max - sp.min) / (sp.total / sp.n) * 100.0 for sp in spreads if sp.total > 0]
        jain = [sp.jain for sp in spreads]
        inside = (f" Within a repeat, (max - min) / mean of the guests: median {statistics.median(within):.1f}% "
                  f"(largest {max(within):.1f}%); Jain's fairness index median {statistics.median(jain):.3f}."
                  if within and jain else "")
        out += [f"{_md(profile)} {_md(test)} by guest over time ({_md(metric)}): {guests}.{inside}", ""]
    return out


# ------------------------------------------------------------------------------------------------ the sweep
def host_qualifiers(labels: Iterable[Sequence[str]], guest_qualifiers: Sequence[str] = ()) -> list[str]:
    """The bare-metal side's qualifiers: "virtualized host" when any of its figures (`labels`) ran on a virtual
    machine, and of the guest side's only the size: it ran without the guest's accelerator."""
    return ((["virtualized host"] if any("virtualized-host" in ls for ls in labels) else [])
            + [q for q in guest_qualifiers if q == "quick"])


QUALIFIER_ORDER = ("nested", "emulated", "quick", "warm cache", "profile changed")


def sweep_qualifiers(samples: Sequence[propagation.Sample]) -> list[str]:
    """The qualifiers any of these samples carries, in the report's order."""
    present = {q for x in samples for q in x.qualifiers}
    return [q for q in QUALIFIER_ORDER if q in present]


def sweep_fit(sweep: SweepEvidence) -> Fit | NoFit:
    """The line through the sweep's samples, or why there is none."""
    try:
        return propagation.fit(sweep.samples)
    except NoFit as e:
        return e


def _secs(v: float) -> str:
    return f"{v:.2f}" if abs(v) < 100 else f"{v:.0f}"


def _rate(v: float | None) -> str:
    return "-" if v is None else (f"{v:.0f}" if v >= 100 else f"{v:.3g}")


def fit_lines(line: Fit, quals: Sequence[str]) -> list[str]:
    """The fitted line in words, its qualifiers after its heading."""
    rate = line.mbps
    slope = (f"- slope: {line.slope_s_per_gb:.3g} s per GB, that is {_rate(rate)} MB/s" if rate is not None else
             f"- slope: {line.slope_s_per_gb:.3g} s per GB: time does not grow with the image's size here, so it "
             "implies no transfer rate")
    r2 = "- (every total is the same)" if line.r2 is None else f"{line.r2:.3f}"
    return [_with("Fitted line", quals) + ", least squares over every sample (sizes in GB of 10^9 bytes, rates in MB "
            "of 10^6):", "",
            f"- total = {_secs(line.intercept_s)} s + {line.slope_s_per_gb:.3g} s/GB × size",
            f"- intercept: {_secs(line.intercept_s)} s, what provisioning costs whatever the image's size (finding B1)",
            slope, f"- R²: {r2}", f"- n: {line.n} samples at {line.sizes} image sizes", ""]


def sweep_section(ev: Evidence) -> list[str]:
    """A study with an image-propagation sweep (B): the method, a row per image size (samples, median and mean total,
    median copy and boot, the copy's rate) and the line fitted through every sample."""
    sweep = ev.sweep
    if sweep is None:
        return []
    study = ev.study
    plans = "; ".join(f"{size} size: {plan.words()}" for size in study.sizes
                      if (plan := study.sweep_plan(size)) is not None)
    out = ["## Propagation", "",
           "The study provisioned a VM from an image of each size, waited until it ran and terminated it, ten times "
           "per size from 3 to 21 GB, and fitted a straight line to time against size: its intercept is what the "
           "cloud manager adds whatever the size, its slope the transfer. Here each sample copies a raw image of that "
           "size from cloudbox's image store to a fresh instance file (every byte read and written, then flushed to "
           f"disk, the host's page cache dropped first), starts `{_md(sweep.profile)}`'s guest with the copy as its "
           "disk and waits for its agent, then destroys the guest and deletes the copy. \"copy\" is the copy's "
           "seconds, \"boot\" from starting the guest to its agent answering, \"total\" both. No cloud manager is in "
           "the loop: the intercept is libvirt's, QEMU's and the guest's own fixed cost.", "",
           f"The sweep ({_md(plans)}), at {_md(sweep.size or '?')} size: the newest samples of each image size up to "
           "its repeats, from finished propagation runs (a run stopped part-way keeps the samples it stored).", ""]
    if not sweep.samples:
        return out + [f"No samples stored yet (`cloudbox study run {study.name}`).", ""]
    if sweep.size == "quick":
        out += ["At quick size the images are a few dozen MiB: the boot outweighs the copy, so the slope says "
                "little about the transfer.", ""]
    out += ["| image size | samples | median total s | mean total s | median copy s | median boot s | copy MB/s "
            "| runs |", "|---:|---:|---:|---:|---:|---:|---:|---|"]
    for size, xs in sweep.by_size().items():
        totals = [x.total_s for x in xs]
        copy = statistics.median(x.copy_s for x in xs)
        want = f" of {sweep.plan.repeats}" if sweep.plan else ""
        runs = ", ".join(f"#{r}" for r in dict.fromkeys(x.run_id for x in xs))
        out.append(f"| {propagation.size_text(size)} | {len(xs)}{want} | "
                   f"{_md(_with(_secs(statistics.median(totals)), sweep_qualifiers(xs)))} | "
                   f"{_secs(statistics.fmean(totals))} | {_secs(copy)} | "
                   f"{_secs(statistics.median(x.boot_s for x in xs))} | "
                   f"{_rate(size / copy / 1e6 if copy > 0 else None)} | {runs} |")
    out.append("")
    line = sweep_fit(sweep)
    if isinstance(line, NoFit):
        return out + [f"No line is fitted: {_md(line)}.", ""]
    return out + fit_lines(line, sweep_qualifiers(sweep.samples))


def to_markdown(ev: Evidence) -> str:
    """The whole report."""
    out = _intro(ev)
    for test in ev.study.test_ids:
        out += table(ev, test)
    out += sweep_section(ev) + variability(ev) + findings(ev) + _notes(ev)
    return "\n".join(out).rstrip("\n") + "\n"


# ----------------------------------------------------------------------------------------------------- HTML
FIG_WIDTH, FIG_LABEL, FIG_BAR, FIG_GAP = 760, 230, 13, 9
PAPER_FILL, OURS_FILL = "#9e9e9e", "#1f5fa8"
HTML_STYLE = """body{font-family:system-ui,sans-serif;max-width:75em;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:.9em}th,td{border:1px solid #ccc;padding:.25em .5em}
th{background:#f2f2f2}td:nth-child(n+3){text-align:right}code{background:#f4f4f4;padding:0 .2em}
figure{margin:1em 0 2em}figcaption{font-size:.85em;color:#555}"""


def bars(ev: Evidence, test: str) -> list[tuple[str, float | None, float | None, str]]:
    """The figure's rows for one test: (profile, the paper's % of native, ours, our qualifiers), one per profile
    that has either number."""
    study = ev.study
    out = []
    for profile in study.profile_names:
        paper, _ = study.paper_percent(profile, test)
        cell = ev.cells.get((profile, test))
        ours = None
        quals = ""
        if cell is not None and cell.baseline is not None and cell.baseline.value:
            ours = cell.guest.value / cell.baseline.value * 100.0
            quals = ", ".join(cell.qualifiers)
        if paper is not None or ours is not None:
            out.append((profile, paper, ours, quals))
    return out


def figure(ev: Evidence, test: str) -> str:
    """An inline SVG bar chart of one test: per profile, the paper's % of native (grey) above ours (blue), the
    bare-metal 100 % as a dashed line; our bars carry their qualifiers (emulated, nested, quick, ...) in words.
    Empty when neither side has a number."""
    rows = bars(ev, test)
    if not rows:
        return ""
    top = max([100.0] + [v for _, p, o, _ in rows for v in (p, o) if v is not None]) * 1.15
    plot = FIG_WIDTH - FIG_LABEL - 10
    row_h = 2 * FIG_BAR + FIG_GAP
    height = 30 + row_h * len(rows) + 20

    def x(v: float) -> float:
        return FIG_LABEL + plot * v / top

    title = next(t.table for t in ev.study.tests if t.id == test)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{FIG_WIDTH}" height="{height}" '
             f'viewBox="0 0 {FIG_WIDTH} {height}" role="img" font-family="sans-serif" font-size="11">',
             f"<title>{escape(printable(title))}: % of native, paper and ours</title>",
             f'<rect x="{FIG_LABEL}" y="6" width="10" height="10" fill="{PAPER_FILL}"/>'
             f'<text x="{FIG_LABEL + 14}" y="15">paper</text>',
             f'<rect x="{FIG_LABEL + 70}" y="6" width="10" height="10" fill="{OURS_FILL}"/>'
             f'<text x="{FIG_LABEL + 84}" y="15">ours (this lab)</text>']
    y = 30
    for profile, paper, ours, quals in rows:
        parts.append(f'<text x="{FIG_LABEL - 6}" y="{y + FIG_BAR + 4}" text-anchor="end">'
                     f"<title>{escape(printable(ev.study.row(profile)))}</title>{escape(printable(profile))}</text>")
        for i, (value, fill, note) in enumerate(((paper, PAPER_FILL, ""), (ours, OURS_FILL, quals))):
            by = y + i * FIG_BAR
            if value is None:
                parts.append(f'<text x="{FIG_LABEL + 4}" y="{by + FIG_BAR - 3}" fill="#777">no number</text>')
                continue
            text = f"{value:.1f} %" + (f" ({note})" if note else "")
            parts.append(f'<rect x="{FIG_LABEL}" y="{by}" width="{x(value) - FIG_LABEL:.1f}" height="{FIG_BAR - 2}" '
                         f'fill="{fill}"/><text x="{x(value) + 4:.1f}" y="{by + FIG_BAR - 3}">'
                         f"{escape(printable(text))}</text>")
        y += row_h
    parts.append(f'<line x1="{x(100):.1f}" y1="24" x2="{x(100):.1f}" y2="{y}" stroke="#333" '
                 f'stroke-dasharray="4 3"/><text x="{x(100):.1f}" y="{y + 14}" text-anchor="middle">'
                 "100 % = bare metal</text></svg>")
    return "\n".join(parts)


def to_html(ev: Evidence) -> str:
    """The whole report as one self-contained HTML page: the Markdown report's text and tables, and after each
    table its figure. Raw HTML in a study's text is shown as text, never passed through."""
    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    body = [md.render("\n".join(_intro(ev)))]
    for test in ev.study.test_ids:
        body.append(md.render("\n".join(table(ev, test))))
        svg = figure(ev, test)
        if svg:
            body.append(f"<figure>{svg}<figcaption>% of native: each guest number divided by the bare-metal "
                        "number of the same run (ours) or of the paper's bare-metal row (paper).</figcaption></figure>")
        for profile in ev.study.profile_names:
            sides = ev.host.get((profile, test))
            if sides:
                body.append("<figure>" + "".join(host_svg(profile, test, sides, key) for key in HOST_PLOTS)
                            + f"<figcaption>{escape(printable(profile))}, {escape(test)}: the host disk each second "
                            "while the guest's test ran (blue) and while the same test ran on bare metal (grey), "
                            f"from run #{ev.cells[(profile, test)].run_id}'s sampler.</figcaption></figure>")
        if is_iozone_sweep(test):
            body += [iozone_figure(ev, ev.cells[(p, test)]) for p in ev.study.profile_names if (p, test) in ev.cells]
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
        for profile, test, samples, _st in _series_rows(ev):
            body.append(f"<figure>{histogram_svg(profile, test, samples)}{density_svg(profile, test, samples)}"
                        f"{timeline_svg(profile, test, samples)}"
                        "<figcaption>First: how often each range of the guest's number came up over the repeats. "
                        "Second: the same samples as a density (Gaussian kernel, Silverman's bandwidth), a tick per "
                        "sample under the curve. Third: each repeat at its start time, with the same run's "
                        "bare-metal number (grey).</figcaption></figure>")
    body.append(md.render("\n".join(findings(ev) + _notes(ev))))
    title = escape(printable(ev.study.title))
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{title}</title>\n<style>\n{HTML_STYLE}\n</style>\n</head>\n<body>\n"
            + "\n".join(body) + "</body>\n</html>\n")


SERIES_W, SERIES_H, SERIES_PAD = 370, 200, 40
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
    plot_w, plot_h = SERIES_W - 2 * SERIES_PAD, SERIES_H - 2 * SERIES_PAD

    def xy(t: float, v: float) -> str:
        return f"{SERIES_PAD + plot_w * t / right:.1f},{SERIES_PAD + plot_h - plot_h * v / top:.1f}"

    what = HOST_PLOTS[key]
    parts = _svg_open(f"{profile} {test}: host disk {what} over the test")
    parts.append(f'<text x="{SERIES_PAD}" y="16">{escape(printable(f"{profile} {test}"))}: {escape(what)}</text>'
                 f'<line x1="{SERIES_PAD}" y1="{SERIES_PAD + plot_h}" x2="{SERIES_PAD + plot_w}" '
                 f'y2="{SERIES_PAD + plot_h}" stroke="#333"/>'
                 f'<text x="{SERIES_PAD - 4}" y="{SERIES_PAD + 4}" text-anchor="end">{top:g}</text>'
                 f'<text x="{SERIES_PAD - 4}" y="{SERIES_PAD + plot_h}" text-anchor="end">0</text>')
    for side, colour, pts in lines:
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" '
                     f'points="{" ".join(xy(t, v) for t, v in pts)}"><title>{side}</title></polyline>')
    if not lines:
        parts.append(f'<text x="{SERIES_W / 2:.0f}" y="{SERIES_H / 2:.0f}" text-anchor="middle" fill="#777">'
                     "no samples</text>")
    parts.append(f'<text x="{SERIES_W / 2:.0f}" y="{SERIES_H - 6}" text-anchor="middle">'
                 f"seconds into the test (up to {right:.0f} s)</text></svg>")
    return "\n".join(parts)


def _svg_open(title: str, width: int = SERIES_W, height: int = SERIES_H) -> list[str]:
    return [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" font-family="sans-serif" font-size="10">',
            f"<title>{escape(printable(title))}</title>"]


def histogram_svg(profile: str, test: str, samples: Sequence[Sample]) -> str:
    """An inline SVG histogram of a series' guest numbers (bars over equal-width bins, counts on top)."""
    metric = samples[0].metric
    hist = bins([x.value for x in samples])
    top = max(n for _, _, n in hist)
    plot_w, plot_h = SERIES_W - 2 * SERIES_PAD, SERIES_H - 2 * SERIES_PAD
    bw = plot_w / len(hist)
    quals = sample_qualifiers(samples)
    repeats = len({x.run_id for x in samples})
    what = f"{len(samples)} samples ({repeats} repeats x {len(samples) // repeats} guests)" \
        if len(samples) > repeats else f"{repeats} repeats"
    parts = _svg_open(f"{profile} {test}: histogram of {what} ({metric})")
    parts.append(f'<text x="{SERIES_PAD}" y="16">{escape(printable(f"{profile} {test}"))}'
                 + (f" ({escape(', '.join(quals))})" if quals else "") + "</text>")
    for i, (a, _b, n) in enumerate(hist):
        h = plot_h * n / top
        x = SERIES_PAD + i * bw
        parts.append(f'<rect x="{x:.1f}" y="{SERIES_PAD + plot_h - h:.1f}" width="{bw - 2:.1f}" height="{h:.1f}" '
                     f'fill="{OURS_FILL}"/><text x="{x + bw / 2:.1f}" y="{SERIES_PAD + plot_h - h - 3:.1f}" '
                     f'text-anchor="middle">{n}</text>')
        if i == 0 or i == len(hist) - 1 or len(hist) <= 6:
            parts.append(f'<text x="{x:.1f}" y="{SERIES_PAD + plot_h + 14}">{escape(value_text(a, metric))}</text>')
    parts.append(f'<text x="{SERIES_W / 2:.0f}" y="{SERIES_H - 6}" text-anchor="middle">'
                 f"{escape(printable(metric))} (guest)</text></svg>")
    return "\n".join(parts)


def density_svg(profile: str, test: str, samples: Sequence[Sample]) -> str:
    """An inline SVG of a series' density: the kernel estimate's curve (filled), a tick per sample under it and a
    dashed line at each peak; a note in place of the curve under three samples or when they are all equal."""
    metric = samples[0].metric
    values = [x.value for x in samples]
    d = density(values)
    plot_w, plot_h = SERIES_W - 2 * SERIES_PAD, SERIES_H - 2 * SERIES_PAD
    quals = sample_qualifiers(samples)
    parts = _svg_open(f"{profile} {test}: density of {len(values)} samples ({metric})")
    parts.append(f'<text x="{SERIES_PAD}" y="16">{escape(printable(f"{profile} {test}"))}: density'
                 + (f" ({escape(', '.join(quals))})" if quals else "") + "</text>"
                 f'<line x1="{SERIES_PAD}" y1="{SERIES_PAD + plot_h}" x2="{SERIES_PAD + plot_w}" '
                 f'y2="{SERIES_PAD + plot_h}" stroke="#333"/>')
    if d is None:
        parts.append(f'<text x="{SERIES_W / 2:.0f}" y="{SERIES_H / 2:.0f}" text-anchor="middle" fill="#777">'
                     "too few distinct samples for a density</text></svg>")
        return "\n".join(parts)
    lo, hi = d.curve[0][0], d.curve[-1][0]
    top = max(y for _, y in d.curve) * 1.1

    def xy(v: float, y: float) -> tuple[float, float]:
        return SERIES_PAD + plot_w * (v - lo) / (hi - lo), SERIES_PAD + plot_h - plot_h * y / top

    pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(v, y) for v, y in d.curve))
    x0, base = xy(lo, 0.0)
    x1, _ = xy(hi, 0.0)
    parts.append(f'<polygon fill="{OURS_FILL}" fill-opacity="0.35" stroke="{OURS_FILL}" stroke-width="1.5" '
                 f'points="{x0:.1f},{base:.1f} {pts} {x1:.1f},{base:.1f}"><title>density, bandwidth '
                 f"{escape(value_text(d.bandwidth, metric))} {escape(printable(metric))}</title></polygon>")
    for v in values:
        tx, _ = xy(v, 0.0)
        parts.append(f'<line x1="{tx:.1f}" y1="{base:.1f}" x2="{tx:.1f}" y2="{base + 6:.1f}" stroke="#333"/>')
    for p in d.peaks:
        px, _ = xy(p, 0.0)
        parts.append(f'<line x1="{px:.1f}" y1="{SERIES_PAD:.1f}" x2="{px:.1f}" y2="{base:.1f}" stroke="{LINE_STROKE}" '
                     f'stroke-dasharray="3,2"><title>peak at {escape(value_text(p, metric))} '
                     f"{escape(printable(metric))}</title></line>")
    for v in (lo, hi):
        tx, _ = xy(v, 0.0)
        parts.append(f'<text x="{tx:.1f}" y="{base + 18:.1f}" text-anchor="{"start" if v == lo else "end"}">'
                     f"{escape(value_text(v, metric))}</text>")
    parts.append(f'<text x="{SERIES_W / 2:.0f}" y="{SERIES_H - 6}" text-anchor="middle">'
                 f"{escape(printable(metric))} (guest)</text></svg>")
    return "\n".join(parts)


def timeline_svg(profile: str, test: str, samples: Sequence[Sample]) -> str:
    """An inline SVG of a series over time: the guest's number per repeat (blue dots) and the bare-metal one (grey)."""
    metric = samples[0].metric
    values = [x.value for x in samples] + [x.baseline for x in samples if x.baseline is not None]
    top = max(values) * 1.1 or 1.0
    t0, t1 = min(x.started_at for x in samples), max(x.started_at for x in samples)
    plot_w, plot_h = SERIES_W - 2 * SERIES_PAD, SERIES_H - 2 * SERIES_PAD

    def xy(t: float, v: float) -> tuple[float, float]:
        x = SERIES_PAD + (plot_w * (t - t0) / (t1 - t0) if t1 > t0 else plot_w / 2)
        return x, SERIES_PAD + plot_h - plot_h * v / top

    parts = _svg_open(f"{profile} {test}: {len({x.run_id for x in samples})} repeats over time ({metric})")
    parts.append(f'<line x1="{SERIES_PAD}" y1="{SERIES_PAD + plot_h}" x2="{SERIES_PAD + plot_w}" '
                 f'y2="{SERIES_PAD + plot_h}" stroke="#333"/>'
                 f'<text x="{SERIES_PAD - 4}" y="{SERIES_PAD + 4}" text-anchor="end">{escape(value_text(top, metric))}'
                 f'</text><text x="{SERIES_PAD - 4}" y="{SERIES_PAD + plot_h}" text-anchor="end">0</text>')
    for x_ in samples:
        if x_.baseline is not None:
            bx, by = xy(x_.started_at, x_.baseline)
            parts.append(f'<circle cx="{bx:.1f}" cy="{by:.1f}" r="3" fill="{PAPER_FILL}"/>')
        gx, gy = xy(x_.started_at, x_.value)
        who = f", guest {x_.instance}" if x_.instance is not None else ""
        parts.append(f'<circle cx="{gx:.1f}" cy="{gy:.1f}" r="3.5" fill="{OURS_FILL}"><title>run #{x_.run_id}{who}: '
                     f"{escape(value_text(x_.value, metric))} {escape(printable(metric))}</title></circle>")
    minutes = (t1 - t0) / 60.0
    parts.append(f'<text x="{SERIES_W / 2:.0f}" y="{SERIES_H - 6}" text-anchor="middle">'
                 f"time: {minutes:.1f} min from the first repeat to the last</text></svg>")
    return "\n".join(parts)


SWEEP_W, SWEEP_H, SWEEP_PAD = 620, 330, 56
LINE_STROKE = "#b03a2e"


def sweep_svg(sweep: SweepEvidence) -> str:
    """An inline SVG of the sweep: each sample's total seconds against its image's size in GB (blue dots, a title
    each) and the fitted line (red) across the sizes; the qualifiers (emulated, nested, quick, ...) in its heading."""
    samples = sweep.samples
    line = sweep_fit(sweep)
    fitted = line if isinstance(line, Fit) else None
    right = max(x.size_gb for x in samples) * 1.08
    ys = [x.total_s for x in samples] + ([fitted.at(0.0), fitted.at(right)] if fitted else [])
    top = max(max(ys) * 1.1, 1e-3)
    bottom = min(0.0, min(ys) * 1.1)
    plot_w, plot_h = SWEEP_W - 2 * SWEEP_PAD, SWEEP_H - 2 * SWEEP_PAD

    def xy(gb: float, sec: float) -> tuple[float, float]:
        return (SWEEP_PAD + plot_w * gb / right, SWEEP_PAD + plot_h - plot_h * (sec - bottom) / (top - bottom))

    quals = sweep_qualifiers(samples)
    heading = f"{sweep.profile}: total seconds against image size" + (f" ({', '.join(quals)})" if quals else "")
    x0, y0 = xy(0.0, bottom)
    x1, _ = xy(right, bottom)
    _, ytop = xy(0.0, top)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{SWEEP_W}" height="{SWEEP_H}" '
             f'viewBox="0 0 {SWEEP_W} {SWEEP_H}" role="img" font-family="sans-serif" font-size="11">',
             f"<title>{escape(printable(heading))}</title>",
             f'<text x="{SWEEP_PAD}" y="18">{escape(printable(heading))}</text>',
             f'<line x1="{x0:.1f}" y1="{y0:.1f}" x2="{x1:.1f}" y2="{y0:.1f}" stroke="#333"/>',
             f'<line x1="{x0:.1f}" y1="{y0:.1f}" x2="{x0:.1f}" y2="{ytop:.1f}" stroke="#333"/>']
    for frac in (0.0, 0.5, 1.0):
        gb = right / 1.08 * frac
        tx, _ = xy(gb, bottom)
        parts.append(f'<text x="{tx:.1f}" y="{y0 + 14:.1f}" text-anchor="middle">{gb:.3g}</text>')
        sec = bottom + (top - bottom) * frac
        _, ty = xy(0.0, sec)
        parts.append(f'<text x="{x0 - 4:.1f}" y="{ty + 4:.1f}" text-anchor="end">{sec:.3g}</text>')
    if bottom < 0:
        _, zy = xy(0.0, 0.0)
        parts.append(f'<line x1="{x0:.1f}" y1="{zy:.1f}" x2="{x1:.1f}" y2="{zy:.1f}" stroke="#bbb" '
                     'stroke-dasharray="3 3"/>')
    if fitted is not None:
        (lx0, ly0), (lx1, ly1) = xy(0.0, fitted.at(0.0)), xy(right, fitted.at(right))
        words = f"fit: {_secs(fitted.intercept_s)} s + {fitted.slope_s_per_gb:.3g} s/GB x size"
        parts.append(f'<line x1="{lx0:.1f}" y1="{ly0:.1f}" x2="{lx1:.1f}" y2="{ly1:.1f}" stroke="{LINE_STROKE}" '
                     f'stroke-width="1.5"><title>{escape(words)}</title></line>')
        parts.append(f'<text x="{SWEEP_W - SWEEP_PAD}" y="34" text-anchor="end" fill="{LINE_STROKE}">'
                     f"{escape(words)}</text>")
    else:
        parts.append(f'<text x="{SWEEP_W - SWEEP_PAD}" y="34" text-anchor="end" fill="#777">no line: '
                     f"{escape(printable(str(line)))}</text>")
    weak = [x for x in samples if {"emulated", "nested"} & set(x.qualifiers)]
    if weak:
        parts.append(f'<text x="{SWEEP_PAD}" y="34" fill="#555">hollow dots: emulated or nested samples</text>')
    for x in samples:
        cx, cy = xy(x.size_gb, x.total_s)
        note = f" ({', '.join(x.qualifiers)})" if x.qualifiers else ""
        paint = (f'fill="none" stroke="{OURS_FILL}" stroke-width="1.5"' if x in weak
                 else f'fill="{OURS_FILL}" fill-opacity="0.75"')
        parts.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="3.5" {paint}>'
                     f"<title>run #{x.run_id}: {escape(propagation.size_text(x.size_bytes))}, total "
                     f"{_secs(x.total_s)} s (copy {_secs(x.copy_s)} s, boot {_secs(x.boot_s)} s)"
                     f"{escape(note)}</title></circle>")
    parts.append(f'<text x="{(x0 + x1) / 2:.0f}" y="{SWEEP_H - 12}" text-anchor="middle">image size (GB)</text>'
                 f'<text x="14" y="{(y0 + ytop) / 2:.0f}" text-anchor="middle" '
                 f'transform="rotate(-90 14 {(y0 + ytop) / 2:.0f})">seconds to the guest\'s agent</text></svg>')
    return "\n".join(parts)


FORMATS = {"md": to_markdown, "html": to_html}


# ------------------------------------------------------------------------------------------ IOzone's sweeps
IOZ_W, IOZ_H, IOZ_PAD, IOZ_LEGEND = 470, 260, 48, 112
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
    plot_w, plot_h = IOZ_W - IOZ_PAD - IOZ_LEGEND - 10, IOZ_H - 2 * IOZ_PAD
    lo, hi = (math.log2(files[0]), math.log2(files[-1])) if files else (0.0, 0.0)

    def xy(kib: int, v: float) -> tuple[float, float]:
        f = (math.log2(kib) - lo) / (hi - lo) if hi > lo else 0.5
        return IOZ_PAD + plot_w * f, IOZ_PAD + plot_h - plot_h * v / top

    y0 = IOZ_PAD + plot_h
    parts = [*_svg_open(f"{heading}: MB/s by file size", IOZ_W, IOZ_H),
             f'<text x="{IOZ_PAD}" y="16">{escape(printable(heading))}</text>',
             f'<line x1="{IOZ_PAD}" y1="{y0}" x2="{IOZ_PAD + plot_w}" y2="{y0}" stroke="#333"/>',
             f'<line x1="{IOZ_PAD}" y1="{IOZ_PAD}" x2="{IOZ_PAD}" y2="{y0}" stroke="#333"/>']
    for frac in (0.0, 0.5, 1.0):
        parts.append(f'<text x="{IOZ_PAD - 4}" y="{y0 - plot_h * frac + 4:.1f}" text-anchor="end">'
                     f"{top * frac:g}</text>")
    step = max(1, math.ceil(len(files) / 6))  # at most six labels under the axis
    for kib in files[::step]:
        x, _ = xy(kib, 0.0)
        parts.append(f'<text x="{x:.1f}" y="{y0 + 14}" text-anchor="middle">{iozone.kib_text(kib)}</text>')
    for i, (label, colour, pts) in enumerate(lines):
        where = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(k, v) for k, v in pts))
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{where}">'
                     f"<title>{escape(label)}</title></polyline>")
        for k, v in pts:
            x, y = xy(k, v)
            parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2" fill="{colour}"><title>{escape(label)}, '
                         f"{iozone.kib_text(k)} file: {value_text(v, 'MB/s')} MB/s</title></circle>")
        ly = IOZ_PAD + 14 * i
        parts.append(f'<line x1="{IOZ_W - IOZ_LEGEND}" y1="{ly - 3}" x2="{IOZ_W - IOZ_LEGEND + 14}" y2="{ly - 3}" '
                     f'stroke="{colour}" stroke-width="2"/><text x="{IOZ_W - IOZ_LEGEND + 18}" y="{ly}">'
                     f"{escape(label)}</text>")
    if not lines:
        parts.append(f'<text x="{IOZ_PAD + plot_w / 2:.0f}" y="{IOZ_PAD + plot_h / 2:.0f}" text-anchor="middle" '
                     'fill="#777">nothing stored</text>')
    mid = IOZ_PAD + plot_h / 2
    parts.append(f'<text x="{IOZ_PAD + plot_w / 2:.0f}" y="{IOZ_H - 10}" text-anchor="middle">file size (log2 scale)'
                 f'</text><text x="12" y="{mid:.0f}" text-anchor="middle" transform="rotate(-90 12 {mid:.0f})">MB/s'
                 "</text></svg>")
    return "\n".join(parts)


def iozone_figure(ev: Evidence, cell: Cell) -> str:
    """An IOzone sweep's cell as two plots, bare metal's and the guest's (each on its own scale), their qualifiers in
    their headings as the tables write them, and a caption."""
    base_q = host_qualifiers([cell.baseline.labels] if cell.baseline else [], cell.qualifiers)
    what = ("the write pass, a line per record size" if cell.test in catalogue.IOZONE_GRIDS
            else "a line per pass")
    base = dict(cell.baseline_figures)
    svgs = [iozone_svg(_with(f"{cell.profile}, bare metal", base_q), iozone_lines(cell.test, base)),
            iozone_svg(_with(f"{cell.profile}, guest", cell.qualifiers), iozone_lines(cell.test, _figures(cell.guest)))]
    return (f"<figure>{''.join(svgs)}<figcaption>{escape(printable(cell.profile))}, {escape(cell.test)} (run "
            f"#{cell.run_id}): IOzone's MB/s against file size, {what}; bare metal (left) and the guest (right) each "
            "on its own scale.</figcaption></figure>")
