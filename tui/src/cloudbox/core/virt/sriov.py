"""SR-IOV for a run: virtual functions of the NIC the user names (--nic), made by the run and removed after it.

`VirtualFunctions(pf)` is the named NIC (its physical function) as found: refused with the reason when it has no
SR-IOV (no sriov_totalvfs, or 0), when the host has no IOMMU to hand a VF over with (VFIO), or when it already has
VFs (someone else's: cloudbox makes and removes its own only). `create()` asks the NIC for two VFs (their removal
registered by the caller first): the first stays with the host, holding the address the guest's tests reach (the
traffic between the two VFs goes through the NIC's own switch), the second is handed to the guest whole
(libvirt's <interface type='hostdev' managed='yes'>). `remove()` sets the count back to 0. `sriov_nics()` is what
a study shows for the step: the host's NICs that offer VFs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from ..disks.pcidev import iommu_problem
from ..errors import CloudboxError

SYSFS_NET = Path("/sys/class/net")
VF_WAIT_S = 10.0


class SriovRefused(CloudboxError):
    """The named NIC cannot give the run its virtual functions."""


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def sriov_nics(net: Path = SYSFS_NET) -> list[str]:
    """This host's NICs that offer virtual functions (sriov_totalvfs > 0)."""
    return sorted(d.name for d in net.iterdir() if _read(d / "device" / "sriov_totalvfs") not in ("", "0")) \
        if net.is_dir() else []


@dataclass(frozen=True)
class VF:
    """One virtual function: its PCI address, and its host netdev while the host's VF driver holds it."""

    address: str
    netdev: str


class VirtualFunctions:
    """The VFs of NIC `pf` the run makes; refused (SriovRefused) at once when it cannot."""

    def __init__(self, pf: str, *, net: Path = SYSFS_NET, sysfs: Path = Path("/sys")):
        self.pf, self.device = pf, net / pf / "device"
        if not (net / pf).exists():
            raise SriovRefused(f"--nic {pf}: no such network interface on this host; NICs with SR-IOV here: "
                               f"{', '.join(sriov_nics(net)) or 'none'}")
        total = _read(self.device / "sriov_totalvfs")
        if total in ("", "0"):
            raise SriovRefused(f"--nic {pf}: it offers no SR-IOV virtual functions (sriov_totalvfs "
                               f"{total or 'absent'}); NICs with SR-IOV here: {', '.join(sriov_nics(net)) or 'none'}")
        if (why := iommu_problem(sysfs)) is not None:
            raise SriovRefused(f"--nic {pf}: a virtual function is handed to the guest by VFIO, and {why}")
        now = _read(self.device / "sriov_numvfs") or "0"
        if now != "0":
            raise SriovRefused(f"--nic {pf}: it has {now} virtual functions already, which cloudbox did not make; it "
                               f"makes and removes its own only (echo 0 > {self.device}/sriov_numvfs frees it)")
        self.total = int(total)
        self.made = 0

    def create(self, count: int = 2) -> list[VF]:
        """`count` VFs, waited for until each has its PCI address (and its host netdev, the host's VF driver
        willing)."""
        if count > self.total:
            raise SriovRefused(f"--nic {self.pf}: the run needs {count} virtual functions (one for the host's end, "
                               f"one for the guest) and the NIC offers {self.total}")
        self.made = count
        (self.device / "sriov_numvfs").write_text(f"{count}\n")
        deadline = time.monotonic() + VF_WAIT_S
        while True:
            vfs = [self._vf(i) for i in range(count)]
            if all(v.address and v.netdev for v in vfs) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if not all(v.address for v in vfs):
            got = sum(1 for v in vfs if v.address)
            raise SriovRefused(f"--nic {self.pf}: asked for {count} virtual functions and {got} appeared within "
                               f"{VF_WAIT_S:.0f} s")
        return vfs

    def _vf(self, i: int) -> VF:
        link = self.device / f"virtfn{i}"
        addr = link.resolve().name if link.exists() else ""
        nets = sorted(p.name for p in (link / "net").iterdir()) if (link / "net").is_dir() else []
        return VF(addr, nets[0] if nets else "")

    def remove(self) -> None:
        """The NIC back to no VFs. Safe to call twice."""
        if self.made:
            (self.device / "sriov_numvfs").write_text("0\n")
            self.made = 0
