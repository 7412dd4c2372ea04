"""A run on this host, as a sequence of small steps over one RunContext: the guest image, the accelerator, libvirt,
the backing store, the host disk's sampler, the bare-metal storage baseline, the network plumbing, the guest's
launch, its storage tests, the network tests (or a guest session's hold). Each step registers what it creates in
the context's cleanup stack; the lifecycle (core.run.lifecycle) unwinds it whatever happens.

The guest's serial console is logged to console.log in the run's work directory (removed with it); when the guest
dies or its agent stops answering, the run's reason ends with the console's last lines.
"""

from __future__ import annotations

import contextlib
import functools
import os
import platform
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from cloudbox import __version__

from .. import paths
from ..bench import fio, iozone, iscsiperf, runners
from ..disks import backing, claims, hostraid, pcidev, vhostuser, virtiofs
from ..disks.diskstats import Sample, Sampler
from ..disks.volumes import aoe, hostattach, iscsi, nbd, nfs, nvmet
from ..disks.volumes.attach import ISCSI_READER_LABELS, check_attach, export_for_run, preflight
from ..disks.volumes.transports import NFS_HOST_MOUNT, VolumeExport
from ..errors import CloudboxError, DiskStalled
from ..record.events import ProgressEvent, SampleEvent
from ..record.hoststate import read_host_state
from ..record.provenance import (
    BackingInfo,
    Controller,
    DiskStall,
    Dom0Info,
    GuestImageInfo,
    Provenance,
    RaidInfo,
    Versions,
    VolumeInfo,
)
from ..spec import addresses, catalogue
from ..spec.knobs import NVME_PCI, VHOST_USER, VIRTIOFS, Dom0, is_nfs, is_share
from ..spec.profiles import Profile, xen_guest_type
from ..spec.runspec import BOOT, RunSpec
from ..spec.schemes import SCHEMES
from ..virt import accel, daemons, network, xendom0
from ..virt.domain import DomainPlan, render_domain
from ..virt.guest import reap_orphans
from ..virt.guestimage import CMDLINE, GuestImage
from .context import RunContext
from .launch import agent_socket, launch, remove_socket
from .measure import caches, steady_state, storage_test
from .network_steps import configure_nic, hold, network_tests, plumb
from .placing import place_guests, record_placement

T = TypeVar("T")

Step = Callable[[RunContext], None]


def run_local(ctx: RunContext) -> None:
    """The run's body on this host (core.run.lifecycle.Execution runs it)."""
    for step in (*setup_steps(), storage_baseline, plumb, serve_volume, launch_guest):
        step(ctx)
    assert ctx.guest is not None
    if ctx.spec.session:
        hold(ctx, ctx.guest, ctx.boot_s)
        return
    guest_storage(ctx)
    if ctx.spec.wants_network and ctx.hostnet is not None:
        network_tests(ctx, ctx.guest)


def setup_steps() -> tuple[Step, ...]:
    """What every run on this host does before its first test, a single pass or a repeated one alike."""
    return (check_volume, find_image, probe_accelerator, connect_libvirt, place_guests, prepare_backing,
            record_facts, tune_dom0, start_sampler)


def check_volume(ctx: RunContext) -> None:
    """A network volume's attach mode, existence and size, before anything is made (the export comes later)."""
    d = ctx.profile.disk
    if d.backing == "network-volume" and ctx.spec.volume_uri:  # the front-end serves it and checked it
        check_attach(d.volume.partition(":")[0], d.attach, hypervisor=ctx.profile.guest.hypervisor)
    elif d.backing == "network-volume" and not nfs_server(ctx.spec):
        preflight(d.volume, d.attach, ctx.size, hypervisor=ctx.profile.guest.hypervisor)
    if is_share(d) and ctx.spec.wants_storage:
        on_device = [t.id for t in catalogue.resolve_tests(ctx.spec.storage_tests) if t.makes_fs]
        share = f"{d.volume} is an NFS export" if is_nfs(d) else "a virtiofs share is"
        if on_device:
            raise CloudboxError(f"profile {ctx.profile.name}: {', '.join(on_device)} makes a file system on a block "
                                f"device, and {share} (a file system already); allowed here: every other storage "
                                "test (fio, dd, IOzone)")


def find_image(ctx: RunContext) -> None:
    ctx.sink.step("checking the benchmark guest image")
    ctx.image = GuestImage.locate()


def probe_accelerator(ctx: RunContext) -> None:
    # before the probe, which boots a KVM test guest
    on_xen = accel.booted_into_xen()
    why = accel.hypervisor_mismatch(ctx.profile.name, ctx.profile.guest.hypervisor, on_xen)
    if not why and on_xen and xen_guest_type(ctx.profile) in accel.HVM_CLASS:
        why = accel.xen_type_refusal(ctx.profile.name, xen_guest_type(ctx.profile), accel.xen_hvm())
    if why:
        raise CloudboxError(why)
    ctx.sink.step("probing the accelerator")
    acc = ctx.accelerator = accel.detect(ctx.image.kernel)
    ctx.sink.log(f"accelerator: {acc.label}: {acc.reason}")
    if acc.emulated:
        ctx.labels.append("emulated")
    if acc.nested:
        ctx.labels.append("nested")
    if ctx.quick:
        ctx.labels.append("quick-size")


def connect_libvirt(ctx: RunContext) -> None:
    """libvirt (started here where systemd does not), and the guests of runs that died, destroyed."""
    ctx.sink.step("connecting to libvirt")
    with ctx.control.atomic():
        ctx.conn = daemons.connect(daemons.XEN_URI if ctx.dom0 else None, hide_kvm=not ctx.accelerator.kvm_usable)
        ctx.stack.callback(ctx.conn.close)
    live = {r.uuid for r in ctx.store.active_runs()}
    for name in reap_orphans(ctx.conn, live | {ctx.run_uuid}, ctx.store.run_uuids()):
        ctx.sink.log(f"destroyed orphan guest {name} left by a dead run")
    for usage in iscsi.reap_secrets(ctx.conn, live | {ctx.run_uuid}, set(ctx.store.run_uuids())):
        ctx.sink.log(f"removed libvirt secret {usage} left by a dead run")
    reap_volume_leftovers(ctx, live)


def reap_volume_leftovers(ctx: RunContext, live: set[str]) -> None:
    """What runs killed outright left in this host's kernel: NVMe/TCP exports (named by their run), AoE veth pairs,
    and, with no other run of this host live (its run lock is ours), every session to cloudbox's targets."""
    for nqn in nvmet.reap(live | {ctx.run_uuid}):
        ctx.sink.log(f"removed NVMe/TCP export {nqn} left by a dead run")
    for name in aoe.reap_veths(live | {ctx.run_uuid}):
        ctx.sink.log(f"removed AoE veth pair {name} left by a dead run")
    if not {r.uuid for r in ctx.store.active_runs() if not r.node} - {ctx.run_uuid}:
        for what in hostattach.reap():
            ctx.sink.log(f"detached {what}, left by a dead run")
    base = paths.work_base(ctx.spec.work_dir)
    for what in hostraid.reap(base, live | {ctx.run_uuid}):  # before its loops' files go with the directory
        ctx.sink.log(f"stopped {what}, left by a dead run")
    for u in ctx.store.run_uuids():  # a run killed outright leaves its work directory (its stores, logs)
        d = base / f"run-{u[:12]}"
        if u not in live and u != ctx.run_uuid and d.is_dir():
            shutil.rmtree(d, ignore_errors=True)
            ctx.sink.log(f"removed {d}, left by a dead run")


def prepare_backing(ctx: RunContext) -> None:
    spec, disk = ctx.spec, ctx.profile.disk
    base = paths.work_base(spec.work_dir)
    ctx.sink.step(f"preparing the backing store ({disk.backing}, {backing.human_size(ctx.size)})")
    ctx.work_dir = base / f"run-{ctx.run_uuid[:12]}"
    if disk.backing == "network-volume":
        ctx.sink.log(f"volume {disk.volume}, attached by {disk.attach}: exporting it for this run")
        with ctx.control.atomic():
            ctx.volume = export_for_run(disk.volume, disk.attach, run_uuid=ctx.run_uuid, work_dir=ctx.work_dir,
                                        size_bytes=ctx.size, hypervisor=ctx.profile.guest.hypervisor,
                                        conn=ctx.conn, nfs_server=nfs_server(spec), remote_uri=spec.volume_uri)
            ctx.stack.callback(ctx.volume.close)
        ctx.backing = ctx.volume.store
        if ctx.volume.export is not None:
            ctx.sink.log(f"volume exported: {ctx.volume.uri} ({ctx.volume.server}; authentication: "
                         f"{ctx.volume.tls})")
        else:
            ctx.sink.log(f"volume {disk.volume} marked attached; served on the guest's bridge once that exists")
        ctx.labels += ctx.backing.labels
        ctx.sink.log(f"backing store ready: {ctx.backing.model}")
        return
    with ctx.control.atomic():
        if disk.backing == NVME_PCI:
            ctx.backing = pcidev.prepare(nvme_controller(ctx), work_dir=ctx.work_dir, size_bytes=ctx.size,
                                         confirm=spec.destroy or None)
        else:
            ctx.backing = backing.prepare(disk.backing, work_dir=ctx.work_dir, size_bytes=ctx.size,
                                          fmt=disk.format, device=spec.device or None, confirm=spec.destroy or None,
                                          volume=disk.volume, count=disk.count)
        ctx.stack.callback(ctx.backing.remove)
        if disk.raid_on == "host":
            ctx.host_raid = hostraid.build(ctx.backing, disk.chunk_kib)
    serve_vhost_user(ctx, ctx.backing, ctx.work_dir)
    if ctx.host_raid is not None:
        ctx.sink.log(f"host md array: {ctx.host_raid.device}, RAID 0 over {', '.join(ctx.host_raid.members)} "
                     f"({ctx.host_raid.chunk_kib} KiB chunks): the guest's one disk and the baseline's target")
    ctx.labels += ctx.backing.labels
    ctx.sink.log(f"backing store ready: {ctx.backing.model}")


def nvme_controller(ctx: RunContext) -> str:
    """The NVMe controller a nvme-pci run hands its guest: the one --device names, never another."""
    if not pcidev.is_pci_address(ctx.spec.device):
        spare = ", ".join(pcidev.spare_controllers()) or "none"
        raise CloudboxError(f"profile {ctx.profile.name}: disk.backing = nvme-pci hands the guest a whole NVMe "
                            f"controller of this host, which the run must be given: --device <PCI address> (got "
                            f"{ctx.spec.device or 'none'}; NVMe controllers not in use here: {spare})")
    return ctx.spec.device


def serve_vhost_user(ctx: RunContext, store: backing.BackingStore, work_dir: Path, k: int = 1,
                     profile: Profile | None = None) -> None:
    """disk.backing = vhost-user: qemu-storage-daemon serving guest k's `store` over a socket in `work_dir`, on the
    CPUs its placement gives the iothreads (else QEMU's threads), stopped on the cleanup stack (after the guest,
    which is launched later)."""
    d = (profile or ctx.profile).disk
    if d.backing != VHOST_USER:
        return
    placed = ctx.placement(k)
    cpus = (placed.iothreads or placed.emulator) if placed is not None else ""
    with ctx.control.atomic():
        export = vhostuser.serve(store, work_dir, cache=d.cache, io=d.io, queues=d.queues, iothread=d.iothreads > 0,
                                 cpus=cpus)
        ctx.stack.callback(export.close)
    ctx.sink.log(f"vhost-user-blk: {vhostuser.DAEMON} (pid {export.pid}) serves {store.path} on {export.socket} "
                 f"(cache {d.cache}, aio {d.io}, {d.queues} queue{'s' if d.queues > 1 else ''}"
                 + (", its own iothread" if d.iothreads else "") + f", on CPUs {export.cpus_allowed() or '?'})")


def _host_raid_info(array: hostraid.HostArray | None) -> RaidInfo | None:
    if array is None:
        return None
    return RaidInfo(where="host", device=array.device, level="0", chunk_kib=array.chunk_kib, members=array.members,
                    mdstat=array.mdstat)


def record_facts(ctx: RunContext) -> None:
    """The run's provenance so far: this host, the accelerator, the versions, the guest image, the backing store."""
    acc, image, store = ctx.accelerator, ctx.image, ctx.backing
    cpus, cores = cpu_counts()
    ctx.provenance = Provenance(
        controller=Controller.this_host(), host=platform.node(), host_kernel=platform.release(), cpu=_cpu_model(),
        host_cpus=cpus, host_cores=cores, accelerator=acc,
        versions=Versions(cloudbox=__version__, qemu=_version(["qemu-system-x86_64", "--version"]),
                          libvirt=_libvirt_version(ctx.conn.getLibVersion()),
                          hypervisor=_libvirt_version(ctx.conn.getVersion()), fio=_version(["fio", "--version"]),
                          netperf=_version(["netperf", "-V"]), iperf3=_version(["iperf3", "--version"]),
                          iozone=_iozone_version(),
                          guest_packages=image.packages),
        guest_image=GuestImageInfo(kernel_version=image.kernel_version, sha256=image.manifest.get("sha256", {})),
        backing=BackingInfo(kind=store.kind, path=store.path, device=store.host_device, model=store.model,
                            size_bytes=store.size_bytes, format=store.format, is_block=store.is_block,
                            count=1 + len(store.more_paths) if store.more_paths else None,
                            more_paths=store.more_paths or None),
        volume=volume_info(ctx.volume),
        raid=_host_raid_info(ctx.host_raid),
        placement=ctx.provenance.placement,  # place_guests ran first: it refuses before the store is made
        spec=ctx.spec, host_state=read_host_state(disk=store.host_device), caches=caches(ctx),
        steady_state=steady_state(ctx))
    ctx.store.update_run(ctx.run_id, accelerator=acc.name, emulated=int(acc.emulated or acc.nested))
    ctx.save_provenance()


def tune_dom0(ctx: RunContext, xl: str = "xl") -> None:
    """A Xen profile's [dom0] knobs, set before dom0's baseline and the guest, recorded, restored after the run."""
    knobs = ctx.profile.dom0
    if knobs == Dom0() or not ctx.dom0:
        return
    ctx.sink.step("setting dom0's " + " and ".join(
        w for w, on in (("vCPU pinning", knobs.vcpu_pin), ("memory", knobs.memory_mib)) if on))
    tuning = xendom0.Tuning(knobs, xl=xl, cancelled=ctx.control.cancelled)

    def restore() -> None:
        note = tuning.restore()
        if note:
            with contextlib.suppress(Exception):  # the run's outcome stands whatever the log does
                ctx.sink.log(note)

    with ctx.control.atomic():
        ctx.stack.callback(restore)
    tuning.apply()
    ctx.provenance.dom0 = Dom0Info(
        vcpu_pin=knobs.vcpu_pin, affinity_before=[f"{a.vcpu}: {a.hard} / {a.soft}" for a in tuning.affinity_before],
        memory_before_mib=tuning.memory_before_mib, memory_mib=tuning.memory_mib)
    ctx.save_provenance()
    pin = f"vCPUs pinned to {knobs.vcpu_pin}" if knobs.vcpu_pin else "vCPUs as found"
    mem = f"memory {tuning.memory_before_mib} -> {tuning.memory_mib} MiB" if knobs.memory_mib else "memory as found"
    ctx.sink.log(f"dom0: {pin}; {mem} (restored after the run)")


def volume_info(v: VolumeExport | None, mount: str = "") -> VolumeInfo | None:
    if v is None:
        return None
    io = v.export.io() if isinstance(v.export, aoe.AoeExport | iscsi.IscsiExport | nfs.NfsExport) else {}
    device, initiator = v.attached
    s = SCHEMES[v.scheme]
    if device:
        baseline = f"{HOST_BASELINES[v.attach == 'host']} ({initiator}, {device})"
    else:  # a front-end's export (no path here) has its own
        baseline = s.front_end_baseline if s.front_end_baseline and not v.path else s.baseline
    return VolumeInfo(name=v.volume, scheme=v.scheme, attach=v.attach, server=v.server, uri=v.uri, tls=v.tls,
                      baseline=v.no_baseline or baseline,
                      target=v.export.target if isinstance(v.export, aoe.AoeExport | iscsi.IscsiExport |
                                                           nvmet.NvmetExport | nfs.NfsExport) else "",
                      server_bytes_read=io.get("read_bytes"), server_bytes_written=io.get("write_bytes"),
                      mount=mount, host_mount=v.host_mount, host_device=device, initiator=initiator,
                      server_device=v.server_device or "")


# How the host domain measures a volume its kernel initiator attached, by whether the guest was handed the same device
# (disk.attach = host); without one, the scheme's own wording (core.spec.schemes).
HOST_BASELINES = {True: ("the same device from the host domain, attached by this host's kernel initiator before the "
                         "guest was handed it (Study A's \"EBS from the host domain\" row)"),
                  False: ("the same volume attached by this host's kernel initiator for the baseline, then detached "
                          "before the guest attached it itself")}


def start_sampler(ctx: RunContext) -> None:
    """The host disk's metrics once a second, on the run's timeline, tagged with the test running then."""
    device = ctx.backing.host_device
    if not (device and ctx.spec.wants_storage):
        return

    def on_sample(s: Sample) -> None:
        ctx.sink.sample(SampleEvent.from_payload({**s.as_dict(), "test": ctx.current_test}))

    with ctx.control.atomic():
        ctx.sampler = ctx.stack.enter_context(Sampler(device, on_sample))
    server = ctx.volume.server_device if ctx.volume is not None else None
    if server and server != device:  # a volume this host attached: the server's disk under it, on the same timeline
        with ctx.control.atomic():
            ctx.stack.enter_context(Sampler(server, on_sample))
        ctx.sink.log(f"sampling {device} (the attached volume) and {server} (the disk under the volume's file)")


def storage_baseline(ctx: RunContext) -> None:
    """The storage tests on bare metal, against the same device the guest's disk is on (a network volume: the same
    export from the host domain)."""
    if not ctx.spec.wants_storage:
        return
    if ctx.volume is not None and ctx.volume.no_baseline:
        ctx.sink.step(f"bare metal: {ctx.volume.no_baseline}", side="baseline")
        return
    tests = catalogue.resolve_tests(ctx.spec.storage_tests)
    v = ctx.volume
    if v is not None and v.attachment is None and isinstance(v.export, iscsi.IscsiExport):
        iscsi_baseline(ctx, v, v.export, tests)
        return
    store, sink = ctx.backing, ctx.sink
    runner = runners.HostRunner(ctx.control.cancelled)
    mount_export_on_host(ctx)
    claim = claim_baseline_file(ctx, store)
    target = claim.tool_path if claim is not None else store.baseline_target
    sink.step("bare metal: storage tests", side="baseline")
    unmeasured = {t.id: fio.nbd_measures(t) for t in tests} if fio.is_nbd_uri(target) else {}
    measured = [t for t in tests if not unmeasured.get(t.id)]
    if runners.needs_fill(measured):
        sink.step("bare metal: laying down data for read tests", side="baseline")
        on_claimed(claim, ctx.size, runner.fill, target, ctx.size)
    for t, lay in zip(tests, iozone.iozone_fills(tests), strict=True):
        if unmeasured.get(t.id):
            sink.step(f"bare metal: {t.id}: not measured: {unmeasured[t.id]}", side="baseline", test=t.id)
            continue
        if lay:
            sink.step(f"bare metal: laying down IOzone's data for {t.id}", side="baseline")
            on_claimed(claim, ctx.size, runner.fill_iozone, t, target, ctx.size)
        storage_test(ctx, "baseline", t, functools.partial(on_claimed, claim, ctx.size, runner.run, t, target,
                                                           ctx.size, ctx.runtime, sink.progress("baseline", t.id)))
    if claim is not None:
        claim.release()
    unmount_export_on_host(ctx)


def claim_baseline_file(ctx: RunContext, store: backing.BackingStore) -> claims.ClaimedFile | None:
    """The bare-metal tests' file made by this process (core.disks.claims), released with the run: None for a device or
    a volume over NBD, which the tools open themselves."""
    target = store.baseline_target
    if store.is_block or fio.is_nbd_uri(target):
        return None
    shared = ctx.volume is not None and isinstance(ctx.volume.export, nfs.NfsExport)
    with ctx.control.atomic():
        claim = claims.ClaimedFile.create(target, where="on the run's NFS export" if shared else "")
        ctx.stack.callback(claim.release)
    return claim


def on_claimed(claim: claims.ClaimedFile | None, size: int, tool: Callable[..., T], *args: Any) -> T:
    """`tool(*args)` on the claimed file: allocated to `size` and checked before, checked again after."""
    if claim is not None:
        claim.ready(size)
    out = tool(*args)
    if claim is not None:
        claim.check()
    return out


def iscsi_baseline(ctx: RunContext, v: VolumeExport, exp: iscsi.IscsiExport,
                   tests: list[catalogue.StorageTest]) -> None:
    """The iSCSI target from the host domain, through libiscsi (QEMU's initiator library) either way: the direct reads
    by libiscsi's iscsi-perf, straight to the target, after data was laid over the whole volume (it reads across the
    whole LUN); every other fio and dd test through QEMU's libiscsi in qemu-nbd by fio's nbd engine (its extra hop
    costs reads a fifth to a third here, so the reads iscsi-perf can do stay its). IOzone and Bonnie++: not
    measured."""
    sink, cancelled = ctx.sink, ctx.control.cancelled
    vol_bytes = backing.byte_size(v.path)
    direct = [t for t in tests if iscsiperf.perf_measures(t)] if not iscsi_unmeasured(vol_bytes, ctx.size) else []
    relay_why = iscsi.relay_problem()
    relayed = [t for t in tests if t not in direct and not fio.nbd_measures(t)] if not relay_why else []
    runner, creds = runners.HostRunner(cancelled), iscsi.chap()
    relay = None
    if relayed:
        sink.step("bare metal: logging in to the volume's target with QEMU's libiscsi initiator (qemu-nbd, CHAP)",
                  side="baseline")
        with ctx.control.atomic():
            relay = iscsi.host_relay(exp, creds, ctx.work_dir / "iscsi-host")
            ctx.stack.callback(relay.stop)
    if direct:
        sink.step(f"bare metal: laying down data over the whole volume ({backing.human_size(vol_bytes)}) for "
                  "iscsi-perf's reads", side="baseline")
        runner.fill(v.path, vol_bytes)
    elif relay is not None and runners.needs_fill(relayed):
        sink.step("bare metal: laying down data for read tests", side="baseline")
        runner.fill(relay.uri, ctx.size)
    for t in tests:
        if t in direct:
            storage_test(ctx, "baseline", t, functools.partial(iscsiperf.perf, t, exp, creds, ctx.runtime, cancelled),
                         labels=[ISCSI_READER_LABELS["direct"]])
        elif relay is not None and t in relayed:
            storage_test(ctx, "baseline", t, functools.partial(runner.run, t, relay.uri, ctx.size, ctx.runtime,
                                                               sink.progress("baseline", t.id)),
                         labels=[ISCSI_READER_LABELS["relay"]])
        else:
            why = fio.nbd_measures(t) or f"{relay_why}, the host domain's way to the target for this test"
            sink.step(f"bare metal: {t.id}: not measured: {why}", side="baseline", test=t.id)
    if relay is not None:
        relay.stop()


def iscsi_unmeasured(vol_bytes: int, size: int) -> str:
    """Why iscsi-perf reads nothing from the host domain ('' when it reads): its reads then go through the relay."""
    if not shutil.which("iscsi-perf"):
        return "this host has no iscsi-perf (Debian package libiscsi-bin)"
    if vol_bytes > iscsiperf.PERF_MAX_FILL * size:
        return (f"iscsi-perf reads across the whole LUN, and laying data over this volume "
                f"({backing.human_size(vol_bytes)}) is more than {iscsiperf.PERF_MAX_FILL} times the test size")
    return ""


def nfs_server(spec: RunSpec) -> tuple[str, int] | None:
    """Where the front-end serves this back-end run's NFS export (host, port), else None."""
    return (spec.nfs_host, spec.nfs_port) if spec.nfs_host else None


def _host_mount(ctx: RunContext) -> Path | None:
    v = ctx.volume
    if v is None or not isinstance(v.export, nfs.NfsExport) or v.path:  # v.path: this host serves it
        return None
    return ctx.work_dir / NFS_HOST_MOUNT


def mount_export_on_host(ctx: RunContext) -> None:
    """A back-end's baseline on the front-end's NFS export: this host's kernel client mounts it with the guest's
    options (the mount's line recorded), its files go in there. Nothing for any other run."""
    where = _host_mount(ctx)
    if where is None:
        return
    assert ctx.volume is not None and isinstance(ctx.volume.export, nfs.NfsExport)
    exp = ctx.volume.export
    options = nfs.mount_options(exp, ctx.profile.nfs)
    ctx.sink.step(f"bare metal: mounting {exp.uri} on this host ({options})", side="baseline")
    with ctx.control.atomic():
        ctx.stack.callback(nfs.unmount_on_host, where)
        line = nfs.mount_on_host(exp, options, where)
    ctx.sink.log(f"host mount: {line}")
    ctx.volume.host_mount = line
    ctx.provenance.volume = volume_info(ctx.volume)
    ctx.save_provenance()


def unmount_export_on_host(ctx: RunContext) -> None:
    if (where := _host_mount(ctx)) is not None:
        nfs.unmount_on_host(where)


def serve_volume(ctx: RunContext) -> None:
    """disk.attach = guest: the volume served on the bridge the guest's NIC joins (plumb made it)."""
    v = ctx.volume
    if v is None or not guest_attaches(ctx):
        return
    if nfs_server(ctx.spec) or v.served_by_front_end:
        if v.attachment is not None:
            ctx.sink.step(f"volume: ending this host's attachment of {v.volume} ({v.attachment.device}): the guest "
                          "attaches it itself")
            with ctx.control.atomic():
                v.end_baseline_attachment()
        ctx.sink.log(f"volume: {v.volume} is served by the front-end: {v.uri}")
        return
    assert ctx.hostnet is not None
    how = SCHEMES[v.scheme].served_to_guest.format(ip=ctx.hostnet.host_ip)
    ctx.sink.step(f"volume: serving {v.volume} {how} on {ctx.hostnet.bridge}")
    # an NFS export admits the run's guests by address (each has a fixed one on the bridge), nobody else on it; the
    # block schemes' servers take no client list
    guests = ", ".join(addresses.guest_ip(k) for k in range(1, ctx.spec.guests + 1))
    with ctx.control.atomic():
        v.serve(ctx.hostnet.bridge, ctx.hostnet.host_ip, clients=guests)
    pid = v.export.pid if v.export is not None else None
    ctx.sink.log(f"volume exported: {v.uri} ({v.server}" + (f", pid {pid})" if pid else ")"))
    ctx.provenance.volume = volume_info(v)
    if ctx.provenance.backing is not None:
        ctx.provenance.backing.path = ctx.backing.path
    ctx.save_provenance()


def launch_guest(ctx: RunContext) -> None:
    """The guest under the profile, on the backing store and the bridge; boot retried under emulation."""
    acc, image = ctx.accelerator, ctx.image
    name = f"cloudbox-{ctx.profile.name}-{ctx.run_uuid[:8]}"
    # virtlogd (root) writes it; it goes with the work directory when the store is removed. libxl logs no console.
    ctx.console_log = ctx.work_dir / "console.log"
    socket = agent_socket(ctx, paths.run_dir() / f"{name}.agent") if ctx.dom0 else None
    v = ctx.volume
    # an AoE target answers its guest's MAC only: the one its server allowed (from the run's shelf)
    mac = aoe.guest_mac(v.export.shelf) if v is not None and isinstance(v.export, aoe.AoeExport) and \
        guest_attaches(ctx) else None
    plan = DomainPlan(ctx.profile, name=name, domain_type=acc.domain_type, mac=mac,
                      kernel=str(image.boot_kernel(acc.domain_type)),
                      initrd=str(image.boot_initrd(acc.domain_type, ctx.profile.guest.memory_mib)),
                      cmdline=CMDLINE,
                      disk_path="" if guest_attaches(ctx) else (ctx.backing.pci or ctx.backing.vhost_user
                                                                 or ctx.backing.path),
                      disk_is_block=ctx.backing.is_block,
                      bridge=ctx.hostnet.bridge if ctx.hostnet else None,
                      run_uuid=ctx.run_uuid,
                      console_log=None if ctx.dom0 else str(ctx.console_log),
                      more_disk_paths=ctx.backing.more_paths,
                      network_source=ctx.backing.network,
                      agent_socket=str(socket) if socket else None,
                      placement=ctx.placement(1))
    ctx.domain_xml = render_domain(plan)
    ctx.sink.step(f"launching guest {name} ({acc.label})")
    up = launch(ctx)
    ctx.sink.log(f"guest agent ready after {up.waited_s:.1f} s"
                 + (f" (boot attempt {up.attempts})" if up.attempts > 1 else ""))
    prov = ctx.provenance
    prov.guest_kernel = up.guest.sh("uname -r", timeout=30).stdout.strip()
    prov.domain_xml = up.guest.xml()
    prov.launch_to_agent_s = round(up.boot_s, 2)
    prov.boot_attempts = up.attempts
    ctx.boot_s = up.boot_s
    ctx.save_provenance()
    record_placement(ctx, up.guest)
    ctx.sink.emit(ProgressEvent("guest", BOOT, 100))


def guest_storage(ctx: RunContext) -> None:
    """The same storage tests inside the guest, against its benchmark disk. A guest whose disk stops completing
    requests (errors.DiskStalled) is destroyed and launched again, once, and the tests go on from the one it
    stopped in, that test's measurement noting why; a second stall fails the run."""
    if not ctx.spec.wants_storage:
        return
    assert ctx.guest is not None
    tests = catalogue.resolve_tests(ctx.spec.storage_tests)
    done: list[str] = []
    try:
        _guest_storage(ctx, tests, done)
    except DiskStalled as e:
        if ctx.control.cancelled():
            raise
        stalled = next(t for t in tests if t.id not in done)
        ctx.provenance.add_disk_stall(DiskStall(test=stalled.id, disks=e.disks, seen=e.seen))
        ctx.save_provenance()
        relaunch_guest(ctx, f"{e}; under {ctx.accelerator.label}", "console-stall1.log")
        _guest_storage(ctx, [t for t in tests if t.id not in done], done,
                       notes={stalled.id: f"measured in a second guest: in the first, {e}"})


def relaunch_guest(ctx: RunContext, why: str, old_console: str) -> None:
    """Destroy the run's guest and launch it again from the same domain XML (its disk and NIC as they were); the
    first guest's console is kept beside the new one's as `old_console`."""
    old = ctx.guest
    assert old is not None
    ctx.sink.step(f"guest {old.name}: {why}: destroying it and launching it again")
    with ctx.control.atomic():
        old.destroy()
        ctx.guest = None
    if old.console_log is not None:
        with contextlib.suppress(OSError):
            old.console_log.replace(old.console_log.with_name(old_console))
    if ctx.dom0:  # libxl's QEMU leaves the agent's socket behind, and binds it again
        remove_socket(paths.run_dir() / f"{old.name}.agent")
    up = launch(ctx)
    ctx.sink.log(f"guest agent ready again after {up.waited_s:.1f} s")


def _guest_storage(ctx: RunContext, tests: list[catalogue.StorageTest], done: list[str],
                   notes: dict[str, str] | None = None) -> None:
    """`tests` in the run's guest (each one's id appended to `done` once stored), on its disk, its RAID 0 array,
    or the network volume it attaches itself."""
    assert ctx.guest is not None
    sink = ctx.sink
    gr = runners.GuestRunner(ctx.guest, ctx.control.cancelled)
    gr.check_tools(tests)
    d = ctx.profile.disk
    run = functools.partial(_guest_tests, ctx, gr, tests, done=done, notes=notes or {})
    if d.backing == VIRTIOFS:
        sink.step(f"guest: mounting the virtiofs share {virtiofs.TAG} ({ctx.backing.path})", side="guest")
        sink.log(f"guest mount: {virtiofs.mount_in_guest(ctx.guest)}")
        run(virtiofs.test_file())
        virtiofs.unmount_in_guest(ctx.guest)
        return
    if guest_attaches(ctx):
        v = ctx.volume
        assert v is not None and v.export is not None
        if isinstance(v.export, nfs.NfsExport):
            _guest_nfs(ctx, v, v.export, run)
            return
        if isinstance(v.export, aoe.AoeExport):
            sink.step(f"guest: attaching {v.export.target} with its aoe driver", side="guest")
            dev = aoe.attach_in_guest(ctx.guest, v.export.target)
        elif isinstance(v.export, nvmet.NvmetExport):
            assert ctx.hostnet is not None and v.nvme_host is not None
            # the host NQN is the guest's only credential (no key in its kernel): never in the run's log
            sink.step(f"guest: connecting to {v.uri} with its nvme_tcp driver (its host NQN, not shown)",
                      side="guest")
            network.configure_guest(ctx.guest, ctx.profile.network.mtu, host_ip=ctx.hostnet.host_ip,
                                    dhcp=bool(ctx.private_bridge))
            dev = nvmet.attach_in_guest(ctx.guest, v.export, v.nvme_host.nqn, v.nvme_host.hostid)
        elif isinstance(v.export, iscsi.IscsiExport):
            assert ctx.hostnet is not None
            sink.step(f"guest: logging in to {v.uri} with iscsistart (CHAP) and its iscsi_tcp driver", side="guest")
            network.configure_guest(ctx.guest, ctx.profile.network.mtu, host_ip=ctx.hostnet.host_ip,
                                    dhcp=bool(ctx.private_bridge))
            dev = iscsi.attach_in_guest(ctx.guest, v.export, v.chap or iscsi.chap())
        else:
            client_dir = v.client_dir or (v.creds.client_dir if v.creds is not None else None)
            assert client_dir is not None and ctx.hostnet is not None and isinstance(v.export, nbd.NbdExport)
            sink.step(f"guest: attaching {v.uri} with nbd-client (TLS, the client's certificate handed over by "
                      "the agent)", side="guest")
            network.configure_guest(ctx.guest, ctx.profile.network.mtu, host_ip=ctx.hostnet.host_ip,
                                    dhcp=bool(ctx.private_bridge))
            dev = nbd.attach_in_guest(ctx.guest, v.export, client_dir)
        run(dev)
        ctx.provenance.volume = pv = volume_info(v)
        ctx.save_provenance()
        assert pv is not None
        if pv.server_bytes_read is not None:  # a server of this host's (the front-end's says so after the run)
            sink.log(f"{v.export.server} read {pv.server_bytes_read} and wrote {pv.server_bytes_written} bytes of the "
                     "volume")
        return
    if d.raid == "none" or d.raid_on == "host":  # the host's md array is the guest's one disk
        run(gr.disk())
        if ctx.host_raid is not None and ctx.provenance.raid is not None:
            ctx.provenance.raid.sectors_written = ctx.host_raid.sectors_written()
            ctx.save_provenance()
            sink.log("host md array: sectors written per member since it was built (baseline and guest): "
                     + ", ".join(f"{k} {v}" for k, v in ctx.provenance.raid.sectors_written.items()))
        if ctx.volume is not None:
            ctx.provenance.volume = pv = volume_info(ctx.volume)
            ctx.save_provenance()
            assert pv is not None
            if pv.server_bytes_read is not None:
                sink.log(f"{ctx.volume.export.server if ctx.volume.export else '?'} read {pv.server_bytes_read} and "
                         f"wrote {pv.server_bytes_written} bytes of the volume")
        return
    sink.step(f"guest: RAID {d.raid} over {d.count} disks ({d.chunk_kib} KiB chunks)", side="guest")
    array = gr.assemble_raid(d.count, d.chunk_kib)
    raid = RaidInfo(device=array.device, level=array.level, chunk_kib=array.chunk_kib, members=array.members,
                    mdstat=array.mdstat)
    ctx.provenance.raid = raid
    ctx.save_provenance()
    sink.log(f"guest md array: {array.device}, RAID {array.level} over {', '.join(array.members)}")
    # A failure leaves the array to the guest's destruction: built without superblocks, nothing outlives it.
    run(array.device)
    raid.sectors_written = gr.sectors_written(array.members)
    gr.stop_raid()
    ctx.save_provenance()
    sink.log("guest md array stopped; sectors written per member: "
             + ", ".join(f"{k} {v}" for k, v in raid.sectors_written.items()))


def _guest_nfs(ctx: RunContext, v: VolumeExport, exp: nfs.NfsExport, run: Callable[[str], None]) -> None:
    """The guest mounts the export with the profile's [nfs] options and runs the tests on a file in it; the mount's
    options as its kernel settled them are recorded, and what the server wrote."""
    assert ctx.guest is not None and ctx.hostnet is not None
    sink = ctx.sink
    options = nfs.mount_options(exp, ctx.profile.nfs)
    configure_nic(ctx, ctx.guest)
    sink.step(f"guest: mounting {exp.uri} ({options})", side="guest")
    line = nfs.mount_in_guest(ctx.guest, exp, options)
    ctx.provenance.volume = volume_info(v, mount=line)
    ctx.save_provenance()
    sink.log(f"guest mount: {line}")
    run(nfs.test_file())
    nfs.unmount_in_guest(ctx.guest)
    ctx.provenance.volume = pv = volume_info(v, mount=line)
    assert pv is not None
    ctx.save_provenance()
    if exp.child is not None:  # a front-end's server: it says what it wrote once the run has ended
        sink.log(f"{exp.server} read {pv.server_bytes_read} and wrote {pv.server_bytes_written} bytes of the "
                 "export's disk")


def guest_attaches(ctx: RunContext) -> bool:
    """The guest attaches the run's network volume itself (disk.attach = guest): it has no benchmark disk."""
    d = ctx.profile.disk
    return d.backing == "network-volume" and d.attach == "guest"


def _guest_tests(ctx: RunContext, gr: runners.GuestRunner, tests: list[catalogue.StorageTest], disk: str, *,
                 done: list[str], notes: dict[str, str]) -> None:
    sink = ctx.sink
    via = ("its own initiator over its NIC" if guest_attaches(ctx) else "a virtiofs share"
           if ctx.profile.disk.backing == VIRTIOFS else f"bus {ctx.profile.disk.bus}")
    sink.log(f"guest benchmark disk: {disk} ({via})")
    sink.step("guest: storage tests", side="guest")
    if runners.needs_fill(tests):
        sink.step("guest: laying down data for read tests", side="guest")
        gr.fill(disk, ctx.size)
    for t, lay in zip(tests, iozone.iozone_fills(tests), strict=True):
        if lay:
            sink.step(f"guest: laying down IOzone's data for {t.id}", side="guest")
            gr.fill_iozone(t, disk, ctx.size, timeout=runners.guest_timeout(t, ctx.size))
        storage_test(ctx, "guest", t, functools.partial(gr.run, t, disk, ctx.size, ctx.runtime,
                                                        sink.progress("guest", t.id),
                                                        timeout=runners.guest_timeout(t, ctx.size)), gr.drop_caches,
                     note=notes.get(t.id, ""))
        done.append(t.id)


def _version(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
        return (out.stdout or out.stderr).strip().splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return "not installed"


def _iozone_version() -> str:
    try:
        out = subprocess.run(["iozone", "-v"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "not installed"
    return iozone.iozone_version(out) or "unknown"


def _libvirt_version(n: int) -> str:
    return f"{n // 1000000}.{n // 1000 % 1000}.{n % 1000}"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


CPU_SYSFS = Path("/sys/devices/system/cpu")


def cpu_counts(root: Path = CPU_SYSFS) -> tuple[int | None, int | None]:
    """(logical CPUs online, physical cores among them) from sysfs, a core being a distinct (package, die, core id);
    the cores are None when sysfs cannot tell."""
    cores: set[tuple[str, ...]] = set()
    logical = 0
    try:
        for cpu in root.glob("cpu[0-9]*"):
            topo = cpu / "topology"
            online = cpu / "online"
            if not topo.is_dir() or (online.exists() and online.read_text().strip() != "1"):
                continue
            logical += 1
            cores.add(tuple((topo / f).read_text().strip() if (topo / f).exists() else ""
                            for f in ("physical_package_id", "die_id", "core_id")))
    except OSError:
        return os.cpu_count(), None
    return (logical or os.cpu_count()), (len(cores) or None)
