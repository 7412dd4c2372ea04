"""What a run is asked to do: the RunSpec with every run option declared once, the test sizes and sets, the plan.

A run option is a RunSpec field declared with `run_option()`: the field gives its name, type and default, the
declaration its CLI flags, TUI control, help, choices and check. RUN_OPTIONS is read from those declarations:
`cloudbox run` builds its flags from it and the TUI's Tests screen its controls, so a new option or choice appears in
both at once, and the node checks a front-end's request against the same fields (agent.requests). A spec is checked
(`RunSpec.validate`) before anything is created; a bad value is a UsageError naming the flag, the value and what is
allowed. The plan is the run's steps as (side, test), in the order the executor takes them.

A propagation run (suite "propagation", study B's image-propagation sweep) is made by `cloudbox study run` only, from
a study's [propagation] table: its image sizes are the spec's `propagate`, one per sample, and `cloudbox run` does not
offer the suite.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
import typing
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

from .. import inputs
from ..errors import CloudboxError, UsageError
from . import catalogue, remote
from .catalogue import PROPAGATE_PREFIX
from .nodeconf import NODE_NAME_ALLOWED, is_node_name
from .profiles import MIX, split_mix

QUICK_SIZE = 128 * 1024**2
MIN_SIZE = 4 * 1024**2
AGENT_TIMEOUT_RANGE = (10.0, 3600.0)  # seconds
DEFAULT_AGENT_TIMEOUT = 300.0
# "guest" launches the profile's guest and keeps it running (no tests) until `cancel` stops it.
SUITES = ("storage", "network", "all", "guest")
SIDES = ("baseline", "guest")
BOOT = "boot"  # the plan's test name for the guest's launch
# Study B's image-propagation sweep: provision a guest from an image of each size (core.run.propagate).
PROPAGATION = "propagation"
MIB = 1024**2
MAX_PROPAGATE_SAMPLES = 2000  # samples in one propagation run: a study's 16 sizes x 100 repeats, with room
MAX_IMAGE_SIZE = 1024**4  # 1 TiB
MAX_GUESTS = 64  # guests of one run on one host; the host's memory and CPUs usually stop it sooner
CPU_OVERCOMMIT_RANGE = (1.0, 16.0)
OVERCOMMIT_LABEL = "vcpu-overcommit"  # a guest figure measured with more guest vCPUs than host CPUs
LOCAL_PLACE = "local"  # this host, as a place of a spread run's guests (--node local,be1)
MAX_PLACES = 8
MAX_REPEATS = 100  # samples a side of one test in one guest boot
MAX_BOOTS = 20
MAX_SAMPLES = 1000  # samples a side of one test in all (--repeats x --boots)
DEFAULT_MOST_REPEATS = 10  # --until-width's cap without --max-repeats (netperf's -i 10 as well)
DEFAULT_WIDTH = 5.0  # --until-width given alone: the ratio known to +-5% (netperf's -I 99,5 asks as much)
# The fewest samples a side whose guest/bare-metal ratio has a 95% interval (core.record.stats.ratio: 4 + 4)
MIN_ADAPTIVE_REPEATS = 4
WIDTH_RANGE = (0.1, 50.0)  # --until-width, percent


def propagation_test(size_bytes: int) -> str:
    """The test name a propagation sample of an image of `size_bytes` (whole MiB) is stored under: "propagate-64m"."""
    return f"{PROPAGATE_PREFIX}{size_bytes // MIB}m"


def propagation_size(test: str) -> int | None:
    """The image size in bytes of a propagation test name ("propagate-64m" -> 64 MiB), else None."""
    m = re.fullmatch(re.escape(PROPAGATE_PREFIX) + r"([1-9][0-9]{0,7})m", test)
    return int(m.group(1)) * MIB if m else None



# ------------------------------------------------------------------------------------------------ options
@dataclass(frozen=True)
class Choice:
    """One offered value of an option: its value, the TUI's words for it, whether the TUI's run form offers it."""

    value: str
    label: str = ""
    offered: bool = True

    @property
    def title(self) -> str:
        return self.label or self.value



Control = Literal["select", "input", ""]  # how the TUI's run form asks for an option ("": it does not)


@dataclass(frozen=True)
class RunOption:
    """One run option, declared once (run_option() on a RunSpec field) for the CLI's flags, the TUI's run form and the
    spec's validation; RUN_OPTIONS fills in the field's name, type and default."""

    field: str  # the RunSpec attribute
    flags: tuple[str, ...]  # the CLI's flags, the long one first
    type: Callable[[str], Any]  # the field's type: str, int or float
    default: Any  # the field's default (None for a required option)
    help: str
    title: str = ""  # the TUI form's heading for it ("" where the form does not offer it)
    control: Control = ""  # how the TUI form asks for it: a select of the offered choices, or an input
    metavar: str | None = None
    choices: tuple[Choice, ...] = ()
    closed: bool = False  # only the choices are allowed; else `check` says what is
    check: Callable[[Any], None] | None = None  # raises UsageError naming the flag, the value and what is allowed
    form_default: Any = None  # the TUI form's first value, where it differs from the CLI's default
    required: bool = False
    sweep: bool = False  # the CLI also takes a comma-separated list: one run per value, one after another
    const: Any = None  # the value of the flag given without one (--until-width alone: 5), where it may be

    @property
    def flag(self) -> str:
        return self.flags[0]

    def validate(self, value: Any) -> None:
        if self.closed and value not in [c.value for c in self.choices]:
            raise UsageError(f"{self.flag} {value!r} is not allowed; allowed: "
                             f"{', '.join(c.value for c in self.choices)}")
        if self.check is not None:
            self.check(value)

    def values(self, given: Any) -> list[Any]:
        """The values of a sweep option's CLI text ("1,2,4" -> [1, 2, 4]), each of the option's type and given once;
        one value for any other option."""
        if not (self.sweep and isinstance(given, str)):
            return [given]
        out = []
        for part in given.split(","):
            try:
                value = self.type(part.strip())
            except ValueError:
                raise UsageError(f"{self.flag} {given!r}: {part.strip()!r} is not understood; allowed: one value or "
                                 f"a comma-separated list such as 1,2,4 (one run each)") from None
            if value in out:
                raise UsageError(f"{self.flag} {given!r}: {value} is given twice; allowed: each value once")
            out.append(value)
        return out

    def offered(self) -> list[tuple[str, str]]:
        """(label, value) of every choice the TUI's form offers, for a select."""
        return [(c.title, c.value) for c in self.choices if c.offered]

    @property
    def initial(self) -> Any:
        """The value the TUI's form starts with."""
        return self.default if self.form_default is None else self.form_default

    def text(self, value: Any) -> str:
        """A value as the CLI and the form write it: 300.0 as 300, 1.5 as 1.5."""
        return f"{value:g}" if isinstance(value, float) else str(value)



_OPTION = "cloudbox.run_option"  # the key of a RunSpec field's metadata that holds its option


def _check_nic(value: str) -> None:
    if value and not re.fullmatch(r"[A-Za-z0-9_.:-]{1,15}", value):
        raise UsageError(f"--nic {value!r} is not a network interface's name; allowed: 1..15 letters, digits and "
                         "_.:- (ip -br link lists them)")


def run_option(default: Any = dataclasses.MISSING, *, flags: tuple[str, ...], help: str, title: str = "",
               control: Control = "", metavar: str | None = None, choices: tuple[Choice, ...] = (),
               closed: bool = False, check: Callable[[Any], None] | None = None, form_default: Any = None,
               sweep: bool = False, const: Any = None) -> Any:
    """A RunSpec field that is also a run option: the field's default (none: the option is required), with the
    option's CLI flags, help, the TUI form's title and control, its choices and check (see RunOption)."""
    declared = RunOption("", flags, str, None, help, title=title, control=control, metavar=metavar, choices=choices,
                         closed=closed, check=check, form_default=form_default, sweep=sweep, const=const)
    return field(default=default, metadata={_OPTION: declared})


def parse_size(text: str, memory_mib: int) -> tuple[int, str]:
    """-> (bytes, label). 'study' is study B's rule: twice the guest's RAM (at least 2 GiB)."""
    t = str(text).strip().lower()
    if t == "quick":
        return QUICK_SIZE, "quick"
    if t == "study":
        return max(2 * memory_mib * 1024**2, 2 * 1024**3), "study"
    mult = {"k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
    try:
        if t and t[-1] in mult:
            n = int(float(t[:-1]) * mult[t[-1]])
        else:
            n = int(t)
    except (ValueError, OverflowError):
        raise UsageError(f"--size {text!r} not understood; allowed: quick, study, or a size like 512M, 4G") from None
    if n < MIN_SIZE:
        raise UsageError(f"--size {text!r} is too small; the minimum is 4M")
    return n, "custom"


def resolve_net_tests(spec: str) -> list[catalogue.NetTest]:
    ids = catalogue.NET_SETS.get(spec.lower()) or [s.strip().lower() for s in spec.split(",") if s.strip()]
    bad = [i for i in ids if i not in catalogue.NET_TESTS]
    if bad:
        near = inputs.did_you_mean(bad[0], [*catalogue.NET_SETS, *catalogue.NET_TESTS])
        raise UsageError(f"unknown network test(s) {', '.join(bad)}{near}; allowed: {', '.join(catalogue.NET_TESTS)} "
                         f"or a set: {', '.join(catalogue.NET_SETS)}")
    return [catalogue.NET_TESTS[i] for i in ids]


def _check_size(value: str) -> None:
    parse_size(value, 1024)


def _check_tests(value: str) -> None:
    try:
        tests = catalogue.resolve_tests(value)
    except CloudboxError as e:
        raise UsageError(f"--tests {value!r}: {e}") from None
    if not tests:
        raise UsageError(f"--tests {value!r} names no storage test; allowed: {', '.join(catalogue.TESTS)} or a set: "
                         f"{', '.join(catalogue.TEST_SETS)}")


def _check_net_tests(value: str) -> None:
    try:
        resolve_net_tests(value)
    except CloudboxError as e:
        raise UsageError(f"--net-tests {value!r}: {e}") from None


def _seconds(flag: str, default: str) -> Callable[[int], None]:
    def check(value: int) -> None:
        if value < 0:
            raise UsageError(f"{flag} {value} is not allowed; allowed: 0 ({default}) or more seconds")
    return check


def _check_agent_timeout(value: float) -> None:
    low, high = AGENT_TIMEOUT_RANGE
    if not low <= value <= high:
        raise UsageError(f"--agent-timeout {value:g} is not allowed; allowed: {low:g} to {high:g} seconds "
                         f"(default {DEFAULT_AGENT_TIMEOUT:g})")


def _check_guests(value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_GUESTS:
        raise UsageError(f"--guests {value!r} is not allowed; allowed: 1 to {MAX_GUESTS} guests (within what this "
                         "host's memory and CPUs hold)")


def _check_cpu_overcommit(value: float) -> None:
    low, high = CPU_OVERCOMMIT_RANGE
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise UsageError(f"--cpu-overcommit {value!r} is not allowed; allowed: {low:g} (default: a host CPU for "
                         f"every guest vCPU) to {high:g} guest vCPUs per host CPU")


def _whole(flag: str, low: int, high: int, what: str) -> Callable[[int], None]:
    def check(value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise UsageError(f"{flag} {value!r} is not allowed; allowed: {low} to {high} {what}")
    return check


def _check_until_width(value: float) -> None:
    low, high = WIDTH_RANGE
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value == 0 or low <= value <= high):
        raise UsageError(f"--until-width {value!r} is not allowed; allowed: 0 (off: --repeats as given) or {low:g} to "
                         f"{high:g} (percent: repeat until the guest/bare-metal ratio's 95% interval is within "
                         "+-that)")


def _check_max_repeats(value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not (
            value == 0 or MIN_ADAPTIVE_REPEATS <= value <= MAX_REPEATS):
        raise UsageError(f"--max-repeats {value!r} is not allowed; allowed: 0 (default: {DEFAULT_MOST_REPEATS} with "
                         f"--until-width) or {MIN_ADAPTIVE_REPEATS} (the fewest samples a side whose ratio has a 95% "
                         f"interval) to {MAX_REPEATS}")


def _check_node(value: str) -> None:
    places = value.split(",") if value else []
    if len(places) > MAX_PLACES:
        raise UsageError(f"--node {value!r} names {len(places)} places; allowed: 1 to {MAX_PLACES}")
    if len(places) == 1 and not is_node_name(value):
        raise UsageError(f"--node {value!r} is not a node name; allowed: {NODE_NAME_ALLOWED} "
                         "(`cloudbox node list` names the enrolled ones)")
    for p in places:
        if not is_node_name(p):
            raise UsageError(f"--node {value!r}: {p!r} is not a node name; allowed: {NODE_NAME_ALLOWED}, in a comma "
                             f"list of places with `{LOCAL_PLACE}` for this host (`cloudbox node list` names the "
                             "enrolled ones)")
    if len(set(places)) < len(places):
        twice = sorted({p for p in places if places.count(p) > 1})
        raise UsageError(f"--node {value!r} names {', '.join(twice)} twice; allowed: each place once (--guests "
                         "says how many guests in all)")
    if places == [LOCAL_PLACE]:
        raise UsageError(f"--node {LOCAL_PLACE} alone is this host; allowed: no --node for a run here, or "
                         f"{LOCAL_PLACE} with enrolled nodes (--node {LOCAL_PLACE},be1) to spread the guests")



@dataclass
class RunSpec:
    """A run's settings. The fields declared with run_option() are `cloudbox run`'s options; the others are set by
    the front-end or a study run and never typed by a person."""

    profile: str = run_option(
        flags=("--profile", "-p"),
        help=f"preset or user profile name, or a .toml file; with --guests N, several joined by {MIX} for a mixed "
             f"run, the guests taking them in turn (virtio-file{MIX}kvm-cache-none)")
    suite: str = run_option(
        "all", flags=("--suite", "-s"),
        help="what to measure: storage, network, all, or guest (launch the profile's guest and keep it until "
             "cancelled)",
        title="Suite", control="select", closed=True, form_default="storage",
        choices=(Choice("storage"), Choice("network"), Choice("all", "both"), Choice("guest", offered=False)))
    size: str = run_option(
        "quick", flags=("--size",), help="test size: quick (128 MiB), study (2x guest RAM, >= 2 GiB) or e.g. 512M, 4G",
        title="Size", control="select", check=_check_size,
        choices=(Choice("quick", "quick (128 MiB, 5 s tests)"),
                 Choice("study", "study-sized (2x guest RAM, 30 s tests)")))
    storage_tests: str = run_option(
        "standard", flags=("--tests",), help=f"storage tests: {', '.join(catalogue.TEST_SETS)}, or comma-separated ids",
        title="Storage tests", control="select", metavar="TESTS", check=_check_tests, form_default="study",
        choices=tuple(Choice(k, f"{k}: {', '.join(v)}") for k, v in catalogue.TEST_SETS.items()))
    net_tests: str = run_option(
        "netperf", flags=("--net-tests",), help="netperf, iperf3, both, or comma-separated ids",
        choices=tuple(Choice(k) for k in catalogue.NET_SETS), check=_check_net_tests)
    net_seconds: int = run_option(
        0, flags=("--net-seconds",),
        help="seconds per network test's sample (default 30; quick size 5, shared by its repeats, >= 2 each)",
        check=_seconds("--net-seconds", "30 s, or at quick size 5 s shared by the repeats"))
    runtime: int = run_option(
        0, flags=("--runtime",),
        help="seconds cap per random I/O test's sample (default 30; quick size 5, shared by its repeats, >= 2 each)",
        check=_seconds("--runtime", "30 s, or at quick size 5 s shared by the repeats"))
    work_dir: str = run_option(
        "", flags=("--work-dir",), help="directory on the file system under test (file backings)")
    device: str = run_option(
        "", flags=("--device",), help="whole device for block-device backings (else a loop device)")
    destroy: str = run_option(
        "", flags=("--destroy",), help="confirm destroying --device's data by naming it (e.g. sdb)", metavar="NAME")
    nic: str = run_option(
        "", flags=("--nic",), help="the host NIC whose SR-IOV virtual function the guest gets (network.attach = sriov)",
        metavar="NAME", check=_check_nic)
    node: str = run_option(
        "", flags=("--node",),
        help="run on this enrolled back-end (front-end only; `cloudbox node list`); with --guests N, a comma list "
             f"to spread them over (`{LOCAL_PLACE}` is this host: --node {LOCAL_PLACE},be1); default: this host",
        title="Where", control="select", metavar="NAME[,NAME...]", check=_check_node,
        choices=(Choice("", "this host"),))  # the TUI adds the enrolled nodes and the spreads over them
    agent_timeout: float = run_option(
        DEFAULT_AGENT_TIMEOUT, flags=("--agent-timeout",),
        help=f"seconds to wait for the guest to boot to its agent (default {DEFAULT_AGENT_TIMEOUT:g}; under TCG or "
             "nested KVM a guest that misses it is launched once more)",
        metavar="SECONDS", check=_check_agent_timeout)
    # Set by the front-end for a run on a back-end (no option: never typed by a person): its private address and
    # the netserver/iperf3 ports it opened there. The guest then joins the node's private bridge and the network
    # tests also go to the front-end.
    peer: str = ""
    peer_netperf_port: int = 0
    peer_iperf3_port: int = 0
    peer_iperf3_ports: list[int] = field(default_factory=list)  # --guests N: an iperf3 server per guest
    # Set by the front-end for an NFS profile's run on a back-end: where it serves the run's export (its private
    # address and ganesha's port). The node's guests and its host mount it from there.
    nfs_host: str = ""
    nfs_port: int = 0
    # Set by the front-end for a block-volume profile's run on a back-end: where it serves the volume
    # (core.spec.remote: iscsi://, nbds://, nvme+tcp://, aoe:); the node's host or guest attaches it from there.
    volume_uri: str = ""
    # Suite propagation only (set by `cloudbox study run`, no option): image sizes in bytes, one per sample, in order.
    propagate: list[int] = field(default_factory=list)
    # Set by `cloudbox study run` (no option): its study, the seed that shuffled its profiles and their order, which
    # the run's provenance keeps (the study report shows them): {"study": "a", "seed": 1234, "order": [...]}.
    study_run: dict[str, Any] = field(default_factory=dict)
    guests: int = run_option(
        1, flags=("--guests",),
        help="benchmark guests of the profile to run at once on this host, each with a disk and a NIC of its own, "
             "their tests started together; stores each guest's figures and their sum; a list such as "
             "1,2,4 runs one run per count and prints them in one table",
        title="Guests at once", control="input", metavar="N[,N...]", check=_check_guests, sweep=True)
    cpu_overcommit: float = run_option(
        1.0, flags=("--cpu-overcommit",),
        help="with --guests N, guest vCPUs allowed per host CPU (default 1: each vCPU gets a host CPU); above 1 "
             "the guests share CPUs and their figures carry the vcpu-overcommit caveat",
        title="vCPUs per host CPU", control="input", metavar="RATIO", check=_check_cpu_overcommit)
    repeats: int = run_option(
        1, flags=("--repeats",),
        help="measure each test this many times (in each guest boot), bare metal and guest taking turns sample by "
             "sample (ABAB...), the guest booted once and idle while bare metal runs; each figure is then the "
             "median of its samples with its 95% interval (from 6), each ratio to bare metal with its interval "
             "(from 4 a side); with --until-width, the fewest repeats",
        title="Repeats", control="input", metavar="N", check=_whole("--repeats", 1, MAX_REPEATS, "samples a side"))
    boots: int = run_option(
        1, flags=("--boots",),
        help="repeat the tests in this many guest boots (the guest destroyed and launched afresh between them, its "
             "disk kept): --repeats N in each, stored with the boot",
        metavar="M", check=_whole("--boots", 1, MAX_BOOTS, "guest boots"))
    until_width: float = run_option(
        0.0, flags=("--until-width",),
        help="repeat each test until its guest/bare-metal ratio's 95% interval is within +-W% of the ratio, or "
             f"--max-repeats; --until-width alone is W = {DEFAULT_WIDTH:g} (default 0: off)",
        metavar="W", check=_check_until_width, const=DEFAULT_WIDTH)
    max_repeats: int = run_option(
        0, flags=("--max-repeats",),
        help=f"with --until-width, the most repeats of a test (default {DEFAULT_MOST_REPEATS})",
        metavar="K", check=_check_max_repeats)
    # Set by the front-end for one node's part of a spread run (no option): each test waits for the front-end's
    # start instant (core.run.hold); it names the coordinating run ("fe1 run 12, be1 g2 of 2 guests").
    hold: str = ""
    # ... and the number its first guest has in the whole run (its files on a shared NFS export are named by it).
    first_guest: int = 1

    def validate(self) -> None:
        """Every option's value against its declaration; a UsageError for the first that is not allowed."""
        for opt in RUN_OPTIONS:
            if opt.field == "suite" and self.suite == PROPAGATION:
                continue  # not a --suite choice: only a study run makes one, and its sizes are checked below
            opt.validate(getattr(self, opt.field))
        if self.wants_storage:
            _check_records_fit(self.storage_tests, self.size)
            jobs = [t.id for t in catalogue.resolve_tests(self.storage_tests) if t.tool in catalogue.JOB_TOOLS]
            if jobs and self.guests < 2:
                raise UsageError(f"storage test(s) {', '.join(jobs)} run one job (MPI, or fio's client/server) across "
                                 "guests; allowed: --guests 2 or more, or --tests without them")
            if jobs and (self.peer or self.nfs_host or self.volume_uri):  # the guests take private leases
                raise UsageError(jobs_on_private_network(jobs))
        if not isinstance(self.propagate, list):
            raise UsageError(f"image sizes to propagate {self.propagate!r} are not allowed; allowed: a list of sizes "
                             "in bytes")
        if self.propagation:
            _check_propagation(self)
        elif self.propagate:
            raise UsageError(f"image sizes to propagate belong to a propagation run, not to --suite {self.suite}")
        if self.guests > 1:
            _check_many_guests(self)
        if self.spread:
            _check_spread(self)
        if self.repeated:
            _check_repeated(self)
        elif self.max_repeats:
            raise UsageError(f"--max-repeats {self.max_repeats} caps --until-width's repeats; allowed: with "
                             "--until-width W, or none")
        if len(self.profiles) > 1:
            _check_mix(self)
        _check_nfs_server(self.nfs_host, self.nfs_port)
        if self.volume_uri:
            remote.parse(self.volume_uri)
        _check_peer_ports(self)
        _check_study_run(self.study_run)
        if isinstance(self.first_guest, bool) or not isinstance(self.first_guest, int) or \
                not 1 <= self.first_guest <= MAX_GUESTS - self.guests + 1:
            raise UsageError(f"first guest {self.first_guest!r} is not allowed; allowed: 1 to "
                             f"{MAX_GUESTS - self.guests + 1} (the front-end numbers a spread run's guests)")

    @property
    def profiles(self) -> list[str]:
        """The profile references given: one, or a mixed run's several (guest k runs the ((k-1) mod m)-th)."""
        return split_mix(self.profile)

    @property
    def places(self) -> list[str]:
        """Where the run's guests go: [] for this host, one enrolled node, or several places (a spread run)."""
        return self.node.split(",") if self.node else []

    @property
    def spread(self) -> bool:
        """The guests spread over several places, coordinated by this host (core.run.spread)."""
        return len(self.places) > 1

    @property
    def wants_storage(self) -> bool:
        return self.suite in ("storage", "all")

    @property
    def wants_mpi(self) -> bool:
        """An MPI job among the storage tests: the guests boot with the MPI layer and talk on the run's bridge."""
        return self.wants_storage and any(t.tool == catalogue.MPI_TOOL
                                          for t in catalogue.resolve_tests(self.storage_tests))

    @property
    def wants_links(self) -> bool:
        """A job across the guests among the storage tests (MPI, fio's client/server): the guests talk on the run's
        bridge."""
        tests = catalogue.resolve_tests(self.storage_tests) if self.wants_storage else []
        return any(t.tool in catalogue.JOB_TOOLS for t in tests)

    @property
    def wants_network(self) -> bool:
        return self.suite in ("network", "all")

    @property
    def session(self) -> bool:
        """A guest session: launched, then held until stopped (no tests)."""
        return self.suite == "guest"

    @property
    def repeated(self) -> bool:
        """Each test measured more than once, or across guest boots: the run alternates bare metal and guest sample
        by sample (core.run.repeated)."""
        return self.repeats > 1 or self.boots > 1 or self.until_width > 0

    @property
    def planned_samples(self) -> int:
        """A test's samples a side as planned: --repeats in each of --boots (with --until-width, the fewest)."""
        return self.repeats * self.boots

    @property
    def most_repeats(self) -> int:
        """A test's repeats in one guest boot at most: --repeats, or with --until-width --max-repeats (its
        default), never fewer than --repeats."""
        if not self.until_width:
            return self.repeats
        return max(self.repeats, self.max_repeats or DEFAULT_MOST_REPEATS)

    @property
    def propagation(self) -> bool:
        """Study B's image-propagation sweep: a guest provisioned from an image of each size in `propagate`."""
        return self.suite == PROPAGATION

    def propagation_steps(self) -> list[tuple[int, str]]:
        """(image size, plan step test) per sample: the size's test name with the sample's number at that size in
        this run ("propagate-64m#2"), so that every sample is a step of its own."""
        seen: dict[int, int] = {}
        out = []
        for size in self.propagate:
            seen[size] = seen.get(size, 0) + 1
            out.append((size, f"{propagation_test(size)}#{seen[size]}"))
        return out

    def plan(self) -> list[PlanStep]:
        """The run's steps in execution order (the guest's launch is ("guest", "boot")): what a watcher needs to
        turn per-test progress into whole-run progress."""
        if self.propagation:
            return [PlanStep("guest", step) for _, step in self.propagation_steps()]
        tests = [t.id for t in catalogue.resolve_tests(self.storage_tests)] if self.wants_storage else []
        if self.repeated:
            return self._repeated_plan(tests)
        out = [PlanStep("baseline", t) for t in tests]
        out.append(PlanStep("guest", BOOT))
        out += [PlanStep("guest", t) for t in tests]
        if self.wants_network:
            for nt in resolve_net_tests(self.net_tests):
                out += [PlanStep("guest", nt.id), PlanStep("baseline", nt.id)]
                if self.peer:
                    fe = nt.id + catalogue.FRONTEND_SUFFIX
                    out += [PlanStep("guest", fe), PlanStep("baseline", fe)]
        return out

    def _repeated_plan(self, tests: list[str]) -> list[PlanStep]:
        """A repeated run's steps: per guest boot its launch, then each test's repeats, bare metal and guest in turn
        (a network test: guest first, as in a run measured once); with --until-width, to --max-repeats (the
        executor drops the repeats a test did not need and says so with a revised plan)."""
        n = self.most_repeats
        out = []
        for boot in range(1, self.boots + 1):
            out.append(PlanStep("guest", BOOT, boot=boot))
            for t in tests:
                for i in range(1, n + 1):
                    r = (boot - 1) * n + i
                    out += [PlanStep("baseline", t, r, boot), PlanStep("guest", t, r, boot)]
            if self.wants_network:
                for nt in resolve_net_tests(self.net_tests):
                    ids = [nt.id, *([nt.id + catalogue.FRONTEND_SUFFIX] if self.peer else [])]
                    for i in range(1, n + 1):
                        r = (boot - 1) * n + i
                        for tid in ids:
                            out += [PlanStep("guest", tid, r, boot), PlanStep("baseline", tid, r, boot)]
        return out

    def as_dict(self) -> dict[str, Any]:
        """The spec's settings; `propagate` only in a propagation run, `guests` only when more than one,
        `cpu_overcommit` only above 1, the NFS server only when there is one, the repetition settings only when not
        their defaults and `nic` only when named, so every other run's stored record and request to a node read as
        before they existed."""
        d = asdict(self)
        if not d["propagate"]:
            del d["propagate"]
        if d["guests"] == 1:
            del d["guests"]
        if not d["peer_iperf3_ports"]:
            del d["peer_iperf3_ports"]
        if not d["nfs_host"]:
            del d["nfs_host"], d["nfs_port"]
        if not d["volume_uri"]:
            del d["volume_uri"]
        if not d["hold"]:
            del d["hold"]
        if not d["study_run"]:
            del d["study_run"]
        if d["cpu_overcommit"] == 1:
            del d["cpu_overcommit"]
        if d["first_guest"] == 1:
            del d["first_guest"]
        for name, once in (("repeats", 1), ("boots", 1), ("until_width", 0), ("max_repeats", 0)):
            if d[name] == once:
                del d[name]
        if not d["nic"]:
            del d["nic"]
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "run settings") -> RunSpec:
        """A spec from its dict form (a detached executor's argument, a sweep file, a front-end's request);
        unknown settings are refused by name (a cloudbox of another version wrote them)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise CloudboxError(f"{source}: unknown run setting(s) {', '.join(unknown)}; allowed: "
                                f"{', '.join(sorted(known))}")
        if "profile" not in data:
            raise CloudboxError(f"{source}: no profile given")
        return cls(**data)



@dataclass(frozen=True)
class PlanStep:
    """One step of a run's plan: a test (or the guest's boot) on one side; in a repeated run, which of the test's
    samples (`repeat`, 1..n in measured order) in which guest boot (`boot`; the boot step's own number)."""

    side: str  # "baseline" | "guest"
    test: str
    repeat: int = 1
    boot: int = 1


def _check_records_fit(tests: str, size: str) -> None:
    """fio refuses a file smaller than one block, so a custom --size must hold the largest record of --tests."""
    n, _ = parse_size(size, 1024)
    big = max(catalogue.resolve_tests(tests), key=lambda t: catalogue.block_bytes(t.bs))
    if n < catalogue.block_bytes(big.bs):
        raise UsageError(f"--size {size!r} is smaller than one {big.bs} record of {big.id}; allowed: a size of at "
                         f"least {big.bs.upper()}, or --tests without {big.id}")
    on_fs = [t.id for t in catalogue.resolve_tests(tests) if t.makes_fs]
    if n < catalogue.FS_MIN_SIZE and on_fs:
        raise UsageError(f"--size {size!r} is too small for {', '.join(on_fs)} (a file system made on the disk and "
                         f"the test's file on it); allowed: a size of at least {catalogue.FS_MIN_SIZE // 1024**2}M, "
                         f"or --tests without {', '.join(on_fs)}")


def _check_propagation(spec: RunSpec) -> None:
    """A propagation run: on this host, with whole-MiB image sizes, and none of the options it has no use for."""
    if spec.node:
        raise UsageError(f"--node {spec.node!r}: the image-propagation sweep runs on this host only for now (on a "
                         "back-end it would have to copy the images over the network, which is not implemented "
                         "yet); allowed: a study run without --node")
    for flag, value in (("--device", spec.device), ("--destroy", spec.destroy)):
        if value:
            raise UsageError(f"{flag} {value!r} does not apply to the image-propagation sweep (its guests' disks are "
                             "copies in --work-dir); allowed: none")
    if not spec.propagate:
        raise UsageError("a propagation run needs image sizes: `cloudbox study run` takes them from the study's "
                         "[propagation] table")
    if len(spec.propagate) > MAX_PROPAGATE_SAMPLES:
        raise UsageError(f"{len(spec.propagate)} propagation samples in one run; allowed: at most "
                         f"{MAX_PROPAGATE_SAMPLES}")
    for size in spec.propagate:
        if isinstance(size, bool) or not isinstance(size, int) or size % MIB or not MIN_SIZE <= size <= MAX_IMAGE_SIZE:
            raise UsageError(f"image size {size!r} is not allowed; allowed: a whole number of MiB from "
                             f"{MIN_SIZE // MIB} MiB to {MAX_IMAGE_SIZE // MIB} MiB, in bytes")


def _check_many_guests(spec: RunSpec) -> None:
    """N guests at once: storage and network tests on this host, each guest on a store and a NIC of its own."""
    n = spec.guests
    if not (spec.wants_storage or spec.wants_network):
        raise UsageError(f"--guests {n} runs the storage and network tests of N guests at once; --suite "
                         f"{spec.suite} runs one guest; allowed with --guests > 1: --suite storage, network or all")
    if spec.device:
        raise UsageError(f"--guests {n} with --device {spec.device!r}: one device cannot be the whole disk of "
                         f"{n} guests; allowed: no --device (each guest gets a store of its own in --work-dir)")
    bonnie = [t.id for t in catalogue.resolve_tests(spec.storage_tests) if t.tool == "bonnie"]
    if bonnie:
        raise UsageError(f"--guests {n} with --tests {spec.storage_tests!r}: {', '.join(bonnie)} runs in one guest "
                         "at a time (its figures are per file system, not summed over N); allowed with --guests > 1: "
                         "--tests without bonnie")


def _check_repeated(spec: RunSpec) -> None:
    """Repeats: of a test run (one guest, bare metal beside it), the samples a side within MAX_SAMPLES, the adaptive
    stop within one guest boot."""
    what = (f"--repeats {spec.repeats}" if spec.repeats > 1 else f"--boots {spec.boots}" if spec.boots > 1
            else f"--until-width {spec.until_width:g}")
    if spec.session or spec.propagation:
        raise UsageError(f"{what} repeats a run's tests; --suite {spec.suite} has none to repeat (a propagation "
                         "run's samples are its image sizes); allowed: --suite storage, network or all")
    if spec.guests > 1 or spec.hold:
        raise UsageError(f"{what} with --guests {spec.guests}: repeats of N guests at once are not supported yet; "
                         "allowed: --guests 1, or --repeats 1 (--guests 1,2,4 sweeps the counts)")
    if spec.until_width and spec.boots > 1:
        raise UsageError(f"--until-width {spec.until_width:g} with --boots {spec.boots}: the adaptive stop counts "
                         "repeats within one guest boot; allowed: one of them")
    if spec.max_repeats and spec.max_repeats < spec.repeats:
        raise UsageError(f"--max-repeats {spec.max_repeats} is fewer than --repeats {spec.repeats} (the fewest "
                         f"with --until-width); allowed: {spec.repeats} to {MAX_REPEATS}")
    if spec.most_repeats * spec.boots > MAX_SAMPLES:
        raise UsageError(f"--repeats {spec.most_repeats} in each of --boots {spec.boots} is "
                         f"{spec.most_repeats * spec.boots} samples a side of each test; allowed: at most "
                         f"{MAX_SAMPLES}")


def _check_study_run(tag: Any) -> None:
    """A study run's tag: none, or its study's name, a seed and the profiles' order (core.studies.planning)."""
    if tag == {}:
        return
    if not (isinstance(tag, dict) and set(tag) == {"study", "seed", "order"} and isinstance(tag["study"], str)
            and isinstance(tag["seed"], int) and isinstance(tag["order"], list)
            and all(isinstance(p, str) and len(p) <= 200 for p in tag["order"]) and len(tag["order"]) <= 64):
        raise UsageError(f"study run {tag!r} is not allowed; allowed: none, or what `cloudbox study run` sets: "
                         "study, seed and order (profile names)")


def _check_nfs_server(host: str, port: int) -> None:
    """The front-end's NFS server for a back-end's run: an IPv4 address and a port, or neither."""
    if not host and not port:
        return
    try:
        ok = isinstance(ipaddress.ip_address(host), ipaddress.IPv4Address)
    except ValueError:
        ok = False
    if not ok or isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise UsageError(f"NFS server {host!r} port {port!r} is not allowed; allowed: the front-end's private IPv4 "
                         "address and a port from 1 to 65535 (the front-end sets both)")


def _check_peer_ports(spec: RunSpec) -> None:
    """The front-end's iperf3 ports for N guests: none, or one per guest, each a port."""
    ports = spec.peer_iperf3_ports
    if not ports:
        return
    if (not isinstance(ports, list) or len(ports) != spec.guests
            or not all(isinstance(p, int) and not isinstance(p, bool) and 1 <= p <= 65535 for p in ports)):
        raise UsageError(f"the front-end's iperf3 ports {ports!r} are not allowed; allowed: one port from 1 to 65535 "
                         f"for each of the run's {spec.guests} guests (the front-end sets them)")


def jobs_on_private_network(jobs: list[str]) -> str:
    """Why a job across guests does not run where the guests sit on the private network (a back-end's run with
    network tests to the front-end or on its volume or export)."""
    return (f"storage test(s) {', '.join(jobs)} run one job across the guests, whose servers in the guests take no "
            "authentication (fio --server runs any job it is sent, exec_prerun included, as root; Open MPI's "
            "out-of-band listener takes any connection); a back-end's guests take leases on the private network for "
            "network tests to the front-end and for its volumes and exports, where every host on that network would "
            "reach those servers; allowed: these tests in a run of their own on the node's own disks (--suite "
            "storage, a profile without disk.backing = network-volume), or the other storage tests here")


def _check_spread(spec: RunSpec) -> None:
    """Guests spread over several places: at least one each; storage tests on each guest's own disk or on the
    front-end's one NFS export, network tests from each guest to its own place's host (MPI jobs across places are
    not spread yet)."""
    places, n = spec.places, spec.guests
    where = f"--node {spec.node}"
    if n < len(places):
        raise UsageError(f"{where} spreads the guests over {len(places)} places; --guests {n} leaves one empty; "
                         f"allowed: --guests {len(places)} or more")
    jobs = [t.id for t in catalogue.resolve_tests(spec.storage_tests) if t.tool in catalogue.JOB_TOOLS]
    if jobs:
        raise UsageError(f"{where} with --tests {', '.join(jobs)}: a job across places (MPI, fio's client/server) is "
                         "not supported yet; allowed: the fio and dd tests, or these with every guest on one place")
    if spec.hold:
        raise UsageError(f"{where}: a part of a spread run runs on one place; allowed: one node")


def _check_mix(spec: RunSpec) -> None:
    """A mixed run: N guests of several profiles, taken in turn wherever the guests go (the profiles' own agreement
    is checked once they are loaded: core.spec.profiles.mix_problem)."""
    m, given = len(spec.profiles), f"--profile {spec.profile}"
    if spec.guests < m:
        raise UsageError(f"{given} names {m} profiles, one per guest in turn; --guests {spec.guests} leaves "
                         f"{'one' if m - spec.guests == 1 else m - spec.guests} unused; allowed: --guests {m} or more")


def guest_profile_index(k: int, m: int) -> int:
    """Which of a mixed run's m profiles guest k (1-based) runs: they take turns."""
    return (k - 1) % m


def split_guests(n: int, places: int) -> list[int]:
    """N guests over the places, as evenly as they go, the first places taking one more: 5 over 2 -> [3, 2]."""
    return [n // places + (1 if i < n % places else 0) for i in range(places)]



def _options() -> tuple[RunOption, ...]:
    """The run options, in RunSpec's order: each declaration with its field's name, type and default."""
    types = typing.get_type_hints(RunSpec)
    out = []
    for f in fields(RunSpec):
        if (declared := f.metadata.get(_OPTION)) is not None:
            required = f.default is dataclasses.MISSING
            out.append(dataclasses.replace(declared, field=f.name, type=types[f.name],
                                           default=None if required else f.default, required=required))
    return tuple(out)


RUN_OPTIONS: tuple[RunOption, ...] = _options()
OPTIONS_BY_FIELD = {o.field: o for o in RUN_OPTIONS}


def option(field: str) -> RunOption:
    return OPTIONS_BY_FIELD[field]
