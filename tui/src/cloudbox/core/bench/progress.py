"""What a storage tool has done of its test's plan while it runs: IOzone's cells (file and record sizes) and passes
read from its output as it goes, dd's bytes from the position of its file, Bonnie++'s phases from its messages; each
as a share of the plan with a line saying what is done, and the progress payload (percent, time elapsed and left)
the run's events carry.

fio reports its own progress (core.bench.fio.parse_eta); the tools here print none, so a runner reads their output
or their file position every second or two and hands the result to a Pace.
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..record.events import duration_text
from ..spec.catalogue import IOZONE_GRID, IOZONE_SWEEPS, StorageTest, block_bytes
from .bonnie import bonnie_file_mib
from .dd import dd_args
from .iozone import IOZONE_FILE_PASSES, iozone_grid_records, kib_text
from .result import MB

Done = tuple[float, str]  # (share of the plan done, 0..1; what is done, in words)


class Pace:
    """A test's clock: the progress payload of a share done, with the seconds elapsed since the test started and the
    time left at the pace so far."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.t0 = clock()

    def payload(self, done: Done | None) -> dict[str, Any]:
        """{"pct", "elapsed", "done", "eta"}: "eta" once something is done, and nothing but the time elapsed when
        `done` is None (the tool has said nothing yet)."""
        elapsed = self.clock() - self.t0
        out: dict[str, Any] = {"elapsed": round(elapsed, 1)}
        if done is None:
            return out
        frac, words = max(0.0, min(1.0, done[0])), done[1]
        out.update(pct=round(100 * frac, 1), done=words)
        if 0 < frac < 1 and elapsed > 0:
            out["eta"] = duration_text(elapsed * (1 - frac) / frac)
        return out


# ---------------------------------------------------------------------------------------------------------- IOzone
# A cell's cost in the estimate: its requests (IOzone issues one at a time, O_DIRECT) plus its bytes, one request
# costing as much time as moving REQUEST_KIB: under emulation and on a hard disk the 4 kB records' requests dominate.
REQUEST_KIB = 64


@dataclass(frozen=True)
class IozonePlan:
    """What an IOzone run of a test measures, in its order: the cells (file KiB, record KiB) and the passes over each
    (automatic mode's write, re-write, read, re-read; one pass's two)."""

    cells: tuple[tuple[int, int], ...]
    passes: tuple[str, ...]

    def weight(self, cell: tuple[int, int]) -> float:
        kib, rec = cell
        return kib / rec + kib / REQUEST_KIB


def iozone_plan(t: StorageTest, size: int) -> IozonePlan:
    """The cells IOzone's command line for `t` over `size` bytes (iozone.iozone_test_args) measures: automatic mode's
    files from its smallest record doubling up to `size`, each with every record of the test no larger than the file
    (IOzone's own rule with -y/-q or -r); one pass's single file."""
    file_kib = max(1, size // 1024)
    if t.tool not in IOZONE_SWEEPS:
        passes = ("write", "re-write") if t.writes else ("read", "re-read")
        return IozonePlan(((file_kib, block_bytes(t.bs) // 1024),), passes)
    records = [r // 1024 for r in iozone_grid_records(t)] if t.tool == IOZONE_GRID else [block_bytes(t.bs) // 1024]
    cells, kib = [], records[0]
    while kib <= file_kib:
        cells += [(kib, r) for r in records if r <= kib]
        kib *= 2
    return IozonePlan(tuple(cells), IOZONE_FILE_PASSES)


_ROW = re.compile(r"^\s*(\d+)\s+(\d+)((?:\s+\d+)*)\s*$")


def iozone_done(plan: IozonePlan, text: str, *, tail: bool = False) -> Done:
    """How much of `plan` IOzone's output `text` shows done: its last result row (file KiB, record KiB, then one
    figure per pass as each ends; the row is printed as the cell starts) placed in the plan. `tail`: `text` is the
    end of the output, its first line possibly cut."""
    lines = text.splitlines()[1 if tail else 0:]
    index, passes = -1, 0
    for line in reversed(lines):
        m = _ROW.match(line)
        if m and (cell := (int(m[1]), int(m[2]))) in plan.cells:
            index, passes = plan.cells.index(cell), min(len(m[3].split()), len(plan.passes))
            break
    n = len(plan.cells)
    if index < 0:
        index, passes = 0, 0
    elif passes == len(plan.passes) and index + 1 < n:
        index, passes = index + 1, 0  # the row is complete: the next cell is the one running
    total = sum(plan.weight(c) for c in plan.cells)
    done = sum(plan.weight(c) for c in plan.cells[:index]) + plan.weight(plan.cells[index]) * passes / len(plan.passes)
    if passes == len(plan.passes):
        return 1.0, (f"{n} of {n} cells done" if n > 1 else "every pass done")
    kib, rec = plan.cells[index]
    at = f"pass {passes + 1} of {len(plan.passes)}: {plan.passes[passes]}"
    if n > 1:
        at = f"cell {index + 1} of {n}: {kib_text(kib)} file, {kib_text(rec)} records, {at}"
    return done / total if total else 0.0, at


# -------------------------------------------------------------------------------------------------------------- dd
def dd_total(t: StorageTest, target: str, size: int) -> int:
    """The bytes dd's command line for `t` (dd.dd_args) copies: its count of 64 KiB blocks."""
    count = next(a for a in dd_args(t, target, size) if a.startswith("count="))
    return int(count.removeprefix("count=")) * 64 * 1024


def dd_fd(t: StorageTest) -> int:
    """The descriptor whose position is dd's progress: GNU and busybox dd both open if= as 0 and of= as 1; a write's
    bytes are those written to its file, a read's those read from it."""
    return 1 if t.writes else 0


def dd_pos_script(pid_file: str, fd: int) -> str:
    """Shell printing the fdinfo of descriptor `fd` of the dd whose process id is in `pid_file` (dd.timed_dd_script's),
    nothing before dd has started or once it has ended."""
    return f"cat /proc/$(cat {shlex.quote(pid_file)} 2>/dev/null)/fdinfo/{fd} 2>/dev/null"


def fdinfo_pos(text: str) -> int | None:
    """The "pos:" of a /proc/PID/fdinfo/FD text, None when there is none."""
    m = re.search(r"^pos:\s*(\d+)", text, re.M)
    return int(m[1]) if m else None


def dd_done(total: int, pos: int | None) -> Done | None:
    """dd's share done from its file's position (None when it could not be read: dd not started or already gone)."""
    if pos is None or total <= 0:
        return None
    return min(1.0, pos / total), f"{pos / MB:.0f} of {total / MB:.0f} MB"


# -------------------------------------------------------------------------------------------------------- Bonnie++
# Bonnie++'s phases with -f (no per-character passes), as its messages on stderr start them, each with its name here
# and its weight: the block passes by the bytes they move (a rewrite reads and writes), the seeks and each file pass
# a fraction of one block pass.
BONNIE_PHASES = (
    ("Writing intelligently", "block write", 1.0),
    ("Rewriting", "rewrite", 2.0),
    ("Reading intelligently", "block read", 1.0),
    ("start 'em", "seeks", 0.5),
    ("Create files in sequential order", "sequential create", 0.25),
    ("Stat files in sequential order", "sequential stat", 0.25),
    ("Delete files in sequential order", "sequential delete", 0.25),
    ("Create files in random order", "random create", 0.25),
    ("Stat files in random order", "random stat", 0.25),
    ("Delete files in random order", "random delete", 0.25),
)


def bonnie_done(text: str, size: int | None = None) -> Done:
    """How much of its phases Bonnie++'s messages `text` show done: every phase before the last one started, and
    that one once its line says "done"; `size` (the disk's bytes) names the file in the line."""
    started = [i for i, (msg, _, _) in enumerate(BONNIE_PHASES) if msg in text]
    n = len(BONNIE_PHASES)
    total = sum(w for _, _, w in BONNIE_PHASES)
    if not started:
        return 0.0, f"phase 1 of {n}: {BONNIE_PHASES[0][1]}" + _bonnie_file(size)
    last = max(started)
    line = next(ln for ln in reversed(text.splitlines()) if BONNIE_PHASES[last][0] in ln)
    # a phase's line ends "done" as it ends; the seeks' says "done" once per seeker process: they end as the next
    # phase begins
    ends = line.rstrip().endswith(("done", "done.")) and BONNIE_PHASES[last][1] != "seeks"
    finished = last + 1 if ends else last
    if finished == n:
        return 1.0, f"{n} of {n} phases done"
    done = sum(w for _, _, w in BONNIE_PHASES[:finished])
    return done / total, f"phase {finished + 1} of {n}: {BONNIE_PHASES[finished][1]}" + (
        _bonnie_file(size) if finished < 3 else "")


def _bonnie_file(size: int | None) -> str:
    return "" if size is None else f", {bonnie_file_mib(size)} MiB file"
