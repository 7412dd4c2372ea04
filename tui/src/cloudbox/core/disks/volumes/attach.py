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

from ...errors import CloudboxError, NoSpace
from ...spec import knobs, remote
from .. import backing
from . import aoe, hostattach, iscsi, nbd, nfs, nodecreds, nvmet, pki
from .store import VolumeBusy, VolumeStore, check_name

# The host kernel's initiator of each scheme (disk.attach = host).
HOST_MODULES = {"aoe": "aoe", "iscsi": "iscsi_tcp", "nbd": "nbd", "nfs": "nfsv4", "nvme-tcp": "nvme_tcp"}
BASELINE_LABEL = "volume-from-host"  # the baseline is the volume from the host domain, not a local disk
HOST_INITIATOR_LABEL = "host-initiator"  # ... through this host's kernel initiator, on the device it attached
# what the benchmark guest attaches itself (its image has aoe, nbd, nbd-client, iscsi_tcp, iscsistart, nvme_tcp and
# nfsv4)
GUEST_SCHEMES = ("aoe", "nbd", "iscsi", "nvme-tcp", "nfs")
# what this host's kernel attaches (disk.attach = host): every block scheme
HOST_SCHEMES = ("aoe", "nbd", "iscsi", "nvme-tcp")
# scheme -> (server, Debian package); nvmet is the kernel's own target
SERVERS = {"nbd": ("qemu-nbd", "qemu-utils"), "aoe": ("vblade", "vblade"), "iscsi": ("tgtd", "tgt"),
           "nvme-tcp": ("nvmet", "the kernel"), "nfs": ("ganesha.nfsd", "nfs-ganesha")}
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


def check_attach(scheme: str, attach: str, *, hypervisor: str = "kvm", has_module=kernel_module_available,
                 tool_problem=hostattach.tool_problem) -> None:
    """Refuse (AttachRefused) what this host or this cloudbox cannot do, saying why and where it works."""
    if attach == "host":
        if scheme not in HOST_SCHEMES:
            raise AttachRefused(f"disk.attach = host ({scheme}): the host hands the guest a block device, and a "
                                f"{scheme}: volume is a file system; allowed: disk.attach = guest")
        module = HOST_MODULES[scheme]
        if not has_module(module):
            summary = f"disk.attach = host ({scheme}): this kernel has no {module}"
            raise AttachRefused(
                f"{summary}: the host's kernel attaches the volume with its {module} driver, which this kernel "
                f"({platform.release()}) lacks (not built in, no loadable module in /lib/modules). The appliance's "
                "kernel has every initiator; here use disk.attach = qemu (" + ", ".join(f"{s}:" for s in QEMU_ATTACH)
                + " volumes; presets kvm-ebs-nbd, kvm-ebs-iscsi) or disk.attach = guest ("
                + ", ".join(f"{s}:" for s in GUEST_SCHEMES) + " volumes; presets kvm-ebs-aoe-guest, "
                "kvm-ebs-nbd-guest, kvm-ebs-iscsi-guest, nfs-async-tcp)", summary)
        if (problem := tool_problem(scheme)):
            raise AttachRefused(f"disk.attach = host ({scheme}): {problem}", f"disk.attach = host ({scheme}): "
                                f"{problem.split(' (')[0]}")
        return
    if attach == "guest":
        if scheme not in GUEST_SCHEMES:
            raise AttachRefused(f"disk.attach = guest ({scheme}) is not implemented yet; the guest attaches "
                                + ", ".join(f"{s}:" for s in GUEST_SCHEMES) + " volumes (presets kvm-ebs-aoe-guest, "
                                "kvm-ebs-nbd-guest, kvm-ebs-iscsi-guest, kvm-ebs-nvme-guest, nfs-async-tcp)")
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
        for mode in typing.get_args(knobs.Attach):
            try:
                check_attach(scheme, mode, hypervisor=hypervisor, has_module=has_module)
            except AttachRefused:
                continue
            modes.append(mode)
        if scheme == "iscsi" and iscsi.qemu_driver() is None and "qemu" in modes:
            modes.remove("qemu")  # QEMU's libiscsi driver (qemu-block-extra) is missing; the guest's initiator is not
        if scheme == "nvme-tcp":
            problem = nvmet.problem(has_module)
        else:
            problem = "" if shutil.which(server) else (f"{server} is not installed (Debian package {package}): run "
                                                       "'make deps'")
        out.append(Export(scheme, server, tuple(modes), problem))
    return out


Served = nbd.NbdExport | aoe.AoeExport | iscsi.IscsiExport | nvmet.NvmetExport | nfs.NfsExport


@dataclass
class VolumeExport:
    """A volume exported for one run, as the run's backing store (`store`)."""

    volume: str
    scheme: str
    attach: str
    store: backing.BackingStore
    export: Served | None  # None until served
    run_uuid: str
    path: str = ""  # the volume's file
    work_dir: Path = Path(".")  # the run's work directory (vblade's log; removed with the store)
    tls: str = "x509 (this box's CA; client certificates required)"
    no_baseline: str = ""  # why the host domain did not measure the volume ("" = it did: BASELINE_LABEL)
    creds: pki.Credentials | None = None  # NBD: the box's credentials (the server's, and the client's for the guest)
    secret_uuid: str = ""  # iSCSI: the libvirt secret QEMU logs in with (removed by close())
    conn: typing.Any = field(default=None, repr=False)  # the libvirt connection holding that secret
    host_mount: str = ""  # NFS on a back-end: its host's /proc/mounts line for the baseline's mount
    attachment: hostattach.HostAttachment | None = None  # disk.attach = host: the host's kernel's session
    attached: tuple[str, str] = ("", "")  # (device, initiator) the host's kernel attached, kept after a detach
    server_device: str | None = None  # the /proc/diskstats name of the disk under the volume's file (the server's)
    nvme_host: hostattach.NvmeHost | None = field(default=None, repr=False)  # NVMe/TCP: who may connect
    after_stop: list[typing.Callable[[], None]] = field(default_factory=list, repr=False)  # e.g. AoE's veth pair
    chap: iscsi.Chap | None = field(default=None, repr=False)  # iSCSI: the identity the guest logs in with
    client_dir: Path | None = None  # NBD: the client certificate, its key and the CA the guest is handed
    served_by_front_end: bool = False  # a back-end's run: the front-end serves the volume, nothing is served here
    _closed: bool = field(default=False, repr=False)

    @property
    def server(self) -> str:
        if isinstance(self.export, nbd.NbdExport):
            return f"{self.export.server} on {self.export.host}:{self.export.port}"
        if isinstance(self.export, aoe.AoeExport):
            return f"{self.export.server} on {self.export.iface} as {self.export.target}"
        if isinstance(self.export, iscsi.IscsiExport | nvmet.NvmetExport | nfs.NfsExport):
            return f"{self.export.server} on {self.export.host}:{self.export.port} as {self.export.target}"
        return "not served yet"

    @property
    def uri(self) -> str:
        return self.export.uri if self.export is not None else ""

    def serve(self, iface: str, address: str, clients: str | None = None) -> Served:
        """Guest attach: serve the volume on `iface`, the bridge the guest's NIC is plugged into (`address`, the
        host's address there): AoE with vblade on the bridge; NBD with qemu-nbd, and iSCSI with tgtd, moved from
        loopback (where the baseline measured it) to that address, TLS or CHAP as before; NFS with ganesha, for
        that bridge's subnet (or `clients`, addresses or subnets in a comma list); NVMe/TCP with the kernel's target
        on that address, for this box's host NQN only. The host domain's attachment for the baseline, if there was
        one, ends first."""
        if self.attachment is not None and self.attach == "guest":
            self.attachment.detach()
            self.attachment = None
            if self.export is not None and not self.served_by_front_end:
                self.export.stop()
                self.export = None
            while self.after_stop:
                self.after_stop.pop()()
        if self.served_by_front_end:
            assert self.export is not None
            return self.export
        served = isinstance(self.export, aoe.AoeExport) or (self.export is not None and self.export.host == address)
        if self.attach != "guest" or served:
            raise CloudboxError(f"volume {self.volume!r} is not attached by the guest or is served already")
        exp: Served
        if self.scheme == "nvme-tcp":
            if self.export is not None:
                self.export.stop()
                self.export = None
            assert self.nvme_host is not None
            # the guest's kernel (6.1) has no NVMe in-band authentication: the allow-list of its host NQN only
            exp = nvmet.start(self.volume, self.path, allowed={self.nvme_host.nqn: ""}, run_uuid=self.run_uuid,
                              host=address)
        elif self.scheme == "nfs":
            exp = nfs.start(self.volume, self.path, iface=iface, host=address, work_dir=self.work_dir / "ganesha",
                            clients=clients)
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
                try:
                    if self.attachment is not None:
                        self.attachment.detach()
                finally:
                    if self.secret_uuid:
                        iscsi.undefine_secret(self.conn, self.secret_uuid)
            finally:
                try:
                    if self.export is not None and not self.served_by_front_end:
                        self.export.stop()
                finally:
                    while self.after_stop:
                        self.after_stop.pop()()
        finally:
            try:
                if self.scheme != "nfs" and not self.served_by_front_end:  # else nothing stored here
                    with VolumeStore() as vs:
                        vs.detach(self.volume, self.run_uuid)
                elif not self.path:  # the front-end's export: this host's mount of it goes before its directory
                    nfs.unmount_on_host(self.work_dir / NFS_HOST_MOUNT)
            finally:
                self.store.remove()

    def end_baseline_attachment(self) -> None:
        """Guest attach on a back-end: the host's attachment the baseline measured ends before the guest attaches
        the same volume itself (the front-end keeps serving it)."""
        if self.attachment is not None and self.attach == "guest":
            self.attachment.detach()
            self.attachment = None


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
    if spec.startswith("nvme-tcp:") and (problem := nvmet.problem(kernel_module_available)):
        raise AttachRefused(f"NVMe/TCP volumes are served by {problem}; the appliance's kernel has it",
                            "NVMe/TCP: no nvmet in this kernel")
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


def no_aoe_baseline() -> str:
    """Why a run with an AoE volume the guest attaches has no baseline: this kernel has no aoe driver (with one, the
    host domain attaches the volume over a veth pair first: `_for_host`)."""
    return (f"no baseline: the host domain attaches AoE volumes with the kernel's aoe driver, and this kernel "
            f"({platform.release()}) has none; a local disk is not the same volume, so nothing is measured in its "
            "place")


def export_for_run(spec: str, attach: str, *, run_uuid: str, work_dir: Path, size_bytes: int,
                   hypervisor: str = "kvm", conn: typing.Any = None, guests: int = 1,
                   nfs_server: tuple[str, int] | None = None, remote_uri: str = "") -> VolumeExport:
    """Check, attach and export the profile's volume `spec` for run `run_uuid`; on any failure nothing is left.
    An AoE volume the guest attaches is only checked and marked here: `VolumeExport.serve()` exports it. An iSCSI
    volume gets a libvirt secret on `conn` for QEMU's login. An NFS export is shared by the run's `guests`; with
    `nfs_server` (host, port) the front-end serves it and this host only mounts it; with `remote_uri` the front-end
    serves a block volume and this host's kernel (or its guest's) attaches it (`_for_remote_block`)."""
    if remote_uri:
        return _for_remote_block(spec, attach, remote.parse(remote_uri), run_uuid, work_dir, size_bytes, hypervisor)
    if spec.startswith("nfs:") and nfs_server is not None:
        return _for_remote_nfs(spec, attach, run_uuid, work_dir, size_bytes, hypervisor, nfs_server)
    if spec.startswith("nfs:"):
        return _for_nfs(spec, attach, run_uuid, work_dir, size_bytes, hypervisor, guests)
    scheme, name = preflight(spec, attach, size_bytes, hypervisor=hypervisor)
    with VolumeStore() as vs:
        vol = vs.attach(name, run_uuid)
    if attach == "host" or scheme == "nvme-tcp":
        return _for_host(scheme, name, vol.path, vol.size_bytes, attach, run_uuid, work_dir, size_bytes)
    if scheme == "aoe" and kernel_module_available("aoe"):  # the host domain's row, through a veth pair
        return _for_host(scheme, name, vol.path, vol.size_bytes, attach, run_uuid, work_dir, size_bytes)
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


HOST_HOW = {"iscsi": "tgtd with CHAP on 127.0.0.1", "nbd": "qemu-nbd with TLS on 127.0.0.1",
            "nvme-tcp": "the kernel's NVMe/TCP target (nvmet) on 127.0.0.1",
            "aoe": "vblade on a veth pair of the run's own (AoE has no authentication)"}


def host_attached(scheme: str, name: str, path: str, run_uuid: str, work_dir: Path
                  ) -> tuple[Served, hostattach.HostAttachment, list[typing.Callable[[], None]],
                             hostattach.NvmeHost | None]:
    """The volume's file exported on this host (loopback; AoE on a veth pair) and attached by this host's kernel:
    (export, attachment, what to undo after the export stops, the NVMe host identity). On failure nothing is
    left."""
    after: list[typing.Callable[[], None]] = []
    exp: Served | None = None
    ident = None
    try:
        if scheme == "iscsi":
            creds = iscsi.chap()
            exp = iscsi.start(name, path, creds, log=work_dir / "tgtd.log")
            att = hostattach.attach_iscsi(exp.host, exp.port, exp.iqn, creds)
        elif scheme == "nbd":
            pki_creds = pki.ensure()
            exp = nbd.start(name, path, pki_creds.server_dir, log=work_dir / "qemu-nbd.log")
            att = hostattach.attach_nbd(exp.host, exp.port, name, pki_creds.client_dir,
                                        log=work_dir / "nbd-client.log")
        elif scheme == "nvme-tcp":
            ident = hostattach.nvme_host()
            nvmet.load()
            key = ident.key if nvmet.auth_supported() else ""
            exp = nvmet.start(name, path, allowed={ident.nqn: key}, run_uuid=run_uuid)
            att = hostattach.attach_nvme(exp.host, exp.port, exp.nqn, ident, authenticate=bool(key))
        else:
            server_end, host_end = aoe.veth_pair(run_uuid)
            after.append(lambda: aoe.remove_veth(server_end))
            exp = aoe.start(name, path, server_end, shelf=aoe.shelf_for(run_uuid), log=work_dir / "vblade.log")
            att = hostattach.attach_aoe(exp.target, host_end)
    except BaseException:
        try:
            if exp is not None:
                exp.stop()
        finally:
            while after:
                after.pop()()
        raise
    return exp, att, after, ident


def _for_host(scheme: str, name: str, path: str, vol_bytes: int, attach: str, run_uuid: str, work_dir: Path,
              size_bytes: int) -> VolumeExport:
    """This host's kernel attaches the volume, served on this host: with disk.attach = host the guest is handed
    that block device on the profile's bus, and the host domain measures the same device first (Study A's "EBS from
    the host domain" row); with disk.attach = guest (NVMe/TCP, AoE where this kernel has aoe) the attachment is the
    baseline's only, and `serve()` ends it before serving the guest on its bridge."""
    store: backing.BackingStore | None = None
    v: VolumeExport | None = None
    try:
        store = backing.new_work_dir("network-volume", work_dir, size_bytes, "raw")
        exp, att, after, ident = host_attached(scheme, name, path, run_uuid, work_dir)
        server_dev = backing.dev_name_for_path(path)
        v = VolumeExport(name, scheme, attach, store, exp, run_uuid, path=path, work_dir=work_dir,
                         tls=_security(scheme, exp, attach), attachment=att, attached=(att.device, att.how),
                         server_device=server_dev, nvme_host=ident, after_stop=after)
        store.is_block = True  # the baseline's target is a device: never unlinked
        store.baseline_target = att.device
        store.baseline_labels = [BASELINE_LABEL, HOST_INITIATOR_LABEL]
        if attach == "host":
            store.path = att.device
            store.host_device = att.diskstats_name  # the back-end's view; the server's disk is sampled beside it
        else:
            store.path = f"{scheme}:{name}"
            store.host_device = server_dev
        if store.host_device is None:
            store.labels.append("no-host-metrics")
        store.model = (f"{SCHEME_NAMES[scheme]} volume {name!r} ({backing.human_size(vol_bytes)}) served by "
                       f"{HOST_HOW[scheme]} from {path} on {backing.device_model(server_dev)}, attached by {att.how} "
                       f"as {att.device}")
    except BaseException:
        if v is not None:
            v.close()  # detaches, stops the export, clears the mark, removes the store
        else:
            if store is not None:
                store.remove()
            with VolumeStore() as vs:
                vs.detach(name, run_uuid)
        raise
    return v


SCHEME_NAMES = {"iscsi": "iSCSI", "nbd": "NBD", "nvme-tcp": "NVMe/TCP", "aoe": "AoE", "nfs": "NFS"}


def _security(scheme: str, exp: Served, attach: str) -> str:
    where = "127.0.0.1 only" if attach == "host" else "then the guest's bridge only"
    if scheme == "iscsi":
        return f"CHAP (this box's secret) and its initiator name; not encrypted: {where}"
    if scheme == "nbd":
        return "x509 (this box's CA; client certificates required)"
    if scheme == "nvme-tcp":
        assert isinstance(exp, nvmet.NvmetExport)
        how = "DH-HMAC-CHAP (this box's key) and its host NQN" if exp.authenticated else "its host NQN only"
        return f"{how}; not encrypted: {where}"
    return "none: AoE is layer 2 without authentication; a veth pair of the run's own, " + (
        "nothing else on it" if attach == "host" else "then the guest's bridge only")


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
                        tls="none: AUTH_SYS (uids), no encryption; served to the run's guests' addresses only")


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


# -- a back-end's run on the front-end's volume ----------------------------------------------------------------------
def _for_remote_block(spec: str, attach: str, rv: remote.RemoteVolume, run_uuid: str, work_dir: Path,
                      size_bytes: int, hypervisor: str) -> VolumeExport:
    """A back-end's side of a volume its front-end serves (`rv`): this host's kernel attaches it with the node's own
    credentials (core.disks.volumes.nodecreds). disk.attach = host: that device is the guest's disk and the baseline's.
    disk.attach = guest: the host's attachment is the baseline's only (where this kernel has the initiator), ended
    before the guest attaches the volume itself over the private network."""
    scheme, name = parse_volume(spec)
    if scheme != rv.scheme:
        raise CloudboxError(f"the front-end serves {rv.uri}, not a {scheme}: volume (disk.volume = {spec})")
    if attach == "qemu":
        raise AttachRefused("disk.attach = qemu on a back-end is not supported: QEMU there would need the front-end's "
                            "credentials in libvirt; allowed on a back-end: disk.attach = host or guest")
    check_attach(scheme, attach, hypervisor=hypervisor)
    creds = nodecreds.on_node()
    store = backing.new_work_dir("network-volume", work_dir, size_bytes, "raw")
    exp: Served  # described as the front-end serves it (`server` names it "... on HOST:PORT as TARGET")
    if scheme == "iscsi":
        exp = iscsi.IscsiExport(name, "", rv.host, rv.port, rv.target, 0, "tgtd (the front-end)")
    elif scheme == "nbd":
        exp = nbd.NbdExport(name, "", rv.host, rv.port, "qemu-nbd (the front-end)")
    elif scheme == "nvme-tcp":
        exp = nvmet.NvmetExport(name, "", rv.host, rv.port, rv.target, 0, (creds.nvme.nqn,), "",
                                server="nvmet (the front-end)")
    else:
        shelf, slot = rv.shelf_slot
        exp = aoe.AoeExport(name, "", rv.host, shelf, slot, server="vblade (the front-end)")
    v = VolumeExport(name, scheme, attach, store, exp, run_uuid, path="", work_dir=work_dir,
                     tls=_remote_security(scheme, attach), chap=creds.chap, client_dir=creds.nbd_dir,
                     nvme_host=creds.nvme, served_by_front_end=True)
    store.path = exp.uri
    store.host_device = None  # the disk under the volume is the front-end's (it samples it)
    store.labels.append("no-host-metrics")
    host_can = kernel_module_available(HOST_MODULES[scheme]) and not hostattach.tool_problem(scheme)
    if attach == "guest" and not host_can:
        v.no_baseline = (f"no baseline: this host's kernel has no {HOST_MODULES[scheme]} (or its initiator program), "
                         "so the host domain cannot attach the front-end's volume; nothing is measured in its place")
        return v
    try:
        att = _attach_remote(v, rv, creds, work_dir)
        v.attachment, v.attached = att, (att.device, att.how)
        store.is_block = True  # the baseline's target is a device: never unlinked
        store.baseline_target = att.device
        store.baseline_labels = [BASELINE_LABEL, HOST_INITIATOR_LABEL]
        if attach == "host":
            store.path = att.device
            store.host_device = att.diskstats_name  # the back-end's view of the volume
            store.labels.remove("no-host-metrics")
        store.model = (f"{SCHEME_NAMES[scheme]} volume {name!r} served by {exp.server}, attached by {att.how} as "
                       f"{att.device}")
    except BaseException:
        v.close()  # logs out or disconnects what was attached, removes the store
        raise
    return v


def _attach_remote(v: VolumeExport, rv: remote.RemoteVolume, creds: nodecreds.NodeCreds,
                   work_dir: Path) -> hostattach.HostAttachment:
    if rv.scheme == "iscsi":
        return hostattach.attach_iscsi(rv.host, rv.port, rv.target, creds.chap, lun=rv.lun)
    if rv.scheme == "nbd":
        return hostattach.attach_nbd(rv.host, rv.port, rv.target, creds.nbd_dir, log=work_dir / "nbd-client.log")
    if rv.scheme == "nvme-tcp":
        # the node's secret goes along: the front-end asks for it only where its target checks keys
        return hostattach.attach_nvme(rv.host, rv.port, rv.target, creds.nvme, authenticate=True)
    from ...spec import nodeconf

    link = nodeconf.private_link(nodeconf.settings())
    if not link:
        raise CloudboxError("AoE from the front-end is layer 2: this node's settings name no private NIC to find it on "
                            f"({nodeconf.node_settings_file()})")
    return hostattach.attach_aoe(rv.target, link)


def _remote_security(scheme: str, attach: str, who: str = "this node's", nvme_auth: bool | None = None) -> str:
    """What guards a volume the front-end serves to one node (`who`); `nvme_auth`: whether its nvmet target checks
    the DH-HMAC-CHAP key (None on the node, which does not know whether the front-end's kernel can)."""
    guest = attach == "guest"
    if scheme == "iscsi":
        return (f"CHAP ({who} secret, made by the front-end{', handed to its guest' if guest else ''}) and its "
                "initiator name; not encrypted: the private network")
    if scheme == "nbd":
        return (f"x509 ({who} client certificate of the front-end's CA, which it pins"
                + ("; handed to its guest" if guest else "") + ")")
    if scheme == "nvme-tcp":
        if nvme_auth:
            how = f"{who} host NQN and its DH-HMAC-CHAP key"
        elif guest or nvme_auth is False:
            how = f"{who} host NQN only" + (" (its guest's kernel has no NVMe authentication)" if guest else "")
        else:
            how = f"{who} host NQN and DH-HMAC-CHAP key (checked where the front-end's kernel can)"
        return how + "; not encrypted: the private network"
    return "none: AoE is layer 2 without authentication; the private network only"


def export_for_node(spec: str, attach: str, *, node: str, creds: nodecreds.NodeCreds, run_uuid: str,
                    work_dir: Path, size_bytes: int, address: str, link: str) -> VolumeExport:
    """The front-end's side of a back-end's run on a stored volume: checked, marked attached by the run and served on
    this host's private `address` (AoE on its private `link`) to that node only: its CHAP identity, its NVMe host
    NQN, client certificates of this box's CA. `close()` stops it."""
    scheme, name = parse_volume(spec)
    if attach == "qemu":
        raise AttachRefused("disk.attach = qemu on a back-end is not supported: QEMU there would need the front-end's "
                            "credentials in libvirt; allowed on a back-end: disk.attach = host or guest")
    _server_check(scheme)
    with VolumeStore() as vs:
        vol = vs.get(name)
    if vol.size_bytes < size_bytes:
        raise NoSpace(f"volume {name!r} holds {backing.human_size(vol.size_bytes)}, less than the test size "
                      f"{backing.human_size(size_bytes)}; use a smaller --size or a larger volume")
    with VolumeStore() as vs:
        vol = vs.attach(name, run_uuid)
    store: backing.BackingStore | None = None
    exp: Served | None = None
    try:
        store = backing.new_work_dir("network-volume", work_dir, size_bytes, "raw")
        if scheme == "iscsi":
            exp = iscsi.start(name, vol.path, creds.chap, log=work_dir / "tgtd.log", host=address)
        elif scheme == "nbd":
            ca = pki.ensure((f"IP:{address}",))
            exp = nbd.start(name, vol.path, ca.server_dir, log=work_dir / "qemu-nbd.log", host=address)
        elif scheme == "nvme-tcp":
            nvmet.load()
            # the node's host checks its key; its guest's kernel (6.1) cannot: the allow-list only then
            key = creds.nvme.key if attach == "host" and nvmet.auth_supported() else ""
            exp = nvmet.start(name, vol.path, allowed={creds.nvme.nqn: key}, run_uuid=run_uuid, host=address)
        else:
            exp = aoe.start(name, vol.path, link, shelf=aoe.shelf_for(run_uuid), log=work_dir / "vblade.log")
    except BaseException:
        if store is not None:
            store.remove()
        with VolumeStore() as vs:
            vs.detach(name, run_uuid)
        raise
    server_dev = backing.dev_name_for_path(vol.path)
    store.path = f"aoe:{exp.target}@{address}" if isinstance(exp, aoe.AoeExport) else exp.uri
    store.host_device = server_dev
    store.model = f"{SCHEME_NAMES[scheme]} volume {name!r} ({backing.human_size(vol.size_bytes)}) served to {node}"
    tls = _remote_security(scheme, attach, f"{node}'s",  # what this target checks, exactly
                           exp.authenticated if isinstance(exp, nvmet.NvmetExport) else None)
    return VolumeExport(name, scheme, attach, store, exp, run_uuid, path=vol.path, work_dir=work_dir, tls=tls,
                        server_device=server_dev)


def _server_check(scheme: str) -> None:
    """The server of `scheme` can run on this host (what `preflight` checks of it), or AttachRefused saying why."""
    if scheme == "nvme-tcp" and (problem := nvmet.problem(kernel_module_available)):
        raise AttachRefused(f"NVMe/TCP volumes are served by {problem}")
    server, package = SERVERS[scheme]
    if scheme != "nvme-tcp" and shutil.which(server) is None:
        raise AttachRefused(f"{SCHEME_NAMES[scheme]} volumes are served by {server}, which is not installed (Debian "
                            f"package {package}): run 'make deps' (scripts/install-deps)")
