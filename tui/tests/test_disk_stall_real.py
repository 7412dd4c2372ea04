"""A guest disk that stops answering mid-test, for real: the volume's qemu-nbd server is stopped (SIGSTOP) while
the TCG guest reads it through QEMU's NBD client, so the guest's requests stay in flight and none completes. The
run notices within its stall limit, kills the test, launches the guest again and measures the test in the second
guest, saying so in the measurement's raw output; nothing is left behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time

import pytest
from real_runs import work_files

from cloudbox.core.bench import diskwatch
from cloudbox.core.disks.volumes.store import VolumeStore
from cloudbox.core.record.results import ResultStore
from cloudbox.core.run import runs
from cloudbox.core.spec.runspec import RunSpec

pytestmark = [pytest.mark.slow, pytest.mark.root]

STALL_S = 8.0  # the run's stall limit here (120 s by default); the watch reads the disk's counters every 5 s
STOPPED_AT_MOST_S = 180.0  # the server is let go by then whatever the run did


def _server_pids(path: str) -> list[int]:
    r = subprocess.run(["pgrep", "-f", f"qemu-nbd .*{path}"], capture_output=True, text=True)
    return [int(p) for p in r.stdout.split()]


class Saboteur(threading.Thread):
    """Stops the volume's qemu-nbd (SIGSTOP) each time the guest's read starts, up to `stops` times, and lets it go
    (SIGCONT) when the run relaunches the guest, when the test is over, and STOPPED_AT_MOST_S after a stop."""

    def __init__(self, path: str, stops: int):
        super().__init__(daemon=True)
        self.path, self.stops = path, stops
        self.stopped_at: list[float] = []
        self.relaunched_at: list[float] = []
        self.pids: list[int] = []
        self.done = threading.Event()

    def _signal(self, sig: int) -> None:
        for pid in self.pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def run(self) -> None:
        try:
            with ResultStore() as store:
                rid, seq = None, 0
                while not self.done.is_set():
                    time.sleep(0.2)
                    if rid is None:
                        listed = store.list_runs()
                        rid = listed[0].id if listed else None
                        continue
                    for ev in store.events_since(rid, seq):
                        seq = ev.seq
                        text = str(ev.payload.get("text", "")) if ev.kind == "step" else ""
                        if text == "guest: seq-read-64k" and len(self.stopped_at) < self.stops:
                            self.pids = _server_pids(self.path)
                            self._signal(signal.SIGSTOP)
                            self.stopped_at.append(time.monotonic())
                        elif "launching it again" in text:
                            self.relaunched_at.append(time.monotonic())
                            self._signal(signal.SIGCONT)
                    if self.stopped_at and time.monotonic() - self.stopped_at[-1] > STOPPED_AT_MOST_S:
                        break
        finally:
            self._signal(signal.SIGCONT)

    def __enter__(self) -> Saboteur:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.join(timeout=30)


SPEC = RunSpec(profile="kvm-ebs-nbd", suite="storage", size="quick", storage_tests="seq-write-64k,seq-read-64k",
               runtime=3)


def _leaves_nothing(state, libvirt_conn, path: str) -> None:
    assert _server_pids(path) == []
    with VolumeStore() as vs:
        assert vs.get("ebs").attached_run is None
    assert work_files(state) == []
    assert [d.name() for d in libvirt_conn.listAllDomains() if d.name().startswith("cloudbox-kvm-ebs-nbd")] == []


def _stalled_run(monkeypatch, stops: int):
    """SPEC's run on a fresh volume "ebs" at an 8 s stall limit, its server stopped `stops` times: the volume, the
    saboteur, the stored run and its events."""
    monkeypatch.setattr(diskwatch, "DISK_STALL_S", STALL_S)
    with VolumeStore() as vs:
        vol = vs.create("ebs", 160 * 1024 * 1024)
    with Saboteur(vol.path, stops=stops) as sab, ResultStore() as store:
        rid = runs.executor(SPEC, store).execute()
    with ResultStore() as store:
        return vol, sab, store.get_run(rid), store.events_since(rid, 0, limit=10000)


def test_a_guest_disk_that_stops_is_noticed_and_the_test_measured_in_a_second_guest(state, libvirt_conn,
                                                                                      monkeypatch):
    vol, sab, run, evs = _stalled_run(monkeypatch, stops=1)
    assert sab.stopped_at, "the guest's read never started, so the server was never stopped"
    assert run.state == "completed", run.reason
    # noticed within the limit plus the watch's step and a guest agent call or two under TCG, not guest_timeout
    assert sab.relaunched_at and sab.relaunched_at[0] - sab.stopped_at[0] < STALL_S + 60
    steps = [str(e.payload.get("text", "")) for e in evs if e.kind == "step"]
    why = next(s for s in steps if "launching it again" in s)
    assert "stopped completing requests" in why and re.search(r"in flight \d+ on vda", why), why
    assert "QEMU's virtio-disk0 queue: took" in why, why  # QEMU's view of the virtio-blk queue, for the diagnosis
    (stall,) = run.provenance.disk_stalls or []
    assert (stall.test, stall.disks, stall.remedy) == ("seq-read-64k", ["vda"], "relaunch")
    assert stall.seen in why
    read = run.measurement("guest", "seq-read-64k", "MB/s")
    assert read is not None and read.value > 0
    assert "# cloudbox: measured in a second guest" in read.raw
    write = run.measurement("guest", "seq-write-64k", "MB/s")
    assert write is not None and "second guest" not in write.raw  # measured in the first, before the stall
    # the second guest laid down the read's data again before reading it
    assert steps.count("guest: laying down data for read tests") == 1
    assert steps.index("guest: laying down data for read tests") > steps.index(why)
    _leaves_nothing(state, libvirt_conn, vol.path)


@pytest.mark.full
def test_a_disk_that_stops_again_in_the_second_guest_fails_the_run_and_leaves_nothing(state, libvirt_conn,
                                                                                       monkeypatch):
    vol, sab, run, _ = _stalled_run(monkeypatch, stops=2)
    assert len(sab.stopped_at) == 2 and len(sab.relaunched_at) == 1
    assert run.state == "aborted", run.state
    assert "fio (seq-read-64k) was killed: its disk stopped completing requests" in (run.reason or ""), run.reason
    assert run.measurement("guest", "seq-write-64k", "MB/s") is not None  # measured before the first stall
    assert run.measurement("guest", "seq-read-64k", "MB/s") is None
    (stall,) = run.provenance.disk_stalls or []  # the first; the second ended the run
    assert stall.test == "seq-read-64k"
    _leaves_nothing(state, libvirt_conn, vol.path)
