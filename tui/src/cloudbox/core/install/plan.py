"""What an install will write, decided before anything is written: `make_plan()` and `InstallPlan.describe()`.

The plan holds every byte-level decision: the partition table (GPT: ESP, BIOS boot partition, root, with
partition UUIDs derived from the install id), the systemd-repart definitions (the vendor files in
/usr/lib/cloudbox/install/repart.d plus a drop-in per partition), what is copied (the running system's root
file system through a read-only bind mount, without the live session's state; the boot medium's ESP),
the boot entries adapted to the node (root=PARTUUID=...), the boot loaders and every settings file with its
content. `describe()` prints it for `cloudbox install --dry-run`, which writes nothing.

The mode says what `apply` will do: ``fresh`` (new partition table), ``resume`` (the disk carries an
interrupted install of these answers: the partitions stay, every later step runs again) or ``done`` (a
finished install of these answers: nothing is written).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from cloudbox import __version__
from cloudbox.core import paths
from cloudbox.core.disks.backing import human_size
from cloudbox.core.errors import InstallError
from cloudbox.core.install.answers import Resolved
from cloudbox.core.install.disks import (
    BIOS_BOOT_TYPE,
    ESP_TYPE,
    ROOT_X86_64_TYPE,
    Disk,
    GiB,
    MiB,
    part_uuid_for,
    source_esp,
)
from cloudbox.core.install.machine import Machine

Mode = Literal["fresh", "resume", "done"]

VENDOR_REPART = Path("/usr/lib/cloudbox/install/repart.d")
JOURNAL = "var/lib/cloudbox/install/journal.jsonl"  # on the installed root, relative
NODE_SETTINGS = "etc/cloudbox/node.toml"
ESP_SIZE = 1 * GiB
BIOS_BOOT_SIZE = 1 * MiB
ROOT_MIN = 4 * GiB
GRUB_MODULES = (
    "biosdisk", "cat", "echo", "fat", "help", "linux", "loadenv", "ls", "normal", "part_gpt", "read",
    "reboot", "search", "search_fs_file", "search_fs_uuid", "sleep", "test", "true",
)


def vendor_repart_dir() -> Path:
    """The vendor repart definitions: the checkout's mkosi.extra copy when running from source, else /usr/lib."""
    root = paths.repo_root()
    if root is not None:
        d = root / "mkosi.extra/usr/lib/cloudbox/install/repart.d"
        if d.is_dir():
            return d
    return VENDOR_REPART


@dataclass(frozen=True)
class Sources:
    """Where the installed system comes from: the running root and the boot medium's ESP (a partition
    device, mounted read-only while needed, or a directory)."""

    root: str = "/"
    esp: str = ""


@dataclass(frozen=True)
class PlannedPartition:
    number: int
    role: str  # esp, bios-boot, root
    label: str
    type_uuid: str
    part_uuid: str
    offset: int
    size: int
    content: str


@dataclass
class InstallPlan:
    resolved: Resolved
    mode: Mode
    sources: Sources
    partitions: list[PlannedPartition]
    table_source: str  # "systemd-repart --dry-run" or "computed"
    definitions: dict[str, str]  # relative path in the definitions dir -> text
    esp_files: list[tuple[str, int]]  # files copied from the boot medium's ESP (relative path, size)
    esp_overrides: dict[str, str]  # files of node-esp (relative path -> text)
    root_used: int
    settings: dict[str, str]  # absolute path on the installed root -> text
    boot: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def disk(self) -> Disk:
        return self.resolved.disk

    @property
    def install_id(self) -> str:
        return self.resolved.install_id

    def part(self, role: str) -> PlannedPartition:
        return next(p for p in self.partitions if p.role == role)

    def summary(self) -> list[str]:
        """A few lines for a console: the target, what happens to it, the partitions."""
        a, d = self.resolved.answers, self.disk
        state = {"done": "already holds the finished install of these answers: nothing will be written",
                 "resume": "holds an interrupted install of these answers: resuming",
                 "fresh": ("ERASING " + "; ".join(d.signatures)) if d.has_data else "blank"}[self.mode]
        out = [f"{a.role} {a.hostname} (install id {self.install_id}) onto {d.identity}: {state}"]
        if self.mode != "done":
            out.append("partitions: " + ", ".join(f"{p.number} {p.label} {human_size(p.size)}" for p in self.partitions)
                       + f"; then {a.after}")
        return out

    def describe(self) -> str:
        """Everything apply would write, for the dry run. Secrets (the password hash) are masked."""
        a = self.resolved.answers
        d = self.disk
        out: list[str] = []
        add = out.append
        add(f"cloudbox install plan ({self.resolved.source})")
        add(f"  role {a.role}, hostname {a.hostname}, install id {self.install_id}")
        add(f"  target: {d.by_id[0] if d.by_id else d.path} = {d.identity}")
        if self.mode == "done":
            add("  state: this disk already holds the finished install of these answers: nothing will be written")
            return "\n".join(out) + "\n"
        if self.mode == "resume":
            add("  state: this disk holds an interrupted install of these answers: its partitions stay, "
                "every later step runs again")
        elif d.has_data:
            add(f"  state: ERASES what the disk holds: {'; '.join(d.signatures)} (serial {d.serial} confirmed)")
        else:
            add("  state: blank disk")
        add("")
        add(f"1. Partition table: GPT on {d.path} ({human_size(d.size)}; {self.table_source})")
        for p in self.partitions:
            add(f"   {p.number}  {p.label:<14} {human_size(p.size):>10}  at {human_size(p.offset):>9}  "
                f"type {p.type_uuid}  uuid {p.part_uuid}")
            add(f"      {p.content}")
        add("   systemd-repart definitions (vendor files + this install's drop-ins):")
        for name, text in self.definitions.items():
            add(f"   --- {name}")
            out.extend("      " + ln for ln in text.rstrip("\n").splitlines())
        add("")
        add(f"2. Copied: the running system's root file system ({human_size(self.root_used)} used on "
            f"{self.sources.root}), through a read-only bind mount (nothing mounted on top of it is copied),")
        add("   without this live session's state (see ExcludeFiles= above); into partition 3 (ext4).")
        total = sum(s for _, s in self.esp_files)
        add(f"   The boot medium's ESP ({self.sources.esp}): {len(self.esp_files)} files, {human_size(total)}, "
            "into partition 1 (vfat):")
        out.extend(f"      {rel}  {human_size(size)}" for rel, size in self.esp_files)
        add("   replaced by versions for this node (its root partition named explicitly):")
        for rel, text in self.esp_overrides.items():
            add(f"   --- /{rel}")
            out.extend("      " + ln for ln in text.rstrip("\n").splitlines())
        add("")
        add("3. Boot loaders:")
        out.extend(f"   {b}" for b in self.boot)
        add("")
        add("4. Settings on the installed system:")
        for path, text in self.settings.items():
            add(f"   --- {path}")
            out.extend("      " + ln for ln in text.rstrip("\n").splitlines())
        if self.resolved.password_hash:
            add("   root's password in /etc/shadow: the hash from the answers (not shown)")
        else:
            add("   root's password in /etc/shadow: locked (log in with an SSH key; without one the console asks "
                "for a password at the first login)")
        add(f"   and a journal of the install steps in /{JOURNAL}")
        add("")
        add(f"5. Then: {a.after}" + (" (into the installed system)" if a.after == "reboot" else ""))
        out.extend(f"note: {n}" for n in self.notes)
        return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------------ building
def find_sources(machine: Machine) -> Sources:
    esp = source_esp(machine.disks)
    if esp is None:
        raise InstallError(
            "the boot medium has no ESP that cloudbox can copy (no partition of type "
            f"{ESP_TYPE} on the disk holding /); install from the cloudbox USB image")
    return Sources(root="/", esp=esp.path)


def _esp_mountpoint(device: str) -> str | None:
    r = subprocess.run(["findmnt", "-n", "-o", "TARGET", "--source", device], capture_output=True, text=True)
    lines = [ln for ln in r.stdout.splitlines() if ln.strip()]
    return lines[0] if r.returncode == 0 and lines else None


def _run(cmd: list[str], what: str) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise InstallError(f"{what}: {' '.join(cmd)} failed: {(r.stderr or r.stdout).strip()}")
    return r.stdout


@contextmanager
def readonly_view(source: str, where: Path) -> Iterator[Path]:
    """A read-only view of `source` at `where`: a directory (or a block device's existing mount point) is
    bind-mounted read-only, an unmounted block device is mounted read-only. Unmounted on exit, also on error."""
    where.mkdir(parents=True, exist_ok=True)
    current = source if os.path.isdir(source) else _esp_mountpoint(source)
    if current:
        _run(["mount", "--bind", current, str(where)], f"bind-mounting {current}")
    else:
        _run(["mount", "-o", "ro,nodev,nosuid,noexec", source, str(where)], f"mounting {source} read-only")
    try:
        if current:
            _run(["mount", "-o", "remount,bind,ro", str(where)], f"making the view of {source} read-only")
        yield where
    finally:
        subprocess.run(["umount", str(where)], capture_output=True)
        try:
            where.rmdir()
        except OSError:
            pass


def esp_listing(esp_dir: Path) -> list[tuple[str, int]]:
    out = []
    for dirpath, _dirs, files in os.walk(esp_dir):
        for f in files:
            p = Path(dirpath) / f
            rel = str(p.relative_to(esp_dir))
            if rel == "loader/random-seed":
                continue
            out.append((rel, p.stat().st_size))
    return sorted(out)


_ROOT_ARG = re.compile(r"(^|\s)root=\S+")


def adapt_grub_cfg(text: str, root_uuid: str) -> str:
    """grub.cfg of the boot medium -> the node's: every `linux` line boots root=PARTUUID=<the node's root>."""
    lines = []
    for line in text.splitlines():
        stripped = line.lstrip()
        if stripped.startswith("linux ") or stripped.startswith("linux\t"):
            line = _ROOT_ARG.sub("", line).rstrip() + f" root=PARTUUID={root_uuid}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def adapt_entry(text: str, root_uuid: str) -> str:
    """A boot loader spec entry -> the node's: `options` names root=PARTUUID=<the node's root>."""
    lines, seen = [], False
    for line in text.splitlines():
        if line.startswith("options"):
            seen = True
            line = _ROOT_ARG.sub("", line).rstrip() + f" root=PARTUUID={root_uuid}"
        lines.append(line)
    if not seen:
        lines.append(f"options root=PARTUUID={root_uuid}")
    return "\n".join(lines) + "\n"


def compute_table(disk_size: int, iid: str) -> list[PlannedPartition]:
    """The GPT layout systemd-repart makes from the vendor definitions (1 MiB alignment at the start, 4 KiB
    grain, the backup GPT at the end): used where systemd-repart cannot do a dry run."""
    esp_off = 1 * MiB
    bios_off = esp_off + ESP_SIZE
    root_off = bios_off + BIOS_BOOT_SIZE
    last_usable = disk_size - 33 * 512  # backup GPT: header + 32 sectors of entries
    root_size = (last_usable - root_off) // 4096 * 4096
    return [
        PlannedPartition(1, "esp", "esp", ESP_TYPE, part_uuid_for(iid, "esp"), esp_off, ESP_SIZE,
                         "vfat: systemd-boot, kernel, initrds, grub.cfg (from the boot medium's ESP)"),
        PlannedPartition(2, "bios-boot", "bios-boot", BIOS_BOOT_TYPE, part_uuid_for(iid, "bios-boot"), bios_off,
                         BIOS_BOOT_SIZE, "grub's core image (legacy BIOS boot), written by grub-bios-setup"),
        PlannedPartition(3, "root", "cloudbox-root", ROOT_X86_64_TYPE, part_uuid_for(iid, "root"), root_off,
                         root_size, "ext4: the running system's root file system"),
    ]


def definitions(iid: str, exclude: list[str]) -> dict[str, str]:
    """The vendor definitions plus this install's drop-ins (partition UUIDs, extra excludes)."""
    vendor = vendor_repart_dir()
    out: dict[str, str] = {}
    roles = {"10-esp.conf": "esp", "20-bios-boot.conf": "bios-boot", "30-root.conf": "root"}
    for name, role in roles.items():
        try:
            out[name] = (vendor / name).read_text()
        except OSError as e:
            raise InstallError(f"the installer's partition definitions are missing: {vendor / name}: {e}") from None
        drop = ["# This install's partition UUID (derived from the install id).", "[Partition]",
                f"UUID={part_uuid_for(iid, role)}"]
        if role == "root":
            drop += [f"ExcludeFiles={p}" for p in exclude]
        out[f"{name}.d/50-install.conf"] = "\n".join(drop) + "\n"
    return out


def live_state_excludes(root: str = "/") -> list[str]:
    """Per-machine files of the live session not named in the vendor definitions (globs resolved now)."""
    ssh = Path(root) / "etc/ssh"
    return [f"/live-root/etc/ssh/{p.name}" for p in sorted(ssh.glob("ssh_host_*"))] if ssh.is_dir() else []


def root_used_bytes(root: str = "/") -> int:
    st = os.statvfs(root)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def node_settings_text(resolved: Resolved) -> str:
    a = resolved.answers
    n = a.network

    def q(v: object) -> str:
        return json.dumps(v)

    lines = [
        "# This node's role and settings, written by `cloudbox install` (docs/install.md).",
        f"role = {q(a.role)}",
        f"hostname = {q(a.hostname)}",
        f"install_id = {q(resolved.install_id)}",
        f"installed_by = {q('cloudbox ' + __version__)}",
        "",
        "[network]",
        f"private_mtu = {n.private_mtu}",
    ]
    for key, nic in (("private", resolved.private_nic), ("campus", resolved.campus_nic)):
        if nic is not None:
            lines += [f"{key}_nic = {q(nic.name)}", f"{key}_mac = {q(nic.mac)}"]
    if n.frontend is not None:
        lines.append(f"frontend = {q(n.frontend)}")
    if serves_private_network(resolved):
        lines.append(f"private_address = {q(private_address(resolved))}")
    return "\n".join(lines) + "\n"


DEFAULT_PRIVATE_ADDRESS = "10.73.0.1/24"


def serves_private_network(resolved: Resolved) -> bool:
    """A front-end (or an all-in-one node given a private NIC) addresses the private network."""
    return resolved.private_nic is not None and resolved.answers.role in ("front-end", "all-in-one")


PRIVATE_BRIDGE = "cbpriv0"  # a back-end's private bridge (its guests' way onto the private network)


def private_address(resolved: Resolved) -> str:
    return resolved.answers.network.private_address or DEFAULT_PRIVATE_ADDRESS


def settings_files(resolved: Resolved) -> dict[str, str]:
    """Files the settings step writes on the installed root (root's password is set in /etc/shadow apart)."""
    a = resolved.answers
    files: dict[str, str] = {
        f"/{NODE_SETTINGS}": node_settings_text(resolved),
        "/etc/hostname": a.hostname + "\n",
        "/etc/machine-id": "uninitialized\n",
    }
    if resolved.private_nic is not None:
        nic = resolved.private_nic
        mtu = a.network.private_mtu
        # Type=ether, Kind=!*: a bridge (or a tap) can carry the NIC's MAC and must not take its file.
        head = f"[Match]\nMACAddress={nic.mac}\nType=ether\nKind=!*\n\n[Link]\nMTUBytes={mtu}\n\n"
        if serves_private_network(resolved):
            # networkd's own DHCP server hands the back-ends (and their guests) their addresses, and names this
            # node as the server: `cloudbox node join --front-end discover` reads it from the lease. No router,
            # no DNS; names are served by multicast DNS (<hostname>.local, systemd-resolved).
            files["/etc/systemd/network/10-cloudbox-private.network"] = (
                f"# The private network, served by this {a.role}: jumbo frames, a fixed address, DHCP for "
                "the back-ends.\n" + head +
                f"[Network]\nAddress={private_address(resolved)}\nDHCPServer=yes\nLinkLocalAddressing=ipv6\n"
                "MulticastDNS=yes\nConfigureWithoutCarrier=yes\n\n"
                "[DHCPServer]\nPoolOffset=16\nEmitRouter=no\nEmitDNS=no\nEmitNTP=no\nDefaultLeaseTimeSec=3600\n"
            )
        else:
            # The private NIC is a port of the bridge cbpriv0, which holds the node's address and which its
            # guests join: guest -> front-end traffic crosses the bridge and the wire, as in the studies.
            files["/etc/systemd/network/10-cloudbox-private.netdev"] = (
                f"# The back-end's private bridge: its guests join the private network through it.\n"
                f"[NetDev]\nName={PRIVATE_BRIDGE}\nKind=bridge\nMTUBytes={mtu}\n\n[Bridge]\nSTP=no\n"
            )
            files["/etc/systemd/network/10-cloudbox-private.network"] = (
                f"# The private NIC ({a.role}): jumbo frames, a port of the bridge {PRIVATE_BRIDGE}.\n"
                + head + f"[Network]\nBridge={PRIVATE_BRIDGE}\nLinkLocalAddressing=no\n"
            )
            files["/etc/systemd/network/11-cloudbox-private-bridge.network"] = (
                f"# The private network ({a.role}): the address comes from the front-end's DHCP; names by mDNS.\n"
                f"[Match]\nName={PRIVATE_BRIDGE}\n\n[Link]\nMTUBytes={mtu}\n\n"
                "[Network]\nDHCP=ipv4\nLinkLocalAddressing=ipv6\nMulticastDNS=yes\nConfigureWithoutCarrier=yes\n\n"
                "[DHCPv4]\nUseRoutes=no\nUseDNS=no\nUseNTP=no\nUseMTU=no\n"
            )
    if resolved.campus_nic is not None:
        files["/etc/systemd/network/20-cloudbox-campus.network"] = (
            "# The campus network: DHCP; no name service answers on it (LLMNR, mDNS: the private links have mDNS).\n"
            f"[Match]\nMACAddress={resolved.campus_nic.mac}\n\n[Network]\nDHCP=yes\nLinkLocalAddressing=yes\n"
            "LLMNR=no\nMulticastDNS=no\n"
        )
    keys = a.root.ssh_authorized_keys
    if keys:
        files["/root/.ssh/authorized_keys"] = "\n".join(keys) + "\n"
    return files


def _repart_dry_run(disk: Disk, defs_dir: Path, src: Path, iid: str, mode: Mode) -> list[dict[str, object]] | None:
    """systemd-repart's own dry run (the exact table it would write), or None where it cannot do one."""
    help_text = subprocess.run(["systemd-repart", "--help"], capture_output=True, text=True).stdout
    if "--copy-source" not in help_text:
        return None
    r = subprocess.run(
        ["systemd-repart", "--dry-run=yes", f"--empty={'allow' if mode == 'resume' else 'force'}",
         f"--definitions={defs_dir}", f"--copy-source={src}", f"--seed={iid}", "--json=short", "--no-pager",
         disk.path],
        capture_output=True, text=True)
    if r.returncode != 0:
        raise InstallError(f"systemd-repart --dry-run on {disk.path} failed: {r.stderr.strip()}")
    data: list[dict[str, object]] = json.loads(r.stdout)
    return data


def write_definitions(defs: dict[str, str], where: Path) -> None:
    for name, text in defs.items():
        p = where / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def read_journal(root_partition: str) -> list[dict[str, object]]:
    """The install journal on an installed root partition, read with debugfs (read-only; no mount)."""
    r = subprocess.run(["debugfs", "-R", f"cat /{JOURNAL}", root_partition], capture_output=True, text=True)
    out = []
    for line in r.stdout.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def detect_mode(resolved: Resolved) -> Mode:
    if not resolved.resume:
        return "fresh"
    root = next((p for p in resolved.disk.parts if p.part_uuid == part_uuid_for(resolved.install_id, "root")), None)
    if root is None:
        return "resume"  # the table is ours, the kernel has not read it (yet): nothing to read the journal from
    events = read_journal(root.path)
    if events and events[-1].get("event") == "complete" and events[-1].get("install_id") == resolved.install_id:
        return "done"
    return "resume"


def make_plan(resolved: Resolved, sources: Sources, *, work: Path | None = None) -> InstallPlan:
    """Decide everything the install writes. Mounts the ESP read-only while reading it; writes nothing."""
    iid = resolved.install_id
    mode = detect_mode(resolved)
    table = compute_table(resolved.disk.size, iid)
    root_uuid = part_uuid_for(iid, "root")
    defs = definitions(iid, live_state_excludes(sources.root))
    settings = settings_files(resolved)
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="cloudbox-plan-", dir=work)))
        esp_dir = stack.enter_context(readonly_view(sources.esp, tmp / "live-esp"))
        listing = esp_listing(esp_dir)
        overrides: dict[str, str] = {}
        grub_cfg = esp_dir / "grub/grub.cfg"
        if grub_cfg.is_file():
            overrides["grub/grub.cfg"] = adapt_grub_cfg(grub_cfg.read_text(), root_uuid)
        entries = sorted((esp_dir / "loader/entries").glob("*.conf")) if (esp_dir / "loader/entries").is_dir() else []
        for e in entries:
            overrides[f"loader/entries/{e.name}"] = adapt_entry(e.read_text(), root_uuid)
        if not entries:
            raise InstallError(f"the boot medium's ESP ({sources.esp}) has no boot entries in /loader/entries")
        table_source = "computed"
        if mode != "done":
            defs_dir = tmp / "repart.d"
            write_definitions(defs, defs_dir)
            src = tmp / "src"
            for sub in ("live-root", "live-esp", "node-esp"):
                (src / sub).mkdir(parents=True, exist_ok=True)
            dry = _repart_dry_run(resolved.disk, defs_dir, src, iid, mode)
            if dry is not None:
                table_source = "from systemd-repart --dry-run"
                table = _table_from_repart(dry, table)
    shim = any(rel.lower() == "efi/boot/grubx64.efi" for rel, _ in listing)
    boot = [
        "UEFI: systemd-boot (EFI/systemd/systemd-bootx64.efi and the removable-media path EFI/BOOT/BOOTX64.EFI), "
        "`bootctl install --root` on the node's ESP (its own random seed); no firmware boot entry is added: "
        "the firmware finds the disk by the removable-media path",
        *(["Secure Boot: the boot medium's shim (Microsoft-signed) back on EFI/BOOT/BOOTX64.EFI after bootctl, "
           "starting systemd-boot (Debian-signed) as EFI/BOOT/grubx64.efi"] if shim else []),
        f"legacy BIOS: grub-mkimage (i386-pc; finds the node's ESP by its file system UUID; modules "
        f"{' '.join(GRUB_MODULES)}) into the ESP's /grub/i386-pc/core.img, and grub-bios-setup: boot.img "
        f"in the protective MBR of {resolved.disk.path}, core.img in partition 2",
        f"both boot root=PARTUUID={root_uuid} with the boot medium's kernel command line",
    ]
    notes = []
    if resolved.disk.removable:
        notes.append(f"{resolved.disk.path} is removable (USB?); the node then boots from it")
    return InstallPlan(
        resolved=resolved, mode=mode, sources=sources, partitions=table, table_source=table_source,
        definitions=defs, esp_files=listing, esp_overrides=overrides, root_used=root_used_bytes(sources.root),
        settings=settings, boot=boot, notes=notes,
    )


_ROLE_BY_TYPE = {"esp": "esp", BIOS_BOOT_TYPE: "bios-boot", "root-x86-64": "root", ROOT_X86_64_TYPE: "root"}


def _table_from_repart(rows: list[dict[str, object]], computed: list[PlannedPartition]) -> list[PlannedPartition]:
    by_role = {p.role: p for p in computed}
    out = []
    for row in rows:
        role = _ROLE_BY_TYPE.get(str(row.get("type")), "")
        base = by_role.get(role)
        if base is None:
            raise InstallError(f"systemd-repart planned an unexpected partition: {row}")
        out.append(PlannedPartition(
            number=int(row.get("partno", base.number - 1)) + 1,  # type: ignore[call-overload]
            role=role, label=str(row.get("label") or base.label), type_uuid=base.type_uuid,
            part_uuid=str(row.get("uuid") or base.part_uuid), offset=int(row.get("offset") or 0),  # type: ignore[call-overload]
            size=int(row.get("raw_size") or 0), content=base.content,  # type: ignore[call-overload]
        ))
    return out
