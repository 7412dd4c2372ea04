"""The error types cloudbox.core raises: every one carries a message meant for a person; and the secrets this process
holds, which no message, event or stored reason may carry (`keep_secret`, `masked`)."""

from __future__ import annotations

import threading

from cloudbox.core.inputs import InputProblem, got, printable


class CloudboxError(Exception):
    """Base class. str(err) is a complete, user-facing explanation; no traceback needed."""


class ProblemsError(CloudboxError):
    """An input file is invalid: one entry per problem, each naming the key, the bad value and what is allowed."""

    WHAT = "input"  # what the source is, in the first line
    AFTER = ""  # said after the count

    def __init__(self, source: str, problems: list[ProfileProblem]):
        self.source = source
        self.problems = problems
        n = len(problems)
        lines = [f"{printable(source)}: invalid {self.WHAT} ({n} problem{'s' if n != 1 else ''}){self.AFTER}"]
        lines += [f"  {p}" for p in problems]
        super().__init__("\n".join(lines))


class ProfileError(ProblemsError):
    """A tuning profile is invalid."""

    WHAT = "profile"


class StudyError(ProblemsError):
    """A study file is invalid."""

    WHAT = "study"


class ProfileProblem:
    """One problem in a profile: the key (dotted path), the bad value, what is allowed."""

    def __init__(self, key: str, value: object, message: str, allowed: str | None = None):
        self.key = key
        self.value = value
        self.message = message
        self.allowed = allowed

    def __str__(self) -> str:
        s = f"{printable(self.key)}: {printable(self.message)}{got(self.value)}"
        if self.allowed:
            s += f"; allowed: {printable(self.allowed)}"
        return s

    def as_dict(self) -> dict[str, object]:
        return {"key": self.key, "value": self.value, "message": self.message, "allowed": self.allowed}


def problem_from(p: InputProblem) -> ProfileProblem:
    """An input layer problem (a file, its syntax, its nesting) as a problem of the profile or answer file."""
    return ProfileProblem(p.where, p.value, p.message, p.allowed)


class UsageError(CloudboxError):
    """A value given on the command line or in a form is not allowed (the CLI exits 2): the message names the
    option, the value and what is allowed."""


class NotFound(CloudboxError):
    """A named thing (profile, run, guest, device) does not exist."""


class DeviceRefused(CloudboxError):
    """cloudbox refuses to write to a device or path (mounted, in use, holds data, not chosen)."""


class NoSpace(CloudboxError):
    """Not enough free space for a backing store or test file."""


class LibvirtUnavailable(CloudboxError):
    """libvirtd cannot be reached or refuses us."""


class LibvirtLost(LibvirtUnavailable):
    """libvirtd went away (died, restarted) while a run used it: not a fault of the guest."""


class GuestError(CloudboxError):
    """The benchmark guest failed: did not boot, agent silent, tool missing or failing."""


class GuestTimeout(GuestError):
    """A program in the guest did not finish in its time (or was given up on: `why`) and was killed."""

    def __init__(self, message: str, why: str | None = None):
        super().__init__(message)
        self.why = why


class GuestUnreachable(GuestError):
    """The guest stopped (crashed, powered off, killed) or its agent stopped answering."""


class NicStalled(GuestError):
    """The guest's network path stopped carrying frames and re-plugging its NIC did not bring it back. `hop` says
    where the frames stop (network.PathProbe.hop); the message carries the counters that show it."""

    def __init__(self, message: str, hop: str):
        super().__init__(message)
        self.hop = hop


class RunBusy(CloudboxError):
    """Another cloudbox run is active on this host."""


class DiskStalled(GuestError):
    """The guest's benchmark disk stopped completing requests (bench.diskwatch) and its test was killed. `disks`
    names those with requests in flight; `seen` (also in the message) is the counters and QEMU's view of the
    queues that show it."""

    def __init__(self, message: str, disks: list[str], seen: str):
        super().__init__(message)
        self.disks = disks
        self.seen = seen  # the counters and queues, without the test's name


class Aborted(CloudboxError):
    """A run was cancelled (Ctrl-C, SIGTERM, or an explicit cancel)."""


class PermissionProblem(CloudboxError):
    """The caller lacks a privilege cloudbox needs (root, or membership in a group)."""


class AnswerError(ProblemsError):
    """An install answer file is invalid, or does not fit this machine."""

    WHAT = "answer file"
    AFTER = "; nothing was written"


class InstallError(CloudboxError):
    """Installing to disk failed at a step; the message names the step, the device and how to resume."""


# -- secrets: never in a message that is shown or stored ---------------------------------------------------------
MASK = "********"
MIN_SECRET = 8  # shorter values (a test's "x") would mask ordinary words
_secrets: set[str] = set()
_secrets_lock = threading.Lock()


def keep_secret(value: str) -> str:
    """Remember `value` (a CHAP secret, a DH-HMAC-CHAP key) as this process's secret, so `masked` hides it wherever
    it turns up; returns it."""
    if len(value) >= MIN_SECRET:
        with _secrets_lock:
            _secrets.add(value)
    return value


def masked(text: str) -> str:
    """`text` with every secret this process holds (keep_secret) replaced by MASK: what a run's reason, its events
    and an error shown to a person go through, whatever path the secret took into the text."""
    with _secrets_lock:
        found = [s for s in _secrets if s in text]
    for s in sorted(found, key=len, reverse=True):
        text = text.replace(s, MASK)
    return text
