"""A real repeated run against real libvirtd and QEMU (TCG here): `cloudbox run --repeats 3` of a sequential write
and a random read stores three samples a side of each, bare metal and guest in turn (ABAB...) in one guest boot, each
read sample after both sides' page caches were dropped and each random one after its discarded warm-up job, and
`results show` gives their figures, the ratio's interval, how the samples were taken and the host's state."""

from __future__ import annotations

import subprocess
import sys

import pytest
from real_runs import leftovers, work_files

from cloudbox.core.bench import fio
from cloudbox.core.record import latency
from cloudbox.core.record.results import ResultStore

pytestmark = [pytest.mark.slow, pytest.mark.root]


def _cli(*argv: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cloudbox.cli", *argv], capture_output=True, text=True,
                          timeout=timeout)


def test_a_run_repeated_three_times_takes_turns_and_shows_the_interval(state, libvirt_conn):
    r = _cli("run", "--profile", "virtio-disk", "--suite", "storage", "--tests", "seq-write-64k,randread-4k-qd1",
             "--size", "16M", "--runtime", "1", "--repeats", "3")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    # the live lines say which repeat each step is
    assert "==> baseline: seq-write-64k (repeat 2 of 3)" in r.stdout, r.stdout[-3000:]
    assert "  = guest seq-write-64k (repeat 3): " in r.stdout
    with ResultStore() as store:
        (summary,) = store.list_runs(raw=False)
        run = store.get_run(summary.id)
    assert run.state == "completed", run.reason
    rows = sorted((m for m in run.measurements if m.metric == "MB/s"), key=lambda m: m.started_at or 0)
    # each test's samples bare metal and guest in turn, each in its place, one guest boot
    assert [(m.test, m.side, m.repeat, m.boot, m.iteration) for m in rows] == [
        (test, side, k, 1, k) for test in ("seq-write-64k", "randread-4k-qd1") for k in (1, 2, 3)
        for side in ("baseline", "guest")]
    assert all(m.value > 0 for m in rows)
    assert all(a.finished_at is not None and b.started_at is not None and a.finished_at <= b.started_at
               for a, b in zip(rows, rows[1:], strict=False))  # one at a time: bare metal while the guest idles
    # every read sample from dropped caches on both sides; each random one measured after its warm-up job, its
    # latency histogram kept (a job done within a ramp_time would have had none)
    reads = [m for m in rows if m.test == "randread-4k-qd1"]
    assert not [m for m in reads if "warm-cache" in m.labels], [m.labels for m in reads]
    lat = [m for m in run.measurements if m.test == "randread-4k-qd1" and m.metric == latency.METRIC]
    assert len(lat) == 6 and all(m.value > 0 and m.histogram is not None and m.histogram.total > 0 for m in lat)
    assert all(m.raw and f'"jobname" : "{fio.WARMUP_JOB}"' in m.raw for m in reads)  # kept in the raw output
    ratio = run.ratio("seq-write-64k", "MB/s")
    assert ratio is not None and ratio.has_interval and (ratio.n_a, ratio.n_b) == (3, 3)
    p = run.provenance
    assert p.repeats is not None and p.repeats.repeats == 3 and len(p.repeats.boot_s) == 1
    assert [(t.test, t.samples, t.reason) for t in p.repeats.tests] == [
        ("seq-write-64k", 3, "the planned 3"), ("randread-4k-qd1", 3, "the planned 3")]
    assert p.host_state is not None and p.host_state.cmdline and p.host_state.disks
    assert p.caches is not None and p.caches.host.startswith("dropped before every read sample")
    assert p.steady_state is not None and (p.steady_state.method, p.steady_state.seconds, p.steady_state.tests) == (
        "warmup", 1, ["randread-4k-qd1"])
    shown = _cli("results", "show", str(run.id))
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert f"{ratio.text()}" in out, out  # e.g. "87.1% [80.3, 93.0] (90%) n=3+3"
    assert " n=3" in out  # each side's median of its three
    assert "repeats      3 a side: each test's samples in turn, bare metal then guest (ABAB...)" in out
    assert "stopped      seq-write-64k: 3 a side, the planned 3" in out
    assert "each sample  network tests 2 s, random I/O 1 s: --runtime 1 s as given" in out  # 5 s over 3 quick samples
    assert "steady state a 1 s warm-up job run first and discarded in randread-4k-qd1" in out
    assert "host state   " in out and "kernel command line:" in out
    assert leftovers(libvirt_conn, state) == {"guests": [], "bridge": False, "netns": False, "loops": []}
    assert work_files(state) == []
