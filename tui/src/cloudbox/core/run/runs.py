"""Starting runs: the executor of a spec (this host's steps, or the mirroring of a run on an enrolled node), a
detached executor that outlives its caller, cancelling (and stopping a guest through its run), and sweeps of several
runs one after another.

`python -m cloudbox.core.run.runs RUN_ID SPEC_JSON` is a detached executor and `python -m cloudbox.core.run.runs --sweep
FILE` a sweep's process: both run in their own session, their output in <state dir>/logs.
"""

from __future__ import annotations

import json
import os
import platform
import re
import signal
import subprocess
import sys
import time
import uuid as uuidlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType

from .. import paths
from ..errors import CloudboxError, NotFound, RunBusy
from ..record.provenance import Controller, Provenance
from ..record.results import ResultStore, pid_alive
from ..record.rows import Run
from ..record.runlock import check_not_busy
from ..spec.runspec import RunSpec
from ..virt.guest import GuestInfo, destroy_guest
from . import preflight
from .lifecycle import Execution
from .local import run_local
from .mirror import run_on_node
from .multi import run_many, run_profiles
from .propagate import run_propagation
from .repeated import run_repeated
from .sink import Consumer
from .spread import run_spread

ENTRY = "cloudbox.core.run.runs"  # the module a detached executor or sweep runs as (`python -m`)


# --------------------------------------------------------------------------------------- executor
def executor(spec: RunSpec, store: ResultStore, *, emit: Consumer | None = None,
             run_id: int | None = None) -> Execution:
    """The executor of `spec`: this host's steps (a test run's, a repeated one's, or the image-propagation sweep's),
    or the mirroring of a run on the enrolled node spec.node."""
    body = run_spread if spec.spread else run_on_node if spec.node else (
        run_propagation if spec.propagation else run_many if spec.guests > 1 or spec.hold else
        run_repeated if spec.repeated else run_local)
    return Execution(spec, store, body, emit=emit, run_id=run_id)


def check_guests_fit(spec: RunSpec) -> None:
    """A run of N guests that the profile cannot run or this host cannot hold, or a mixed run whose profiles
    cannot share it: a UsageError with the arithmetic or the knob."""
    run_profiles(spec)


# ------------------------------------------------------------------------------------- detached
def start_detached(spec: RunSpec, store: ResultStore) -> int:
    """Start the executor in its own session (it outlives the caller); returns the run id at once. What the
    executor would refuse before recording anything (bad settings, no such profile, what the run needs that is not
    there: core.run.preflight, a busy host) is raised here."""
    preflight.check(spec)
    check_not_busy(spec.node)
    run_id = store.create_run(uuid=uuidlib.uuid4().hex, profile_name=spec.profile, suite=spec.suite,
                              state="running", node=spec.node or platform.node(), started_at=time.time(),
                              provenance=Provenance(controller=Controller.this_host()))
    log_dir = paths.state_dir() / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log = open(log_dir / f"run-{run_id}.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", ENTRY, str(run_id), json.dumps(spec.as_dict())],
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    log.close()
    store.update_run(run_id, pid=proc.pid)
    return run_id


def cancel(store: ResultStore, run_id: int, timeout: float = 60.0) -> str:
    """Ask a run's executor to stop (SIGTERM: it cleans up and stores the run as aborted)."""
    run = store.get_run(run_id)
    if run.state != "running":
        return run.state
    if where := store.executed_elsewhere(run):
        raise CloudboxError(f"run {run_id} is executed by {where}, not by this host: cancel it on {where}")
    if not run.pid:
        raise CloudboxError(f"run {run_id} has no executor pid recorded")
    if not store.executor_alive(run):  # gone, or its pid recycled by another process: never signal that one
        store.reap_dead_runs()
        return store.get_run(run_id).state
    try:
        os.kill(run.pid, signal.SIGTERM)
    except ProcessLookupError:
        store.reap_dead_runs()
        return store.get_run(run_id).state
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = store.get_run(run_id).state
        if state != "running":
            return state
        time.sleep(0.5)
    return "running"


def run_of_guest(store: ResultStore, info: GuestInfo) -> Run | None:
    """The live run that owns a guest (by the run uuid in its metadata), or None for an orphan."""
    if not info.run_uuid:
        return None
    for r in store.active_runs():
        if r.uuid == info.run_uuid:
            return r
    return None


def stop_guest(store: ResultStore, info: GuestInfo, uri: str | None = None) -> str:
    """Stop a guest through its run (cleans up like Ctrl-C); an orphan is destroyed directly (over `uri`). Says
    which it was."""
    run = run_of_guest(store, info)
    if run is not None:
        state = cancel(store, run.id)
        return f"run {run.id} {state}"
    destroy_guest(info.name, uri)
    return "destroyed (it had no live run)"


# ----------------------------------------------------------------------------------------- sweeps
@dataclass
class Sweep:
    """Several runs queued one after another (profiles x one suite), executed by one detached process.

    Its state lives in <state dir>/sweeps/<id>.json, rewritten by the sweep process after every change:
    `runs[i]` is the run id of `specs[i]` once it has started (None while queued), `state` is running,
    completed (every item ran, whatever each run's outcome) or cancelled (the rest was skipped). A series
    (a study's repeats over time) gives `offsets[i]`: run i starts no sooner than that many seconds after the
    sweep started."""

    id: str
    specs: list[RunSpec]
    runs: list[int | None]
    state: str = "running"
    pid: int | None = None
    started_at: float = 0.0
    finished_at: float | None = None
    offsets: list[float] = field(default_factory=list)
    waiting_until: float | None = None  # while the sweep waits for its next run's start

    def due(self, i: int) -> float:
        """When run i may start (the sweep's start for a plain sweep)."""
        return self.started_at + (self.offsets[i] if i < len(self.offsets) else 0.0)

    @property
    def path(self) -> Path:
        return sweeps_dir() / f"{self.id}.json"

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = {**asdict(self), "specs": [s.as_dict() for s in self.specs]}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, self.path)

    @classmethod
    def load(cls, path: Path) -> Sweep:
        data = json.loads(path.read_text())
        data["specs"] = [RunSpec.from_dict(s, source=str(path)) for s in data["specs"]]
        return cls(**data)

    @property
    def queued(self) -> int:
        return sum(1 for r in self.runs if r is None) if self.state == "running" else 0


SWEEP_START_GRACE_S = 60.0  # how long a new sweep may take to record its process before it counts as dead


def sweeps_dir() -> Path:
    return paths.state_dir() / "sweeps"


def _load_sweep(f: Path) -> Sweep | None:
    """The sweep in file `f`, a 'running' one whose process is gone reported as 'died'; None when unreadable."""
    try:
        sw = Sweep.load(f)
    except (OSError, ValueError, TypeError, KeyError, CloudboxError):
        return None
    if sw.state == "running":
        if sw.pid is None:
            if time.time() - sw.started_at > SWEEP_START_GRACE_S:
                sw.state = "died"  # its process never recorded itself
        elif not pid_alive(sw.pid, sw.started_at):
            sw.state = "died"
    return sw


def list_sweeps() -> list[Sweep]:
    """Known sweeps, newest first. A 'running' sweep whose process is gone is reported as 'died'."""
    d = sweeps_dir()
    found = (_load_sweep(f) for f in sorted(d.glob("*.json"), reverse=True)) if d.is_dir() else ()
    return [sw for sw in found if sw is not None]


SWEEP_ID = re.compile(r"sweep-\d{8}-\d{6}-[0-9a-f]{6}")


def find_sweep(sweep_id: str) -> Sweep | None:
    """The sweep called `sweep_id` (its file alone is read), or None."""
    if not SWEEP_ID.fullmatch(sweep_id):
        return None
    return _load_sweep(sweeps_dir() / f"{sweep_id}.json")


def start_sweep(specs: list[RunSpec], store: ResultStore, *, offsets: list[float] | None = None) -> Sweep:
    """Queue `specs` to run one after another in a detached process (it outlives the caller); with `offsets`
    (seconds from now, one per spec) none starts before its own."""
    if not specs:
        raise CloudboxError("a sweep needs at least one profile")
    offsets = list(offsets or [])
    if offsets and (len(offsets) != len(specs) or any(b < a for a, b in zip(offsets, offsets[1:], strict=False))):
        raise CloudboxError(f"a sweep's start offsets must be one per run ({len(specs)}), in order")
    for spec in specs:
        spec.validate()
        check_guests_fit(spec)  # a series of N guests the host cannot hold: refused now
    for node in dict.fromkeys(spec.node for spec in specs):
        check_not_busy(node)
    sweep = Sweep(id=time.strftime("sweep-%Y%m%d-%H%M%S-") + uuidlib.uuid4().hex[:6], specs=specs,
                  runs=[None] * len(specs), started_at=time.time(), offsets=offsets)
    sweep.save()
    log_dir = paths.state_dir() / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / f"{sweep.id}.log", "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", ENTRY, "--sweep", str(sweep.path)],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    # Only the child writes the file from now on (it records its own pid first): a second writer here could
    # overwrite the child's progress. Until the pid appears, list_sweeps() reports the sweep as starting.
    sweep.pid = proc.pid
    return sweep


def wait_until(when: float, stopped: Callable[[], bool]) -> bool:
    """Sleep until the wall-clock time `when` unless `stopped()` turns true first (checked every 0.2 s); True when
    the time came."""
    while not stopped():
        left = when - time.time()
        if left <= 0:
            return True
        time.sleep(min(0.2, left))
    return False


def cancel_sweep(sweep_id: str, timeout: float = 60.0) -> str:
    """Stop a sweep: its running run is cancelled (cleaned up, stored as aborted) and the queued ones skipped; a
    sweep waiting for its next start stops at once. Returns the sweep's state afterwards."""
    sweep = find_sweep(sweep_id)
    if sweep is None:
        known = ", ".join(s.id for s in list_sweeps()[:5]) or "(none)"
        raise NotFound(f"no sweep {sweep_id!r}; newest sweeps: {known}")
    if sweep.state != "running" or sweep.pid is None:
        return sweep.state
    try:
        os.kill(sweep.pid, signal.SIGTERM)
    except ProcessLookupError:
        return "died"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = find_sweep(sweep_id)
        if now is None or now.state != "running":
            return now.state if now else "gone"
        time.sleep(0.3)
    return "running"


def _run_sweep(path: Path) -> int:
    sweep = Sweep.load(path)
    sweep.pid = os.getpid()
    sweep.save()
    stop = {"signal": ""}

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stop["signal"] = signal.Signals(signum).name

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, on_signal)
    rc = 0
    with ResultStore() as store:
        for i, spec in enumerate(sweep.specs):
            if time.time() < sweep.due(i) and not stop["signal"]:
                sweep.waiting_until = sweep.due(i)
                sweep.save()
                wait_until(sweep.due(i), lambda: bool(stop["signal"]))
                sweep.waiting_until = None
            if stop["signal"]:
                break
            run_id = store.create_run(uuid=uuidlib.uuid4().hex, profile_name=spec.profile, suite=spec.suite,
                                      state="running", node=platform.node(), started_at=time.time())
            sweep.runs[i] = run_id
            sweep.save()
            ex = executor(spec, store, run_id=run_id)
            try:
                ex.execute()
            except RunBusy as e:  # raised before the executor owns the run: record it here
                store.finish_run(run_id, "failed", str(e))
                rc = 1
            except Exception as e:  # noqa: BLE001 - the executor recorded it in the run
                print(f"sweep {sweep.id}: run {run_id}: {e}", file=sys.stderr)
                rc = 1
            if ex.cancelled():
                stop["signal"] = stop["signal"] or "cancel"
    sweep.state = "cancelled" if stop["signal"] else "completed"
    sweep.finished_at = time.time()
    sweep.save()
    return rc


def _main(argv: list[str]) -> int:
    if argv and argv[0] == "--sweep":
        return _run_sweep(Path(argv[1]))
    run_id, spec = int(argv[0]), RunSpec.from_dict(json.loads(argv[1]), source="the detached executor's argument")
    with ResultStore() as store:
        ex = executor(spec, store, run_id=run_id)
        try:
            ex.execute()
        except Exception as e:  # noqa: BLE001 - recorded in the run already
            print(f"executor: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
