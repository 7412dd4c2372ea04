"""cloudbox.core.virt.launchtrace without a guest: the dmesg marks and how a launch splits into phases."""

from __future__ import annotations

import pytest

from cloudbox.core.virt.launchtrace import Trace, parse_dmesg

DMESG = """\
[    0.000000] Linux version 6.1.0-56-amd64 (debian-kernel@lists.debian.org)
[    2.261273] Asymmetric key parser 'x509' registered
[    2.755840] Freeing initrd memory: 93724K
[    4.625645] Run /init as init process
[    5.512965] cloudbox-guest: boot: drivers
[    5.600000] cloudbox-guest: boot: agent
[    9.000000] cloudbox-guest: boot: drivers
"""


def test_parse_dmesg_first_of_each_mark():
    assert parse_dmesg(DMESG) == {"initramfs unpacked": 2.75584, "/init run": 4.625645, "drivers": 5.512965,
                                  "agent": 5.6}


def test_phases_add_up_to_the_launch():
    t = Trace(created=0.7, agent=7.0, kernel_zero=1.3, guest_marks=parse_dmesg(DMESG))
    phases = dict(t.phases())
    assert phases["libvirt and QEMU start (createXML call)"] == pytest.approx(0.7)
    assert phases["firmware and kernel load (to the kernel's clock 0)"] == pytest.approx(0.6)
    assert phases["/init: agent started"] == pytest.approx(5.6 - 5.512965)
    assert phases["agent's first answer (host poll)"] == pytest.approx(7.0 - 1.3 - 5.6)
    assert sum(v for v in phases.values() if v is not None) == pytest.approx(7.0)


def test_phases_of_a_guest_without_init_marks():
    marks = parse_dmesg("\n".join(DMESG.splitlines()[:4]))
    phases = dict(Trace(created=0.7, agent=7.0, kernel_zero=1.3, guest_marks=marks).phases())
    assert phases["/init: mounts, drivers loaded"] is None and phases["/init: agent started"] is None
    assert phases["agent's first answer (host poll)"] == pytest.approx(7.0 - 1.3 - 4.625645)
    assert sum(v for v in phases.values() if v is not None) == pytest.approx(7.0)


def test_boot_pair_by_domain_type_and_memory(tmp_path):
    from cloudbox.core.virt.guestimage import GuestImage

    for name, size in (("vmlinuz", 10), ("initrd.img", 10)):
        (tmp_path / name).write_bytes(b"x" * size)
    (tmp_path / "manifest.json").write_text("{}")
    img = GuestImage.locate(tmp_path)
    assert img.boot_kernel("qemu") == tmp_path / "vmlinuz" and img.boot_initrd("qemu", 1024) == img.initrd
    (tmp_path / "vmlinux").write_bytes(b"x")
    with open(tmp_path / "initrd.cpio", "wb") as f:
        f.truncate(96 * 1024 * 1024)
    assert img.boot_kernel("qemu") == tmp_path / "vmlinux" and img.boot_kernel("xen") == img.kernel
    assert img.boot_initrd("kvm", 1024) == tmp_path / "initrd.cpio" and img.boot_initrd("xen", 1024) == img.initrd
    assert img.boot_initrd("qemu", 384) == tmp_path / "initrd.cpio"
    assert img.boot_initrd("qemu", 256) == img.initrd
