"""Each network-volume scheme's part in a run, one class per scheme (a `Transport`) registered by the scheme's name
in one table (`TRANSPORTS`), as mkosi registers a distribution's installer; and `VolumeExport`, the volume a run
holds, which its scheme's transport serves. The schemes' facts (titles, servers, attach modes, wording) are
core.spec.schemes; the checks and the path a run takes are core.disks.volumes.attach.
"""

from __future__ import annotations

import platform
import secrets
import shutil
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import CloudboxError
from ...spec import remote
from ...spec.schemes import AOE, ISCSI, NBD, NFS, NVME_TCP, SCHEMES, Scheme
from .. import backing
from . import aoe, hostattach, iscsi, nbd, nfs, nodecreds, nvmet, pki
from .store import VolumeStore

BASELINE_LABEL = "volume-from-host"  # the baseline is the volume from the host domain, not a local disk
NFS_HOST_MOUNT = "nfs-host"  # in a back-end's run work directory: where its host mounts the front-end's export
CLIENT_CERT = "client-cert.pem"  # in an NBD client's directory: the certificate its server authorises

Served = nbd.NbdExport | aoe.AoeExport | iscsi.IscsiExport | nvmet.NvmetExport | nfs.NfsExport
HasModule = Callable[[str], bool]  # whether the running kernel has (or can load) a module


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
    tls: str = "x509 (this box's CA; this box's client certificate only)"
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
        exp = transport(self.scheme).serve_to_guest(self, iface, address, clients)
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
                if SCHEMES[self.scheme].block and not self.served_by_front_end:  # else nothing stored here
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


def undo_attach(name: str, run_uuid: str, store: backing.BackingStore | None = None) -> None:
    """What a failed attach leaves behind, undone: its work store removed, volume `name` no longer the run's."""
    if store is not None:
        store.remove()
    with VolumeStore() as vs:
        vs.detach(name, run_uuid)


def no_aoe_baseline() -> str:
    """Why a run with an AoE volume the guest attaches has no baseline: this kernel has no aoe driver (with one, the
    host domain attaches the volume over a veth pair first: `_for_host`)."""
    return (f"no baseline: the host domain attaches AoE volumes with the kernel's aoe driver, and this kernel "
            f"({platform.release()}) has none; a local disk is not the same volume, so nothing is measured in its "
            "place")


def _where(attach: str) -> str:
    return "127.0.0.1 only" if attach == "host" else "then the guest's bridge only"


def _stop_loopback(v: VolumeExport) -> None:
    """The export the baseline measured on loopback stops before the guest's is served on its bridge."""
    if v.export is not None:
        v.export.stop()
        v.export = None


class Transport:
    """What a run asks of a volume's scheme beyond its facts (`scheme`); one subclass per scheme."""

    scheme: Scheme

    def export_problem(self, has_module: HasModule) -> str:
        """Why this host cannot serve the scheme, as the listing of its exports says it ('' when it can)."""
        s = self.scheme
        return "" if shutil.which(s.server) else (f"{s.server} is not installed (Debian package {s.package}): run "
                                                  "'make deps'")

    def qemu_client(self) -> bool:
        """QEMU's client of the scheme is installed (disk.attach = qemu)."""
        return True

    def server_problem(self, has_module: HasModule) -> str:
        """Why this host cannot serve a run's volume of the scheme ('' when it can)."""
        return self._not_installed() if shutil.which(self.scheme.server) is None else ""

    def _not_installed(self) -> str:
        s = self.scheme
        return (f"{s.title} volumes are served by {s.server}, which is not installed (Debian package {s.package}): "
                "run 'make deps' (scripts/install-deps)")

    def preflight_problem(self, attach: str, has_module: HasModule) -> tuple[str, str]:
        """(why, its summary) this host cannot serve a run's volume attached by `attach`, as a run's first step
        checks it before anything is made; ("", "") when it can."""
        problem = self.server_problem(has_module)
        return problem, problem

    def serve_to_guest(self, v: VolumeExport, iface: str, address: str, clients: str | None) -> Served:
        """Serve `v` on the guest's bridge `iface` (this host's `address` there) to `clients` (NFS)."""
        raise NotImplementedError(self.scheme.name)


class BlockTransport(Transport):
    """A block scheme's: a stored volume's file served, attached by a host's kernel or a guest (or QEMU)."""

    def baseline_by_host_kernel(self, has_module: HasModule) -> bool:
        """Whether the host domain's baseline goes through this host's kernel initiator even when the guest
        attaches the volume itself."""
        return False

    def for_run(self, name: str, path: str, vol_bytes: int, attach: str, run_uuid: str, work_dir: Path,
                size_bytes: int, conn: typing.Any) -> VolumeExport:
        """Stored volume `name` (its file `path`, marked attached by `run_uuid`) served on this host for a run whose
        guest or QEMU attaches it, its baseline without this host's kernel initiator; on failure nothing is left."""
        raise NotImplementedError(self.scheme.name)

    def serve_here(self, name: str, path: str, run_uuid: str, work_dir: Path, after: list[Callable[[], None]]
                   ) -> tuple[Served, Callable[[], hostattach.HostAttachment], hostattach.NvmeHost | None]:
        """The volume's file served for this host's own kernel (on loopback; AoE on a veth pair, its removal put
        on `after`): (the export, what attaches it, the NVMe host identity)."""
        raise NotImplementedError(self.scheme.name)

    def security(self, exp: Served, attach: str) -> str:
        """What guards the volume this host serves itself, attached by `attach`."""
        raise NotImplementedError(self.scheme.name)

    def front_end_export(self, name: str, rv: remote.RemoteVolume, creds: nodecreds.NodeCreds) -> Served:
        """The export the front-end serves (`rv`), described as it serves it: nothing runs here."""
        raise NotImplementedError(self.scheme.name)

    def attach_front_end(self, rv: remote.RemoteVolume, creds: nodecreds.NodeCreds,
                         work_dir: Path) -> hostattach.HostAttachment:
        """This host's kernel attaching the front-end's export `rv` with the node's credentials."""
        raise NotImplementedError(self.scheme.name)

    def remote_security(self, attach: str, who: str, nvme_auth: bool | None) -> str:
        """What guards a volume the front-end serves to one node (`who`); `nvme_auth`: whether its nvmet target
        checks the DH-HMAC-CHAP key (None on the node, which does not know whether the front-end's kernel can)."""
        raise NotImplementedError(self.scheme.name)

    def serve_node(self, name: str, path: str, creds: nodecreds.NodeCreds, attach: str, run_uuid: str,
                   address: str, link: str, work_dir: Path, peer: str = "") -> Served:
        """The front-end's export of stored volume `name` (its file `path`) to one node only: on this host's
        private `address` (AoE: its private `link`, for the MACs of the node at `peer` and of its guest) with that
        node's credentials."""
        raise NotImplementedError(self.scheme.name)


class NbdTransport(BlockTransport):
    """NBD with TLS: qemu-nbd and this box's x509 credentials."""

    scheme = NBD

    def preflight_problem(self, attach: str, has_module: HasModule) -> tuple[str, str]:
        return "", ""  # nbd.start names a missing qemu-nbd itself

    def serve_to_guest(self, v: VolumeExport, iface: str, address: str, clients: str | None) -> Served:
        assert v.creds is not None
        _stop_loopback(v)
        return nbd.start(v.volume, v.path, v.creds.server_dir, client=pki.identity(v.creds.client_dir / CLIENT_CERT),
                         log=v.work_dir / "qemu-nbd.log", host=address)

    def for_run(self, name: str, path: str, vol_bytes: int, attach: str, run_uuid: str, work_dir: Path,
                size_bytes: int, conn: typing.Any) -> VolumeExport:
        store: backing.BackingStore | None = None
        try:
            creds = pki.ensure()
            pki.install_client(creds, pki.libvirt_nbd_dir(), group=pki.qemu_group())
            pki.install_client(creds, pki.LIBNBD_DIR)
            store = backing.new_work_dir("network-volume", work_dir, size_bytes, "raw")
            exp = nbd.start(name, path, creds.server_dir, client=pki.identity(creds.client_dir / CLIENT_CERT),
                            log=work_dir / "qemu-nbd.log")
        except BaseException:
            undo_attach(name, run_uuid, store)
            raise
        dev = backing.dev_name_for_path(path)
        store.path = store.baseline_target = exp.uri
        store.host_device = dev
        store.model = (f"NBD volume {name!r} ({backing.human_size(vol_bytes)}, TLS) served by {exp.server} from "
                       f"{path} on {backing.device_model(dev)}")
        if attach == "qemu":  # QEMU opens the export; a guest that attaches it itself has no disk
            store.network = backing.NetworkSource("nbd", name, exp.host, exp.port, tls=True)
        store.baseline_labels = [BASELINE_LABEL]
        if dev is None:
            store.labels.append("no-host-metrics")
        return VolumeExport(name, self.scheme.name, attach, store, exp, run_uuid, path=path, work_dir=work_dir,
                            creds=creds)

    def serve_here(self, name: str, path: str, run_uuid: str, work_dir: Path, after: list[Callable[[], None]]
                   ) -> tuple[Served, Callable[[], hostattach.HostAttachment], hostattach.NvmeHost | None]:
        pki_creds = pki.ensure()
        exp = nbd.start(name, path, pki_creds.server_dir, client=pki.identity(pki_creds.client_dir / CLIENT_CERT),
                        log=work_dir / "qemu-nbd.log")
        return exp, lambda: hostattach.attach_nbd(exp.host, exp.port, name, pki_creds.client_dir,
                                                  log=work_dir / "nbd-client.log"), None

    def security(self, exp: Served, attach: str) -> str:
        return "x509 (this box's CA; this box's client certificate only)"

    def front_end_export(self, name: str, rv: remote.RemoteVolume, creds: nodecreds.NodeCreds) -> Served:
        return nbd.NbdExport(name, "", rv.host, rv.port, "qemu-nbd (the front-end)")

    def attach_front_end(self, rv: remote.RemoteVolume, creds: nodecreds.NodeCreds,
                         work_dir: Path) -> hostattach.HostAttachment:
        return hostattach.attach_nbd(rv.host, rv.port, rv.target, creds.nbd_dir, log=work_dir / "nbd-client.log")

    def remote_security(self, attach: str, who: str, nvme_auth: bool | None) -> str:
        return (f"x509 ({who} client certificate of the front-end's CA, which it pins, and no other"
                + ("; handed to its guest" if attach == "guest" else "") + ")")

    def serve_node(self, name: str, path: str, creds: nodecreds.NodeCreds, attach: str, run_uuid: str,
                   address: str, link: str, work_dir: Path, peer: str = "") -> Served:
        ca = pki.ensure((f"IP:{address}",))
        # that node's certificate alone: another node's, or the one of a set forgotten at its removal or its
        # enrolment with a new host key (nodecreds.forget), is refused
        return nbd.start(name, path, ca.server_dir, client=pki.identity(creds.nbd_dir / CLIENT_CERT),
                         log=work_dir / "qemu-nbd.log", host=address)


class AoeTransport(BlockTransport):
    """AoE: vblade on a bridge or link, no authentication (layer 2)."""

    scheme = AOE

    def baseline_by_host_kernel(self, has_module: HasModule) -> bool:
        return has_module(self.scheme.host_module)  # the host domain's row, through a veth pair

    def serve_to_guest(self, v: VolumeExport, iface: str, address: str, clients: str | None) -> Served:
        shelf = aoe.shelf_for(v.run_uuid)
        return aoe.start(v.volume, v.path, iface, shelf=shelf, log=v.work_dir / "vblade.log",
                         macs=(aoe.guest_mac(shelf),))  # the guest's MAC, which the run gives it

    def for_run(self, name: str, path: str, vol_bytes: int, attach: str, run_uuid: str, work_dir: Path,
                size_bytes: int, conn: typing.Any) -> VolumeExport:
        """Only checked and marked here: `VolumeExport.serve()` exports it on the guest's bridge."""
        try:
            store = backing.new_work_dir("network-volume", work_dir, size_bytes, "raw")
        except BaseException:
            undo_attach(name, run_uuid)
            raise
        dev = backing.dev_name_for_path(path)
        target = f"e{aoe.shelf_for(run_uuid)}.0"
        store.path = f"aoe:{target}"
        store.baseline_target = ""
        store.host_device = dev
        store.model = (f"AoE volume {name!r} ({backing.human_size(vol_bytes)}, no authentication) served by vblade "
                       f"as {target} on the guest's bridge from {path} on {backing.device_model(dev)}")
        if dev is None:
            store.labels.append("no-host-metrics")
        return VolumeExport(name, self.scheme.name, attach, store, None, run_uuid, path=path, work_dir=work_dir,
                            tls="none: AoE is layer 2 without authentication; served on the guest's bridge only, "
                                "answering its MAC only",
                            no_baseline=no_aoe_baseline())

    def serve_here(self, name: str, path: str, run_uuid: str, work_dir: Path, after: list[Callable[[], None]]
                   ) -> tuple[Served, Callable[[], hostattach.HostAttachment], hostattach.NvmeHost | None]:
        server_end, host_end = aoe.veth_pair(run_uuid)
        after.append(lambda: aoe.remove_veth(server_end))
        exp = aoe.start(name, path, server_end, shelf=aoe.shelf_for(run_uuid), log=work_dir / "vblade.log",
                        macs=(aoe.link_mac(host_end),))
        return exp, lambda: hostattach.attach_aoe(exp.target, host_end), None

    def security(self, exp: Served, attach: str) -> str:
        return "none: AoE is layer 2 without authentication; a veth pair of the run's own, " + (
            "nothing else on it" if attach == "host" else "then the guest's bridge only, answering its MAC only")

    def front_end_export(self, name: str, rv: remote.RemoteVolume, creds: nodecreds.NodeCreds) -> Served:
        shelf, slot = rv.shelf_slot
        return aoe.AoeExport(name, "", rv.host, shelf, slot, server="vblade (the front-end)")

    def attach_front_end(self, rv: remote.RemoteVolume, creds: nodecreds.NodeCreds,
                         work_dir: Path) -> hostattach.HostAttachment:
        from ...spec import nodeconf

        link = nodeconf.private_link(nodeconf.settings())
        if not link:
            raise CloudboxError("AoE from the front-end is layer 2: this node's settings name no private NIC to find "
                                f"it on ({nodeconf.node_settings_file()})")
        return hostattach.attach_aoe(rv.target, link)

    def remote_security(self, attach: str, who: str, nvme_auth: bool | None) -> str:
        return ("none: AoE is layer 2 without authentication; the private network only, answering the MACs of "
                f"{who} host and guest (which any host there can send from)")

    def serve_node(self, name: str, path: str, creds: nodecreds.NodeCreds, attach: str, run_uuid: str,
                   address: str, link: str, work_dir: Path, peer: str = "") -> Served:
        if not peer:
            raise CloudboxError(f"AoE volume {name!r} for {creds.node}: the node's private address is needed for "
                                "vblade's allow-list")
        shelf = aoe.shelf_for(run_uuid)
        # the node's host (its private link's MAC, as its aoe driver sends from it) and its guest (the MAC the node
        # gives it: aoe.guest_mac of the shelf in the volume's address)
        return aoe.start(name, path, link, shelf=shelf, log=work_dir / "vblade.log",
                         macs=(aoe.neighbour_mac(peer, link), aoe.guest_mac(shelf)))


class IscsiTransport(BlockTransport):
    """iSCSI with CHAP: tgtd, this box's CHAP secret and initiator name."""

    scheme = ISCSI

    def qemu_client(self) -> bool:
        return iscsi.qemu_driver() is not None  # QEMU's libiscsi driver (qemu-block-extra); the guest's is its own

    def preflight_problem(self, attach: str, has_module: HasModule) -> tuple[str, str]:
        if shutil.which("tgtd") is None or shutil.which("tgtadm") is None:
            return self._not_installed(), self._not_installed()
        if attach == "qemu" and iscsi.qemu_driver() is None:
            problem = ("disk.attach = qemu: QEMU's iSCSI driver (block-iscsi.so) is not installed (Debian package "
                       "qemu-block-extra): run 'make deps' (scripts/install-deps)")
            return problem, problem
        return "", ""

    def serve_to_guest(self, v: VolumeExport, iface: str, address: str, clients: str | None) -> Served:
        _stop_loopback(v)
        return iscsi.start(v.volume, v.path, iscsi.chap(), log=v.work_dir / "tgtd.log", host=address)

    def for_run(self, name: str, path: str, vol_bytes: int, attach: str, run_uuid: str, work_dir: Path,
                size_bytes: int, conn: typing.Any) -> VolumeExport:
        """tgtd serves the volume on 127.0.0.1 with CHAP; QEMU logs in with a libvirt secret of the run's own (on
        `conn`), or the guest logs in itself once `serve()` has moved the target to its bridge."""
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
            undo_attach(name, run_uuid, store)
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
        return VolumeExport(name, self.scheme.name, attach, store, exp, run_uuid, path=path, work_dir=work_dir,
                            tls=f"CHAP (this box's secret) and its initiator name; not encrypted: {where}",
                            secret_uuid=secret, conn=conn)

    def serve_here(self, name: str, path: str, run_uuid: str, work_dir: Path, after: list[Callable[[], None]]
                   ) -> tuple[Served, Callable[[], hostattach.HostAttachment], hostattach.NvmeHost | None]:
        creds = iscsi.chap()
        exp = iscsi.start(name, path, creds, log=work_dir / "tgtd.log")
        return exp, lambda: hostattach.attach_iscsi(exp.host, exp.port, exp.iqn, creds), None

    def security(self, exp: Served, attach: str) -> str:
        return f"CHAP (this box's secret) and its initiator name; not encrypted: {_where(attach)}"

    def front_end_export(self, name: str, rv: remote.RemoteVolume, creds: nodecreds.NodeCreds) -> Served:
        return iscsi.IscsiExport(name, "", rv.host, rv.port, rv.target, 0, "tgtd (the front-end)")

    def attach_front_end(self, rv: remote.RemoteVolume, creds: nodecreds.NodeCreds,
                         work_dir: Path) -> hostattach.HostAttachment:
        return hostattach.attach_iscsi(rv.host, rv.port, rv.target, creds.chap, lun=rv.lun)

    def remote_security(self, attach: str, who: str, nvme_auth: bool | None) -> str:
        return (f"CHAP ({who} secret, made by the front-end{', handed to its guest' if attach == 'guest' else ''}) "
                "and its initiator name; not encrypted: the private network")

    def serve_node(self, name: str, path: str, creds: nodecreds.NodeCreds, attach: str, run_uuid: str,
                   address: str, link: str, work_dir: Path, peer: str = "") -> Served:
        return iscsi.start(name, path, creds.chap, log=work_dir / "tgtd.log", host=address)


class NvmeTcpTransport(BlockTransport):
    """NVMe/TCP: the kernel's own target (nvmet), open to this box's host NQN (and its key where it checks keys)."""

    scheme = NVME_TCP

    def export_problem(self, has_module: HasModule) -> str:
        return nvmet.problem(has_module)

    def server_problem(self, has_module: HasModule) -> str:
        problem = nvmet.problem(has_module)
        return f"NVMe/TCP volumes are served by {problem}" if problem else ""

    def preflight_problem(self, attach: str, has_module: HasModule) -> tuple[str, str]:
        if problem := nvmet.problem(has_module):
            return (f"NVMe/TCP volumes are served by {problem}; the appliance's kernel has it",
                    "NVMe/TCP: no nvmet in this kernel")
        return "", ""

    def baseline_by_host_kernel(self, has_module: HasModule) -> bool:
        return True  # the kernel's target serves the host's kernel first, then the guest on its bridge

    def serve_to_guest(self, v: VolumeExport, iface: str, address: str, clients: str | None) -> Served:
        _stop_loopback(v)
        # the guest's kernel (6.1) has no NVMe in-band authentication, so its host NQN is its only credential: one of
        # the run's own (random, never shown), which no later run's allow-list names; the guest attaches as it
        v.nvme_host = hostattach.new_nvme_host(f"run-{v.run_uuid[:8]}-{secrets.token_hex(4)}")
        return nvmet.start(v.volume, v.path, allowed={v.nvme_host.nqn: ""}, run_uuid=v.run_uuid, host=address)

    def serve_here(self, name: str, path: str, run_uuid: str, work_dir: Path, after: list[Callable[[], None]]
                   ) -> tuple[Served, Callable[[], hostattach.HostAttachment], hostattach.NvmeHost | None]:
        ident = hostattach.nvme_host()
        nvmet.load()
        key = ident.key if nvmet.auth_supported() else ""
        exp = nvmet.start(name, path, allowed={ident.nqn: key}, run_uuid=run_uuid,
                          ctrl_keys={ident.nqn: ident.ctrl_key})
        return exp, lambda: hostattach.attach_nvme(exp.host, exp.port, exp.nqn, ident, authenticate=bool(key)), ident

    def security(self, exp: Served, attach: str) -> str:
        assert isinstance(exp, nvmet.NvmetExport)
        how = ("DH-HMAC-CHAP both ways (this box's key, and the target's to this box) and its host NQN" if exp.mutual
               else "DH-HMAC-CHAP (this box's key) and its host NQN" if exp.authenticated else "its host NQN only")
        return f"{how}; not encrypted: {_where(attach)}"

    def front_end_export(self, name: str, rv: remote.RemoteVolume, creds: nodecreds.NodeCreds) -> Served:
        return nvmet.NvmetExport(name, "", rv.host, rv.port, rv.target, 0, (creds.nvme.nqn,),
                                 server="nvmet (the front-end)")

    def attach_front_end(self, rv: remote.RemoteVolume, creds: nodecreds.NodeCreds,
                         work_dir: Path) -> hostattach.HostAttachment:
        # the node's secret and the target's go along: the front-end asks for them only where its target checks keys
        return hostattach.attach_nvme(rv.host, rv.port, rv.target, creds.nvme, authenticate=True)

    def remote_security(self, attach: str, who: str, nvme_auth: bool | None) -> str:
        guest = attach == "guest"
        if nvme_auth:
            how = f"{who} host NQN and its DH-HMAC-CHAP key (the target's key answering it where the kernel has it)"
        elif guest or nvme_auth is False:
            how = f"{who} host NQN only" + (" (its guest's kernel has no NVMe authentication)" if guest else "")
        else:
            how = f"{who} host NQN and DH-HMAC-CHAP key (checked where the front-end's kernel can)"
        return how + "; not encrypted: the private network"

    def serve_node(self, name: str, path: str, creds: nodecreds.NodeCreds, attach: str, run_uuid: str,
                   address: str, link: str, work_dir: Path, peer: str = "") -> Served:
        nvmet.load()
        # the node's host checks its key; its guest's kernel (6.1) cannot: the allow-list only then
        key = creds.nvme.key if attach == "host" and nvmet.auth_supported() else ""
        return nvmet.start(name, path, allowed={creds.nvme.nqn: key}, run_uuid=run_uuid, host=address,
                           ctrl_keys={creds.nvme.nqn: creds.nvme.ctrl_key})


class NfsTransport(Transport):
    """NFSv4: nfs-ganesha exporting a directory of the run's own."""

    scheme = NFS

    def preflight_problem(self, attach: str, has_module: HasModule) -> tuple[str, str]:
        problem = nfs.server_problem()
        return problem, problem

    def serve_to_guest(self, v: VolumeExport, iface: str, address: str, clients: str | None) -> Served:
        return nfs.start(v.volume, v.path, iface=iface, host=address, work_dir=v.work_dir / "ganesha",
                         clients=clients)


TRANSPORTS: dict[str, Transport] = {t.scheme.name: t for t in (NbdTransport(), AoeTransport(), IscsiTransport(),
                                                               NvmeTcpTransport(), NfsTransport())}


def transport(scheme: str) -> Transport:
    """The transport of `scheme` (a name in core.spec.schemes.SCHEMES)."""
    return TRANSPORTS[scheme]


def block_transport(scheme: str) -> BlockTransport:
    """The transport of block scheme `scheme`."""
    t = TRANSPORTS[scheme]
    assert isinstance(t, BlockTransport), f"{scheme}: not a block scheme"
    return t


