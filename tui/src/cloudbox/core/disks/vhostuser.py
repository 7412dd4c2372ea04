"""A guest disk served by qemu-storage-daemon as a vhost-user-blk export (disk.backing = vhost-user).

The store under it is what backing.prepare makes for the kind (a pre-allocated file in the run's work directory, or
the device given with --device); `serve()` starts qemu-storage-daemon on it, a child of the run that dies with it
(procs.Child), exporting it over a unix socket beside the store, which the guest's QEMU connects to as its
vhost-user-blk device (core.virt.domain: <disk type='vhostuser'>; the guest's RAM is then shared memory the daemon
maps). The profile's cache and I/O mode become the daemon's block options (`block_options()`), its queues the
export's, its one iothread the daemon's. `problem()` says why this host cannot serve one.
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path

from .. import procs
from ..errors import CloudboxError
from .backing import BackingStore

DAEMON = "qemu-storage-daemon"
SOCKET = "vhost-user-blk.sock"
QEMU_USER = "libvirt-qemu"  # whom libvirt's QEMU runs as (Debian's qemu.conf): the socket is handed to it
START_TIMEOUT_S = 20.0

# disk.cache -> (O_DIRECT on the file, the export's writethrough, flushes ignored): the same three properties
# QEMU's own cache modes set for a disk it opens itself.
CACHE: dict[str, tuple[bool, bool, bool]] = {
    "none": (True, False, False), "writethrough": (False, True, False), "writeback": (False, False, False),
    "directsync": (True, True, False), "unsafe": (False, False, True),
}


def problem() -> str | None:
    """Why this host cannot serve a vhost-user-blk export, or None."""
    if shutil.which(DAEMON) is None:
        return (f"disk.backing = vhost-user is served by {DAEMON}, which is not installed (Debian: package "
                "qemu-system-common, which qemu-system-x86 depends on)")
    return None


def block_options(path: str, is_block: bool, cache: str, io: str) -> list[str]:
    """The daemon's --blockdev arguments for the store at `path`: the protocol node (file or host_device, with
    the cache's O_DIRECT and no-flush and the AIO mode) and the raw format node the export serves."""
    direct, _writethrough, no_flush = CACHE[cache]
    proto = (f"driver={'host_device' if is_block else 'file'},node-name=proto0,filename={path},"
             f"cache.direct={'on' if direct else 'off'},cache.no-flush={'on' if no_flush else 'off'},aio={io}")
    return ["--blockdev", proto, "--blockdev", "driver=raw,node-name=disk0,file=proto0"]


def argv(store: BackingStore, socket: Path, *, cache: str, io: str, queues: int, iothread: bool,
         cpus: str = "") -> list[str]:
    """qemu-storage-daemon's command line serving `store` on `socket`; on host CPUs `cpus` (taskset: every thread
    it makes inherits them) when given."""
    export = (f"type=vhost-user-blk,id=export0,node-name=disk0,addr.type=unix,addr.path={socket},writable=on,"
              f"num-queues={queues},writethrough={'on' if CACHE[cache][1] else 'off'}")
    out = [*(["taskset", "--cpu-list", cpus] if cpus else []), DAEMON,
           *block_options(store.path, store.is_block, cache, io)]
    if iothread:
        out += ["--object", "iothread,id=iothread0"]
        export += ",iothread=iothread0"
    return [*out, "--export", export]


@dataclass
class VhostUserExport(procs.ServedByChild):
    """A running export: its socket and the daemon serving it (None once closed; its pid and io as
    procs.ServedByChild says)."""

    socket: Path
    argv: list[str]
    child: procs.Child | None = field(default=None, repr=False)

    def cpus_allowed(self) -> str:
        """The host CPUs the daemon may run on, as the kernel says (its Cpus_allowed_list); "" once closed."""
        try:
            status = Path(f"/proc/{self.pid}/status").read_text() if self.pid else ""
        except OSError:
            return ""
        return next((line.split(":", 1)[1].strip() for line in status.splitlines()
                     if line.startswith("Cpus_allowed_list:")), "")

    def close(self) -> None:
        """Stop the daemon and remove its socket. Safe to call twice."""
        child, self.child = self.child, None
        if child is not None:
            child.stop()
        self.socket.unlink(missing_ok=True)


def _is_socket(path: Path) -> bool:
    try:
        return stat.S_ISSOCK(path.stat().st_mode)
    except OSError:
        return False


def _hand_to_qemu(path: Path) -> None:
    """The socket made connectable by libvirt's QEMU (it runs as QEMU_USER where that user exists)."""
    try:
        uid, gid = pwd.getpwnam(QEMU_USER).pw_uid, grp.getgrnam(QEMU_USER).gr_gid
    except KeyError:
        return
    os.chown(path, uid, gid)
    os.chmod(path, 0o660)


def serve(store: BackingStore, work_dir: Path, *, cache: str, io: str, queues: int, iothread: bool,
          cpus: str = "") -> VhostUserExport:
    """Start qemu-storage-daemon exporting `store` as vhost-user-blk on a socket in `work_dir` (the store's
    directory, removed with it), on host CPUs `cpus` when given; returns once the socket is up and handed to
    QEMU's user. The store learns the socket (store.vhost_user). Raises CloudboxError (with the daemon's output)
    when it does not come up."""
    why = problem()
    if why:
        raise CloudboxError(why)
    sock = work_dir / SOCKET
    sock.unlink(missing_ok=True)
    cmd = argv(store, sock, cache=cache, io=io, queues=queues, iothread=iothread, cpus=cpus)
    export = VhostUserExport(sock, cmd)
    export.child = procs.Child.start(cmd, log=sock.with_suffix(".log"), ready=lambda _pid: _is_socket(sock),
                                     serving=f"{store.path} as vhost-user-blk", ready_is=f"listen on {sock}",
                                     timeout=START_TIMEOUT_S)
    try:
        _hand_to_qemu(sock)
    except BaseException:
        export.close()
        raise
    store.vhost_user = str(sock)
    store.model = f"{store.model}; served to the guest as vhost-user-blk by {DAEMON}"
    return export
