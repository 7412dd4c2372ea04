"""A run's lifecycle (core.run.lifecycle), the same for this host's steps and a node's mirroring: the run's
row and events, a signal turned into Aborted except inside atomic(), the cleanup stack unwound whatever happens,
and the final state with its reason. Bodies here are small functions over the run context: no guest is booted."""

from __future__ import annotations

import os
import signal

import pytest

from cloudbox.core.errors import CloudboxError, RunBusy
from cloudbox.core.record.events import RunEvent, StateEvent, StepEvent
from cloudbox.core.record.results import ResultStore
from cloudbox.core.record.runlock import RunLock
from cloudbox.core.run.context import RunContext
from cloudbox.core.run.lifecycle import Execution
from cloudbox.core.spec.runspec import RunSpec

SPEC = RunSpec(profile="virtio-disk", suite="storage", storage_tests="smoke")


def _run(body, spec: RunSpec = SPEC) -> tuple[int, list[RunEvent], Execution]:
    seen: list[RunEvent] = []
    with ResultStore() as store:
        ex = Execution(spec, store, body, emit=seen.append)
        return ex.execute(), seen, ex


def test_a_completed_run_has_its_row_plan_and_cleanup(state):
    cleaned: list[str] = []

    def body(ctx: RunContext) -> None:
        ctx.stack.callback(cleaned.append, "store")
        ctx.sink.step("measuring", side="guest", test="seq-write-64k")

    rid, seen, _ = _run(body)
    with ResultStore() as store:
        run, events = store.get_run(rid), [e.record for e in store.events_since(rid)]
    assert (run.state, run.reason, run.profile_name, run.size_label) == ("completed", None, "virtio-disk", "quick")
    assert run.provenance.controller is not None and cleaned == ["store"]
    first = events[0]
    assert isinstance(first, StateEvent) and first.plan == tuple(SPEC.plan())
    assert [e.text for e in events if isinstance(e, StepEvent)] == ["measuring", "cleaning up"]
    assert events[-1] == StateEvent("completed") and seen[-1] == StateEvent("completed")
    assert RunLock().holder() == {}  # released: the lock file is emptied


def test_a_signal_aborts_the_run_and_unwinds_the_stack(state):
    cleaned: list[str] = []

    def body(ctx: RunContext) -> None:
        ctx.stack.callback(cleaned.append, "guest")
        os.kill(os.getpid(), signal.SIGTERM)
        cleaned.append("after the signal")  # never: the handler raised Aborted

    rid, _, ex = _run(body)
    with ResultStore() as store:
        run = store.get_run(rid)
    assert (run.state, run.reason) == ("aborted", "cancelled by SIGTERM")
    assert cleaned == ["guest"] and ex.cancelled()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the caller's handler is back


def test_a_signal_inside_atomic_is_held_until_the_cleanup_is_registered(state):
    cleaned: list[str] = []

    def body(ctx: RunContext) -> None:
        with ctx.control.atomic():
            os.kill(os.getpid(), signal.SIGINT)
            cleaned.append("made")  # the resource is made...
            ctx.stack.callback(cleaned.append, "removed")  # ...and its cleanup registered
        cleaned.append("after atomic")  # never: Aborted is raised as atomic() ends

    rid, _, _ = _run(body)
    with ResultStore() as store:
        assert store.get_run(rid).reason == "cancelled by SIGINT"
    assert cleaned == ["made", "removed"]


def test_stopping_a_guest_session_is_its_normal_end(state):
    def body(ctx: RunContext) -> None:
        ctx.control.holding = True
        os.kill(os.getpid(), signal.SIGTERM)

    rid, _, _ = _run(body, RunSpec(profile="virtio-disk", suite="guest"))
    with ResultStore() as store:
        run = store.get_run(rid)
    assert (run.state, run.reason) == ("completed", "guest stopped (cancelled by SIGTERM)")


def test_a_failure_is_the_reason_and_a_bug_is_raised_after_the_cleanup(state):
    def fails(ctx: RunContext) -> None:
        raise CloudboxError("the backing store is full")

    rid, _, _ = _run(fails)
    with ResultStore() as store:
        assert store.get_run(rid).reason == "the backing store is full"

    cleaned: list[str] = []

    def buggy(ctx: RunContext) -> None:
        ctx.stack.callback(cleaned.append, "guest")
        raise KeyError("oops")

    with pytest.raises(KeyError):
        _run(buggy)
    with ResultStore() as store:
        (bug, _) = store.list_runs()
    assert (bug.state, bug.reason) == ("aborted", "internal error: KeyError: 'oops'") and cleaned == ["guest"]


def test_a_busy_host_is_refused_before_anything_is_recorded(state):
    lock = RunLock()
    lock.acquire({"pid": 1, "profile": "other", "run_id": 41})
    try:
        with pytest.raises(RunBusy, match=r"another cloudbox run is active on this host \(run 41, profile other"):
            _run(lambda ctx: None)
    finally:
        lock.release()
    with ResultStore() as store:
        assert store.list_runs() == []


def test_a_xen_profile_is_refused_before_anything_is_recorded(state, guest_image):
    """This host is not booted into Xen: the run says so at once, naming the boot entry, before the probe boots a
    KVM test guest and before the run is recorded (core.run.preflight)."""
    from cloudbox.core.run import preflight, runs

    with ResultStore() as store:
        with pytest.raises(preflight.Refused) as e:
            runs.executor(RunSpec(profile="xen-default", suite="storage"), store).execute()
        assert store.list_runs() == []
    assert "needs the Xen hypervisor" in str(e.value) and '"cloudbox on Xen" entry' in str(e.value)


def test_a_pvh_profile_is_refused_on_a_xen_without_hvm_before_anything_is_made(state, guest_image, monkeypatch,
                                                                                 tmp_path):
    """On a Xen boot whose Xen offers PV only (as nested under QEMU TCG: Xen's capabilities list no hvm-*), a PVH
    run is refused saying why and where it runs, before the probe, libvirt, a backing store or its record."""
    from cloudbox.core.run import runs
    from cloudbox.core.virt import accel

    caps = tmp_path / "capabilities"
    caps.write_text("xen-3.0-x86_64 xen-3.0-x86_32p\n")
    monkeypatch.setattr(accel, "booted_into_xen", lambda *a: True)
    monkeypatch.setattr(accel, "XEN_CAPS_SYSFS", caps)
    monkeypatch.setattr(accel.xen_hvm, "__defaults__", (caps,))
    monkeypatch.setattr(accel, "dom0_facts", lambda: {})  # no `xl info` here: the capabilities answer
    from cloudbox.core.run import preflight

    with ResultStore() as store:
        with pytest.raises(preflight.Refused) as e:
            runs.executor(RunSpec(profile="xen-pvh-phy", suite="storage"), store).execute()
        assert store.list_runs() == []
    assert "runs a PVH guest, which needs hardware virtualization" in str(e.value)
    assert "real hardware with VT-x/AMD-V" in str(e.value)
