"""One active run per host (and per enrolled node): an flock in the run dir holding the run's id and pid."""

from __future__ import annotations

import fcntl
import json
import os
from typing import Any

from .. import paths
from ..errors import RunBusy, UsageError
from ..spec.nodeconf import NODE_NAME_ALLOWED, is_node_name


class RunLock:
    """An flock on <run dir>/run.lock holding the run's id and pid. A run on a node takes run-node-<name>.lock here
    instead (the node itself holds its own run.lock); the name must be a node name, so it stays in the run dir."""

    def __init__(self, node: str = "") -> None:
        if node and not is_node_name(node):
            raise UsageError(f"--node {node!r} is not a node name; allowed: {NODE_NAME_ALLOWED}")
        self.node = node
        self.path = paths.run_dir() / (f"run-node-{node}.lock" if node else "run.lock")
        self.fd: int | None = None

    def acquire(self, info: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self.holder() or {}
            os.close(fd)
            where = f"node {self.node}" if self.node else "this host"
            raise RunBusy(
                f"another cloudbox run is active on {where} (run {holder.get('run_id', '?')}, profile "
                f"{holder.get('profile', '?')}, pid {holder.get('pid', '?')}); watch it with 'cloudbox watch "
                f"{holder.get('run_id', 'ID')}' or stop it with 'cloudbox cancel {holder.get('run_id', 'ID')}'"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(info).encode())
        self.fd = fd

    def update(self, info: dict[str, Any]) -> None:
        if self.fd is not None:
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, json.dumps(info).encode(), 0)

    def holder(self) -> dict[str, Any] | None:
        try:
            data = json.loads(self.path.read_text() or "{}")
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def release(self) -> None:
        if self.fd is not None:
            os.ftruncate(self.fd, 0)
            os.close(self.fd)
            self.fd = None


LOCAL_PLACE = "local"  # runspec.LOCAL_PLACE: this host among a spread run's places


def place_locks(node: str = "", *, coordinator: bool = False) -> list[RunLock]:
    """The locks of a run's places (--node: "", a node, or a comma list of them and `local`). The coordinator of a
    spread run holds its nodes' locks only: its part on this host is a run of its own, which takes this host's."""
    places = node.split(",") if node else [""]
    names = ["" if p == LOCAL_PLACE else p for p in places]
    if coordinator and len(places) > 1:
        names = [n for n in names if n]
    return [RunLock(n) for n in names]


def acquire_all(locks: list[RunLock], info: dict[str, Any]) -> None:
    """Every lock, or none (a busy one releases those already taken)."""
    taken: list[RunLock] = []
    try:
        for lock in locks:
            lock.acquire(info)
            taken.append(lock)
    except BaseException:
        for lock in taken:
            lock.release()
        raise


def check_not_busy(node: str = "") -> None:
    """Raise RunBusy now (cheaply) if a run holds the lock of this host, of `node`, or of any of its places."""
    locks = place_locks(node)
    acquire_all(locks, {"probe": True, "pid": os.getpid()})
    for lock in locks:
        lock.release()
