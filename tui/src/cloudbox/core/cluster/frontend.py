"""What a front-end does with its cluster, shared by `cloudbox node` and the TUI: the role check, a join code
with the detached enrolment server that listens while it is open (one server per host), serving enrolments in
the foreground, and removing a node, which first deletes the front-end's line from the node's authorized_keys
over the pinned ssh and forgets the node even when the node cannot be reached (saying what is left to do).
"""

from __future__ import annotations

import fcntl
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .. import inputs, paths
from ..disks.volumes import nodecreds
from ..errors import CloudboxError
from ..spec import nodeconf
from ..virt import network
from . import enrol, keys, protocol, volumecreds
from .client import NodeShell
from .registry import DEFAULT_CODE_MINUTES, JoinCode, NodeRecord, Registry

FRONT_END_ROLES = ("front-end", "all-in-one")
NODE_AUTHORIZED_KEYS = "/root/.ssh/authorized_keys"  # on the node (what enrolment writes there)
SERVER_START_TIMEOUT_S = 15.0  # the detached server's Python start, keys and bind
REMOTE_TIMEOUT_S = 20.0  # ssh to a node (its ConnectTimeout is 5 s) and the edit


def role_refusal(role: str, source: str, what: str, allowed: tuple[str, ...] = FRONT_END_ROLES) -> str | None:
    """Why `what` does not run on a node of this role (naming the role and where it came from), or None."""
    if role in allowed:
        return None
    return (f"role: this node is {inputs.a_or_an(role)} ({source}); {what} runs on "
            f"{' or '.join(inputs.a_or_an(r) for r in allowed)}")


def require_role(what: str, allowed: tuple[str, ...] = FRONT_END_ROLES) -> str:
    """This node's role when it is one of `allowed`; else a CloudboxError naming the role and where it came from."""
    role, src = nodeconf.role()
    why = role_refusal(role, src, what, allowed)
    if why:
        raise CloudboxError(why)
    return role


def enrol_bind() -> str:
    """Where the enrolment server listens: the private link's address, never every address. A CloudboxError when
    this host has none (no private NIC in the node settings, or it has no IPv4 address), saying to pass --bind."""
    addr = network.private_address()
    if addr == "0.0.0.0":
        raise CloudboxError("the enrolment server listens only on this front-end's private network address, and "
                            "none was found (the node settings name no private NIC, or it has no IPv4 address); "
                            "give the address with --bind ADDR")
    return addr


def when(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


# -- the enrolment server ---------------------------------------------------------------------------------


def server_lock() -> Path:
    return paths.run_dir() / "enrol-server.lock"


def server_log() -> Path:
    return paths.state_dir() / "logs" / "enrol-server.log"


def server_running() -> bool:
    """Whether an enrolment server holds this host's lock (it listens, or is about to)."""
    lock = server_lock()
    if not lock.exists():
        return False
    with open(lock, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
    return False


def serve(reg: Registry, bind: str, port: int, log: Callable[[str], None]) -> None:
    """Serve enrolments in this process until no code is open, holding the one-per-host lock exactly while the
    socket is open: it is released when the socket closes (connections still finishing hold no lock), so the
    next code starts a server of its own. A code made while this one was closing is served here again."""
    lock_path = server_lock()
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    ident = enrol.local_identity(nodeconf.settings().get("hostname"), client_key_path=reg.client_key)
    first = True
    while True:
        lock = open(lock_path, "a")  # noqa: SIM115 - closed by release(), when the socket closes
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            if first:
                raise CloudboxError(f"the enrolment server is already running ({lock_path} is locked)") from None
            return  # another server took over
        released = False

        def release(lock=lock) -> None:
            nonlocal released
            if not released:
                released = True
                lock.close()  # closing the file drops the flock

        try:
            server = enrol.EnrolServer(reg, ident, host=bind, port=port, log=log,
                                       on_enrolled=lambda name: volumecreds.install_in_background(name, log))
            try:
                server.open()
            except enrol.NoOpenCode:
                if first:
                    raise
                return
            server.serve(on_close=release)
        finally:
            release()
        first = False
        if not reg.open_codes():
            return


def _child_env() -> dict[str, str]:
    """The environment of `python -m cloudbox.cli` children: they import this very cloudbox (a checkout's
    src directory goes first on PYTHONPATH; an installed package is found anyway)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    src = Path(__file__).resolve().parents[3]  # nodes -> core -> cloudbox -> src
    if src.name not in ("site-packages", "dist-packages"):
        env["PYTHONPATH"] = os.pathsep.join([str(src), *filter(None, [env.get("PYTHONPATH")])])
    return env


def start_server(bind: str, port: int, db: Path | None = None,
                 timeout: float = SERVER_START_TIMEOUT_S) -> int:
    """Start `cloudbox node enrol-server` in its own session (it outlives the caller: the CLI, the TUI) and
    wait until it listens; returns its pid. A server that exits first (the port in use, no host key) is a
    CloudboxError with its own message from the log."""
    log_path = server_log()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "cloudbox.cli", "node", "enrol-server", "--bind", bind, "--port", str(port)]
    if db is not None:
        cmd[4:4] = ["--db", str(db)]
    with open(log_path, "ab") as log:
        start = log.tell()
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, env=_child_env())
    deadline = time.monotonic() + timeout
    while True:
        new = _read_from(log_path, start)
        if "enrolment server listening on" in new:
            return proc.pid
        if proc.poll() is not None:
            lines = [ln.removeprefix("cloudbox: ") for ln in new.splitlines() if ln.strip()]
            why = lines[-1] if lines else f"exit status {proc.returncode}"
            raise CloudboxError(f"the enrolment server did not start on {bind}:{port}: {why} (log: {log_path})")
        if time.monotonic() > deadline:
            return proc.pid  # slow, but alive: its log says the rest
        time.sleep(0.05)


def _read_from(path: Path, offset: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except OSError:
        return ""


# -- join codes -------------------------------------------------------------------------------------------


@dataclass
class CodeOffer:
    """A new join code and where a back-end sends it. `code` is shown once: only its scrypt key is stored."""

    code: str
    record: JoinCode
    minutes: float
    bind: str
    port: int
    server: str  # "started" | "running" (it was already) | "not started" (listen=False) | "serving" (caller serves)
    pid: int | None = None

    @property
    def front_end(self) -> str:
        """The --front-end value to type on the back-end (ADDRESS when it is not known here)."""
        where = "ADDRESS" if self.bind in ("", "0.0.0.0", "::") else self.bind
        if self.port != protocol.PORT:
            where = f"[{where}]:{self.port}" if ":" in where else f"{where}:{self.port}"
        return where

    @property
    def join_command(self) -> str:
        return f"cloudbox node join --front-end {self.front_end} --code {self.code}"

    @property
    def listening(self) -> str:
        """One line on the enrolment server."""
        at = f"{self.bind}:{self.port}"
        return {"started": f"enrolment server started (pid {self.pid}), listening on {at}; it stops when no "
                           f"code is open (log: {server_log()})",
                "running": f"the enrolment server is already running (on {at} unless started otherwise)",
                "serving": f"serving enrolments on {at} in the foreground",
                }.get(self.server, "not listening (--no-listen): start `cloudbox node enrol-server` before the "
                                   "back-end joins")


def make_code(reg: Registry, minutes: float = DEFAULT_CODE_MINUTES, *, bind: str | None = None,
              port: int = protocol.PORT, listen: bool = True, db: Path | None = None,
              replaces: str | None = None) -> CodeOffer:
    """A one-time join code, and (listen=True) the detached enrolment server, unless one already runs. When the
    server cannot start, the new code is revoked (nothing could use it) and the server's error is raised.
    `replaces`: the code may re-enrol that node without proof of its host key (a reinstalled node)."""
    require_role("making join codes")
    if not 1 <= port <= 65535:
        raise CloudboxError(f"--port: {port} is out of range; allowed: 1..65535")
    if listen:
        bind = bind or enrol_bind()  # before a code is made that no server could serve
    else:
        bind = bind or ("" if network.private_address() == "0.0.0.0" else network.private_address())
    code, rec = reg.make_code(minutes, replaces=replaces)
    offer = CodeOffer(code, rec, minutes, bind, port, "not started")
    if not listen:
        return offer
    if server_running():
        offer.server = "running"
        return offer
    try:
        offer.pid = start_server(bind, port, db)
    except CloudboxError as e:
        reg.revoke(rec.id, "the enrolment server did not start")
        raise CloudboxError(f"{e}; join code {rec.id} is revoked") from e
    offer.server = "started"
    return offer


def revoke_codes(reg: Registry, code_id: int | None = None) -> list[int]:
    """Revoke one open code or all; the enrolment server stops by itself once none is left open."""
    require_role("revoking join codes")
    return reg.revoke(code_id)


# -- removing a node ----------------------------------------------------------------------------------------

# Runs on the node as root (POSIX sh and awk): drops the lines that carry this front-end's management key followed
# by the cloudbox mark, keeps every other line and the file's mode, replaces the file in one rename, and prints
# how many lines went. $1 is the file, $2 the key's base64 part.
_REMOTE_REMOVE = r"""
f=$1 k=$2 m=cloudbox-front-end
if [ ! -e "$f" ]; then echo "removed 0 (no $f)"; exit 0; fi
ours='{ for (i = 1; i < NF; i++) if ($i == k && $(i + 1) == m) { hit = 1; break } }'
n=$(awk -v k="$k" -v m="$m" "$ours"' hit { c++ } { hit = 0 } END { print c + 0 }' "$f") || exit 3
if [ "$n" -eq 0 ]; then echo "removed 0"; exit 0; fi
t=$(mktemp "$f.cloudbox.XXXXXX") || exit 3
if awk -v k="$k" -v m="$m" "$ours"' !hit { print } { hit = 0 }' "$f" > "$t" && chmod 600 "$t" && mv -f "$t" "$f"
then echo "removed $n"; else rm -f "$t"; exit 3; fi
"""


@dataclass
class Removal:
    """What removing a node did: it is always forgotten here; `lines_removed` is None when its authorized_keys
    could not be edited (`problem` says why, `manual` what to do on the node)."""

    node: NodeRecord
    authorized_keys: str
    lines_removed: int | None
    problem: str | None = None

    @property
    def cleaned(self) -> bool:
        return self.lines_removed is not None

    @property
    def manual(self) -> str:
        """The command that deletes the line by hand, as root on the node (cloudbox keeps one such line)."""
        return f"sed -i '/ {keys.AUTHORIZED_MARK} /d' {shlex.quote(self.authorized_keys)}"

    @property
    def forgotten(self) -> str:
        return (f"removed node {self.node.name} ({self.node.address}, host key "
                f"{self.node.host_key_fingerprint}); its pinned key is gone")

    @property
    def on_node(self) -> str:
        """What became of the front-end's key on the node, in one sentence."""
        if self.lines_removed:
            return f"the front-end's key is no longer in {self.node.name}'s {self.authorized_keys}"
        if self.lines_removed == 0:
            return f"{self.node.name}'s {self.authorized_keys} held no line with the front-end's key"
        return (f"{self.node.name} could not be reached ({self.problem}), so the front-end's key is STILL in its "
                f"{self.authorized_keys}; delete that line there as root with: {self.manual}")


def remove_authorized_line(reg: Registry, node: NodeRecord, path: str = NODE_AUTHORIZED_KEYS,
                           timeout: float = REMOTE_TIMEOUT_S) -> int:
    """Delete the line with this front-end's management key from `path` on the node, over the pinned ssh (the
    node's recorded host key only); other lines stay. Returns how many lines went; CloudboxError when the node
    cannot be reached or the edit fails."""
    try:
        mgmt = keys.read_public_key(reg.client_key.with_name(reg.client_key.name + ".pub"),
                                    what="the front-end's management key")
    except keys.KeyProblem as e:
        raise CloudboxError(str(e)) from None
    shell = NodeShell.for_node(reg, node)
    stdout = shell.run("sh", "-c", _REMOTE_REMOVE, "cloudbox-remove", path, mgmt.blob, timeout=timeout,
                       what=f"editing {path}")
    # The last line is the script's (a chatty shell start-up file on the node may print before it).
    words = (stdout.strip().splitlines() or [""])[-1].split()
    if len(words) < 2 or words[0] != "removed" or not words[1].isdigit():
        raise CloudboxError(f"editing {path}: unexpected answer {stdout.strip()[-200:]!r}")
    return int(words[1])


def remove_node(reg: Registry, name: str, *, authorized_keys: str = NODE_AUTHORIZED_KEYS,
                timeout: float = REMOTE_TIMEOUT_S) -> Removal:
    """Take the front-end's key off the node (when it can be reached), then forget the node and its pinned key
    either way: an unreachable or dead node must not stay in the registry."""
    require_role("removing nodes")
    node = reg.node(name)
    try:
        removal = Removal(node, authorized_keys, remove_authorized_line(reg, node, authorized_keys, timeout))
    except CloudboxError as e:
        removal = Removal(node, authorized_keys, None, str(e))
    reg.remove(name)
    nodecreds.forget(name)  # a node enrolled again under this name gets new volume credentials
    return removal
