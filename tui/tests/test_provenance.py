"""A run's provenance (core.record.provenance): one typed record, written whole, read back from this and older releases.

data/provenance-2026-11.db holds runs recorded by the writers of the release before the record was typed (commit
8d3dedd): run 1 on this host, its guest network stalled once; runs 2 and 3 on back-end be1 with network tests,
their private network under "network" (as stored before it had its own key) and under "private_network"; run 4
failed before its profile resolved, holding its controller only.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from cloudbox.core.record.provenance import (
    BackingInfo,
    Controller,
    DiskStall,
    NicStall,
    Nodes,
    PeerServers,
    PrivateNetwork,
    Propagation,
    Provenance,
    RemoteRun,
    Versions,
)
from cloudbox.core.record.results import ResultStore
from cloudbox.core.record.rows import Run
from cloudbox.core.spec.runspec import RunSpec
from cloudbox.core.views import compare, labels
from cloudbox.core.virt.accel import Accelerator

FIXTURE = Path(__file__).parent / "data" / "provenance-2026-11.db"


@pytest.fixture
def old_runs(tmp_path: Path) -> dict[int, Run]:
    db = tmp_path / "results.db"
    shutil.copy(FIXTURE, db)  # opening it sets WAL mode: never on the committed file
    with ResultStore(db) as store:
        return {rid: store.get_run(rid) for rid in store.run_ids()}


def _stored(run_id: int) -> dict:
    with sqlite3.connect(f"file:{FIXTURE}?mode=ro", uri=True) as c:
        return json.loads(c.execute("SELECT provenance FROM runs WHERE id = ?", (run_id,)).fetchone()[0])


def test_a_local_run_of_the_previous_release_reads_field_by_field(old_runs):
    p = old_runs[1].provenance
    assert p.host == "fe1" and p.host_kernel == "6.12.48+deb13-amd64"
    assert p.accelerator == Accelerator("tcg", "qemu", True, False, "no /dev/kvm", 0.1)
    assert p.backing is not None and (p.backing.kind, p.backing.path, p.backing.device) == ("block-device",
                                                                                              "/dev/loop7", "loop7")
    assert p.versions is not None and p.versions.fio.startswith("fio-") and p.versions.guest_packages
    assert p.spec == RunSpec(profile="virtio-disk", suite="all", storage_tests="smoke")
    assert p.nic_stalls == [NicStall(test="tcp-maerts", hop="the guest's NIC", remedy="relaunch")]
    assert (p.boot_attempts, p.launch_to_agent_s, p.guest_kernel) == (1, 21.37, "6.12.48+deb13-amd64")
    assert "<domain" in (p.domain_xml or "") and p.private_network is None and p.nodes is None
    # Written out again, it is what the previous release stored, key for key.
    assert p.to_stored() == _stored(1)


def test_a_node_runs_private_network_reads_under_its_own_key_from_either_form(old_runs):
    for rid in (2, 3):
        p = old_runs[rid].provenance
        assert p.private_network == PrivateNetwork(bridge="cbpriv0", peer="10.73.0.1", host_ip="10.73.0.17",
                                                   guest_ip="10.73.0.101", mtu=9000), rid
        assert p.nodes == Nodes(front_end="fe1", back_end="be1") and p.host == "be1"
        assert p.controller == Controller(host="fe1", host_kernel="6.12.48+deb13-amd64")
        assert p.peer == PeerServers(peer="10.73.0.1", peer_netperf_port=41000)
        assert p.remote_run == RemoteRun("be1", 7, str(rid) * 32)
        assert p.propagation is not None and p.propagation.mbps == 40.13 and not p.propagation.cached
        assert p.spec is not None and p.spec.peer == "10.73.0.1"
        stored = _stored(rid)
        if rid == 2:
            assert "private_network" not in stored
            stored["private_network"] = stored.pop("network")
        assert p.to_stored() == stored, rid
    assert old_runs[4].provenance == Provenance(controller=Controller(host="fe1", host_kernel="6.12.48+deb13-amd64"))


def test_vhost_stays_in_the_comparison_rows_of_node_runs_with_network_tests(old_runs):
    """Both forms of a back-end's run: its NIC's knobs come from the profile, "(vhost)" included."""
    table = compare.compare_table([old_runs[i] for i in (1, 2, 3)])
    for test in ("tcp-stream", "tcp-stream-fe"):
        section = table.section(test)
        assert section is not None, test
        drivers = {r.run_ids[0]: r.cells["driver"] for r in section.rows if r.kind == "guest"}
        assert drivers[2] == drivers[3] == "virtio-net (vhost), MTU 9000", (test, drivers)
    assert labels.nic_label(old_runs[1]) == "virtio-net, MTU 9000"
    assert [(labels.target_label(r), labels.driver_label(r)) for r in old_runs.values()] == [
        ("local disk", "virtio-blk, phy"), ("local file", "virtio-blk, sparse file"),
        ("local file", "virtio-blk, sparse file"), ("?", "?, ?")]


def test_a_record_is_written_whole_and_read_back(tmp_path: Path):
    prov = Provenance(controller=Controller.this_host(), host="h", accelerator=Accelerator("kvm", "kvm", False,
                                                                                          False, "ok"),
                      versions=Versions(qemu="QEMU 9"), backing=BackingInfo(kind="sparse-file", path="/w/d.raw"),
                      spec=RunSpec(profile="p"), nodes=Nodes(front_end="fe1", back_end="be1"),
                      propagation=Propagation("be1", "0123456789abcdef", 1, 0.5, 0.1, 2.0, False, "/x", at=1.0))
    prov.add_nic_stall(NicStall(test="tcp-rr", hop="the bridge"))
    prov.add_disk_stall(DiskStall(test="seq-read-64k", disks=["vda"], seen="in flight 1 on vda"))
    prov.add_disk_stall(DiskStall(test="seq-read-1m", disks=["vda", "vdb"], seen="in flight 8 on vda, 8 on vdb"))
    with ResultStore(tmp_path / "r.db") as store:
        rid = store.create_run(profile_name="p", provenance=prov)
        assert store.get_run(rid).provenance == prov
        assert store.get_run(rid).as_dict()["provenance"]["nodes"] == {"front-end": "fe1", "back-end": "be1"}
        prov.boot_attempts = 2
        store.set_provenance(rid, prov)
        assert store.get_run(rid).provenance.boot_attempts == 2


def test_a_value_of_the_wrong_type_drops_that_key_alone():
    p = Provenance.from_stored({"host": "h", "boot_attempts": "twice", "nodes": {"front-end": "fe1"},
                                "sizes": {"storage_bytes": 1}, "network": {"model": "virtio"}})
    assert p == Provenance(host="h")
    assert Provenance.from_stored(None) == Provenance() == Provenance.from_stored([1, 2])


def test_the_front_ends_facts_go_over_the_nodes():
    node = Provenance(host="be1", controller=Controller(host="be1"), boot_attempts=2)
    ours = Provenance(controller=Controller(host="fe1"), nodes=Nodes(front_end="fe1", back_end="be1"))
    merged = node.under(ours)
    assert (merged.host, merged.controller, merged.boot_attempts, merged.nodes) == (
        "be1", Controller(host="fe1"), 2, ours.nodes)


def test_runs_of_the_previous_release_have_no_core_count(old_runs):
    assert old_runs and all(r.provenance.host_cores is None and r.provenance.host_cpus is None
                            for r in old_runs.values())


def _cpu(root: Path, n: int, package: int, core: int, *, online: str | None = None, die: bool = True) -> None:
    topo = root / f"cpu{n}" / "topology"
    topo.mkdir(parents=True)
    (topo / "physical_package_id").write_text(f"{package}\n")
    (topo / "core_id").write_text(f"{core}\n")
    if die:
        (topo / "die_id").write_text("0\n")
    if online is not None:
        (root / f"cpu{n}" / "online").write_text(online)


def test_host_cpus_and_cores_are_counted_from_sysfs_and_kept_with_the_run(tmp_path: Path):
    from cloudbox.core.run.local import cpu_counts

    root = tmp_path / "cpu"
    # two packages of two cores with two threads each; one more thread offline; core ids repeat across packages
    for n, (package, core) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1), (0, 0), (0, 1), (1, 0), (1, 1)]):
        _cpu(root, n, package, core, online=None if n == 0 else "1\n")
    _cpu(root, 8, 1, 1, online="0\n")
    (root / "cpufreq").mkdir()  # not a CPU
    assert cpu_counts(root) == (8, 4)
    older = tmp_path / "older"
    _cpu(older, 0, 0, 0, die=False)  # kernels without die_id
    _cpu(older, 1, 0, 0, die=False)
    assert cpu_counts(older) == (2, 1)
    assert cpu_counts(tmp_path / "none")[1] is None  # no sysfs: the cores are not guessed

    prov = Provenance(host="h", host_cpus=8, host_cores=4)
    with ResultStore(tmp_path / "r.db") as store:
        rid = store.create_run(profile_name="p", provenance=prov)
        run = store.get_run(rid)
    assert (run.provenance.host_cpus, run.provenance.host_cores) == (8, 4)
    assert run.as_dict()["provenance"]["host_cores"] == 4
    assert Provenance.from_stored({"host": "h", "host_cores": "eight"}) == Provenance(host="h")
