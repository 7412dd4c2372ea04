"""Views over stored runs: the studies' comparison tables (Study A, Tables 1 and 2) and their renderings.

compare_table(runs) builds a Table: one Section per test, storage first (all writes, then all reads,
64 kB requests first, as Table 1 then Table 2), then network. Each section holds, per group of runs
sharing a node and target, a bare-metal row ("none", target, "-") and then one row per run:

    run  VMM                 target      driver                 MB/s  % of bare metal  avgrq  avgqu  util

"% of bare metal" (network: "% of baseline") always divides by the baseline measured in the SAME run.
Rows measured under emulation (TCG, or KVM nested in a TCG guest) carry the marker "*" and the table a
footnote saying so: such numbers are not overhead figures. Markers are text, never colour alone.

Renderers: to_text (fixed width, wraps text columns to fit 80 columns), to_markdown, to_csv (one
rectangular table, raw numbers), to_json (whole runs with provenance). run_summary(run) gives the
headline numbers for list views.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import re
import statistics
import textwrap
import time
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..record.fairness import spread
from ..record.rows import Measurement, Run
from ..spec.catalogue import (
    FIO_CS_TESTS,
    FRONTEND_SUFFIX,
    JOB_TESTS,
    MPI_TESTS,
    base_test,
    is_storage_test,
    primary_metric,
    test_sort_key,
    test_title,
)
from ..spec.runspec import OVERCOMMIT_LABEL

EMULATED_MARK = "*"
MEAN_BASELINE_MARK = "^"
CAVEAT_MARK = "+"
EMULATED_NOTE = f"{EMULATED_MARK} measured under TCG emulation: not an overhead figure"
NESTED_NOTE = (
    f"{EMULATED_MARK} measured under emulation (TCG, or KVM nested in an emulated host): "
    "not an overhead figure"
)
# Measurement labels that make a number weaker than the studies' (shown with CAVEAT_MARK).
CAVEAT_LABELS = {
    "quick-size": "test file smaller than the studies' (page cache and device cache weigh more)",
    "warm-cache": "page cache not dropped before the test",
    "loopback": "no physical network between the ends",
    "virtualized-host": "the bare-metal side ran on a virtual machine, not on bare metal",
    OVERCOMMIT_LABEL: "the guests had more vCPUs than the host had CPUs (--cpu-overcommit): CPU scheduling weighs in",
}
# A baseline measured on a network volume from the host domain (Study A's "EBS from dom0" row), not on a local disk.
VOLUME_BASELINE_LABEL = "volume-from-host"
# ... through this host's kernel initiator (open-iscsi, nbd-client, aoe, nvme_tcp), on the device it attached
HOST_INITIATOR_LABEL = "host-initiator"
# A baseline measured on an NFS export's own directory on the server's disk, without NFS (core.disks.volumes.attach).
NFS_BASELINE_LABEL = "nfs-export-dir"

JSON_FORMAT = "cloudbox-results"
JSON_VERSION = 1


# --------------------------------------------------------------------------------------------------
# The table model
# --------------------------------------------------------------------------------------------------


@dataclass
class Column:
    key: str  # key into Row.cells
    title: str  # full title (markdown, csv header is the key)
    short: str  # title in the fixed-width text rendering
    numeric: bool = False


@dataclass
class Row:
    kind: str  # "baseline" | "guest"
    run_ids: list[int]
    cells: dict[str, Any]  # run, vmm, target, driver (str); value, pct, avgrq, avgqu, util (float | None)
    markers: list[str] = field(default_factory=list)
    emulated: bool = False
    labels: list[str] = field(default_factory=list)

    @property
    def marker(self) -> str:
        return "".join(self.markers)


@dataclass
class Section:
    test: str
    title: str
    metric: str
    columns: list[Column]
    rows: list[Row] = field(default_factory=list)

    @property
    def storage(self) -> bool:
        return is_storage_test(self.test)


@dataclass
class Table:
    title: str
    run_ids: list[int]
    sections: list[Section] = field(default_factory=list)
    footnotes: list[str] = field(default_factory=list)
    legend: list[str] = field(default_factory=list)  # one line per run: id, profile, suite, size, accelerator

    def section(self, test: str) -> Section | None:
        return next((s for s in self.sections if s.test == test), None)


# --------------------------------------------------------------------------------------------------
# Test ordering and titles
# --------------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------------
# Describing a run's configuration: VMM, target, driver
# --------------------------------------------------------------------------------------------------

# Backing kinds (profiles.Backing) -> the studies' "target" words...
_TARGETS = {
    "sparse-file": "local file", "prealloc-file": "local file", "qcow2": "local file", "qcow2-prealloc": "local file",
    "block-device": "local disk", "network-volume": "EBS",
}
_VOLUME_SCHEMES = {"aoe": "AoE", "iscsi": "iSCSI", "nbd": "NBD", "nvme-tcp": "NVMe/TCP"}
# ... and the backing half of the studies' "driver" column ("SCSI, sparse file", "virtio/phy").
_BACKINGS = {
    "sparse-file": "sparse file", "prealloc-file": "pre-allocated file", "qcow2": "qcow2 file",
    "qcow2-prealloc": "pre-allocated qcow2", "block-device": "phy", "network-volume": "phy",
}
# Disk buses (profiles.Bus) as the tables name them.
_BUSES = {"xen-vbd": "xvd"}


@dataclass(frozen=True)
class Knobs:
    """The profile's knobs the tables name (from the profile stored with the run); "" where it has none."""

    hypervisor: str = ""
    bus: str = ""
    backing: str = ""
    volume: str = ""
    nic: str = ""
    vhost: bool = False
    mtu: int | None = None
    memory_mib: int | None = None  # the guest's RAM
    disks: int = 1  # disk.count
    raid: str = "none"
    chunk_kib: int | None = None
    attach: str = "host"  # who attached a network volume
    xen_type: str = ""  # guest.xen_type: pv, pvh, hvm; "" or auto where the bus decides
    nfs_vers: str = ""  # an NFS export's [nfs] mount: version and writes (async | sync)
    nfs_writes: str = ""
    raid_on: str = "guest"  # who built the RAID: the guest or the host


def knobs(run: Run) -> Knobs:
    """The knobs of the run's stored profile."""
    return _knobs(run.profile_toml or "")


@functools.lru_cache(maxsize=256)
def _knobs(profile_toml: str) -> Knobs:
    """Each knob read on its own: a partial or older profile leaves the rest empty rather than losing them all."""
    try:
        data = tomllib.loads(profile_toml)
    except tomllib.TOMLDecodeError:
        data = {}

    def get(table: str, key: str, kind: type) -> Any:
        section = data.get(table)
        value = section.get(key) if isinstance(section, dict) else None
        return value if isinstance(value, kind) and not (kind is int and isinstance(value, bool)) else None

    return Knobs(get("guest", "hypervisor", str) or "", get("disk", "bus", str) or "",
                 get("disk", "backing", str) or "", get("disk", "volume", str) or "",
                 get("network", "model", str) or "", bool(get("network", "vhost", bool)), get("network", "mtu", int),
                 get("guest", "memory_mib", int), get("disk", "count", int) or 1, get("disk", "raid", str) or "none",
                 get("disk", "chunk_kib", int), get("disk", "attach", str) or "host",
                 get("guest", "xen_type", str) or "", get("nfs", "vers", str) or "4.2",
                 get("nfs", "writes", str) or "async", get("disk", "raid_on", str) or "guest")


def vmm_label(run: Run) -> str:
    """'KVM', 'Xen (PV)', 'Xen (PVH)', 'KVM (TCG, emulated)', 'KVM (nested, emulated)', 'Xen (HVM, emulated)'..."""
    k = knobs(run)
    hyp = k.hypervisor or ("xen" if run.accelerator == "xen" else "kvm")
    base = {"kvm": "KVM", "xen": "Xen", "qemu": "QEMU"}.get(hyp.lower(), hyp)
    quals = []
    if hyp.lower() == "xen":
        quals.append(k.xen_type.upper() if k.xen_type in ("pv", "pvh", "hvm") else
                     "PV" if k.bus == "xen-vbd" else "HVM")
    if run.accelerator == "tcg":
        quals.append("TCG")
    elif run.accelerator == "nested-kvm":
        quals.append("nested")
    if run.emulated:
        quals.append("emulated")
    return f"{base} ({', '.join(quals)})" if quals else base


def backing_kind(run: Run) -> str:
    """The backing store the run prepared (provenance), else the one its profile asked for."""
    b = run.provenance.backing
    return b.kind if b is not None else knobs(run).backing


def target_label(run: Run) -> str:
    """'local file', 'local disk', 'EBS (AoE)', 'NFS'..."""
    kind = backing_kind(run)
    if kind == "network-volume":
        volume = knobs(run).volume
        scheme = volume.split(":", 1)[0] if ":" in volume else ""
        if scheme == "nfs":  # a shared file system, not an EBS-like block volume
            return "NFS"
        if scheme in _VOLUME_SCHEMES:
            return f"EBS ({_VOLUME_SCHEMES[scheme]})"
    return _TARGETS.get(kind, kind.replace("-", " ") if kind else "?")


def mix_of(run: Run) -> list[tuple[str, Knobs]]:
    """A mixed run's profiles (name, knobs), in the order its guests took them; [] for a run of one profile."""
    g = run.provenance.guests
    if g is None or not g.profiles:
        return []
    order = dict.fromkeys([x.profile for x in g.guests if x.profile in g.profiles] + sorted(g.profiles))
    return [(name, _knobs(g.profiles[name])) for name in order]


def _bus(k: Knobs) -> str:
    return _BUSES.get(k.bus.lower(), k.bus.lower()) or "?"


def bus_label(run: Run) -> str:
    """The guest's disk bus; a mixed run's buses, each once ('virtio-blk / IDE')."""
    mix = mix_of(run)
    return " / ".join(dict.fromkeys(_bus(k) for _, k in mix)) if mix else _bus(knobs(run))


def driver_label(run: Run) -> str:
    """'<bus>, <backing>', e.g. 'scsi-lsi, sparse file' or 'virtio-blk, phy' (whole device or volume); a RAID
    says so first: 'RAID 0 (64 KiB) over 3 x virtio-blk, pre-allocated file'."""
    kind = backing_kind(run)
    backing = _BACKINGS.get(kind, kind.replace("-", " ") or "?")
    k = knobs(run)
    if kind == "network-volume" and k.attach != "host":
        scheme = _VOLUME_SCHEMES.get(k.volume.split(":", 1)[0], "volume")
        if k.attach == "guest":  # no disk on a bus: the guest reaches the volume through its NIC
            nic = {"virtio": "virtio-net", "xen-netfront": "netfront"}.get(k.nic, k.nic) or "?"
            if k.volume.startswith("nfs:"):
                return f"{nic} NIC, the guest's NFSv{k.nfs_vers} client ({k.nfs_writes})"
            return f"{nic} NIC, the guest's {scheme} initiator"
        backing = f"QEMU's {scheme} client"
    if k.raid != "none":
        chunk = f" ({k.chunk_kib} KiB)" if k.chunk_kib else ""
        if k.raid_on == "host":
            return f"{bus_label(run)}, the host's RAID {k.raid}{chunk} over {k.disks} loop devices"
        return f"RAID {k.raid}{chunk} over {k.disks} x {bus_label(run)}, {backing}"
    return f"{bus_label(run)}, {backing}"


def _volume_baseline_driver(run: Run, labels: Iterable[str] = ()) -> str:
    """How the host domain reached a network volume for the baseline: 'NBD, fio nbd engine (user space)'."""
    scheme = knobs(run).volume.split(":", 1)[0]
    if HOST_INITIATOR_LABEL in labels:  # the same device the guest was handed (Study A's "EBS from dom0")
        return f"{_VOLUME_SCHEMES.get(scheme, scheme or '?')}, the host's kernel initiator"
    if scheme == "nbd":
        return "NBD, fio nbd engine (user space)"
    if scheme == "iscsi":  # a test's rows say which reader measured it
        return ("iSCSI, libiscsi's iscsi-perf (user space)" if "iscsi-perf" in labels else
                "iSCSI, QEMU's libiscsi via qemu-nbd, fio nbd engine (user space)")
    if scheme == "nfs":  # a back-end's host on the front-end's export
        return f"NFSv{knobs(run).nfs_vers}, the host's kernel client ({knobs(run).nfs_writes})"
    return f"{_VOLUME_SCHEMES.get(scheme, scheme or '?')}, host initiator"


def _nic_model(k: Knobs) -> str:
    model = {"virtio": "virtio-net", "xen-netfront": "netfront"}.get(k.nic, k.nic)
    return (model or "?") + (" (vhost)" if k.vhost else "")


def _nic(run: Run) -> str:
    """The guest's NIC model and MTU; a mixed run's models, each once."""
    k, mix = knobs(run), mix_of(run)
    parts = [" / ".join(dict.fromkeys(_nic_model(x) for _, x in mix)) if mix else _nic_model(k)]
    if k.mtu:
        parts.append(f"MTU {k.mtu}")
    return ", ".join(parts)


def _net_target(run: Run, measurements: Sequence[Measurement]) -> str:
    if any(m.test.endswith(FRONTEND_SUFFIX) for m in measurements):
        return "front-end"
    if any("loopback" in m.labels for m in measurements):
        return "loopback"
    if any("veth-netns" in m.labels for m in measurements):
        return "own host"
    return "peer host"


# --------------------------------------------------------------------------------------------------
# Building the table
# --------------------------------------------------------------------------------------------------


def _columns(test: str, metric: str) -> list[Column]:
    head = [
        Column("run", "run", "run"),
        Column("vmm", "VMM", "VMM"),
        Column("target", "target", "target"),
        Column("driver", "driver", "driver"),
        Column("value", metric, metric, True),
    ]
    if is_storage_test(test):
        return head + [
            Column("pct", "% of bare metal", "% bare", True),
            Column("avgrq", "avgrq (sectors)", "avgrq", True),
            Column("avgqu", "avgqu", "avgqu", True),
            Column("util", "util %", "util", True),
        ]
    return head + [Column("pct", "% of baseline", "% base", True)]


def _mean(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def percent_of_baseline(run: Run, test: str, metric: str) -> float | None:
    """guest / baseline * 100, both from this run; None if either is missing or baseline is 0."""
    g = run.value("guest", test, metric)
    b = run.value("baseline", test, metric)
    if g is None or not b:
        return None
    return g / b * 100.0


def _host_cells(m: Measurement | None) -> dict[str, float | None]:
    if m is None:
        return {"avgrq": None, "avgqu": None, "util": None}
    return {"avgrq": m.host_avgrq_sectors, "avgqu": m.host_avgqu, "util": m.host_util}


def _legend(r: Run) -> str:
    acc = {"tcg": "TCG (emulated)", "nested-kvm": "nested KVM"}.get(r.accelerator or "", r.accelerator or "?")
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.started_at)) if r.started_at else "?"
    n = guest_count(r)
    many = f", {n} guests at once ({_rows_note(r)}; bare metal: {n} processes)" if n > 1 else ""
    return (f"run #{r.id}: profile {r.profile_name or '?'}, suite {r.suite or '?'}, {r.size_label or '?'} size, "
            f"{acc}{many}, {when}, {r.state}")


def _rows_note(r: Run) -> str:
    """What the first row of a run of N guests holds: the guests' sum, or an MPI job's own aggregate (IOR's)."""
    mpi = {base_test(m.test) in MPI_TESTS for m in r.measurements}
    fio = any(base_test(m.test) in FIO_CS_TESTS for m in r.measurements)
    if mpi == {True}:
        return "rows: the MPI job's aggregate, then each rank"
    if True in mpi:
        return "rows: their sum (an MPI job: its aggregate), then each guest or rank"
    if fio:
        return "rows: their sum (fio --client: its aggregate over the servers), then each guest"
    return "rows: their sum, then each guest"


def guest_count(r: Run) -> int:
    """The guests the run ran at once (1 for a run of one guest)."""
    g = r.provenance.guests
    return g.count if g is not None else 1


def guest_profiles(r: Run) -> dict[int, str]:
    """A mixed run's guests' profiles by instance number (1-based); {} for a run of one profile."""
    g = r.provenance.guests
    if g is None or not g.profiles:
        return {}
    return {k: x.profile for k, x in enumerate(g.guests, 1) if x.profile}


def instance_rows(r: Run, side: str, test: str, metric: str, storage: bool) -> list[Row]:
    """A run of N guests: one row per guest (side guest) or bare-metal process (side baseline), under its sum; a
    mixed run's guest rows name each guest's profile."""
    out = []
    mixed = guest_profiles(r) if side == "guest" else {}
    for m in r.instances(side, test, metric):
        row = Row(kind=side, run_ids=[r.id],
                  cells={"run": f"#{r.id} {'g' if side == 'guest' else 'p'}{m.instance}",
                         "vmm": "",
                         "target": "", "driver": mixed.get(m.instance or 0, ""), "value": m.value, "pct": None},
                  emulated=r.emulated and side == "guest")
        if storage:
            row.cells.update(avgrq=None, avgqu=None, util=None)
        out.append(row)
    return out


def spread_note(r: Run, test: str, metric: str) -> str | None:
    """A run of N guests: how `test`'s figure split among them (core.record.fairness), and the guests' start skew."""
    guests = r.instances("guest", test, metric)
    if not guests:
        return None
    g = spread([m.value for m in guests])
    if base_test(test) in JOB_TESTS:  # one job: its own aggregate, each rank timed over its own share
        job = r.measurement("guest", test, metric)
        mpi = base_test(test) in MPI_TESTS
        one = "one MPI job, a rank" if mpi else "one fio --client job, a fio --server"
        note = (f"#{r.id} {test}: {one} in each of {g.n} guests, "
                f"{'-' if job is None else f'{job.value:.1f}'} {metric} (all bytes over the job's time); per "
                f"{'rank' if mpi else 'server'} "
                f"(over its own time) min {g.min:.1f} / median {g.median:.1f} / max {g.max:.1f}; Jain's fairness "
                f"index {g.jain:.3f}")
    else:
        note = (f"#{r.id} {test}: {g.n} guests, sum {g.total:.1f} {metric}; per guest min {g.min:.1f} / median "
                f"{g.median:.1f} / max {g.max:.1f}; Jain's fairness index {g.jain:.3f}")
    mixed = guest_profiles(r)
    if mixed and base_test(test) not in JOB_TESTS:
        by: dict[str, list[float]] = {}
        for m in guests:
            by.setdefault(mixed.get(m.instance or 0, "?"), []).append(m.value)
        note += "; by profile: " + ", ".join(f"{name} {statistics.median(v):.1f}"
                                             + (f" (median of {len(v)})" if len(v) > 1 else "")
                                             for name, v in by.items())
    info = r.provenance.guests
    if info is not None and test in info.skew_s:
        note += f"; start skew {info.skew_s[test] * 1000:.0f} ms"
    base = r.instances("baseline", test, metric)
    if base:
        b = spread([m.value for m in base])
        if base_test(test) in MPI_TESTS:
            job = r.measurement("baseline", test, metric)
            note += (f". Bare metal, one job of {b.n} ranks: {'-' if job is None else f'{job.value:.1f}'}, per rank "
                     f"min {b.min:.1f} / median {b.median:.1f} / max {b.max:.1f}, Jain {b.jain:.3f}")
        else:
            note += (f". Bare metal, {b.n} processes: sum {b.total:.1f}, min {b.min:.1f} / median {b.median:.1f} / "
                     f"max {b.max:.1f}, Jain {b.jain:.3f}")
    return note


def compare_table(runs: Sequence[Run], title: str | None = None) -> Table:
    """The Table 1/2 layout for these runs (order kept within each node/target group)."""
    runs = list(runs)
    table = Table(
        title=title or ("Run " if len(runs) == 1 else "Runs ") + ", ".join(f"#{r.id}" for r in runs),
        run_ids=[r.id for r in runs],
        legend=[_legend(r) for r in runs],
    )
    tests: dict[str, None] = {}
    for r in runs:
        for t in r.tests():
            tests.setdefault(t, None)
    any_emulated = False
    any_nested = False
    mean_baselines: list[str] = []
    caveats: dict[int, set[str]] = {}
    spreads: list[str] = []

    for test in sorted(tests, key=test_sort_key):
        metrics = [m.metric for r in runs for m in r.measurements if m.test == test]
        # an MPI job's read phase is a figure of its own (its write is the primary)
        for metric in [primary_metric(test, metrics), *(["read MB/s"] if base_test(test) in MPI_TESTS else [])]:
            section = Section(test, test_title(test) + (" - the read job" if metric == "read MB/s" else ""), metric,
                              _columns(test, metric))
            storage = is_storage_test(test)
            groups: dict[tuple[str, str, str, int], list[Run]] = {}
            for r in runs:
                if r.measurement("guest", test, metric) or r.measurement("baseline", test, metric):
                    ms = [m for m in r.measurements if m.test == test]
                    target = target_label(r) if storage else _net_target(r, ms)
                    bm = r.measurement("baseline", test, metric)
                    host = "dom0" if bm is not None and "dom0" in bm.labels else "none"
                    # a baseline of N processes is never averaged with one of another N
                    groups.setdefault((r.node or "", target, host, guest_count(r)), []).append(r)
            for (_node, target, host, n), members in groups.items():
                bases: list[tuple[Run, Measurement]] = []
                for r in members:
                    bm = r.measurement("baseline", test, metric)
                    if bm is not None:
                        bases.append((r, bm))
                if bases:
                    agg = "job" if base_test(test) in MPI_TESTS else "sum"  # fio --client's bare metal: N processes
                    ms_b = [m for _, m in bases]
                    from_host = storage and any(VOLUME_BASELINE_LABEL in m.labels for m in ms_b)
                    row = Row(
                        kind="baseline",
                        run_ids=[r.id for r, _ in bases],
                        cells={
                            "run": ",".join(f"#{r.id}" for r, _ in bases) + (f" {agg}" if n > 1 else ""),
                            "vmm": host if host != "none" else ("host domain" if from_host else "none"),
                            "target": target,
                            "driver": _volume_baseline_driver(bases[0][0], {lab for m in ms_b for lab in m.labels})
                            if from_host else
                            ("the export's directory, no NFS" if storage and any(NFS_BASELINE_LABEL in m.labels
                                                                                  for m in ms_b) else "-"),
                            "value": _mean(m.value for m in ms_b),
                            "pct": None,
                        },
                        labels=sorted({lab for m in ms_b for lab in m.labels if lab != "emulated"}),
                    )
                    if storage:
                        row.cells.update(
                            avgrq=_mean(m.host_avgrq_sectors for m in ms_b),
                            avgqu=_mean(m.host_avgqu for m in ms_b),
                            util=_mean(m.host_util for m in ms_b),
                        )
                    if len(bases) > 1:
                        row.markers.append(MEAN_BASELINE_MARK)
                        note = (
                            f"{MEAN_BASELINE_MARK} bare-metal row of {', '.join(f'#{r.id}' for r, _ in bases)}: "
                            "mean of those runs' own baselines; each run's % uses its own baseline"
                        )
                        if note not in mean_baselines:
                            mean_baselines.append(note)
                    section.rows.append(row)
                    for r, _ in bases:
                        section.rows += instance_rows(r, "baseline", test, metric, storage)
                for r in members:
                    m = r.measurement("guest", test, metric)
                    if m is None:
                        continue
                    row = Row(
                        kind="guest",
                        run_ids=[r.id],
                        cells={
                            "run": f"#{r.id}",
                            "vmm": vmm_label(r),
                            "target": target,
                            "driver": driver_label(r) if storage else _nic(r),
                            "value": m.value,
                            "pct": percent_of_baseline(r, test, metric),
                        },
                        emulated=r.emulated,
                        labels=[lab for lab in m.labels if lab != "emulated"],
                    )
                    if storage:
                        row.cells.update(_host_cells(m))
                    if r.emulated:
                        row.markers.append(EMULATED_MARK)
                        any_emulated = True
                        any_nested = any_nested or r.accelerator == "nested-kvm"
                    cav = [lab for lab in m.labels if lab in CAVEAT_LABELS]
                    if cav:
                        row.markers.append(CAVEAT_MARK)
                        caveats.setdefault(r.id, set()).update(cav)
                    if guest_count(r) > 1:
                        row.cells["run"] = f"#{r.id} {'job' if base_test(test) in JOB_TESTS else 'sum'}"
                    section.rows.append(row)
                    section.rows += instance_rows(r, "guest", test, metric, storage)
                    if (spread_line := spread_note(r, test, metric)) is not None:
                        spreads.append(spread_line)
            if section.rows:
                table.sections.append(section)

    if any_emulated:
        table.footnotes.append(NESTED_NOTE if any_nested else EMULATED_NOTE)
    table.footnotes.extend(mean_baselines)
    table.footnotes.extend(spreads)
    if caveats:
        table.footnotes.append(_caveat_note(caveats))
    return table


def _caveat_note(caveats: dict[int, set[str]]) -> str:
    """The footnote naming each run's caveats and what each means."""
    present = set().union(*caveats.values())
    return (f"{CAVEAT_MARK} caveats: "
            + "; ".join(f"#{rid}: {', '.join(sorted(labs))}" for rid, labs in sorted(caveats.items()))
            + " (" + "; ".join(f"{lab}: {CAVEAT_LABELS[lab]}" for lab in CAVEAT_LABELS if lab in present) + ")")


def guest_sweep_table(runs: Sequence[Run]) -> Table:
    """Runs of 1, 2, 4... guests side by side, per test: the guests' sum, each guest's min/median/max, Jain's index,
    the start skew, the sum as % of bare metal with the same number of processes, and the host disk's queue."""
    runs = list(runs)
    table = Table(title="Guests at once: runs " + ", ".join(f"#{r.id}" for r in runs), run_ids=[r.id for r in runs],
                  legend=[_legend(r) for r in runs])
    tests: dict[str, None] = {}
    for r in runs:
        for t in r.tests("guest"):
            tests.setdefault(t, None)
    any_emulated = False
    caveats: dict[int, set[str]] = {}
    for test in sorted(tests, key=test_sort_key):
        metric = primary_metric(test, [m.metric for r in runs for m in r.measurements if m.test == test])
        agg = "job" if base_test(test) in JOB_TESTS else "sum"  # a job's own aggregate, not its ranks' sum
        columns = [Column("run", "run", "run"), Column("guests", "guests", "N", True),
                   Column("value", f"{agg} {metric}", f"{agg} {metric}", True), Column("min", "min", "min", True),
                   Column("median", "median", "median", True), Column("max", "max", "max", True),
                   Column("jain", "Jain's index", "Jain", True), Column("skew", "start skew ms", "skew ms", True),
                   Column("base", f"bare metal {metric}", "bare", True),
                   Column("pct", "% of bare metal", "% bare", True),
                   Column("avgqu", "avgqu", "avgqu", True), Column("util", "util %", "util", True)]
        section = Section(test, test_title(test), metric, columns)
        for r in runs:
            total = r.measurement("guest", test, metric)
            if total is None:
                continue
            each = r.instances("guest", test, metric) or [total]
            g = spread([m.value for m in each])
            info = r.provenance.guests
            skew = info.skew_s.get(test) if info is not None else None
            row = Row(kind="guest", run_ids=[r.id], emulated=r.emulated,
                      cells={"run": f"#{r.id}", "guests": guest_count(r), "value": total.value, "min": g.min,
                             "median": g.median, "max": g.max, "jain": g.jain,
                             "skew": None if skew is None else skew * 1000,
                             "base": r.value("baseline", test, metric), "pct": percent_of_baseline(r, test, metric),
                             "avgqu": total.host_avgqu, "util": total.host_util},
                      labels=[lab for lab in total.labels if lab != "emulated"])
            if r.emulated:
                row.cells["run"] += f" {EMULATED_MARK}"
                any_emulated = True
            if cav := [lab for lab in total.labels if lab in CAVEAT_LABELS]:
                row.cells["run"] += f" {CAVEAT_MARK}"
                caveats.setdefault(r.id, set()).update(cav)
            section.rows.append(row)
        if section.rows:
            table.sections.append(section)
    if any_emulated:
        table.footnotes.append(EMULATED_NOTE)
    if caveats:
        table.footnotes.append(_caveat_note(caveats))
    return table


# --------------------------------------------------------------------------------------------------
# Renderers
# --------------------------------------------------------------------------------------------------


def _fmt(key: str, value: Any, metric: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    v = float(value)
    if key == "pct":
        return f"{v:.1f}%"
    if key == "util":
        return f"{v:.0f}%"
    if key == "avgrq":
        return f"{v:.0f}" if v >= 10 else f"{v:.1f}"
    if key == "avgqu":
        return f"{v:.2f}" if v < 10 else (f"{v:.1f}" if v < 100 else f"{v:.0f}")
    if key == "jain":
        return f"{v:.3f}"
    if key in ("skew", "guests"):
        return f"{v:.0f}"
    if key in ("value", "min", "median", "max", "base"):
        if metric in ("IOPS", "Mbit/s", "trans/s"):
            return f"{v:.0f}"
        return f"{v:.1f}"
    return f"{v:g}"


def _display(section: Section, row: Row) -> list[str]:
    out = []
    for c in section.columns:
        text = _fmt(c.key, row.cells.get(c.key), section.metric)
        if c.key == "vmm" and row.marker:
            text = f"{text} {row.marker}"
        out.append(text)
    return out


def _fit(widths: list[int], minimums: list[int], wrappable: list[bool], budget: int) -> list[int]:
    widths = list(widths)
    while sum(widths) > budget:
        candidates = [i for i, w in enumerate(widths) if wrappable[i] and w > minimums[i]]
        if not candidates:
            break
        i = max(candidates, key=lambda j: widths[j])
        widths[i] -= 1
    return widths


def _wrap(text: str, width: int) -> list[str]:
    return textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False) or [""]


def _text_row(
    cells: list[str], columns: list[Column], widths: list[int], wrappable: list[bool], gap: str
) -> list[str]:
    wrapped = [_wrap(cells[i], widths[i]) if wrappable[i] else [cells[i]] for i in range(len(cells))]
    out = []
    for k in range(max(len(w) for w in wrapped)):
        parts = []
        for i, c in enumerate(columns):
            s = wrapped[i][k] if k < len(wrapped[i]) else ""
            parts.append(s.rjust(widths[i]) if c.numeric else s.ljust(widths[i]))
        out.append(gap.join(parts).rstrip())
    return out


def to_text(table: Table, width: int = 80) -> str:
    """Fixed-width text; the VMM/target/driver columns wrap onto extra lines to keep within `width`."""
    lines = [table.title, "=" * min(len(table.title), width)]
    for entry in table.legend:
        lines.extend(textwrap.wrap(entry, width, subsequent_indent="    ", break_on_hyphens=False) or [entry])
    if not table.sections:
        lines.append("(no measurements)")
    gap = "  "
    for section in table.sections:
        header = [c.short for c in section.columns]
        body = [_display(section, r) for r in section.rows]
        ncol = len(header)
        natural = [max(len(x) for x in [header[i], *(b[i] for b in body)]) for i in range(ncol)]
        wrappable = [c.key in ("vmm", "target", "driver") for c in section.columns]
        minimums = [
            max([len(w) for x in [header[i], *(b[i] for b in body)] for w in x.split()] or [1])
            if wrappable[i] else natural[i]
            for i in range(ncol)
        ]
        budget = width - len(gap) * (ncol - 1)
        widths = _fit(natural, minimums, wrappable, budget)
        # a wrapped column only needs its longest wrapped line; spend what that frees on unwrapping others
        for i in range(ncol):
            if wrappable[i] and widths[i] < natural[i]:
                widths[i] = max(
                    len(line) for x in [header[i], *(b[i] for b in body)] for line in _wrap(x, widths[i])
                )
        for i in sorted(range(ncol), key=lambda j: natural[j] - widths[j]):
            slack = budget - sum(widths)
            if wrappable[i] and 0 < natural[i] - widths[i] <= slack:
                widths[i] = natural[i]
        lines.append("")
        lines.extend(textwrap.wrap(section.title, width, break_on_hyphens=False) or [section.title])

        lines.extend(_text_row(header, section.columns, widths, wrappable, gap))
        lines.append(gap.join("-" * w for w in widths))
        for b in body:
            lines.extend(_text_row(b, section.columns, widths, wrappable, gap))
    if table.footnotes:
        lines.append("")
        for note in table.footnotes:
            lines.extend(textwrap.wrap(note, width, subsequent_indent="  ", break_on_hyphens=False) or [note])
    return "\n".join(lines) + "\n"


def _md_escape(text: str) -> str:
    return re.sub(r"([|*_\\`^+])", r"\\\1", text)


def to_markdown(table: Table) -> str:
    """GitHub-flavoured markdown: a heading and a pipe table per section, footnotes last."""
    out = [f"## {_md_escape(table.title)}", ""]
    if table.legend:
        out += [f"- {_md_escape(entry)}" for entry in table.legend] + [""]
    if not table.sections:
        out += ["(no measurements)", ""]
    for section in table.sections:
        out += [f"### {_md_escape(section.title)}", ""]
        out.append("| " + " | ".join(_md_escape(c.title) for c in section.columns) + " |")
        out.append("|" + "|".join("---:" if c.numeric else "---" for c in section.columns) + "|")
        for row in section.rows:
            out.append("| " + " | ".join(_md_escape(x) for x in _display(section, row)) + " |")
        out.append("")
    for note in table.footnotes:
        out += [_md_escape(note), ""]
    return "\n".join(out).rstrip("\n") + "\n"


CSV_FIELDS = (
    "test", "metric", "row", "run", "vmm", "target", "driver", "value", "pct_of_baseline",
    "avgrq_sectors", "avgqu", "util_pct", "emulated", "marker", "labels", "note",
)


def _num(v: Any, digits: int = 3) -> str:
    if v is None:
        return ""
    return str(round(float(v), digits))


def to_csv(table: Table) -> str:
    """One rectangular CSV (header CSV_FIELDS) of every section's rows; numbers unformatted.
    Emulated rows carry marker '*' and the footnote text in `note`."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_FIELDS)
    notes = {n[0]: n for n in table.footnotes}
    for s in table.sections:
        for r in s.rows:
            c = r.cells
            w.writerow([
                s.test, s.metric, r.kind, c.get("run"), c.get("vmm"), c.get("target"), c.get("driver"),
                _num(c.get("value")), _num(c.get("pct"), 2), _num(c.get("avgrq"), 1), _num(c.get("avgqu"), 2),
                _num(c.get("util"), 1), "yes" if r.emulated else "no", r.marker, " ".join(r.labels),
                " | ".join(notes[m] for m in r.markers if m in notes),
            ])
    return buf.getvalue()


def run_summary(run: Run) -> dict[str, Any]:
    """Headline numbers for list views: sequential write/read MB/s with % of this run's baseline,
    TCP stream Mbit/s. Missing numbers are None; 'emulated' says how to label them."""

    def pick(candidates: Sequence[str], metric: str) -> tuple[str | None, float | None, float | None]:
        for t in candidates:
            v = run.value("guest", t, metric)
            if v is not None:
                return t, v, percent_of_baseline(run, t, metric)
        return None, None, None

    wt, wv, wp = pick(("seq-write-64k", "dd-write-64k", "seq-write-1m", "rec-write-1m"), "MB/s")
    rt, rv, rp = pick(("seq-read-64k", "dd-read-64k", "seq-read-1m", "rec-read-1m"), "MB/s")
    nt, nv, np_ = pick(("tcp-stream", "iperf3-tx"), "Mbit/s")
    return {
        "id": run.id,
        "uuid": run.uuid,
        "profile": run.profile_name,
        "state": run.state,
        "reason": run.reason,
        "suite": run.suite,
        "size_label": run.size_label,
        "accelerator": run.accelerator,
        "emulated": run.emulated,
        "vmm": vmm_label(run),
        "node": run.node,
        "started_at": run.started_at,
        "duration": run.duration,
        "seq_write_test": wt,
        "seq_write_mbps": wv,
        "seq_write_pct": wp,
        "seq_read_test": rt,
        "seq_read_mbps": rv,
        "seq_read_pct": rp,
        "tcp_stream_test": nt,
        "tcp_stream_mbits": nv,
        "tcp_stream_pct": np_,
    }


def to_json(runs: Sequence[Run], raw: bool = False, indent: int | None = 2) -> str:
    """Whole runs (profile TOML, provenance, every measurement; raw tool output if raw=True)."""
    doc = {
        "format": JSON_FORMAT,
        "version": JSON_VERSION,
        "exported_at": time.time(),
        "runs": [dict(r.as_dict(raw=raw), summary=run_summary(r)) for r in runs],
    }
    return json.dumps(doc, indent=indent, sort_keys=False, default=str) + "\n"
