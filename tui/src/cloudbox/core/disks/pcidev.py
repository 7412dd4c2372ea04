"""A whole NVMe controller of this host handed to the guest by VFIO (disk.backing = nvme-pci), named by the user.

The controller is named by its PCI address (`--device 0000:01:00.0`); nothing else is ever touched (without one,
`spare_controllers()` only reads sysfs and the mount table to name the candidates).
`check()` refuses it, with the reason, where this host has no IOMMU (no /sys/kernel/iommu_groups), where the
address is not an NVMe controller, where one of its namespaces is in use (mounted, the running system, swap, a
member of md or dm) or where its IOMMU group holds other devices bound to a host driver (passing it through would
take them too), and, when a namespace holds data, unless `--destroy` names the same address: the same rule as a
block device's. `prepare()` is the store for the run: the first namespace, which the bare-metal baseline measures
before libvirt (managed='yes') unbinds the controller from nvme, binds it to vfio-pci for the guest and gives it
back after. `iommu_problem()` is what a study shows for the step on a host without an IOMMU.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import DeviceRefused
from . import backing

SYSFS = Path("/sys")
PCI_ADDRESS = re.compile(r"^([0-9a-f]{4}):([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])$")
NVME_CLASS = "0x010802"  # PCI class: mass storage, non-volatile memory, NVM Express
# Drivers that may share the controller's IOMMU group without being passed through with it.
HARMLESS_DRIVERS = ("vfio-pci", "pcieport", "")


def is_pci_address(text: str) -> bool:
    """`text` is a full PCI address, domain included: 0000:01:00.0."""
    return PCI_ADDRESS.match(text) is not None


def address_parts(addr: str) -> dict[str, str]:
    """The address as libvirt's <address domain bus slot function> attributes: 0x0000, 0x01, 0x00, 0x0."""
    m = PCI_ADDRESS.match(addr)
    if m is None:
        raise ValueError(f"not a PCI address: {addr!r} (allowed: DDDD:BB:SS.F, e.g. 0000:01:00.0)")
    return {"domain": f"0x{m.group(1)}", "bus": f"0x{m.group(2)}", "slot": f"0x{m.group(3)}",
            "function": f"0x{m.group(4)}"}


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def iommu_problem(sysfs: Path = SYSFS) -> str | None:
    """Why this host cannot hand a PCI device to a guest (no IOMMU, no VFIO), or None."""
    groups = sysfs / "kernel" / "iommu_groups"
    if not groups.is_dir() or not any(groups.iterdir()):
        return ("this host has no IOMMU (no /sys/kernel/iommu_groups): passing a PCI device to a guest (VFIO) needs "
                "VT-d or AMD-Vi on in the firmware and intel_iommu=on or amd_iommu=on on the kernel's command line; "
                "a virtual machine needs an emulated IOMMU (QEMU -device intel-iommu)")
    if not (sysfs / "module" / "vfio_pci").exists() and not (sysfs / "bus" / "pci" / "drivers" / "vfio-pci").exists():
        modules = Path("/lib/modules")
        found = any(modules.glob("*/kernel/drivers/vfio/pci/vfio-pci.ko*")) if modules.is_dir() else False
        if not found:
            return "this host's kernel has no vfio-pci driver (CONFIG_VFIO_PCI), which hands a PCI device to a guest"
    return None


def namespaces(addr: str, sysfs: Path = SYSFS) -> list[str]:
    """The block devices of the NVMe controller at `addr` (nvme0n1, ...), while the host's nvme driver holds it.

    With native NVMe multipath (CONFIG_NVME_MULTIPATH, on in Debian's kernel) the controller holds only its hidden
    paths (nvme0c0n1: subsystem 0, controller 0, namespace 1), and the block device is the subsystem's nvme0n1."""
    dev = sysfs / "bus" / "pci" / "devices" / addr
    names = set()
    for p in dev.glob("nvme/nvme*/nvme*n*"):
        if m := re.fullmatch(r"nvme(\d+)(?:c\d+)?n(\d+)", p.name):
            names.add(f"nvme{m.group(1)}n{m.group(2)}")
    return sorted(names)


def group_members(addr: str, sysfs: Path = SYSFS) -> list[tuple[str, str]]:
    """(address, driver) of every other device in `addr`'s IOMMU group; driver "" when none is bound."""
    group = sysfs / "bus" / "pci" / "devices" / addr / "iommu_group" / "devices"
    out = []
    for d in sorted(group.iterdir()) if group.is_dir() else []:
        if d.name != addr:
            drv = sysfs / "bus" / "pci" / "devices" / d.name / "driver"
            out.append((d.name, drv.resolve().name if drv.exists() else ""))
    return out


def spare_controllers(sysfs: Path = SYSFS) -> list[str]:
    """The NVMe controllers of this host none of whose namespaces holds the running system or is mounted or swap
    (what a run could be given with --device; nothing is touched to find them)."""
    out = []
    for dev in sorted((sysfs / "bus" / "pci" / "devices").glob("*")):
        if _read(dev / "class") != NVME_CLASS:
            continue
        try:
            for ns in namespaces(dev.name, sysfs):
                backing.check_device(f"/dev/{ns}", confirm=ns)
        except DeviceRefused as e:
            if "holds data" not in str(e):
                continue
        out.append(dev.name)
    return out


def check(addr: str, *, confirm: str | None, sysfs: Path = SYSFS,
          check_namespace=backing.check_device) -> list[str]:  # type: ignore[no-untyped-def]
    """Refuse (DeviceRefused) to hand the controller at `addr` to a guest unless it is safe and confirmed; returns
    its namespaces (/dev/nvme0n1, ...)."""
    if not is_pci_address(addr):
        raise DeviceRefused(f"--device {addr}: disk.backing = nvme-pci names an NVMe controller by its PCI address; "
                            "allowed: DDDD:BB:SS.F, e.g. 0000:01:00.0 (lspci -D -d ::0108 lists them)")
    why = iommu_problem(sysfs)
    if why:
        raise DeviceRefused(f"{addr}: refused: {why}")
    dev = sysfs / "bus" / "pci" / "devices" / addr
    if not dev.is_dir():
        raise DeviceRefused(f"{addr}: no such PCI device on this host")
    if _read(dev / "class") != NVME_CLASS:
        raise DeviceRefused(f"{addr}: not an NVMe controller (PCI class {_read(dev / 'class') or '?'}; NVMe is "
                            f"{NVME_CLASS})")
    others = [(a, d) for a, d in group_members(addr, sysfs) if d not in HARMLESS_DRIVERS]
    if others:
        listed = ", ".join(f"{a} ({d})" for a, d in others)
        raise DeviceRefused(f"{addr}: refused: its IOMMU group also holds {listed}, bound to host drivers; VFIO "
                            "hands a group over whole, so they would go too")
    names = namespaces(addr, sysfs)
    for ns in names:
        try:
            check_namespace(f"/dev/{ns}", confirm=ns if confirm == addr else None)
        except DeviceRefused as e:
            if "holds data" in str(e):
                # The signatures only: the block device's own advice (--destroy naming the namespace) is not this.
                sigs = str(e).split("(", 1)[1].split(")", 1)[0]
                raise DeviceRefused(f"{addr}: refused: its namespace /dev/{ns} holds data ({sigs}). To destroy it "
                                    f"anyway name the controller: --device {addr} --destroy {addr}") from None
            raise DeviceRefused(f"{addr}: {e}") from None
    return [f"/dev/{ns}" for ns in names]


def prepare(addr: str, *, work_dir: Path, size_bytes: int, confirm: str | None) -> backing.BackingStore:
    """The run's store for the controller at `addr` (checked): its first namespace, for the baseline and the
    sampler while the host holds it; the guest gets the whole controller."""
    names = check(addr, confirm=confirm)
    if not names:
        raise DeviceRefused(f"{addr}: the NVMe controller has no namespace the host's nvme driver shows; the "
                            "bare-metal baseline needs one (is it bound to nvme?)")
    store = backing.prepare("block-device", work_dir=work_dir, size_bytes=size_bytes, fmt="raw", device=names[0],
                            confirm=names[0].removeprefix("/dev/") if confirm == addr else None)
    store.kind = "nvme-pci"
    store.pci = addr
    store.model = f"{store.model}; the whole controller {addr} handed to the guest by VFIO"
    return store
