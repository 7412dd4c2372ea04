"""Fixed machine data for the installer TUI's snapshot tests: a fictional box with a USB stick (the boot
medium), an NVMe disk holding data, a blank disk, a too-small stick and a disk in use; two NICs. Built from
cloudbox.core.install's own dataclasses (no probing), so the screens are the same on every host.

`fixed_backend()` plans without reading a real ESP or running systemd-repart: the plan is made from the core's
own pieces (partition table, definitions, settings files) with fixed sources."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from cloudbox.core.install import Disk, InstallPlan, Machine, Nic, Resolved, Sources
from cloudbox.core.install import answers as answers_mod
from cloudbox.core.install.disks import GiB, MiB
from cloudbox.core.install.plan import compute_table, definitions, settings_files
from cloudbox.tui.install_app import InstallBackend

BY_ID = "/dev/disk/by-id"


def machine() -> Machine:
    disks = [
        Disk("sda", "/dev/sda", "disk", 32 * GiB, model="SanDisk Cruzer Blade", serial="4C530001230518117452",
             transport="usb", removable=True, by_id=(f"{BY_ID}/usb-SanDisk_Cruzer_Blade_4C530001230518117452-0:0",),
             pt_type="gpt", signatures=("gpt partition table",), boot_medium=True,
             refusals=("boot medium: holds the running system (/ on /dev/sda2)",)),
        Disk("nvme0n1", "/dev/nvme0n1", "disk", 1000 * GiB, model="Samsung SSD 980 PRO 1TB",
             serial="S5GXNX0T123456K", transport="nvme",
             by_id=(f"{BY_ID}/nvme-Samsung_SSD_980_PRO_1TB_S5GXNX0T123456K",), pt_type="gpt",
             signatures=("gpt partition table", "ext4 on nvme0n1p1 (label scratch)")),
        Disk("sdb", "/dev/sdb", "disk", 2000 * GiB, model="WDC WD20EZRZ-00Z5HB0", serial="WD-WCC4M1234567",
             transport="sata", by_id=(f"{BY_ID}/ata-WDC_WD20EZRZ-00Z5HB0_WD-WCC4M1234567",)),
        Disk("sdc", "/dev/sdc", "disk", 4 * GiB, model="Generic Flash Disk", serial="0123456789AB",
             transport="usb", removable=True, by_id=(f"{BY_ID}/usb-Generic_Flash_Disk_0123456789AB-0:0",),
             refusals=("smaller than 8 GiB (the installed system needs at least that)",)),
        Disk("sdd", "/dev/sdd", "disk", 500 * GiB, model="ST500DM002-1BD142", serial="Z3T1ABCD",
             transport="sata", by_id=(f"{BY_ID}/ata-ST500DM002-1BD142_Z3T1ABCD",), pt_type="dos",
             signatures=("dos partition table", "xfs on sdd1"), refusals=("mounted: /srv/data (sdd1)",)),
    ]
    nics = [Nic("enp1s0", "52:54:00:12:34:01", "e1000e", True), Nic("enp2s0", "52:54:00:12:34:02", "igb", False)]
    return Machine(disks=disks, nics=nics, cred_dirs=[])


def fixed_plan(resolved: Resolved, sources: Sources) -> InstallPlan:
    iid = resolved.install_id
    return InstallPlan(
        resolved=resolved, mode="fresh", sources=sources, partitions=compute_table(resolved.disk.size, iid),
        table_source="computed", definitions=definitions(iid, []),
        esp_files=[("EFI/BOOT/BOOTX64.EFI", 98 * 1024), ("cloudbox/6.12/vmlinuz", 11 * MiB),
                   ("cloudbox/initrd", 40 * MiB), ("loader/entries/cloudbox-6.12.conf", 120)],
        esp_overrides={"loader/entries/cloudbox-6.12.conf": "title cloudbox 6.12\n"},
        root_used=1800 * MiB, settings=settings_files(resolved), boot=["UEFI: systemd-boot", "legacy BIOS: grub"])


def no_apply(plan: InstallPlan, progress: object) -> bool:
    raise AssertionError("the demo machine's disks do not exist: nothing may be applied to them")


def fixed_backend(**kw: object) -> InstallBackend:
    kw.setdefault("apply", no_apply)
    return InstallBackend(probe=machine, sources=lambda m: Sources(root="/", esp="/dev/sda1"), plan=fixed_plan,
                          hash_password=lambda pw: "$6$fixedsalt$" + "x" * 86, after=lambda what: None,
                          answers_file=Path("/tmp/cloudbox-install-demo/answers.toml"), **kw)  # type: ignore[arg-type]


@contextlib.contextmanager
def by_id_lookup() -> Iterator[None]:
    """check_answers finds the target disk by resolving its by-id link; these disks have no links on this host,
    so look them up by name instead (everything else the core checks as always)."""
    real = answers_mod.find_disk

    def find(disks: list[Disk], path: str) -> Disk | None:
        return next((d for d in disks if path in d.by_id or path == d.path), None)

    answers_mod.find_disk = find  # type: ignore[assignment]
    try:
        yield
    finally:
        answers_mod.find_disk = real
