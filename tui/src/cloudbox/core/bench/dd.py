"""dd's storage tests: its command line (64 KiB blocks, a write flushed with conv=fsync), the guest's timed wrapper
(busybox dd prints no rate line) and the parser of GNU dd's rate line or that wrapper's elapsed line."""

from __future__ import annotations

import re
import shlex

from ..errors import CloudboxError
from ..spec.catalogue import StorageTest
from .result import MB, FioResult, elapsed, timed_script


def dd_args(t: StorageTest, target: str, size: int) -> list[str]:
    count = max(1, size // (64 * 1024))
    if t.writes:
        # conv=fsync (not fdatasync): the guest's busybox dd knows only fsync; both flush the data to disk.
        return ["dd", "if=/dev/zero", f"of={target}", "bs=64k", f"count={count}", "conv=fsync"]
    return ["dd", f"if={target}", "of=/dev/null", "bs=64k", f"count={count}"]


_DD = re.compile(r"(\d+) bytes.*copied,\s*([\d.]+)\s*s")
_RECORDS_OUT = re.compile(r"(\d+)\+(\d+) records out")


def timed_dd_script(argv: list[str], pid_file: str | None = None) -> str:
    """dd wrapped so it reports its own elapsed time: busybox dd (in the guest) prints no rate line. With `pid_file`,
    dd's process id is written there while it runs (its file position is its progress: core.bench.progress)."""
    cmd = " ".join(shlex.quote(a) for a in argv)
    if pid_file is not None:
        cmd = f"{cmd} & echo $! > {shlex.quote(pid_file)}; wait $!"
    return timed_script(cmd) + "exit $rc"


def parse_dd(test_id: str, text: str, block: int = 64 * 1024) -> FioResult:
    """GNU dd's "N bytes ... copied, S s" line, or records out + the timed_dd_script's elapsed line."""
    m = _DD.search(text)
    if m:
        nbytes, secs = int(m[1]), float(m[2])
    else:
        rec, took = _RECORDS_OUT.search(text), elapsed(text)
        if rec is None or took is None:
            raise CloudboxError(f"dd ({test_id}) output not understood: {text.strip()[-300:]}")
        nbytes = int(rec[1]) * block
        secs = took
    return FioResult(test_id, nbytes / secs / MB if secs > 0 else 0.0, 0.0, 0.0, secs, text)
