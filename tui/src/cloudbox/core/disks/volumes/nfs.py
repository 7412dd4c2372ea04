"""One NFSv4 export of a directory for one run: nfs-ganesha (user space, its VFS back-end) as a child of the run's
process, and the guest's kernel client mounting it with the profile's [nfs] options.

The kernels here have no nfsd, and a lab's box need not load one: ganesha serves NFSv4.0-4.2 over TCP from user
space. Each export runs its own ganesha: one address (the host's on the guest's bridge) and a free port, read and
write for the run's guests' addresses only (every other client is refused), the guest's root not squashed (it
writes the test files as root). Another host's baseline mounts it nosuid, nodev, noexec, and every file the host's
tools write on it is made and held open by cloudbox (core.disks.claims), so a client cannot swap it for a link or a
device. No rpcbind, mountd, NLM or UDP: NFSv4 needs none of them. Ganesha's VFS back-end writes what the client
sends as it asks: a stable WRITE (mount -o sync) reaches the disk before the reply, an unstable one (async) waits
in the server's page cache for the client's COMMIT. Linux's nfsd can also lie about stability (its
`async` export option); ganesha cannot, so a profile's nfs.writes is the client's choice.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import platform
import re
import shlex
import shutil
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ... import ledger, procs
from ...errors import CloudboxError, GuestError, GuestTimeout
from ...procs import free_port, listens
from ...spec.knobs import Nfs
from .. import mounts

START_TIMEOUT = 20.0  # ganesha reads its configuration, loads the VFS back-end, then listens
PSEUDO_ROOT = "/cloudbox"  # the exports' place in the server's NFSv4 pseudo file system
MOUNT_POINT = "/mnt/nfs"  # in the guest
TEST_FILE = "cloudbox.dat"  # the guest's tests run on this file in the export (guest k of several: cloudbox-gK.dat)
VFS_FSAL = [Path("/usr/lib/x86_64-linux-gnu/ganesha/libfsalvfs.so"), Path("/usr/lib/ganesha/libfsalvfs.so")]
GUEST_MOUNT_TIMEOUT = 60.0
INITIALIZED = "NFS SERVER INITIALIZED"  # ganesha's log once its exports are loaded


def server_problem() -> str:
    """Why this host cannot serve an NFS export ('' when it can)."""
    if shutil.which("ganesha.nfsd") is None:
        return "nfs-ganesha is not installed (Debian packages nfs-ganesha, nfs-ganesha-vfs): run 'make deps'"
    if not any(p.exists() for p in VFS_FSAL):
        return ("nfs-ganesha's VFS back-end is not installed (Debian package nfs-ganesha-vfs; it serves a local "
                "directory): run 'make deps'")
    return ""


def _version() -> str:
    r = subprocess.run(["ganesha.nfsd", "-v"], capture_output=True, text=True)
    m = re.search(r"Release = V?(\S+)", r.stdout + r.stderr)  # "NFS-Ganesha Release = V4.3"
    return f"nfs-ganesha {m[1]}" if m else "nfs-ganesha"


def ganesha_conf(directory: str, pseudo: str, host: str, port: int, clients: str, recovery: str) -> str:
    """ganesha.conf for one export of `directory` as `pseudo` on host:port, read-write for `clients` (addresses or
    subnets, a comma list) only, NFSv4 over TCP."""
    q = json.dumps  # ganesha takes double-quoted strings with C escapes
    return f"""NFS_CORE_PARAM {{
    Protocols = 4;
    Bind_addr = {host};
    NFS_Port = {port};
    Enable_NLM = false;
    Enable_RQUOTA = false;
    Enable_UDP = false;
}}
NFSV4 {{
    Graceless = true;
    RecoveryBackend = fs;
    RecoveryRoot = {q(recovery)};
    Only_Numeric_Owners = true;
}}
NFS_KRB5 {{ Active_krb5 = false; }}
EXPORT_DEFAULTS {{ Access_Type = None; }}
EXPORT {{
    Export_Id = 1;
    Path = {q(directory)};
    Pseudo = {q(pseudo)};
    Protocols = 4;
    Transports = TCP;
    SecType = sys;
    Squash = No_Root_Squash;
    Access_Type = None;
    FSAL {{ Name = VFS; }}
    CLIENT {{ Clients = {clients}; Access_Type = RW; }}
}}
"""


def subnet(iface: str, address: str) -> str:
    """The subnet of `address` as configured on `iface` (e.g. 169.254.77.0/24): the only clients an export takes."""
    r = subprocess.run(["ip", "-j", "-4", "addr", "show", "dev", iface], capture_output=True, text=True, timeout=10)
    try:
        infos = json.loads(r.stdout or "[]")
    except ValueError:
        infos = []
    for info in infos:
        for a in info.get("addr_info", []):
            if a.get("local") == address:
                return str(ipaddress.ip_interface(f"{address}/{a['prefixlen']}").network)
    raise CloudboxError(f"{address} is not an address of {iface}: cannot say which clients the NFS export serves")


@dataclass
class NfsExport(procs.ServedByChild):
    """A running export: nfs://host:port/cloudbox/<name> (NFSv4)."""

    name: str
    directory: str
    host: str
    port: int
    clients: str
    server: str = "nfs-ganesha"
    child: procs.Child | None = field(default=None, repr=False)
    work_dir: Path | None = field(default=None, repr=False)  # ganesha's configuration and recovery directory

    @property
    def pseudo(self) -> str:
        return f"{PSEUDO_ROOT}/{self.name}"

    @property
    def uri(self) -> str:
        return f"nfs://{self.host}:{self.port}{self.pseudo}"

    @property
    def target(self) -> str:
        return f"{self.host}:{self.pseudo}"

    def stop(self) -> None:
        """End ganesha (SIGTERM: it closes its clients' state and exits), remove its configuration and log. Safe to
        call twice."""
        super().stop()
        self.child = None
        if self.work_dir is not None:
            shutil.rmtree(self.work_dir, ignore_errors=True)
            self.work_dir = None


def served_elsewhere(name: str, host: str, port: int, server: str) -> NfsExport:
    """The export `name` that another host (`server`, a front-end) serves on host:port for this run: this side
    mounts it and never starts or stops its server."""
    return NfsExport(name, "", host, port, "", server)


def host_client_problem(has_module: Callable[[str], bool]) -> str:
    """Why this host's kernel cannot mount an NFSv4 export itself ('' when it can); `has_module(name)` says whether
    it can load a module."""
    try:
        if "nfs4" in Path("/proc/filesystems").read_text().split():
            return ""
    except OSError:
        pass
    if has_module("nfsv4"):
        return ""
    return f"this host's kernel ({platform.release()}) has no NFSv4 client (the nfsv4 module)"


# A run's export is written by other machines: nothing on it runs or acts as a device or set-uid file on this host.
HOST_MOUNT_FLAGS = "nosuid,nodev,noexec"


def mount_on_host(exp: NfsExport, options: str, mount_point: Path) -> str:
    """This host's kernel client mounting `exp` on `mount_point` (made here) with `options` (the guest's) and
    HOST_MOUNT_FLAGS: the baseline of an export another host serves. Returns the mount's /proc/mounts line."""
    options = f"{options},{HOST_MOUNT_FLAGS}"
    ledger.hold(mounts.Mount(str(mount_point), exp.uri))  # unmount_on_host marks it released
    mount_point.mkdir(parents=True, exist_ok=True)
    subprocess.run(["modprobe", "nfsv4"], capture_output=True, timeout=30)  # built in or loaded already: no harm
    try:
        r = subprocess.run(["mount", "-t", "nfs4", "-o", options, exp.target, str(mount_point)],
                           capture_output=True, text=True, timeout=GUEST_MOUNT_TIMEOUT, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        unmount_on_host(mount_point)
        raise CloudboxError(f"this host's mount of {exp.uri} ({options}) did not return within "
                            f"{GUEST_MOUNT_TIMEOUT:.0f} s") from None
    if r.returncode != 0:
        raise CloudboxError(f"this host could not mount {exp.uri} with options {options} (exit {r.returncode}): "
                            f"{(r.stdout + r.stderr).strip()[-300:]}")
    line = _host_mount_line(mount_point)
    if not line:
        raise CloudboxError(f"mount of {exp.uri} returned 0, but {mount_point} is not in /proc/mounts")
    return line


def _host_mount_line(mount_point: Path) -> str:
    """This host's /proc/mounts line for `mount_point`, '' when nothing is mounted there."""
    return next((ln for ln in Path("/proc/mounts").read_text().splitlines()
                 if ln.split()[1:2] == [str(mount_point)]), "")


def unmount_on_host(mount_point: Path) -> None:
    """The host's mount of an export gone (lazily when busy: a cancelled test's fio may still hold it), and its
    mount point. Safe when nothing is mounted there."""
    if _host_mount_line(mount_point):
        mounts.umount(str(mount_point), timeout=GUEST_MOUNT_TIMEOUT)
    with contextlib.suppress(OSError):
        mount_point.rmdir()
    held = ledger.active()
    for entry in held.held():
        if isinstance(entry.record, mounts.Mount) and entry.record.path == str(mount_point):
            entry.done()


def start(name: str, directory: str, *, iface: str, host: str, work_dir: Path, port: int | None = None,
          clients: str | None = None) -> NfsExport:
    """Export `directory` as /cloudbox/<name> on host:port (a free port when None) to `iface`'s subnet (or to
    `clients`, a subnet); returns once ganesha listens. Its configuration, log and recovery state go under
    `work_dir` (made here, removed by `stop()`). On failure nothing runs."""
    problem = server_problem()
    if problem:
        raise CloudboxError(problem)
    clients = clients or subnet(iface, host)
    port = port or free_port(host)
    version = _version()
    work_dir.mkdir(mode=0o700)
    exp = NfsExport(name, directory, host, port, clients, version, work_dir=work_dir)
    try:
        (work_dir / "recovery").mkdir()
        conf = work_dir / "ganesha.conf"
        conf.write_text(ganesha_conf(directory, exp.pseudo, host, port, clients, str(work_dir / "recovery")))
        exp.child = procs.Child.start(
            ["ganesha.nfsd", "-F", "-f", str(conf), "-L", str(work_dir / "ganesha.log"), "-p",
             str(work_dir / "ganesha.pid"), "-N", "NIV_EVENT"],
            log=work_dir / "ganesha.out", ready=lambda pid: listens(pid, port) and _initialized(work_dir),
            serving=f"NFS export {name}", ready_is=f"listen on {host}:{port} and say {INITIALIZED!r}",
            timeout=START_TIMEOUT, death_signal=signal.SIGKILL)
    except BaseException as e:
        log = _tail(work_dir / "ganesha.log")
        exp.stop()
        if log and isinstance(e, CloudboxError):
            raise CloudboxError(f"{e}; ganesha's log: {log}") from None
        raise
    return exp


def _initialized(work_dir: Path) -> bool:
    """ganesha has loaded its exports and serves (it binds its port before that)."""
    try:
        return INITIALIZED in (work_dir / "ganesha.log").read_text(errors="replace")
    except OSError:
        return False


def _tail(log: Path, limit: int = 600) -> str:
    """ganesha's own complaints (CRIT, MAJ, FATAL lines) at the end of its log; '' when there are none."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    bad = [ln for ln in lines if any(f":{lvl} :" in ln for lvl in ("FATAL", "MAJ", "CRIT"))
           and "DBUS" not in ln and "krb5" not in ln.lower() and "Cannot register" not in ln]
    return " | ".join(bad)[-limit:]


def mount_options(exp: NfsExport, opts: Nfs) -> str:
    """The guest's mount options for `exp` under the profile's [nfs] table (`opts`). The kernel's own text
    options: addr= and port= name the server, so busybox's mount needs no NFS helper."""
    out = [f"vers={opts.vers}", f"proto={opts.proto}", f"port={exp.port}", f"addr={exp.host}", opts.writes, "hard",
           f"nconnect={opts.nconnect}"]
    out += [f"{k}={v * 1024}" for k, v in (("rsize", opts.rsize_kib), ("wsize", opts.wsize_kib)) if v]
    return ",".join(out)


# Every guest boots the same image under the same host name, and NFSv4 tells clients apart by their owner string
# ("Linux NFSv4.2 <host name>"): without an id of its own, the server takes two guests for one client and their
# state collides (fsync then fails with EIO). A random id per boot, set before the client's first mount.
UNIQUE_CLIENT = ("p=/sys/module/nfs/parameters/nfs4_unique_id; { [ ! -w $p ] || [ -n \"$(cat $p)\" ] || "
                 "cat /proc/sys/kernel/random/uuid > $p; }")


def mount_in_guest(guest, exp: NfsExport, options: str) -> str:
    """In the benchmark guest (its NIC already has its address): the nfsv4 client loaded and `exp` mounted on
    MOUNT_POINT with `options`; returns the mount's line in /proc/mounts (the options the kernel settled on)."""
    q = shlex.quote
    try:
        p = guest.sh(f"modprobe nfsv4 && {UNIQUE_CLIENT} && mkdir -p {MOUNT_POINT} && mount -t nfs4 -o {q(options)} "
                     f"{q(exp.target)} {MOUNT_POINT} </dev/null 2>&1", timeout=GUEST_MOUNT_TIMEOUT)
    except GuestTimeout as e:
        raise CloudboxError(f"the guest's mount of {exp.uri} ({options}) did not return within "
                            f"{GUEST_MOUNT_TIMEOUT:.0f} s{_why(guest, exp)}") from e
    if p.exitcode != 0:
        raise CloudboxError(f"the guest could not mount {exp.uri} with options {options} (exit {p.exitcode}): "
                            f"{(p.stdout + p.stderr).strip()[-300:]}{_why(guest, exp)}")
    line = guest.sh(f"grep ' {MOUNT_POINT} ' /proc/mounts", timeout=30).stdout.strip()
    if not line:
        raise CloudboxError(f"mount of {exp.uri} in the guest returned 0, but {MOUNT_POINT} is not in its "
                            "/proc/mounts")
    return line


def test_file(k: int = 0) -> str:
    """The file the guest's tests run on; guest k of a run of several (k from 1) has its own in the shared export."""
    return f"{MOUNT_POINT}/{TEST_FILE}" if k == 0 else f"{MOUNT_POINT}/cloudbox-g{k}.dat"


def _why(guest, exp: NfsExport) -> str:
    """What the guest's kernel and the server said about a mount that failed, for its error ('' when nothing)."""
    try:
        said = guest.sh("dmesg | grep -i -E 'nfs|rpc|svc' | tail -n 6", timeout=30).stdout.strip()
    except GuestError:
        said = ""
    out = f"; the guest's kernel said: {said[-600:]}" if said else ""
    log = _tail(exp.work_dir / "ganesha.log") if exp.work_dir else ""
    if exp.child is not None and exp.child.proc is not None and exp.child.proc.poll() is not None:
        out += f"; ganesha exited {exp.child.proc.returncode}"
    return out + (f"; ganesha's log: {log}" if log else "")


def unmount_in_guest(guest, k: int = 0) -> None:
    """The guest's test file removed and the export unmounted (what the guest wrote reaches the server first)."""
    guest.sh(f"rm -f {test_file(k)}; umount {MOUNT_POINT}", timeout=GUEST_MOUNT_TIMEOUT, check=True)


def running(directory: str) -> list[int]:
    """The pids of every ganesha.nfsd serving `directory` (a test's check that nothing is left)."""
    out = []
    for d, argv in procs.programs("ganesha.nfsd"):
        try:
            conf = argv[argv.index(b"-f") + 1].decode()
            if f'Path = {json.dumps(directory)};' in Path(conf).read_text():
                out.append(int(d.name))
        except (OSError, ValueError, IndexError):
            continue
    return out
