"""Node health: is each enrolled node's libvirt reachable through the pinned SSH transport?

`check_all()` probes every node at once (libvirt open + getHostname + getLibVersion over the node's
qemu+ssh URI, each bounded by CHECK_TIMEOUT_S), stores up/down with the reason in the registry and, for a
node that is down, marks its runs still 'running' whose executor is gone as failed with that reason (not left
running, not lost; a live executor ends its run itself: ResultStore.fail_runs_on_node).
`monitor()` repeats it every CHECK_INTERVAL_S: a back-end that disappears is shown down within
CHECK_INTERVAL_S + CHECK_TIMEOUT_S (20 s), inside the 30 s the overview promises. A node whose last check is
older than STALE_AFTER_S is shown 'unknown' (nobody is checking), never as still up.
"""

from __future__ import annotations

import subprocess
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import CloudboxError
from .registry import NodeRecord, Registry

CHECK_TIMEOUT_S = 10.0
CHECK_INTERVAL_S = 10.0
STALE_AFTER_S = 30.0

Probe = Callable[[NodeRecord], dict[str, Any]]


@dataclass
class Health:
    name: str
    state: str  # up | down
    reason: str
    detail: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    failed_runs: list[int] = field(default_factory=list)


def libvirt_probe(node: NodeRecord) -> dict[str, Any]:
    """Open the node's libvirt through its pinned qemu+ssh URI and ask its host name and libvirt version."""
    import libvirt

    libvirt.registerErrorHandler(lambda *_: None, None)
    try:
        conn = libvirt.open(node.libvirt_uri)
    except libvirt.libvirtError as e:
        why = _first_line(str(e))
        ssh = ssh_diagnosis(node)
        raise CloudboxError(f"{why}; ssh: {ssh}" if ssh else why) from None
    try:
        hostname = conn.getHostname()
        v = int(conn.getLibVersion())
    finally:
        conn.close()
    return {"hostname": hostname, "libvirt": f"{v // 1_000_000}.{v // 1000 % 1000}.{v % 1000}"}


def local_libvirt_ready() -> float:
    """Open this node's own libvirt once, as the front-end is about to over SSH: on an installed node that starts
    the socket-activated daemon and its QEMU capability probe, so that the node is ready when enrolment says so
    (the front-end's first check right after an enrolment once took more than its 10 s: CI, a TCG back-end).
    Returns the seconds taken; CloudboxError when libvirt does not answer. Never starts daemons by hand."""
    from ..virt import daemons

    t0 = time.monotonic()
    conn = daemons.connect(start=False)
    try:
        conn.getLibVersion()
    finally:
        conn.close()
    return time.monotonic() - t0


def ssh_diagnosis(node: NodeRecord, timeout: float = 8.0) -> str | None:
    """libvirt's SSH transport hides ssh's own message (a changed host key reads as "Cannot recv data"): run
    `true` through the same pinned ssh wrapper and return ssh's complaint, or None when ssh itself is fine."""
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(node.libvirt_uri).query)
    wrapper = (query.get("command") or ["ssh"])[0]
    try:
        out = subprocess.run([wrapper, "-p", str(node.ssh_port), "-l", "root", "--", node.address, "true"],
                             capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{type(e).__name__}: {e}"
    if out.returncode == 0:
        return None
    lines = [ln.strip() for ln in out.stderr.splitlines() if ln.strip() and not ln.startswith("@")]
    keep = [ln for ln in lines if "verification failed" in ln or "Permission denied" in ln or "refused" in ln]
    return "; ".join((keep or lines[-1:])[:2]) or f"exit status {out.returncode}"


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return "; ".join(lines[:3])[:300] or "failed without a message"


# node name -> (its probe's thread, when it started): a probe given up on keeps running until its SSH ends.
_in_flight: dict[str, tuple[threading.Thread, float]] = {}
_in_flight_lock = threading.Lock()


def check_node(node: NodeRecord, *, probe: Probe = libvirt_probe, timeout: float = CHECK_TIMEOUT_S) -> Health:
    """Probe one node in a worker thread, giving up after `timeout` seconds. While an earlier probe of the node
    is still waiting, no second one starts: on a back-end too busy to answer in time (a TCG node running a
    guest), each new SSH login would add to the load that made it slow, and the logins would pile up."""
    out: dict[str, Any] = {}

    def work() -> None:
        try:
            out["detail"] = probe(node)
        except Exception as e:  # any failure of the probe is the node's reason for being down
            out["error"] = f"{type(e).__name__}: {e}" if not isinstance(e, CloudboxError) else str(e)

    t0 = time.monotonic()
    with _in_flight_lock:
        earlier = _in_flight.get(node.name)
        if earlier is not None and earlier[0].is_alive():
            return Health(node.name, "down", f"no answer from libvirt at {node.address} within {timeout:g} s "
                          f"(its check started {t0 - earlier[1]:.0f} s ago is still waiting)", {}, 0.0)
        t = threading.Thread(target=work, name=f"check-{node.name}", daemon=True)
        _in_flight[node.name] = (t, t0)
    t.start()
    t.join(timeout)
    took = time.monotonic() - t0
    if t.is_alive():
        return Health(node.name, "down", f"no answer from libvirt at {node.address} within {timeout:g} s", {}, took)
    if "error" in out:
        return Health(node.name, "down", f"libvirt at {node.address}: {out['error']}", {}, took)
    d = out.get("detail", {})
    return Health(node.name, "up", f"libvirt {d.get('libvirt', '?')} on {d.get('hostname', '?')}", d, took)


def check_all(registry: Registry, results: Any = None, *, probe: Probe = libvirt_probe,
              timeout: float = CHECK_TIMEOUT_S) -> list[Health]:
    """Check every node at once; store the outcome; fail the runs of nodes that are down (`results` is a
    ResultStore, or None to leave runs alone)."""
    nodes = registry.nodes()
    found: list[Health | None] = [None] * len(nodes)

    def one(i: int, n: NodeRecord) -> None:
        found[i] = check_node(n, probe=probe, timeout=timeout)

    threads = [threading.Thread(target=one, args=(i, n), daemon=True) for i, n in enumerate(nodes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 5)
    healths: list[Health] = []
    for n, h in zip(nodes, found, strict=True):
        if h is None:
            h = Health(n.name, "down", f"no answer within {timeout:g} s")
        registry.set_health(n.name, h.state, h.reason, h.detail if h.state == "up" else None)
        if h.state == "down" and results is not None:
            h.failed_runs = [r.id for r in results.fail_runs_on_node(n.name, f"node {n.name} down: {h.reason}")]
        healths.append(h)
    return healths


def shown_state(node: NodeRecord, now: float | None = None) -> tuple[str, str]:
    """(state, reason) as the overview should show it: a stale check says 'unknown', not the old answer."""
    now = time.time() if now is None else now
    if node.checked_at is None:
        return "unknown", node.reason or "not checked yet (is `cloudbox node check --watch` running?)"
    age = now - node.checked_at
    if age > STALE_AFTER_S:
        return "unknown", f"last checked {int(age)} s ago ({node.state}: {node.reason}); no monitor is running"
    return node.state, node.reason or ""


def monitor(registry: Registry, results: Any = None, *, interval: float = CHECK_INTERVAL_S,
            timeout: float = CHECK_TIMEOUT_S, probe: Probe = libvirt_probe, stop: threading.Event | None = None,
            on_check: Callable[[list[Health]], None] | None = None) -> None:
    """check_all() every `interval` seconds until `stop` is set."""
    stop = stop or threading.Event()
    while not stop.is_set():
        t0 = time.monotonic()
        healths = check_all(registry, results, probe=probe, timeout=timeout)
        if on_check is not None:
            on_check(healths)
        stop.wait(max(0.0, interval - (time.monotonic() - t0)))
