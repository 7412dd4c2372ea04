"""The results store: runs, their measurements, host disk samples and the live event stream, in SQLite.

One file (paths.results_db() unless told otherwise) in WAL mode, so one writer process (the run
executor) and any number of reader processes (CLI, TUI, a watcher re-attached to a run) work at once:
readers never block the writer and always see committed rows. Every write is its own short
`BEGIN IMMEDIATE` transaction; busy_timeout (5 s) absorbs the rare overlap of two writers.

Its tables and their migrations are core.record.schema's; the records it reads and writes, core.record.rows'.

A ResultStore object may be shared by the threads of one process (calls are serialised by a lock).
After a fork the child opens its own connection automatically; it never reuses the parent's.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sqlite3
import tempfile
import threading
import time
import uuid as uuid_mod
from collections.abc import Iterator, Sequence
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

from .. import db, paths
from ..errors import CloudboxError, NotFound, masked
from ..procs import how_it_died, process_exists
from . import events, latency
from .events import FINAL_STATES, SAMPLE_FIELDS
from .provenance import Provenance
from .rows import (
    ACCELERATORS,
    EMULATED_ACCELERATORS,
    RUN_COLUMNS,
    SIDES,
    SIZE_LABELS,
    STATES,
    SUITES,
    Event,
    Run,
    Sample,
    check,
    check_position,
    dumps,
    load_measurements,
    loads,
    run_from_row,
)
from .schema import SCHEMA_VERSION, migrate, schema_version

DEAD_EXECUTOR_REASON = "executor killed"  # how a run whose executor is gone ends (core.procs.how_it_died may say more)


# --------------------------------------------------------------------------------------------------
# A run's executor: alive, or gone
# --------------------------------------------------------------------------------------------------


def _proc_stat(pid: int) -> tuple[str, float | None] | None:
    """(state letter, wall-clock start time) of `pid` from /proc (Linux), or None if unreadable."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2 :].split()  # fields[0] is field 3 (state) of proc(5)
        state, start_ticks = fields[0], int(fields[19])  # field 22: start time in clock ticks since boot
    except (OSError, ValueError, IndexError):
        return None
    btime = None
    try:
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith("btime "):
                    btime = int(line.split()[1])
                    break
    except (OSError, ValueError):
        pass
    return state, (None if btime is None else btime + start_ticks / os.sysconf("SC_CLK_TCK"))


# A process that started this long after its run did is a recycled pid. Generous, because wall-clock
# steps and the coarse btime make the computed start time approximate; a false "dead" is worse.
PID_START_SLACK_S = 30.0


def pid_alive(pid: int | None, since: float | None = None) -> bool:
    """True if `pid` looks like a run's executor: the process exists; if `since` (the run's
    started_at) is given it started no later than that (plus slack); and its command line (when
    readable) mentions python or cloudbox. Anything else is a dead executor or a recycled pid."""
    if not process_exists(pid):
        return False
    assert pid is not None
    stat = _proc_stat(pid)
    if stat is not None:
        state, start = stat
        if state in ("Z", "X"):
            return False  # exited, not yet reaped by its parent
        if since is not None and start is not None and start > since + PID_START_SLACK_S:
            return False
    cmdline = _cmdline(pid)
    if cmdline is not None and "python" not in cmdline and "cloudbox" not in cmdline:
        return False  # recycled by an unrelated program: executors are Python (cloudbox) processes
    return True


def _cmdline(pid: int) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return raw.replace(b"\0", b" ").decode(errors="replace") if raw else None


# --------------------------------------------------------------------------------------------------
# The store
# --------------------------------------------------------------------------------------------------


class ResultStore:
    """The results database. Use as a context manager or call close()."""

    def __init__(self, path: Path | str | None = None):
        self.path = Path(path) if path is not None else paths.results_db()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise CloudboxError(
                f"cannot create {self.path.parent} for the results database: {e.strerror or e}"
                " (set CLOUDBOX_STATE_DIR to a writable directory)"
            ) from e
        self._lock = threading.RLock()
        self._conn_obj: sqlite3.Connection | None = None
        self._conn_pid = -1
        self._hostname = socket.gethostname()
        self._connect()

    # -- connection --------------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        try:
            # 0600 from its first byte: runs' reasons, events and provenance are root's alone
            db.private_files(self.path)
            conn = db.connect(self.path)
            conn.execute("PRAGMA foreign_keys = ON")
            conn.execute("PRAGMA synchronous = NORMAL")  # durable enough in WAL; fast for event appends
            migrate(conn, self.path)
        except (OSError, sqlite3.DatabaseError) as e:
            raise CloudboxError(f"{self.path}: cannot open the results database: {e}") from e
        self._conn_obj = conn
        self._conn_pid = os.getpid()
        return conn

    @property
    def _conn(self) -> sqlite3.Connection:
        if self._conn_obj is None:
            raise CloudboxError(f"{self.path}: results store is closed")
        if self._conn_pid != os.getpid():  # forked: never share a connection with the parent
            self._conn_obj = None
            return self._connect()
        return self._conn_obj

    def close(self) -> None:
        with self._lock:
            if self._conn_obj is not None and self._conn_pid == os.getpid():
                self._conn_obj.close()
            self._conn_obj = None

    @classmethod
    @contextmanager
    def reading(cls, path: Path | str) -> Iterator[ResultStore]:
        """A results database opened to be read: one in an older schema, which opening it would upgrade in place, is
        read from an upgraded copy in a temporary directory (removed after), so that reading a file (another
        machine's, an example's, an older cloudbox's) never changes it."""
        path = Path(path)
        tmp: Path | None = None
        try:
            with closing(sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=ro", uri=True)) as ro:
                if schema_version(ro) < SCHEMA_VERSION:
                    tmp = Path(tempfile.mkdtemp(prefix="cloudbox-read-"))
                    with closing(sqlite3.connect(tmp / path.name)) as copy:
                        ro.backup(copy)
        except sqlite3.DatabaseError as e:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            raise CloudboxError(f"{path}: cannot open the results database: {e}") from e
        try:
            with cls(tmp / path.name if tmp is not None else path) as store:
                yield store
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)

    def __enter__(self) -> ResultStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def journal_mode(self) -> str:
        with self._lock:
            return str(self._conn.execute("PRAGMA journal_mode").fetchone()[0]).lower()

    @property
    def schema_version(self) -> int:
        with self._lock:
            return schema_version(self._conn)

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, safe against a cut by a signal (core.db.write)."""
        with self._lock, self._sqlite_errors("write to"), db.write(self._conn) as conn:
            yield conn

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """A read transaction: several SELECTs see one consistent snapshot (core.db.read)."""
        with self._lock, self._sqlite_errors("read"), db.read(self._conn) as conn:
            yield conn

    @contextmanager
    def _sqlite_errors(self, doing: str) -> Iterator[None]:
        """SQLite's operational failures (locked past busy_timeout, disk full, read-only file) as
        CloudboxError with the database named; programming errors pass through unchanged."""
        try:
            yield
        except sqlite3.OperationalError as e:
            raise CloudboxError(f"{self.path}: cannot {doing} the results database: {e}") from e

    # -- errors ------------------------------------------------------------------------------------

    def _not_found(self, conn: sqlite3.Connection, ref: object) -> NotFound:
        ids = [r[0] for r in conn.execute("SELECT id FROM runs ORDER BY id DESC LIMIT 5")]
        if ids:
            hint = "newest runs: " + ", ".join(map(str, ids))
        else:
            hint = "the results database holds no runs yet"
        return NotFound(f"no run {ref} in {self.path}; {hint}")

    def _require(self, conn: sqlite3.Connection, run_id: int) -> sqlite3.Row:
        row = conn.execute("SELECT * FROM runs WHERE id = ?", (int(run_id),)).fetchone()
        if row is None:
            raise self._not_found(conn, run_id)
        return row

    def resolve(self, ref: int | str) -> int:
        """A run id from an id ('12') or a uuid or unique uuid prefix (at least 4 characters)."""
        with self._read() as conn:
            text = str(ref).strip()
            if text.isdigit() and conn.execute("SELECT 1 FROM runs WHERE id = ?", (int(text),)).fetchone():
                return int(text)
            if len(text) >= 4:  # uuids may be stored with or without dashes; a prefix may be all digits
                rows = conn.execute(
                    "SELECT id FROM runs WHERE uuid LIKE ? ESCAPE '\\' LIMIT 2",
                    (text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%",),
                ).fetchall()
                if len(rows) == 1:
                    return int(rows[0][0])
                if len(rows) > 1:
                    raise NotFound(
                        f"run {text!r} is ambiguous in {self.path}: give more of the uuid or the id"
                    )
            raise self._not_found(conn, text if text.isdigit() else repr(text))

    # -- runs --------------------------------------------------------------------------------------

    def _run_values(self, fields: dict[str, Any], current: dict[str, Any] | None = None) -> dict[str, Any]:
        unknown = set(fields) - set(RUN_COLUMNS)
        if unknown:
            raise ValueError(f"unknown run field(s): {', '.join(sorted(unknown))}")
        check("suite", fields.get("suite"), SUITES)
        check("size_label", fields.get("size_label"), SIZE_LABELS)
        check("state", fields.get("state"), STATES)
        check("accelerator", fields.get("accelerator"), ACCELERATORS)
        values = dict(fields)
        if isinstance(values.get("reason"), str):
            values["reason"] = masked(values["reason"])  # a secret this process holds is never stored
        accel = values.get("accelerator", (current or {}).get("accelerator"))
        if "emulated" in values or "accelerator" in values:
            emulated = bool(values.get("emulated", (current or {}).get("emulated", False)))
            values["emulated"] = int(emulated or accel in EMULATED_ACCELERATORS)
        return values

    def create_run(
        self,
        *,
        profile_name: str | None = None,
        profile_hash: str | None = None,
        profile_toml: str | None = None,
        suite: str | None = None,
        size_bytes: int | None = None,
        size_label: str | None = None,
        accelerator: str | None = None,
        emulated: bool = False,
        provenance: Provenance | None = None,
        node: str | None = None,
        pid: int | None = None,
        started_at: float | None = None,
        uuid: str | None = None,
        state: str = "running",
        reason: str | None = None,
        finished_at: float | None = None,
    ) -> int:
        """Insert a run (state 'running' by default); returns its id. Emits no event.

        Defaults: uuid random, node this host, pid this process, started_at now. `emulated` is
        forced on for accelerator 'tcg' and 'nested-kvm'.
        """
        values = self._run_values(
            {
                "uuid": uuid or str(uuid_mod.uuid4()),
                "profile_name": profile_name,
                "profile_hash": profile_hash,
                "profile_toml": profile_toml,
                "suite": suite,
                "size_bytes": size_bytes,
                "size_label": size_label,
                "state": state,
                "reason": reason,
                "accelerator": accelerator,
                "emulated": emulated,
                "node": node or self._hostname,
                "pid": pid if pid is not None else os.getpid(),
                "started_at": started_at if started_at is not None else time.time(),
                "finished_at": finished_at,
            }
        )
        values["provenance"] = dumps((provenance or Provenance()).to_stored())
        cols = ", ".join(values)
        marks = ", ".join("?" for _ in values)
        with self._write() as conn:
            cur = conn.execute(f"INSERT INTO runs ({cols}) VALUES ({marks})", tuple(values.values()))
            return int(cur.lastrowid or 0)

    def update_run(self, run_id: int, **fields: Any) -> None:
        """Set any run columns (see RUN_COLUMNS) but the provenance (set_provenance)."""
        if "provenance" in fields:
            raise ValueError("a run's provenance is set with set_provenance()")
        if not fields:
            return
        with self._write() as conn:
            current = dict(self._require(conn, run_id))
            values = self._run_values(fields, current)
            assignments = ", ".join(f"{k} = ?" for k in values)
            conn.execute(f"UPDATE runs SET {assignments} WHERE id = ?", (*values.values(), int(run_id)))

    def set_provenance(self, run_id: int, provenance: Provenance) -> None:
        """Store the run's provenance record, replacing what it had: the one way provenance is written."""
        with self._write() as conn:
            self._require(conn, run_id)
            conn.execute("UPDATE runs SET provenance = ? WHERE id = ?",
                         (dumps(provenance.to_stored()), int(run_id)))

    def finish_run(self, run_id: int, state: str, reason: str | None = None, *,
                   finished_at: float | None = None) -> None:
        """Set the final state and finished_at (default now) and, in the same transaction, append the final
        'state' event {"state", "reason"} at that time: a watcher that sees the state change also finds the
        event. The executor should not emit its own final 'state' event (it would appear twice)."""
        if state not in FINAL_STATES:
            raise ValueError(f"state must be one of {', '.join(FINAL_STATES)} (got {state!r})")
        reason = None if reason is None else masked(reason)  # the run's secrets stay out of its reason
        with self._write() as conn:
            self._require(conn, run_id)
            now = time.time() if finished_at is None else float(finished_at)
            conn.execute(
                "UPDATE runs SET state = ?, reason = ?, finished_at = ? WHERE id = ?",
                (state, reason, now, int(run_id)),
            )
            self._append_event(conn, int(run_id), "state", {"state": state, "reason": reason}, now)

    def delete_run(self, run_id: int) -> None:
        """Delete a run with its measurements, samples and events."""
        with self._write() as conn:
            self._require(conn, run_id)
            conn.execute("DELETE FROM runs WHERE id = ?", (int(run_id),))

    def get_run(self, run_id: int, *, raw: bool = True) -> Run:
        """The run with all its measurements (raw tool output included unless raw=False)."""
        with self._read() as conn:
            row = self._require(conn, run_id)
            ms = load_measurements(conn, [int(run_id)], raw)[int(run_id)]
            return run_from_row(row, ms)

    def list_runs(
        self,
        state: str | None = None,
        profile: str | None = None,
        limit: int | None = None,
        *,
        raw: bool = False,
    ) -> list[Run]:
        """Runs newest first, with measurements (raw output left out unless raw=True)."""
        check("state", state, STATES)
        where: list[str] = []
        args: list[Any] = []
        if state is not None:
            where.append("state = ?")
            args.append(state)
        if profile is not None:
            where.append("profile_name = ?")
            args.append(profile)
        sql = "SELECT * FROM runs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY started_at DESC, id DESC"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(int(limit))
        with self._read() as conn:
            rows = conn.execute(sql, args).fetchall()
            ms = load_measurements(conn, [r["id"] for r in rows], raw)
            return [run_from_row(r, ms[r["id"]]) for r in rows]

    def run_ids(self) -> list[int]:
        with self._lock:
            return [r[0] for r in self._conn.execute("SELECT id FROM runs ORDER BY id")]

    def executed_elsewhere(self, run: Run) -> str:
        """The host whose process executes `run` when it is not this one ("" when it is this host's): a run on an
        enrolled node is executed (mirrored) by this host when this host is its controller."""
        controller = run.provenance.controller.host if run.provenance.controller else None
        if run.node and run.node != self._hostname and controller != self._hostname:
            return controller or run.node
        return ""

    def executor_alive(self, run: Run) -> bool:
        """Whether `run`'s executor still runs: its recorded pid is that process on this host (pid_alive), or the run
        is executed by another host, whose processes this one cannot see (assumed alive)."""
        if self.executed_elsewhere(run):
            return True
        return pid_alive(run.pid, run.started_at)

    def run_uuids(self) -> set[str]:
        """Every run's uuid in this database (whatever its state)."""
        with self._read() as conn:
            return {r[0] for r in conn.execute("SELECT uuid FROM runs")}

    def active_runs(self) -> list[Run]:
        """Runs in state 'running' whose executor process is alive."""
        return [r for r in self.list_runs(state="running") if self.executor_alive(r)]

    def dead_runs(self) -> list[Run]:
        """Runs still in state 'running' on this host whose executor process is gone."""
        return [r for r in self.list_runs(state="running") if not self.executor_alive(r)]

    def reap_dead_runs(self) -> list[Run]:
        """Mark every run whose executor is gone 'aborted': "executor killed" (by what, where the kernel's log says)
        and when the run was last seen (its last event) in which step; its stored figures stay. Returns them as
        they are now. The first command that notices does it (results list/show, the TUI, the next run, `cloudbox
        guests --destroy-orphans`, `cloudbox reclaim`)."""
        ended = []
        for r in self.dead_runs():
            ended += self._fail_running([r.id], self.dead_executor_reason(r), state="aborted")
        return ended

    def last_seen(self, run_id: int) -> tuple[float | None, str]:
        """When the run last wrote an event (None: never) and the last step it announced ("" when none)."""
        with self._read() as conn:
            t = conn.execute("SELECT MAX(t) FROM events WHERE run_id = ?", (int(run_id),)).fetchone()[0]
            step = conn.execute("SELECT payload FROM events WHERE run_id = ? AND kind = 'step' ORDER BY seq DESC"
                                " LIMIT 1", (int(run_id),)).fetchone()
        text = loads(step[0], {}).get("text", "") if step is not None else ""
        return (float(t) if t is not None else None), str(text or "")

    def dead_executor_reason(self, run: Run) -> str:
        """Why a run whose executor is gone ended: "executor killed" (or what killed it, where known), when it was
        last seen and in which step."""
        t, step = self.last_seen(run.id)
        when = t if t is not None else run.started_at
        how = how_it_died(run.pid) if run.pid else ""
        seen = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when)) if when else "never"
        return (f"{DEAD_EXECUTOR_REASON}{f' ({how})' if how else ''}: executor pid {run.pid or '?'} gone, last seen "
                f"{seen}" + (f" during '{step}'" if step else ""))

    def fail_runs_on_node(self, node: str, reason: str) -> list[Run]:
        """Mark every run still 'running' on `node` whose executor is gone as 'failed' with `reason` (the node
        went down: they cannot finish, and must not stay 'running' forever); returns them as they are now. A run
        whose executor on this host is alive is left to it: it follows the node over its own SSH stream, which
        drops after 2 minutes of silence, and then ends the run itself; so a busy node that misses one health
        check (a TCG back-end running a guest) does not lose the run it is measuring."""
        with self._read() as conn:
            rows = conn.execute("SELECT id, pid, started_at FROM runs WHERE state = 'running' AND node = ?",
                                (node,)).fetchall()
        return self._fail_running([int(r["id"]) for r in rows if not pid_alive(r["pid"], r["started_at"])], reason)

    def _fail_running(self, run_ids: list[int], reason: str, state: str = "failed") -> list[Run]:
        """Each run of `run_ids` still 'running' becomes `state` with `reason` and its final state event, in one
        transaction per run (a run that ended meanwhile is left as it is); returns them as they are now."""
        failed = []
        reason = masked(reason)
        for run_id in run_ids:
            with self._write() as conn:
                row = conn.execute("SELECT state FROM runs WHERE id = ?", (run_id,)).fetchone()
                if row is None or row["state"] != "running":
                    continue
                now = time.time()
                conn.execute("UPDATE runs SET state = ?, reason = ?, finished_at = ? WHERE id = ?",
                             (state, reason, now, run_id))
                self._append_event(conn, run_id, "state", {"state": state, "reason": reason}, now)
            failed.append(self.get_run(run_id, raw=False))
        return failed

    # -- measurements and samples ------------------------------------------------------------------

    def add_measurement(
        self,
        run_id: int,
        *,
        side: str,
        test: str,
        metric: str,
        value: float,
        host_mbps: float | None = None,
        host_avgrq_sectors: float | None = None,
        host_avgqu: float | None = None,
        host_util: float | None = None,
        labels: Sequence[str] = (),
        raw: str | dict[str, Any] | list[Any] | None = None,
        started_at: float | None = None,
        finished_at: float | None = None,
        instance: int | None = None,
        repeat: int | None = None,
        boot: int | None = None,
        iteration: int | None = None,
        clat_hist: latency.Histogram | dict[str, Any] | str | None = None,
    ) -> int:
        """Store one sample of a figure; returns its id. A dict/list `raw` is stored as JSON. The label
        'emulated' is added to guest-side rows when the run is emulated. `instance`: 1..N for one of a run's N
        guests (or bare-metal processes), None for the run's figure. `repeat`: the sample's place among the
        figure's in measured order (by default the next; a place already taken is refused), `boot` the guest boot
        it was measured in (default 1), `iteration` the repeat within that boot (default the next in it).
        `clat_hist`: a random test's sample's fio completion-latency histogram (a latency.Histogram or its stored
        form), on its lat_us row."""
        if side not in SIDES:
            raise ValueError(f"side must be one of {', '.join(SIDES)} (got {side!r})")
        if instance is not None and (isinstance(instance, bool) or not isinstance(instance, int) or instance < 1):
            raise ValueError(f"instance must be None or a guest number from 1 (got {instance!r})")
        for name, pos in (("repeat", repeat), ("boot", boot), ("iteration", iteration)):
            if pos is not None:
                check_position(name, pos)
        lab = list(dict.fromkeys(labels))
        hist = latency.stored_text(clat_hist)
        if raw is not None and not isinstance(raw, str):
            raw = json.dumps(raw)
        with self._write() as conn:
            run = self._require(conn, run_id)
            # Only the guest side ran under emulation: a bare-metal baseline is never emulated.
            if run["emulated"] and side == "guest" and "emulated" not in lab:
                lab.append("emulated")
            taken = {int(r[0]): int(r[1]) for r in conn.execute(  # repeat -> boot of the figure's samples so far
                "SELECT repeat, boot FROM measurements WHERE run_id = ? AND side = ? AND test = ? AND metric = ?"
                " AND instance IS ?", (int(run_id), side, test, metric, instance))}
            if repeat is None:
                repeat = max(taken, default=0) + 1
            elif repeat in taken:
                raise ValueError(f"run {run_id} already has repeat {repeat} of {side} {test} {metric}"
                                 + (f" instance {instance}" if instance is not None else ""))
            boot = boot or 1
            if iteration is None:
                iteration = 1 + sum(1 for b in taken.values() if b == boot)
            cur = conn.execute(
                "INSERT INTO measurements (run_id, side, test, metric, value, host_mbps, host_avgrq_sectors,"
                " host_avgqu, host_util, labels, raw, started_at, finished_at, instance, repeat, boot, iteration,"
                " clat_hist) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (int(run_id), side, test, metric, float(value), host_mbps, host_avgrq_sectors, host_avgqu,
                 host_util, json.dumps(lab), raw, started_at, finished_at, instance, repeat, boot, iteration, hist),
            )
            return int(cur.lastrowid or 0)

    def add_samples(self, run_id: int, rows: Sequence[dict[str, Any]], *, event: bool = False) -> None:
        """Store sampler rows (keys from SAMPLE_FIELDS; 't' required). avgrq_kb and avgrq_sectors
        are derived from each other when only one is given (1 sector = 512 bytes). With event=True each
        row is also appended to the live stream as a `sample` event, in the same transaction."""
        prepared = []
        for row in rows:
            unknown = set(row) - set(SAMPLE_FIELDS)
            if unknown:
                raise ValueError(f"unknown sample field(s): {', '.join(sorted(unknown))}")
            if row.get("t") is None:
                raise ValueError("every sample needs a time 't'")
            r = dict(row)
            if r.get("avgrq_kb") is None and r.get("avgrq_sectors") is not None:
                r["avgrq_kb"] = r["avgrq_sectors"] / 2.0
            if r.get("avgrq_sectors") is None and r.get("avgrq_kb") is not None:
                r["avgrq_sectors"] = r["avgrq_kb"] * 2.0
            prepared.append((int(run_id), *(r.get(k) for k in SAMPLE_FIELDS)))
        if not prepared:
            return
        with self._write() as conn:
            self._require(conn, run_id)
            conn.executemany(
                f"INSERT INTO samples (run_id, {', '.join(SAMPLE_FIELDS)}) VALUES (?, {', '.join('?' * 9)})",
                prepared,
            )
            if event:
                for values in prepared:
                    self._append_event(conn, int(run_id), "sample",
                                       dict(zip(SAMPLE_FIELDS, values[1:], strict=True)))

    def samples(
        self, run_id: int, *, test: str | None = None, device: str | None = None, since: float | None = None
    ) -> list[Sample]:
        """Sampler rows of a run in time order, optionally for one test/device or after time `since`."""
        sql = "SELECT * FROM samples WHERE run_id = ?"
        args: list[Any] = [int(run_id)]
        for col, val, op in (("test", test, "="), ("device", device, "="), ("t", since, ">")):
            if val is not None:
                sql += f" AND {col} {op} ?"
                args.append(val)
        with self._read() as conn:
            self._require(conn, run_id)
            return [Sample(**dict(r)) for r in conn.execute(sql + " ORDER BY t", args)]

    # -- events ------------------------------------------------------------------------------------

    @staticmethod
    def _append_event(
        conn: sqlite3.Connection, run_id: int, kind: str, payload: dict[str, Any], t: float | None = None
    ) -> int:
        seq = conn.execute(
            "SELECT COALESCE(MAX(seq), 0) + 1 FROM events WHERE run_id = ?", (run_id,)
        ).fetchone()[0]
        conn.execute(
            "INSERT INTO events (run_id, seq, t, kind, payload) VALUES (?, ?, ?, ?, ?)",
            # every event's text passes here: a secret this process holds is masked in whatever field it reached
            (run_id, seq, time.time() if t is None else t, kind, masked(dumps(payload))),
        )
        return int(seq)

    def add_event(self, run_id: int, kind: str, payload: dict[str, Any] | None = None, *,
                  t: float | None = None) -> int:
        """Append to the run's live stream at time `t` (default now); returns the new seq (1, 2, ...).
        Touches nothing else."""
        if kind not in events.KINDS:
            raise ValueError(f"event kind must be one of {', '.join(events.KINDS)} (got {kind!r})")
        with self._write() as conn:
            try:
                return self._append_event(conn, int(run_id), kind, payload or {}, t)
            except sqlite3.IntegrityError as e:  # foreign key: unknown run
                raise self._not_found(conn, run_id) from e

    def events_since(self, run_id: int, after_seq: int = 0, limit: int = 1000) -> list[Event]:
        """Events with seq > after_seq in order, at most `limit`. Poll with the last seq seen.
        Unknown runs give an empty list (a watcher may race a delete); use get_run to check."""
        with self._lock, self._sqlite_errors("read"):
            rows = self._conn.execute(
                "SELECT run_id, seq, t, kind, payload FROM events WHERE run_id = ? AND seq > ?"
                " ORDER BY seq LIMIT ?",
                (int(run_id), int(after_seq), int(limit)),
            ).fetchall()
        return [Event(r["run_id"], r["seq"], r["t"], r["kind"], loads(r["payload"], {})) for r in rows]

    def follow(self, run_id: int, after_seq: int = 0, *, poll: float = 0.5) -> Iterator[Event]:
        """Every event after `after_seq` as it is appended, until the run has ended and its last event is out (a
        run whose executor died is reaped on the way, so this ends). What `cloudbox watch` and a node's
        `node local follow` stream; the caller reads the final state with get_run."""
        seq = after_seq
        while True:
            for ev in self.events_since(run_id, seq):
                seq = ev.seq
                yield ev
            if self.get_run(run_id, raw=False).state != "running":
                for ev in self.events_since(run_id, seq):  # the final state event, appended with the state
                    seq = ev.seq
                    yield ev
                return
            if not self.active_runs() and self.reap_dead_runs():
                continue
            time.sleep(poll)

    def last_seq(self, run_id: int) -> int:
        with self._lock:
            return int(
                self._conn.execute(
                    "SELECT COALESCE(MAX(seq), 0) FROM events WHERE run_id = ?", (int(run_id),)
                ).fetchone()[0]
            )
