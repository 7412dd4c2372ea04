"""This box's x509 credentials for NBD with TLS: its own CA, a server certificate for the volume server (qemu-nbd)
and a client certificate for the initiators it runs (QEMU under libvirt, fio's nbd engine), all made by cloudbox on
first use with openssl (ECDSA P-256) and kept in `<state dir>/pki/nbd`. The server requires a client certificate
signed by this CA (verify-peer) and, of those, the one certificate the run is for (its subject, `identity`: this
box's own, or one node's), so a node's certificate opens no other node's volume and none of this box's own; there
is no password anywhere.

The initiators read their credentials from fixed places: libvirt hands QEMU the directory named by qemu.conf's
`nbd_tls_x509_cert_dir` (else /etc/pki/libvirt-nbd when it exists, else `default_tls_x509_cert_dir`, else
/etc/pki/qemu), and libnbd run as root reads /etc/pki/libnbd. `install_client()` writes the client's three files
there, marked as cloudbox's; a directory holding someone else's CA is refused, never overwritten.

The other schemes' credentials (iSCSI CHAP, the NVMe host identity, a node's ids) are JSON files written here the
same private way (`write_private_json`).
"""

from __future__ import annotations

import grp
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ... import paths
from ...errors import CloudboxError
from ...spec.addresses import HOST_IP

MARKER = ".cloudbox-nbd"  # in an initiator's directory: cloudbox wrote it (holds the CA's fingerprint)
QEMU_CONF = Path("/etc/libvirt/qemu.conf")
LIBNBD_DIR = Path("/etc/pki/libnbd")
# QEMU reaches the server on the host itself; a benchmark guest reaches it on the bridge, checking that address.
SERVER_NAMES = ("IP:127.0.0.1", "DNS:localhost", f"IP:{HOST_IP}")
_DAYS = "3650"


@dataclass(frozen=True)
class Credentials:
    base: Path  # <state dir>/pki/nbd: ca-key.pem (never leaves it), ca-cert.pem
    server_dir: Path  # ca-cert.pem, server-cert.pem, server-key.pem (qemu-nbd's tls-creds-x509 dir)
    client_dir: Path  # ca-cert.pem, client-cert.pem, client-key.pem
    fingerprint: str  # the CA's SHA-256 fingerprint


def pki_dir() -> Path:
    return paths.state_dir() / "pki" / "nbd"


def _openssl(*args: str, cwd: Path) -> str:
    r = subprocess.run(["openssl", *args], capture_output=True, text=True, cwd=cwd)
    if r.returncode != 0:
        raise CloudboxError(f"openssl {args[0]} failed while making the box's NBD credentials: "
                            f"{(r.stderr or r.stdout).strip()[-300:]}")
    return r.stdout


CLIENT_EXTENSIONS = "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n"


def _issue(base: Path, out: Path, role: str, extensions: str, cn: str = "") -> None:
    key, csr, cert, ext = out / f"{role}-key.pem", base / f"{role}.csr", out / f"{role}-cert.pem", base / f"{role}.ext"
    _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", str(key),
             "-out", str(csr), "-subj", f"/O=cloudbox/CN={cn or f'cloudbox NBD {role}'}", cwd=base)
    ext.write_text(extensions)
    _openssl("x509", "-req", "-in", str(csr), "-CA", "ca-cert.pem", "-CAkey", "ca-key.pem", "-CAcreateserial",
             "-days", _DAYS, "-sha256", "-out", str(cert), "-extfile", str(ext), cwd=base)
    csr.unlink()
    ext.unlink()
    os.chmod(key, 0o600)
    shutil.copyfile(base / "ca-cert.pem", out / "ca-cert.pem")


def server_names(cert: Path) -> set[str]:
    """The subjectAltName entries of a certificate, as "IP:…" and "DNS:…"."""
    out = _openssl("x509", "-in", str(cert), "-noout", "-ext", "subjectAltName", cwd=cert.parent)
    return {n.strip().replace("IP Address:", "IP:") for line in out.splitlines()[1:] for n in line.split(",")
            if n.strip()}


def identity(cert: Path) -> str:
    """A client certificate's subject as qemu-nbd's TLS authorisation sees it (GnuTLS: the names in the
    certificate's order, comma-separated), e.g. "O=cloudbox,CN=cloudbox NBD client be1-3f9a2c"."""
    out = _openssl("x509", "-in", str(cert), "-noout", "-subject", "-nameopt", "esc_2253,utf8,sep_comma_plus",
                   cwd=cert.parent)
    return out.strip().removeprefix("subject=").strip()


def _server(base: Path, out: Path, names: tuple[str, ...] = SERVER_NAMES) -> None:
    common = "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
    _issue(base, out, "server", common + "extendedKeyUsage=serverAuth\nsubjectAltName=" + ",".join(names) + "\n")


def ensure(also: tuple[str, ...] = ()) -> Credentials:
    """The box's credentials, made now if they are not there yet (an incomplete set is made again whole); a server
    certificate that does not name every address in SERVER_NAMES and `also` (a front-end's private address, "IP:...")
    is issued again by the same CA, so the clients' credentials stay valid."""
    base = pki_dir()
    server, client = base / "server", base / "client"
    want = [base / "ca-cert.pem", base / "ca-key.pem", server / "server-cert.pem", server / "server-key.pem",
            client / "client-cert.pem", client / "client-key.pem"]
    names = tuple(dict.fromkeys((*SERVER_NAMES, *also)))
    if all(p.exists() for p in want) and not set(names) <= server_names(server / "server-cert.pem"):
        tmp = Path(tempfile.mkdtemp(prefix=".server-", dir=base))
        try:
            _server(base, tmp, tuple(sorted(set(names) | server_names(server / "server-cert.pem"))))
            for name in ("server-cert.pem", "server-key.pem"):
                (tmp / name).replace(server / name)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    if not all(p.exists() for p in want):
        if shutil.which("openssl") is None:
            raise CloudboxError("openssl is not installed: run 'make deps' (scripts/install-deps)")
        base.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".nbd-", dir=base.parent))
        try:
            (tmp / "server").mkdir()
            (tmp / "client").mkdir()
            _openssl("req", "-x509", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                     "-keyout", "ca-key.pem", "-out", "ca-cert.pem", "-days", _DAYS, "-sha256",
                     "-subj", "/O=cloudbox/CN=cloudbox NBD CA", "-addext", "basicConstraints=critical,CA:TRUE",
                     "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=tmp)
            os.chmod(tmp / "ca-key.pem", 0o600)
            _server(tmp, tmp / "server", names)
            _issue(tmp, tmp / "client", "client", CLIENT_EXTENSIONS)
            shutil.rmtree(base, ignore_errors=True)
            tmp.rename(base)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    fp = _openssl("x509", "-in", "ca-cert.pem", "-noout", "-fingerprint", "-sha256", cwd=base)
    return Credentials(base, server, client, fp.strip().split("=", 1)[-1])


def issue_client(creds: Credentials, out: Path, cn: str) -> None:
    """A client certificate of this box's CA named `cn` (a back-end's), with its key and the CA, into `out` (made
    0700; the key 0600)."""
    out.mkdir(mode=0o700, parents=True, exist_ok=True)
    _issue(creds.base, out, "client", CLIENT_EXTENSIONS, cn)


def _conf_value(text: str, key: str) -> str | None:
    m = re.search(rf'^\s*{key}\s*=\s*"([^"]*)"', text, re.M)
    return m[1] if m else None


def libvirt_nbd_dir(conf: Path = QEMU_CONF) -> Path:
    """The directory libvirt hands QEMU for an NBD disk with tls='yes' (qemu.conf's rule, see the module's doc)."""
    try:
        text = conf.read_text()
    except OSError:
        text = ""
    own = _conf_value(text, "nbd_tls_x509_cert_dir")
    if own:
        return Path(own)
    if Path("/etc/pki/libvirt-nbd").exists():
        return Path("/etc/pki/libvirt-nbd")
    return Path(_conf_value(text, "default_tls_x509_cert_dir") or "/etc/pki/qemu")


def qemu_group(conf: Path = QEMU_CONF) -> int | None:
    """The group QEMU runs as under libvirt (qemu.conf's `group`, else libvirt-qemu), None if there is none."""
    try:
        name = _conf_value(conf.read_text(), "group") or "libvirt-qemu"
    except OSError:
        name = "libvirt-qemu"
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        return None


def install_client(creds: Credentials, target: Path, *, group: int | None = None) -> None:
    """The box's client credentials into an initiator's directory `target` (made when missing), readable by root and
    `group` only. Refused when `target` holds a CA that cloudbox did not put there."""
    marker = target / MARKER
    if (target / "ca-cert.pem").exists() and not marker.exists():
        raise CloudboxError(
            f"{target} holds TLS credentials cloudbox did not make; NBD volumes need it for this box's client "
            f"certificate. Point qemu.conf's nbd_tls_x509_cert_dir at a directory of its own (libvirtd restarted), "
            f"or move those files away")
    if marker.exists() and marker.read_text().strip() == creds.fingerprint:
        return
    target.mkdir(parents=True, exist_ok=True)
    os.chmod(target, 0o750)
    gid = -1 if group is None else group
    os.chown(target, 0, gid)
    for name in ("ca-cert.pem", "client-cert.pem", "client-key.pem"):
        dst = target / name
        tmp = target / f".{name}.new"
        shutil.copyfile(creds.client_dir / name, tmp)
        os.chmod(tmp, 0o640 if name == "client-key.pem" else 0o644)
        os.chown(tmp, 0, gid)
        tmp.replace(dst)
    marker.write_text(creds.fingerprint + "\n")


def write_private_json(f: Path, data: dict[str, str]) -> None:
    """`data` into `f` atomically, 0600 in a 0700 directory."""
    f.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(f.parent, 0o700)
    fd, tmp = tempfile.mkstemp(prefix=".new-", dir=f.parent)
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(data, out)
        os.chmod(tmp, 0o600)
        os.replace(tmp, f)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
