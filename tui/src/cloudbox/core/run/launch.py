"""Launching the run's guest and waiting for its agent, with the boot retry under emulation or nested
virtualization, and the note a failed run's reason ends with when its guest died or went silent."""

from __future__ import annotations

import contextlib
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import CloudboxError, GuestUnreachable
from ..record.events import ProgressEvent
from ..spec.runspec import BOOT
from ..virt.guest import QEMU_LOG_DIR, Guest
from .context import RunContext

# Launches of one guest under emulation or nested virtualization before a silent or dead boot fails the run.
BOOT_ATTEMPTS = 2
CONSOLE_TAIL_LINES = 20  # lines of the guest's serial console kept in the reason of a run whose guest died
QEMU_LOG_TAIL_LINES = 8  # and of libvirt's log of its QEMU process


@dataclass
class Launched:
    guest: Guest
    waited_s: float  # for the agent
    boot_s: float  # since this attempt's launch
    attempts: int


def console_note(guest: Guest | None, err: CloudboxError) -> str:
    """When the guest died or its agent went silent: the last lines of its serial console (read before the
    work directory holding the log is removed) and of libvirt's log of its QEMU process (a guest reset without
    a word, a KVM error), to go after the abort reason. Else ""."""
    if guest is None or guest.console_log is None:
        return ""
    if not isinstance(err, GuestUnreachable) and guest.is_active():
        return ""
    tail = guest.console_tail(CONSOLE_TAIL_LINES)
    if tail:
        note = (f"\nlast {len(tail)} lines of the guest's serial console:\n"
                + "\n".join(f"  | {line}" for line in tail))
    else:
        note = f"\n(guest {guest.name} printed nothing on its serial console)"
    qemu = guest.qemu_log_tail(QEMU_LOG_TAIL_LINES)
    if qemu:
        note += (f"\nlast {len(qemu)} lines of its QEMU log ({QEMU_LOG_DIR / (guest.name + '.log')}):\n"
                 + "\n".join(f"  : {line}" for line in qemu))
    return note


def agent_socket(ctx: RunContext, path: Path) -> Path:
    """`path`, the unix socket libxl's QEMU in dom0 binds for a Xen guest's agent channel, with its removal on the
    run's cleanup stack: QEMU leaves it behind when the domain is destroyed. Registered before the guest starts, so
    it is unwound after the guest's destruction whether the run succeeds, fails or is cancelled."""
    ctx.stack.callback(remove_socket, path)
    return path


def remove_socket(path: Path) -> None:
    """Remove `path` if it is a unix socket; anything else there (or nothing) is left alone."""
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(path.lstat().st_mode):
            path.unlink()


def launch(ctx: RunContext, domain_xml: str | None = None, console_log: Path | None = None,
           first_attempt: int = 1) -> Launched:
    """Start the guest (`domain_xml`, else ctx.domain_xml) and wait for its agent. Under emulation or nested
    virtualization a guest that dies while booting or whose agent stays silent is launched once more (from
    `first_attempt`), announced as a step with its
    console's last lines (the first console is kept as console-attempt1.log): multi-threaded TCG and nested KVM
    inside TCG lose a boot now and then (docs/image.md). With KVM on bare metal that means something is wrong: no
    retry."""
    acc, control = ctx.accelerator, ctx.control
    attempts = BOOT_ATTEMPTS if (acc.emulated or acc.nested) else 1
    xml = ctx.domain_xml if domain_xml is None else domain_xml
    log = ctx.console_log if console_log is None else console_log

    def waiting(seconds: float) -> None:
        control.check("cancelled while the guest was booting")
        ctx.sink.emit(ProgressEvent("guest", BOOT, 0, f"booting, {seconds:.0f} s since launch"))

    for attempt in range(first_attempt, attempts + 1):
        t0 = time.monotonic()
        with control.atomic():
            guest = Guest.start(ctx.conn, xml, console_log=log)
            ctx.stack.callback(guest.destroy)
            ctx.guest = guest
        try:
            waited = guest.wait_agent(timeout=ctx.spec.agent_timeout, on_wait=waiting)
            return Launched(guest, waited, time.monotonic() - t0, attempt)
        except GuestUnreachable as e:
            if attempt == attempts or control.cancelled():
                raise
            note = console_note(guest, e)
            with control.atomic():
                guest.destroy()
                ctx.guest = None
            _retrying(ctx, guest, e, note, log, attempt, attempts)
    raise AssertionError("unreachable")


def _retrying(ctx: RunContext, guest: Guest, err: CloudboxError, note: str, log: Path, attempt: int,
              attempts: int) -> None:
    kept = log.with_name(f"console-attempt{attempt}.log")
    with contextlib.suppress(OSError):
        log.replace(kept)
    ctx.sink.step(f"guest {guest.name} did not come up ({err}); {ctx.accelerator.label} loses a boot now and then: "
                  f"launching it again (attempt {attempt + 1} of {attempts})")
    if note:
        ctx.sink.log(note.strip("\n") + f"\n(attempt {attempt}'s console: {kept})")


def launch_all(ctx: RunContext, domains: list[tuple[str, Path]]) -> list[Launched]:
    """Start every guest of `domains` (domain XML, console log), then wait for each one's agent: they boot side by
    side. A guest lost while booting under emulation or nested virtualization is launched once more on its own."""
    acc, control = ctx.accelerator, ctx.control
    attempts = BOOT_ATTEMPTS if (acc.emulated or acc.nested) else 1

    def waiting(seconds: float) -> None:
        control.check("cancelled while the guests were booting")
        ctx.sink.emit(ProgressEvent("guest", BOOT, 0, f"booting, {seconds:.0f} s since launch"))

    started: list[tuple[Guest, float]] = []
    for xml, log in domains:
        with control.atomic():
            guest = Guest.start(ctx.conn, xml, console_log=log)
            ctx.stack.callback(guest.destroy)
            ctx.guest = guest
        started.append((guest, time.monotonic()))
    out = []
    for (guest, t0), (xml, log) in zip(started, domains, strict=True):
        try:
            waited = guest.wait_agent(timeout=ctx.spec.agent_timeout, on_wait=waiting)
            out.append(Launched(guest, waited, time.monotonic() - t0, 1))
        except GuestUnreachable as e:
            if attempts == 1 or control.cancelled():
                ctx.guest = guest
                raise
            note = console_note(guest, e)
            with control.atomic():
                guest.destroy()
            _retrying(ctx, guest, e, note, log, 1, attempts)
            out.append(launch(ctx, xml, log, first_attempt=2))
    return out
