"""Reaches libvirt, starting virtlogd + libvirtd ourselves on hosts where systemd is not PID 1.

On a normal host systemd owns libvirtd and we only connect. Without systemd (containers, CI) we
start the daemons, and when the accelerator probe found KVM unusable libvirtd is started in its own
mount namespace with /dev/kvm hidden: otherwise it re-probes QEMU on every domain start (~30-60 s).
Daemons we started are recorded in <run dir>/daemons.json so `stop_started_daemons()` stops
exactly those and nothing else.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import time
from pathlib import Path

from .. import paths
from ..errors import LibvirtUnavailable, PermissionProblem
from ..procs import process_exists

DEFAULT_URI = "qemu:///system"
XEN_URI = "xen:///system"  # libvirt's libxl driver, on Xen's dom0


def libvirt_uri() -> str:
    return os.environ.get("CLOUDBOX_LIBVIRT_URI", DEFAULT_URI)


def systemd_is_pid1() -> bool:
    """True only when systemd really runs as PID 1 (a stale /run/systemd/system proves nothing)."""
    try:
        return Path("/proc/1/comm").read_text().strip() == "systemd"
    except OSError:
        return False


def _record() -> Path:
    return paths.run_dir() / "daemons.json"


def _read_pidfile(p: str) -> int | None:
    try:
        return int(Path(p).read_text().strip())
    except (OSError, ValueError):
        return None


def connect(uri: str | None = None, *, start: bool = True, hide_kvm: bool = False):
    """Open a libvirt connection, starting the daemons first if we must and may."""
    import libvirt

    uri = uri or libvirt_uri()
    libvirt.registerErrorHandler(lambda *_: None, None)  # errors arrive as exceptions, not on stderr
    try:
        conn = libvirt.open(uri)
    except libvirt.libvirtError as first:
        if not start or uri != DEFAULT_URI or systemd_is_pid1():
            raise _explain(uri, first) from first
    else:
        if uri == DEFAULT_URI:
            _check_kvm_stand_in()
        return conn
    start_daemons(hide_kvm=hide_kvm)
    try:
        return libvirt.open(uri)
    except libvirt.libvirtError as e:
        raise _explain(uri, e) from e


def _check_kvm_stand_in() -> None:
    """A running libvirtd whose /dev/kvm stand-in was deleted cannot start any domain; say so plainly."""
    for name in ("libvirtd", "virtqemud"):
        pid = _read_pidfile(f"/run/{name}.pid")
        if not pid or not process_exists(pid):
            continue
        try:
            mounts = Path(f"/proc/{pid}/mountinfo").read_text()
        except OSError:
            return
        for line in mounts.splitlines():
            fields = line.split()
            if len(fields) > 4 and fields[4] == "/dev/kvm" and fields[3].endswith("//deleted"):
                raise LibvirtUnavailable(
                    f"{name} (pid {pid}) hides /dev/kvm behind {fields[3].removesuffix('//deleted')}, which has "
                    f"been deleted, so it cannot start guests; stop it (kill {pid}) and cloudbox starts a new one")
        return


def _explain(uri: str, err: Exception) -> LibvirtUnavailable | PermissionProblem:
    msg = str(err).strip()
    if "Permission denied" in msg or "authentication" in msg.lower():
        return PermissionProblem(
            f"libvirt at {uri} refused this user ({msg}). Run cloudbox as root, or add the user to "
            "the 'libvirt' group (adduser $USER libvirt) and log in again."
        )
    hint = "start it with 'systemctl start libvirtd'" if systemd_is_pid1() else (
        "cloudbox starts libvirtd itself on hosts without systemd when run as root")
    return LibvirtUnavailable(f"cannot reach libvirtd at {uri}: {msg}; {hint}")


NO_KVM_NODE = Path("/run/cloudbox/no-kvm")


def start_daemons(*, hide_kvm: bool = False, timeout: float = 20.0) -> None:
    """Start virtlogd and libvirtd (no systemd). Records the pids of what we started."""
    if os.geteuid() != 0:
        raise PermissionProblem(
            "libvirtd is not running and only root can start it on a host without systemd: "
            "run cloudbox as root (sudo)"
        )
    libvirtd = shutil.which("libvirtd") or shutil.which("virtqemud")
    virtlogd = shutil.which("virtlogd")
    if libvirtd is None or virtlogd is None:
        raise LibvirtUnavailable("libvirtd/virtlogd are not installed: run 'make deps' (scripts/install-deps)")
    started: dict[str, int] = {}
    if not process_exists(_read_pidfile("/run/virtlogd.pid") or 0):
        subprocess.run([virtlogd, "-d"], check=True)
        for _ in range(100):
            pid = _read_pidfile("/run/virtlogd.pid")
            if pid and process_exists(pid):
                started["virtlogd"] = pid
                break
            time.sleep(0.05)
    name = os.path.basename(libvirtd)
    pidfile = f"/run/{name}.pid"
    if not process_exists(_read_pidfile(pidfile) or 0):
        cmd = [libvirtd, "-d"]
        if hide_kvm and os.path.exists("/dev/kvm"):
            # Own mount namespace in which /dev/kvm is a private character node (null's numbers, mode 0,
            # fixed timestamps). Not /dev/null itself: libvirt keys its QEMU capability cache on /dev/kvm's
            # ctime, and /dev/null's changes all the time, so every domain start re-probed QEMU (~27 s).
            # Not a regular file: libvirt's per-domain /dev namespace cannot move such a mount.
            # A fixed host path, not the (per-session, removable) run dir: libvirtd outlives the process that
            # started it, and once the mount's source is deleted libvirt cannot move it into a domain's
            # namespace ("Unable to move /dev/kvm mount"), so every later guest start would fail.
            blank = NO_KVM_NODE
            blank.parent.mkdir(parents=True, exist_ok=True)
            if not blank.is_char_device():
                blank.unlink(missing_ok=True)
                os.mknod(blank, 0o000 | stat.S_IFCHR, os.makedev(1, 3))
            os.chmod(blank, 0)
            os.utime(blank, (0, 0))
            cmd = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                   f'mount --bind {blank} /dev/kvm && exec "$0" "$@"', *cmd]
        subprocess.run(cmd, check=True)
        deadline = time.monotonic() + timeout
        sock = "/run/libvirt/libvirt-sock" if name == "libvirtd" else "/run/libvirt/virtqemud-sock"
        while time.monotonic() < deadline:
            pid = _read_pidfile(pidfile)
            if pid and process_exists(pid) and os.path.exists(sock):
                started[name] = pid
                break
            time.sleep(0.1)
        else:
            raise LibvirtUnavailable(f"{name} did not come up within {timeout:.0f} s (see its log in /var/log/libvirt)")
    if started:
        rec = _record()
        rec.parent.mkdir(parents=True, exist_ok=True)
        old = json.loads(rec.read_text()) if rec.exists() else {}
        old.update(started)
        if name in started:
            old["hide_kvm"] = bool(hide_kvm)  # how a libvirtd that dies is started again (reconnect)
        rec.write_text(json.dumps(old))


def libvirtd_pid() -> int | None:
    """The pid of the libvirt daemon (libvirtd or virtqemud) that its pid file names, when that process lives."""
    for name in ("libvirtd", "virtqemud"):
        pid = _read_pidfile(f"/run/{name}.pid")
        if pid and process_exists(pid):
            return pid
    return None


def _started_hidden() -> bool | None:
    """Whether the libvirtd cloudbox started last hid /dev/kvm (None: it started none)."""
    try:
        value = json.loads(_record().read_text()).get("hide_kvm")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, bool) else None


BACK_WITHIN_S = 60.0  # how long a run waits for libvirtd to answer again after it went away


def reconnect(uri: str | None = None, *, hide_kvm: bool = False, within: float = BACK_WITHIN_S,
              pause: float = 1.0):
    """A new connection to libvirt after the daemon went away: started again here where systemd does not run it
    (hiding /dev/kvm as the one that died did, when cloudbox started it), else waited for (systemd restarts it, or
    its socket starts it) for up to `within` seconds. LibvirtUnavailable when it did not come back."""
    hidden = _started_hidden()
    hide = hidden if hidden is not None else hide_kvm
    deadline = time.monotonic() + within
    while True:
        try:
            return connect(uri, hide_kvm=hide)
        except (LibvirtUnavailable, subprocess.CalledProcessError) as e:
            if time.monotonic() + pause > deadline:
                raise LibvirtUnavailable(f"{e} (waited {within:.0f} s for libvirtd to come back)") from None
        time.sleep(pause)


def stop_started_daemons() -> list[str]:
    """Stop the daemons cloudbox started (per the record); returns their names."""
    rec = _record()
    if not rec.exists():
        return []
    stopped = []
    data = json.loads(rec.read_text())
    for name in ("libvirtd", "virtqemud", "virtlogd"):
        pid = data.get(name)
        if pid and process_exists(pid):
            os.kill(pid, signal.SIGTERM)
            for _ in range(100):
                if not process_exists(pid):
                    break
                time.sleep(0.05)
            stopped.append(name)
    rec.unlink(missing_ok=True)
    return stopped
