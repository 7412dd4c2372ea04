"""Real runs with a [placement] table (TCG here: one NUMA node, 2 CPUs): the guest pinned to one CPU with QEMU's
threads and the disk's iothread on the other, its RAM strict on node 0 in 2 MiB huge pages the run reserved; the
tests run, the placement is read back from libvirt and /proc, and the host's huge page pool is as it was after the
run. make test keeps one (the ladder's vhost-user-blk step: the disk served by qemu-storage-daemon, pinned where the
iothread would be, on shared huge-page RAM); the iothread inside QEMU is in make test-full."""

from __future__ import annotations

import pytest
from real_runs import completed_run, leftovers, work_files

from cloudbox.core.record.results import ResultStore
from cloudbox.core.spec.profiles import parse_profile
from cloudbox.core.spec.runspec import RunSpec
from cloudbox.core.virt.hugepages import HugePages
from cloudbox.core.virt.placement import Topology

pytestmark = [pytest.mark.slow, pytest.mark.root]

PINNED = """
name = "pinned-hugepages"
description = "virtio-blk, one vCPU pinned, QEMU's threads beside it, RAM strict on its node in 2 MiB pages"
[guest]
hypervisor = "kvm"
vcpus = 1
memory_mib = 512
[disk]
bus = "virtio-blk"
cache = "none"
io = "io_uring"
iothreads = 1
backing = "prealloc-file"
[network]
model = "virtio"
[placement]
vcpu_pin = "auto"
emulator_pin = "auto"
iothread_pin = "auto"
memory_nodes = "auto"
hugepages = "2M"
"""


def _host() -> tuple[int, tuple[int, ...]]:
    topo = Topology.read()
    node, cpus = topo.largest(), topo.nodes[topo.largest()]
    if len(cpus) < 2:
        pytest.skip(f"needs a NUMA node of 2 CPUs or more: {topo.describe()}")
    return node, cpus


@pytest.mark.full
def test_pinned_guest_in_huge_pages_runs_and_gives_the_pages_back(state, libvirt_conn, tmp_path):
    node, cpus = _host()
    path = tmp_path / "pinned-hugepages.toml"
    path.write_text(PINNED)
    parse_profile(PINNED)
    pool = HugePages(2048, node if len(Topology.read().nodes) > 1 else None)
    before = pool.state()
    run = completed_run(RunSpec(profile=str(path), suite="storage", size="16M", storage_tests="randread-4k-qd32",
                                runtime=3))
    assert run.measurement("guest", "randread-4k-qd32", "MB/s").value > 0
    info = run.provenance.placement
    assert info is not None
    # libvirt's view: the vCPU on the node's first CPU, QEMU's threads and the iothread on the others
    rest = ",".join(str(c) for c in cpus[1:]) if len(cpus) == 2 else None
    assert info.vcpu_pins == {"0": str(cpus[0])}
    if rest is not None:
        assert info.emulator_pin == rest and info.iothread_pins == {"1": rest}
    assert info.memory_binding == f"strict {node}"
    # the kernel's: the vCPU thread may run on that CPU only, and the RAM sits in 2 MiB pages on the node
    vcpu_threads = {k: v for k, v in info.threads.items() if k.startswith("CPU 0/")}
    assert list(vcpu_threads.values()) == [str(cpus[0])], info.threads
    if rest is not None:
        assert info.threads.get("IO iothread1") == rest, info.threads
    assert info.ram_page_kib == 2048 and info.ram_pages == {f"N{node}": 256}, info
    assert info.ram_policy.startswith("bind"), info.ram_policy
    # the pool: 256 pages held while the guest ran, then back to what it was
    assert info.hugepages_needed == 256 and info.hugepages_before == {"total": before.total, "free": before.free}
    assert info.hugepages_running["free"] == info.hugepages_running["total"] - 256 - (before.total - before.free)
    after = pool.state()
    assert (after.total, after.free) == (before.total, before.free)
    assert info.hugepages_after == {"total": before.total, "free": before.free}
    assert leftovers(libvirt_conn, state)["guests"] == [] and work_files(state) == []


def test_vhost_user_blk_on_pinned_huge_page_memory(state, libvirt_conn, tmp_path):
    """The ladder's vhost-user-blk step as a quick run of one test, twice a side: qemu-storage-daemon serves the
    file on the CPU the guest's vCPU does not take, the guest's 512 MiB are shared memfd in 2 MiB pages, fio reads
    through it."""
    node, cpus = _host()
    text = PINNED.replace('backing = "prealloc-file"', 'backing = "vhost-user"').replace(
        'name = "pinned-hugepages"', 'name = "vhost-user-pinned"')
    path = tmp_path / "vhost-user-pinned.toml"
    path.write_text(text)
    pool = HugePages(2048, node if len(Topology.read().nodes) > 1 else None)
    before = pool.state()
    # repeated, as a study's quick plan runs it: the repeated run places its guest as a single pass does
    run = completed_run(RunSpec(profile=str(path), suite="storage", size="16M", storage_tests="randread-4k-qd32",
                                runtime=3, repeats=2))
    assert run.measurement("guest", "randread-4k-qd32", "MB/s").value > 0
    assert run.measurement("baseline", "randread-4k-qd32", "MB/s").value > 0
    assert len([m for m in run.measurements if m.test == "randread-4k-qd32" and m.metric == "MB/s"]) == 4
    prov = run.provenance
    assert prov.backing is not None and prov.backing.kind == "vhost-user"
    assert "vhost-user-blk by qemu-storage-daemon" in prov.backing.model
    assert "type='vhostuser'" in prov.domain_xml or 'type="vhostuser"' in prov.domain_xml
    assert "<access mode='shared'/>" in prov.domain_xml or '<access mode="shared"/>' in prov.domain_xml
    with ResultStore() as store:
        logs = [e.payload.get("text", "") for e in store.events_since(run.id, 0) if e.kind == "log"]
    served = next(t for t in logs if t.startswith("vhost-user-blk: qemu-storage-daemon"))
    rest = ",".join(str(c) for c in cpus[1:])
    if len(cpus) == 2:
        assert served.endswith(f"on CPUs {rest})"), served  # where the placement puts the iothread
    info = prov.placement
    assert info is not None and info.vcpu_pins == {"0": str(cpus[0])}
    assert info.ram_page_kib == 2048 and info.ram_pages == {f"N{node}": 256}, info
    after = pool.state()
    assert (after.total, after.free) == (before.total, before.free)
    assert leftovers(libvirt_conn, state)["guests"] == [] and work_files(state) == []
