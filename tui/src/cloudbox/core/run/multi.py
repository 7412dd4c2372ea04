"""A run of N guests of one profile on this host at once (--guests N): each guest on a backing store of its own and
with a NIC of its own on the run's bridge, all launched side by side, and every storage and network test started in
all of them at one instant.

The barrier: the host reads each guest's /proc/uptime through the agent's file calls (one round trip each, the
quickest of five kept) to know the guest's clock against its own, picks a start two seconds ahead, and hands every
guest that instant on its own clock; each guest's shell waits for it (10 ms steps) and notes when it left. Those
notes, on the host's clock, are the start skew stored per test (uncertain by half the measuring round trip). The
bare-metal baseline runs the same N at once: N fio (or dd) processes on the host, one file or loop device each; N
netperf or iperf3 clients in the baseline namespace, each against its own server (iperf3 serves one client at a time;
netserver forks one child per client). Each guest's figures are stored as instances 1..N beside the run's row,
their sum (core.record.fairness for the spread). An NFS export (disk.volume = nfs:<name>) is the one store every guest
shares: each mounts it and runs its tests on a file of its own there, the baseline's N processes on N files in the
export's directory.
"""

from __future__ import annotations

import functools
import ipaddress
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from .. import ledger, paths
from ..bench import fio, iozone, mpiio, nettests
from ..bench.result import FioResult
from ..bench.runners import GuestRunner, HostRunner, drop_host_caches, guest_timeout, needs_fill
from ..disks import backing, claims
from ..disks.diskstats import Sample, Sampler
from ..disks.hostraid import problem as raid_problem
from ..disks.volumes import nfs
from ..disks.volumes.attach import export_for_run
from ..errors import CloudboxError, DiskStalled, GuestError, GuestUnreachable, NicStalled, UsageError
from ..record.events import ProgressEvent, SampleEvent, counted
from ..record.provenance import Guests, GuestStart, RaidInfo
from ..spec import addresses, catalogue
from ..spec.knobs import is_nfs
from ..spec.profiles import MIX, Profile, mix_problem, resolve_mix
from ..spec.runspec import (
    BOOT,
    CPU_OVERCOMMIT_RANGE,
    LOCAL_PLACE,
    OVERCOMMIT_LABEL,
    RunSpec,
    guest_profile_index,
    resolve_net_tests,
    split_guests,
)
from ..virt import network
from ..virt.domain import DomainPlan, render_domain
from ..virt.guestimage import CMDLINE
from . import hold
from .context import RunContext, host_labels
from .launch import launch_all
from .local import (
    check_volume,
    claim_baseline_file,
    connect_libvirt,
    cpu_counts,
    find_image,
    mount_export_on_host,
    nfs_server,
    on_claimed,
    probe_accelerator,
    record_facts,
    serve_vhost_user,
    serve_volume,
    unmount_export_on_host,
    volume_info,
)
from .measure import NetRan, Ran, net_test_many, storage_job, storage_test_many
from .network_steps import configure_nic, plumb
from .placing import place_guests, record_placement

QEMU_OVERHEAD_MIB = 256  # each guest's QEMU beside its RAM (TCG's translation cache, device emulation)
HOST_RESERVE_MIB = 512  # left to the host itself: libvirt, the bare-metal fio processes, cloudbox
BARRIER_LEAD_S = 2.0  # from picking the start instant to it: every guest's agent must have started its shell
HOST_LEAD_S = 0.3  # the same for the bare-metal clients: every thread must be waiting for the instant
MEMINFO = Path("/proc/meminfo")


def mem_available_mib(meminfo: Path = MEMINFO) -> int | None:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_fits(spec: RunSpec, profile: Profile, *, mix: list[Profile] | None = None,
               available_mib: int | None = None, host_cpus: int | None = None) -> None:
    """Refuse N guests the profile cannot run or this host cannot hold, with the arithmetic, before anything starts:
    every guest's RAM and its QEMU's overhead within the host's available memory less a reserve; a host CPU for
    every guest vCPU (else the guests' figures would measure the CPU scheduler). A host RAID (any count) needs
    this host's md and mdadm (a node checks its own). `mix`: the run's profiles (run_profiles), the guests' in turn."""
    n, d = spec.guests, profile.disk
    if d.raid_on == "host" and not spec.node and (why := raid_problem()):
        raise UsageError(f"profile {profile.name}: disk.raid_on = host: {why}; allowed on this host: disk.raid_on = "
                         "guest (the guest's own md array over its disks, e.g. profile virtio-raid0)")
    if n <= 1:
        return
    if d.backing == "network-volume" and not is_nfs(d):
        raise UsageError(f"profile {profile.name}: disk.backing = network-volume exports one volume for one guest; "
                         f"--guests {n} needs a store per guest: a profile with a file or block-device backing, or "
                         "an NFS export (disk.volume = nfs:<name>), which every guest mounts")
    if d.backing == "virtiofs":
        raise UsageError(f"profile {profile.name}: disk.backing = virtiofs shares one directory with one guest for "
                         f"now; --guests {n} needs a store per guest or an NFS export every guest mounts (disk.volume "
                         "= nfs:<name>)")
    if d.raid_on == "host":
        raise UsageError(f"profile {profile.name}: disk.raid_on = host builds one md array on the host for one "
                         f"guest; --guests {n} needs a disk each: allowed: a profile with disk.raid_on = guest (each "
                         "guest stripes its own disks)")
    if profile.guest.hypervisor != "kvm":
        raise UsageError(f"profile {profile.name}: guest.hypervisor = {profile.guest.hypervisor}: --guests {n} runs "
                         "KVM/QEMU guests only for now; allowed: a profile with guest.hypervisor = kvm")
    shared = [t.id for t in catalogue.resolve_tests(spec.storage_tests) if t.tool == catalogue.MPI_TOOL
              and mpiio.shared(t)] if spec.wants_storage else []
    if shared and not is_nfs(d):
        raise UsageError(f"profile {profile.name}: storage test(s) {', '.join(shared)} write one file every guest "
                         "sees, which a disk of each guest's own is not; allowed: a profile whose disk is an NFS "
                         "export (disk.volume = nfs:<name>), or mpiio-fpp-1m (a file per process)")
    if spec.spread:
        if is_nfs(d) and spec.wants_network:
            raise UsageError(f"profile {profile.name}: a run spread over places (--node {spec.node}) on one NFS "
                             f"export runs the storage tests; --suite {spec.suite} would also send each back-end's "
                             "guests' network tests over the export's private link; allowed: --suite storage")
        if LOCAL_PLACE not in spec.places:
            return
        shares, here = split_guests(n, len(spec.places)), spec.places.index(LOCAL_PLACE)
        n, first = shares[here], sum(shares[:here]) + 1  # this host's share, and its first guest's number
        what, allowed = f"--guests {spec.guests} --node {spec.node} puts {n} on this host", "at most {} here"
    elif spec.node:  # the node checks its own memory and CPUs when its run starts
        return
    else:
        what, allowed, first = f"--guests {n}", "--guests 1 to {}", 1
    per_guest = ([mix[guest_profile_index(k, len(mix))] for k in range(first, first + n)] if mix
                 else [profile] * n)
    named = f"profile {MIX.join(p.name for p in mix or [profile])}"
    mems = [p.guest.memory_mib for p in per_guest]
    avail = mem_available_mib() if available_mib is None else available_mib
    if avail is not None:
        need = sum(mems) + n * QEMU_OVERHEAD_MIB + HOST_RESERVE_MIB
        if need > avail:
            terms = (f"{n} x ({mems[0]} MiB guest.memory_mib + {QEMU_OVERHEAD_MIB} MiB QEMU)" if len(set(mems)) == 1
                     else f"({' + '.join(map(str, mems))} MiB guest.memory_mib + {n} x {QEMU_OVERHEAD_MIB} MiB QEMU)")
            most = _most(avail - HOST_RESERVE_MIB, [m + QEMU_OVERHEAD_MIB for m in mems])
            raise UsageError(f"{what}: {terms} + {HOST_RESERVE_MIB} MiB for the host = {need} MiB, but this host has "
                             f"{avail} MiB available; allowed: {allowed.format(most)} with {named}")
    cpus = cpu_counts()[0] if host_cpus is None else host_cpus
    vcpus = [p.guest.vcpus for p in per_guest]
    ratio = spec.cpu_overcommit
    if cpus is not None and sum(vcpus) > cpus * ratio:
        terms = (f"{n} x {vcpus[0]} guest.vcpus" if len(set(vcpus)) == 1 else
                 f"{' + '.join(map(str, vcpus))} guest.vcpus")
        budget, need = int(cpus * ratio), -(-sum(vcpus) // cpus)  # the ratio these guests would need
        times = f" x --cpu-overcommit {ratio:g} = {budget} vCPUs" if ratio != 1 else ""
        why = " (each vCPU gets a host CPU, else the figures measure the scheduler)" if ratio == 1 else ""
        more = (f", or --cpu-overcommit {need} to share the host's CPUs (the figures then carry the "
                f"{OVERCOMMIT_LABEL} caveat)" if need <= CPU_OVERCOMMIT_RANGE[1] else "")
        raise UsageError(f"{what}: {terms} = {sum(vcpus)} vCPUs, but this host has {counted(cpus, 'CPU')}{times}; "
                         "allowed: "
                         f"{allowed.format(max(1, _most(budget, vcpus)))} with {named}{why}{more}")


def _most(budget: int, costs: list[int]) -> int:
    """How many of the guests, taken in order, fit in `budget` (costs repeat past the list's end)."""
    k = 0
    while budget >= costs[k % len(costs)]:
        budget -= costs[k % len(costs)]
        k += 1
    return k


def run_profiles(spec: RunSpec) -> list[Profile]:
    """The run's profiles, checked before anything starts: one, or a mixed run's (--profile a+b), which must differ
    in guest-side knobs only; and the guests they make must fit (check_fits)."""
    mix = resolve_mix(spec.profile)
    link_unused = not (spec.wants_network or spec.wants_links or is_nfs(mix[0].disk))
    if len(mix) > 1 and (why := mix_problem(mix, link_unused=link_unused)):
        raise UsageError(f"--profile {spec.profile}: {why}")
    check_fits(spec, mix[0], mix=mix)
    return mix


def run_many(ctx: RunContext) -> None:
    """The body of a run of N guests (core.run.lifecycle.Execution runs it)."""
    for step in (check_volume, find_image, probe_accelerator, connect_libvirt, place_guests, prepare_stores,
                 record_facts, record_guests, start_sampler, baseline_many, plumb, serve_volume, launch_many,
                 guests_storage, guests_network):
        step(ctx)


def prepare_stores(ctx: RunContext) -> None:
    """A backing store of the profile's kind for every guest, each in a directory of its own under the run's."""
    spec, disk, n = ctx.spec, ctx.profile.disk, ctx.spec.guests
    base = paths.work_base(spec.work_dir)
    ctx.work_dir = base / f"run-{ctx.run_uuid[:12]}"
    if is_nfs(disk):
        _prepare_export(ctx)
        return
    ctx.sink.step(f"preparing {n} backing stores ({disk.backing}, {backing.human_size(ctx.size)} each)")
    need, what = backing.space_needed(disk.backing, ctx.size, count=disk.count)
    _, free = backing.free_bytes_at(base)
    if n * need + backing.MARGIN > free:
        raise CloudboxError(f"{base}: not enough free space for {n} guests: {n} x {backing.human_size(need)} ({what}) "
                            f"+ {backing.human_size(backing.MARGIN)} margin, {backing.human_size(free)} free; use a "
                            "smaller --size, fewer --guests or another --work-dir")
    with ctx.control.atomic():
        made = ledger.hold(ledger.Directory(str(ctx.work_dir)))
        try:
            ctx.work_dir.mkdir(parents=True, exist_ok=False)
        except BaseException:
            made.done()  # not made here: never removed
            raise
        ctx.work_dir.chmod(0o755)  # QEMU runs as libvirt-qemu and must reach the stores
        ctx.stack.callback(made.release)
    for k in range(1, n + 1):
        with ctx.control.atomic():
            store = backing.prepare(disk.backing, work_dir=ctx.work_dir / f"g{k}", size_bytes=ctx.size,
                                    fmt=disk.format, volume=disk.volume, count=disk.count)
            ctx.stack.callback(store.remove)
        serve_vhost_user(ctx, store, ctx.work_dir / f"g{k}", k, ctx.guest_profile(k))
        ctx.backings.append(store)
    ctx.backing = ctx.backings[0]
    ctx.labels += ctx.backing.labels


def _prepare_export(ctx: RunContext) -> None:
    """The run's NFS export, one directory every guest mounts (served once the bridge exists: serve_volume); the
    baseline's N files in it, one per process."""
    disk, n = ctx.profile.disk, ctx.spec.guests
    ctx.sink.step(f"preparing the NFS export {disk.volume} for {n} guests ({backing.human_size(ctx.size)} each)")
    with ctx.control.atomic():
        ctx.volume = v = export_for_run(disk.volume, disk.attach, run_uuid=ctx.run_uuid, work_dir=ctx.work_dir,
                                        size_bytes=ctx.size, hypervisor=ctx.profile.guest.hypervisor, guests=n,
                                        nfs_server=nfs_server(ctx.spec))
        ctx.stack.callback(v.close)
    first = v.store
    base = Path(first.baseline_target).parent
    for k in range(ctx.spec.first_guest, ctx.spec.first_guest + n):  # removed with the export by v.close(); named
        ctx.backings.append(backing.BackingStore(                      # by the whole run's numbers (a spread run)
            first.kind, first.path, False, first.format, ctx.size, first.host_device, first.model,
            labels=list(first.labels), baseline_target=str(base / f"baseline-g{k}.dat"),
            baseline_labels=list(first.baseline_labels)))
    ctx.backing = ctx.backings[0]
    ctx.labels += ctx.backing.labels


def record_guests(ctx: RunContext) -> None:
    """The run's guests in the provenance; more guest vCPUs than host CPUs (--cpu-overcommit) labels every guest
    figure vcpu-overcommit."""
    vcpus = sum(ctx.guest_profile(k).guest.vcpus for k in range(1, ctx.spec.guests + 1))
    cpus = cpu_counts()[0]
    if cpus is not None and vcpus > cpus:
        ctx.labels.append(OVERCOMMIT_LABEL)
        ctx.sink.log(f"vCPUs overcommitted: {vcpus} guest vCPUs on {counted(cpus, 'host CPU')} (--cpu-overcommit "
                     f"{ctx.spec.cpu_overcommit:g}); the guests' figures carry the {OVERCOMMIT_LABEL} caveat")
    ctx.provenance.guests = Guests(
        count=ctx.spec.guests, baseline_processes=ctx.spec.guests, vcpus=vcpus, host_cpus=cpus,
        barrier="each guest waits on its own uptime clock for one instant the host picked; a start is when the "
                "guest's shell left the wait (10 ms steps), uncertain by half the agent round trip of clock_rtt_s",
        profiles={p.name: p.to_toml() for p in ctx.mix})
    ctx.save_provenance()


def start_sampler(ctx: RunContext) -> None:
    """The host disk every store is on (a loop device's file included), once a second."""
    if not ctx.spec.wants_storage:
        return
    device = backing.dev_name_for_path(ctx.work_dir)

    def on_sample(s: Sample) -> None:
        ctx.sink.sample(SampleEvent.from_payload({**s.as_dict(), "test": ctx.current_test}))

    if device is None:
        ctx.labels.append("no-host-metrics")
        return
    with ctx.control.atomic():
        ctx.sampler = ctx.stack.enter_context(Sampler(device, on_sample))


def baseline_many(ctx: RunContext) -> None:
    """The storage tests on bare metal, N processes at once, each on its own guest's store's baseline target (on
    a back-end's run with the front-end's NFS export: N files in this host's mount of it)."""
    if not ctx.spec.wants_storage:
        return
    tests = catalogue.resolve_tests(ctx.spec.storage_tests)
    if ctx.volume is not None and ctx.volume.no_baseline:
        ctx.sink.step(f"bare metal: {ctx.volume.no_baseline}", side="baseline")
        for t in tests if ctx.spec.hold else ():  # a spread run's other places still wait for every place here
            hold.wait(ctx, t.id, 0, side="baseline")
        return
    sink = ctx.sink
    mount_export_on_host(ctx)
    # each process's file made by this process (core.disks.claims): a shared export's names can be replaced by its
    # clients
    files = [claim_baseline_file(ctx, store) for store in ctx.backings]
    targets = [c.tool_path if c is not None else s.baseline_target for c, s in zip(files, ctx.backings, strict=True)]
    sink.step(f"bare metal: storage tests, {counted(ctx.spec.guests, 'process', 'processes')} at once", side="baseline")
    if needs_fill(tests):
        sink.step("bare metal: laying down data for read tests", side="baseline")
        for claim, target in zip(files, targets, strict=True):
            on_claimed(claim, ctx.size, HostRunner(ctx.control.cancelled).fill, target, ctx.size)
    for t, lay in zip(tests, iozone.iozone_fills(tests), strict=True):
        if t.tool == catalogue.MPI_TOOL:
            _host_mpi(ctx, t, targets)
            continue
        if lay:
            sink.step(f"bare metal: laying down IOzone's data for {t.id}", side="baseline")
            for claim, target in zip(files, targets, strict=True):
                on_claimed(claim, ctx.size, HostRunner(ctx.control.cancelled).fill_iozone, t, target,
                           ctx.size)
        # a spread run's places start bare metal at one instant too (a shared export sees them all at once)
        at = hold.wait(ctx, t.id, len(ctx.backings), side="baseline") if ctx.spec.hold else None
        for claim in files:
            if claim is not None:
                claim.ready(ctx.size)
        jobs = [functools.partial(_host_part, ctx, t, target, k, at) for k, target in enumerate(targets, 1)]
        storage_test_many(ctx, "baseline", t, jobs)
        for claim in files:
            if claim is not None:
                claim.check()
    for claim in files:
        if claim is not None:
            claim.release()
    unmount_export_on_host(ctx)


def _host_mpi(ctx: RunContext, t: catalogue.StorageTest, targets: list[str]) -> None:
    """`t` on bare metal: one mpirun of N ranks from the image's MPI layer, unpacked into the run's directory once;
    on a shared export N ranks on one file (or a file each) in its directory, else each rank on its own store's
    baseline target."""
    root = ctx.work_dir / "mpi-root"
    if not root.exists():
        with ctx.control.atomic():
            ctx.stack.callback(shutil.rmtree, root, ignore_errors=True)
            mpiio.host_layer(ctx.image.mpi_layer(), ctx.work_dir)
    n = ctx.spec.guests
    shared: claims.ClaimedDir | None = None
    if ctx.volume is not None:
        # the job's file (or a file per rank) in a directory this process made on the export, reached through it
        with ctx.control.atomic():
            shared = claims.ClaimedDir.create(str(Path(ctx.backings[0].baseline_target).parent
                                                  / f"cloudbox-mpiio-{ctx.run_uuid[:12]}"),
                                              where="on the run's NFS export")
            ctx.stack.callback(shared.release)
        path = f"{shared.tool_path}/cloudbox-mpiio-baseline.dat"
        parts = {ph: [mpiio.argv(t, path, ctx.size, n, ph)] * n for ph in ("write", "read")}
    else:
        parts = {ph: [mpiio.argv(t, target, ctx.size, n, ph, local=True) for target in targets]
                 for ph in ("write", "read")}

    def run() -> tuple[FioResult, list[FioResult]]:
        try:
            out = mpiio.run_on_host(root, parts["write"], ctx.control.cancelled, ctx.work_dir)
            drop_host_caches()
            out += mpiio.run_on_host(root, parts["read"], ctx.control.cancelled, ctx.work_dir)
        finally:
            if shared is not None:
                shared.release()
        res = mpiio.parse(t.id, out)
        return res.total, res.ranks

    storage_job(ctx, "baseline", t, run)


def _guests_mpi(ctx: RunContext, t: catalogue.StorageTest, runners: list[GuestRunner], disks: list[str],
                interface: str) -> None:
    """`t` as MPI jobs across the guests, mpirun in the first: a write job, every cache dropped, a read job. On the
    shared export one file (or a file each) there; else each rank on its own guest's disk. The ranks must have run
    one in each guest, in order."""
    g1, n = runners[0].guest, len(runners)
    hosts = [mpiio.host_name(k) for k in range(1, n + 1)]
    local = ctx.volume is None
    if local and len(set(disks)) != 1:
        raise CloudboxError(f"{t.id}: the guests' benchmark disks have different names ({', '.join(disks)}); one "
                            "mpirun command line names one path for every rank")
    path = disks[0] if local else f"{nfs.MOUNT_POINT}/cloudbox-mpiio.dat"
    drops = tuple(gr.drop_caches for gr in runners)

    def job(phase: str) -> str:
        argv = mpiio.mpirun_argv(hosts, mpiio.argv(t, path, ctx.size, n, phase, local=local), interface)
        r = g1.run(argv, timeout=guest_timeout(t, ctx.size), poll=ctx.control.check)
        if r.exitcode != 0:
            raise GuestError(f"mpirun ({t.id}, {phase}) in {g1.name} exited {r.exitcode}: "
                             f"{(r.stdout + r.stderr).strip()[-600:]}")
        return r.stdout

    def run() -> tuple[FioResult, list[FioResult]]:
        out = job("write")
        drop_host_caches()
        for drop in drops:
            drop()
        out += job("read")
        if not local:
            g1.sh(f"rm -f {path} {path}.*", timeout=60)
        res = mpiio.parse(t.id, out)
        if res.hosts != hosts:
            raise GuestError(f"{t.id}: the MPI job's ranks ran on {', '.join(res.hosts)}; expected one in each guest: "
                             f"{', '.join(hosts)}")
        ctx.sink.log(f"{t.id}: {res.library.split(',')[0]}, ranks on {', '.join(res.hosts)}")
        return res.total, res.ranks

    storage_job(ctx, "guest", t, run, drops)


def _host_part(ctx: RunContext, t: catalogue.StorageTest, target: str, k: int, at: float | None,
               cancelled: Callable[[], bool]) -> Ran:
    progress = ctx.sink.progress("baseline", t.id, k)
    if at is not None:
        time.sleep(max(0.0, at - time.time()))
    start = time.time()
    res = HostRunner(cancelled).run(t, target, ctx.size, ctx.runtime, progress)
    return Ran(res, start, time.time())


def launch_many(ctx: RunContext) -> None:
    """Every guest under its profile (the run's, or a mixed run's in turn) on its own store, launched side by side;
    names carry the profile, the run and the guest's number, so no two runs' or guests' names meet."""
    acc, image = ctx.accelerator, ctx.image
    initrds: dict[int, Path] = {}  # the boot initrd fits the guest's RAM: one per size among the profiles

    def initrd_for(memory_mib: int) -> Path:
        if memory_mib not in initrds:
            if ctx.spec.wants_mpi:  # the image's MPI layer appended, in the run's directory
                with ctx.control.atomic():
                    initrds[memory_mib] = image.write_mpi_initrd(acc.domain_type, memory_mib,
                                                                 ctx.work_dir / f"initrd-mpi-{memory_mib}.cpio")
                    ctx.stack.callback(initrds[memory_mib].unlink, missing_ok=True)
            else:
                initrds[memory_mib] = image.boot_initrd(acc.domain_type, memory_mib)
        return initrds[memory_mib]

    domains = []
    for k, store in enumerate(ctx.backings, 1):
        profile = ctx.guest_profile(k)
        name = f"cloudbox-{profile.name}-{ctx.run_uuid[:8]}-g{k}"
        # removed with the store's directory (an NFS export's guests have none: the run's)
        log = ctx.work_dir / (f"console-g{k}.log" if ctx.volume else f"g{k}/console.log")
        plan = DomainPlan(profile, name=name, domain_type=acc.domain_type,
                          kernel=str(image.boot_kernel(acc.domain_type)),
                          initrd=str(initrd_for(profile.guest.memory_mib)),
                          cmdline=CMDLINE, disk_path="" if ctx.volume else store.vhost_user or store.path,
                          disk_is_block=store.is_block,
                          bridge=ctx.hostnet.bridge if ctx.hostnet else None,
                          run_uuid=ctx.run_uuid, console_log=str(log), more_disk_paths=store.more_paths,
                          placement=ctx.placement(k))
        xml = render_domain(plan)
        domains.append((xml, log))
    ctx.domain_xml, ctx.console_log = domains[0]
    mixed = f" of profiles {MIX.join(p.name for p in ctx.mix)} in turn" if ctx.mix else ""
    ctx.sink.step(f"launching {counted(len(domains), 'guest')}{mixed} ({acc.label})")
    ups = launch_all(ctx, domains)
    prov = ctx.provenance
    assert prov.guests is not None
    for k, (up, store) in enumerate(zip(ups, ctx.backings, strict=True), 1):
        ctx.sink.log(f"guest {up.guest.name}: agent ready {up.boot_s:.1f} s after its launch")
        prov.guests.guests.append(GuestStart(name=up.guest.name, disk=ctx.volume.uri if ctx.volume else store.path,
                                             launch_to_agent_s=round(up.boot_s, 2),
                                             profile=ctx.guest_profile(k).name if ctx.mix else ""))
    ctx.many = [up.guest for up in ups]
    ctx.guest = ctx.many[0]
    prov.guest_kernel = ctx.guest.sh("uname -r", timeout=30).stdout.strip()
    prov.domain_xml = ctx.guest.xml()
    xmls = prov.guests.domain_xml  # a mixed run's: what each profile's first guest really ran (guest k <= len(mix)
    for k, p in enumerate(ctx.mix, 1):  # runs the k-th profile; a profile named twice is read once)
        if p.name not in xmls:
            xmls[p.name] = prov.domain_xml if k == 1 else ctx.many[k - 1].xml()
    prov.launch_to_agent_s = round(max(up.boot_s for up in ups), 2)
    prov.boot_attempts = max(up.attempts for up in ups)
    ctx.boot_s = max(up.boot_s for up in ups)
    ctx.save_provenance()
    record_placement(ctx, ctx.guest)
    ctx.sink.emit(ProgressEvent("guest", BOOT, 100))


def guests_storage(ctx: RunContext) -> None:
    """Every storage test in all guests at once, through the barrier; each guest's start skew kept per test."""
    if not ctx.spec.wants_storage:
        return
    tests = catalogue.resolve_tests(ctx.spec.storage_tests)
    runners = [GuestRunner(g, ctx.control.cancelled) for g in ctx.many]
    for gr in runners:
        gr.check_tools(tests)
    links: list[tuple[str, str]] = []  # each guest's (NIC, address) on the bridge
    if ctx.volume is not None:  # every guest on the shared export
        disks, links = _mount_export(ctx, runners)
    else:
        disks = _assemble_raids(ctx, runners) if ctx.profile.disk.raid != "none" else [gr.disk() for gr in runners]
        if ctx.spec.wants_links:
            ctx.sink.step(f"guest: configuring {len(runners)} NICs for the jobs across guests", side="guest")
            links = [configure_nic(ctx, gr.guest, addresses.guest_ip(k)) for k, gr in enumerate(runners, 1)]
    if ctx.spec.wants_mpi:
        ctx.sink.step(f"guest: dropbear in {len(runners)} guests for mpirun", side="guest")
        mpiio.prepare_guests(ctx.many, [ip for _, ip in links],
                             lambda g, script: g.sh(script, timeout=60).check().stdout)
    ctx.sink.log("guest benchmark disks: " + ", ".join(f"{g.name} {d}" for g, d in zip(ctx.many, disks, strict=True)))
    ctx.sink.step(f"guest: storage tests, {counted(len(runners), 'guest')} at once", side="guest")
    if needs_fill(tests):
        ctx.sink.step("guest: laying down data for read tests, in every guest", side="guest")
        for gr, disk in zip(runners, disks, strict=True):
            gr.fill(disk, ctx.size)
    for t, lay in zip(tests, iozone.iozone_fills(tests), strict=True):
        if t.tool == catalogue.MPI_TOOL:
            _guests_mpi(ctx, t, runners, disks, links[0][0])
            continue
        if t.tool == catalogue.FIO_CS_TOOL:
            _guests_fio_cs(ctx, t, runners, disks, [ip for _, ip in links])
            continue
        if lay:
            ctx.sink.step(f"guest: laying down IOzone's data for {t.id}, in every guest", side="guest")
            for gr, disk in zip(runners, disks, strict=True):
                gr.fill_iozone(t, disk, ctx.size, timeout=guest_timeout(t, ctx.size))
        offsets = _read_clocks(ctx, runners)
        at = hold.wait(ctx, t.id, len(runners)) if ctx.spec.hold else time.time() + BARRIER_LEAD_S
        jobs = [functools.partial(_guest_part, ctx, t, gr, disk, at, offset, k)
                for k, (gr, disk, offset) in enumerate(zip(runners, disks, offsets, strict=True), 1)]
        parts = storage_test_many(ctx, "guest", t, jobs, tuple(gr.drop_caches for gr in runners))
        _record_skew(ctx, t.id, [p.started_at for p in parts])
    if ctx.profile.disk.raid != "none":
        _stop_raids(ctx, runners)
    if ctx.volume is not None:
        for k, g in enumerate(ctx.many, 1):
            nfs.unmount_in_guest(g, k)
        ctx.provenance.volume = pv = volume_info(ctx.volume, mount=ctx.provenance.volume.mount
                                                  if ctx.provenance.volume else "")
        ctx.save_provenance()
        assert pv is not None
        if pv.server_bytes_written is not None:  # unknown here when the front-end serves it
            ctx.sink.log(f"{pv.server} read {pv.server_bytes_read} and wrote {pv.server_bytes_written} bytes of the "
                         "export's disk")


FIO_SERVER_PORT = 8765  # fio's own default, on each guest's bridge address only
FIO_SERVER_PID = "/run/cloudbox-fio-server.pid"


def _guests_fio_cs(ctx: RunContext, t: catalogue.StorageTest, runners: list[GuestRunner], disks: list[str],
                   ips: list[str]) -> None:
    """`t` through fio's own client/server mode: a `fio --server` in every guest on its bridge address, and in the
    first guest one `fio --client` that sends each server its job (on that guest's own disk, or its own file on the
    shared export). fio starts them all and reports each server's figures and their aggregate ("All clients": all
    bytes over the longest job), which is the run's row; the servers are stopped after."""
    g1, n = runners[0].guest, len(runners)
    files = [f"/tmp/cloudbox-fiocs-g{k}.fio" for k in range(1, n + 1)]

    def stop() -> None:
        for gr in runners:
            gr.guest.sh(f"[ -f {FIO_SERVER_PID} ] && kill $(cat {FIO_SERVER_PID}); rm -f {FIO_SERVER_PID}", timeout=30)

    with ctx.control.atomic():
        ctx.stack.callback(stop)  # also when the job fails or the run is cancelled
    for gr, ip in zip(runners, ips, strict=True):
        gr.guest.run(["fio", f"--server=ip:{ip},{FIO_SERVER_PORT}", f"--daemonize={FIO_SERVER_PID}"], timeout=30,
                     check=True)
    argv = ["fio", "--output-format=json"]
    for path, disk, ip in zip(files, disks, ips, strict=True):
        g1.run(["/bin/sh", "-c", 'printf "%s" "$1" > "$2"', "sh",
                fio.fio_job_file(t, disk, ctx.size, ctx.runtime), path], timeout=30, check=True)
        argv += [f"--client=ip:{ip},{FIO_SERVER_PORT}", path]

    def run() -> tuple[FioResult, list[FioResult]]:
        r = g1.run(argv, timeout=guest_timeout(t, ctx.size), poll=ctx.control.check)
        if r.exitcode != 0:
            raise GuestError(f"fio --client ({t.id}) in {g1.name} exited {r.exitcode}: "
                             f"{(r.stdout + r.stderr).strip()[-600:]}")
        return fio.parse_fio_clients(t.id, r.stdout, ips)

    storage_job(ctx, "guest", t, run, tuple(gr.drop_caches for gr in runners),
                what=f"fio --client in {g1.name}, a fio --server in each of {n} guests")
    stop()


def _assemble_raids(ctx: RunContext, runners: list[GuestRunner]) -> list[str]:
    """Each guest stripes its own disk.count disks (RAID 0, mdadm --build); the arrays, each kept in its guest's
    record (the first also as the run's, as a single guest's is)."""
    d, info = ctx.profile.disk, ctx.provenance.guests
    assert info is not None
    ctx.sink.step(f"guest: RAID {d.raid} over {d.count} disks ({d.chunk_kib} KiB chunks), in each of {len(runners)} "
                  "guests", side="guest")
    devices = []
    for gr, rec in zip(runners, info.guests, strict=True):
        array = gr.assemble_raid(d.count, d.chunk_kib)
        rec.raid = RaidInfo(device=array.device, level=array.level, chunk_kib=array.chunk_kib, members=array.members,
                            mdstat=array.mdstat)
        devices.append(array.device)
        ctx.sink.log(f"guest {gr.guest.name} md array: {array.device}, RAID {array.level} over "
                     f"{', '.join(array.members)}")
    # A failure leaves the arrays to the guests' destruction: built without superblocks, nothing outlives them.
    ctx.provenance.raid = info.guests[0].raid
    ctx.save_provenance()
    return devices


def _stop_raids(ctx: RunContext, runners: list[GuestRunner]) -> None:
    """What each guest's members had written after the tests, kept; every array stopped."""
    info = ctx.provenance.guests
    assert info is not None
    for gr, rec in zip(runners, info.guests, strict=True):
        assert rec.raid is not None
        rec.raid.sectors_written = gr.sectors_written(rec.raid.members)
        gr.stop_raid()
        ctx.sink.log(f"guest {gr.guest.name} md array stopped; sectors written per member: "
                     + ", ".join(f"{k} {v}" for k, v in rec.raid.sectors_written.items()))
    ctx.save_provenance()


def _mount_export(ctx: RunContext, runners: list[GuestRunner]) -> tuple[list[str], list[tuple[str, str]]]:
    """Every guest's NIC configured and the export mounted in it; each guest's own test file there, and its NIC and
    address."""
    v = ctx.volume
    assert v is not None and isinstance(v.export, nfs.NfsExport) and ctx.hostnet is not None
    options = nfs.mount_options(v.export, ctx.profile.nfs)
    ctx.sink.step(f"guest: mounting {v.export.uri} in {counted(len(runners), 'guest')} ({options})", side="guest")
    files, links, line = [], [], ""
    hostnet = ctx.hostnet
    # a spread run's part on the front-end: its guests reach the export on the front-end's private address
    # through their bridge
    routed = not ctx.private_bridge and ipaddress.ip_address(v.export.host) not in \
        ipaddress.ip_network(addresses.bridge_subnet())
    for k, gr in enumerate(runners, 1):
        links.append(configure_nic(ctx, gr.guest, addresses.guest_ip(k)))
        if routed:
            network.guest_route(gr.guest, v.export.host, hostnet.host_ip)
        got = nfs.mount_in_guest(gr.guest, v.export, options)
        line = line or got
        files.append(nfs.test_file(k + ctx.spec.first_guest - 1))  # the whole run's number: no two places meet
    ctx.provenance.volume = volume_info(v, mount=line)
    ctx.save_provenance()
    ctx.sink.log(f"guest mount: {line}")
    return files, links


def _read_clocks(ctx: RunContext, runners: list[GuestRunner]) -> list[float]:
    """Each guest's uptime clock against the host's, kept in the provenance; the offsets, in the guests' order."""
    info = ctx.provenance.guests
    assert info is not None
    clocks = [gr.uptime_offset() for gr in runners]
    for rec, (offset, rtt) in zip(info.guests, clocks, strict=True):
        rec.clock_offset_s, rec.clock_rtt_s = round(offset, 4), round(rtt, 4)
    return [offset for offset, _ in clocks]


def _record_skew(ctx: RunContext, test: str, starts: list[float]) -> None:
    info = ctx.provenance.guests
    assert info is not None
    first = min(starts)
    info.start_offsets_s[test] = [round(s - first, 4) for s in starts]
    info.started_at[test] = round(first, 4)
    info.skew_s[test] = round(max(starts) - first, 4)
    ctx.save_provenance()
    ctx.sink.log(f"{test}: start skew {info.skew_s[test] * 1000:.0f} ms over {counted(len(starts), 'guest')}")


def _guest_part(ctx: RunContext, t: catalogue.StorageTest, gr: GuestRunner, disk: str, at: float,
                offset: float, k: int, cancelled: Callable[[], bool]) -> Ran:
    runner = GuestRunner(gr.guest, cancelled)
    progress = ctx.sink.progress("guest", t.id, k)
    try:
        res = runner.run(t, disk, ctx.size, ctx.runtime, progress, timeout=guest_timeout(t, ctx.size),
                         start_uptime=at - offset)
    except GuestUnreachable:
        if not cancelled():  # the first guest to fail: the run's reason quotes its console
            ctx.guest = gr.guest
        raise
    except DiskStalled as e:  # not relaunched: a new guest would no longer start with the others
        raise DiskStalled(f"guest {k} of {len(ctx.many)} ({gr.guest.name}): {e}", e.disks, e.seen) from e
    assert res.started_uptime is not None
    return Ran(res, res.started_uptime + offset, time.time())


def serve_many(hostnet: network.HostNetwork, tool: str, addr: str, n: int) -> list[int]:
    """The port each of n clients of `tool` uses on `addr`: one netserver for all (it forks a child per client), an
    iperf3 server each (it serves one client at a time)."""
    if tool == "netperf":
        return [hostnet.start_netserver(addr)] * n
    return [hostnet.start_iperf3(addr) for _ in range(n)]


def guests_network(ctx: RunContext) -> None:
    """Every network test in all guests at once through the barrier, each guest against a server of its own on the
    run's bridge (start skew kept per test); then on bare metal, N clients at once in the baseline namespace."""
    if not ctx.spec.wants_network:
        return
    hostnet, control, sink, n = ctx.hostnet, ctx.control, ctx.sink, len(ctx.many)
    assert hostnet is not None
    mtu = ctx.profile.network.mtu
    sink.step(f"guest: configuring {n} NICs and checking the MTU end to end")
    links = []
    for k, g in enumerate(ctx.many, 1):
        nic, ip = configure_nic(ctx, g, addresses.guest_ip(k))
        sink.log(f"MTU {mtu} verified end to end (guest {g.name} {nic} {ip} -> bridge {hostnet.bridge} "
                 f"{hostnet.host_ip})")
        links.append(network.GuestLink(g, nic, hostnet.host_ip, hostnet.bridge, mtu))
    runners = [GuestRunner(g, control.cancelled) for g in ctx.many]
    bare_labels = [*host_labels(ctx.labels, dom0=ctx.dom0), "veth-netns"]
    ports: dict[str, tuple[list[int], list[int]]] = {}
    for nt in resolve_net_tests(ctx.spec.net_tests):
        for g in ctx.many:
            if not g.has(nt.tool):
                raise CloudboxError(f"{nt.tool} is not installed in the guest {g.name}; rebuild it with "
                                    "'make guest-image'")
        if nt.tool not in ports:
            ports[nt.tool] = (serve_many(hostnet, nt.tool, hostnet.host_ip, n),
                              serve_many(hostnet, nt.tool, addresses.NS_HOST_IP, n))
        gports, bports = ports[nt.tool]
        _guests_net_many(ctx, nt, links, gports, runners)
        _host_net_many(ctx, nt, bports, bare_labels)
        if ctx.spec.peer:
            _to_front_end(ctx, nt, links, runners)


def _guests_net_many(ctx: RunContext, nt: catalogue.NetTest, links: list[network.GuestLink], ports: list[int],
                     runners: list[GuestRunner]) -> None:
    """`nt` in every guest at once through the barrier (a spread run's part: at the front-end's instant), guest k
    against ports[k - 1]; the start skew kept."""
    offsets = _read_clocks(ctx, runners)
    at = hold.wait(ctx, nt.id, len(runners)) if ctx.spec.hold else time.time() + BARRIER_LEAD_S
    jobs = [functools.partial(_guest_net_part, ctx, nt, link, port, at, offset, k)
            for k, (link, port, offset) in enumerate(zip(links, ports, offsets, strict=True), 1)]
    parts = net_test_many(ctx, "guest", nt, jobs, ctx.labels)
    _record_skew(ctx, nt.id, [p.started_at for p in parts])


def _host_net_many(ctx: RunContext, nt: catalogue.NetTest, ports: list[int], labels: list[str],
                   target: str = addresses.NS_HOST_IP, netns: str | None = addresses.NS) -> None:
    """`nt` on bare metal: N clients at once (from the baseline namespace, or with netns None from this host to
    `target`), each against its own port."""
    at = hold.wait(ctx, nt.id, len(ports), side="baseline") if ctx.spec.hold else time.time() + HOST_LEAD_S
    jobs = [functools.partial(_host_net_part, ctx, nt, port, at, k, target=target, netns=netns)
            for k, port in enumerate(ports, 1)]
    parts = net_test_many(ctx, "baseline", nt, jobs, labels)
    first = min(p.started_at for p in parts)
    ctx.sink.log(f"bare metal {nt.id}: start skew {(max(p.started_at for p in parts) - first) * 1000:.0f} ms over "
                 f"{counted(len(parts), 'process', 'processes')}")


def _to_front_end(ctx: RunContext, nt: catalogue.NetTest, links: list[network.GuestLink],
                  runners: list[GuestRunner]) -> None:
    """A back-end's run for the front-end: `nt` from every guest to the front-end's servers at once, through the
    barrier, then from this host's N clients at once (the private network's own baseline)."""
    spec, n = ctx.spec, len(links)
    # netserver forks a child per client; an iperf3 server serves one client at a time
    ports = [spec.peer_netperf_port] * n if nt.tool == "netperf" else list(spec.peer_iperf3_ports)
    if not all(ports) or len(ports) != n:
        raise CloudboxError(f"the front-end {spec.peer} opened no {nt.tool} server for each of the run's {n} guests "
                            f"(peer_netperf_port / peer_iperf3_ports: {ports})")
    fe = catalogue.frontend_test(nt)
    far = [network.GuestLink(ln.guest, ln.nic, spec.peer, ln.bridge, ln.mtu, local=False) for ln in links]
    _guests_net_many(ctx, fe, far, ports, runners)
    with network.frames_to(spec.peer, ctx.profile.network.mtu, ctx.sink.log):  # at the guests' MTU, as they are
        _host_net_many(ctx, fe, ports, [*host_labels(ctx.labels, dom0=ctx.dom0), "private-network"],
                       target=spec.peer, netns=None)


def _guest_net_part(ctx: RunContext, t: catalogue.NetTest, link: network.GuestLink, port: int, at: float,
                    offset: float, k: int, cancelled: Callable[[], bool]) -> NetRan:
    try:
        res = nettests.run_in_guest(link.guest, t, port, ctx.net_seconds, ctx.sink.progress("guest", t.id, k),
                                   cancelled, target=link.target, log=ctx.sink.log, link=link,
                                   start_uptime=at - offset)
    except (GuestUnreachable, NicStalled):
        if not cancelled():  # the first guest to fail: the run's reason quotes its console
            ctx.guest = link.guest
        raise
    assert res.started_uptime is not None
    return NetRan(res, res.started_uptime + offset, time.time())


def _host_net_part(ctx: RunContext, t: catalogue.NetTest, port: int, at: float, k: int,
                   cancelled: Callable[[], bool], *, target: str, netns: str | None) -> NetRan:
    while (wait := at - time.time()) > 0 and not cancelled():
        time.sleep(min(wait, 0.05))
    start = time.time()
    res = nettests.run_baseline(t, port, ctx.net_seconds, ctx.sink.progress("baseline", t.id, k), cancelled,
                               target=target, netns=netns, log=ctx.sink.log)
    return NetRan(res, start, time.time())
