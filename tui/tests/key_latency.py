"""The TUI's key latency without a guest: `make bench`'s key sequence and timing (cloudbox.tui.bench.measure)
against a results store filled here, in a state dir under /tmp.

The store holds finished runs with measurements, host samples and their event streams (tui_demo's history, three
times over), and a run in progress whose events a thread writes while the keys are pressed, at an executor's
rates: a progress event every 0.5 s, a host sample every second, a log line every 2 s, a measurement and the next
test's step every 6 s. The app is on the Tests screen attached to that run (live log and charts, 0.5 s poll), host
facts are fixed and guests come from libvirt's test driver: nothing of this host is probed or started.

    tui/.venv/bin/python tui/tests/key_latency.py [--presses N] [--rounds R]

To compare two versions of the TUI, run it alternately with PYTHONPATH=<tree>/tui/src for each.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tui_demo  # noqa: E402

import cloudbox  # noqa: E402
from cloudbox.core.record.results import ResultStore
from cloudbox.core.spec import profiles
from cloudbox.tui import create_app
from cloudbox.tui.backend import Backend
from cloudbox.tui.bench import measure, summary

TESTS = tui_demo.STUDY_TESTS


def fill_history(copies: int) -> None:
    """tui_demo's finished runs `copies` times, each with its event stream and host samples."""
    store = ResultStore()
    try:
        for c in range(copies):
            for d in tui_demo.RUNS:
                tui_demo.add_run(store, dataclasses.replace(d, started_at=d.started_at - c * 7 * tui_demo.DAY,
                                                            events=True))
    finally:
        store.close()


def live_run(started: threading.Event, stop: threading.Event) -> None:
    """A run in progress on this host (this process is its 'executor'), its events written as they happen."""
    store = ResultStore()
    prof = profiles.find_profile("virtio-disk")
    rid = store.create_run(profile_name=prof.name, profile_hash=prof.hash, profile_toml=prof.to_toml(),
                           suite="storage", size_bytes=128 * 2**20, size_label="quick", accelerator="tcg")
    plan = [f"baseline:{t}" for t in TESTS] + ["guest:boot"] + [f"guest:{t}" for t in TESTS]
    store.add_event(rid, "state", {"state": "running", "profile": prof.name, "suite": "storage", "plan": plan})
    started.set()
    steps = itertools.cycle([(side, t) for side in ("baseline", "guest") for t in TESTS])
    side, test = next(steps)
    store.add_event(rid, "step", {"text": f"{side}: {test}", "side": side, "test": test})
    try:
        for tick in itertools.count(1):
            if stop.wait(0.5):
                break
            mbps = 80.0 + 20.0 * ((tick * 7) % 5) / 4
            store.add_event(rid, "progress", {"side": side, "test": test, "pct": 100.0 * (tick % 12) / 12,
                                              "mbps": mbps, "eta": f"00m:{6 - (tick % 12) // 2:02d}s"})
            if tick % 2 == 0:
                store.add_samples(rid, [{"t": time.time(), "device": "sdb", "test": f"{side}:{test}",
                                         "read_mbps": mbps if "read" in test else 0.0,
                                         "write_mbps": 0.0 if "read" in test else mbps,
                                         "avgrq_sectors": 128.0 + tick % 3, "avgqu": 0.9, "util": 95.0}],
                                  event=True)
            if tick % 4 == 0:
                store.add_event(rid, "log", {"text": f"fio: {test}: {mbps:.1f} MB/s"})
            if tick % 12 == 0:
                store.add_measurement(rid, side=side, test=test, metric="MB/s", value=mbps, host_mbps=mbps,
                                      host_avgrq_sectors=128.0, host_avgqu=0.9, host_util=95.0, labels=["quick-size"])
                store.add_event(rid, "measurement", {"side": side, "test": test, "metric": "MB/s", "value": mbps,
                                                     "labels": ["quick-size"]})
                side, test = next(steps)
                store.add_event(rid, "step", {"text": f"{side}: {test}", "side": side, "test": test})
        store.finish_run(rid, "aborted", "the measurement ended")
    finally:
        store.close()


def one_round(presses: int, copies: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="cloudbox-keylat-", dir="/tmp") as tmp, \
            tui_demo.demo_environment(Path(tmp) / "demo"):
        fill_history(copies)
        started, stop = threading.Event(), threading.Event()
        writer = threading.Thread(target=live_run, args=(started, stop), name="live-run", daemon=True)
        writer.start()
        started.wait(30)
        backend = Backend(facts=tui_demo.host_facts(), libvirt_uri=tui_demo.LIBVIRT_URI)
        try:
            return asyncio.run(measure(create_app(backend, mode="tests", poll_interval=0.5), presses))
        finally:
            stop.set()
            writer.join(30)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presses", type=int, default=70, help="screen switches per round (cursor moves: half)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--copies", type=int, default=3, help="copies of the demo history (6 finished runs each)")
    ap.add_argument("--json", help="append each round's raw figures to this file (one JSON object a line)")
    a = ap.parse_args()
    print(f"key latency: cloudbox from {Path(cloudbox.__file__).parent}", flush=True)
    for r in range(a.rounds):
        res = one_round(a.presses, a.copies)
        print(f"round {r + 1}:")
        for line in summary(res):
            print(f"  {line}", flush=True)
        if a.json:
            with open(a.json, "a") as f:
                f.write(json.dumps({"src": str(Path(cloudbox.__file__).parent), **res}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
