"""A profile's [placement]: its keys validated like the others, resolved against a host's CPUs and NUMA nodes (auto
and explicit, refusals with the arithmetic), the huge page pool reserved and given back (a stand-in sysfs), what
/proc says read back, and the domain XML each variant renders accepted by virt-xml-validate and libvirt's test
driver."""

from __future__ import annotations

import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from cloudbox.core.errors import ProfileError
from cloudbox.core.spec.iopaths import Placement
from cloudbox.core.spec.profiles import Profile, parse_profile
from cloudbox.core.virt.domain import DomainPlan, read_domain, render_domain
from cloudbox.core.virt.hugepages import HugePages, HugePagesRefused, pages_for
from cloudbox.core.virt.placement import PlacementRefused, Topology, cpuset, observed, resolve

BASE = """
name = "p"
description = "placement variant"
[guest]
hypervisor = "kvm"
vcpus = {vcpus}
memory_mib = {memory}
[disk]
bus = "virtio-blk"
cache = "none"
io = "io_uring"
iothreads = {iothreads}
backing = "prealloc-file"
[network]
model = "virtio"
[placement]
{placement}
"""


def profile(placement: str = "", *, vcpus: int = 2, memory: int = 1024, iothreads: int = 1) -> Profile:
    return parse_profile(BASE.format(placement=placement, vcpus=vcpus, memory=memory, iothreads=iothreads))


def problems(placement: str, **kw) -> list[tuple[str, str]]:
    with pytest.raises(ProfileError) as e:
        profile(placement, **kw)
    return [(p.key, p.allowed) for p in e.value.problems]


# -- the keys -----------------------------------------------------------------------------------------------------
def test_without_placement_the_hash_and_the_toml_are_as_before():
    plain = profile()
    assert "placement" not in plain.sections() and "[placement]" not in plain.to_toml()
    assert '"placement"' not in plain.canonical_json()
    pinned = profile('vcpu_pin = "auto"\nhugepages = "2M"\nmemory_nodes = "auto"')
    assert pinned.hash != plain.hash and "[placement]" in pinned.to_toml()
    assert parse_profile(pinned.to_toml()) == pinned
    assert "placement: vCPUs pinned (auto), RAM strict on node auto, 2M huge pages" in pinned.describe()


@pytest.mark.parametrize(("placement", "kw", "key", "allowed"), [
    ('vcpu_pin = "0"', {}, "placement.vcpu_pin", "a list of at least 2 host CPUs"),
    ('vcpu_pin = "a-b"', {}, "placement.vcpu_pin", "empty (the vCPUs float"),
    ('vcpu_pin = "3-1"', {}, "placement.vcpu_pin", "empty (the vCPUs float"),
    ('iothread_pin = "1"', {"iothreads": 0}, "placement.iothread_pin", "empty (with disk.iothreads = 0)"),
    ('memory_nodes = "auto"', {}, "placement.memory_nodes", "auto needs placement.vcpu_pin"),
    ('memory_nodes = "x"', {}, "placement.memory_nodes", "host NUMA nodes as a list"),
    ('memory_mode = "interleave"', {}, "placement.memory_mode", "strict (with placement.memory_nodes empty)"),
    ('memory_mode = "local"', {}, "placement.memory_mode", "strict, preferred, interleave"),
    ('hugepages = "4M"', {}, "placement.hugepages", "none, 2M, 1G"),
    ('hugepages = "1G"', {"memory": 1536}, "guest.memory_mib", "a multiple of 1024 MiB"),
    ('hugepages = "2M"\nguest_nodes = 2', {"memory": 1026}, "guest.memory_mib", "a multiple of 4 MiB"),
    ("guest_nodes = 2", {"vcpus": 3}, "placement.guest_nodes", "1 or a divisor of guest.vcpus = 3"),
    ("guest_nodes = 9", {}, "placement.guest_nodes", "1..8"),
])
def test_refusals_name_the_key_and_what_is_allowed(placement, kw, key, allowed):
    found = problems(placement, **kw)
    assert any(k == key and allowed in (a or "") for k, a in found), found


def test_xen_takes_no_placement():
    text = BASE.format(placement='vcpu_pin = "auto"', vcpus=1, memory=1024, iothreads=0).replace(
        'hypervisor = "kvm"', 'hypervisor = "xen"').replace('"virtio-blk"', '"xen-vbd"').replace(
        'cache = "none"', 'cache = "writeback"').replace('io = "io_uring"', "").replace(
        'model = "virtio"', 'model = "xen-netfront"')
    with pytest.raises(ProfileError) as e:
        parse_profile(text)
    assert [p.key for p in e.value.problems] == ["placement.vcpu_pin"]
    assert "[dom0]" in e.value.problems[0].message


# -- the host's topology and auto ---------------------------------------------------------------------------------
def fake_sysfs(root: Path, nodes: dict[int, list[int]], cores: dict[int, int] | None = None) -> Path:
    """A sysfs with `nodes` (node -> CPUs) and each CPU's core (`cores`, default its own)."""
    cpus = sorted(c for cs in nodes.values() for c in cs)
    (root / "cpu").mkdir(parents=True)
    (root / "cpu" / "online").write_text(cpuset(cpus) + "\n")
    for n, cs in nodes.items():
        d = root / "node" / f"node{n}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpuset(cs) + "\n")
    for c in cpus:
        topo = root / "cpu" / f"cpu{c}" / "topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text("0\n")
        (topo / "core_id").write_text(f"{(cores or {}).get(c, c)}\n")
    return root


def test_topology_orders_whole_cores_first(tmp_path):
    # two nodes; node 1's CPUs 4-7 are two cores with two threads each (4/6 and 5/7 are siblings)
    root = fake_sysfs(tmp_path, {0: [0, 1], 1: [4, 5, 6, 7]}, cores={4: 10, 6: 10, 5: 11, 7: 11})
    topo = Topology.read(root)
    assert topo.nodes == {0: (0, 1), 1: (4, 5, 6, 7)}
    assert topo.largest() == 1
    root2 = fake_sysfs(tmp_path / "b", {0: [0, 1, 2, 3]}, cores={0: 0, 1: 0, 2: 1, 3: 1})
    assert Topology.read(root2).nodes == {0: (0, 2, 1, 3)}  # 0 and 2 are different cores


def test_a_kernel_without_numa_is_one_node(tmp_path):
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "online").write_text("0-3\n")
    assert Topology.read(tmp_path).nodes == {0: (0, 1, 2, 3)}


def test_auto_takes_one_node_and_gives_the_rest_to_qemus_threads():
    topo = Topology({0: (0, 1), 1: (2, 3, 4, 5)})
    p = profile('vcpu_pin = "auto"\nemulator_pin = "auto"\niothread_pin = "auto"\nmemory_nodes = "auto"\n'
                'hugepages = "2M"')
    hp = resolve(p.placement, 2, topo)
    assert hp.vcpus == ("2", "3") and hp.emulator == "4-5" and hp.iothreads == "4-5"
    assert (hp.memory_nodes, hp.memory_mode, hp.hugepage_kib) == ("1", "strict", 2048)
    second = resolve(p.placement, 2, topo, guest=1)  # the next guest of the run: the node's next CPUs
    assert second.vcpus == ("4", "5") and second.emulator == "2-3"
    with pytest.raises(PlacementRefused, match=r"6 CPUs for guests 1..3, and this host's largest node has 4"):
        resolve(p.placement, 2, topo, guest=2)


def test_auto_on_a_node_the_vcpus_fill_shares_it_with_qemus_threads():
    hp = resolve(profile('vcpu_pin = "auto"\nemulator_pin = "auto"').placement, 2, Topology({0: (0, 1)}))
    assert hp.vcpus == ("0", "1") and hp.emulator == "0-1"
    with pytest.raises(PlacementRefused, match=r"4 vCPUs per guest need 4 CPUs.*node 0: CPUs 0-1"):
        resolve(profile('vcpu_pin = "auto"', vcpus=4).placement, 4, Topology({0: (0, 1)}))


def test_explicit_lists_are_checked_against_the_host():
    topo = Topology({0: (0, 1), 1: (2, 3)})
    hp = resolve(profile('vcpu_pin = "3,2"\nmemory_nodes = "auto"\nemulator_pin = "0"').placement, 2, topo)
    assert hp.vcpus == ("3", "2") and hp.memory_nodes == "1" and hp.emulator == "0"
    with pytest.raises(PlacementRefused, match=r"names CPU 9, which this host does not have online; allowed: CPUs "
                                               r"0-3"):
        resolve(profile('vcpu_pin = "0,9"').placement, 2, topo)
    with pytest.raises(PlacementRefused, match=r"names node 4, which this host does not have; allowed: nodes 0-1"):
        resolve(profile('memory_nodes = "4"').placement, 2, topo)


# -- huge pages ----------------------------------------------------------------------------------------------------
def pool_dir(tmp_path: Path, total: int, free: int, mem_kib: int = 8 << 20, grows_to: int | None = None):
    mm = tmp_path / "mm"
    d = mm / "hugepages-2048kB"
    d.mkdir(parents=True)
    (mm / "hugepages-1048576kB").mkdir()
    (d / "nr_hugepages").write_text(f"{total}\n")
    (d / "free_hugepages").write_text(f"{free}\n")
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemTotal: {mem_kib * 2} kB\nMemAvailable: {mem_kib} kB\n")
    return mm, meminfo, d


class KernelPool:
    """nr_hugepages written: free grows with it, up to what the 'kernel' finds room for."""

    def __init__(self, d: Path, used: int, most: int):
        self.d, self.used, self.most = d, used, most

    def settle(self) -> None:
        total = min(int((self.d / "nr_hugepages").read_text()), self.most)
        (self.d / "nr_hugepages").write_text(f"{total}\n")
        (self.d / "free_hugepages").write_text(f"{total - self.used}\n")


def test_pages_for_rounds_up_per_guest():
    assert pages_for(1024, 2048) == 512 and pages_for(1025, 2048, guests=2) == 1026
    assert pages_for(1024, 1048576) == 1


def test_a_pool_grows_by_what_is_missing_and_goes_back(tmp_path, monkeypatch):
    mm, meminfo, d = pool_dir(tmp_path, total=100, free=40)
    kernel = KernelPool(d, used=60, most=10_000)
    pool = HugePages(2048, mm=mm, meminfo=meminfo)
    write = pool._write
    monkeypatch.setattr(pool, "_write", lambda total: (write(total), kernel.settle()))
    got = pool.reserve(512)
    assert pool.added == 472 and (got.total, got.free) == (572, 512)
    back = pool.release()
    assert (back.total, back.free) == (100, 40) and pool.added == 0
    assert pool.release() == back  # twice is harmless


def test_enough_free_pages_change_nothing(tmp_path):
    mm, meminfo, d = pool_dir(tmp_path, total=600, free=600)
    pool = HugePages(2048, mm=mm, meminfo=meminfo)
    pool.reserve(512)
    assert pool.added == 0 and (d / "nr_hugepages").read_text() == "600\n"


def test_too_little_memory_is_refused_before_anything_is_written(tmp_path):
    mm, meminfo, d = pool_dir(tmp_path, total=0, free=0, mem_kib=512 * 1024)
    pool = HugePages(2048, mm=mm, meminfo=meminfo)
    with pytest.raises(HugePagesRefused, match=r"the guest RAM \(1024 MiB\) needs 512 pages of 2 MiB on the whole "
                                               r"host: 0 of its 0 are free, so 512 more \(1024 MiB\) would have to be "
                                               r"reserved, and the host has 512 MiB available"):
        pool.reserve(512, "the guest RAM (1024 MiB)")
    assert (d / "nr_hugepages").read_text() == "0\n"


def test_a_kernel_that_finds_too_few_pages_is_refused_and_the_pool_put_back(tmp_path, monkeypatch):
    mm, meminfo, d = pool_dir(tmp_path, total=0, free=0)
    kernel = KernelPool(d, used=0, most=100)
    pool = HugePages(2048, mm=mm, meminfo=meminfo)
    write = pool._write
    monkeypatch.setattr(pool, "_write", lambda total: (write(total), kernel.settle()))
    with pytest.raises(HugePagesRefused, match=r"found room for only 100 of the 512 more asked.*hugepagesz=2M "
                                               r"hugepages=512"):
        pool.reserve(512)
    assert (d / "nr_hugepages").read_text() == "0\n"


def test_a_page_size_the_kernel_lacks_is_named(tmp_path):
    mm, meminfo, _ = pool_dir(tmp_path, total=0, free=0)
    with pytest.raises(HugePagesRefused, match=r"no 16 MiB huge pages.*allowed: 2 MiB, 1 GiB"):
        HugePages(16384, mm=mm, meminfo=meminfo)


# -- read back from /proc -----------------------------------------------------------------------------------------
def test_observed_reads_threads_and_the_rams_nodes(tmp_path):
    pid = tmp_path / "42"
    for tid, comm, allowed in ((42, "qemu-system-x86", "1"), (43, "CPU 0/TCG", "0"), (44, "IO iothread1", "1")):
        t = pid / "task" / str(tid)
        t.mkdir(parents=True)
        (t / "comm").write_text(comm + "\n")
        (t / "status").write_text(f"Name:\t{comm}\nCpus_allowed_list:\t{allowed}\n")
    (pid / "numa_maps").write_text(
        "7f00 default anon=3000 dirty=3000 N0=3000 kernelpagesize_kB=4\n"
        "7f80 bind:0 file=/memfd:ram-node0\\040(deleted) huge dirty=128 N0=128 kernelpagesize_kB=2048\n"
        "7fc0 bind:0 file=/memfd:ram-node1\\040(deleted) huge dirty=128 N0=128 kernelpagesize_kB=2048\n")
    seen = observed(42, tmp_path)
    assert seen.threads == {"qemu-system-x86": "1", "CPU 0/TCG": "0", "IO iothread1": "1"}
    assert (seen.ram_pages, seen.ram_page_kib, seen.ram_policy) == ({"N0": 256}, 2048, "bind:0")


# -- the domain XML -----------------------------------------------------------------------------------------------
TOPO = Topology({0: (0, 1), 1: (2, 3)})
VARIANTS = {
    "pinned-auto": ('vcpu_pin = "auto"\nemulator_pin = "auto"\niothread_pin = "auto"\nmemory_nodes = "auto"', {}),
    "hugepages-2m": ('hugepages = "2M"', {}),
    "hugepages-1g-strict": ('hugepages = "1G"\nvcpu_pin = "0-1"\nmemory_nodes = "0"', {}),
    "interleave": ('memory_nodes = "0-1"\nmemory_mode = "interleave"', {}),
    "guest-numa": ('guest_nodes = 2\nhugepages = "2M"\nvcpu_pin = "auto"', {}),
    "guest-numa-4": ("guest_nodes = 4", {"vcpus": 4}),
}


def rendered(prof: Profile, domain_type: str = "kvm") -> str:
    hp = resolve(prof.placement, prof.guest.vcpus, TOPO)
    return render_domain(DomainPlan(prof, name=f"cbtest-{prof.name}", domain_type=domain_type, kernel="/k",
                                    initrd="/i", cmdline="", disk_path="/var/tmp/d.img", disk_is_block=False,
                                    bridge="cbbr0", placement=hp))


@pytest.mark.skipif(shutil.which("virt-xml-validate") is None, reason="virt-xml-validate (libvirt-clients)")
@pytest.mark.parametrize("variant", VARIANTS)
def test_schema_valid(variant, tmp_path):
    placement, kw = VARIANTS[variant]
    f = tmp_path / "d.xml"
    f.write_text(rendered(profile(placement, **kw)))
    r = subprocess.run(["virt-xml-validate", str(f), "domain"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr + f.read_text()


@pytest.mark.parametrize("variant", VARIANTS)
def test_test_driver_keeps_the_placement(variant):
    libvirt = pytest.importorskip("libvirt")
    libvirt.registerErrorHandler(lambda *_: None, None)
    placement, kw = VARIANTS[variant]
    prof = profile(placement, **kw)
    conn = libvirt.open("test:///default")
    try:
        dom = conn.defineXML(rendered(prof, domain_type="qemu"))
        desc = dom.XMLDesc(0)
        dom.undefine()
    finally:
        conn.close()
    live, hp = read_domain(desc), resolve(prof.placement, prof.guest.vcpus, TOPO)
    assert live.vcpu_pins == {str(i): c for i, c in enumerate(hp.vcpus) if c}
    binding = live.memory_binding
    got = (binding.mode, binding.nodeset) if binding else None
    assert got == ((hp.memory_mode, hp.memory_nodes) if hp.memory_nodes else None)
    page = live.hugepage
    assert (int(page.size) if page else 0) == hp.hugepage_kib
    cells = ET.fromstring(desc).findall("cpu/numa/cell")
    assert len(cells) == (prof.placement.guest_nodes if prof.placement.guest_nodes > 1 else 0)
    assert sum(int(c.get("memory")) for c in cells) in (0, prof.guest.memory_mib * 1024)  # KiB, as libvirt keeps it


def test_host_problem_says_why_a_host_cannot_place_a_guest(tmp_path, monkeypatch):
    from cloudbox.core.virt import hugepages, placement

    two = Topology({0: (0, 1)})
    assert placement.host_problem(profile('vcpu_pin = "auto"').placement, 2, 1024, two) is None
    assert "largest node has 2" in placement.host_problem(profile('vcpu_pin = "auto"', vcpus=4).placement, 4, 1024,
                                                          two)
    mm, meminfo, _ = pool_dir(tmp_path, total=0, free=0, mem_kib=256 * 1024)
    monkeypatch.setattr(hugepages, "SYSFS_MM", mm)
    monkeypatch.setattr(hugepages, "MEMINFO", meminfo)
    why = placement.host_problem(profile('hugepages = "2M"').placement, 2, 1024, two)
    assert why is not None and "512 pages of 2 MiB" in why and "256 MiB available" in why


def test_a_profile_with_placement_needs_it_resolved():
    prof = profile('hugepages = "2M"')
    with pytest.raises(ValueError, match=r"resolve it on the host"):
        render_domain(DomainPlan(prof, name="x", domain_type="kvm", kernel="/k", initrd="/i", cmdline="",
                                 disk_path="/d", disk_is_block=False, bridge=None))
    assert Placement() == profile().placement
