"""Benchmark guests: start a transient libvirt domain, talk to it through the QEMU guest agent, destroy it.

Domains are transient (createXML): destroying one removes it completely, so nothing is left defined
after a failure. Every domain carries cloudbox metadata (namespace below) naming its run, so
`reap_orphans()` can find and destroy guests whose run is gone. Commands run inside the guest with
guest-exec; no SSH keys or guest network are needed for control. When the domain XML logs the serial
console to a file (domain.DomainPlan.console_log), `Guest.console_tail()` reads its last lines, so a
guest that dies can say why (kernel panic, oops, OOM) in the run's abort reason.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from .. import ledger
from ..errors import GuestError, GuestTimeout, GuestUnreachable, LibvirtLost, LibvirtUnavailable, PermissionProblem
from . import daemons
from .daemons import connect
from .domain import CLOUDBOX_XMLNS, ProfileTag, read_domain
from .qga import AgentError, AgentSilent, AgentSocket

NAME_PREFIX = "cloudbox-"

# libvirt error codes for an agent that does not answer: VIR_ERR_AGENT_UNRESPONSIVE (86) and, since libvirt 9.9,
# VIR_ERR_AGENT_COMMAND_TIMEOUT (112: "guest agent didn't respond to command within N seconds"), which older
# libvirt-python builds do not name.
AGENT_SILENT_CODES = frozenset({86, 112})
# Where libvirtd (qemu:///system) keeps each domain's QEMU log: its command line, its stderr (KVM internal errors,
# register dumps) and why it stopped ("shutting down, reason=...").
QEMU_LOG_DIR = Path("/var/log/libvirt/qemu")
AGENT_POLL_S = 0.1  # wait_agent's pause between guest-pings (an unconnected agent fails at once in libvirt)
ON_WAIT_S = 0.5  # and between its on_wait calls (progress events)


@dataclass
class ExecResult:
    argv: list[str]
    exitcode: int
    stdout: str
    stderr: str

    def check(self) -> ExecResult:
        if self.exitcode != 0:
            tail = (self.stderr or self.stdout).strip().splitlines()[-5:]
            raise GuestError(f"in guest: {' '.join(self.argv)} exited {self.exitcode}: " + " | ".join(tail))
        return self


# CSI/OSC escape sequences (colours, cursor moves) a console may carry; other control characters go too.
_ESCAPES = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)?|[ -/]*[0-~])")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def read_console_tail(path: str | Path, lines: int = 20, max_bytes: int = 65536) -> list[str]:
    """The last `lines` non-blank lines of a serial console log, as printable text ([] if none or unreadable)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return []
    text = _ESCAPES.sub("", data.decode("utf-8", errors="replace"))
    out = []
    for raw in text.replace("\r\n", "\n").split("\n"):
        line = _CONTROL.sub("", raw.rsplit("\r", 1)[-1]).rstrip()  # a bare CR overwrites the line
        if line.strip():
            out.append(line)
    return out[-lines:] if lines > 0 else []


class Guest:
    """A running benchmark guest."""

    def __init__(self, conn, dom, console_log: str | Path | None = None, agent_socket: str | None = None,
                 held: ledger.Entry | None = None):
        self.conn = conn
        self.dom = dom
        self.held = held  # the run's ledger's entry for the domain (None: not started by this process)
        self.name: str = dom.name()
        self.console_log = Path(console_log) if console_log is not None else None
        # A Xen guest's agent channel as a unix socket this process talks to itself (libvirt's libxl driver passes
        # no agent commands); None for a virtio-serial channel, reached through libvirt.
        self._socket = AgentSocket(agent_socket) if agent_socket else None

    # ---- lifecycle -------------------------------------------------------------------------
    @classmethod
    def start(cls, conn, xml: str, console_log: str | Path | None = None) -> Guest:
        """Create the transient domain, written in the run's ledger first. console_log: the file the XML logs the
        serial console to, if any."""
        import libvirt

        read = read_domain(xml)
        tag = read.metadata
        held = ledger.hold(Domain(read.name, _uri(conn), (tag.run or "") if tag is not None else "",
                                  hide_kvm=read.type == "qemu"))
        try:
            dom = conn.createXML(xml, 0)
        except libvirt.libvirtError as e:
            if _alive(conn):
                held.done()  # libvirt made nothing
            raise _lost(conn, "starting the guest", e) or GuestError(f"libvirt could not start the guest: {e}") from e
        return cls(conn, dom, console_log, read.agent_socket, held=held)

    def destroy(self) -> None:
        """Power the guest off. When libvirtd went away meanwhile, through a new connection (the daemon started
        again, or waited for) or, failing that, by ending its QEMU process: QEMU is gone when this returns, so the
        storage it held can go next."""
        import libvirt

        if self._socket is not None:
            self._socket.close()
        try:
            self.dom.destroy()
        except libvirt.libvirtError as e:
            if not _alive(self.conn):
                if self.held is not None:
                    self.held.release()
                    return
                raise (_lost(self.conn, f"destroying guest {self.name}", e)
                       or GuestError(f"could not destroy guest {self.name}: {e}")) from e
            if e.get_error_code() != libvirt.VIR_ERR_NO_DOMAIN and self.is_active():
                raise GuestError(f"could not destroy guest {self.name}: {e}") from e
        if self.held is not None:
            self.held.done()

    def is_active(self) -> bool:
        import libvirt

        try:
            return bool(self.dom.isActive())
        except libvirt.libvirtError:
            return False

    def lost(self, doing: str, err: Exception) -> LibvirtLost | None:
        """A LibvirtLost saying so when libvirtd went away under this guest's connection, else None."""
        return _lost(self.conn, doing, err)

    def xml(self) -> str:
        return self.dom.XMLDesc(0)

    def qemu_pid(self) -> int | None:
        """The pid of the guest's QEMU process (libvirt's pid file of it), None where there is none."""
        try:
            return int(Path(f"/run/libvirt/qemu/{self.name}.pid").read_text().strip())
        except (OSError, ValueError):
            return None

    def console_tail(self, lines: int = 20) -> list[str]:
        """The last lines the guest wrote to its serial console ([] without a console log)."""
        return read_console_tail(self.console_log, lines) if self.console_log is not None else []

    def qemu_log_tail(self, lines: int = 10) -> list[str]:
        """The last lines of libvirt's log of this guest's QEMU process ([] where there is none)."""
        return read_console_tail(QEMU_LOG_DIR / f"{self.name}.log", lines)

    # ---- guest agent -----------------------------------------------------------------------
    def agent(self, command: str, arguments: dict | None = None, timeout: int = 10) -> object:
        import libvirt
        import libvirt_qemu

        sock = self._socket
        if sock is not None:
            try:
                return sock.command(command, arguments, timeout)
            except AgentSilent as e:
                if not self.is_active():
                    raise GuestUnreachable(f"guest {self.name} stopped (guest agent, {command}: {e})") from e
                raise GuestUnreachable(f"guest agent in {self.name} stopped answering ({command}: {e})") from e
            except AgentError as e:
                raise GuestError(f"guest agent ({command}) in {self.name}: {e}") from e

        req: dict[str, object] = {"execute": command}
        if arguments is not None:
            req["arguments"] = arguments
        try:
            out = libvirt_qemu.qemuAgentCommand(self.dom, json.dumps(req), timeout, 0)
        except libvirt.libvirtError as e:
            if (gone := self.lost(f"guest agent, {command}", e)) is not None:
                raise gone from e
            if not self.is_active():
                raise GuestUnreachable(f"guest {self.name} stopped (guest agent, {command}: {e})") from e
            if e.get_error_code() in AGENT_SILENT_CODES:
                raise GuestUnreachable(f"guest agent in {self.name} stopped answering ({command}: {e})") from e
            raise GuestError(f"guest agent ({command}) in {self.name}: {e}") from e
        return json.loads(out).get("return")

    def wait_agent(self, timeout: float = 180.0, on_wait: Callable[[float], None] | None = None,
                   interval: float = AGENT_POLL_S) -> float:
        """Block until the guest agent answers, asking every `interval` seconds; returns seconds waited."""
        start = time.monotonic()
        last: Exception | None = None
        told = start
        while time.monotonic() - start < timeout:
            if not self.is_active():
                if not _alive(self.conn):
                    raise LibvirtLost(f"{daemon_gone()} while guest {self.name} was booting")
                raise GuestUnreachable(f"guest {self.name} stopped while booting")
            try:
                self.agent("guest-ping", timeout=2)
                return time.monotonic() - start
            except GuestError as e:
                last = e
            if on_wait and time.monotonic() - told >= ON_WAIT_S:
                told = time.monotonic()
                on_wait(told - start)
            time.sleep(interval)
        raise GuestUnreachable(f"guest agent in {self.name} did not answer within {timeout:.0f} s ({last})")

    def spawn(self, argv: list[str], *, capture: bool = True) -> int:
        """Start argv in the guest; returns the guest pid."""
        ret = self.agent("guest-exec", {"path": argv[0], "arg": argv[1:], "capture-output": capture})
        assert isinstance(ret, dict)
        return int(ret["pid"])

    def status(self, pid: int) -> dict | None:
        """None while running; the guest-exec-status dict once exited."""
        ret = self.agent("guest-exec-status", {"pid": pid})
        assert isinstance(ret, dict)
        return ret if ret.get("exited") else None

    def run(self, argv: list[str], *, timeout: float = 120.0, check: bool = False,
            poll: Callable[[], None] | None = None, interval: float = 0.2,
            on_timeout: Callable[[], None] | None = None,
            give_up: Callable[[], str | None] | None = None) -> ExecResult:
        """Run argv in the guest to completion. `poll` is called while waiting (progress hooks). Past `timeout`,
        or as soon as `give_up` returns a reason, the program is killed (after `on_timeout`, which can look at it
        still running) and GuestTimeout raised."""
        try:
            pid = self.spawn(argv)
        except GuestError as e:
            if "No such file" in str(e) or "Failed to execute child process" in str(e):
                raise GuestError(f"{argv[0]} is not installed in the guest ({self.name}): {e}") from e
            raise
        deadline = time.monotonic() + timeout
        while True:
            st = self.status(pid)
            if st is not None:
                break
            why = give_up() if give_up else None
            if why or time.monotonic() > deadline:
                if on_timeout:
                    on_timeout()
                self.run(["/bin/kill", "-9", str(pid)], timeout=10)
                raise GuestTimeout(f"in guest: {' '.join(argv)} "
                                   f"{why or f'did not finish within {timeout:.0f} s'} (killed)", why)
            if poll:
                poll()
            time.sleep(interval)
        res = ExecResult(
            argv,
            int(st.get("exitcode", -1 if st.get("signal") is None else 128 + int(st["signal"]))),
            _b64(st.get("out-data")),
            _b64(st.get("err-data")),
        )
        return res.check() if check else res

    def monitor(self, command: str) -> str | None:
        """A QEMU human-monitor command's answer through libvirt (diagnosis only: libvirt marks the domain
        'tainted: custom-monitor'); None where this domain has no QEMU monitor (another hypervisor, gone)."""
        import libvirt
        import libvirt_qemu

        try:
            return str(libvirt_qemu.qemuMonitorCommand(self.dom, command,
                                                       libvirt_qemu.VIR_DOMAIN_QEMU_MONITOR_COMMAND_HMP))
        except libvirt.libvirtError:
            return None

    def virtio_net_queues(self) -> dict[str, dict[str, int]] | None:
        """QEMU's own view of the first virtio-net NIC's queues ({"rx": ..., "tx": ...}: used_idx,
        signalled_used, last_avail_idx, shadow_avail_idx); None for another NIC model or an older QEMU."""
        found = self.virtio_queues("virtio-net", {"rx": 0, "tx": 1})
        return found[0][1] if found else None

    def virtio_blk_queues(self) -> list[tuple[str, dict[str, int]]]:
        """QEMU's own view of each virtio-blk disk's first request queue, by device path: empty for another bus,
        another hypervisor or an older QEMU."""
        return [(path, q["requests"]) for path, q in self.virtio_queues("virtio-blk", {"requests": 0})]

    def virtio_queues(self, kind: str, queues: dict[str, int]) -> list[tuple[str, dict[str, dict[str, int]]]]:
        """For each virtio device of `kind` ("virtio-net", "virtio-blk") QEMU lists: its path and the counters of
        its `queues` (name -> index); a device whose queues QEMU does not report is left out."""
        listing = self.monitor("info virtio") or ""
        out = []
        for path in (ln.split()[0] for ln in listing.splitlines() if f"[{kind}]" in ln):
            found = {}
            for name, index in queues.items():
                q = parse_virtqueue_status(self.monitor(f"info virtio-queue-status {path} {index}") or "")
                if q is None:
                    break
                found[name] = q
            else:
                out.append((path, found))
        return out

    def sh(self, script: str, **kw) -> ExecResult:
        return self.run(["/bin/sh", "-c", script], **kw)

    def has(self, program: str) -> bool:
        return self.sh(f"command -v {program} >/dev/null 2>&1", timeout=20).exitcode == 0

    def put_file(self, path: str, data: bytes, mode: int) -> None:
        """`path` in the guest made 0600 (empty), written through the agent (guest-file-open/write/close), then
        chmod `mode`: a secret handed over this way is in no command line and no script text, and a failure names
        the path, never the data."""
        self.run(["/bin/sh", "-c", 'umask 077 && : > "$1"', "sh", path], timeout=30, check=True)
        try:
            handle = self.agent("guest-file-open", {"path": path, "mode": "w"})
            try:
                self.agent("guest-file-write", {"handle": handle, "buf-b64": base64.b64encode(data).decode()})
            finally:
                self.agent("guest-file-close", {"handle": handle})
        except GuestUnreachable:
            raise
        except GuestError as e:
            raise GuestError(f"the guest agent in {self.name} could not write {path} "
                             f"({str(e).split(': ', 1)[0]})") from None
        self.run(["chmod", f"{mode:o}", path], timeout=30, check=True)


VIRTQUEUE_FIELDS = ("used_idx", "signalled_used", "last_avail_idx", "shadow_avail_idx")


def parse_virtqueue_status(text: str) -> dict[str, int] | None:
    """The counters of QEMU's `info virtio-queue-status` answer; None when one is missing."""
    found = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(":")
        if key in VIRTQUEUE_FIELDS and value.strip().isdigit():
            found[key] = int(value)
    return found if len(found) == len(VIRTQUEUE_FIELDS) else None


def _b64(s: str | None) -> str:
    return base64.b64decode(s).decode(errors="replace") if s else ""


@dataclass
class GuestInfo:
    name: str
    state: str
    run_uuid: str | None
    profile: str | None
    started_at: float | None = None  # when its QEMU process started (wall clock), if libvirt's pid file says

    def uptime(self, now: float | None = None) -> float | None:
        if self.started_at is None or self.state != "running":
            return None
        return max(0.0, (time.time() if now is None else now) - self.started_at)


def _qemu_started_at(name: str) -> float | None:
    """libvirt writes /run/libvirt/qemu/<name>.pid when it starts the domain's QEMU: its mtime is the start."""
    import os

    try:
        return os.stat(f"/run/libvirt/qemu/{name}.pid").st_mtime
    except OSError:
        return None


def list_guests(conn) -> list[GuestInfo]:
    """cloudbox guests (by metadata) known to libvirt, sorted by name (libvirt's order is arbitrary)."""
    import libvirt

    out = []
    for dom in conn.listAllDomains(0):
        # Transient domains vanish when destroyed: one may go between listAllDomains and the calls below.
        try:
            meta = dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, CLOUDBOX_XMLNS, 0)
            name = dom.name()
            active = dom.isActive()
        except libvirt.libvirtError:
            continue
        tag = ProfileTag.from_xml(meta)
        state = "running" if active else "shut off"
        started = _qemu_started_at(name) if active and conn.getType() == "QEMU" else None
        out.append(GuestInfo(name, state, tag.run, tag.name, started))
    return sorted(out, key=lambda g: g.name)


def reap_orphans(conn, live_runs: set[str], known_runs: set[str] | None = None) -> list[str]:
    """Destroy cloudbox guests whose run is not live. With `known_runs` (the run uuids of one results database),
    only guests of those runs: a guest of an unknown run belongs to another state directory on this host. Returns
    their names."""
    gone = []
    for g in list_guests(conn):
        if g.run_uuid and g.run_uuid in live_runs:
            continue
        if known_runs is not None and g.run_uuid not in known_runs:
            continue
        try:
            destroy_domain(conn, g.name)
        except GuestError:
            continue
        gone.append(g.name)
    return gone


def destroy_domain(conn, name: str) -> None:
    """Power a guest off at once (libvirt destroy) and undefine it if it was defined; a GuestError naming it when
    libvirt refuses. Its run, if any, then cleans up the rest (disk, network)."""
    import libvirt

    try:
        dom = conn.lookupByName(name)
        persistent = dom.isPersistent()  # asked first: a transient domain is gone once destroyed
        if dom.isActive():
            dom.destroy()
        if persistent:
            dom.undefine()
    except libvirt.libvirtError as e:
        raise GuestError(f"could not destroy guest {name}: {e}") from e


def destroy_guest(name: str, uri: str | None = None) -> None:
    """destroy_domain over a connection of its own to `uri` (libvirtd is not started for it)."""
    conn = connect(uri, start=False)
    try:
        destroy_domain(conn, name)
    finally:
        conn.close()


# -- when libvirtd goes away, and the guest the run's ledger holds ---------------------------------------------------
def _uri(conn) -> str:
    try:
        return str(conn.getURI())
    except Exception:  # noqa: BLE001 - a test's stand-in connection, a dead one
        return ""


def _alive(conn) -> bool:
    """The connection to libvirtd still works (False once the daemon went away under it)."""
    try:
        return bool(conn.isAlive())
    except Exception:  # noqa: BLE001 - a closed connection raises; a stand-in without isAlive counts as alive
        return not hasattr(conn, "isAlive")


def daemon_gone() -> str:
    """What became of libvirtd, in words."""
    pid = daemons.libvirtd_pid()
    return (f"libvirtd went away (its connection broke; pid {pid} runs now)" if pid
            else "libvirtd went away (its process is gone)")


def _lost(conn, doing: str, err: Exception) -> LibvirtLost | None:
    if _alive(conn):
        return None
    return LibvirtLost(f"{daemon_gone()} during the run ({doing}: {err}); the run stops, and its guest is destroyed "
                       "through libvirtd started again (or its QEMU ended) before its storage is removed")


def qemu_pids(name: str) -> list[int]:
    """The QEMU processes running domain `name` (libvirt starts them with `-name guest=NAME,...`)."""
    want = f"guest={name},".encode()
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")  # empty for a zombie: gone already
        except OSError:
            continue
        if argv and b"qemu" in Path(argv[0].decode(errors="replace")).name.encode() and \
                any(a.startswith(want) or a == want[:-1] for a in argv):
            found.append(int(d.name))
    return found


def _running(pid: int) -> bool:
    """`pid` is a process that has not exited (a zombie has: its parent, libvirtd, collects it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


QEMU_EXIT_S = 30.0  # QEMU flushing a big write-through cache can take a while to end


def _end_qemu(name: str) -> str:
    """End domain `name`'s QEMU processes (TERM, then KILL) and wait until they are gone; what was done."""
    pids = qemu_pids(name)
    if not pids:
        return ""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + QEMU_EXIT_S / 2
        while (left := [p for p in pids if _running(p)]) and time.monotonic() < deadline:
            for p in left:
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(p, os.WNOHANG)
            time.sleep(0.1)
        if not left:
            return f"ended QEMU of guest {name} (pid {', '.join(map(str, pids))}): libvirt could not destroy it"
    raise GuestError(f"guest {name}'s QEMU (pid {', '.join(map(str, pids))}) did not end on SIGKILL")


@ledger.kind
@dataclass(frozen=True)
class Domain(ledger.Held):
    """A guest the run started (a transient domain): destroyed through libvirt (started again, or waited for, when
    it went away), else its QEMU process ended. Either way QEMU is gone before the storage it held is removed."""

    kind: ClassVar[str] = "guest"
    first: ClassVar[bool] = True
    name: str = ""
    uri: str = ""
    run: str = ""  # the run uuid its metadata carries: a domain of that name but another run is not this one
    hide_kvm: bool = False  # a TCG guest: a libvirtd started again hides /dev/kvm, as the run's did

    def release(self) -> str:
        if ledger.booting():  # no guest outlives a boot; libvirtd must not be asked (it waits for the clean-up)
            return _end_qemu(self.name)
        try:
            conn = daemons.reconnect(self.uri or None, hide_kvm=self.hide_kvm)
        except (LibvirtUnavailable, PermissionProblem):
            return _end_qemu(self.name)
        try:
            done = self._destroy(conn)
            # a domain of that name that is another run's (or not cloudbox's) is left, its QEMU too
            return _end_qemu(self.name) if done == "" else (done or "")
        finally:
            with contextlib.suppress(Exception):
                conn.close()

    def _destroy(self, conn) -> str | None:
        """What destroying the domain did ("" when libvirt has no such domain: a QEMU left by name is ended next;
        None when the domain of that name is another run's or not cloudbox's: left alone)."""
        import libvirt

        try:
            dom = conn.lookupByName(self.name)
        except libvirt.libvirtError:
            return ""
        try:
            meta = dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, CLOUDBOX_XMLNS, 0)
        except libvirt.libvirtError:
            return None
        if self.run and ProfileTag.from_xml(meta).run != self.run:
            return None
        try:
            if dom.isActive():
                dom.destroy()
        except libvirt.libvirtError as e:
            try:  # a destroy that was under way (the run's own cleanup, cut by a kill) may just have ended
                conn.lookupByName(self.name)
            except libvirt.libvirtError:
                return ""
            raise GuestError(f"could not destroy guest {self.name}: {e}") from e
        return f"destroyed guest {self.name}"
