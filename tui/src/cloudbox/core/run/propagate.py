"""A propagation run on this host (suite "propagation", study B's image-propagation sweep), as steps over one
RunContext like a test run's: the guest image, the accelerator, libvirt, a fresh work directory for the instance
files, the facts, the source images, then one sample per image size in `spec.propagate`.

A sample: the host's page cache dropped (the source is read from disk, as from a repository), the source image
copied to a fresh instance file and flushed, the benchmark guest started with that copy as its disk and waited for
until its agent answers, then destroyed and the copy deleted; its copy, boot-to-agent and total seconds are stored
as three measurements of the test "propagate-<MiB>m", written together. Whatever stops the run (Ctrl-C, `cloudbox
cancel`, a guest that does not come up) unwinds the context's stack: the guest destroyed, the work directory with
any copy removed, a source image cut while being made deleted; the samples stored before stay and count.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

from .. import paths
from ..bench import propagation, runners
from ..bench.propagation import BOOT, COPY, TOTAL
from ..disks import backing
from ..record.events import MeasurementEvent, ProgressEvent
from ..spec.runspec import propagation_test
from ..virt.domain import DomainPlan, render_domain
from ..virt.guestimage import CMDLINE
from .context import RunContext
from .launch import launch
from .local import connect_libvirt, find_image, probe_accelerator, record_facts


def run_propagation(ctx: RunContext) -> None:
    """The body of a propagation run (core.run.lifecycle.Execution runs it)."""
    for step in (find_image, probe_accelerator, connect_libvirt, prepare_instances, record_facts):
        step(ctx)
    sources = make_sources(ctx)
    counts = Counter(ctx.spec.propagate)
    for i, (size, plan_test) in enumerate(ctx.spec.propagation_steps(), 1):
        provision(ctx, i, sources[size], size, plan_test, counts[size])


def prepare_instances(ctx: RunContext) -> None:
    """The free space checked again (the study run checked it before starting), then a fresh work directory for
    the instance files, removed whole at the end."""
    sizes = ctx.spec.propagate
    base = paths.work_base(ctx.spec.work_dir)
    propagation.check_space(sizes, base)
    ctx.sink.step(f"preparing a work directory for the instance copies (up to {backing.human_size(max(sizes))})")
    ctx.work_dir = base / f"run-{ctx.run_uuid[:12]}"
    with ctx.control.atomic():
        ctx.backing = backing.instance_dir(ctx.work_dir, max(sizes))
        ctx.stack.callback(ctx.backing.remove)
    ctx.labels += ctx.backing.labels
    ctx.store.update_run(ctx.run_id, size_bytes=max(sizes))


def make_sources(ctx: RunContext) -> dict[int, Path]:
    """The source image of each size, made once and kept in the image store for later sweeps; those of other sizes
    are removed first."""
    wanted = sorted(set(ctx.spec.propagate))
    removed = propagation.clear_sources(keep=wanted)
    if removed:
        ctx.sink.log("removed source images of other sizes, or cut short: "
                     + ", ".join(propagation.size_text(s.size_bytes) for s in removed))
    have = {s.size_bytes for s in propagation.list_sources() if s.complete}
    for size in wanted:
        if size in have:
            continue
        test = propagation_test(size)
        ctx.sink.step(f"making the source image of {propagation.size_text(size)} (once: later sweeps reuse it)")
        part = propagation.part_path(size)
        with ctx.control.atomic():
            part.parent.mkdir(parents=True, exist_ok=True)
            ctx.stack.callback(part.unlink, missing_ok=True)
        propagation.fill_file(part, size, _progress(ctx, f"{test}:source"))
        part.replace(propagation.source_path(size))
    return {size: propagation.source_path(size) for size in wanted}


def provision(ctx: RunContext, i: int, source: Path, size: int, step: str, of: int) -> None:
    """Sample `i` of the run: copy, start, agent, destroy, delete; stored as one sample of `size`."""
    control, sink = ctx.control, ctx.sink
    control.check()
    number = step.rpartition("#")[2]
    sink.step(f"propagation: {propagation.size_text(size)} image, sample {number} of {of}", side="guest", test=step)
    labels = list(ctx.labels)
    if not runners.drop_host_caches():
        labels.append("warm-cache")
    instance = ctx.work_dir / f"instance-{i}.raw"  # removed with the work directory if the run stops here
    started = time.time()
    t0 = time.monotonic()
    copy_s = propagation.copy_image(source, instance, _progress(ctx, step))
    name = f"cloudbox-{ctx.profile.name}-{ctx.run_uuid[:8]}-{i}"
    ctx.console_log = ctx.work_dir / f"console-{i}.log"
    plan = DomainPlan(ctx.profile, name=name, domain_type=ctx.accelerator.domain_type,
                      kernel=str(ctx.image.boot_kernel(ctx.accelerator.domain_type)),
                      initrd=str(ctx.image.boot_initrd(ctx.accelerator.domain_type, ctx.profile.guest.memory_mib)),
                      cmdline=CMDLINE,
                      disk_path=str(instance), disk_is_block=False, bridge=None,
                      run_uuid=ctx.run_uuid, console_log=str(ctx.console_log))
    ctx.domain_xml = render_domain(plan)
    t1 = time.monotonic()
    up = launch(ctx)
    t2 = time.monotonic()
    boot_s, total_s = t2 - t1, t2 - t0
    if i == 1:
        prov = ctx.provenance
        prov.domain_xml = up.guest.xml()
        prov.guest_kernel = up.guest.sh("uname -r", timeout=30).stdout.strip()
        prov.launch_to_agent_s = round(up.boot_s, 2)
        prov.boot_attempts = up.attempts
        ctx.save_provenance()
    t3 = time.monotonic()
    with control.atomic():
        up.guest.destroy()
        ctx.guest = None
        instance.unlink()
    teardown_s = time.monotonic() - t3
    raw = {"size_bytes": size, "copy_s": round(copy_s, 4), "boot_s": round(boot_s, 4), "total_s": round(total_s, 4),
           "teardown_s": round(teardown_s, 4), "boot_attempts": up.attempts, "source": str(source),
           "instance": str(instance), "guest": name}
    finished = time.time()
    test = propagation_test(size)
    with control.atomic():  # a sample is stored whole: a signal waits until its three rows are written
        for metric, value in ((COPY, copy_s), (BOOT, boot_s), (TOTAL, total_s)):
            # each sample is a guest boot of its own: sample k of this size is its repeat k, in boot k
            ctx.store.add_measurement(ctx.run_id, side="guest", test=test, metric=metric, value=value,
                                      labels=labels, raw=raw if metric == TOTAL else None, started_at=started,
                                      finished_at=finished, repeat=int(number), boot=int(number), iteration=1)
    mbps = size / copy_s / 1e6 if copy_s > 0 else 0.0
    sink.log(f"{propagation.size_text(size)}: copy {copy_s:.2f} s ({mbps:.0f} MB/s), boot to agent {boot_s:.2f} s, "
             f"total {total_s:.2f} s" + (f" (boot attempt {up.attempts})" if up.attempts > 1 else ""))
    sink.emit(MeasurementEvent("guest", step, "s", round(total_s, 2), tuple(labels)))


def _progress(ctx: RunContext, test: str) -> propagation.Progress:
    """A byte counter's callback as the run's progress events (the sink keeps two a second)."""
    t0 = time.monotonic()

    def on(done: int, total: int) -> None:
        elapsed = time.monotonic() - t0
        ctx.sink.emit(ProgressEvent("guest", test, round(100.0 * done / total, 1) if total else 100.0,
                                    mbps=round(done / elapsed / 1e6, 1) if elapsed > 0 else None))

    return on
