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

from cloudbox.core import runs, storage
from cloudbox.core.results import ResultStore
from cloudbox.core.runspec import RunSpec
from cloudbox.core.volumes.store import VolumeStore

pytestmark = [pytest.mark.slow, pytest.mark.root]

STALL_S = 8.0  # the run's stall limit here (120 s by default); the watch reads the disk's counters every 5 s
STOPPED_AT_MOST_S = 180.0  # the server is let go by then whatever the run did


def _server_pids(path: str) -> list[int]:
    r = subprocess.run(["pgrep", "-f", f"qemu-nbd .*{path}"], capture_output=True, text=True)
    return [int(p) for p in r.stdout.split()]


def test_a_guest_disk_that_stops_is_noticed_and_the_test_measured_in_a_second_guest(state, libvirt_conn,
                                                                                      monkeypatch):
    monkeypatch.setattr(storage, "DISK_STALL_S", STALL_S)
    with VolumeStore() as vs:
        vol = vs.create("ebs", 160 * 1024 * 1024)
    seen: dict[str, float] = {}
    stopped: list[int] = []
    done = threading.Event()

    def saboteur() -> None:
        """Stop the server when the guest's read starts; let it go when the run relaunches the guest."""
        try:
            with ResultStore() as store:
                rid, seq = None, 0
                while not done.is_set():
                    time.sleep(0.2)
                    if rid is None:
                        listed = store.list_runs()
                        rid = listed[0].id if listed else None
                        continue
                    for ev in store.events_since(rid, seq):
                        seq = ev.seq
                        text = str(ev.payload.get("text", "")) if ev.kind == "step" else ""
                        if text == "guest: seq-read-64k" and not stopped:
                            stopped.extend(_server_pids(vol.path))
                            for pid in stopped:
                                os.kill(pid, signal.SIGSTOP)
                            seen["stopped"] = time.monotonic()
                        elif "launching it again" in text and stopped and "relaunch" not in seen:
                            seen["relaunch"] = time.monotonic()
                            for pid in stopped:
                                os.kill(pid, signal.SIGCONT)
                    if "stopped" in seen and time.monotonic() - seen["stopped"] > STOPPED_AT_MOST_S:
                        break
        finally:
            for pid in stopped:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass

    th = threading.Thread(target=saboteur, daemon=True)
    th.start()
    spec = RunSpec(profile="kvm-ebs-nbd", suite="storage", size="quick", storage_tests="seq-write-64k,seq-read-64k",
                   runtime=3)
    try:
        with ResultStore() as store:
            rid = runs.executor(spec, store).execute()
    finally:
        done.set()
        th.join(timeout=30)
    with ResultStore() as store:
        run = store.get_run(rid)
        evs = store.events_since(rid, 0, limit=10000)
    assert stopped, "the guest's read never started, so the server was never stopped"
    assert run.state == "completed", run.reason
    # noticed within the limit plus the watch's step and a guest agent call or two under TCG, not guest_timeout
    assert "relaunch" in seen and seen["relaunch"] - seen["stopped"] < STALL_S + 60, seen
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
    assert _server_pids(vol.path) == []
    with VolumeStore() as vs:
        assert vs.get("ebs").attached_run is None
    assert work_files(state) == []
    assert [d.name() for d in libvirt_conn.listAllDomains() if d.name().startswith("cloudbox-kvm-ebs-nbd")] == []
