"""A back-end's credentials for the front-end's network volumes: its own iSCSI initiator name and CHAP secret, its
own NVMe host NQN and DH-HMAC-CHAP key, and a client certificate of the front-end's NBD CA (with that CA, which the
back-end pins). The front-end makes one set per node (`make`, kept in `<state>/nodes/volumes/<node>`, 0700) when the
node enrols or before its first volume run, and installs it on the node over the pinned SSH (`payload` -> the node's
`cloudbox node local volume-creds` -> `install`, into `<state>/pki/front-end`, 0700). Nothing is shared between
nodes, and no password is fixed: a node removed and enrolled again gets new ones.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ... import paths
from ...errors import CloudboxError
from . import hostattach, iscsi, pki

NBD_FILES = ("ca-cert.pem", "client-cert.pem", "client-key.pem")


@dataclass(frozen=True)
class NodeCreds:
    """One node's identity towards the front-end's volume servers."""

    node: str
    chap: iscsi.Chap
    nvme: hostattach.NvmeHost
    nbd_dir: Path  # ca-cert.pem (the front-end's CA), client-cert.pem, client-key.pem

    @property
    def fingerprint(self) -> str:
        """A digest of the whole set: the node holds this set exactly when its digest matches."""
        h = hashlib.sha256()
        for part in (self.chap.initiator, self.chap.user, self.chap.secret, self.nvme.nqn, self.nvme.hostid,
                     self.nvme.key):
            h.update(part.encode() + b"\0")
        for part in (self.chap.target_user, self.chap.target_secret, self.nvme.ctrl_key):  # a set made before
            if part:  # targets answered with secrets of their own has none: its digest is as it was
                h.update(part.encode() + b"\0")
        for name in NBD_FILES:
            h.update((self.nbd_dir / name).read_bytes())
        return h.hexdigest()


def front_end_dir(node: str) -> Path:
    """On the front-end: where node `node`'s set is kept."""
    return paths.state_dir() / "nodes" / "volumes" / node


def on_node_dir() -> Path:
    """On a back-end: where the set the front-end installed is kept."""
    return paths.state_dir() / "pki" / "front-end"


def _load(base: Path, node: str) -> NodeCreds:
    try:
        data = json.loads((base / "ids.json").read_text())
        c = data["chap"]
        chap = iscsi.Chap(str(c["initiator"]), str(c["user"]), str(c["secret"]), str(c.get("target_user", "")),
                          str(c.get("target_secret", "")))
        nvme = hostattach.read_nvme_ids(data["nvme"])
        for name in NBD_FILES:
            if not (base / "nbd" / name).is_file():
                raise KeyError(f"nbd/{name}")
        return NodeCreds(str(data.get("node", node)), chap, nvme, base / "nbd")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CloudboxError(f"{base}: the volume credentials of {node or 'this node'} cannot be read ({e})") from None


def make(node: str, ca: pki.Credentials, base: Path | None = None) -> NodeCreds:
    """Node `node`'s set, made now when it is not there (random names and secrets; the NBD client certificate issued
    by `ca`, its name carrying the set's random tag, so the certificate of a set forgotten is never authorised
    again), else the one kept; a set kept from before the targets had secrets of their own gets them (and so a new
    fingerprint: the next volume run installs it on the node)."""
    base = base or front_end_dir(node)
    if (base / "ids.json").exists():
        c = _load(base, node)
        if not (c.chap.mutual and c.nvme.ctrl_key):
            c = NodeCreds(c.node, iscsi.Chap(c.chap.initiator, c.chap.user, c.chap.secret,
                                             **iscsi.target_account(c.chap.user.removeprefix("cloudbox-"))),
                          hostattach.NvmeHost(c.nvme.nqn, c.nvme.hostid, c.nvme.key, hostattach.dhchap_secret()),
                          c.nbd_dir)
            pki.write_private_json(base / "ids.json", _ids(node, c.chap, c.nvme))
        return c
    tag = f"{node}-{secrets.token_hex(3)}"
    tmp = base.with_name(f".{base.name}.new")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(mode=0o700, parents=True)
    try:
        chap = iscsi.Chap(f"{iscsi.IQN_PREFIX}:node-{tag}", f"cloudbox-{tag}", secrets.token_hex(16),
                          **iscsi.target_account(tag))
        nvme = hostattach.new_nvme_host(f"node-{tag}")
        pki.issue_client(ca, tmp / "nbd", f"cloudbox NBD client {tag}")
        pki.write_private_json(tmp / "ids.json", _ids(node, chap, nvme))
        os.chmod(base.parent, 0o700)
        tmp.rename(base)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return _load(base, node)


def _ids(node: str, chap: iscsi.Chap, nvme: hostattach.NvmeHost) -> dict[str, Any]:
    return {"node": node, "chap": {"initiator": chap.initiator, "user": chap.user, "secret": chap.secret,
                                   "target_user": chap.target_user, "target_secret": chap.target_secret},
            "nvme": hostattach.nvme_ids(nvme)}


def forget(node: str) -> None:
    """The front-end's copy of a node's set, when the node is removed or enrolls again with another host key: the
    next set is made afresh (new secrets, a client certificate with a new name), and every server the front-end
    starts for the node from then on refuses the old one."""
    shutil.rmtree(front_end_dir(node), ignore_errors=True)


def payload(c: NodeCreds, front_end: str) -> bytes:
    """The set as the node's `cloudbox node local volume-creds` reads it on its standard input (never argv)."""
    data: dict[str, Any] = _ids(c.node, c.chap, c.nvme)
    data["front_end"] = front_end
    data["nbd"] = {name: (c.nbd_dir / name).read_text() for name in NBD_FILES}
    data["fingerprint"] = c.fingerprint
    return json.dumps(data).encode()


def install(data: dict[str, Any], base: Path | None = None) -> NodeCreds:
    """On the node: the set the front-end sent, into `base` (replacing the last one whole); checked against the
    fingerprint it came with."""
    base = base or on_node_dir()
    tmp = base.with_name(f".{base.name}.new")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        (tmp / "nbd").mkdir(mode=0o700, parents=True)
        os.chmod(tmp, 0o700)
        nbd = data["nbd"]
        for name in NBD_FILES:
            f = tmp / "nbd" / name
            fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if name.endswith("key.pem") else 0o644)
            with os.fdopen(fd, "w") as out:
                out.write(str(nbd[name]))
        pki.write_private_json(tmp / "ids.json", {"node": str(data["node"]), "chap": data["chap"],
                                                         "nvme": data["nvme"], "front_end": str(data["front_end"])})
        got = _load(tmp, str(data["node"]))
        if got.fingerprint != data.get("fingerprint"):
            raise CloudboxError("the volume credentials arrived changed (their fingerprint does not match)")
        base.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        shutil.rmtree(base, ignore_errors=True)
        tmp.rename(base)
    except (KeyError, TypeError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CloudboxError(f"the front-end's volume credentials are incomplete (no {e})") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return _load(base, str(data["node"]))


def on_node() -> NodeCreds:
    """On a back-end: the set its front-end installed; an error saying how to get one when there is none."""
    base = on_node_dir()
    if not (base / "ids.json").exists():
        raise CloudboxError(f"this node has no credentials for its front-end's volumes ({base}); the front-end "
                            "installs them at enrolment and before each volume run: run the volume run from the "
                            "front-end again, or enrol this node again (cloudbox node join)")
    return _load(base, "")


def installed_fingerprint(base: Path | None = None) -> str:
    """The node's installed set's fingerprint, '' when it has none (what the front-end compares before pushing)."""
    try:
        return _load(base or on_node_dir(), "").fingerprint
    except CloudboxError:
        return ""
