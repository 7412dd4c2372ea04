"""Real quick storage runs over a network volume under libvirt and QEMU (TCG here): NBD with TLS attached by QEMU's
own client (disk.attach = qemu; the baseline is the same export from the host domain, fio's nbd engine), iSCSI with
CHAP attached by QEMU's libiscsi driver (no baseline: no libiscsi engine in this fio), and AoE attached by the
guest's own aoe driver over its NIC (disk.attach = guest; no baseline on a host without aoe)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from real_runs import completed_run, interrupt_cli_run, work_files

from cloudbox.core.disks.volumes import attach, iscsi
from cloudbox.core.disks.volumes.store import VolumeStore
from cloudbox.core.record.results import ResultStore
from cloudbox.core.record.rows import Run
from cloudbox.core.spec.runspec import RunSpec
from cloudbox.core.views import labels
from cloudbox.core.views.compare import compare_table
from cloudbox.core.views.render import to_text

pytestmark = [pytest.mark.slow, pytest.mark.root]


def test_quick_storage_run_over_nbd_attached_by_qemu(volume_run):
    run = volume_run("kvm-ebs-nbd", "qemu")
    prov = run.provenance
    assert prov.volume is not None
    assert (prov.volume.scheme, prov.volume.attach, prov.volume.name) == ("nbd", "qemu", "ebs")
    assert prov.volume.server.startswith("qemu-nbd") and "x509" in prov.volume.tls
    assert prov.domain_xml and "protocol='nbd'" in prov.domain_xml and "tls='yes'" in prov.domain_xml
    for side in ("guest", "baseline"):
        for test in ("seq-write-64k", "seq-read-64k", "randread-4k-qd32"):
            m = run.measurement(side, test, "MB/s")
            assert m is not None and m.value > 0, (side, test)
            assert ("volume-from-host" in m.labels) == (side == "baseline")
    text = to_text(compare_table([run]))
    assert "EBS (NBD)" in text and "host domain" in text and "QEMU's NBD" in text


@pytest.mark.full  # make test keeps iSCSI through the guest's initiator and QEMU's NBD client
def test_quick_storage_run_over_iscsi_attached_by_qemu(volume_run, libvirt_conn):
    """disk.attach = qemu over iSCSI: tgtd serves the volume with CHAP on loopback, QEMU's libiscsi driver logs in
    with the run's libvirt secret; the guest's writes pass through tgtd to the volume's file, and after the run no
    tgtd, libvirt secret or management socket is left. The baseline, from the host domain through the same tgtd:
    the reads by libiscsi's iscsi-perf, the write through QEMU's libiscsi in qemu-nbd by fio's nbd engine, each
    logged in without the secret on its command line."""
    if not (shutil.which("tgtd") and iscsi.qemu_driver()):
        pytest.skip("needs tgtd (tgt) and QEMU's iSCSI driver (qemu-block-extra): make deps")
    sockets = set(iscsi.SOCKET_DIR.glob("socket.*"))
    run = volume_run("kvm-ebs-iscsi", "qemu")
    v = run.provenance.volume
    assert v is not None and (v.scheme, v.name) == ("iscsi", "ebs")
    assert v.server.startswith("tgtd 1.") and "CHAP" in v.tls and v.uri.startswith("iscsi://127.0.0.1:")
    xml = run.provenance.domain_xml or ""
    assert "protocol='iscsi'" in xml and "<auth username=" in xml and iscsi.chap().secret not in xml
    # the guest's writes went through tgtd to the volume's file
    assert (v.server_bytes_written or 0) >= 16 * 1024 * 1024, v
    for test in ("seq-write-64k", "seq-read-64k", "randread-4k-qd32"):
        m = run.measurement("guest", test, "MB/s")
        assert m is not None and m.value > 0, test
    # the reads by iscsi-perf straight to the target, the write through QEMU's libiscsi in qemu-nbd
    for test, reader in (("seq-write-64k", "libiscsi-relay"), ("seq-read-64k", "iscsi-perf"),
                         ("randread-4k-qd32", "iscsi-perf")):
        b = run.measurement("baseline", test, "MB/s")
        assert b is not None and b.value > 0 and {"volume-from-host", reader} <= set(b.labels), (test, b)
        assert iscsi.chap().secret not in b.raw
    assert run.measurement("baseline", "randread-4k-qd32", "IOPS") is not None
    assert "iscsi-perf" in v.baseline and "qemu-nbd" in v.baseline and (v.server_bytes_read or 0) > 0
    table = compare_table([run])
    for test, driver in (("seq-write-64k", "iSCSI, QEMU's libiscsi via qemu-nbd, fio nbd engine (user space)"),
                         ("seq-read-64k", "iSCSI, libiscsi's iscsi-perf (user space)")):
        sec = table.section(test)
        assert sec is not None and [(r.kind, r.cells["vmm"], r.cells["driver"]) for r in sec.rows][0] == (
            "baseline", "host domain", driver), sec.rows
    assert labels.target_label(run) == "EBS (iSCSI)" and labels.driver_label(run).endswith("QEMU's iSCSI client")
    assert iscsi.secrets_named(libvirt_conn, iscsi.secret_usage(run.uuid)) == []
    assert set(iscsi.SOCKET_DIR.glob("socket.*")) <= sockets


@pytest.mark.full
def test_ctrl_c_with_the_guest_on_an_iscsi_volume_leaves_nothing(state, libvirt_conn):
    """SIGINT while QEMU is logged in to tgtd: the run is aborted, and the guest, tgtd, its management socket, the
    libvirt secret and the attachment are gone."""
    from cloudbox.core.virt.guest import list_guests
    if not (shutil.which("tgtd") and iscsi.qemu_driver()):
        pytest.skip("needs tgtd (tgt) and QEMU's iSCSI driver (qemu-block-extra): make deps")
    with VolumeStore() as vs:
        vol = vs.create("ebs", 160 * 1024 * 1024)
    sockets = set(iscsi.SOCKET_DIR.glob("socket.*"))

    def exported() -> None:
        assert iscsi.running(vol.path) != []

    got = interrupt_cli_run(["--profile", "kvm-ebs-iscsi", "--suite", "storage", "--size", "64M",
                             "--tests", "standard", "--runtime", "5"], while_running=exported)  # reads: baseline
    assert got.returncode == 1, got.output
    assert got.run.state == "aborted" and "SIGINT" in (got.run.reason or ""), got.run.reason
    assert [g.name for g in list_guests(libvirt_conn) if "kvm-ebs-iscsi" in g.name] == []
    assert iscsi.running(vol.path) == [] and set(iscsi.SOCKET_DIR.glob("socket.*")) <= sockets
    assert subprocess.run(["pgrep", "-f", "file.driver=iscsi"], capture_output=True).returncode == 1  # no relay
    assert iscsi.secrets_named(libvirt_conn, iscsi.secret_usage(got.run.uuid)) == []
    with VolumeStore() as vs:
        assert vs.get("ebs").attached_run is None
    assert work_files(state) == []


@pytest.mark.full  # 46 s under TCG here: over the slow tier's 45 s, so make test-full
def test_ctrl_c_with_the_guest_on_the_volume_leaves_no_export(state, libvirt_conn):
    """SIGINT while the guest's QEMU holds the export: the run is aborted, the guest, the export and the attachment
    are gone, the volume is free for the next run."""
    from cloudbox.core.virt.guest import list_guests

    with VolumeStore() as vs:
        vol = vs.create("ebs", 160 * 1024 * 1024)
    def exported() -> None:
        assert subprocess.run(["pgrep", "-f", f"qemu-nbd .*{vol.path}"], capture_output=True).returncode == 0

    got = interrupt_cli_run(["--profile", "kvm-ebs-nbd", "--suite", "storage", "--size", "64M",
                             "--tests", "standard", "--runtime", "30"], while_running=exported)
    assert got.returncode == 1, got.output
    assert got.run.state == "aborted" and "SIGINT" in (got.run.reason or ""), got.run.reason
    assert [g.name for g in list_guests(libvirt_conn) if "kvm-ebs-nbd" in g.name] == []
    assert subprocess.run(["pgrep", "-f", f"qemu-nbd .*{vol.path}"], capture_output=True).returncode == 1
    with VolumeStore() as vs:
        assert vs.get("ebs").attached_run is None
    assert work_files(state) == []


def _aoe_left(path: str) -> list[str]:
    """What a guest-attach AoE run could leave: vblade on the volume, the run's bridge."""
    from cloudbox.core.disks.volumes import aoe
    from cloudbox.core.spec.addresses import BRIDGE

    return ([f"vblade pid {p}" for p in aoe.running(path)]
            + ([f"bridge {BRIDGE}"] if os.path.exists(f"/sys/class/net/{BRIDGE}") else []))


@pytest.fixture
def volume_run(state, libvirt_conn) -> Callable[[str, str], Run]:
    """A quick storage run of a volume profile on a fresh volume "ebs", checked for what every such run shows:
    completed, attached as the profile says, the guest's writes in the volume's file, a disk in the domain only when
    the guest does not attach the volume itself, and nothing left after it (no vblade or qemu-nbd on the volume, no
    bridge, the volume free, no work files)."""
    def run_on_volume(profile: str, attach_mode: str) -> Run:
        with VolumeStore() as vs:
            vol = vs.create("ebs", 160 * 1024 * 1024)
        before = hashlib.sha256(Path(vol.path).read_bytes()).hexdigest()
        run = completed_run(RunSpec(profile=profile, suite="storage", size="quick", storage_tests="smoke", runtime=3))
        assert run.provenance.volume is not None and run.provenance.volume.attach == attach_mode, run.provenance.volume
        assert run.provenance.domain_xml and ("<disk" in run.provenance.domain_xml) == (attach_mode != "guest")
        assert hashlib.sha256(Path(vol.path).read_bytes()).hexdigest() != before  # the guest's writes reached it
        assert subprocess.run(["pgrep", "-f", f"qemu-nbd .*{vol.path}"], capture_output=True).returncode == 1
        assert _aoe_left(vol.path) == []  # vblade, and the bridge of either scheme
        assert iscsi.running(vol.path) == []  # no tgtd holds the volume
        with VolumeStore() as vs:
            assert vs.get("ebs").attached_run is None
        assert work_files(state) == []
        return run

    return run_on_volume


@pytest.mark.full  # 32 s under TCG here; the iSCSI run below is make test's guest-attach volume test
def test_quick_storage_run_over_aoe_attached_by_the_guest(volume_run):
    """disk.attach = guest: vblade serves the volume on the guest's bridge, the guest's aoe driver reads and writes
    it over its NIC; the host domain cannot attach AoE here, so there is no baseline and the run says why."""
    if shutil.which("vblade") is None:
        pytest.skip("vblade is not installed (make deps)")
    run = volume_run("kvm-ebs-aoe-guest", "guest")
    v = run.provenance.volume
    assert v is not None and (v.scheme, v.attach, v.name) == ("aoe", "guest", "ebs")
    assert v.server.startswith("vblade on ") and v.target.startswith("e") and v.tls.startswith("none")
    # the guest's writes went through vblade to the volume's file
    assert (v.server_bytes_written or 0) >= 16 * 1024 * 1024, v
    for test in ("seq-write-64k", "seq-read-64k", "randread-4k-qd32"):
        m = run.measurement("guest", test, "MB/s")
        assert m is not None and m.value > 0, test
        assert run.measurement("baseline", test, "MB/s") is None, test  # never a local disk in its place
    if not attach.kernel_module_available("aoe"):
        assert "has none" in v.baseline and "a local disk is not the same volume" in v.baseline
    assert labels.target_label(run) == "EBS (AoE)"
    assert labels.driver_label(run) == "e1000 NIC, the guest's AoE initiator"


@pytest.mark.full
def test_ctrl_c_with_the_guest_attached_over_aoe_leaves_nothing(state, libvirt_conn):
    """SIGINT while the guest reads the volume over AoE: aborted, and the guest, vblade, the bridge and the
    attachment are gone."""
    from cloudbox.core.virt.guest import list_guests

    if shutil.which("vblade") is None:
        pytest.skip("vblade is not installed (make deps)")
    with VolumeStore() as vs:
        vol = vs.create("ebs", 160 * 1024 * 1024)

    def served() -> None:
        assert _aoe_left(vol.path) != []

    got = interrupt_cli_run(["--profile", "kvm-ebs-aoe-guest", "--suite", "storage", "--size", "64M",
                             "--tests", "standard", "--runtime", "30"], while_running=served)
    assert got.returncode == 1, got.output
    assert got.run.state == "aborted" and "SIGINT" in (got.run.reason or ""), got.run.reason
    assert [g.name for g in list_guests(libvirt_conn) if "kvm-ebs-aoe-guest" in g.name] == []
    assert _aoe_left(vol.path) == []
    with VolumeStore() as vs:
        assert vs.get("ebs").attached_run is None
    assert work_files(state) == []


@pytest.mark.full  # 56 s under TCG here; the iSCSI run below is make test's guest-attach test
def test_quick_storage_run_over_nbd_attached_by_the_guest(volume_run):
    """disk.attach = guest over NBD: the baseline from the host domain on loopback, then qemu-nbd on the guest's
    bridge with TLS, the guest's nbd-client holding the client certificate the agent handed it."""
    run = volume_run("kvm-ebs-nbd-guest", "guest")
    v = run.provenance.volume
    assert v is not None and (v.scheme, v.attach) == ("nbd", "guest") and "x509" in v.tls
    assert v.uri.startswith("nbds://169.254.") and v.server.startswith("qemu-nbd")
    for side in ("guest", "baseline"):
        for test in ("seq-write-64k", "seq-read-64k", "randread-4k-qd32"):
            m = run.measurement(side, test, "MB/s")
            assert m is not None and m.value > 0, (side, test)
            assert ("volume-from-host" in m.labels) == (side == "baseline")
    assert labels.driver_label(run) == "virtio-net NIC, the guest's NBD initiator"


def test_quick_storage_run_over_iscsi_attached_by_the_guest(volume_run):
    """disk.attach = guest over iSCSI: the baseline from the host domain on loopback (libiscsi both ways), then
    tgtd on the guest's bridge, the guest's iscsi_tcp logged in by iscsistart with this box's initiator name and CHAP
    secret; the domain has no disk of the volume and the guest's writes went through tgtd."""
    run = volume_run("kvm-ebs-iscsi-guest", "guest")
    v = run.provenance.volume
    assert v is not None and (v.scheme, v.attach, v.name) == ("iscsi", "guest", "ebs")
    assert v.uri.startswith("iscsi://169.254.") and v.server.startswith("tgtd") and "CHAP" in v.tls
    assert "guest's bridge" in v.tls
    assert (v.server_bytes_written or 0) >= 16 * 1024 * 1024, v
    for test in ("seq-write-64k", "seq-read-64k", "randread-4k-qd32"):
        m = run.measurement("guest", test, "MB/s")
        assert m is not None and m.value > 0, test
    for test, reader in (("seq-write-64k", "libiscsi-relay"), ("seq-read-64k", "iscsi-perf")):
        base = run.measurement("baseline", test, "MB/s")
        assert base is not None and base.value > 0 and reader in base.labels, test
    assert labels.driver_label(run) == "virtio-net NIC, the guest's iSCSI initiator"
    secret = iscsi.chap().secret  # on iscsistart's command line in the guest, and nowhere in the run's record
    with ResultStore() as store:
        assert not any(secret in str(e.payload) for e in store.events_since(run.id, 0, limit=10000))
    assert secret not in str(run.provenance.to_stored())
