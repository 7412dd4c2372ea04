"""SSH keys for the cluster: this node's host and client keys, key-line checks, fingerprints, and the two files
enrolment writes on a back-end (root's authorized_keys entry for the front-end, the pinned front-end host key).

Keys are made and fingerprinted by OpenSSH's own `ssh-keygen`; nothing here parses key material beyond
splitting an OpenSSH public key line into type and base64 blob.

Paths (environment overrides are for tests and unusual layouts):
  CLOUDBOX_SSH_HOST_KEY     this node's sshd host public key   (default /etc/ssh/ssh_host_ed25519_key.pub)
  CLOUDBOX_AUTHORIZED_KEYS  root's authorized_keys on a back-end (default /root/.ssh/authorized_keys)
  <state dir>/nodes/id_ed25519      this node's client key (the front-end's management key; a back-end's
                                    root client key, recorded by the front-end for later node-to-front-end use)
"""

from __future__ import annotations

import base64
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .. import paths
from ..errors import CloudboxError

KEY_TYPES = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521", "ssh-rsa")
AUTHORIZED_MARK = "cloudbox-front-end"  # the comment that names cloudbox's line in authorized_keys
# libvirt's SSH transport runs `sh -c '... virt-ssh-helper ... || nc ...'` and host-side tests run commands, so
# the key cannot carry a forced command; `restrict` still removes forwarding, agent, X11, pty and ~/.ssh/rc.
AUTHORIZED_OPTIONS = "restrict"


class KeyProblem(CloudboxError):
    """A key file is missing or malformed, or ssh-keygen failed."""


@dataclass(frozen=True)
class PublicKey:
    type: str
    blob: str  # base64

    @property
    def line(self) -> str:
        """'type base64' (no comment): the form compared and stored."""
        return f"{self.type} {self.blob}"

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.line)


def parse_public_key(text: str, *, what: str = "public key") -> PublicKey:
    """An OpenSSH public key line ('type base64 [comment]') -> PublicKey; anything else is a KeyProblem naming
    the field, the value and what is allowed."""
    parts = text.strip().split()
    if len(parts) < 2 or parts[0] not in KEY_TYPES:
        shown = (text.strip()[:40] + "...") if len(text.strip()) > 40 else text.strip()
        raise KeyProblem(f"{what}: not an OpenSSH public key line (got {shown!r}); allowed: "
                        f"'<type> <base64> [comment]' with type one of {', '.join(KEY_TYPES)}")
    try:
        raw = base64.b64decode(parts[1], validate=True)
    except ValueError:
        raise KeyProblem(f"{what}: the key's base64 part does not decode") from None
    # The blob starts with the key type as an SSH string: a line whose type word and blob disagree is forged.
    n = int.from_bytes(raw[:4], "big") if len(raw) >= 4 else -1
    if raw[4:4 + n].decode(errors="replace") != parts[0]:
        raise KeyProblem(f"{what}: the key's type word ({parts[0]}) does not match its encoded type")
    return PublicKey(parts[0], parts[1])


def fingerprint(line: str) -> str:
    """SHA256:... as ssh-keygen -l shows it."""
    import hashlib

    blob = base64.b64decode(line.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def host_key_path() -> Path:
    return Path(os.environ.get("CLOUDBOX_SSH_HOST_KEY", "/etc/ssh/ssh_host_ed25519_key.pub"))


def authorized_keys_path() -> Path:
    return Path(os.environ.get("CLOUDBOX_AUTHORIZED_KEYS", "/root/.ssh/authorized_keys"))


def nodes_dir() -> Path:
    return paths.state_dir() / "nodes"


def client_key_path() -> Path:
    return nodes_dir() / "id_ed25519"


def read_public_key(path: Path, *, what: str) -> PublicKey:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise KeyProblem(f"{what}: {path} does not exist (is openssh-server installed and its host keys made? "
                        "`ssh-keygen -A` makes them)") from None
    except OSError as e:
        raise KeyProblem(f"{what}: cannot read {path}: {e.strerror or e}") from e
    return parse_public_key(text, what=f"{what} ({path})")


def host_key() -> PublicKey:
    return read_public_key(host_key_path(), what="this node's SSH host key")


def generate_key(path: Path, comment: str) -> None:
    """An ed25519 key pair at path / path.pub (no passphrase: it is used unattended), by ssh-keygen."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        out = subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                             capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise KeyProblem("ssh-keygen not found: install openssh-client") from None
    if out.returncode != 0:
        raise KeyProblem(f"ssh-keygen failed making {path}: {out.stderr.strip()}")


def client_key(path: Path | None = None, *, create: bool = True) -> PublicKey:
    """This node's client key (made on first use)."""
    path = path or client_key_path()
    if not path.exists() and create:
        generate_key(path, f"cloudbox@{os.uname().nodename}")
    return read_public_key(path.with_name(path.name + ".pub"), what="this node's cloudbox client key")


def _atomic_write(path: Path, text: str, mode: int = 0o600) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def known_hosts_entry(address: str, port: int, key: PublicKey) -> str:
    host = address if port == 22 else f"[{address}]:{port}"
    return f"{host} {key.line}"


def authorized_line(key: PublicKey, *, frontend_name: str, from_address: str | None) -> str:
    opts = AUTHORIZED_OPTIONS
    if from_address:
        opts += f',from="{from_address}"'
    return f"{opts} {key.line} {AUTHORIZED_MARK} {frontend_name}"


def install_authorized_key(key: PublicKey, *, frontend_name: str, from_address: str | None,
                           path: Path | None = None) -> Path:
    """Put the front-end's management key into root's authorized_keys, replacing an earlier cloudbox line (one
    front-end at a time) and keeping every other line as it was."""
    path = path or authorized_keys_path()
    try:
        old = path.read_text().splitlines()
    except FileNotFoundError:
        old = []
    kept = [ln for ln in old if not re.search(rf"\s{AUTHORIZED_MARK}(\s|$)", ln)]
    kept.append(authorized_line(key, frontend_name=frontend_name, from_address=from_address))
    _atomic_write(path, "\n".join(kept) + "\n", 0o600)
    return path


def write_file(path: Path, text: str, mode: int = 0o600) -> None:
    _atomic_write(path, text, mode)


SIGNATURE_RE = re.compile(r"-----BEGIN SSH SIGNATURE-----\n[A-Za-z0-9+/=\n]{1,4000}-----END SSH SIGNATURE-----\n?")


def host_private_key_path() -> Path:
    """The private half of this node's host key (the .pub path without .pub): what proves the key is ours."""
    pub = host_key_path()
    return pub.with_name(pub.name.removesuffix(".pub"))


def sign(data: bytes, private_key: Path, namespace: str) -> str | None:
    """An SSH signature (ssh-keygen -Y sign) of `data` with `private_key`, or None when the key cannot be read
    (not root, no such file): the caller then proves nothing with it."""
    try:
        out = subprocess.run(["ssh-keygen", "-q", "-Y", "sign", "-f", str(private_key), "-n", namespace], input=data,
                             capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = out.stdout.decode(errors="replace")
    return text if out.returncode == 0 and SIGNATURE_RE.fullmatch(text) else None


def verify(data: bytes, signature: str, key: PublicKey, namespace: str) -> bool:
    """Whether `signature` is `key`'s SSH signature of `data` in `namespace` (ssh-keygen -Y verify)."""
    if not SIGNATURE_RE.fullmatch(signature):
        return False
    with tempfile.TemporaryDirectory(prefix="cloudbox-verify-") as tmp:
        signers, sig = Path(tmp) / "allowed_signers", Path(tmp) / "data.sig"
        signers.write_text(f'node namespaces="{namespace}" {key.line}\n')
        sig.write_text(signature)
        try:
            out = subprocess.run(["ssh-keygen", "-Y", "verify", "-f", str(signers), "-I", "node", "-n", namespace,
                                  "-s", str(sig)], input=data, capture_output=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return False
    return out.returncode == 0
