"""A repeated run on this host (--repeats N, --boots M, --until-width W): the guest launched first and kept, each
test's samples taken bare metal and guest in turn (ABAB...), so that a drift of the machine over the run falls on
both sides, bare metal measured while the guest idles; the guest destroyed and launched afresh between boots (its disk
kept). With --until-width a test is repeated until its guest/bare-metal ratio's 95% interval (core.record.stats.ratio)
is within +-W% of the ratio, or --max-repeats; each test's stopping reason is recorded (provenance.repeats) and the
plan revised when a test needed fewer repeats than it might have.

Not repeated yet: a network volume (attached by one initiator at a time, this host's for bare metal and then the
guest's, so the two cannot take turns) and N guests at once (RunSpec refuses --guests N with repeats).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..bench import iozone, runners
from ..disks.claims import ClaimedFile
from ..errors import CloudboxError, DiskStalled
from ..record import stats
from ..record.events import ProgressEvent, StateEvent
from ..record.provenance import DiskStall, Repeats, TestRepeats
from ..record.rows import Repetition
from ..spec import catalogue
from ..spec.profiles import Profile
from ..spec.runspec import BOOT, RunSpec
from .context import RunContext
from .local import claim_baseline_file, launch_guest, on_claimed, relaunch_guest, setup_steps
from .measure import storage_test
from .network_steps import Pair, network_tests, plumb

ORDER = ("each test's samples in turn, bare metal then guest (ABAB...), the guest launched first and idle while bare "
         "metal runs")


# ------------------------------------------------------------------------------------------- stopping
@dataclass(frozen=True)
class Policy:
    """When a test has samples enough: `repeats` of them (in each guest boot), or with `width` (percent) once its
    ratio's 95% interval is within +-width of the ratio, from `repeats` on and at most `most`."""

    repeats: int
    width: float = 0.0
    most: int = 0

    @classmethod
    def of(cls, spec: RunSpec) -> Policy:
        return cls(spec.repeats, spec.until_width, spec.most_repeats)

    @property
    def planned(self) -> int:
        """A test's repeats in one boot at most: what the plan holds."""
        return self.most if self.width else self.repeats


@dataclass(frozen=True)
class Stopped:
    """Why a test's repeats stopped: after `samples` a side, `reason` in words, on an interval of +-`half_width`%."""

    samples: int
    reason: str
    half_width: float | None = None


def interval(bare: list[float], guest: list[float]) -> tuple[float | None, str]:
    """(the half-width in percent a test is judged by, what it is): its guest/bare-metal ratio's 95% interval (the
    rank-sum one, from 4 samples a side), or where one side has no figure the other's median interval (from 6)."""
    if bare and guest:
        r = stats.ratio(guest, bare)
        if r is not None:
            hw = r.half_width if r.method == "rank-sum" else None
            return hw, "its ratio's 95% interval"
    side = guest or bare
    if not side:
        return None, "no figure on either side"
    return stats.summarize(side).half_width, "its median's 95% interval"


def stop_reason(policy: Policy, n: int, bare: list[float], guest: list[float]) -> Stopped | None:
    """Whether `n` repeats (their figures `bare` and `guest`, those the tool could time) are enough."""
    if n < policy.repeats:
        return None
    if not policy.width:
        return Stopped(n, f"the planned {n}")
    hw, what = interval(bare, guest)
    if hw is not None and hw <= policy.width:
        return Stopped(n, f"{what} +-{hw:.1f}% is within +-{policy.width:g}% after {n}", hw)
    if n >= policy.most:
        got = f"{what} was +-{hw:.1f}%" if hw is not None else f"{what}: none yet"
        return Stopped(n, f"the most repeats ({policy.most}) reached; {got}, +-{policy.width:g}% wanted", hw)
    return None


def repeat_test(pair: Pair, policy: Policy, *, boot: int = 1, first: int = 1) -> Stopped:
    """`pair` (one repeat: bare metal's figure and the guest's) called until `policy` has enough, each call with
    its sample's place: repeat `first`, `first` + 1, ... in guest boot `boot`."""
    bare: list[float] = []
    guest: list[float] = []
    i = 0
    while True:
        i += 1
        b, g = pair(Repetition(first + i - 1, boot, i))
        bare += [b] if b is not None and not math.isnan(b) else []
        guest += [g] if g is not None and not math.isnan(g) else []
        if (stop := stop_reason(policy, i, bare, guest)) is not None:
            return stop


def where(spec: RunSpec, rep: Repetition | None) -> str:
    """Where a sample stands, for its step: "repeat 2 of 3", "repeat 5 (4 to 10, until +-5%)", ", boot 2 of 3"."""
    if rep is None:
        return ""
    if spec.until_width:
        text = f"repeat {rep.iteration} ({spec.repeats} to {spec.most_repeats}, until +-{spec.until_width:g}%)"
    else:
        text = f"repeat {rep.iteration} of {spec.repeats}"
    return text + (f", boot {rep.boot} of {spec.boots}" if spec.boots > 1 else "")


# ----------------------------------------------------------------------------------------------- run
def repeat_problem(profile: Profile) -> str:
    """Why this profile's tests cannot be repeated here ('' when they can)."""
    if profile.disk.backing == "network-volume":
        return (f"profile {profile.name}: disk.backing = network-volume is attached by one initiator at a time (this "
                "host's for bare metal, then the guest's), so bare metal and the guest cannot take turns; allowed "
                "with --repeats, --boots or --until-width: a profile whose disk is a file or a device")
    return ""


class Plan:
    """The run's plan as it goes: a test that stops before its most repeats drops the steps it did not need, and
    the revised plan goes out as a new 'running' state event (events.PlanProgress takes it)."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.steps = ctx.spec.plan()

    def stopped(self, tests: list[str], samples: int) -> None:
        keep = [s for s in self.steps if not (s.test in tests and s.repeat > samples)]
        if len(keep) < len(self.steps):
            self.steps = keep
            self.ctx.sink.emit(StateEvent("running", profile=self.ctx.profile.name, suite=self.ctx.spec.suite,
                                          plan=tuple(self.steps)))


@dataclass
class BareMetal:
    """Bare metal's side of the storage tests: its runner and target (the claimed file, or the device)."""

    ctx: RunContext
    runner: runners.HostRunner
    claim: ClaimedFile | None
    target: str

    def measure(self, t: catalogue.StorageTest, lay: bool, rep: Repetition, drop: Callable[[], object]) -> float:
        ctx, claim = self.ctx, self.claim
        if lay:
            ctx.sink.step(f"bare metal: laying down IOzone's data for {t.id}", side="baseline")
            on_claimed(claim, ctx.size, self.runner.fill_iozone, t, self.target, ctx.size)
        run = functools.partial(on_claimed, claim, ctx.size, self.runner.run, t, self.target, ctx.size, ctx.runtime,
                                ctx.sink.progress("baseline", t.id))
        return storage_test(ctx, "baseline", t, run, drop, rep=rep, where=where(ctx.spec, rep)).mbps


class GuestSide:
    """The guest's side of the storage tests in one boot: its runner and benchmark disk (its md array with RAID 0),
    launched afresh once when its disk stops completing requests."""

    def __init__(self, ctx: RunContext, tests: list[catalogue.StorageTest]) -> None:
        self.ctx, self.tests = ctx, tests
        self.runner: runners.GuestRunner
        self.disk = ""
        self.raid = False
        self.prepare()

    def prepare(self) -> None:
        ctx = self.ctx
        assert ctx.guest is not None
        self.runner = gr = runners.GuestRunner(ctx.guest, ctx.control.cancelled)
        gr.check_tools(self.tests)
        d = ctx.profile.disk
        if d.raid == "none" or d.raid_on == "host":
            self.disk = gr.disk()
        else:
            ctx.sink.step(f"guest: RAID {d.raid} over {d.count} disks ({d.chunk_kib} KiB chunks)", side="guest")
            # built without superblocks the same way each boot: the same stripes over the disks as they were
            self.disk, self.raid = gr.assemble_raid(d.count, d.chunk_kib).device, True
        ctx.sink.log(f"guest benchmark disk: {self.disk} (bus {d.bus})")

    def fill(self) -> None:
        self.ctx.sink.step("guest: laying down data for read tests", side="guest")
        self.runner.fill(self.disk, self.ctx.size)

    def measure(self, t: catalogue.StorageTest, lay: bool, rep: Repetition, note: str = "") -> float:
        ctx, gr = self.ctx, self.runner
        timeout = runners.guest_timeout(t, ctx.size)
        if lay:
            ctx.sink.step(f"guest: laying down IOzone's data for {t.id}", side="guest")
            gr.fill_iozone(t, self.disk, ctx.size, timeout=timeout)
        run = functools.partial(gr.run, t, self.disk, ctx.size, ctx.runtime, ctx.sink.progress("guest", t.id),
                                timeout=timeout)
        return storage_test(ctx, "guest", t, run, gr.drop_caches, note=note, rep=rep, where=where(ctx.spec, rep)).mbps

    def finish(self) -> None:
        if self.raid:
            self.runner.stop_raid()


def run_repeated(ctx: RunContext) -> None:
    """A repeated run's body on this host (core.run.lifecycle.Execution runs it)."""
    if why := repeat_problem(ctx.profile):
        raise CloudboxError(why)
    for step in (*setup_steps(), plumb):  # the guests' [placement] too, as a single pass places them
        step(ctx)
    spec = ctx.spec
    policy, plan = Policy.of(spec), Plan(ctx)
    record = ctx.provenance.repeats = Repeats(repeats=spec.repeats, boots=spec.boots,
                                              until_width=spec.until_width or None,
                                              max_repeats=spec.most_repeats if spec.until_width else None, order=ORDER,
                                              timing=ctx.timed_note())
    ctx.save_provenance()
    tests = catalogue.resolve_tests(spec.storage_tests) if spec.wants_storage else []
    bare = _bare_metal(ctx, tests) if tests else None
    stops: dict[str, list[Stopped]] = {}
    for boot in range(1, spec.boots + 1):
        t0 = time.monotonic()
        if boot == 1:
            launch_guest(ctx)
            record.boot_s.append(round(ctx.boot_s, 2))
        else:
            relaunch_guest(ctx, f"boot {boot} of {spec.boots} (its disk kept)", f"console-boot{boot - 1}.log")
            ctx.sink.emit(ProgressEvent("guest", BOOT, 100))
            record.boot_s.append(round(time.monotonic() - t0, 2))
        ctx.save_provenance()
        if bare is not None:
            _storage(ctx, bare, tests, policy, boot, plan, stops)
        if spec.wants_network and ctx.hostnet is not None:
            assert ctx.guest is not None
            network_tests(ctx, ctx.guest, functools.partial(_take, ctx, policy, boot, plan, stops),
                          functools.partial(where, spec))
    if bare is not None and bare.claim is not None:
        bare.claim.release()
    if ctx.host_raid is not None and ctx.provenance.raid is not None:
        ctx.provenance.raid.sectors_written = ctx.host_raid.sectors_written()
    record.tests = [_summed(test, s, spec.boots) for test, s in stops.items()]
    ctx.save_provenance()
    for tr in record.tests:
        ctx.sink.log(f"{tr.test}: {tr.samples} samples a side: {tr.reason}")


def _bare_metal(ctx: RunContext, tests: list[catalogue.StorageTest]) -> BareMetal:
    """Bare metal's target (a claimed file, or the device itself), with data laid down for reads."""
    runner = runners.HostRunner(ctx.control.cancelled)
    claim = claim_baseline_file(ctx, ctx.backing)
    target = claim.tool_path if claim is not None else ctx.backing.baseline_target
    if runners.needs_fill(tests):
        ctx.sink.step("bare metal: laying down data for read tests", side="baseline")
        on_claimed(claim, ctx.size, runner.fill, target, ctx.size)
    return BareMetal(ctx, runner, claim, target)


def _storage(ctx: RunContext, bare: BareMetal, tests: list[catalogue.StorageTest], policy: Policy, boot: int,
             plan: Plan, stops: dict[str, list[Stopped]]) -> None:
    """One boot's storage tests, each test's repeats bare metal and guest in turn."""
    guest = GuestSide(ctx, tests)
    if boot == 1 and runners.needs_fill(tests):  # the guest's disk keeps its data across boots
        guest.fill()
    stalled: list[str] = []

    def in_guest(t: catalogue.StorageTest, lay: bool, rep: Repetition) -> float:
        try:
            return guest.measure(t, lay, rep)
        except DiskStalled as e:
            if stalled or ctx.control.cancelled():
                raise
            stalled.append(t.id)
            ctx.provenance.add_disk_stall(DiskStall(test=t.id, disks=e.disks, seen=e.seen))
            ctx.save_provenance()
            relaunch_guest(ctx, f"{e}; under {ctx.accelerator.label}", "console-stall1.log")
            guest.prepare()
            return guest.measure(t, lay, rep, note=f"measured in a second guest: in the first, {e}")

    def pair(t: catalogue.StorageTest, lay: bool, rep: Repetition) -> tuple[float | None, float | None]:
        b = bare.measure(t, lay, rep, guest.runner.drop_caches)
        return b, in_guest(t, lay, rep)

    for t, lay in zip(tests, iozone.iozone_fills(tests), strict=True):
        stop = repeat_test(functools.partial(pair, t, lay), policy, boot=boot, first=(boot - 1) * policy.planned + 1)
        stops.setdefault(t.id, []).append(stop)
        if stop.samples < policy.planned:
            plan.stopped([t.id], stop.samples)
    guest.finish()


def _take(ctx: RunContext, policy: Policy, boot: int, plan: Plan, stops: dict[str, list[Stopped]], test: str,
          pair: Pair) -> None:
    """A network test's repeats in one boot (network_steps.network_tests calls it per test)."""
    stop = repeat_test(pair, policy, boot=boot, first=(boot - 1) * policy.planned + 1)
    stops.setdefault(test, []).append(stop)
    if stop.samples < policy.planned:
        plan.stopped([test, test + catalogue.FRONTEND_SUFFIX], stop.samples)


def _summed(test: str, stops: list[Stopped], boots: int) -> TestRepeats:
    """A test's record over its boots: the samples in all, and why it stopped (each boot's when they differ)."""
    n = sum(s.samples for s in stops)
    if boots > 1:
        reason = f"the planned {stops[0].samples} in each of {boots} boots" if len({s.reason for s in stops}) == 1 \
            else "; ".join(f"boot {b}: {s.reason}" for b, s in enumerate(stops, 1))
    else:
        reason = stops[0].reason
    return TestRepeats(test=test, samples=n, reason=reason, half_width=stops[-1].half_width)

