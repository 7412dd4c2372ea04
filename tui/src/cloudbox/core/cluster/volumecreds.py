"""The front-end's side of a back-end's volume credentials (core.disks.volumes.nodecreds): made once per node and
installed
on it over the pinned SSH, when it enrols (in the background, so enrolment does not wait on it) and again before
each of its volume runs when the node's set is not the front-end's (a node reinstalled, a file removed)."""

from __future__ import annotations

import json
import platform
import threading
from collections.abc import Callable

from ..disks.volumes import nodecreds, pki
from ..errors import CloudboxError
from ..virt import network
from . import client, registry


def server_names() -> tuple[str, ...]:
    """What the front-end's NBD server certificate must name beyond loopback: its private address."""
    addr = network.private_address()
    return () if addr == "0.0.0.0" else (f"IP:{addr}",)


def ensure(shell: client.NodeShell) -> nodecreds.NodeCreds:
    """Node `shell.node`'s set, made when missing and installed on the node unless it holds it already."""
    ca = pki.ensure(server_names())
    c = nodecreds.make(shell.node.name, ca)
    have = shell.run("cloudbox", "node", "local", "volume-creds", input=b"null", timeout=60,
                     what="reading the node's volume credentials")
    if _fingerprint(shell, have) != c.fingerprint:
        got = shell.run("cloudbox", "node", "local", "volume-creds", input=nodecreds.payload(c, platform.node()),
                        timeout=60, what="installing the node's volume credentials")
        if _fingerprint(shell, got) != c.fingerprint:
            raise CloudboxError(f"{shell.where}: the volume credentials installed there do not match the "
                                "front-end's")
    return c


def _fingerprint(shell: client.NodeShell, out: str) -> str:
    try:
        return str(json.loads(out.strip().splitlines()[-1])["fingerprint"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise client.NodeError(f"{shell.where}: volume-creds answered {out.strip()[:200]!r}, not JSON") from None


def install_in_background(name: str, log: Callable[[str], None]) -> threading.Thread:
    """`ensure` for a node that has just enrolled, in a thread of its own; the outcome goes to `log`."""
    def work() -> None:
        try:
            with registry.Registry() as reg:
                shell = client.NodeShell.for_node(reg, reg.node(name))
            c = ensure(shell)
            log(f"node {name}: volume credentials installed (iSCSI initiator {c.chap.initiator}, NVMe host "
                f"{c.nvme.nqn}, an NBD client certificate of this front-end's CA)")
        except CloudboxError as e:
            log(f"node {name}: volume credentials not installed yet ({e}); its first volume run installs them")
    # not a daemon: the enrolment server's process waits for it before it exits
    t = threading.Thread(target=work, name=f"volume-creds-{name}", daemon=False)  # not inherited from the caller
    t.start()
    return t
