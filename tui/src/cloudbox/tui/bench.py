"""`make bench` (section "tui"): how fast the TUI answers keys while a real run is going.

A detached storage run (real libvirtd, QEMU, fio) is started; the app runs headless (App.run_test) on the
Tests screen, attached to it, with live charts and log; then screen-switch keys are pressed one by one and
each is timed from the key press until the new screen is shown and the app is idle again (Pilot.press +
Pilot.pause). A 10 ms timer on the UI thread also records the longest event-loop stall. Target: every key
answered in < 100 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

KEYS = [("5", "results"), ("4", "tests"), ("2", "profiles"), ("4", "tests"), ("3", "guests"), ("1", "overview"),
        ("4", "tests")]


async def _measure(presses: int, run_id: int) -> dict:
    from cloudbox.core.results import ResultStore
    from cloudbox.tui import create_app
    from cloudbox.tui.backend import Backend

    app = create_app(Backend(), mode="tests", poll_interval=0.5)
    stalls: list[float] = []
    times: list[float] = []
    async with app.run_test(size=(100, 32)) as pilot:
        loop = asyncio.get_running_loop()
        last = [loop.time()]

        def tick() -> None:
            now = loop.time()
            stalls.append(now - last[0] - 0.01)
            last[0] = now

        app.set_interval(0.01, tick)
        store = ResultStore()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:  # measure while the guest is up and fio runs in it
            if any(e.kind == "step" and str(e.payload.get("text", "")).startswith("guest: ")
                   for e in store.events_since(run_id)):
                break
            if store.get_run(run_id).finished:
                raise RuntimeError(f"the run ended before the guest phase: {store.get_run(run_id).reason}")
            await pilot.pause(0.5)
        stalls.clear()
        for i in range(presses):
            key, mode = KEYS[i % len(KEYS)]
            t0 = time.perf_counter()
            await pilot.press(key)
            while app.current_mode != mode:
                await pilot.pause(0)
            await pilot.pause()
            times.append((time.perf_counter() - t0) * 1000)
            await pilot.pause(0.05)
        state = store.get_run(run_id).state
        store.close()
    return {"times_ms": times, "max_stall_ms": max(stalls) * 1000 if stalls else 0.0, "run_state": state}


def main() -> int:
    from cloudbox.bench import machine, update_section
    from cloudbox.core import runner
    from cloudbox.core.results import ResultStore

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--presses", type=int, default=140)
    ap.add_argument("--doc", default=str(Path(__file__).resolve().parents[4] / "docs" / "benchmarks.md"))
    a = ap.parse_args()
    state = Path(tempfile.mkdtemp(prefix="cloudbox-bench-tui-", dir="/var/tmp"))
    os.chmod(state, 0o755)
    os.environ["CLOUDBOX_STATE_DIR"] = str(state)
    spec = runner.RunSpec(profile="virtio-disk", suite="storage", size="64M", storage_tests="standard", runtime=10)
    store = ResultStore()
    print("bench: TUI key response during a run ...", flush=True)
    run_id = runner.start_detached(spec, store)
    try:
        res = asyncio.run(_measure(a.presses, run_id))
        acc = store.get_run(run_id).accelerator or "?"
    finally:
        runner.cancel(store, run_id, timeout=120)
        store.close()
        shutil.rmtree(state, ignore_errors=True)
    t = sorted(res["times_ms"])
    p95 = t[int(0.95 * (len(t) - 1))]
    over = sum(1 for x in t if x >= 100)
    print(f"  median {statistics.median(t):.1f} ms, p95 {p95:.1f} ms, max {t[-1]:.1f} ms, {over} >= 100 ms", flush=True)
    emu = " (guest under TCG emulation, which loads both cores)" if acc == "tcg" else ""
    body = "\n".join([
        "## TUI key response during a run (cloudbox.tui.bench)",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {machine()}.",
        f"Command: `make bench` (`python -m cloudbox.tui.bench --presses {a.presses}`).",
        "",
        f"While a real detached storage run was in its guest phase ({spec.storage_tests} tests, 64M, accelerator "
        f"{acc}{emu}), the app ran headless on the Tests screen attached to it (live log, charts, 0.5 s poll) and "
        f"{len(t)} screen-switch keys were pressed one at a time; each is timed from the press until the new "
        "screen is shown and the app is idle (Pilot.press + Pilot.pause).",
        "",
        "| what | result | target |",
        "|---|---|---|",
        f"| key press answered | median {statistics.median(t):.1f} ms, p95 {p95:.1f} ms, max {t[-1]:.1f} ms; "
        f"{over} of {len(t)} at or over 100 ms | < 100 ms |",
        f"| longest UI event-loop stall (10 ms timer) | {res['max_stall_ms']:.0f} ms | - |",
    ])
    update_section(Path(a.doc), "tui", body)
    print(f"bench: wrote {a.doc}")
    return 0 if over == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
