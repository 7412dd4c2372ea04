"""The disks of this machine as the installer sees them, and which of them it may write.

`probe_disks()` reads the topology with `lsblk --json --bytes -O` (sizes, model, serial, partitions, mount
points), the signatures with `wipefs --no-act --json` on the disk and on each partition (falling back to
`blkid -p`), the partition entries with `blkid -p`, and the first and last MiB of the disk for data no
tool recognises. Each `Disk` then has one of three statuses:

- ``offered``: blank (no signature, zeros at both ends), big enough, not in use;
- ``confirm``: holds data (a partition table, a file system, RAID/LVM/crypto metadata, unrecognised
  bytes); used only after the user types its serial number (or an answer file names the serial);
- ``refused``: never written whatever the user says: the boot medium (the disk holding the running
  root or /usr, or the one the firmware booted from), a disk with a mounted file system or swap, a disk
  other devices are stacked on (device mapper, md), a read-only disk, a disk smaller than the minimum,
  a disk whose signatures cannot be read.

A disk carrying an earlier cloudbox install made from the same answers is recognised by the partition
UUIDs derived from the install id (`ours`); the installer resumes or skips it without a confirmation.
Nothing here writes to any device.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from cloudbox.core.disks.backing import dev_name_for_path, human_size, mounts, parent_disk, swap_names

GiB = 1024**3
MiB = 1024**2
MIN_DISK_BYTES = 8 * GiB
BY_ID_DIR = "/dev/disk/by-id"

ESP_TYPE = "c12a7328-f81f-11d2-ba4b-00a0c93ec93b"
BIOS_BOOT_TYPE = "21686148-6449-6e6f-744e-656564454649"
ROOT_X86_64_TYPE = "4f68bce3-e8cd-4db1-96e7-fbcaf984b709"
# The namespace of the install id and of the partition UUIDs derived from it (uuid5).
INSTALL_NAMESPACE = uuid.UUID("5f0c2a1e-4d3b-4c8e-9a43-0c1b0dc10b0e")
# systemd-boot records the ESP it was started from in this EFI variable (UTF-16 partition UUID).
LOADER_DEVICE_VAR = Path("/sys/firmware/efi/efivars/LoaderDevicePartUUID-4a67b082-0a4c-41cf-b6c7-440b29bb8c4f")

Status = Literal["offered", "confirm", "refused"]


def part_uuid_for(install_id: str, role: str) -> str:
    """The partition UUID an install with `install_id` gives its partition `role` (esp, bios-boot, root)."""
    return str(uuid.uuid5(uuid.UUID(install_id), role))


@dataclass(frozen=True)
class Part:
    """One partition (or the whole disk's own file system) as probed."""

    name: str
    path: str
    size: int
    part_uuid: str = ""
    part_type: str = ""
    fstype: str = ""
    fs_uuid: str = ""
    label: str = ""
    mountpoints: tuple[str, ...] = ()


@dataclass(frozen=True)
class Disk:
    name: str  # kernel name: sda, vdb, nvme0n1, loop3
    path: str  # /dev/vdb
    kind: str  # lsblk TYPE: disk, loop
    size: int
    model: str = ""
    serial: str = ""
    transport: str = ""
    removable: bool = False
    read_only: bool = False
    by_id: tuple[str, ...] = ()
    pt_type: str = ""  # gpt, dos or ""
    pt_uuid: str = ""
    signatures: tuple[str, ...] = ()  # "gpt partition table", "ext4 on vdc1 (label data)", ...
    parts: tuple[Part, ...] = ()
    table: tuple[tuple[int, str, str], ...] = ()  # the partition table on the disk: (number, UUID, type UUID)
    refusals: tuple[str, ...] = ()  # why it is never written (empty when it may be)
    boot_medium: bool = False
    notes: tuple[str, ...] = field(default=())

    @property
    def has_data(self) -> bool:
        return bool(self.signatures)

    @property
    def status(self) -> Status:
        if self.refusals:
            return "refused"
        return "confirm" if self.has_data else "offered"

    def part(self, part_type: str) -> Part | None:
        """The first partition of this GPT type."""
        return next((p for p in self.parts if p.part_type == part_type), None)

    def install_id_matches(self, install_id: str) -> bool:
        """True when the disk's partitions carry the UUIDs an install with `install_id` gives them."""
        want = {part_uuid_for(install_id, r) for r in ("esp", "bios-boot", "root")}
        have = {uuid for _, uuid, _ in self.table}
        return self.pt_type == "gpt" and want <= have

    @property
    def identity(self) -> str:
        """What a person reads to recognise the disk: model, serial, size."""
        bits = [b for b in (self.model, f"serial {self.serial}" if self.serial else "") if b]
        return f"{self.path} ({human_size(self.size)}{', ' + ', '.join(bits) if bits else ''})"

    def why(self) -> str:
        """One line: why the disk is offered, needs a confirmation, or is refused."""
        if self.refusals:
            return "refused: " + "; ".join(self.refusals)
        if self.has_data:
            how = f"type its serial {self.serial!r} to confirm" if self.serial else "it has no serial to confirm with"
            return "holds data (" + "; ".join(self.signatures) + f"): {how}"
        return "blank: offered"

    def as_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "path": self.path,
            "by_id": list(self.by_id),
            "size": self.size,
            "model": self.model,
            "serial": self.serial,
            "transport": self.transport,
            "removable": self.removable,
            "status": self.status,
            "why": self.why(),
            "signatures": list(self.signatures),
            "refusals": list(self.refusals),
            "boot_medium": self.boot_medium,
        }


# ---------------------------------------------------------------------------------------------- probing
def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True)


def _str(v: object) -> str:
    return "" if v is None else str(v).strip()


def _bool(v: object) -> bool:
    if isinstance(v, bool):
        return v
    return _str(v) in ("1", "true")


def lsblk() -> list[dict[str, object]]:
    """`lsblk --json --bytes -O` as a list of top-level devices (with their "children")."""
    r = _run(["lsblk", "--json", "--bytes", "-O"])
    if r.returncode != 0:
        raise OSError(f"lsblk --json --bytes -O failed: {r.stderr.strip()}")
    data = json.loads(r.stdout or "{}")
    devices: list[dict[str, object]] = data.get("blockdevices", [])
    return devices


def blkid_probe(path: str) -> dict[str, str]:
    """`blkid -p -o export PATH`: the low-level probe of one device (read-only, no cache). {} when nothing."""
    r = _run(["blkid", "-p", "-o", "export", path])
    if r.returncode not in (0, 2):  # 2: nothing found
        raise OSError(r.stderr.strip() or f"blkid -p {path} failed with status {r.returncode}")
    out: dict[str, str] = {}
    for line in r.stdout.splitlines():
        k, sep, v = line.partition("=")
        if sep:
            out[k] = v
    return out


def wipefs_signatures(path: str) -> list[dict[str, str]]:
    """Every signature on one device (`wipefs --no-act --json`): [{"type": "gpt", "offset": ..., ...}]."""
    r = _run(["wipefs", "--no-act", "--json", path])
    if r.returncode != 0:
        raise OSError(r.stderr.strip() or f"wipefs --no-act {path} failed with status {r.returncode}")
    if not r.stdout.strip():
        return []
    sigs: list[dict[str, str]] = json.loads(r.stdout).get("signatures", [])
    return sigs


def partition_table(path: str) -> tuple[tuple[int, str, str], ...]:
    """The partition table as written on the disk (`partx`, read-only), whether or not the kernel has read it."""
    r = _run(["partx", "--pairs", "-o", "NR,UUID,TYPE", path])
    out = []
    for line in r.stdout.splitlines() if r.returncode == 0 else []:
        f = dict(re.findall(r'(\w+)="([^"]*)"', line))
        if f.get("NR", "").isdigit():
            out.append((int(f["NR"]), f.get("UUID", "").lower(), f.get("TYPE", "").lower()))
    return tuple(out)


def _nonzero_ends(path: str, size: int) -> list[str]:
    """Which of the first and last MiB of the device hold bytes other than zero."""
    found = []
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        for where, offset in (("first", 0), ("last", max(size - MiB, 0))):
            data = os.pread(fd, MiB, offset)
            if data.count(0) != len(data):
                found.append(where)
    finally:
        os.close(fd)
    return found


def _mounted_devnums() -> dict[tuple[int, int], str]:
    """Each mounted device's number with its first mount point."""
    out: dict[tuple[int, int], str] = {}
    for num, where in mounts():
        out.setdefault(num, where)
    return out


def _devnum(name: str) -> tuple[int, int] | None:
    try:
        maj, mnr = Path(f"/sys/class/block/{name}/dev").read_text().strip().split(":")
    except OSError:
        return None
    return int(maj), int(mnr)


def _holders(name: str) -> list[str]:
    try:
        return sorted(h.name for h in Path(f"/sys/class/block/{name}/holders").iterdir())
    except OSError:
        return []


def _sysfs_serial(name: str) -> str:
    for f in (f"/sys/block/{name}/serial", f"/sys/block/{name}/device/serial"):
        try:
            v = Path(f).read_text().strip()
        except OSError:
            continue
        if v:
            return v
    return ""


def _loop_backing(name: str) -> str:
    try:
        return Path(f"/sys/block/{name}/loop/backing_file").read_text().strip()
    except OSError:
        return ""


def by_id_links(by_id_dir: str = BY_ID_DIR) -> dict[str, list[str]]:
    """{kernel name: [by-id paths]} from the by-id directory (udev's /dev/disk/by-id)."""
    out: dict[str, list[str]] = {}
    d = Path(by_id_dir)
    if not d.is_dir():
        return out
    for link in sorted(d.iterdir()):
        try:
            target = link.resolve(strict=True)
        except OSError:
            continue
        out.setdefault(target.name, []).append(str(link))
    return out


def loader_device_part_uuid() -> str:
    """The partition UUID of the ESP systemd-boot was started from ("" when not booted that way)."""
    try:
        raw = LOADER_DEVICE_VAR.read_bytes()[4:]  # 4 bytes of attributes, then UTF-16LE text
    except OSError:
        return ""
    return raw.decode("utf-16-le", errors="replace").rstrip("\0").strip().lower()


def boot_medium_names() -> dict[str, str]:
    """{disk name: why it is the boot medium}: the disks holding / and /usr, and the one the firmware booted."""
    out: dict[str, str] = {}
    for mnt in ("/", "/usr"):
        try:
            name = dev_name_for_path(mnt)
        except OSError:
            continue
        if name:
            out.setdefault(parent_disk(name), f"boot medium: holds the running system ({mnt} on /dev/{name})")
    esp = loader_device_part_uuid()
    if esp:
        link = Path(f"/dev/disk/by-partuuid/{esp}")
        try:
            name = link.resolve(strict=True).name
        except OSError:
            name = ""
        if name:
            out.setdefault(parent_disk(name), f"boot medium: the firmware booted from it (ESP /dev/{name})")
    return out


def probe_disks(
    *,
    include_loop: bool = False,
    by_id_dir: str = BY_ID_DIR,
    min_bytes: int = MIN_DISK_BYTES,
) -> list[Disk]:
    """Every disk of this machine with its status (see the module docstring). Writes nothing.

    `include_loop` also lists loop devices (tests; a live system never installs onto one). A loop device's
    serial is its backing file's name, since it has none of its own."""
    mounted = _mounted_devnums()
    swaps = {os.path.realpath(n) for n in swap_names()}
    boot = boot_medium_names()
    links = by_id_links(by_id_dir)
    disks: list[Disk] = []
    for dev in lsblk():
        kind = _str(dev.get("type"))
        name = _str(dev.get("kname") or dev.get("name"))
        if kind not in ("disk", "loop") or (kind == "loop" and not include_loop) or name.startswith("zram"):
            continue  # zram: compressed RAM, not a disk
        size = int(dev.get("size") or 0)  # type: ignore[call-overload]
        if size == 0:
            continue  # an unused loop device, a card reader without a card
        disks.append(_disk(dev, name, kind, size, mounted, swaps, boot, links, min_bytes))
    return disks


def _disk(
    dev: dict[str, object],
    name: str,
    kind: str,
    size: int,
    mounted: dict[tuple[int, int], str],
    swaps: set[str],
    boot: dict[str, str],
    links: dict[str, list[str]],
    min_bytes: int,
) -> Disk:
    path = _str(dev.get("path")) or f"/dev/{name}"
    serial = _str(dev.get("serial")) or _sysfs_serial(name)
    if kind == "loop" and not serial:
        serial = os.path.basename(_loop_backing(name))
    refusals: list[str] = []
    notes: list[str] = []
    if name in boot:
        refusals.append(boot[name])
    if _bool(dev.get("ro")):
        refusals.append("read-only device")
    if size < min_bytes:
        refusals.append(f"too small: {human_size(size)}, the installed system needs at least {human_size(min_bytes)}")

    # The disk itself and its partitions: mounts, swap, stacked devices, signatures.
    children = [c for c in dev.get("children") or [] if isinstance(c, dict)]  # type: ignore[attr-defined]
    members = [(name, path, dev)] + [
        (_str(c.get("kname") or c.get("name")), _str(c.get("path")), c) for c in children
    ]
    signatures: list[str] = []
    parts: list[Part] = []
    pt_type = pt_uuid = ""
    for mname, mpath, info in members:
        mpath = mpath or f"/dev/{mname}"
        num = _devnum(mname)
        where = mounted.get(num) if num else None
        mps = tuple(sorted({m for m in info.get("mountpoints") or [] if m} | ({where} if where else set())))  # type: ignore[attr-defined]
        for mp in mps:
            refusals.append(f"/dev/{mname} is mounted on {mp}")
        if os.path.realpath(mpath) in swaps:
            refusals.append(f"/dev/{mname} is in use as swap")
        for h in _holders(mname):
            refusals.append(f"/dev/{mname} is in use by /dev/{h} (device mapper, RAID or LVM)")
        sigs: list[dict[str, str]] = []
        probe: dict[str, str] = {}
        try:
            sigs = wipefs_signatures(mpath)
        except OSError as e:
            if not mps:  # a mounted device is refused anyway; wipefs may not open it
                refusals.append(f"cannot read the signatures of /dev/{mname}: {e}")
        try:
            probe = blkid_probe(mpath)
        except OSError as e:
            if not mps:
                refusals.append(f"cannot probe /dev/{mname}: {e}")
        for s in sigs:
            t = _str(s.get("type"))
            if mname == name and t in ("gpt", "dos", "PMBR"):
                if t != "PMBR" and f"{t} partition table" not in signatures:
                    signatures.append(f"{t} partition table")
                continue
            label = _str(s.get("label"))
            where_txt = "whole disk" if mname == name else f"/dev/{mname}"
            signatures.append(f"{t} on {where_txt}" + (f" (label {label!r})" if label else ""))
        if mname == name:
            pt_type = probe.get("PTTYPE", "")
            pt_uuid = probe.get("PTUUID", "").lower()
            if pt_type and f"{pt_type} partition table" not in signatures:
                signatures.insert(0, f"{pt_type} partition table")
        else:
            parts.append(
                Part(
                    name=mname,
                    path=mpath,
                    size=int(info.get("size") or 0),  # type: ignore[call-overload]
                    part_uuid=probe.get("PART_ENTRY_UUID", _str(info.get("partuuid"))).lower(),
                    part_type=probe.get("PART_ENTRY_TYPE", _str(info.get("parttype"))).lower(),
                    fstype=probe.get("TYPE", _str(info.get("fstype"))),
                    fs_uuid=probe.get("UUID", _str(info.get("uuid"))),
                    label=probe.get("LABEL", _str(info.get("label"))),
                    mountpoints=mps,
                )
            )
    if not signatures and not refusals:
        try:
            ends = _nonzero_ends(path, size)
        except OSError as e:
            refusals.append(f"cannot read {path}: {e}")
            ends = []
        if ends:
            signatures.append(f"unrecognised data in the {' and '.join(ends)} MiB")
    if kind == "loop":
        notes.append(f"loop device over {_loop_backing(name) or '?'}")
    return Disk(
        name=name,
        path=path,
        kind=kind,
        size=size,
        model=_str(dev.get("model")),
        serial=serial,
        transport=_str(dev.get("tran")),
        removable=_bool(dev.get("rm")) or _bool(dev.get("hotplug")),
        read_only=_bool(dev.get("ro")),
        by_id=tuple(links.get(name, [])),
        pt_type=pt_type,
        pt_uuid=pt_uuid,
        signatures=tuple(signatures),
        parts=tuple(parts),
        table=partition_table(path) if pt_type else (),
        refusals=tuple(dict.fromkeys(refusals)),
        boot_medium=name in boot,
        notes=tuple(notes),
    )


def find_disk(disks: list[Disk], path: str) -> Disk | None:
    """The disk a path names (a by-id link or a /dev node), resolving symlinks."""
    try:
        real = os.path.realpath(path, strict=True)
    except OSError:
        return None
    base = os.path.basename(real)
    return next((d for d in disks if d.name == base or os.path.realpath(d.path) == real), None)


def source_esp(disks: list[Disk]) -> Part | None:
    """The ESP on the boot medium (the copy source of the installed system's ESP)."""
    for d in disks:
        if d.boot_medium:
            esp = d.part(ESP_TYPE)
            if esp is not None:
                return esp
    return None
