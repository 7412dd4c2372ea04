"""The test catalogue: every storage test (fio, dd, IOzone, Bonnie++, MPI-IO, fio's client/server) and network
test (netperf, iperf3) a run can ask for, their sets, and what a stored test name is: its kind, title, order and
primary metric. Declarations only: bench/ runs the tests, and results, compare, the studies and the CLI read them
from here."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..errors import CloudboxError
from ..inputs import did_you_mean

FS_MIN_SIZE = 64 * 1024**2  # a file system's journal and inode tables leave Bonnie++ or IOzone too little below that

@dataclass(frozen=True)
class StorageTest:
    id: str
    rw: str  # fio rw: write, read, randread, randwrite
    bs: str
    iodepth: int = 1
    direct: bool = True
    tool: str = "fio"  # fio, or the studies' own tools: a literal dd, IOzone, Bonnie++ (on a file system it makes)
    timed: bool = False  # random tests are capped by runtime
    sync: bool = False  # one read()/write() call at a time, as IOzone issues them, instead of libaio
    min_bs: str | None = None  # IOzone's grid: its smallest record size (bs is its largest)

    @property
    def dd(self) -> bool:
        return self.tool == "dd"

    @property
    def program(self) -> str:
        """The program the test runs (what the guest must have)."""
        if self.tool in IOZONE_TOOLS or self.tool == IOZONE_FS:
            return "iozone"
        return {"dd": "dd", "bonnie": "bonnie++", MPI_TOOL: "cloudbox-mpiio"}.get(self.tool, "fio")

    @property
    def engine(self) -> str:
        return "psync" if self.sync or not self.direct else "libaio"

    @property
    def writes(self) -> bool:
        return "write" in self.rw

    @property
    def labels(self) -> list[str]:
        return [] if self.direct else ["buffered"]

    @property
    def makes_fs(self) -> bool:
        """Whether the test makes a file system on the disk first (Bonnie++, IOzone on ext3): a block device of its
        own, never an NFS export, of at least FS_MIN_SIZE."""
        return self.tool in FS_TOOLS


# IOzone's O_DIRECT record-size sweep (study C): the whole file at each size, one request at a time, write then read.
RECORD_SIZES = ("4k", "16k", "64k", "256k", "1m", "4m", "16m")


RECORD_TESTS = tuple(f"rec-{rw}-{bs}" for bs in RECORD_SIZES for rw in ("write", "read"))


# IOzone itself (study B's tool): write reports re-write beside it, read reports re-read; O_DIRECT, fsync timed.
IOZONE_TESTS = tuple(f"iozone-{rw}-{bs}" for bs in RECORD_SIZES for rw in ("write", "read"))


IOZONE_FILE_TESTS = tuple(f"iozone-files-{bs}" for bs in RECORD_SIZES)


# IOzone's automatic mode over record sizes as well (its own -a grid): every record from 64 kB doubling to 16 MB;
# iozone-grid-4k from IOzone's own smallest, 4 kB (by name only: one request at a time, it is the slow one).
IOZONE_GRID = "iozone-grid"


IOZONE_GRIDS = (IOZONE_GRID, "iozone-grid-4k")


IOZONE_SWEEPS = ("iozone-files", IOZONE_GRID)  # tools whose run is IOzone's automatic mode


IOZONE_TOOLS = ("iozone", *IOZONE_SWEEPS)


# IOzone as study B ran it: on a file in an ext3 file system made on the disk, through the page cache (no O_DIRECT),
# its 16 MB records; the write pass leaves the file system and its file for the read pass, which mounts it afresh.
IOZONE_FS = "iozone-fs"


IOZONE_FS_TESTS = ("iozone-fs-write-16m", "iozone-fs-read-16m")


FS_TOOLS = ("bonnie", IOZONE_FS)  # tests that make a file system on the benchmark disk


# Study D's IOR transfers, 2 MB, one request at a time with fio, direct and through the page cache.
TRANSFER_2M_TESTS = ("seq-write-2m", "seq-read-2m", "seq-write-2m-buffered", "seq-read-2m-buffered")


# One MPI job across the run's guests (core.bench.mpiio): write then read back with 1 MiB transfers, IOR's way.
MPI_TOOL = "mpiio"


MPI_TESTS = ("mpiio-shared-1m", "mpiio-fpp-1m", "posix-shared-1m", "hdf5-shared-1m")


# fio's own client/server mode across the run's guests: the first guest's `fio --client` sends every guest's
# `fio --server` its job (each on its own disk or file), fio starts them and sums them up ("All clients").
FIO_CS_TOOL = "fio-cs"


FIO_CS_TESTS = ("fiocs-seq-write-64k",)


JOB_TESTS = (*MPI_TESTS, *FIO_CS_TESTS)  # one job across the guests: its own aggregate is the run's row


JOB_TOOLS = (MPI_TOOL, FIO_CS_TOOL)


TESTS: dict[str, StorageTest] = {t.id: t for t in [
    StorageTest("seq-write-64k", "write", "64k"),
    StorageTest("seq-read-64k", "read", "64k"),
    StorageTest("seq-write-64k-buffered", "write", "64k", direct=False),
    StorageTest("seq-read-64k-buffered", "read", "64k", direct=False),
    StorageTest("dd-write-64k", "write", "64k", direct=False, tool="dd"),
    StorageTest("dd-read-64k", "read", "64k", direct=False, tool="dd"),
    StorageTest("seq-write-1m", "write", "1m", iodepth=8),
    StorageTest("seq-read-1m", "read", "1m", iodepth=8),
    StorageTest("seq-write-2m", "write", "2m"),
    StorageTest("seq-read-2m", "read", "2m"),
    StorageTest("seq-write-2m-buffered", "write", "2m", direct=False),
    StorageTest("seq-read-2m-buffered", "read", "2m", direct=False),
    StorageTest("randwrite-4k-qd1", "randwrite", "4k", timed=True),
    StorageTest("randread-4k-qd1", "randread", "4k", timed=True),
    StorageTest("randwrite-4k-qd32", "randwrite", "4k", iodepth=32, timed=True),
    StorageTest("randread-4k-qd32", "randread", "4k", iodepth=32, timed=True),
    *(StorageTest(f"rec-{rw}-{bs}", rw, bs, sync=True) for bs in RECORD_SIZES for rw in ("write", "read")),
    *(StorageTest(f"iozone-{rw}-{bs}", rw, bs, sync=True, tool="iozone")
      for bs in RECORD_SIZES for rw in ("write", "read")),
    # IOzone's automatic mode over file sizes (study B's sweep): each record size, files doubling up to the run's size.
    *(StorageTest(f"iozone-files-{bs}", "write", bs, sync=True, tool="iozone-files") for bs in RECORD_SIZES),
    # Both sweeps at once; its bs is the largest record, which the run's size must hold.
    StorageTest(IOZONE_GRID, "write", "16m", sync=True, tool=IOZONE_GRID, min_bs="64k"),
    StorageTest("iozone-grid-4k", "write", "16m", sync=True, tool=IOZONE_GRID, min_bs="4k"),
    *(StorageTest(tid, "write" if "write" in tid else "read", "16m", direct=False, sync=True, tool=IOZONE_FS)
      for tid in IOZONE_FS_TESTS),
    # Bonnie++ (study B): its own write, rewrite and read of one file, then its file creations and deletions.
    StorageTest("bonnie", "write", "8k", tool="bonnie"),
    # a write job, then (caches dropped) a read job: both phases' caches and labels as a read test's
    *(StorageTest(tid, "write,read", "1m", tool=MPI_TOOL) for tid in MPI_TESTS),
    StorageTest("fiocs-seq-write-64k", "write", "64k", tool=FIO_CS_TOOL),
]}


TEST_SETS: dict[str, list[str]] = {
    # The studies' pattern: 64 kB sequential, synchronous (dd) and direct.
    "study": ["dd-write-64k", "dd-read-64k", "seq-write-64k", "seq-read-64k"],
    "standard": ["seq-write-64k", "seq-read-64k", "dd-write-64k", "dd-read-64k", "seq-write-1m",
                 "seq-read-1m", "randwrite-4k-qd1", "randread-4k-qd1", "randwrite-4k-qd32",
                 "randread-4k-qd32"],
    # Not the record sweep: 14 more whole-file passes, down to 4 kB at a time, would more than double a full run.
    # Nor Bonnie++, which makes a file system on the disk and writes, rewrites and reads most of it once more,
    # nor IOzone's grid, which passes over twice the disk 36 times.
    # Nor IOzone on ext3 (a file system made on the disk, like Bonnie++), nor study D's 2 MB transfers (set 2m).
    "full": [t for t in TESTS if t not in RECORD_TESTS and t not in IOZONE_TESTS and t not in IOZONE_FILE_TESTS
             and t not in ("bonnie", *IOZONE_GRIDS) and t not in JOB_TESTS and t not in IOZONE_FS_TESTS
             and t not in TRANSFER_2M_TESTS],
    "smoke": ["seq-write-64k", "seq-read-64k", "randread-4k-qd32"],
    "records": list(RECORD_TESTS),
    # Study B's record sizes (64 kB, 1 MB and its 16 MB) with IOzone itself; the whole sweep is `iozone-*` by name.
    "iozone": [f"iozone-{rw}-{bs}" for bs in ("64k", "1m", "16m") for rw in ("write", "read")],
    "bonnie": ["bonnie"],
    # Study B's IOzone as it ran it: a file in ext3 through the page cache, 16 MB records (write, then read).
    "iozone-fs": list(IOZONE_FS_TESTS),
    # Study D's transfer size (IOR's 2 MB), direct and buffered.
    "2m": list(TRANSFER_2M_TESTS),
    # IOzone's file-size sweep with the study's 16 MB records; other record sizes by name (iozone-files-SIZE).
    "iozone-files": ["iozone-files-16m"],
    # across guests only (--guests 2 or more); the shared-file ones on an NFS export
    "mpi": list(MPI_TESTS),
    "fio-cs": list(FIO_CS_TESTS),  # across guests only, like mpi
}


def resolve_tests(spec: str | list[str]) -> list[StorageTest]:
    """A set name or comma-separated test ids -> tests in a safe order (writes before reads)."""
    ids = spec if isinstance(spec, list) else (TEST_SETS.get(spec.lower())
                                               or [s.strip().lower() for s in spec.split(",") if s.strip()])
    unknown = [i for i in ids if i not in TESTS]
    if unknown:
        raise CloudboxError(
            f"unknown storage test(s) {', '.join(unknown)}{did_you_mean(unknown[0], [*TEST_SETS, *TESTS])}; "
            f"allowed: a set ({', '.join(TEST_SETS)}) or test ids, comma-separated (all {len(TESTS)} with their "
            "titles: cloudbox tests)")
    return [TESTS[i] for i in ids]


def block_bytes(bs: str) -> int:
    """fio's block size in bytes: "64k" -> 65536, "16m" -> 16777216."""
    return int(bs[:-1]) * {"k": 1024, "m": 1024**2}[bs[-1]]


@dataclass(frozen=True)
class NetTest:
    id: str
    tool: str  # netperf | iperf3
    kind: str  # TCP_STREAM | TCP_MAERTS | TCP_RR | tx | rx
    metric: str
    direction: str
    what: str = ""  # its title's words: "TCP stream, guest transmits"

    @property
    def title(self) -> str:
        """What the tables call it: "TCP stream, guest transmits (netperf TCP_STREAM)"."""
        how = f"netperf {self.kind}" if self.tool == "netperf" else "iperf3 -R" if self.kind == "rx" else "iperf3"
        return f"{self.what} ({how})"


NET_TESTS: dict[str, NetTest] = {t.id: t for t in [
    NetTest("tcp-stream", "netperf", "TCP_STREAM", "Mbit/s", "guest -> host", "TCP stream, guest transmits"),
    NetTest("tcp-maerts", "netperf", "TCP_MAERTS", "Mbit/s", "host -> guest", "TCP stream, guest receives"),
    NetTest("tcp-rr", "netperf", "TCP_RR", "trans/s", "request/response", "TCP request/response"),
    NetTest("iperf3-tx", "iperf3", "tx", "Mbit/s", "guest -> host", "TCP stream, guest transmits"),
    NetTest("iperf3-rx", "iperf3", "rx", "Mbit/s", "host -> guest", "TCP stream, guest receives"),
]}


FRONTEND_SUFFIX = "-fe"


# A direction with the front-end as the far end, and the word its title joins the front-end with.
_FE_DIRECTIONS = {"guest -> host": ("guest -> front-end", "to"), "host -> guest": ("front-end -> guest", "from"),
                  "request/response": ("request/response with the front-end", "with")}


def frontend_test(t: NetTest) -> NetTest:
    """The same test with the front-end as the far end (its baseline: this node's host -> the front-end)."""
    direction, word = _FE_DIRECTIONS.get(t.direction, (t.direction, "with"))
    return NetTest(t.id + FRONTEND_SUFFIX, t.tool, t.kind, t.metric, direction, f"{t.what} {word} the front-end")


NET_SETS = {"netperf": ["tcp-stream", "tcp-maerts", "tcp-rr"], "iperf3": ["iperf3-tx", "iperf3-rx"],
            "both": ["tcp-stream", "tcp-maerts", "tcp-rr", "iperf3-tx", "iperf3-rx"]}


# Study B's image-propagation samples are stored as tests "propagate-<MiB>m" (core.run.propagate).
PROPAGATE_PREFIX = "propagate-"


# --------------------------------------------------------------------------------------------------
# A stored test name: its kind
# --------------------------------------------------------------------------------------------------

# The guest's own host first, then (runs on a back-end) the same tests to the front-end ("-fe").
NETWORK_TESTS = (*NET_SETS["both"], *(t + FRONTEND_SUFFIX for t in NET_SETS["both"]))


BUFFERED_SUFFIX = "-buffered"


def base_test(test: str) -> str:
    """The test name without the '-buffered' suffix."""
    return test[: -len(BUFFERED_SUFFIX)] if test.endswith(BUFFERED_SUFFIX) else test


def is_storage_test(test: str) -> bool:
    b = base_test(test)
    return b in TESTS or b.startswith(("seq-", "dd-", "rand", "rec-", "iozone-"))


def is_network_test(test: str) -> bool:
    return test in NETWORK_TESTS or test.startswith(("tcp-", "udp-", "iperf3-"))


def net_test(test: str) -> NetTest | None:
    """The network test a stored name is, to the guest's own host or ("-fe") to the front-end; None if none."""
    if test in NET_TESTS:
        return NET_TESTS[test]
    base = test.removesuffix(FRONTEND_SUFFIX)
    return frontend_test(NET_TESTS[base]) if base != test and base in NET_TESTS else None


# --------------------------------------------------------------------------------------------------
# Its order in the tables: storage (Study A's Table 1, then Table 2), then network
# --------------------------------------------------------------------------------------------------

_STORAGE_ORDER = ("seq-{d}-64k", "dd-{d}-64k", "seq-{d}-1m", "seq-{d}-2m", "rand{d}-4k-qd1", "rand{d}-4k-qd32",
                  *(f"rec-{{d}}-{bs}" for bs in RECORD_SIZES), *(f"iozone-{{d}}-{bs}" for bs in RECORD_SIZES),
                  "iozone-fs-{d}-16m")


def _direction(test: str) -> str | None:
    b = base_test(test)
    if "write" in b:
        return "write"
    if "read" in b:
        return "read"
    return None


def _storage_template(test: str) -> str | None:
    d = _direction(test)
    if d is None:
        return None
    tpl = base_test(test).replace(d, "{d}", 1)
    return tpl if tpl in _STORAGE_ORDER else None


def test_sort_key(test: str) -> tuple[Any, ...]:
    """Storage before network; writes (Table 1) before reads (Table 2); 64 kB first; direct before
    buffered; unknown names after known ones, alphabetically."""
    if is_network_test(test) and not is_storage_test(test):
        idx = NETWORK_TESTS.index(test) if test in NETWORK_TESTS else len(NETWORK_TESTS)
        return (1, idx, test)
    d = _direction(test)
    tpl = _storage_template(test)
    return (
        0,
        {"write": 0, "read": 1}.get(d or "", 2),
        _STORAGE_ORDER.index(tpl) if tpl else len(_STORAGE_ORDER),
        base_test(test),
        test.endswith("-buffered"),
    )


# --------------------------------------------------------------------------------------------------
# Its title and the metric its table shows
# --------------------------------------------------------------------------------------------------


def _size_words(bs: str) -> str:
    """fio's block size in words: 4k -> 4 kB, 16m -> 16 MB."""
    return f"{bs[:-1]} {'kB' if bs.endswith('k') else 'MB'}"


_STORAGE_TITLES = {
    "seq-{d}-64k": "sequential {d}, 64 kB requests (fio)",
    "dd-{d}-64k": "sequential {d}, 64 kB blocks (dd, as in Study A)",
    "seq-{d}-1m": "sequential {d}, 1 MB requests (fio)",
    "seq-{d}-2m": "sequential {d}, 2 MB requests, one at a time (fio, as IOR's transfers)",
    "rand{d}-4k-qd1": "random {d}, 4 kB, queue depth 1 (fio)",
    "rand{d}-4k-qd32": "random {d}, 4 kB, queue depth 32 (fio)",
    **{f"rec-{{d}}-{bs}": f"sequential {{d}}, {_size_words(bs)} records, one at a time (fio, as IOzone)"
       for bs in RECORD_SIZES},
    **{f"iozone-{{d}}-{bs}": f"sequential {{d}}, {_size_words(bs)} records (IOzone; re-{{d}} stored beside it)"
       for bs in RECORD_SIZES},
}


def test_title(test: str) -> str:
    """A readable title for a test name, e.g. 'Write: sequential write, 64 kB requests (fio), O_DIRECT'."""
    nt = net_test(test)
    if nt is not None:
        return f"Network: {nt.title}"
    if test.startswith("iozone-files-"):
        bs = test.removeprefix("iozone-files-")
        return (f"IOzone's file-size sweep, {_size_words(bs)} records: write MB/s of the largest file (re-write, read "
                f"and re-read of every file size stored beside it), O_DIRECT [{test}]")
    if test in IOZONE_GRIDS:
        smallest = TESTS[test].min_bs or TESTS[test].bs
        return (f"IOzone's automatic mode over record and file sizes, {_size_words(smallest)} to 16 MB records: write "
                "MB/s of the largest file with the largest records (every pass of every file and record size stored "
                f"beside it), O_DIRECT [{test}]")
    if base_test(test) in FIO_CS_TESTS:
        return ("Write: sequential write, 64 kB requests, fio's client/server mode: the first guest's fio --client "
                "sends a fio --server in every guest its job, each on its own disk, and sums them up ('All clients': "
                f"all bytes over the longest job), O_DIRECT [{test}]")
    if base_test(test) in MPI_TESTS:
        api, layout = test.split("-")[:2]
        return (f"{ {'mpiio': 'MPI-IO', 'posix': 'POSIX', 'hdf5': 'parallel HDF5'}[api]} across guests, one MPI job, "
                f"{'one shared file' if layout == 'shared' else 'a file per process'}, 1 MiB transfers: written "
                "(fsync before close), then, caches dropped, read back (on a shared export by the next rank) "
                f"(cloudbox-mpiio: IOR's parameters, not IOR) [{test}]")
    if base_test(test) in IOZONE_FS_TESTS:
        way = _direction(test) or "write"
        return (f"{way.capitalize()}: sequential {way}, 16 MB records, IOzone on a file in ext3 made on the disk, "
                f"through the page cache (re-{way} stored beside it) [{test}]")
    if test == "bonnie":
        return ("Bonnie++: sequential block write (MB/s; rewrite, read, %CPU and file creations and deletions per "
                "second stored beside it), on ext4 through the page cache [bonnie]")
    tpl = _storage_template(test)
    d = _direction(test)
    buffered = test.endswith("-buffered")
    if tpl and d:
        title = f"{d.capitalize()}: " + _STORAGE_TITLES[tpl].format(d=d)
        if not base_test(test).startswith("dd-"):
            title += ", through the page cache" if buffered else ", O_DIRECT"
        elif buffered:
            title += ", through the page cache"
        return f"{title} [{test}]"
    return test


def primary_metric(test: str, available: Iterable[str] = ()) -> str:
    """The metric a section shows: MB/s for sequential, IOPS for random, trans/s for tcp-rr,
    Mbit/s for streams, total_s for an image-propagation sample; the first available one when the preferred is
    missing."""
    avail = list(dict.fromkeys(available))
    b = base_test(test)
    nt = net_test(test)
    if nt is not None:
        preferred = [nt.metric]
    elif test.startswith(PROPAGATE_PREFIX):
        preferred = ["total_s"]  # an image-propagation sample: provisioning to the guest's agent
    elif is_network_test(test) and not is_storage_test(test):
        preferred = ["Mbit/s"]
    elif b.startswith("rand"):
        preferred = ["IOPS", "MB/s"]
    else:
        preferred = ["MB/s", "IOPS"]
    for m in preferred:
        if m in avail or not avail:
            return m
    return avail[0]
