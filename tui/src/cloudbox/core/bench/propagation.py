"""Image propagation (study B): how long provisioning a guest from a disk image takes, against the image's size.

The study (Nimbus and OpenNebula) started a VM from an image of size S, waited until it ran and terminated it, ten
times per size from 3 to 21 GB, and fitted a straight line to time against size: the intercept is what the cloud
manager adds whatever the size, the slope the transfer. cloudbox's equivalent on one box (a run of suite
"propagation", core.run.propagate): the source image of each size lives in cloudbox's image store
(`store_dir()`: made once, filled with data, reused); each sample copies it to a fresh instance file in the run's
work directory, as a manager copied its repository's image to the node's disk, starts the benchmark guest with that
copy as its disk, waits for its agent, destroys the guest and deletes the copy.

This module is what needs no guest: the source images, the copy, the free space a sweep needs, the samples read back
from stored runs, and the least-squares line through them.
"""

from __future__ import annotations

import os
import re
import statistics
import struct
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from .. import paths
from ..disks import backing
from ..errors import NoSpace
from ..record.events import FINAL_STATES
from ..record.rows import Run
from ..spec.runspec import MIB, PROPAGATION, propagation_size

COPY = "copy_s"  # the image copied from the store to the instance file, flushed to disk
BOOT = "boot_s"  # the guest started on the copy until its agent answered
TOTAL = "total_s"  # both: from the copy's first byte to the agent's answer
METRICS = (COPY, BOOT, TOTAL)
GB = 1e9  # the fit's unit of size, as the study's "3 to 21 GB"; MB/s likewise in 10^6 bytes

FILL_BLOCK = 4 * MIB
PAGE = 4096
COPY_CHUNK = 8 * MIB
SOURCE_SUFFIX = ".raw"
PART_SUFFIX = ".part"

Progress = Callable[[int, int], None]  # (bytes done, bytes in all)


# ------------------------------------------------------------------------------------------- source images
def store_dir() -> Path:
    """cloudbox's image store for the sweep's source images (<state dir>/propagation-images)."""
    return paths.state_dir() / "propagation-images"


def source_path(size_bytes: int) -> Path:
    return store_dir() / f"{size_bytes // MIB}m{SOURCE_SUFFIX}"


def part_path(size_bytes: int) -> Path:
    """Where a source image is written before it is complete (renamed into place then)."""
    return source_path(size_bytes).with_name(source_path(size_bytes).name + PART_SUFFIX)


@dataclass(frozen=True)
class SourceImage:
    path: Path
    size_bytes: int
    complete: bool  # False: a `.part` a stopped run left (removed by the next sweep or `study images --clear`)


_SOURCE_NAME = re.compile(r"([1-9][0-9]{0,7})m" + re.escape(SOURCE_SUFFIX) + f"({re.escape(PART_SUFFIX)})?")


def list_sources() -> list[SourceImage]:
    """The store's source images by size: complete ones whose file has its full size, and cut ones."""
    d = store_dir()
    out = []
    for f in sorted(d.iterdir()) if d.is_dir() else ():
        m = _SOURCE_NAME.fullmatch(f.name)
        if m is None or not f.is_file():
            continue
        size = int(m.group(1)) * MIB
        out.append(SourceImage(f, size, m.group(2) is None and f.stat().st_size == size))
    return sorted(out, key=lambda s: (s.size_bytes, s.complete))


def clear_sources(keep: Collection[int] = ()) -> list[SourceImage]:
    """Remove the store's source images but the complete ones of the sizes in `keep`; what was removed."""
    removed = []
    for src in list_sources():
        if src.complete and src.size_bytes in keep:
            continue
        src.path.unlink(missing_ok=True)
        removed.append(src)
    return removed


def fill_file(path: Path, size_bytes: int, progress: Progress | None = None) -> None:
    """Write `size_bytes` of data to a new file `path` and flush it to disk: random bytes, each 4 KiB page stamped
    with its block's number so that no two pages are alike (neither compression nor deduplication can shrink the
    file), and no hole anywhere."""
    block = bytearray(os.urandom(FILL_BLOCK))
    written = n = 0
    with open(path, "xb", buffering=0) as f:
        while written < size_bytes:
            for off in range(0, FILL_BLOCK, PAGE):
                struct.pack_into("<Q", block, off, n)
            chunk = memoryview(block)[:min(FILL_BLOCK, size_bytes - written)]
            _write_all(f, chunk)
            written += len(chunk)
            n += 1
            if progress is not None:
                progress(written, size_bytes)
        os.fsync(f.fileno())


def _write_all(f: object, data: memoryview) -> None:
    done = 0
    while done < len(data):
        done += f.write(data[done:])  # type: ignore[attr-defined]


def copy_image(src: Path, dst: Path, progress: Progress | None = None) -> float:
    """Copy `src` to a new file `dst` and flush it to disk; the seconds that took."""
    total = src.stat().st_size
    buf = bytearray(COPY_CHUNK)
    view = memoryview(buf)
    done = 0
    t0 = time.monotonic()
    # Every byte by hand, then fsync: a reflink or sparse copy would time metadata, not the managers' transfer.
    with open(src, "rb", buffering=0) as fin, open(dst, "xb", buffering=0) as fout:
        while n := fin.readinto(buf):
            _write_all(fout, view[:n])
            done += n
            if progress is not None:
                progress(done, total)
        os.fsync(fout.fileno())
    return time.monotonic() - t0


# ------------------------------------------------------------------------------------------------ free space
def check_space(sizes: Sequence[int], work_base: Path, *, hint: str = "") -> None:
    """Refuse (NoSpace) a sweep over `sizes` whose files do not fit: the source images still to make in the store
    and the largest instance copy in `work_base` (one at a time: each is deleted before the next), each with the
    64 MiB margin, on one file system or two; source images of other sizes, which the sweep removes, count as
    free. The message names the directory, what is needed and what is free; `hint` is what the caller can change."""
    wanted = set(sizes)
    if not wanted:
        return
    sources = list_sources()
    have = {s.size_bytes for s in sources if s.complete}
    missing = sum(s for s in wanted if s not in have)
    stale = sum(s.path.stat().st_size for s in sources if not (s.complete and s.size_bytes in wanted))
    largest = max(wanted)
    store_at, store_free = backing.free_bytes_at(store_dir())
    work_at, work_free = backing.free_bytes_at(work_base)
    parts = [(work_at, work_free, largest, "the largest instance copy")]
    if os.stat(store_at).st_dev == os.stat(work_at).st_dev:
        parts = [(work_at, work_free + stale, largest + missing, "the largest instance copy"
                  + (f" and the source images still to make ({backing.human_size(missing)})" if missing else ""))]
    elif missing:
        parts.append((store_at, store_free + stale, missing, "the source images still to make in the image store"))
    for where, free, need, what in parts:
        if free < need + backing.MARGIN:
            raise NoSpace(
                f"{where}: not enough free space for the image-propagation sweep (images of "
                f"{', '.join(size_text(s) for s in sorted(wanted))}): it needs "
                f"{backing.human_size(need + backing.MARGIN)} for {what} ({backing.human_size(backing.MARGIN)} "
                f"margin included), {backing.human_size(free)} free"
                + (f" (counting {backing.human_size(stale)} of source images the sweep would remove)" if stale else "")
                + ". Allowed: " + (hint or "a --work-dir on a larger file system, or more free space there"))


# ---------------------------------------------------------------------------------------------- samples
@dataclass(frozen=True)
class Sample:
    """One provisioning: the image's size and the seconds of its copy, of the guest's boot to its agent, and of
    both; with its run's facts (for the labels every view shows)."""

    run_id: int
    size_bytes: int
    copy_s: float
    boot_s: float
    total_s: float
    started_at: float | None = None
    accelerator: str | None = None
    emulated: bool = False
    size_label: str | None = None
    labels: tuple[str, ...] = ()
    profile_changed: bool = False

    @property
    def size_gb(self) -> float:
        return self.size_bytes / GB

    @property
    def copy_mbps(self) -> float | None:
        return self.size_bytes / self.copy_s / 1e6 if self.copy_s > 0 else None

    @property
    def qualifiers(self) -> list[str]:
        """Why this sample is weaker than one on bare hardware at study size, in a word each (as Cell's)."""
        out = []
        # a TCG guest on a virtual host (label "nested") is emulated: that is what makes its numbers unusable
        if self.accelerator == "nested-kvm":
            out.append("nested")
        elif self.emulated or "emulated" in self.labels:
            out.append("emulated")
        elif "nested" in self.labels:
            out.append("nested")
        if self.size_label == "quick":
            out.append("quick")
        if "warm-cache" in self.labels:
            out.append("warm cache")
        if self.profile_changed:
            out.append("profile changed")
        return out


def is_propagation_run(run: Run) -> bool:
    return run.suite == PROPAGATION


def samples_of(run: Run, *, profile_hash: str | None = None) -> list[Sample]:
    """The whole samples a propagation run stored (its three rows of one sample share test and start time), oldest
    first; a run that stopped part-way keeps those it finished. `profile_hash`: the profile's hash today, for the
    "profile changed" label."""
    rows: dict[tuple[str, float | None], dict[str, float]] = {}
    labels: dict[tuple[str, float | None], tuple[str, ...]] = {}
    for m in run.measurements:
        if m.side == "guest" and m.metric in METRICS and propagation_size(m.test) is not None:
            key = (m.test, m.started_at)
            rows.setdefault(key, {})[m.metric] = m.value
            labels[key] = tuple(m.labels)
    changed = bool(profile_hash and run.profile_hash and run.profile_hash != profile_hash)
    out = []
    for (test, started), values in rows.items():
        if all(k in values for k in METRICS):
            size = propagation_size(test)
            assert size is not None
            out.append(Sample(run.id, size, values[COPY], values[BOOT], values[TOTAL], started, run.accelerator,
                              run.emulated, run.size_label, labels[(test, started)], changed))
    return sorted(out, key=lambda s: (s.started_at or 0.0, s.size_bytes))


def finished(run: Run) -> bool:
    """A propagation run whose samples count: it ended, whichever way (each sample is stored whole)."""
    return is_propagation_run(run) and run.state in FINAL_STATES


def size_text(size_bytes: int) -> str:
    """An image size as the study file gives it: "512 MiB", "3 GiB"."""
    mib = size_bytes // MIB
    return f"{mib // 1024} GiB" if mib >= 1024 and mib % 1024 == 0 else f"{mib} MiB"


# ------------------------------------------------------------------------------------------------- the fit
class NoFit(ValueError):
    """No line can be fitted through these samples; the message says why."""


@dataclass(frozen=True)
class Fit:
    """The least-squares line total = intercept + slope x size (size in GB): the intercept is the fixed overhead
    in seconds, the slope seconds per GB; R² the share of the variance the line explains (None when every total
    is the same); n samples over `sizes` distinct sizes."""

    intercept_s: float
    slope_s_per_gb: float
    r2: float | None
    n: int
    sizes: int

    @property
    def mbps(self) -> float | None:
        """The rate the slope implies, MB/s (10^6 bytes); None unless time grows with size."""
        return 1000.0 / self.slope_s_per_gb if self.slope_s_per_gb > 0 else None

    def at(self, size_gb: float) -> float:
        return self.intercept_s + self.slope_s_per_gb * size_gb


def fit(samples: Sequence[Sample]) -> Fit:
    """Least squares over every sample's (size in GB, total seconds); NoFit, saying why, below two distinct
    sizes."""
    sizes = sorted({s.size_bytes for s in samples})
    if len(sizes) < 2:
        have = ("no samples" if not sizes else f"the samples cover one image size ({size_text(sizes[0])})")
        raise NoFit(f"{have}; a line needs samples at two sizes at least")
    xs = [s.size_gb for s in samples]
    ys = [s.total_s for s in samples]
    line = statistics.linear_regression(xs, ys)
    try:
        r2: float | None = statistics.correlation(xs, ys) ** 2
    except statistics.StatisticsError:  # every total the same: no variance to explain
        r2 = None
    return Fit(line.intercept, line.slope, r2, len(samples), len(sizes))
