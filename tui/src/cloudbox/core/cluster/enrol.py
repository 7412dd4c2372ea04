"""Enrolment: a back-end joins the front-end with a one-time join code, and both sides pin each other's keys.

The protocol is JSON lines over one TCP connection (port PORT). The code never crosses the wire: both sides
prove they know it with HMAC-SHA256 keyed by K = scrypt(code, cluster salt) over a transcript of both nonces
and all four public keys (docs/cluster.md has the whole design and the threat model):

    back-end -> hello      {v, name, role, ssh_port, nonce, host_key, client_key, address, front_end_address}
    front-end -> challenge {v, name, nonce, host_key, mgmt_key, ssh_port, salt, address, back_end_address}
                                                                                        (or refused)
    back-end -> proof      {mac = HMAC(K, "back-end" || transcript), host_sig = SSH signature of the transcript
                            with the back-end's host key}
    front-end -> welcome   {mac = HMAC(K, "front-end" || transcript || welcome), libvirt_uri, address}
                                                                                        (or refused)
    back-end -> installed  {} (or error {message}): the front-end's key is in root's authorized_keys

The front-end only answers with its own proof after the back-end's proof matched an open code, and records the
node (consuming the code) in the same transaction. Each side puts its own view of both addresses into the
transcript and refuses when the other's view differs from its own (a relay in between would be pinned on both
sides). Re-enrolling a known name needs host_sig, or a code made to replace that node. Refusals are a `refused`
message {reason, message} the other side raises as EnrolRefused; the reasons are REASONS.

The server listens only while at least one code is open: `EnrolServer.open()` refuses to bind without one (and
to bind every address), and `serve()` closes the socket as soon as none is left (used, expired, revoked). A
connection has CONNECTION_DEADLINE_S in all; at most MAX_CONNECTIONS are served at once, MAX_PER_PEER from one
address; an address with PEER_FAILURE_LIMIT refusals is turned away at accept, before anything is read.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from .. import inputs
from ..disks.volumes import nodecreds
from ..errors import CloudboxError, NotFound
from ..spec.nodeconf import NODE_NAME_ALLOWED, NODE_NAME_PATTERN
from . import keys
from .protocol import (
    HOST_SIG_NAMESPACE,
    MAX_LINE,
    MAX_MESSAGE_NESTING,
    PORT,
    REASONS,
    VERSION,
    Challenge,
    FieldProblem,
    Hello,
    Message,
    Proof,
    checked,
)
from .registry import (
    PEER_FAILURE_LIMIT,
    PEER_FAILURE_WINDOW_S,
    TOTAL_FAILURE_LIMIT,
    JoinCode,
    NodeConflict,
    NodeRecord,
    Registry,
    derive_key,
    normalize_code,
)

IO_TIMEOUT_S = 15.0
CONNECTION_DEADLINE_S = 30.0  # a whole enrolment, hello to installed; a peer trickling bytes gets no more
MAX_CONNECTIONS = 16  # served at once; more are turned away ("busy") at accept
MAX_PER_PEER = 2  # at once from one address, so that a few addresses cannot take every slot

_M = TypeVar("_M", bound=Message)

# These count for the rate limit: a wrong, reused, expired or revoked code, and a malformed message.
CODE_REFUSALS = ("wrong-code", "code-used", "code-expired", "code-revoked", "bad-request")


class EnrolRefused(CloudboxError):
    """Enrolment was refused, by the other side or by us; `reason` is one of REASONS."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


class NoOpenCode(CloudboxError):
    """The front-end has no open join code, so it does not listen."""


# --------------------------------------------------------------------------------------------------
# Wire format
# --------------------------------------------------------------------------------------------------


class _Channel:
    """JSON lines over a socket, each read bounded by `timeout` and all of them by `deadline` (monotonic)."""

    def __init__(self, sock: socket.socket, timeout: float = IO_TIMEOUT_S, deadline: float | None = None, *,
                 refusals: bool = True):
        self.sock = sock
        self.refusals = refusals  # the back-end reads refusals; the server takes none from a peer
        self.timeout = timeout
        self.deadline = deadline if deadline is not None else time.monotonic() + CONNECTION_DEADLINE_S
        self.span = self.deadline - time.monotonic()
        self._buf = b""

    def send(self, obj: dict[str, Any]) -> None:
        self.sock.settimeout(max(0.1, min(self.timeout, self.deadline - time.monotonic())))
        self.sock.sendall(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode() + b"\n")

    def _line(self) -> bytes:
        while b"\n" not in self._buf:
            if len(self._buf) > MAX_LINE:
                raise EnrolRefused("bad-request", f"message longer than {MAX_LINE} bytes")
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise EnrolRefused("bad-request", "the other side did not finish in time (the whole enrolment "
                                   f"has {self.span:.0f} s)")
            self.sock.settimeout(min(self.timeout, left))
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                if time.monotonic() >= self.deadline:
                    raise EnrolRefused("bad-request", "the other side did not finish in time (the whole enrolment "
                                       f"has {self.span:.0f} s)") from None
                raise EnrolRefused("bad-request", "the other side went silent (timeout)") from None
            except OSError as e:
                raise CloudboxError(f"enrolment connection failed: {e.strerror or e}") from e
            if not data:
                raise CloudboxError("the other side closed the enrolment connection")
            self._buf += data
        line, _, self._buf = self._buf.partition(b"\n")
        if len(line) > MAX_LINE:
            raise EnrolRefused("bad-request", f"message longer than {MAX_LINE} bytes")
        return line

    def recv(self, *expected: str) -> dict[str, Any]:
        line = self._line()
        try:
            msg = inputs.load_json(line, max_depth=MAX_MESSAGE_NESTING)
        except inputs.InputProblem as e:
            raise EnrolRefused("bad-request", f"message is not JSON ({inputs.printable(e.message)})") from None
        if not isinstance(msg, dict):
            raise EnrolRefused("bad-request", "message is not a JSON object")
        kind = msg.get("type")
        if kind == "refused" and self.refusals:
            # Whatever answers on the port wrote this: it reaches a terminal only escaped and cut.
            reason = inputs.cut(inputs.printable(msg.get("reason", "?")), 40)
            text = msg.get("message", REASONS.get(reason, ""))
            raise EnrolRefused(reason, f"refused ({reason}): {inputs.cut(inputs.printable(text), 500)}")
        if kind not in expected:
            raise EnrolRefused("bad-request", f"expected a {' or '.join(expected)} message, got "
                               f"{inputs.shown(kind, 40)}")
        return msg

    def close(self) -> None:
        self.sock.close()


def _checked(kind: type[_M], msg: dict[str, Any], seen: dict[str, tuple[str, str]] | None = None) -> _M:
    """A message as its schema (core.cluster.protocol), or a refusal naming its first wrong field."""
    try:
        return checked(kind, msg, seen)
    except FieldProblem as e:
        raise EnrolRefused(e.reason, str(e)) from None


def transcript(hello: dict[str, Any], challenge: dict[str, Any]) -> bytes:
    """What both MACs cover: every field of hello and challenge that the other side acts on."""
    t = {
        "v": VERSION,
        "back-end": {k: hello[k] for k in ("name", "role", "ssh_port", "nonce", "host_key", "client_key",
                                           "address", "front_end_address")},
        "front-end": {k: challenge[k] for k in ("name", "nonce", "host_key", "mgmt_key", "ssh_port", "salt",
                                                "address", "back_end_address")},
    }
    return json.dumps(t, sort_keys=True, separators=(",", ":")).encode()


def mac(key: bytes, side: str, data: bytes, extra: dict[str, Any] | None = None) -> str:
    msg = f"cloudbox-enrol-v{VERSION} {side}\n".encode() + data
    if extra is not None:
        msg += b"\n" + json.dumps(extra, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(key, msg, hashlib.sha256).hexdigest()


# --------------------------------------------------------------------------------------------------
# Front-end
# --------------------------------------------------------------------------------------------------


@dataclass
class Identity:
    """One side's name and public keys (a front-end's client key is its management key)."""

    name: str
    host_key: keys.PublicKey
    client_key: keys.PublicKey
    ssh_port: int = 22
    host_private_key: Path | None = None  # signs the enrolment (a back-end proves it holds host_key)


def local_identity(name: str | None = None, *, client_key_path: Path | None = None, ssh_port: int = 22) -> Identity:
    return Identity(name or socket.gethostname().split(".")[0].lower(), keys.host_key(),
                    keys.client_key(client_key_path), ssh_port, keys.host_private_key_path())


class EnrolServer:
    """Accepts enrolments while a join code is open. `log` receives one line per event (stdout by default)."""

    def __init__(self, registry: Registry, identity: Identity, *, host: str, port: int = PORT,
                 log: Callable[[str], None] = print, io_timeout: float = IO_TIMEOUT_S,
                 deadline: float = CONNECTION_DEADLINE_S, max_connections: int = MAX_CONNECTIONS,
                 max_per_peer: int = MAX_PER_PEER, peer_failure_limit: int = PEER_FAILURE_LIMIT,
                 on_enrolled: Callable[[str], object] | None = None):
        self.registry = registry
        self.on_enrolled = on_enrolled  # called with the node's name once it has installed the front-end's key
        self.identity = identity
        self.host, self.port = host, port
        self.log = log
        self.io_timeout = io_timeout
        self.deadline = deadline
        self.max_connections, self.max_per_peer = max_connections, max_per_peer
        self.peer_failure_limit = peer_failure_limit
        self.sock: socket.socket | None = None
        self.enrolled: list[str] = []
        self._threads: list[threading.Thread] = []
        self._active: dict[str, int] = {}  # peer -> connections being served
        self._active_lock = threading.Lock()
        self._turned_away: dict[tuple[str, str], float] = {}  # (peer, why) -> when last logged
        self._alarm_at = 0  # total refusals already warned about

    def open(self) -> tuple[str, int]:
        """Bind and listen; refuses (NoOpenCode) when no join code is open, and refuses every-address binds (the
        server belongs on the private network's address). Returns the bound address."""
        if not self.registry.open_codes():
            raise NoOpenCode("no open join code: the enrolment server does not listen without one "
                             "(make one with `cloudbox node code`)")
        try:
            unspecified = inputs.ip_address(self.host).is_unspecified
        except ValueError:
            unspecified = False
        if unspecified or not self.host:
            raise CloudboxError(f"enrolment server: will not listen on every address ({self.host or 'none given'});"
                                " allowed: this front-end's address on the private network (--bind ADDR)")
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        s = socket.socket(family, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((self.host, self.port))
        except OSError as e:
            s.close()
            raise CloudboxError(f"enrolment server: cannot listen on {self.host}:{self.port}: "
                                f"{e.strerror or e}") from e
        s.listen(64)
        self.sock = s
        self.host, self.port = s.getsockname()[:2]
        return self.host, self.port

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def serve(self, *, stop: threading.Event | None = None, poll: float = 0.5,
              on_close: Callable[[], None] | None = None) -> None:
        """Accept connections until no code is open (or `stop` is set), then stop listening (and call `on_close`:
        the caller's one-per-host lock goes with the socket) and return once the connections in progress are
        done, each within its deadline."""
        if self.sock is None:
            self.open()
        assert self.sock is not None
        self.sock.settimeout(poll)
        self.log(f"enrolment server listening on {self.host}:{self.port} while a join code is open")
        sock = self.sock
        try:
            while not (stop is not None and stop.is_set()):
                if not self.registry.open_codes():
                    self.log("no join code open any more: not listening")
                    break
                try:
                    conn, addr = sock.accept()
                except TimeoutError:
                    continue
                except OSError:  # closed under us (close() from another thread)
                    break
                self._admit(conn, inputs.normal_address(addr[0]))
        finally:
            self.close()
            if on_close is not None:
                on_close()
            for t in self._threads:
                t.join(self.deadline + 5)

    def _admit(self, conn: socket.socket, peer: str) -> None:
        """Serve `conn` in a thread, or turn it away at once: too many connections (from this peer or in all), or
        a peer past its refusal limit. Turning away reads nothing, writes no registry row and logs a peer once."""
        self._threads = [t for t in self._threads if t.is_alive()]
        why = None
        with self._active_lock:
            if sum(self._active.values()) >= self.max_connections:
                why = ("busy", f"the enrolment server is serving {self.max_connections} connections; try again in "
                       "a moment")
            elif self._active.get(peer, 0) >= self.max_per_peer:
                why = ("busy", f"{peer} already has {self.max_per_peer} enrolment connections open")
        if why is None:
            recent = self.registry.peer_failures(peer)
            if len(recent) >= self.peer_failure_limit:
                wait = int(recent[-self.peer_failure_limit] + PEER_FAILURE_WINDOW_S - time.time()) + 1
                why = ("rate-limited", f"too many failed attempts from {peer} ({len(recent)} in "
                       f"{PEER_FAILURE_WINDOW_S // 60} min); try again in {wait} s")
        if why is not None:
            self._turn_away(conn, peer, *why)
            return
        with self._active_lock:
            self._active[peer] = self._active.get(peer, 0) + 1
        t = threading.Thread(target=self._handle_safely, args=(conn, peer), daemon=True)
        t.start()
        self._threads.append(t)

    def serving(self, peer: str) -> int:
        """How many connections from `peer` are being served now (a handler ends a moment after its last reply)."""
        with self._active_lock:
            return self._active.get(peer, 0)

    def _turn_away(self, conn: socket.socket, peer: str, reason: str, message: str) -> None:
        try:
            conn.settimeout(0.5)
            conn.sendall(json.dumps({"type": "refused", "reason": reason, "message": message}).encode() + b"\n")
        except OSError:
            pass
        finally:
            conn.close()
        now = time.monotonic()
        if now - self._turned_away.get((peer, reason), -1e9) > 60:
            self._turned_away[(peer, reason)] = now
            self.log(f"{peer}: turned away ({reason}): {message} (logged once a minute per address)")
            if len(self._turned_away) > 4096:
                self._turned_away.clear()

    def _handle_safely(self, conn: socket.socket, peer: str) -> None:
        try:
            self.handle(conn, peer)
        except Exception as e:  # one bad connection must not stop the server
            self.log(f"{peer}: enrolment failed: {inputs.printable(e)}")
        finally:
            with self._active_lock:
                self._active[peer] -= 1
                if not self._active[peer]:
                    del self._active[peer]

    def _refuse(self, ch: _Channel, peer: str, name: str | None, reason: str, message: str) -> None:
        counts = reason in CODE_REFUSALS
        self.registry.record_failure(peer, name, reason, counts=counts)
        self.log(f"{peer}: refused {name or '?'}: {inputs.cut(inputs.printable(message), 300)}")
        try:
            ch.send({"type": "refused", "reason": reason, "message": message})
        except OSError:
            pass
        if counts:
            self._total_alarm()

    def _total_alarm(self) -> None:
        """Warn (never revoke) when refusals pile up while codes are open: someone may be guessing."""
        open_codes = self.registry.open_codes()
        if not open_codes:
            return
        n = self.registry.failures_since(min(c.created_at for c in open_codes))
        if n >= TOTAL_FAILURE_LIMIT and n >= 2 * self._alarm_at:
            self._alarm_at = n
            self.log(f"warning: {n} refused enrolment attempts since the oldest open code; the codes stay open (an "
                     "80-bit code is not guessed online); `cloudbox node code --revoke all` closes them")

    def handle(self, conn: socket.socket, peer: str) -> None:
        """One enrolment: hello, challenge, proof, welcome, installed. Every refusal is sent, logged and recorded
        (_refuse); the node is recorded, consuming its code, only after its proof matched an open code."""
        ch = _Channel(conn, self.io_timeout, time.monotonic() + self.deadline, refusals=False)
        name: str | None = None
        try:
            local = inputs.normal_address(conn.getsockname()[0])
            raw = ch.recv("hello")
            seen = {"address": (peer, "the back-end's address"),
                    "front_end_address": (local, "the front-end's address")}
            try:
                hello = checked(Hello, raw, seen)
            except FieldProblem as e:
                name = raw["name"] if "name" in e.valid else None  # the refusal is recorded under a valid name
                raise EnrolRefused(e.reason, str(e)) from None
            name = hello.name
            host_key, client_key = keys.parse_public_key(hello.host_key), keys.parse_public_key(hello.client_key)
            if not self.registry.open_codes():
                raise EnrolRefused("no-open-code", "the front-end has no open join code; make one there with "
                                   "`cloudbox node code`")
            me = self.identity
            challenge = {"type": "challenge", "v": VERSION, "name": me.name, "nonce": secrets.token_hex(32),
                         "host_key": me.host_key.line, "mgmt_key": me.client_key.line, "ssh_port": me.ssh_port,
                         "salt": self.registry.salt, "address": local, "back_end_address": peer}
            ch.send(challenge)
            data = transcript(raw, challenge)
            proof = ch.recv("proof")
            match = self._open_code(_checked(Proof, proof).mac, data)
            proven = self._proven(proof, data, host_key)
            node = self._record(hello, peer, match, (host_key, client_key), proven=proven)
            welcome = {"libvirt_uri": node.libvirt_uri, "address": peer}
            ch.send({"type": "welcome", **welcome, "mac": mac(match.key, "front-end", data, welcome)})
            self.enrolled.append(hello.name)
            self.log(f"{peer}: enrolled node {hello.name} (host key {host_key.fingerprint}"
                     f"{', proven' if proven else ''}) with join code {match.id}")
            self._confirmed(ch, peer, hello.name)
        except EnrolRefused as e:
            self._refuse(ch, peer, name, e.reason, str(e))
        finally:
            ch.close()

    def _open_code(self, got: str, data: bytes) -> JoinCode:
        """The join code whose key made the back-end's proof `got` over the transcript, if it is still open."""
        match = next((c for c in self.registry.codes() if hmac.compare_digest(mac(c.key, "back-end", data), got)),
                     None)
        if match is None:
            raise EnrolRefused("wrong-code", "wrong join code (check it on the front-end: `cloudbox node code --list`)")
        now = time.time()
        status = match.status(now)
        if status != "open":
            when = {"used": match.used_at, "expired": match.expires_at, "revoked": match.revoked_at}[status]
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when or now))
            detail = {"used": f"already used at {stamp} by {match.used_by}; codes are one-time",
                      "expired": f"expired at {stamp}", "revoked": f"revoked at {stamp} ({match.revoked_reason})"}
            raise EnrolRefused(f"code-{status}", f"join code {match.id} {detail[status]}; make a new one on the "
                               "front-end with `cloudbox node code`")
        return match

    @staticmethod
    def _proven(proof: dict[str, Any], data: bytes, host_key: keys.PublicKey) -> bool:
        """Whether the back-end signed the transcript with the host key it offers (optional, but a signature that
        does not verify is refused)."""
        sig = proof.get("host_sig")
        if sig is None:
            return False
        if not isinstance(sig, str) or not keys.verify(data, sig, host_key, HOST_SIG_NAMESPACE):
            raise EnrolRefused("bad-request", "field host_sig: not a signature of this enrolment by the offered "
                               "host_key; allowed: ssh-keygen -Y sign with the host key")
        return True

    def _record(self, hello: Hello, peer: str, match: JoinCode, offered: tuple[keys.PublicKey, keys.PublicKey], *,
                proven: bool) -> NodeRecord:
        """The node in the registry with the host and client keys it offered, consuming the code (refused: a name or
        key taken, the code used meanwhile)."""
        host_key, client_key = offered
        try:
            before = self.registry.node(hello.name).host_key
        except NotFound:
            before = None
        try:
            node = self.registry.enrol(name=hello.name, role=hello.role, address=peer, ssh_port=hello.ssh_port,
                                       host_key=host_key.line, client_key=client_key.line, code_key=match.key,
                                       peer=peer, proven=proven)
        except NodeConflict as e:
            raise EnrolRefused(e.reason, str(e)) from None
        except CloudboxError as e:  # another back-end used the code a moment ago
            raise EnrolRefused("code-used", f"join code {match.id}: {e}") from None
        if before is not None and before != node.host_key:
            # another machine under the name (a reinstall, `--replace`): the old one's volume credentials, which
            # it may still hold, are forgotten; the new machine is given a set of its own
            nodecreds.forget(node.name)
            self.log(f"{peer}: node {node.name} enrolled with a new host key; its old volume credentials are "
                     "forgotten")
        return node

    def _confirmed(self, ch: _Channel, peer: str, name: str) -> None:
        """The back-end's last word: it installed the front-end's key, or failed to; the node's reason says which."""
        try:
            ack = ch.recv("installed", "error")
        except CloudboxError as e:
            self.registry.set_reason(name, f"enrolled, but the back-end did not confirm installing the "
                                     f"front-end's key ({inputs.cut(inputs.printable(e), 300)})")
            return
        if ack["type"] == "error":
            msg = inputs.cut(inputs.printable(ack.get("message", "?")), 300)
            self.registry.set_reason(name, f"enrolled, but the back-end failed to install the front-end's key: "
                                     f"{msg}")
            self.log(f"{peer}: node {name} could not install the front-end's key: {msg}")
        else:
            self.registry.set_reason(name, "enrolled; not checked yet")
            if self.on_enrolled is not None:
                self.on_enrolled(name)


# --------------------------------------------------------------------------------------------------
# Back-end
# --------------------------------------------------------------------------------------------------


@dataclass
class JoinResult:
    frontend_name: str
    frontend_address: str
    frontend_host_key: keys.PublicKey
    libvirt_uri: str
    authorized_keys: Path
    pin_file: Path


def parse_frontend(value: str, default_port: int = PORT) -> tuple[str, int]:
    """'ADDR', 'ADDR:PORT', '[V6]:PORT' or a host name -> (host, port). 'discover' is resolved before this
    (nodes.discover, by the CLI)."""
    v = value.strip()
    if v == "discover":
        raise CloudboxError("--front-end discover: resolve it with cloudbox.core.cluster.discover first")
    if inputs.control_chars(v):
        raise CloudboxError(f"--front-end: {inputs.shown(value)} contains {inputs.control_chars(v)}; allowed: an "
                            "address or host name")
    m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\](?::(\d+))?", v)
    if m:
        host, port = m.group(1), m.group(2)
    elif v.count(":") == 1:
        host, port = v.split(":")
    else:
        host, port = v, None
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,252})", host):
            raise CloudboxError(f"--front-end: {inputs.shown(value)} is not an address; allowed: an IPv4/IPv6 "
                                "address or host name, optionally with :PORT, or \"discover\"") from None
    if port is not None and not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
        raise CloudboxError(f"--front-end: port {inputs.shown(port)} is out of range; allowed: 1..65535")
    return host, int(port) if port else default_port


def pin_paths(state: Path | None = None) -> tuple[Path, Path]:
    d = state or keys.nodes_dir()
    return d / "frontend.json", d / "frontend_known_hosts"


def join(frontend: str, code: str, *, identity: Identity | None = None, role: str = "back-end",
         authorized_keys: Path | None = None, pin_dir: Path | None = None, restrict_from: bool = True,
         timeout: float = IO_TIMEOUT_S, log: Callable[[str], None] = lambda _m: None) -> JoinResult:
    """Enrol this node with the front-end at `frontend` using `code`. On success root's authorized_keys holds the
    front-end's management key and the front-end's host key is pinned; on any refusal nothing is written."""
    normalized = normalize_code(code)  # a typo in the code's format fails here, before any connection
    host, port = parse_frontend(frontend)
    me = identity or local_identity()
    if not re.fullmatch(NODE_NAME_PATTERN, me.name):
        raise CloudboxError(f"--name: {inputs.shown(me.name)} is not a valid node name; allowed: {NODE_NAME_ALLOWED}")
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as e:
        raise CloudboxError(f"cannot reach the front-end's enrolment server at {host}:{port}: {e.strerror or e} "
                            "(it listens only while a join code is open: run `cloudbox node code` there)") from e
    peer = inputs.normal_address(sock.getpeername()[0])
    local = inputs.normal_address(sock.getsockname()[0])
    ch = _Channel(sock, timeout, time.monotonic() + max(timeout, CONNECTION_DEADLINE_S))
    try:
        hello = {"type": "hello", "v": VERSION, "name": me.name, "role": role, "ssh_port": me.ssh_port,
                 "nonce": secrets.token_hex(32), "host_key": me.host_key.line, "client_key": me.client_key.line,
                 "address": local, "front_end_address": peer}
        ch.send(hello)
        challenge = ch.recv("challenge")
        fe = _checked(Challenge, challenge, {"back_end_address": (local, "this back-end's address"),
                                             "address": (peer, "the front-end's address")})
        fe_name, fe_ssh_port = fe.name, fe.ssh_port
        fe_host, fe_mgmt = keys.parse_public_key(fe.host_key), keys.parse_public_key(fe.mgmt_key)
        k = derive_key(normalized, fe.salt)
        data = transcript(hello, challenge)
        proof: dict[str, Any] = {"type": "proof", "mac": mac(k, "back-end", data)}
        if me.host_private_key is not None:
            sig = keys.sign(data, me.host_private_key, HOST_SIG_NAMESPACE)
            if sig is not None:
                proof["host_sig"] = sig
            else:
                log(f"could not sign with {me.host_private_key}: the front-end enrols this node only under a new "
                    "name, or with a code made by `cloudbox node code --replace NAME`")
        ch.send(proof)
        welcome = ch.recv("welcome")
        extra = {"libvirt_uri": welcome.get("libvirt_uri"), "address": welcome.get("address")}
        if not hmac.compare_digest(mac(k, "front-end", data, extra), str(welcome.get("mac", ""))):
            ch.send({"type": "error", "message": "front-end's proof did not verify"})
            raise EnrolRefused("front-end-unproven", f"the server at {host}:{port} did not prove it knows the code: "
                               "it is not the front-end that made it (or the connection was tampered with); "
                               "nothing was installed")
        try:
            ak = keys.install_authorized_key(fe_mgmt, frontend_name=fe_name,
                                             from_address=peer if restrict_from else None, path=authorized_keys)
            pin_json, pin_kh = pin_paths(pin_dir)
            keys.write_file(pin_kh, keys.known_hosts_entry(peer, fe_ssh_port, fe_host) + "\n", 0o644)
            keys.write_file(pin_json, json.dumps({
                "name": fe_name, "address": peer, "ssh_port": fe_ssh_port, "host_key": fe_host.line,
                "host_key_fingerprint": fe_host.fingerprint, "mgmt_key": fe_mgmt.line, "enrolled_at": time.time(),
                "node_name": me.name, "libvirt_uri_on_front_end": extra["libvirt_uri"],
            }, indent=2) + "\n", 0o644)
        except (OSError, CloudboxError) as e:
            ch.send({"type": "error", "message": str(e)})
            raise CloudboxError(f"enrolled, but installing the front-end's key failed: {e}") from e
        ch.send({"type": "installed"})
        log(f"enrolled as {me.name} with front-end {fe_name} ({peer}); its host key {fe_host.fingerprint} is pinned")
        return JoinResult(fe_name, peer, fe_host, str(extra["libvirt_uri"]), ak, pin_json)
    finally:
        ch.close()
