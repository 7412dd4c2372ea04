"""Tuning profiles: presets load, invalid profiles are refused with precise problems, canonical forms."""

from __future__ import annotations

from pathlib import Path

import pytest

from cloudbox.core import paths
from cloudbox.core.errors import NotFound, ProfileError
from cloudbox.core.inputs import shown
from cloudbox.core.spec import knobs, profiles
from cloudbox.core.spec.profiles import Profile, diff_profiles, load_profile, parse_profile

PRESET_DIR = Path(__file__).resolve().parents[2] / "profiles"
PRESETS = sorted(PRESET_DIR.glob("*.toml"))

REQUIRED_PRESETS = {
    "eucalyptus-default",
    "eucalyptus-prealloc",
    "kvm-scsi-phy",
    "virtio-file",
    "virtio-disk",
    "modern-tuned",
    "xen-default",
    "xen-xvd-phy",
    "xen-xvd-file",
    "kvm-cache-writethrough",
    "kvm-cache-none",
    "kvm-ebs-aoe",
}


pytestmark = pytest.mark.usefixtures("isolated")


# -- presets ---------------------------------------------------------------------------------


def test_required_presets_exist():
    assert REQUIRED_PRESETS <= {p.stem for p in PRESETS}


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.stem)
def test_preset_loads(path: Path):
    prof = load_profile(path)
    assert prof.name == path.stem
    assert prof.reproduces, "every preset says which study row it reproduces"
    text = path.read_text()
    assert text.startswith("#"), "every preset starts with a comment header citing its study row"
    assert "Study" in text.split("\nname =")[0]
    # the canonical text round-trips to an equal profile with the same hash
    again = parse_profile(prof.to_toml(), "canonical", expect_name=prof.name)
    assert again == prof and again.hash == prof.hash


def test_presets_found_by_name_and_listed_as_presets():
    entries = {e.name: e for e in profiles.list_profiles()}
    for name in REQUIRED_PRESETS:
        assert entries[name].kind == "preset"
        assert entries[name].problem is None
        assert entries[name].description
        assert profiles.find_profile(name).name == name


def test_preset_knobs_match_the_studies():
    eu = profiles.find_profile("eucalyptus-default")
    assert (
        eu.guest.hypervisor,
        eu.disk.bus,
        eu.disk.cache,
        eu.disk.backing,
        eu.network.model,
        eu.network.mtu,
    ) == ("kvm", "scsi-lsi", "writethrough", "sparse-file", "e1000", 1500)
    mt = profiles.find_profile("modern-tuned")
    assert (mt.disk.bus, mt.disk.cache, mt.disk.io, mt.disk.iothreads, mt.disk.backing) == (
        "virtio-blk",
        "none",
        "io_uring",
        1,
        "block-device",
    )
    assert (mt.network.model, mt.network.vhost, mt.network.queues, mt.guest.vcpus, mt.network.mtu) == (
        "virtio",
        True,
        2,
        2,
        9000,
    )
    xv = profiles.find_profile("xen-xvd-phy")
    assert (xv.guest.hypervisor, xv.disk.bus, xv.disk.backing) == ("xen", "xen-vbd", "block-device")
    ebs = profiles.find_profile("kvm-ebs-aoe")
    assert ebs.disk.backing == "network-volume" and ebs.disk.volume.startswith("aoe:")
    assert diff_profiles(
        profiles.find_profile("kvm-cache-writethrough"), profiles.find_profile("kvm-cache-none")
    ) == [("disk.cache", "writethrough", "none")]


# -- invalid profiles --------------------------------------------------------------------------

XEN_PV_FILE = """name = "t"
description = "a Xen PV test profile"
[guest]
hypervisor = "xen"
[network]
model = "xen-netfront"
[disk]
bus = "xen-vbd"
cache = "writeback"
backing = "prealloc-file"
"""

BASE = {
    "name": "t",
    "description": "a test profile",
    "guest": {"hypervisor": "kvm", "vcpus": 1, "memory_mib": 1024},
    "disk": {
        "bus": "virtio-blk",
        "cache": "writethrough",
        "io": "threads",
        "backing": "sparse-file",
        "format": "raw",
    },
    "network": {"model": "virtio", "vhost": False, "queues": 1, "mtu": 1500},
}


def _val(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def toml_of(data: dict) -> str:
    lines = [f"{k} = {_val(v)}" for k, v in data.items() if not isinstance(v, dict)]
    for k, v in data.items():
        if isinstance(v, dict):
            lines += ["", f"[{k}]"] + [f"{kk} = {_val(vv)}" for kk, vv in v.items()]
    return "\n".join(lines) + "\n"


def variant(*changes: tuple[str, object]) -> str:
    """BASE with dotted-key changes; a value of ... deletes the key."""
    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in BASE.items()}
    for key, value in changes:
        *parents, leaf = key.split(".")
        target = data
        for p in parents:
            target = target[p]
        if value is ...:
            target.pop(leaf, None)
        else:
            target[leaf] = value
    return toml_of(data)


MISSING = None  # a missing key is reported with value None

# (id, TOML text, expected name or None, key, offending value, fragment of the allowed values)
INVALID = [
    ("unknown-top-level-key", variant(("colour", "red")), None, "colour", "red", "description"),
    ("unknown-nested-key", variant(("disk.speed", 5)), None, "disk.speed", 5, "bus, cache, io"),
    ("string-vcpus", variant(("guest.vcpus", "2")), None, "guest.vcpus", "2", "1..64"),
    ("bool-mtu", variant(("network.mtu", True)), None, "network.mtu", True, "1500..9000"),
    ("vcpus-0", variant(("guest.vcpus", 0)), None, "guest.vcpus", 0, "1..64"),
    ("vcpus-65", variant(("guest.vcpus", 65)), None, "guest.vcpus", 65, "1..64"),
    ("memory-too-small", variant(("guest.memory_mib", 128)), None, "guest.memory_mib", 128, "256..262144"),
    ("mtu-1499", variant(("network.mtu", 1499)), None, "network.mtu", 1499, "1500..9000"),
    ("mtu-9001", variant(("network.mtu", 9001)), None, "network.mtu", 9001, "1500..9000"),
    (
        "bad-cache-mode",
        variant(("disk.cache", "fast")),
        None,
        "disk.cache",
        "fast",
        "none, writethrough, writeback, directsync, unsafe",
    ),
    (
        "bad-bus",
        variant(("disk.bus", "sas")),
        None,
        "disk.bus",
        "sas",
        "virtio-blk, virtio-scsi, scsi-lsi, sata, ide, xen-vbd, nvme",
    ),
    (
        "bad-backing",
        variant(("disk.backing", "lvm")),
        None,
        "disk.backing",
        "lvm",
        "sparse-file, prealloc-file, qcow2, qcow2-prealloc, block-device, network-volume, vhost-user, nvme-pci",
    ),
    ("bad-hypervisor", variant(("guest.hypervisor", "qemu")), None, "guest.hypervisor", "qemu", "kvm, xen"),
    (
        "io-native-with-writeback",
        variant(("disk.io", "native"), ("disk.cache", "writeback")),
        None,
        "disk.io",
        "native",
        "none or directsync",
    ),
    (
        "qcow2-backing-raw-format",
        variant(("disk.backing", "qcow2"), ("disk.format", "raw")),
        None,
        "disk.format",
        "raw",
        "qcow2",
    ),
    ("raw-backing-qcow2-format", variant(("disk.format", "qcow2")), None, "disk.format", "qcow2", "raw"),
    (
        "iothreads-with-scsi-lsi",
        variant(("disk.bus", "scsi-lsi"), ("disk.iothreads", 1)),
        None,
        "disk.iothreads",
        1,
        "virtio-blk or virtio-scsi",
    ),
    (
        "disk-queues-with-ide",
        variant(("disk.bus", "ide"), ("disk.queues", 2), ("guest.vcpus", 2)),
        None,
        "disk.queues",
        2,
        "virtio-blk or virtio-scsi",
    ),
    (
        "disk-queues-over-vcpus",
        variant(("disk.queues", 4), ("guest.vcpus", 2)),
        None,
        "disk.queues",
        4,
        "1..2",
    ),
    (
        "vhost-with-e1000",
        variant(("network.model", "e1000"), ("network.vhost", True)),
        None,
        "network.vhost",
        True,
        "model virtio",
    ),
    (
        "net-queues-with-e1000",
        variant(("network.model", "e1000"), ("network.queues", 2), ("guest.vcpus", 2)),
        None,
        "network.queues",
        2,
        "model virtio",
    ),
    ("net-queues-over-vcpus", variant(("network.queues", 2)), None, "network.queues", 2, "1..1"),
    (
        "xen-vbd-with-kvm",
        variant(("disk.bus", "xen-vbd")),
        None,
        "disk.bus",
        "xen-vbd",
        "virtio-blk, virtio-scsi, scsi-lsi, sata, ide",
    ),
    (
        "xen-with-virtio-blk",
        variant(("guest.hypervisor", "xen"), ("disk.cache", "writeback"), ("network.model", "e1000")),
        None,
        "disk.bus",
        "virtio-blk",
        "xen-vbd, ide, scsi-lsi",
    ),
    (
        "xen-with-virtio-net",
        variant(("guest.hypervisor", "xen"), ("disk.bus", "ide"), ("disk.cache", "writeback")),
        None,
        "network.model",
        "virtio",
        "e1000, rtl8139, xen-netfront",
    ),
    (
        "xen-pv-with-e1000",
        variant(
            ("guest.hypervisor", "xen"),
            ("disk.bus", "xen-vbd"),
            ("disk.cache", "writeback"),
            ("network.model", "e1000"),
        ),
        None,
        "network.model",
        "e1000",
        "xen-netfront",
    ),
    (
        "xen-cache-libxl-cannot-set",
        variant(("guest.hypervisor", "xen"), ("disk.bus", "ide"), ("network.model", "e1000")),
        None,
        "disk.cache",
        "writethrough",
        "writeback",
    ),
    (
        "netfront-with-kvm",
        variant(("network.model", "xen-netfront")),
        None,
        "network.model",
        "xen-netfront",
        "e1000, rtl8139, virtio",
    ),
    ("name-not-file-stem", variant(("name", "other")), "t", "name", "other", "t (this file is t.toml)"),
    ("bad-name-chars", variant(("name", "Bad_Name")), None, "name", "Bad_Name", "lowercase letters, digits"),
    ("name-leading-dash", variant(("name", "-x")), None, "name", "-x", "starting with a letter or digit"),
    ("missing-description", variant(("description", ...)), None, "description", MISSING, "one line of text"),
    (
        "multi-line-description",
        variant(("description", "one\ntwo")),
        None,
        "description",
        "one\ntwo",
        "one line of text",
    ),
    ("missing-bus", variant(("disk.bus", ...)), None, "disk.bus", MISSING, "virtio-blk, virtio-scsi"),
    (
        "guest-not-a-table",
        variant(("guest", ...)).replace('name = "t"', 'name = "t"\nguest = 5'),
        None,
        "guest",
        5,
        "a [guest] table with keys: hypervisor, xen_type, vcpus, memory_mib",
    ),
    ("toml-syntax-error", variant().replace("vcpus = 1", "vcpus 1"), None, "line 6", "vcpus 1", "TOML"),
    (
        "network-volume-without-scheme",
        variant(("disk.backing", "network-volume"), ("disk.volume", "e0.1")),
        None,
        "disk.volume",
        "e0.1",
        "aoe:<target>, iscsi:<target>, nbd:<target>, nfs:<target>, nvme-tcp:<target>",
    ),
    (
        "network-volume-unknown-scheme",
        variant(("disk.backing", "network-volume"), ("disk.volume", "rbd:pool/x")),
        None,
        "disk.volume",
        "rbd:pool/x",
        "aoe:<target>",
    ),
    (
        "block-device-relative-path",
        variant(("disk.backing", "block-device"), ("disk.volume", "sdb")),
        None,
        "disk.volume",
        "sdb",
        "absolute /dev/ path",
    ),
    (
        "block-device-escaping-dev",
        variant(("disk.backing", "block-device"), ("disk.volume", "/dev/../etc/x")),
        None,
        "disk.volume",
        "/dev/../etc/x",
        "absolute /dev/ path",
    ),
    (
        "volume-on-a-file-backing",
        variant(("disk.volume", "/dev/sdb")),
        None,
        "disk.volume",
        "/dev/sdb",
        "empty",
    ),
    ("raid-over-one-disk", variant(("disk.raid", "0")), None, "disk.raid", "0", "0 needs disk.count 2..8"),
    ("several-disks-without-raid", variant(("disk.count", 3)), None, "disk.count", 3, "2..8 needs disk.raid = 0"),
    ("chunk-without-raid", variant(("disk.chunk_kib", 64)), None, "disk.chunk_kib", 64,
     "0 (with disk.raid = none)"),
    ("chunk-not-a-power-of-two", variant(("disk.count", 2), ("disk.raid", "0"), ("disk.chunk_kib", 48)), None,
     "disk.chunk_kib", 48, "a power of two 4..1024"),
    ("chunk-too-big", variant(("disk.count", 2), ("disk.raid", "0"), ("disk.chunk_kib", 2048)), None,
     "disk.chunk_kib", 2048, "a power of two 4..1024"),
    ("chunk-too-small", variant(("disk.count", 2), ("disk.raid", "0"), ("disk.chunk_kib", 2)), None,
     "disk.chunk_kib", 2, "a power of two 4..1024"),
    ("attach-a-file", variant(("disk.attach", "qemu")), None, "disk.attach", "qemu", "host (with disk.backing ="),
    ("attach-unknown", variant(("disk.attach", "iscsiadm")), None, "disk.attach", "iscsiadm", "host, guest, qemu"),
    ("attach-aoe-by-qemu", variant(("disk.backing", "network-volume"), ("disk.volume", "aoe:e0.1"),
                                   ("disk.attach", "qemu")), None, "disk.attach", "qemu",
     "host, guest (with disk.volume = 'aoe:e0.1'); qemu needs nbd:<target> or iscsi:<target>"),
    ("attach-nvme-tcp-by-qemu", variant(("disk.backing", "network-volume"), ("disk.volume", "nvme-tcp:nqn.x"),
                                        ("disk.attach", "qemu")), None, "disk.attach", "qemu", "host, guest"),
    ("too-many-disks", variant(("disk.count", 9), ("disk.raid", "0")), None, "disk.count", 9, "1..8"),
    ("no-disk", variant(("disk.count", 0)), None, "disk.count", 0, "1..8"),
    ("raid-level-1", variant(("disk.count", 2), ("disk.raid", "1")), None, "disk.raid", "1", 'none, "0"'),
    ("raid-level-as-a-number", variant(("disk.count", 2), ("disk.raid", 0)), None, "disk.raid", 0, 'none, "0"'),
    ("ide-five-disks", variant(("disk.bus", "ide"), ("disk.count", 5), ("disk.raid", "0")), None, "disk.count", 5,
     "1..4 (with disk.bus = ide)"),
    ("xen-backend-on-kvm", variant(("disk.xen_backend", "qdisk")), None, "disk.xen_backend", "qdisk",
     "auto (with guest.hypervisor = kvm)"),
    ("xen-backend-unknown", variant(("disk.xen_backend", "tap")), None, "disk.xen_backend", "tap",
     "auto, phy, qdisk"),
    ("xen-phy-on-a-file", XEN_PV_FILE + 'xen_backend = "phy"\n', None, "disk.xen_backend", "phy",
     "qdisk, auto (with disk.backing = prealloc-file); phy needs backing block-device or network-volume"),
    ("xen-qdisk-cache-none", XEN_PV_FILE.replace('"writeback"', '"none"') + 'xen_backend = "qdisk"\n', None,
     "disk.cache", "none", "writeback (with guest.hypervisor = xen, disk.bus = xen-vbd, disk.backing = "
     "prealloc-file, disk.xen_backend = qdisk)"),
    ("several-disks-on-one-volume", variant(("disk.backing", "block-device"), ("disk.volume", "/dev/sdb"),
                                            ("disk.count", 2), ("disk.raid", "0")), None, "disk.count", 2,
     "1 (with disk.volume = '/dev/sdb')"),
]


@pytest.mark.parametrize(
    ("text", "expect_name", "key", "value", "allowed"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID]
)
def test_invalid_profile(text, expect_name, key, value, allowed):
    with pytest.raises(ProfileError) as exc_info:
        parse_profile(text, "bad/t.toml", expect_name=expect_name)
    err = exc_info.value
    by_key = {p.key: p for p in err.problems}
    assert key in by_key, f"no problem for {key}: {err}"
    problem = by_key[key]
    assert problem.value == value and type(problem.value) is type(value)
    assert problem.allowed and allowed in problem.allowed
    text_of_err = str(err)
    assert text_of_err.startswith("bad/t.toml: invalid profile")
    assert f"{key}: " in text_of_err
    assert value is None or shown(value) in text_of_err
    assert "got None" not in text_of_err and "True" not in text_of_err
    assert allowed in text_of_err


def test_xen_backend_keeps_kvm_hashes_and_decides_xen_cache():
    assert parse_profile(variant(("disk.xen_backend", "auto"))).hash == parse_profile(variant()).hash
    assert "xen_backend" not in parse_profile(variant()).canonical_json()
    file_auto = parse_profile(XEN_PV_FILE)
    assert knobs.xen_backend(file_auto.disk) == "qdisk" and "backend qdisk (QEMU in dom0)" in file_auto.describe()
    qdisk_dev = parse_profile(XEN_PV_FILE.replace('"prealloc-file"', '"block-device"') + 'xen_backend = "qdisk"\n')
    assert knobs.xen_backend(qdisk_dev.disk) == "qdisk" and qdisk_dev.disk.cache == "writeback"
    phy = profiles.find_profile("xen-xvd-phy")
    assert (phy.disk.xen_backend, phy.disk.cache) == ("phy", "none") and "blkback (phy)" in phy.describe()
    # Study A's XVD row on a file instead of a whole disk: one knob pair apart from xen-xvd-phy
    assert diff_profiles(phy, profiles.find_profile("xen-xvd-file")) == [
        ("disk.cache", "none", "writeback"), ("disk.backing", "block-device", "prealloc-file"),
        ("disk.xen_backend", "phy", "qdisk")]


def test_attach_host_keeps_the_hash_and_qemu_attaches_nbd():
    assert parse_profile(variant(("disk.attach", "host"))).hash == parse_profile(variant()).hash
    p = parse_profile(variant(("disk.backing", "network-volume"), ("disk.volume", "nbd:ebs"), ("disk.attach", "qemu")))
    assert p.disk.attach == "qemu" and "attached by QEMU's own initiator" in p.describe()


def test_at_least_twenty_invalid_cases():
    assert len(INVALID) >= 20


def test_all_problems_reported_at_once():
    text = variant(("guest.vcpus", 0), ("disk.cache", "fast"), ("network.mtu", 1))
    with pytest.raises(ProfileError) as exc_info:
        parse_profile(text)
    assert {p.key for p in exc_info.value.problems} == {"guest.vcpus", "disk.cache", "network.mtu"}


def test_load_profile_names_file_and_checks_stem(tmp_path):
    f = tmp_path / "mine.toml"
    f.write_text(variant(("name", "yours")))
    with pytest.raises(ProfileError) as exc_info:
        load_profile(f)
    assert str(f) in str(exc_info.value)
    assert exc_info.value.problems[0].key == "name"
    f.write_text(variant(("name", "mine")))
    assert load_profile(f).name == "mine"


def test_a_file_rewritten_at_once_is_read_again(tmp_path):
    # Loads are kept by text, not by timestamp: a rewrite within one clock tick is still seen.
    f = tmp_path / "mine.toml"
    f.write_text(variant(("name", "mine"), ("disk.cache", "none")))
    first = load_profile(f)
    f.write_text(variant(("name", "mine"), ("disk.cache", "unsafe")))
    assert (first.disk.cache, load_profile(f).disk.cache) == ("none", "unsafe")
    assert load_profile(f) is load_profile(f)  # unchanged text: parsed once
    f.write_text(variant(("name", "mine"), ("disk.cache", "bogus")))
    with pytest.raises(ProfileError):
        load_profile(f)


def test_syntax_error_names_file_and_line(tmp_path):
    f = tmp_path / "t.toml"
    f.write_text('name = "t"\ndescription = "x"\n[guest\n')
    with pytest.raises(ProfileError) as exc_info:
        load_profile(f)
    assert str(exc_info.value).startswith(f"{f}: invalid profile")
    assert "line 3" in str(exc_info.value)


def test_missing_file_is_not_found(tmp_path):
    with pytest.raises(NotFound):
        load_profile(tmp_path / "nope.toml")


def test_defaults_fill_optional_knobs():
    text = toml_of(
        {
            "name": "t",
            "description": "minimal",
            "guest": {"hypervisor": "kvm"},
            "disk": {"bus": "virtio-blk", "cache": "none", "backing": "qcow2"},
            "network": {"model": "e1000"},
        }
    )
    prof = parse_profile(text)
    assert prof.guest.vcpus == 1 and prof.guest.memory_mib == 1024
    assert (prof.disk.io, prof.disk.iothreads, prof.disk.queues, prof.disk.format, prof.disk.volume) == (
        "threads",
        0,
        1,
        "qcow2",
        "",
    )
    assert (prof.network.vhost, prof.network.queues, prof.network.mtu) == (False, 1, 1500)
    assert prof.reproduces is None


def test_models_are_strict_in_python_too():
    with pytest.raises(Exception):  # noqa: B017 - pydantic's ValidationError
        Profile.model_validate({**BASE, "guest": {"hypervisor": "kvm", "vcpus": "1"}})


# -- canonical forms -----------------------------------------------------------------------------


def test_hash_is_stable_across_layout_and_comments():
    a = parse_profile(variant())
    shuffled = (
        '# a comment\n[network]\nmtu = 1500\nmodel = "virtio"\n\n'
        '[disk]\nformat = "raw"\nbacking = "sparse-file"\nbus = "virtio-blk"\ncache = "writethrough"\n\n'
        '[guest]\nmemory_mib = 1024\nhypervisor = "kvm"\n'
    )
    b = parse_profile('description = "a test profile"\nname = "t"\n' + shuffled)
    assert a == b and a.hash == b.hash


def test_hash_golden_value():
    # The hash identifies a configuration in stored results: it must not drift silently. It is the
    # sha256 of json.dumps(model_dump(mode="json"), sort_keys=True, separators=(",", ":")).
    prof = parse_profile(variant())
    assert prof.hash == "574072a5af512125a1dbd89d3e2ec5f2adc2748fe07ed454713bfcb2157c3e60"
    assert len(prof.hash) == 64


def test_raid_knobs_default_and_keep_old_hashes():
    single = parse_profile(variant())
    assert (single.disk.count, single.disk.raid, single.disk.chunk_kib) == (1, "none", 0)
    # the knobs at their neutral values leave a profile's hash as it was before they existed
    explicit = parse_profile(variant(("disk.count", 1), ("disk.raid", "none"), ("disk.chunk_kib", 0)))
    assert explicit.hash == single.hash == "574072a5af512125a1dbd89d3e2ec5f2adc2748fe07ed454713bfcb2157c3e60"
    raid = parse_profile(variant(("disk.count", 3), ("disk.raid", "0")))
    assert raid.disk.chunk_kib == 512  # mdadm's default, written into the profile
    assert raid == parse_profile(variant(("disk.count", 3), ("disk.raid", "0"), ("disk.chunk_kib", 0)))
    assert raid.hash != single.hash
    assert parse_profile(variant(("disk.count", 3), ("disk.raid", "0"), ("disk.chunk_kib", 64))).hash != raid.hash
    assert parse_profile(variant(("disk.count", 2), ("disk.raid", "0"))).hash != raid.hash
    assert parse_profile(raid.to_toml()) == raid
    assert "RAID 0 (512 KiB chunks) over 3 disks" in raid.describe()


def test_raid_preset():
    p = profiles.find_profile("virtio-raid0")
    assert (p.disk.bus, p.disk.count, p.disk.raid, p.disk.chunk_kib) == ("virtio-blk", 3, "0", 64)
    assert [k for k, _, _ in diff_profiles(profiles.find_profile("virtio-file"), p)] == [
        "disk.count", "disk.raid", "disk.chunk_kib"]


def test_hash_changes_with_any_knob():
    base = parse_profile(variant())
    assert parse_profile(variant(("network.mtu", 9000))).hash != base.hash
    assert parse_profile(variant(("disk.cache", "none"))).hash != base.hash


def test_knobs_are_flat_and_ordered():
    knobs = parse_profile(variant()).knobs()
    assert list(knobs) == [
        "guest.hypervisor",
        "guest.vcpus",
        "guest.memory_mib",
        "disk.bus",
        "disk.cache",
        "disk.io",
        "disk.iothreads",
        "disk.queues",
        "disk.backing",
        "disk.format",
        "disk.volume",
        "disk.count",
        "disk.raid",
        "disk.raid_on",
        "disk.chunk_kib",
        "disk.attach",
        "disk.xen_backend",
        "network.model",
        "network.vhost",
        "network.queues",
        "network.mtu",
        "network.attach",
    ]
    assert knobs["disk.cache"] == "writethrough"


def test_to_toml_escapes_strings():
    prof = parse_profile(variant(("description", 'quotes " and \\ back, ünïcode')))
    assert parse_profile(prof.to_toml()) == prof


def test_diff_profiles():
    a = profiles.find_profile("eucalyptus-default")
    b = profiles.find_profile("eucalyptus-prealloc")
    assert diff_profiles(a, b) == [("disk.backing", "sparse-file", "prealloc-file")]
    assert diff_profiles(a, a) == []
    rows = dict((k, (x, y)) for k, x, y in diff_profiles(a, profiles.find_profile("modern-tuned")))
    assert rows["disk.bus"] == ("scsi-lsi", "virtio-blk")
    assert rows["network.mtu"] == (1500, 9000)
    assert "guest.hypervisor" not in rows


def test_describe_is_one_line():
    d = profiles.find_profile("modern-tuned").describe()
    assert "\n" not in d
    assert "virtio-blk" in d and "io_uring" in d and "MTU 9000" in d


# -- lookup and saving ---------------------------------------------------------------------------


def test_find_profile_not_found_lists_known_names():
    with pytest.raises(NotFound) as exc_info:
        profiles.find_profile("no-such-profile")
    msg = str(exc_info.value)
    assert "no-such-profile" in msg and "eucalyptus-default" in msg and "modern-tuned" in msg


def test_find_profile_refuses_path_tricks():
    with pytest.raises(NotFound):
        profiles.find_profile("../profiles/eucalyptus-default")


def test_save_user_profile_refuses_preset_names():
    preset = profiles.find_profile("eucalyptus-default")
    with pytest.raises(ProfileError) as exc_info:
        profiles.save_user_profile(preset)
    problem = exc_info.value.problems[0]
    assert problem.key == "name" and problem.value == "eucalyptus-default"
    assert "preset" in str(exc_info.value)
    assert not (paths.user_profiles_dir() / "eucalyptus-default.toml").exists()


def test_save_user_profile_writes_and_is_found(tmp_path):
    mine = profiles.find_profile("eucalyptus-default").model_copy(update={"name": "my-euca"})
    path = profiles.save_user_profile(mine)
    assert path == tmp_path / "state" / "profiles" / "my-euca.toml"
    assert profiles.load_profile(path) == mine
    assert profiles.find_profile("my-euca").hash == mine.hash
    entry = {e.name: e for e in profiles.list_profiles()}["my-euca"]
    assert entry.kind == "user" and entry.path == path
    # saving again overwrites the user's own profile
    changed = mine.model_copy(update={"description": "changed"})
    profiles.save_user_profile(changed)
    assert profiles.find_profile("my-euca").description == "changed"


def test_save_user_profile_revalidates():
    prof = profiles.find_profile("eucalyptus-default")
    bad = prof.model_copy(update={"name": "mine", "disk": prof.disk.model_copy(update={"io": "native"})})
    with pytest.raises(ProfileError) as exc_info:
        profiles.save_user_profile(bad)
    assert exc_info.value.problems[0].key == "disk.io"


def test_list_profiles_shows_invalid_user_files():
    d = paths.user_profiles_dir()
    d.mkdir(parents=True)
    (d / "broken.toml").write_text("name = ")
    entry = {e.name: e for e in profiles.list_profiles()}["broken"]
    assert entry.kind == "user" and entry.problem and "line 1" in entry.problem


def test_extra_profile_path_comes_first(tmp_path, monkeypatch):
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "lab.toml").write_text(variant(("name", "lab")))
    monkeypatch.setenv("CLOUDBOX_PROFILE_PATH", str(extra))
    assert profiles.find_profile("lab").name == "lab"
    assert {e.name: e.kind for e in profiles.list_profiles()}["lab"] == "user"


def test_preset_dir_from_the_environment_replaces_the_defaults(tmp_path, monkeypatch):
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    (shipped / "lab.toml").write_text(variant(("name", "lab")))
    monkeypatch.setenv("CLOUDBOX_PRESET_DIR", str(shipped))
    assert paths.preset_dirs() == [shipped]
    entries = {e.name: e for e in profiles.list_profiles()}
    assert set(entries) == {"lab"}  # the checkout's profiles/ is not searched
    assert entries["lab"].kind == "preset" and entries["lab"].path == shipped / "lab.toml"
    monkeypatch.setenv("CLOUDBOX_PRESET_DIR", str(tmp_path / "missing"))
    assert paths.preset_dirs() == []


# -- Xen's guest type (guest.xen_type) ------------------------------------------------------------

def _xen_typed(xen_type: str, bus: str = "xen-vbd", model: str = "xen-netfront", hypervisor: str = "xen") -> str:
    cache = "writeback"
    text = XEN_PV_FILE.replace('hypervisor = "xen"', f'hypervisor = "{hypervisor}"\nxen_type = "{xen_type}"')
    return text.replace('"xen-vbd"', f'"{bus}"').replace('"xen-netfront"', f'"{model}"').replace(
        'cache = "writeback"', f'cache = "{cache}"')


@pytest.mark.parametrize(("xen_type", "bus", "model", "key", "allowed"), [
    ("pvh", "xen-vbd", "xen-netfront", "guest.xen_type", "auto (with guest.hypervisor = kvm)"),  # on KVM below
    ("pvh", "ide", "e1000", "disk.bus", "xen-vbd (with guest.xen_type = pvh)"),
    ("pv", "scsi-lsi", "e1000", "disk.bus", "xen-vbd (with guest.xen_type = pv)"),
    ("pvh", "xen-vbd", "e1000", "network.model", "xen-netfront (with guest.xen_type = pvh)"),
    ("pvh", "xen-vbd", "rtl8139", "network.model", "xen-netfront (with guest.xen_type = pvh)"),
    ("hvm", "xen-vbd", "xen-netfront", "guest.xen_type", "auto, pv, pvh (with disk.bus = xen-vbd)"),
    ("pvhh", "xen-vbd", "xen-netfront", "guest.xen_type", "auto, pv, pvh, hvm"),
])
def test_xen_type_refusals_name_the_key_and_allowed_values(xen_type, bus, model, key, allowed):
    text = _xen_typed(xen_type, bus, model)
    if allowed.endswith("guest.hypervisor = kvm)"):
        text = _xen_typed(xen_type, "virtio-blk", "virtio", hypervisor="kvm").replace(
            'cache = "writeback"', 'cache = "none"')
    with pytest.raises(ProfileError) as exc_info:
        parse_profile(text, "bad/t.toml")
    by_key = {p.key: p for p in exc_info.value.problems}
    assert key in by_key, str(exc_info.value)
    assert allowed in (by_key[key].allowed or ""), str(exc_info.value)


def test_xen_type_auto_follows_the_bus_and_keeps_hashes():
    pvh = profiles.find_profile("xen-pvh-phy")
    assert profiles.xen_guest_type(pvh) == "pvh" and pvh.describe().startswith("XEN PVH, ")
    # the PVH preset is xen-xvd-phy with only the guest type changed
    assert diff_profiles(profiles.find_profile("xen-xvd-phy"), pvh) == [("guest.xen_type", "auto", "pvh")]
    assert [profiles.xen_guest_type(profiles.find_profile(n)) for n in ("xen-xvd-phy", "xen-xvd-file",
                                                                         "xen-default", "virtio-disk")] == [
        "pv", "pv", "hvm", ""]
    for name in profiles.preset_names():
        p = profiles.find_profile(name)
        assert "xen_type" not in p.canonical_json() or p.guest.xen_type == "pvh"  # auto is not hashed
        if p.guest.hypervisor == "xen":
            stated = p.model_copy(update={"guest": p.guest.model_copy(update={"xen_type":
                                                                                profiles.xen_guest_type(p)})})
            assert stated.hash == p.hash  # the type the bus implies, stated, is the same guest
            assert 'xen_type = "' in p.to_toml() and parse_profile(p.to_toml()) == p
        else:
            assert "xen_type" not in p.to_toml() and "guest.xen_type" not in p.knobs()
    pv_stated = parse_profile(_xen_typed("pv"))
    assert pv_stated.hash == parse_profile(XEN_PV_FILE).hash and pv_stated.describe().startswith("XEN PV, ")
    entries = {e.name: e for e in profiles.list_profiles()}
    assert (entries["xen-pvh-phy"].xen_type, entries["xen-default"].xen_type, entries["virtio-disk"].xen_type) == (
        "pvh", "hvm", "")
