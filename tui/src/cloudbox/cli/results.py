"""`cloudbox results`: list, show, compare, export and delete stored benchmark runs.

    cloudbox results list [--state S] [--profile P] [--limit N] [--json]
    cloudbox results show RUN [--json] [--raw]
    cloudbox results compare RUN [RUN...] [--format text|md|csv|json]
    cloudbox results export [RUN...] [--format json|csv|md] [--raw] [-o FILE]
    cloudbox results delete RUN

RUN is a run id or a (prefix of a) run uuid. `--db PATH` (before the subcommand) reads another
results database than paths.results_db(). Handlers return exit codes: 0 ok, 1 on a CloudboxError
(message on stderr), 2 on usage errors (argparse).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from cloudbox.cli.common import guard, usage
from cloudbox.core import paths
from cloudbox.core.errors import CloudboxError, NotFound, UsageError
from cloudbox.core.inputs import printable
from cloudbox.core.record.results import ResultStore
from cloudbox.core.record.rows import STATES, Run
from cloudbox.core.views import compare, labels, render, rundetail


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `results` on a parent's add_subparsers() object; every leaf sets args.func."""
    p = subparsers.add_parser(
        "results", help="list, show, compare and export stored runs",
        description="Stored benchmark runs: list, show, compare (Study A's Table 1/2 layout), "
        "export, delete.",
    )
    p.add_argument("--db", type=Path, default=None,
                   help="results database (default: the state dir's results.db)")
    p.set_defaults(func=usage(p))
    sub = p.add_subparsers(dest="results_command", metavar="COMMAND")

    ls = sub.add_parser("list", help="runs, newest first, with headline numbers")
    ls.add_argument("--state", choices=STATES, help="only runs in this state")
    ls.add_argument("--profile", help="only runs of this profile")
    ls.add_argument("--limit", type=int, default=None, help="at most N runs")
    ls.add_argument("--json", action="store_true", help="JSON list of run summaries")
    ls.set_defaults(func=guard(cmd_list))

    show = sub.add_parser("show", help="one run: configuration, provenance and its table")
    show.add_argument("run", metavar="RUN", help="run id or uuid (prefix)")
    show.add_argument("--json", action="store_true", help="the whole run as JSON")
    show.add_argument("--raw", action="store_true", help="include the tools' raw output")
    show.set_defaults(func=guard(cmd_show))

    cmp = sub.add_parser("compare", help="runs side by side against each run's own bare-metal baseline")
    cmp.add_argument("runs", metavar="RUN", nargs="+", help="run ids or uuids")
    cmp.add_argument("--format", choices=("text", "md", "csv", "json"), default="text",
                     help="text (default), Markdown, CSV or JSON")
    cmp.set_defaults(func=guard(cmd_compare))

    exp = sub.add_parser("export", help="write runs (all when none given) as JSON, CSV or markdown")
    exp.add_argument("runs", metavar="RUN", nargs="*", help="run ids or uuids (default: every run)")
    exp.add_argument("--format", choices=("json", "csv", "md"), default="json")
    exp.add_argument("--raw", action="store_true", help="JSON: include the tools' raw output")
    exp.add_argument("-o", "--output", type=Path, help="write to FILE instead of standard output")
    exp.set_defaults(func=guard(cmd_export))

    rm = sub.add_parser("delete", help="delete a run with its measurements, samples and events")
    rm.add_argument("run", metavar="RUN", help="run id or uuid")
    rm.set_defaults(func=guard(cmd_delete))
    return p


def _store(args: argparse.Namespace, *, writes: bool = False) -> AbstractContextManager[ResultStore]:
    """The results database: the state dir's, or `--db`'s, which is only read (ResultStore.reading) unless the
    command `writes`."""
    db = getattr(args, "db", None)
    if db is not None and not Path(db).is_file():
        raise NotFound(f"--db {printable(str(db))}: no such results database; allowed: an existing results.db "
                       f"(default: {paths.results_db()})")
    return ResultStore(db) if db is None or writes else ResultStore.reading(db)


def _mbps(v: float | None, pct: float | None, n: int = 1) -> str:
    """A headline figure: "55.0 (50%)"; the median of repeats says of how many: "73.8 (96%) n=8"."""
    if v is None:
        return "-"
    return (f"{v:.1f} ({pct:.0f}%)" if pct is not None else f"{v:.1f}") + (f" n={n}" if n > 1 else "")


def _alive(store: ResultStore, run: Run) -> bool:
    return run.state != "running" or run.id in {r.id for r in store.active_runs()}


# -- list -------------------------------------------------------------------------------------------


def cmd_list(args: argparse.Namespace) -> int:
    """Runs newest first: id, start, state, profile, accelerator, headline write/read/TCP numbers."""
    with _store(args) as store:
        store.reap_dead_runs()  # a run whose executor is gone is aborted from now on, however it is looked at
        runs = store.list_runs(state=args.state, profile=args.profile, limit=args.limit)
        active = {r.id for r in store.active_runs()} if any(r.state == "running" for r in runs) else set()
    summaries = []
    for r in runs:
        s = compare.run_summary(r)
        s["executor_alive"] = (r.id in active) if r.state == "running" else None
        summaries.append(s)
    if args.json:
        print(json.dumps(summaries, indent=2, default=str))
        return 0
    if not runs:
        print("no runs" + (f" in state {args.state}" if args.state else "") + (
            f" of profile {args.profile}" if args.profile else ""))
        return 0
    header = ["ID", "STARTED", "STATE", "PROFILE", "ACCEL", "WRITE MB/s", "READ MB/s", "TCP Mb/s"]
    rows = []
    marks: set[str] = set()
    for s in summaries:
        state = s["state"]
        if state == "running" and not s["executor_alive"]:
            state += "?"
            marks.add("?")
        accel = s["accelerator"] or "-"
        if s["emulated"]:
            accel += labels.EMULATED_MARK
            marks.add(labels.EMULATED_MARK)
        profile = s["profile"] or "-"
        if len(profile) > 16:
            profile = profile[:15] + "~"
        tcp = "-" if s["tcp_stream_mbits"] is None else f"{s['tcp_stream_mbits']:.0f}"
        if s["tcp_stream_n"] > 1:
            tcp += f" n={s['tcp_stream_n']}"
        rows.append([
            str(s["id"]), rundetail.when(s["started_at"]), state, profile, accel,
            _mbps(s["seq_write_mbps"], s["seq_write_pct"], s["seq_write_n"]),
            _mbps(s["seq_read_mbps"], s["seq_read_pct"], s["seq_read_n"]), tcp,
        ])
        if any(s[f"{k}_n"] > 1 for k in ("seq_write", "seq_read", "tcp_stream")):
            marks.add("n")
    numeric = {0, 5, 6, 7}
    rows = [[printable(c) for c in r] for r in rows]
    widths = [max(len(x[i]) for x in [header, *rows]) for i in range(len(header))]
    for line in [header, *rows]:
        print(" ".join(c.rjust(widths[i]) if i in numeric else c.ljust(widths[i]) for i, c in enumerate(line))
              .rstrip())
    if labels.EMULATED_MARK in marks:
        print(labels.EMULATED_NOTE if not any(r.accelerator == "nested-kvm" for r in runs)
              else labels.NESTED_NOTE)
    if "?" in marks:
        print("? still marked running, but its executor process is gone (it will be marked aborted)")
    print("(%) = guest as % of the bare-metal baseline measured in the same run")
    if "n" in marks:
        print("n=k: the median of k repeats (results show gives its interval and samples)")
    return 0


# -- show -------------------------------------------------------------------------------------------


def cmd_show(args: argparse.Namespace) -> int:
    """One run: configuration, provenance summary, its table; --raw adds tool output."""
    with _store(args) as store:
        store.reap_dead_runs()
        run = store.get_run(store.resolve(args.run), raw=args.raw)
        if args.json:
            print(render.to_json([run], raw=args.raw), end="")
        else:
            print(rundetail.run_detail(run, store.samples(run.id), executor_alive=_alive(store, run), raw=args.raw),
                  end="")
    return 0


# -- compare / export -------------------------------------------------------------------------------


def _render(runs: list[Run], fmt: str, raw: bool = False) -> str:
    if fmt == "json":
        return render.to_json(runs, raw=raw)
    table = compare.compare_table(runs)
    if fmt == "md":
        return render.to_markdown(table)
    if fmt == "csv":
        return render.to_csv(table)
    return render.to_text(table)


def _runs(store: ResultStore, refs: list[str], raw: bool) -> list[Run]:
    ids = list(dict.fromkeys(store.resolve(ref) for ref in refs))
    return [store.get_run(i, raw=raw) for i in ids]


def cmd_compare(args: argparse.Namespace) -> int:
    """Runs side by side, each against its own baseline."""
    with _store(args) as store:
        runs = _runs(store, args.runs, raw=False)
    print(_render(runs, args.format), end="")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """Runs (all when none named, oldest first) as JSON, CSV or markdown, to stdout or -o FILE."""
    with _store(args) as store:
        if args.runs:
            runs = _runs(store, args.runs, raw=args.raw)
        else:
            runs = list(reversed(store.list_runs(raw=args.raw)))
    text = _render(runs, args.format, raw=args.raw)
    if args.output is None:
        print(text, end="")
        return 0
    if args.output.is_dir():
        raise UsageError(f"-o {printable(str(args.output))}: is a directory; allowed: a file name (the export is "
                            "written there)")
    tmp = args.output.with_name(f".{args.output.name}.tmp{os.getpid()}")
    try:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)
        tmp.replace(args.output)
    except OSError as e:
        raise CloudboxError(f"cannot write {printable(str(args.output))}: {e.strerror or e}") from e
    finally:
        tmp.unlink(missing_ok=True)
    print(f"wrote {len(runs)} run{'s' if len(runs) != 1 else ''} to {args.output}", file=sys.stderr)
    return 0


# -- delete -----------------------------------------------------------------------------------------


def cmd_delete(args: argparse.Namespace) -> int:
    """Delete one run; refused while its executor is still running."""
    with _store(args, writes=True) as store:
        run_id = store.resolve(args.run)
        run = store.get_run(run_id, raw=False)
        if run.state == "running" and _alive(store, run):
            raise CloudboxError(
                f"run #{run_id} is still running (executor pid {run.pid}); stop it before deleting it"
            )
        store.delete_run(run_id)
    print(f"deleted run #{run_id}")
    return 0
