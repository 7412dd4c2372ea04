"""The study file's schema: a published study's matrix, the numbers it published and its findings as rules that
stored runs can confirm or refute, as strict models.

A study is a TOML file (studies/*.toml in the checkout, /usr/share/cloudbox/studies installed) holding:

- its matrix: the profiles (each with the paper's words for its row), the tests (each with the title of the paper's
  table it fills) and the sizes `study run` offers (`study` decides findings; `quick` is for trying things out);
- `includes`: the names of other studies whose rows and findings this file holds (study A holds study E, its
  slides), so that asking for one of them says where it went;
- `[documents]`: the texts the study comes from, by number ("000" = ...): every `source` names its lines in them;
- `differs` on a row or a table: what this lab's configuration or method does otherwise than the study, and why;
- `[[paper]]`: the published numbers per cell ("profile/test", or "native/test" for the bare-metal row), each with
  its `source` ("000:294 (Table 1)": document, line, where in it), how a figure was `derived` from published ones
  and a `note` where the texts disagree;
- `[[rules]]`: each finding as a comparison over one cell, with the `source` of the finding: the cell's number (or
  another of its stored figures, `figure`) itself, or as a % of the same run's bare-metal baseline ("native"), of
  another profile's cell of the same test (`against`) or of another cell (`against_cell`).
- `cost = true`: the report adds each number per host core and per GiB of guest RAM (study C's cost per MB/s).
- `[plan.study]` / `[plan.quick]`: how each cell is sampled at that size (repeats, or until the ratio's interval is
  narrow enough, in how many guest boots); a size without one takes DEFAULT_PLANS';
- `[series]`: study D's variability series: how many repeats of each profile at each size, how far apart.
- `[propagation]`: study B's image-propagation sweep: a profile whose guest is provisioned from images of the sizes
  of `[propagation.study]` / `[propagation.quick]`, `repeats` times each (core.bench.propagation).

`Study` is the whole, validated by loading.parse_study / load_study (which also check it against the profiles).
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import Field

from ..spec import catalogue, profiles
from ..spec import schema as spec_schema
from ..spec.catalogue import FRONTEND_SUFFIX, NET_TESTS, is_network_test, is_storage_test, primary_metric
from ..spec.catalogue import TESTS as STORAGE_TESTS
from ..spec.runspec import (
    DEFAULT_MOST_REPEATS,
    DEFAULT_WIDTH,
    MAX_BOOTS,
    MAX_GUESTS,
    MIB,
    MIN_ADAPTIVE_REPEATS,
    WIDTH_RANGE,
)
from ..spec.runspec import MAX_REPEATS as MAX_RUN_REPEATS

NATIVE = "native"  # the bare-metal row of a paper table, and a rule's "% of native"
SIZES = ("study", "quick")
DECISIVE_SIZE = "study"  # the only size whose cells can decide a finding
HOST_METRICS = ("avgrq", "avgqu", "util")
RULE_METRICS = ("value", *HOST_METRICS)
OPS: dict[str, Callable[[float, float], bool]] = {"<=": operator.le, ">=": operator.ge, "<": operator.lt,
                                                 ">": operator.gt}
OP_SIGNS = {"<=": "≤", ">=": "≥", "<": "<", ">": ">"}
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
Line = spec_schema.OneLine
Text = Annotated[str, Field(min_length=1, max_length=1000, pattern=spec_schema.ONE_LINE), spec_schema.NoControls]
Number = Annotated[float, Field(ge=0, allow_inf_nan=False)]
CellText = Annotated[str, Field(max_length=200)]
StudyName = Annotated[str, Field(pattern=profiles.NAME_PATTERN)]
# Where in the study's texts: "000:294 (Table 1)", "003:139, 153 (slides); 000:431-433": a document of [documents],
# its lines (as `sed -n Np` counts them) and, in brackets, where that is; several such parts joined by "; ".
SOURCE_PART = r"\d{3}:\d+(?:-\d+)?(?:, \d+(?:-\d+)?)*(?: \([^()\n\r]+\))?"
SOURCE_REF = re.compile(r"(\d{3}):(\d+(?:-\d+)?(?:, \d+(?:-\d+)?)*)")
Source = Annotated[str, Field(min_length=1, max_length=300, pattern=rf"^{SOURCE_PART}(?:; {SOURCE_PART})*$"),
                   spec_schema.NoControls]


def source_refs(source: str) -> list[tuple[str, list[tuple[int, int]]]]:
    """A source's references: (document, [(first line, last line), ...]) per part, in order."""
    out = []
    for doc, lines in SOURCE_REF.findall(source):
        spans = []
        for span in lines.split(", "):
            first, _, last = span.partition("-")
            spans.append((int(first), int(last or first)))
        out.append((doc, spans))
    return out


class MatrixProfile(spec_schema.Strict):
    """A row of the study: a profile, with the paper's words for the configuration it stands for."""

    name: str = Field(pattern=profiles.NAME_PATTERN)
    row: Line
    differs: Text | None = None  # what the profile does otherwise than the study's configuration, and why


class MatrixTest(spec_schema.Strict):
    """A column of the study: a test, with the title of the paper's table it fills."""

    id: str = Field(max_length=64)
    table: Line
    differs: Text | None = None  # what the test does otherwise than the study's method, and why


class PaperCell(spec_schema.Strict):
    """The published numbers of one cell ("profile/test", or "native/test" for the bare-metal row)."""

    cell: CellText
    value: Number | None = None  # in the test's metric (MB/s, Mbit/s, ...)
    percent: Number | None = None  # the published % of native, where the paper gives a ratio rather than a number
    native: Number | None = None  # the bare-metal number this row was published against, when not the native row
    avgrq: Number | None = None  # host request size, 512-byte sectors
    avgqu: Number | None = None  # host queue length
    util: Number | None = None  # host disk utilisation, %
    source: Source  # where the texts print these numbers
    derived: Text | None = None  # how a number was computed from published ones (a unit converted, a ratio)
    note: Text | None = None  # where the texts disagree about it


class Rule(spec_schema.Strict):
    """A finding as a check over one cell: its number (`value`), or its % of native, of another profile's cell of
    the same test (`against`) or of another cell (`against_cell`) with `percent`, compared with `op`. The number is
    the test's own, a host disk metric (`metric`) or another figure the run stored for the test (`figure`)."""

    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9.-]{0,15}$")
    finding: Text
    cell: CellText
    against: str | None = Field(None, max_length=64)
    against_cell: CellText | None = None
    metric: Literal["value", "avgrq", "avgqu", "util"] = "value"
    figure: Line | None = None  # a stored figure of the test other than its own number, e.g. "re-read MB/s"
    op: Literal["<=", ">=", "<", ">"]
    percent: Number | None = None
    value: Number | None = None
    paper: Number | None = None  # the published figure of the same quantity, where the paper states it
    why: Text
    # where the texts state the finding: every rule of a published study has one (loading checks it); a study of
    # cloudbox's own (no [documents]) states its own questions
    source: Source | None = None

    @property
    def profile(self) -> str:
        return self.cell.partition("/")[0]

    @property
    def test(self) -> str:
        return self.cell.partition("/")[2]

    @property
    def other(self) -> tuple[str, str] | None:
        """The (profile, test) of the cell the rule divides by, when that is a guest's: `against`'s profile with the
        same test, or `against_cell`; None against native or without a divisor."""
        if self.against_cell is not None:
            profile, _, test = self.against_cell.partition("/")
            return profile, test
        if self.against is not None and self.against != NATIVE:
            return self.against, self.test
        return None

    @property
    def relative(self) -> bool:
        """Whether the rule compares a percentage (against native, a profile or a cell) rather than a number."""
        return self.against is not None or self.against_cell is not None

    @property
    def threshold(self) -> float:
        return self.percent if self.percent is not None else (self.value or 0.0)

    @property
    def unit(self) -> str:
        """The unit of the rule's number without `against`: the test's metric, the host metric's or the figure's."""
        if self.figure is not None:
            return figure_unit(self.figure)
        return {"value": primary_metric(self.test), "avgrq": "sectors", "avgqu": "", "util": "%"}[self.metric]

    def statement(self) -> str:
        """The rule in words, e.g. "eucalyptus-default dd-write-64k ≤ 10% of native"."""
        quantity = (f" {self.figure}" if self.figure is not None else
                    "" if self.metric == "value" else f" host {self.metric}")
        what = f"{self.profile} {self.test}{quantity}"
        sign = OP_SIGNS[self.op]
        if not self.relative:
            unit = "" if self.figure is not None or not self.unit else (
                self.unit if self.unit == "%" else f" {self.unit}")
            return f"{what} {sign} {self.threshold:g}{unit}"
        if self.against_cell is not None:
            profile, _, test = self.against_cell.partition("/")
            of = f"{test}'s" if profile == self.profile else f"{profile} {test}'s"
        else:
            of = NATIVE if self.against == NATIVE else f"{self.against}'s"
        return f"{what} {sign} {self.threshold:g}% of {of}"


def figure_unit(figure: str) -> str:
    """The unit a stored figure's name ends its quantity with: "re-read MB/s" -> MB/s, "creates/s" -> /s."""
    head = figure.split(",")[0]
    return next((u for u in ("MB/s", "%CPU", "/s", "seconds") if u in head), "")


class SeriesPlan(spec_schema.Strict):
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


class RepeatPlan(spec_schema.Strict):
    """How each cell is sampled at one size (a study measured per cell, not a series): `repeats` samples a side in
    one guest boot, or with `until_width` (percent) until the guest/bare-metal ratio's 95% interval is within that,
    at least `repeats` and at most `max_repeats`; in each of `boots` guest boots (`cloudbox run`'s options of the
    same names, which each profile's run gets)."""

    repeats: int = Field(default=1, ge=1, le=MAX_RUN_REPEATS)
    until_width: float = Field(default=0.0, ge=0, le=WIDTH_RANGE[1], allow_inf_nan=False)
    max_repeats: int = Field(default=0, ge=0, le=MAX_RUN_REPEATS)
    boots: int = Field(default=1, ge=1, le=MAX_BOOTS)

    @property
    def repeated(self) -> bool:
        return self.repeats > 1 or self.boots > 1 or self.until_width > 0

    @property
    def options(self) -> dict[str, Any]:
        """The run options of each profile's run (RunSpec fields)."""
        return {"repeats": self.repeats, "until_width": self.until_width, "max_repeats": self.max_repeats,
                "boots": self.boots}

    @property
    def samples(self) -> int:
        """The samples a side a test takes in all with a fixed count (with until_width: the fewest)."""
        return self.repeats * self.boots

    def words(self) -> str:
        """"3 repeats", "until +-5% (4 to 10 repeats)", "2 repeats in each of 3 boots", "one sample"."""
        if self.until_width:
            low = max(self.repeats, MIN_ADAPTIVE_REPEATS)
            most = max(low, self.max_repeats or DEFAULT_MOST_REPEATS)
            return f"until +-{self.until_width:g}% ({low} to {most} repeats)"
        if not self.repeated:
            return "one sample"
        return f"{self.repeats} repeat{'s' if self.repeats != 1 else ''}" + (
            f" in each of {self.boots} boots" if self.boots > 1 else "")


# A study file without a [plan] table: a quick run gives each cell 3 + 3 samples (a ratio with an interval, the guest
# boot reused; its cost against a single pass: docs/benchmarks.md "study plan"); a study-size run, the one that
# decides findings, repeats until the ratio is within +-5% or 10 repeats (netperf's -I 99,5 and -i 10).
DEFAULT_PLANS = {"quick": RepeatPlan(repeats=3),
                 "study": RepeatPlan(until_width=DEFAULT_WIDTH, max_repeats=DEFAULT_MOST_REPEATS)}
SINGLE = RepeatPlan()  # one sample a side: a series' run, a run whose profile cannot be repeated


class Plans(spec_schema.Strict):
    """A study's sampling per size ([plan.study], [plan.quick]); a size without one takes DEFAULT_PLANS'."""

    study: RepeatPlan | None = None
    quick: RepeatPlan | None = None


class Series(spec_schema.Strict):
    """A study measured as a series over time (study D) rather than once per cell: the plan for each size."""

    study: SeriesPlan | None = None
    quick: SeriesPlan | None = None


class PropagationPlan(spec_schema.Strict):
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


class Propagation(spec_schema.Strict):
    """Study B's image-propagation sweep: the profile whose guest is provisioned, and the plan per size."""

    profile: str = Field(pattern=profiles.NAME_PATTERN)
    study: PropagationPlan | None = None
    quick: PropagationPlan | None = None


class Study(spec_schema.Strict):
    """A validated study. Construct with parse_study/load_study."""

    name: str = Field(pattern=profiles.NAME_PATTERN)
    title: Line
    description: Text
    documents: dict[str, Text] = Field(default_factory=dict, max_length=16)  # "000" -> the text's reference
    includes: list[StudyName] = Field(default_factory=list, max_length=8)  # other studies held here: A holds E
    sizes: list[Literal["study", "quick"]] = Field(min_length=1, max_length=2)
    profiles: list[MatrixProfile] = Field(min_length=1, max_length=MAX_ENTRIES)
    tests: list[MatrixTest] = Field(min_length=1, max_length=MAX_ENTRIES)
    paper: list[PaperCell] = Field(default_factory=list, max_length=4 * MAX_ENTRIES)
    rules: list[Rule] = Field(default_factory=list, max_length=MAX_ENTRIES)
    plan: Plans | None = None
    series: Series | None = None
    cost: bool = False  # the report adds each number per host core and per GiB of guest RAM (study C's cost)
    propagation: Propagation | None = None

    def series_plan(self, size: str) -> SeriesPlan | None:
        """How many repeats at `size`, how far apart; None for a study measured once per cell."""
        return None if self.series is None else getattr(self.series, size, None)

    def repeat_plan(self, size: str) -> RepeatPlan:
        """How each cell is sampled at `size`: the file's [plan.SIZE], else DEFAULT_PLANS'; one sample for a series
        study (its repeats are runs, its [series] plan)."""
        if self.series is not None:
            return SINGLE
        own = None if self.plan is None else getattr(self.plan, size, None)
        return own or DEFAULT_PLANS.get(size, SINGLE)

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

    def differs(self, profile: str) -> str | None:
        """What the row's profile does otherwise than the study, and why; None when it says nothing."""
        return next((p.differs for p in self.profiles if p.name == profile), None)

    def test_differs(self, test: str) -> str | None:
        """What the table's test does otherwise than the study's method, and why; None when it says nothing."""
        return next((t.differs for t in self.tests if t.id == test), None)

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


def is_iozone_sweep(test: str) -> bool:
    """A test whose run is IOzone's automatic mode: a file sweep (one record size) or the grid (every record size)."""
    return test.startswith("iozone-files-") or test in catalogue.IOZONE_GRIDS
