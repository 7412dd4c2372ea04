"""A real repeated run against real libvirtd and QEMU (TCG here): `cloudbox run --repeats 3` of one storage test
stores three samples a side, bare metal and guest in turn (ABAB...) in one guest boot, and `results show` gives
their figures, the ratio's interval, how the samples were taken and the host's state."""

from __future__ import annotations

import subprocess
import sys

import pytest
from real_runs import leftovers, work_files

from cloudbox.core.record.results import ResultStore

pytestmark = [pytest.mark.slow, pytest.mark.root]


def _cli(*argv: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cloudbox.cli", *argv], capture_output=True, text=True,
                          timeout=timeout)


def test_a_run_repeated_three_times_takes_turns_and_shows_the_interval(state, libvirt_conn):
    r = _cli("run", "--profile", "virtio-disk", "--suite", "storage", "--tests", "seq-write-64k", "--size", "16M",
             "--repeats", "3")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    # the live lines say which repeat each step is
    assert "==> baseline: seq-write-64k (repeat 2 of 3)" in r.stdout, r.stdout[-3000:]
    assert "  = guest seq-write-64k (repeat 3): " in r.stdout
    with ResultStore() as store:
        (summary,) = store.list_runs(raw=False)
        run = store.get_run(summary.id)
    assert run.state == "completed", run.reason
    rows = sorted((m for m in run.measurements if m.test == "seq-write-64k" and m.metric == "MB/s"),
                  key=lambda m: m.started_at or 0)
    # bare metal and guest in turn, each sample in its place, one guest boot
    assert [(m.side, m.repeat, m.boot, m.iteration) for m in rows] == [
        (side, k, 1, k) for k in (1, 2, 3) for side in ("baseline", "guest")]
    assert all(m.value > 0 for m in rows)
    assert all(a.finished_at is not None and b.started_at is not None and a.finished_at <= b.started_at
               for a, b in zip(rows, rows[1:], strict=False))  # one at a time: bare metal while the guest idles
    ratio = run.ratio("seq-write-64k", "MB/s")
    assert ratio is not None and ratio.has_interval and (ratio.n_a, ratio.n_b) == (3, 3)
    p = run.provenance
    assert p.repeats is not None and p.repeats.repeats == 3 and len(p.repeats.boot_s) == 1
    assert [(t.test, t.samples, t.reason) for t in p.repeats.tests] == [("seq-write-64k", 3, "the planned 3")]
    assert p.host_state is not None and p.host_state.cmdline and p.host_state.disks
    assert p.caches is not None and p.caches.host.startswith("dropped before every read sample")
    shown = _cli("results", "show", str(run.id))
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert f"{ratio.text()}" in out, out  # e.g. "87.1% [80.3, 93.0] (90%) n=3+3"
    assert " n=3" in out  # each side's median of its three
    assert "repeats      3 a side: each test's samples in turn, bare metal then guest (ABAB...)" in out
    assert "stopped      seq-write-64k: 3 a side, the planned 3" in out
    assert "host state   " in out and "kernel command line:" in out
    assert leftovers(libvirt_conn, state) == {"guests": [], "bridge": False, "netns": False, "loops": []}
    assert work_files(state) == []
