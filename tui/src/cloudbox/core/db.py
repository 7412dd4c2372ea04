"""SQLite for cloudbox's databases (the results store, the node registry): one way to open a connection and one
signal-safe transaction path.

The executor turns SIGINT/SIGTERM into an exception raised wherever Python is, BEGIN and COMMIT included; every
transaction here rolls back whatever such a cut left, and first closes a transaction an earlier cut left open, so
the next write never meets "cannot start a transaction within a transaction"."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

BUSY_TIMEOUT_MS = 5000  # two writers overlap rarely and briefly; waiting beats failing


def connect(path: Path | str) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit, below), rows by name, busy_timeout set and
    the database in WAL mode (readers never block the writer). Raises sqlite3.DatabaseError; callers name the
    database in their own words."""
    conn = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=False)
    try:
        conn.row_factory = sqlite3.Row
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        mode = str(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]).lower()
        if mode != "wal":
            raise sqlite3.DatabaseError(f"cannot switch to WAL mode (got {mode})")
    except BaseException:
        conn.close()
        raise
    return conn


@contextmanager
def write(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One write transaction (BEGIN IMMEDIATE: takes the write lock up front, waits busy_timeout), committed at
    the end, rolled back on any exception. The caller holds its own lock for threads."""
    try:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        conn.execute("BEGIN IMMEDIATE")
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


@contextmanager
def read(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """A read transaction: several SELECTs see one consistent snapshot."""
    try:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        conn.execute("BEGIN")
        yield conn
    finally:
        if conn.in_transaction:
            conn.execute("COMMIT")
