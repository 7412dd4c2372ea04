"""LV-backed volumes: a logical volume in a volume group the user names, made and removed with lvm2's tools.

cloudbox never makes or changes a volume group: the group is the user's explicit choice of where volumes go (a disk
they gave to LVM), and cloudbox only adds and removes its own LVs in it, each named cloudbox-VOLUME.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ... import ledger
from ...errors import CloudboxError, NoSpace, UsageError
from ..backing import human_size

# lvm2's rule for VG names (lvm(8), "VALID NAMES"), without the names it reserves.
VG_PATTERN = r"[A-Za-z0-9+_.][A-Za-z0-9+_.-]{0,126}"
LV_PREFIX = "cloudbox-"
TIMEOUT_S = 120
# Quiet about descriptors inherited from the caller (the TUI's threads hold some open).
_ENV = {**os.environ, "LVM_SUPPRESS_FD_WARNINGS": "1"}


def lv_name(volume: str) -> str:
    return LV_PREFIX + volume


def lv_path(vg: str, volume: str) -> str:
    return f"/dev/{vg}/{lv_name(volume)}"


def _lvm(*args: str, what: str) -> str:
    if shutil.which(args[0]) is None:
        raise UsageError(f"{what}: {args[0]} not found; LV-backed volumes need lvm2 (apt install lvm2); allowed "
                         "without it: a volume in a file (cloudbox volume create NAME --size S, without --vg)")
    try:
        r = subprocess.run(list(args), capture_output=True, text=True, timeout=TIMEOUT_S, env=_ENV,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise CloudboxError(f"{what}: {args[0]} did not finish in {TIMEOUT_S} s") from None
    if r.returncode != 0:
        raise CloudboxError(f"{what}: {' '.join(args[:1])} failed: {(r.stderr or r.stdout).strip()[-400:]}")
    return r.stdout


def groups() -> dict[str, int]:
    """This box's volume groups and the bytes free in each."""
    out = _lvm("vgs", "--noheadings", "--units", "b", "--nosuffix", "-o", "vg_name,vg_free",
               what="listing the volume groups")
    found = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            found[parts[0]] = int(parts[1])
    return found


def check_group(vg: str, size_bytes: int, field: str = "--vg") -> None:
    """Refuse a VG name lvm2 would not take, a group this box does not have, or one without `size_bytes` free."""
    if not isinstance(vg, str) or not re.fullmatch(VG_PATTERN, vg) or vg in (".", ".."):
        raise UsageError(f"{field} {vg!r} is not a volume group name; allowed: letters, digits and + _ . -, not "
                         "starting with '-'")
    have = groups()
    if vg not in have:
        allowed = ", ".join(sorted(have)) or "none here (make one on a disk you choose: vgcreate VG /dev/...)"
        raise UsageError(f"{field} {vg!r}: no such volume group on this box; allowed: {allowed}")
    if have[vg] < size_bytes:
        raise NoSpace(f"{field} {vg!r} has {human_size(have[vg])} free, not the {human_size(size_bytes)} asked for; "
                      f"allowed: at most {human_size(have[vg])}")


def create(vg: str, volume: str, size_bytes: int) -> tuple[str, int]:
    """A new LV for `volume` in `vg` (checked by check_group first); its path and its size (lvm2 rounds up to whole
    extents). Its first blocks are zeroed and old signatures wiped, so a guest never finds a previous file system."""
    _lvm("lvcreate", "--yes", "--wipesignatures", "y", "--zero", "y", "-L", f"{size_bytes}b", "-n", lv_name(volume),
         vg, what=f"making the logical volume {vg}/{lv_name(volume)}")
    out = _lvm("lvs", "--noheadings", "--units", "b", "--nosuffix", "-o", "lv_size", f"{vg}/{lv_name(volume)}",
               what=f"reading the size of {vg}/{lv_name(volume)}")
    return lv_path(vg, volume), int(out.split()[0])


def remove(vg: str, volume: str) -> None:
    """Remove the volume's LV; one already gone is not an error (a group removed by hand, a half-made create)."""
    name = f"{vg}/{lv_name(volume)}"
    if shutil.which("lvremove") is None:
        raise CloudboxError(f"removing {name}: lvremove not found (lvm2 was removed?); install lvm2 and delete again")
    try:
        _lvm("lvs", "--noheadings", "-o", "lv_name", name, what=f"finding {name}")
    except CloudboxError:
        return
    _lvm("lvremove", "--yes", name, what=f"removing the logical volume {name}")


@ledger.kind
@dataclass(frozen=True)
class Activation(ledger.Held):
    """An LV the run activated (it was not active before): deactivated again."""

    kind: ClassVar[str] = "lv-activation"
    vg: str = ""
    lv: str = ""

    def release(self) -> str:
        if not Path(f"/dev/{self.vg}/{self.lv}").exists():
            return ""
        _lvm("lvchange", "--activate", "n", f"{self.vg}/{self.lv}", what=f"deactivating {self.vg}/{self.lv}")
        return f"deactivated the logical volume {self.vg}/{self.lv}"


def activate(vg: str, volume: str) -> str:
    """The volume's LV active, its device node there (a group not activated at boot); its path. An activation made
    here is in the run's ledger: `deactivate` (or a clean-up after a killed run) undoes it."""
    path = lv_path(vg, volume)
    if Path(path).exists():
        return path
    made = ledger.hold(Activation(vg, lv_name(volume)))
    try:
        _lvm("lvchange", "--activate", "y", f"{vg}/{lv_name(volume)}", what=f"activating {vg}/{lv_name(volume)}")
    except BaseException:
        if not Path(path).exists():
            made.done()
        raise
    deadline = time.monotonic() + 10
    while not Path(path).exists():  # udev makes the /dev/VG/LV link
        if time.monotonic() > deadline:
            raise CloudboxError(f"{path}: no device node 10 s after activating {vg}/{lv_name(volume)}")
        time.sleep(0.1)
    return path


def deactivate(vg: str, volume: str) -> None:
    """Deactivate the volume's LV when the run activated it (its ledger says so); an LV that was active before the
    run stays active."""
    entry = ledger.active().find(Activation(vg, lv_name(volume)))
    if entry is not None:
        entry.release()
