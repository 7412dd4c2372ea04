"""The run's steps for what a profile asks of this host: its paths' needs checked (core.virt.requirements), the
guests placed on its CPUs and NUMA nodes ([placement]), the huge pages their RAM needs reserved before anything
else is made and given back after the run, and what the host really did read back once the guests are up
(libvirt's pinning, QEMU's threads' affinities and its RAM's nodes from /proc, the huge page pool) into the run's
provenance."""

from __future__ import annotations

import contextlib

from ..errors import CloudboxError
from ..record.provenance import PlacementInfo
from ..spec.iopaths import Placement
from ..spec.profiles import placement_words
from ..virt import placement, requirements
from ..virt.domain import read_domain
from ..virt.guest import Guest
from ..virt.hugepages import HugePages, pages_for
from .context import RunContext


def place_guests(ctx: RunContext) -> None:
    """What the run's profiles need of this host checked (core.virt.requirements), each guest's [placement] resolved
    on it (ctx.placements, guest k's at k-1), and the huge pages they all take reserved, their release registered
    first; refused with the arithmetic before the run makes anything when the host cannot. Nothing more for a
    profile without a [placement] table."""
    n = ctx.spec.guests
    profiles = [ctx.guest_profile(k) for k in range(1, n + 1)]
    for p in {p.name: p for p in profiles}.values():
        if (why := requirements.host_problem(p)) is not None:
            raise CloudboxError(f"profile {p.name}: {why}")
    if all(p.placement == Placement() for p in profiles):
        return
    ctx.sink.step("placing the guest" + ("s" if n > 1 else "") + " on this host's CPUs and memory")
    topo = placement.Topology.read()
    ctx.placements = [placement.resolve(p.placement, p.guest.vcpus, topo, guest=k, profile=p.name)
                      for k, p in enumerate(profiles)]
    info = ctx.provenance.placement = PlacementInfo(
        asked=placement_words(ctx.profile.placement), topology=topo.describe(),
        placed=[hp.words() for hp in ctx.placements])
    ctx.sink.log(f"host: {topo.describe()}; placed: " + " | ".join(info.placed))
    page_kib = ctx.placements[0].hugepage_kib
    if page_kib:
        needed = sum(pages_for(p.guest.memory_mib, page_kib) for p in profiles)
        pool = ctx.hugepages = HugePages(page_kib, placement.pool_node(ctx.placements[0], topo))
        info.hugepage_kib, info.hugepages_needed = page_kib, needed
        info.hugepages_before = {"total": pool.before.total, "free": pool.before.free}

        def release() -> None:
            after = pool.release()
            info.hugepages_after = {"total": after.total, "free": after.free}
            with contextlib.suppress(Exception):  # the run's outcome stands whatever the log and store do
                ctx.sink.log(f"huge pages given back: {pool.where} has {after.total} pages of {page_kib} KiB, "
                             f"{after.free} free (before the run: {pool.before.total}, {pool.before.free} free)")
                ctx.save_provenance()

        with ctx.control.atomic():
            ctx.stack.callback(release)
        memory = " + ".join(f"{p.guest.memory_mib} MiB" for p in profiles)
        got = pool.reserve(needed, f"the guest RAM ({memory})")
        ctx.sink.log(f"huge pages: {needed} of {page_kib} KiB reserved on {pool.where} for the run ({got.total} "
                     f"in the pool, {got.free} free; {pool.added} added, given back after the run)")
    ctx.save_provenance()


def record_placement(ctx: RunContext, guest: Guest) -> None:
    """What the host did with the run's (first) guest: libvirt's pinning and memory binding (the live XML and its
    pin calls), QEMU's threads' affinities and its RAM's pages per node (/proc), the huge page pool while it runs;
    logged, and stored in the provenance."""
    info = ctx.provenance.placement
    if info is None:
        return
    live = read_domain(guest.xml())
    info.vcpu_pins = {str(i): placement.cpuset([c for c, on in enumerate(cpus) if on])
                      for i, cpus in enumerate(_call(guest.dom.vcpuPinInfo, 0) or ())}
    emulator = _call(guest.dom.emulatorPinInfo, 0)
    info.emulator_pin = placement.cpuset([c for c, on in enumerate(emulator) if on]) if emulator else ""
    info.iothread_pins = {str(i): placement.cpuset([c for c, on in enumerate(cpus) if on])
                          for i, cpus in _call(guest.dom.ioThreadInfo, 0) or ()}
    binding = live.memory_binding
    info.memory_binding = f"{binding.mode} {binding.nodeset}" if binding is not None else ""
    pid = guest.qemu_pid()
    if pid is not None:
        seen = placement.observed(pid)
        info.threads, info.ram_pages = seen.threads, seen.ram_pages
        info.ram_page_kib, info.ram_policy = seen.ram_page_kib, seen.ram_policy
    if ctx.hugepages is not None:
        now = ctx.hugepages.state()
        info.hugepages_running = {"total": now.total, "free": now.free}
    ctx.save_provenance()
    vcpus = ", ".join(f"{k}: {v}" for k, v in info.threads.items() if k.startswith("CPU "))
    ctx.sink.log(f"placement read back: libvirt pins vCPUs {info.vcpu_pins or '-'}, emulator {info.emulator_pin}, "
                 f"iothreads {info.iothread_pins or '-'}, memory {info.memory_binding or 'unbound'}; /proc: vCPU "
                 f"threads on {vcpus or '?'}; RAM pages per node {info.ram_pages or '?'} of {info.ram_page_kib} KiB "
                 f"({info.ram_policy or '?'})" + (f"; huge pages free while running: "
                                                  f"{info.hugepages_running['free']}" if info.hugepages_running
                                                  else ""))


def _call(method, *args):  # type: ignore[no-untyped-def]
    """A libvirt query that a driver may not offer (the test driver, Xen): None then."""
    import libvirt

    try:
        return method(*args)
    except libvirt.libvirtError:
        return None
