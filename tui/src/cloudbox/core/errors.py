"""The error types cloudbox.core raises: every one carries a message meant for a person."""

from __future__ import annotations


class CloudboxError(Exception):
    """Base class. str(err) is a complete, user-facing explanation; no traceback needed."""


class ProfileError(CloudboxError):
    """A tuning profile is invalid. Carries one entry per problem."""

    def __init__(self, source: str, problems: list[ProfileProblem]):
        self.source = source
        self.problems = problems
        lines = [f"{source}: invalid profile ({len(problems)} problem{'s' if len(problems) != 1 else ''})"]
        lines += [f"  {p}" for p in problems]
        super().__init__("\n".join(lines))


class ProfileProblem:
    """One problem in a profile: the key (dotted path), the bad value, what is allowed."""

    def __init__(self, key: str, value: object, message: str, allowed: str | None = None):
        self.key = key
        self.value = value
        self.message = message
        self.allowed = allowed

    def __str__(self) -> str:
        s = f"{self.key}: {self.message} (got {self.value!r})"
        if self.allowed:
            s += f"; allowed: {self.allowed}"
        return s

    def as_dict(self) -> dict[str, object]:
        return {"key": self.key, "value": self.value, "message": self.message, "allowed": self.allowed}


class NotFound(CloudboxError):
    """A named thing (profile, run, guest, device) does not exist."""


class DeviceRefused(CloudboxError):
    """cloudbox refuses to write to a device or path (mounted, in use, holds data, not chosen)."""


class NoSpace(CloudboxError):
    """Not enough free space for a backing store or test file."""


class LibvirtUnavailable(CloudboxError):
    """libvirtd cannot be reached or refuses us."""


class GuestError(CloudboxError):
    """The benchmark guest failed: did not boot, agent silent, tool missing or failing."""


class GuestUnreachable(GuestError):
    """The guest stopped (crashed, powered off, killed) or its agent stopped answering."""


class RunBusy(CloudboxError):
    """Another cloudbox run is active on this host."""


class Aborted(CloudboxError):
    """A run was cancelled (Ctrl-C, SIGTERM, or an explicit cancel)."""


class PermissionProblem(CloudboxError):
    """The caller lacks a privilege cloudbox needs (root, or membership in a group)."""


class AnswerError(CloudboxError):
    """An install answer file is invalid, or does not fit this machine. One entry per problem, each naming the
    key, the bad value and what is allowed (the same shape as a ProfileProblem)."""

    def __init__(self, source: str, problems: list[ProfileProblem]):
        self.source = source
        self.problems = problems
        n = len(problems)
        lines = [f"{source}: invalid answer file ({n} problem{'s' if n != 1 else ''}); nothing was written"]
        lines += [f"  {p}" for p in problems]
        super().__init__("\n".join(lines))


class InstallError(CloudboxError):
    """Installing to disk failed at a step; the message names the step, the device and how to resume."""
