"""A study run: per profile the cells still to measure (plan_run) and how each is sampled (the study's plan per
size: repeats, or until the ratio's interval is narrow enough), a series' missing repeats and the sweep's missing
samples, as the validated runs that `cloudbox study run` and the TUI's Studies screen both start (prepare_run), the
profiles' runs in an order shuffled by a seed the runs record, refused before anything starts when the largest would
not fit."""

from __future__ import annotations

import platform
import random
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from .. import paths
from ..bench import propagation
from ..disks import backing
from ..errors import NoSpace, UsageError
from ..record.rows import Run
from ..run import preflight
from ..run.repeated import repeat_problem
from ..spec import profiles
from ..spec.catalogue import FRONTEND_SUFFIX, is_storage_test
from ..spec.runspec import DEFAULT_MOST_REPEATS, RunSpec, parse_size
from ..views.compare import guest_count
from .evidence import profile_facts
from .imagesweep import PlannedSweep, plan_sweep
from .loading import ALLOWED, list_studies, load_study, plan_problems
from .schema import SINGLE, Plans, RepeatPlan, SeriesPlan, Study, needs_node
from .series import series_runs


@dataclass
class PlannedProfile:
    """One profile of a study run: the tests still to measure, those already stored (test -> run id), those this
    placement cannot measure, or why the profile cannot run at all."""

    profile: str
    run: list[str] = field(default_factory=list)
    stored: dict[str, int] = field(default_factory=dict)
    elsewhere: list[str] = field(default_factory=list)
    refused: str | None = None
    repeats: int = 1  # runs of `run` still to do: 1, or in a series the repeats missing
    series: SeriesPlan | None = None
    have: int = 0  # in a series: the repeats already stored
    sampling: RepeatPlan = SINGLE  # how each missing test is sampled: the study's plan at the size
    single: str = ""  # why the profile takes one sample a side though the plan asks more ("" when it does not)

    def spec(self, size: str, node: str = "", **options: Any) -> RunSpec:
        """The run that measures the missing tests, sampled as planned (the run options of `cloudbox run` in
        `options`)."""
        storage = [t for t in self.run if is_storage_test(t)]
        network = list(dict.fromkeys(t.removesuffix(FRONTEND_SUFFIX) for t in self.run if t not in storage))
        suite = "all" if storage and network else ("network" if network else "storage")
        extra: dict[str, Any] = {}
        if storage:
            extra["storage_tests"] = ",".join(storage)
        if network:
            extra["net_tests"] = ",".join(network)
        if self.series is not None and self.series.guests > 1:
            extra["guests"] = self.series.guests
        return RunSpec(profile=self.profile, suite=suite, size=size, node=node, **extra,
                       **{k: v for k, v in self.sampling.options.items() if k not in options}, **options)


def plan_run(study: Study, runs: Sequence[Run], hashes: Mapping[str, str], *, size: str, node: str,
             backend: bool, unavailable: Mapping[str, str] | None = None, again: bool = False) -> list[PlannedProfile]:
    """What `study run` has to do: per profile, the tests not yet stored by a completed run of the profile as it is
    today (same hash), at `size`, on `node` (the node name runs record: the back-end's with --node, else this
    host's). With `again` every test runs. Unless the runs go to a back-end (`backend`), the front-end tests ("-fe")
    are left out: only a run on a back-end measures them. Each test is sampled as the study's plan at `size` says
    (Study.repeat_plan), and a test counts as stored only when its run took the samples that plan asks; a profile
    whose runs cannot be repeated (a network volume) takes one sample a side, and its plan line says why."""
    unavailable = unavailable or {}
    series = study.series_plan(size)
    sampling = study.repeat_plan(size)
    out = []
    for name in study.profile_names:
        item = PlannedProfile(name, series=series)
        if name in unavailable:
            item.refused = unavailable[name]
            out.append(item)
            continue
        if series is not None:
            item.elsewhere = [t for t in study.test_ids if needs_node(t) and not backend]
            tests = [t for t in study.test_ids if t not in item.elsewhere]
            item.have = 0 if again else len(series_runs(runs, name, hashes.get(name), tests, size, node,
                                                        series.guests))
            item.repeats = max(0, series.repeats - item.have)
            item.run = tests if item.repeats else []
            out.append(item)
            continue
        item.sampling = sampling
        if sampling.repeated and (why := _cannot_repeat(name, study, size, sampling)):
            item.sampling, item.single = SINGLE, f"not {sampling.words()}: {why}"
        for test in study.test_ids:
            if needs_node(test) and not backend:
                item.elsewhere.append(test)
                continue
            found = None if again else _stored(runs, name, hashes.get(name), test, size, node, item.sampling)
            if found is None:
                item.run.append(test)
            else:
                item.stored[test] = found
        out.append(item)
    return out


def _cannot_repeat(name: str, study: Study, size: str, sampling: RepeatPlan) -> str:
    """Why the profile's runs cannot be sampled as planned ('' when they can): what a run would refuse before it
    starts (a network volume: one initiator at a time; what RunSpec.validate refuses)."""
    prof = profiles.find_profile(name)
    why = repeat_problem(prof)
    if not why:
        try:
            RunSpec(profile=name, suite=study.suite, size=size, **sampling.options).validate()
        except UsageError as e:
            why = str(e)
    # the plan line names the profile already, and the way out is a plan of one sample, which it takes
    return why.removeprefix(f"profile {name}: ").split("; allowed")[0]


def _stored(runs: Sequence[Run], profile: str, profile_hash: str | None, test: str, size: str,
            node: str, sampling: RepeatPlan = SINGLE) -> int | None:
    """The newest completed run of one guest of this profile (same hash), size and node with both sides of `test`
    sampled as planned (enough_samples), or None."""
    for run in sorted(runs, key=lambda r: (r.started_at or 0.0, r.id), reverse=True):
        if (run.state == "completed" and run.profile_name == profile and run.profile_hash == profile_hash
                and run.size_label == size and run.node == node and guest_count(run) == 1
                and run.measurement("guest", test) is not None and run.measurement("baseline", test) is not None
                and enough_samples(run, test, sampling)):
            return run.id
    return None


def enough_samples(run: Run, test: str, sampling: RepeatPlan) -> bool:
    """Whether `run` sampled `test` as `sampling` plans: as many samples a side (repeats x boots), or with
    until_width a stop the run recorded with its reason at that width or narrower (or the most repeats taken). A run
    measured once holds one sample: enough only for a plan of one."""
    if not sampling.repeated:
        return True
    n = min(max((m.repeat for m in run.measurements if m.side == side and m.test == test and m.instance is None),
                default=0) for side in ("guest", "baseline"))
    if not sampling.until_width:
        return n >= sampling.samples
    kept = run.provenance.repeats
    if kept is not None and kept.until_width and kept.until_width <= sampling.until_width and any(
            t.test in (test, test.removesuffix(FRONTEND_SUFFIX)) and t.reason for t in kept.tests):
        return True
    return n >= max(sampling.repeats, sampling.max_repeats or DEFAULT_MOST_REPEATS)


# ------------------------------------------------------------------------------------------- a study run to do
@dataclass
class StudyRun:
    """What `study run` will do: its size and placement, the plan per profile and the runs (validated specs)."""

    study: Study
    size: str
    node: str  # "" for this host
    plan: list[PlannedProfile]
    specs: list[RunSpec]
    offsets: list[float] = field(default_factory=list)  # a series: seconds from the start to each run's start
    sweep: PlannedSweep | None = None  # the image-propagation sweep (its run, if any, is the last of `specs`)
    seed: int = 0  # what shuffled the profiles' runs (`study run --seed` repeats the order)
    order: list[str] = field(default_factory=list)  # the profiles whose runs are to do, in the order they run

    @property
    def where(self) -> str:
        return f"on node {self.node}" if self.node else "on this host"

    @property
    def series(self) -> SeriesPlan | None:
        return self.study.series_plan(self.size)

    def headline(self) -> str:
        text = f"study {self.study.name} at {self.size} size {self.where}: {len(self.specs)} run(s) to do"
        if self.series is not None and self.specs:
            text += f", a series of {self.series.words()}"
        return text

    def lines(self) -> list[str]:
        """The plan in words, one line per profile, the order their runs go in, then the sweep's (it runs last),
        then what a loop device will stand in for."""
        return (plan_lines(self.plan) + self.order_lines() + ([self.sweep.line()] if self.sweep is not None else [])
                + self.loop_lines())

    def order_lines(self) -> list[str]:
        """The order the profiles' runs go in and the seed that shuffled it (none with fewer than two)."""
        if len(self.order) < 2:
            return []
        return [f"  order: {', '.join(self.order)} (shuffled by seed {self.seed}: --seed {self.seed} gives this "
                "order again)"]

    def loop_lines(self) -> list[str]:
        """The whole-disk profiles this run will measure on a loop device over a file (no --device on this host),
        with the rules that will then be inconclusive and how to give a disk."""
        out = []
        for spec in self.specs:
            if spec.node or spec.device or spec.propagation:
                continue
            disk = profiles.find_profile(spec.profile).disk
            if disk.backing != "block-device":
                continue
            rules = [r.id for r in self.study.rules
                     if spec.profile in (r.profile, (r.other or ("", ""))[0]) and is_storage_test(r.test)]
            out.append(f"  {spec.profile}: a whole-disk profile with no --device: it runs on a loop device over a "
                       f"file, not a whole disk, so " + (f"rule(s) {', '.join(rules)} will be inconclusive"
                                                        if rules else "its figures are labelled loop device")
                       + "; give --device /dev/DISK (and --destroy DISK when it holds data) to measure one")
        return list(dict.fromkeys(out))


def plan_lines(plan: Sequence[PlannedProfile]) -> list[str]:
    """Per profile: what runs, what is stored (with its run), what needs a back-end, or why it is skipped."""
    out = []
    for item in plan:
        if item.refused:
            out.append(f"  {item.profile}: skipped, {item.refused}")
            continue
        parts = []
        if item.series is not None:
            parts.append(f"{item.have} of {item.series.repeats} repeats stored")
        if item.run:
            parts.append("run " + ", ".join(item.run) + (f" x{item.repeats}" if item.series is not None else
                                                         f", {item.sampling.words()}" if not item.single else
                                                         f", one sample: {item.single}"))
        if item.stored:
            parts.append("stored " + ", ".join(f"{t} (#{rid})" for t, rid in item.stored.items()))
        if item.elsewhere:
            parts.append("needs --node for " + ", ".join(item.elsewhere))
        out.append(f"  {item.profile}: " + "; ".join(parts))
    return out


def with_series_plan(study: Study, size: str, *, repeats: int | None = None,
                     every_minutes: float | None = None, guests: int | None = None) -> Study:
    """The study with its series plan at `size` changed (`study run --repeats/--every/--guests`), or UsageError
    naming the option and what is allowed: a study sampled per cell (one guest) has no series to change."""
    plan = study.series_plan(size)
    if plan is None:
        series = ", ".join(e.name for e in list_studies()
                           if e.problem is None and load_study(e.path).series is not None) or "(none)"
        raise UsageError(f"--every and --guests change a series study's plan; study {study.name} is not a series: "
                         f"each cell is one guest's run, sampled as its plan says (--repeats, --until-width, "
                         f"--max-repeats and --boots change that); series studies: {series}")
    try:
        new = SeriesPlan(every_minutes=plan.every_minutes if every_minutes is None else float(every_minutes),
                         repeats=plan.repeats if repeats is None else repeats,
                         guests=plan.guests if guests is None else guests)
    except ValidationError as exc:
        field_ = str(exc.errors()[0]["loc"][0])
        flag, allowed = {"repeats": ("--repeats", ALLOWED["series.study.repeats"]),
                         "every_minutes": ("--every", ALLOWED["series.study.every_minutes"]),
                         "guests": ("--guests", ALLOWED["series.study.guests"])}[field_]
        given = {"repeats": repeats, "every_minutes": every_minutes, "guests": guests}[field_]
        raise UsageError(f"{flag} {given!r} is out of range; allowed: {allowed}") from None
    assert study.series is not None
    return study.model_copy(update={"series": study.series.model_copy(update={size: new})})


def with_repeat_plan(study: Study, size: str, *, repeats: int | None = None, until_width: float | None = None,
                     max_repeats: int | None = None, boots: int | None = None) -> Study:
    """The study with its sampling at `size` replaced by the options given (`study run --repeats/--until-width/
    --max-repeats/--boots`, as `cloudbox run` takes them: what is not given is that option's default, not the file's
    plan), or UsageError naming the option: a series study's repeats are runs (`--repeats` changes its series)."""
    asked = {"repeats": repeats, "until_width": until_width, "max_repeats": max_repeats, "boots": boots}
    given: dict[str, Any] = {k: v for k, v in asked.items() if v is not None}
    if not given:
        return study
    if study.series is not None:
        raise UsageError(f"{', '.join('--' + k.replace('_', '-') for k in given)}: study {study.name} is a series, "
                         "its repeats are runs spaced in time; allowed: --repeats, --every and --guests (its series "
                         "plan)")
    RunSpec(profile=study.profile_names[0], size=size, **given).validate()  # the flags' own checks and words
    plan = RepeatPlan(**given)
    if found := plan_problems(plan):
        key, value, why = found[0]
        raise UsageError(f"--{key.replace('_', '-')} {value!r}: {why}; allowed: {ALLOWED[f'plan.{size}.{key}']}")
    plans = (study.plan or Plans()).model_copy(update={size: plan})
    return study.model_copy(update={"plan": plans})


def check_run(study: Study, size: str | None, node: str = "", **options: Any) -> str:
    """The size a study run uses (the study's first when None), after refusing a size the study does not offer and
    bad run options (UsageError), before anything is opened or recorded."""
    size = size or study.sizes[0]
    if size not in study.sizes:
        raise UsageError(f"--size {size!r} is not offered by study {study.name}; allowed: {', '.join(study.sizes)}")
    spec = RunSpec(profile=study.profile_names[0], size=size, node=node, **options)
    spec.validate()
    # the node and the device the whole study names, checked as a run's are before it is recorded
    found = preflight.node_problems(spec)
    if (dev := preflight.device_problem(spec)) is not None:
        found.append(dev)
    if found:
        raise UsageError(str(found[0])) if found[0].usage else found[0]
    return size


def prepare_run(study: Study, runs: Sequence[Run], *, size: str | None = None, node: str = "", again: bool = False,
                seed: int | None = None, **options: Any) -> StudyRun:
    """The study run `cloudbox study run` (and the TUI's Studies screen) starts: the cells not stored yet for the
    profiles as they are today, at `size`, on `node` (this host when ""), as validated RunSpecs, and after them the
    sweep's missing samples as one propagation run. `runs` are the stored runs (ResultStore.list_runs(): the cells
    count completed ones, the sweep the samples of every finished propagation run). The profiles' runs go in an
    order shuffled by `seed` (drawn when None; the same seed, the same order), each run's spec carrying the study
    run's seed and order (RunSpec.study_run) for the report."""
    size = check_run(study, size, node, **options)
    seed = secrets.randbelow(SEED_DRAWN) if seed is None else check_seed(seed)
    hashes, unavailable = profile_facts(study, here=not node)
    plan = plan_run(study, runs, hashes, size=size, node=node or platform.node(), backend=bool(node),
                    unavailable=unavailable, again=again)
    # Round r runs each profile still short of r + 1 repeats; a series spaces the rounds `every_minutes` apart. In
    # a round the profiles go in the seed's order, so that a drift of the machine over the study run does not fall
    # on the same profiles every time (the order of the whole matrix, those with nothing to do left out).
    series = study.series_plan(size)
    shuffled = shuffle(study.profile_names, seed)
    todo_items = sorted((item for item in plan if item.run), key=lambda item: shuffled.index(item.profile))
    order = [item.profile for item in todo_items]
    tag = {"study": study.name, "seed": seed, "order": order}
    specs: list[RunSpec] = []
    offsets: list[float] = []
    for r in range(max((item.repeats for item in todo_items), default=0)):
        for item in todo_items:
            if r < item.repeats:
                specs.append(item.spec(size, node, study_run=tag, **options))
                offsets.append(r * series.every_s if series else 0.0)
    sweep = plan_sweep(study, runs, hashes, size=size, node=node or platform.node(), backend=bool(node),
                       unavailable=unavailable, again=again)
    if sweep is not None and sweep.todo and not sweep.refused:
        specs.append(sweep.spec(size, **options))
        offsets.append(offsets[-1] if offsets else 0.0)
    for spec in specs:
        spec.validate()
    todo = StudyRun(study, size, node, plan, specs, offsets if series else [], sweep, seed, order)
    if not node:
        check_space(todo)
    return todo


SEED_DRAWN = 1_000_000  # a drawn seed is below this: six digits to retype
MAX_SEED = 2**32 - 1


def check_seed(seed: int) -> int:
    """`--seed`'s value, or UsageError saying what is allowed."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise UsageError(f"--seed {seed!r} is not allowed; allowed: a whole number from 0 to {MAX_SEED} (a study run "
                         "prints the one it drew)")
    return seed


def shuffle(names: Sequence[str], seed: int) -> list[str]:
    """`names` in the order `seed` shuffles them to (the same seed, the same order)."""
    out = list(names)
    random.Random(seed).shuffle(out)
    return out


def space_plan(todo: StudyRun) -> list[tuple[RunSpec, int, str]]:
    """Per test run of a study run on this host: (its spec, the bytes it writes into its work directory, what they
    are). The runs go one after the other and each removes its work directory, so the largest one decides."""
    out = []
    for spec in todo.specs:
        if spec.propagation:
            continue  # its source images stay: checked apart (propagation.check_space)
        prof = profiles.find_profile(spec.profile)
        size_bytes, _ = parse_size(spec.size, prof.guest.memory_mib)
        need, what = backing.space_needed(prof.disk.backing, size_bytes, device=spec.device or None,
                                          count=prof.disk.count)
        out.append((spec, need, what))
    return out


def check_space(todo: StudyRun) -> None:
    """Refuse a study run on this host whose largest run would not fit in the free space of the work directory's
    file system (NoSpace), before anything starts; each run still checks again at its own start. The sweep, which
    runs last, needs its source images and its largest instance copy (propagation.check_space)."""
    allowed = ("--size quick, " if todo.size != "quick" and "quick" in todo.study.sizes else "") \
        + "a --work-dir on a larger file system, or more free space there"
    plan = space_plan(todo)
    spec, need, what = max(plan, key=lambda p: p[1]) if plan else (None, 0, "")
    if spec is not None and need:
        where, free = backing.free_bytes_at(paths.work_base(spec.work_dir))
        if free < need + backing.MARGIN:
            raise NoSpace(
                f"{where}: not enough free space for study {todo.study.name} at {todo.size} size: its largest run "
                f"(profile {spec.profile}) needs {backing.human_size(need + backing.MARGIN)} for the {what} "
                f"({backing.human_size(backing.MARGIN)} margin included), {backing.human_size(free)} free. "
                f"Allowed: {allowed}")
    for spec in todo.specs:
        if spec.propagation:
            propagation.check_space(spec.propagate, paths.work_base(spec.work_dir), hint=allowed)
