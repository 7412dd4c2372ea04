"""A guest disk that has stopped: DiskWatch reads a guest's /sys/block/<disk>/stat through its agent while a test
runs, and watched_sh runs a test's script under one, killing it with DiskStalled once requests wait in flight and
none completes."""

from __future__ import annotations

import math
import shlex
import time
from collections.abc import Callable

from ..errors import DiskStalled, GuestError, GuestTimeout
from ..spec.catalogue import StorageTest

# Requests in flight on a guest's disk and none completed for this long: the disk has stopped (the kernel's own
# hung-task warning waits as long), not a slow one; the test is killed instead of waiting out guest_timeout.
DISK_STALL_S = 120.0
DISK_WATCH_EVERY_S = 5.0  # how often the guest's disk counters are read while a test runs


def parse_disk_stat(text: str) -> tuple[int, int]:
    """A /sys/block/<disk>/stat line -> (requests completed: reads, writes, discards and flushes; requests in
    flight). ValueError on anything else."""
    f = [int(x) for x in text.split()]
    if len(f) < 11:
        raise ValueError(f"not a block device's stat line: {text!r}")
    return f[0] + f[4] + sum(f[i] for i in (11, 15) if i < len(f)), f[8]


class DiskWatch:
    """Whether a guest's benchmark disks have stopped: requests in flight and not one completed for `stall_s`,
    read from /sys/block/<disk>/stat through the agent every `every` seconds. Called while a guest test runs
    (Guest.run's give_up): returns why it gave up, else None. A read that fails says nothing either way."""

    def __init__(self, guest, disks: list[str], stall_s: float | None = None, every: float = DISK_WATCH_EVERY_S,
                 clock: Callable[[], float] = time.monotonic):
        self.guest = guest
        self.disks = disks
        self.stall_s = DISK_STALL_S if stall_s is None else stall_s
        self.every = every
        self.clock = clock
        self.since = clock()
        self.checked = -math.inf
        self.completed: int | None = None
        self.seen: dict[str, tuple[int, int]] = {}
        self.reason: str | None = None  # why it gave up, once it has
        self.counts = ""  # what showed it

    def read(self) -> dict[str, tuple[int, int]] | None:
        script = "; ".join(f"echo {shlex.quote(d)} $(cat /sys/block/{shlex.quote(d)}/stat)" for d in self.disks)
        try:
            out = self.guest.sh(script, timeout=20).stdout
            found = {name: parse_disk_stat(rest) for name, _, rest in
                     (line.partition(" ") for line in out.splitlines() if line.strip())}
        except (GuestError, ValueError):
            return None
        return found if set(found) == set(self.disks) else None

    def __call__(self) -> str | None:
        now = self.clock()
        if not self.disks or now - self.checked < self.every:
            return None
        self.checked = now
        found = self.read()
        if found is None:
            return None
        self.seen = found
        completed = sum(c for c, _ in found.values())
        if completed != self.completed or not any(n for _, n in found.values()):
            self.completed, self.since = completed, now
            return None
        if now - self.since < self.stall_s:
            return None
        busy = ", ".join(f"{n} on {d}" for d, (_, n) in found.items() if n)
        self.counts = f"in flight {busy}, none completed for {now - self.since:.0f} s"
        self.reason = f"its disk stopped completing requests: {self.counts}"
        return self.reason

    def queues(self) -> str:
        """QEMU's view of the virtio-blk queues (where the requests wait: not taken from the guest's ring, or
        answered and never noticed by it), for the error; "" where QEMU cannot tell."""
        try:
            qs = self.guest.virtio_blk_queues()
        except GuestError:
            return ""
        return "; ".join(f"QEMU's {path.split('/')[3] if path.count('/') > 3 else path} queue: took "
                         f"{q['last_avail_idx']} of the {q['shadow_avail_idx']} requests the guest queued, answered "
                         f"{q['used_idx']}, last interrupt at {q['signalled_used']}" for path, q in qs)


def watched_sh(guest, disks: list[str], t: StorageTest, script: str, **kw):
    """`script` (test `t`) in the guest, watched by a DiskWatch over `disks`: one that stops completing requests has
    the script killed and DiskStalled raised, with the counters and QEMU's queues."""
    watch = DiskWatch(guest, disks)
    try:
        return guest.sh(script, give_up=watch, **kw)
    except GuestTimeout as e:
        if e.why is None or e.why != watch.reason:
            raise
        queues = watch.queues()
        seen = watch.counts + (f"; {queues}" if queues else "")
        raise DiskStalled(f"{t.program} ({t.id}) was killed: its disk stopped completing requests ({seen})",
                          sorted(d for d, (_, n) in watch.seen.items() if n), seen) from e
