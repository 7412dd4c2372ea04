"""One place's side of a spread run's start barrier (spec.hold): before each test, with its guests' clocks read
(and before each of bare metal's), the place tells the front-end (a step event with `held`, in its event stream)
and waits for the start instant the front-end writes here through `cloudbox node local coord`, already on this
host's clock (core.run.spread)."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from .. import ledger, paths
from ..errors import CloudboxError
from ..record.events import StepEvent, counted
from .context import RunContext

HOLD_WAIT_S = 1800.0  # the slowest place may still be booting its guests or laying down data for a read test
POLL_S = 0.02
MIN_LEAD_S = 1.0  # an instant closer than this leaves the guests' shells too little time: said in the log
TEST_KEY = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")


def hold_dir(run_id: int) -> Path:
    return paths.run_dir() / "holds" / str(run_id)


def key(side: str, test: str) -> str:
    """What a held test is called between a place and the front-end: the guests' `test`, or bare metal's
    `baseline.<test>`."""
    return f"baseline.{test}" if side == "baseline" else test


def wait(ctx: RunContext, test: str, count: int, wait_s: float = HOLD_WAIT_S, side: str = "guest") -> float:
    """The start instant of `test` on `side` (its `count` guests, or bare metal's processes; epoch seconds, this
    host's clock), once the front-end has given it."""
    d = hold_dir(ctx.run_id)
    if not d.is_dir():
        made = ledger.hold(ledger.Directory(str(d)))
        d.mkdir(parents=True)
        ctx.stack.callback(made.release)
    f = d / key(side, test)
    who = counted(count, "process", "processes") if side == "baseline" else counted(count, "guest")
    ready = f"{who} ready" if count else "nothing to run here"  # a place without a baseline still keeps the step
    ctx.sink.emit(StepEvent(f"{'bare metal' if side == 'baseline' else 'guest'}: {test}: {ready}, waiting for "
                            "the front-end's start instant", side, test, held=max(count, 1)))
    deadline = time.monotonic() + wait_s
    while not f.exists():
        ctx.control.check()
        if time.monotonic() > deadline:
            raise CloudboxError(f"{key(side, test)}: no start instant from the front-end ({ctx.spec.hold}) within "
                                f"{wait_s:.0f} s of this place's {who} being ready; another place's part may have "
                                "stopped")
        time.sleep(POLL_S)
    at = float(f.read_text())
    lead = at - time.time()
    if lead < MIN_LEAD_S:
        ctx.sink.log(f"{key(side, test)}: the front-end's start instant came {lead:.2f} s ahead (under "
                     f"{MIN_LEAD_S:g} s); the {side} side starts as soon as it can and the start skew shows it")
    else:
        ctx.sink.log(f"{key(side, test)}: the front-end's start instant is {lead:.2f} s ahead")
    return at


def release(run_id: int, test: str, at: float) -> None:
    """The front-end's side, run here by `cloudbox node local coord`: `test` of run `run_id` starts at `at`."""
    if not TEST_KEY.fullmatch(test):
        raise CloudboxError(f"test {test!r} is not a test id; allowed: lowercase letters, digits, '.', '_', '-'")
    d = hold_dir(run_id)
    if not d.is_dir():
        raise CloudboxError(f"run {run_id} holds no test here ({d} does not exist): it has not reached a barrier yet, "
                            "or it has ended")
    tmp = d / f".{test}.{os.getpid()}"
    tmp.write_text(f"{at:.6f}\n")
    tmp.replace(d / test)
