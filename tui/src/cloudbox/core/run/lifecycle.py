"""One run from lock to finish, whatever runs it (this host's executor, or the front-end's mirroring of a run on a
node): the run lock, the run's row, its signals, the cleanup stack, and its final state with the reason.

Ctrl-C, SIGTERM (`cloudbox cancel`) or any failure unwinds the cleanup stack (guest, backing store, bridge,
namespace, servers, connections) and stores the run as `aborted` with the reason; a guest session that is stopped
ends `completed`. A bug is recorded as an internal error and raised after the cleanup.

Before its body the run undoes what runs that died left on this host (core.run.reclaim); while it runs, everything
its steps make on the host is in its own ledger (core.ledger), which it holds locked; what its cleanup could not take
down stays there, named in the reason, for the next clean-up.
"""

from __future__ import annotations

import contextlib
import os
import platform
import time
import uuid as uuidlib
from collections.abc import Callable
from typing import Any

from .. import ledger
from ..errors import Aborted, CloudboxError
from ..record.events import StateEvent
from ..record.provenance import Controller, Provenance
from ..record.results import ResultStore
from ..record.runlock import acquire_all, place_locks
from ..spec.profiles import MIX, mix_hash
from ..spec.runspec import RunSpec, parse_size
from . import preflight, reclaim
from .context import RunContext, RunControl
from .launch import console_note
from .multi import run_profiles
from .sink import Consumer, EventSink

Body = Callable[[RunContext], None]


class Execution:
    """Runs `body` (the run's own steps) as run `run_id` (pre-created by a detached start, else created here)."""

    def __init__(self, spec: RunSpec, store: ResultStore, body: Body, *, emit: Consumer | None = None,
                 run_id: int | None = None) -> None:
        self.spec = spec
        self.store = store
        self.body = body
        self.sink = EventSink(store, run_id, emit)
        self.run_id = run_id
        self.control = RunControl()

    def cancelled(self) -> bool:
        return self.control.cancelled()

    def execute(self) -> int:
        """The run, start to end; its id. Bad settings, what the run needs that is not there (core.run.preflight)
        and a busy host raise before anything is recorded (a pre-created run was checked by its starter)."""
        spec, store, control, sink = self.spec, self.store, self.control, self.sink
        if self.run_id is None:
            preflight.check(spec)
        else:
            spec.validate()
        mix = run_profiles(spec)  # checked, the guests' fit too
        profile = mix[0]  # a mixed run's first: the run-wide knobs are the same in all (core.spec.profiles.mix_problem)
        size, size_label = parse_size(spec.size, max(p.guest.memory_mib for p in mix))
        name = MIX.join(p.name for p in mix)
        run_uuid = uuidlib.uuid4().hex
        locks = place_locks(spec.node, coordinator=True)
        acquire_all(locks, {"pid": os.getpid(), "profile": name, "run_id": self.run_id})
        control.install()
        stack = contextlib.ExitStack()
        held = ledger.Ledger(None)
        ctx: RunContext | None = None
        state: str = "aborted"
        reason: str | None = "unknown"
        try:
            fields: dict[str, Any] = dict(uuid=run_uuid, profile_name=name, profile_hash=mix_hash(mix),
                                          profile_toml=profile.to_toml(), suite=spec.suite, size_bytes=size,
                                          size_label=size_label, state="running", node=spec.node or platform.node(),
                                          pid=os.getpid(), started_at=time.time())
            provenance = Provenance(controller=Controller.this_host())
            if self.run_id is None:
                self.run_id = store.create_run(**fields, provenance=provenance)
            else:
                store.update_run(self.run_id, **fields)
                store.set_provenance(self.run_id, provenance)
            sink.run_id = self.run_id
            for lock in locks:
                lock.update({"pid": os.getpid(), "profile": name, "run_id": self.run_id})
            _reclaim(store, sink)
            held = stack.enter_context(ledger.keeping(ledger.Ledger.create(run_uuid)))
            ctx = RunContext(spec, profile, size, size_label, run_uuid, self.run_id, store, sink, control, stack,
                             provenance, mix=mix if len(mix) > 1 else [])
            sink.emit(StateEvent("running", profile=name, suite=spec.suite, plan=tuple(spec.plan())))
            self.body(ctx)
            state, reason = "completed", None
            if spec.session:
                reason = "the guest shut down"
        except (Aborted, KeyboardInterrupt) as e:
            reason = str(e) or "cancelled (Ctrl-C)"
            if control.holding:  # stopping a guest session is its normal end
                state, reason = "completed", f"guest stopped ({reason})"
        except CloudboxError as e:
            reason = str(e) + console_note(ctx.guest if ctx else None, e)
        except Exception as e:  # a bug: still clean up and record it
            reason = f"internal error: {e.__class__.__name__}: {e}"
            raise
        finally:
            control.cleaning = True
            sink.step("cleaning up")
            try:
                stack.close()
            except Exception as e:  # noqa: BLE001
                reason = f"{reason or ''} (cleanup problem: {e})".strip()
            left = _last_resort(held, sink)
            if left:
                reason = (f"{reason or ''} (cleanup left {'; '.join(left)}: the next run, `cloudbox reclaim` or a "
                          "boot undoes it)").strip()
            if self.run_id is not None:
                # finish_run also appends the final `state` event, atomically with the state change.
                store.finish_run(self.run_id, state, reason)
                sink.finished(state, reason)
            control.restore()
            for lock in locks:
                lock.release()
        assert self.run_id is not None
        return self.run_id


def _reclaim(store: ResultStore, sink: EventSink) -> None:
    """What runs that died left on this host, undone before this run makes anything (core.run.reclaim); a failure
    there is logged, never this run's."""
    try:
        for problem in reclaim.reclaim_dead_runs(store, sink.log):
            sink.log(f"could not undo what a dead run left: {problem}")
    except Exception as e:  # noqa: BLE001 - the clean-up of other runs does not decide this one
        sink.log(f"the clean-up after dead runs failed: {e.__class__.__name__}: {e}")


def _last_resort(held: ledger.Ledger, sink: EventSink) -> list[str]:
    """What the run's ledger still holds once its cleanup stack is unwound (a step that made something outside it,
    a release that failed), undone through the ledger now; the run's ledger closed. What still cannot be undone,
    described (it stays in the ledger for a later clean-up)."""

    def say(what: str) -> None:
        with contextlib.suppress(Exception):
            sink.log(f"{what} (left by a step's cleanup)")

    try:
        return held.undo_held(say)
    finally:
        held.close()
