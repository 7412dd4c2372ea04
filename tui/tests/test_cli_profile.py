"""`cloudbox profile list | show | diff | validate` through the command line entry point."""

from __future__ import annotations

import argparse
import contextlib
import io
import json

import pytest

from cloudbox import cli
from cloudbox.cli import profile as profile_cli
from cloudbox.core.spec.profiles import parse_profile


def _wired() -> bool:
    """Whether cloudbox.cli.main already registers the `profile` command."""
    sink = io.StringIO()
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            cli.main(["profile", "--help"])
    except SystemExit as e:
        return e.code == 0
    return False


def main(argv: list[str]) -> int:
    """cloudbox.cli.main when it registers `profile`; otherwise the same dispatch over profile.add_parser."""
    if _WIRED:
        return cli.main(argv)
    parser = argparse.ArgumentParser(prog="cloudbox")
    profile_cli.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return int(args.func(args))


_WIRED = _wired()


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("CLOUDBOX_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("CLOUDBOX_PROFILE_PATH", raising=False)


GOOD = """
name = "{name}"
description = "a cli test profile"
[guest]
hypervisor = "kvm"
[disk]
bus = "virtio-blk"
cache = "none"
backing = "prealloc-file"
[network]
model = "virtio"
"""


def test_list(capsys):
    assert main(["profile", "list"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("eucalyptus-default "))
    assert "preset" in line and "sparse" in line
    assert "modern-tuned" in out


def test_list_json(capsys):
    assert main(["profile", "list", "--json"]) == 0
    entries = {e["name"]: e for e in json.loads(capsys.readouterr().out)}
    assert entries["xen-xvd-phy"]["kind"] == "preset" and entries["xen-xvd-phy"]["problem"] is None


def test_show_human(capsys):
    assert main(["profile", "show", "modern-tuned"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("modern-tuned: ")
    assert "hash: " in out
    assert any(ln.split() == ["disk.cache", "none"] for ln in out.splitlines())
    assert any(ln.split() == ["network.vhost", "true"] for ln in out.splitlines())


def test_show_toml_roundtrips(capsys):
    assert main(["profile", "show", "eucalyptus-default", "--toml"]) == 0
    prof = parse_profile(capsys.readouterr().out, expect_name="eucalyptus-default")
    assert prof.disk.backing == "sparse-file"


def test_show_json_by_file(tmp_path, capsys):
    f = tmp_path / "mine.toml"
    f.write_text(GOOD.format(name="mine"))
    assert main(["profile", "show", str(f), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["name"] == "mine" and data["disk"]["cache"] == "none" and len(data["hash"]) == 64


def test_show_unknown_name(capsys):
    assert main(["profile", "show", "nope"]) == 1
    err = capsys.readouterr().err
    assert "no profile named 'nope'" in err and "eucalyptus-default" in err


def test_diff(capsys):
    assert main(["profile", "diff", "eucalyptus-default", "eucalyptus-prealloc"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["key", "eucalyptus-default", "eucalyptus-prealloc"]
    assert lines[1].split() == ["disk.backing", "sparse-file", "prealloc-file"]
    assert len(lines) == 2


def test_diff_same(capsys):
    assert main(["profile", "diff", "virtio-disk", "virtio-disk"]) == 0
    assert "same tuning knobs" in capsys.readouterr().out


def test_validate_good(tmp_path, capsys):
    f = tmp_path / "mine.toml"
    f.write_text(GOOD.format(name="mine"))
    assert main(["profile", "validate", str(f)]) == 0
    assert f"{f}: ok (mine, " in capsys.readouterr().out


def test_validate_bad_file(tmp_path, capsys):
    good = tmp_path / "good.toml"
    good.write_text(GOOD.format(name="good"))
    bad = tmp_path / "bad.toml"
    bad.write_text(GOOD.format(name="bad").replace('cache = "none"', 'cache = "fastest"'))
    assert main(["profile", "validate", str(good), str(bad)]) == 2
    captured = capsys.readouterr()
    assert f"{good}: ok" in captured.out
    err = captured.err
    assert str(bad) in err
    assert "disk.cache" in err and "'fastest'" in err
    assert "none, writethrough, writeback, directsync, unsafe" in err


def test_validate_syntax_error_and_missing(tmp_path, capsys):
    bad = tmp_path / "broken.toml"
    bad.write_text('name = "broken"\n[disk\n')
    assert main(["profile", "validate", str(bad), str(tmp_path / "absent.toml")]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: invalid profile" in err and "line 2" in err
    assert "absent.toml" in err


def test_show_invalid_file_exits_2(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text(GOOD.format(name="bad").replace('bus = "virtio-blk"', 'bus = "xen-vbd"'))
    assert main(["profile", "show", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "disk.bus" in err and "'xen-vbd'" in err and "virtio-blk, virtio-scsi, scsi-lsi, sata, ide" in err


def test_profile_without_subcommand_prints_usage(capsys):
    assert main(["profile"]) == 2
    assert "list" in capsys.readouterr().err
