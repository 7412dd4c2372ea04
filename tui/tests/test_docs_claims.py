"""The docs held against the code: every passage of README.md and docs/*.md that says something is not there yet is
listed here with the check that shows it still is not (a refusal, an absent option, test or value), so building it
breaks this test until the doc changes; every `cloudbox ...` command line the README quotes parses (its subcommand,
options, profile and study exist); the README's example result is a verbatim part of the example report it links.
All cheap: no guest, no root, the CLI's own parser."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import typing
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

# A passage says something is missing when it has "not ... yet" / "no ... yet" / "cannot ... yet" within one clause,
# or lies under a heading "Not yet".
_YET = re.compile(r"\b(?:not|no|cannot)\b[^.;:()]*?\byet\b", re.I)
# Passages with "yet" that promise nothing missing (their key, a substring of the passage).
BENIGN = (
    "the rows not stored yet",  # README: study run measures what is not stored yet
    "No lease yet",  # cluster.md: the back-end waiting for DHCP
    "when no image is there yet",  # image.md: the build script
    "the disk carries no table yet",  # install.md: a cut install starting again
    "what cloudbox cannot run yet",  # studies.md's introduction, pointing at its lists
    "a profile cloudbox cannot run yet",  # studies.md: why a verdict is inconclusive
    "This is the first part of `cloudbox study`. Not there yet:",  # studies.md: the lead-in of its list
)


def _passages(text: str) -> list[tuple[str, bool]]:
    """(passage, under a "Not yet" heading) for each bullet and paragraph outside code blocks, whitespace joined."""
    out: list[tuple[str, bool]] = []
    cur: list[str] = []
    under = False
    fenced = False

    def flush() -> None:
        if cur:
            out.append((" ".join(" ".join(cur).split()), under))
            cur.clear()

    for line in text.splitlines():
        if line.startswith("```"):
            flush()
            fenced = not fenced
            continue
        if fenced:
            continue
        if line.startswith("#"):
            flush()
            under = bool(re.match(r"#+ Not yet\s*$", line))
            continue
        if not line.strip() or re.match(r"\s*[-*] |\s*\d+\. |\|", line):
            flush()
        if line.strip():
            cur.append(line.strip())
    flush()
    return out


def claim_passages() -> list[tuple[str, str]]:
    """(file relative to the repository, passage) for each passage that says something is not there yet."""
    found = []
    for path in DOCS:
        for passage, under in _passages(path.read_text()):
            if (under and passage.startswith(("- ", "* "))) or (_YET.search(passage)
                                                               and not any(b in passage for b in BENIGN)):
                found.append((str(path.relative_to(REPO)), passage))
    return found


# ------------------------------------------------------------------------------------------------------- the checks
def _refuses(fn: Callable[[], object], *words: str) -> None:
    """`fn` raises, and its message has every one of `words`."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - any refusal will do; its words tell which
        missing = [w for w in words if w not in str(e)]
        assert not missing, f"refused, but without {missing}: {e}"
        return
    raise AssertionError("accepted: it is built now, so the doc's sentence is no longer true")


def _no_test_named(*words: str) -> None:
    """No storage or network test, set or tool of the catalogue is named with any of `words`."""
    from cloudbox.core.spec import catalogue
    from cloudbox.core.studies.schema import known_tests

    names = " ".join([*known_tests(), *catalogue.TEST_SETS, *catalogue.NET_TESTS,
                      *(t.tool for t in catalogue.TESTS.values())]).lower()
    assert not [w for w in words if w in names], f"the catalogue has a test named {words}"


def _no_profile_named(*words: str) -> None:
    from cloudbox.core.spec.profiles import preset_names

    assert not [p for p in preset_names() if any(w in p for w in words)], f"a preset is named with {words}"


def _xen_hvm_needs_hardware() -> None:
    from cloudbox.core.virt.accel import xen_type_refusal

    assert xen_type_refusal("xen-default", "hvm", False), "an HVM guest is accepted on a Xen without VT-x/AMD-V"


def _propagation_on_one_host() -> None:
    from cloudbox.core.spec.runspec import PROPAGATION, RunSpec

    spec = RunSpec(profile="virtio-file", suite=PROPAGATION, node="be1", propagate=[64 * 1024 * 1024])
    _refuses(spec.validate, "not implemented yet")


def _jobs_not_across_places() -> None:
    from cloudbox.core.spec.runspec import RunSpec

    for tests in ("mpi", "fio-cs"):
        spec = RunSpec(profile="nfs-async-tcp", suite="storage", node="local,be1", guests=2, storage_tests=tests)
        _refuses(spec.validate, "not supported yet")


def _spread_network_to_own_host() -> None:
    """A spread run's parts are given no network server but their own place's (the NFS export's host aside)."""
    src = (REPO / "tui/src/cloudbox/core/run/spread.py").read_text()
    assert "peer_iperf3_ports" not in src and "peer_host" not in src, "a spread run now names a network server"


def _nfs_v4_tcp_only() -> None:
    from cloudbox.core.spec import knobs
    from cloudbox.core.spec.profiles import parse_profile

    assert "3" not in typing.get_args(knobs.NfsVersion), "nfs.vers takes NFSv3 now"
    text = (REPO / "profiles/nfs-async-tcp.toml").read_text().replace('proto = "tcp"', 'proto = "udp"')
    assert 'proto = "udp"' in text, "profiles/nfs-async-tcp.toml names no nfs.proto to change"
    _refuses(lambda: parse_profile(text, expect_name=None), "nfs.proto")


def _nfs_baseline_without_nfs_on_one_box() -> None:
    from cloudbox.core.spec.schemes import SCHEMES

    assert "without NFS" in SCHEMES["nfs"].baseline, SCHEMES["nfs"].baseline


def _guest_attach_kvm_only() -> None:
    from cloudbox.core.disks.volumes.attach import check_attach

    for scheme in ("nfs", "nbd"):
        _refuses(lambda s=scheme: check_attach(s, "guest", hypervisor="xen"), "KVM/QEMU only")


def _iscsi_served_by_tgtd() -> None:
    from cloudbox.core.spec.schemes import SCHEMES

    assert SCHEMES["iscsi"].server == "tgtd" and "lio" not in repr(SCHEMES).lower(), SCHEMES["iscsi"]


def _qemu_attach_not_on_a_back_end() -> None:
    from cloudbox.core.disks.volumes import attach

    rv = SimpleNamespace(scheme="nbd", uri="nbd://192.0.2.1/ebs")
    _refuses(lambda: attach._for_remote_block("nbd:ebs", "qemu", rv, "r", Path("/nonexistent"), 1, "kvm"),
             "not supported")


def _volume_list_this_box_only() -> None:
    options = _options("volume", "list")
    assert not {"--node", "--all"} & options, f"cloudbox volume list takes {options}"


def _bonnie_untimed_on_bare_metal() -> None:
    from cloudbox.core.bench.bonnie import bonnie_args, parse_bonnie

    assert "-D" not in bonnie_args("/mnt", 64 * 1024 * 1024), "Bonnie++ runs with O_DIRECT (-D) now"
    raw = (REPO / "tui/tests/data/bonnie-host-96m.txt").read_text()
    assert parse_bonnie("bonnie", raw).extra["creates/s"] is None, "an untimed (+++++) file phase has a figure"


def _no_cloud_manager() -> None:
    src = REPO / "tui/src/cloudbox"
    names = [p for p in src.rglob("*.py") if re.search(r"nebula|nimbus|eucalyptus|openstack", p.name)]
    assert not names, f"modules driving a cloud manager: {names}"
    _no_test_named("gridftp", "scp")


def _raid0_not_over_volumes() -> None:
    from cloudbox.core.spec.profiles import parse_profile

    text = (REPO / "profiles/kvm-ebs-nbd.toml").read_text()
    text = re.sub(r"(?m)^\[disk\]$", "[disk]\ncount = 3", text, count=1)
    _refuses(lambda: parse_profile(text), "disk.count")


def _repeats_not_of_many_guests_nor_volumes() -> None:
    """--repeats is refused with --guests N, and for a profile whose disk is a network volume."""
    from cloudbox.core.run.repeated import repeat_problem
    from cloudbox.core.spec.profiles import resolve_profile
    from cloudbox.core.spec.runspec import RunSpec

    _refuses(RunSpec(profile="virtio-disk", suite="storage", repeats=3, guests=2).validate, "not supported yet")
    assert "cannot take turns" in repeat_problem(resolve_profile("kvm-ebs-nbd")), "a network volume is repeated"


def _reports_take_study_and_quick() -> None:
    from cloudbox.cli import build_parser

    report = _subparser(build_parser(), "study", "report")
    size = next(a for a in report._actions if "--size" in a.option_strings)
    assert set(size.choices or ()) == {"study", "quick"}, size.choices


def _presets() -> list:
    from cloudbox.core.spec.profiles import find_profile, preset_names

    return [find_profile(n) for n in preset_names()]


def _no_xen_scsi_preset(backing: str) -> None:
    """No Xen preset gives its guest emulated SCSI on `backing` (Table 1's and 2's Xen SCSI rows but the default)."""
    found = [p.name for p in _presets() if p.guest.hypervisor == "xen" and p.disk.bus.startswith("scsi")
             and p.disk.backing == backing]
    assert not found, f"Xen presets with emulated SCSI on {backing}: {found}"


def _no_xen_tap() -> None:
    """Xen's disk backends are blkback (phy) and qdisk: no blktap (tap) to give a preset."""
    from cloudbox.core.spec import knobs

    assert "tap" not in typing.get_args(knobs.XenBackend), knobs.XenBackend


def _no_small_dd() -> None:
    """Every dd test writes or reads 64 kB blocks or larger: none at the sparse file's 7.5 kB or 15 kB."""
    from cloudbox.core.spec import catalogue

    small = [t.id for t in catalogue.TESTS.values() if t.tool == "dd" and t.bs.endswith("k") and int(t.bs[:-1]) < 64]
    assert not small, f"dd tests with small blocks: {small}"


def _no_rule_across_baselines() -> None:
    """A rule divides a cell by its own run's bare metal or by another cell's guest figure: no rule kind sets two
    runs' baselines against each other."""
    from cloudbox.core.studies.schema import Rule

    assert not [f for f in Rule.model_fields if "baseline" in f], sorted(Rule.model_fields)


def _no_rule_over_spread_or_fit() -> None:
    """A rule reads a cell's number, a host metric or a stored figure: not a series' CV nor the sweep's line."""
    from cloudbox.core.studies.schema import Rule

    metrics = typing.get_args(Rule.model_fields["metric"].annotation)
    assert set(metrics) == {"value", "avgrq", "avgqu", "util"}, metrics


def _no_rule_reads_bonnie_cpu() -> None:
    from cloudbox.core.studies.loading import find_study, list_studies

    found = [r.id for e in list_studies() for r in find_study(e.name).rules if r.figure and "%CPU" in r.figure]
    assert not found, f"rules reading Bonnie++'s %CPU: {found}"


def _raid_members_on_one_disk() -> None:
    """A RAID's members are the profile's own backing stores (disk.count of one kind): no key names a member
    device or volume of its own."""
    from cloudbox.core.spec import knobs

    assert not [f for f in knobs.Disk.model_fields if f in ("devices", "members", "volumes")], knobs.Disk.model_fields
    _raid0_not_over_volumes()


def _nfs_export_not_on_a_volume() -> None:
    """The [nfs] table has no key for where the export lives: it is a file of the host's, never a network volume."""
    from cloudbox.core.spec import knobs

    assert not [f for f in knobs.Nfs.model_fields if "volume" in f or "backing" in f], knobs.Nfs.model_fields


def _no_prealloc_timing() -> None:
    _no_test_named("allocate", "prealloc")


def _series_not_on_a_volume() -> None:
    """A run of several guests (a series' repeat) refuses a network volume, which gives one guest a store."""
    from cloudbox.core.run.multi import check_fits
    from cloudbox.core.spec.profiles import find_profile
    from cloudbox.core.spec.runspec import RunSpec

    spec = RunSpec(profile="kvm-ebs-aoe", suite="storage", guests=4)
    _refuses(lambda: check_fits(spec, find_profile("kvm-ebs-aoe")), "one volume for one guest")


def _study_c_no_btio_nor_mpi_cells() -> None:
    from cloudbox.core.studies.loading import find_study

    _no_test_named("bt-io", "btio")
    assert not [t for t in find_study("c").test_ids if "mpi" in t or "ior" in t], find_study("c").test_ids


# (file, key: a substring of the passage, the check). A passage may hold several claims: one entry each.
def _no_repeats_of_volumes_or_many_guests() -> None:
    from cloudbox.core.run.repeated import repeat_problem
    from cloudbox.core.spec import profiles
    from cloudbox.core.spec.runspec import RunSpec
    for name in ("nfs-async-tcp", "kvm-ebs-aoe"):
        assert repeat_problem(profiles.find_profile(name)), f"{name}'s runs can be repeated now"
    _refuses(lambda: RunSpec(profile="virtio-disk", repeats=3, guests=2).validate(), "--guests 2", "not supported")


CLAIMS: list[tuple[str, str, Callable[[], None]]] = [
    ("docs/studies.md", "Two rows of the table are not yet reachable by repeating",
     _no_repeats_of_volumes_or_many_guests),
    ("docs/studies.md", "repeats of a run on a network volume", _no_repeats_of_volumes_or_many_guests),
    ("docs/nfs.md", "The host domain mounting an export it serves itself", _nfs_baseline_without_nfs_on_one_box),
    ("docs/nfs.md", "NFSv3 (needs rpcbind and mountd", _nfs_v4_tcp_only),
    ("docs/nfs.md", "Xen guests mounting an export", _guest_attach_kvm_only),
    ("docs/parallel.md", "The network tests of a spread run to one server", _spread_network_to_own_host),
    ("docs/parallel.md", "MPI jobs and fio's client/server mode across places", _jobs_not_across_places),
    ("docs/parallel.md", "NFSv3 and NFS over UDP", _nfs_v4_tcp_only),
    ("docs/volumes.md", "The kernel's LIO iSCSI target", _iscsi_served_by_tgtd),
    ("docs/volumes.md", "`disk.attach = qemu` across nodes", _qemu_attach_not_on_a_back_end),
    ("docs/volumes.md", "Another node's volumes", _volume_list_this_box_only),
    ("docs/studies.md", "Not yet: cloudbox's HVM run under nested emulation", _xen_hvm_needs_hardware),
    ("docs/studies.md", "the Hadoop workload", lambda: _no_test_named("hadoop", "mapreduce", "terasort")),
    ("docs/studies.md", "the EC2 rows, which are out of scope", lambda: _no_profile_named("ec2")),
    ("docs/studies.md", "Not yet: the sweep across the network", _propagation_on_one_host),
    ("docs/studies.md", "a cloud manager in the loop", _no_cloud_manager),
    ("docs/studies.md", "Bonnie++'s read and file-phase figures on bare metal", _bonnie_untimed_on_bare_metal),
    ("docs/studies.md", "in study A, the Hadoop job", lambda: _no_test_named("hadoop")),
    ("docs/studies.md", "Bonnie++'s untimed bare-metal figures", _bonnie_untimed_on_bare_metal),
    ("docs/studies.md", "the image-propagation sweep on a back-end", _propagation_on_one_host),
    ("docs/studies.md", "runs of a custom size", _reports_take_study_and_quick),
    ("README.md", "`--repeats N` measures each test N times", _repeats_not_of_many_guests_nor_volumes),
    ("docs/architecture.md", "A repeated run (`--repeats N`", _repeats_not_of_many_guests_nor_volumes),
    ("docs/studies.md", "| 000:300; 003:174 | no preset yet", lambda: _no_xen_scsi_preset("block-device")),
    ("docs/studies.md", "| 000:302 | no preset yet (blktap is gone", _no_xen_tap),
    ("docs/studies.md", "| 000:312; 003:259 | no preset yet", lambda: _no_xen_scsi_preset("network-volume")),
    ("docs/studies.md", "| 000:313 | no preset yet", _no_xen_tap),
    ("docs/studies.md", "| 000:392; 003:200 | no preset yet", lambda: _no_xen_scsi_preset("block-device")),
    ("docs/studies.md", "| 000:393 | no preset yet", _no_xen_tap),
    ("docs/studies.md", "000:402) | no preset yet", lambda: _no_xen_scsi_preset("network-volume")),
    ("docs/studies.md", "| 000:403 | no preset yet", _no_xen_tap),
    ("docs/studies.md", "not measurable yet: no bare-metal dd with small blocks", _no_small_dd),
    ("docs/studies.md", "not measurable yet: it sets two runs' baselines", _no_rule_across_baselines),
    ("docs/studies.md", "no rule yet: it compares two runs' baselines", _no_rule_across_baselines),
    ("docs/studies.md", "a pre-allocated file's creation is not timed yet", _no_prealloc_timing),
    ("docs/studies.md", "no rule yet: it needs a rule over the sweep's fitted line", _no_rule_over_spread_or_fit),
    ("docs/studies.md", "no rule yet: no rule reads Bonnie++'s %CPU", _no_rule_reads_bonnie_cpu),
    ("docs/studies.md", "The doubling itself: not measurable yet", _raid_members_on_one_disk),
    ("docs/studies.md", "For NFS reads, EBS and ephemeral disks tie", _nfs_export_not_on_a_volume),
    ("docs/studies.md", "Ephemeral disks beat EBS volumes with a sync server", _nfs_export_not_on_a_volume),
    ("docs/studies.md", "Not measured yet: RAID 0 over separate devices or network volumes", _raid_members_on_one_disk),
    ("docs/studies.md", "not checked yet: a series of a network-volume row is refused", _series_not_on_a_volume),
    ("docs/studies.md", "a rule over a series' coefficient of variation would check it", _no_rule_over_spread_or_fit),
    ("docs/studies.md", "in study C, BT-IO, IOR's multi-client runs as cells", _study_c_no_btio_nor_mpi_cells),
    ("docs/studies.md", "and RAID 0 over separate devices or network volumes (RAID 0 in",
     _raid_members_on_one_disk),
    ("docs/studies.md", "rules over a series' spread", _no_rule_over_spread_or_fit),
]

# Passages that say something is missing which the code has, or that no cheap check can tell: each with the reason.
# Every one is owed a rewrite of its passage (docs/studies.md is being rewritten beside this list); an entry whose
# passage is gone fails test_every_listed_claim_is_still_in_its_doc until it is removed.
KNOWN_FALSE: list[tuple[str, str, str]] = [
    ("docs/studies.md", "Not yet: a study run whose guests are spread over several nodes",
     "`study run --node local,be1 --guests N` is offered by the parser; whether the series runs spread needs an "
     "enrolled back-end to tell"),
]


def _key_in(passage: str, key: str) -> bool:
    return " ".join(key.split()) in passage


def test_every_not_yet_passage_is_listed_with_its_check():
    listed = [(f, k) for f, k, _ in CLAIMS] + [(f, k) for f, k, _ in KNOWN_FALSE]
    unlisted = [f"{f}: {p[:160]}" for f, p in claim_passages()
                if not any(lf == f and _key_in(p, k) for lf, k in listed)]
    assert not unlisted, ("passages saying something is not there yet, with no check in tui/tests/test_docs_claims.py "
                          "(add one to CLAIMS):\n" + "\n".join(unlisted))


def test_every_listed_claim_is_still_in_its_doc():
    passages = claim_passages()
    gone = [f"{f}: {k}" for f, k, _ in [*CLAIMS, *KNOWN_FALSE]
            if not any(pf == f and _key_in(p, k) for pf, p in passages)]
    assert not gone, ("listed passages that are gone or no longer say 'not yet' (remove their entries):\n"
                      + "\n".join(gone))


@pytest.mark.parametrize(("doc", "key", "check"), CLAIMS, ids=[f"{f}:{k[:40]}" for f, k, _ in CLAIMS])
def test_what_the_docs_say_is_not_there_yet_is_not(doc, key, check):
    """Fails once the thing is built: then the doc's passage (and its entry here) must change."""
    check()


# --------------------------------------------------------------------------------------------- the README's commands
def _subparser(parser, *path: str):
    import argparse

    for name in path:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[name]
    return parser


def _options(*path: str) -> set[str]:
    from cloudbox.cli import build_parser

    return {o for a in _subparser(build_parser(), *path)._actions for o in a.option_strings}


# Placeholders the README writes in upper case, and what stands for them when parsing.
_PLACEHOLDERS = {"N": "7", "NAME": "be1", "ID": "7"}


def readme_commands() -> list[str]:
    """Every `cloudbox ...` command line in README.md: the lines of its code blocks and its inline code."""
    text = (REPO / "README.md").read_text()
    lines = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        lines += [ln.split("  #")[0].split(" # ")[0].strip() for ln in block.splitlines()
                  if ln.strip().startswith("cloudbox ")]
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    lines += [" ".join(m.split()) for m in re.findall(r"`(cloudbox [^`]+)`", prose)]
    return sorted({ln for ln in lines if "COMMAND" not in ln})


def test_the_readme_quotes_commands():
    assert len(readme_commands()) > 30, readme_commands()


@pytest.mark.parametrize("line", readme_commands())
def test_each_readme_command_parses(line):
    from cloudbox.cli import build_parser
    from cloudbox.core.spec.profiles import preset_names, split_mix
    from cloudbox.core.studies.loading import list_studies

    argv = [_PLACEHOLDERS.get(w, w) for w in shlex.split(line)[1:]]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.suppress(SystemExit):
        args = build_parser().parse_args(argv)
        if getattr(args, "profile", None):
            unknown = [p for p in split_mix(args.profile) if p not in preset_names()]
            assert not unknown, f"{line}: no preset named {unknown}"
        if args.command == "study" and getattr(args, "name", None):
            assert args.name in [s.name for s in list_studies()], f"{line}: no study named {args.name}"
        return
    pytest.fail(f"{line}: {err.getvalue().strip()}")


def test_the_readme_example_is_part_of_the_report_it_names():
    """The README's example rows, verbatim from the example report: regenerating docs/examples shows here."""
    text = (REPO / "README.md").read_text()
    blocks = re.findall(r"<!-- example: (\S+) -->\n(.*?)<!-- /example -->", text, re.S)
    assert blocks, "README.md has no <!-- example: FILE --> block"
    for name, block in blocks:
        report = (REPO / name).read_text()
        rows = [ln for ln in block.splitlines() if ln.startswith("|")]
        stale = [r for r in rows if r not in report.splitlines()]
        assert rows and not stale, f"README.md's example rows not in {name} (copy them from it again): {stale}"


def test_the_readme_docs_map_names_every_doc():
    text = (REPO / "README.md").read_text()
    missing = [p.name for p in sorted((REPO / "docs").glob("*.md")) if f"(docs/{p.name})" not in text]
    assert not missing, f"README.md's docs map does not link {missing}"


def test_the_architecture_page_names_every_scheme_with_its_attach_modes():
    from cloudbox.core.spec.schemes import SCHEMES

    text = " ".join((REPO / "docs/architecture.md").read_text().split())
    for s in SCHEMES.values():
        m = re.search(rf"`{re.escape(s.name)}:` \(([^)]*)\)", text)
        assert m, f"docs/architecture.md does not name the {s.name}: scheme"
        assert m.group(1).split("; ")[-1].split(", ") == list(s.attach), (m.group(0), s.attach)
