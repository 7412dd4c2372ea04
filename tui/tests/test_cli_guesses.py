"""The CLI for a first evening: an unknown profile, test, study or node names the closest match first; test sets and
ids are taken in any case; exit 2 is bad usage or input (a name that does not exist, a bad option, an invalid file)
and 1 a failure of the system; the internal node commands stay out of the help."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(("argv", "hint"), [
    (["run", "--profile", "virtio-dsk", "--suite", "storage"], "(did you mean virtio-disk?)"),
    (["run", "--profile", "virtio-disk", "--tests", "seq-wrte-64k"], "(did you mean seq-write-64k?)"),
    (["run", "--profile", "virtio-disk", "--tests", "smok"], "(did you mean smoke?)"),
    (["run", "--profile", "virtio-disk", "--net-tests", "iprf3"], "(did you mean iperf3?)"),
    (["study", "show", "bb"], "(did you mean b?)"),
    (["study", "show", "e"], "has no file of its own: its rows and findings are in study a ("),
])
def test_an_unknown_name_is_usage_and_names_the_closest_match(isolated, cli_run, argv, hint):
    ran = cli_run(argv)
    assert ran.code == 2 and hint in ran.err and ran.out == "", ran.err


def test_a_storage_test_refusal_is_not_a_wall_of_ids(isolated, cli_run):
    ran = cli_run(["run", "--profile", "virtio-disk", "--tests", "nosuchtest"])
    assert ran.code == 2 and "randread-4k-qd32" not in ran.err and "cloudbox tests" in ran.err


def test_sets_and_ids_are_taken_in_any_case():
    from cloudbox.core.spec import catalogue
    from cloudbox.core.spec.runspec import RunSpec, resolve_net_tests

    assert [t.id for t in catalogue.resolve_tests("Study")] == catalogue.TEST_SETS["study"]
    assert [t.id for t in catalogue.resolve_tests("SEQ-WRITE-64K, Seq-Read-64k")] == ["seq-write-64k",
                                                                                      "seq-read-64k"]
    assert [t.id for t in resolve_net_tests("IPERF3")] == ["iperf3-tx", "iperf3-rx"]
    RunSpec(profile="virtio-disk", size="Quick", storage_tests="Smoke").validate()


def test_the_test_catalogue_is_one_command(cli_run):
    ran = cli_run(["tests"])
    assert ran.code == 0
    assert "  randread-4k-qd32 " in ran.out and "storage test sets: study (4), standard (10)" in ran.out
    assert "network test sets: netperf (tcp-stream, tcp-maerts, tcp-rr)" in ran.out


def test_a_results_database_that_is_not_there_is_an_error_not_an_empty_list(isolated, cli_run, tmp_path):
    ran = cli_run(["results", "--db", str(tmp_path / "nope" / "x.db"), "list"])
    assert ran.code == 2 and "no such results database" in ran.err and ran.out == ""
    assert not (tmp_path / "nope").exists()  # nothing made on the way


def test_internal_node_commands_are_not_offered_in_the_help(cli_run, capsys):
    with pytest.raises(SystemExit):
        cli_run(["node", "--help"])
    out = capsys.readouterr().out
    assert " join " in out and " local " not in out and "enrol-server" not in out


def test_counts_and_articles_read_as_english():
    from cloudbox.core.inputs import a_or_an
    from cloudbox.core.record.events import counted

    assert (a_or_an("all-in-one"), a_or_an("front-end"), counted(1, "rule"), counted(3, "rule")) == (
        "an all-in-one", "a front-end", "1 rule", "3 rules")
