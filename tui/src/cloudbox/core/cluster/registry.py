"""The front-end's node registry and join codes, in SQLite (<state dir>/nodes.db, WAL, like results.db).

Tables (schema version SCHEMA_VERSION in PRAGMA user_version; MIGRATIONS upgrade older files):
  meta            key/value: the cluster salt (random, made with the file) that keys the join-code KDF
  nodes           one enrolled node: name, role, address, SSH port, pinned host key, its client key, libvirt URI,
                  enrolled_at, last_seen (last good check), checked_at, state up/down/unknown and the reason
  join_codes      one join code: only its derived key (scrypt of the code), created/expires/used/revoked
  enrol_failures  refused enrolments (peer, name, reason), which is what the rate limit counts; kept a day and
                  at most MAX_FAILURE_ROWS rows
  propagations    every copy of the guest image to a node: bytes, seconds, MB/s, or "cached" (v2)

The file and its -wal/-shm are 0600 from their first byte: nodes.db is created 0600 before SQLite opens it,
and SQLite gives the WAL and shared-memory files the database's own mode.

A join code is 16 Crockford base32 characters (80 bits), shown as XXXX-XXXX-XXXX-XXXX. The code itself is
never stored: only scrypt(code, cluster salt), which is both what proves a code and the HMAC key the enrolment
protocol uses (enrol.py). Used, expired and revoked codes are kept for a day so that a reused or late code is
refused with that reason rather than as "wrong".

The registry also renders the files OpenSSH reads for every connection to a node (libvirt's SSH transport and
host-side commands alike): <state dir>/nodes/known_hosts (the pinned host keys, nothing else),
<state dir>/nodes/ssh_config, and the `ssh` wrapper that libvirt URIs name as their `command`.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shlex
import sqlite3
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import db, paths
from ..errors import CloudboxError, NotFound
from . import keys
from .protocol import ENROL_ROLES

SCHEMA_VERSION = 3
NODE_STATES = ("up", "down", "unknown")

CODE_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"  # Crockford base32: no I, L, O, U
CODE_CHARS = 16  # 80 bits
CODE_ALLOWED = "16 characters of 0-9 and A-Z without I, L, O, U (e.g. 7K3M-Q9XD-2PWN-HT4R; '-' and case ignored)"
DEFAULT_CODE_MINUTES = 15
MAX_CODE_MINUTES = 24 * 60
KEEP_SPENT_CODES_S = 24 * 3600
# scrypt cost: ~50 ms and 16 MiB per guess; with 80-bit codes an offline guesser has no chance either way.
KDF_N, KDF_R, KDF_P = 2**14, 8, 1

# Rate limits on refused enrolments (wrong, reused, expired or revoked code, or a malformed message).
PEER_FAILURE_LIMIT = 5  # from one address within PEER_FAILURE_WINDOW_S: that address is refused until it ages out
PEER_FAILURE_WINDOW_S = 600
# In all, while codes are open: logged as a warning (someone is guessing), never a revocation, so a few addresses
# cannot shut enrolment down; guessing an 80-bit code online is hopeless at any rate a server can answer.
TOTAL_FAILURE_LIMIT = 20
KEEP_FAILURES_S = 24 * 3600
MAX_FAILURE_ROWS = 1000

_SCHEMA_V1 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE nodes (
    name         TEXT PRIMARY KEY,
    role         TEXT NOT NULL CHECK (role IN ('back-end')),
    address      TEXT NOT NULL,
    ssh_port     INTEGER NOT NULL DEFAULT 22,
    host_key     TEXT NOT NULL UNIQUE,
    client_key   TEXT,
    libvirt_uri  TEXT NOT NULL,
    enrolled_at  REAL NOT NULL,
    last_seen    REAL,
    checked_at   REAL,
    state        TEXT NOT NULL DEFAULT 'unknown' CHECK (state IN ('up', 'down', 'unknown')),
    reason       TEXT,
    detail       TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE join_codes (
    id              INTEGER PRIMARY KEY,
    key             BLOB NOT NULL UNIQUE,
    created_at      REAL NOT NULL,
    expires_at      REAL NOT NULL,
    used_at         REAL,
    used_by         TEXT,
    revoked_at      REAL,
    revoked_reason  TEXT
);
CREATE TABLE enrol_failures (
    t       REAL NOT NULL,
    peer    TEXT NOT NULL,
    name    TEXT,
    reason  TEXT NOT NULL,
    counts  INTEGER NOT NULL DEFAULT 1 CHECK (counts IN (0, 1))
);
CREATE INDEX enrol_failures_peer ON enrol_failures (peer, t);
"""


def _migrate_0_to_1(conn: sqlite3.Connection) -> None:
    for stmt in _SCHEMA_V1.split(";"):
        if stmt.strip():
            conn.execute(stmt)
    conn.execute("INSERT INTO meta (key, value) VALUES ('salt', ?)", (secrets.token_hex(16),))


def _migrate_1_to_2(conn: sqlite3.Connection) -> None:
    conn.execute("""CREATE TABLE propagations (
        id              INTEGER PRIMARY KEY,
        node            TEXT NOT NULL,
        image_id        TEXT NOT NULL,
        bytes           INTEGER NOT NULL,
        seconds         REAL NOT NULL,
        verify_seconds  REAL NOT NULL,
        mbps            REAL NOT NULL,
        cached          INTEGER NOT NULL CHECK (cached IN (0, 1)),
        remote_dir      TEXT NOT NULL,
        at              REAL NOT NULL
    )""")
    conn.execute("CREATE INDEX propagations_node ON propagations (node, at)")


def _migrate_2_to_3(conn: sqlite3.Connection) -> None:
    # A code made with --replace NAME may re-enrol that node without proof of its host key (the admin's say-so).
    conn.execute("ALTER TABLE join_codes ADD COLUMN replaces TEXT")


# MIGRATIONS[n] upgrades user_version n to n + 1. Append, never edit, entries.
MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {0: _migrate_0_to_1, 1: _migrate_1_to_2,
                                                               2: _migrate_2_to_3}


def nodes_db() -> Path:
    return paths.state_dir() / "nodes.db"


# --------------------------------------------------------------------------------------------------
# Join codes
# --------------------------------------------------------------------------------------------------


class CodeFormatError(CloudboxError):
    """A typed join code is not in the code's format (nothing was sent)."""


def new_code() -> str:
    raw = "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_CHARS))
    return "-".join(raw[i:i + 4] for i in range(0, CODE_CHARS, 4))


def normalize_code(code: str) -> str:
    """The code as the KDF sees it: upper case, without '-' and spaces; O -> 0 and I, L -> 1 (Crockford)."""
    s = "".join(code.split()).replace("-", "").upper().translate(str.maketrans("OIL", "011"))
    bad = sorted({c for c in s if c not in CODE_ALPHABET})
    if len(s) != CODE_CHARS or bad:
        why = f"characters {''.join(bad)!r} are not allowed" if bad else f"{len(s)} characters, not {CODE_CHARS}"
        raise CodeFormatError(f"--code: not a join code ({why}); allowed: {CODE_ALLOWED}")
    return s


def derive_key(code: str, salt: str) -> bytes:
    """scrypt(code, cluster salt): what the registry stores and what keys the enrolment HMACs."""
    return hashlib.scrypt(b"cloudbox-join-v1:" + normalize_code(code).encode(), salt=bytes.fromhex(salt),
                          n=KDF_N, r=KDF_R, p=KDF_P, dklen=32)


@dataclass
class JoinCode:
    id: int
    key: bytes
    created_at: float
    expires_at: float
    used_at: float | None
    used_by: str | None
    revoked_at: float | None
    revoked_reason: str | None
    replaces: str | None = None  # a node this code may re-enrol without proof of its host key

    def status(self, now: float | None = None) -> str:
        now = time.time() if now is None else now
        if self.used_at is not None:
            return "used"
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at <= now:
            return "expired"
        return "open"

    def as_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in ("id", "created_at", "expires_at", "used_at", "used_by", "revoked_at",
                                              "revoked_reason", "replaces")}
        d["status"] = self.status()
        return d


# --------------------------------------------------------------------------------------------------
# Nodes
# --------------------------------------------------------------------------------------------------


@dataclass
class NodeRecord:
    name: str
    role: str
    address: str
    ssh_port: int
    host_key: str
    client_key: str | None
    libvirt_uri: str
    enrolled_at: float
    last_seen: float | None
    checked_at: float | None
    state: str
    reason: str | None
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def host_key_fingerprint(self) -> str:
        return keys.fingerprint(self.host_key)

    def as_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in ("name", "role", "address", "ssh_port", "host_key", "client_key",
                                              "libvirt_uri", "enrolled_at", "last_seen", "checked_at", "state",
                                              "reason", "detail")}
        d["host_key_fingerprint"] = self.host_key_fingerprint
        return d


class NodeConflict(CloudboxError):
    """A node name or host key is already enrolled with other keys / under another name."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


class Registry(db.Database):
    """The node registry. One connection per instance (shared by threads under a lock); use as a context
    manager or call close()."""

    WHAT = "node registry"
    SCHEMA_VERSION = SCHEMA_VERSION
    MIGRATIONS = MIGRATIONS

    def __init__(self, path: Path | str | None = None):
        path = Path(path) if path is not None else nodes_db()
        self.dir = path.parent / "nodes"
        super().__init__(path)

    def _prepare(self) -> None:
        # nodes.db's directory 0700 when made here; a state directory others could write to loses those bits (it
        # stays traversable: QEMU reaches the work directory below it)
        parent = self.path.parent
        if not parent.exists():
            parent.mkdir(parents=True, mode=0o700)
        else:
            st = parent.stat()
            if st.st_uid == os.geteuid() and st.st_mode & 0o022:
                os.chmod(parent, st.st_mode & 0o7755)
        db.private_files(self.path)

    @property
    def salt(self) -> str:
        with self._lock:
            return str(self._conn.execute("SELECT value FROM meta WHERE key = 'salt'").fetchone()[0])

    # -- join codes ---------------------------------------------------------------------------------

    def make_code(self, minutes: float = DEFAULT_CODE_MINUTES, *, replaces: str | None = None) -> tuple[str, JoinCode]:
        """A new one-time code, valid `minutes`; returns (the code, its record). The code is shown once. With
        `replaces`, the code may also re-enrol that (enrolled) node without proof of its host key: a reinstalled
        node with a new key, or one that cannot sign with its key."""
        if not (0 < minutes <= MAX_CODE_MINUTES):
            raise CloudboxError(f"--minutes: {minutes:g} is out of range; allowed: more than 0, "
                                f"at most {MAX_CODE_MINUTES} (a day)")
        if replaces is not None:
            self.node(replaces)  # NotFound names the enrolled nodes
        code = new_code()
        now = time.time()
        key = derive_key(code, self.salt)
        with self._write() as conn:
            conn.execute("DELETE FROM join_codes WHERE coalesce(used_at, revoked_at, expires_at) < ?",
                         (now - KEEP_SPENT_CODES_S,))
            cur = conn.execute("INSERT INTO join_codes (key, created_at, expires_at, replaces) VALUES (?, ?, ?, ?)",
                               (key, now, now + minutes * 60, replaces))
            code_id = int(cur.lastrowid or 0)
        return code, self.code(code_id)

    @staticmethod
    def _code_row(r: sqlite3.Row) -> JoinCode:
        return JoinCode(**{k: r[k] for k in r.keys()})

    def code(self, code_id: int) -> JoinCode:
        with self._lock:
            r = self._conn.execute("SELECT * FROM join_codes WHERE id = ?", (int(code_id),)).fetchone()
        if r is None:
            raise NotFound(f"join code {code_id}: no such code (see `cloudbox node code --list`)")
        return self._code_row(r)

    def codes(self) -> list[JoinCode]:
        """Every kept code, newest first."""
        with self._lock:
            return [self._code_row(r) for r in self._conn.execute("SELECT * FROM join_codes ORDER BY id DESC")]

    def open_codes(self) -> list[JoinCode]:
        now = time.time()
        return [c for c in self.codes() if c.status(now) == "open"]

    def revoke(self, code_id: int | None = None, reason: str = "revoked by the administrator") -> list[int]:
        """Revoke one open code, or every open code when code_id is None; returns the ids revoked."""
        now = time.time()
        with self._write() as conn:
            sql = "SELECT id FROM join_codes WHERE used_at IS NULL AND revoked_at IS NULL AND expires_at > ?"
            args: list[Any] = [now]
            if code_id is not None:
                if conn.execute("SELECT 1 FROM join_codes WHERE id = ?", (int(code_id),)).fetchone() is None:
                    raise NotFound(f"--revoke: no join code {code_id} (see `cloudbox node code --list`)")
                sql += " AND id = ?"
                args.append(int(code_id))
            ids = [int(r[0]) for r in conn.execute(sql, args)]
            for i in ids:
                conn.execute("UPDATE join_codes SET revoked_at = ?, revoked_reason = ? WHERE id = ?", (now, reason, i))
        return ids

    # -- refusals and the rate limit ------------------------------------------------------------------

    def record_failure(self, peer: str, name: str | None, reason: str, *, counts: bool = True) -> None:
        """Record a refusal, pruning rows older than KEEP_FAILURES_S and beyond the newest MAX_FAILURE_ROWS."""
        now = time.time()
        with self._write() as conn:
            conn.execute("INSERT INTO enrol_failures (t, peer, name, reason, counts) VALUES (?, ?, ?, ?, ?)",
                         (now, peer, name, reason, int(counts)))
            conn.execute("DELETE FROM enrol_failures WHERE t < ? OR rowid <= (SELECT max(rowid) FROM enrol_failures)"
                         " - ?", (now - KEEP_FAILURES_S, MAX_FAILURE_ROWS))

    def peer_failures(self, peer: str, window: float = PEER_FAILURE_WINDOW_S) -> list[float]:
        with self._lock:
            return [float(r[0]) for r in self._conn.execute(
                "SELECT t FROM enrol_failures WHERE peer = ? AND counts = 1 AND t > ? ORDER BY t",
                (peer, time.time() - window))]

    def failures_since(self, t: float) -> int:
        with self._lock:
            return int(self._conn.execute("SELECT count(*) FROM enrol_failures WHERE counts = 1 AND t >= ?",
                                          (t,)).fetchone()[0])

    def failures(self, limit: int = 50) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(r) for r in self._conn.execute(
                "SELECT t, peer, name, reason FROM enrol_failures ORDER BY t DESC LIMIT ?", (limit,))]

    # -- nodes ----------------------------------------------------------------------------------------

    @staticmethod
    def _node_row(r: sqlite3.Row) -> NodeRecord:
        d = dict(r)
        d["detail"] = json.loads(d["detail"] or "{}")
        return NodeRecord(**d)

    def nodes(self) -> list[NodeRecord]:
        with self._lock:
            return [self._node_row(r) for r in self._conn.execute("SELECT * FROM nodes ORDER BY name")]

    def node(self, name: str) -> NodeRecord:
        with self._lock:
            r = self._conn.execute("SELECT * FROM nodes WHERE name = ?", (name,)).fetchone()
        if r is None:
            known = ", ".join(n.name for n in self.nodes()) or "none enrolled"
            raise NotFound(f"node {name!r}: not enrolled (known: {known})")
        return self._node_row(r)

    def conflict(self, name: str, host_key: str, *, proven: bool = True,
                 replaces: str | None = None) -> NodeConflict | None:
        """Why enrolling `name` with `host_key` must be refused, or None. Re-enrolling a node with the same host
        key is allowed when the back-end proved it holds that key (`proven`: a re-run join); another key under a
        known name, or a known key under another name, is not. A code made to replace `name` allows both."""
        with self._lock:
            by_name = self._conn.execute("SELECT host_key FROM nodes WHERE name = ?", (name,)).fetchone()
            by_key = self._conn.execute("SELECT name FROM nodes WHERE host_key = ?", (host_key,)).fetchone()
        replacing = replaces is not None and replaces == name
        if by_name is not None and by_name[0] == host_key and not proven and not replacing:
            return NodeConflict(
                "key-unproven",
                f"node {name!r} is already enrolled with this host key, and the back-end did not prove it holds "
                f"the key (it could not sign with it); to enrol it again all the same, make the code with "
                f"`cloudbox node code --replace {name}` on the front-end")
        if by_name is not None and by_name[0] != host_key and not replacing:
            return NodeConflict(
                "name-taken",
                f"node {name!r} is already enrolled with a different SSH host key "
                f"({keys.fingerprint(by_name[0])}, offered {keys.fingerprint(host_key)}); if the node was "
                f"reinstalled, make its code with `cloudbox node code --replace {name}`, or remove it on the "
                f"front-end first: cloudbox node remove {name}")
        if by_key is not None and by_key[0] != name:
            return NodeConflict(
                "key-taken",
                f"SSH host key {keys.fingerprint(host_key)} is already enrolled as node {by_key[0]!r}; one "
                f"machine enrols under one name (remove {by_key[0]!r} first to rename it)")
        return None

    def enrol(self, *, name: str, role: str, address: str, ssh_port: int, host_key: str, client_key: str,
              code_key: bytes, peer: str, proven: bool = False) -> NodeRecord:
        """In one transaction: consume the (still open) code and record the node. Raises NodeConflict or
        CloudboxError('code no longer open') without changing anything. `proven`: the back-end signed the
        enrolment with its host key (required to re-enrol a known name, unless the code replaces it)."""
        if role not in ENROL_ROLES:
            raise CloudboxError(f"role: {role!r} cannot enrol; allowed: {', '.join(ENROL_ROLES)}")
        now = time.time()
        with self._write() as conn:
            row = conn.execute("SELECT * FROM join_codes WHERE key = ?", (code_key,)).fetchone()
            if row is None or self._code_row(row).status(now) != "open":
                raise CloudboxError("the join code stopped being open while this node enrolled")
            problem = self.conflict(name, host_key, proven=proven, replaces=row["replaces"])
            if problem is not None:
                raise problem
            conn.execute("UPDATE join_codes SET used_at = ?, used_by = ? WHERE id = ?",
                         (now, f"{name} ({peer})", row["id"]))
            uri = self.libvirt_uri(address, ssh_port)
            conn.execute(
                "INSERT INTO nodes (name, role, address, ssh_port, host_key, client_key, libvirt_uri, enrolled_at,"
                " state, reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'unknown', 'enrolled; not checked yet')"
                " ON CONFLICT (name) DO UPDATE SET address = excluded.address, ssh_port = excluded.ssh_port,"
                " host_key = excluded.host_key,"
                " client_key = excluded.client_key, libvirt_uri = excluded.libvirt_uri,"
                " enrolled_at = excluded.enrolled_at, state = 'unknown', reason = excluded.reason",
                (name, role, address, int(ssh_port), host_key, client_key, uri, now))
        self.write_ssh_files()
        return self.node(name)

    def set_reason(self, name: str, reason: str) -> None:
        with self._write() as conn:
            conn.execute("UPDATE nodes SET reason = ? WHERE name = ?", (reason, name))

    def set_health(self, name: str, state: str, reason: str | None, detail: dict[str, Any] | None = None) -> None:
        if state not in NODE_STATES:
            raise ValueError(f"state must be one of {', '.join(NODE_STATES)} (got {state!r})")
        now = time.time()
        with self._write() as conn:
            conn.execute(
                "UPDATE nodes SET state = ?, reason = ?, checked_at = ?,"
                " last_seen = CASE WHEN ? = 'up' THEN ? ELSE last_seen END,"
                " detail = CASE WHEN ? IS NULL THEN detail ELSE ? END WHERE name = ?",
                (state, reason, now, state, now, None if detail is None else 1, json.dumps(detail or {}), name))

    def remove(self, name: str) -> NodeRecord:
        node = self.node(name)
        with self._write() as conn:
            conn.execute("DELETE FROM nodes WHERE name = ?", (name,))
        self.write_ssh_files()
        return node

    # -- guest image propagation ---------------------------------------------------------------------

    def add_propagation(self, p: dict[str, Any]) -> None:
        """Record one propagation (provenance.Propagation as a dict)."""
        cols = ("node", "image_id", "bytes", "seconds", "verify_seconds", "mbps", "cached", "remote_dir", "at")
        with self._write() as conn:
            conn.execute(f"INSERT INTO propagations ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                         tuple(int(p[c]) if c == "cached" else p[c] for c in cols))

    def propagations(self, node: str | None = None, *, copies_only: bool = False,
                     limit: int = 50) -> list[dict[str, Any]]:
        """Recorded propagations, newest first (copies_only: not the 'already there' checks)."""
        sql, args = "SELECT * FROM propagations WHERE 1 = 1", []
        if node is not None:
            sql += " AND node = ?"
            args.append(node)
        if copies_only:
            sql += " AND cached = 0"
        with self._lock:
            rows = self._conn.execute(sql + " ORDER BY at DESC LIMIT ?", (*args, limit)).fetchall()
        return [dict(r, cached=bool(r["cached"])) for r in rows]

    # -- what OpenSSH and libvirt read ---------------------------------------------------------------

    @property
    def known_hosts(self) -> Path:
        return self.dir / "known_hosts"

    @property
    def ssh_config(self) -> Path:
        return self.dir / "ssh_config"

    @property
    def ssh_wrapper(self) -> Path:
        return self.dir / "ssh"

    @property
    def client_key(self) -> Path:
        return self.dir / "id_ed25519"

    def libvirt_uri(self, address: str, port: int) -> str:
        """qemu+ssh://root@ADDR[:PORT]/system through the wrapper that pins host keys. libvirt's `ssh` transport
        has no known_hosts parameter (only libssh/libssh2 do), so the pinning lives in the ssh_config the
        wrapper passes with -F; keyfile names the management key, no_verify=0 keeps strict checking and
        no_tty=1 makes a missing key fail instead of prompting."""
        host = f"[{address}]" if ":" in address else address
        if port != 22:
            host += f":{port}"
        q = urllib.parse.urlencode({"command": str(self.ssh_wrapper), "keyfile": str(self.client_key),
                                    "no_verify": "0", "no_tty": "1"}, safe="/")
        return f"qemu+ssh://root@{host}/system?{q}"

    def ssh_args(self, node: NodeRecord) -> list[str]:
        """`ssh` arguments (before the remote command) that reach `node` as root with the pinned host key."""
        return [str(self.ssh_wrapper), "-p", str(node.ssh_port), "-l", "root", "--", node.address]

    def write_ssh_files(self) -> None:
        """Re-render known_hosts from the registry (the only source of pins) and the ssh_config + wrapper."""
        lines = ["# cloudbox: the enrolled nodes' pinned SSH host keys (rewritten from nodes.db; do not edit)"]
        for n in self.nodes():
            lines.append(keys.known_hosts_entry(n.address, n.ssh_port, keys.parse_public_key(n.host_key)))
        keys.write_file(self.known_hosts, "\n".join(lines) + "\n", 0o644)
        q = shlex.quote
        config = "\n".join([
            "# cloudbox: how the front-end reaches enrolled nodes (rewritten by cloudbox; do not edit)",
            "Host *",
            "    User root",
            f"    IdentityFile {q(str(self.client_key))}",
            "    IdentitiesOnly yes",
            f"    UserKnownHostsFile {q(str(self.known_hosts))}",
            "    GlobalKnownHostsFile /dev/null",
            "    StrictHostKeyChecking yes",
            "    UpdateHostKeys no",
            "    CheckHostIP no",
            "    BatchMode yes",
            "    PasswordAuthentication no",
            "    KbdInteractiveAuthentication no",
            "    ConnectTimeout 5",
            "    ServerAliveInterval 5",
            "    ServerAliveCountMax 2",
            "",
        ])
        keys.write_file(self.ssh_config, config, 0o644)
        keys.write_file(self.ssh_wrapper, f"#!/bin/sh\n# cloudbox: ssh with the pinned node keys only\n"
                        f"exec ssh -F {q(str(self.ssh_config))} \"$@\"\n", 0o755)
