"""The QEMU guest agent's protocol spoken directly over a stream socket, for hypervisors whose libvirt driver has no
agent command (libvirt's libxl driver: the agent's channel is a Xen PV console that libxl's QEMU backend in dom0
serves as a unix socket, <channel type='unix'> in the domain XML).

The agent reads JSON commands and answers each with one JSON object and a newline. A serial line keeps whatever an
earlier client left half-written, so every connection first sends 0xFF (the agent drops its parser's state) and
`guest-sync-delimited` with a fresh id: the agent answers with 0xFF and then the id, and everything before that
0xFF is stale. `AgentSocket` does that on every (re)connect; `frame()`, `split_sync()` and `parse_reply()` are the
pure parts.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import time

SYNC_BYTE = b"\xff"
MAX_REPLY_BYTES = 64 * 1024 * 1024  # guest-exec-status carries the program's output, base64


class AgentError(Exception):
    """The agent answered with an error object ({"error": {"class", "desc"}})."""


class AgentSilent(Exception):
    """No answer in time, or the channel is not there or closed (guest not up yet, or gone)."""


def frame(command: str, arguments: dict | None = None) -> bytes:
    """One command as the agent reads it."""
    req: dict[str, object] = {"execute": command}
    if arguments is not None:
        req["arguments"] = arguments
    return json.dumps(req, separators=(",", ":")).encode() + b"\n"


def split_sync(buf: bytes, sync_id: int) -> tuple[bool, bytes]:
    """Whether `buf` holds the agent's answer to guest-sync-delimited `sync_id` (0xFF, then {"return": id}), and
    what follows that answer. Stale answers (older ids, an earlier client's leftovers) before it are skipped."""
    while True:
        at = buf.find(SYNC_BYTE)
        if at < 0:
            return False, b""
        buf = buf[at + 1:]
        nl = buf.find(b"\n")
        if nl < 0:
            return False, b""
        try:
            reply = json.loads(buf[:nl].strip(SYNC_BYTE) or b"null")
        except ValueError:
            reply = None
        if isinstance(reply, dict) and reply.get("return") == sync_id:
            return True, buf[nl + 1:]
        buf = buf[nl + 1:]


def parse_reply(buf: bytes) -> tuple[object, bytes] | None:
    """The first complete reply in `buf` and the bytes after it; None while it is incomplete. Raises AgentError for
    an error reply; blank lines and stray 0xFF bytes are skipped."""
    while True:
        buf = buf.lstrip(b" \r\n\t" + SYNC_BYTE)
        nl = buf.find(b"\n")
        if nl < 0:
            return None
        line, rest = buf[:nl], buf[nl + 1:]
        try:
            reply = json.loads(line)
        except ValueError:
            buf = rest  # a line of noise (an agent restarting), not ours
            continue
        if not isinstance(reply, dict):
            buf = rest
            continue
        if "error" in reply:
            err = reply["error"] if isinstance(reply["error"], dict) else {}
            raise AgentError(f"{err.get('class', 'error')}: {err.get('desc', reply['error'])}")
        if "return" in reply:
            return reply["return"], rest
        buf = rest


class AgentSocket:
    """One guest's agent on a unix stream socket (the path libvirt gave the channel), connected on demand."""

    _ids = itertools.count(int.from_bytes(os.urandom(3), "big"))

    def __init__(self, path: str) -> None:
        self.path = path
        self._sock: socket.socket | None = None
        self._buf = b""

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._sock = None
        self._buf = b""

    def _recv(self, deadline: float) -> None:
        assert self._sock is not None
        left = deadline - time.monotonic()
        if left <= 0:
            raise AgentSilent("no answer in time")
        self._sock.settimeout(left)
        try:
            data = self._sock.recv(65536)
        except TimeoutError as e:
            raise AgentSilent("no answer in time") from e
        except OSError as e:
            raise AgentSilent(f"channel read failed: {e}") from e
        if not data:
            raise AgentSilent("channel closed")
        self._buf += data
        if len(self._buf) > MAX_REPLY_BYTES:
            raise AgentSilent(f"answer larger than {MAX_REPLY_BYTES} bytes")

    def _send(self, data: bytes) -> None:
        assert self._sock is not None
        try:
            self._sock.sendall(data)
        except OSError as e:
            raise AgentSilent(f"channel write failed: {e}") from e

    def _connect(self, deadline: float) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            sock.connect(self.path)
        except OSError as e:
            sock.close()
            raise AgentSilent(f"cannot connect to {self.path}: {e}") from e
        self._sock, self._buf = sock, b""
        sync_id = next(self._ids) & 0x7FFFFFFF
        self._send(SYNC_BYTE + frame("guest-sync-delimited", {"id": sync_id}))
        while True:
            synced, rest = split_sync(self._buf, sync_id)
            if synced:
                self._buf = rest
                return
            self._recv(deadline)

    def command(self, command: str, arguments: dict | None = None, timeout: float = 10.0) -> object:
        """Send one command and return its "return" value. AgentSilent when the agent does not answer within
        `timeout` (the connection is dropped: the next command syncs afresh), AgentError when it refuses."""
        deadline = time.monotonic() + timeout
        try:
            if self._sock is None:
                self._connect(deadline)
            self._send(frame(command, arguments))
            while True:
                got = parse_reply(self._buf)
                if got is not None:
                    value, self._buf = got
                    return value
                self._recv(deadline)
        except AgentSilent:
            self.close()
            raise
        except AgentError:
            self._buf = b""
            raise
