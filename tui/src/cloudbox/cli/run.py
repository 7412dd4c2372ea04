"""`cloudbox run | watch | cancel | guests | reclaim | host`: start runs (foreground or detached), watch them live, stop
them, clean up after runs that died."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from dataclasses import replace

from cloudbox.cli.common import EXIT_ERROR, guard
from cloudbox.core.errors import UsageError
from cloudbox.core.record.events import (
    PlanProgress,
    ProgressEvent,
    RunEvent,
    SampleEvent,
    describe,
    progress_line,
)
from cloudbox.core.run import runs
from cloudbox.core.spec.runspec import RUN_OPTIONS, RunSpec


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run storage and/or network tests under a profile, with a bare-metal baseline")
    for opt in RUN_OPTIONS:
        shown = f" (default: {opt.default})" if isinstance(opt.default, str) and opt.default and not opt.sweep else ""
        p.add_argument(*opt.flags, dest=opt.field, type=str if opt.sweep else opt.type, default=opt.default,
                       help=(opt.help + shown).replace("%", "%%"),  # argparse formats help with %
                       metavar=opt.metavar, required=opt.required,
                       choices=[c.value for c in opt.choices] if opt.closed else None,
                       **({"nargs": "?", "const": opt.const} if opt.const is not None else {}))
    p.add_argument("--detach", "-d", action="store_true", help="start in the background and print the run id")
    p.add_argument("--json", action="store_true", help="print the finished run as JSON")
    p.set_defaults(func=guard(cmd_run, invalid=(UsageError,)))

    t = sub.add_parser("tests", help="every storage and network test `run --tests` / `--net-tests` take, with its "
                                     "title, and the sets")
    t.set_defaults(func=guard(cmd_tests))

    w = sub.add_parser("watch", help="follow a run's progress live (attach to a detached run)")
    w.add_argument("run", help="run id")
    w.set_defaults(func=guard(cmd_watch))

    c = sub.add_parser("cancel", help="stop a run: guest destroyed, stores removed, run kept as aborted; "
                                      "or a sweep (its running run and the queued ones)")
    c.add_argument("run", help="run id, or a sweep's id (sweep-...: `cloudbox study run --detach` prints it)")
    c.set_defaults(func=guard(cmd_cancel))

    g = sub.add_parser("guests", help="list cloudbox guests known to libvirt; --destroy-orphans cleans up")
    g.add_argument("--destroy-orphans", action="store_true",
                   help="destroy the guests no live run owns (a killed run's), and nothing else, after undoing what "
                        "dead runs' ledgers hold (as `cloudbox reclaim`)")
    g.set_defaults(func=guard(cmd_guests))

    r = sub.add_parser("reclaim", help="mark runs whose executor is gone aborted and undo what their ledgers hold "
                                       "on this host (guests, loop devices, arrays, mounts, links, servers)")
    r.add_argument("--boot", action="store_true",
                   help="at boot, before libvirtd and the runs (cloudbox-reclaim.service): ask no daemon")
    r.set_defaults(func=guard(cmd_reclaim))

    h = sub.add_parser("host", help="what this host offers: accelerator (a tiny probe guest is booted once per boot "
                                    "to tell), libvirt, the root device; `host readiness` checks the whole box")
    h.add_argument("what", nargs="?", choices=["readiness"],
                   help="readiness: CPU virtualization, IOMMU, Secure Boot, memory, each disk (read-only fio) and NIC, "
                        "the private link and the path to each node (ping, iperf3), and what this box can answer (the "
                        "studies and their cells); writes nothing")
    h.add_argument("--json", action="store_true", help="print it as JSON")
    h.add_argument("--verdict", action="store_true",
                   help="print one line: KVM usable, or why not and that guests fall back to TCG (exit 1 then)")
    h.add_argument("--fio-seconds", type=int, default=3, metavar="S",
                   help="readiness: seconds of read-only fio per disk and queue depth (0 to skip; default 3)")
    h.add_argument("--device", action="append", default=None, metavar="DEV",
                   help="readiness: measure this disk only (repeatable; default every disk)")
    h.add_argument("--link-seconds", type=int, default=3, metavar="S",
                   help="readiness: seconds of iperf3 to each enrolled node over the private link (0: ping only; "
                        "default 3)")
    h.set_defaults(func=guard(cmd_host, invalid=(UsageError,)))


def _specs(a: argparse.Namespace) -> list[RunSpec]:
    """The run the flags ask for, or one per value of a sweep option given as a list (--guests 1,2,4)."""
    given = {opt.field: getattr(a, opt.field) for opt in RUN_OPTIONS if not opt.sweep}
    specs = [RunSpec(**given)]
    for opt in RUN_OPTIONS:
        if opt.sweep:
            specs = [replace(s, **{opt.field: v}) for s in specs for v in opt.values(getattr(a, opt.field))]
    return specs


class Printer:
    """Prints run events (core.record.events' lines): a live status line on a tty, sparse progress lines otherwise;
    in a repeated run each line says which repeat it is (the plan's, events.PlanProgress)."""

    def __init__(self, out=sys.stdout):
        self.out = out
        self.plan = PlanProgress()
        self.tty = out.isatty()
        self.sample: SampleEvent | None = None
        self.last_plain = 0.0
        self.status_shown = False

    def _clear(self) -> None:
        if self.tty and self.status_shown:
            self.out.write("\r\033[K")
            self.status_shown = False

    def __call__(self, ev: RunEvent) -> None:
        self.plan.feed(ev)
        if isinstance(ev, SampleEvent):
            # one device on the status line: the run's own disk, not the front-end's under a volume ("fe1:vda")
            # nor a second one this host samples beside it
            own = ":" not in (ev.device or "")
            if self.sample is None or ev.device == self.sample.device or (own and ":" in (self.sample.device or "")):
                self.sample = ev
            return
        if isinstance(ev, ProgressEvent):
            if (ev.instance or 1) > 1:
                return  # one status line: the first of N guests' (the TUI shows each guest's)
            line = progress_line(ev, self.sample, self.plan.where())
            if self.tty:
                self.out.write("\r\033[K" + line[:200])
                self.status_shown = True
            elif time.monotonic() - self.last_plain > 5:
                self.out.write(line + "\n")
                self.last_plain = time.monotonic()
            self.out.flush()
            return
        self._clear()
        text = describe(ev)
        if text is not None:
            self.out.write(text + "\n")
        self.out.flush()


def _store():
    from cloudbox.core.record.results import ResultStore

    return ResultStore()


def cmd_run(a: argparse.Namespace) -> int:
    from cloudbox.core.views.compare import compare_table
    from cloudbox.core.views.render import to_text

    specs = _specs(a)
    for spec in specs:  # a usage error exits 2 before anything (the results database) is created
        spec.validate()
        if spec.guests > 1:
            runs.check_guests_fit(spec)
    if len(specs) > 1:
        return _sweep(a, specs)
    spec = specs[0]
    with _store() as store:
        if a.detach:
            rid = runs.start_detached(spec, store)
            if a.json:
                print(json.dumps({"run_id": rid, "uuid": store.get_run(rid).uuid}))
                return 0
            print(f"run {rid} started in the background; follow it with 'cloudbox watch {rid}', "
                  f"stop it with 'cloudbox cancel {rid}'")
            return 0
        printer = Printer()
        ex = runs.executor(spec, store, emit=printer)
        rid = ex.execute()
        run = store.get_run(rid)
        if a.json:
            print(json.dumps(run.as_dict(), indent=2, default=str))
        elif run.measurements:
            print()
            print(to_text(compare_table([run])))
        return 0 if run.state == "completed" else 1


def _sweep(a: argparse.Namespace, specs: list[RunSpec]) -> int:
    """One run per guest count, one after another; then the runs side by side (compare.guest_sweep_table)."""
    from cloudbox.core.views.compare import guest_sweep_table
    from cloudbox.core.views.render import to_json, to_text

    counts = ", ".join(str(s.guests) for s in specs)
    with _store() as store:
        if a.detach:
            sweep = runs.start_sweep(specs, store)
            if a.json:
                print(json.dumps({"sweep": sweep.id}))
                return 0
            print(f"{sweep.id} started in the background: one run per guest count ({counts}); 'cloudbox results "
                  f"list' shows its runs, 'cloudbox cancel {sweep.id}' stops it")
            return 0
        done = []
        for i, spec in enumerate(specs, 1):
            print(f"=== run {i} of {len(specs)}: --guests {spec.guests}")
            rid = runs.executor(spec, store, emit=Printer()).execute()
            done.append(store.get_run(rid))
            if done[-1].state != "completed":
                print(f"run {rid} {done[-1].state}: the sweep stops here")
                break
        if a.json:
            print(to_json(done), end="")
        else:
            print()
            print(to_text(guest_sweep_table(done)))
        return 0 if len(done) == len(specs) and all(r.state == "completed" for r in done) else 1


def cmd_watch(a: argparse.Namespace) -> int:
    printer = Printer()
    try:
        with _store() as store:
            rid = store.resolve(a.run)
            for ev in store.follow(rid):
                if (rec := ev.record) is not None:
                    printer(rec)
            return 0 if store.get_run(rid, raw=False).state == "completed" else 1
    except KeyboardInterrupt:
        print("\n(stopped watching; the run goes on)")
        return 0


def cmd_cancel(a: argparse.Namespace) -> int:
    with _store() as store:
        if a.run.startswith("sweep-"):
            state = runs.cancel_sweep(a.run)
            print(f"{a.run}: {state}")
            return 0 if state != "running" else 1
        rid = store.resolve(a.run)
        state = runs.cancel(store, rid)
        run = store.get_run(rid, raw=False)
        print(f"run {rid}: {state}" + (f" ({run.reason})" if run.reason else ""))
        return 0 if state != "running" else 1


def cmd_reclaim(a: argparse.Namespace) -> int:
    from cloudbox.core.run import reclaim

    with _store() as store:
        problems = reclaim.reclaim_dead_runs(store, print, boot=a.boot)
    for p in problems:
        print(f"could not undo: {p}", file=sys.stderr)
    return EXIT_ERROR if problems else 0


def cmd_guests(a: argparse.Namespace) -> int:
    from cloudbox.core.run import reclaim
    from cloudbox.core.virt import daemons, guest

    conn = daemons.connect()
    with _store() as store:
        if a.destroy_orphans:
            for p in reclaim.reclaim_dead_runs(store, print):
                print(f"could not undo: {p}", file=sys.stderr)
        live = {r.uuid for r in store.active_runs()}
    guests = guest.list_guests(conn)
    if not guests:
        print("no cloudbox guests")
    for g in guests:
        orphan = "" if g.run_uuid in live else "  (orphan: its run is not active)"
        print(f"{g.name:40} {g.state:10} profile={g.profile}{orphan}")
    if a.destroy_orphans:
        for name in guest.reap_orphans(conn, live):
            print(f"destroyed {name}")
    return 0


def cmd_host(a: argparse.Namespace) -> int:
    from cloudbox.core.disks import backing
    from cloudbox.core.virt import accel

    if a.what == "readiness":
        return _readiness(a)
    acc = accel.detect()
    if a.verdict:
        print(acc.verdict)
        return 0 if acc.kvm_usable else 1
    root = backing.dev_name_for_path("/")
    info = {"accelerator": acc.label, "reason": acc.reason, "nested": acc.nested,
            "root_device": backing.device_model(root)}
    if a.json:
        if acc.name == "xen":
            info.update(accel.dom0_facts())
        print(json.dumps(info, indent=2))
    else:
        for k, v in info.items():
            print(f"{k:12} {v}")
        if acc.name == "xen":
            for k, v in accel.dom0_facts().items():
                print(f"{k:12} {v}")
        if acc.emulated:
            print("WARNING: guests run under TCG emulation: their numbers are not virtualization-overhead figures")
    return 0


def _readiness(a: argparse.Namespace) -> int:
    """The box's readiness report and what it can answer; exit 1 when a problem was found."""
    from cloudbox.core.inputs import printable
    from cloudbox.core.studies import capability
    from cloudbox.core.views import readiness
    from cloudbox.core.virt import accel

    if a.fio_seconds < 0 or a.fio_seconds > 60:
        raise UsageError(f"--fio-seconds {a.fio_seconds} is not allowed; allowed: 0 to 60")
    if a.link_seconds < 0 or a.link_seconds > 30:
        raise UsageError(f"--link-seconds {a.link_seconds} is not allowed; allowed: 0 to 30")
    found = capability.answers(accel.detect(), fio_seconds=a.fio_seconds, devices=a.device,
                               link_seconds=a.link_seconds)
    facts, caps = found.facts, found.studies
    if a.json:
        print(json.dumps({**facts.as_dict(), "studies": [dataclasses.asdict(c) for c in caps]}, indent=2))
    else:
        for line in readiness.lines(facts) + [""] + ["What this box can answer:"] + capability.lines(caps):
            print(printable(line))
    return 1 if facts.problems else 0


def cmd_tests(a: argparse.Namespace) -> int:
    """`cloudbox tests`: every test id with its title, then the sets, for `run --tests` and `--net-tests`."""
    from cloudbox.core.spec import catalogue

    print("storage tests (--tests ID[,ID...] or a set):")
    for tid in catalogue.TESTS:
        print(f"  {tid:26} {catalogue.test_title(tid)}")
    print("storage test sets: " + ", ".join(f"{k} ({len(v)})" for k, v in catalogue.TEST_SETS.items()))
    print("network tests (--net-tests ID[,ID...] or a set):")
    for tid in catalogue.NET_TESTS:
        print(f"  {tid:26} {catalogue.test_title(tid)}")
    print("network test sets: " + ", ".join(f"{k} ({', '.join(v)})" for k, v in catalogue.NET_SETS.items()))
    return 0
