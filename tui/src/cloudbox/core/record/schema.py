"""The results database's schema: its tables as schema 1 made them, and the migrations since to SCHEMA_VERSION.

Tables (the version kept in PRAGMA user_version; `migrate()` upgrades older files):
  runs          one benchmark run: profile, suite, size, state, accelerator, emulated flag, provenance
  measurements  one sample of a figure (run, side, test, metric, instance), with the host disk metrics of its window:
                `repeat` its place among the figure's samples in measured order (1..n; a run of today's tests
                measures each once), `boot` the guest boot it was measured in and `iteration` the repeat within
                that boot (a propagation run stores one sample per boot of its copy, boot and total seconds); a run
                of N guests also one per guest or host process (`instance` 1..N) beside the aggregate (NULL);
                `clat_hist` a random test's fio completion-latency histogram on its lat_us row (core.record.latency)
  samples       the host sampler's once-a-second disk metrics
  events        the live stream (state/step/progress/log/sample/measurement) a watcher polls by seq
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

from .. import db
from ..errors import CloudboxError

SCHEMA_VERSION = 6


_SCHEMA_V1 = """
CREATE TABLE runs (
    id            INTEGER PRIMARY KEY,
    uuid          TEXT NOT NULL UNIQUE,
    profile_name  TEXT,
    profile_hash  TEXT,
    profile_toml  TEXT,
    suite         TEXT CHECK (suite IN ('storage', 'network', 'all')),
    size_bytes    INTEGER,
    size_label    TEXT CHECK (size_label IN ('quick', 'study', 'custom')),
    state         TEXT NOT NULL DEFAULT 'running'
                  CHECK (state IN ('running', 'completed', 'aborted', 'failed')),
    reason        TEXT,
    accelerator   TEXT CHECK (accelerator IN ('kvm', 'nested-kvm', 'tcg', 'xen')),
    emulated      INTEGER NOT NULL DEFAULT 0 CHECK (emulated IN (0, 1)),
    node          TEXT,
    pid           INTEGER,
    started_at    REAL,
    finished_at   REAL,
    provenance    TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX runs_state ON runs (state);
CREATE INDEX runs_profile ON runs (profile_name);
CREATE INDEX runs_started ON runs (started_at);

CREATE TABLE measurements (
    id                  INTEGER PRIMARY KEY,
    run_id              INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    side                TEXT NOT NULL CHECK (side IN ('guest', 'baseline')),
    test                TEXT NOT NULL,
    metric              TEXT NOT NULL,
    value               REAL NOT NULL,
    host_mbps           REAL,
    host_avgrq_sectors  REAL,
    host_avgqu          REAL,
    host_util           REAL,
    labels              TEXT NOT NULL DEFAULT '[]',
    raw                 TEXT,
    started_at          REAL,
    finished_at         REAL
);
CREATE INDEX measurements_run ON measurements (run_id, side, test);

CREATE TABLE samples (
    run_id         INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    t              REAL NOT NULL,
    device         TEXT,
    test           TEXT,
    read_mbps      REAL,
    write_mbps     REAL,
    avgrq_sectors  REAL,
    avgrq_kb       REAL,
    avgqu          REAL,
    util           REAL
);
CREATE INDEX samples_run ON samples (run_id, t);

CREATE TABLE events (
    run_id   INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    seq      INTEGER NOT NULL,
    t        REAL NOT NULL,
    kind     TEXT NOT NULL CHECK (kind IN ('state', 'step', 'progress', 'log', 'sample', 'measurement')),
    payload  TEXT NOT NULL DEFAULT '{}',
    PRIMARY KEY (run_id, seq)
);
"""


def _migrate_0_to_1(conn: sqlite3.Connection) -> None:
    _exec_script(conn, _SCHEMA_V1)


def _exec_script(conn: sqlite3.Connection, script: str) -> None:
    """Run a ';'-separated DDL script inside the caller's transaction (executescript would commit)."""
    for stmt in script.split(";"):
        if stmt.strip():
            conn.execute(stmt)


# MIGRATIONS[n] upgrades a database at user_version n to n + 1. Append, never edit, entries.
_SUITE_CHECK_V1 = "CHECK (suite IN ('storage', 'network', 'all'))"
_SUITE_CHECK_V2 = "CHECK (suite IN ('storage', 'network', 'all', 'guest'))"
_SUITE_CHECK_V3 = "CHECK (suite IN ('storage', 'network', 'all', 'guest', 'propagation'))"


def _widen_suite_check(conn: sqlite3.Connection, old: str, new: str, target: int) -> None:
    """Replace runs.suite's CHECK `old` by the wider `new`. A wider CHECK changes nothing on disk, so this is
    SQLite's documented in-place schema edit (writable_schema + schema_version bump), not a table rebuild: a
    rebuild would have to drop `runs`, which cascades to measurements and events."""
    version = int(conn.execute("PRAGMA schema_version").fetchone()[0])
    conn.execute("PRAGMA writable_schema = ON")
    try:
        cur = conn.execute(
            "UPDATE sqlite_master SET sql = replace(sql, ?, ?)"
            " WHERE type = 'table' AND name = 'runs' AND instr(sql, ?)",
            (old, new, old),
        )
        if cur.rowcount != 1:
            raise CloudboxError(f"results database: table runs with {old} not found while upgrading to schema {target}")
        conn.execute(f"PRAGMA schema_version = {version + 1}")
    finally:
        conn.execute("PRAGMA writable_schema = OFF")
    check = conn.execute("PRAGMA integrity_check").fetchone()[0]
    if check != "ok":
        raise CloudboxError(f"results database: integrity check failed after upgrading to schema {target}: {check}")


def _migrate_1_to_2(conn: sqlite3.Connection) -> None:
    """Widen runs.suite's CHECK to allow 'guest' (guest sessions)."""
    _widen_suite_check(conn, _SUITE_CHECK_V1, _SUITE_CHECK_V2, 2)


def _migrate_2_to_3(conn: sqlite3.Connection) -> None:
    """Widen runs.suite's CHECK to allow 'propagation' (study B's image-propagation sweep)."""
    _widen_suite_check(conn, _SUITE_CHECK_V2, _SUITE_CHECK_V3, 3)


def _migrate_3_to_4(conn: sqlite3.Connection) -> None:
    """measurements.instance: which of a run's N guests (or bare-metal processes) a row is; NULL for the run's own."""
    conn.execute("ALTER TABLE measurements ADD COLUMN instance INTEGER CHECK (instance IS NULL OR instance >= 1)")


def _migrate_4_to_5(conn: sqlite3.Connection) -> None:
    """measurements.repeat, boot, iteration: where a sample stands among its figure's repeated samples. A row stored
    before is its figure's only sample (1, 1, 1), but where a run stored one figure several times (a propagation
    run's samples, one guest boot each) its rows are numbered in stored order, the order they were measured in."""
    for col in ("repeat", "boot", "iteration"):
        conn.execute(f"ALTER TABLE measurements ADD COLUMN {col} INTEGER NOT NULL DEFAULT 1 CHECK ({col} >= 1)")
    conn.execute(
        "UPDATE measurements SET repeat = (SELECT COUNT(*) FROM measurements AS o WHERE o.run_id = measurements.run_id"
        " AND o.side = measurements.side AND o.test = measurements.test AND o.metric = measurements.metric"
        " AND o.instance IS measurements.instance AND o.id <= measurements.id)"
        " WHERE EXISTS (SELECT 1 FROM measurements AS o WHERE o.run_id = measurements.run_id"
        " AND o.side = measurements.side AND o.test = measurements.test AND o.metric = measurements.metric"
        " AND o.instance IS measurements.instance AND o.id < measurements.id)")
    conn.execute("UPDATE measurements SET boot = repeat WHERE repeat > 1"
                 " AND run_id IN (SELECT id FROM runs WHERE suite = 'propagation')")
    conn.execute("UPDATE measurements SET iteration = repeat WHERE repeat > 1"
                 " AND run_id NOT IN (SELECT id FROM runs WHERE suite = 'propagation')")


def _migrate_5_to_6(conn: sqlite3.Connection) -> None:
    """measurements.clat_hist: a random test's sample's fio completion-latency histogram (JSON, on its lat_us row);
    NULL on every row stored before, which keeps its mean latency alone."""
    conn.execute("ALTER TABLE measurements ADD COLUMN clat_hist TEXT")


MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {0: _migrate_0_to_1, 1: _migrate_1_to_2,
                                                                2: _migrate_2_to_3, 3: _migrate_3_to_4,
                                                                4: _migrate_4_to_5, 5: _migrate_5_to_6}


def schema_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def migrate(conn: sqlite3.Connection, db_path: Path | str = "results database") -> int:
    """Bring the database to SCHEMA_VERSION, one step per transaction (core.db.migrate); returns the final version."""
    return db.migrate(conn, SCHEMA_VERSION, MIGRATIONS, f"{db_path}: results database")
