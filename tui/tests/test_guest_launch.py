"""The benchmark guest's launch path on a real libvirtd + QEMU: every disk bus and NIC model the presets use comes
up with only the drivers the host names on the kernel command line, and the launch trace sees each phase."""

from __future__ import annotations

import os
import subprocess
import uuid

import pytest

from cloudbox.core.disks import backing
from cloudbox.core.spec.profiles import Profile, find_profile
from cloudbox.core.virt import accel
from cloudbox.core.virt.domain import DomainPlan, render_domain
from cloudbox.core.virt.guestimage import CMDLINE
from cloudbox.core.virt.launchtrace import trace_launch

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root: libvirtd, a bridge")]

# bus, NIC model, the guest's disk, the driver its NIC binds to; make test boots the UEC default's (the studies'
# most used), make test-full the others (6-8 s each under TCG)
FULL = pytest.mark.full
CASES = [
    ("scsi-lsi", "e1000", "sda", "e1000"),
    pytest.param("ide", "rtl8139", "sda", "8139cp", marks=FULL),
    pytest.param("sata", "e1000", "sda", "e1000", marks=FULL),
    pytest.param("virtio-scsi", "virtio", "sda", "virtio_net", marks=FULL),
]


@pytest.fixture
def bridge():
    name = f"cbtl{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "link", "add", "name", name, "type", "bridge"], check=True)
    subprocess.run(["ip", "link", "set", name, "up"], check=True)
    yield name
    subprocess.run(["ip", "link", "del", name], check=False)


@pytest.mark.parametrize(("bus", "model", "disk", "nic_driver"), CASES)
def test_each_bus_and_nic_with_only_its_drivers(bus, model, disk, nic_driver, state, libvirt_conn, guest_image,
                                                bridge):
    data = find_profile("virtio-disk").model_dump()
    data["disk"]["bus"], data["network"]["model"] = bus, model
    prof = Profile.model_validate(data)
    acc = accel.detect(guest_image.kernel)
    st = backing.prepare("sparse-file", work_dir=state / "w", size_bytes=32 * 1024**2, fmt="raw")
    log = state / "w" / "console.log"
    xml = render_domain(DomainPlan(prof, name=f"cloudbox-test-launch-{bus}", domain_type=acc.domain_type,
                                   kernel=str(guest_image.boot_kernel(acc.domain_type)),
                                   initrd=str(guest_image.boot_initrd(acc.domain_type, prof.guest.memory_mib)),
                                   cmdline=CMDLINE, disk_path=st.path,
                                   disk_is_block=False, bridge=bridge, run_uuid=f"test-launch-{bus}",
                                   console_log=str(log)))
    assert "cloudbox.drivers=" in xml
    g, trace = trace_launch(libvirt_conn, xml, console_log=log)
    try:
        nics = g.sh("for n in /sys/class/net/*; do [ ${n##*/} = lo ] || "
                    "echo ${n##*/} $(basename $(readlink $n/device/driver)); done", timeout=60).check().stdout
        assert nic_driver in nics.split(), nics
        assert g.sh(f"test -b /dev/{disk}", timeout=30).exitcode == 0, g.sh("ls /sys/block", timeout=30).stdout
        # fio itself runs, on this bus
        g.run(["/usr/bin/fio", "--name=w", f"--filename=/dev/{disk}", "--rw=write", "--bs=64k", "--size=4M",
               "--direct=1", "--output-format=terse"], timeout=120, check=True)
        mods = g.sh("cut -d' ' -f1 /proc/modules", timeout=30).check().stdout.split()
        assert "ata_piix" not in mods or bus == "ide"  # absent hardware's drivers stay unloaded
    finally:
        g.destroy()
        st.remove()
    assert {"initramfs unpacked", "/init run", "drivers", "agent"} <= set(trace.guest_marks)
    assert 0 < trace.created < trace.kernel_zero < trace.agent
    phases = [v for _, v in trace.phases()]
    assert all(v is not None and v >= -0.5 for v in phases), trace.phases()
    assert sum(phases) == pytest.approx(trace.agent)


def test_a_256_mib_guest_boots_the_compressed_root(state, libvirt_conn, guest_image):
    data = find_profile("virtio-disk").model_dump()
    data["guest"]["memory_mib"] = 256  # the smallest a profile allows
    prof = Profile.model_validate(data)
    acc = accel.detect(guest_image.kernel)
    initrd = guest_image.initrd  # the compressed root, as Xen and the nodes boot it
    st = backing.prepare("sparse-file", work_dir=state / "w", size_bytes=32 * 1024**2, fmt="raw")
    log = state / "w" / "console.log"
    xml = render_domain(DomainPlan(prof, name="cloudbox-test-launch-256", domain_type=acc.domain_type,
                                   kernel=str(guest_image.boot_kernel(acc.domain_type)), initrd=str(initrd),
                                   cmdline=CMDLINE,
                                   disk_path=st.path, disk_is_block=False, bridge=None, run_uuid="test-launch-256",
                                   console_log=str(log)))
    g, trace = trace_launch(libvirt_conn, xml, console_log=log)
    try:
        g.run(["/usr/bin/fio", "--name=w", "--filename=/dev/vda", "--rw=write", "--bs=64k", "--size=4M",
               "--direct=1", "--output-format=terse"], timeout=120, check=True)
    finally:
        g.destroy()
        st.remove()
    assert trace.agent > 0
