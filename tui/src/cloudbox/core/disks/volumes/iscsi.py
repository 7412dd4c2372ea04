"""One iSCSI export of a volume with CHAP: tgtd (the user-space target of the tgt package) as a child of the run's
process, killed with it.

The kernel's LIO target needs configfs and target modules, which the build and CI machines' kernel lacks; tgtd speaks
the same protocol from user space. Each export runs its own tgtd: its own management socket (`-C`, a number whose
socket file is not there yet), its own portal on one private address (127.0.0.1 for QEMU's initiator, the host's
address on the guest's bridge for the guest's own, `attach_in_guest`), one target holding the volume's file as LUN 1
(direct I/O: the server's page cache is not part of the volume). A login needs this box's initiator name (the
target's allow-list) and its CHAP secret (made once per box, `<state dir>/pki/iscsi/chap.json`, 0600; never
printed). tgtd does not exit on SIGTERM, so it gets SIGKILL when the run's process dies, and `stop()` takes the
target down and tells tgtd to exit through tgtadm.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from ... import paths, procs
from ...errors import CloudboxError, keep_secret, masked
from ...procs import free_port, listens
from .pki import write_private_json

START_TIMEOUT = 30.0  # a server on an emulated, busy host can take its time to start
MGMT_TIMEOUT = 30.0  # one tgtadm request
IQN_PREFIX = "iqn.2026-11.org.cloudbox"
LUN = 1  # LUN 0 is tgtd's own controller
SOCKET_DIR = Path("/var/run/tgtd")  # where tgtd puts socket.N (fixed in tgtd)
QEMU_ISCSI = [Path("/usr/lib/x86_64-linux-gnu/qemu/block-iscsi.so"), Path("/usr/lib/qemu/block-iscsi.so")]
TID = 1
MAX_CONTROL = 32767  # tgtd's -C takes 0..32767


@dataclass(frozen=True)
class Chap:
    """An iSCSI identity: the initiator name the targets allow, the CHAP user and secret it logs in with, and the
    target's own CHAP user and secret (mutual CHAP: the initiator checks the target too, so a host answering on the
    target's address without that secret hands it no disk; '' where an older set has none)."""

    initiator: str
    user: str
    secret: str = field(repr=False)
    target_user: str = ""
    target_secret: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        keep_secret(self.secret)  # masked wherever it turns up in this process's messages, events and reasons
        keep_secret(self.target_secret)

    @property
    def mutual(self) -> bool:
        return bool(self.target_user and self.target_secret)


def chap_file() -> Path:
    return paths.state_dir() / "pki" / "iscsi" / "chap.json"


def target_account(tag: str) -> dict[str, str]:
    """A target's own CHAP account (mutual CHAP), new: {"target_user", "target_secret"}."""
    return {"target_user": f"cloudbox-target-{tag}", "target_secret": secrets.token_hex(16)}


def chap() -> Chap:
    """The box's CHAP credentials, made on first use (secrets module; the file 0600 in a 0700 directory); a file
    made before targets had an account of their own gets one."""
    f = chap_file()
    if not f.exists():
        box = secrets.token_hex(4)
        write_private_json(f, {"initiator": f"{IQN_PREFIX}:box-{box}", "user": f"cloudbox-{box}",
                           "secret": secrets.token_hex(16), **target_account(box)})
    try:
        data = json.loads(f.read_text())
        if not data.get("target_secret"):
            data.update(target_account(str(data["user"]).removeprefix("cloudbox-")))
            write_private_json(f, data)
        return Chap(str(data["initiator"]), str(data["user"]), str(data["secret"]), str(data["target_user"]),
                    str(data["target_secret"]))
    except (OSError, ValueError, KeyError) as e:
        raise CloudboxError(f"{f}: this box's iSCSI CHAP credentials cannot be read ({e}); remove the file to make "
                            "new ones") from None


def target_iqn(volume: str) -> str:
    return f"{IQN_PREFIX}:vol.{volume}"


def qemu_driver() -> Path | None:
    """QEMU's libiscsi block driver (Debian package qemu-block-extra), None when not installed."""
    return next((p for p in QEMU_ISCSI if p.exists()), None)


def _version() -> str:
    r = subprocess.run(["tgtd", "--version"], capture_output=True, text=True)
    out = (r.stdout or r.stderr).strip().splitlines()
    return f"tgtd {out[0].strip()}" if out else "tgtd"


@dataclass
class IscsiExport(procs.ServedByChild):
    """A running export: iscsi://host:port/<iqn>/1 (the URI names no secret)."""

    name: str
    path: str
    host: str
    port: int
    iqn: str
    control_port: int  # tgtd's management socket, /var/run/tgtd/socket.N
    server: str = "tgtd"
    child: procs.Child | None = field(default=None, repr=False)

    @property
    def uri(self) -> str:
        return f"iscsi://{self.host}:{self.port}/{self.iqn}/{LUN}"

    @property
    def target(self) -> str:
        return f"{self.iqn}/{LUN}"

    def stop(self) -> None:
        """Take the target down (sessions closed), end tgtd, remove its socket and log. Safe to call twice."""
        if self.child is None:
            return
        if self.child.proc is not None and self.child.proc.poll() is None:
            with contextlib.suppress(CloudboxError):
                tgtadm(self.control_port, "--mode", "target", "--op", "delete", "--tid", str(TID), "--force")
            with contextlib.suppress(CloudboxError):
                tgtadm(self.control_port, "--mode", "system", "--op", "delete", lld=False)
        self.child.stop()
        for leftover in (f"socket.{self.control_port}", f"socket.{self.control_port}.lock"):
            (SOCKET_DIR / leftover).unlink(missing_ok=True)


def tgtadm(control_port: int, *args: str, lld: bool = True) -> str:
    """Run tgtadm against the tgtd of `control_port`; CloudboxError with what it said. No secret is ever an
    argument: accounts are made over the management socket (`new_account`)."""
    cmd = ["tgtadm", "-C", str(control_port), *(["--lld", "iscsi"] if lld else []), *args]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=MGMT_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise CloudboxError(f"{' '.join(cmd)} did not answer within {MGMT_TIMEOUT:.0f} s") from None
    if r.returncode != 0:
        raise CloudboxError(f"{' '.join(cmd)} failed (exit {r.returncode}): {masked((r.stderr or r.stdout).strip())}")
    return r.stdout


# tgtd's management request (usr/tgtadm.h, unchanged since tgt 1.0.60): mode, op, lld[64], len, tid, sid, lun, cid,
# host_no, device_type, ac_dir, pack, force; then the parameters as one NUL-terminated "key=value,..." string. The
# answer is (err, len) and len - 8 bytes of text.
_REQ = struct.Struct("@ii64sIiQQIIIIII")
_RSP = struct.Struct("@II")
MODE_ACCOUNT, OP_NEW = 7, 0


def new_account(control_port: int, user: str, secret: str, *, timeout: float | None = None) -> None:
    """The CHAP account `user` in the tgtd of `control_port`, made over its management socket as tgtadm would make
    it, so the secret is in no process's arguments (tgtadm takes it only on its command line)."""
    params = f"user={user},password={secret}".encode() + b"\0"
    req = _REQ.pack(MODE_ACCOUNT, OP_NEW, b"iscsi", _REQ.size + len(params), 0, 0, 0, 0, 0, 0, 0, 0, 0)
    path = SOCKET_DIR / f"socket.{control_port}"
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(MGMT_TIMEOUT if timeout is None else timeout)
            s.connect(str(path))
            s.sendall(req + params)
            head = b""
            while len(head) < _RSP.size:
                got = s.recv(_RSP.size - len(head))
                if not got:
                    break
                head += got
    except TimeoutError:
        raise CloudboxError(f"tgtd ({path}) did not answer making CHAP account {user} within "
                            f"{MGMT_TIMEOUT if timeout is None else timeout:.0f} s") from None
    except OSError as e:
        raise CloudboxError(f"cannot make CHAP account {user} through tgtd's socket {path}: {e.strerror or e}") \
            from None
    if len(head) != _RSP.size:
        raise CloudboxError(f"tgtd ({path}) closed its socket without answering the request for CHAP account {user}")
    err, _ = _RSP.unpack(head)
    if err != 0:
        raise CloudboxError(f"tgtd refused CHAP account {user} (its error {err}; `tgtadm --mode account --op show` "
                            f"-C {control_port} lists the accounts it has)")


def control_port(port: int) -> int:
    """A management socket number for the tgtd of portal `port` (tgtd allows 1..32767; 0 is a system tgtd's),
    the first from the port's own whose socket file is not there: another tgtd's never is taken."""
    for i in range(MAX_CONTROL):
        n = 1 + (port + i) % MAX_CONTROL
        if not (SOCKET_DIR / f"socket.{n}").exists() and not (SOCKET_DIR / f"socket.{n}.lock").exists():
            return n
    raise CloudboxError(f"no free tgtd management socket in {SOCKET_DIR} (all of 1..{MAX_CONTROL} exist)")


def start(name: str, path: str, creds: Chap, *, log: Path, host: str = "127.0.0.1",
          port: int | None = None) -> IscsiExport:
    """Export `path` as LUN 1 of target iqn...:vol.<name> on host:port (a free port when None), CHAP and the
    box's initiator name required; returns once a login can succeed. On failure nothing runs."""
    if shutil.which("tgtd") is None or shutil.which("tgtadm") is None:
        raise CloudboxError("tgtd is not installed (Debian package tgt): run 'make deps' (scripts/install-deps)")
    port = port or free_port(host)
    control = control_port(port)
    version = _version()
    child = procs.Child.start(["tgtd", "-f", "-C", str(control), "--iscsi", f"portal={host}:{port}"], log=log,
                              ready=lambda pid: listens(pid, port), serving=f"volume {name}",
                              ready_is=f"listen on {host}:{port}", timeout=START_TIMEOUT,
                              death_signal=signal.SIGKILL)
    exp = IscsiExport(name, path, host, port, target_iqn(name), control, version, child=child)
    try:
        tgtadm(control, "--mode", "target", "--op", "new", "--tid", str(TID), "--targetname", exp.iqn)
        tgtadm(control, "--mode", "logicalunit", "--op", "new", "--tid", str(TID), "--lun", str(LUN),
               "--backing-store", path, "--bsoflags", "direct")
        new_account(control, creds.user, creds.secret)
        tgtadm(control, "--mode", "account", "--op", "bind", "--tid", str(TID), "--user", creds.user)
        if creds.mutual:  # the target's answer to an initiator that checks it (open-iscsi's, the guest's)
            new_account(control, creds.target_user, creds.target_secret)
            tgtadm(control, "--mode", "account", "--op", "bind", "--tid", str(TID), "--user", creds.target_user,
                   "--outgoing")
        tgtadm(control, "--mode", "target", "--op", "bind", "--tid", str(TID), "--initiator-name", creds.initiator)
    except BaseException:
        exp.stop()
        raise
    return exp


GUEST_LOGIN_TIMEOUT = 60.0  # iscsistart's login, then the LUN's disk appearing in the guest


GUEST_CHAP = "/run/cloudbox-iscsi"  # in the guest: the CHAP secrets, written by the agent (tmpfs), gone after login


def login_script(exp: IscsiExport, creds: Chap) -> str:
    """The guest's iscsistart login to `exp`: the secrets are read from GUEST_CHAP's files by the shell, so the
    script (what a timeout or a failure reports) never holds them; mutual CHAP where `creds` has the target's."""
    q = shlex.quote
    mutual = f" -U {q(creds.target_user)} -W \"$(cat {GUEST_CHAP}/target)\"" if creds.mutual else ""
    return (f"modprobe -a iscsi_tcp sd_mod && iscsistart -i {q(creds.initiator)} -t {q(exp.iqn)} -g 1 "
            f"-a {q(exp.host)} -p {int(exp.port)} -u {q(creds.user)} -w \"$(cat {GUEST_CHAP}/secret)\"{mutual}")


def attach_in_guest(guest, exp: IscsiExport, creds: Chap) -> str:
    """In the benchmark guest (its NIC already has its address): the kernel's iscsi_tcp and sd_mod (a virtio
    profile's guest boots without the SCSI disk driver) loaded, and open-iscsi's iscsistart logged in to `exp` with
    `creds`' initiator name and CHAP secret, checking the target's (mutual CHAP) where `creds` has it. The secrets
    reach the guest through its agent's file write (GUEST_CHAP, 0600, removed after the login): the shell hands them
    to iscsistart, and no script text or message holds them. Returns the disk of LUN 1 once it appears (/dev/sdX)."""
    if not guest.has("iscsistart"):
        raise CloudboxError("the guest has no iscsistart: rebuild the benchmark guest image (make guest-image)")
    guest.run(["mkdir", "-p", "-m", "0700", GUEST_CHAP], timeout=30, check=True)
    guest.put_file(f"{GUEST_CHAP}/secret", creds.secret.encode(), 0o600)
    if creds.mutual:
        guest.put_file(f"{GUEST_CHAP}/target", creds.target_secret.encode(), 0o600)
    try:
        p = guest.sh(f"{login_script(exp, creds)} </dev/null 2>&1", timeout=GUEST_LOGIN_TIMEOUT)
    finally:
        with contextlib.suppress(CloudboxError):  # a guest that stopped answering has its own error on the way
            guest.run(["rm", "-rf", GUEST_CHAP], timeout=30)
    if p.exitcode != 0:
        said = masked((p.stdout + p.stderr).strip())[-300:]
        raise CloudboxError(f"iscsistart in the guest could not log in to {exp.uri} (exit {p.exitcode}"
                            f"{', mutual CHAP' if creds.mutual else ''}): {said}")
    # iscsistart logs in but scans nothing (iscsid would): the session's SCSI host is scanned here, then the LUN's
    # disk (host:channel:target:LUN 1) is waited for under the session
    find = ("for h in /sys/class/iscsi_host/*; do echo '- - -' > /sys/class/scsi_host/${h##*/}/scan; done; "
            f"for i in $(seq {int(GUEST_LOGIN_TIMEOUT * 5)}); do for b in /sys/class/iscsi_session/session*/device/"
            f"target*/*:*:*:{LUN}/block/*; do [ -e \"$b\" ] && {{ echo \"${{b##*/}}\"; exit 0; }}; done; "
            "sleep 0.2; done; exit 1")
    r = guest.sh(find, timeout=GUEST_LOGIN_TIMEOUT + 10)
    dev = r.stdout.strip()
    if r.exitcode != 0 or not dev:
        seen = guest.sh("ls /sys/class/iscsi_session/*/device/ /sys/class/scsi_device/ 2>&1; dmesg | tail -n 8",
                        timeout=30).stdout.strip()
        raise CloudboxError(f"iscsistart logged in to {exp.uri}, but no disk of LUN {LUN} appeared in the guest "
                            f"within {GUEST_LOGIN_TIMEOUT:.0f} s; its sessions, SCSI devices and kernel messages: "
                            f"{seen[-1200:]}")
    return f"/dev/{dev}"


def running(path: str) -> list[int]:
    """The pids of every tgtd holding `path` open (a test's check that nothing is left)."""
    out = []
    for d, _argv in procs.programs("tgtd"):
        try:
            if any(os.readlink(fd) == path for fd in (d / "fd").iterdir()):
                out.append(int(d.name))
        except OSError:
            continue
    return out


# -- the libvirt secret QEMU logs in with ---------------------------------------------------------------------------
def secret_usage(run_uuid: str) -> str:
    return f"cloudbox-iscsi-{run_uuid[:12]}"


def define_secret(conn, usage: str, value: str) -> str:
    """An ephemeral, private libvirt secret (never written to disk by libvirt, never read back) of type iscsi named
    `usage`, holding `value`; returns its UUID."""
    u = str(uuid.uuid4())
    xml = (f"<secret ephemeral='yes' private='yes'><uuid>{u}</uuid><description>cloudbox iSCSI CHAP for one run"
           f"</description><usage type='iscsi'><target>{usage}</target></usage></secret>")
    sec = conn.secretDefineXML(xml, 0)
    try:
        sec.setValue(value.encode(), 0)
    except BaseException:
        sec.undefine()
        raise
    return u


def undefine_secret(conn, u: str) -> None:
    """Remove secret `u` (gone already is fine)."""
    import libvirt

    try:
        conn.secretLookupByUUIDString(u).undefine()
    except libvirt.libvirtError as e:
        if e.get_error_code() != libvirt.VIR_ERR_NO_SECRET:
            raise


def secrets_named(conn, usage: str) -> list[str]:
    """UUIDs of the libvirt secrets of type iscsi named `usage` (a test's check that none is left)."""
    import libvirt

    try:
        return [conn.secretLookupByUsage(libvirt.VIR_SECRET_USAGE_TYPE_ISCSI, usage).UUIDString()]
    except libvirt.libvirtError:
        return []


def reap_secrets(conn, live_runs: set[str], known_runs: set[str]) -> list[str]:
    """Undefine the iSCSI secrets of runs of this results store (`known_runs`) that are not live (a run killed
    outright leaves its secret in libvirtd until it restarts); another store's runs are left alone. Returns their
    usage names."""
    import libvirt

    gone: list[str] = []
    try:
        found = [s for s in conn.listAllSecrets(0) if s.usageType() == libvirt.VIR_SECRET_USAGE_TYPE_ISCSI]
    except libvirt.libvirtError:  # a driver without secrets (libvirt's test driver) has none to leave
        return gone
    for sec in found:
        usage = sec.usageID()
        run = usage.removeprefix("cloudbox-iscsi-")
        if (usage.startswith("cloudbox-iscsi-") and any(u.startswith(run) for u in known_runs)
                and not any(u.startswith(run) for u in live_runs)):
            with contextlib.suppress(libvirt.libvirtError):
                sec.undefine()
                gone.append(usage)
    return gone


# -- the baseline: the same target from the host domain -----------------------------------------------------------
RELAY_EXPORT = "lun"  # the relay's NBD export name


@dataclass
class HostRelay(procs.ServedByChild):
    """The target as the host domain's benchmark reaches it: QEMU's own libiscsi initiator (the one disk.attach =
    qemu uses), logged in with CHAP inside qemu-nbd, which serves the LUN to fio's nbd engine on a unix socket in a
    0700 directory. No kernel initiator is needed (the build machines have none), and every fio test runs."""

    socket: Path
    work_dir: Path = field(repr=False)
    child: procs.Child | None = field(default=None, repr=False)

    @property
    def uri(self) -> str:
        return f"nbd+unix:///{RELAY_EXPORT}?socket={self.socket}"

    def stop(self) -> None:
        """Log out (qemu-nbd ends its session as it exits) and remove the socket, the secret and the log. Safe to
        call twice."""
        super().stop()
        self.child = None
        shutil.rmtree(self.work_dir, ignore_errors=True)


def relay_problem() -> str:
    """Why the host domain cannot reach an iSCSI target here ('' when it can)."""
    if shutil.which("qemu-nbd") is None:
        return "this host has no qemu-nbd (Debian package qemu-utils)"
    if qemu_driver() is None:
        return "this host has no QEMU iSCSI driver (block-iscsi.so, Debian package qemu-block-extra)"
    return ""


def relay_args(exp: IscsiExport, creds: Chap, secret_file: Path, socket: Path) -> list[str]:
    """qemu-nbd serving `exp`'s LUN, reached through libiscsi with this box's CHAP identity; the secret is read from
    `secret_file`, never given on the command line."""
    lun = ",".join(f"file.{k}={v}" for k, v in (
        ("driver", "iscsi"), ("transport", "tcp"), ("portal", f"{exp.host}:{exp.port}"), ("target", exp.iqn),
        ("lun", LUN), ("user", creds.user), ("password-secret", "chap0"), ("initiator-name", creds.initiator)))
    return ["qemu-nbd", "--object", f"secret,id=chap0,file={secret_file}", "--image-opts", f"driver=raw,{lun}",
            f"--socket={socket}", f"--export-name={RELAY_EXPORT}", "--persistent", "--shared=16", "--cache=none",
            "--aio=threads"]


def host_relay(exp: IscsiExport, creds: Chap, work_dir: Path) -> HostRelay:
    """The relay for `exp`, once qemu-nbd has logged in and serves (`work_dir` made here, 0700, removed by
    `stop()`); a refused login names what libiscsi said, and nothing is left."""
    problem = relay_problem()
    if problem:
        raise CloudboxError(problem)
    work_dir.mkdir(mode=0o700)
    relay = HostRelay(work_dir / "nbd.sock", work_dir)
    try:
        secret = work_dir / "chap.secret"
        fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(creds.secret)
        # qemu-nbd logs in before it makes the socket: the socket is the login's success
        relay.child = procs.Child.start(relay_args(exp, creds, secret, relay.socket), log=work_dir / "qemu-nbd.log",
                                        ready=lambda _pid: relay.socket.exists(), serving=f"the target {exp.iqn}",
                                        ready_is=f"log in to {exp.host}:{exp.port} and serve {relay.socket}",
                                        timeout=START_TIMEOUT)
    except BaseException:
        relay.stop()
        raise
    return relay


