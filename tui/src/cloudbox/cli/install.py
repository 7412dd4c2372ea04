"""`cloudbox install [--answers FILE] [--dry-run] [--yes] [--cli]`, `cloudbox install --unattended`,
`cloudbox install disks`.

On a terminal, without --answers, --yes or --cli, the full-screen installer opens (cloudbox.tui.install_app:
the same questions, checks, plan and confirmation). Otherwise, without --answers the answers are asked for on the
terminal line by line (role, disk, hostname, NICs, MTU, front-end,
root access); the plan is shown, and nothing is written before the user types "yes" (or --yes). With
--dry-run the plan is printed and nothing is written. --unattended is what cloudbox-install.service runs at
boot of the live system: it finds an answer file (credential, kernel command line, the stick's ESP; see
cloudbox.core.install.unattended) and installs without a question, or does nothing when there is none.

Exit codes: 0 installed, nothing to do, or dry run printed; 1 the install failed (re-run to resume) or the
disk is refused; 2 invalid answers (every problem is printed, naming file, key, value and what is allowed);
130 interrupted (what was written stays; re-run the same answers to resume).

Test hooks (environment): CLOUDBOX_INSTALL_BY_ID_DIR replaces /dev/disk/by-id, CLOUDBOX_INSTALL_LOOP=1 lists
loop devices as disks (cloudbox.core.install.actions.probe_machine).
"""

from __future__ import annotations

import argparse
import getpass
import io
import json
import signal
import subprocess
import sys
import syslog
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from cloudbox.core.disks.backing import human_size
from cloudbox.core.errors import AnswerError, CloudboxError
from cloudbox.core.install import (
    Machine,
    ProgressEvent,
    apply,
    check_answers,
    find_answers,
    find_sources,
    load_answers,
    make_plan,
    parse_answers,
)
from cloudbox.core.install.actions import after_install, hash_password, probe_machine, readiness_lines
from cloudbox.core.install.answers import ROLES, Answers, validate_data
from cloudbox.core.install.apply import reap_stale
from cloudbox.core.install.disks import source_esp

EXIT_OK, EXIT_FAILED, EXIT_INVALID, EXIT_INTERRUPTED = 0, 1, 2, 130
NODE_SETTINGS = Path("/etc/cloudbox/node.toml")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("install", help="install cloudbox from this live system onto a disk (front-end, "
                       "back-end or all-in-one)", description=__doc__.split("\n\n")[1] if __doc__ else None)
    p.add_argument("--answers", "-a", metavar="FILE", help="answer file (TOML); without it the answers are asked")
    p.add_argument("--dry-run", "-n", action="store_true", help="print what would be written; write nothing")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask before writing the disk")
    p.add_argument("--cli", action="store_true",
                   help="ask the questions line by line, even on a terminal (the default there is the full-screen "
                   "installer)")
    p.add_argument("--unattended", action="store_true",
                   help="find the answer file (credential, kernel command line, the stick's ESP) and install "
                   "without a question; nothing to do without one (run at boot by cloudbox-install.service)")
    p.set_defaults(func=cmd_install)
    isub = p.add_subparsers(dest="install_command", metavar="SUBCOMMAND")
    d = isub.add_parser("disks", help="every disk, and why it is offered, needs a confirmation or is refused")
    d.add_argument("--json", action="store_true")
    d.set_defaults(func=cmd_disks)


def cmd_disks(a: argparse.Namespace) -> int:
    try:
        m = probe_machine()
    except (OSError, CloudboxError) as e:
        print(f"cloudbox: {e}", file=sys.stderr)
        return EXIT_FAILED
    if a.json:
        print(json.dumps([d.as_dict() for d in m.disks], indent=2))
        return EXIT_OK
    if not m.disks:
        print("no disks found")
    for d in m.disks:
        mark = {"offered": "+", "confirm": "?", "refused": "-"}[d.status]
        print(f"{mark} {d.path:<14} {human_size(d.size):>10}  {d.model or '-':<20} serial {d.serial or '-'}")
        for link in d.by_id[:2]:
            print(f"    {link}")
        print(f"    {d.why()}")
    print("\n+ offered   ? only after typing its serial (holds data)   - never written")
    return EXIT_OK


# -------------------------------------------------------------------------------------------- progress
class ProgressPrinter:
    """Progress lines: rewritten in place on a terminal, one line per event otherwise (journal, console)."""

    def __init__(self, out: TextIO | None = None):
        # sys.stdout at call time: the unattended install redirects it to the kernel log.
        self.out: TextIO = out if out is not None else sys.stdout
        self.tty = self.out.isatty()
        self.start = time.monotonic()

    def __call__(self, ev: ProgressEvent) -> None:
        line = f"{int(time.monotonic() - self.start):4d}s {ev}"
        if self.tty and ev.fraction is not None and ev.fraction < 1.0:
            self.out.write("\r\033[K" + line[:200])
        else:
            self.out.write(("\r\033[K" if self.tty else "") + line + "\n")
        self.out.flush()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _after(what: str) -> None:
    def notice() -> None:
        print(f"cloudbox: {what} in 5 s")
        sys.stdout.flush()
        time.sleep(5)

    problem = after_install(what, notice)
    if problem is not None:
        print(f"cloudbox: {problem}", file=sys.stderr)


def _run_plan(answers: Answers, source: str, machine: Machine, a: argparse.Namespace,
              confirm: Callable[[str], bool] | None) -> int:
    resolved = check_answers(answers, machine, source)
    plan = make_plan(resolved, find_sources(machine))
    if a.unattended:
        # The console (kernel log, rate-limited) gets a summary; the journal gets the whole plan.
        for line in plan.summary():
            print(f"cloudbox install: {line}")
        print("cloudbox install: the whole plan is in the journal (journalctl -u cloudbox-install)")
        syslog.openlog("cloudbox-install", 0, syslog.LOG_DAEMON)
        for line in plan.describe().splitlines():
            syslog.syslog(syslog.LOG_INFO, line or " ")
    else:
        print(plan.describe(), end="")
    if a.dry_run:
        print("dry run: nothing was written")
        return EXIT_OK
    if plan.mode != "done" and not a.yes and confirm is not None:
        for line in readiness_lines():  # what this box offers, before anything is written
            print(f"readiness: {line}")
        if not confirm(f"Write {plan.disk.path} ({plan.disk.identity})? Type yes to install: "):
            print("nothing was written")
            return EXIT_FAILED
    a.writing = True  # from here on an interruption leaves something written (and a re-run resumes it)
    installed = apply(plan, ProgressPrinter())
    if installed:
        print(f"cloudbox: installed {answers.role} {answers.hostname} on {plan.disk.path}")
        _after(answers.after)
    else:
        print(f"cloudbox: {plan.disk.path} already holds this install; nothing was written. Remove the boot "
              "medium and reboot into the installed node.")
    return EXIT_OK


def cmd_install(a: argparse.Namespace) -> int:
    if getattr(a, "install_command", None):
        return EXIT_INVALID
    old = signal.signal(signal.SIGTERM, _interrupt)
    try:
        if a.unattended:
            return _unattended(a)
        reap_stale()
        if _wants_tui(a):
            return _tui(a)  # probes the machine itself, in a worker, showing that it does
        machine = probe_machine()
        if a.answers:
            answers = load_answers(a.answers)
            return _run_plan(answers, a.answers, machine, a, _ask_yes)
        answers = Interview(machine).run()
        return _run_plan(answers, "interactive answers", machine, a, _ask_yes)
    except CloudboxError as e:
        return _failed(e, a, written="re-run `cloudbox install` with the same answers to resume")
    except (KeyboardInterrupt, EOFError):
        if getattr(a, "writing", False):
            print("\ncloudbox: interrupted; mounts removed. What was written stays: re-run `cloudbox install` with "
                  "the same answers to resume", file=sys.stderr)
        else:
            print("\ncloudbox: interrupted before anything was written; nothing was written", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        signal.signal(signal.SIGTERM, old)


def _failed(e: CloudboxError, a: argparse.Namespace, *, written: str, unwritten: str = "") -> int:
    """Say `e` and what to do next (`written` once the plan has begun writing, else `unwritten`); the exit status:
    INVALID for answers that do not validate (nothing more to say then), else FAILED."""
    print(f"cloudbox: {e}", file=sys.stderr)
    if isinstance(e, AnswerError):
        return EXIT_INVALID
    hint = written if getattr(a, "writing", False) else unwritten
    if hint:
        print(f"cloudbox: {hint}", file=sys.stderr)
    return EXIT_FAILED


def _wants_tui(a: argparse.Namespace) -> bool:
    """The full-screen installer: on a terminal, unless an answer file, --yes or --cli asks for the line-based one."""
    return not (a.answers or a.unattended or a.yes or getattr(a, "cli", False)) and sys.stdin.isatty() \
        and sys.stdout.isatty()


def _tui(a: argparse.Namespace) -> int:
    from cloudbox.tui.install_app import InstallBackend, run_install_tui

    return run_install_tui(InstallBackend(), dry_run=a.dry_run)


class KmsgLines(io.TextIOBase):
    """Each line written goes to the kernel log (/dev/kmsg), which the kernel shows on every console (screen
    and serial port) and journald stores: where a person at the machine, or a test harness, looks. /dev/kmsg is
    opened per line, as the kernel rate-limits each open file to 10 lines in 5 s."""

    def __init__(self, fallback: TextIO, tag: str = "cloudbox-install"):
        self.fallback = fallback
        self.tag = tag
        self.buf = ""

    def isatty(self) -> bool:
        return False

    def write(self, s: str) -> int:
        self.buf += s.replace("\r\033[K", "")
        while "\n" in self.buf:
            line, self.buf = self.buf.split("\n", 1)
            self._line(line)
        return len(s)

    def _line(self, line: str) -> None:
        try:
            with open("/dev/kmsg", "w") as k:
                k.write(f"{self.tag}: {line[:900]}\n")
        except OSError:
            self.fallback.write(line + "\n")
            self.fallback.flush()

    def flush(self) -> None:
        if self.buf:
            self._line(self.buf)
            self.buf = ""


def _unattended(a: argparse.Namespace) -> int:
    out, err = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = KmsgLines(out)
    try:
        return _unattended_run(a)
    except CloudboxError as e:
        return _failed(e, a, written="fix the cause and reboot the stick to resume; what was written stays",
                       unwritten="fix the cause and reboot the stick; nothing was written")
    finally:
        sys.stdout.flush()
        sys.stdout, sys.stderr = out, err


def _unattended_run(a: argparse.Namespace) -> int:
    if NODE_SETTINGS.exists():
        print(f"cloudbox install: this is an installed node ({NODE_SETTINGS}); nothing to do")
        return EXIT_OK
    subprocess.run(["udevadm", "settle", "--timeout=60"], check=False, capture_output=True)
    reap_stale()
    machine = probe_machine()
    esp = source_esp(machine.disks)
    found = find_answers(machine, esp.path if esp else None)
    if found is None:
        print("cloudbox install: no answer file (credential cloudbox.answers, kernel command line "
              "cloudbox.answers=, /cloudbox/answers.toml on the stick's ESP); nothing to do")
        return EXIT_OK
    print(f"cloudbox install: unattended install with the answers from {found.source}")
    answers = parse_answers(found.text, found.source)
    a.yes = True
    return _run_plan(answers, found.source, machine, a, None)


def _ask_yes(prompt: str) -> bool:
    return input(prompt).strip().lower() == "yes"


# -------------------------------------------------------------------------------------------- interview
class Interview:
    """Asks for the answers on the terminal and returns them validated (each answer re-asked until valid)."""

    def __init__(self, machine: Machine, ask: Callable[[str], str] = input,
                 secret: Callable[[str], str] = getpass.getpass, out: TextIO = sys.stdout):
        self.m = machine
        self.ask = ask
        self.secret = secret
        self.out = out

    def say(self, text: str = "") -> None:
        print(text, file=self.out)

    def choose(self, title: str, options: list[str], default: int | None = None) -> int:
        self.say(title)
        for i, o in enumerate(options, 1):
            self.say(f"  {i}) {o}")
        while True:
            hint = f" [{default + 1}]" if default is not None else ""
            raw = self.ask(f"choice{hint}: ").strip()
            if not raw and default is not None:
                return default
            if raw.isdigit() and 1 <= int(raw) <= len(options):
                return int(raw) - 1
            self.say(f"  type a number 1..{len(options)}")

    def text(self, prompt: str, default: str = "", check: Callable[[str], str | None] | None = None) -> str:
        while True:
            raw = self.ask(f"{prompt}{f' [{default}]' if default else ''}: ").strip() or default
            problem = check(raw) if check else None
            if problem is None:
                return raw
            self.say(f"  {problem}")

    def _field(self, data: dict[str, Any], key: str) -> str | None:
        """The problem validation finds with `key` (dotted) in otherwise complete data, or None."""
        try:
            validate_data(data, "interactive answers")
        except AnswerError as e:
            for p in e.problems:
                if p.key == key:
                    return f"{p.message}; allowed: {p.allowed}" if p.allowed else p.message
        return None

    def run(self) -> Answers:
        m = self.m
        self.say("cloudbox install: answers for this node (Ctrl-C to stop; nothing is written before you confirm)")
        role = ROLES[self.choose("Role of this node:", [
            "front-end: controller, private network services, block-volume exports",
            "back-end: hypervisor (libvirt, QEMU/KVM or Xen) for the guests",
            "all-in-one: both, on this one machine",
        ])]
        usable = [d for d in m.disks if d.status != "refused"]
        for d in m.disks:
            if d.status == "refused":
                self.say(f"  (not offered: {d.path} {d.why()})")
        if not usable:
            raise CloudboxError("no disk of this machine can be installed to (`cloudbox install disks` says why)")
        i = self.choose("Target disk (everything on it is replaced):",
                        [f"{d.identity}: {d.why()}" for d in usable])
        disk = usable[i]
        if not disk.by_id:
            raise CloudboxError(f"{disk.path} has no {m.by_id_dir} name; cloudbox names target disks by it")
        data: dict[str, Any] = {"role": role, "hostname": "x", "disk": {"target": disk.by_id[0]}}
        if disk.has_data:
            self.say(f"{disk.path} holds data: {'; '.join(disk.signatures)}")
            if not disk.serial:
                raise CloudboxError(f"{disk.path} holds data and has no serial to confirm with; wipe it first")
            serial = self.text(f"Type the serial number of {disk.path} ({disk.serial}) to erase it",
                               check=lambda s: None if s == disk.serial else "that is not its serial")
            data["disk"]["confirm_serial"] = serial
        data["hostname"] = self.text("Hostname", f"cloudbox-{role.split('-')[0]}",
                                     lambda s: self._field({**data, "hostname": s}, "hostname"))
        net: dict[str, Any] = {}
        nics = m.nics
        if role in ("front-end", "back-end"):
            if not nics:
                raise CloudboxError("this machine has no NIC; a front-end or back-end needs one")
            i = self.choose("NIC facing the private network:", [n.describe() for n in nics])
            net["private_nic"] = nics[i].name
        rest = [n for n in nics if n.name != net.get("private_nic")]
        if rest:
            opts = [n.describe() for n in rest] + (["none"] if role != "front-end" else [])
            i = self.choose("NIC facing the campus network:", opts, default=0)
            if i < len(rest):
                net["campus_nic"] = rest[i].name
        elif role == "front-end":
            raise CloudboxError("a front-end needs two NICs (private and campus); this machine has one")
        if "private_nic" in net:
            mtu = self.text("MTU of the private network", "9000",
                            lambda s: None if s.isdigit() and 1500 <= int(s) <= 9000 else "an integer 1500..9000")
            net["private_mtu"] = int(mtu)
        if role == "back-end":
            net["frontend"] = self.text(
                'Front-end address on the private network, or "discover"', "discover",
                lambda s: self._field({**data, "network": {**net, "frontend": s}}, "network.frontend"))
        data["network"] = net
        root: dict[str, Any] = {}
        key = self.text("SSH public key for root (one line; empty for none)", "",
                        lambda s: None if not s else self._field(
                            {**data, "root": {"ssh_authorized_keys": [s]}}, "root.ssh_authorized_keys"))
        if key:
            root["ssh_authorized_keys"] = [key]
        while True:
            pw = self.secret("Root password (empty: none, log in with the SSH key or choose one at first login): ")
            if not pw or pw == self.secret("Again: "):
                break
            self.say("  the two passwords differ")
        if pw:
            root["password_hash"] = hash_password(pw)
        data["root"] = root
        after = ("reboot", "poweroff", "stay")[self.choose("When the install is done:", [
            "reboot into the installed node", "power off", "stay in the live system"], default=0)]
        data["after"] = after
        return validate_data(data, "interactive answers")
