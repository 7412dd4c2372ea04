"""Enrolment: a back-end joins the front-end with a one-time join code, and both sides pin each other's keys.

The protocol is JSON lines over one TCP connection (port PORT). The code never crosses the wire: both sides
prove they know it with HMAC-SHA256 keyed by K = scrypt(code, cluster salt) over a transcript of both nonces
and all four public keys (docs/cluster.md has the whole design and the threat model):

    back-end -> hello      {v, name, role, ssh_port, nonce, host_key, client_key}
    front-end -> challenge {v, name, nonce, host_key, mgmt_key, ssh_port, salt}      (or refused)
    back-end -> proof      {mac = HMAC(K, "back-end" || transcript)}
    front-end -> welcome   {mac = HMAC(K, "front-end" || transcript || welcome), libvirt_uri, address}
                                                                                        (or refused)
    back-end -> installed  {} (or error {message}): the front-end's key is in root's authorized_keys

The front-end only answers with its own proof after the back-end's proof matched an open code, and records the
node (consuming the code) in the same transaction. Refusals are a `refused` message {reason, message} the
other side raises as EnrolRefused; the reasons are REASONS.

The server listens only while at least one code is open: `EnrolServer.open()` refuses to bind without one, and
`serve()` closes the socket as soon as none is left (used, expired, revoked).
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
from typing import Any

from ..errors import CloudboxError
from ..nodeconf import NODE_NAME_ALLOWED, NODE_NAME_PATTERN
from . import keys
from .registry import (
    ENROL_ROLES,
    PEER_FAILURE_LIMIT,
    PEER_FAILURE_WINDOW_S,
    TOTAL_FAILURE_LIMIT,
    NodeConflict,
    Registry,
    derive_key,
    normalize_code,
)

PORT = 7413
VERSION = 1
MAX_LINE = 64 * 1024
IO_TIMEOUT_S = 15.0

REASONS = {
    "bad-request": "the message is malformed or a field is invalid",
    "no-open-code": "the front-end has no open join code",
    "wrong-code": "the code does not match any code of this front-end",
    "code-used": "the code was already used (codes are one-time)",
    "code-expired": "the code expired",
    "code-revoked": "the code was revoked",
    "rate-limited": "too many failed attempts",
    "name-taken": "the node name is enrolled with another host key",
    "key-taken": "the host key is enrolled under another name",
    "not-confirmed": "the back-end did not confirm installing the front-end's key",
    "front-end-unproven": "the front-end did not prove it knows the code",
}
CODE_REFUSALS = ("wrong-code", "code-used", "code-expired", "code-revoked")  # these count for the rate limit


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
    def __init__(self, sock: socket.socket, timeout: float = IO_TIMEOUT_S):
        sock.settimeout(timeout)
        self.sock = sock
        self._rfile = sock.makefile("rb")

    def send(self, obj: dict[str, Any]) -> None:
        self.sock.sendall(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode() + b"\n")

    def recv(self, *expected: str) -> dict[str, Any]:
        try:
            line = self._rfile.readline(MAX_LINE + 1)
        except TimeoutError:
            raise EnrolRefused("bad-request", "the other side went silent (timeout)") from None
        except OSError as e:
            raise CloudboxError(f"enrolment connection failed: {e.strerror or e}") from e
        if not line:
            raise CloudboxError("the other side closed the enrolment connection")
        if len(line) > MAX_LINE or not line.endswith(b"\n"):
            raise EnrolRefused("bad-request", f"message longer than {MAX_LINE} bytes")
        try:
            msg = json.loads(line)
        except ValueError:
            raise EnrolRefused("bad-request", "message is not JSON") from None
        if not isinstance(msg, dict):
            raise EnrolRefused("bad-request", "message is not a JSON object")
        kind = msg.get("type")
        if kind == "refused":
            reason = str(msg.get("reason", "?"))
            raise EnrolRefused(reason, f"refused ({reason}): {msg.get('message', REASONS.get(reason, ''))}")
        if kind not in expected:
            raise EnrolRefused("bad-request", f"expected a {' or '.join(expected)} message, got {kind!r}")
        return msg

    def close(self) -> None:
        try:
            self._rfile.close()
        finally:
            self.sock.close()


def _field(msg: dict[str, Any], key: str, pattern: str | None = None, allowed: str = "") -> str:
    v = msg.get(key)
    if not isinstance(v, str) or (pattern is not None and not re.match(pattern, v)):
        raise EnrolRefused("bad-request", f"field {key}: invalid value {v!r}" + (f"; allowed: {allowed}" if allowed
                                                                                   else ""))
    return v


def _port_field(msg: dict[str, Any], key: str) -> int:
    v = msg.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= 65535:
        raise EnrolRefused("bad-request", f"field {key}: invalid value {v!r}; allowed: an integer 1..65535")
    return v


def _key_field(msg: dict[str, Any], key: str) -> keys.PublicKey:
    try:
        return keys.parse_public_key(_field(msg, key), what=f"field {key}")
    except keys.KeyProblem as e:
        raise EnrolRefused("bad-request", str(e)) from None


def transcript(hello: dict[str, Any], challenge: dict[str, Any]) -> bytes:
    """What both MACs cover: every field of hello and challenge that the other side acts on."""
    t = {
        "v": VERSION,
        "back-end": {k: hello[k] for k in ("name", "role", "ssh_port", "nonce", "host_key", "client_key")},
        "front-end": {k: challenge[k] for k in ("name", "nonce", "host_key", "mgmt_key", "ssh_port", "salt")},
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


def local_identity(name: str | None = None, *, client_key_path: Path | None = None, ssh_port: int = 22) -> Identity:
    return Identity(name or socket.gethostname().split(".")[0].lower(), keys.host_key(),
                    keys.client_key(client_key_path), ssh_port)


class EnrolServer:
    """Accepts enrolments while a join code is open. `log` receives one line per event (stdout by default)."""

    def __init__(self, registry: Registry, identity: Identity, *, host: str = "0.0.0.0", port: int = PORT,
                 log: Callable[[str], None] = print, io_timeout: float = IO_TIMEOUT_S):
        self.registry = registry
        self.identity = identity
        self.host, self.port = host, port
        self.log = log
        self.io_timeout = io_timeout
        self.sock: socket.socket | None = None
        self.enrolled: list[str] = []
        self._threads: list[threading.Thread] = []

    def open(self) -> tuple[str, int]:
        """Bind and listen; refuses (NoOpenCode) when no join code is open. Returns the bound address."""
        if not self.registry.open_codes():
            raise NoOpenCode("no open join code: the enrolment server does not listen without one "
                             "(make one with `cloudbox node code`)")
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        s = socket.socket(family, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((self.host, self.port))
        except OSError as e:
            s.close()
            raise CloudboxError(f"enrolment server: cannot listen on {self.host}:{self.port}: "
                                f"{e.strerror or e}") from e
        s.listen(8)
        self.sock = s
        self.host, self.port = s.getsockname()[:2]
        return self.host, self.port

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def serve(self, *, stop: threading.Event | None = None, poll: float = 0.5) -> None:
        """Accept connections until no code is open (or `stop` is set), then stop listening and return once
        the connections in progress are done."""
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
                    conn, peer = sock.accept()
                except TimeoutError:
                    continue
                except OSError:  # closed under us (close() from another thread)
                    break
                t = threading.Thread(target=self._handle_safely, args=(conn, peer[0]), daemon=True)
                t.start()
                self._threads.append(t)
        finally:
            self.close()
            for t in self._threads:
                t.join(self.io_timeout * 3)

    def _handle_safely(self, conn: socket.socket, peer: str) -> None:
        try:
            self.handle(conn, peer)
        except Exception as e:  # one bad connection must not stop the server
            self.log(f"{peer}: enrolment failed: {e}")

    def _refuse(self, ch: _Channel, peer: str, name: str | None, reason: str, message: str) -> None:
        counts = reason in CODE_REFUSALS
        self.registry.record_failure(peer, name, reason, counts=counts)
        self.log(f"{peer}: refused {name or '?'}: {message}")
        try:
            ch.send({"type": "refused", "reason": reason, "message": message})
        except OSError:
            pass
        if counts:
            self._enforce_total_limit()

    def _enforce_total_limit(self) -> None:
        open_codes = self.registry.open_codes()
        if not open_codes:
            return
        since = min(c.created_at for c in open_codes)
        n = self.registry.failures_since(since)
        if n >= TOTAL_FAILURE_LIMIT:
            ids = self.registry.revoke(None, f"revoked after {n} failed enrolment attempts")
            self.log(f"{n} failed enrolment attempts since the oldest open code: revoked codes "
                     f"{', '.join(map(str, ids))}; make a new one with `cloudbox node code`")

    def handle(self, conn: socket.socket, peer: str) -> None:
        ch = _Channel(conn, self.io_timeout)
        name: str | None = None
        try:
            try:
                hello = ch.recv("hello")
                if hello.get("v") != VERSION:
                    raise EnrolRefused("bad-request", f"field v: protocol version {hello.get('v')!r} is not "
                                       f"supported; allowed: {VERSION}")
                name = _field(hello, "name", NODE_NAME_PATTERN, NODE_NAME_ALLOWED)
                role = _field(hello, "role")
                if role not in ENROL_ROLES:
                    raise EnrolRefused("bad-request", f"field role: {role!r} cannot enrol with a front-end; "
                                       f"allowed: {', '.join(ENROL_ROLES)}")
                _port_field(hello, "ssh_port")
                _field(hello, "nonce", r"^[0-9a-f]{64}$", "64 hex digits")
                host_key = _key_field(hello, "host_key")
                client_key = _key_field(hello, "client_key")
            except EnrolRefused as e:
                self._refuse(ch, peer, name, e.reason, str(e))
                return
            recent = self.registry.peer_failures(peer)
            if len(recent) >= PEER_FAILURE_LIMIT:
                wait = int(recent[-PEER_FAILURE_LIMIT] + PEER_FAILURE_WINDOW_S - time.time()) + 1
                self._refuse(ch, peer, name, "rate-limited",
                             f"too many failed attempts from {peer} ({len(recent)} in "
                             f"{PEER_FAILURE_WINDOW_S // 60} min); try again in {wait} s")
                return
            if not self.registry.open_codes():
                self._refuse(ch, peer, name, "no-open-code", "the front-end has no open join code; make one "
                             "there with `cloudbox node code`")
                return
            me = self.identity
            challenge = {"type": "challenge", "v": VERSION, "name": me.name, "nonce": secrets.token_hex(32),
                         "host_key": me.host_key.line, "mgmt_key": me.client_key.line, "ssh_port": me.ssh_port,
                         "salt": self.registry.salt}
            ch.send(challenge)
            proof = ch.recv("proof")
            got = _field(proof, "mac", r"^[0-9a-f]{64}$", "64 hex digits")
            data = transcript(hello, challenge)
            now = time.time()
            match = None
            for code in self.registry.codes():
                if hmac.compare_digest(mac(code.key, "back-end", data), got):
                    match = code
                    break
            if match is None:
                self._refuse(ch, peer, name, "wrong-code", "wrong join code (check it on the front-end: "
                             "`cloudbox node code --list`)")
                return
            status = match.status(now)
            if status != "open":
                when = {"used": match.used_at, "expired": match.expires_at, "revoked": match.revoked_at}[status]
                stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when or now))
                detail = {"used": f"already used at {stamp} by {match.used_by}; codes are one-time",
                          "expired": f"expired at {stamp}", "revoked": f"revoked at {stamp} ({match.revoked_reason})"}
                self._refuse(ch, peer, name, f"code-{status}", f"join code {match.id} {detail[status]}; make a new "
                             "one on the front-end with `cloudbox node code`")
                return
            try:
                node = self.registry.enrol(name=name, role=role, address=peer, ssh_port=hello["ssh_port"],
                                           host_key=host_key.line, client_key=client_key.line, code_key=match.key,
                                           peer=peer)
            except NodeConflict as e:
                self._refuse(ch, peer, name, e.reason, str(e))
                return
            except CloudboxError as e:  # another back-end used the code a moment ago
                self._refuse(ch, peer, name, "code-used", f"join code {match.id}: {e}")
                return
            welcome = {"libvirt_uri": node.libvirt_uri, "address": peer}
            ch.send({"type": "welcome", **welcome, "mac": mac(match.key, "front-end", data, welcome)})
            self.enrolled.append(name)
            self.log(f"{peer}: enrolled node {name} (host key {host_key.fingerprint}) with join code {match.id}")
            try:
                ack = ch.recv("installed", "error")
            except CloudboxError as e:
                self.registry.set_reason(name, f"enrolled, but the back-end did not confirm installing the "
                                         f"front-end's key ({e})")
                return
            if ack["type"] == "error":
                msg = str(ack.get("message", "?"))[:500]
                self.registry.set_reason(name, f"enrolled, but the back-end failed to install the front-end's key: "
                                         f"{msg}")
                self.log(f"{peer}: node {name} could not install the front-end's key: {msg}")
            else:
                self.registry.set_reason(name, "enrolled; not checked yet")
        except EnrolRefused as e:
            self._refuse(ch, peer, name, e.reason, str(e))
        finally:
            ch.close()


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
        raise CloudboxError("--front-end discover: resolve it with cloudbox.core.nodes.discover first")
    m = re.match(r"^\[([0-9A-Fa-f:.]+)\](?::(\d+))?$", v)
    if m:
        host, port = m.group(1), m.group(2)
    elif v.count(":") == 1:
        host, port = v.split(":")
    else:
        host, port = v, None
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not re.match(r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,252})$", host):
            raise CloudboxError(f"--front-end: {value!r} is not an address; allowed: an IPv4/IPv6 address or host "
                                "name, optionally with :PORT, or \"discover\"") from None
    if port is not None and not (port.isdigit() and 1 <= int(port) <= 65535):
        raise CloudboxError(f"--front-end: port {port!r} is out of range; allowed: 1..65535")
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
    if not re.match(NODE_NAME_PATTERN, me.name):
        raise CloudboxError(f"--name: {me.name!r} is not a valid node name; allowed: {NODE_NAME_ALLOWED}")
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as e:
        raise CloudboxError(f"cannot reach the front-end's enrolment server at {host}:{port}: {e.strerror or e} "
                            "(it listens only while a join code is open: run `cloudbox node code` there)") from e
    peer = sock.getpeername()[0]
    ch = _Channel(sock, timeout)
    try:
        hello = {"type": "hello", "v": VERSION, "name": me.name, "role": role, "ssh_port": me.ssh_port,
                 "nonce": secrets.token_hex(32), "host_key": me.host_key.line, "client_key": me.client_key.line}
        ch.send(hello)
        challenge = ch.recv("challenge")
        fe_name = _field(challenge, "name", NODE_NAME_PATTERN, NODE_NAME_ALLOWED)
        _field(challenge, "nonce", r"^[0-9a-f]{64}$", "64 hex digits")
        salt = _field(challenge, "salt", r"^[0-9a-f]{32}$", "32 hex digits")
        fe_host = _key_field(challenge, "host_key")
        fe_mgmt = _key_field(challenge, "mgmt_key")
        fe_ssh_port = _port_field(challenge, "ssh_port")
        k = derive_key(normalized, salt)
        data = transcript(hello, challenge)
        ch.send({"type": "proof", "mac": mac(k, "back-end", data)})
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
