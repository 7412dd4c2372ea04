"""The run-detail view: one stored run's configuration, provenance, comparison table, its repeated figures sample by
sample and raw tool output as text, what `cloudbox results show` prints."""

from __future__ import annotations

import textwrap
import time
from collections.abc import Sequence

from ..inputs import printable
from ..record.events import counted
from ..record.provenance import Guests, Provenance
from ..record.rows import Figure, Run, Sample
from ..record.stats import drift
from ..spec.catalogue import test_sort_key
from ..spec.runspec import OVERCOMMIT_LABEL
from . import compare, labels, render


def when(t: float | None, long: bool = False) -> str:
    """A time as the run views show it: "11-14 23:13", or with the year and seconds (`long`); "-" for none."""
    if t is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S" if long else "%m-%d %H:%M", time.localtime(t))


def duration_words(seconds: float) -> str:
    """Seconds as "42 s", "3 min 05 s" or "1 h 02 min"."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    h, rem = divmod(s, 3600)
    return f"{h} h {rem // 60:02d} min" if h else f"{rem // 60} min {rem % 60:02d} s"


def _sampled_devices(samples: Sequence[Sample]) -> list[str]:
    """Each device the host sampler watched during the run: seconds sampled, mean MB/s and utilisation."""
    by: dict[str, list[Sample]] = {}
    for smp in samples:
        by.setdefault(smp.device or "?", []).append(smp)
    out = []
    for dev, ss in by.items():
        mbps = sum((x.read_mbps or 0) + (x.write_mbps or 0) for x in ss) / len(ss)
        util = sum(x.util or 0 for x in ss) / len(ss)
        out.append(f"{dev} {len(ss)} s, mean {mbps:.1f} MB/s, util {util:.0f}%")
    return out


def _vcpus(vcpus: int, cpus: int) -> str:
    """'3 on 2 host CPUs' (guest vCPUs on host CPUs), saying when the guests had to share them (--cpu-overcommit)."""
    return (f"{vcpus} on {counted(cpus, 'host CPU')}"
            + (f": overcommitted, the guests shared CPUs ({OVERCOMMIT_LABEL})" if vcpus > cpus else ""))


def run_detail(run: Run, samples: Sequence[Sample], *, executor_alive: bool = True, raw: bool = False) -> str:
    """What `cloudbox results show` prints: the run's configuration and provenance, its comparison table and (`raw`)
    the tools' own output. `samples` are its host samples; `executor_alive` False for a run still marked running
    whose executor is gone."""
    p = run.provenance
    lines = [*_run_lines(run, executor_alive), *_store_lines(p, samples),
             *(_guests_lines(p.guests) if p.guests is not None else []), *_boot_lines(p), *how_measured_lines(p)]
    # Reasons, kernels and versions may come from a node: every line goes through the one escaping function.
    out = ["\n".join(printable(line) for line in lines) + "\n", "\n"]
    table = render.to_text(compare.compare_table([run], title=f"Run #{run.id}"))
    out += [printable(line) + "\n" for line in table.splitlines()]
    out += [printable(line) + "\n" for line in repeated_lines(run)]
    if raw:
        for m in run.measurements:
            if m.raw:
                out.append(printable(f"\n--- raw: {m.side} {m.test} {m.metric} (measurement {m.id}) ---", "\n") + "\n")
                out.append(printable(m.raw.rstrip("\n"), "\t\n") + "\n")
    return "".join(out)


SIDE_NAMES = {"guest": "guest", "baseline": "bare metal"}


def repeated_lines(run: Run, width: int = 80) -> list[str]:
    """Each figure the run measured more than once: its median with its interval and n, CV, min and max (flagged
    past stats.CV_FLAG), a drift between its first and second half when one shows, and every sample in measured
    order (by guest boot when there were several); the guest's % of bare metal with its interval. [] when the run
    measured each figure once."""
    figures = [f for f in run.figures() if f.repeated]
    if not figures:
        return []
    out = ["", "Repeated figures: median [95% interval] n, CV, min, max, samples in order"]
    tests = sorted(dict.fromkeys((f.test, f.metric) for f in figures), key=lambda k: test_sort_key(k[0]))
    for test, metric in tests:
        out.append(f"  {test} {metric}")
        for f in sorted((f for f in figures if (f.test, f.metric) == (test, metric)),
                        key=lambda f: (f.instance or 0, f.side != "guest")):
            name = SIDE_NAMES.get(f.side, f.side) + ("" if f.instance is None else f" {f.instance}")
            out += _figure_lines(f, name, width)
        r = run.ratio(test, metric)
        if r is not None:
            out.append(f"    {'% of bare':<12}{labels.ratio_text(r)}")
    return out


def _figure_lines(f: Figure, name: str, width: int) -> list[str]:
    """One figure of `repeated_lines`: its summary, its drift if any, its samples wrapped under it."""
    s, fmt = f.summary, labels.value_format(f.metric)
    cv = "-" if s.cv is None else f"{s.cv * 100:.1f}%"
    head = (f"    {name:<12}{labels.figure_text(s, fmt)}  CV {cv}" + (f" {labels.VARIES_MARK}" if s.flagged else "")
            + f"  min {fmt.format(s.minimum)}  max {fmt.format(s.maximum)}")
    out = [head]
    d = drift(f.values)
    if d is not None and d.detected:
        out.append(f"{'':16}{d.text()}")
    if f.boots > 1:
        groups: dict[int, list[float]] = {}
        for m in f.samples:
            groups.setdefault(m.boot, []).append(m.value)
        text = "; ".join(f"boot {b}: " + " ".join(fmt.format(v) for v in vs) for b, vs in groups.items())
    else:
        text = " ".join(fmt.format(v) for v in f.values)
    out += textwrap.wrap(text, width, initial_indent=" " * 16, subsequent_indent=" " * 16)
    return out


def how_measured_lines(p: Provenance, width: int = 116) -> list[str]:
    """How the samples were taken: the repeats (their order, each test's count and why it stopped), the timed tests'
    warm-up, the page caches before reads, and the host's state (CPU frequency and idle states, THP, NUMA, the
    kernel command line, the disk, the NIC); each wrapped to `width` under its heading."""
    items: list[tuple[str, str]] = []
    if (r := p.repeats) is not None:
        boots = f" in each of {r.boots} guest boots" if r.boots > 1 else ""
        until = (f", until its ratio's 95% interval is within +-{r.until_width:g}% (at most {r.max_repeats})"
                 if r.until_width else "")
        items.append(("repeats", f"{r.repeats} a side{boots}{until}: {r.order}"))
        if r.timing:
            items.append(("each sample", r.timing))
        if r.boot_s:
            items.append(("boots", "launch to agent " + ", ".join(f"{s:.0f} s" for s in r.boot_s)))
        items += [("stopped", f"{tr.test}: {tr.samples} a side, {tr.reason}") for tr in r.tests]
    if (ss := p.steady_state) is not None:
        what = (f"a {ss.seconds} s warm-up job run first and discarded" if ss.method == "warmup"
                else "fio's steady-state detection")
        items.append(("steady state", f"{what} in {', '.join(ss.tests)}: {ss.note}"))
    if (c := p.caches) is not None:
        items += [("caches", f"host: {c.host}")] + [("", f"{who}: {text}") for who, text in
                                                     (("guest", c.guest), ("server", c.server)) if text]
    if (h := p.host_state) is not None:
        items += [("host state" if i == 0 else "", line) for i, line in enumerate(h.lines())]
    lines = []
    for head, text in items:
        lines += textwrap.wrap(text, width, initial_indent=f"  {head:<13}", subsequent_indent=" " * 17,
                               break_on_hyphens=False, break_long_words=False)
    return lines


def _run_lines(run: Run, executor_alive: bool) -> list[str]:
    """The run's own row: state, profile, suite and size, accelerator, what the tables call it, node and times."""
    state = run.state + (f" ({run.reason})" if run.reason else "")
    if run.state == "running" and not executor_alive:
        state += " - executor process gone"
    return [
        f"run #{run.id}  {run.uuid}",
        f"  state        {state}",
        f"  profile      {run.profile_name or '-'}"
        + (f"  [{run.profile_hash[:12]}]" if run.profile_hash else ""),
        f"  suite        {run.suite or '-'}  size {run.size_label or '-'}"
        + (f" ({run.size_bytes / 2**30:.1f} GiB)" if run.size_bytes else ""),
        f"  accelerator  {run.accelerator or '-'}"
        + (f"  {labels.EMULATED_MARK} EMULATED: numbers are not overhead figures" if run.emulated else ""),
        f"  VMM/driver   {labels.vmm_label(run)}; {labels.target_label(run)}; {labels.driver_label(run)}",
        f"  node         {run.node or '-'}  pid {run.pid or '-'}",
        f"  started      {when(run.started_at, True)}  finished {when(run.finished_at, True)}"
        + (f"  ({duration_words(run.duration)})" if run.duration is not None else ""),
    ]


def _store_lines(p: Provenance, samples: Sequence[Sample]) -> list[str]:
    """What the guest's disk sat on: the backing store, a network volume and how it was reached, the devices
    sampled, the RAID arrays."""
    lines = []
    if p.backing is not None:
        b = p.backing
        desc = ", ".join(f"{k}={v}" for k, v in (("kind", b.kind), ("path", b.path), ("device", b.device),
                                                  ("model", b.model), ("size_bytes", b.size_bytes)) if v is not None)
        if b.count and b.more_paths:
            desc += f", {b.count} disks (size_bytes each), also " + ", ".join(b.more_paths)
        lines.append(f"  backing      {desc}")
    if p.volume is not None:
        v = p.volume
        io = (f"; the server read {v.server_bytes_read} and wrote {v.server_bytes_written} bytes"
              if v.server_bytes_written is not None else "")
        lines.append(f"  volume       {v.scheme}:{v.name} attached by {v.attach}, {v.server}; authentication: "
                     f"{v.tls or 'none'}{io}")
        if v.host_device:
            lines.append(f"  attached     {v.host_device} by {v.initiator}"
                         + (" for the baseline (the guest attached the volume itself)" if v.attach == "guest" else "")
                         + (f"; the disk under the volume ({v.server_device}) sampled beside it" if v.server_device
                            else ""))
        if v.mount:
            lines.append(f"  guest mount  {v.mount}")
        if v.host_mount:  # a back-end's host on the front-end's export, for the baseline
            lines.append(f"  host mount   {v.host_mount}")
        lines.append(f"  baseline     {v.baseline or '-'}")
    per_device = _sampled_devices(samples)
    # a volume's two ends (the attached device, the disk under it) on one timeline, or a front-end's disk alone
    if len(per_device) > 1 or (p.volume is not None and p.volume.server_device):
        lines.append("  sampled      " + "; ".join(per_device))
    arrays = [(f" of {x.name}", x.raid) for x in p.guests.guests if x.raid] if p.guests else []
    for whose, r in arrays or ([("", p.raid)] if p.raid is not None else []):
        lines.append(f"  {r.where + ' RAID':<13}{r.device}{whose}: RAID {r.level}, {r.chunk_kib} KiB chunks, over "
                     + ", ".join(r.members)
                     + ("; sectors written " + ", ".join(f"{k} {v}" for k, v in r.sectors_written.items())
                        if r.sectors_written else ""))
    return lines


def _guests_lines(g: Guests) -> list[str]:
    """A run of N guests: each guest's store, each place of a spread run, the vCPUs on the host's CPUs, the start
    skew."""
    lines = [f"  guests       {g.count} at once, each on a store of its own: "
             + ", ".join(f"{x.name} ({', '.join(filter(None, (x.profile, x.disk)))}"
                         f"{' on ' + x.place if x.place else ''})" if x.disk or x.profile else x.name
                         for x in g.guests)]
    for pl in g.places:  # a run spread over several places
        first, last = pl.first, pl.first + pl.guests - 1
        clock = (f"; its clock {pl.clock_offset_s * 1000:+.1f} ms from the front-end's (round trip "
                 f"{(pl.clock_rtt_s or 0) * 1000:.1f} ms)" if pl.clock_offset_s is not None else "")
        cpus = f"; vCPUs {_vcpus(pl.vcpus, pl.host_cpus)}" if pl.vcpus and pl.host_cpus else ""
        lines.append(f"  place        {pl.name}: g{first}" + (f"-g{last}" if last > first else "")
                     + f" on {pl.host or '?'} ({pl.accelerator or '?'}), its run {pl.run_id}{clock}{cpus}")
    if g.vcpus and g.host_cpus:
        lines.append(f"  vCPUs        {_vcpus(g.vcpus, g.host_cpus)}")
    if g.skew_s:
        lines.append("  start skew   " + ", ".join(f"{t} {s * 1000:.0f} ms" for t, s in g.skew_s.items())
                     + " (the latest guest's start after the earliest's)")
    return lines


def _boot_lines(p: Provenance) -> list[str]:
    """The kernels, the guest's boot, its stalls and relaunches, and the tools' versions."""
    lines = []
    for key, value in (("host kernel", p.host_kernel), ("guest kernel", p.guest_kernel)):
        if value:
            lines.append(f"  {key:<12} {value}")
    if p.launch_to_agent_s is not None:
        attempts = p.boot_attempts or 1
        lines.append(f"  guest boot   {p.launch_to_agent_s:.0f} s to its agent"
                     + (f" (launch {attempts}: the guest's first boot was lost and it was launched again)"
                        if attempts > 1 else ""))
    for stall in p.nic_stalls or []:
        lines.append(f"  network      the guest's network stopped during {stall.test} (frames stopped at "
                     f"{stall.hop}); re-plugging its NIC did not help, the guest was launched afresh and "
                     "the tests from there on ran on the new guest")
    for ds in p.disk_stalls or []:
        lines.append(f"  disk         the guest's disk stopped completing requests during {ds.test} ({ds.seen}); "
                     f"the guest was launched afresh and {ds.test} and the tests after it ran on the new guest")
    if p.versions is not None:  # the tools' versions; the guest's packages are in --json (dozens of them)
        versions = p.versions.model_dump(exclude={"guest_packages"})
        lines.append("  versions     " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items()) if v))
    return lines
