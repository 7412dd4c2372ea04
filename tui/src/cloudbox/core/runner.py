"""Runs: the executor of a spec (this host's steps, or the mirroring of a run on an enrolled node), detached
executors that outlive their caller, cancelling, and sweeps of several runs one after another."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import signal
import subprocess
import sys
import time
import uuid as uuidlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from . import network, nodeconf, paths
from .errors import CloudboxError, RunBusy
from .events import ProgressEvent, SampleEvent, StateEvent, StepEvent, parse
from .execution.context import RunContext
from .execution.lifecycle import Execution
from .execution.local import run_local
from .execution.sink import Consumer
from .guestimage import GuestImage
from .nodes import health, registry, remote
from .provenance import Controller, NodeInfo, Nodes, PeerServers, Provenance
from .results import MEASUREMENT_COLUMNS, ResultStore, pid_alive
from .runlock import check_not_busy
from .runspec import BOOT, RunSpec, resolve_net_tests


# --------------------------------------------------------------------------------------- executor
def executor(spec: RunSpec, store: ResultStore, *, emit: Consumer | None = None,
             run_id: int | None = None) -> Execution:
    """The executor of `spec`: this host's steps, or the mirroring of a run on the enrolled node spec.node."""
    return Execution(spec, store, run_on_node if spec.node else run_local, emit=emit, run_id=run_id)


def run_on_node(ctx: RunContext) -> None:
    """The run on an enrolled node: check it is up, propagate the guest image (timed), start the node's own
    executor there, mirror its events here live, then bring its measurements and provenance into this
    database. Cancelling here cancels the node's run (its guest and stores are removed there)."""
    spec, sink, control, store = ctx.spec, ctx.sink, ctx.control, ctx.store
    sink.step(f"checking node {spec.node}")
    with registry.Registry() as reg:
        try:
            node = reg.node(spec.node)
        except CloudboxError:
            known = ", ".join(n.name for n in reg.nodes()) or "none enrolled"
            raise CloudboxError(f"--node {spec.node!r}: no such node; allowed: {known}") from None
        shell = remote.NodeShell.for_node(reg, node)
    h = health.check_node(node)
    if h.state != "up":
        raise CloudboxError(f"node {node.name} is down: {h.reason}")
    sink.log(f"node {node.name} ({node.address}) is up: {h.reason}")
    image = GuestImage.locate()
    sink.step(f"propagating the guest image to {node.name}", side="guest")
    prop = remote.propagate_image(
        shell, image, cancelled=control.cancelled,
        progress=lambda done, total: sink.emit(ProgressEvent("guest", BOOT, 0, f"copy {done * 100 // total}%")))
    sink.log(prop.describe())
    with registry.Registry() as reg:
        reg.add_propagation(asdict(prop))
    # The front-end's part of the provenance; the node's own (host, CPU, versions, domain XML) joins it at the end.
    ours = Provenance(controller=Controller.this_host(), nodes=Nodes(front_end=platform.node(), back_end=node.name),
                      node=NodeInfo(name=node.name, address=node.address,
                                    host_key_fingerprint=node.host_key_fingerprint),
                      propagation=prop)
    ctx.provenance = ours
    ctx.save_provenance()
    remote_spec = {k: v for k, v in asdict(spec).items() if k != "node"}
    if spec.suite in ("network", "all"):
        remote_spec.update(serve_peer(ctx))
        if remote_spec.get("peer"):
            ours.peer = PeerServers(peer=remote_spec["peer"], peer_netperf_port=remote_spec["peer_netperf_port"],
                                    peer_iperf3_port=remote_spec["peer_iperf3_port"])
    sink.step(f"starting the run on {node.name}")
    with control.atomic():
        rr = remote.start_run(shell, remote_spec, ctx.profile.to_toml(), prop.remote_dir)
        finished = {"done": False}

        def stop_remote() -> None:
            if not finished["done"]:
                try:
                    sink.log(f"cancelling run {rr.run_id} on {node.name}: {remote.cancel_run(shell, rr)}")
                except CloudboxError as e:
                    sink.log(f"could not cancel run {rr.run_id} on {node.name}: {e}")

        ctx.stack.callback(stop_remote)
    ours.remote_run = rr
    ctx.save_provenance()
    sink.log(f"run {rr.run_id} on {node.name} started; its own record stays there")
    seq, final = 0, dict[str, object]()
    control.holding = spec.session  # stopping a guest session is its normal end, as on this host
    dropped_at: float | None = None  # when the stream first dropped without the run having ended
    while True:
        try:
            for ev_seq, kind, payload in remote.follow(shell, rr, cancelled=control.cancelled, after_seq=seq):
                seq = ev_seq  # where a re-attached stream picks up
                dropped_at = None
                mirror(ctx, kind, payload, final)
            break
        except remote.NodeError as e:
            if control.cancelled():
                break
            now = time.monotonic()
            dropped_at = dropped_at or now
            if now - dropped_at > remote.REATTACH_WITHIN_S:
                h = health.check_node(node)
                raise CloudboxError(f"lost node {node.name} during the run: no event stream for "
                                    f"{now - dropped_at:.0f} s ({e}); its health check: {h.state}, {h.reason}; "
                                    f"run {rr.run_id} there is left to finish or be cleaned up by the node") \
                    from None
            sink.log(f"re-attaching to run {rr.run_id} on {node.name} in 10 s ({e})")
            time.sleep(10)
    if control.cancelled():
        raise control.aborted()
    control.holding = False
    data = remote.fetch_run(shell, rr)
    rr.uuid = str(data.get("uuid") or rr.uuid)  # the node's executor gives its run its final uuid
    finished["done"] = data.get("state") != "running"
    ours.remote_run = rr
    store.update_run(ctx.run_id, accelerator=data.get("accelerator"), emulated=int(bool(data.get("emulated"))),
                     size_bytes=data.get("size_bytes"), size_label=data.get("size_label"))
    ctx.provenance = Provenance.from_stored(data.get("provenance")).under(ours)
    ctx.save_provenance()
    for m in data.get("measurements") or []:  # as the node's export wrote them (its own columns)
        store.add_measurement(ctx.run_id, **{k: m.get(k) for k in MEASUREMENT_COLUMNS if k in m})
    if data.get("state") != "completed":
        raise CloudboxError(f"the run on {node.name} (its run {rr.run_id}) ended {data.get('state')}: "
                            f"{data.get('reason') or final.get('reason') or 'no reason given'}")


def serve_peer(ctx: RunContext) -> dict[str, Any]:
    """The front-end's side of the cross-node network tests: netserver and iperf3 on its private address for
    the length of the run (stopped with it). {} when this host has no private network (not an installed
    front-end): the node's guest -> front-end tests are then left out, and the log says so."""
    addr = nodeconf.private_address()
    if addr == "0.0.0.0":
        ctx.sink.log("this host has no private network address (its node settings name no private NIC): the "
                     "guest -> front-end network tests are left out of this run")
        return {}
    tools = {nt.tool for nt in resolve_net_tests(ctx.spec.net_tests)}
    servers = network.HostNetwork(ctx.profile.network.mtu)
    ctx.stack.callback(servers.teardown)
    fields = {"peer": addr,
              "peer_netperf_port": servers.start_netserver(addr) if "netperf" in tools else 0,
              "peer_iperf3_port": servers.start_iperf3(addr) if "iperf3" in tools else 0}
    ctx.sink.log(f"serving the cross-node network tests on {addr}: "
                 + ", ".join(f"{t} port {fields[f'peer_{t}_port']}" for t in sorted(tools)))
    return fields


def mirror(ctx: RunContext, kind: str, payload: dict[str, Any], final: dict[str, Any]) -> None:
    """One event of the node's run, re-emitted here (samples stored as this run's timeline)."""
    ev = parse(kind, payload)
    if isinstance(ev, StateEvent):
        if ev.state == "running":
            ctx.sink.emit(ev)
        else:
            final.update(ev.to_payload())
        return
    if isinstance(ev, SampleEvent):
        ctx.sink.sample(ev)
        return
    if isinstance(ev, StepEvent):
        ev = dataclasses.replace(ev, text=f"{ctx.spec.node}: {ev.text}")
    if ev is not None:
        ctx.sink.emit(ev)


# ------------------------------------------------------------------------------------- detached
def start_detached(spec: RunSpec, store) -> int:
    """Start the executor in its own session (it outlives the caller); returns the run id at once."""
    spec.validate()
    check_not_busy(spec.node)
    run_id = store.create_run(uuid=uuidlib.uuid4().hex, profile_name=spec.profile, suite=spec.suite,
                              state="running", node=spec.node or platform.node(), started_at=time.time(),
                              provenance=Provenance(controller=Controller.this_host()))
    log_dir = paths.state_dir() / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log = open(log_dir / f"run-{run_id}.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "cloudbox.core.runner", str(run_id), json.dumps(asdict(spec))],
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    log.close()
    store.update_run(run_id, pid=proc.pid)
    return run_id


def cancel(store, run_id: int, timeout: float = 60.0) -> str:
    """Ask a run's executor to stop (SIGTERM: it cleans up and stores the run as aborted)."""
    run = store.get_run(run_id)
    if run.state != "running":
        return run.state
    if not run.pid:
        raise CloudboxError(f"run {run_id} has no executor pid recorded")
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


# ----------------------------------------------------------------------------------------- sweeps
@dataclass
class Sweep:
    """Several runs queued one after another (profiles x one suite), executed by one detached process.

    Its state lives in <state dir>/sweeps/<id>.json, rewritten by the sweep process after every change:
    `runs[i]` is the run id of `specs[i]` once it has started (None while queued), `state` is running,
    completed (every item ran, whatever each run's outcome) or cancelled (the rest was skipped)."""

    id: str
    specs: list[RunSpec]
    runs: list[int | None]
    state: str = "running"
    pid: int | None = None
    started_at: float = 0.0
    finished_at: float | None = None

    @property
    def path(self) -> Path:
        return sweeps_dir() / f"{self.id}.json"

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = {**asdict(self), "specs": [asdict(s) for s in self.specs]}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, self.path)

    @classmethod
    def load(cls, path: Path) -> Sweep:
        data = json.loads(path.read_text())
        data["specs"] = [RunSpec(**s) for s in data["specs"]]
        return cls(**data)

    @property
    def queued(self) -> int:
        return sum(1 for r in self.runs if r is None) if self.state == "running" else 0


SWEEP_START_GRACE_S = 60.0  # how long a new sweep may take to record its process before it counts as dead


def sweeps_dir() -> Path:
    return paths.state_dir() / "sweeps"


def list_sweeps() -> list[Sweep]:
    """Known sweeps, newest first. A 'running' sweep whose process is gone is reported as 'died'."""
    out = []
    d = sweeps_dir()
    for f in sorted(d.glob("*.json"), reverse=True) if d.is_dir() else []:
        try:
            sw = Sweep.load(f)
        except (OSError, ValueError, TypeError):
            continue
        if sw.state == "running":
            if sw.pid is None:
                if time.time() - sw.started_at > SWEEP_START_GRACE_S:
                    sw.state = "died"  # its process never recorded itself
            elif not pid_alive(sw.pid, sw.started_at):
                sw.state = "died"
        out.append(sw)
    return out


def start_sweep(specs: list[RunSpec], store) -> Sweep:
    """Queue `specs` to run one after another in a detached process (it outlives the caller)."""
    if not specs:
        raise CloudboxError("a sweep needs at least one profile")
    for spec in specs:
        spec.validate()
    for node in dict.fromkeys(spec.node for spec in specs):
        check_not_busy(node)
    sweep = Sweep(id=time.strftime("sweep-%Y%m%d-%H%M%S-") + uuidlib.uuid4().hex[:6], specs=specs,
                  runs=[None] * len(specs), started_at=time.time())
    sweep.save()
    log_dir = paths.state_dir() / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / f"{sweep.id}.log", "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "cloudbox.core.runner", "--sweep", str(sweep.path)],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    # Only the child writes the file from now on (it records its own pid first): a second writer here could
    # overwrite the child's progress. Until the pid appears, list_sweeps() reports the sweep as starting.
    sweep.pid = proc.pid
    return sweep


def _run_sweep(path: Path) -> int:
    sweep = Sweep.load(path)
    sweep.pid = os.getpid()
    sweep.save()
    stop = {"signal": ""}

    def on_signal(signum, _frame) -> None:
        stop["signal"] = signal.Signals(signum).name

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, on_signal)
    rc = 0
    with ResultStore() as store:
        for i, spec in enumerate(sweep.specs):
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
    run_id, spec = int(argv[0]), RunSpec(**json.loads(argv[1]))
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
