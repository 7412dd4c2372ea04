"""diskwatch.DiskWatch: a guest disk with requests in flight and none completed for the stall limit has stopped; one
that completes requests, or has none in flight, has not. The guest's /sys/block/<disk>/stat lines are handed in as
the agent would return them; the real stall is test_disk_stall_real."""

from __future__ import annotations

import pytest

from cloudbox.core.bench.diskwatch import DiskWatch, parse_disk_stat
from cloudbox.core.errors import GuestError
from cloudbox.core.virt.guest import ExecResult

# reads, merges, sectors, ticks; writes, ...; in flight; io ticks; queue time; discards ...; flushes, flush ticks
IDLE = ("    1661        0   212608     3012      400        0    51200     9000        0     3400    12012"
        "        0 0 0 0 7 3")


def stat(reads: int, writes: int, inflight: int, flushes: int = 7) -> str:
    return f"{reads} 0 0 0 {writes} 0 0 0 {inflight} 0 0 0 0 0 0 {flushes} 0"


def test_a_stat_line_gives_requests_completed_and_in_flight():
    assert parse_disk_stat(IDLE) == (1661 + 400 + 7, 0)
    assert parse_disk_stat(stat(5, 6, 32, flushes=2)) == (13, 32)
    assert parse_disk_stat("5 0 0 0 6 0 0 0 3 0 0") == (11, 3)  # an old kernel: no discard or flush fields
    with pytest.raises(ValueError):
        parse_disk_stat("cat: can't open '/sys/block/vdz/stat': No such file or directory")


class Answers:
    """The guest's answers to the watch's reads, one per call, as its agent returns them."""

    def __init__(self, *outputs: str | Exception):
        self.outputs = list(outputs)
        self.scripts: list[str] = []

    def sh(self, script: str, timeout: float) -> ExecResult:
        self.scripts.append(script)
        out = self.outputs.pop(0)
        if isinstance(out, Exception):
            raise out
        return ExecResult(["/bin/sh", "-c", script], 0, out, "")


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def watch(answers: Answers, disks=("vda",), stall_s=30.0) -> tuple[DiskWatch, Clock]:
    clock = Clock()
    return DiskWatch(answers, list(disks), stall_s=stall_s, every=5.0, clock=clock), clock


def test_requests_in_flight_and_none_completed_for_the_limit_is_a_stall():
    w, clock = watch(Answers(*[f"vda {stat(10, 20, 32)}"] * 8))
    for _ in range(6):  # 0, 5, ... 25 s after the first read that saw these counts: within the limit
        assert w() is None
        clock.t += 5
    why = w()
    assert why is not None and "in flight 32 on vda" in why and "none completed for 30 s" in why
    assert w.reason == why and w.seen == {"vda": (37, 32)}
    assert "cat /sys/block/vda/stat" in w.guest.scripts[0]


def test_a_completed_request_or_an_idle_disk_restarts_the_clock():
    w, clock = watch(Answers(f"vda {stat(10, 20, 32)}", f"vda {stat(10, 20, 32)}", f"vda {stat(11, 20, 32)}",
                             f"vda {stat(11, 20, 0)}", f"vda {stat(11, 20, 0)}", f"vda {stat(11, 20, 4)}",
                             f"vda {stat(11, 20, 4)}"), stall_s=12.0)
    for _ in range(7):
        assert w() is None  # a completion at 110 s, then idle until 120 s: never 12 s stuck
        clock.t += 5
    assert w.seen == {"vda": (38, 4)}


def test_reads_between_checks_are_skipped_and_a_failed_read_says_nothing():
    answers = Answers(GuestError("agent busy"), f"vda {stat(1, 1, 1)}", "garbage", f"vda {stat(1, 1, 1)}")
    w, clock = watch(answers, stall_s=5.0)
    assert w() is None  # the read failed
    clock.t += 1
    assert w() is None and len(answers.scripts) == 1  # 1 s later: not read again
    clock.t += 4
    assert w() is None  # first counts, at 105 s
    clock.t += 5
    assert w() is None  # not a stat line
    clock.t += 5
    assert w() is not None  # the same counts 10 s after the first


def test_every_disk_is_watched_and_a_stall_needs_all_of_them_quiet():
    both = Answers(f"vdb {stat(1, 1, 0)}\nvda {stat(5, 5, 8)}", f"vdb {stat(1, 2, 0)}\nvda {stat(5, 5, 8)}",
                   f"vdb {stat(1, 2, 0)}\nvda {stat(5, 5, 8)}", f"vdb {stat(1, 2, 0)}\nvda {stat(5, 5, 8)}")
    w, clock = watch(both, disks=("vda", "vdb"), stall_s=10.0)
    assert w() is None
    clock.t += 5
    assert w() is None  # vdb completed a write: the array as a whole moves
    clock.t += 5
    assert w() is None
    clock.t += 5
    why = w()
    assert why is not None and "in flight 8 on vda" in why and "vdb" not in why
    missing = Answers(f"vda {stat(5, 5, 8)}")
    w, _ = watch(missing, disks=("vda", "vdb"))
    assert w() is None and w.seen == {}  # one disk's counts missing: no verdict


def test_a_watch_without_disks_never_reads():
    answers = Answers()
    w, clock = watch(answers, disks=())
    clock.t += 1000
    assert w() is None and answers.scripts == []
