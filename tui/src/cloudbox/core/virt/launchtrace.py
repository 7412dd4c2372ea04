"""Where a guest's launch time goes: one launch from createXML to its agent's first answer, split into phases.

Host side (CLOCK_BOOTTIME, the clock /proc/<pid>/stat's start times count in): the createXML call, the start of
the domain's QEMU process (libvirt's pid file, then /proc), the first byte on the serial console (its log file,
polled) and the agent's first answer. Guest side, read through the agent once it answers: the kernel's own
timestamps (dmesg: initramfs unpacked, /init run) and the marks the cloudbox guest's /init writes to /dev/kmsg
("cloudbox-guest: boot: <mark>"). The guest's clock is placed on the host's by reading /proc/uptime through the
agent: the read happens inside a host interval whose half-width is the anchor's error.
"""

from __future__ import annotations

import base64
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .guest import Guest

# Kernel log lines that end a guest phase (dmesg: "[   1.234567] text").
_KERNEL_MARKS = {
    "initramfs unpacked": re.compile(r"Freeing initrd memory"),
    "/init run": re.compile(r"Run /init as init process"),
}
_GUEST_MARK = re.compile(r"cloudbox-guest: boot: (\S+)")
_DMESG = re.compile(r"^\[\s*(\d+\.\d+)\]\s?(.*)$")
POLL_S = 0.01  # the console log's poll interval (host)


def now() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


@dataclass
class Trace:
    """Times in seconds since the createXML call (host marks) or since the guest kernel's clock start (guest marks,
    placed on the host's timeline by `kernel_zero`)."""

    created: float  # createXML returned (QEMU running its vCPUs)
    agent: float  # the agent's first answer
    qemu_started: float | None = None  # the QEMU process began (10 ms resolution)
    first_console: float | None = None  # first byte on the serial console seen by the host
    kernel_zero: float | None = None  # the guest kernel's clock 0 on the host timeline
    anchor_error: float | None = None  # +- seconds on kernel_zero
    guest_marks: dict[str, float] = field(default_factory=dict)  # guest uptime of each mark

    def phases(self) -> list[tuple[str, float | None]]:
        """(phase, seconds) in launch order; None where this launch did not show that boundary (an old guest
        without /init marks). The phases add up to `agent` wherever every boundary is known."""
        m = self.guest_marks
        kz = self.kernel_zero

        def host(name: str) -> float | None:
            return None if kz is None or name not in m else kz + m[name]

        init_run = host("/init run")
        bounds: list[tuple[str, float | None]] = [
            ("libvirt and QEMU start (createXML call)", self.created),
            ("firmware and kernel load (to the kernel's clock 0)", kz),
            ("kernel, initramfs unpacked", host("initramfs unpacked")),
            ("kernel, to /init", init_run),
            ("/init: mounts, drivers loaded", host("drivers")),
            ("/init: agent started", host("agent")),
            ("agent's first answer (host poll)", self.agent),
        ]
        out: list[tuple[str, float | None]] = []
        prev = 0.0  # each phase runs from the last boundary this launch showed
        for name, t in bounds:
            out.append((name, None if t is None else t - prev))
            if t is not None:
                prev = t
        return out


class _ConsoleWatch(threading.Thread):
    """Notes when the serial console's log file first holds a byte."""

    def __init__(self, path: Path, t0: float):
        super().__init__(daemon=True)
        self.path, self.t0 = path, t0
        self.first: float | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                if self.path.stat().st_size > 0:
                    self.first = now() - self.t0
                    return
            except OSError:
                pass
            self.stop.wait(POLL_S)


def _qemu_start(name: str, t0: float) -> float | None:
    try:
        pid = int(Path(f"/run/libvirt/qemu/{name}.pid").read_text().strip())
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    ticks = int(stat.rsplit(")", 1)[1].split()[19])
    return ticks / os.sysconf("SC_CLK_TCK") - t0


def parse_dmesg(text: str) -> dict[str, float]:
    """The guest marks in a dmesg listing: the kernel's (_KERNEL_MARKS) and /init's, first occurrence each."""
    marks: dict[str, float] = {}
    for line in text.splitlines():
        m = _DMESG.match(line.strip())
        if not m:
            continue
        ts, msg = float(m.group(1)), m.group(2)
        for name, rx in _KERNEL_MARKS.items():
            if name not in marks and rx.search(msg):
                marks[name] = ts
        g = _GUEST_MARK.search(msg)
        if g and g.group(1) not in marks:
            marks[g.group(1)] = ts
    return marks


def _anchor(guest: Guest) -> tuple[float, float] | None:
    """(host time of the guest kernel's clock 0, +- error), from one /proc/uptime read through the agent."""
    for _ in range(3):
        t1 = now()
        pid = guest.spawn(["/bin/cat", "/proc/uptime"])
        st = None
        while st is None:
            st = guest.status(pid)
            if st is None:
                time.sleep(POLL_S)
        t2 = now()
        try:
            uptime = float(base64.b64decode(st.get("out-data", "")).split()[0])
        except (ValueError, IndexError):
            return None
        if t2 - t1 < 0.5:  # a slow round trip is retried: the error is half of it
            break
    return (t1 + t2) / 2 - uptime, (t2 - t1) / 2


def trace_launch(conn, xml: str, *, console_log: Path | None, timeout: float = 300.0,
                 interval: float | None = None, start: Callable[[], None] | None = None) -> tuple[Guest, Trace]:
    """Start the domain `xml`, wait for its agent and trace where the time went. The guest is left running (the
    caller destroys it). `interval`: the agent poll's (Guest.wait_agent's default when None)."""
    t0 = now()
    watch = _ConsoleWatch(console_log, t0) if console_log is not None else None
    if watch is not None:
        watch.start()
    if start is not None:
        start()
    guest = Guest.start(conn, xml, console_log=console_log)
    created = now() - t0
    qemu = _qemu_start(guest.name, t0)
    try:
        if interval is None:
            guest.wait_agent(timeout=timeout)
        else:
            guest.wait_agent(timeout=timeout, interval=interval)
        agent = now() - t0
        trace = Trace(created=created, agent=agent, qemu_started=qemu)
        anchor = _anchor(guest)
        if anchor is not None:
            trace.kernel_zero, trace.anchor_error = anchor[0] - t0, anchor[1]
        trace.guest_marks = parse_dmesg(guest.run(["/bin/dmesg"], timeout=60).stdout)
    except BaseException:
        guest.destroy()
        raise
    finally:
        if watch is not None:
            watch.stop.set()
            watch.join(1)
    trace.first_console = watch.first if watch is not None else None
    return guest, trace
