"""What a storage tool's run gives back: its figures as a FioResult, whichever tool measured them, and the elapsed-time
line a guest script prints for a tool that times nothing itself (busybox's dd; Bonnie++).

fio, dd, IOzone, Bonnie++, iscsi-perf and the MPI jobs each parse their output into a FioResult; the run's steps
store it (core.run.measure) without knowing the tool.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..record.latency import Histogram

MB = 1_000_000


@dataclass
class FioResult:
    test: str
    mbps: float
    iops: float
    lat_us: float
    seconds: float
    raw: str
    extra: dict = field(default_factory=dict)
    started_uptime: float | None = None  # a guest test held at a barrier: the guest's uptime when it was let go
    latency: Histogram | None = None  # a random fio test's completion latencies in fio's bins (json+)


_ELAPSED = re.compile(r"cloudbox-elapsed ([\d.]+) ([\d.]+)")


def timed_script(cmd: str) -> str:
    """Shell that runs `cmd` between two reads of the guest's uptime and prints the "cloudbox-elapsed" line
    (elapsed() reads it) on stderr; `$rc` holds `cmd`'s exit status after it."""
    return (f"s=$(cat /proc/uptime); {cmd}; rc=$?; e=$(cat /proc/uptime); "
            'echo "cloudbox-elapsed ${s%% *} ${e%% *}" >&2; ')


def elapsed(text: str) -> float | None:
    """The seconds a timed_script's "cloudbox-elapsed" line in `text` says, None when there is none."""
    m = _ELAPSED.search(text)
    return float(m[2]) - float(m[1]) if m else None
