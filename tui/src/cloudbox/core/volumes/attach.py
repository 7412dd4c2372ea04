"""A network volume for one run: checked, exported, described as the run's backing store, and taken down again.

`export_for_run()` checks the profile's volume (`<scheme>:<volume name>`) and attach mode against what this host and
this cloudbox can do before anything is made, marks the volume attached by the run, exports it and returns a
`VolumeExport` whose `close()` undoes all of that (the executor registers it in the run's cleanup stack). What
works today: NBD with TLS (qemu-nbd, this box's x509 credentials) attached by QEMU's own NBD client (disk.attach =
qemu); the baseline is the same export from the host domain through fio's nbd engine (libnbd, user space). AoE
attached by the guest itself (disk.attach = guest): vblade serves the volume on the bridge of the guest's NIC once
that exists (`VolumeExport.serve()`), the guest's `aoe` driver reads it; no baseline, `no_baseline` says why.
iSCSI with CHAP (tgtd, this box's CHAP secret and initiator name) attached by QEMU's libiscsi driver (disk.attach =
qemu), which logs in with a libvirt secret made for the run, or by the guest's own initiator (disk.attach = guest:
the kernel's iscsi_tcp and open-iscsi's iscsistart, logging in with the same CHAP secret over its NIC); its baseline
is the target from the host domain through libiscsi: iscsi-perf's direct reads, the rest through QEMU's libiscsi in
qemu-nbd, measured by fio's nbd engine. NFS (nfs:<name>, disk.attach = guest): not a stored volume but a fresh
directory in the run's work directory, exported by nfs-ganesha on the guest's bridge and mounted by the guest's NFSv4
client; the baseline runs on a file in that directory from the host domain, without NFS (this kernel has no NFS
client); on a back-end, the front-end serves it and the back-end's host mounts it for the baseline.
"""

from __future__ import annotations

import os
import platform
import shutil
import typing
from dataclasses import dataclass, field
from pathlib import Path

from .. import backing, profiles
from ..errors import CloudboxError, NoSpace
from . import aoe, iscsi, nbd, nfs, pki
from .store import VolumeBusy, VolumeStore, check_name

# The host kernel's initiator of each scheme (disk.attach = host).
HOST_MODULES = {"aoe": "aoe", "iscsi": "iscsi_tcp", "nbd": "nbd", "nfs": "nfsv4", "nvme-tcp": "nvme_tcp"}
BASELINE_LABEL = "volume-from-host"  # the baseline is the volume from the host domain, not a local disk
# what the benchmark guest attaches itself (its image has aoe, nbd, nbd-client, iscsi_tcp, iscsistart and nfsv4)
GUEST_SCHEMES = ("aoe", "nbd", "iscsi", "nfs")
# scheme -> (server, Debian package)
SERVERS = {"nbd": ("qemu-nbd", "qemu-utils"), "aoe": ("vblade", "vblade"), "iscsi": ("tgtd", "tgt"),
           "nfs": ("ganesha.nfsd", "nfs-ganesha")}
# how an iSCSI baseline test reached the target: libiscsi's iscsi-perf itself, or QEMU's libiscsi in qemu-nbd
ISCSI_READER_LABELS = {"direct": "iscsi-perf", "relay": "libiscsi-relay"}
NFS_BASELINE_LABEL = "nfs-export-dir"  # the baseline ran on the export's directory on the server's disk, not over NFS
NFS_HOST_MOUNT = "nfs-host"  # in a back-end's run work directory: where its host mounts the front-end's export
QEMU_ATTACH = ("nbd", "iscsi")  # the schemes disk.attach = qemu serves here


class AttachRefused(CloudboxError):
    """This attach mode or scheme cannot run here (or not yet): the message says why and where it does; `summary`
    is its first sentence, for a table cell."""

    def __init__(self, message: str, summary: str = ""):
        super().__init__(message)
        self.summary = summary or message


def kernel_module_available(module: str, release: str | None = None) -> bool:
    """True when the running kernel has `module` loaded or built in, or can load it from /lib/modules."""
    if Path(f"/sys/module/{module}").exists():
        return True
    base = Path("/lib/modules") / (release or platform.release())
    for listing in ("modules.builtin", "modules.dep"):
        try:
            text = (base / listing).read_text()
        except OSError:
            continue
        for line in text.splitlines():
            path = line.split(":", 1)[0]
            stem = os.path.basename(path).split(".ko", 1)[0]
            if stem.replace("-", "_") == module:
                return True
    return False


def check_attach(scheme: str, attach: str, *, hypervisor: str = "kvm", has_module=kernel_module_available) -> None:
    """Refuse (AttachRefused) what this host or this cloudbox cannot do, saying why and where it works."""
    if attach == "host":
        module = HOST_MODULES[scheme]
        lacks = "" if has_module(module) else (f", which this kernel ({platform.release()}) lacks as well (not built "
                                               "in, no loadable module in /lib/modules)")
        summary = f"disk.attach = host ({scheme}) is not implemented yet"
        raise AttachRefused(
            f"{summary}: the host's kernel would attach the volume with its {module} driver{lacks}. Use "
            "disk.attach = qemu (" + ", ".join(f"{s}:" for s in QEMU_ATTACH) + " volumes; presets kvm-ebs-nbd, "
            "kvm-ebs-iscsi) or disk.attach = guest (" + ", ".join(f"{s}:" for s in GUEST_SCHEMES)
            + " volumes; presets kvm-ebs-aoe-guest, kvm-ebs-nbd-guest, kvm-ebs-iscsi-guest, nfs-async-tcp)", summary)
    if attach == "guest":
        if scheme not in GUEST_SCHEMES:
            raise AttachRefused(f"disk.attach = guest ({scheme}) is not implemented yet; the guest attaches "
                                + ", ".join(f"{s}:" for s in GUEST_SCHEMES) + " volumes (presets kvm-ebs-aoe-guest, "
                                "kvm-ebs-nbd-guest, kvm-ebs-iscsi-guest, nfs-async-tcp)")
        if hypervisor != "kvm":
            raise AttachRefused(f"disk.attach = guest is implemented under KVM/QEMU only, not guest.hypervisor = "
                                f"{hypervisor}")
        return
    if scheme not in QEMU_ATTACH:
        raise AttachRefused(f"disk.attach = qemu ({scheme}) is not implemented yet; "
                            + " and ".join(f"{s}:" for s in QEMU_ATTACH) + " volumes are")


@dataclass(frozen=True)
class Export:
    """How this host can export a volume over one scheme: the server, and who can attach it (disk.attach)."""

    scheme: str
    server: str
    attach: tuple[str, ...]  # the disk.attach modes check_attach lets through here
    problem: str = ""  # why no run can use it here ('' when the server is installed)

    @property
    def usable(self) -> bool:
        return not self.problem and bool(self.attach)


def exports_here(*, hypervisor: str = "kvm", has_module=kernel_module_available) -> list[Export]:
    """Every scheme cloudbox serves a stored volume over (not nfs:), with the attach modes check_attach accepts on
    this host and whether the server is installed. Reads only PATH and the kernel's module lists; makes nothing."""
    out = []
    for scheme, (server, package) in SERVERS.items():
        if scheme == "nfs":  # an NFS export is a run's own directory, never a stored volume
            continue
        modes = []
        for mode in typing.get_args(profiles.Attach):
            try:
                check_attach(scheme, mode, hypervisor=hypervisor, has_module=has_module)
            except AttachRefused:
                continue
            modes.append(mode)
        if scheme == "iscsi" and iscsi.qemu_driver() is None and "qemu" in modes:
            modes.remove("qemu")  # QEMU's libiscsi driver (qemu-block-extra) is missing; the guest's initiator is not
        problem = "" if shutil.which(server) else (f"{server} is not installed (Debian package {package}): run "
                                                   "'make deps'")
        out.append(Export(scheme, server, tuple(modes), problem))
    return out


@dataclass
class VolumeExport:
    """A volume exported for one run, as the run's backing store (`store`)."""

    volume: str
    scheme: str
    attach: str
    store: backing.BackingStore
    export: nbd.NbdExport | aoe.AoeExport | iscsi.IscsiExport | nfs.NfsExport | None  # None until served
    run_uuid: str
    path: str = ""  # the volume's file
    work_dir: Path = Path(".")  # the run's work directory (vblade's log; removed with the store)
    tls: str = "x509 (this box's CA; client certificates required)"
    no_baseline: str = ""  # why the host domain did not measure the volume ("" = it did: BASELINE_LABEL)
    creds: pki.Credentials | None = None  # NBD: the box's credentials (the server's, and the client's for the guest)
    secret_uuid: str = ""  # iSCSI: the libvirt secret QEMU logs in with (removed by close())
    conn: typing.Any = field(default=None, repr=False)  # the libvirt connection holding that secret
    host_mount: str = ""  # NFS on a back-end: its host's /proc/mounts line for the baseline's mount
    _closed: bool = field(default=False, repr=False)

    @property
    def server(self) -> str:
        if isinstance(self.export, nbd.NbdExport):
            return f"{self.export.server} on {self.export.host}:{self.export.port}"
        if isinstance(self.export, aoe.AoeExport):
            return f"{self.export.server} on {self.export.iface} as {self.export.target}"
        if isinstance(self.export, iscsi.IscsiExport | nfs.NfsExport):
            return f"{self.export.server} on {self.export.host}:{self.export.port} as {self.export.target}"
        return "not served yet"

    @property
    def uri(self) -> str:
        return self.export.uri if self.export is not None else ""

    def serve(self, iface: str, address: str) -> nbd.NbdExport | aoe.AoeExport | iscsi.IscsiExport | nfs.NfsExport:
        """Guest attach: serve the volume on `iface`, the bridge the guest's NIC is plugged into (`address`, the
        host's address there): AoE with vblade on the bridge; NBD with qemu-nbd, and iSCSI with tgtd, moved from
        loopback (where the baseline measured it) to that address, TLS or CHAP as before; NFS with ganesha, for
        that bridge's subnet."""
        served = isinstance(self.export, aoe.AoeExport) or (self.export is not None and self.export.host == address)
        if self.attach != "guest" or served:
            raise CloudboxError(f"volume {self.volume!r} is not attached by the guest or is served already")
        exp: nbd.NbdExport | aoe.AoeExport | iscsi.IscsiExport | nfs.NfsExport
        if self.scheme == "nfs":
            exp = nfs.start(self.volume, self.path, iface=iface, host=address, work_dir=self.work_dir / "ganesha")
        elif self.scheme == "aoe":
            exp = aoe.start(self.volume, self.path, iface, shelf=aoe.shelf_for(self.run_uuid),
                            log=self.work_dir / "vblade.log")
        elif self.scheme == "iscsi":
            if self.export is not None:
                self.export.stop()
                self.export = None
            exp = iscsi.start(self.volume, self.path, iscsi.chap(), log=self.work_dir / "tgtd.log", host=address)
        else:
            assert self.creds is not None
            if self.export is not None:
                self.export.stop()
                self.export = None
            exp = nbd.start(self.volume, self.path, self.creds.server_dir, log=self.work_dir / "qemu-nbd.log",
                            host=address)
        self.export = exp
        self.store.path = exp.uri
        return exp

    def close(self) -> None:
        """Stop the export, clear the volume's attachment, remove the run's work directory. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            try:
                if self.secret_uuid:
                    iscsi.undefine_secret(self.conn, self.secret_uuid)
            finally:
                if self.export is not None:
                    self.export.stop()
        finally:
            try:
                if self.scheme != "nfs":  # an NFS export is the run's own directory, not a stored volume
                    with VolumeStore() as vs:
                        vs.detach(self.volume, self.run_uuid)
                elif not self.path:  # the front-end's export: this host's mount of it goes before its directory
                    nfs.unmount_on_host(self.work_dir / NFS_HOST_MOUNT)
            finally:
                self.store.remove()


def parse_volume(spec: str) -> tuple[str, str]:
    """'nbd:ebs' -> ('nbd', 'ebs')."""
    scheme, _, name = spec.partition(":")
    return scheme, check_name(name)


def preflight(spec: str, attach: str, size_bytes: int, *, hypervisor: str = "kvm") -> tuple[str, str]:
    """(scheme, volume name) once the attach mode can run here, the volume exists, is free and holds `size_bytes`;
    else the error that says why. Nothing is made."""
    check_attach(spec.partition(":")[0], attach, hypervisor=hypervisor)
    if spec.startswith("nfs:"):  # a fresh directory of the run's: nothing stored to look up
        problem = nfs.server_problem()
        if problem:
            raise AttachRefused(problem)
        return parse_volume(spec)
    if spec.startswith("aoe:") and shutil.which("vblade") is None:
        raise AttachRefused("AoE volumes are served by vblade, which is not installed (Debian package vblade): run "
                            "'make deps' (scripts/install-deps)")
    if spec.startswith("iscsi:"):
        if shutil.which("tgtd") is None or shutil.which("tgtadm") is None:
            raise AttachRefused("iSCSI volumes are served by tgtd, which is not installed (Debian package tgt): run "
                                "'make deps' (scripts/install-deps)")
        if attach == "qemu" and iscsi.qemu_driver() is None:
            raise AttachRefused("disk.attach = qemu: QEMU's iSCSI driver (block-iscsi.so) is not installed (Debian "
                                "package qemu-block-extra): run 'make deps' (scripts/install-deps)")
    scheme, name = parse_volume(spec)
    with VolumeStore() as vs:
        vol = vs.get(name)
    if vol.size_bytes < size_bytes:
        raise NoSpace(f"volume {name!r} holds {backing.human_size(vol.size_bytes)}, less than the test size "
                      f"{backing.human_size(size_bytes)}; use a smaller --size or a larger volume")
    if vol.attached_run:
        raise VolumeBusy(f"volume {name!r} is attached by run {vol.attached_run}; a volume serves one run at a time")
    return scheme, name


def no_aoe_baseline(has_module=kernel_module_available) -> str:
    """Why a run with an AoE volume has no baseline: the host domain cannot attach the volume here."""
    if not has_module("aoe"):
        return (f"no baseline: the host domain attaches AoE volumes with the kernel's aoe driver, and this kernel "
                f"({platform.release()}) has none; a local disk is not the same volume, so nothing is measured in "
                "its place")
    return ("no baseline: the host's aoe driver does not see a vblade served on the same host (its frames never "
            "come back to it); the host-domain row needs the target in another network namespace, not built yet")


def export_for_run(spec: str, attach: str, *, run_uuid: str, work_dir: Path, size_bytes: int,
                   hypervisor: str = "kvm", conn: typing.Any = None, guests: int = 1,
                   nfs_server: tuple[str, int] | None = None) -> VolumeExport:
    """Check, attach and export the profile's volume `spec` for run `run_uuid`; on any failure nothing is left.
    An AoE volume the guest attaches is only checked and marked here: `VolumeExport.serve()` exports it. An iSCSI
    volume gets a libvirt secret on `conn` for QEMU's login. An NFS export is shared by the run's `guests`; with
    `nfs_server` (host, port) the front-end serves it and this host only mounts it."""
    if spec.startswith("nfs:") and nfs_server is not None:
        return _for_remote_nfs(spec, attach, run_uuid, work_dir, size_bytes, hypervisor, nfs_server)
    if spec.startswith("nfs:"):
        return _for_nfs(spec, attach, run_uuid, work_dir, size_bytes, hypervisor, guests)
    scheme, name = preflight(spec, attach, size_bytes, hypervisor=hypervisor)
    with VolumeStore() as vs:
        vol = vs.attach(name, run_uuid)
    if scheme == "aoe":
        return _for_guest(scheme, name, vol.path, vol.size_bytes, attach, run_uuid, work_dir, size_bytes)
    if scheme == "iscsi":
        return _for_iscsi(name, vol.path, vol.size_bytes, attach, run_uuid, work_dir, size_bytes, conn)
    store: backing.BackingStore | None = None
    try:
        creds = pki.ensure()
        pki.install_client(creds, pki.libvirt_nbd_dir(), group=pki.qemu_group())
        pki.install_client(creds, pki.LIBNBD_DIR)
        store = backing.new_work_dir("network-volume", work_dir, size_bytes, "raw")
        exp = nbd.start(name, vol.path, creds.server_dir, log=work_dir / "qemu-nbd.log")
    except BaseException:
        if store is not None:
            store.remove()
        with VolumeStore() as vs:
            vs.detach(name, run_uuid)
        raise
    dev = backing.dev_name_for_path(vol.path)
    store.path = store.baseline_target = exp.uri
    store.host_device = dev
    store.model = (f"NBD volume {name!r} ({backing.human_size(vol.size_bytes)}, TLS) served by {exp.server} from "
                   f"{vol.path} on {backing.device_model(dev)}")
    if attach == "qemu":  # QEMU opens the export; a guest that attaches it itself has no disk
        store.network = backing.NetworkSource("nbd", name, exp.host, exp.port, tls=True)
    store.baseline_labels = [BASELINE_LABEL]
    if dev is None:
        store.labels.append("no-host-metrics")
    return VolumeExport(name, scheme, attach, store, exp, run_uuid, path=vol.path, work_dir=work_dir, creds=creds)


def _for_guest(scheme: str, name: str, path: str, vol_bytes: int, attach: str, run_uuid: str, work_dir: Path,
               size_bytes: int) -> VolumeExport:
    try:
        store = backing.new_work_dir("network-volume", work_dir, size_bytes, "raw")
    except BaseException:
        with VolumeStore() as vs:
            vs.detach(name, run_uuid)
        raise
    dev = backing.dev_name_for_path(path)
    target = f"e{aoe.shelf_for(run_uuid)}.0"
    store.path = f"aoe:{target}"
    store.baseline_target = ""
    store.host_device = dev
    store.model = (f"AoE volume {name!r} ({backing.human_size(vol_bytes)}, no authentication) served by vblade as "
                   f"{target} on the guest's bridge from {path} on {backing.device_model(dev)}")
    if dev is None:
        store.labels.append("no-host-metrics")
    return VolumeExport(name, scheme, attach, store, None, run_uuid, path=path, work_dir=work_dir,
                        tls="none: AoE is layer 2 without authentication; served on the guest's bridge only",
                        no_baseline=no_aoe_baseline())


def _for_iscsi(name: str, path: str, vol_bytes: int, attach: str, run_uuid: str, work_dir: Path, size_bytes: int,
               conn: typing.Any) -> VolumeExport:
    """tgtd serves the volume on 127.0.0.1 with CHAP; QEMU logs in with a libvirt secret of the run's own, or the
    guest logs in itself once `serve()` has moved the target to its bridge."""
    store: backing.BackingStore | None = None
    exp: iscsi.IscsiExport | None = None
    usage = secret = ""
    try:
        if conn is None and attach == "qemu":
            raise CloudboxError("an iSCSI volume needs the run's libvirt connection for QEMU's CHAP secret")
        creds = iscsi.chap()
        store = backing.new_work_dir("network-volume", work_dir, size_bytes, "raw")
        exp = iscsi.start(name, path, creds, log=work_dir / "tgtd.log")
        if attach == "qemu":
            usage = iscsi.secret_usage(run_uuid)
            secret = iscsi.define_secret(conn, usage, creds.secret)
    except BaseException:
        if exp is not None:
            exp.stop()
        if store is not None:
            store.remove()
        with VolumeStore() as vs:
            vs.detach(name, run_uuid)
        raise
    dev = backing.dev_name_for_path(path)
    store.path = exp.uri
    store.baseline_target = ""
    store.host_device = dev
    store.model = (f"iSCSI volume {name!r} ({backing.human_size(vol_bytes)}, CHAP) served by {exp.server} from "
                   f"{path} on {backing.device_model(dev)}")
    if attach == "qemu":
        store.network = backing.NetworkSource("iscsi", exp.target, exp.host, exp.port, tls=False,
                                              initiator=creds.initiator, auth_user=creds.user, auth_usage=usage)
    store.baseline_labels = [BASELINE_LABEL]  # and per test how the host domain reached it: ISCSI_READER_LABELS
    if dev is None:
        store.labels.append("no-host-metrics")
    where = "127.0.0.1 only" if attach == "qemu" else "served on the guest's bridge only"
    return VolumeExport(name, "iscsi", attach, store, exp, run_uuid, path=path, work_dir=work_dir,
                        tls=f"CHAP (this box's secret) and its initiator name; not encrypted: {where}",
                        secret_uuid=secret, conn=conn)


def _for_nfs(spec: str, attach: str, run_uuid: str, work_dir: Path, size_bytes: int, hypervisor: str,
             guests: int) -> VolumeExport:
    """A fresh directory in the run's work directory, to be exported by ganesha once the guest's bridge exists
    (`VolumeExport.serve()`); the host-domain baseline runs on a file in it, without NFS (one per guest)."""
    scheme, name = preflight(spec, attach, size_bytes, hypervisor=hypervisor)
    store = backing.new_work_dir("network-volume", work_dir, size_bytes, "raw")
    try:
        export_dir = work_dir / "export"
        export_dir.mkdir(mode=0o755)
        # each guest's test file, and the baseline's beside it
        backing.need_space(work_dir, 2 * guests * size_bytes,
                           f"the NFS export's test file{'s' if guests > 1 else ''} and the baseline's "
                           f"({2 * guests} x {backing.human_size(size_bytes)})")
    except BaseException:
        store.remove()
        raise
    dev = store.host_device
    store.path = f"nfs:{name}"
    store.baseline_target = str(export_dir / "baseline.dat")
    store.baseline_labels = [NFS_BASELINE_LABEL]
    store.model = (f"NFSv4 export {name!r} of {export_dir} on {backing.device_model(dev)}, served by nfs-ganesha on "
                   "the guest's bridge")
    if dev is None:
        store.labels.append("no-host-metrics")
    return VolumeExport(name, scheme, attach, store, None, run_uuid, path=str(export_dir), work_dir=work_dir,
                        tls="none: AUTH_SYS (uids), no encryption; served on the guest's bridge's subnet only")


def _for_remote_nfs(spec: str, attach: str, run_uuid: str, work_dir: Path, size_bytes: int, hypervisor: str,
                    server: tuple[str, int]) -> VolumeExport:
    """The export the front-end serves for this run (a back-end's side): nothing is served or stored here. The
    baseline is this host's kernel client on the same export (a file per process in its mount under the run's
    work directory); a host without an NFSv4 client has none, and `no_baseline` says why."""
    check_attach("nfs", attach, hypervisor=hypervisor)
    scheme, name = parse_volume(spec)
    host, port = server
    store = backing.new_work_dir("network-volume", work_dir, size_bytes, "raw")
    exp = nfs.served_elsewhere(name, host, port, f"nfs-ganesha on the front-end {host}")
    store.path = f"nfs:{name}"
    store.host_device = None  # the disk under the export is the front-end's
    store.baseline_target = str(work_dir / NFS_HOST_MOUNT / "baseline.dat")
    store.baseline_labels = [BASELINE_LABEL]
    store.model = f"NFSv4 export {name!r} served by nfs-ganesha on the front-end {host}:{port}"
    store.labels.append("no-host-metrics")
    problem = nfs.host_client_problem(kernel_module_available)
    return VolumeExport(name, scheme, attach, store, exp, run_uuid, path="", work_dir=work_dir,
                        tls="none: AUTH_SYS (uids), no encryption; served to the private network's subnet only",
                        no_baseline=f"no baseline: {problem}; the export's disk is the front-end's" if problem
                        else "")
