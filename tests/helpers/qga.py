"""A client for the benchmark guest's agent (qemu-ga) on its unix socket, for tests/guest-image.bats.
Standard library only: it runs with Debian's python3.

    qga.py SOCKET sync TIMEOUT            wait until qemu-ga answers guest-sync
    qga.py SOCKET exec TIMEOUT PATH ARG.. run PATH via guest-exec: its stdout/stderr and exit code
    qga.py SOCKET send JSON               send one command, do not wait for an answer (guest-shutdown)
"""

from __future__ import annotations

import base64
import json
import random
import socket
import sys
import time
from typing import Any


class Agent:
    """One connection to qemu-ga; every wait ends at the deadline (exit "qga: timed out")."""

    def __init__(self, path: str, timeout: float) -> None:
        self.deadline = time.monotonic() + timeout
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.buf = b""

    def left(self) -> float:
        t = self.deadline - time.monotonic()
        if t <= 0:
            sys.exit("qga: timed out")
        return t

    def send(self, obj: dict[str, Any]) -> None:
        self.sock.sendall(json.dumps(obj).encode() + b"\n")

    def reply(self) -> Any:
        while True:
            while b"\n" in self.buf:
                line, self.buf = self.buf.split(b"\n", 1)
                # a reply may follow 0xff (guest-sync-delimited's sentinel) or blanks
                line = line.strip(b"\xff \r\t")
                if not line:
                    continue
                try:
                    return json.loads(line)
                except ValueError:
                    continue
            self.sock.settimeout(self.left())
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                sys.exit("qga: timed out")
            if not data:
                sys.exit("qga: agent socket closed")
            self.buf += data

    def call(self, execute: str, **arguments: Any) -> Any:
        msg: dict[str, Any] = {"execute": execute}
        if arguments:
            msg["arguments"] = arguments
        self.send(msg)
        r = self.reply()
        if "error" in r:
            sys.exit(f"qga: {execute}: {r['error']}")
        return r["return"]

    def sync(self) -> None:
        """guest-sync with a random id: replies to earlier, abandoned commands are skipped."""
        tag = random.randrange(1, 2**31)
        self.send({"execute": "guest-sync", "arguments": {"id": tag}})
        while self.reply().get("return") != tag:
            pass


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    path, cmd = argv[0], argv[1]
    agent = Agent(path, float(argv[2]) if cmd in ("sync", "exec") else 10)
    if cmd == "sync":
        agent.sync()
    elif cmd == "exec":
        agent.sync()
        pid = agent.call("guest-exec", path=argv[3], arg=argv[4:], **{"capture-output": True})["pid"]
        while True:
            st = agent.call("guest-exec-status", pid=pid)
            if st.get("exited"):
                break
            agent.left()
            time.sleep(0.1)
        sys.stdout.buffer.write(base64.b64decode(st.get("out-data", "")))
        sys.stderr.buffer.write(base64.b64decode(st.get("err-data", "")))
        return int(st.get("exitcode", 128 + st.get("signal", 0)))
    elif cmd == "send":
        agent.sync()
        agent.send(json.loads(argv[2]))
        time.sleep(0.5)
    else:
        sys.exit(f"qga: unknown command {cmd}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
