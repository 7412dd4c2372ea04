"""Study B's image-propagation sweep: the samples finished propagation runs stored, those a study run still has to
measure (plan_sweep), those a report uses (gather_sweep) and the line fitted through them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..bench import propagation
from ..bench.propagation import Fit, NoFit
from ..record.rows import Run
from ..spec.runspec import PROPAGATION, RunSpec
from .schema import PropagationPlan, Study


@dataclass
class PlannedSweep:
    """The image-propagation sweep of a study run: its profile and plan, the samples stored per image size (size in
    bytes -> count, at most `repeats`), the samples still to measure (image sizes in the order they run), or why it
    is skipped."""

    profile: str
    plan: PropagationPlan
    have: dict[int, int] = field(default_factory=dict)
    todo: list[int] = field(default_factory=list)
    refused: str | None = None

    def spec(self, size: str, **options: Any) -> RunSpec:
        """The propagation run measuring `todo` (work_dir and agent_timeout of `options` passed on)."""
        passed = {k: v for k, v in options.items() if k in ("work_dir", "agent_timeout")}
        return RunSpec(profile=self.profile, suite=PROPAGATION, size=size, propagate=list(self.todo), **passed)

    def line(self) -> str:
        """The sweep in the plan's words: stored and to do per image size."""
        head = f"  propagation sweep ({self.profile}): "
        if self.refused:
            return head + f"skipped, {self.refused}"
        per = [f"{propagation.size_text(sz)} {min(self.have.get(sz, 0), self.plan.repeats)} of {self.plan.repeats}"
               for sz in self.plan.sizes]
        todo = f"run {len(self.todo)} sample(s)" if self.todo else "nothing to run"
        return head + f"{todo}; stored " + ", ".join(per)


def sweep_samples(runs: Sequence[Run], profile: str, profile_hash: str | None, size: str | None,
                  node: str | None, *, today: str | None = None) -> list[propagation.Sample]:
    """The samples of finished propagation runs (completed, or stopped part-way: each sample is stored whole) of
    `profile` (same hash when given), at `size` and on `node` (any when None), oldest first; those of a run whose
    profile hash is not `today`'s are labelled profile changed."""
    out: list[propagation.Sample] = []
    for run in runs:
        if (propagation.finished(run) and run.profile_name == profile
                and (profile_hash is None or run.profile_hash == profile_hash)
                and (size is None or run.size_label == size) and (node is None or run.node == node)):
            out += propagation.samples_of(run, profile_hash=today)
    return sorted(out, key=lambda x: (x.started_at or 0.0, x.run_id))


def plan_sweep(study: Study, runs: Sequence[Run], hashes: Mapping[str, str], *, size: str, node: str,
               backend: bool, unavailable: Mapping[str, str] | None = None,
               again: bool = False) -> PlannedSweep | None:
    """The sweep's samples still to measure at `size` on `node`: per image size, `repeats` less those stored by
    finished propagation runs of the profile as it is today (all of them with `again`). None for a study without a
    sweep; skipped, saying why, when the runs go to a back-end or the profile cannot run here."""
    plan = study.sweep_plan(size)
    if plan is None:
        return None
    assert study.propagation is not None
    name = study.propagation.profile
    item = PlannedSweep(name, plan)
    why = (unavailable or {}).get(name)
    if backend:
        why = ("the sweep runs on this host only for now (on a back-end it would copy the images over the network, "
               "which is not implemented yet): run it without --node")
    if why:
        item.refused = why
        return item
    for x in [] if again else sweep_samples(runs, name, hashes.get(name), size, node):
        item.have[x.size_bytes] = item.have.get(x.size_bytes, 0) + 1
    missing = {sz: max(0, plan.repeats - item.have.get(sz, 0)) for sz in plan.sizes}
    # Round by round over the sizes: drift spreads over all of them instead of tilting the slope; a cut sweep has all.
    for r in range(max(missing.values(), default=0)):
        item.todo += [sz for sz in plan.sizes if r < missing[sz]]
    return item


@dataclass(frozen=True)
class SweepRun:
    """A propagation run whose samples a report uses, as its legend lists it."""

    run_id: int
    state: str
    reason: str | None
    size_label: str | None
    accelerator: str | None
    node: str | None
    started_at: float | None


@dataclass
class SweepEvidence:
    """The stored samples of a study's image-propagation sweep at one size (`size`: the report's, else the first of
    the study's sizes holding any), per image size at most the plan's repeats, the newest of the profile as it is
    today first; and the runs they come from."""

    profile: str
    size: str | None
    plan: PropagationPlan | None
    samples: list[propagation.Sample]
    runs: list[SweepRun]

    def by_size(self) -> dict[int, list[propagation.Sample]]:
        out: dict[int, list[propagation.Sample]] = {}
        for x in sorted(self.samples, key=lambda x: (x.size_bytes, x.started_at or 0.0)):
            out.setdefault(x.size_bytes, []).append(x)
        return out


def gather_sweep(study: Study, runs: Sequence[Run], hashes: Mapping[str, str], *, size: str | None = None,
                 node: str | None = None) -> SweepEvidence | None:
    """The sweep's stored samples (SweepEvidence), None for a study without a sweep."""
    if study.propagation is None:
        return None
    name = study.propagation.profile
    sizes = [size] if size else list(study.sizes)
    at, found = sizes[0], []
    for sz in sizes:
        found = sweep_samples(runs, name, None, sz, node, today=hashes.get(name))
        if found:
            at = sz
            break
    plan = study.sweep_plan(at)
    # The newest per size, today's profile first: a new set (--again, a changed profile) takes the old one's place.
    per: dict[int, list[propagation.Sample]] = {}
    for x in found:
        per.setdefault(x.size_bytes, []).append(x)
    chosen: list[propagation.Sample] = []
    for xs in per.values():
        ranked = sorted(xs, key=lambda x: (not x.profile_changed, x.started_at or 0.0), reverse=True)
        chosen += ranked[:plan.repeats] if plan else ranked
    chosen.sort(key=lambda x: (x.size_bytes, x.started_at or 0.0))
    used = {x.run_id for x in chosen}
    sweep_runs = [SweepRun(r.id, r.state, r.reason, r.size_label, r.accelerator, r.node, r.started_at)
                  for r in sorted(runs, key=lambda r: r.id) if r.id in used]
    return SweepEvidence(name, at, plan, chosen, sweep_runs)


def sweep_fit(sweep: SweepEvidence) -> Fit | NoFit:
    """The line through the sweep's samples, or why there is none."""
    try:
        return propagation.fit(sweep.samples)
    except NoFit as e:
        return e
