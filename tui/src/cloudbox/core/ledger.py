"""What a run holds on this host, written down before each thing is made: the run's ledger, and its reclaiming.

Whatever a run makes outside its own process (a directory, a loop device, an md array, an LV activation, a mount, a
link, a network namespace, a server, a kernel export or session, a guest) is appended to the run's ledger as an
intent before it is made (`Ledger.hold`), completed with what only the making tells (a loop's device, a server's
pid: `Entry.update`), and marked released once the run has taken it down (`Entry.done`, or `Entry.release`, which
undoes it through the record). A run killed outright, or whose cleanup failed, leaves entries still held; a later
clean-up (`reclaim`, from core.run.reclaim) undoes exactly those, guests first, and nothing else.

Each kind of thing is one small record: a frozen dataclass subclass of `Held`, registered with `@kind` in the
module that makes such things (core.disks.backing's `Loop`, core.virt.guest's `Domain`, ...), whose `release()`
undoes it when it is still there, says what it did ("" when nothing was left), and raises CloudboxError when it
cannot. The generic kinds are here: a process, a directory, a network link and a network namespace.

A ledger is a file of JSON lines, <state dir>/ledgers/<run uuid>.jsonl, each appended whole by one write() (a line is
there or not, whatever kills the process). The run's executor holds an exclusive flock on it for as long as it runs:
the kernel drops the lock when the process dies, so a ledger whose lock can be taken is a dead or finished run's, and
its reclaiming can never race the run that writes it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from . import paths
from .errors import CloudboxError

SUFFIX = ".jsonl"


def ledgers_dir(state: Path | None = None) -> Path:
    """Where the runs of a state directory (default: this one's) keep their ledgers."""
    return (state or paths.state_dir()) / "ledgers"


# ------------------------------------------------------------------------------------------------ the records
@dataclass(frozen=True)
class Held:
    """One thing a run made on this host. Subclasses are frozen dataclasses registered with `@kind`."""

    kind: ClassVar[str] = ""
    first: ClassVar[bool] = False  # reclaimed before everything else: a guest holds the storage the rest is

    def release(self) -> str:
        """Undo it if it is still there; what was done ("" when nothing was left). CloudboxError when it cannot."""
        raise NotImplementedError(self.kind)

    def describe(self) -> str:
        fields = ", ".join(f"{k} {v}" for k, v in dataclasses.asdict(self).items() if v not in ("", 0, None, ()))
        return f"{self.kind} ({fields})"


KINDS: dict[str, type[Held]] = {}


def kind(cls: type[Held]) -> type[Held]:
    """Register a record class by its `kind` name (a decorator): ledgers name their entries by it."""
    if not cls.kind or KINDS.get(cls.kind, cls) is not cls:
        raise ValueError(f"ledger kind {cls.kind!r} of {cls.__name__}: empty or registered twice")
    KINDS[cls.kind] = cls
    return cls


@dataclass(frozen=True)
class Unknown(Held):
    """An entry whose kind no module registered (a newer cloudbox wrote it): kept, never undone."""

    name: str = ""
    what: dict[str, Any] = field(default_factory=dict)

    def release(self) -> str:
        raise CloudboxError(f"ledger entry of kind {self.name!r} ({self.what}): this cloudbox does not know how to "
                            "undo it")

    def describe(self) -> str:
        return f"{self.name} {self.what}"


def _to_record(name: str, what: dict[str, Any]) -> Held:
    cls = KINDS.get(name)
    if cls is None:
        return Unknown(name, what)
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    try:
        return cls(**{k: v for k, v in what.items() if k in known})
    except TypeError:
        return Unknown(name, what)


# ------------------------------------------------------------------------------------------------- the ledger
@dataclass(eq=False)
class Entry:
    """One thing in a ledger, from its intent on."""

    ledger: Ledger
    n: int
    record: Held
    open: bool = True

    def update(self, **fields: Any) -> None:
        """What the making told (a device name, a pid), written down."""
        self.record = dataclasses.replace(self.record, **fields)  # type: ignore[type-var]
        self.ledger._append({"n": self.n, "op": "set", "what": dataclasses.asdict(self.record)})

    def done(self) -> None:
        """It is gone (the caller took it down, or it was never made). Safe to call twice."""
        if self.open:
            self.open = False
            self.ledger._append({"n": self.n, "op": "free"})

    def release(self) -> str:
        """Undo it through its record now, then mark it released; what was done."""
        what = self.record.release() if self.open else ""
        self.done()
        return what


class Ledger:
    """A run's ledger. `Ledger(None)` keeps nothing (code run outside a run: a test, `cloudbox volume`)."""

    def __init__(self, path: Path | None, entries: list[Entry] | None = None, fd: int = -1) -> None:
        self.path = path
        self._fd = fd
        self._lock = threading.Lock()
        self._entries: list[Entry] = entries or []
        self._n = max((e.n for e in self._entries), default=0)

    @classmethod
    def create(cls, run_uuid: str, state: Path | None = None) -> Ledger:
        """The ledger of run `run_uuid`, made and locked by this process for as long as it runs."""
        d = ledgers_dir(state)
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"{run_uuid}{SUFFIX}"
        # locked under another name first, then named: a clean-up never finds it unlocked
        new = path.with_name(path.name + ".new")
        fd = os.open(new, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.replace(new, path)
        return cls(path, fd=fd)

    @classmethod
    def take(cls, path: Path) -> Ledger | None:
        """A dead or finished run's ledger, locked for reclaiming with its entries still held; None while a live
        process holds it (its run, or another clean-up)."""
        try:
            fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        led = cls(path, fd=fd)
        led._entries = read(path, led)
        led._n = max((e.n for e in led._entries), default=0)
        return led

    def _append(self, line: dict[str, Any]) -> None:
        if self._fd < 0:
            return
        data = (json.dumps({**line, "t": round(time.time(), 3)}, separators=(",", ":")) + "\n").encode()
        with self._lock:
            os.write(self._fd, data)  # one write of a whole line: no signal or kill leaves half of it

    def hold(self, record: Held) -> Entry:
        """Write down that `record` is about to be made; its entry."""
        with self._lock:
            self._n += 1
            entry = Entry(self, self._n, record)
            self._entries.append(entry)
        self._append({"n": entry.n, "op": "hold", "kind": record.kind, "what": dataclasses.asdict(record)})
        return entry

    def held(self) -> list[Entry]:
        """The entries still held, in the order they were made."""
        return [e for e in self._entries if e.open]

    def find(self, record: Held) -> Entry | None:
        """The latest entry still held whose record equals `record`."""
        return next((e for e in reversed(self._entries) if e.open and e.record == record), None)

    def done(self, record: Held) -> None:
        """Mark the held entry equal to `record` released (its maker's caller took it down)."""
        entry = self.find(record)
        if entry is not None:
            entry.done()

    def undo_held(self, say: Callable[[str], None]) -> list[str]:
        """Undo every entry still held: guests first, then the rest newest first; what was done goes to `say`.
        Returns the problems (each thing that could not be undone stays held). A guest that cannot be destroyed
        keeps everything else: its storage is not taken from under it."""
        problems: list[str] = []
        guests_stay = False
        for entry in sorted(self.held(), key=lambda e: (not e.record.first, -e.n)):
            if guests_stay and not entry.record.first:
                problems.append(f"{entry.record.describe()}: left, as a guest of the run could not be destroyed")
                continue
            try:
                what = entry.release()
            except Exception as e:  # noqa: BLE001 - one thing that cannot be undone does not stop the others
                problems.append(f"{entry.record.describe()}: {e}")
                guests_stay = guests_stay or entry.record.first
                continue
            if what:
                say(what)
        return problems

    def close(self) -> list[Entry]:
        """The run is over: the file is removed when nothing is held any more, else kept for a later clean-up; the
        lock is dropped. The entries still held."""
        left = self.held()
        if self.path is not None and self._fd >= 0:
            if not left:
                self.path.unlink(missing_ok=True)
            os.close(self._fd)
            self._fd = -1
        return left


def read(path: Path, ledger: Ledger | None = None) -> list[Entry]:
    """The entries still held in ledger file `path`, in order (a line a dying process could not finish is left
    out)."""
    led = ledger or Ledger(None)
    entries: dict[int, Entry] = {}
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    for line in text.splitlines():
        try:
            d = json.loads(line)
            n, op = int(d["n"]), d["op"]
        except (ValueError, KeyError, TypeError):
            continue
        if op == "hold" and isinstance(d.get("what"), dict):
            entries[n] = Entry(led, n, _to_record(str(d.get("kind")), d["what"]))
        elif op == "set" and n in entries and isinstance(d.get("what"), dict):
            e = entries[n]
            name = e.record.name if isinstance(e.record, Unknown) else e.record.kind
            e.record = _to_record(name, d["what"])
        elif op == "free" and n in entries:
            entries[n].open = False
    return [e for e in entries.values() if e.open]


_ACTIVE = Ledger(None)


def active() -> Ledger:
    """The ledger of the run this process executes (one that keeps nothing outside a run)."""
    return _ACTIVE


@contextlib.contextmanager
def keeping(ledger: Ledger) -> Iterator[Ledger]:
    """Make `ledger` the process's active one for the block (the run's executor, from start to cleanup's end)."""
    global _ACTIVE
    before, _ACTIVE = _ACTIVE, ledger
    try:
        yield ledger
    finally:
        _ACTIVE = before


def hold(record: Held) -> Entry:
    """`active().hold(record)`."""
    return _ACTIVE.hold(record)


# ------------------------------------------------------------------------------------------------ reclaiming
_BOOTING = threading.Event()


def booting() -> bool:
    """The clean-up runs at boot, before the daemons: nothing of the last boot's processes or kernel state is left,
    and no daemon may be asked for (libvirtd would be started by its socket and wait for the clean-up)."""
    return _BOOTING.is_set()


def reclaim(path: Path, say: Callable[[str], None], *, boot: bool = False) -> list[str] | None:
    """Undo what the ledger at `path` still holds: guests first, then the rest newest first. What was done goes to
    `say`; returns the problems (each thing that could not be undone, kept in the ledger for the next clean-up), or
    None when a live process holds the ledger (its run is not over). A guest that cannot be destroyed keeps
    everything else: its storage is not taken from under it."""
    led = Ledger.take(path)
    if led is None:
        return None
    if boot:
        _BOOTING.set()
    try:
        return led.undo_held(say)
    finally:
        _BOOTING.clear()
        led.close()


def ledgers(state: Path | None = None) -> list[Path]:
    """The ledger files of a state directory's runs, oldest first."""
    d = ledgers_dir(state)
    found = list(d.glob(f"*{SUFFIX}")) if d.is_dir() else []
    return sorted(found, key=lambda p: p.stat().st_mtime if p.exists() else 0.0)


# ------------------------------------------------------------------------------------------ the generic kinds
def _start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat): with its pid, it names one
    process for good (a pid is reused, the pair is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat[stat.rindex(")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def start_ticks(pid: int) -> int:
    """`pid`'s start time in ticks since boot, 0 when it cannot be read."""
    return _start_ticks(pid) or 0


@kind
@dataclass(frozen=True)
class Process(Held):
    """A server or tool the run started (qemu-nbd, tgtd, ganesha, vblade, netserver, iperf3, fio, ...): ended when
    the same process (pid and start time) is still there, its process group too when it leads one."""

    kind: ClassVar[str] = "process"
    program: str = ""
    pid: int = 0
    start: int = 0  # ticks since boot, as /proc/PID/stat says
    group: bool = False  # it leads a process group of its own (netserver's children per test)

    def alive(self) -> bool:
        """The very process the run started is still there (without its start time recorded, it never counts)."""
        return bool(self.pid and self.start) and _start_ticks(self.pid) == self.start

    def release(self) -> str:
        if not self.alive() or booting():
            return ""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if self.group:
                    os.killpg(self.pid, sig)
                else:
                    os.kill(self.pid, sig)
            deadline = time.monotonic() + 5
            while self.alive() and time.monotonic() < deadline:
                _reap(self.pid)
                time.sleep(0.05)
            if not self.alive():
                return f"stopped {self.program} (pid {self.pid})"
        raise CloudboxError(f"{self.program} (pid {self.pid}) did not end on SIGKILL")


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


@kind
@dataclass(frozen=True)
class Directory(Held):
    """A directory the run made (its work directory), removed whole with what is in it."""

    kind: ClassVar[str] = "directory"
    path: str = ""

    def release(self) -> str:
        if not os.path.isdir(self.path) or os.path.islink(self.path):
            return ""
        shutil.rmtree(self.path, ignore_errors=True)
        if os.path.exists(self.path):
            raise CloudboxError(f"{self.path}: could not be removed whole")
        return f"removed {self.path}"


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


def _ip_del(obj: str, name: str, there: str) -> None:
    """`ip OBJ del NAME`; a refusal with ip's own words when it failed and `there` (its /sys or /run file) stays."""
    r = _ip(obj, "del", name)
    if r.returncode != 0 and os.path.exists(there):
        raise CloudboxError(f"ip {obj} del {name}: {r.stderr.strip()}")


@kind
@dataclass(frozen=True)
class Link(Held):
    """A network link the run made (a bridge, one end of a veth pair), deleted when there."""

    kind: ClassVar[str] = "link"
    name: str = ""

    def release(self) -> str:
        there = f"/sys/class/net/{self.name}"
        if not os.path.exists(there):
            return ""
        _ip_del("link", self.name, there)
        return f"removed link {self.name}"


@kind
@dataclass(frozen=True)
class Netns(Held):
    """A network namespace the run made, its processes ended first (the baseline's servers)."""

    kind: ClassVar[str] = "netns"
    name: str = ""

    def release(self) -> str:
        there = f"/run/netns/{self.name}"
        if not os.path.exists(there):
            return ""
        for pid in _ip("netns", "pids", self.name).stdout.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        _ip_del("netns", self.name, there)
        return f"removed network namespace {self.name}"
