"""`make bench` (section "tui"): how fast the TUI answers keys while a real run is going.

A detached storage run (real libvirtd, QEMU, fio) is started; the app runs under App.run_test on the Tests
screen, attached to it, with live charts and log. Once the run's guest is up, keys are pressed one at a time:
screen switches (1-6, the heaviest keys) and cursor moves in the Profiles list, whose detail pane follows the
cursor (the commonest). The app draws to a recording terminal (`KeyTimer`: Textual's headless driver, except
that the app renders every frame and writes it, as to a real terminal). Each key is timed from the press until
the terminal is written the frame that shows its answer (the new screen's bar; the row the cursor moved to, then
that profile's detail), and, second, until the app is idle again (Pilot.press returns). A 10 ms timer on the UI
thread records the longest event-loop stall. Target: a key press answered in < 100 ms. Public Textual API only.

`measure()` is also what tui/tests/key_latency.py runs against a results store it fills itself (no guest).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from textual.app import App
from textual.drivers.headless_driver import HeadlessDriver
from textual.pilot import Pilot
from textual.widgets import DataTable

from cloudbox.tui.screens.profiles import ProfilesScreen, detail_title
from cloudbox.tui.widgets.navbar import SCREENS

KEYS = [("5", "results"), ("4", "tests"), ("2", "profiles"), ("4", "tests"), ("3", "guests"), ("6", "studies"),
        ("4", "tests"), ("1", "overview"), ("4", "tests")]
SIZE = (100, 32)
FRAME_TIMEOUT_S = 10.0
BAR = {mode: f"[{key} {title}]" for mode, key, title in SCREENS}  # how the screen bar marks the screen shown


Check = Callable[[], bool]


class KeyTimer:
    """Times keys from the press until the app writes the frames that show the answer (frames containing given
    texts, each with an optional check made when the frame is written).

    Made before the app runs: it sets the app's driver class to a headless driver that is not headless to the
    app, so the app renders each frame and writes it here instead of to a terminal."""

    def __init__(self, app: App[Any]):
        self.wanted: dict[str, tuple[str, Check | None]] = {}
        self.answered: dict[str, float] = {}
        self.all_answered = asyncio.Event()
        timer = self

        class FrameDriver(HeadlessDriver):
            @property
            def is_headless(self) -> bool:
                return False

            def write(self, data: str) -> None:
                timer.written(data)

        app.driver_class = FrameDriver

    def written(self, data: str) -> None:
        for name, (text, check) in list(self.wanted.items()):
            if text in data and (check is None or check()):
                del self.wanted[name]
                self.answered[name] = time.perf_counter()
        if not self.wanted:
            self.all_answered.set()

    async def press(self, pilot: Pilot[Any], key: str, shows: dict[str, tuple[str, Check | None]]) -> dict[str, float]:
        """Press `key`; ms until a frame shows each of `shows` (name: text, check) and until the app is idle
        again ("idle")."""
        self.all_answered.clear()
        self.answered = {}
        self.wanted = dict(shows)
        t0 = time.perf_counter()
        pressing = asyncio.create_task(pilot.press(key))
        try:
            await asyncio.wait_for(self.all_answered.wait(), FRAME_TIMEOUT_S)
        except TimeoutError:
            pressing.cancel()
            missing = ", ".join(repr(text) for text, _ in self.wanted.values())
            self.wanted = {}
            raise RuntimeError(f"key {key!r}: no frame showed {missing} within {FRAME_TIMEOUT_S:.0f} s") from None
        await pressing
        return {**{n: (t - t0) * 1000 for n, t in self.answered.items()}, "idle": (time.perf_counter() - t0) * 1000}


def switch_shows(mode: str) -> dict[str, tuple[str, Check | None]]:
    """A screen key is answered by the frame with the new screen's bar (the whole screen is redrawn with it)."""
    return {"switch": (BAR[mode], None)}


def cursor_key(app: App[Any], i: int) -> tuple[str, dict[str, tuple[str, Check | None]]]:
    """The i-th cursor move in the Profiles list (down and up in turn, within the list) and what shows it
    answered: a frame with the profile's row drawn while the cursor is on it ("cursor"), then one with the
    detail pane's title of that profile ("detail")."""
    screen = app.screen
    assert isinstance(screen, ProfilesScreen), f"cursor moves need the Profiles screen, not {screen!r}"
    table = screen.query_one("#profiles", DataTable)
    row, n = table.cursor_row, len(screen.entries)
    to = row + 1 if row == 0 or (i % 2 == 0 and row < n - 1) else row - 1
    e = screen.entries[to]
    return ("down" if to > row else "up"), {"cursor": (e.name, lambda: table.cursor_row == to),
                                            "detail": (detail_title(e), None)}


async def measure(app: App[Any], presses: int, ready: Callable[[Pilot[Any]], Awaitable[None]] | None = None,
                  size: tuple[int, int] = SIZE) -> dict[str, Any]:
    """Run `app`, wait for `ready(pilot)`, show every screen once (a first build is not a key's answer), then time
    `presses` screen switches and max(10, presses // 2) cursor moves in the Profiles list."""
    timer = KeyTimer(app)
    stalls: list[float] = []
    frames: dict[str, list[float]] = {"switch": [], "cursor": [], "detail": []}
    idle: dict[str, list[float]] = {"switch": [], "cursor": []}
    slow: list[str] = []  # keys answered in 100 ms or more: which key, which screen
    by_screen: dict[str, list[float]] = {}  # screen switches' frames by the screen switched to
    gc_pauses: list[tuple[int, float]] = []  # the collector's pauses: (generation, ms)
    gc_start = [0.0]

    def gc_timer(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            gc_start[0] = time.perf_counter()
        else:
            gc_pauses.append((info["generation"], (time.perf_counter() - gc_start[0]) * 1000))

    async with app.run_test(headless=False, size=size) as pilot:
        loop = asyncio.get_running_loop()
        last = [loop.time()]

        def tick() -> None:
            now = loop.time()
            stalls.append(now - last[0] - 0.01)
            last[0] = now

        async def press(key: str, shows: dict[str, tuple[str, Check | None]], kind: str, what: str) -> None:
            t = await timer.press(pilot, key, shows)
            for name in shows:
                frames[name].append(t[name])
            idle[kind].append(t["idle"])
            if kind == "switch":
                by_screen.setdefault(what, []).append(t[kind])
            if t[kind] >= 100:
                slow.append(f"{key}->{what} {t[kind]:.0f} ms")
            await pilot.pause(0.05)

        if ready is not None:
            await ready(pilot)
        for key, mode in KEYS:
            await timer.press(pilot, key, switch_shows(mode))
            await pilot.pause(0.3)
        last[0] = loop.time()
        app.set_interval(0.01, tick)
        gc.callbacks.append(gc_timer)
        try:
            for i in range(presses):
                key, mode = KEYS[i % len(KEYS)]
                await press(key, switch_shows(mode), "switch", mode)
            await press("2", switch_shows("profiles"), "switch", "profiles")
            await pilot.pause(0.3)  # the list's data is shown (a reload may follow the switch)
            for i in range(max(10, presses // 2)):
                key, shows = cursor_key(app, i)
                await press(key, shows, "cursor", "profiles")
        finally:
            gc.callbacks.remove(gc_timer)
    full = [ms for gen, ms in gc_pauses if gen == 2]
    return {"frames": frames, "idle": idle, "slow": slow, "by_screen": by_screen,
            "max_gc_ms": max((ms for _, ms in gc_pauses), default=0.0),
            "gc_pauses": len(gc_pauses), "gc_full": len(full), "gc_full_median_ms": statistics.median(full or [0.0]),
            "max_stall_ms": max(stalls) * 1000 if stalls else 0.0}


def stats(t: list[float]) -> dict[str, float]:
    s = sorted(t)
    return {"n": len(s), "median": statistics.median(s), "p95": s[int(0.95 * (len(s) - 1))], "max": s[-1],
            "over": sum(1 for x in s if x >= 100)}


def by_screen(res: dict[str, Any]) -> list[tuple[str, dict[str, float]]]:
    """Screen switches' frame statistics per screen switched to, slowest median first."""
    out = [(mode, stats(t)) for mode, t in res["by_screen"].items()]
    return sorted(out, key=lambda x: -x[1]["median"])


def summary(res: dict[str, Any]) -> list[str]:
    """The measurement as lines for a terminal."""
    lines = []
    for what, kind, part in (("screen switch, frame", "switch", "frames"), ("cursor move, frame", "cursor", "frames"),
                             ("detail follows, frame", "detail", "frames"), ("screen switch, idle", "switch", "idle"),
                             ("cursor move, idle", "cursor", "idle")):
        st = stats(res[part][kind])
        lines.append(f"{what}: median {st['median']:.1f} ms, p95 {st['p95']:.1f} ms, max {st['max']:.1f} ms, "
                     f"{st['over']:.0f} of {st['n']:.0f} >= 100 ms")
    lines.append(f"longest stall {res['max_stall_ms']:.0f} ms, longest gc pause {res['max_gc_ms']:.0f} ms "
                 f"({res['gc_pauses']} collections, {res['gc_full']} full: median {res['gc_full_median_ms']:.0f} ms)")
    lines.append("screen switch, frame, by screen: " + "; ".join(
        f"{mode} median {st['median']:.0f} max {st['max']:.0f} ms" for mode, st in by_screen(res)))
    if res["slow"]:
        lines.append(f"slow keys: {', '.join(res['slow'])}")
    return lines


def main() -> int:
    from cloudbox.bench import machine, update_section
    from cloudbox.core.record.results import ResultStore
    from cloudbox.core.run import runs
    from cloudbox.core.spec.runspec import RunSpec
    from cloudbox.tui import create_app
    from cloudbox.tui.backend import Backend

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--presses", type=int, default=140)
    ap.add_argument("--doc", default=str(Path(__file__).resolve().parents[4] / "docs" / "benchmarks.md"))
    a = ap.parse_args()
    state = Path(tempfile.mkdtemp(prefix="cloudbox-bench-tui-", dir="/var/tmp"))
    os.chmod(state, 0o755)
    os.environ["CLOUDBOX_STATE_DIR"] = str(state)
    spec = RunSpec(profile="virtio-disk", suite="storage", size="64M", storage_tests="standard", runtime=10)
    store = ResultStore()
    print("bench: TUI key response during a run ...", flush=True)
    run_id = runs.start_detached(spec, store)

    async def guest_up(pilot: Pilot[Any]) -> None:
        """Measure while the guest is up and fio runs in it."""
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if any(e.kind == "step" and str(e.payload.get("text", "")).startswith("guest: ")
                   for e in store.events_since(run_id)):
                return
            if store.get_run(run_id).finished:
                raise RuntimeError(f"the run ended before the guest phase: {store.get_run(run_id).reason}")
            await pilot.pause(0.5)

    try:
        res = asyncio.run(measure(create_app(Backend(), mode="tests", poll_interval=0.5), a.presses, guest_up))
        acc = store.get_run(run_id).accelerator or "?"
    finally:
        runs.cancel(store, run_id, timeout=120)
        store.close()
        shutil.rmtree(state, ignore_errors=True)
    for line in summary(res):
        print(f"  {line}", flush=True)
    fs, fc, fd = (stats(res["frames"][k]) for k in ("switch", "cursor", "detail"))
    i_s, i_c = stats(res["idle"]["switch"]), stats(res["idle"]["cursor"])
    emu = " (guest under TCG emulation, which loads both cores)" if acc == "tcg" else ""

    def row(what: str, st: dict[str, float], target: str) -> str:
        return (f"| {what} | median {st['median']:.1f} ms, p95 {st['p95']:.1f} ms, max {st['max']:.1f} ms; "
                f"{st['over']:.0f} of {st['n']:.0f} at or over 100 ms | {target} |")

    met = fs["over"] == 0 and fc["over"] == 0
    body = "\n".join([
        "## TUI key response during a run (cloudbox.tui.bench)",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {machine()}.",
        f"Command: `make bench` (`python -m cloudbox.tui.bench --presses {a.presses}`).",
        "",
        f"While a real detached storage run was in its guest phase ({spec.storage_tests} tests, 64M, accelerator "
        f"{acc}{emu}), the app ran on the Tests screen attached to it (live log, charts, 0.5 s poll), drawing "
        f"to a recording terminal of {SIZE[0]}x{SIZE[1]} (every frame rendered and written, as to a real one). "
        "Keys were pressed one at a time (Pilot.press): screen switches (1-6, the heaviest keys; each screen "
        "shown once before, so a first build is not counted) and cursor moves in the Profiles list (its detail "
        "pane follows). *Frame*: from the key until the terminal is written the frame that shows its answer "
        "(the whole new screen with its bar; the profile's row drawn with the cursor on it, then its detail). "
        "*Idle*: until the app has nothing left to do (Pilot.press returns). Without a guest, "
        "`tui/tests/key_latency.py` presses the same keys against a results store it fills.",
        "",
        "| what | result | target |",
        "|---|---|---|",
        row("screen switch answered (frame)", fs, "< 100 ms"),
        row("cursor move answered (frame)", fc, "< 100 ms"),
        row("its detail pane follows (frame)", fd, "-"),
        row("screen switch, until idle", i_s, "-"),
        row("cursor move, until idle", i_c, "-"),
        f"| longest UI event-loop stall (10 ms timer) | {res['max_stall_ms']:.0f} ms | - |",
        f"| longest garbage-collector pause | {res['max_gc_ms']:.0f} ms ({res['gc_pauses']} collections during "
        f"the keys, {res['gc_full']} of them full, median {res['gc_full_median_ms']:.0f} ms) | - |",
        "",
        "Screen switch answered (frame), by the screen switched to: " + "; ".join(
            f"{mode} median {st['median']:.0f} ms, max {st['max']:.0f} ms" for mode, st in by_screen(res)) + ".",
        "",
        "Target met: every key answered in under 100 ms." if met else
        "Target not met: some keys took 100 ms or more to answer (counts above).",
    ])
    update_section(Path(a.doc), "tui", body)
    print(f"bench: wrote {a.doc}")
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
