"""Studies as data: what a published study measured, the numbers it published and its findings as rules that stored
runs can confirm or refute.

A study is a TOML file (studies/*.toml in the checkout, /usr/share/cloudbox/studies installed) holding:

- its matrix: the profiles (each with the paper's words for its row), the tests (each with the title of the paper's
  table it fills) and the sizes `study run` offers (`study` decides findings; `quick` is for trying things out);
- `[[paper]]`: the published numbers per cell ("profile/test", or "native/test" for the bare-metal row);
- `[[rules]]`: each finding as a comparison over one cell: the cell's number itself, or as a % of the same run's
  bare-metal baseline ("native") or of another profile's cell of the same test.
- `cost = true`: the report adds each number per host core and per GiB of guest RAM (study C's cost per MB/s).
- `[propagation]`: study B's image-propagation sweep: a profile whose guest is provisioned from images of the sizes
  of `[propagation.study]` / `[propagation.quick]`, `repeats` times each (core.bench.propagation).

This module loads and validates studies (`StudyError`: file, key, value and what is allowed, like a profile's
problems), picks for every cell the latest completed run (`select_cells`), evaluates each rule to a `Verdict`
(`evaluate`), and plans which cells `study run` still has to measure (`plan_run`). Selecting, evaluating and
planning are pure functions over plain data (runs, cells, hashes), so they are tested without a guest.
`cell_states` says where each cell of the matrix stands (done, failed, running, not run, cannot run) and
`prepare_run` is the study run that `cloudbox study run` and the TUI's Studies screen both start; for a study with a
sweep it plans the samples still missing (`plan_sweep`) as one more run, and `gather` reads the stored ones back.
"""

from __future__ import annotations

import dataclasses
import operator
import os
import platform
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from .. import inputs, paths
from ..bench import propagation
from ..disks import backing, hostraid
from ..disks.volumes import attach
from ..errors import (
    PYDANTIC_MESSAGES,
    NoSpace,
    NotFound,
    ProfileError,
    ProfileProblem,
    StudyError,
    UsageError,
    plain_value,
    problem_from,
)
from ..record.rows import Measurement, Run
from ..record.rows import Sample as HostSample
from ..spec import profiles
from ..spec.catalogue import FRONTEND_SUFFIX, NET_TESTS, is_network_test, is_storage_test, primary_metric
from ..spec.catalogue import TESTS as STORAGE_TESTS
from ..spec.runspec import MAX_GUESTS, MIB, PROPAGATION, RunSpec, parse_size
from ..views.compare import guest_count
from ..views.labels import knobs
from ..virt import accel

NATIVE = "native"  # the bare-metal row of a paper table, and a rule's "% of native"
SIZES = ("study", "quick")
DECISIVE_SIZE = "study"  # the only size whose cells can decide a finding
HOST_METRICS = ("avgrq", "avgqu", "util")
RULE_METRICS = ("value", *HOST_METRICS)
OPS: dict[str, Callable[[float, float], bool]] = {"<=": operator.le, ">=": operator.ge, "<": operator.lt,
                                                 ">": operator.gt}
OP_SIGNS = {"<=": "≤", ">=": "≥", "<": "<", ">": ">"}

REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
INCONCLUSIVE = "inconclusive"
VERDICTS = (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE)

MAX_ENTRIES = 64  # profiles, tests, paper cells or rules in one study: the real ones have about a dozen
MAX_REPEATS = 1000  # runs of one profile in a series: 24 h at one every 1.5 min
MAX_IMAGE_SIZES = 16  # sizes in a propagation sweep: the study had seven
MAX_IMAGE_MIB = 1024 * 1024  # 1 TiB
MAX_SWEEP_REPEATS = 100  # samples per size: the study took ten


def known_tests() -> list[str]:
    """Every test a run can store: the storage tests, the network tests and their front-end variants."""
    return [*STORAGE_TESTS, *NET_TESTS, *(t + FRONTEND_SUFFIX for t in NET_TESTS)]


def needs_node(test: str) -> bool:
    """A test only a run on a back-end measures (the far end is the front-end)."""
    return test.endswith(FRONTEND_SUFFIX)


# ------------------------------------------------------------------------------------------------------ schema
def _no_controls(v: str) -> str:
    bad = inputs.control_chars(v)
    if bad:
        raise ValueError(f"contains {bad}")
    return v


Line = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[^\n\r]*\S[^\n\r]*$"),
                 AfterValidator(_no_controls)]
Text = Annotated[str, Field(min_length=1, max_length=1000, pattern=r"^[^\n\r]*\S[^\n\r]*$"),
                 AfterValidator(_no_controls)]
Number = Annotated[float, Field(ge=0, allow_inf_nan=False)]
CellText = Annotated[str, Field(max_length=200)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class MatrixProfile(_Strict):
    """A row of the study: a profile, with the paper's words for the configuration it stands for."""

    name: str = Field(pattern=profiles.NAME_PATTERN)
    row: Line


class MatrixTest(_Strict):
    """A column of the study: a test, with the title of the paper's table it fills."""

    id: str = Field(max_length=64)
    table: Line


class PaperCell(_Strict):
    """The published numbers of one cell ("profile/test", or "native/test" for the bare-metal row)."""

    cell: CellText
    value: Number | None = None  # in the test's metric (MB/s, Mbit/s, ...)
    percent: Number | None = None  # the published % of native, where the paper gives a ratio rather than a number
    native: Number | None = None  # the bare-metal number this row was published against, when not the native row
    avgrq: Number | None = None  # host request size, 512-byte sectors
    avgqu: Number | None = None  # host queue length
    util: Number | None = None  # host disk utilisation, %


class Rule(_Strict):
    """A finding as a check over one cell: its number (`value`), or its % of native or of another profile's cell of
    the same test (`against` with `percent`), compared with `op`."""

    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9.-]{0,15}$")
    finding: Text
    cell: CellText
    against: str | None = Field(None, max_length=64)
    metric: Literal["value", "avgrq", "avgqu", "util"] = "value"
    op: Literal["<=", ">=", "<", ">"]
    percent: Number | None = None
    value: Number | None = None
    paper: Number | None = None  # the published figure of the same quantity, where the paper states it
    why: Text

    @property
    def profile(self) -> str:
        return self.cell.partition("/")[0]

    @property
    def test(self) -> str:
        return self.cell.partition("/")[2]

    @property
    def threshold(self) -> float:
        return self.percent if self.percent is not None else (self.value or 0.0)

    @property
    def unit(self) -> str:
        """The unit of the rule's number without `against`: the test's metric, or the host metric's."""
        return {"value": primary_metric(self.test), "avgrq": "sectors", "avgqu": "", "util": "%"}[self.metric]

    def statement(self) -> str:
        """The rule in words, e.g. "eucalyptus-default dd-write-64k ≤ 10% of native"."""
        what = f"{self.profile} {self.test}" + ("" if self.metric == "value" else f" host {self.metric}")
        sign = OP_SIGNS[self.op]
        if self.against is None:
            return f"{what} {sign} {self.threshold:g}" + (f" {self.unit}" if self.unit else "")
        of = NATIVE if self.against == NATIVE else f"{self.against}'s"
        return f"{what} {sign} {self.threshold:g}% of {of}"


class SeriesPlan(_Strict):
    """How a variability series is measured at one size: `repeats` runs of each profile, one started every
    `every_minutes` (at once when the previous run took longer), each of `guests` guests at once (instances)."""

    every_minutes: float = Field(ge=0, le=24 * 60, allow_inf_nan=False)
    repeats: int = Field(ge=2, le=MAX_REPEATS)
    guests: int = Field(default=1, ge=1, le=MAX_GUESTS)

    @property
    def every_s(self) -> float:
        return self.every_minutes * 60.0

    def words(self) -> str:
        span = self.every_minutes * (self.repeats - 1)
        every = f"every {self.every_minutes:g} min" if self.every_minutes else "back to back"
        return (f"{self.repeats} repeats {every}" + (f" (over {span / 60:.3g} h)" if span >= 60 else
                                                    (f" (over {span:g} min)" if span else ""))
                + (f", {self.guests} guests at once" if self.guests > 1 else ""))


class Series(_Strict):
    """A study measured as a series over time (study D) rather than once per cell: the plan for each size."""

    study: SeriesPlan | None = None
    quick: SeriesPlan | None = None


class PropagationPlan(_Strict):
    """The image-propagation sweep at one size of the study: the images' sizes (MiB, ascending) and the samples per
    size."""

    sizes_mib: list[Annotated[int, Field(ge=4, le=MAX_IMAGE_MIB)]] = Field(min_length=1, max_length=MAX_IMAGE_SIZES)
    repeats: int = Field(ge=1, le=MAX_SWEEP_REPEATS)

    @property
    def sizes(self) -> list[int]:
        """The image sizes in bytes."""
        return [m * MIB for m in self.sizes_mib]

    def words(self) -> str:
        return (f"images of {', '.join(str(m) for m in self.sizes_mib)} MiB, {self.repeats} "
                f"sample{'s' if self.repeats != 1 else ''} each")


class Propagation(_Strict):
    """Study B's image-propagation sweep: the profile whose guest is provisioned, and the plan per size."""

    profile: str = Field(pattern=profiles.NAME_PATTERN)
    study: PropagationPlan | None = None
    quick: PropagationPlan | None = None


class Study(_Strict):
    """A validated study. Construct with parse_study/load_study."""

    name: str = Field(pattern=profiles.NAME_PATTERN)
    title: Line
    description: Text
    sizes: list[Literal["study", "quick"]] = Field(min_length=1, max_length=2)
    profiles: list[MatrixProfile] = Field(min_length=1, max_length=MAX_ENTRIES)
    tests: list[MatrixTest] = Field(min_length=1, max_length=MAX_ENTRIES)
    paper: list[PaperCell] = Field(default_factory=list, max_length=4 * MAX_ENTRIES)
    rules: list[Rule] = Field(default_factory=list, max_length=MAX_ENTRIES)
    series: Series | None = None
    cost: bool = False  # the report adds each number per host core and per GiB of guest RAM (study C's cost)
    propagation: Propagation | None = None

    def series_plan(self, size: str) -> SeriesPlan | None:
        """How many repeats at `size`, how far apart; None for a study measured once per cell."""
        return None if self.series is None else getattr(self.series, size, None)

    def guests(self, size: str) -> int:
        """The guests each of its runs at `size` has at once: a series plan's, else one (the papers' cells are one
        instance's figures)."""
        plan = self.series_plan(size)
        return plan.guests if plan else 1

    def sweep_plan(self, size: str) -> PropagationPlan | None:
        """The image-propagation sweep at `size`; None for a study without one."""
        return None if self.propagation is None else getattr(self.propagation, size, None)

    @property
    def profile_names(self) -> list[str]:
        return [p.name for p in self.profiles]

    @property
    def test_ids(self) -> list[str]:
        return [t.id for t in self.tests]

    def row(self, profile: str) -> str:
        return next((p.row for p in self.profiles if p.name == profile), profile)

    def paper_cell(self, profile: str, test: str) -> PaperCell | None:
        key = f"{profile}/{test}"
        return next((c for c in self.paper if c.cell == key), None)

    def paper_native(self, profile: str, test: str) -> float | None:
        """The bare-metal number the paper set this row against: its own `native`, else the native row's."""
        own = self.paper_cell(profile, test)
        if own is not None and own.native is not None:
            return own.native
        row = self.paper_cell(NATIVE, test)
        return None if row is None else row.value

    def paper_percent(self, profile: str, test: str) -> tuple[float | None, bool]:
        """(the paper's % of native for the cell, whether it was computed here from published numbers)."""
        c = self.paper_cell(profile, test)
        if c is None:
            return None, False
        if c.percent is not None:
            return c.percent, False
        native = self.paper_native(profile, test)
        if c.value is None or not native:
            return None, False
        return c.value / native * 100.0, True

    @property
    def suite(self) -> str:
        storage = any(is_storage_test(t) for t in self.test_ids)
        network = any(is_network_test(t) and not is_storage_test(t) for t in self.test_ids)
        return "all" if storage and network else ("network" if network else "storage")


# --------------------------------------------------------------------------------------------------- problems
_RULES = {
    "name": "lowercase letters, digits and '-', starting with a letter or digit, at most 63 characters",
    "title": "one line of text, 1..200 characters",
    "description": "one line of text, 1..1000 characters",
    "sizes": "a list of study, quick (each at most once)",
    "profiles": f"1..{MAX_ENTRIES} [[profiles]] tables with keys name, row",
    "profiles.name": "a profile name (cloudbox profile list)",
    "profiles.row": "one line of text, 1..200 characters: the paper's words for the row",
    "tests": f"1..{MAX_ENTRIES} [[tests]] tables with keys id, table",
    "tests.table": "one line of text, 1..200 characters: the paper's table title",
    "paper": f"at most {4 * MAX_ENTRIES} [[paper]] tables",
    "paper.cell": "profile/test, or native/test for the bare-metal row",
    "rules": f"at most {MAX_ENTRIES} [[rules]] tables",
    "rules.id": "1..16 letters, digits, '.' and '-', e.g. A1 or B3.2",
    "rules.finding": "one line of text, 1..1000 characters",
    "rules.why": "one line of text, 1..1000 characters: why the threshold is where it is",
    "rules.cell": "profile/test of this study's matrix",
    "rules.against": f"{NATIVE} or a profile of this study's matrix",
    "rules.metric": ", ".join(RULE_METRICS),
    "rules.op": ", ".join(OPS),
    "series": "a table with a plan per size: [series.study] and/or [series.quick]",
    "cost": "true or false: whether the report adds cost columns (per host core, per GiB of guest RAM)",
    "series.study": "a table with keys every_minutes, repeats and optionally guests",
    "series.quick": "a table with keys every_minutes, repeats and optionally guests",
    "series.study.every_minutes": "minutes between the starts of two repeats, 0..1440 (0: back to back)",
    "series.quick.every_minutes": "minutes between the starts of two repeats, 0..1440 (0: back to back)",
    "series.study.repeats": f"a whole number of runs per profile, 2..{MAX_REPEATS}",
    "series.quick.repeats": f"a whole number of runs per profile, 2..{MAX_REPEATS}",
    "series.study.guests": f"guests of each run at once (instances), 1..{MAX_GUESTS} (default 1)",
    "series.quick.guests": f"guests of each run at once (instances), 1..{MAX_GUESTS} (default 1)",
    "propagation": "a table with key profile and a plan per size: [propagation.study] and/or [propagation.quick]",
    "propagation.profile": "a profile of this study's [[profiles]] whose guest cloudbox launches (KVM) on a raw disk",
    "propagation.study": "a table with keys sizes_mib, repeats",
    "propagation.quick": "a table with keys sizes_mib, repeats",
    "propagation.study.sizes_mib": f"1..{MAX_IMAGE_SIZES} image sizes in MiB, each 4..{MAX_IMAGE_MIB}, ascending",
    "propagation.quick.sizes_mib": f"1..{MAX_IMAGE_SIZES} image sizes in MiB, each 4..{MAX_IMAGE_MIB}, ascending",
    "propagation.study.repeats": f"a whole number of samples per image size, 1..{MAX_SWEEP_REPEATS}",
    "propagation.quick.repeats": f"a whole number of samples per image size, 1..{MAX_SWEEP_REPEATS}",
}
_NUMBERS = {"value", "percent", "native", "avgrq", "avgqu", "util", "paper"}


def _model_at(parts: Sequence[str]) -> type[BaseModel] | None:
    """The model owning the key at `parts` (list indexes left out)."""
    model: type[BaseModel] = Study
    for part in parts[:-1]:
        field_ = model.model_fields.get(part)
        args = getattr(field_.annotation, "__args__", ()) if field_ else ()
        inner = next((a for a in args if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if inner is None:
            return None
        model = inner
    return model


def _key(loc: Sequence[str | int]) -> str:
    """A key as the file writes it, arrays of tables counted from 1: "rules[2].op"."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part + 1}]"
        else:
            out += ("." if out else "") + inputs.key_text((part,))
    return out or "(study)"


def _allowed(loc: Sequence[str | int], etype: str) -> str | None:
    parts = [str(p) for p in loc if not isinstance(p, int)]
    if etype == "extra_forbidden":
        owner = _model_at(parts)
        return f"known keys: {', '.join(owner.model_fields)}" if owner else None
    if not parts:
        return f"a TOML document with keys: {', '.join(Study.model_fields)}"
    if parts[-1] in _NUMBERS:
        return "a number >= 0"
    if parts == ["tests", "id"]:
        return ", ".join(known_tests())
    return _RULES.get(".".join(parts))


def _problems_from(exc: ValidationError) -> list[ProfileProblem]:
    out = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        etype = err["type"]
        message = PYDANTIC_MESSAGES.get(etype, err["msg"])
        if etype == "value_error":
            message = str(err["msg"]).removeprefix("Value error, ")
        value = None if etype == "missing" else plain_value(err.get("input"))
        out.append(ProfileProblem(_key(loc), value, message, _allowed(loc, etype)))
    return out


def _split_cell(text: str) -> tuple[str, str] | None:
    profile, sep, test = text.partition("/")
    return (profile, test) if sep and profile and test else None


def _cross_problems(study: Study, lookup: Callable[[str], object]) -> list[ProfileProblem]:
    """What pydantic cannot see: unknown profiles and tests, cells outside the matrix, rules that cannot be stated."""
    out: list[ProfileProblem] = []

    def bad(key: str, value: object, message: str, allowed: str) -> None:
        out.append(ProfileProblem(key, value, message, allowed))

    if len(set(study.sizes)) != len(study.sizes):
        bad("sizes", list(study.sizes), "a size is listed twice", _RULES["sizes"])

    names = study.profile_names
    for i, p in enumerate(study.profiles, 1):
        key = f"profiles[{i}].name"
        if p.name == NATIVE:
            bad(key, p.name, f"'{NATIVE}' names the bare-metal row, not a profile", "a profile name")
        elif names.index(p.name) != i - 1:
            bad(key, p.name, "the profile is listed twice", "each profile once")
        else:
            try:
                lookup(p.name)
            except NotFound:
                names_known = ", ".join(e.name for e in profiles.list_profiles()) or "(none)"
                bad(key, p.name, "no such profile", f"a profile name: {names_known}")
            except ProfileError as e:
                bad(key, p.name, f"the profile does not validate ({e.problems[0] if e.problems else e.source})",
                    "a valid profile (cloudbox profile validate)")

    tests = study.test_ids
    known = known_tests()
    for i, t in enumerate(study.tests, 1):
        key = f"tests[{i}].id"
        if t.id not in known:
            bad(key, t.id, "no such test", ", ".join(known))
        elif tests.index(t.id) != i - 1:
            bad(key, t.id, "the test is listed twice", "each test once")

    def cell_problem(key: str, text: str, *, native: bool) -> tuple[str, str] | None:
        rows = ([NATIVE] if native else []) + names
        allowed = (f"profile/test with a profile of [[profiles]] ({', '.join(rows)}) and a test of [[tests]] "
                   f"({', '.join(tests)})")
        parts = _split_cell(text)
        if parts is None:
            bad(key, text, "not a cell", allowed)
            return None
        if parts[0] not in rows:
            bad(key, text, f"profile {parts[0]!r} is not in this study's [[profiles]]", allowed)
            return None
        if parts[1] not in tests:
            bad(key, text, f"test {parts[1]!r} is not in this study's [[tests]]", allowed)
            return None
        return parts

    seen: set[str] = set()
    for i, c in enumerate(study.paper, 1):
        key = f"paper[{i}]"
        parts = cell_problem(f"{key}.cell", c.cell, native=True)
        if parts is None:
            continue
        if c.cell in seen:
            bad(f"{key}.cell", c.cell, "the cell has published numbers twice", "each cell once")
        seen.add(c.cell)
        if parts[0] == NATIVE and (c.percent is not None or c.native is not None):
            bad(f"{key}.percent" if c.percent is not None else f"{key}.native",
                c.percent if c.percent is not None else c.native, "the bare-metal row is native itself",
                "value, avgrq, avgqu, util (on native/... cells)")
        if all(getattr(c, k) is None for k in ("value", "percent", "avgrq", "avgqu", "util")):
            bad(key, c.cell, "a paper cell without a published number", "at least one of value, percent, avgrq, "
                "avgqu, util")

    ids: set[str] = set()
    for i, r in enumerate(study.rules, 1):
        key = f"rules[{i}]"
        if r.id in ids:
            bad(f"{key}.id", r.id, "two rules have this id", "a unique id per rule")
        ids.add(r.id)
        parts = cell_problem(f"{key}.cell", r.cell, native=False)
        if r.against is not None and r.against != NATIVE:
            if r.against not in names:
                bad(f"{key}.against", r.against, "not a profile of this study's [[profiles]]",
                    f"{NATIVE}, {', '.join(names)}")
            elif parts is not None and r.against == parts[0]:
                bad(f"{key}.against", r.against, "a cell against itself", f"{NATIVE} or another profile")
        if r.against is None and r.value is None:
            bad(f"{key}.value", None, "a rule without `against` compares the cell's number with `value`",
                "a number >= 0 (or set against and percent)")
        if r.against is not None and r.percent is None:
            bad(f"{key}.percent", None, "a rule with `against` compares a percentage", "a number > 0 (percent)")
        if r.against is not None and r.value is not None:
            bad(f"{key}.value", r.value, "with `against` the threshold is a percentage", "percent instead of value")
        if r.against is None and r.percent is not None:
            bad(f"{key}.percent", r.percent, "a percentage needs `against`", f"against = \"{NATIVE}\" or a profile; "
                "or value instead of percent")
        if r.percent == 0 and r.against is not None:
            bad(f"{key}.percent", r.percent, "0% is no threshold", "a number > 0")
        if parts is not None and r.metric in HOST_METRICS and not is_storage_test(parts[1]):
            bad(f"{key}.metric", r.metric, "host disk metrics exist for storage tests only",
                f"value (with test {parts[1]})")
    if study.propagation is not None:
        out += _sweep_problems(study, lookup)
    if study.series is not None:
        for size in study.sizes:
            if study.series_plan(size) is None:
                bad(f"series.{size}", None, f"a series study needs a plan for each of its sizes ({size} is one)",
                    _RULES[f"series.{size}"])
        for other in SIZES:
            if other not in study.sizes and study.series_plan(other) is not None:
                bad(f"series.{other}", other, "a plan for a size the study does not offer",
                    f"sizes: {', '.join(study.sizes)}")
    return out


def _sweep_problems(study: Study, lookup: Callable[[str], object]) -> list[ProfileProblem]:
    """The [propagation] table against the rest: its profile a runnable row with a raw disk, a plan for each of the
    study's sizes and none for another, the image sizes ascending."""
    assert study.propagation is not None
    prop = study.propagation
    out: list[ProfileProblem] = []
    names = study.profile_names
    if prop.profile not in names:
        out.append(ProfileProblem("propagation.profile", prop.profile, "not a profile of this study's [[profiles]]",
                                  ", ".join(names)))
    else:
        try:
            prof = lookup(prop.profile)
        except (NotFound, ProfileError):
            prof = None  # [[profiles]] says what is wrong with it
        if isinstance(prof, profiles.Profile):
            why = cannot_run(prof)
            if why is None and prof.guest.hypervisor != "kvm":
                why = f"a {prof.guest.hypervisor} profile: the sweep launches its guests under KVM/QEMU"
            if why is None and prof.disk.format != "raw":
                why = f"its disk format is {prof.disk.format}: the sweep copies raw images"
            if why is not None:
                out.append(ProfileProblem("propagation.profile", prop.profile, why, _RULES["propagation.profile"]))
    for size in study.sizes:
        if study.sweep_plan(size) is None:
            out.append(ProfileProblem(f"propagation.{size}", None, f"a sweep needs a plan for each of the study's "
                                      f"sizes ({size} is one)", _RULES[f"propagation.{size}"]))
    for other in SIZES:
        plan = study.sweep_plan(other)
        if plan is None:
            continue
        if other not in study.sizes:
            out.append(ProfileProblem(f"propagation.{other}", other, "a plan for a size the study does not offer",
                                      f"sizes: {', '.join(study.sizes)}"))
        if any(b <= a for a, b in zip(plan.sizes_mib, plan.sizes_mib[1:], strict=False)):
            out.append(ProfileProblem(f"propagation.{other}.sizes_mib", list(plan.sizes_mib),
                                      "the sizes are not ascending (or one is listed twice)",
                                      _RULES[f"propagation.{other}.sizes_mib"]))
    return out


def _validate_own(data: object, source: str, expect_name: str | None) -> tuple[Study, list[ProfileProblem]]:
    """The study's own checks (schema, name); StudyError when the schema fails, else the study and its problems."""
    try:
        study = Study.model_validate(data)
    except ValidationError as exc:
        raise StudyError(source, _problems_from(exc)) from None
    problems = []
    if expect_name is not None and study.name != expect_name:
        problems.append(ProfileProblem("name", study.name, "must equal the file name without .toml",
                                       f"{expect_name} (this file is {expect_name}.toml)"))
    return study, problems


def validate_data(data: object, source: str, *, expect_name: str | None = None,
                  lookup: Callable[[str], object] = profiles.find_profile) -> Study:
    """Validate parsed data (a dict) into a Study, or raise StudyError with every problem found. `lookup` finds a
    profile by name (NotFound or ProfileError when it cannot)."""
    study, problems = _validate_own(data, source, expect_name)
    problems += _cross_problems(study, lookup)
    if problems:
        raise StudyError(source, problems)
    return study


def parse_study(text: str, source: str = "<study>", *, expect_name: str | None = None,
                lookup: Callable[[str], object] = profiles.find_profile) -> Study:
    """A Study from TOML text; `source` names the text in errors."""
    try:
        data = inputs.load_toml(text)
    except inputs.InputProblem as e:
        raise StudyError(source, [problem_from(e)]) from None
    return validate_data(data, source, expect_name=expect_name, lookup=lookup)


def load_study(path: str | os.PathLike[str]) -> Study:
    """Load and validate one study file (a regular file of at most inputs.MAX_FILE_BYTES); its `name` must equal the
    file's stem."""
    try:
        text = inputs.read_text_file(path)
    except FileNotFoundError:
        raise NotFound(f"{inputs.shown(os.fspath(path))}: no such study file") from None
    except inputs.InputProblem as e:
        raise StudyError(os.fspath(path), [problem_from(e)]) from None
    source = os.fspath(path)
    key = (os.path.abspath(path), text)
    if (own := _PARSED.get(key)) is None:
        try:
            data = inputs.load_toml(text)
        except inputs.InputProblem as e:
            raise StudyError(source, [problem_from(e)]) from None
        own = _validate_own(data, source, Path(path).stem)
        if len(_PARSED) >= _PARSED_MAX:
            _PARSED.clear()
        _PARSED[key] = own
    study, problems = own
    # The profiles may have changed since: checked on every load (cheap, load_profile keeps what it parsed).
    problems = problems + _cross_problems(study, profiles.find_profile)
    if problems:
        raise StudyError(source, problems)
    return study


# A study file's own validation by (path, text): the Studies screen reloads every few seconds, and parsing every
# study took most of that reload's CPU on the UI's process (make bench, "tui"). Study is immutable.
_PARSED: dict[tuple[str, str], tuple[Study, list[ProfileProblem]]] = {}
_PARSED_MAX = 64


@dataclass(frozen=True)
class StudyEntry:
    """A study file found in the study directories; `problem` is set (and `title` empty) when it does not
    validate."""

    name: str
    path: Path
    title: str
    profiles: int = 0
    tests: int = 0
    rules: int = 0
    problem: str | None = None


def _candidates() -> list[tuple[str, Path]]:
    seen: dict[str, Path] = {}
    for d in paths.study_dirs():
        for f in sorted(d.glob("*.toml")):
            if f.is_file():
                seen.setdefault(f.stem, f)
    return sorted(seen.items())


def list_studies() -> list[StudyEntry]:
    """Every study file in paths.study_dirs(), by name; invalid ones too, with their problem."""
    out = []
    for name, f in _candidates():
        try:
            s = load_study(f)
            out.append(StudyEntry(name, f, s.title, len(s.profiles), len(s.tests), len(s.rules)))
        except (StudyError, NotFound) as e:
            out.append(StudyEntry(name, f, "", problem=str(e)))
    return out


def find_study(name: str) -> Study:
    """The study called `name` (case does not matter: `A` is studies/a.toml), or a study file given by path."""
    if "/" in name or name.endswith(".toml"):
        return load_study(name)
    for stem, f in _candidates():
        if stem == name.lower():
            return load_study(f)
    known = ", ".join(stem for stem, _ in _candidates()) or "(none)"
    raise NotFound(f"no study named {inputs.shown(name)}; known studies: {known} (cloudbox study list)")


def cannot_run(profile: profiles.Profile) -> str | None:
    """Why this cloudbox cannot measure `profile` yet on any boot (the executor refuses it at its start), or None."""
    d = profile.disk
    if d.backing != "network-volume":
        return None
    try:
        attach.check_attach(d.volume.partition(":")[0], d.attach, hypervisor=profile.guest.hypervisor,
                            has_module=lambda _m: True, tool_problem=lambda _s: "")
    except attach.AttachRefused as e:
        return f"network volumes: {e.summary}"
    return None


def cannot_run_here(profile: profiles.Profile) -> str | None:
    """Why `profile` cannot run on this host (its kernel lacks the initiator a network volume's attach mode needs,
    e.g. aoe for disk.attach = host; md for a RAID on the host), or None; the same check a run makes at its first
    step."""
    d = profile.disk
    if d.raid_on == "host":
        return hostraid.problem() or None
    if d.backing != "network-volume":
        return None
    try:
        attach.check_attach(d.volume.partition(":")[0], d.attach, hypervisor=profile.guest.hypervisor)
    except attach.AttachRefused as e:
        return e.summary
    return None


# ------------------------------------------------------------------------------------------------------- cells
@dataclass(frozen=True)
class Measured:
    """One side's number of a cell with the host disk's metrics over its window and its labels."""

    value: float
    avgrq: float | None = None
    avgqu: float | None = None
    util: float | None = None
    labels: tuple[str, ...] = ()
    others: tuple[tuple[str, float], ...] = ()  # the test's other figures on this side (Bonnie++'s), by metric

    def metric(self, name: str) -> float | None:
        return self.value if name == "value" else getattr(self, name)


@dataclass(frozen=True)
class Cell:
    """What a stored run measured for one (profile, test): the guest's number and the same run's bare-metal one."""

    profile: str
    test: str
    run_id: int
    guest: Measured
    baseline: Measured | None = None
    metric: str = ""  # the unit of `value` (MB/s, Mbit/s, ...)
    size_label: str | None = None
    accelerator: str | None = None
    emulated: bool = False
    node: str | None = None
    started_at: float | None = None
    profile_changed: bool = False  # the run's profile hash is not the profile's hash today
    host_cores: int | None = None  # physical cores of the host that ran it, as the run recorded them
    guest_memory_mib: int | None = None  # the guest's RAM, from the profile stored with the run
    # every figure the run's bare metal stored for the test (by metric), the cell's own metric or not (Bonnie++'s)
    baseline_figures: tuple[tuple[str, float], ...] = ()
    guests: int = 1  # a series' run of N guests: its numbers are their sum (and N bare-metal processes')

    def per_host_core(self, value: float | None) -> float | None:
        """`value` (this cell's guest or bare-metal number) per physical core of the host; None when the run
        recorded no core count."""
        return None if value is None or not self.host_cores else value / self.host_cores

    @property
    def guest_per_gib(self) -> float | None:
        """The guest's number per GiB of its RAM; None when the stored profile gives no memory size."""
        return None if not self.guest_memory_mib else self.guest.value / (self.guest_memory_mib / 1024)

    @property
    def qualifiers(self) -> list[str]:
        """Why this number is weaker than the paper's, in a word each: emulated, nested, quick, ..."""
        out = []
        if self.accelerator == "nested-kvm":
            out.append("nested")
        elif self.emulated:
            out.append("emulated")
        if self.size_label == "quick":
            out.append("quick")
        labels = set(self.guest.labels) | set(self.baseline.labels if self.baseline else ())
        if "warm-cache" in labels:
            out.append("warm cache")
        if "loop-device" in labels:
            out.append("loop device")
        if self.profile_changed:
            out.append("profile changed")
        if self.guests > 1:
            out.append(f"sum of {self.guests} guests")
        return out


CellKey = tuple[str, str]  # (profile, test)


def _measured(run: Run, side: str, test: str, metric: str) -> Measured | None:
    m = run.measurement(side, test, metric)
    if m is None:
        return None
    others = tuple((o.metric, o.value) for o in run.measurements
                   if o.side == side and o.test == test and o.metric != metric and o.instance is None)
    return Measured(m.value, m.host_avgrq_sectors, m.host_avgqu, m.host_util, tuple(m.labels), others)


def select_cells(study: Study, runs: Sequence[Run], hashes: Mapping[str, str], *, size: str | None = None,
                 node: str | None = None) -> dict[CellKey, Cell]:
    """For each (profile, test) of the study, the cell of the best completed run measuring it: a run of the profile
    as it is today (`hashes`: name -> hash) before one of an older version of it, the study size before quick
    (only `size` when given), then the latest; only runs on `node` when given. Only runs of one guest (a run of N
    stores their sum, which no paper's one-instance figure compares with), but in a series those of the guest
    count its variability section shows."""
    sizes: list[str] = [size] if size else list(study.sizes)
    best: dict[CellKey, tuple[tuple[Any, ...], Cell]] = {}
    wanted: dict[tuple[str, str, str], int] = {}

    def guests_for(profile: str, test: str, sz: str) -> int:
        if study.series is None:
            return 1
        if (profile, test, sz) not in wanted:
            wanted[(profile, test, sz)] = _series_guests(study, runs, profile, hashes.get(profile), test, sz, node)
        return wanted[(profile, test, sz)]

    for run in runs:
        if run.state != "completed" or run.profile_name not in study.profile_names or run.size_label not in sizes:
            continue
        if node and run.node != node:
            continue
        current = hashes.get(run.profile_name)
        changed = bool(current and run.profile_hash and run.profile_hash != current)
        n = guest_count(run)
        for test in study.test_ids:
            if n != guests_for(run.profile_name, test, run.size_label or ""):
                continue
            metric = primary_metric(test, [m.metric for m in run.measurements if m.test == test])
            guest = _measured(run, "guest", test, metric)
            if guest is None:
                continue
            rank = (not changed, -sizes.index(run.size_label or ""), run.started_at or 0.0, run.id)
            key = (run.profile_name, test)
            if key in best and best[key][0] >= rank:
                continue
            best[key] = (rank, Cell(run.profile_name, test, run.id, guest, _measured(run, "baseline", test, metric),
                                    metric=metric, size_label=run.size_label, accelerator=run.accelerator,
                                    emulated=run.emulated, node=run.node, started_at=run.started_at,
                                    profile_changed=changed, host_cores=run.provenance.host_cores,
                                    guest_memory_mib=knobs(run).memory_mib,
                                    baseline_figures=tuple((m.metric, m.value) for m in run.measurements
                                                           if m.side == "baseline" and m.test == test
                                                           and m.instance is None), guests=n))
    return {k: v[1] for k, v in best.items()}


# ---------------------------------------------------------------------------------------------------- verdicts
@dataclass(frozen=True)
class Verdict:
    """One rule evaluated: its status, why it is inconclusive, our figure and the paper's (in the rule's unit: % or
    the metric), and the runs it used."""

    rule: Rule
    status: str
    reasons: tuple[str, ...] = ()
    ours: float | None = None
    paper: float | None = None
    paper_computed: bool = False
    run_ids: tuple[int, ...] = ()

    def figure(self, v: float | None) -> str:
        if v is None:
            return "-"
        if self.rule.against is not None:
            return f"{v:.1f}%"
        unit = f" {self.rule.unit}" if self.rule.unit else ""
        return (f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}") + unit

    def explain(self) -> str:
        """One line: the verdict and what it rests on."""
        need = f"{OP_SIGNS[self.rule.op]} " + (f"{self.rule.threshold:g}%" if self.rule.against is not None
                                               else self.figure(self.rule.threshold))
        paper = "" if self.paper is None else (
            f"; the paper: {self.figure(self.paper)}" + (" (computed from its numbers)" if self.paper_computed else ""))
        if self.status == INCONCLUSIVE:
            would = "" if self.ours is None else f"; ours would be {self.figure(self.ours)}"
            return f"{INCONCLUSIVE}: " + "; ".join(self.reasons) + would + paper
        return f"{self.status}: ours {self.figure(self.ours)}, the rule needs {need}{paper}"


def _missing(profile: str, test: str, size: str | None, unavailable: Mapping[str, str]) -> str:
    at = f" at {size} size" if size else ""
    why = f"no completed run of {profile} with {test}{at}"
    if profile in unavailable:
        return f"{why}: {unavailable[profile]}"
    if needs_node(test):
        return f"{why}: only a run on a back-end (--node) measures it"
    return why


def _cell_reasons(cell: Cell, metric: str, *, native: bool) -> list[str]:
    name = f"{cell.profile}/{cell.test} (run #{cell.run_id})"
    out = []
    if cell.accelerator == "nested-kvm":
        out.append(f"{name} was measured under nested virtualization: not an overhead figure")
    elif cell.emulated:
        how = "TCG emulation" if cell.accelerator == "tcg" else "emulation"
        out.append(f"{name} was measured under {how}: not an overhead figure")
    if cell.size_label == "quick":
        out.append(f"{name} is quick-size: the page and device caches weigh more than in the study")
    elif cell.size_label != DECISIVE_SIZE:
        out.append(f"{name} was measured at {cell.size_label or 'an unknown'} size, not the study's")
    if "warm-cache" in cell.guest.labels or (native and cell.baseline and "warm-cache" in cell.baseline.labels):
        out.append(f"{name}: the page cache was not dropped before the test")
    if is_storage_test(cell.test) and ("loop-device" in cell.guest.labels
                                        or (native and cell.baseline and "loop-device" in cell.baseline.labels)):
        out.append(f"{name} ran on a loop device over a file, not a whole disk (study run --device names one)")
    if cell.profile_changed:
        out.append(f"{name}: the profile {cell.profile} changed since this run")
    if cell.guest.metric(metric) is None:
        out.append(f"{name} has no host {metric} (no host metrics for this backing)")
    if native:
        if cell.baseline is None:
            out.append(f"{name} has no bare-metal number")
        else:
            if "virtualized-host" in cell.baseline.labels:
                out.append(f"{name}: its bare-metal side ran on a virtual machine")
            base = cell.baseline.metric(metric)
            if base is None:
                out.append(f"{name} has no host {metric} for its bare-metal side")
            elif base == 0:
                out.append(f"{name}: bare metal measured 0")
    return out


def paper_figure(study: Study, rule: Rule) -> tuple[float | None, bool]:
    """The paper's figure for the rule's quantity: stated in the rule, or computed from its published cells."""
    if rule.paper is not None:
        return rule.paper, False
    own = study.paper_cell(rule.profile, rule.test)
    if own is None:
        return None, False
    mine = own.value if rule.metric == "value" else getattr(own, rule.metric)
    if rule.against is None:
        return mine, False
    if rule.against == NATIVE:
        if rule.metric == "value":
            return study.paper_percent(rule.profile, rule.test)
        base = study.paper_cell(NATIVE, rule.test)
        other = None if base is None else getattr(base, rule.metric)
    else:
        cell = study.paper_cell(rule.against, rule.test)
        other = None if cell is None else (cell.value if rule.metric == "value" else getattr(cell, rule.metric))
    if mine is None or not other:
        return None, False
    return mine / other * 100.0, True


def evaluate_rule(study: Study, rule: Rule, cells: Mapping[CellKey, Cell], *,
                  unavailable: Mapping[str, str] | None = None, size: str | None = None) -> Verdict:
    """One rule over the selected cells. Inconclusive, with every reason, when a cell is missing or was measured where
    it cannot speak for virtualization overhead (emulated, nested, quick size, warm cache, a changed profile);
    otherwise reproduced or not reproduced."""
    unavailable = unavailable or {}
    paper, computed = paper_figure(study, rule)
    native = rule.against == NATIVE
    keys = [(rule.profile, rule.test)]
    if rule.against not in (None, NATIVE):
        keys.append((str(rule.against), rule.test))
    reasons: list[str] = []
    for key in keys:
        if key not in cells:
            reasons.append(_missing(*key, size, unavailable))
        else:
            reasons += _cell_reasons(cells[key], rule.metric, native=native)
    present = [cells[k] for k in keys if k in cells]
    ours = _ours(rule, present) if len(present) == len(keys) else None
    run_ids = tuple(dict.fromkeys(c.run_id for c in present))
    if ours is None and not reasons:
        reasons.append("no figure could be computed from the cells")
    if reasons:
        return Verdict(rule, INCONCLUSIVE, tuple(dict.fromkeys(reasons)), ours, paper, computed, run_ids)
    assert ours is not None
    status = REPRODUCED if OPS[rule.op](ours, rule.threshold) else NOT_REPRODUCED
    return Verdict(rule, status, (), ours, paper, computed, run_ids)


def _ours(rule: Rule, cells: Sequence[Cell]) -> float | None:
    mine = cells[0].guest.metric(rule.metric)
    if mine is None:
        return None
    if rule.against is None:
        return mine
    if rule.against == NATIVE:
        base = cells[0].baseline
        other = None if base is None else base.metric(rule.metric)
    else:
        other = cells[1].guest.metric(rule.metric)
    if not other:
        return None
    return mine / other * 100.0


def evaluate(study: Study, cells: Mapping[CellKey, Cell], *, unavailable: Mapping[str, str] | None = None,
             size: str | None = None) -> list[Verdict]:
    """Every rule of the study, in file order."""
    return [evaluate_rule(study, r, cells, unavailable=unavailable, size=size) for r in study.rules]


# -------------------------------------------------------------------------------------------------- study runs
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

    def spec(self, size: str, node: str = "", **options: Any) -> RunSpec:
        """The run that measures the missing tests (the run options of `cloudbox run` in `options`)."""
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
        return RunSpec(profile=self.profile, suite=suite, size=size, node=node, **extra, **options)


def plan_run(study: Study, runs: Sequence[Run], hashes: Mapping[str, str], *, size: str, node: str,
             backend: bool, unavailable: Mapping[str, str] | None = None, again: bool = False) -> list[PlannedProfile]:
    """What `study run` has to do: per profile, the tests not yet stored by a completed run of the profile as it is
    today (same hash), at `size`, on `node` (the node name runs record: the back-end's with --node, else this
    host's). With `again` every test runs. Unless the runs go to a back-end (`backend`), the front-end tests ("-fe")
    are left out: only a run on a back-end measures them."""
    unavailable = unavailable or {}
    series = study.series_plan(size)
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
        for test in study.test_ids:
            if needs_node(test) and not backend:
                item.elsewhere.append(test)
                continue
            found = None if again else _stored(runs, name, hashes.get(name), test, size, node)
            if found is None:
                item.run.append(test)
            else:
                item.stored[test] = found
        out.append(item)
    return out


def series_runs(runs: Sequence[Run], profile: str, profile_hash: str | None, tests: Sequence[str], size: str,
                node: str | None, guests: int | None = 1) -> list[Run]:
    """The completed runs of this profile (same hash), size, node (any when None) and guest count (any when None)
    holding both sides of every one of `tests`: the repeats of a series, oldest first."""
    out = [r for r in runs if r.state == "completed" and r.profile_name == profile and r.profile_hash == profile_hash
           and r.size_label == size and (node is None or r.node == node)
           and (guests is None or guest_count(r) == guests)
           and all(r.measurement("guest", t) is not None and r.measurement("baseline", t) is not None
                   for t in tests)]
    return sorted(out, key=lambda r: (r.started_at or 0.0, r.id))


def _stored(runs: Sequence[Run], profile: str, profile_hash: str | None, test: str, size: str,
            node: str) -> int | None:
    """The newest completed run of one guest of this profile (same hash), size and node with both sides of `test`,
    or None."""
    for run in sorted(runs, key=lambda r: (r.started_at or 0.0, r.id), reverse=True):
        if (run.state == "completed" and run.profile_name == profile and run.profile_hash == profile_hash
                and run.size_label == size and run.node == node and guest_count(run) == 1
                and run.measurement("guest", test) is not None and run.measurement("baseline", test) is not None):
            return run.id
    return None


# ------------------------------------------------------------------------------------------- the sweep
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


# ------------------------------------------------------------------------------------------ from the store
@dataclass
class Evidence:
    """What the store holds for a study: the profiles' hashes today, which profiles cannot run here yet (and why),
    the selected cells and the verdicts."""

    study: Study
    hashes: dict[str, str]
    unavailable: dict[str, str]
    cells: dict[CellKey, Cell]
    verdicts: list[Verdict]
    size: str | None = None
    node: str | None = None
    series: dict[CellKey, list[Sample]] = field(default_factory=dict)  # a series study's repeats per cell
    host: dict[CellKey, dict[str, list[HostSample]]] = field(default_factory=dict)  # attach_host_samples
    sweep: SweepEvidence | None = None  # a study with an image-propagation sweep: its stored samples


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


def profile_facts(study: Study, *, here: bool = True) -> tuple[dict[str, str], dict[str, str]]:
    """(name -> hash today, name -> why it cannot run yet) for the study's profiles; `here`: also why not on the
    hypervisor this host is booted into (a Xen profile on Linux, a KVM one on Xen's dom0)."""
    hashes: dict[str, str] = {}
    unavailable: dict[str, str] = {}
    boot = accel.boot_of(None) if here else None
    for name in study.profile_names:
        prof = profiles.find_profile(name)
        hashes[name] = prof.hash
        booted = boot.refusal(prof.guest.hypervisor, profiles.xen_guest_type(prof), prof.disk.raid_on) if boot else None
        why = cannot_run(prof) or booted or (cannot_run_here(prof) if here else None)
        if why:
            unavailable[name] = why
    return hashes, unavailable


def gather(study: Study, runs: Sequence[Run], *, size: str | None = None, node: str | None = None) -> Evidence:
    """The evidence for `study` in `runs` (ResultStore.list_runs(): cells and series come from the completed runs
    among them, a sweep's samples from every finished propagation run)."""
    hashes, unavailable = profile_facts(study, here=node is None)
    cells = select_cells(study, runs, hashes, size=size, node=node)
    verdicts = evaluate(study, cells, unavailable=unavailable, size=size)
    series = gather_series(study, runs, hashes, size=size, node=node) if study.series else {}
    sweep = gather_sweep(study, runs, hashes, size=size, node=node)
    return Evidence(study, hashes, unavailable, cells, verdicts, size, node, series, sweep=sweep)


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


def attach_host_samples(ev: Evidence, fetch: Callable[[int, str], Sequence[HostSample]]) -> Evidence:
    """Fill `ev.host`: per storage cell, the host disk's samples (one a second) of its run while the guest's and
    while the bare-metal test ran, by side; `fetch(run_id, "side:test")` reads them (ResultStore.samples)."""
    for (profile, test), cell in ev.cells.items():
        if not is_storage_test(test):
            continue
        sides = {side: list(fetch(cell.run_id, f"{side}:{test}")) for side in ("guest", "baseline")}
        if any(sides.values()):
            ev.host[(profile, test)] = sides
    return ev


# ----------------------------------------------------------------------------------------------------- series
@dataclass(frozen=True)
class Sample:
    """One repeat of a series: the run, when it started, the guest's number and the same run's bare-metal one."""

    run_id: int
    started_at: float
    value: float
    baseline: float | None
    metric: str
    size_label: str
    emulated: bool = False
    accelerator: str | None = None
    baseline_labels: tuple[str, ...] = ()  # e.g. virtualized-host: the bare-metal side ran on a virtual machine
    instance: int | None = None  # a run of N guests: the guest (its bare-metal process: the same number)


@dataclass(frozen=True)
class SeriesStats:
    """A series' distribution: count, median, 5th and 95th percentiles (linear between ranks), mean, standard
    deviation and coefficient of variation (stdev / mean, %; None below two samples or with a zero mean)."""

    n: int
    median: float
    p5: float
    p95: float
    mean: float
    stdev: float | None
    cv: float | None
    low: float
    high: float


def series_stats(values: Sequence[float]) -> SeriesStats | None:
    """The distribution of `values`, or None when there are none."""
    if not values:
        return None
    xs = sorted(values)
    mean = statistics.fmean(xs)
    if len(xs) == 1:
        return SeriesStats(1, xs[0], xs[0], xs[0], mean, None, None, xs[0], xs[0])
    q = statistics.quantiles(xs, n=20, method="inclusive")
    sd = statistics.stdev(xs)
    return SeriesStats(len(xs), statistics.median(xs), q[0], q[-1], mean, sd, sd / mean * 100.0 if mean else None,
                       xs[0], xs[-1])


def gather_series(study: Study, runs: Sequence[Run], hashes: Mapping[str, str], *, size: str | None = None,
                  node: str | None = None) -> dict[CellKey, list[Sample]]:
    """Per cell, every stored repeat (oldest first) at one size: `size`, else the first of the study's sizes holding
    any; each repeat is a completed run of the profile as it is today, on `node` when given, of the plan's guest
    count. A run of N guests gives N samples, one per guest beside its own bare-metal process (instances 1..N):
    the distribution is over time and over instances."""
    out: dict[CellKey, list[Sample]] = {}
    for profile in study.profile_names:
        for test in study.test_ids:
            for sz in [size] if size else study.sizes:
                guests = _series_guests(study, runs, profile, hashes.get(profile), test, sz, node)
                found = series_runs(runs, profile, hashes.get(profile), [test], sz, node, guests)
                if not found:
                    continue
                samples = []
                for r in found:
                    samples += _samples(r, test, sz, guests)
                out[(profile, test)] = samples
                break
    return out


def _series_guests(study: Study, runs: Sequence[Run], profile: str, profile_hash: str | None, test: str, size: str,
                   node: str | None) -> int:
    """The guest count whose repeats a cell's series shows: the plan's when it has any, else the count with the most
    repeats (a series run with `--guests`)."""
    counts: dict[int, int] = {}
    for r in series_runs(runs, profile, profile_hash, [test], size, node, guests=None):
        counts[guest_count(r)] = counts.get(guest_count(r), 0) + 1
    planned = study.guests(size)
    if planned in counts or not counts:
        return planned
    return max(counts, key=lambda n: (counts[n], n))


def _samples(r: Run, test: str, size: str, guests: int) -> list[Sample]:
    """A repeat's samples of `test`: the guest's number, or with N guests each guest's (instance k beside bare
    metal's process k)."""
    metric = primary_metric(test, [m.metric for m in r.measurements if m.test == test])

    def sample(value: float, base: Measured | Measurement | None, at: float | None, k: int | None) -> Sample:
        return Sample(r.id, at or r.started_at or 0.0, value, base.value if base else None, metric, size, r.emulated,
                      r.accelerator, tuple(base.labels) if base else (), k)

    if guests == 1:
        guest = _measured(r, "guest", test, metric)
        return [] if guest is None else [sample(guest.value, _measured(r, "baseline", test, metric), None, None)]
    bases = {m.instance: m for m in r.instances("baseline", test, metric)}
    return [sample(m.value, bases.get(m.instance), m.started_at, m.instance)
            for m in r.instances("guest", test, metric)]


# ------------------------------------------------------------------------------------------ the matrix's state
NOT_RUN = "not run"
DONE = "done"
FAILED = "failed"
RUNNING = "running"
CANNOT_RUN = "cannot run"
CELL_STATES = (NOT_RUN, DONE, FAILED, RUNNING, CANNOT_RUN)


@dataclass(frozen=True)
class CellState:
    """Where one cell of the matrix stands: done (its selected `cell`); failed or running (the latest run of the
    profile that would measure it, newer than any stored number, in `run_id`, with its reason when failed); not run;
    or cannot run here (`reason`). A failed or running cell keeps the older number it has, if any, in `cell`."""

    profile: str
    test: str
    state: str
    cell: Cell | None = None
    run_id: int | None = None
    reason: str | None = None
    repeats: tuple[int, int] | None = None  # a series: (repeats stored, repeats planned at their size)

    @property
    def series_text(self) -> str:
        """"3 of 5 repeats" for a series cell, else empty."""
        return "" if self.repeats is None else f"{self.repeats[0]} of {self.repeats[1]} repeats"


def _covers(run: Run, test: str) -> bool:
    """Whether a run of `run.suite` would measure `test` (its measurements say so once it stored one). A front-end
    test only a run on a back-end measures: one on this host (its node is this host's name) does not."""
    if run.measurement("guest", test) is not None:
        return True
    if needs_node(test) and run.node in (None, "", platform.node()):
        return False
    if is_storage_test(test):
        return run.suite in ("storage", "all")
    return run.suite in ("network", "all")


def cell_states(study: Study, runs: Sequence[Run], cells: Mapping[CellKey, Cell], *,
                unavailable: Mapping[str, str] | None = None, size: str | None = None,
                series: Mapping[CellKey, Sequence[Sample]] | None = None) -> list[CellState]:
    """Every cell of the matrix (profiles in the study's order, then tests) with its state. `cells` is
    select_cells' choice; `runs` are the stored runs in any state: a running or failed run of the profile at one of
    the study's sizes (only `size` when given) that started after the selected cell's run, and would measure the
    test, decides the state."""
    sizes = [size] if size else list(study.sizes)
    out = _cell_states(study, runs, cells, unavailable or {}, sizes)
    if study.series is None:
        return out
    return [_with_repeats(study, c, (series or {}).get((c.profile, c.test), ()), sizes) for c in out]


def _cell_states(study: Study, runs: Sequence[Run], cells: Mapping[CellKey, Cell], unavailable: Mapping[str, str],
                 sizes: Sequence[str]) -> list[CellState]:
    latest: dict[str, list[Run]] = {}
    for run in sorted(runs, key=lambda r: (r.started_at or 0.0, r.id), reverse=True):
        if (run.profile_name in study.profile_names and run.size_label in sizes and run.state != "completed"
                and guest_count(run) == study.guests(run.size_label or "")):
            latest.setdefault(run.profile_name, []).append(run)
    out = []
    for profile in study.profile_names:
        for test in study.test_ids:
            cell = cells.get((profile, test))
            after = (cell.started_at or 0.0, cell.run_id) if cell else None
            newer = next((r for r in latest.get(profile, ())
                          if _covers(r, test) and (after is None or (r.started_at or 0.0, r.id) > after)), None)
            if newer is not None:
                state = RUNNING if newer.state == "running" else FAILED
                out.append(CellState(profile, test, state, cell, newer.id,
                                     newer.reason if state == FAILED else None))
            elif cell is not None:
                out.append(CellState(profile, test, DONE, cell, cell.run_id))
            elif profile in unavailable:
                out.append(CellState(profile, test, CANNOT_RUN, reason=unavailable[profile]))
            elif needs_node(test):
                out.append(CellState(profile, test, NOT_RUN, reason="only a run on a back-end (--node) measures it"))
            else:
                out.append(CellState(profile, test, NOT_RUN))
    return out


def _with_repeats(study: Study, c: CellState, samples: Sequence[Sample], sizes: Sequence[str]) -> CellState:
    size = samples[0].size_label if samples else sizes[0]
    plan = study.series_plan(size)
    return dataclasses.replace(c, repeats=(len({x.run_id for x in samples}), plan.repeats if plan else 0))


@dataclass(frozen=True)
class StudySummary:
    """A study in one line: its matrix's size, the cells holding a number, and the findings by verdict."""

    name: str
    title: str
    cells: int
    with_results: int
    verdicts: dict[str, int]
    problem: str | None = None

    @property
    def checked(self) -> int:
        """Findings with a verdict other than inconclusive."""
        return self.verdicts.get(REPRODUCED, 0) + self.verdicts.get(NOT_REPRODUCED, 0)

    @property
    def reproduced(self) -> int:
        return self.verdicts.get(REPRODUCED, 0)

    @property
    def findings(self) -> int:
        return sum(self.verdicts.values())


def summarize(ev: Evidence) -> StudySummary:
    """The summary of gathered evidence."""
    study = ev.study
    counts = {s: sum(1 for v in ev.verdicts if v.status == s) for s in VERDICTS}
    return StudySummary(study.name, study.title, len(study.profiles) * len(study.tests), len(ev.cells), counts)


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
        """The plan in words, one line per profile, then the sweep's, then what a loop device will stand in for."""
        return plan_lines(self.plan) + ([self.sweep.line()] if self.sweep is not None else []) + self.loop_lines()

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
                     if spec.profile in (r.profile, r.against) and is_storage_test(r.test)]
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
            parts.append("run " + ", ".join(item.run) + (f" x{item.repeats}" if item.series is not None else ""))
        if item.stored:
            parts.append("stored " + ", ".join(f"{t} (#{rid})" for t, rid in item.stored.items()))
        if item.elsewhere:
            parts.append("needs --node for " + ", ".join(item.elsewhere))
        out.append(f"  {item.profile}: " + "; ".join(parts))
    return out


def with_series_plan(study: Study, size: str, *, repeats: int | None = None,
                     every_minutes: float | None = None, guests: int | None = None) -> Study:
    """The study with its series plan at `size` changed (`study run --repeats/--every/--guests`), or UsageError
    naming the option and what is allowed: a study measured once per cell has no series to change."""
    plan = study.series_plan(size)
    if plan is None:
        series = ", ".join(e.name for e in list_studies()
                           if e.problem is None and load_study(e.path).series is not None) or "(none)"
        raise UsageError(f"--repeats, --every and --guests change a series study's plan; study {study.name} is "
                         f"measured once per cell, by one guest (series studies: {series})")
    try:
        new = SeriesPlan(every_minutes=plan.every_minutes if every_minutes is None else float(every_minutes),
                         repeats=plan.repeats if repeats is None else repeats,
                         guests=plan.guests if guests is None else guests)
    except ValidationError as exc:
        field_ = str(exc.errors()[0]["loc"][0])
        flag, allowed = {"repeats": ("--repeats", _RULES["series.study.repeats"]),
                         "every_minutes": ("--every", _RULES["series.study.every_minutes"]),
                         "guests": ("--guests", _RULES["series.study.guests"])}[field_]
        given = {"repeats": repeats, "every_minutes": every_minutes, "guests": guests}[field_]
        raise UsageError(f"{flag} {given!r} is out of range; allowed: {allowed}") from None
    assert study.series is not None
    return study.model_copy(update={"series": study.series.model_copy(update={size: new})})


def check_run(study: Study, size: str | None, node: str = "", **options: Any) -> str:
    """The size a study run uses (the study's first when None), after refusing a size the study does not offer and
    bad run options (UsageError), before anything is opened or recorded."""
    size = size or study.sizes[0]
    if size not in study.sizes:
        raise UsageError(f"--size {size!r} is not offered by study {study.name}; allowed: {', '.join(study.sizes)}")
    RunSpec(profile=study.profile_names[0], size=size, node=node, **options).validate()
    return size


def prepare_run(study: Study, runs: Sequence[Run], *, size: str | None = None, node: str = "", again: bool = False,
                **options: Any) -> StudyRun:
    """The study run `cloudbox study run` (and the TUI's Studies screen) starts: the cells not stored yet for the
    profiles as they are today, at `size`, on `node` (this host when ""), as validated RunSpecs, and after them the
    sweep's missing samples as one propagation run. `runs` are the stored runs (ResultStore.list_runs(): the cells
    count completed ones, the sweep the samples of every finished propagation run)."""
    size = check_run(study, size, node, **options)
    hashes, unavailable = profile_facts(study, here=not node)
    plan = plan_run(study, runs, hashes, size=size, node=node or platform.node(), backend=bool(node),
                    unavailable=unavailable, again=again)
    # Round r runs each profile still short of r + 1 repeats; a series spaces the rounds `every_minutes` apart.
    series = study.series_plan(size)
    specs: list[RunSpec] = []
    offsets: list[float] = []
    for r in range(max((item.repeats for item in plan if item.run), default=0)):
        for item in plan:
            if item.run and r < item.repeats:
                specs.append(item.spec(size, node, **options))
                offsets.append(r * series.every_s if series else 0.0)
    sweep = plan_sweep(study, runs, hashes, size=size, node=node or platform.node(), backend=bool(node),
                       unavailable=unavailable, again=again)
    if sweep is not None and sweep.todo and not sweep.refused:
        specs.append(sweep.spec(size, **options))
        offsets.append(offsets[-1] if offsets else 0.0)
    for spec in specs:
        spec.validate()
    todo = StudyRun(study, size, node, plan, specs, offsets if series else [], sweep)
    if not node:
        check_space(todo)
    return todo


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
