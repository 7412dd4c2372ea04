"""AoE volumes attached by the guest (disk.attach = guest): the checks before a run, the domain without a disk, the
labels, and a real vblade on a real bridge made by the test (started, serving, stopped, nothing left)."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from cloudbox.core.disks.volumes import aoe, attach, transports
from cloudbox.core.disks.volumes.store import VolumeStore
from cloudbox.core.errors import CloudboxError
from cloudbox.core.spec import profiles
from cloudbox.core.studies import loading
from cloudbox.core.virt.domain import DomainPlan, render_domain

MIB = 1024 * 1024


def test_guest_attach_is_checked_per_scheme_and_hypervisor():
    attach.check_attach("aoe", "guest", has_module=lambda m: False)  # the host needs no aoe driver for it
    attach.check_attach("nbd", "guest", has_module=lambda m: False)
    attach.check_attach("iscsi", "guest", has_module=lambda m: False)
    attach.check_attach("nvme-tcp", "guest", has_module=lambda m: False)  # the guest's own nvme_tcp
    with pytest.raises(attach.AttachRefused, match="KVM/QEMU only, not guest.hypervisor = xen"):
        attach.check_attach("aoe", "guest", hypervisor="xen")
    # host mode needs the host kernel's initiator; without it the message names the driver and what works here
    with pytest.raises(attach.AttachRefused, match=r"its aoe driver, which this kernel .* lacks.*disk.attach = qemu"):
        attach.check_attach("aoe", "host", has_module=lambda m: False)


def test_no_baseline_says_why():
    assert "this kernel" in transports.no_aoe_baseline()
    assert "a local disk is not the same volume" in transports.no_aoe_baseline()


def test_the_guest_presets_are_valid_and_runnable_and_the_host_one_is_not():
    for name, volume in (("kvm-ebs-aoe-guest", "aoe:ebs"), ("kvm-ebs-nbd-guest", "nbd:ebs")):
        guest = profiles.find_profile(name)
        assert (guest.disk.backing, guest.disk.attach, guest.disk.volume) == ("network-volume", "guest", volume)
        assert loading.cannot_run(guest) is None
    # host attach runs where the kernel has the initiator (the appliance): a study counts it as runnable
    for name in ("kvm-ebs-aoe", "kvm-ebs-aoe-virtio", "kvm-ebs-iscsi-host", "kvm-ebs-nvme", "kvm-ebs-nvme-guest"):
        assert loading.cannot_run(profiles.find_profile(name)) is None, name


def _render(prof: profiles.Profile, **kw: object) -> str:
    args: dict[str, object] = dict(name="g", domain_type="qemu", kernel="/k", initrd="/i", cmdline="console=ttyS0",
                                   disk_path="", disk_is_block=False, bridge="cbbr0")
    args.update(kw)
    return render_domain(DomainPlan(prof, **args))  # type: ignore[arg-type]


def test_a_guest_attach_domain_has_a_nic_and_no_disk():
    prof = profiles.find_profile("kvm-ebs-aoe-guest")
    root = ET.fromstring(_render(prof))
    assert root.findall("devices/disk") == []
    assert root.find("devices/interface/source").get("bridge") == "cbbr0"
    assert root.find("devices/interface/model").get("type") == "e1000"
    drivers = root.findtext("os/cmdline").split("cloudbox.drivers=")[1].split(",")
    assert "e1000" in drivers and "sym53c8xx" not in drivers  # no disk on the profile's bus
    with pytest.raises(ValueError, match="needs a bridge"):
        _render(prof, bridge=None)
    with pytest.raises(ValueError, match="disk_path must be empty"):
        _render(prof, disk_path="/var/tmp/x.img")


def test_shelves_are_in_range_and_per_run():
    shelves = {aoe.shelf_for(uuid.uuid4().hex) for _ in range(200)}
    assert all(0 <= s <= aoe.MAX_SHELF for s in shelves) and len(shelves) > 150


@pytest.fixture
def bridge():
    if os.geteuid() != 0:
        pytest.skip("a bridge and vblade's packet socket need root")
    name = f"cbtaoe{os.getpid() % 10000}"
    subprocess.run(["ip", "link", "add", name, "type", "bridge"], check=True)
    try:
        subprocess.run(["ip", "link", "set", name, "up"], check=True)
        yield name
    finally:
        subprocess.run(["ip", "link", "del", name], check=False)


@pytest.mark.root
def test_vblade_serves_on_the_bridge_and_is_gone_after(state, bridge):
    if shutil.which("vblade") is None:
        pytest.skip("vblade is not installed (make deps)")
    with VolumeStore() as vs:
        vol = vs.create("ebs", 8 * MIB)
    work = state / "work"
    work.mkdir()
    exp = aoe.start("ebs", vol.path, bridge, shelf=aoe.shelf_for("ab12" * 8), log=work / "vblade.log")
    try:
        assert aoe.running(vol.path) == [exp.pid]
        assert exp.uri == f"aoe:e{exp.shelf}.0@{bridge}"
        # the bridge's address is pinned (set by hand: 3), so a guest plugged in later does not change it
        assert Path(f"/sys/class/net/{bridge}/addr_assign_type").read_text().strip() == "3"
        assert set(exp.io()) == {"read_bytes", "write_bytes"}
    finally:
        exp.stop()
    assert aoe.running(vol.path) == [] and not (work / "vblade.log").exists()
    exp.stop()  # twice is fine


@pytest.mark.root
def test_vblade_on_a_missing_interface_is_refused_and_leaves_nothing(state):
    with VolumeStore() as vs:
        vol = vs.create("ebs", 8 * MIB)
    with pytest.raises(CloudboxError, match="no network interface 'nope0'"):
        aoe.start("ebs", vol.path, "nope0", shelf=1, log=state / "vblade.log")
    assert aoe.running(vol.path) == []


def test_an_nbd_guest_export_serves_loopback_then_the_bridge_and_hands_qemu_nothing(state, bridge):
    """NBD with guest attach: qemu-nbd on loopback for the baseline, moved to the host's address on the guest's
    bridge by serve(); the domain gets no network disk source; close() leaves no qemu-nbd."""
    with VolumeStore() as vs:
        vol = vs.create("ebs", 16 * MIB)
    subprocess.run(["ip", "addr", "add", "169.254.199.1/24", "dev", bridge], check=True)
    ve = attach.export_for_run("nbd:ebs", "guest", run_uuid="run-n", work_dir=state / "work" / "run-n",
                               size_bytes=8 * MIB)
    try:
        assert ve.store.network is None and ve.no_baseline == "" and ve.uri.startswith("nbds://127.0.0.1:")
        loop_pid = ve.export.pid if ve.export else None
        exp = ve.serve(bridge, "169.254.199.1")
        assert ve.uri == exp.uri and exp.uri.startswith("nbds://169.254.199.1:") and ve.store.path == exp.uri
        assert loop_pid is not None and not os.path.exists(f"/proc/{loop_pid}")
        assert ve.creds is not None and (ve.creds.client_dir / "client-key.pem").exists()
    finally:
        ve.close()
    assert subprocess.run(["pgrep", "-f", f"qemu-nbd .*{vol.path}"], capture_output=True).returncode == 1


def test_a_guest_attach_export_is_marked_then_cleared(state):
    """export_for_run for a guest-attached AoE volume only checks and marks it; close() clears the mark and the
    work directory (the export itself starts once the guest's bridge exists)."""
    if shutil.which("vblade") is None:
        pytest.skip("vblade is not installed (make deps)")
    with VolumeStore() as vs:
        vs.create("ebs", 16 * MIB)
    ve = attach.export_for_run("aoe:ebs", "guest", run_uuid="run-g", work_dir=state / "work" / "run-g",
                               size_bytes=8 * MIB)
    try:
        assert ve.export is None and ve.server == "not served yet" and ve.no_baseline.startswith("no baseline")
        assert ve.store.path.startswith("aoe:e") and ve.store.baseline_target == ""
        with VolumeStore() as vs:
            assert vs.get("ebs").attached_run == "run-g"
    finally:
        ve.close()
    with VolumeStore() as vs:
        assert vs.get("ebs").attached_run is None
    assert not (state / "work" / "run-g").exists()
