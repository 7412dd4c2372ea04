"""SQLite for cloudbox's databases (the results store, the node registry, the volume registry): one way to open a
connection, one signal-safe transaction path, one migration loop and one small base for a store that keeps one
connection.

The executor turns SIGINT/SIGTERM into an exception raised wherever Python is, BEGIN and COMMIT included; every
transaction here rolls back whatever such a cut left, and first closes a transaction an earlier cut left open, so
the next write never meets "cannot start a transaction within a transaction"."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Self

from .errors import CloudboxError

BUSY_TIMEOUT_MS = 5000  # two writers overlap rarely and briefly; waiting beats failing


def connect(path: Path | str) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit, below), rows by name, busy_timeout set and
    the database in WAL mode (readers never block the writer). Raises sqlite3.DatabaseError; callers name the
    database in their own words."""
    conn = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=False)
    try:
        conn.row_factory = sqlite3.Row
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
        while True:
            # Opening a WAL database another process is writing or checkpointing has answered "database is
            # locked" here without waiting (CI: a thread opening results.db beside a run's writer): wait as
            # busy_timeout would.
            try:
                mode = str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower()
                if mode != "wal":
                    mode = str(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]).lower()
                break
            except sqlite3.OperationalError as e:
                if not _busy(e) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        if mode != "wal":
            raise sqlite3.DatabaseError(f"cannot switch to WAL mode (got {mode})")
    except BaseException:
        conn.close()
        raise
    return conn


def private_files(db_path: Path) -> None:
    """A database file 0600 before SQLite first opens it (its -wal and -shm then get the same mode), and older -wal
    and -shm files made 0600 too: only root reads what it holds. Its directory must exist."""
    fd = os.open(db_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        if os.fstat(fd).st_uid == os.geteuid():  # another's file keeps its mode (and refuses us itself)
            os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    for suffix in ("-wal", "-shm"):
        side = db_path.with_name(db_path.name + suffix)
        if side.exists() and side.stat().st_uid == os.geteuid():
            os.chmod(side, 0o600)


def _busy(e: sqlite3.OperationalError) -> bool:
    return "locked" in str(e) or "busy" in str(e)


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


Migrations = dict[int, Callable[[sqlite3.Connection], None]]


def migrate(conn: sqlite3.Connection, version: int, migrations: Migrations, what: str) -> int:
    """Bring the database to `version`, one step (migrations[n]: n -> n + 1) per transaction; returns the final
    version. Safe when several processes open a fresh file at once: each step re-reads user_version under the write
    lock, so a step another process did is skipped. `what` names the database in the error for a newer file."""
    while True:
        current = int(conn.execute("PRAGMA user_version").fetchone()[0])
        if current == version:
            return current
        if current > version:
            raise CloudboxError(f"{what} has schema version {current}, but this cloudbox only knows up to {version}; "
                                "upgrade cloudbox (or point CLOUDBOX_STATE_DIR elsewhere)")
        with write(conn):
            if int(conn.execute("PRAGMA user_version").fetchone()[0]) == current:
                migrations[current](conn)
                conn.execute(f"PRAGMA user_version = {current + 1}")


class Database:
    """A store with one connection, shared by threads under one lock; a context manager. Subclasses set WHAT (for
    errors), SCHEMA_VERSION and MIGRATIONS, and may prepare the file first (`_prepare`)."""

    WHAT = "database"
    SCHEMA_VERSION = 0
    MIGRATIONS: Migrations = {}

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self._lock = threading.RLock()
        try:
            self._prepare()
            self._conn = connect(self.path)
        except (OSError, sqlite3.DatabaseError) as e:
            raise CloudboxError(f"{self.path}: cannot open the {self.WHAT}: {e}"
                                " (set CLOUDBOX_STATE_DIR to a writable directory)") from e
        try:
            migrate(self._conn, self.SCHEMA_VERSION, self.MIGRATIONS, f"{self.path}: the {self.WHAT}")
        except sqlite3.DatabaseError as e:
            self._conn.close()
            raise CloudboxError(f"{self.path}: cannot open the {self.WHAT}: {e}") from e
        except BaseException:
            self._conn.close()
            raise

    def _prepare(self) -> None:
        """Before the file is opened: its directory exists."""
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction under the lock, safe against a cut by a signal (write())."""
        with self._lock, write(self._conn) as conn:
            yield conn
