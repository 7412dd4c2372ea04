"""Where a run's events go: its event stream in the results store, and one optional extra consumer (the foreground
CLI's printer, a test). Progress is thinned to two a second (each of N guests' on its own); a test's last progress
always goes through."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from ..errors import masked
from ..record.events import LogEvent, ProgressEvent, RunEvent, SampleEvent, StateEvent, StepEvent
from ..record.results import ResultStore

Consumer = Callable[[RunEvent], None]
PROGRESS_EVERY_S = 0.5


class EventSink:
    def __init__(self, store: ResultStore, run_id: int | None = None, extra: Consumer | None = None) -> None:
        self.store = store
        self.run_id = run_id  # None until the run is recorded: events before that go to `extra` alone
        self.extra = extra
        self._last_progress: dict[int | None, float] = {}  # instance -> when its progress last went through

    def emit(self, ev: RunEvent) -> None:
        if isinstance(ev, ProgressEvent):
            now = time.monotonic()
            if now - self._last_progress.get(ev.instance, 0.0) < PROGRESS_EVERY_S and ev.pct < 100:
                return
            self._last_progress[ev.instance] = now
        if self.run_id is not None:
            self.store.add_event(self.run_id, ev.kind, ev.to_payload())  # masked there
        if self.extra is not None:
            if isinstance(ev, StepEvent | LogEvent):  # what the terminal shows is what the store keeps
                ev = dataclasses.replace(ev, text=masked(ev.text))
            self.extra(ev)

    def step(self, text: str, side: str | None = None, test: str | None = None) -> None:
        self.emit(StepEvent(text, side, test))

    def log(self, text: str) -> None:
        self.emit(LogEvent(text))

    def progress(self, side: str, test: str, instance: int | None = None) -> Callable[[dict[str, Any]], None]:
        """The progress callback of a test's runner (core.bench.runners, core.bench.nettests: pct, mbps, eta, done);
        `instance`: which of N guests (or bare-metal processes) at once it is. Its seconds elapsed count from this
        call, made as the test starts, unless the runner gives its own."""
        t0 = time.monotonic()
        return lambda p: self.emit(ProgressEvent.from_payload({"elapsed": round(time.monotonic() - t0, 1), **p,
                                                               "side": side, "test": test, "instance": instance}))

    def sample(self, ev: SampleEvent) -> None:
        """A sampler row: kept in the run's timeline and its event stream in one transaction."""
        if self.run_id is not None:
            self.store.add_samples(self.run_id, [ev.to_payload()], event=True)
        if self.extra is not None:
            self.extra(ev)

    def finished(self, state: str, reason: str | None) -> None:
        """The final state, for the extra consumer: the store appends its event with the state itself."""
        if self.extra is not None:
            self.extra(StateEvent(state, None if reason is None else masked(reason)))
