"""A run's events (core.record.events): typed records and their stored form, the one line each is written as (the CLI's
printer and the TUI's log), and whole-run progress from the plan."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from cloudbox.cli.run import Printer
from cloudbox.core.record import events
from cloudbox.core.record.events import (
    LogEvent,
    MeasurementEvent,
    PlanProgress,
    ProgressEvent,
    SampleEvent,
    StateEvent,
    StepEvent,
)
from cloudbox.core.record.results import ResultStore
from cloudbox.core.spec.runspec import PlanStep, RunSpec

PLAN = tuple(RunSpec(profile="x", suite="storage", storage_tests="smoke").plan())
SAMPLE = SampleEvent(1.5, "sdb", "guest:seq-write-64k", 0.0, 26.9, 256.0, 128.0, 0.45, 90.0)
RECORDS = [
    StateEvent("running", profile="virtio-disk", suite="storage", plan=PLAN),
    StepEvent("guest: seq-write-64k", "guest", "seq-write-64k"),
    StepEvent("cleaning up"),
    LogEvent("guest agent ready after 21.4 s"),
    ProgressEvent("guest", "seq-write-64k", 45.0, "00m:05s", 120.3),
    ProgressEvent("guest", "boot", 0, "12s"),
    MeasurementEvent("guest", "seq-write-64k", "MB/s", 26.9, ("quick-size", "emulated"), 430.4, 26.9, 256.0, 0.45,
                     90.0),
    MeasurementEvent("baseline", "tcp-rr", "trans/s", 9800.0),
    SAMPLE,
    StateEvent("aborted", "cancelled by SIGTERM"),
    StateEvent("completed"),
]


@pytest.mark.parametrize("rec", RECORDS, ids=lambda r: r.kind)
def test_every_record_survives_the_store(rec, tmp_path: Path):
    with ResultStore(tmp_path / "r.db") as store:
        rid = store.create_run(profile_name="x")
        store.add_event(rid, rec.kind, rec.to_payload())
        (ev,) = store.events_since(rid)
    assert ev.record == rec


def test_the_stored_forms_of_older_runs_still_read():
    # The plan as 'side:test' strings, as runs recorded it before it was typed.
    old = events.parse("state", {"state": "running", "profile": "p", "suite": "storage",
                                 "plan": ["baseline:seq-write-64k", "guest:boot", "guest:seq-write-64k"]})
    assert isinstance(old, StateEvent) and old.plan == (PlanStep("baseline", "seq-write-64k"),
                                                        PlanStep("guest", "boot"), PlanStep("guest", "seq-write-64k"))
    assert events.parse("state", {"state": "completed", "reason": None}) == StateEvent("completed")
    assert events.parse("hologram", {}) is None
    # A sample as the store appends it (every field, None where the sampler had nothing).
    row = dict.fromkeys(events.SAMPLE_FIELDS)
    assert events.parse("sample", {**row, "t": 3}) == SampleEvent(3.0)


def test_the_stored_payload_keeps_its_keys():
    """What watchers of another version read: the keys the executor has always written."""
    assert RECORDS[1].to_payload() == {"text": "guest: seq-write-64k", "side": "guest", "test": "seq-write-64k"}
    assert RECORDS[2].to_payload() == {"text": "cleaning up"}
    assert RECORDS[4].to_payload() == {"side": "guest", "test": "seq-write-64k", "pct": 45.0, "mbps": 120.3,
                                       "eta": "00m:05s"}
    assert RECORDS[7].to_payload() == {"side": "baseline", "test": "tcp-rr", "metric": "trans/s", "value": 9800.0,
                                       "labels": []}
    assert RECORDS[10].to_payload() == {"state": "completed", "reason": None}
    assert RECORDS[0].to_payload()["plan"][0] == {"side": "baseline", "test": "seq-write-64k"}


def test_one_line_per_event_for_the_cli_and_the_tui():
    lines = [events.describe(r) for r in RECORDS]
    assert lines == [
        None,
        "==> guest: seq-write-64k",
        "==> cleaning up",
        "    guest agent ready after 21.4 s",
        None,
        None,
        "  = guest seq-write-64k: 26.9 MB/s [quick-size, emulated]  (host: 26.9 MB/s, avgrq 256 sectors, "
        "avgqu 0.45, util 90%)",
        "  = baseline tcp-rr: 9800 trans/s",
        None,
        "==> run aborted: cancelled by SIGTERM",
        "==> run completed",
    ]
    # The CLI prints exactly those lines (a pipe: no live status line, the first progress line only).
    out = io.StringIO()
    printer = Printer(out)
    for r in RECORDS:
        printer(r)
    printed = out.getvalue().splitlines()
    assert [x for x in printed if not x.startswith("  [")] == [x for x in lines if x is not None]
    assert printed[3] == "  [guest] seq-write-64k  45.0%     120.3 MB/s  eta 00m:05s"
    assert events.progress_line(RECORDS[4], SAMPLE).endswith("| host sdb 26.9 MB/s rq 256 sect qu 0.5 util 90%")
    assert events.stamped(0, "==> run completed").endswith(" ==> run completed")
    # The launch has no percentage or ETA: its line says what it is doing and for how long.
    boot = ProgressEvent("guest", "boot", 0, "booting, 12 s since launch")
    assert events.progress_line(boot, SAMPLE) == "  [guest] boot: booting, 12 s since launch"


def test_whole_run_progress_from_the_plan():
    p = PlanProgress()
    assert p.percent is None
    p.feed(StateEvent("running", plan=PLAN))
    assert p.percent == 0
    p.feed(MeasurementEvent("baseline", "seq-write-64k", "MB/s", 1.0))
    assert p.percent == pytest.approx(100 / 7)
    p.feed(ProgressEvent("guest", "boot", 50))
    assert p.percent == pytest.approx(1.5 * 100 / 7)
    p.feed(ProgressEvent("guest", "boot", 100))
    assert p.percent == pytest.approx(200 / 7)
    for step in PLAN:
        p.feed(MeasurementEvent(step.side, step.test, "MB/s", 1.0))
    assert p.percent == 100


def test_event_text_from_a_node_or_a_guest_reaches_the_terminal_escaped():
    """A log line, a step, a reason or a label carrying terminal control sequences (a retitle and a screen clear,
    as a node's text or a guest's console could) is printed with them made visible, never raw."""
    hostile = "node says \x1b]0;owned\x07\x1b[2J\x1b[31mred"

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    for out in (io.StringIO(), Tty()):
        printer = Printer(out)
        printer(LogEvent(hostile))
        printer(StepEvent(hostile))
        printer(ProgressEvent("guest", hostile, 50.0, "5s"))
        printer(MeasurementEvent("guest", "seq-write-64k", "MB/s", 10.0, labels=(hostile,)))
        printer(StateEvent("aborted", hostile))
        text = out.getvalue().replace("\r\x1b[K", "")  # the printer's own status-line clearing on a tty
        assert "\x1b" not in text and "\x07" not in text, repr(text)
        assert "\\x1b]0;owned\\x07" in text
