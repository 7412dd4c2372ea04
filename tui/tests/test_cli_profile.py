"""`cloudbox profile list | show | diff | validate` through the command line entry point."""

from __future__ import annotations

import json

import pytest

from cloudbox.core.spec.profiles import parse_profile

pytestmark = pytest.mark.usefixtures("isolated")


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


def test_list(cli_run):
    ran = cli_run(["profile", "list"])
    assert ran.code == 0
    out = ran.out
    line = next(ln for ln in out.splitlines() if ln.startswith("eucalyptus-default "))
    assert "preset" in line and "sparse" in line
    assert "modern-tuned" in out


def test_list_json(cli_run):
    ran = cli_run(["profile", "list", "--json"])
    assert ran.code == 0
    entries = {e["name"]: e for e in json.loads(ran.out)}
    assert entries["xen-xvd-phy"]["kind"] == "preset" and entries["xen-xvd-phy"]["problem"] is None


def test_show_human(cli_run):
    ran = cli_run(["profile", "show", "modern-tuned"])
    assert ran.code == 0
    out = ran.out
    assert out.startswith("modern-tuned: ")
    assert "hash: " in out
    assert any(ln.split() == ["disk.cache", "none"] for ln in out.splitlines())
    assert any(ln.split() == ["network.vhost", "true"] for ln in out.splitlines())


def test_show_toml_roundtrips(cli_run):
    ran = cli_run(["profile", "show", "eucalyptus-default", "--toml"])
    assert ran.code == 0
    prof = parse_profile(ran.out, expect_name="eucalyptus-default")
    assert prof.disk.backing == "sparse-file"


def test_show_json_by_file(tmp_path, cli_run):
    f = tmp_path / "mine.toml"
    f.write_text(GOOD.format(name="mine"))
    ran = cli_run(["profile", "show", str(f), "--json"])
    assert ran.code == 0
    data = json.loads(ran.out)
    assert data["name"] == "mine" and data["disk"]["cache"] == "none" and len(data["hash"]) == 64


def test_show_unknown_name(cli_run):
    ran = cli_run(["profile", "show", "nope"])
    assert ran.code == 2
    err = ran.err
    assert "no profile named 'nope'" in err and "eucalyptus-default" in err


def test_diff(cli_run):
    ran = cli_run(["profile", "diff", "eucalyptus-default", "eucalyptus-prealloc"])
    assert ran.code == 1
    lines = ran.out.splitlines()
    assert lines[0].split() == ["key", "eucalyptus-default", "eucalyptus-prealloc"]
    assert lines[1].split() == ["disk.backing", "sparse-file", "prealloc-file"]
    assert len(lines) == 2


def test_diff_same(cli_run):
    ran = cli_run(["profile", "diff", "virtio-disk", "virtio-disk"])
    assert ran.code == 0
    assert "same tuning knobs" in ran.out


def test_validate_good(tmp_path, cli_run):
    f = tmp_path / "mine.toml"
    f.write_text(GOOD.format(name="mine"))
    ran = cli_run(["profile", "validate", str(f)])
    assert ran.code == 0
    assert f"{f}: ok (mine, " in ran.out


def test_validate_bad_file(tmp_path, cli_run):
    good = tmp_path / "good.toml"
    good.write_text(GOOD.format(name="good"))
    bad = tmp_path / "bad.toml"
    bad.write_text(GOOD.format(name="bad").replace('cache = "none"', 'cache = "fastest"'))
    ran = cli_run(["profile", "validate", str(good), str(bad)])
    assert ran.code == 2
    assert f"{good}: ok" in ran.out
    err = ran.err
    assert str(bad) in err
    assert "disk.cache" in err and "'fastest'" in err
    assert "none, writethrough, writeback, directsync, unsafe" in err


def test_validate_syntax_error_and_missing(tmp_path, cli_run):
    bad = tmp_path / "broken.toml"
    bad.write_text('name = "broken"\n[disk\n')
    ran = cli_run(["profile", "validate", str(bad), str(tmp_path / "absent.toml")])
    assert ran.code == 2
    err = ran.err
    assert f"{bad}: invalid profile" in err and "line 2" in err
    assert "absent.toml" in err


def test_show_invalid_file_exits_2(tmp_path, cli_run):
    bad = tmp_path / "bad.toml"
    bad.write_text(GOOD.format(name="bad").replace('bus = "virtio-blk"', 'bus = "xen-vbd"'))
    ran = cli_run(["profile", "show", str(bad)])
    assert ran.code == 2
    err = ran.err
    assert "disk.bus" in err and "'xen-vbd'" in err and "virtio-blk, virtio-scsi, scsi-lsi, sata, ide" in err


def test_profile_without_subcommand_prints_usage(cli_run):
    ran = cli_run(["profile"])
    assert ran.code == 2
    assert "list" in ran.err
