"""A mixed run (--profile a+b --guests N): the guests take the profiles in turn, which may differ only in each
guest's own hardware; the checks, the memory arithmetic over unequal guests, the stored record and the tables.
The real run of a mixed pair is test_many_guests' two-guest run in make test."""

from __future__ import annotations

import pytest

from cloudbox import cli
from cloudbox.agent import requests
from cloudbox.core.errors import NotFound, UsageError
from cloudbox.core.record.provenance import Guests, GuestStart, Provenance
from cloudbox.core.record.results import ResultStore
from cloudbox.core.run.multi import QEMU_OVERHEAD_MIB, check_fits, run_profiles
from cloudbox.core.spec.profiles import (
    GUEST_SIDE_KNOBS,
    MIX,
    diff_profiles,
    mix_hash,
    mix_problem,
    resolve_mix,
    resolve_profile,
)
from cloudbox.core.spec.runspec import RunSpec, guest_profile_index
from cloudbox.core.views import compare, labels, render


def test_the_guests_take_the_profiles_in_turn():
    assert [guest_profile_index(k, 2) for k in range(1, 6)] == [0, 1, 0, 1, 0]
    assert [guest_profile_index(k, 3) for k in range(1, 4)] == [0, 1, 2]
    spec = RunSpec(profile="virtio-file + kvm-cache-none", suite="storage", guests=3)
    assert spec.profiles == ["virtio-file", "kvm-cache-none"]
    spec.validate()
    assert RunSpec(profile="virtio-file").profiles == ["virtio-file"]


def test_a_profile_file_with_a_plus_in_its_path_is_one_profile_alone_or_in_a_mix(tmp_path):
    f = tmp_path / "c++" / "mine.toml"
    f.parent.mkdir()
    f.write_text(resolve_profile("virtio-file").to_toml().replace('"virtio-file"', '"mine"', 1))
    assert RunSpec(profile=str(f)).profiles == [str(f)]
    assert [p.name for p in resolve_mix(str(f))] == ["mine"]
    # in a mix too: the longest run of pieces naming a file is one profile
    assert [p.name for p in resolve_mix(f"kvm-cache-none+{f}+virtio-file")] == ["kvm-cache-none", "mine",
                                                                                 "virtio-file"]
    assert RunSpec(profile=f"{f}+{f}").profiles == [str(f), str(f)]
    with pytest.raises(UsageError, match="an empty name in the list"):
        resolve_mix("kvm-cache-none++virtio-file")


def test_profiles_that_differ_in_the_guests_own_hardware_mix():
    mix = resolve_mix(f"virtio-file{MIX}kvm-cache-none")  # writethrough/e1000/1 GiB and none/rtl8139/2 GiB
    assert [p.name for p in mix] == ["virtio-file", "kvm-cache-none"]
    assert mix_problem(mix) is None
    assert {k for k, _, _ in diff_profiles(*mix)} <= set(GUEST_SIDE_KNOBS)
    assert mix_hash(mix) != mix_hash(mix[::-1]) and mix_hash(mix[:1]) == mix[0].hash


def test_profiles_that_differ_in_what_the_run_sets_up_once_are_refused_naming_the_knob():
    why = mix_problem(resolve_mix("virtio-file+virtio-disk"))  # a pre-allocated file and a block device
    assert why is not None
    assert why.startswith("profiles virtio-file and virtio-disk differ in disk.backing ('prealloc-file' / "
                          "'block-device'), which the run sets up once for every guest; allowed to differ: "
                          "guest.vcpus, guest.memory_mib, disk.bus")
    with pytest.raises(UsageError, match=r"^--profile virtio-file\+virtio-disk: profiles virtio-file and "):
        run_profiles(RunSpec(profile="virtio-file+virtio-disk", suite="storage", guests=2))
    with pytest.raises(UsageError, match="an empty name in the list; allowed: NAME or NAME"):
        resolve_mix("virtio-file+")
    with pytest.raises(NotFound, match="no profile named 'nosuch'"):
        resolve_mix("virtio-file+nosuch")


def test_the_mtu_may_differ_only_when_nothing_goes_over_the_guests_link():
    # Study A's pair on a whole device: virtio/phy (MTU 9000) and SCSI/phy (MTU 1500)
    storage = RunSpec(profile="virtio-disk+kvm-scsi-phy", suite="storage", guests=2, storage_tests="seq-write-64k")
    assert [p.name for p in run_profiles(storage)] == ["virtio-disk", "kvm-scsi-phy"]
    for spec in (RunSpec(profile="virtio-disk+kvm-scsi-phy", suite="all", guests=2),
                 RunSpec(profile="virtio-disk+kvm-scsi-phy", suite="storage", guests=2, storage_tests="mpi")):
        with pytest.raises(UsageError, match=r"differ in network.mtu \(9000 / 1500\), which the run sets up once for "
                                             r"every guest \(the run's network tests, NFS mount or MPI job use the "
                                             r"guests' link\)"):
            run_profiles(spec)


def test_a_mix_needs_a_guest_per_profile_and_goes_wherever_the_guests_go():
    with pytest.raises(UsageError, match=r"names 2 profiles, one per guest in turn; --guests 1 leaves one unused; "
                                         r"allowed: --guests 2 or more"):
        RunSpec(profile="virtio-file+kvm-cache-none", suite="storage").validate()
    with pytest.raises(UsageError, match=r"--guests 2 leaves 2 unused; allowed: --guests 4"):
        RunSpec(profile="virtio-file+kvm-cache-none+virtio-file+kvm-cache-none", suite="storage", guests=2).validate()
    RunSpec(profile="virtio-file+kvm-cache-none", suite="storage", guests=2, node="be1").validate()
    RunSpec(profile="virtio-file+kvm-cache-none", suite="storage", guests=3, node="local,be1").validate()


def test_this_hosts_share_of_a_spread_mix_is_counted_with_its_own_guests_profiles():
    small = resolve_profile("virtio-file")
    big = small.model_copy(update={"name": "big", "guest": small.guest.model_copy(update={"memory_mib": 4096})})
    first = RunSpec(profile="virtio-file+big", suite="storage", guests=3, node="local,be1")  # here g1 and g2
    with pytest.raises(UsageError, match=r"puts 2 on this host: \(1024 \+ 4096 MiB guest.memory_mib"):
        check_fits(first, small, mix=[small, big], available_mib=5000, host_cpus=8)
    last = RunSpec(profile="virtio-file+big", suite="storage", guests=3, node="be1,local")  # here g3 alone: small
    check_fits(last, small, mix=[small, big], available_mib=1024 + QEMU_OVERHEAD_MIB + 512, host_cpus=8)


def test_a_nodes_start_request_carries_each_profile_of_the_mix():
    import io
    import json


    a, b = resolve_profile("virtio-file").to_toml(), resolve_profile("kvm-cache-none").to_toml()
    spec = {"profile": "x", "suite": "storage", "guests": 2}

    class Stream(io.BytesIO):
        pass

    def read(**req):
        return requests.read_request(Stream(json.dumps(req).encode()))

    assert read(spec=spec, profile_toml=a, mix_tomls=[a, b])["mix_tomls"] == [a, b]
    for bad, message in (([a], "field mix_tomls: .*allowed: a list of 2 to 64"), ([a, 3], "field mix_tomls"),
                         ([a, "name = 1"], "start-run: field mix_tomls, profile 2")):
        with pytest.raises(requests.BadRequest, match=message):
            read(spec=spec, profile_toml=a, mix_tomls=bad)


def test_unequal_guests_memory_is_summed_guest_by_guest(tmp_path):
    small = resolve_profile("virtio-file")
    big = small.model_copy(update={"name": "virtio-file-2g",
                                   "guest": small.guest.model_copy(update={"memory_mib": 2048, "vcpus": 2})})
    spec = RunSpec(profile="virtio-file+virtio-file-2g", suite="storage", guests=3)
    q = QEMU_OVERHEAD_MIB
    with pytest.raises(UsageError) as e:  # 1024 + 2048 + 1024 + 3 x 256 + 512 = 5376
        check_fits(spec, small, mix=[small, big], available_mib=5000, host_cpus=8)
    assert str(e.value) == (f"--guests 3: (1024 + 2048 + 1024 MiB guest.memory_mib + 3 x {q} MiB QEMU) + 512 MiB for "
                            "the host = 5376 MiB, but this host has 5000 MiB available; allowed: --guests 1 to 2 with "
                            "profile virtio-file+virtio-file-2g")
    with pytest.raises(UsageError, match=r"--guests 3: 1 \+ 2 \+ 1 guest.vcpus = 4 vCPUs, but this host has 3 CPUs; "
                                         r"allowed: --guests 1 to 2 with profile virtio-file\+virtio-file-2g"):
        check_fits(spec, small, mix=[small, big], available_mib=64000, host_cpus=3)
    check_fits(spec, small, mix=[small, big], available_mib=5376, host_cpus=4)


def test_the_cli_refuses_a_mix_naming_the_knob(capsys):
    assert cli.main(["run", "--profile", "virtio-file+virtio-disk", "--guests", "2", "--suite", "storage"]) == 2
    err = capsys.readouterr().err
    assert "profiles virtio-file and virtio-disk differ in disk.backing" in err


def _mixed_run(store: ResultStore) -> int:
    a, b = resolve_profile("virtio-file"), resolve_profile("eucalyptus-prealloc")
    rid = store.create_run(profile_name="virtio-file+eucalyptus-prealloc", suite="storage", accelerator="tcg",
                           profile_toml=a.to_toml(),
                           provenance=Provenance(guests=Guests(
                               count=3, profiles={p.name: p.to_toml() for p in (a, b)},
                               guests=[GuestStart(name="g1", profile=a.name), GuestStart(name="g2", profile=b.name),
                                       GuestStart(name="g3", profile=a.name)])))
    for k, v in ((1, 30.0), (2, 10.0), (3, 20.0)):
        store.add_measurement(rid, side="guest", test="seq-write-64k", metric="MB/s", value=v, instance=k)
        store.add_measurement(rid, side="baseline", test="seq-write-64k", metric="MB/s", value=100.0, instance=k)
    store.add_measurement(rid, side="guest", test="seq-write-64k", metric="MB/s", value=60.0)
    store.add_measurement(rid, side="baseline", test="seq-write-64k", metric="MB/s", value=300.0)
    return rid


def test_the_tables_name_each_guests_profile_and_the_mix(tmp_path, capsys):
    with ResultStore(tmp_path / "r.db") as store:
        run = store.get_run(_mixed_run(store))
    assert labels.bus_label(run) == "virtio-blk / scsi-lsi"  # not the first profile's alone
    assert labels.driver_label(run) == "virtio-blk / scsi-lsi, pre-allocated file"
    table = compare.compare_table([run])
    rows = {r.cells["run"]: r.cells["driver"] for r in table.sections[0].rows if r.kind == "guest"}
    assert rows == {"#1 sum": "virtio-blk / scsi-lsi, pre-allocated file", "#1 g1": "virtio-file",
                    "#1 g2": "eucalyptus-prealloc", "#1 g3": "virtio-file"}
    text = render.to_text(table, width=240)
    assert "by profile: virtio-file 25.0 (median of 2), eucalyptus-prealloc 10.0. Bare metal" in text
    assert cli.main(["results", "--db", str(tmp_path / "r.db"), "show", "1"]) == 0
    out = capsys.readouterr().out
    assert "g2 (eucalyptus-prealloc)" in out and "profile      virtio-file+eucalyptus-prealloc" in out
