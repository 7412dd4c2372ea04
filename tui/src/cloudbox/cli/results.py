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
import time
from pathlib import Path
from typing import Any, TextIO

from cloudbox.cli.common import guard, usage
from cloudbox.core.errors import CloudboxError
from cloudbox.core.inputs import printable
from cloudbox.core.record.events import counted
from cloudbox.core.record.results import ResultStore
from cloudbox.core.record.rows import STATES, Run
from cloudbox.core.spec.runspec import OVERCOMMIT_LABEL
from cloudbox.core.views import compare, labels, render


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
    cmp.add_argument("--format", choices=("text", "md", "csv", "json"), default="text")
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


def _store(args: argparse.Namespace) -> ResultStore:
    return ResultStore(getattr(args, "db", None))


def _when(t: float | None, long: bool = False) -> str:
    if t is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S" if long else "%m-%d %H:%M", time.localtime(t))


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    h, rem = divmod(s, 3600)
    return f"{h} h {rem // 60:02d} min" if h else f"{rem // 60} min {rem % 60:02d} s"


def _mbps(v: float | None, pct: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.1f} ({pct:.0f}%)" if pct is not None else f"{v:.1f}"


def _alive(store: ResultStore, run: Run) -> bool:
    return run.state != "running" or run.id in {r.id for r in store.active_runs()}


# -- list -------------------------------------------------------------------------------------------


def cmd_list(args: argparse.Namespace) -> int:
    """Runs newest first: id, start, state, profile, accelerator, headline write/read/TCP numbers."""
    with _store(args) as store:
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
        rows.append([
            str(s["id"]), _when(s["started_at"]), state, profile, accel,
            _mbps(s["seq_write_mbps"], s["seq_write_pct"]), _mbps(s["seq_read_mbps"], s["seq_read_pct"]), tcp,
        ])
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
        print("? still marked running, but its executor process is gone (it will be marked failed)")
    print("(%) = guest as % of the bare-metal baseline measured in the same run")
    return 0


# -- show -------------------------------------------------------------------------------------------


def _sampled_devices(store: ResultStore, run: Run) -> list[str]:
    """Each device the host sampler watched during the run: seconds sampled, mean MB/s and utilisation."""
    by: dict[str, list] = {}
    for smp in store.samples(run.id):
        by.setdefault(smp.device or "?", []).append(smp)
    out = []
    for dev, ss in by.items():
        mbps = sum((x.read_mbps or 0) + (x.write_mbps or 0) for x in ss) / len(ss)
        util = sum(x.util or 0 for x in ss) / len(ss)
        out.append(f"{dev} {len(ss)} s, mean {mbps:.1f} MB/s, util {util:.0f}%")
    return out


def _vcpus(vcpus: int, cpus: int) -> str:
    """'3 on 2 host CPUs' (guest vCPUs on host CPUs), saying when the guests had to share them (--cpu-overcommit)."""
    return (f"{vcpus} on {counted(cpus, 'host CPU')}"
            + (f": overcommitted, the guests shared CPUs ({OVERCOMMIT_LABEL})" if vcpus > cpus else ""))


def _show_text(store: ResultStore, run: Run, raw: bool, out: TextIO) -> None:
    p = run.provenance
    state = run.state + (f" ({run.reason})" if run.reason else "")
    if run.state == "running" and not _alive(store, run):
        state += " - executor process gone"
    lines = [
        f"run #{run.id}  {run.uuid}",
        f"  state        {state}",
        f"  profile      {run.profile_name or '-'}"
        + (f"  [{run.profile_hash[:12]}]" if run.profile_hash else ""),
        f"  suite        {run.suite or '-'}  size {run.size_label or '-'}"
        + (f" ({run.size_bytes / 2**30:.1f} GiB)" if run.size_bytes else ""),
        f"  accelerator  {run.accelerator or '-'}"
        + (f"  {labels.EMULATED_MARK} EMULATED: numbers are not overhead figures" if run.emulated else ""),
        f"  VMM/driver   {labels.vmm_label(run)}; {labels.target_label(run)}; {labels.driver_label(run)}",
        f"  node         {run.node or '-'}  pid {run.pid or '-'}",
        f"  started      {_when(run.started_at, True)}  finished {_when(run.finished_at, True)}"
        + (f"  ({_duration(run.duration)})" if run.duration is not None else ""),
    ]
    if p.backing is not None:
        b = p.backing
        desc = ", ".join(f"{k}={v}" for k, v in (("kind", b.kind), ("path", b.path), ("device", b.device),
                                                  ("model", b.model), ("size_bytes", b.size_bytes)) if v is not None)
        if b.count and b.more_paths:
            desc += f", {b.count} disks (size_bytes each), also " + ", ".join(b.more_paths)
        lines.append(f"  backing      {desc}")
    if p.volume is not None:
        v = p.volume
        io = (f"; the server read {v.server_bytes_read} and wrote {v.server_bytes_written} bytes"
              if v.server_bytes_written is not None else "")
        lines.append(f"  volume       {v.scheme}:{v.name} attached by {v.attach}, {v.server}; authentication: "
                     f"{v.tls or 'none'}{io}")
        if v.host_device:
            lines.append(f"  attached     {v.host_device} by {v.initiator}"
                         + (" for the baseline (the guest attached the volume itself)" if v.attach == "guest" else "")
                         + (f"; the disk under the volume ({v.server_device}) sampled beside it" if v.server_device
                            else ""))
        if v.mount:
            lines.append(f"  guest mount  {v.mount}")
        if v.host_mount:  # a back-end's host on the front-end's export, for the baseline
            lines.append(f"  host mount   {v.host_mount}")
        lines.append(f"  baseline     {v.baseline or '-'}")
    per_device = _sampled_devices(store, run)
    # a volume's two ends (the attached device, the disk under it) on one timeline, or a front-end's disk alone
    if len(per_device) > 1 or (p.volume is not None and p.volume.server_device):
        lines.append("  sampled      " + "; ".join(per_device))
    arrays = [(f" of {x.name}", x.raid) for x in p.guests.guests if x.raid] if p.guests else []
    for whose, r in arrays or ([("", p.raid)] if p.raid is not None else []):
        lines.append(f"  {r.where + ' RAID':<13}{r.device}{whose}: RAID {r.level}, {r.chunk_kib} KiB chunks, over "
                     + ", ".join(r.members)
                     + ("; sectors written " + ", ".join(f"{k} {v}" for k, v in r.sectors_written.items())
                        if r.sectors_written else ""))
    if p.guests is not None:
        g = p.guests
        lines.append(f"  guests       {g.count} at once, each on a store of its own: "
                     + ", ".join(f"{x.name} ({', '.join(filter(None, (x.profile, x.disk)))}"
                                 f"{' on ' + x.place if x.place else ''})" if x.disk or x.profile else x.name
                                 for x in g.guests))
        for pl in g.places:  # a run spread over several places
            first, last = pl.first, pl.first + pl.guests - 1
            clock = (f"; its clock {pl.clock_offset_s * 1000:+.1f} ms from the front-end's (round trip "
                     f"{(pl.clock_rtt_s or 0) * 1000:.1f} ms)" if pl.clock_offset_s is not None else "")
            cpus = f"; vCPUs {_vcpus(pl.vcpus, pl.host_cpus)}" if pl.vcpus and pl.host_cpus else ""
            lines.append(f"  place        {pl.name}: g{first}" + (f"-g{last}" if last > first else "")
                         + f" on {pl.host or '?'} ({pl.accelerator or '?'}), its run {pl.run_id}{clock}{cpus}")
        if g.vcpus and g.host_cpus:
            lines.append(f"  vCPUs        {_vcpus(g.vcpus, g.host_cpus)}")
        if g.skew_s:
            lines.append("  start skew   " + ", ".join(f"{t} {s * 1000:.0f} ms" for t, s in g.skew_s.items())
                         + " (the latest guest's start after the earliest's)")
    for key, value in (("host kernel", p.host_kernel), ("guest kernel", p.guest_kernel)):
        if value:
            lines.append(f"  {key:<12} {value}")
    if p.launch_to_agent_s is not None:
        attempts = p.boot_attempts or 1
        lines.append(f"  guest boot   {p.launch_to_agent_s:.0f} s to its agent"
                     + (f" (launch {attempts}: the guest's first boot was lost and it was launched again)"
                        if attempts > 1 else ""))
    for stall in p.nic_stalls or []:
        lines.append(f"  network      the guest's network stopped during {stall.test} (frames stopped at "
                     f"{stall.hop}); re-plugging its NIC did not help, the guest was launched afresh and "
                     "the tests from there on ran on the new guest")
    for ds in p.disk_stalls or []:
        lines.append(f"  disk         the guest's disk stopped completing requests during {ds.test} ({ds.seen}); "
                     f"the guest was launched afresh and {ds.test} and the tests after it ran on the new guest")
    if p.versions is not None:  # the tools' versions; the guest's packages are in --json (dozens of them)
        versions = p.versions.model_dump(exclude={"guest_packages"})
        lines.append("  versions     " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items()) if v))
    # Reasons, kernels and versions may come from a node: every line goes through the one escaping function.
    print("\n".join(printable(line) for line in lines), file=out)
    print(file=out)
    table = render.to_text(compare.compare_table([run], title=f"Run #{run.id}"))
    print("".join(printable(line) + "\n" for line in table.splitlines()), end="", file=out)
    if raw:
        for m in run.measurements:
            if m.raw:
                print(printable(f"\n--- raw: {m.side} {m.test} {m.metric} (measurement {m.id}) ---", "\n"), file=out)
                print(printable(m.raw.rstrip("\n"), "\t\n"), file=out)


def cmd_show(args: argparse.Namespace) -> int:
    """One run: configuration, provenance summary, its table; --raw adds tool output."""
    with _store(args) as store:
        run = store.get_run(store.resolve(args.run), raw=args.raw)
        if args.json:
            print(render.to_json([run], raw=args.raw), end="")
        else:
            _show_text(store, run, args.raw, sys.stdout)
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
        raise CloudboxError(f"-o {printable(str(args.output))}: is a directory; allowed: a file name (the export is "
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
    with _store(args) as store:
        run_id = store.resolve(args.run)
        run = store.get_run(run_id, raw=False)
        if run.state == "running" and _alive(store, run):
            raise CloudboxError(
                f"run #{run_id} is still running (executor pid {run.pid}); stop it before deleting it"
            )
        store.delete_run(run_id)
    print(f"deleted run #{run_id}")
    return 0
