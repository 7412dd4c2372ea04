"""What the tables call a run and mark its figures with: its VMM, target, driver and NIC (from the profile stored
with it and its provenance), the markers and their notes, and the labels that are caveats.

Markers are text, never colour alone: "*" a figure measured under emulation, "^" a bare-metal row that is the mean
of several runs' own baselines, "+" a figure with a caveat, "~" a figure whose repeated samples vary by more than
stats.CV_FLAG. A repeated figure is shown as its median with its interval and n (figure_text), a ratio with its
interval (ratio_text); the notes say what those are, and that a figure measured once has none.
"""

from __future__ import annotations

import functools
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..record.rows import Measurement, Run
from ..record.stats import CV_FLAG, MIN_N_MEDIAN_CI, Ratio, Summary
from ..spec.catalogue import FRONTEND_SUFFIX
from ..spec.runspec import OVERCOMMIT_LABEL
from ..spec.schemes import SCHEMES

EMULATED_MARK = "*"
MEAN_BASELINE_MARK = "^"
CAVEAT_MARK = "+"
VARIES_MARK = "~"
EMULATED_NOTE = f"{EMULATED_MARK} measured under TCG emulation: not an overhead figure"
NESTED_NOTE = (
    f"{EMULATED_MARK} measured under emulation (TCG, or KVM nested in an emulated host): "
    "not an overhead figure"
)
VARIES_NOTE = (f"{VARIES_MARK} its samples vary by more than {CV_FLAG * 100:.0f}% of their mean (coefficient of "
               "variation): the figure moves from one repeat to the next")
INTERVAL_NOTE = ("[low, high] n=k: the median of k samples with its 95% confidence interval (order statistics); a % "
                 "of bare metal: the guest's samples against its bare metal's (Hodges-Lehmann, 95% rank-sum "
                 "interval), n=guest+bare metal")
FEW_NOTE = f"n=2 to {MIN_N_MEDIAN_CI - 1} without an interval: a median needs {MIN_N_MEDIAN_CI} samples for a 95% one"
RANGE_NOTE = ("[low, high] (67%) or (90%): below 4+4 samples a ratio's interval is the range of every guest / bare "
              "metal pair, which holds the true ratio only that often")
ONCE_NOTE = "n=1: each figure was measured once, so it has no interval"
ONCE_SOME_NOTE = "a figure without n= was measured once (n=1), so it has no interval"


def value_format(metric: str) -> str:
    """How a figure in `metric` is written: whole numbers of IOPS, Mbit/s and trans/s, a decimal of the rest."""
    return "{:.0f}" if metric in ("IOPS", "Mbit/s", "trans/s") else "{:.1f}"


def figure_text(s: Summary, fmt: str = "{:.1f}") -> str:
    """A figure in a table: "74.2 [71.0, 76.9] n=8", "74.2 n=3" below 6 samples (FEW_NOTE), "74.2" measured once."""
    head = fmt.format(s.median)
    if s.n == 1:
        return head
    if s.low is not None and s.high is not None:
        return f"{head} [{fmt.format(s.low)}, {fmt.format(s.high)}] n={s.n}"
    return f"{head} n={s.n}"


def ratio_text(r: Ratio) -> str:
    """A % of bare metal in a table: "96.3% [95.1, 97.2] n=8+8", "[...] (90%) n=3+3" (RANGE_NOTE), "96.3% n=1+3"
    without an interval, "96.3%" when both sides were measured once."""
    if r.n_a == r.n_b == 1:
        return f"{r.percent:.1f}%"
    return r.text().removesuffix(" (no interval)")


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


# --------------------------------------------------------------------------------------------------
# Describing a run's configuration: VMM, target, driver
# --------------------------------------------------------------------------------------------------

# Backing kinds (profiles.Backing) -> the studies' "target" words...
_TARGETS = {
    "sparse-file": "local file", "prealloc-file": "local file", "qcow2": "local file", "qcow2-prealloc": "local file",
    "block-device": "local disk", "network-volume": "EBS", "vhost-user": "local file", "nvme-pci": "local disk",
    "virtiofs": "local file",
}
# ... and the backing half of the studies' "driver" column ("SCSI, sparse file", "virtio/phy").
_BACKINGS = {
    "sparse-file": "sparse file", "prealloc-file": "pre-allocated file", "qcow2": "qcow2 file",
    "qcow2-prealloc": "pre-allocated qcow2", "block-device": "phy", "network-volume": "phy",
    "vhost-user": "vhost-user-blk", "nvme-pci": "VFIO passthrough", "virtiofs": "virtiofs",
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


def _volume_title(scheme: str, default: str) -> str:
    """A block volume scheme's title ('iSCSI'), else `default`."""
    s = SCHEMES.get(scheme)
    return s.title if s is not None and s.block else default


def target_label(run: Run) -> str:
    """'local file', 'local disk', 'EBS (AoE)', 'NFS'..."""
    kind = backing_kind(run)
    if kind == "network-volume":
        volume = knobs(run).volume
        s = SCHEMES.get(volume.split(":", 1)[0]) if ":" in volume else None
        if s is not None:  # a shared file system (NFS) is not an EBS-like block volume
            return f"EBS ({s.title})" if s.block else s.title
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
        scheme = _volume_title(k.volume.split(":", 1)[0], "volume")
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


def volume_baseline_driver(run: Run, labels: Iterable[str] = ()) -> str:
    """How the host domain reached a network volume for the baseline: 'NBD, fio nbd engine (user space)'."""
    scheme = knobs(run).volume.split(":", 1)[0]
    if HOST_INITIATOR_LABEL in labels:  # the same device the guest was handed (Study A's "EBS from dom0")
        return f"{_volume_title(scheme, scheme or '?')}, the host's kernel initiator"
    s = SCHEMES.get(scheme)
    for label, words in s.baseline_drivers if s is not None else ():  # a test's rows say which reader measured it
        if not label or label in labels:
            return words.format(vers=knobs(run).nfs_vers, writes=knobs(run).nfs_writes)
    return f"{_volume_title(scheme, scheme or '?')}, host initiator"


def _nic_model(k: Knobs) -> str:
    model = {"virtio": "virtio-net", "xen-netfront": "netfront"}.get(k.nic, k.nic)
    return (model or "?") + (" (vhost)" if k.vhost else "")


def nic_label(run: Run) -> str:
    """The guest's NIC model and MTU; a mixed run's models, each once."""
    k, mix = knobs(run), mix_of(run)
    parts = [" / ".join(dict.fromkeys(_nic_model(x) for _, x in mix)) if mix else _nic_model(k)]
    if k.mtu:
        parts.append(f"MTU {k.mtu}")
    return ", ".join(parts)


def net_target(run: Run, measurements: Sequence[Measurement]) -> str:
    if any(m.test.endswith(FRONTEND_SUFFIX) for m in measurements):
        return "front-end"
    if any("loopback" in m.labels for m in measurements):
        return "loopback"
    if any("veth-netns" in m.labels for m in measurements):
        return "own host"
    return "peer host"
