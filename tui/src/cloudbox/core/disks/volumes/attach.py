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
import typing
from dataclasses import dataclass
from pathlib import Path

from ...errors import CloudboxError, NoSpace
from ...spec import knobs, remote
from ...spec.schemes import AOE, SCHEMES, attached_by, scheme_of
from .. import backing
from . import aoe, hostattach, nfs, nodecreds, nvmet
from .store import VolumeBusy, VolumeStore, check_name
from .transports import (
    BASELINE_LABEL,
    NFS_HOST_MOUNT,
    Served,
    VolumeExport,
    block_transport,
    transport,
    undo_attach,
)

HOST_INITIATOR_LABEL = "host-initiator"  # ... through this host's kernel initiator, on the device it attached
# how an iSCSI baseline test reached the target: libiscsi's iscsi-perf itself, or QEMU's libiscsi in qemu-nbd
ISCSI_READER_LABELS = {"direct": "iscsi-perf", "relay": "libiscsi-relay"}
NFS_BASELINE_LABEL = "nfs-export-dir"  # the baseline ran on the export's directory on the server's disk, not over NFS


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
    s = SCHEMES.get(scheme)
    if attach == "host":
        if s is None or attach not in s.attach:  # every block scheme
            raise AttachRefused(f"disk.attach = host ({scheme}): the host hands the guest a block device, and a "
                                f"{scheme}: volume is a file system; allowed: disk.attach = guest")
        module = s.host_module
        if not has_module(module):
            summary = f"disk.attach = host ({scheme}): this kernel has no {module}"
            raise AttachRefused(
                f"{summary}: the host's kernel attaches the volume with its {module} driver, which this kernel "
                f"({platform.release()}) lacks (not built in, no loadable module in /lib/modules). The appliance's "
                "kernel has every initiator; here use disk.attach = qemu (" + _listed("qemu")
                + " volumes; presets kvm-ebs-nbd, kvm-ebs-iscsi) or disk.attach = guest ("
                + _listed("guest") + " volumes; presets kvm-ebs-aoe-guest, "
                "kvm-ebs-nbd-guest, kvm-ebs-iscsi-guest, nfs-async-tcp)", summary)
        if (problem := tool_problem(scheme)):
            raise AttachRefused(f"disk.attach = host ({scheme}): {problem}", f"disk.attach = host ({scheme}): "
                                f"{problem.split(' (')[0]}")
        return
    if attach == "guest":
        if s is None or attach not in s.attach:  # the guest's image has every initiator and an NFSv4 client
            raise AttachRefused(f"disk.attach = guest ({scheme}) is not implemented yet; the guest attaches "
                                + _listed("guest") + " volumes (presets kvm-ebs-aoe-guest, "
                                "kvm-ebs-nbd-guest, kvm-ebs-iscsi-guest, kvm-ebs-nvme-guest, nfs-async-tcp)")
        if hypervisor != "kvm":
            raise AttachRefused(f"disk.attach = guest is implemented under KVM/QEMU only, not guest.hypervisor = "
                                f"{hypervisor}")
        return
    if s is None or not s.qemu:
        raise AttachRefused(f"disk.attach = qemu ({scheme}) is not implemented yet; "
                            + _listed("qemu", " and ") + " volumes are")


def _listed(mode: str, sep: str = ", ") -> str:
    """The schemes disk.attach = `mode` is implemented for, as the refusals name them (AoE's first: it was the first
    a guest attached itself)."""
    return sep.join(f"{s.name}:" for s in sorted(attached_by(mode), key=lambda s: s is not AOE))


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
    for s in SCHEMES.values():
        if not s.block:  # an NFS export is a run's own directory, never a stored volume
            continue
        modes = []
        for mode in typing.get_args(knobs.Attach):
            try:
                check_attach(s.name, mode, hypervisor=hypervisor, has_module=has_module)
            except AttachRefused:
                continue
            modes.append(mode)
        t = transport(s.name)
        if "qemu" in modes and not t.qemu_client():
            modes.remove("qemu")  # QEMU's client of it is missing; the guest's initiator is not
        out.append(Export(s.name, s.server, tuple(modes), t.export_problem(has_module)))
    return out


def parse_volume(spec: str) -> tuple[str, str]:
    """'nbd:ebs' -> ('nbd', 'ebs')."""
    scheme, _, name = spec.partition(":")
    return scheme, check_name(name)


def preflight(spec: str, attach: str, size_bytes: int, *, hypervisor: str = "kvm") -> tuple[str, str]:
    """(scheme, volume name) once the attach mode can run here, the volume exists, is free and holds `size_bytes`;
    else the error that says why. Nothing is made."""
    scheme = spec.partition(":")[0]
    check_attach(scheme, attach, hypervisor=hypervisor)
    problem, summary = transport(scheme).preflight_problem(attach, kernel_module_available)
    if problem:
        raise AttachRefused(problem, summary)
    if not SCHEMES[scheme].block:  # NFS: a fresh directory of the run's, nothing stored to look up
        return parse_volume(spec)
    scheme, name = parse_volume(spec)
    with VolumeStore() as vs:
        vol = vs.get(name)
    if vol.size_bytes < size_bytes:
        raise NoSpace(f"volume {name!r} holds {backing.human_size(vol.size_bytes)}, less than the test size "
                      f"{backing.human_size(size_bytes)}; use a smaller --size or a larger volume")
    if vol.attached_run:
        raise VolumeBusy(f"volume {name!r} is attached by run {vol.attached_run}; a volume serves one run at a time")
    return scheme, name


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
    file_system = (s := scheme_of(spec)) is not None and not s.block  # NFS: no stored volume
    if file_system and nfs_server is not None:
        return _for_remote_nfs(spec, attach, run_uuid, work_dir, size_bytes, hypervisor, nfs_server)
    if file_system:
        return _for_nfs(spec, attach, run_uuid, work_dir, size_bytes, hypervisor, guests)
    scheme, name = preflight(spec, attach, size_bytes, hypervisor=hypervisor)
    with VolumeStore() as vs:
        vol = vs.attach(name, run_uuid)
    t = block_transport(scheme)
    if attach == "host" or t.baseline_by_host_kernel(kernel_module_available):
        return _for_host(scheme, name, vol.path, vol.size_bytes, attach, run_uuid, work_dir, size_bytes)
    return t.for_run(name, vol.path, vol.size_bytes, attach, run_uuid, work_dir, size_bytes, conn)


def host_attached(scheme: str, name: str, path: str, run_uuid: str, work_dir: Path
                  ) -> tuple[Served, hostattach.HostAttachment, list[typing.Callable[[], None]],
                             hostattach.NvmeHost | None]:
    """The volume's file exported on this host (loopback; AoE on a veth pair) and attached by this host's kernel:
    (export, attachment, what to undo after the export stops, the NVMe host identity). On failure nothing is
    left."""
    after: list[typing.Callable[[], None]] = []
    exp: Served | None = None
    try:
        exp, attach_it, ident = block_transport(scheme).serve_here(name, path, run_uuid, work_dir, after)
        att = attach_it()
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
                         tls=block_transport(scheme).security(exp, attach), attachment=att,
                         attached=(att.device, att.how), server_device=server_dev, nvme_host=ident, after_stop=after)
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
        s = SCHEMES[scheme]
        store.model = (f"{s.title} volume {name!r} ({backing.human_size(vol_bytes)}) served by {s.served_here} from "
                       f"{path} on {backing.device_model(server_dev)}, attached by {att.how} as {att.device}")
    except BaseException:
        if v is not None:
            v.close()  # detaches, stops the export, clears the mark, removes the store
        else:
            undo_attach(name, run_uuid, store)
        raise
    return v


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
    t, s = block_transport(scheme), SCHEMES[scheme]
    # described as the front-end serves it (`server` names it "... on HOST:PORT as TARGET")
    exp = t.front_end_export(name, rv, creds)
    v = VolumeExport(name, scheme, attach, store, exp, run_uuid, path="", work_dir=work_dir,
                     tls=t.remote_security(attach, "this node's", None), chap=creds.chap, client_dir=creds.nbd_dir,
                     nvme_host=creds.nvme, served_by_front_end=True)
    store.path = exp.uri
    store.host_device = None  # the disk under the volume is the front-end's (it samples it)
    store.labels.append("no-host-metrics")
    host_can = kernel_module_available(s.host_module) and not hostattach.tool_problem(scheme)
    if attach == "guest" and not host_can:
        v.no_baseline = (f"no baseline: this host's kernel has no {s.host_module} (or its initiator program), so the "
                         "host domain cannot attach the front-end's volume; nothing is measured in its place")
        return v
    try:
        att = t.attach_front_end(rv, creds, work_dir)
        v.attachment, v.attached = att, (att.device, att.how)
        store.is_block = True  # the baseline's target is a device: never unlinked
        store.baseline_target = att.device
        store.baseline_labels = [BASELINE_LABEL, HOST_INITIATOR_LABEL]
        if attach == "host":
            store.path = att.device
            store.host_device = att.diskstats_name  # the back-end's view of the volume
            store.labels.remove("no-host-metrics")
        store.model = f"{s.title} volume {name!r} served by {exp.server}, attached by {att.how} as {att.device}"
    except BaseException:
        v.close()  # logs out or disconnects what was attached, removes the store
        raise
    return v


def export_for_node(spec: str, attach: str, *, node: str, creds: nodecreds.NodeCreds, run_uuid: str,
                    work_dir: Path, size_bytes: int, address: str, link: str, peer: str = "") -> VolumeExport:
    """The front-end's side of a back-end's run on a stored volume: checked, marked attached by the run and served on
    this host's private `address` (AoE on its private `link`) to that node only (at `peer`, its private address):
    its CHAP identity, its NVMe host NQN, its client certificate of this box's CA, its MACs. `close()` stops it."""
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
        exp = block_transport(scheme).serve_node(name, vol.path, creds, attach, run_uuid, address, link, work_dir,
                                                 peer)
    except BaseException:
        undo_attach(name, run_uuid, store)
        raise
    server_dev = backing.dev_name_for_path(vol.path)
    store.path = f"aoe:{exp.target}@{address}" if isinstance(exp, aoe.AoeExport) else exp.uri
    store.host_device = server_dev
    store.model = f"{SCHEMES[scheme].title} volume {name!r} ({backing.human_size(vol.size_bytes)}) served to {node}"
    tls = block_transport(scheme).remote_security(attach, f"{node}'s",  # what this target checks, exactly
                                                  exp.authenticated if isinstance(exp, nvmet.NvmetExport) else None)
    return VolumeExport(name, scheme, attach, store, exp, run_uuid, path=vol.path, work_dir=work_dir, tls=tls,
                        server_device=server_dev)


def _server_check(scheme: str) -> None:
    """The server of `scheme` can run on this host (what `preflight` checks of it), or AttachRefused saying why."""
    if problem := transport(scheme).server_problem(kernel_module_available):
        raise AttachRefused(problem)
