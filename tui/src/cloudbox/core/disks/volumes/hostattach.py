"""The host's own kernel attaching a network volume (disk.attach = host), as Study A's back-end did: open-iscsi
(iscsiadm, iscsid and the kernel's iscsi_tcp), nbd-client with TLS and the kernel's nbd, the kernel's aoe driver,
and the kernel's NVMe/TCP host (nvme_tcp, through /dev/nvme-fabrics). Each attach returns a `HostAttachment`: the
block device the host domain measures and the guest is handed on the profile's bus, and `detach()`, which logs out
or disconnects. A run killed outright cannot detach; `reap()` logs out what such a run left (one run at a time holds
a host's run lock, so at a run's start every cloudbox session on this host is a leftover).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import shutil
import subprocess
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from ... import ledger, paths, procs
from ...errors import CloudboxError, keep_secret, masked
from ...spec.schemes import SCHEMES
from . import iscsi, nvmet
from .pki import write_private_json

ATTACH_TIMEOUT = 60.0  # a login or connect, then the volume's disk appearing
ISCSI_IFACE = "cloudbox"  # iscsiadm's interface record: this box's (or node's) initiator name, not the system's
NVME_FABRICS = Path("/dev/nvme-fabrics")
ISCSI_SESSIONS = Path("/sys/class/iscsi_session")
NVME_CTRLS = Path("/sys/class/nvme")

def tool_problem(scheme: str) -> str:
    """Why this host's user space cannot attach `scheme` ('' when it can): the program beside its kernel module
    (core.spec.schemes)."""
    s = SCHEMES[scheme]
    if s.host_tool and shutil.which(s.host_tool) is None:
        return (f"{s.host_tool} is not installed (Debian package {s.host_tool_package}): run 'make deps' "
                "(scripts/install-deps)")
    return ""


@dataclass
class HostAttachment:
    """A volume attached by this host's kernel: `device` is its block device."""

    scheme: str
    device: str
    how: str  # the initiator, for the results' driver column and the provenance
    _undo: list[Callable[[], object]] = field(default_factory=list, repr=False)

    @property
    def diskstats_name(self) -> str:
        """The device's name in /proc/diskstats (the sampler's): sysfs spells AoE's etherd/eS.N as etherd!eS.N."""
        st = os.stat(self.device)
        link = Path(f"/sys/dev/block/{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}")
        return link.resolve().name.replace("!", "/")

    def detach(self) -> None:
        """Log out / disconnect, in reverse order of what attaching did. Safe to call twice; every step is tried."""
        errors = []
        while self._undo:
            try:
                self._undo.pop()()
            except (CloudboxError, OSError, subprocess.SubprocessError) as e:
                errors.append(str(e))
        if errors:
            raise CloudboxError(f"detaching {self.device} ({self.how}): " + "; ".join(errors))


def _modprobe(*modules: str, params: tuple[str, ...] = ()) -> None:
    r = subprocess.run(["modprobe", *modules, *params], capture_output=True, text=True)
    if r.returncode != 0:
        raise CloudboxError(f"cannot load {' '.join(modules)} (modprobe): {(r.stderr or r.stdout).strip()}")


def _dmesg_tail(n: int = 6) -> str:
    r = subprocess.run(["dmesg"], capture_output=True, text=True)
    return " | ".join(r.stdout.strip().splitlines()[-n:])


def _wait(what: str, found: Callable[[], str], timeout: float) -> str:
    return procs.wait_for(found, timeout, lambda: f"{what} did not appear within {timeout:.0f} s; the kernel said: "
                          f"{_dmesg_tail()}", interval=0.2)


# -- iSCSI: open-iscsi --------------------------------------------------------------------------------------------
def _iscsiadm(*args: str, ok: tuple[int, ...] = (0,)) -> str:
    cmd = ["iscsiadm", *args]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=ATTACH_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise CloudboxError(f"iscsiadm {' '.join(args[:2])} ... did not answer within {ATTACH_TIMEOUT:.0f} s (is "
                            "iscsid running? `iscsiadm -m session` asks it)") from None
    if r.returncode not in ok:
        raise CloudboxError(masked(f"{' '.join(cmd)} failed (exit {r.returncode}): {(r.stderr or r.stdout).strip()}"))
    return r.stdout


def _iscsid() -> None:
    """iscsid running (iscsiadm talks to it): started through systemd's socket where systemd runs, else by hand."""
    r = subprocess.run(["iscsiadm", "-m", "session"], capture_output=True, text=True)
    if r.returncode in (0, 21):  # 21: no sessions, but iscsid answered
        return
    if Path("/run/systemd/system").is_dir():
        subprocess.run(["systemctl", "start", "iscsid.socket", "iscsid.service"], capture_output=True)
    else:
        subprocess.run(["iscsid"], capture_output=True)
    r = subprocess.run(["iscsiadm", "-m", "session"], capture_output=True, text=True)
    if r.returncode not in (0, 21):
        raise CloudboxError(f"open-iscsi's iscsid does not answer iscsiadm: {(r.stderr or r.stdout).strip()}")


def _session_disk(iqn: str, portal: str, lun: int) -> str:
    for s in ISCSI_SESSIONS.glob("session*"):
        try:
            if (s / "targetname").read_text().strip() != iqn:
                continue
        except OSError:
            continue
        for b in (s / "device").glob(f"target*/*:*:*:{lun}/block/*"):
            if Path(f"/dev/{b.name}").exists():  # udev makes the node a moment after the kernel's disk
                return f"/dev/{b.name}"
    return ""


def attach_iscsi(host: str, port: int, iqn: str, creds: iscsi.Chap, *, lun: int = iscsi.LUN) -> HostAttachment:
    """Log this host in to `iqn` on host:port with `creds` (its initiator name through iscsiadm's interface record
    `cloudbox`, one-way CHAP); returns the disk of `lun`. On failure nothing is left logged in or recorded."""
    if (p := tool_problem("iscsi")):
        raise CloudboxError(p)
    _modprobe("iscsi_tcp")
    _iscsid()
    portal = f"{host}:{port}"
    att = HostAttachment("iscsi", "", "open-iscsi (iscsiadm, the kernel's iscsi_tcp)")
    node = ["-m", "node", "-T", iqn, "-p", portal, "-I", ISCSI_IFACE]
    try:
        _iscsiadm("-m", "iface", "-I", ISCSI_IFACE, "-o", "new", ok=(0, 15))  # 15: the record exists
        _iscsiadm("-m", "iface", "-I", ISCSI_IFACE, "-o", "update", "-n", "iface.initiatorname",
                  "-v", creds.initiator)
        session = ledger.hold(IscsiSession(iqn, portal))  # its node record, then the login
        att._undo.append(session.release)
        _iscsiadm(*node, "-o", "new")
        # a refused login fails at once; a target that does not answer is tried 2 times of 15 s, not 8
        settings = [("node.startup", "manual"), ("node.session.initial_login_retry_max", "2"),
                    ("node.session.auth.authmethod", "CHAP"), ("node.session.auth.username", creds.user),
                    # iscsiadm takes them on its command line only (its node record is the file it keeps them in):
                    # local root sees them for a moment in ps; every message masks them
                    ("node.session.auth.password", creds.secret)]
        if creds.mutual:  # the target proves it holds its own secret before this host takes its disk
            settings += [("node.session.auth.username_in", creds.target_user),
                         ("node.session.auth.password_in", creds.target_secret)]
        for key, value in settings:
            _iscsiadm(*node, "-o", "update", "-n", key, "-v", value)
        _iscsiadm(*node, "--login")
        att.device = _wait(f"the disk of LUN {lun} of {iqn}", lambda: _session_disk(iqn, portal, lun),
                           ATTACH_TIMEOUT)
    except BaseException:
        with contextlib.suppress(CloudboxError):
            att.detach()
        raise
    return att


# -- NBD: nbd-client with TLS --------------------------------------------------------------------------------------
def _free_nbd() -> str:
    for d in sorted(Path("/sys/block").glob("nbd*"), key=lambda p: int(p.name[3:]) if p.name[3:].isdigit() else 0):
        if not (d / "pid").exists() and (d / "size").read_text().strip() == "0":
            return f"/dev/{d.name}"
    raise CloudboxError("every NBD device of this host is in use (/sys/block/nbd*); load nbd with more "
                        "(modprobe nbd nbds_max=N) or end what holds them")


def _nbd_size(dev: str) -> int:
    try:
        return int(Path(f"/sys/block/{Path(dev).name}/size").read_text())
    except (OSError, ValueError):
        return 0


def attach_nbd(host: str, port: int, name: str, client_dir: Path, *, log: Path) -> HostAttachment:
    """nbd-client, a child of this process that dies with it, connects a free /dev/nbdN to export `name` on
    host:port with TLS (this box's client certificate from `client_dir`, the server's checked against its CA and
    the address connected to); returns once the device has its size."""
    if (p := tool_problem("nbd")):
        raise CloudboxError(p)
    _modprobe("nbd")
    dev = _free_nbd()
    connected = ledger.hold(NbdDevice(dev, f"nbds://{host}:{port}/{name}"))
    cmd = ["nbd-client", host, str(port), dev, "-name", name, "-cacertfile", str(client_dir / "ca-cert.pem"),
           "-certfile", str(client_dir / "client-cert.pem"), "-keyfile", str(client_dir / "client-key.pem"),
           "-tlshostname", host, "-nonetlink", "-nofork", "-block-size", "4096"]
    try:
        child = procs.Child.start(cmd, log=log, ready=lambda _pid: _nbd_size(dev) > 0, serving=f"{dev} from {host}",
                                  ready_is=f"connect {dev} to nbds://{host}:{port}/{name}", timeout=ATTACH_TIMEOUT)
    except BaseException:
        connected.release()
        raise
    att = HostAttachment("nbd", dev, "nbd-client with TLS (the kernel's nbd)")

    def disconnect() -> None:
        connected.release()
        child.stop()
    att._undo.append(disconnect)
    return att


# -- AoE: the kernel's aoe driver ------------------------------------------------------------------------------------
AOE_IFLIST = Path("/sys/module/aoe/parameters/aoe_iflist")


def attach_aoe(target: str, iface: str) -> HostAttachment:
    """The kernel's aoe driver, listening on `iface` (added to its interface list for the attachment), finds
    `target` (eS.N); returns /dev/etherd/eS.N. AoE has no login: detaching removes the device (flush)."""
    att = HostAttachment("aoe", "", "the kernel's aoe driver")
    if not AOE_IFLIST.exists():
        _modprobe("aoe", params=(f"aoe_iflist={iface}",))
        # loaded for this attachment: unloaded after it, so no AoE listener outlives the run
        att._undo.append(lambda: subprocess.run(["modprobe", "-r", "aoe"], capture_output=True))
    before = AOE_IFLIST.read_text().strip()
    if before and iface not in before.split():
        AOE_IFLIST.write_text(f"{before} {iface}")
        att._undo.append(lambda: AOE_IFLIST.write_text(before))
    elif not before:  # an empty list takes every interface: keep AoE to this one while attached
        AOE_IFLIST.write_text(iface)
        att._undo.append(lambda: AOE_IFLIST.write_text(""))
    dev = f"/dev/etherd/{target}"

    def found() -> str:
        size = Path(f"/sys/block/etherd!{target}/size")
        if Path(dev).exists() and size.exists() and size.read_text().strip() not in ("", "0"):
            return dev
        with contextlib.suppress(OSError):
            Path("/dev/etherd/discover").write_text("\n")  # ask again: the first may have left before the link
        return ""
    found_it = ledger.hold(AoeDevice(target))
    att._undo.append(found_it.release)
    try:
        att.device = _wait(f"AoE target {target} on {iface}", found, ATTACH_TIMEOUT / 2)
    except BaseException:
        att.detach()
        raise
    return att


# -- NVMe/TCP: the kernel's nvme_tcp -------------------------------------------------------------------------------
@dataclass(frozen=True)
class NvmeHost:
    """An NVMe host identity: its NQN and host ID, and its DH-HMAC-CHAP secret (DHHC-1 format)."""

    nqn: str
    hostid: str
    key: str = field(repr=False)
    ctrl_key: str = field(default="", repr=False)  # the target's DH-HMAC-CHAP key (bidirectional); '' for none

    def __post_init__(self) -> None:
        keep_secret(self.key)  # masked wherever it turns up in this process's messages, events and reasons
        keep_secret(self.ctrl_key)


def dhchap_secret() -> str:
    """A new DH-HMAC-CHAP secret as nvme-cli's gen-dhchap-key writes it: 32 random bytes and their CRC-32, base64,
    untransformed (hash 00)."""
    raw = secrets.token_bytes(32)
    return "DHHC-1:00:" + base64.b64encode(raw + zlib.crc32(raw).to_bytes(4, "little")).decode() + ":"


def new_nvme_host(label: str) -> NvmeHost:
    """A new identity named host.<label> (the label unique: it carries a random part), with its key and the key the
    target answers with (bidirectional DH-HMAC-CHAP)."""
    return NvmeHost(f"{nvmet.NQN_PREFIX}:host.{label}", str(uuid.uuid4()), dhchap_secret(), dhchap_secret())


def nvme_ids(h: NvmeHost) -> dict[str, str]:
    """An identity as its files keep it."""
    return {"nqn": h.nqn, "hostid": h.hostid, "key": h.key, "ctrl_key": h.ctrl_key}


def read_nvme_ids(data: dict[str, str]) -> NvmeHost:
    """An identity from its file's fields (KeyError: one is missing); an older file has no target key."""
    return NvmeHost(str(data["nqn"]), str(data["hostid"]), str(data.get("key", "")), str(data.get("ctrl_key", "")))


def nvme_host_file() -> Path:
    return paths.state_dir() / "pki" / "nvme" / "host.json"


def nvme_host(f: Path | None = None) -> NvmeHost:
    """This box's NVMe host identity, made on first use (the file 0600 in a 0700 directory); an older file gets
    the target's key."""
    f = f or nvme_host_file()
    if not f.exists():
        write_private_json(f, nvme_ids(new_nvme_host(f"box-{secrets.token_hex(4)}")))
    try:
        data = json.loads(f.read_text())
        if not data.get("ctrl_key"):  # made before targets answered with a key of their own
            data["ctrl_key"] = dhchap_secret()
            write_private_json(f, data)
        return read_nvme_ids(data)
    except (OSError, ValueError, KeyError) as e:
        raise CloudboxError(f"{f}: this box's NVMe host identity cannot be read ({e}); remove the file to make a "
                            "new one") from None


def fabrics_options(host: str, port: int, nqn: str, ident: NvmeHost, *, authenticate: bool) -> str:
    """The kernel's connect options: with `authenticate`, this host's key, and the target's, which the kernel then
    checks too (bidirectional: a host answering on the target's address without it hands this host no disk)."""
    opts = f"transport=tcp,traddr={host},trsvcid={port},nqn={nqn},hostnqn={ident.nqn},hostid={ident.hostid}"
    if authenticate and ident.key:
        opts += f",dhchap_secret={ident.key}" + (f",dhchap_ctrl_secret={ident.ctrl_key}" if ident.ctrl_key else "")
    return opts


def _nvme_namespace(ctrl: str) -> str:
    """The block device of namespace 1 behind controller `ctrl`: nvmeXnY itself, or with native multipath the head
    nvmeXn1 of its path nvmeXcYn1."""
    for ns in sorted((NVME_CTRLS / ctrl).glob("nvme*n*")):
        name = ns.name
        if "c" in name[4:]:  # nvme<subsys>c<ctrl>n<ns>: the path; the disk is its head
            sub, _, rest = name[4:].partition("c")
            name = f"nvme{sub}n{rest.partition('n')[2]}"
        if Path(f"/dev/{name}").exists():
            return f"/dev/{name}"
    return ""


def attach_nvme(host: str, port: int, nqn: str, ident: NvmeHost, *, authenticate: bool) -> HostAttachment:
    """The kernel's NVMe/TCP host connects to subsystem `nqn` on host:port as `ident` (with its DH-HMAC-CHAP secret
    when `authenticate`); returns namespace 1's disk. A refusal (not on the allow-list, a wrong key) names what the
    kernel said."""
    _modprobe("nvme_tcp")
    opts = fabrics_options(host, port, nqn, ident, authenticate=authenticate)
    connected = ledger.hold(NvmeController(nqn, host, str(port)))
    try:
        fd = os.open(NVME_FABRICS, os.O_RDWR)
    except OSError as e:
        connected.done()
        raise CloudboxError(f"cannot open {NVME_FABRICS} (the kernel's NVMe over Fabrics host): {e.strerror}") \
            from None
    try:
        os.write(fd, opts.encode())
        answer = os.read(fd, 4096).decode()
    except OSError as e:
        connected.done()
        raise CloudboxError(masked(f"the kernel's NVMe/TCP host could not connect to {nqn} on {host}:{port}: "
                                   f"{e.strerror} (kernel: {_dmesg_tail(4)})")) from None
    finally:
        os.close(fd)
    fields = dict(kv.split("=", 1) for kv in answer.strip().split(",") if "=" in kv)
    ctrl = f"nvme{fields.get('instance', '?')}"
    connected.update(controller=ctrl)
    att = HostAttachment("nvme-tcp", "", "the kernel's NVMe/TCP host (nvme_tcp)"
                         + ((", DH-HMAC-CHAP both ways" if ident.ctrl_key else ", DH-HMAC-CHAP")
                            if authenticate and ident.key else ""))
    att._undo.append(connected.release)
    try:
        att.device = _wait(f"namespace {nvmet.NSID} of {nqn} ({ctrl})", lambda: _nvme_namespace(ctrl),
                           ATTACH_TIMEOUT / 2)
    except BaseException:
        att.detach()
        raise
    return att


# -- what the run's ledger holds ---------------------------------------------------------------------------------
def _session(iqn: str, portal: str) -> bool:
    """This host has a session to `iqn` (at `portal`, where sysfs says which)."""
    for s in ISCSI_SESSIONS.glob("session*"):
        with contextlib.suppress(OSError):
            if (s / "targetname").read_text().strip() != iqn:
                continue
            conn = next(Path("/sys/class/iscsi_connection").glob(f"connection{s.name.removeprefix('session')}:*"),
                        None)
            if conn is None:
                return True
            where = f"{(conn / 'persistent_address').read_text().strip()}:" \
                    f"{(conn / 'persistent_port').read_text().strip()}"
            if where == portal:
                return True
    return False


@ledger.kind
@dataclass(frozen=True)
class IscsiSession(ledger.Held):
    """This host's login to a target (open-iscsi), with its node record: logged out and the record deleted."""

    kind: ClassVar[str] = "iscsi-session"
    iqn: str = ""
    portal: str = ""

    def release(self) -> str:
        node = ["-m", "node", "-T", self.iqn, "-p", self.portal, "-I", ISCSI_IFACE]
        had = _session(self.iqn, self.portal)
        if had:
            _iscsiadm(*node, "--logout", ok=(0, 21))
        if shutil.which("iscsiadm"):
            _iscsiadm(*node, "-o", "delete", ok=(0, 21))
        return f"logged out of iSCSI target {self.iqn} ({self.portal})" if had else ""


@ledger.kind
@dataclass(frozen=True)
class NvmeController(ledger.Held):
    """This host's NVMe/TCP connection to a subsystem: its controller deleted."""

    kind: ClassVar[str] = "nvme-controller"
    nqn: str = ""
    host: str = ""
    port: str = ""
    controller: str = ""  # nvmeN, once connected

    def release(self) -> str:
        gone = []
        for c in NVME_CTRLS.glob("nvme*"):
            with contextlib.suppress(OSError):
                if (c / "subsysnqn").read_text().strip() != self.nqn:
                    continue
                address = (c / "address").read_text()
                if f"traddr={self.host}" not in address or f"trsvcid={self.port}" not in address:
                    continue
                (c / "delete_controller").write_text("1")
                gone.append(c.name)
        return f"disconnected NVMe controller {', '.join(gone)} ({self.nqn})" if gone else ""


@ledger.kind
@dataclass(frozen=True)
class NbdDevice(ledger.Held):
    """An NBD device nbd-client connected for the run: disconnected when it is still connected."""

    kind: ClassVar[str] = "nbd-device"
    device: str = ""
    export: str = ""

    def release(self) -> str:
        if not Path(f"/sys/block/{Path(self.device).name}/pid").exists():
            return ""
        subprocess.run(["nbd-client", "-d", self.device], capture_output=True, timeout=30)
        return f"disconnected {self.device} ({self.export})"


@ledger.kind
@dataclass(frozen=True)
class AoeDevice(ledger.Held):
    """The aoe driver's device of a target the run found: flushed (removed) when it is there."""

    kind: ClassVar[str] = "aoe-device"
    target: str = ""

    def release(self) -> str:
        if not Path(f"/sys/block/etherd!{self.target}").exists():
            return ""
        Path("/dev/etherd/flush").write_text(self.target)
        return f"removed AoE device {self.target}"


# -- leftovers of runs killed outright ---------------------------------------------------------------------------
def leftovers() -> dict[str, list[str]]:
    """What this host's kernel still has attached from cloudbox's targets: iSCSI sessions, NVMe controllers, NBD
    devices connected by nbd-client, AoE devices (a test's check that a run left nothing)."""
    out: dict[str, list[str]] = {"iscsi": [], "nvme": [], "nbd": [], "aoe": []}
    for s in ISCSI_SESSIONS.glob("session*"):
        with contextlib.suppress(OSError):
            if (s / "targetname").read_text().startswith(iscsi.IQN_PREFIX):
                out["iscsi"].append(s.name)
    for c in NVME_CTRLS.glob("nvme*"):
        with contextlib.suppress(OSError):
            if (c / "subsysnqn").read_text().startswith(nvmet.NQN_PREFIX):
                out["nvme"].append(c.name)
    out["nbd"] = [d.name for d in Path("/sys/block").glob("nbd*") if (d / "pid").exists()]
    out["aoe"] = [d.name.replace("etherd!", "") for d in Path("/sys/block").glob("etherd!*")]
    return out


def forget_iscsi_records() -> list[str]:
    """Delete open-iscsi's node records of cloudbox's targets (a run killed outright leaves its record, the CHAP
    secrets in it, in /etc/iscsi/nodes; called with no live run's session, after the logouts); returns them."""
    if shutil.which("iscsiadm") is None:
        return []
    try:
        r = subprocess.run(["iscsiadm", "-m", "node"], capture_output=True, text=True, timeout=ATTACH_TIMEOUT)
    except subprocess.TimeoutExpired:
        return []
    gone = []
    for line in r.stdout.splitlines():  # "HOST:PORT,TPGT IQN"
        portal, _, iqn = line.strip().partition(" ")
        if not iqn.startswith(iscsi.IQN_PREFIX):
            continue
        with contextlib.suppress(CloudboxError, subprocess.SubprocessError):
            _iscsiadm("-m", "node", "-T", iqn, "-p", portal.partition(",")[0], "-o", "delete", ok=(0, 21))
            gone.append(f"iSCSI node record {iqn} ({portal.partition(',')[0]}) and its CHAP secrets")
    return gone


def reap() -> list[str]:
    """Log out and disconnect what runs that died left attached to cloudbox's targets, and delete their iSCSI node
    records (called while this host's run lock is held, so none of it is a live run's); returns what it removed."""
    gone = []
    for s in ISCSI_SESSIONS.glob("session*"):
        with contextlib.suppress(OSError, CloudboxError, subprocess.SubprocessError):
            if (s / "targetname").read_text().startswith(iscsi.IQN_PREFIX):
                _iscsiadm("-m", "session", "-r", s.name.removeprefix("session"), "-u")
                gone.append(f"iSCSI {s.name}")
    for c in NVME_CTRLS.glob("nvme*"):
        with contextlib.suppress(OSError):
            if (c / "subsysnqn").read_text().startswith(nvmet.NQN_PREFIX):
                (c / "delete_controller").write_text("1")
                gone.append(f"NVMe controller {c.name}")
    gone += forget_iscsi_records()
    if Path("/dev/etherd/flush").exists() and list(Path("/sys/block").glob("etherd!*")):
        with contextlib.suppress(OSError):
            Path("/dev/etherd/flush").write_text("\n")  # the devices whose target is down
            gone.append("AoE devices whose target is gone")
    return gone
