"""One NVMe/TCP export of a volume: the kernel's NVMe target (nvmet, nvmet-tcp), configured through configfs.

nvmet is in the kernel, so no process serves the volume: the export is a subsystem (the volume's file as namespace 1,
opened with O_DIRECT: the server's page cache is not part of the volume), an allow-list of host NQNs (any other host
is refused at connect), optionally a DH-HMAC-CHAP key per host where the kernel has NVMe in-band authentication, and
a TCP port on one address. `stop()` takes every entry down again, in reverse order. A run killed outright cannot do
that, so the subsystem's serial carries the run's id and `reap()` removes the exports of runs that are gone.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from ... import ledger
from ...errors import CloudboxError
from ...procs import free_port, listening, wait_for

CONFIGFS = Path("/sys/kernel/config")
NQN_PREFIX = "nqn.2026-11.org.cloudbox"
NSID = 1
MODULES = ("nvmet", "nvmet_tcp")
SERIAL_LEN = 20  # NVMe's serial number field
LISTEN_TIMEOUT = 10.0


def root(configfs: Path = CONFIGFS) -> Path:
    return configfs / "nvmet"


def subsystem_nqn(volume: str) -> str:
    return f"{NQN_PREFIX}:vol.{volume}"


def run_serial(run_uuid: str) -> str:
    """The subsystem's serial number: the run's id, so a leftover export names the run that made it."""
    return run_uuid.replace("-", "")[:SERIAL_LEN]


def problem(has_module) -> str:
    """Why this host cannot serve NVMe/TCP ('' when it can): the target modules and configfs."""
    missing = [m for m in MODULES if not has_module(m)]
    if missing:
        return (f"the kernel's NVMe target ({', '.join(missing)}) is not in this kernel (not built in, no loadable "
                "module in /lib/modules)")
    return ""


def load(configfs: Path = CONFIGFS) -> Path:
    """The target's configfs tree, its modules loaded and configfs mounted first; CloudboxError naming what failed."""
    r = subprocess.run(["modprobe", "-a", *MODULES], capture_output=True, text=True)
    if r.returncode != 0:
        raise CloudboxError(f"cannot load the kernel's NVMe target (modprobe {' '.join(MODULES)}): "
                            f"{(r.stderr or r.stdout).strip()}")
    if not root(configfs).is_dir():
        subprocess.run(["mount", "-t", "configfs", "configfs", str(configfs)], capture_output=True)
    if not root(configfs).is_dir():
        raise CloudboxError(f"the NVMe target's configfs tree {root(configfs)} is not there after loading "
                            f"{', '.join(MODULES)} (is configfs mounted on {configfs}?)")
    return root(configfs)


def _write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError as e:
        shown = "its key" if path.name.startswith("dhchap") else repr(value)
        raise CloudboxError(f"cannot set the NVMe target's {path} to {shown}: {e.strerror or e}") from None


def auth_supported(configfs: Path = CONFIGFS) -> bool:
    """Whether this kernel's target has NVMe in-band authentication (DH-HMAC-CHAP): a host entry has dhchap_key."""
    hosts = root(configfs) / "hosts"
    probe = hosts / f"{NQN_PREFIX}:probe-{os.getpid()}"
    try:
        probe.mkdir()
    except OSError:
        return False
    try:
        return (probe / "dhchap_key").exists()
    finally:
        with contextlib.suppress(OSError):
            probe.rmdir()


def _listening(port: int) -> bool:
    """True once the kernel listens on TCP `port` (nvmet-tcp's socket belongs to no process)."""
    return bool(listening(port))


@dataclass
class NvmetExport:
    """A running export: nvme+tcp://host:port/<subsystem NQN>, open to the hosts in `allowed`."""

    name: str
    path: str
    host: str
    port: int
    nqn: str
    port_id: int
    allowed: tuple[str, ...] = field(repr=False)  # a guest's NQN is its only credential: never shown
    serial: str = ""
    authenticated: bool = False  # each allowed host proves its DH-HMAC-CHAP key
    mutual: bool = False  # ... and the target proves its own to them
    server: str = "nvmet (the kernel's NVMe/TCP target)"
    base: Path = field(default=CONFIGFS / "nvmet", repr=False)
    _made_hosts: list[str] = field(default_factory=list, repr=False)
    _stopped: bool = field(default=False, repr=False)

    @property
    def uri(self) -> str:
        return f"nvme+tcp://{self.host}:{self.port}/{self.nqn}"

    @property
    def target(self) -> str:
        return self.nqn

    pid = None  # in the kernel: no server process

    def io(self) -> dict[str, int]:
        return {}

    def stop(self) -> None:
        """Take the export down: the port's link (connected hosts are dropped), the port, the namespace, the
        allow-list, the subsystem, and the host entries it made that no other subsystem allows. Safe to call twice."""
        if self._stopped:
            return
        self._stopped = True
        _teardown(self.base, self.nqn, self.port_id)
        for h in self._made_hosts:
            _remove_host_if_unused(self.base, h)
        ledger.active().done(Export(self.nqn, self.serial, self.port_id, str(self.base)))


@ledger.kind
@dataclass(frozen=True)
class Export(ledger.Held):
    """A subsystem and port the run made in the kernel's NVMe target (configfs): taken down when the subsystem there
    is still the run's (its serial), with the host entries no other subsystem allows."""

    kind: ClassVar[str] = "nvmet-export"
    nqn: str = ""
    serial: str = ""
    port_id: int = 0
    base: str = str(CONFIGFS / "nvmet")

    def release(self) -> str:
        base, sub = Path(self.base), Path(self.base) / "subsystems" / self.nqn
        if not sub.is_dir():
            return ""
        try:
            if (sub / "attr_serial").read_text().strip() != self.serial:
                return ""  # another run's export of the same volume by now
        except OSError:
            pass
        hosts = [h.name for h in (sub / "allowed_hosts").iterdir()] if (sub / "allowed_hosts").is_dir() else []
        _teardown(base, self.nqn, self.port_id or None)
        for h in hosts:
            _remove_host_if_unused(base, h)
        return f"removed NVMe/TCP export {self.nqn}"


def _teardown(base: Path, nqn: str, port_id: int | None) -> None:
    """Remove subsystem `nqn` and (when given) port `port_id` from the target's tree; what is gone already is fine."""
    sub = base / "subsystems" / nqn
    ports = [base / "ports" / str(port_id)] if port_id is not None else [
        p for p in (base / "ports").glob("*") if (p / "subsystems" / nqn).is_symlink()]
    for port in ports:
        with contextlib.suppress(FileNotFoundError):
            (port / "subsystems" / nqn).unlink()
        if port_id is not None or not any((port / "subsystems").iterdir()):
            _rmdir(port)
    ns = sub / "namespaces" / str(NSID)
    if ns.is_dir():
        with contextlib.suppress(OSError):
            (ns / "enable").write_text("0")
        _rmdir(ns)
    if (sub / "allowed_hosts").is_dir():
        for link in (sub / "allowed_hosts").iterdir():
            with contextlib.suppress(FileNotFoundError):
                link.unlink()
    _rmdir(sub)


def _rmdir(p: Path) -> None:
    # configfs may answer EBUSY for a moment while the kernel drops a controller that was connected
    for _ in range(50):
        try:
            p.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno != errno.EBUSY:
                raise CloudboxError(f"cannot remove the NVMe target's {p}: {e.strerror}") from None
            time.sleep(0.1)
    raise CloudboxError(f"cannot remove the NVMe target's {p}: still busy after 5 s")


def _remove_host_if_unused(base: Path, host_nqn: str) -> None:
    for sub in (base / "subsystems").glob("*"):
        if (sub / "allowed_hosts" / host_nqn).is_symlink():
            return
    with contextlib.suppress(OSError):
        (base / "hosts" / host_nqn).rmdir()


def _free_port_id(base: Path) -> int:
    taken = {int(p.name) for p in (base / "ports").glob("*") if p.name.isdigit()}
    return next(i for i in range(1, 65535) if i not in taken)


def start(name: str, path: str, *, allowed: dict[str, str], run_uuid: str, host: str = "127.0.0.1",
          port: int | None = None, configfs: Path = CONFIGFS, ctrl_keys: dict[str, str] | None = None
          ) -> NvmetExport:
    """Export `path` as namespace 1 of subsystem nqn...:vol.<name> on host:port (a free port when None), for the
    host NQNs in `allowed` only (NQN -> its DH-HMAC-CHAP key, '' for none), the target answering a keyed host with
    its key in `ctrl_keys` (bidirectional, where this kernel's target has it); returns once the kernel listens. On
    failure nothing is left."""
    base = load(configfs)
    nqn = subsystem_nqn(name)
    if (base / "subsystems" / nqn).exists():
        raise CloudboxError(f"the NVMe target already has subsystem {nqn} (another run's export of volume "
                            f"{name!r}?); a volume serves one run at a time")
    keyed = any(allowed.values())
    if keyed and not auth_supported(configfs):
        raise CloudboxError("this kernel's NVMe target has no in-band authentication (DH-HMAC-CHAP, "
                            "CONFIG_NVME_TARGET_AUTH), so it cannot check the hosts' keys")
    port = port or free_port(host)
    exp = NvmetExport(name, path, host, port, nqn, _free_port_id(base), tuple(allowed), run_serial(run_uuid),
                      authenticated=keyed, base=base)
    sub = base / "subsystems" / nqn
    ledger.hold(Export(nqn, exp.serial, exp.port_id, str(base)))  # stop() marks it released
    try:
        for h, key in allowed.items():
            entry = base / "hosts" / h
            if not entry.exists():
                entry.mkdir()
                exp._made_hosts.append(h)
            if key:
                _write(entry / "dhchap_key", key)
                ctrl = (ctrl_keys or {}).get(h, "")
                if ctrl and (entry / "dhchap_ctrl_key").exists():
                    _write(entry / "dhchap_ctrl_key", ctrl)
                    exp.mutual = True
        sub.mkdir()
        _write(sub / "attr_allow_any_host", "0")
        _write(sub / "attr_serial", exp.serial)
        for h in allowed:
            (sub / "allowed_hosts" / h).symlink_to(base / "hosts" / h)
        ns = sub / "namespaces" / str(NSID)
        ns.mkdir()
        _write(ns / "device_path", path)
        _write(ns / "enable", "1")
        p = base / "ports" / str(exp.port_id)
        p.mkdir()
        for attr, value in (("addr_trtype", "tcp"), ("addr_adrfam", "ipv6" if ":" in host else "ipv4"),
                            ("addr_traddr", host), ("addr_trsvcid", str(port))):
            _write(p / attr, value)
        (p / "subsystems" / nqn).symlink_to(sub)
        wait_for(lambda: _listening(port), LISTEN_TIMEOUT,
                 lambda: f"the kernel's NVMe/TCP target did not listen on {host}:{port} within {LISTEN_TIMEOUT:.0f} s "
                 "(dmesg says why)")
    except BaseException:
        exp.stop()
        raise
    return exp


@dataclass(frozen=True)
class Leftover:
    nqn: str
    serial: str
    ports: tuple[str, ...]


def exports(configfs: Path = CONFIGFS) -> list[Leftover]:
    """cloudbox's subsystems in the target now, with their serial (the run) and the ports that serve them (a
    test's check that none is left; `reap`'s input)."""
    base = root(configfs)
    out = []
    for sub in sorted((base / "subsystems").glob(f"{NQN_PREFIX}:*")):
        try:
            serial = (sub / "attr_serial").read_text().strip()
        except OSError:
            serial = ""
        ports = tuple(p.name for p in (base / "ports").glob("*") if (p / "subsystems" / sub.name).is_symlink())
        out.append(Leftover(sub.name, serial, ports))
    return out


def reap(live_runs: set[str], configfs: Path = CONFIGFS) -> list[str]:
    """Take down the exports whose run (their serial) is not among `live_runs` (a run killed outright leaves its
    subsystem in the kernel); returns their NQNs."""
    if not root(configfs).is_dir():
        return []
    live = {run_serial(u) for u in live_runs}
    gone = []
    for left in exports(configfs):
        if left.serial and left.serial not in live:
            _teardown(root(configfs), left.nqn, None)
            gone.append(left.nqn)
    return gone


GUEST_TIMEOUT = 60.0  # the connect, then namespace 1's disk appearing in the guest


GUEST_CONNECT = "/run/cloudbox-nvme"  # in the guest: the connect options, written by the agent (tmpfs), then removed


def attach_in_guest(guest, exp: NvmetExport, host_nqn: str, hostid: str) -> str:
    """In the benchmark guest (its NIC already has its address): nvme_tcp loaded and its kernel's NVMe/TCP host
    connected to `exp` through /dev/nvme-fabrics as `host_nqn` (the export's allow-list; the guest's kernel has no
    in-band authentication); returns namespace 1's disk (the multipath head where the kernel makes one). The host
    NQN is the guest's only credential, so it reaches the guest by the agent's file write and is in no script text,
    message or log line."""
    opts = f"transport=tcp,traddr={exp.host},trsvcid={exp.port},nqn={exp.nqn},hostnqn={host_nqn},hostid={hostid}"
    guest.run(["mkdir", "-p", "-m", "0700", GUEST_CONNECT], timeout=30, check=True)
    guest.put_file(f"{GUEST_CONNECT}/options", opts.encode(), 0o600)
    script = (f"modprobe nvme_tcp || exit 3; cat {GUEST_CONNECT}/options > /dev/nvme-fabrics || exit 4; "
              f"rm -rf {GUEST_CONNECT}; "
              f"for i in $(seq {int(GUEST_TIMEOUT * 5)}); do for c in /sys/class/nvme/nvme*; do "
              f"[ \"$(cat $c/subsysnqn 2>/dev/null)\" = '{exp.nqn}' ] || continue; for n in $c/nvme*n{NSID}; do "
              "[ -e \"$n\" ] || continue; b=${n##*/}; case $b in *c*n*) b=\"${b%%c*}n${b##*n}\";; esac; "
              "[ -b /dev/$b ] && { echo /dev/$b; exit 0; }; done; done; sleep 0.2; done; exit 1")
    try:
        p = guest.sh(f"{script} 2>&1", timeout=GUEST_TIMEOUT + 30)
    finally:
        with contextlib.suppress(CloudboxError):
            guest.run(["rm", "-rf", GUEST_CONNECT], timeout=30)
    if p.exitcode == 0 and p.stdout.strip().startswith("/dev/"):
        return p.stdout.strip().splitlines()[-1]
    said = guest.sh("dmesg | grep -i nvme | tail -n 6; ls /sys/class/nvme 2>&1", timeout=30).stdout.strip()
    what = {3: "could not load its nvme_tcp driver (rebuild the guest image: make guest-image)",
            4: f"was refused connecting to {exp.uri} (its host NQN is not on the allow-list?)"}.get(
                p.exitcode, "connected, but namespace 1 did not appear")
    raise CloudboxError(f"the guest {what} (exit {p.exitcode}): {(p.stdout + p.stderr).strip()[-200:]}; its kernel "
                        f"said: {' | '.join(said.splitlines())[-500:]}".replace(host_nqn, "<its host NQN>"))
