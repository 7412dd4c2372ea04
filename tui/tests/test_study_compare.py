"""`cloudbox study compare`: two measurements of a study side by side, each rule's interval placed against its
threshold, the rules on opposite sides named and the exit status 1 when there are any."""

from __future__ import annotations

import platform
from pathlib import Path

from cloudbox.core.record.results import ResultStore
from cloudbox.core.spec import profiles
from cloudbox.core.studies import agreement, evidence, loading

T0 = 1_700_000_000.0


def write_db(path: Path, cells: dict[str, tuple[list[float], list[float]]], *, accelerator: str = "tcg") -> Path:
    """A results database with one completed quick run per profile: dd-write-64k's guest and bare-metal samples."""
    with ResultStore(path) as store:
        for i, (profile, (guest, base)) in enumerate(cells.items()):
            prof = profiles.find_profile(profile)
            rid = store.create_run(profile_name=profile, profile_hash=prof.hash, profile_toml=prof.to_toml(),
                                   suite="storage", size_label="quick", accelerator=accelerator,
                                   started_at=T0 + i, node=platform.node())
            for g, b in zip(guest, base, strict=True):  # ABAB, as a repeated run stores them
                store.add_measurement(rid, side="baseline", test="dd-write-64k", metric="MB/s", value=b)
                store.add_measurement(rid, side="guest", test="dd-write-64k", metric="MB/s", value=g)
            store.finish_run(rid, "completed")
    return path


SCSI = [100.0, 101.0, 99.0, 100.5]
FAST = [200.0, 204.0, 198.0, 201.0]  # virtio twice SCSI: A2.disk's interval wholly on the finding's side
SLOW = [50.0, 52.0, 49.0, 51.0]  # half of it: wholly on the other side
NEAR = [90.0, 130.0, 70.0, 150.0]  # spread over both sides of any threshold between 100% and 110%


def test_the_same_measurement_twice_agrees_and_exits_0(tmp_path, cli_run):
    a = write_db(tmp_path / "a.db", {"virtio-disk": (FAST, SCSI), "kvm-scsi-phy": (SCSI, SCSI)})
    b = write_db(tmp_path / "b.db", {"virtio-disk": ([x + 1 for x in FAST], SCSI), "kvm-scsi-phy": (SCSI, SCSI)})
    r = cli_run(["study", "compare", "a", str(a), str(b)])
    assert r.code == 0, r.err
    row = next(line for line in r.out.splitlines() if line.startswith("| A2.disk |"))
    assert row.count(agreement.FINDING_SIDE) == 2 and "same side" in row, row
    assert "on opposite sides: 0" in r.out


def test_opposite_sides_are_named_and_exit_1(tmp_path, cli_run):
    a = write_db(tmp_path / "a.db", {"virtio-disk": (FAST, SCSI), "kvm-scsi-phy": (SCSI, SCSI)})
    b = write_db(tmp_path / "b.db", {"virtio-disk": (SLOW, SCSI), "kvm-scsi-phy": (SCSI, SCSI)})
    r = cli_run(["study", "compare", "a", str(a), str(b)])
    assert r.code == 1
    row = next(line for line in r.out.splitlines() if line.startswith("| A2.disk |"))
    assert agreement.FINDING_SIDE in row and agreement.OTHER_SIDE in row and "OPPOSITE" in row, row
    assert "on opposite sides: 2 (A2.disk, A2.native)" in r.out  # virtio against SCSI, and against native


def test_a_straddling_interval_is_named_not_counted_as_opposite(tmp_path):
    study = loading.find_study("a")
    a = write_db(tmp_path / "a.db", {"virtio-disk": (FAST, SCSI), "kvm-scsi-phy": (SCSI, SCSI)})
    b = write_db(tmp_path / "b.db", {"virtio-disk": (NEAR, SCSI), "kvm-scsi-phy": (SCSI, SCSI)})
    evs = []
    for path in (a, b):
        with ResultStore(path) as store:
            evs.append(evidence.gather(study, store.list_runs()))
    pairs = {p.rule_id: p for p in agreement.pair(*evs)}
    p = pairs["A2.disk"]
    assert p.positions == (agreement.FINDING_SIDE, agreement.ACROSS)
    assert p.straddles and not p.opposite and not p.agrees
    text = "\n".join(agreement.lines(list(pairs.values())))
    assert "A2.disk" in text.split("across the threshold in one or both")[1].splitlines()[0]
    # every verdict stays inconclusive (TCG, quick): the positions set that aside, the verdicts do not
    assert {v.status for v in evs[0].verdicts} == {"inconclusive"}


def test_one_sample_a_side_has_no_interval_to_place(tmp_path):
    study = loading.find_study("a")
    a = write_db(tmp_path / "a.db", {"virtio-disk": ([200.0], [100.0]), "kvm-scsi-phy": ([100.0], [100.0])})
    with ResultStore(a) as store:
        ev = evidence.gather(study, store.list_runs())
    p = {p.rule_id: p for p in agreement.pair(ev, ev)}["A2.disk"]
    assert p.positions == (agreement.NO_INTERVAL, agreement.NO_INTERVAL) and not p.agrees and not p.opposite


def test_a_missing_database_is_refused_naming_it(tmp_path, cli_run):
    a = write_db(tmp_path / "a.db", {"virtio-disk": (FAST, SCSI)})
    r = cli_run(["study", "compare", "a", str(a), str(tmp_path / "nope.db")])
    assert r.code == 2 and "nope.db: no such results database" in r.err
    assert not (tmp_path / "nope.db").exists()
