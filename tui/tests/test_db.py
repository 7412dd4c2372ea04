"""core.db: the one SQLite transaction path of the results store and the node registry, safe against an exception
raised by a signal handler anywhere inside it (the executor turns SIGINT/SIGTERM into one)."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import pytest

from cloudbox.core import db
from cloudbox.core.cluster.registry import Registry


class Cut(Exception):
    pass


def _cut_writes(write, seconds: float = 1.5) -> tuple[int, int]:
    """Calls write() for `seconds` with SIGALRM every 50 us, each raising Cut once inside a call; (cuts, calls).
    Fails the test on any other error (the bug: 'cannot start a transaction within a transaction')."""
    armed = [False]

    def cut(_signum, _frame):
        if armed[0]:
            armed[0] = False
            raise Cut

    old = signal.signal(signal.SIGALRM, cut)
    cuts = calls = 0
    deadline = time.monotonic() + seconds
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.00005, 0.00005)
        while time.monotonic() < deadline:
            calls += 1
            try:
                armed[0] = True
                write()
                armed[0] = False
            except Cut:
                cuts += 1
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    return cuts, calls


def test_the_node_registry_survives_writes_cut_by_a_signal(tmp_path: Path):
    """The registry had its own older write path without the rollback of a cut transaction; it now shares
    core.db's, so a cut write leaves nothing open and nothing half-written."""
    with Registry(tmp_path / "nodes.db") as reg:
        cuts, calls = _cut_writes(lambda: reg.record_failure("10.73.0.9", "be1", "wrong code"))
        assert cuts > 100, (cuts, calls)  # the cuts did land
        reg.record_failure("10.73.0.9", "be1", "after")
        rows = reg.failures(limit=100000)
        assert rows[0]["reason"] == "after"
        assert all(r["reason"] in ("wrong code", "after") and r["peer"] == "10.73.0.9" for r in rows)
        # every uncut call wrote its row, a cut one at most its row (cut after COMMIT), nothing twice
        assert calls - cuts + 1 <= len(rows) <= calls + 1, (len(rows), calls, cuts)


def test_a_transaction_left_open_is_closed_before_the_next(tmp_path: Path):
    conn = db.connect(tmp_path / "x.db")
    conn.execute("CREATE TABLE t (v INTEGER)")
    conn.execute("BEGIN")  # as a cut between BEGIN and the try would leave it
    conn.execute("INSERT INTO t VALUES (1)")
    with db.write(conn) as c:
        c.execute("INSERT INTO t VALUES (2)")
    assert [r[0] for r in conn.execute("SELECT v FROM t")] == [2]  # the half-done one rolled back, ours kept
    with pytest.raises(ValueError), db.write(conn) as c:
        c.execute("INSERT INTO t VALUES (3)")
        raise ValueError
    assert not conn.in_transaction and [r[0] for r in conn.execute("SELECT v FROM t")] == [2]
    assert str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower() == "wal"


class _Two(db.Database):
    WHAT = "test store"
    SCHEMA_VERSION = 2
    MIGRATIONS: db.Migrations = {0: lambda c: None if c.execute("CREATE TABLE a (x)") else None,
                                 1: lambda c: None if c.execute("CREATE TABLE b (y)") else None}


def test_the_base_migrates_once_closes_under_its_lock_and_refuses_a_newer_file(tmp_path: Path):
    path = tmp_path / "sub" / "t.db"
    with _Two(path) as s:
        tables = {r[0] for r in s._conn.execute("SELECT name FROM sqlite_master")}
        assert tables == {"a", "b"}
        with s._write() as c:
            c.execute("INSERT INTO a VALUES (1)")
    with _Two(path) as s:  # a second open runs no step again (CREATE TABLE a would fail)
        assert s._conn.execute("SELECT x FROM a").fetchall()[0][0] == 1
        s._lock.acquire()
        closer = threading.Thread(target=s.close)
        closer.start()
        closer.join(0.2)
        assert closer.is_alive()  # close waits for a thread holding the lock
        s._lock.release()
        closer.join(5)
    conn = db.connect(path)
    conn.execute("PRAGMA user_version = 3")
    conn.close()
    with pytest.raises(db.CloudboxError, match=r"t\.db: the test store has schema version 3.*up to 2"):
        _Two(path)
