"""The volume registry: block volumes this box serves, each a pre-allocated file or a logical volume in a volume group
the user names (core.disks.volumes.lvm), recorded in `volumes.db` (SQLite, core.db) beside results.db.

A volume is created whole (fallocate: real blocks, as the studies' volume servers had; an LV is thick) after its size
was checked against the free space of the volumes directory or the group, and deleted only when no live run has it
attached. A run marks the
volume attached (its id and its process) for as long as it exports it; a mark whose process is gone counts as free.
"""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ... import db, paths
from ...errors import CloudboxError, NoSpace, NotFound, UsageError
from ...procs import process_exists
from ..backing import MARGIN, human_size
from . import lvm

NAME_PATTERN = r"[a-z0-9][a-z0-9-]{0,62}"
MIN_BYTES = 4 * 1024 * 1024
MAX_BYTES = 64 * 1024**4
_SIZE = re.compile(r"(\d+)([KMGT]?)(i?B)?", re.I)
_SCHEMA = """CREATE TABLE IF NOT EXISTS volumes (
    name TEXT PRIMARY KEY, size_bytes INTEGER NOT NULL, path TEXT NOT NULL, created REAL NOT NULL,
    attached_run TEXT, attached_pid INTEGER)"""


def _migrate_0_to_1(conn: sqlite3.Connection) -> None:
    conn.execute(_SCHEMA)  # IF NOT EXISTS: a file made before user_version was kept has the table already


def _migrate_1_to_2(conn: sqlite3.Connection) -> None:
    conn.execute("ALTER TABLE volumes ADD COLUMN vg TEXT")  # NULL: a file


class VolumeBusy(CloudboxError):
    """The volume is attached by a live run."""


@dataclass(frozen=True)
class Volume:
    name: str
    size_bytes: int
    path: str
    created: float
    attached_run: str | None = None  # the run exporting it now (None when free)
    vg: str | None = None  # the volume group of an LV-backed volume (None: a file)

    @property
    def backing(self) -> str:
        return f"LV in {self.vg}" if self.vg else "file"

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "size_bytes": self.size_bytes, "path": self.path, "created": self.created,
                "attached_run": self.attached_run, "backing": "lv" if self.vg else "file", "vg": self.vg}


def volumes_db() -> Path:
    return paths.state_dir() / "volumes.db"


def volumes_dir() -> Path:
    """Where the volumes' files live: the state dir's volumes/ (the disk the volume service measures)."""
    return paths.state_dir() / "volumes"


def check_name(name: str) -> str:
    if not isinstance(name, str) or not re.fullmatch(NAME_PATTERN, name):
        raise UsageError(f"volume name {name!r} is not allowed; allowed: lowercase letters, digits and '-', starting "
                         "with a letter or digit, at most 63 characters")
    return name


def parse_size(text: str, field: str = "--size") -> int:
    """'512M', '4G', '1GiB' or a number of bytes -> bytes (powers of 1024), 4 MiB .. 64 TiB, whole MiB. `field` is
    what the error calls the value (the CLI's option, a form's field)."""
    m = _SIZE.fullmatch(str(text).strip())
    allowed = "a size like 512M, 4G or 1TiB (powers of 1024), from 4M to 64T, in whole MiB"
    if not m:
        raise UsageError(f"{field} {text!r} not understood; allowed: {allowed}")
    n = int(m[1]) * 1024 ** " KMGT".index((m[2] or " ").upper())
    if not MIN_BYTES <= n <= MAX_BYTES or n % (1024 * 1024):
        raise UsageError(f"{field} {text!r} ({human_size(n)}) is out of range; allowed: {allowed}")
    return n


class VolumeStore(db.Database):
    """The registry. One connection per instance (threads share it under a lock); use as a context manager."""

    WHAT = "volume registry"
    SCHEMA_VERSION = 2
    MIGRATIONS: db.Migrations = {0: _migrate_0_to_1, 1: _migrate_1_to_2}

    def __init__(self, path: Path | str | None = None):
        super().__init__(path or volumes_db())

    # -- queries ----------------------------------------------------------------------------------------------------
    def _volume(self, row: sqlite3.Row) -> Volume:
        run, pid = row["attached_run"], row["attached_pid"]
        live = run is not None and pid is not None and process_exists(int(pid))
        return Volume(row["name"], row["size_bytes"], row["path"], row["created"], run if live else None, row["vg"])

    def list(self) -> list[Volume]:
        with self._lock, db.read(self._conn) as c:
            rows = c.execute("SELECT * FROM volumes ORDER BY name").fetchall()
        return [self._volume(r) for r in rows]

    def get(self, name: str) -> Volume:
        with self._lock, db.read(self._conn) as c:
            row = c.execute("SELECT * FROM volumes WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise NotFound(f"no volume {name!r} on this box; create it with: cloudbox volume create {name} --size 1G")
        return self._volume(row)

    # -- changes ----------------------------------------------------------------------------------------------------
    def create(self, name: str, size_bytes: int, field: str = "--size", vg: str | None = None,
               vg_field: str = "--vg") -> Volume:
        """A new volume of `size_bytes` (checked: name, size, free space): a pre-allocated file, or an LV in the
        volume group `vg`; on any failure nothing is left. `field` and `vg_field` are what the errors call the size
        and the group (the CLI's options, a form's fields)."""
        check_name(name)
        if not MIN_BYTES <= size_bytes <= MAX_BYTES:
            raise UsageError(f"{field} {size_bytes} is out of range; allowed: 4M to 64T")
        if vg is not None:
            lvm.check_group(vg, size_bytes, vg_field)
            path = Path(lvm.lv_path(vg, name))
        else:
            d = volumes_dir()
            d.mkdir(parents=True, exist_ok=True)
            os.chmod(d, 0o700)  # only the volume server (root) opens the files; guests reach them through an export
            free = os.statvfs(d).f_bavail * os.statvfs(d).f_frsize
            if free < size_bytes + MARGIN:
                raise NoSpace(f"{field} {human_size(size_bytes)} does not fit in {d}: {human_size(free)} free, "
                              f"{human_size(MARGIN)} kept free; allowed: at most {human_size(max(0, free - MARGIN))}")
            path = d / f"{name}.img"
        with self._write() as c:
            if c.execute("SELECT 1 FROM volumes WHERE name = ?", (name,)).fetchone():
                raise UsageError(f"volume {name!r} exists already; allowed: a new name (cloudbox volume list)")
            c.execute("INSERT INTO volumes (name, size_bytes, path, created, vg) VALUES (?, ?, ?, ?, ?)",
                      (name, size_bytes, str(path), time.time(), vg))
        try:
            if vg is not None:
                _, made = lvm.create(vg, name, size_bytes)
                with self._write() as c:
                    c.execute("UPDATE volumes SET size_bytes = ? WHERE name = ?", (made, name))
            else:
                with open(path, "xb"):
                    pass
                r = subprocess.run(["fallocate", "-l", str(size_bytes), str(path)], capture_output=True, text=True)
                if r.returncode != 0:
                    raise NoSpace(f"{path}: cannot pre-allocate {human_size(size_bytes)}: {r.stderr.strip()}")
        except BaseException:
            if vg is not None:
                lvm.remove(vg, name)
            else:
                path.unlink(missing_ok=True)
            with self._write() as c:
                c.execute("DELETE FROM volumes WHERE name = ?", (name,))
            raise
        return self.get(name)

    def delete(self, name: str) -> Volume:
        vol = self.get(name)
        if vol.attached_run:
            raise VolumeBusy(f"volume {name!r} is attached by run {vol.attached_run}; cancel that run first "
                             "(cloudbox cancel) or wait for it to end")
        if vol.vg:
            lvm.remove(vol.vg, vol.name)  # first: an LV that cannot be removed keeps its entry
        with self._write() as c:
            c.execute("DELETE FROM volumes WHERE name = ?", (name,))
        if not vol.vg:
            Path(vol.path).unlink(missing_ok=True)
        return vol

    def attach(self, name: str, run_uuid: str, pid: int | None = None) -> Volume:
        """Mark the volume attached by `run_uuid` (this process unless `pid`); refused while another live run has it."""
        pid = os.getpid() if pid is None else pid
        with self._write() as c:
            row = c.execute("SELECT * FROM volumes WHERE name = ?", (name,)).fetchone()
            if row is None:
                raise NotFound(f"no volume {name!r} on this box; create it with: cloudbox volume create {name} "
                               "--size 1G")
            vol = self._volume(row)
            if vol.attached_run and vol.attached_run != run_uuid:
                raise VolumeBusy(f"volume {name!r} is attached by run {vol.attached_run}; a volume serves one run "
                                 "at a time")
            c.execute("UPDATE volumes SET attached_run = ?, attached_pid = ? WHERE name = ?", (run_uuid, pid, name))
        if vol.vg:
            try:
                lvm.activate(vol.vg, vol.name)
            except BaseException:
                self.detach(name, run_uuid)
                raise
        return self.get(name)

    def detach(self, name: str, run_uuid: str) -> None:
        """Clear `run_uuid`'s mark (another run's is left alone)."""
        with self._write() as c:
            row = c.execute("SELECT vg FROM volumes WHERE name = ? AND attached_run = ?", (name, run_uuid)).fetchone()
            c.execute("UPDATE volumes SET attached_run = NULL, attached_pid = NULL WHERE name = ? AND attached_run = ?",
                      (name, run_uuid))
        if row is not None and row["vg"]:
            lvm.deactivate(row["vg"], name)  # when the run activated it
