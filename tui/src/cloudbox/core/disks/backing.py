"""Backing stores for the guest's benchmark disk: prepared per run, removed afterwards, never on a device
the user did not choose.

Kinds: sparse-file, prealloc-file, qcow2, qcow2-prealloc (files in a work directory on the device under test),
block-device (a whole device, partition or LV the user names with a destroy confirmation; or, on a test host, a loop
device over a pre-allocated file, labelled as such), network-volume (core.disks.volumes exports one per run; this module
only describes it: `NetworkSource`). A profile with
several disks (disk.count, for a RAID in the guest) gets that many stores of its kind, each of an equal share of the
test size; the bare-metal baseline then runs on a file of the whole test size on the same host disk, the one device
every store lives on. Safety checks refuse a device that is mounted, holds the running system or swap, or carries a
partition table / filesystem signature, unless the user confirms by naming it.
"""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from .. import ledger
from ..errors import CloudboxError, DeviceRefused, NoSpace

MARGIN = 64 * 1024 * 1024  # space kept free beyond the store itself


@dataclass(frozen=True)
class NetworkSource:
    """A guest disk that QEMU opens over the network itself (libvirt <disk type='network'>)."""

    protocol: str  # nbd | iscsi
    name: str  # the export's name (iSCSI: <target IQN>/<LUN>)
    host: str
    port: int
    tls: bool = True
    initiator: str = ""  # iSCSI: the initiator name QEMU logs in as
    auth_user: str = ""  # iSCSI: the CHAP user, its secret in the libvirt secret of type iscsi named auth_usage
    auth_usage: str = ""


@dataclass
class BackingStore:
    kind: str
    path: str  # what the guest's disk points at (file or /dev node)
    is_block: bool
    format: str  # raw | qcow2
    size_bytes: int
    host_device: str | None  # /proc/diskstats name to sample (e.g. "vda", "loop3", "sdb")
    model: str  # human description of the physical device under test
    labels: list[str] = field(default_factory=list)
    baseline_target: str = ""  # file or device the bare-metal baseline runs fio against
    more_paths: list[str] = field(default_factory=list)  # the other disks' stores (disk.count > 1), like `path`
    network: NetworkSource | None = None  # QEMU opens the disk over the network (disk.attach = qemu), not `path`
    vhost_user: str = ""  # the socket a vhost-user-blk export of `path` listens on (core.disks.vhostuser)
    pci: str = ""  # the NVMe controller handed to the guest whole (core.disks.pcidev); `path` is its namespace
    baseline_labels: list[str] = field(default_factory=list)  # what the baseline's numbers are, beyond `labels`
    _cleanup: list[ledger.Entry] = field(default_factory=list, repr=False)  # what prepare() made, in order

    def remove(self) -> None:
        """Undo everything prepare() did, in reverse order. Safe to call twice."""
        while self._cleanup:
            entry = self._cleanup.pop()
            try:
                entry.release()
            except (OSError, CloudboxError):
                pass


@ledger.kind
@dataclass(frozen=True)
class File(ledger.Held):
    """A file the run made (a backing file, the baseline's file)."""

    kind: ClassVar[str] = "file"
    path: str = ""

    def release(self) -> str:
        if not os.path.lexists(self.path):
            return ""
        Path(self.path).unlink(missing_ok=True)
        return f"removed {self.path}"


LOOP_SYSFS = Path("/sys/block")


def loops_over(file: str, sys_block: Path = LOOP_SYSFS) -> list[str]:
    """The loop devices (/dev/loopN) whose backing file is `file`, also once the file is deleted (the kernel then
    names it "<file> (deleted)" and holds its space until the loop is detached)."""
    found = []
    for b in sorted(sys_block.glob("loop*/loop/backing_file")):
        try:
            name = b.read_text().strip()
        except OSError:
            continue
        if name.removesuffix(" (deleted)") == file:
            found.append(f"/dev/{b.parent.parent.name}")
    return found


@ledger.kind
@dataclass(frozen=True)
class Loop(ledger.Held):
    """A loop device over a file of the run's (found by the file, deleted or not, and by the device it got)."""

    kind: ClassVar[str] = "loop"
    file: str = ""
    device: str = ""

    def release(self) -> str:
        devices = loops_over(self.file)
        for dev in devices:
            subprocess.run(["losetup", "-d", dev], check=False, capture_output=True)
        held = [d for d in devices if d in loops_over(self.file)]
        if held:  # the kernel detaches a busy loop once its last user closes it (autoclear)
            raise CloudboxError(f"loop device {', '.join(held)} over {self.file} is still open (by a guest, an "
                                "array or a mount); it is detached once closed")
        return f"detached loop device {', '.join(devices)} ({self.file})" if devices else ""


# ---------------------------------------------------------------------------- device facts
def dev_name_for_path(path: str | Path) -> str | None:
    """The /proc/diskstats name of the block device holding `path`, or of `path` itself when it is one (an LV:
    dm-N); None for tmpfs/overlay."""
    st = os.stat(path)
    dev = st.st_rdev if stat.S_ISBLK(st.st_mode) else st.st_dev
    return _name_from_devnum(os.major(dev), os.minor(dev))


def byte_size(path: str | Path) -> int:
    """The size of a file or a block device (whose st_size is 0)."""
    with open(path, "rb") as f:
        return f.seek(0, os.SEEK_END)


def _name_from_devnum(major: int, minor: int) -> str | None:
    link = Path(f"/sys/dev/block/{major}:{minor}")
    if not link.exists():
        return None
    return link.resolve().name


def parent_disk(name: str) -> str:
    """sda1 -> sda; nvme0n1p2 -> nvme0n1; dm/loop/whole disks map to themselves."""
    p = Path(f"/sys/class/block/{name}")
    if (p / "partition").exists():
        return p.resolve().parent.name
    return name


def device_model(name: str | None) -> str:
    if not name:
        return "no block device (tmpfs/overlay): host disk metrics unavailable"
    disk = parent_disk(name)
    base = Path(f"/sys/class/block/{disk}")
    parts = []
    for f in ("device/vendor", "device/model"):
        try:
            v = (base / f).read_text().strip()
            if v:
                parts.append(v)
        except OSError:
            pass
    if disk.startswith("loop"):
        try:
            parts.append("loop over " + (base / "loop/backing_file").read_text().strip())
        except OSError:
            parts.append("loop device")
    if disk.startswith("vd"):
        parts.append("virtio disk (this host is a VM)")
    try:
        rot = (base / "queue/rotational").read_text().strip()
        parts.append("rotational" if rot == "1" else "non-rotational")
    except OSError:
        pass
    return f"/dev/{name}: " + (", ".join(parts) if parts else "unknown model")


def mounts() -> Iterator[tuple[tuple[int, int], str]]:
    """Each mount /proc/self/mountinfo lists, in its order: the device's number (major, minor) and the mount point."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            maj, mnr = fields[2].split(":")
            yield (int(maj), int(mnr)), fields[4]


def swap_names() -> list[str]:
    """The devices and files /proc/swaps lists, as it names them (none when it cannot be read)."""
    try:
        lines = Path("/proc/swaps").read_text().splitlines()[1:]
    except OSError:
        return []
    return [ln.split()[0] for ln in lines if ln.strip()]


def _holders_and_parts(name: str) -> list[str]:
    """The device, its partitions, and the devices stacked on it (dm, md), recursively."""
    seen, todo = [], [name]
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.append(n)
        base = Path(f"/sys/class/block/{n}")
        for sub in base.iterdir() if base.exists() else []:
            if sub.is_dir() and (sub / "partition").exists():
                todo.append(sub.name)
        holders = base / "holders"
        if holders.exists():
            todo += [h.name for h in holders.iterdir()]
    return seen


def signatures(dev: str) -> list[str]:
    """Partition-table / filesystem / RAID / LVM signatures on `dev` (wipefs --no-act)."""
    r = subprocess.run(["wipefs", "--no-act", "--noheadings", "--output", "TYPE", dev],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise DeviceRefused(f"{dev}: cannot read its signatures ({r.stderr.strip()})")
    return [ln.strip() for ln in r.stdout.splitlines() if ln.strip()]


def check_device(dev: str, *, confirm: str | None) -> None:
    """Refuse to write `dev` unless it is a safe, explicitly confirmed target.

    `confirm` must equal the device's kernel name (e.g. "sdb") for a device holding signatures;
    a mounted device, the root disk, or a swap device is refused whatever the confirmation.
    """
    try:
        st = os.stat(dev)
    except FileNotFoundError:
        raise DeviceRefused(f"{dev}: no such device") from None
    if not stat.S_ISBLK(st.st_mode):
        raise DeviceRefused(f"{dev}: not a block device")
    name = _name_from_devnum(os.major(st.st_rdev), os.minor(st.st_rdev)) or os.path.basename(dev)
    family = _holders_and_parts(name)
    mounted = dict(mounts())  # a device mounted twice: its last mount point
    for n in family:
        try:
            num = Path(f"/sys/class/block/{n}/dev").read_text().strip().split(":")
        except OSError:
            continue
        where = mounted.get((int(num[0]), int(num[1])))
        if where is not None:
            what = "holds the running system" if where == "/" else f"is mounted on {where}"
            raise DeviceRefused(f"{dev}: refused: /dev/{n} {what}; cloudbox never writes to a device in use")
    root = dev_name_for_path("/")
    if root and parent_disk(root) in [parent_disk(n) for n in family]:
        raise DeviceRefused(f"{dev}: refused: it holds the running system (root file system on /dev/{root})")
    swaps = set(swap_names())
    for n in family:
        if f"/dev/{n}" in swaps:
            raise DeviceRefused(f"{dev}: refused: /dev/{n} is in use as swap")
    sigs = signatures(dev)
    if sigs and confirm != name:
        raise DeviceRefused(
            f"{dev}: refused: it holds data ({', '.join(sigs)}). To destroy it anyway name it "
            f"explicitly: --device {dev} --destroy {name}"
        )


# ---------------------------------------------------------------------------- preparation
def _free_bytes(d: Path) -> int:
    s = os.statvfs(d)
    return s.f_bavail * s.f_frsize


FILE_KINDS = ("sparse-file", "prealloc-file", "qcow2", "qcow2-prealloc")
# Kinds whose store another process serves to the guest (core.disks.vhostuser), made as the kind it maps to here:
# a pre-allocated file, or the device given.
SERVED_KINDS = ("vhost-user",)
SHARE_KIND = "virtiofs"  # a directory of the run's the guest mounts over virtiofs


def served_store_kind(kind: str, device: str | None) -> str:
    """The store a served kind is made as: the device's when one is given, else a pre-allocated file's."""
    return ("block-device" if device else "prealloc-file") if kind in SERVED_KINDS else kind


def disk_bytes(size_bytes: int, count: int) -> int:
    """Each of `count` disks' size for a test of `size_bytes`: an equal share, rounded up to whole MiB (a multiple
    of any RAID chunk, so the striped array holds the whole test)."""
    if count <= 1:
        return size_bytes
    mib = 1024 * 1024
    return -(-size_bytes // (count * mib)) * mib


def space_needed(kind: str, size_bytes: int, *, device: str | None = None, count: int = 1) -> tuple[int, str]:
    """(bytes a run of backing `kind` writes into its work directory, what they are), margin not included: a file
    backing and the bare-metal baseline file beside it; a loop device's file when no --device is given; nothing for a
    device or a network volume. With `count` disks, each store holds its share (disk_bytes)."""
    kind = served_store_kind(kind, device)
    if kind == SHARE_KIND:
        return 2 * size_bytes, "virtiofs share's test files (the guest's and the bare-metal baseline's)"
    stores = disk_bytes(size_bytes, count) * count
    if kind in FILE_KINDS:
        return stores + size_bytes, ("backing file" if count == 1 else f"{count} backing files") \
            + " and the bare-metal baseline file"
    if kind == "block-device" and not device:
        if count > 1:
            return stores + size_bytes, f"{count} loop devices' backing files and the bare-metal baseline file"
        return size_bytes, "loop-device backing file"
    return 0, ""


def free_bytes_at(d: Path) -> tuple[Path, int]:
    """(the directory that holds `d`: `d` or its nearest existing parent, its free bytes for an unprivileged write)."""
    d = Path(d)
    while not d.exists() and d != d.parent:
        d = d.parent
    return d, _free_bytes(d)


def need_space(d: Path, size: int, what: str) -> None:
    free = _free_bytes(d)
    if free < size + MARGIN:
        raise NoSpace(
            f"{d}: not enough free space for the {what}: need {human_size(size + MARGIN)} "
            f"({human_size(size)} + {human_size(MARGIN)} margin), {human_size(free)} free. "
            "Use a smaller --size or another --work-dir"
        )


def human_size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def _run(cmd: list[str]) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise CloudboxError(f"{' '.join(cmd)} failed: {r.stderr.strip() or r.stdout.strip()}")
    return r.stdout


def new_work_dir(kind: str, work_dir: Path, size_bytes: int, fmt: str) -> BackingStore:
    """A fresh per-run work directory that QEMU can reach, as an empty store that removes it whole."""
    for parent in work_dir.parents:  # QEMU runs as libvirt-qemu and must be able to traverse to the store
        if parent == Path("/"):
            break
        if not parent.exists():  # created below with mode 0755
            continue
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            raise CloudboxError(f"{parent}: not traversable by others (mode {oct(mode & 0o777)}); QEMU runs "
                                "as libvirt-qemu and could not open the backing store. Choose another --work-dir")
    # A fresh per-run directory that we create and later remove whole; never a pre-existing one.
    made = ledger.hold(ledger.Directory(str(work_dir)))
    try:
        work_dir.mkdir(parents=True, exist_ok=False)
    except FileExistsError:
        made.done()  # not ours: never removed
        raise CloudboxError(f"{work_dir}: already exists; cloudbox only removes work directories it created") from None
    except BaseException:
        made.done()
        raise
    os.chmod(work_dir, 0o755)  # QEMU runs as libvirt-qemu and must reach the store
    dev_name = dev_name_for_path(work_dir)
    store = BackingStore(kind, "", False, fmt, size_bytes, dev_name, device_model(dev_name))
    store._cleanup.append(made)
    return store


INSTANCE_KIND = "instance-copy"


def instance_dir(work_dir: Path, size_bytes: int) -> BackingStore:
    """A fresh work directory for the raw instance files a propagation run copies in, one per guest (study B); the
    store is the directory (`path`), removed whole with what is in it. `size_bytes`: the largest instance."""
    store = new_work_dir(INSTANCE_KIND, work_dir, size_bytes, "raw")
    store.path = str(work_dir)
    if store.host_device is None:
        store.labels.append("no-host-metrics")
    return store


def prepare(kind: str, *, work_dir: Path, size_bytes: int, fmt: str, device: str | None = None,
            confirm: str | None = None, volume: str = "", count: int = 1) -> BackingStore:
    """Create the backing store (`count` of them for a profile with several disks). On any failure everything
    created so far is removed."""
    if kind == "network-volume":
        raise CloudboxError(f"backing 'network-volume' ({volume or 'no volume'}) is exported by the volume service "
                            "(core.disks.volumes), not prepared here")
    if kind == SHARE_KIND:  # a directory of the host the guest mounts; the baseline's file in it
        store = new_work_dir(kind, work_dir, size_bytes, fmt)
        need_space(work_dir, size_bytes * 2, "virtiofs share's test files (the guest's and the baseline's)")
        share = work_dir / "share"
        share.mkdir(mode=0o755)
        store.path, store.baseline_target = str(share), str(share / "baseline.dat")
        store.model = f"a directory on {device_model(store.host_device)}, shared with the guest by virtiofsd"
        return store
    if kind in SERVED_KINDS:  # the store a daemon serves: made as a file or a device, and named as what it is
        store = prepare(served_store_kind(kind, device), work_dir=work_dir, size_bytes=size_bytes, fmt=fmt,
                        device=device, confirm=confirm, volume=volume, count=count)
        store.kind = kind
        return store
    if count > 1:
        if kind == "block-device" and (device or volume):
            raise CloudboxError(
                f"the profile has {count} disks (disk.count) but {device or volume} is one device; leave out "
                f"--device to give each disk a loop device, or use a file backing")
        return _prepare_several(kind, work_dir=work_dir, size_bytes=size_bytes, fmt=fmt, count=count)
    store = new_work_dir(kind, work_dir, size_bytes, fmt)
    dev_name = store.host_device
    with _made(store):
        if kind in FILE_KINDS:
            need_space(work_dir, *space_needed(kind, size_bytes))
            path = work_dir / ("disk.qcow2" if kind.startswith("qcow2") else "disk.raw")
            _make_file(store, kind, path, size_bytes)
            store.path = str(path)
            store.baseline_target = str(work_dir / "baseline.dat")
            store._cleanup.append(ledger.hold(File(store.baseline_target)))
        elif kind == "block-device":
            if device:
                check_device(device, confirm=confirm)
                store.path = store.baseline_target = device
                store.is_block = True
                st = os.stat(device)
                store.host_device = _name_from_devnum(os.major(st.st_rdev), os.minor(st.st_rdev))
                store.model = device_model(store.host_device)
                dev_size = int(_run(["blockdev", "--getsize64", device]).strip())
                if dev_size < size_bytes:
                    raise NoSpace(f"{device}: {human_size(dev_size)} is smaller than the test size "
                                  f"{human_size(size_bytes)}")
            else:
                # Test host without a spare disk: a loop device over a pre-allocated file, labelled.
                need_space(work_dir, *space_needed(kind, size_bytes))
                loop = _make_loop(store, work_dir / "loopdisk.raw", size_bytes)
                store.path = store.baseline_target = loop
                store.is_block = True
                store.host_device = os.path.basename(loop)
                store.model = f"{loop}: loop device over a pre-allocated file on {device_model(dev_name)}"
                store.labels.append("loop-device")
        else:
            raise CloudboxError(f"unknown backing kind {kind!r}")
    return store


@contextlib.contextmanager
def _made(store: BackingStore) -> Iterator[BackingStore]:
    """Around the making of `store`'s disks: the store removed again when that fails; labelled no-host-metrics when
    its disk is not one /proc/diskstats names."""
    try:
        yield store
    except BaseException:
        store.remove()
        raise
    if store.host_device is None:
        store.labels.append("no-host-metrics")


def _make_file(store: BackingStore, kind: str, path: Path, size_bytes: int) -> None:
    """One file store of `kind` at `path`, registered for removal before it exists."""
    store._cleanup.append(ledger.hold(File(str(path))))
    if kind == "sparse-file":
        with open(path, "wb") as f:
            f.truncate(size_bytes)
    elif kind == "prealloc-file":
        # Real blocks, as the study's pre-allocated ("full") files: fallocate, not a sparse hole.
        _run(["fallocate", "-l", str(size_bytes), str(path)])
    else:
        prealloc = "falloc" if kind == "qcow2-prealloc" else "off"
        _run(["qemu-img", "create", "-q", "-f", "qcow2", "-o", f"preallocation={prealloc}",
              str(path), str(size_bytes)])


def _make_loop(store: BackingStore, img: Path, size_bytes: int) -> str:
    """A loop device over a fresh pre-allocated file `img`; both registered for removal (the loop by its file before
    it exists, so a run killed while losetup works still has it found)."""
    store._cleanup.append(ledger.hold(File(str(img))))
    _run(["fallocate", "-l", str(size_bytes), str(img)])
    entry = ledger.hold(Loop(str(img)))
    store._cleanup.append(entry)
    loop = _run(["losetup", "--find", "--show", "--direct-io=on", str(img)]).strip()
    entry.update(device=loop)
    return loop


def _prepare_several(kind: str, *, work_dir: Path, size_bytes: int, fmt: str, count: int) -> BackingStore:
    """`count` stores of `kind`, each of an equal share of the test size, in one work directory; the baseline on a
    file of the whole size beside them (the host disk they all share is what bare metal has to offer)."""
    if kind not in FILE_KINDS and kind != "block-device":
        raise CloudboxError(f"unknown backing kind {kind!r}")
    each = disk_bytes(size_bytes, count)
    store = new_work_dir(kind, work_dir, each, fmt)
    dev_name = store.host_device
    with _made(store):
        need_space(work_dir, *space_needed(kind, size_bytes, count=count))
        paths: list[str] = []
        for i in range(1, count + 1):
            if kind in FILE_KINDS:
                path = work_dir / (f"disk{i}.qcow2" if kind.startswith("qcow2") else f"disk{i}.raw")
                _make_file(store, kind, path, each)
                paths.append(str(path))
            else:
                paths.append(_make_loop(store, work_dir / f"loopdisk{i}.raw", each))
        store.path, store.more_paths = paths[0], paths[1:]
        if kind == "block-device":
            store.is_block = True
            store.model = (f"{count} loop devices ({', '.join(paths)}) over pre-allocated files on "
                           f"{device_model(dev_name)}")
            store.labels.append("loop-device")
        store.baseline_target = str(work_dir / "baseline.dat")
        store._cleanup.append(ledger.hold(File(store.baseline_target)))
    return store
