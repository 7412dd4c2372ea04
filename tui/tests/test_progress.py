"""Progress on long work: IOzone's cells, dd's bytes and Bonnie++'s phases read from the real tools as they run
(core.bench.progress), the progress event's new fields through the store and the sink, the line the CLI prints and
the Live view shows, and a study run's cells done of those planned with its time left (core.studies.progress)."""

from __future__ import annotations

import asyncio
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cloudbox.cli.run import Printer
from cloudbox.core.bench import bonnie, dd, progress
from cloudbox.core.bench.runners import HostRunner
from cloudbox.core.record.events import (
    LogEvent,
    MeasurementEvent,
    ProgressEvent,
    StateEvent,
    StepEvent,
    duration_text,
    progress_line,
)
from cloudbox.core.record.results import ResultStore
from cloudbox.core.run.sink import EventSink
from cloudbox.core.spec.catalogue import TESTS
from cloudbox.core.spec.runspec import PlanStep, RunSpec
from cloudbox.core.studies.progress import StudyProgress, step_seconds

MIB = 1 << 20
ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+\d+\s+\d+\s+\d+\s+\d+\s*$", re.M)


def needs(program: str) -> None:
    if shutil.which(program) is None:
        pytest.skip(f"{program} is not installed (make deps-test)")


@pytest.fixture
def disk_dir() -> Path:
    """A directory on a disk's file system (IOzone opens its file O_DIRECT, which a tmpfs may refuse)."""
    d = Path(tempfile.mkdtemp(prefix="cloudbox-progress-", dir="/var/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def fractions(done: Callable[[str], progress.Done], text: str, *, by_char: bool = False) -> list[progress.Done]:
    """What `done` says of every prefix of `text` cut at a line's end (or at every character), in order."""
    if by_char:
        return [done(text[:k]) for k in range(len(text) + 1)]
    lines = text.splitlines(keepends=True)
    return [done("".join(lines[:k])) for k in range(len(lines) + 1)]


# ---------------------------------------------------------------------------------------------------------- IOzone
def test_iozones_grid_progress_is_read_from_its_real_output(disk_dir):
    needs("iozone")
    t, size = TESTS["iozone-grid-4k"], MIB
    plan = progress.iozone_plan(t, size)
    got: list[dict] = []
    res = HostRunner(lambda: False).run(t, str(disk_dir / "f"), size, 0, got.append)
    # the plan is IOzone's own order of files and records
    assert [(int(a), int(b)) for a, b in ROW.findall(res.raw)] == list(plan.cells)
    assert len(plan.cells) == 45 and plan.cells[:3] == ((4, 4), (8, 4), (8, 8)) and plan.cells[-1] == (1024, 1024)
    said = fractions(lambda text: progress.iozone_done(plan, text), res.raw)
    assert [f for f, _ in said] == sorted(f for f, _ in said)  # never backwards
    assert said[0] == (0.0, "cell 1 of 45: 4 KiB file, 4 KiB records, pass 1 of 4: write")
    assert said[-1] == (1.0, "45 of 45 cells done")
    # a row is printed as its cell starts, its figures as the passes end (write and re-write, read and re-read)
    head = res.raw[:res.raw.index("            1024       4")]
    assert progress.iozone_done(plan, head + "            1024       4")[1] == (
        "cell 37 of 45: 1 MiB file, 4 KiB records, pass 1 of 4: write")
    middle = progress.iozone_done(plan, head + "            1024       4    40677    36247")
    assert middle[1] == "cell 37 of 45: 1 MiB file, 4 KiB records, pass 3 of 4: read"
    assert progress.iozone_done(plan, head)[0] < middle[0] < 1.0
    # the guest's reads are the output's last bytes: a cut first line is not taken for a row
    cut = "512       4    1    2    3    4\n"
    assert progress.iozone_done(plan, cut, tail=True)[0] == 0.0 < progress.iozone_done(plan, cut)[0]
    # the runner's own reports: the time elapsed from the start, never backwards
    assert got and all("elapsed" in p for p in got)
    assert [p.get("pct", 0) for p in got] == sorted(p.get("pct", 0) for p in got)


def test_one_iozone_pass_counts_its_two_passes(disk_dir):
    needs("iozone")
    t = TESTS["iozone-write-64k"]
    plan = progress.iozone_plan(t, MIB)
    assert plan == progress.IozonePlan(((1024, 64),), ("write", "re-write"))
    res = HostRunner(lambda: False).run(t, str(disk_dir / "f"), MIB, 0, lambda _p: None)
    said = fractions(lambda text: progress.iozone_done(plan, text), res.raw)
    assert said[0] == (0.0, "pass 1 of 2: write") and said[-1] == (1.0, "every pass done")


# -------------------------------------------------------------------------------------------------------------- dd
@pytest.mark.parametrize("program", ["dd", "busybox"])
def test_dds_position_is_its_progress_whichever_dd(program, tmp_path):
    """GNU dd (the host's) and busybox dd (the guest's) both copy from descriptor 0 to 1: the write's progress is the
    position of 1, the read's of 0, read from /proc as the guest's script does (its pid file, dd_pos_script)."""
    needs(program)
    argv0 = ["busybox", "dd"] if program == "busybox" else ["dd"]
    fifo, data, pid = tmp_path / "fifo", tmp_path / "data", str(tmp_path / "dd.pid")
    os.mkfifo(fifo)
    w, r = TESTS["dd-write-64k"], TESTS["dd-read-64k"]
    assert progress.dd_total(w, str(data), 4 * MIB) == 4 * MIB and (progress.dd_fd(w), progress.dd_fd(r)) == (1, 0)

    def position(fd: int) -> int | None:
        return progress.fdinfo_pos(subprocess.run(["sh", "-c", progress.dd_pos_script(pid, fd)],
                                                  capture_output=True, text=True).stdout)

    def wait_for(cond: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 10
        while not cond():
            assert time.monotonic() < deadline, "dd's position never got there"
            time.sleep(0.02)

    # a write: dd copies what we feed its input, 1 MiB of the 4; its output's position says so
    script = dd.timed_dd_script([*argv0, f"if={fifo}", f"of={data}", "bs=64k", "count=64"], pid)
    proc = subprocess.Popen(["sh", "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert position(1) is None or position(1) == 0
    with open(fifo, "wb") as feed:
        feed.write(b"x" * MIB)
        feed.flush()
        wait_for(lambda: position(progress.dd_fd(w)) == MIB)
        assert progress.dd_done(4 * MIB, MIB) == (0.25, "1 of 4 MB")
        time.sleep(0.05)  # /proc/uptime counts in 10 ms steps: the timed copy must outlast one
        feed.write(b"x" * 3 * MIB)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and dd.parse_dd("dd-write-64k", err).seconds > 0
    # a read: dd reads its file as fast as we take its output
    script = dd.timed_dd_script([*argv0, f"if={data}", f"of={fifo}", "bs=64k", "count=64"], pid)
    proc = subprocess.Popen(["sh", "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    with open(fifo, "rb") as take:
        took = 0
        while took < MIB:
            took += len(take.read(MIB - took))
        wait_for(lambda: (position(progress.dd_fd(r)) or 0) >= MIB)
        assert position(progress.dd_fd(r)) <= MIB + 2 * 65536  # a block or two ahead of what we took
        take.read()
    proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert progress.dd_done(4 * MIB, None) is None  # dd not started, or gone


# -------------------------------------------------------------------------------------------------------- Bonnie++
def test_bonnies_phases_are_read_from_its_real_messages(tmp_path):
    needs("bonnie++")
    if os.geteuid() != 0:
        pytest.skip("bonnie++ -u root needs root")
    size = 8 * MIB
    r = subprocess.run(bonnie.bonnie_args(str(tmp_path), size), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    said = fractions(lambda text: progress.bonnie_done(text, size), r.stderr, by_char=True)
    assert [f for f, _ in said] == sorted(f for f, _ in said)
    assert said[0] == (0.0, "phase 1 of 10: block write, 8 MiB file")
    assert said[-1] == (1.0, "10 of 10 phases done")
    assert progress.bonnie_done("Writing intelligently...done\nRewriting...", size) == (
        pytest.approx(1 / 6), "phase 2 of 10: rewrite, 8 MiB file")
    assert {w for _, w in said} >= {f"phase {k} of 10: {name}" + (", 8 MiB file" if k <= 3 else "")
                                    for k, (_, name, _) in enumerate(progress.BONNIE_PHASES, 1)}
    # its figures still come from the CSV line, now beside the messages
    assert bonnie.parse_bonnie("bonnie", r.stdout + "\n" + r.stderr).extra["seconds"] is None


def test_the_guests_bonnie_script_keeps_its_messages_where_the_runner_reads_them():
    s = bonnie.bonnie_guest_script("/dev/vda", 128 * MIB)
    assert s.startswith(f": > {bonnie.GUEST_BONNIE_LOG}; ")
    assert f"-u root 2>{bonnie.GUEST_BONNIE_LOG}; rc=$?" in s
    assert s.index("cloudbox-elapsed") < s.index(f"cat {bonnie.GUEST_BONNIE_LOG} >&2") < s.index("umount")


class BusyboxGuest:
    """A stand-in for a guest's agent: every script runs here under busybox's shell (the guest's), a long one in the
    background with the runner's poll called while it runs, as Guest.run does."""

    name = "stand-in"

    def sh(self, script: str, *, poll: Callable[[], None] | None = None, interval: float = 0.01, **_kw):
        from cloudbox.core.virt.guest import ExecResult

        proc = subprocess.Popen(["busybox", "sh", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        while poll is not None and proc.poll() is None:
            poll()
            time.sleep(interval)
        out, err = proc.communicate()
        return ExecResult(["/bin/sh", "-c", script], proc.returncode, out, err)


@pytest.mark.parametrize("test,size", [("iozone-grid-4k", MIB), ("dd-write-64k", 256 * MIB),
                                       ("dd-read-64k", 256 * MIB)])
def test_the_guests_scripts_report_progress_under_busybox(test, size, disk_dir, monkeypatch):
    """The guest runner's scripts and its reads of their progress, run under busybox's shell as in the guest: IOzone's
    output kept in a file and read from its end, dd's pid recorded and its position read."""
    from cloudbox.core.bench import runners

    needs("busybox")
    needs("iozone")
    monkeypatch.setattr(runners, "GUEST_IOZONE_OUT", str(disk_dir / "iozone.out"))
    monkeypatch.setattr(runners, "GUEST_DD_PID", str(disk_dir / "dd.pid"))
    monkeypatch.setattr(runners, "GUEST_PROGRESS_S", 0.02)
    target = disk_dir / "disk"
    if test == "dd-read-64k":  # on the disk, out of the page cache: the read takes long enough to be seen
        with open(target, "wb") as fh:
            for _ in range(size // MIB):
                fh.write(b"\0" * MIB)
            fh.flush()
            os.fsync(fh.fileno())
            os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    gr = runners.GuestRunner(BusyboxGuest(), lambda: False)
    gr._watched_disks = []  # no disk watch: this host's disks are not the stand-in's
    got: list[dict] = []
    res = gr.run(TESTS[test], str(target), size, 0, got.append)
    assert res.mbps > 0
    said = [p for p in got if "done" in p]
    assert said, got
    assert [p["pct"] for p in said] == sorted(p["pct"] for p in said)
    if test.startswith("iozone"):
        assert any(p["done"].startswith("cell ") and " of 45: " in p["done"] for p in said), said
        assert all(p["done"].startswith(("cell ", "45 of 45 cells done")) for p in said), said
        assert res.raw.count("iozone test complete") == 1  # the output, printed whole at the end
    else:
        assert re.fullmatch(r"\d+ of 268 MB", said[-1]["done"])


# ------------------------------------------------------------------------------------------------ the event itself
def test_the_test_clock_eta_and_plan_done_survive_the_store_and_the_sink(tmp_path):
    ev = ProgressEvent("guest", "iozone-grid-4k", 45.3, "3m10s", instance=None,
                       done="cell 12 of 78: 8 MiB file, 16 KiB records, pass 3 of 4: read", elapsed=160.0)
    with ResultStore(tmp_path / "r.db") as store:
        rid = store.create_run(profile_name="x")
        store.add_event(rid, ev.kind, ev.to_payload())
        seen: list = []
        sink = EventSink(store, rid, seen.append)
        report = sink.progress("baseline", "dd-write-64k")
        report({"pct": 25.0, "done": "1 of 4 MB"})  # no time of its own: the sink's since the test began
        stored = [e.record for e in store.events_since(rid)]
    assert stored[0] == ev
    assert stored[1] == seen[0] and seen[0].done == "1 of 4 MB" and 0 <= seen[0].elapsed < 5
    # an older run's progress (no such fields) reads as before
    old = ProgressEvent.from_payload({"side": "guest", "test": "t", "pct": 5})
    assert old.done is None and old.elapsed is None
    assert "done" not in old.to_payload() and "elapsed" not in old.to_payload()
    assert progress_line(ev) == ("  [guest] iozone-grid-4k  45.3%  2m40s elapsed  eta 3m10s  (cell 12 of 78: 8 MiB "
                                 "file, 16 KiB records, pass 3 of 4: read)")
    # the text is the guest's output's: control characters reach no terminal
    hostile = ProgressEvent("guest", "t", 1.0, done="\x1b]0;owned\x07\x1b[2J", elapsed=1.0)
    assert "\x1b" not in progress_line(hostile) and "\x07" not in progress_line(hostile)
    out = io.StringIO()
    Printer(out)(hostile)
    assert "\x1b" not in out.getvalue()
    assert [duration_text(s) for s in (0, 44.6, 65, 3599, 7380)] == ["0s", "45s", "1m05s", "59m59s", "2h03m"]


def test_a_pace_says_the_time_left_once_something_is_done():
    now = [100.0]
    pace = progress.Pace(lambda: now[0])
    assert pace.payload(None) == {"elapsed": 0.0}
    now[0] = 160.0
    assert pace.payload((0.25, "1 of 4 MB")) == {"elapsed": 60.0, "pct": 25.0, "done": "1 of 4 MB", "eta": "3m00s"}
    assert "eta" not in pace.payload((1.0, "every pass done"))


# ------------------------------------------------------------------------------------------------------ the TUI
async def test_the_live_view_shows_the_tests_clock_and_what_is_done(state):
    from test_tui_pilot import SIZE, facts, text, until

    from cloudbox.tui import create_app
    from cloudbox.tui.backend import Backend

    spec = RunSpec(profile="virtio-disk", suite="storage", storage_tests="iozone-grid-4k")
    with ResultStore() as store:
        rid = store.create_run(profile_name="virtio-disk", suite="storage", size_label="quick", accelerator="tcg")
        recs = [StateEvent("running", profile="virtio-disk", suite="storage", plan=tuple(spec.plan())),
                StepEvent("bare metal: iozone-grid-4k", "baseline", "iozone-grid-4k"),
                ProgressEvent("baseline", "iozone-grid-4k", 12.5, "6m10s", elapsed=52.0,
                              done="cell 30 of 78: 512 KiB file, 4 KiB records, pass 3 of 4: read")]
        for i, rec in enumerate(recs):
            store.add_event(rid, rec.kind, rec.to_payload(), t=1000.0 + i)

    backend = Backend(facts=facts(), libvirt_uri="test:///default")
    try:
        app = create_app(backend, mode="tests")
        async with app.run_test(size=SIZE) as pilot:
            screen = app.screen
            screen.action_attach(rid)
            box = screen.query_one("#run-test")
            await until(pilot, lambda: "cell 30 of 78" in text(box), what="the test's progress")
            assert box.display
            assert text(box) == ("Test: [baseline] iozone-grid-4k  12.5%  52s elapsed  eta 6m10s  (cell 30 of 78: "
                                 "512 KiB file, 4 KiB records, pass 3 of 4: read)")
            with ResultStore() as store:
                store.add_event(rid, "step", StepEvent("guest: booting").to_payload())
            await until(pilot, lambda: not box.display, what="the line gone with the test")
            await asyncio.sleep(0)
    finally:
        backend.close()


# ------------------------------------------------------------------------------------------------------ a study
def test_a_study_run_says_its_cells_done_of_those_planned_and_its_time_left(tmp_path):
    specs = [RunSpec(profile=p, suite="storage", storage_tests="dd-write-64k,iozone-grid-4k", size="quick")
             for p in ("a", "b")]
    with ResultStore(tmp_path / "r.db") as store:  # a stored run here: dd took 10 s a side, the grid 90
        rid = store.create_run(profile_name="a", suite="storage", size_label="quick", node="lab1")
        for side in ("baseline", "guest"):
            for test, took in (("dd-write-64k", 10.0), ("iozone-grid-4k", 90.0)):
                store.add_measurement(rid, side=side, test=test, metric="MB/s", value=1.0, started_at=500.0,
                                      finished_at=500.0 + took)
        store.finish_run(rid, "completed")
        runs = store.list_runs()
    est = step_seconds(runs, "quick", "lab1")
    assert est[PlanStep("guest", "iozone-grid-4k")] == 90.0 and step_seconds(runs, "study", "lab1") == {}
    now = [0.0]
    p = StudyProgress(specs, est, clock=lambda: now[0])
    assert p.cells_planned == 4 and p.line("a") == "study a: 0 of 4 cells done (0%), 0s elapsed"
    p.start_run(0)
    # run 1: the bare-metal steps, the guest's boot (counted as the mean step, 50 s), the guest's
    assert not p.feed(MeasurementEvent("baseline", "dd-write-64k", "MB/s", 1.0))
    assert not p.feed(ProgressEvent("baseline", "iozone-grid-4k", 50.0))
    now[0] = 60.0
    assert p.fraction == pytest.approx((10 + 45) / 500)
    assert p.line("a") == "study a: 0 of 4 cells done (11%), 1m00s elapsed, eta 8m05s"
    assert not p.feed(MeasurementEvent("baseline", "iozone-grid-4k", "MB/s", 1.0))
    assert not p.feed(ProgressEvent("guest", "boot", 100.0))
    assert p.feed(MeasurementEvent("guest", "dd-write-64k", "MB/s", 1.0))  # both sides of dd: a cell done
    assert p.cells_done == 1
    assert not p.feed(MeasurementEvent("guest", "dd-write-64k", "MB/s", 1.0, instance=2))  # one of N guests'
    assert not p.feed(LogEvent("x"))
    # a test whose guest side stored no figure is passed once the run is past it: the next run counts it done
    p.start_run(1)
    assert p.cells_done == 2
    now[0] = 250.0
    assert not p.feed(StepEvent("guest: dd-write-64k", "guest", "dd-write-64k"))  # begun, not done
    assert p.feed(StepEvent("guest: iozone-grid-4k", "guest", "iozone-grid-4k")) and p.cells_done == 3
    assert p.fraction == pytest.approx((250 + 10 + 90 + 50 + 10) / 500)
    assert p.line("a") == "study a: 3 of 4 cells done (82%), 4m10s elapsed, eta 55s"
    p.start_run(2)
    assert p.cells_done == 4 and p.fraction == 1.0


def test_a_study_run_of_repeated_runs_follows_each_sample():
    """A study's plan repeats each test (3 a side here): each sample is a step, weighed as the stored one-sample
    step, and the cell is done once its last sample is."""
    spec = RunSpec(profile="a", suite="storage", storage_tests="dd-write-64k,seq-read-1m", size="quick", repeats=3)
    est = {PlanStep("baseline", "dd-write-64k"): 10.0, PlanStep("guest", "dd-write-64k"): 10.0}
    now = [0.0]
    p = StudyProgress([spec], est, clock=lambda: now[0])
    assert p.cells_planned == 2
    p.start_run(0)
    assert not p.feed(ProgressEvent("guest", "boot", 100.0))
    for r in (1, 2, 3):
        assert not p.feed(ProgressEvent("baseline", "dd-write-64k", 50.0))  # the sample under way: repeat r
        assert p.reached == spec.plan().index(PlanStep("baseline", "dd-write-64k", r))
        assert not p.feed(MeasurementEvent("baseline", "dd-write-64k", "MB/s", 1.0, repeat=r))
        done = p.feed(MeasurementEvent("guest", "dd-write-64k", "MB/s", 1.0, repeat=r))
        assert done == (r == 3) and p.cells_done == (1 if r == 3 else 0)
    assert p.fraction == pytest.approx((10.0 * 6 + 10.0) / (10.0 * 6 + 10.0 * 7))  # the rest count 10 s each


def test_a_series_has_no_eta_before_its_last_run_can_start():
    specs = [RunSpec(profile="a", suite="storage", storage_tests="dd-write-64k", size="quick")] * 3
    now = [0.0]
    p = StudyProgress(specs, {}, offsets=[0.0, 3600.0, 7200.0], clock=lambda: now[0])
    p.start_run(0)
    p.feed(MeasurementEvent("baseline", "dd-write-64k", "MB/s", 1.0))
    now[0] = 30.0
    eta = p.eta()
    assert eta is not None and eta >= 7200.0 - 30.0


STUDY = """\
name = "p"
title = "Progress"
description = "Two profiles, two tests: where a study run stands as it goes."
sizes = ["quick"]

[[profiles]]
name = "virtio-disk"
row = "KVM, virtio"

[[profiles]]
name = "kvm-cache-none"
row = "KVM, host cache off"

[[tests]]
id = "dd-write-64k"
table = "dd"

[[tests]]
id = "seq-write-64k"
table = "fio"

[plan.quick]
repeats = 1  # one sample a cell: a repeated study run's progress has a test of its own
"""


def test_study_run_prints_where_the_study_stands_as_each_cell_is_done(state, tmp_path, monkeypatch, capsys):
    """The foreground `study run`: a line of cells done of those planned, with its time elapsed and left, as each
    run starts and each cell is done (the runs here are stand-ins that store each step's figure at once)."""
    from cloudbox import cli
    from cloudbox.cli import study as cli_study

    class Executor:
        def __init__(self, spec: RunSpec, store: ResultStore, emit: Callable) -> None:
            self.spec, self.store, self.emit = spec, store, emit

        def execute(self) -> int:
            rid = self.store.create_run(profile_name=self.spec.profile, suite="storage", size_label="quick")
            for step in self.spec.plan():
                if step.test == "boot":
                    self.emit(ProgressEvent("guest", "boot", 100.0))
                    continue
                self.emit(StepEvent(f"{step.side}: {step.test}", step.side, step.test))
                self.emit(MeasurementEvent(step.side, step.test, "MB/s", 10.0))
            self.store.finish_run(rid, "completed")
            return rid

        def cancelled(self) -> bool:
            return False

    (tmp_path / "p.toml").write_text(STUDY)
    monkeypatch.setenv("CLOUDBOX_STUDY_DIR", str(tmp_path))
    monkeypatch.setattr(cli_study.runs, "executor", Executor)
    monkeypatch.setattr(cli_study, "Printer", lambda: Printer(sys.stdout))  # the stdout captured now
    monkeypatch.setattr(cli_study.runs, "check_guests_fit", lambda spec: None)
    monkeypatch.setattr(cli_study.planning, "profile_facts",
                        lambda study, here=True: ({p: "h" for p in study.profile_names}, {}))
    assert cli.main(["study", "run", "p", "--size", "quick"]) == 0, capsys.readouterr()
    out = capsys.readouterr().out
    lines = [ln.strip() for ln in out.splitlines() if " cells done " in ln]
    assert [re.sub(r", \d+s elapsed.*", "", ln) for ln in lines] == [
        "study p: 0 of 4 cells done (0%)", "study p: 1 of 4 cells done (40%)", "study p: 2 of 4 cells done (50%)",
        "study p: 2 of 4 cells done (50%)", "study p: 3 of 4 cells done (90%)", "study p: 4 of 4 cells done (100%)"]
    # each run's header is followed by where the study stands
    assert out.split("run 2 of 2: ")[1].splitlines()[1].strip() == lines[3]
