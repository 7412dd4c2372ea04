"""Studies as data (cloudbox.core.studies: schema, loading, verdicts, evidence, planning): the shipped studies load;
every kind of bad study file is refused naming the file, the key, the value and what is allowed; rules evaluate to
each verdict over hand-built cells; cells are selected from, and study runs planned against, a real results store."""

from __future__ import annotations

import platform
import tomllib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cloudbox.core import paths
from cloudbox.core.errors import NotFound, StudyError, UsageError
from cloudbox.core.inputs import shown
from cloudbox.core.record.results import ResultStore
from cloudbox.core.spec import catalogue, profiles
from cloudbox.core.studies import evidence, loading, planning, schema, verdicts
from cloudbox.core.studies.cells import Cell, Measured
from cloudbox.core.studies.loading import parse_study
from cloudbox.core.studies.verdicts import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, evaluate_rule

REPO = Path(__file__).resolve().parents[2]

# A small valid study over presets: two KVM profiles, one Xen (not runnable), one storage and one network test.
GOOD = """\
name = "t"
title = "A test study"
description = "Two KVM rows and a Xen row."
sizes = ["study", "quick"]

[documents]
"000" = "the paper"
"003" = "its slides"

[[profiles]]
name = "eucalyptus-default"
row = "KVM, sparse file, SCSI"

[[profiles]]
name = "virtio-disk"
row = "KVM, whole disk, virtio"

[[profiles]]
name = "xen-default"
row = "Xen, file, SCSI"

[[tests]]
id = "dd-write-64k"
table = "Table 1: writes"

[[tests]]
id = "tcp-stream-fe"
table = "Network to the other node"

[[paper]]
cell = "native/dd-write-64k"
value = 100
avgqu = 140
source = "000:292 (Table 1)"

[[paper]]
cell = "eucalyptus-default/dd-write-64k"
value = 2.0
avgqu = 0.9
source = "000:294 (Table 1); 003:138, 168 (slides)"

[[paper]]
cell = "virtio-disk/dd-write-64k"
value = 95
source = "000:297"

[[rules]]
id = "R1"
finding = "The default collapses writes."
cell = "eucalyptus-default/dd-write-64k"
against = "native"
op = "<="
percent = 10
why = "Ten percent is a collapse."
source = "000:401"

[[rules]]
id = "R2"
finding = "virtio beats the default."
cell = "virtio-disk/dd-write-64k"
against = "eucalyptus-default"
op = ">="
percent = 110
why = "A margin over a tie."
source = "000:402"

[[rules]]
id = "R3"
finding = "The host queue stays below one."
cell = "eucalyptus-default/dd-write-64k"
metric = "avgqu"
op = "<"
value = 1
why = "One request at a time."
source = "000:403"

[[rules]]
id = "R4"
finding = "Xen is in the way."
cell = "xen-default/dd-write-64k"
against = "native"
op = ">="
percent = 50
why = "Half."
source = "000:404"

[[rules]]
id = "R5"
finding = "The default does not fill the link."
cell = "eucalyptus-default/tcp-stream-fe"
against = "native"
op = "<="
percent = 85
paper = 71
why = "Halfway to a full link."
source = "000:405"
"""


pytestmark = pytest.mark.usefixtures("isolated")


def good() -> schema.Study:
    return parse_study(GOOD, "t.toml")


def replace(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


# ------------------------------------------------------------------------------------------------ loading
def test_shipped_studies_load_and_name_their_files():
    names = [e.name for e in loading.list_studies()]
    assert {"a", "b"} <= set(names)
    for e in loading.list_studies():
        assert e.problem is None, e.problem
        assert e.path.parent == REPO / "studies"
    a = loading.find_study("A")  # the spelling
    assert a.name == "a" and a.suite == "all"
    assert set(a.profile_names) <= set(profiles.preset_names())
    assert a.paper_percent("eucalyptus-default", "dd-write-64k") == pytest.approx((1.3 / 111 * 100, True))
    assert a.paper_percent("kvm-ebs-aoe", "dd-write-64k") == pytest.approx((18.7 / 65.2 * 100, True))
    assert a.paper_percent("eucalyptus-default", "tcp-stream-fe") == (71.0, False)
    assert a.paper_percent("kvm-ebs-aoe", "dd-read-64k") == pytest.approx((49.5 / 55.8 * 100, True))
    assert a.includes == ["e"]
    b = loading.find_study("b")
    assert b.suite == "storage" and [r.id for r in b.rules][:3] == ["B3.wt", "B3.none", "B3.kvm"]
    assert "iozone-grid" in b.test_ids and not any("iozone-grid" in r.cell for r in b.rules)  # a cell, no rule
    # the study's Xen was paravirtual, its IOzone on a file in ext3: B3 divides by the PV preset, on that test
    assert {r.against for r in b.rules if r.id.startswith("B3.") and r.id != "B3.kvm"} == {"xen-xvd-file-2g"}
    assert profiles.xen_guest_type(profiles.find_profile("xen-xvd-file-2g")) == "pv"
    assert {r.test for r in b.rules if r.id.startswith("B3.")} <= set(catalogue.IOZONE_FS_TESTS)
    for name in ("kvm-cache-writethrough", "kvm-cache-none"):
        p = profiles.find_profile(name)
        assert (p.disk.bus, p.guest.memory_mib) == ("virtio-blk", 2048)


# The study's texts by number and their length in lines (docs/studies.md, "Sources"): every source points inside one.
TEXTS = {"000": 588, "001": 791, "002": 235, "003": 286, "004": 625}


def test_every_paper_figure_and_rule_carries_its_source_and_every_row_says_how_it_differs():
    own = [e.name for e in loading.list_studies() if not loading.load_study(e.path).documents]
    assert own == ["ladder"], own  # cloudbox's own question, not a published study's
    for e in loading.list_studies():
        study = loading.load_study(e.path)
        if e.name in own:
            assert not study.paper and all(r.source is None for r in study.rules), study.name
            continue
        assert study.documents and set(study.documents) <= set(TEXTS), study.name
        sourced = [(f"paper {c.cell}", c.source) for c in study.paper]
        sourced += [(f"rule {r.id}", r.source) for r in study.rules]
        for what, source in sourced:
            refs = schema.source_refs(source)
            assert refs, (study.name, what, source)
            for doc, spans in refs:
                assert doc in study.documents, (study.name, what, source)
                assert all(1 <= first <= last <= TEXTS[doc] for first, last in spans), (study.name, what, source)
        assert all(p.differs for p in study.profiles), study.name
        assert all(r.why and r.finding for r in study.rules)
    # a derived figure says from what, and where the texts disagree the study says so
    a = loading.find_study("a")
    assert a.paper_cell("virtio-file", "dd-write-64k").derived == "avgrq from the slides' 490 kB (1 kB = 2 sectors)"
    assert "19.9" in a.paper_cell("kvm-ebs-aoe", "dd-write-64k").note
    assert "7.5 kB" in a.paper_cell("eucalyptus-default", "dd-write-64k").note
    # a published cell of the matrix is never left without its numbers (Table 2's KVM SCSI read; the slides' EBS)
    assert a.paper_cell("kvm-scsi-phy", "dd-read-64k").value == 70.5
    assert a.paper_cell("kvm-ebs-aoe-virtio", "dd-read-64k").value == 48.0


def test_study_e_is_folded_into_a_and_asking_for_it_says_so():
    with pytest.raises(UsageError) as exc:
        loading.find_study("E")
    assert str(exc.value).startswith("study 'E' has no file of its own: its rows and findings are in study a (")
    assert str(exc.value).endswith("; allowed: a (cloudbox study show a)")


def test_study_c_is_the_iozone_record_sweep_with_cost_columns_and_no_invented_figures():
    c = loading.find_study("C")
    assert c.title == "Study C: record size under O_DIRECT" and c.suite == "storage" and c.cost
    assert c.sizes == ["study", "quick"] and c.series is None
    assert c.test_ids == list(catalogue.IOZONE_TESTS)  # IOzone itself, with O_DIRECT as the study ran it
    assert set(c.profile_names) <= set(profiles.preset_names())
    for name in c.profile_names:  # one KVM box: no Xen, no network volume, one disk per guest
        assert loading.cannot_run(profiles.find_profile(name)) is None
    backings = {profiles.find_profile(n).disk.backing for n in c.profile_names}
    assert "block-device" in backings and backings & {"prealloc-file", "sparse-file"}
    assert c.paper == []  # the study's figures are EC2's own: none is a lab's cell
    assert [r.id for r in c.rules] == ["C5.w", "C5.r", "C5.raid", "C6"]
    assert {profiles.find_profile(n).disk.count for n in c.profile_names} == {1, 2, 4}  # the study's 2 and 4
    assert not loading.find_study("a").cost and not loading.find_study("b").cost


def test_a_bad_cost_in_a_study_file_names_the_file_key_value_and_what_is_allowed(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text((REPO / "studies" / "c.toml").read_text().replace("cost = true", 'cost = "maybe"'))
    with pytest.raises(StudyError) as exc:
        loading.load_study(f)
    assert [p.key for p in exc.value.problems] == ["cost"]
    text = str(exc.value)
    assert text.startswith(f"{f}: invalid study (1 problem)")
    assert "cost: must be true or false (got 'maybe'); allowed: true or false: whether the report adds cost " \
           "columns (per host core, per GiB of guest RAM)" in text


def test_study_dir_override_and_not_found(tmp_path, monkeypatch):
    d = tmp_path / "studies"
    d.mkdir()
    (d / "t.toml").write_text(GOOD)
    monkeypatch.setenv("CLOUDBOX_STUDY_DIR", str(d))
    assert paths.study_dirs() == [d]
    assert [e.name for e in loading.list_studies()] == ["t"]
    assert loading.find_study("T").title == "A test study"
    with pytest.raises(NotFound) as exc:
        loading.find_study("a")  # the checkout's studies are not searched when the override is set
    assert "known studies: t" in str(exc.value)
    with pytest.raises(NotFound):
        loading.load_study(tmp_path / "nope.toml")


def test_an_invalid_file_is_listed_with_its_problem(tmp_path, monkeypatch):
    d = tmp_path / "studies"
    d.mkdir()
    (d / "t.toml").write_text(GOOD)
    (d / "u.toml").write_text(GOOD)  # its name says t
    monkeypatch.setenv("CLOUDBOX_STUDY_DIR", str(d))
    by_name = {e.name: e for e in loading.list_studies()}
    assert by_name["t"].problem is None and by_name["t"].rules == 5
    assert by_name["u"].problem is not None and "name: must equal the file name" in by_name["u"].problem


def test_a_study_is_checked_against_the_profiles_on_every_load(tmp_path, monkeypatch):
    # The study's own parse is kept by text; its profiles are looked up again each time.
    pdir = tmp_path / "presets"
    pdir.mkdir()
    for name in ("eucalyptus-default", "virtio-disk", "xen-default"):
        (pdir / f"{name}.toml").write_text((REPO / "profiles" / f"{name}.toml").read_text())
    monkeypatch.setenv("CLOUDBOX_PRESET_DIR", str(pdir))
    f = tmp_path / "t.toml"
    f.write_text(GOOD)
    assert loading.load_study(f) is loading.load_study(f)
    (pdir / "virtio-disk.toml").unlink()
    with pytest.raises(StudyError) as exc:
        loading.load_study(f)
    assert "profiles[2].name" in str(exc.value) and "no such profile" in str(exc.value)
    f.write_text(GOOD.replace('title = "A test study"', 'title = "A test study!"'))
    (pdir / "virtio-disk.toml").write_text((REPO / "profiles" / "virtio-disk.toml").read_text())
    assert loading.load_study(f).title == "A test study!"


# Each bad input: (id, text, key, value, a piece of what is allowed).
INVALID = [
    ("unknown-profile", replace(GOOD, 'name = "virtio-disk"', 'name = "virtio-dsk"'),
     "profiles[2].name", "virtio-dsk", "virtio-disk"),
    ("profile-twice", replace(GOOD, 'name = "virtio-disk"', 'name = "eucalyptus-default"'),
     "profiles[2].name", "eucalyptus-default", "each profile once"),
    ("native-is-no-profile", replace(GOOD, 'name = "virtio-disk"', 'name = "native"'),
     "profiles[2].name", "native", "a profile name"),
    ("unknown-test", replace(GOOD, 'id = "dd-write-64k"', 'id = "dd-write-2m"'),
     "tests[1].id", "dd-write-2m", "dd-write-64k"),
    ("unknown-grid", replace(GOOD, 'id = "dd-write-64k"', 'id = "iozone-grid-16m"'),
     "tests[1].id", "iozone-grid-16m", "iozone-files-16m, iozone-grid, iozone-grid-4k, iozone-fs-write-16m, "
     "iozone-fs-read-16m, bonnie"),
    ("unknown-size", replace(GOOD, 'sizes = ["study", "quick"]', 'sizes = ["study", "huge"]'),
     "sizes[2]", "huge", "study, quick"),
    ("size-twice", replace(GOOD, 'sizes = ["study", "quick"]', 'sizes = ["quick", "quick"]'),
     "sizes", ["quick", "quick"], "each at most once"),
    ("unknown-top-key", 'matrix = "x"\n' + GOOD, "matrix", "x", "known keys: name, title"),
    ("unknown-rule-key", replace(GOOD, 'percent = 110', 'treshold = 110'),
     "rules[2].treshold", 110, "known keys: id, finding, cell"),
    ("rule-bad-op", replace(GOOD, 'op = ">="', 'op = "=>"'), "rules[2].op", "=>", "<=, >=, <, >"),
    ("rule-test-outside-matrix", replace(GOOD, 'cell = "virtio-disk/dd-write-64k"\nagainst',
                                         'cell = "virtio-disk/dd-read-64k"\nagainst'),
     "rules[2].cell", "virtio-disk/dd-read-64k", "a test of [[tests]] (dd-write-64k, tcp-stream-fe)"),
    ("rule-profile-outside-matrix", replace(GOOD, 'cell = "virtio-disk/dd-write-64k"\nagainst',
                                            'cell = "kvm-scsi-phy/dd-write-64k"\nagainst'),
     "rules[2].cell", "kvm-scsi-phy/dd-write-64k", "eucalyptus-default, virtio-disk, xen-default"),
    ("rule-not-a-cell", replace(GOOD, 'cell = "virtio-disk/dd-write-64k"\nagainst', 'cell = "virtio-disk"\nagainst'),
     "rules[2].cell", "virtio-disk", "profile/test"),
    ("rule-against-unknown", replace(GOOD, 'against = "eucalyptus-default"', 'against = "xen"'),
     "rules[2].against", "xen", "native, eucalyptus-default"),
    ("rule-against-itself", replace(GOOD, 'against = "eucalyptus-default"', 'against = "virtio-disk"'),
     "rules[2].against", "virtio-disk", "another profile"),
    ("rule-percent-without-against", replace(GOOD, 'metric = "avgqu"\nop = "<"\nvalue = 1',
                                             'metric = "avgqu"\nop = "<"\npercent = 1'),
     "rules[3].percent", 1.0, "or value instead of percent"),
    ("rule-value-with-against", replace(GOOD, 'percent = 110', 'value = 110'),
     "rules[2].value", 110.0, "percent instead of value"),
    ("rule-host-metric-on-network", replace(GOOD, 'cell = "eucalyptus-default/tcp-stream-fe"\nagainst = "native"',
                                            'cell = "eucalyptus-default/tcp-stream-fe"\nmetric = "util"\n'
                                            'against = "native"'),
     "rules[5].metric", "util", "value (with test tcp-stream-fe)"),
    ("rule-id-twice", replace(GOOD, 'id = "R2"', 'id = "R1"'), "rules[2].id", "R1", "a unique id per rule"),
    ("rule-without-why", replace(GOOD, 'why = "Half."\n', ''), "rules[4].why", None, "why the threshold"),
    ("paper-negative", replace(GOOD, "value = 95", "value = -95"), "paper[3].value", -95, "a number >= 0"),
    ("paper-cell-twice", replace(GOOD, 'cell = "virtio-disk/dd-write-64k"\nvalue = 95',
                                 'cell = "eucalyptus-default/dd-write-64k"\nvalue = 95'),
     "paper[3].cell", "eucalyptus-default/dd-write-64k", "each cell once"),
    ("paper-percent-on-native", replace(GOOD, "value = 100\navgqu = 140", "value = 100\npercent = 100"),
     "paper[1].percent", 100.0, "native/... cells"),
    ("paper-unknown-test", replace(GOOD, 'cell = "virtio-disk/dd-write-64k"\nvalue = 95',
                                   'cell = "virtio-disk/tcp-rr"\nvalue = 95'),
     "paper[3].cell", "virtio-disk/tcp-rr", "a test of [[tests]]"),
    ("no-profiles", GOOD.split("[[profiles]]")[0], "profiles", None, "[[profiles]] tables"),
    ("cost-not-a-bool", replace(GOOD, 'sizes = ["study", "quick"]\n', 'sizes = ["study", "quick"]\ncost = "yes"\n'),
     "cost", "yes", "true or false"),
    ("cost-a-number", replace(GOOD, 'sizes = ["study", "quick"]\n', 'sizes = ["study", "quick"]\ncost = 1\n'),
     "cost", 1, "per host core, per GiB of guest RAM"),
    # sources: required on every paper cell and rule, in the form document:line (where), of a listed document
    ("paper-without-source", replace(GOOD, 'source = "000:297"\n', ''), "paper[3].source", None,
     'document:line (where), e.g. "000:294 (Table 1)"'),
    ("rule-without-source", replace(GOOD, 'source = "000:402"\n', ''), "rules[2].source", None,
     "a bracketed note of where"),
    ("source-not-a-reference", replace(GOOD, 'source = "000:297"', 'source = "Table 1, line 297"'),
     "paper[3].source", "Table 1, line 297", "its lines (N or N-M"),
    ("source-unknown-document", replace(GOOD, 'source = "000:297"', 'source = "002:297 (Table 1)"'),
     "paper[3].source", "002:297 (Table 1)", "documents: 000, 003"),
    ("source-lines-backwards", replace(GOOD, 'source = "000:297"', 'source = "000:297-290"'),
     "paper[3].source", "000:297-290", "its lines (N or N-M"),
    ("document-not-a-number", replace(GOOD, '"003" = "its slides"', 'slides = "its slides"'),
     "documents.slides", "slides", 'e.g. "000" = "the paper'),
    ("differs-not-one-line", replace(GOOD, 'row = "KVM, whole disk, virtio"\n',
                                     'row = "KVM, whole disk, virtio"\ndiffers = "a\\nb"\n'),
     "profiles[2].differs", "a\nb", "what the profile does otherwise than the study's configuration"),
    ("paper-note-empty", replace(GOOD, 'source = "000:297"', 'source = "000:297"\nnote = ""'),
     "paper[3].note", "", "where the texts disagree"),
    ("includes-bad-name", replace(GOOD, 'sizes = ["study", "quick"]\n',
                                  'sizes = ["study", "quick"]\nincludes = ["E!"]\n'),
     "includes[1]", "E!", "other studies' names"),
    # against_cell: another cell of the matrix, instead of against
    ("against-cell-and-against", replace(GOOD, 'against = "eucalyptus-default"',
                                         'against = "eucalyptus-default"\nagainst_cell = "virtio-disk/tcp-stream-fe"'),
     "rules[2].against_cell", "virtio-disk/tcp-stream-fe", "one of the two"),
    ("against-cell-outside-matrix", replace(GOOD, 'against = "eucalyptus-default"',
                                            'against_cell = "virtio-disk/dd-read-64k"'),
     "rules[2].against_cell", "virtio-disk/dd-read-64k", "a test of [[tests]] (dd-write-64k, tcp-stream-fe)"),
    ("against-cell-itself", replace(GOOD, 'against = "eucalyptus-default"',
                                    'against_cell = "virtio-disk/dd-write-64k"'),
     "rules[2].against_cell", "virtio-disk/dd-write-64k", "other than the rule's own cell"),
    ("against-cell-native", replace(GOOD, 'against = "eucalyptus-default"', 'against_cell = "native/dd-write-64k"'),
     "rules[2].against_cell", "native/dd-write-64k", "profile/test with a profile of [[profiles]]"),
    # figure: one the test stores beside its number, read instead of it
    ("figure-of-a-test-without", replace(GOOD, 'against = "eucalyptus-default"',
                                         'against = "eucalyptus-default"\nfigure = "re-read MB/s"'),
     "rules[2].figure", "re-read MB/s", "a test that stores some: IOzone, its sweeps, Bonnie++"),
    ("figure-with-a-host-metric", replace(GOOD, 'metric = "avgqu"', 'metric = "avgqu"\nfigure = "re-read MB/s"'),
     "rules[3].figure", "re-read MB/s", "figure without metric, or metric without figure"),
]


@pytest.mark.parametrize(("text", "key", "value", "allowed"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID])
def test_invalid_study(text, key, value, allowed):
    with pytest.raises(StudyError) as exc_info:
        parse_study(text, "studies/t.toml", expect_name="t")
    err = exc_info.value
    by_key = {p.key: p for p in err.problems}
    assert key in by_key, f"no problem for {key}: {err}"
    problem = by_key[key]
    assert problem.value == value and type(problem.value) is type(value)
    assert problem.allowed and allowed in problem.allowed
    text_of_err = str(err)
    assert text_of_err.startswith("studies/t.toml: invalid study")
    assert f"{key}: " in text_of_err
    assert value is None or shown(value) in text_of_err
    assert allowed in text_of_err


# Any value at any of these places of a valid study: a study or a list of problems, never another exception.
PLACES = [("name",), ("sizes",), ("sizes", 0), ("profiles",), ("profiles", 0), ("profiles", 1, "name"),
          ("profiles", 0, "row"), ("tests",), ("tests", 1, "id"), ("paper",), ("paper", 0, "cell"),
          ("paper", 1, "value"), ("paper", 2, "native"), ("rules",), ("rules", 0), ("rules", 0, "cell"),
          ("rules", 1, "against"), ("rules", 2, "op"), ("rules", 0, "percent"), ("rules", 2, "metric"),
          ("rules", 2, "value"), ("rules", 3, "extra"), ("title",), ("description",), ("other",), ("cost",)]
scalars = st.one_of(st.booleans(), st.integers(min_value=-(2**70), max_value=2**70), st.floats(allow_nan=True),
                    st.text(max_size=30), st.sampled_from(["native", "native/dd-write-64k", "virtio-disk/tcp-rr",
                                                           "/", "a/b/c", "\x1b[2J", "study", ">=", "avgqu"]))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                      max_leaves=8)


def put(data: Any, place: tuple, value: Any) -> None:
    for part in place[:-1]:
        if isinstance(data, dict):
            data = data.get(part)
        elif isinstance(data, list) and isinstance(part, int) and part < len(data):
            data = data[part]
        else:
            return
    if isinstance(data, dict) and isinstance(place[-1], str):
        data[place[-1]] = value
    elif isinstance(data, list) and isinstance(place[-1], int) and place[-1] < len(data):
        data[place[-1]] = value


@settings(max_examples=80, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(PLACES), values), min_size=1, max_size=3))
def test_any_change_gives_a_study_or_problems(changes):
    data = tomllib.loads(GOOD)
    for place, value in changes:
        put(data, place, value)
    try:
        study = loading.validate_data(data, "t.toml")
    except StudyError as e:
        assert e.problems and all(p.key and str(p) for p in e.problems)
    else:
        for r in study.rules:  # what a valid study never holds
            assert (r.percent is None) == (r.against is None) and (r.value is None) != (r.against is None)
            assert (r.profile, r.test) != ("", "") and r.test in study.test_ids


def test_name_must_be_the_file_stem_and_syntax_errors_name_the_line(tmp_path):
    f = tmp_path / "other.toml"
    f.write_text(GOOD)
    with pytest.raises(StudyError) as exc:
        loading.load_study(f)
    assert str(exc.value).startswith(f"{f}: invalid study")
    assert exc.value.problems[0].key == "name" and exc.value.problems[0].value == "t"
    f.write_text(GOOD.replace("[[tests]]", "[[tests]", 1))
    with pytest.raises(StudyError) as exc:
        loading.load_study(f)
    line = GOOD.splitlines().index("[[tests]]") + 1
    assert exc.value.problems[0].key == f"line {line}"


def test_every_problem_is_reported_at_once():
    text = replace(replace(GOOD, 'op = ">="', 'op = "=>"'), 'name = "virtio-disk"', 'name = "nope"')
    with pytest.raises(StudyError) as exc:
        parse_study(text)
    # pydantic's problem (the op) stops the cross-checks; fixed, the profile is the one left
    assert [p.key for p in exc.value.problems] == ["rules[2].op"]
    with pytest.raises(StudyError) as exc:
        parse_study(replace(GOOD, 'name = "virtio-disk"', 'name = "nope"').replace('id = "R2"', 'id = "R1"'))
    assert {p.key for p in exc.value.problems} >= {"profiles[2].name", "rules[2].id"}


def test_statements_and_paper_figures():
    s = good()
    by_id = {r.id: r for r in s.rules}
    assert by_id["R1"].statement() == "eucalyptus-default dd-write-64k ≤ 10% of native"
    assert by_id["R2"].statement() == "virtio-disk dd-write-64k ≥ 110% of eucalyptus-default's"
    assert by_id["R3"].statement() == "eucalyptus-default dd-write-64k host avgqu < 1"
    assert verdicts.paper_figure(s, by_id["R1"]) == pytest.approx((2.0, True))
    assert verdicts.paper_figure(s, by_id["R2"]) == pytest.approx((4750.0, True))
    assert verdicts.paper_figure(s, by_id["R3"]) == (0.9, False)
    assert verdicts.paper_figure(s, by_id["R4"]) == (None, False)
    assert verdicts.paper_figure(s, by_id["R5"]) == (71.0, False)


# ----------------------------------------------------------------------------------------------- verdicts
def cell(profile: str, test: str = "dd-write-64k", guest: float = 2.0, base: float | None = 100.0, *,
         run_id: int = 1, avgqu: float | None = 0.5, **kw) -> Cell:
    baseline = None if base is None else Measured(base, avgqu=140.0, labels=tuple(kw.pop("base_labels", ())))
    kw.setdefault("size_label", "study")
    kw.setdefault("accelerator", "kvm")
    return Cell(profile, test, run_id, Measured(guest, avgqu=avgqu, labels=tuple(kw.pop("labels", ()))), baseline,
                metric="MB/s", **kw)


def verdict(rule_id: str, cells: list[Cell], **kw) -> verdicts.Verdict:
    s = good()
    rule = next(r for r in s.rules if r.id == rule_id)
    return evaluate_rule(s, rule, {(c.profile, c.test): c for c in cells}, **kw)


def test_reproduced_against_native():
    v = verdict("R1", [cell("eucalyptus-default", guest=4.0, base=80.0)])
    assert v.status == REPRODUCED and v.reasons == ()
    assert v.ours == pytest.approx(5.0) and v.run_ids == (1,)
    assert v.explain() == ("reproduced: ours 5.0% n=1+1 (one sample a side: no interval), the rule needs ≤ 10%; "
                           "the paper: 2.0% (computed from its numbers)")


def test_not_reproduced_says_the_numbers():
    v = verdict("R1", [cell("eucalyptus-default", guest=40.0, base=80.0)])
    assert v.status == NOT_REPRODUCED and v.ours == pytest.approx(50.0)
    assert v.explain() == ("not reproduced: ours 50.0% n=1+1 (one sample a side: no interval), the rule needs ≤ 10%; "
                           "the paper: 2.0% "
                           "(computed from its numbers)")


def test_a_boundary_value_holds_for_an_inclusive_operator_only():
    assert verdict("R1", [cell("eucalyptus-default", guest=10.0, base=100.0)]).status == REPRODUCED
    assert verdict("R3", [cell("eucalyptus-default", avgqu=1.0)]).status == NOT_REPRODUCED
    assert verdict("R3", [cell("eucalyptus-default", avgqu=0.99)]).status == REPRODUCED


def test_against_another_profile():
    cells = [cell("eucalyptus-default", guest=50.0, run_id=1), cell("virtio-disk", guest=60.0, run_id=2)]
    v = verdict("R2", cells)
    assert v.status == REPRODUCED and v.ours == pytest.approx(120.0) and v.run_ids == (2, 1)
    cells = [cell("eucalyptus-default", guest=50.0, run_id=1), cell("virtio-disk", guest=52.0, run_id=2)]
    v = verdict("R2", cells)
    assert v.status == NOT_REPRODUCED and v.ours == pytest.approx(104.0)


def test_emulated_cells_are_inconclusive_whatever_their_numbers():
    for acc, words in (("tcg", "under TCG emulation"), ("nested-kvm", "under nested virtualization")):
        v = verdict("R1", [cell("eucalyptus-default", guest=1.0, base=100.0, accelerator=acc, emulated=True)])
        assert v.status == INCONCLUSIVE
        assert v.reasons == (f"eucalyptus-default/dd-write-64k (run #1) was measured {words}: "
                             "not an overhead figure",)
        assert v.ours == pytest.approx(1.0)  # shown, never used
        assert "ours would be 1.0%" in v.explain()
    # one emulated side of a comparison is enough
    cells = [cell("eucalyptus-default", guest=10.0, run_id=1),
             cell("virtio-disk", guest=60.0, run_id=2, accelerator="tcg", emulated=True)]
    v = verdict("R2", cells)
    assert v.status == INCONCLUSIVE and "virtio-disk/dd-write-64k (run #2)" in v.reasons[0]


def test_quick_size_warm_cache_changed_profile_and_virtualized_host_are_inconclusive():
    base = dict(guest=1.0, base=100.0)
    cases = [
        (dict(size_label="quick"), "is quick-size"),
        (dict(labels=["warm-cache"]), "the page cache was not dropped"),
        (dict(profile_changed=True), "the profile eucalyptus-default changed since this run"),
        (dict(base_labels=["virtualized-host"]), "its bare-metal side ran on a virtual machine"),
        (dict(labels=["loop-device"]), "ran on a loop device over a file, not a whole disk"),
        (dict(base_labels=["loop-device"]), "ran on a loop device over a file, not a whole disk"),
    ]
    for extra, words in cases:
        v = verdict("R1", [cell("eucalyptus-default", **base, **extra)])
        assert v.status == INCONCLUSIVE, extra
        assert len(v.reasons) == 1 and words in v.reasons[0], v.reasons


def test_a_quick_network_cell_gets_the_network_reason_not_the_caches():
    rule = next(r for r in good().rules if r.id == "R5")  # a network rule, on the guest's own number
    reasons = verdicts._cell_reasons(cell("eucalyptus-default", test="tcp-stream", size_label="quick"), rule,
                                     native=True)
    assert any("a 5-second stream, where a study-size run streams for 30 s" in r for r in reasons), reasons
    assert not any("caches" in r for r in reasons)


def test_every_reason_is_given():
    v = verdict("R1", [cell("eucalyptus-default", size_label="quick", accelerator="tcg", emulated=True)])
    assert v.status == INCONCLUSIVE and len(v.reasons) == 2
    assert "TCG" in v.reasons[0] and "quick-size" in v.reasons[1]


def test_a_missing_cell_is_inconclusive_and_says_why():
    v = verdict("R2", [cell("eucalyptus-default")], size="study")
    assert v.status == INCONCLUSIVE and v.ours is None
    assert v.reasons == ("no completed run of virtio-disk with dd-write-64k at study size",)
    xen = "Xen profile: boot the appliance's Xen entry"
    v = verdict("R4", [], unavailable={"xen-default": xen})
    assert v.reasons == (f"no completed run of xen-default with dd-write-64k: {xen}",)
    v = verdict("R5", [])
    assert v.reasons == ("no completed run of eucalyptus-default with tcp-stream-fe: only a run on a back-end "
                         "(--node) measures it",)


# Two more kinds of rule over GOOD's matrix and IOzone's read: one cell against another cell, and a stored figure.
MORE = (replace(GOOD, '[[paper]]', '[[tests]]\nid = "iozone-read-16m"\ntable = "Reads, IOzone"\n\n[[paper]]') + """
[[rules]]
id = "R6"
finding = "Writing is slower than sending."
cell = "eucalyptus-default/dd-write-64k"
against_cell = "eucalyptus-default/tcp-stream-fe"
op = "<"
percent = 100
why = "The order only."
source = "000:539-544"

[[rules]]
id = "R7"
finding = "virtio re-reads near native."
cell = "virtio-disk/iozone-read-16m"
figure = "re-read MB/s"
against = "native"
op = ">="
percent = 90
why = "On par."
source = "003:201"
""")


def test_a_cell_against_another_cell_and_a_stored_figure():
    s = parse_study(MORE, "t.toml")
    r6, r7 = (next(r for r in s.rules if r.id == i) for i in ("R6", "R7"))
    assert r6.statement() == "eucalyptus-default dd-write-64k < 100% of tcp-stream-fe's"
    assert r7.statement() == "virtio-disk iozone-read-16m re-read MB/s ≥ 90% of native"
    assert verdicts.paper_figure(s, r6) == (None, False) and verdicts.paper_figure(s, r7) == (None, False)
    cells = {("eucalyptus-default", "dd-write-64k"): cell("eucalyptus-default", guest=50.0, run_id=1),
             ("eucalyptus-default", "tcp-stream-fe"): cell("eucalyptus-default", "tcp-stream-fe", guest=400.0,
                                                           run_id=2)}
    v = evaluate_rule(s, r6, cells)
    assert v.status == REPRODUCED and v.ours == pytest.approx(12.5) and v.run_ids == (1, 2)
    v = evaluate_rule(s, r6, {k: c for k, c in cells.items() if k[1] == "dd-write-64k"}, size="study")
    assert v.status == INCONCLUSIVE and v.reasons == (
        "no completed run of eucalyptus-default with tcp-stream-fe at study size: only a run on a back-end (--node) "
        "measures it",)
    guest = Measured(300.0, others=(("re-read MB/s", 95.0),))
    base = Measured(400.0, others=(("re-read MB/s", 100.0),))
    c = Cell("virtio-disk", "iozone-read-16m", 3, guest, base, metric="MB/s", size_label="study", accelerator="kvm")
    v = evaluate_rule(s, r7, {("virtio-disk", "iozone-read-16m"): c})
    assert v.status == REPRODUCED and v.ours == pytest.approx(95.0)  # the figure, not the cell's 75%
    c = Cell("virtio-disk", "iozone-read-16m", 3, Measured(300.0), base, metric="MB/s", size_label="study",
             accelerator="kvm")
    v = evaluate_rule(s, r7, {("virtio-disk", "iozone-read-16m"): c})
    assert v.status == INCONCLUSIVE and v.reasons == ("virtio-disk/iozone-read-16m (run #3) has no figure "
                                                      "'re-read MB/s'",)
    with pytest.raises(StudyError) as exc:
        parse_study(MORE.replace('figure = "re-read MB/s"', 'figure = "re-write MB/s"'), "t.toml")
    assert [(p.key, p.value, p.allowed) for p in exc.value.problems] == [
        ("rules[7].figure", "re-write MB/s", "re-read MB/s")]


def test_missing_numbers_inside_a_run_are_inconclusive():
    v = verdict("R1", [cell("eucalyptus-default", base=None)])
    assert v.status == INCONCLUSIVE and v.reasons == ("eucalyptus-default/dd-write-64k (run #1) has no bare-metal "
                                                      "number",)
    v = verdict("R1", [cell("eucalyptus-default", base=0.0)])
    assert v.status == INCONCLUSIVE and v.reasons[0].endswith("bare metal measured 0")
    v = verdict("R3", [cell("eucalyptus-default", avgqu=None)])
    assert v.status == INCONCLUSIVE and "has no host avgqu" in v.reasons[0]


# ------------------------------------------------------------------------------------- cells from the store
def add_run(store: ResultStore, profile: str, tests: dict[str, tuple[float, float]], *, size: str = "study",
            accelerator: str = "kvm", state: str = "completed", started_at: float = 1_700_000_000.0,
            node: str | None = None, profile_hash: str | None = None, metric: str = "MB/s") -> int:
    prof = profiles.find_profile(profile)
    rid = store.create_run(profile_name=profile, profile_hash=profile_hash or prof.hash,
                           profile_toml=prof.to_toml(), suite="all", size_label=size, accelerator=accelerator,
                           started_at=started_at, node=node or platform.node())
    for test, (guest, base) in tests.items():
        store.add_measurement(rid, side="baseline", test=test, metric=metric, value=base, host_avgqu=100.0)
        store.add_measurement(rid, side="guest", test=test, metric=metric, value=guest, host_avgqu=0.8)
    if state != "running":
        store.finish_run(rid, state)
    return rid


def test_select_cells_prefers_today_s_profile_then_study_size_then_the_latest(tmp_path):
    s = good()
    w = "dd-write-64k"
    with ResultStore(tmp_path / "r.db") as store:
        old = add_run(store, "eucalyptus-default", {w: (1.0, 100.0)}, started_at=1.0)
        new = add_run(store, "eucalyptus-default", {w: (2.0, 100.0)}, started_at=2.0)
        add_run(store, "eucalyptus-default", {w: (3.0, 100.0)}, started_at=3.0, size="quick")
        add_run(store, "eucalyptus-default", {w: (4.0, 100.0)}, started_at=4.0, state="aborted")
        add_run(store, "eucalyptus-default", {w: (5.0, 100.0)}, started_at=5.0, profile_hash="0" * 64)
        add_run(store, "modern-tuned", {w: (6.0, 100.0)}, started_at=6.0)  # not in the study
        quick_virtio = add_run(store, "virtio-disk", {w: (7.0, 100.0)}, started_at=7.0, size="quick",
                               accelerator="tcg")
        custom = add_run(store, "virtio-disk", {w: (8.0, 100.0)}, started_at=8.0, size="custom")
        runs = store.list_runs()
    hashes, _ = evidence.profile_facts(s)
    cells = evidence.select_cells(s, runs, hashes)
    assert set(cells) == {("eucalyptus-default", w), ("virtio-disk", w)}
    c = cells[("eucalyptus-default", w)]
    assert (c.run_id, c.guest.value, c.baseline.value, c.metric) == (new, 2.0, 100.0, "MB/s")
    v = cells[("virtio-disk", w)]  # a custom size is not one of the study's sizes
    assert v.run_id == quick_virtio != custom and v.qualifiers == ["emulated", "quick"] and v.emulated
    assert evidence.select_cells(s, runs, hashes, size="quick")[("eucalyptus-default", w)].guest.value == 3.0
    assert evidence.select_cells(s, runs, hashes, node="elsewhere") == {}
    # a run of an older version of the profile is used only when nothing else is there, and says so
    only_old = [r for r in runs if r.profile_hash == "0" * 64]
    c = evidence.select_cells(s, only_old, hashes)[("eucalyptus-default", w)]
    assert c.profile_changed and c.qualifiers == ["profile changed"]
    assert old != c.run_id


def test_gather_evaluates_over_the_store(tmp_path):
    s = good()
    with ResultStore(tmp_path / "r.db") as store:
        add_run(store, "eucalyptus-default", {"dd-write-64k": (4.0, 80.0)})
        add_run(store, "virtio-disk", {"dd-write-64k": (3.0, 80.0)}, started_at=1_700_000_100.0)
        ev = evidence.gather(s, store.list_runs(state="completed"))
    assert ev.unavailable == {"xen-default": "Xen profile: boot the appliance's Xen entry"}
    assert [(v.rule.id, v.status) for v in ev.verdicts] == [
        ("R1", REPRODUCED), ("R2", NOT_REPRODUCED), ("R3", REPRODUCED), ("R4", INCONCLUSIVE), ("R5", INCONCLUSIVE)]
    assert ev.verdicts[1].ours == pytest.approx(75.0)


# ------------------------------------------------------------------------------------ verdicts from intervals
def repeated_run(store: ResultStore, profile: str, test: str, guest: list[float], base: list[float], *,
                 avgqu: list[float] | None = None) -> int:
    """A completed study-size run on KVM whose test was repeated: the samples alternate bare metal and guest."""
    prof = profiles.find_profile(profile)
    rid = store.create_run(profile_name=profile, profile_hash=prof.hash, profile_toml=prof.to_toml(), suite="all",
                           size_label="study", accelerator="kvm", started_at=1_700_000_000.0, node=platform.node())
    qus = avgqu or [0.8] * len(guest)
    for b, g, q in zip(base, guest, qus, strict=True):
        store.add_measurement(rid, side="baseline", test=test, metric="MB/s", value=b, host_avgqu=100.0)
        store.add_measurement(rid, side="guest", test=test, metric="MB/s", value=g, host_avgqu=q)
    store.finish_run(rid, "completed")
    return rid


def verdicts_over(tmp_path: Path, runs: list[tuple[str, list[float], list[float]]], **kw) -> dict[str, Any]:
    with ResultStore(tmp_path / "r.db") as store:
        for profile, guest, base in runs:
            repeated_run(store, profile, "dd-write-64k", guest, base, **kw)
        ev = evidence.gather(good(), store.list_runs(state="completed"))
    return {v.rule.id: v for v in ev.verdicts}


BASE8 = [100.0, 101.0, 99.0, 100.5, 99.5, 100.2, 99.8, 100.1]


def test_a_ratio_whose_whole_interval_is_on_the_findings_side_is_reproduced(tmp_path):
    # R1: the default at most 10% of native; eight repeats a side of about 5%
    v = verdicts_over(tmp_path, [("eucalyptus-default", [5.0, 5.2, 4.9, 5.1, 4.8, 5.3, 5.0, 4.95], BASE8)])["R1"]
    assert v.status == REPRODUCED and v.reasons == ()
    e = v.estimate
    assert e.n == "8+8" and e.has_interval and e.coverage == pytest.approx(0.95)
    assert 4.7 < e.low < v.ours < e.high < 5.4 and e.high <= 10
    assert v.explain().startswith(f"reproduced: ours {v.ours:.1f}% [{e.low:.1f}, {e.high:.1f}] n=8+8, the rule "
                                  "needs ≤ 10% (the whole interval)")


def test_a_ratio_whose_whole_interval_is_on_the_other_side_is_not_reproduced(tmp_path):
    v = verdicts_over(tmp_path, [("eucalyptus-default", [50.0, 52.0, 49.0, 51.0, 48.0, 53.0, 50.0, 49.5],
                                  BASE8)])["R1"]
    assert v.status == NOT_REPRODUCED and v.estimate.low > 10
    assert v.explain().startswith("not reproduced: ours 50.") and "n=8+8" in v.explain()


def test_a_ratio_whose_interval_straddles_the_threshold_is_inconclusive_and_says_so(tmp_path):
    # about 10% of native, spread from 6 to 14: the median alone would say reproduced or not by chance
    v = verdicts_over(tmp_path, [("eucalyptus-default", [6.0, 14.0, 8.0, 12.0, 9.0, 11.0, 7.0, 13.0], BASE8)])["R1"]
    assert v.status == INCONCLUSIVE and v.estimate.low < 10 < v.estimate.high
    assert len(v.reasons) == 1 and v.reasons[0].startswith("our interval [")
    assert v.reasons[0].endswith("(n=8+8) lies across the threshold (≤ 10%): more repeats narrow it")
    assert "ours would be" in v.explain() and "n=8+8" in v.explain()


def test_a_cells_own_number_is_decided_by_its_medians_interval(tmp_path):
    # R3: the host queue below one request, an absolute rule over the host metric's eight samples
    below = verdicts_over(tmp_path, [("eucalyptus-default", [5.0] * 8, BASE8)],
                          avgqu=[0.5, 0.55, 0.6, 0.5, 0.45, 0.52, 0.58, 0.5])["R3"]
    assert below.status == REPRODUCED and below.estimate.n == "8" and below.estimate.high < 1
    across = verdicts_over(tmp_path / "b", [("eucalyptus-default", [5.0] * 8, BASE8)],
                           avgqu=[0.6, 1.4, 0.8, 1.2, 0.9, 1.1, 0.7, 1.3])["R3"]
    assert across.status == INCONCLUSIVE and "lies across the threshold (< 1)" in across.reasons[0]


def test_a_ratio_of_two_cells_has_an_interval_over_both_cells_samples(tmp_path):
    # R2: virtio at least 110% of the default; 3 + 3 samples: the range of the pairwise ratios, 90% coverage
    v = verdicts_over(tmp_path, [("eucalyptus-default", [4.0, 4.2, 3.9], [100.0] * 3),
                                 ("virtio-disk", [8.0, 8.1, 7.9], [100.0] * 3)])["R2"]
    assert v.status == REPRODUCED and v.estimate.n == "3+3" and v.estimate.coverage == pytest.approx(0.9)
    assert " (90%) n=3+3" in v.ours_text()


def test_one_sample_a_side_decides_on_that_figure_and_says_so(tmp_path):
    vs = verdicts_over(tmp_path, [("eucalyptus-default", [4.0], [80.0])])
    v = vs["R1"]
    assert v.status == REPRODUCED and v.estimate.n == "1+1" and not v.estimate.has_interval
    assert v.ours_text() == "5.0% n=1+1 (one sample a side: no interval)"
    assert v.ours_text(brief=True) == "5.0% n=1+1"
    assert vs["R3"].ours_text() == "0.8 n=1 (one sample: no interval)"
    # below six samples a number has no interval either: its median decides
    few = verdicts_over(tmp_path / "b", [("eucalyptus-default", [4.0, 4.1, 3.9], [80.0, 81.0, 79.0])])["R3"]
    assert few.estimate.n == "3" and few.ours_text().endswith("n=3 (no interval below 6 samples)")


def test_a_repeated_cell_is_its_samples_median_with_the_interval_in_the_report(tmp_path):
    from cloudbox.core.studies import markdown

    with ResultStore(tmp_path / "r.db") as store:
        rid = repeated_run(store, "eucalyptus-default", "dd-write-64k", [5.0, 5.2, 4.9, 5.1, 4.8, 5.3, 5.0, 4.95],
                           BASE8)
        ev = evidence.gather(good(), store.list_runs(state="completed"))
    c = ev.cells[("eucalyptus-default", "dd-write-64k")]
    assert c.guest.n == 8 and c.guest.value == pytest.approx(5.0) and c.baseline.value == pytest.approx(100.05)
    report = markdown.to_markdown(ev)
    row = next(ln for ln in report.splitlines() if "`eucalyptus-default`" in ln and ln.endswith(f"#{rid} |"))
    cells = [x.strip() for x in row.strip("|").split(" | ")]
    assert cells[3].startswith("5.0 [4.") and cells[5].startswith(f"{c.ratio().percent:.1f} [")
    assert cells[-2:] == ["8+8", f"#{rid}"]
    # the HTML report's bar of % of native carries the interval as an error bar, and its words
    from cloudbox.core.studies import html

    r = c.ratio()
    page = html.to_html(ev)
    assert f"<title>95% interval {r.low:.1f} to {r.high:.1f} %</title>" in page
    assert f">{r.percent:.1f} % [{r.low:.1f}, {r.high:.1f}] n=8+8</text>" in page


def test_a_cell_whose_samples_drifted_says_so_beside_its_verdict(tmp_path):
    from cloudbox.core.studies import markdown

    rising = [4.0, 4.1, 4.2, 4.3, 5.5, 5.6, 5.7, 5.8]  # faster from halfway on: an order effect
    with ResultStore(tmp_path / "r.db") as store:
        repeated_run(store, "eucalyptus-default", "dd-write-64k", rising, BASE8)
        ev = evidence.gather(good(), store.list_runs(state="completed"))
    report = markdown.to_markdown(ev)
    r1 = report.split("### R1: ")[1].split("### ")[0]
    assert "- order: eucalyptus-default/dd-write-64k: drift: first half 4.2, second half 5.7 (+36.1%), " \
           "Mann-Whitney p = 0.029" in r1
    # measured once, a cell has no order to test
    with ResultStore(tmp_path / "once.db") as store:
        add_run(store, "eucalyptus-default", {"dd-write-64k": (4.0, 80.0)})
        once = markdown.to_markdown(evidence.gather(good(), store.list_runs(state="completed")))
    assert "- order:" not in once


# ---------------------------------------------------------------------------------------------- study runs
def test_plan_skips_cells_stored_for_the_same_hash_size_and_node(tmp_path):
    one = schema.RepeatPlan()  # these runs took one sample a side: a plan of one counts them
    s = good().model_copy(update={"plan": schema.Plans(study=one, quick=one)})
    here = platform.node()
    with ResultStore(tmp_path / "r.db") as store:
        done = add_run(store, "eucalyptus-default", {"dd-write-64k": (1.0, 100.0)})
        add_run(store, "virtio-disk", {"dd-write-64k": (1.0, 100.0)}, size="quick")  # another size
        add_run(store, "virtio-disk", {"dd-write-64k": (1.0, 100.0)}, node="elsewhere")  # another node
        add_run(store, "virtio-disk", {"dd-write-64k": (1.0, 100.0)}, profile_hash="0" * 64)  # another profile
        add_run(store, "virtio-disk", {"dd-write-64k": (1.0, 100.0)}, state="failed")
        runs = store.list_runs()
    hashes, unavailable = evidence.profile_facts(s)
    plan = planning.plan_run(s, runs, hashes, size="study", node=here, backend=False, unavailable=unavailable)
    by = {p.profile: p for p in plan}
    assert by["eucalyptus-default"].stored == {"dd-write-64k": done} and by["eucalyptus-default"].run == []
    assert by["eucalyptus-default"].elsewhere == ["tcp-stream-fe"]
    assert by["virtio-disk"].run == ["dd-write-64k"] and by["virtio-disk"].stored == {}
    assert by["xen-default"].refused == "Xen profile: boot the appliance's Xen entry" and by["xen-default"].run == []
    # on a back-end the front-end test is measured too; --again measures what is stored
    plan = planning.plan_run(s, runs, hashes, size="study", node=here, backend=True, unavailable=unavailable,
                            again=True)
    assert {p.profile: p.run for p in plan}["eucalyptus-default"] == ["dd-write-64k", "tcp-stream-fe"]
    # the quick run counts for a quick study run
    plan = planning.plan_run(s, runs, hashes, size="quick", node=here, backend=False, unavailable=unavailable)
    assert {p.profile: p.run for p in plan}["virtio-disk"] == []


def test_planned_profiles_become_valid_run_specs():
    storage_only = planning.PlannedProfile("virtio-disk", run=["dd-write-64k", "dd-read-64k"])
    spec = storage_only.spec("quick", work_dir="/srv/test")
    assert (spec.profile, spec.suite, spec.size, spec.storage_tests, spec.work_dir) == (
        "virtio-disk", "storage", "quick", "dd-write-64k,dd-read-64k", "/srv/test")
    spec.validate()
    both = planning.PlannedProfile("virtio-disk", run=["dd-read-64k", "tcp-stream", "tcp-stream-fe", "tcp-maerts-fe"])
    spec = both.spec("study", "node2")
    assert (spec.suite, spec.storage_tests, spec.net_tests, spec.node) == (
        "all", "dd-read-64k", "tcp-stream,tcp-maerts", "node2")
    spec.validate()
    assert [(p.side, p.test) for p in spec.plan()][:3] == [("baseline", "dd-read-64k"), ("guest", "boot"),
                                                            ("guest", "dd-read-64k")]
    net = planning.PlannedProfile("virtio-disk", run=["tcp-maerts"]).spec("quick")
    assert (net.suite, net.net_tests) == ("network", "tcp-maerts")


def test_a_published_studys_rule_without_its_source_is_refused_and_an_own_study_has_none():
    """Every finding of a study with [documents] says where the texts state it; a study of cloudbox's own (no
    [documents]) carries no published figure."""
    text = (REPO / "studies/a.toml").read_text()
    first = text.index("[[rules]]")
    line = next(ln for ln in text[first:].splitlines() if ln.startswith("source = "))
    with pytest.raises(StudyError, match=r"rules\[1\]\.source: required key is missing; allowed: document:line"):
        loading.parse_study(text[:first] + text[first:].replace(line + "\n", "", 1), "a.toml")
    ladder = (REPO / "studies/ladder.toml").read_text()
    paper = '\n[[paper]]\ncell = "eucalyptus-default/dd-write-64k"\nvalue = 1.3\nsource = "000:294"\n'
    with pytest.raises(StudyError, match=r"paper: a study without \[documents\] \(cloudbox's own\) has no published"):
        loading.parse_study(ladder + paper, "ladder.toml")
