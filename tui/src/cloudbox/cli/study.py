"""`cloudbox study list | show | report | run`: the published studies as checked experiments.

    cloudbox study list [--json]
    cloudbox study show NAME [--json]
    cloudbox study report NAME [--format md|html] [-o FILE] [--size quick|study] [--node N] [--db PATH]
    cloudbox study compare NAME FIRST.db SECOND.db [--size quick|study] [--node N]
    cloudbox study run NAME [--size quick|study] [--node N] [--work-dir D] [--device DEV --destroy NAME]
                            [--agent-timeout S] [--repeats N] [--until-width W] [--max-repeats K] [--boots M]
                            [--every MINUTES] [--guests N] [--seed S] [--again] [--dry-run] [--detach]
    cloudbox study images [--clear]

NAME is a study's name (`A` and `a` are the same) or a study file. `run` measures, one profile after another in an
order shuffled by a seed it prints (--seed S gives an order again; the same executor as `cloudbox run`; with
--detach a sweep), the cells no completed run holds yet, sampled as the study's plan for the size says, for the same
profile hash, size and node, and says which it skips; --repeats, --until-width, --max-repeats and --boots replace
that plan for this run (as `cloudbox run` takes them). A series study (D) runs the repeats still missing, spaced as
its file says (--repeats, --every and --guests change that series); a study with an image-propagation sweep (B)
then runs the sweep's missing samples as one more run.
`compare` puts two measurements of one study side by side (two results databases, e.g. the same quick run on two
evenings): per rule, where each one's interval lies against the threshold, and the rules on opposite sides.
`images` lists the sweep's source images in the image store, `--clear` removes them.
Exit codes: 0 ok; 1 a cloudbox error, a run that did not complete, or (compare) a rule on opposite sides;
2 an invalid study file or option; 130 stopped by Ctrl-C (after the current run cleaned up).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from cloudbox.cli.common import EXIT_INTERRUPTED, guard, usage
from cloudbox.cli.run import Printer
from cloudbox.core.bench import propagation
from cloudbox.core.disks import backing
from cloudbox.core.errors import CloudboxError, StudyError, UsageError
from cloudbox.core.inputs import printable
from cloudbox.core.record.events import LogEvent, RunEvent, counted
from cloudbox.core.record.results import ResultStore
from cloudbox.core.record.runlock import check_not_busy
from cloudbox.core.run import runs
from cloudbox.core.spec.runspec import MAX_GUESTS, option
from cloudbox.core.studies import agreement, evidence, html, loading, planning, schema, verdicts
from cloudbox.core.studies.progress import StudyProgress, step_seconds

# The `cloudbox run` options a study run passes on to each of its runs, declared once in runspec.RUN_OPTIONS.
PASSED_ON = ("work_dir", "device", "destroy", "agent_timeout", "cpu_overcommit")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `study` and its subcommands on an argparse subparsers object."""
    p = subparsers.add_parser(
        "study", help="the published studies: their matrix, a run that fills it, a report with verdicts",
        description="Studies (studies/*.toml): the paper's matrix of profiles and tests, its published numbers "
        "and its findings as rules checked against stored runs.")
    p.set_defaults(func=usage(p))
    sub = p.add_subparsers(dest="study_command", metavar="SUBCOMMAND")
    invalid = (StudyError, UsageError)

    ls = sub.add_parser("list", help="every study: name, title, matrix size, rules")
    ls.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    ls.set_defaults(func=guard(cmd_list, invalid=invalid))

    show = sub.add_parser("show", help="a study's matrix, the paper's numbers and its rules")
    show.add_argument("study", metavar="NAME")
    show.add_argument("--json", action="store_true", help="the validated study as JSON")
    show.set_defaults(func=guard(cmd_show, invalid=invalid))

    rep = sub.add_parser("report", help="the study's tables with the paper's numbers beside ours, and the verdicts")
    rep.add_argument("study", metavar="NAME")
    rep.add_argument("--format", choices=tuple(html.FORMATS), default=None,
                     help="md (Markdown) or html (one page with a figure per table); default: html when FILE ends "
                          "in .html or .htm, else md")
    rep.add_argument("-o", "--output", type=Path, help="write to FILE instead of standard output")
    rep.add_argument("--size", choices=schema.SIZES, default=None,
                     help="only runs of this size (default: the study's sizes, study size first)")
    rep.add_argument("--node", default=None, metavar="NAME", help="only runs on this node")
    rep.add_argument("--db", type=Path, default=None, help="results database (default: the state dir's results.db)")
    rep.set_defaults(func=guard(cmd_report, invalid=invalid))

    cmp = sub.add_parser("compare", help="two measurements of the study side by side: where each rule's interval "
                                         "lies against its threshold, and the rules on opposite sides")
    cmp.add_argument("study", metavar="NAME")
    cmp.add_argument("first", type=Path, metavar="FIRST.db", help="the first measurement's results database")
    cmp.add_argument("second", type=Path, metavar="SECOND.db", help="the second measurement's results database")
    cmp.add_argument("--size", choices=schema.SIZES, default=None, help="only runs of this size (default: as report)")
    cmp.add_argument("--node", default=None, metavar="NAME", help="only runs on this node")
    cmp.set_defaults(func=guard(cmd_compare, invalid=invalid))

    run = sub.add_parser("run", help="measure the study's cells not stored yet, one profile after another")
    run.add_argument("study", metavar="NAME")
    run.add_argument("--size", choices=schema.SIZES, default=None,
                     help="study (2x guest RAM, >= 2 GiB: decides findings) or quick (128 MiB: trying things out; "
                     "its findings are inconclusive); default: the study's first size")
    node = option("node")
    run.add_argument(*node.flags, dest="node", default="", metavar=node.metavar, help=node.help)
    for name in PASSED_ON:
        opt = option(name)
        run.add_argument(*opt.flags, dest=opt.field, type=opt.type, default=opt.default, help=opt.help,
                         metavar=opt.metavar)
    run.add_argument("--repeats", type=int, default=None, metavar="N",
                     help="samples a side of each test instead of the study's plan for the size (as `cloudbox run "
                          "--repeats`); a series study (D): runs per profile instead of its series plan, "
                          f"2..{schema.MAX_REPEATS}")
    for name in ("until_width", "max_repeats", "boots"):
        opt = option(name)
        run.add_argument(*opt.flags, dest=name, type=opt.type, default=None, metavar=opt.metavar,
                         **({"nargs": "?", "const": opt.const} if opt.const is not None else {}),
                         help=f"{opt.help}; instead of the study's plan for the size")
    run.add_argument("--seed", type=int, default=None, metavar="S",
                     help="shuffle the profiles' runs with this seed (default: one drawn and printed); the same seed "
                          "gives the same order")
    run.add_argument("--every", type=float, default=None, metavar="MINUTES",
                     help="a series study (D): minutes between the starts of two repeats instead of the file's "
                          "plan, 0..1440 (0: back to back)")
    run.add_argument("--guests", type=int, default=None, metavar="N",
                     help="a series study (D): guests of each run at once (instances) instead of the file's plan, "
                          f"1..{MAX_GUESTS}; the report's spread is then over time and over instances")
    run.add_argument("--again", action="store_true", help="measure every cell, also those already stored")
    run.add_argument("--dry-run", action="store_true", help="say what would run and what is skipped, run nothing")
    run.add_argument("--detach", "-d", action="store_true",
                     help="run in the background as a sweep (one run after another) and return at once")
    run.set_defaults(func=guard(cmd_run, invalid=invalid))

    im = sub.add_parser("images", help="the image-propagation sweep's source images (made once, reused); --clear "
                                       "removes them")
    im.add_argument("--clear", action="store_true",
                    help="remove every source image (refused while a run is going on this host)")
    im.set_defaults(func=guard(cmd_images, invalid=invalid))
    return p


# -- list / show --------------------------------------------------------------------------------------------------
def cmd_list(args: argparse.Namespace) -> int:
    entries = loading.list_studies()
    if args.json:
        print(json.dumps([{"name": e.name, "path": str(e.path), "title": e.title, "profiles": e.profiles,
                           "tests": e.tests, "rules": e.rules, "problem": e.problem} for e in entries], indent=2))
        return 0
    if not entries:
        print("no studies found (searched: studies/ in the checkout, /usr/share/cloudbox/studies, "
              "CLOUDBOX_STUDY_DIR)", file=sys.stderr)
        return 0
    width = max(len(e.name) for e in entries)
    for e in entries:
        if e.problem is not None:
            text = f"INVALID (cloudbox study show {e.path})"
        else:
            text = (f"{e.title}  [{counted(e.profiles, 'profile')} x {counted(e.tests, 'test')}, "
                    f"{counted(e.rules, 'rule')}]")
        print(printable(f"{e.name:<{width}}  {text}"))
    return 0


def _paper_text(c: schema.PaperCell) -> str:
    parts = [f"{k} {getattr(c, k):g}" for k in ("value", "percent", "native", "avgrq", "avgqu", "util")
             if getattr(c, k) is not None]
    return ", ".join(parts) + f"  [{c.source}]"


def cmd_show(args: argparse.Namespace) -> int:
    study = loading.find_study(args.study)
    if args.json:
        print(json.dumps(study.model_dump(mode="json"), indent=2))
        return 0
    _, unavailable = evidence.profile_facts(study)
    lines = [f"{study.name}: {study.title}", study.description, "",
             f"sizes: {', '.join(study.sizes)} (only {schema.DECISIVE_SIZE} size decides findings)",
             f"suite: {study.suite}"]
    if study.series is not None:
        lines.append("series: " + "; ".join(f"{size}: {plan.words()}" for size in study.sizes
                                            if (plan := study.series_plan(size)) is not None))
    else:
        own = study.plan or schema.Plans()
        lines.append("plan per cell: " + "; ".join(
            f"{size}: {study.repeat_plan(size).words()}" + ("" if getattr(own, size) else " (the default)")
            for size in study.sizes))
    if study.cost:
        lines.append("cost: the report gives each number per host core and per GiB of guest RAM")
    if study.propagation is not None:
        lines.append(f"image-propagation sweep of {study.propagation.profile}: " + "; ".join(
            f"{size}: {sp.words()}" for size in study.sizes if (sp := study.sweep_plan(size)) is not None))
    lines += ["", "profiles (rows):"]
    width = max(len(p) for p in study.profile_names)
    for p in study.profiles:
        note = f"  [not runnable here: {unavailable[p.name]}]" if p.name in unavailable else ""
        lines.append(f"  {p.name:<{width}}  {p.row}{note}")
        if p.differs:
            lines.append(f"  {'':<{width}}  differs: {p.differs}")
    lines += ["", "tests (tables):"]
    width = max(len(t) for t in study.test_ids)
    for t in study.tests:
        note = "  [measured only by runs on a back-end: --node]" if schema.needs_node(t.id) else ""
        lines.append(f"  {t.id:<{width}}  {t.table}{note}")
        if t.differs:
            lines.append(f"  {'':<{width}}  differs: {t.differs}")
    lines += ["", "paper's numbers:"]
    if not study.paper:
        lines.append("  (none per cell" + (": the paper's figures are on the rules)" if study.rules else ")"))
    width = max([len(c.cell) for c in study.paper] or [0])
    for c in study.paper:
        lines.append(f"  {c.cell:<{width}}  {_paper_text(c)}")
        lines += [f"  {'':<{width}}  {k}: {getattr(c, k)}" for k in ("derived", "note") if getattr(c, k)]
    lines += ["", "rules:"]
    if not study.rules:
        lines.append("  (none: the report gives the measurements" + (" and their spread over the series)"
                                                                    if study.series else ")"))
    for r in study.rules:
        paper, computed = verdicts.paper_figure(study, r)
        figure = "" if paper is None else (f"{paper:.1f}%" if r.relative else f"{paper:g}")
        lines += [f"  {r.id}: {r.statement()}" + (f"  (paper: {figure}{', computed' if computed else ''})"
                                                  if figure else ""),
                  f"      {r.finding}", *([f"      source: {r.source}"] if r.source else []), f"      why: {r.why}"]
    if study.documents:
        lines += ["", "sources (a source 000:294 is line 294 of document 000):"]
        lines += [f"  {doc}: {ref}" for doc, ref in study.documents.items()]
    print("\n".join(printable(line) for line in lines))
    return 0


# -- report -------------------------------------------------------------------------------------------------------
def _write(path: Path, text: str) -> None:
    """`text` to `path` through a temporary file that never outlives the command."""
    if path.is_dir():
        raise UsageError(f"-o {printable(str(path))}: is a directory; allowed: a file name (the report is "
                            "written there)")
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)
        tmp.replace(path)
    except OSError as e:
        raise CloudboxError(f"cannot write {printable(str(path))}: {e.strerror or e}") from e
    finally:
        tmp.unlink(missing_ok=True)


def cmd_report(args: argparse.Namespace) -> int:
    study = loading.find_study(args.study)
    fmt = args.format
    if fmt is None:
        fmt = "html" if args.output is not None and args.output.suffix.lower() in (".html", ".htm") else "md"
    with ResultStore.reading(args.db) if args.db is not None else ResultStore() as store:
        ev = evidence.gather(study, store.list_runs(), size=args.size, node=args.node)
        if fmt == "html":  # its host disk figures
            evidence.attach_host_samples(ev, lambda run_id, test: store.samples(run_id, test=test))
    text = html.FORMATS[fmt](ev)
    if args.output is None:
        print(text, end="")
        return 0
    _write(args.output, text)
    counts = evidence.summarize(ev).verdicts
    sweep = f"; {len(ev.sweep.samples)} propagation samples" if ev.sweep is not None else ""
    print(printable(f"wrote {args.output}: {len(ev.cells)} cells from {len({c.run_id for c in ev.cells.values()})} "
                    f"runs{sweep}; " + ", ".join(f"{n} {s}" for s, n in counts.items())), file=sys.stderr)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    study = loading.find_study(args.study)
    found = []
    for path in (args.first, args.second):
        if not path.is_file():
            raise UsageError(f"{path}: no such results database; allowed: a results.db a cloudbox run wrote")
        with ResultStore.reading(path) as store:
            found.append(evidence.gather(study, store.list_runs(), size=args.size, node=args.node))
    pairs = agreement.pair(found[0], found[1])
    names = (str(args.first), str(args.second))
    print(printable(f"study {study.name}: {names[0]} against {names[1]}"))
    for line in agreement.lines(pairs, names):
        print(printable(line))
    return 1 if any(p.opposite for p in pairs) else 0


# -- run ----------------------------------------------------------------------------------------------------------
def cmd_run(args: argparse.Namespace) -> int:
    study = loading.find_study(args.study)
    options = {name: getattr(args, name) for name in PASSED_ON}
    # A bad option stops here, before the results database is opened or any run recorded.
    size = planning.check_run(study, args.size, args.node, **options)
    if study.series is not None and (args.repeats is not None or args.every is not None or args.guests is not None):
        study = planning.with_series_plan(study, size, repeats=args.repeats, every_minutes=args.every,
                                         guests=args.guests)
    elif args.every is not None or args.guests is not None:  # says which studies have a series
        planning.with_series_plan(study, size, every_minutes=args.every, guests=args.guests)
    study = planning.with_repeat_plan(study, size, repeats=None if study.series else args.repeats,
                                      until_width=args.until_width, max_repeats=args.max_repeats, boots=args.boots)
    if args.seed is not None:
        planning.check_seed(args.seed)
    with ResultStore() as store:
        stored = store.list_runs()
        todo = planning.prepare_run(study, stored, size=args.size, node=args.node, again=args.again, seed=args.seed,
                                    **options)
        specs = todo.specs
        for spec in specs:  # the series' guests on this host, before the first run starts
            runs.check_guests_fit(spec)
        print(printable(todo.headline()))
        print("\n".join(printable(line) for line in todo.lines()))
        if args.dry_run:
            return 0
        if not specs:
            print(f"every cell this placement can measure is stored: cloudbox study report {study.name}")
            return 0
        if args.detach:
            sweep = runs.start_sweep(specs, store, offsets=todo.offsets)
            print(f"sweep {sweep.id} started in the background ({len(specs)} runs, one after another"
                  + (f", {todo.series.words()}" if todo.series else "") + "); "
                  "`cloudbox results list` shows each run as it starts, `cloudbox watch RUN` follows it, "
                  f"`cloudbox cancel {sweep.id}` stops it and the rest")
            return 0
        printer = Printer()
        # the cells done and the time left, each step weighed by how long it took in the stored runs here
        progress = StudyProgress(specs, step_seconds(stored, todo.size, args.node or platform.node()), todo.offsets)
        failed = 0
        start = time.time()
        for i, spec in enumerate(specs, 1):
            due = start + (todo.offsets[i - 1] if todo.offsets else 0.0)
            if time.time() < due:
                print(f"\n(next run at {time.strftime('%H:%M:%S', time.localtime(due))}: "
                      f"{todo.series.words() if todo.series else ''}; Ctrl-C stops the series)", flush=True)
                try:
                    runs.wait_until(due, lambda: False)
                except KeyboardInterrupt:
                    print(f"\nstopped before run {i} of {len(specs)}; `cloudbox study run {study.name}` again "
                          "measures the repeats still missing")
                    return EXIT_INTERRUPTED
            what = f"image-propagation sweep, {len(spec.propagate)} samples" if spec.propagation else spec.suite
            print()
            print(printable(f"== study {study.name}: run {i} of {len(specs)}: {spec.profile} ({what})"))
            progress.start_run(i - 1)
            print(printable(f"   {progress.line(study.name)}"))

            def emit(ev: RunEvent) -> None:
                printer(ev)
                if progress.feed(ev):  # a cell is done: where the study stands, as a line of the run's log
                    printer(LogEvent(progress.line(study.name)))

            ex = runs.executor(spec, store, emit=emit)
            try:
                rid = ex.execute()
            except Exception:  # noqa: BLE001 - a bug in one run: recorded and cleaned up, the study goes on
                traceback.print_exc()
                print(printable(f"run {i} of {len(specs)} ({spec.profile}) stopped on an internal error (above); "
                                "the study goes on with the next"), file=sys.stderr)
                failed += 1
                continue
            state = store.get_run(rid, raw=False).state
            failed += state != "completed"
            if ex.cancelled():
                print(f"\nstopped after run #{rid} cleaned up; `cloudbox study run {study.name}` again measures "
                      "what is still missing")
                return EXIT_INTERRUPTED
    print(f"\nstudy {study.name}: {len(specs) - failed} of {len(specs)} runs completed; "
          f"cloudbox study report {study.name}")
    return 0 if not failed else 1


# -- images -------------------------------------------------------------------------------------------------------
def cmd_images(args: argparse.Namespace) -> int:
    if args.clear:
        check_not_busy()  # a sweep in progress copies from them
        removed = propagation.clear_sources()
        freed = sum(x.size_bytes for x in removed)
        print(printable(f"removed {len(removed)} source image(s) from {propagation.store_dir()}"
                        + (f" ({backing.human_size(freed)})" if removed else "")))
        return 0
    found = propagation.list_sources()
    if not found:
        print(printable(f"no source images in {propagation.store_dir()} (a study's image-propagation sweep makes "
                        "them: cloudbox study run b)"))
        return 0
    print(printable(f"{propagation.store_dir()}:"))
    for x in found:
        print(printable(f"  {propagation.size_text(x.size_bytes):>9}  {x.path.name}"
                        + ("" if x.complete else "  (incomplete: the next sweep or --clear removes it)")))
    return 0
