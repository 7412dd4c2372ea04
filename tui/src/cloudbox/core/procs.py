"""Processes, shared by the core: whether a pid names a live process, children that die with their parent,
stopping a child, waiting for a child while a run may be cancelled, and a child server that is started, waited
for until it serves, and stopped."""

from __future__ import annotations

import ctypes
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from . import ledger
from .errors import Aborted, CloudboxError

T = TypeVar("T")

# Loaded here, not in the forked child: dlopen after fork in a threaded parent can deadlock on the loader's lock.
_LIBC = ctypes.CDLL(None, use_errno=True)
_PR_SET_PDEATHSIG = 1


def process_exists(pid: int | None) -> bool:
    """True if a process with this pid exists (possibly owned by another user)."""
    if not pid or pid <= 0:  # kill(0, ...) would signal our own process group
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def how_it_died(pid: int, timeout: float = 5.0) -> str:
    """What the kernel's log says ended process `pid` (its out-of-memory killer), "" when it says nothing (a kill
    from user space leaves no trace there; only a parent that waited for it knows the signal)."""
    try:
        r = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    if re.search(rf"\b(Killed process|Out of memory: Killed process) {pid}\b", r.stdout or ""):
        return "by the kernel's out-of-memory killer, SIGKILL"
    return ""


def die_with_parent(sig: signal.Signals = signal.SIGKILL) -> Callable[[], None]:
    """A Popen preexec_fn: the child gets `sig` when the thread that forked it dies, so no child outlives a killed run.

    The child only calls prctl (async-signal-safe); libc was resolved at import."""
    prctl = _LIBC.prctl
    number = int(sig)

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, number, 0, 0, 0)
    return hook


def stop(proc: subprocess.Popen[bytes] | subprocess.Popen[str], grace_s: float) -> int:
    """End child `proc`: SIGTERM, then SIGKILL when it is still there after `grace_s`; always reaped. Returns its
    exit status (negative: the signal that ended it). A child that has already exited is only reaped."""
    if proc.poll() is None:
        proc.terminate()
        try:
            return proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


def wait_cancellable(proc: subprocess.Popen[Any], cancelled: Callable[[], bool], during: str, *,
                     every: Callable[[], None] | None = None, interval: float = 0.5) -> tuple[Any, Any]:
    """Wait for child `proc` and return what communicate() read, its output (None for a stream not piped).
    Every `interval` s until it ends: Aborted("cancelled during <during>") once `cancelled()` says so, then
    `every()` (which may raise, e.g. on a hang). Whatever ends the wait early, the child is killed and reaped."""
    try:
        while True:
            if cancelled():
                raise Aborted(f"cancelled during {during}")
            if every is not None:
                every()
            try:
                return proc.communicate(timeout=interval)
            except subprocess.TimeoutExpired:
                continue
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def wait_for(found: Callable[[], T], timeout: float, failure: Callable[[], str], interval: float = 0.05) -> T:
    """What `found()` returns once it is something (asked every `interval` s); after `timeout` s without it,
    CloudboxError(failure())."""
    deadline = time.monotonic() + timeout
    while True:
        got = found()
        if got:
            return got
        if time.monotonic() > deadline:
            raise CloudboxError(failure())
        time.sleep(interval)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def programs(name: str) -> Iterator[tuple[Path, list[bytes]]]:
    """Each process running program `name` (its argv[0]'s last part): its /proc directory and its argv."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if os.path.basename(argv[0]) == name.encode():
            yield d, argv


def listening(port: int) -> list[list[str]]:
    """The fields of each /proc/net/tcp and tcp6 row of a socket listening on TCP `port`."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 3 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                found.append(f)
    return found


def listens(pid: int, port: int) -> bool:
    """True once process `pid` itself holds a listening TCP socket on `port` (not merely: something answers there)."""
    inodes = {f"socket:[{f[9]}]" for f in listening(port) if len(f) > 9}
    if not inodes:
        return False
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(fd) in inodes:
                return True
        except OSError:
            continue
    return False


class ServedByChild:
    """An export whose server runs as a Child (`child`, None once stopped): its pid and what it read and wrote."""

    child: Child | None

    @property
    def pid(self) -> int | None:
        return self.child.pid if self.child else None

    def io(self) -> dict[str, int]:
        """What the server read from and wrote to storage so far (Child.io); empty once it has stopped."""
        return self.child.io() if self.child else {}

    def stop(self) -> None:
        """End the server (SIGTERM, then SIGKILL after its grace) and remove its log. Safe to call twice."""
        if self.child is not None:
            self.child.stop()


@dataclass
class Child:
    """A server running as a child of this process, its output in `log`; it gets SIGTERM when the thread that
    started it dies. `stop()` ends it and removes the log."""

    program: str
    log: Path
    grace_s: float = 5.0
    proc: subprocess.Popen[bytes] | None = None
    held: ledger.Entry | None = field(default=None, repr=False)  # the run's ledger's entry for it

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def io(self) -> dict[str, int]:
        """What it read from and wrote to storage so far (/proc/PID/io read_bytes, write_bytes, all its threads);
        empty once it has stopped."""
        if self.pid is None:
            return {}
        try:
            text = Path(f"/proc/{self.pid}/io").read_text()
        except OSError:
            return {}
        fields = dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)
        return {k: int(fields[k]) for k in ("read_bytes", "write_bytes") if k in fields}

    def tail(self, limit: int = 300) -> str:
        """The end of what it printed (its stdout and stderr), for an error message."""
        try:
            return self.log.read_text(errors="replace").strip()[-limit:]
        except OSError:
            return ""

    def stop(self) -> None:
        """End it (SIGTERM, SIGKILL after grace_s) and remove its log. Safe to call twice."""
        proc, self.proc = self.proc, None
        if proc is not None:
            stop(proc, self.grace_s)
        if self.held is not None:
            self.held.done()
        self.log.unlink(missing_ok=True)

    @classmethod
    def start(cls, argv: Sequence[str], *, log: Path, ready: Callable[[int], bool], serving: str, ready_is: str,
              timeout: float, grace_s: float = 5.0, death_signal: signal.Signals = signal.SIGTERM) -> Child:
        """Run `argv` and return once `ready(pid)` holds. When it exits first or is not ready within `timeout`
        seconds, it is stopped, its log removed, and the CloudboxError names the program, `serving` (what it was
        to serve) or `ready_is` (what ready means, e.g. "listen on host:port") and the end of its output. It gets
        `death_signal` when this thread dies (SIGKILL for a server that ignores SIGTERM)."""
        child = cls(os.path.basename(argv[0]), log, grace_s)
        # It dies with this process; the run's ledger names it too, for a clean-up of whatever outlived a kill.
        child.held = ledger.hold(ledger.Process(child.program))
        try:
            with open(log, "wb") as out:
                child.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                              preexec_fn=die_with_parent(death_signal))  # noqa: PLW1509 - only prctl, before exec
            child.held.update(pid=child.proc.pid, start=ledger.start_ticks(child.proc.pid))
            deadline = time.monotonic() + timeout
            while True:
                if child.proc.poll() is not None:
                    raise CloudboxError(f"{child.program} exited {child.proc.returncode} before serving {serving}: "
                                        f"{child.tail()}")
                if ready(child.proc.pid):
                    return child
                if time.monotonic() > deadline:
                    raise CloudboxError(f"{child.program} did not {ready_is} within {timeout:.0f} s: "
                                        f"{child.tail() or 'it printed nothing'}")
                time.sleep(0.05)
        except BaseException:
            child.stop()
            raise
