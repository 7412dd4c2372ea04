"""Bad inputs: devices cloudbox must refuse (mounted, root disk, holding data), a full disk, an unreachable
libvirtd, a guest without fio. Each gives a clear error and leaves nothing behind."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from cloudbox.core.disks import backing
from cloudbox.core.errors import CloudboxError, DeviceRefused, GuestError, NoSpace
from cloudbox.core.record.results import ResultStore
from cloudbox.core.run import runs
from cloudbox.core.spec import catalogue
from cloudbox.core.spec.runspec import RunSpec

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: loop devices, mounts, libvirtd")


@pytest.fixture
def loopdev(tmp_path):
    img = tmp_path / "disk.img"
    with open(img, "wb") as f:
        f.truncate(64 * 1024 * 1024)
    dev = subprocess.run(["losetup", "--find", "--show", str(img)], capture_output=True, text=True,
                         check=True).stdout.strip()
    yield dev
    subprocess.run(["umount", "-l", dev], capture_output=True)
    subprocess.run(["losetup", "-d", dev], capture_output=True)


@root_only
def test_refuses_mounted_device(loopdev, tmp_path):
    subprocess.run(["mkfs.ext4", "-q", loopdev], check=True)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", loopdev, str(mnt)], check=True)
    try:
        with pytest.raises(DeviceRefused, match=rf"{loopdev}: refused: .* is mounted on {mnt}"):
            backing.check_device(loopdev, confirm=os.path.basename(loopdev))
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


@root_only
def test_refuses_root_disk():
    root = backing.dev_name_for_path("/")
    if root is None:
        pytest.skip("the root file system is not on a block device here (overlay/tmpfs)")
    dev = f"/dev/{backing.parent_disk(root)}"
    with pytest.raises(DeviceRefused, match="refused: .*(running system|mounted)"):
        backing.check_device(dev, confirm=backing.parent_disk(root))


@root_only
def test_refuses_device_with_signature_unless_named(loopdev):
    subprocess.run(["mkfs.ext4", "-q", loopdev], check=True)
    name = os.path.basename(loopdev)
    with pytest.raises(DeviceRefused, match=rf"holds data \(ext4\).*--destroy {name}"):
        backing.check_device(loopdev, confirm=None)
    with pytest.raises(DeviceRefused):
        backing.check_device(loopdev, confirm="sdz")  # naming another device is no confirmation
    backing.check_device(loopdev, confirm=name)  # explicit: allowed


@root_only
def test_blank_device_is_accepted(loopdev):
    backing.check_device(loopdev, confirm=None)


def test_refuses_non_block_device(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(DeviceRefused, match="not a block device"):
        backing.check_device(str(f), confirm=None)
    with pytest.raises(DeviceRefused, match="no such device"):
        backing.check_device("/dev/does-not-exist", confirm=None)


@root_only
def test_full_disk_no_space_for_backing_file(state):
    mnt = state / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(mnt)], check=True)
    try:
        with pytest.raises(NoSpace, match=r"not enough free space .* need .* free"):
            backing.prepare("prealloc-file", work_dir=mnt / "run-x", size_bytes=64 * 1024**2, fmt="raw")
        assert list(mnt.iterdir()) == []  # the work dir it made was removed
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_refuses_untraversable_work_dir(tmp_path):
    # pytest's tmp dirs are 0700: QEMU (libvirt-qemu) could not reach a store there; nothing is created.
    with pytest.raises(CloudboxError, match="not traversable by others .* Choose another --work-dir"):
        backing.prepare("sparse-file", work_dir=tmp_path / "run-x", size_bytes=16 * 1024**2, fmt="raw")
    assert not (tmp_path / "run-x").exists()


def test_refuses_existing_work_dir(state):
    tmp_path = state
    d = tmp_path / "mine"
    d.mkdir()
    (d / "precious").write_text("data")
    with pytest.raises(CloudboxError, match="only removes work directories it created"):
        backing.prepare("sparse-file", work_dir=d, size_bytes=16 * 1024**2, fmt="raw")
    assert (d / "precious").read_text() == "data"


def test_network_volume_is_the_volume_services(state):
    with pytest.raises(CloudboxError, match="network-volume.*exported by the volume service"):
        backing.prepare("network-volume", work_dir=state / "w", size_bytes=16 * 1024**2, fmt="raw",
                        volume="aoe:e1.1")
    assert not (state / "w").exists()


@root_only
def test_a_run_that_does_not_fit_the_disk_is_refused_before_anything_is_recorded(state, guest_image):
    from cloudbox.core.run import preflight

    mnt = state / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(mnt)], check=True)
    try:
        with ResultStore() as store:
            with pytest.raises(preflight.Refused) as e:
                runs.executor(RunSpec(profile="eucalyptus-prealloc", suite="storage", size="64M",
                                      work_dir=str(mnt)), store).execute()
            assert store.list_runs() == []
        assert "not enough free space" in str(e.value) and str(mnt) in str(e.value)
        assert "allowed: a smaller --size, or a --work-dir with more free space" in str(e.value)
        assert list(mnt.iterdir()) == []
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_unreachable_libvirtd(state, guest_image, monkeypatch):
    monkeypatch.setenv("CLOUDBOX_LIBVIRT_URI", "qemu+unix:///system?socket=/nonexistent/libvirt-sock")
    with ResultStore() as store:
        rid = runs.executor(RunSpec(profile="virtio-disk", suite="storage", size="16M"), store).execute()
        run = store.get_run(rid)
    assert run.state == "aborted"
    assert "cannot reach libvirtd" in run.reason and "/nonexistent/libvirt-sock" in run.reason
    work = state / "state" / "work"
    assert not work.exists() or list(work.iterdir()) == []  # libvirt is reached before any store is made


def test_bad_run_arguments(state):
    with ResultStore() as store:
        for spec, msg in [
            (RunSpec(profile="virtio-disk", suite="disk"), "allowed: storage, network, all"),
            (RunSpec(profile="virtio-disk", size="lots"), "allowed: quick, study"),
            (RunSpec(profile="virtio-disk", size="1M"), "too small"),
            (RunSpec(profile="virtio-disk", storage_tests="seq-write-7k"), "unknown storage test"),
            (RunSpec(profile="virtio-disk", net_tests="udp-stream"), "unknown network test"),
        ]:
            with pytest.raises(CloudboxError, match=msg):
                runs.executor(spec, store).execute()
        assert store.list_runs() == []  # rejected before a run was recorded


@pytest.mark.slow
@root_only
def test_guest_without_fio(state, libvirt_conn, guest_image):
    from cloudbox.core.bench import runners
    from cloudbox.core.spec.profiles import find_profile
    from cloudbox.core.virt import accel
    from cloudbox.core.virt.domain import DomainPlan, render_domain
    from cloudbox.core.virt.guest import Guest
    from cloudbox.core.virt.guestimage import CMDLINE

    prof = find_profile("virtio-disk")
    st = backing.prepare("sparse-file", work_dir=state / "w", size_bytes=16 * 1024**2, fmt="raw")
    acc = accel.detect(guest_image.kernel)
    xml = render_domain(DomainPlan(prof, name="cloudbox-test-nofio", domain_type=acc.domain_type,
                                   kernel=str(guest_image.kernel), initrd=str(guest_image.initrd), cmdline=CMDLINE,
                                   disk_path=st.path, disk_is_block=False, bridge=None, run_uuid="test-nofio"))
    g = Guest.start(libvirt_conn, xml)
    try:
        g.wait_agent(timeout=300)
        g.sh("rm -f $(command -v fio)", timeout=30).check()
        with pytest.raises(GuestError, match="has no fio.*rebuild it with 'make guest-image'"):
            runners.GuestRunner(g, lambda: False).check_tools(catalogue.resolve_tests("smoke"))
    finally:
        g.destroy()
        st.remove()
    assert not Path(st.path).exists()
