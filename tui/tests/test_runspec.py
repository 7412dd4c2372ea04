"""Run options: one declaration (core.spec.runspec.RUN_OPTIONS) from which `cloudbox run` builds its flags and the TUI's
Tests screen its selects; the spec's checks name the flag, the value and what is allowed."""

from __future__ import annotations

import pytest

from cloudbox import cli
from cloudbox.core.errors import UsageError
from cloudbox.core.spec import catalogue
from cloudbox.core.spec.runspec import RUN_OPTIONS, RunSpec, option


def _run_args(argv: list[str]):
    return cli.build_parser().parse_args(["run", *argv])


def test_every_option_is_a_flag_with_its_default_and_help(capsys):
    args = _run_args(["--profile", "virtio-disk"])
    spec = RunSpec(**{o.field: getattr(args, o.field) for o in RUN_OPTIONS})
    assert spec == RunSpec(profile="virtio-disk")
    with pytest.raises(SystemExit):
        _run_args(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    for opt in RUN_OPTIONS:
        assert opt.flag in out, opt.flag
        assert " ".join(opt.help.split()[:4]) in out, opt.help
    args = _run_args(["-p", "x", "--tests", "smoke", "--agent-timeout", "60", "--net-seconds", "3", "-s", "network"])
    assert (args.storage_tests, args.agent_timeout, args.net_seconds, args.suite) == ("smoke", 60.0, 3, "network")


def test_the_spec_and_its_dict_form():
    spec = RunSpec(profile="virtio-disk", suite="storage", node="be1")
    assert RunSpec.from_dict(spec.as_dict()) == spec
    with pytest.raises(Exception, match="unknown run setting.*colour"):
        RunSpec.from_dict({**spec.as_dict(), "colour": "red"})


@pytest.mark.parametrize(("field", "value", "message"), [
    ("suite", "disk", r"--suite 'disk' is not allowed; allowed: storage, network, all, guest"),
    ("size", "lots", r"--size 'lots' not understood; allowed: quick, study"),
    ("storage_tests", "seq-write-7k", r"--tests 'seq-write-7k': unknown storage test\(s\) seq-write-7k \(did you mean "
     r"seq-write-64k\?\); allowed:"),
    ("storage_tests", ",", r"--tests ',' names no storage test; allowed: seq-write"),
    ("net_tests", "udp", r"--net-tests 'udp': unknown network test\(s\) udp; allowed: tcp-stream"),
    ("agent_timeout", 5.0, r"--agent-timeout 5 is not allowed; allowed: 10 to 3600 seconds"),
])
def test_a_bad_value_names_its_flag_and_what_is_allowed(field, value, message):
    with pytest.raises(UsageError, match=message):
        RunSpec(profile="virtio-disk", **{field: value}).validate()


async def test_the_tests_screen_offers_the_declared_choices(state):
    from textual.widgets import Label, Select

    from cloudbox.tui import create_app
    from cloudbox.tui.backend import Backend

    backend = Backend(libvirt_uri="test:///default")
    app = create_app(backend, mode="tests")
    async with app.run_test(size=(100, 32)) as pilot:
        await pilot.pause()
        for widget, field in (("#suite", "suite"), ("#size", "size"), ("#test-set", "storage_tests")):
            select = app.screen.query_one(widget, Select)
            opt = option(field)
            assert [v for _, v in select._options if v is not Select.BLANK] == [v for _, v in opt.offered()]
            assert select.value == opt.initial
        labels = [str(lab.content) for lab in app.screen.query(Label)]
        assert {"Suite", "Size", "Storage tests", "Where"} <= set(labels)
    backend.close()
    assert option("suite").offered() == [("storage", "storage"), ("network", "network"), ("both", "all")]
    assert [v for _, v in option("storage_tests").offered()] == list(catalogue.TEST_SETS)


@pytest.mark.parametrize(("argv", "message"), [
    (["--agent-timeout", "5"], "--agent-timeout 5 is not allowed; allowed: 10 to 3600 seconds (default 300)"),
    (["--size", "1M"], "--size '1M' is too small; the minimum is 4M"),
    (["--tests", "seq-write-7k"], "--tests 'seq-write-7k': unknown storage test(s) seq-write-7k (did you mean "
     "seq-write-64k?); allowed:"),
    (["--net-seconds", "-3"],
     "--net-seconds -3 is not allowed; allowed: 0 (30 s, or at quick size 5 s shared by the repeats) or more"),
    (["--runtime", "-1"],
     "--runtime -1 is not allowed; allowed: 0 (30 s, or at quick size 5 s shared by the repeats) or more seconds"),
])
def test_a_usage_error_exits_2_before_anything_is_created(argv, message, isolated, cli_run):
    code, _, err = cli_run(["run", "--profile", "virtio-disk", *argv])
    assert code == 2 and message in err
    assert not isolated.exists()  # no results database, no log, no lock


@pytest.mark.parametrize("name", ["/../../x", "../escape", "be1\n", "Be1", "-be1", "a" * 64])
def test_a_node_name_reaching_the_run_lock_is_a_node_name(name, tmp_path, monkeypatch, isolated, cli_run):
    from cloudbox.core.record.runlock import RunLock, check_not_busy

    run_dir = tmp_path / "run" / "dir"
    monkeypatch.setenv("CLOUDBOX_RUN_DIR", str(run_dir))
    for attempt in (lambda: RunLock(name), lambda: check_not_busy(name)):
        with pytest.raises(UsageError, match="is not a node name; allowed: lowercase letters, digits and '-'"):
            attempt()
    code, _, err = cli_run(["run", "--profile", "virtio-disk", f"--node={name}"])
    assert code == 2 and f"--node {name!r} is not a node name" in err
    assert list(tmp_path.rglob("*")) == []  # no lock file, in the run dir or outside it
    lock = RunLock("be-1")
    lock.acquire({"pid": 1})
    lock.release()
    assert [p.name for p in run_dir.iterdir()] == ["run-node-be-1.lock"]
