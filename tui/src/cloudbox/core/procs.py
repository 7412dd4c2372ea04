"""Processes, shared by the core: whether a pid names a live process, children that die with their parent, and
stopping a child."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
from collections.abc import Callable

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
