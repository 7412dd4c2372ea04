"""One NBD export of a volume with TLS: qemu-nbd as a child of the run's process, killed with it.

qemu-nbd serves the volume's file (raw, O_DIRECT: the server's page cache is not part of the volume) on one TCP
address to the one client the run is for: a certificate of this box's CA (tls-creds-x509 with verify-peer) whose
subject is that client's (authz-simple, --tls-authz: another node's certificate, or one of a set forgotten, is
refused after the handshake). It dies with the
process that started it (PR_SET_PDEATHSIG), so an executor killed outright leaves no export behind; `stop()` ends it
in the ordinary case, Ctrl-C and failures included.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from ... import procs
from ...errors import CloudboxError
from ...procs import free_port, listens

START_TIMEOUT = 30.0  # a server on an emulated, busy host can take its time to start


def _version() -> str:
    r = subprocess.run(["qemu-nbd", "--version"], capture_output=True, text=True)
    return (r.stdout.splitlines() or ["qemu-nbd"])[0].strip()


@dataclass
class NbdExport(procs.ServedByChild):
    """A running export: nbds://host:port/name."""

    name: str
    path: str
    host: str
    port: int
    server: str  # "qemu-nbd 7.2.x ..." as it names itself
    child: procs.Child | None = field(default=None, repr=False)

    @property
    def uri(self) -> str:
        return f"nbds://{self.host}:{self.port}/{self.name}"


def start(name: str, path: str, server_creds: Path, *, client: str, log: Path, host: str = "127.0.0.1",
          port: int | None = None) -> NbdExport:
    """Export `path` as `name` on host:port (a free port when None) with TLS from `server_creds`, to the client
    certificate whose subject is `client` only (pki.identity); returns once the server accepts connections. On
    failure nothing runs and the error names what qemu-nbd said."""
    if shutil.which("qemu-nbd") is None:
        raise CloudboxError("qemu-nbd is not installed (package qemu-utils): run 'make deps' (scripts/install-deps)")
    if not client or any(c in client for c in "\n\0"):
        raise CloudboxError(f"volume {name}: the client identity {client!r} cannot be authorised (an x509 subject)")
    port = port or free_port(host)
    version = _version()
    cmd = ["qemu-nbd", "--format=raw", "--cache=none", "--aio=threads", "--persistent", "--shared=16",
           f"--export-name={name}", f"--bind={host}", f"--port={port}",
           "--object", f"tls-creds-x509,id=tls0,dir={server_creds},endpoint=server,verify-peer=on",
           # QEMU's option syntax doubles a comma inside a value
           "--object", f"authz-simple,id=authz0,identity={client.replace(',', ',,')}",
           "--tls-creds=tls0", "--tls-authz=authz0", path]
    child = procs.Child.start(cmd, log=log, ready=lambda pid: listens(pid, port), serving=f"volume {name}",
                              ready_is=f"listen on {host}:{port}", timeout=START_TIMEOUT)
    return NbdExport(name, path, host, port, version, child=child)


GUEST_CREDS = "/run/cloudbox-nbd"  # in the guest: the client's certificate, handed over by the agent (tmpfs)


def attach_in_guest(guest, exp: NbdExport, client_dir: Path, *, device: str = "/dev/nbd0") -> str:
    """In the benchmark guest (its NIC already has its address): the client's certificate, key and this box's CA
    written by the agent into GUEST_CREDS (0700, the key 0600), the `nbd` driver loaded and nbd-client connected to
    the export with TLS, checking that the server's certificate names the address it connects to; returns the
    device."""
    if not guest.has("nbd-client"):
        raise CloudboxError("the guest has no nbd-client: rebuild the benchmark guest image (make guest-image)")
    guest.run(["mkdir", "-p", "-m", "0700", GUEST_CREDS], timeout=30, check=True)
    for name, mode in (("ca-cert.pem", 0o644), ("client-cert.pem", 0o644), ("client-key.pem", 0o600)):
        guest.put_file(f"{GUEST_CREDS}/{name}", (client_dir / name).read_bytes(), mode)
    script = (f"modprobe nbd nbds_max=1 && nbd-client {exp.host} {exp.port} {device} -name {exp.name} "
              f"-cacertfile {GUEST_CREDS}/ca-cert.pem -certfile {GUEST_CREDS}/client-cert.pem "
              f"-keyfile {GUEST_CREDS}/client-key.pem -tlshostname {exp.host} -nonetlink -block-size 4096 "
              f"</dev/null >{GUEST_CREDS}/nbd-client.log 2>&1; rc=$?; cat {GUEST_CREDS}/nbd-client.log; exit $rc")
    p = guest.sh(script, timeout=120)
    if p.exitcode != 0:
        raise CloudboxError(f"nbd-client in the guest could not attach {exp.uri} (exit {p.exitcode}): "
                            f"{(p.stdout + p.stderr).strip()[-300:]}")
    size = guest.sh(f"cat /sys/block/{device.rsplit('/', 1)[1]}/size", timeout=30).stdout.strip()
    if not size.isdigit() or int(size) == 0:
        raise CloudboxError(f"nbd-client attached {exp.uri}, but {device} has no size in the guest ({size!r})")
    return device
