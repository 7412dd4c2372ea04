"""One run's state as it goes, shared by its steps: what was asked (spec, profile, sizes), what the steps made
(accelerator, image, libvirt connection, backing store, host network, guest) and where things go (the results
store, the event sink, the cleanup stack, the cancellation control, the provenance record)."""

from __future__ import annotations

import contextlib
import math
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from ..disks.backing import BackingStore
from ..disks.diskstats import Sampler
from ..disks.hostraid import HostArray
from ..disks.volumes.transports import VolumeExport
from ..errors import Aborted
from ..record.provenance import Provenance
from ..record.results import ResultStore
from ..spec.profiles import Profile
from ..spec.runspec import OVERCOMMIT_LABEL, RunSpec, guest_profile_index
from ..virt.accel import Accelerator
from ..virt.guest import Guest
from ..virt.guestimage import GuestImage
from ..virt.hugepages import HugePages
from ..virt.network import HostNetwork
from ..virt.placement import HostPlacement
from .sink import EventSink

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
FULL_SECONDS = 30  # a timed test's seconds per sample from the guest's RAM up (ctx.timed_default)
QUICK_SECONDS = 5  # ... at quick size, shared by its samples
MIN_SAMPLE_SECONDS = 2  # ... but never fewer than this per sample (netperf's -l, fio's runtime after its warm-up)


class RunControl:
    """Cancellation of one run. SIGINT, SIGTERM (`cloudbox cancel`) and SIGHUP mark the run cancelled and raise
    Aborted wherever Python is, except inside `atomic()` (raised right after it) and while cleaning up (not at all)."""

    def __init__(self) -> None:
        self.signal_name = ""
        self.cleaning = False
        self.holding = False  # a guest session is up and waiting to be stopped: stopping it is its normal end
        self._cancelled = False
        self._deferred = 0
        self._old: dict[int, Any] = {}

    def cancelled(self) -> bool:
        return self._cancelled

    def aborted(self) -> Aborted:
        return Aborted(f"cancelled by {self.signal_name or 'request'}")

    def check(self, why: str = "cancelled") -> None:
        """Raise Aborted(why) if the run was cancelled (between steps, where a signal was held)."""
        if self._cancelled:
            raise Aborted(why)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self._cancelled = True
        self.signal_name = signal.Signals(signum).name
        if not self.cleaning and not self._deferred:
            raise Aborted(f"cancelled by {self.signal_name}")

    def install(self) -> None:
        self._old = {s: signal.getsignal(s) for s in SIGNALS}
        for s in SIGNALS:
            signal.signal(s, self._on_signal)

    def restore(self) -> None:
        for s, handler in self._old.items():
            signal.signal(s, handler)
        self._old = {}

    @contextlib.contextmanager
    def atomic(self) -> Iterator[None]:
        """Create a resource and register its cleanup with no cancellation in between: a signal that
        arrives meanwhile is held and raised right after (else e.g. a guest could start unregistered)."""
        self._deferred += 1
        try:
            yield
        finally:
            self._deferred -= 1
        if self._cancelled and not self._deferred and not self.cleaning:
            raise self.aborted()


@dataclass(eq=False)
class RunContext:
    spec: RunSpec
    profile: Profile
    size: int
    size_label: str
    run_uuid: str
    run_id: int
    store: ResultStore
    sink: EventSink
    control: RunControl
    stack: contextlib.ExitStack  # every resource's cleanup, unwound at the end whatever happened
    provenance: Provenance
    labels: list[str] = field(default_factory=list)  # every measurement's (emulated, nested, quick-size, ...)
    current_test: str = "idle"  # the plan step running, as "side:test": tags the host disk's samples
    # Made by the steps, in order (reading one before its step ran is a bug: AttributeError).
    image: GuestImage = field(init=False, repr=False)
    accelerator: Accelerator = field(init=False, repr=False)
    conn: Any = field(init=False, repr=False)  # the libvirt connection
    backing: BackingStore = field(init=False, repr=False)
    volume: VolumeExport | None = field(default=None, repr=False)  # a network volume exported for the run
    work_dir: Path = field(init=False, repr=False)
    domain_xml: str = field(init=False, repr=False)  # rendered: what each launch of the guest starts
    console_log: Path = field(init=False, repr=False)
    sampler: Sampler | None = None
    host_raid: HostArray | None = None  # the host's md array the guest's disk is (disk.raid_on = host)
    hostnet: HostNetwork | None = None
    private_bridge: str = ""  # a back-end's private bridge, for the network tests to the front-end
    guest: Guest | None = None  # the running guest, for its console on failure
    backings: list[BackingStore] = field(default_factory=list)  # a run of N guests: each one's store, in order
    many: list[Guest] = field(default_factory=list)  # and its guests, in order
    boot_s: float = 0.0  # the guest's launch to its agent
    mix: list[Profile] = field(default_factory=list)  # a mixed run's profiles (guest k runs guest_profile(k))
    placements: list[HostPlacement] = field(default_factory=list)  # guest k's [placement] on this host at k-1
    hugepages: HugePages | None = None  # the huge page pool the run reserved its guests' RAM in

    def placement(self, k: int) -> HostPlacement | None:
        """Guest k's (1-based) placement on this host, None for a profile without one."""
        return self.placements[k - 1] if self.placements else None

    def guest_profile(self, k: int) -> Profile:
        """The profile guest k (1-based) of the run runs: the run's, or in a mixed run the list's in turn."""
        return self.mix[guest_profile_index(k, len(self.mix))] if self.mix else self.profile

    @property
    def quick(self) -> bool:
        """Test data smaller than twice a guest's RAM: the page cache weighs more (labelled quick-size)."""
        memory = max(p.guest.memory_mib for p in self.mix or [self.profile])
        return self.size_label == "quick" or self.size < 2 * memory * 1024**2

    @property
    def runtime(self) -> int:
        """A random I/O test's measured seconds in each sample (--runtime, or timed_default)."""
        return self.spec.runtime or self.timed_default

    @property
    def net_seconds(self) -> int:
        """A network test's seconds in each sample (--net-seconds, or timed_default)."""
        return self.spec.net_seconds or self.timed_default

    @property
    def timed_default(self) -> int:
        """A timed test's seconds per sample when the run names none: 30, or at quick size QUICK_SECONDS shared by
        the test's planned samples a side (a quick run tries things out: its repeats buy an interval, not more
        time), at least MIN_SAMPLE_SECONDS each."""
        return sample_seconds(self.quick, self.spec.planned_samples)

    def timed_note(self) -> str:
        """How long each sample of a timed test ran, and why, in words (a repeated run's provenance)."""
        given = [f"{flag} {v} s" for flag, v in (("--net-seconds", self.spec.net_seconds),
                                                  ("--runtime", self.spec.runtime)) if v]
        each = (f"network tests {self.net_seconds} s, random I/O {self.runtime} s")
        if given:
            return f"{each}: {', '.join(given)} as given"
        if not self.quick:
            return f"{each}: the default at this size"
        n = self.spec.planned_samples
        if n == 1:
            return f"{each}: quick size's {QUICK_SECONDS} s"
        return (f"{each}: quick size's {QUICK_SECONDS} s shared by {n} samples a side, at least "
                f"{MIN_SAMPLE_SECONDS} s each")

    @property
    def dom0(self) -> bool:
        """The host side is Xen's dom0 (the run's guests are Xen domains)."""
        return self.accelerator.name == "xen"

    def save_provenance(self) -> None:
        self.store.set_provenance(self.run_id, self.provenance)


def sample_seconds(quick: bool, samples: int) -> int:
    """A timed test's seconds per sample by default: FULL_SECONDS, or at quick size QUICK_SECONDS shared by its
    `samples` a side, at least MIN_SAMPLE_SECONDS (RunContext.timed_default)."""
    if not quick:
        return FULL_SECONDS
    return max(MIN_SAMPLE_SECONDS, math.ceil(QUICK_SECONDS / max(1, samples)))


def host_labels(labels: list[str], *, dom0: bool = False) -> list[str]:
    """A run's labels as the host side (the baseline) carries them: never "emulated" (no guest there); and
    "nested" (this host is itself a virtual machine) becomes "virtualized-host": the "bare metal" side ran on a
    VM, and says so wherever it is shown; nor "vcpu-overcommit" (the bare-metal processes share no CPU with
    guests). `dom0`: the host is Xen's control domain, itself a PV guest of Xen (the
    baseline Study A measured under Xen), labelled "dom0"."""
    out = [x for x in labels if x not in ("emulated", "nested", OVERCOMMIT_LABEL)]
    if dom0:
        out.append("dom0")
    return [*out, "virtualized-host"] if "nested" in labels else out
