"""A run's provenance: everything that says where, how and with what its numbers were measured, as one typed record.

The executor fills it as the run goes (which host ran it and its CPUs, the accelerator, tool versions, the guest
image, the backing store, the network volume, the spec, the guest's domain XML and kernel, the guest's md array, its
boot, a stalled network, the private network of a run on a back-end) and the front-end adds what it knows of a run it
mirrored on a node (both nodes, the image's propagation, the node's run, the servers it opened for the cross-node
tests). The results store keeps it as JSON (`to_stored`) and reads it back with `from_stored`, which also reads the
older untyped form: keys it does not know are left out, a value of the wrong type drops that key alone, and `network`
of a run on a back-end, its private network before that had its own key, becomes `private_network`.
"""

from __future__ import annotations

import platform
import time
from dataclasses import dataclass, field
from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, field_serializer

from ..spec.runspec import RunSpec
from ..virt.accel import Accelerator
from .hoststate import HostState


class _Record(BaseModel):
    model_config = ConfigDict(extra="ignore")


class Controller(_Record):
    """The host whose executor runs the run (for a run on a node: the front-end that mirrors it)."""

    host: str
    host_kernel: str = ""

    @classmethod
    def this_host(cls) -> Controller:
        return cls(host=platform.node(), host_kernel=platform.release())


class Versions(_Record):
    """The versions of what measured: cloudbox, QEMU, libvirt and its hypervisor driver, the tools, the guest's
    packages."""

    cloudbox: str = ""
    qemu: str = ""
    libvirt: str = ""
    hypervisor: str = ""
    fio: str = ""
    netperf: str = ""
    iperf3: str = ""
    iozone: str | None = None  # None in runs stored without it, so their stored form reads back key for key
    guest_packages: dict[str, str] = {}


class GuestImageInfo(_Record):
    kernel_version: str = ""
    sha256: dict[str, str] = {}


class BackingInfo(_Record):
    """The backing store the guest's disk was on, as prepared (core.disks.backing.BackingStore)."""

    kind: str
    path: str = ""
    device: str | None = None  # the host block device sampled
    model: str = ""
    size_bytes: int | None = None
    format: str = ""
    is_block: bool = False
    count: int | None = None  # disks, each on its own store, when more than one (size_bytes is then each one's)
    more_paths: list[str] | None = None  # the other disks' stores


class VolumeInfo(_Record):
    """The network volume a run measured (backing network-volume): its scheme, who attached it, the server, how the
    export was secured and what the baseline measured."""

    name: str
    scheme: str
    attach: str  # host | guest | qemu
    server: str = ""  # the exporting program and its address
    uri: str = ""
    tls: str = ""  # how the export authenticated its clients ("" = none, as AoE)
    baseline: str = ""  # what the baseline measured, or why there is none
    target: str = ""  # the AoE shelf.slot the guest read (disk.attach = guest)
    server_bytes_read: int | None = None  # what the export read from / wrote to the volume's disk during the run
    server_bytes_written: int | None = None
    mount: str = ""  # NFS: the guest's /proc/mounts line (the options its kernel and the server settled on)
    host_mount: str = ""  # NFS on a back-end: its host's /proc/mounts line for the baseline's mount
    host_device: str = ""  # the device this host's kernel attached (disk.attach = host, or for the baseline)
    initiator: str = ""  # which initiator attached it: "open-iscsi (iscsiadm, the kernel's iscsi_tcp)", ...
    server_device: str = ""  # the disk under the volume's file, sampled beside the attached device


class RaidInfo(_Record):
    """The md array the guest's tests ran on (disk.raid): as assembled, and what each member had written after."""

    device: str
    level: str
    chunk_kib: int
    members: list[str] = []
    mdstat: str = ""  # /proc/mdstat once assembled
    sectors_written: dict[str, int] = {}  # per member, after the guest's tests (512-byte sectors since boot)
    where: str = "guest"  # who built it (disk.raid_on): the guest over its disks, or the host over its loops (whose
    # sectors_written count from the array's building, the baseline's and the guest's writes both)


class Dom0Info(_Record):
    """What a Xen profile's [dom0] table changed for the run (restored after it): as found, and as set."""

    vcpu_pin: str = ""  # the physical CPUs every dom0 vCPU was pinned to ("" left as found)
    affinity_before: list[str] = []  # "vCPU: hard / soft", as `xl vcpu-list` showed it before
    memory_before_mib: int | None = None
    memory_mib: int | None = None  # dom0's size once the balloon driver reached the profile's


class PlacementInfo(_Record):
    """Where the run placed its guest on the host ([placement]) and what the host really did (read back once the
    guest was up): libvirt's pinning, QEMU's threads' affinities and its RAM's nodes from /proc, and the huge page
    pool before the run, with the guest running, and after it."""

    asked: str = ""  # the profile's [placement] in words
    topology: str = ""  # the host's NUMA nodes and their CPUs
    placed: list[str] = []  # per guest: the placement resolved on this host, in words
    vcpu_pins: dict[str, str] = {}  # libvirt's: vCPU -> host CPUs (the first guest)
    emulator_pin: str = ""
    iothread_pins: dict[str, str] = {}
    memory_binding: str = ""  # libvirt's <numatune>: "strict 0"
    threads: dict[str, str] = {}  # /proc: QEMU's thread name -> the CPUs it may run on
    ram_pages: dict[str, int] = {}  # /proc/<pid>/numa_maps: the guest RAM's pages per host node
    ram_page_kib: int | None = None
    ram_policy: str = ""
    hugepage_kib: int | None = None
    hugepages_needed: int | None = None  # pages the run's guests take
    hugepages_before: dict[str, int] = {}  # the pool before the run: total, free
    hugepages_running: dict[str, int] = {}  # with the guests up
    hugepages_after: dict[str, int] = {}  # given back after the run


class GuestStart(_Record):
    """One guest of a run of N: its name, and how well the host knows its clock (for the start barrier)."""

    name: str
    place: str = ""  # a spread run's: the node (or this host) it ran on
    profile: str = ""  # a mixed run's: the profile this guest ran (Guests.profiles holds its TOML)
    disk: str = ""  # its backing store on the host (file or device)
    clock_offset_s: float | None = None  # host time minus the guest's uptime clock, as last measured
    clock_rtt_s: float | None = None  # the agent round trip that measurement took (its uncertainty is half of it)
    launch_to_agent_s: float | None = None
    raid: RaidInfo | None = None  # its own md array over its disks (disk.raid)


class Place(_Record):
    """One place's part of a spread run: its guests (instances first..first+guests-1), its own run there, and its
    clock against the front-end's, measured at each test's release through the coordination channel (the quickest
    of five round trips)."""

    name: str
    guests: int
    first: int  # its first guest's instance number in the whole run
    run_id: int | None = None  # the part's own run, on that node (this host's parts store for `local`)
    clock_offset_s: float | None = None  # the place's clock minus the front-end's, as last measured
    clock_rtt_s: float | None = None
    host: str | None = None
    accelerator: str | None = None
    host_metrics: dict[str, dict[str, float | None]] = {}  # per test: its own disk's host_mbps, avgqu, util
    vcpus: int | None = None  # its guests' vCPUs, and its host's CPUs (more vCPUs: --cpu-overcommit)
    host_cpus: int | None = None


class Guests(_Record):
    """A run of N guests of one profile (or a mixed run's several, in turn) on one host, started test by test at
    one instant (the barrier)."""

    count: int
    guests: list[GuestStart] = []
    # per test: each guest's start after the earliest one's, in seconds (guest 1 first), and the largest of them
    start_offsets_s: dict[str, list[float]] = {}
    skew_s: dict[str, float] = {}
    started_at: dict[str, float] = {}  # per test: the earliest guest's start, epoch seconds on the host's clock
    baseline_processes: int | None = None  # bare-metal fio processes run at once, one file each
    barrier: str = ""
    places: list[Place] = []  # a run spread over several places (--node local,be1): each one's part
    profiles: dict[str, str] = {}  # a mixed run's (--profile a+b): each profile's canonical TOML, by name
    domain_xml: dict[str, str] = {}  # and the live domain XML of each profile's first guest, by profile name
    vcpus: int | None = None  # the guests' vCPUs on this host, all together
    host_cpus: int | None = None  # and this host's CPUs: more vCPUs than CPUs is an overcommitted run


class PrivateNetwork(_Record):
    """A back-end guest's network for the tests to the front-end: the node's private bridge and the addresses."""

    bridge: str
    peer: str  # the front-end's private address
    host_ip: str | None = None
    guest_ip: str | None = None
    mtu: int | None = None


class NicStall(_Record):
    """A guest network test whose path stopped for good: the test, the hop where frames stopped, what was done."""

    test: str
    hop: str
    remedy: str = "relaunch"


class DiskStall(_Record):
    """A guest storage test whose disk stopped completing requests: the test, the disks with requests in flight,
    what was seen (the counters, QEMU's view of the queues), what was done."""

    test: str
    disks: list[str]
    seen: str
    remedy: str = "relaunch"


class TestRepeats(_Record):
    """One test of a repeated run: the samples it took a side and why it stopped there."""

    test: str
    samples: int
    reason: str  # "the planned 3", "its ratio's 95% interval +-2.1% is within +-5% after 6", ...
    half_width: float | None = None  # the interval it stopped on: +- percent of the ratio (or of the median)


class Repeats(_Record):
    """How a repeated run (--repeats, --boots, --until-width) took its samples."""

    repeats: int  # a test's samples a side in each guest boot (with until_width: the fewest)
    boots: int = 1
    until_width: float | None = None  # percent: the ratio's interval's half-width a test stops at
    max_repeats: int | None = None  # with until_width: the most
    order: str = ""  # how the samples alternate, in words
    timing: str = ""  # each timed test's seconds per sample, and why (RunContext.timed_note)
    boot_s: list[float] = []  # each guest boot's launch to agent, in order
    tests: list[TestRepeats] = []


class SteadyState(_Record):
    """How timed tests (random I/O with a runtime) reach a steady state before they count: a warm-up run and
    discarded first (a fio job of its own before the measured one), or fio's own steady-state detection."""

    method: str  # "warmup" | "steadystate"
    seconds: int = 0  # the warm-up's length
    tests: list[str] = []  # the tests it applies to, each sample of them
    note: str = ""


class Caches(_Record):
    """How each read test's sample starts: the page caches dropped (or why one cannot be)."""

    host: str
    guest: str = ""
    server: str = ""  # a network volume's server: whose cache is dropped with the host's, or why not


class Nodes(_Record):
    """A run on a back-end: the front-end that ran it and the back-end it ran on."""

    front_end: str = Field(validation_alias=AliasChoices("front-end", "front_end"), serialization_alias="front-end")
    back_end: str = Field(validation_alias=AliasChoices("back-end", "back_end"), serialization_alias="back-end")


class NodeInfo(_Record):
    """The back-end as the front-end's registry knows it."""

    name: str
    address: str = ""
    host_key_fingerprint: str = ""


class PeerServers(_Record):
    """The front-end's netserver and iperf3 for the cross-node tests of a run on a back-end."""

    peer: str
    peer_netperf_port: int = 0
    peer_iperf3_port: int = 0
    peer_iperf3_ports: list[int] | None = None  # N guests: an iperf3 server each (it serves one client at a time)


@dataclass
class Propagation:
    """One copy of the guest image from the front-end's store to a node (cached: it was there already)."""

    node: str
    image_id: str
    bytes: int
    seconds: float  # first byte sent -> the node has written every file
    verify_seconds: float  # the node's SHA-256 check of what it received
    mbps: float  # MB/s (10^6 bytes per second) over `seconds`; 0 when cached
    cached: bool
    remote_dir: str
    at: float = field(default_factory=time.time)

    def describe(self) -> str:
        if self.cached:
            return f"guest image {self.image_id} already on {self.node} (checked in {self.verify_seconds:.1f} s)"
        return (f"guest image {self.image_id} to {self.node}: {self.bytes / 1e6:.1f} MB in {self.seconds:.2f} s = "
                f"{self.mbps:.1f} MB/s (verified on the node in {self.verify_seconds:.2f} s)")


@dataclass
class RemoteRun:
    """A run on a node, as the node's own results store numbers it."""

    node: str
    run_id: int
    uuid: str


class Provenance(_Record):
    """Every fact of a run's provenance; None (left out of the stored form) where the run never got that far."""

    controller: Controller | None = None
    host: str | None = None  # the host that ran the guest and the baseline
    host_kernel: str | None = None
    cpu: str | None = None
    host_cpus: int | None = None  # logical CPUs online on `host`
    host_cores: int | None = None  # physical cores among them (hyperthreads counted once)
    accelerator: Accelerator | None = None
    versions: Versions | None = None
    guest_image: GuestImageInfo | None = None
    backing: BackingInfo | None = None
    volume: VolumeInfo | None = None
    raid: RaidInfo | None = None
    dom0: Dom0Info | None = None
    placement: PlacementInfo | None = None


    guests: Guests | None = None  # a run of N guests (--guests N > 1)
    spec: RunSpec | None = None
    private_network: PrivateNetwork | None = None
    domain_xml: str | None = None  # what libvirt reported after the launch
    guest_kernel: str | None = None
    launch_to_agent_s: float | None = None
    boot_attempts: int | None = None
    nic_stalls: list[NicStall] | None = None
    disk_stalls: list[DiskStall] | None = None
    nodes: Nodes | None = None
    node: NodeInfo | None = None
    propagation: Propagation | None = None
    peer: PeerServers | None = None
    remote_run: RemoteRun | None = None
    host_state: HostState | None = None  # what moves figures on real hardware: CPU, idle states, THP, disk, NIC
    caches: Caches | None = None
    steady_state: SteadyState | None = None
    repeats: Repeats | None = None

    @field_serializer("spec")
    def _spec_stored(self, spec: RunSpec | None) -> dict[str, Any] | None:
        return None if spec is None else spec.as_dict()

    def to_stored(self) -> dict[str, Any]:
        """The JSON form kept in the results store and shown by `results export|show --json`."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)

    @classmethod
    def from_stored(cls, data: Any) -> Provenance:
        """The record of a stored provenance, of this or an older cloudbox (see the module's docstring)."""
        if not isinstance(data, dict):
            return cls()
        d = dict(data)
        old = d.pop("network", None)
        if "private_network" not in d and isinstance(old, dict) and ("bridge" in old or "peer" in old):
            d["private_network"] = old
        while True:
            try:
                return cls.model_validate(d)
            except ValidationError as e:
                bad = {err["loc"][0] for err in e.errors() if err["loc"]} & set(d)
                if not bad:
                    return cls()
                for key in bad:
                    del d[key]

    def add_nic_stall(self, stall: NicStall) -> None:
        self.nic_stalls = [*(self.nic_stalls or []), stall]

    def add_disk_stall(self, stall: DiskStall) -> None:
        self.disk_stalls = [*(self.disk_stalls or []), stall]

    def under(self, front_end: Provenance) -> Provenance:
        """This (a node's run's) provenance with the front-end's facts over it: what the front-end stores."""
        return self.model_copy(update={k: v for k in type(front_end).model_fields
                                       if (v := getattr(front_end, k)) is not None})
