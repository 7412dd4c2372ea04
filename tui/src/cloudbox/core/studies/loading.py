"""Study files: parsing and validating them, finding them in the study directories, and whether this cloudbox can
run a study's profile.

`load_study` checks a file against the schema, then against the rest (its profiles exist and validate, its cells are
in its matrix, its rules can be stated and read figures their tests store, every source names lines of one of its
documents, a series or sweep has a plan per size); `StudyError` names the file and, for every problem, the key, the
value and what is allowed, like a profile's problems. Asking for a study another file holds (E, in A's) is a
UsageError naming that file.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from pydantic import ValidationError

from .. import inputs, paths
from ..bench.bonnie import BONNIE_METRICS
from ..bench.iozone import IOZONE_FILE_PASSES, RETEST_METRIC
from ..disks import hostraid
from ..disks.volumes import attach
from ..errors import NotFound, ProfileError, ProfileProblem, StudyError, UsageError
from ..spec import profiles
from ..spec import schema as spec_schema
from ..spec.catalogue import IOZONE_GRIDS, IOZONE_SWEEPS, TESTS, is_storage_test
from ..spec.runspec import MAX_BOOTS, MAX_GUESTS, MAX_SAMPLES, MIN_ADAPTIVE_REPEATS, WIDTH_RANGE
from ..spec.runspec import MAX_REPEATS as MAX_RUN_REPEATS
from ..virt import requirements
from .schema import (
    HOST_METRICS,
    MAX_ENTRIES,
    MAX_IMAGE_MIB,
    MAX_IMAGE_SIZES,
    MAX_REPEATS,
    MAX_SWEEP_REPEATS,
    NATIVE,
    OPS,
    RULE_METRICS,
    SIZES,
    RepeatPlan,
    Rule,
    Study,
    known_tests,
    source_refs,
)

SOURCE_ALLOWED = ('document:line (where), e.g. "000:294 (Table 1)", "003:139, 153 (slides); 000:431-433": a document '
                  "of the study's [documents] (three digits), its lines (N or N-M, several joined by \", \"), a "
                  "bracketed note of where; several such parts joined by \"; \"")
TEXT = "one line of text, 1..1000 characters"

ALLOWED = {
    "name": "lowercase letters, digits and '-', starting with a letter or digit, at most 63 characters",
    "title": "one line of text, 1..200 characters",
    "description": TEXT,
    "includes": "a list of other studies' names (lowercase letters, digits, '-') whose rows this file holds",
    "documents": 'a table of the study\'s texts by number, e.g. "000" = "the paper: its authors, title, venue"',
    "sizes": "a list of study, quick (each at most once)",
    "profiles": f"1..{MAX_ENTRIES} [[profiles]] tables with keys name, row and optionally differs",
    "profiles.name": "a profile name (cloudbox profile list)",
    "profiles.row": "one line of text, 1..200 characters: the paper's words for the row",
    "profiles.differs": f"{TEXT}: what the profile does otherwise than the study's configuration, and why",
    "tests": f"1..{MAX_ENTRIES} [[tests]] tables with keys id, table and optionally differs",
    "tests.table": "one line of text, 1..200 characters: the paper's table title",
    "tests.differs": f"{TEXT}: what the test does otherwise than the study's method, and why",
    "paper": f"at most {4 * MAX_ENTRIES} [[paper]] tables",
    "paper.cell": "profile/test, or native/test for the bare-metal row",
    "paper.source": SOURCE_ALLOWED,
    "paper.derived": f"{TEXT}: how a number was computed from the published ones",
    "paper.note": f"{TEXT}: where the texts disagree about these numbers",
    "rules": f"at most {MAX_ENTRIES} [[rules]] tables",
    "rules.id": "1..16 letters, digits, '.' and '-', e.g. A1 or B3.2",
    "rules.finding": TEXT,
    "rules.why": f"{TEXT}: why the threshold is where it is",
    "rules.source": SOURCE_ALLOWED,
    "rules.cell": "profile/test of this study's matrix",
    "rules.against": f"{NATIVE} or a profile of this study's matrix",
    "rules.against_cell": "profile/test of this study's matrix, other than the rule's own cell",
    "rules.figure": "a figure the rule's test stores beside its number, e.g. re-read MB/s (IOzone), creates/s "
                    "(Bonnie++), read MB/s, 1 MiB file (IOzone's file sweep)",
    "rules.metric": ", ".join(RULE_METRICS),
    "rules.op": ", ".join(OPS),
    "plan": "a table with a sampling plan per size: [plan.study] and/or [plan.quick]",
    **{f"plan.{size}": "a table with keys repeats, until_width, max_repeats, boots (each optional)" for size in SIZES},
    **{f"plan.{size}.{key}": text for size in SIZES for key, text in (
        ("repeats", f"samples a side of each test in one guest boot, 1..{MAX_RUN_REPEATS} (with until_width: the "
                    "fewest; default 1)"),
        ("until_width", f"0 (off) or {WIDTH_RANGE[0]:g}..{WIDTH_RANGE[1]:g}: repeat until the guest/bare-metal "
                        "ratio's 95% interval is within +-that percent"),
        ("max_repeats", f"with until_width, the most repeats: 0 (the default, 10) or {MIN_ADAPTIVE_REPEATS}.."
                        f"{MAX_RUN_REPEATS}, at least repeats"),
        ("boots", f"guest boots the repeats are taken in, 1..{MAX_BOOTS} (more than 1 only without until_width)"))},
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
        owner = spec_schema.model_at(Study, parts)
        return f"known keys: {', '.join(owner.model_fields)}" if owner else None
    if not parts:
        return f"a TOML document with keys: {', '.join(Study.model_fields)}"
    if parts[0] == "documents":
        return ALLOWED["documents"]
    if parts[-1] in _NUMBERS:
        return "a number >= 0"
    if parts == ["tests", "id"]:
        return ", ".join(known_tests())
    return ALLOWED.get(".".join(parts))


def _split_cell(text: str) -> tuple[str, str] | None:
    profile, sep, test = text.partition("/")
    return (profile, test) if sep and profile and test else None


def _size_problems(study: Study, lookup: Callable[[str], object]) -> list[ProfileProblem]:
    """Each size once."""
    if len(set(study.sizes)) != len(study.sizes):
        return [ProfileProblem("sizes", list(study.sizes), "a size is listed twice", ALLOWED["sizes"])]
    return []


def _profile_problems(study: Study, lookup: Callable[[str], object]) -> list[ProfileProblem]:
    """Each row a profile that exists and validates, listed once, and none named like the bare-metal row."""
    out = []
    names = study.profile_names
    for i, p in enumerate(study.profiles, 1):
        key = f"profiles[{i}].name"
        if p.name == NATIVE:
            out.append(ProfileProblem(key, p.name, f"'{NATIVE}' names the bare-metal row, not a profile",
                                      "a profile name"))
        elif names.index(p.name) != i - 1:
            out.append(ProfileProblem(key, p.name, "the profile is listed twice", "each profile once"))
        else:
            try:
                lookup(p.name)
            except NotFound:
                names_known = ", ".join(e.name for e in profiles.list_profiles()) or "(none)"
                out.append(ProfileProblem(key, p.name, "no such profile", f"a profile name: {names_known}"))
            except ProfileError as e:
                out.append(ProfileProblem(
                    key, p.name, f"the profile does not validate ({e.problems[0] if e.problems else e.source})",
                    "a valid profile (cloudbox profile validate)"))
    return out


def _test_problems(study: Study, lookup: Callable[[str], object]) -> list[ProfileProblem]:
    """Each column a test a run stores, listed once."""
    out = []
    tests = study.test_ids
    known = known_tests()
    for i, t in enumerate(study.tests, 1):
        key = f"tests[{i}].id"
        if t.id not in known:
            out.append(ProfileProblem(key, t.id, "no such test", ", ".join(known)))
        elif tests.index(t.id) != i - 1:
            out.append(ProfileProblem(key, t.id, "the test is listed twice", "each test once"))
    return out


def _in_matrix(study: Study, key: str, text: str, *, native: bool) -> tuple[str, str] | ProfileProblem:
    """A cell's (profile, test) when `text` names one of the study's matrix (or of its bare-metal row, `native`),
    else the problem."""
    rows = ([NATIVE] if native else []) + study.profile_names
    tests = study.test_ids
    allowed = (f"profile/test with a profile of [[profiles]] ({', '.join(rows)}) and a test of [[tests]] "
               f"({', '.join(tests)})")
    parts = _split_cell(text)
    if parts is None:
        return ProfileProblem(key, text, "not a cell", allowed)
    if parts[0] not in rows:
        return ProfileProblem(key, text, f"profile {parts[0]!r} is not in this study's [[profiles]]", allowed)
    if parts[1] not in tests:
        return ProfileProblem(key, text, f"test {parts[1]!r} is not in this study's [[tests]]", allowed)
    return parts


def _document_problems(study: Study, lookup: Callable[[str], object]) -> list[ProfileProblem]:
    """Each document numbered with three digits, and every source naming lines of one of them."""
    out = [ProfileProblem(f"documents.{inputs.key_text((doc,))}", doc, "not a document number", ALLOWED["documents"])
           for doc in study.documents if not (len(doc) == 3 and doc.isdigit())]
    sources = [(f"paper[{i}].source", c.source) for i, c in enumerate(study.paper, 1)]
    sources += [(f"rules[{i}].source", r.source) for i, r in enumerate(study.rules, 1) if r.source is not None]
    known = ", ".join(study.documents) or "none: the study has no [documents] table"
    if study.documents:  # a published study: every finding with where the texts state it
        out += [ProfileProblem(f"rules[{i}].source", None, "required key is missing", SOURCE_ALLOWED)
                for i, r in enumerate(study.rules, 1) if r.source is None]
    elif study.paper:  # a study of cloudbox's own has no published figures to carry
        out.append(ProfileProblem("paper", f"{len(study.paper)} cells", "a study without [documents] (cloudbox's "
                                  "own) has no published figures", "a [documents] table naming the texts"))
    for key, source in sources:
        for doc, spans in source_refs(source):
            if doc not in study.documents:
                out.append(ProfileProblem(key, source, f"document {doc} is not in this study's [documents]",
                                          f"{SOURCE_ALLOWED}; documents: {known}"))
            elif any(first < 1 or last < first for first, last in spans):
                out.append(ProfileProblem(key, source, f"the lines of document {doc} are not N or N-M with "
                                          "1 <= N <= M", SOURCE_ALLOWED))
    return out


E = TypeVar("E")


def _keyed(entries: Iterable[E], table: str) -> Iterator[tuple[str, E]]:
    """Each entry of an array of tables with its key as problems name it: paper[1], paper[2], ..."""
    for i, entry in enumerate(entries, 1):
        yield f"{table}[{i}]", entry


def _paper_problems(study: Study, lookup: Callable[[str], object]) -> list[ProfileProblem]:
    """Each published cell in the matrix, once, with a number, and no % of native on the bare-metal row."""
    out = []
    seen: set[str] = set()
    for key, c in _keyed(study.paper, "paper"):
        parts = _in_matrix(study, f"{key}.cell", c.cell, native=True)
        if isinstance(parts, ProfileProblem):
            out.append(parts)
            continue
        if c.cell in seen:
            out.append(ProfileProblem(f"{key}.cell", c.cell, "the cell has published numbers twice",
                                      "each cell once"))
        seen.add(c.cell)
        if parts[0] == NATIVE and (c.percent is not None or c.native is not None):
            out.append(ProfileProblem(f"{key}.percent" if c.percent is not None else f"{key}.native",
                                      c.percent if c.percent is not None else c.native,
                                      "the bare-metal row is native itself",
                                      "value, avgrq, avgqu, util (on native/... cells)"))
        if all(getattr(c, k) is None for k in ("value", "percent", "avgrq", "avgqu", "util")):
            out.append(ProfileProblem(key, c.cell, "a paper cell without a published number",
                                      "at least one of value, percent, avgrq, avgqu, util"))
    return out


def _rule_problems(study: Study, lookup: Callable[[str], object]) -> list[ProfileProblem]:
    """Each rule with its own id, over a cell of the matrix, with a threshold it can state."""
    out = []
    ids: set[str] = set()
    for key, r in _keyed(study.rules, "rules"):
        if r.id in ids:
            out.append(ProfileProblem(f"{key}.id", r.id, "two rules have this id", "a unique id per rule"))
        ids.add(r.id)
        parts = _in_matrix(study, f"{key}.cell", r.cell, native=False)
        if isinstance(parts, ProfileProblem):
            out.append(parts)
        out += _threshold_problems(study, key, r, None if isinstance(parts, ProfileProblem) else parts)
        out += _figure_problems(study, key, r, None if isinstance(parts, ProfileProblem) else parts)
    return out


_SWEEP_FIGURE = re.compile(rf"(?:{'|'.join(IOZONE_FILE_PASSES)}) MB/s, \d+ (?:KiB|MiB) file")
_GRID_FIGURE = re.compile(rf"{_SWEEP_FIGURE.pattern}, \d+ (?:KiB|MiB) records")


def stored_figures(test: str) -> tuple[Callable[[str], bool], str] | None:
    """Which figures a run stores for `test` beside its number (a predicate over a figure's name, and the names in
    words), or None when it stores none: IOzone's second pass, its sweeps' passes per file size, Bonnie++'s."""
    t = TESTS.get(test)
    if t is None:
        return None
    if t.tool in IOZONE_SWEEPS:
        grid = test in IOZONE_GRIDS
        pattern = _GRID_FIGURE if grid else _SWEEP_FIGURE
        return (lambda f: pattern.fullmatch(f) is not None,
                "PASS MB/s, SIZE file" + (", SIZE records" if grid else "") + f" (PASS one of "
                f"{', '.join(IOZONE_FILE_PASSES)}; SIZE e.g. 1 MiB or 512 KiB)")
    if t.program == "iozone":
        name = RETEST_METRIC["write" if t.writes else "read"]
        return (lambda f: f == name), name
    if t.tool == "bonnie":
        names = [m for m in BONNIE_METRICS if m != "MB/s"]
        return (lambda f: f in names), ", ".join(names)
    return None


def _figure_problems(study: Study, key: str, r: Rule, parts: tuple[str, str] | None) -> list[ProfileProblem]:
    """A rule's `figure`: on the number itself only (not a host metric), one its test (and the cell it divides by)
    stores."""
    if r.figure is None:
        return []
    if r.metric != "value":
        return [ProfileProblem(f"{key}.figure", r.figure, "a figure is read instead of the test's number, not of a "
                               f"host metric ({r.metric})", "figure without metric, or metric without figure")]
    out = []
    other = r.other
    for test in dict.fromkeys(t for t in (parts[1] if parts else None, other[1] if other else None) if t):
        figures = stored_figures(test)
        if figures is None:
            out.append(ProfileProblem(f"{key}.figure", r.figure, f"test {test} stores no figure beside its number",
                                      "no figure (the test's own number), or a test that stores some: IOzone, "
                                      "its sweeps, Bonnie++"))
        elif not figures[0](r.figure):
            out.append(ProfileProblem(f"{key}.figure", r.figure, f"not a figure test {test} stores",
                                      figures[1]))
    return out


def _threshold_problems(study: Study, key: str, r: Rule, parts: tuple[str, str] | None) -> list[ProfileProblem]:
    """What one rule compares its cell (`parts`, None when outside the matrix) with: `against` another profile of the
    matrix (or native) and a percentage, or without `against` a value; a host metric only for a storage test."""
    out = []
    names = study.profile_names
    if r.against_cell is not None:
        if r.against is not None:
            out.append(ProfileProblem(f"{key}.against_cell", r.against_cell, "a rule divides by one thing: "
                                      "`against` (native or a profile) or `against_cell`", "one of the two"))
        other = _in_matrix(study, f"{key}.against_cell", r.against_cell, native=False)
        if isinstance(other, ProfileProblem):
            out.append(other)
        elif parts is not None and other == parts:
            out.append(ProfileProblem(f"{key}.against_cell", r.against_cell, "a cell against itself",
                                      ALLOWED["rules.against_cell"]))
        elif r.metric in HOST_METRICS and not is_storage_test(other[1]):
            out.append(ProfileProblem(f"{key}.metric", r.metric, "host disk metrics exist for storage tests only",
                                      f"value (with test {other[1]})"))
    if r.against is not None and r.against != NATIVE:
        if r.against not in names:
            out.append(ProfileProblem(f"{key}.against", r.against, "not a profile of this study's [[profiles]]",
                                      f"{NATIVE}, {', '.join(names)}"))
        elif parts is not None and r.against == parts[0]:
            out.append(ProfileProblem(f"{key}.against", r.against, "a cell against itself",
                                      f"{NATIVE} or another profile"))
    if not r.relative and r.value is None:
        out.append(ProfileProblem(f"{key}.value", None, "a rule without `against` compares the cell's number with "
                                  "`value`", "a number >= 0 (or set against and percent)"))
    if r.relative and r.percent is None:
        out.append(ProfileProblem(f"{key}.percent", None, "a rule with `against` compares a percentage",
                                  "a number > 0 (percent)"))
    if r.relative and r.value is not None:
        out.append(ProfileProblem(f"{key}.value", r.value, "with `against` the threshold is a percentage",
                                  "percent instead of value"))
    if not r.relative and r.percent is not None:
        out.append(ProfileProblem(f"{key}.percent", r.percent, "a percentage needs `against`",
                                  f"against = \"{NATIVE}\" or a profile, or against_cell; or value instead of "
                                  "percent"))
    if r.percent == 0 and r.relative:
        out.append(ProfileProblem(f"{key}.percent", r.percent, "0% is no threshold", "a number > 0"))
    if parts is not None and r.metric in HOST_METRICS and not is_storage_test(parts[1]):
        out.append(ProfileProblem(f"{key}.metric", r.metric, "host disk metrics exist for storage tests only",
                                  f"value (with test {parts[1]})"))
    return out


def _series_problems(study: Study, lookup: Callable[[str], object]) -> list[ProfileProblem]:
    """A series study's plans: one for each of its sizes, none for another."""
    out: list[ProfileProblem] = []
    if study.series is None:
        return out
    for size in study.sizes:
        if study.series_plan(size) is None:
            out.append(ProfileProblem(f"series.{size}", None, f"a series study needs a plan for each of its sizes "
                                      f"({size} is one)", ALLOWED[f"series.{size}"]))
    for other in SIZES:
        if other not in study.sizes and study.series_plan(other) is not None:
            out.append(ProfileProblem(f"series.{other}", other, "a plan for a size the study does not offer",
                                      f"sizes: {', '.join(study.sizes)}"))
    return out


def _plan_problems(study: Study, lookup: Callable[[str], object]) -> list[ProfileProblem]:
    """The [plan] tables: none in a series study, none for a size the study does not offer, and each a plan
    `cloudbox run` would take (the same checks as its --repeats, --until-width, --max-repeats and --boots)."""
    out: list[ProfileProblem] = []
    if study.plan is None:
        return out
    if study.series is not None:
        return [ProfileProblem("plan", "a [plan] table", "a series study's repeats are runs spaced in time, planned "
                               "by its [series] tables", "[series.study] / [series.quick], no [plan]")]
    for size in SIZES:
        plan = getattr(study.plan, size)
        if plan is None:
            continue
        if size not in study.sizes:
            out.append(ProfileProblem(f"plan.{size}", size, "a plan for a size the study does not offer",
                                      f"sizes: {', '.join(study.sizes)}"))
        out += [ProfileProblem(f"plan.{size}.{key}", value, why, ALLOWED[f"plan.{size}.{key}"])
                for key, value, why in plan_problems(plan)]
    return out


def plan_problems(plan: RepeatPlan) -> list[tuple[str, object, str]]:
    """What `cloudbox run` would refuse in a sampling plan beyond each key's range: (key, value, why) each."""
    out: list[tuple[str, object, str]] = []
    if 0 < plan.until_width < WIDTH_RANGE[0]:
        out.append(("until_width", plan.until_width, "narrower than any run can be asked for"))
    if plan.max_repeats and not plan.until_width:
        out.append(("max_repeats", plan.max_repeats, "caps until_width's repeats, and until_width is off"))
    elif plan.max_repeats and plan.max_repeats < max(plan.repeats, MIN_ADAPTIVE_REPEATS):
        out.append(("max_repeats", plan.max_repeats, f"fewer than {max(plan.repeats, MIN_ADAPTIVE_REPEATS)} (repeats, "
                    f"or the {MIN_ADAPTIVE_REPEATS} a side a ratio's interval needs)"))
    if plan.until_width and plan.boots > 1:
        out.append(("boots", plan.boots, "the adaptive stop (until_width) counts repeats within one guest boot"))
    if plan.repeats * plan.boots > MAX_SAMPLES:
        out.append(("repeats", plan.repeats, f"{plan.repeats} in each of {plan.boots} boots is more than "
                    f"{MAX_SAMPLES} samples a side"))
    return out


def _sweep_problems(study: Study, lookup: Callable[[str], object]) -> list[ProfileProblem]:
    """The [propagation] table against the rest: its profile a runnable row with a raw disk, a plan for each of the
    study's sizes and none for another, the image sizes ascending."""
    prop = study.propagation
    out: list[ProfileProblem] = []
    if prop is None:
        return out
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
                out.append(ProfileProblem("propagation.profile", prop.profile, why, ALLOWED["propagation.profile"]))
    for size in study.sizes:
        if study.sweep_plan(size) is None:
            out.append(ProfileProblem(f"propagation.{size}", None, f"a sweep needs a plan for each of the study's "
                                      f"sizes ({size} is one)", ALLOWED[f"propagation.{size}"]))
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
                                      ALLOWED[f"propagation.{other}.sizes_mib"]))
    return out


# What pydantic cannot see, in the order the problems are listed: unknown profiles and tests, cells outside the
# matrix, rules that cannot be stated, plans missing for a size.
_CROSS_CHECKS = (_size_problems, _profile_problems, _test_problems, _paper_problems, _rule_problems,
                 _document_problems, _sweep_problems, _series_problems, _plan_problems)


def _cross_problems(study: Study, lookup: Callable[[str], object]) -> list[ProfileProblem]:
    """Every problem the cross checks find (`lookup` finds a profile by name)."""
    return [problem for check in _CROSS_CHECKS for problem in check(study, lookup)]


def _validate_own(data: object, source: str, expect_name: str | None) -> tuple[Study, list[ProfileProblem]]:
    """The study's own checks (schema, name); StudyError when the schema fails, else the study and its problems."""
    try:
        study = Study.model_validate(data)
    except ValidationError as exc:
        raise StudyError(source, spec_schema.problems_from(
            exc, key=_key, allowed=lambda loc, _key_text, etype: _allowed(loc, etype))) from None
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
    data = spec_schema.parse_toml(text, source, StudyError)
    return validate_data(data, source, expect_name=expect_name, lookup=lookup)


def load_study(path: str | os.PathLike[str]) -> Study:
    """Load and validate one study file (a regular file of at most inputs.MAX_FILE_BYTES); its `name` must equal the
    file's stem."""
    own = spec_schema.load_file(path, _parse_own, error=StudyError, missing=_no_study_file, kept=_PARSED)
    study, problems = own
    # The profiles may have changed since: checked on every load (cheap, load_profile keeps what it parsed).
    problems = problems + _cross_problems(study, profiles.find_profile)
    if problems:
        raise StudyError(os.fspath(path), problems)
    return study


# A study file's own validation by (path, text): the Studies screen reloads every few seconds, and parsing every
# study took most of that reload's CPU on the UI's process (make bench, "tui"). Study is immutable.
_PARSED: spec_schema.Parsed[tuple[Study, list[ProfileProblem]]] = spec_schema.Parsed(64)


def _parse_own(text: str, source: str, stem: str) -> tuple[Study, list[ProfileProblem]]:
    """A study file's text through its own checks (schema, name against the file's stem)."""
    return _validate_own(spec_schema.parse_toml(text, source, StudyError), source, stem)


def _no_study_file(path: str | os.PathLike[str]) -> NotFound:
    return NotFound(f"{inputs.shown(os.fspath(path))}: no such study file")


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
    """The study called `name` (case does not matter: `A` is studies/a.toml), or a study file given by path; a name
    another study `includes` (study E, the slides, is in A's file) is a UsageError naming that study."""
    if "/" in name or name.endswith(".toml"):
        return load_study(name)
    for stem, f in _candidates():
        if stem == name.lower():
            return load_study(f)
    stems = [stem for stem, _ in _candidates()]
    for stem, f in _candidates():
        with contextlib.suppress(StudyError, NotFound):
            if name.lower() in load_study(f).includes:
                raise UsageError(f"study {inputs.shown(name)} has no file of its own: its rows and findings are in "
                                 f"study {stem} ({f}); allowed: {stem} (cloudbox study show {stem})")
    raise NotFound(f"no study named {inputs.shown(name)}{inputs.did_you_mean(name, stems)}; known "
                   f"studies: {', '.join(stems) or '(none)'} (cloudbox study list)")


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
    e.g. aoe for disk.attach = host; md for a RAID on the host; the CPUs, NUMA nodes, huge pages or devices of
    core.virt.requirements), or None; the same check a run makes at its first step."""
    d = profile.disk
    if (why := requirements.host_problem(profile)) is not None:  # CPUs, nodes, huge pages, devices
        return why
    if d.raid_on == "host":
        return hostraid.problem() or None
    if d.backing != "network-volume":
        return None
    try:
        attach.check_attach(d.volume.partition(":")[0], d.attach, hypervisor=profile.guest.hypervisor)
    except attach.AttachRefused as e:
        return e.summary
    return None
