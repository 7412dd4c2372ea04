"""A study's report in Markdown: its rows with what each does otherwise than the study, its tables in the paper's
layout with the paper's number beside ours in every cell, ours with its interval and n where its samples give one
(and, when the study asks for cost, ours per host core and per GiB of guest RAM) and where in the texts each
published figure comes from, then for a study with an
image-propagation sweep (B) its samples per image size and the line fitted through them, for a series study (D) the
spread of its repeats, then each finding with its verdict, the reason and its source, and the texts the sources
name.

Made only from stored runs (`evidence.gather`), so it can be regenerated and exported at any time; it carries no
time of its own, only the runs it used. Our numbers measured where they cannot stand for the paper's (emulated,
nested, quick size, warm cache, a changed profile, a loop device) carry the reason in brackets, and the
findings resting on them are inconclusive (verdicts.evaluate_rule).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

from ..bench import bonnie, iozone, propagation
from ..bench.propagation import Fit, NoFit
from ..inputs import printable
from ..record.fairness import spread
from ..spec import catalogue
from ..spec.catalogue import is_storage_test, test_title
from .cells import Cell, Measured, figures
from .evidence import Evidence
from .imagesweep import sweep_fit
from .schema import NATIVE, PaperCell, Study, is_iozone_sweep, needs_node
from .series import MIN_PEAK_SAMPLES, Density, Sample, SeriesStats, bins, density, series_stats
from .verdicts import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, Verdict
from .wording import (
    host_qualifiers,
    n_text,
    ours_text,
    paper_text,
    published_text,
    qualified,
    ratio_text,
    sample_qualifiers,
    secs_text,
    sweep_qualifiers,
    value_text,
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


def _row(cells: Sequence[object]) -> str:
    return "| " + " | ".join(_md(x) for x in cells) + " |"


def _table_head(study: Study, test: str, metric: str) -> list[str]:
    """A test's heading (the paper's table title, the test in words) and its table's header: the numbers, then the
    cost columns when the study asks for them, the host columns for a storage test, the run."""
    title = next(t.table for t in study.tests if t.id == test)
    differs = study.test_differs(test)
    head = ["configuration", "profile", f"paper {metric}", f"ours {metric}", "paper % of native", "ours % of native"]
    if study.cost:
        head += [f"ours {metric} per host core", f"ours {metric} per GiB guest RAM"]
    if is_storage_test(test):
        head += ["avgrq paper / ours", "avgqu paper / ours", "util % paper / ours"]
    head += ["n", "run"]
    return [f"## {_md(title)}", "", f"`{test}`: {_md(test_title(test))}", "",
            *([f"What differs from the study's method: {_md(differs)}", ""] if differs else []),
            "| " + " | ".join(head) + " |",
            "|" + "|".join("---" if i < 2 or i == len(head) - 1 else "---:" for i in range(len(head))) + "|"]


def _bare_metal_row(study: Study, test: str, cells: Sequence[Cell], metric: str) -> list[str]:
    """The table's bare-metal row: the paper's, and ours as the mean baseline of the runs the guest cells come
    from."""
    paper_native = study.paper_cell(NATIVE, test)
    native, native_runs = native_row(cells)
    native_q = host_qualifiers([native.labels] if native else [])
    many = {c.guests for c in cells if c.baseline is not None and c.guests > 1}
    native_q += [f"sum of {n} processes" for n in sorted(many)]  # a series' runs of N guests: N at once
    row = ["none, bare metal", "-", published_text(paper_native.value if paper_native else None),
           qualified(value_text(native.value if native else None, metric), native_q), "100" if paper_native else "-",
           "100" if native else "-"]
    if study.cost:
        row += [qualified(value_text(native_per_core(cells), metric), native_q), "-"]
    if is_storage_test(test):
        for key in ("avgrq", "avgqu", "util"):
            row.append(f"{published_text(getattr(paper_native, key) if paper_native else None)} / "
                       f"{host_text(key, getattr(native, key) if native else None)}")
    by_run = {c.run_id: c.baseline.n for c in cells if c.baseline is not None}
    row.append(str(sum(by_run.values())) if by_run else "-")  # every bare-metal sample the row's mean rests on
    row.append(_runs(native_runs) if native_runs else "-")
    return row


def _profile_row(ev: Evidence, profile: str, test: str, metric: str, drop: Sequence[str] = ()) -> list[str]:
    """A profile's row: the paper's numbers beside ours and our run, or why there is no run yet; `drop`: the
    qualifiers the table states once under it."""
    study = ev.study
    pc = study.paper_cell(profile, test)
    cell = ev.cells.get((profile, test))
    p_pct, computed = study.paper_percent(profile, test)
    p_pct_text = pct_text(p_pct) if computed or p_pct is None else f"{published_text(p_pct)} (published)"
    if pc is not None and pc.native is not None and p_pct is not None:
        p_pct_text += f" (of {published_text(pc.native)})"
    q = [x for x in cell.qualifiers if x not in drop] if cell else []
    ours = ours_pct = "-"
    if cell is not None:
        ours = ours_text(cell, metric, drop=drop)
        if (r := cell.ratio()) is not None:
            ours_pct = qualified(ratio_text(r), q)
    row = [study.row(profile), f"`{profile}`", paper_text(study, profile, test), ours, p_pct_text, ours_pct]
    if study.cost:
        row += [qualified(value_text(cell.per_host_core(cell.guest.value) if cell else None, metric), q),
                qualified(value_text(cell.guest_per_gib if cell else None, metric), q)]
    if is_storage_test(test):
        for key in ("avgrq", "avgqu", "util"):
            row.append(f"{published_text(getattr(pc, key) if pc else None)} / "
                       f"{host_text(key, getattr(cell.guest, key) if cell else None)}")
    row.append(n_text(cell) if cell else "-")
    row.append(f"#{cell.run_id}" if cell else _missing_note(ev, profile, test))
    return row


def table(ev: Evidence, test: str) -> list[str]:
    """One test's table in the paper's layout: the bare-metal row, then a row per profile in the study's order."""
    study = ev.study
    cells = [ev.cells[(p, test)] for p in study.profile_names if (p, test) in ev.cells]
    metric = cells[0].metric if cells else ("MB/s" if is_storage_test(test) else "Mbit/s")
    out = _table_head(study, test, metric)
    out.append(_row(_bare_metal_row(study, test, cells, metric)))
    # what every guest figure of the table shares is said once under it, not in each cell
    shared = list(cells[0].qualifiers) if len(cells) > 1 and all(c.qualifiers == cells[0].qualifiers
                                                                  for c in cells) else []
    out += [_row(_profile_row(ev, profile, test, metric, shared)) for profile in study.profile_names]
    out.append("")
    if shared:
        out += [f"Every guest figure of ours in this table is {_md(', '.join(shared))} (see the notes on these "
                "words below).", ""]
    out += paper_sources(study, test)
    if test == "bonnie":
        out += bonnie_table(ev, cells)
    if is_iozone_sweep(test):
        out += file_sweep_table(ev, cells)
    return out


def _paper_numbers(c: PaperCell) -> str:
    """A paper cell's numbers in words: "1.3, avgrq 30, avgqu 0.9, util 90"."""
    parts = [published_text(c.value)] if c.value is not None else []
    parts += [f"{k} {published_text(getattr(c, k))}" for k in ("percent", "native", "avgrq", "avgqu", "util")
              if getattr(c, k) is not None]
    return ", ".join(parts)


def paper_sources(study: Study, test: str) -> list[str]:
    """Where the texts print each of the paper's figures of a table, with how any was derived and where the texts
    disagree."""
    cells = [(p, study.paper_cell(p, test)) for p in (NATIVE, *study.profile_names)]
    lines = []
    for profile, c in cells:
        if c is None:
            continue
        row = "bare metal" if profile == NATIVE else f"`{_md(profile)}`"
        text = f"- {row}: {_md(_paper_numbers(c))}, from {_md(c.source)}"
        if c.derived:
            text += f"; derived: {_md(c.derived)}"
        if c.note:
            text += f"; note: {_md(c.note)}"
        lines.append(text)
    return ["Where the paper's figures come from (document:line, see Sources):", "", *lines, ""] if lines else []


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


def _sides(ev: Evidence, cell: Cell) -> list[tuple[str, dict[str, float]]]:
    """A cell's run's figures of the test by metric: bare metal's, then the guest's under the profile's row."""
    return [("bare metal", dict(cell.baseline_figures)), (ev.study.row(cell.profile), figures(cell.guest))]


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


def order_lines(ev: Evidence) -> list[str]:
    """Per study run among the cells' runs: the seed that shuffled its profiles and the order they ran in (a drift
    of the machine over a study run falls on the profiles in that order; each finding's "order" line checks the drift
    within a cell's own samples)."""
    runs: dict[tuple[int, tuple[str, ...]], set[int]] = {}
    untagged: set[int] = set()
    for c in ev.cells.values():
        if c.study_run is None:
            untagged.add(c.run_id)
        else:
            runs.setdefault((c.study_run.seed, c.study_run.order), set()).add(c.run_id)
    if not runs:
        return []
    out = ["Order of the profiles' runs in each study run (shuffled by its seed; `cloudbox study run "
           f"{_md(ev.study.name)} --seed S` runs them in that order again):", ""]
    for (seed, order), ids in runs.items():
        out.append(f"- seed {seed}: {_md(', '.join(order))} (run{'s' if len(ids) > 1 else ''} "
                   f"{', '.join(f'#{i}' for i in sorted(ids))} used here)")
    if untagged:
        out.append(f"- run{'s' if len(untagged) > 1 else ''} {', '.join(f'#{i}' for i in sorted(untagged))}: no "
                   "order recorded (not started by `cloudbox study run`, or by an older cloudbox)")
    return out + [""]


def findings(ev: Evidence) -> list[str]:
    """The findings: a summary table, then each rule with its verdict, the reason and why its threshold is there."""
    if not ev.verdicts:
        return ["## Findings", "", "This study states no findings as rules.", ""]
    counts = {s: sum(1 for v in ev.verdicts if v.status == s) for s in (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE)}
    out = ["## Findings", "", ", ".join(f"{n} {s}" for s, n in counts.items()) + ".", "",
           "| finding | rule | paper | ours | verdict |", "|---|---|---:|---:|---|"]
    for v in ev.verdicts:
        paper = v.figure(v.paper) + (" (computed)" if v.paper_computed else "")
        out.append(f"| {_md(v.rule.id)} | {_md(v.rule.statement())} | {_md(paper)} | {_md(v.ours_text(brief=True))} | "
                   f"**{v.status}** |")
    out.append("")
    for v in ev.verdicts:
        out += [f"### {_md(v.rule.id)}: {v.status}", "", _md(v.rule.finding), "",
                f"- rule: {_md(v.rule.statement())}",
                f"- verdict: {_md(v.explain())}",
                *[f"- order: {_md(line)}" for line in drift_lines(ev, v)],
                *([f"- source: {_md(v.rule.source)}"] if v.rule.source else []),
                f"- runs: {', '.join(f'#{i}' for i in v.run_ids) or 'none'}",
                f"- why this threshold: {_md(v.rule.why)}", ""]
    return out


def drift_lines(ev: Evidence, v: Verdict) -> list[str]:
    """For each cell a verdict rests on whose guest side has 6 samples or more, whether they drifted between their
    first and second half in measured order (stats.drift): an order effect the interval does not show."""
    keys = [(v.rule.profile, v.rule.test), *([v.rule.other] if v.rule.other else [])]
    return [f"{profile}/{test}: {d.text()}" for profile, test in keys
            if (c := ev.cells.get((profile, test))) is not None and (d := c.drift()) is not None]


def intro(ev: Evidence) -> list[str]:
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
           "",
           "Each of our numbers is the median of its run's samples, in brackets its 95% interval where there are "
           "enough samples (6 for a number; a percentage's interval from 2 + 2, marked with its coverage below "
           "4 + 4); \"n\" counts the samples, guest + bare metal. A figure measured once (n=1+1) has no interval: "
           "its verdict rests on that one figure and says so. A finding is reproduced when our whole interval lies "
           "on its side of the threshold, not reproduced when it lies wholly on the other, inconclusive when it "
           "straddles.", ""]
    if study.cost:
        out += ["Cost columns: each number divided by the physical cores of the host that ran it, as its run "
                "recorded them, and the guest's by its RAM in GiB, from the profile stored with its run; the "
                "bare-metal row has no guest RAM. \"-\" where a run did not record its host's cores.", ""]
    legend = _legend(ev)
    out += ["Runs used:", "", *legend, "", *order_lines(ev)] if legend else ["No stored run matches this study yet "
                                                           f"(`cloudbox study run {study.name}`).", ""]
    return out + configurations(study)


def configurations(study: Study) -> list[str]:
    """The study's rows: each profile beside the paper's words for it and what it does otherwise than the study's
    configuration, and why."""
    out = ["## Configurations", "",
           "Each row's profile beside what it does otherwise than the study's own configuration, and why (not "
           "possible here, or a deliberate modern default); \"-\" where the profile is the study's configuration as "
           "far as its texts describe it.", "",
           "| configuration | profile | what differs from the study, and why |", "|---|---|---|"]
    out += [_row([p.row, f"`{p.name}`", p.differs or "-"]) for p in study.profiles]
    return out + [""]


def sources(ev: Evidence) -> list[str]:
    """The texts the study file's sources point into, by number."""
    study = ev.study
    if not study.documents:
        return []
    out = ["## Sources", "",
           "A source such as 000:294 is line 294 of document 000 (its plain text, lines counted from 1); the "
           "documents of this study:", ""]
    out += [f"- {_md(doc)}: {_md(ref)}" for doc, ref in study.documents.items()]
    return out + [""]


def notes(ev: Evidence) -> list[str]:
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


def density_words(d: Density, metric: str) -> str:
    """One line for the Markdown report: the bandwidth and where the curve peaks."""
    texts = [value_text(p, metric) for p in d.peaks]
    where = " and ".join([", ".join(texts[:-1]), texts[-1]] if len(texts) > 1 else texts)
    peaks = f"one peak, at {where}" if len(d.peaks) == 1 else f"{len(d.peaks)} peaks, at {where}"
    minor = "" if not d.minor else (
        f" ({d.minor} smaller {'bump' if d.minor == 1 else 'bumps'} of fewer than {MIN_PEAK_SAMPLES} samples "
        "not named as peaks)")
    return (f"Density (Gaussian kernel, bandwidth {value_text(d.bandwidth, metric)} {metric} by Silverman's rule): "
            f"{peaks} {metric}{minor}.")


def series_rows(ev: Evidence) -> list[tuple[str, str, list[Sample], SeriesStats]]:
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
    rows = series_rows(ev)
    if not rows:
        return out + [f"No repeats stored yet (`cloudbox study run {study.name}`).", ""]
    out += ["| profile | test | repeats | median | p5 | p95 | CV | range | bare-metal median | from - to |",
            "|---|---|---:|---:|---:|---:|---:|---|---:|---|"]
    out += [_spread_row(study, profile, test, samples, st) for profile, test, samples, st in rows]
    out.append("")
    out += _between_guests(rows)
    for profile, test, samples, _st in rows:
        out += _histogram(profile, test, samples)
    return out


def _spread_row(study: Study, profile: str, test: str, samples: Sequence[Sample], st: SeriesStats) -> str:
    """A cell's row of the variability table: its repeats, the guest's distribution, bare metal's median, when."""
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
    return (f"| {_md(profile)} | {_md(test)} | {repeats}{want} ({_md(samples[0].size_label)}{each}) | "
            f"{_md(qualified(value_text(st.median, metric), quals))} {_md(metric)} | "
            f"{value_text(st.p5, metric)} | {value_text(st.p95, metric)} | {cv} | "
            f"{value_text(st.low, metric)} - {value_text(st.high, metric)} | "
            f"{_md(qualified(value_text(base.median if base else None, metric), base_quals))} | {span} |")


def _histogram(profile: str, test: str, samples: Sequence[Sample]) -> list[str]:
    """A cell's text histogram over its samples, and its density's peaks in words."""
    metric = samples[0].metric
    hist = bins([x.value for x in samples])
    top = max(n for _, _, n in hist)
    ids = list(dict.fromkeys(x.run_id for x in samples))
    per = f", {len(samples) // len(ids)} guests each" if len(samples) > len(ids) else ""
    out = [f"Histogram of {_md(profile)} {_md(test)} ({_md(metric)}, runs "
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


def _rate(v: float | None) -> str:
    return "-" if v is None else (f"{v:.0f}" if v >= 100 else f"{v:.3g}")


def fit_lines(line: Fit, quals: Sequence[str]) -> list[str]:
    """The fitted line in words, its qualifiers after its heading."""
    rate = line.mbps
    slope = (f"- slope: {line.slope_s_per_gb:.3g} s per GB, that is {_rate(rate)} MB/s" if rate is not None else
             f"- slope: {line.slope_s_per_gb:.3g} s per GB: time does not grow with the image's size here, so it "
             "implies no transfer rate")
    r2 = "- (every total is the same)" if line.r2 is None else f"{line.r2:.3f}"
    return [qualified("Fitted line", quals) + ", least squares over every sample (sizes in GB of 10^9 bytes, rates in "
            "MB of 10^6):", "",
            f"- total = {secs_text(line.intercept_s)} s + {line.slope_s_per_gb:.3g} s/GB × size",
            f"- intercept: {secs_text(line.intercept_s)} s, what provisioning costs whatever the image's size "
            "(finding B1)",
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
                   f"{_md(qualified(secs_text(statistics.median(totals)), sweep_qualifiers(xs)))} | "
                   f"{secs_text(statistics.fmean(totals))} | {secs_text(copy)} | "
                   f"{secs_text(statistics.median(x.boot_s for x in xs))} | "
                   f"{_rate(size / copy / 1e6 if copy > 0 else None)} | {runs} |")
    out.append("")
    line = sweep_fit(sweep)
    if isinstance(line, NoFit):
        return out + [f"No line is fitted: {_md(line)}.", ""]
    return out + fit_lines(line, sweep_qualifiers(sweep.samples))


def to_markdown(ev: Evidence) -> str:
    """The whole report."""
    out = intro(ev)
    for test in ev.study.test_ids:
        out += table(ev, test)
    out += sweep_section(ev) + variability(ev) + findings(ev) + notes(ev) + sources(ev)
    return "\n".join(out).rstrip("\n") + "\n"
