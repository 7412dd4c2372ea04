"""The host's huge pages reserved for a run's guests and given back after it.

`HugePages(kib, node)` is one pool: the host's pages of one size (2048 or 1048576 KiB), on one NUMA node when the
guest's RAM is bound to one, else the whole host's (sysfs' nr_hugepages and free_hugepages). It reads the pool as
found when made, so `release()` (registered on the run's cleanup stack before `reserve()` changes anything) puts
nr_hugepages back to that value. `reserve(pages)` grows the pool by what is missing and refuses with the arithmetic
when the host cannot give it: more than its available memory, or fewer pages than asked once the kernel has tried
(memory too fragmented for pages that large, 1 GiB pages especially: those are reserved at boot).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from ..errors import CloudboxError

SYSFS_MM = Path("/sys/kernel/mm/hugepages")
SYSFS_NODES = Path("/sys/devices/system/node")
MEMINFO = Path("/proc/meminfo")


class HugePagesRefused(CloudboxError):
    """The host cannot give the run the huge pages its guests' RAM needs."""


def pages_for(memory_mib: int, page_kib: int, guests: int = 1) -> int:
    """Huge pages of `page_kib` that `guests` guests of `memory_mib` each take."""
    return math.ceil(memory_mib * 1024 / page_kib) * guests


def _mib(kib: int) -> str:
    return f"{kib // 1024} MiB" if kib < 1024 * 1024 else f"{kib // (1024 * 1024)} GiB"


def _need(pages: int, page_kib: int, memory: str) -> str:
    return f"{memory + ' needs ' if memory else ''}{pages} page{'s' if pages != 1 else ''} of {_mib(page_kib)}"


def _kernel_size(kib: int) -> str:
    """A page size as the kernel's hugepagesz= takes it: 2M, 1G."""
    return f"{kib // 1024}M" if kib < 1024 * 1024 else f"{kib // (1024 * 1024)}G"


def _int(path: Path) -> int:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return 0


def mem_available_kib(meminfo: Path = MEMINFO) -> int | None:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


@dataclass(frozen=True)
class PoolState:
    """One pool's counters: pages reserved (nr_hugepages) and free among them."""

    total: int
    free: int


class HugePages:
    """One pool of huge pages (a size, on one node or the whole host), as found when made."""

    def __init__(self, page_kib: int, node: int | None = None, *, mm: Path | None = None,
                 nodes: Path | None = None, meminfo: Path | None = None):
        self.page_kib, self.node = page_kib, node
        base = (mm or SYSFS_MM) if node is None else (nodes or SYSFS_NODES) / f"node{node}" / "hugepages"
        self.dir = base / f"hugepages-{page_kib}kB"
        self.meminfo = meminfo or MEMINFO
        if not self.dir.is_dir():
            sizes = sorted(int(d.name[len("hugepages-"):-2]) for d in base.glob("hugepages-*kB"))
            raise HugePagesRefused(f"this host's kernel offers no {_mib(page_kib)} huge pages ({self.where}); "
                                   f"allowed: {', '.join(_mib(s) for s in sizes) or 'none (no hugetlbfs support)'}")
        self.before = self.state()
        self.added = 0

    @property
    def where(self) -> str:
        return "the whole host" if self.node is None else f"NUMA node {self.node}"

    def state(self) -> PoolState:
        return PoolState(_int(self.dir / "nr_hugepages"), _int(self.dir / "free_hugepages"))

    def _write(self, total: int) -> None:
        (self.dir / "nr_hugepages").write_text(f"{total}\n")

    def reserve(self, pages: int, memory: str = "") -> PoolState:
        """At least `pages` free pages in the pool, growing it by what is missing; `memory` says what they are for
        (in the refusal). Returns the pool's state once reserved."""
        have = self.before
        missing = pages - have.free
        if missing <= 0:
            return have
        short = self.shortfall(pages, memory)
        if short:
            raise HugePagesRefused(short)
        self.added = missing
        self._write(have.total + missing)
        got = self.state()
        size, need = _mib(self.page_kib), _need(pages, self.page_kib, memory)
        if got.free < pages:
            self.release()
            raise HugePagesRefused(
                f"{need} on {self.where}: {have.free} of its {have.total} were free and the kernel found room for "
                f"only {got.total - have.total} of the {missing} more asked (memory too fragmented for pages of "
                f"{size}, which are surest reserved at boot: hugepagesz={_kernel_size(self.page_kib)} "
                f"hugepages={have.total + missing} on the kernel's command line); allowed: fewer pages, or pages "
                "reserved at boot")
        return got

    def shortfall(self, pages: int, memory: str = "") -> str:
        """Why the pool cannot hold `pages` free pages without more memory than the host has available, with the
        arithmetic; "" when it can (the kernel may still find too few: reserve() says so)."""
        have = self.before
        missing = pages - have.free
        avail = mem_available_kib(self.meminfo)
        if missing <= 0 or avail is None or missing * self.page_kib <= avail:
            return ""
        return (f"{_need(pages, self.page_kib, memory)} on {self.where}: {have.free} of its {have.total} are free, "
                f"so {missing} more ({missing * self.page_kib // 1024} MiB) would have to be reserved, and the host "
                f"has {avail // 1024} MiB available; allowed: a smaller guest.memory_mib or fewer guests, or free "
                "memory")

    def release(self) -> PoolState:
        """The pool back to the size it was found at (pages a guest still holds come back once it is gone)."""
        if self.added:
            self._write(self.before.total)
            self.added = 0
        return self.state()
