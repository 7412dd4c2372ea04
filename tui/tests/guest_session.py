"""Waiting for a real run in a test: up to the bound the run itself keeps (every boot attempt's agent wait), and
failing at once, with the run's reason and its last steps, when the run ends instead."""

from __future__ import annotations

import time

from cloudbox.core.run import launch
from cloudbox.core.spec.runspec import RunSpec

# A guest session is up within every boot attempt's agent wait; past that the run has failed on its own.
SESSION_UP_S = launch.BOOT_ATTEMPTS * RunSpec.agent_timeout + 60
UP_STEP = "running; stop it"


def _steps(store, run_id: int, last: int = 8) -> str:
    lines = [e.payload.get("text", "") for e in store.events_since(run_id) if e.kind in ("step", "log")]
    return "\n".join(f"  {ln}" for ln in lines[-last:])


def wait_up(store, run_id: int, what: str = "the guest session", timeout: float = SESSION_UP_S) -> None:
    """Until the guest session `run_id` holds its guest; an AssertionError naming the run's end or its steps."""
    deadline = time.monotonic() + timeout
    while True:
        if any(UP_STEP in (e.payload.get("text") or "") for e in store.events_since(run_id)):
            return
        run = store.get_run(run_id)
        if run.state != "running":
            raise AssertionError(f"{what} (run {run_id}) ended {run.state} before it was up: {run.reason}\n"
                                 f"its last steps:\n{_steps(store, run_id)}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} (run {run_id}) was not up after {timeout:.0f} s; its last steps:\n"
                                 f"{_steps(store, run_id)}")
        time.sleep(0.5)
