"""Where a guest runs on this host: its [placement] table resolved against the host's CPUs and NUMA nodes.

`Topology.read()` is the host's NUMA nodes and their online CPUs (sysfs), each node's CPUs in pinning order (the
first thread of every core before the cores' second threads, so vCPUs get whole cores first). `resolve()` turns a
profile's placement into `HostPlacement`: the concrete cpuset of each vCPU, of QEMU's own threads and of the
iothreads, the host nodes its RAM is bound to, the huge page size and the guest's NUMA nodes, which
core.virt.domain writes as <cputune>, <numatune>, <memoryBacking> and <cpu><numa>. `auto` is chosen here: the
vCPUs take CPUs of their own on the node with the most CPUs (guest k of a run of N the next ones), QEMU's threads
and the iothreads that node's other CPUs (or the whole node when the vCPUs take every one), the RAM the vCPUs'
node. What the host cannot give is a `PlacementRefused` with the arithmetic, raised before the run makes anything.
`observed()` reads back what the host really did with a running guest: each thread's affinity and where its RAM
sits (`/proc/<pid>/task/*/status`, `/proc/<pid>/numa_maps`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import CloudboxError
from ..spec.iopaths import AUTO, HUGEPAGE_MIB, Placement
from ..spec.knobs import cpu_list, cpu_sequence

SYSFS = Path("/sys/devices/system")


class PlacementRefused(CloudboxError):
    """This host cannot place the guest as its profile asks (a CPU or node it lacks, too few CPUs for auto)."""


def cpuset(cpus: list[int] | tuple[int, ...]) -> str:
    """CPUs as libvirt's and the kernel's list form, ranges joined: [0, 1, 2, 5] -> "0-2,5"."""
    out: list[str] = []
    ordered = sorted(set(cpus))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


@dataclass(frozen=True)
class Topology:
    """The host's NUMA nodes: node -> its online CPUs in pinning order (first threads of the cores first)."""

    nodes: dict[int, tuple[int, ...]]

    @classmethod
    def read(cls, root: Path = SYSFS) -> Topology:
        """This host's nodes from sysfs; a kernel without NUMA is one node 0 holding every online CPU."""
        online = set(cpu_list(_read(root / "cpu" / "online") or "0"))
        nodes: dict[int, tuple[int, ...]] = {}
        for d in sorted(root.glob("node/node[0-9]*"), key=lambda p: int(p.name[4:])):
            cpus = [c for c in cpu_list(_read(d / "cpulist")) if c in online]
            if cpus:
                nodes[int(d.name[4:])] = _pinning_order(root, cpus)
        return cls(nodes or {0: _pinning_order(root, sorted(online))})

    @property
    def cpus(self) -> list[int]:
        return sorted(c for cpus in self.nodes.values() for c in cpus)

    def node_of(self, cpu: int) -> int | None:
        return next((n for n, cpus in self.nodes.items() if cpu in cpus), None)

    def largest(self) -> int:
        """The node with the most CPUs (the lowest numbered of equals): where auto places a guest."""
        return max(self.nodes, key=lambda n: (len(self.nodes[n]), -n))

    def describe(self) -> str:
        return "; ".join(f"node {n}: CPUs {cpuset(list(c))}" for n, c in sorted(self.nodes.items()))


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _pinning_order(root: Path, cpus: list[int]) -> tuple[int, ...]:
    """`cpus` with each core's first thread before any core's second: vCPUs pinned in this order get whole cores
    while there are enough of them."""
    seen: dict[str, int] = {}
    rank: dict[int, tuple[int, int]] = {}
    for c in cpus:
        topo = root / "cpu" / f"cpu{c}" / "topology"
        core = f"{_read(topo / 'physical_package_id')}/{_read(topo / 'core_id')}" if topo.is_dir() else str(c)
        seen[core] = seen.get(core, -1) + 1
        rank[c] = (seen[core], c)
    return tuple(sorted(cpus, key=lambda c: rank[c]))


@dataclass(frozen=True)
class HostPlacement:
    """A guest's placement on this host, as core.virt.domain writes it: each vCPU's cpuset (empty: not pinned),
    QEMU's own threads' and the iothreads' cpusets, the host nodes holding its RAM and how, the huge page size
    (KiB, 0: the host's base pages) and the guest's own NUMA nodes."""

    vcpus: tuple[str, ...] = ()
    emulator: str = ""
    iothreads: str = ""
    memory_nodes: str = ""
    memory_mode: str = "strict"
    hugepage_kib: int = 0
    guest_nodes: int = 1

    @property
    def pinned(self) -> bool:
        return any(self.vcpus) or bool(self.emulator or self.iothreads)

    def words(self) -> str:
        """For the run's log: "vCPUs on 0, 1; emulator on 0-1; RAM strict on node 0 in 2048 KiB pages"."""
        out = []
        if any(self.vcpus):
            out.append("vCPUs on " + ", ".join(v or "any" for v in self.vcpus))
        for what, cpus in (("QEMU's threads", self.emulator), ("iothreads", self.iothreads)):
            if cpus:
                out.append(f"{what} on {cpus}")
        if self.memory_nodes:
            out.append(f"RAM {self.memory_mode} on node {self.memory_nodes}")
        if self.hugepage_kib:
            out.append(f"RAM in {_page_words(self.hugepage_kib)} huge pages")
        if self.guest_nodes > 1:
            out.append(f"{self.guest_nodes} guest NUMA nodes")
        return "; ".join(out) or "as the host's scheduler places it"


def _page_words(kib: int) -> str:
    return f"{kib // 1024} MiB" if kib < 1024 * 1024 else f"{kib // (1024 * 1024)} GiB"


def hugepage_kib(placement: Placement) -> int:
    """The huge page size a placement asks for, in KiB; 0 for the host's base pages."""
    return HUGEPAGE_MIB.get(placement.hugepages, 0) * 1024


def resolve(placement: Placement, vcpus: int, topo: Topology, *, guest: int = 0, profile: str = "") -> HostPlacement:
    """`placement` on `topo` for guest `guest` (0-based) of a run: explicit lists checked against the host, auto
    chosen; a PlacementRefused naming the key, the host's CPUs or nodes and the arithmetic when it cannot be."""
    who = f"profile {profile}: " if profile else ""
    node_cpus: tuple[int, ...] = ()
    vcpu_sets: tuple[str, ...] = ()
    taken: list[int] = []
    if placement.vcpu_pin == AUTO:
        node = topo.largest()
        node_cpus = topo.nodes[node]
        first = guest * vcpus
        if first + vcpus > len(node_cpus):
            need = f"{first + vcpus} CPUs for guests 1..{guest + 1}" if guest else f"{vcpus} CPUs"
            raise PlacementRefused(
                f"{who}placement.vcpu_pin = auto gives each vCPU a CPU of its own on one NUMA node: {vcpus} vCPU"
                f"{'s' if vcpus > 1 else ''} per guest need {need}, and this host's largest node has "
                f"{len(node_cpus)} ({topo.describe()}); allowed: fewer vCPUs or guests, or an explicit list (CPUs "
                "may then be shared)")
        taken = list(node_cpus[first:first + vcpus])
        vcpu_sets = tuple(str(c) for c in taken)
    elif placement.vcpu_pin:
        cpus = cpu_sequence(placement.vcpu_pin)  # vCPU i on the i-th CPU written
        _check_cpus(who, "placement.vcpu_pin", cpus, topo)
        taken = cpus[:vcpus]
        vcpu_sets = tuple(str(c) for c in taken)
        node_cpus = _nodes_cpus(topo, taken)
    if not node_cpus:  # nothing pinned the vCPUs: auto for QEMU's threads means the largest node
        node_cpus = topo.nodes[topo.largest()]
    rest = [c for c in node_cpus if c not in taken] or list(node_cpus)
    return HostPlacement(
        vcpus=vcpu_sets,
        emulator=_side_pin(who, "placement.emulator_pin", placement.emulator_pin, rest, topo),
        iothreads=_side_pin(who, "placement.iothread_pin", placement.iothread_pin, rest, topo),
        memory_nodes=_memory_nodes(who, placement, taken, topo),
        memory_mode=placement.memory_mode,
        hugepage_kib=hugepage_kib(placement),
        guest_nodes=placement.guest_nodes)


def _nodes_cpus(topo: Topology, cpus: list[int]) -> tuple[int, ...]:
    """Every CPU of the nodes holding `cpus`, in pinning order."""
    nodes = {topo.node_of(c) for c in cpus}
    return tuple(c for n in sorted(x for x in nodes if x is not None) for c in topo.nodes[n])


def _check_cpus(who: str, key: str, cpus: list[int], topo: Topology) -> None:
    missing = [c for c in cpus if topo.node_of(c) is None]
    if missing:
        raise PlacementRefused(f"{who}{key} names CPU{'s' if len(missing) > 1 else ''} {cpuset(missing)}, which "
                               f"this host does not have online; allowed: CPUs {cpuset(topo.cpus)} ({topo.describe()})")


def _side_pin(who: str, key: str, value: str, rest: list[int], topo: Topology) -> str:
    if value == AUTO:
        return cpuset(rest)
    if value:
        _check_cpus(who, key, cpu_list(value), topo)
        return cpuset(cpu_list(value))
    return ""


def _memory_nodes(who: str, placement: Placement, vcpu_cpus: list[int], topo: Topology) -> str:
    if placement.memory_nodes == AUTO:
        return cpuset([n for n in {topo.node_of(c) for c in vcpu_cpus} if n is not None])
    if placement.memory_nodes:
        nodes = cpu_list(placement.memory_nodes)
        missing = [n for n in nodes if n not in topo.nodes]
        if missing:
            raise PlacementRefused(f"{who}placement.memory_nodes names node{'s' if len(missing) > 1 else ''} "
                                   f"{cpuset(missing)}, which this host does not have; allowed: nodes "
                                   f"{cpuset(list(topo.nodes))} ({topo.describe()})")
        return cpuset(nodes)
    return ""


def pool_node(hp: HostPlacement, topo: Topology) -> int | None:
    """The NUMA node whose huge pages a guest's RAM takes: the one node it is strictly bound to on a host of several,
    else None (the whole host's pool)."""
    nodes = cpu_list(hp.memory_nodes)
    return nodes[0] if len(nodes) == 1 and hp.memory_mode == "strict" and len(topo.nodes) > 1 else None


def host_problem(placement: Placement, vcpus: int, memory_mib: int, topo: Topology | None = None) -> str | None:
    """Why this host cannot place one guest as `placement` asks (too few CPUs for auto, a CPU or node it lacks, a
    huge page size its kernel lacks or more huge pages than its memory holds), or None: what a study shows for a
    step it cannot run here, the checks the run makes at its start."""
    from .hugepages import HugePages, HugePagesRefused, pages_for

    topo = topo or Topology.read()
    try:
        hp = resolve(placement, vcpus, topo)
        if not hp.hugepage_kib:
            return None
        pool = HugePages(hp.hugepage_kib, pool_node(hp, topo))
        return pool.shortfall(pages_for(memory_mib, hp.hugepage_kib), f"the guest RAM ({memory_mib} MiB)") or None
    except (PlacementRefused, HugePagesRefused) as e:
        return str(e)


# -- what the host really did ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Observed:
    """A running guest's QEMU as /proc shows it: each thread's name and allowed CPUs, and its RAM's pages per host
    node with their page size and NUMA policy (numa_maps)."""

    threads: dict[str, str]  # "CPU 0/TCG" -> "0"; "qemu-system-x86" -> "0-1"; "IO iothread1" -> "1"
    ram_pages: dict[str, int]  # "N0" -> pages
    ram_page_kib: int
    ram_policy: str  # numa_maps' policy of the RAM's mapping: bind:0, prefer:0, interleave:0-1, default


_NUMA_LINE = re.compile(r"^[0-9a-f]+ (\S+)(.*)$")


def observed(pid: int, proc: Path = Path("/proc")) -> Observed:
    """What the kernel did with QEMU process `pid`: its threads' affinities and its RAM's placement."""
    threads: dict[str, str] = {}
    for task in sorted((proc / str(pid) / "task").glob("[0-9]*"), key=lambda p: int(p.name)):
        name = _read(task / "comm")
        allowed = next((line.split(":", 1)[1].strip() for line in _read(task / "status").splitlines()
                        if line.startswith("Cpus_allowed_list:")), "")
        if name and name not in threads:
            threads[name] = allowed
    maps: list[tuple[bool, int, dict[str, int], int, str]] = []
    for line in _read(proc / str(pid) / "numa_maps").splitlines():
        m = _NUMA_LINE.match(line)
        if not m:
            continue
        fields = dict(f.split("=", 1) for f in m.group(2).split() if "=" in f)
        kib = int(fields.get("kernelpagesize_kB", "4") or 4)
        counted = {k: int(v) for k, v in fields.items() if re.fullmatch(r"N\d+", k) and v.isdigit()}
        maps.append(("memfd:" in line, sum(counted.values()) * kib, counted, kib, m.group(1)))
    # The guest's RAM: its memfd backends (one per guest node) where it has them, else the largest populated
    # anonymous mapping of at least 64 MiB.
    ram = [x for x in maps if x[0]] or sorted((x for x in maps if x[1] >= 64 * 1024), key=lambda x: -x[1])[:1]
    pages: dict[str, int] = {}
    for _memfd, _size, counted, _kib, _policy in ram:
        for node, n in counted.items():
            pages[node] = pages.get(node, 0) + n
    return Observed(threads, pages, ram[0][3] if ram else 0, ram[0][4] if ram else "")
