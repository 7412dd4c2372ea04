"""The installer's answer files, disk safety and planning (cloudbox.core.install), on real loop devices.

Disks are loop devices over sparse files in /var/tmp (real lsblk, wipefs, blkid, mkfs, sfdisk; nothing
mocked); a private by-id directory stands in for /dev/disk/by-id (this host runs no udev). Every bad answer
file must be refused before anything is written, with an error naming the file, the key, the bad value and
the allowed values. Writing an install (systemd-repart, bootctl, grub) needs the appliance's systemd 257 and
runs in tests/image/install.bats.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from cloudbox.core.errors import AnswerError, InstallError
from cloudbox.core.install import Machine, check_answers, load_answers, make_plan, parse_answers
from cloudbox.core.install.answers import Answers
from cloudbox.core.install.apply import _efi_boot_file, _shim
from cloudbox.core.install.disks import GiB, MiB, part_uuid_for
from cloudbox.core.install.plan import Sources, adapt_entry, adapt_grub_cfg, detect_mode
from cloudbox.core.install.unattended import cmdline_answers_path

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: loop devices, mkfs, mounts")
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIENOjxf0CgSsL4lQCx7uvCzVPVZgcvHPvucArzJFwCzT test"
HASH = "$6$yAS/Ne2GmLuv3XGb$wqEONWcbW0.y5n3cSvZxvbkAeVDtYYtfcX1AnqzDfIsb7aV/CNSwH0/.Pw2/yYVFX6VV3I8CdGvdqpKbk1K2u1"


def _mounts() -> str:
    """This namespace's mounts but network namespaces' (nsfs): runs of other sessions on the host add and remove those,
    an install never does."""
    return "".join(line for line in Path("/proc/self/mountinfo").read_text().splitlines(keepends=True)
                   if " - nsfs " not in line)


class Lab:
    """Loop-device disks over sparse files and the by-id directory naming them; everything removed at the end."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="cloudbox-test-install-", dir="/var/tmp"))
        self.by_id = self.dir / "by-id"
        self.by_id.mkdir()
        self.loops: list[str] = []
        self.mounted: list[Path] = []

    def disk(self, name: str, size: int) -> str:
        img = self.dir / f"{name}.img"
        with open(img, "wb") as f:
            f.truncate(size)
        dev = subprocess.run(["losetup", "--find", "--show", "--partscan", str(img)], capture_output=True,
                             text=True, check=True).stdout.strip()
        self.loops.append(dev)
        (self.by_id / f"loop-{name}").symlink_to(dev)
        return dev

    def link(self, name: str) -> str:
        return str(self.by_id / f"loop-{name}")

    def machine(self) -> Machine:
        return Machine.probe(include_loop=True, by_id_dir=str(self.by_id))

    def mount(self, dev: str) -> Path:
        mnt = self.dir / f"mnt-{len(self.mounted)}"
        mnt.mkdir()
        subprocess.run(["mount", dev, str(mnt)], check=True)
        self.mounted.append(mnt)
        return mnt

    def close(self) -> None:
        for m in self.mounted:
            subprocess.run(["umount", "-l", str(m)], capture_output=True)
        for dev in self.loops:
            subprocess.run(["losetup", "-d", dev], capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def lab() -> Iterator[Lab]:
    if os.geteuid() != 0:
        pytest.skip("needs root: loop devices, mkfs, mounts")
    lab = Lab()
    try:
        yield lab
    finally:
        lab.close()
    # No loop device, mount or file of this test is left behind.
    out = subprocess.run(["losetup", "--list", "--noheadings", "-O", "BACK-FILE"], capture_output=True,
                         text=True).stdout
    assert str(lab.dir) not in out
    assert str(lab.dir) not in _mounts()
    assert not lab.dir.exists()


@pytest.fixture
def nic(lab: Lab) -> str:
    nics = lab.machine().nics
    if not nics:
        pytest.skip("this host has no physical NIC to name in an answer file")
    return nics[0].name


def write(tmp_path: Path, text: str, name: str = "answers.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def good(target: str, nic: str, **extra: str) -> str:
    lines = ['role = "all-in-one"', 'hostname = "node1"', "", "[disk]", f'target = "{target}"']
    if "confirm" in extra:
        lines.append(f'confirm_serial = "{extra["confirm"]}"')
    lines += ["", "[network]", f'campus_nic = "{nic}"', "", "[root]", f'ssh_authorized_keys = ["{KEY}"]']
    return "\n".join(lines) + "\n"


def refused(path: Path, machine: Machine) -> AnswerError:
    """The AnswerError for a file; the file's name is in the message (every error names the file)."""
    with pytest.raises(AnswerError) as ei:
        check_answers(load_answers(path), machine, str(path))
    err = ei.value
    assert str(path) in str(err)
    assert "nothing was written" in str(err)
    return err


def problem(err: AnswerError, key: str):  # type: ignore[no-untyped-def]
    found = [p for p in err.problems if p.key == key]
    assert found, f"no problem for {key} in:\n{err}"
    return found[0]


# ------------------------------------------------------------------------------------------ the file alone
@pytest.mark.parametrize(
    ("text", "key", "message", "allowed"),
    [
        ('role = "all-in-one"\nhostname = "a"\ncolour = "red"\n[disk]\ntarget = "/dev/disk/by-id/x"\n',
         "colour", "unknown key", "role, hostname"),
        ('role = "all-in-one"\nhostname = "a"\n[disk]\ntarget = "/dev/disk/by-id/x"\nsize = "8G"\n',
         "disk.size", "unknown key", "target, confirm_serial"),
        ('role = ["front-end", "back-end"]\nhostname = "a"\n[disk]\ntarget = "/dev/disk/by-id/x"\n',
         "role", "exactly one role", "front-end, back-end, all-in-one"),
        ('role = "controller"\nhostname = "a"\n[disk]\ntarget = "/dev/disk/by-id/x"\n',
         "role", "not an allowed value", "front-end, back-end, all-in-one"),
        ('role = "all-in-one"\nhostname = "a"\n[disk]\ntarget = "/dev/disk/by-id/x"\n[network]\nprivate_mtu = 9600\n',
         "network.private_mtu", "out of range", "1500..9000"),
        ('role = "all-in-one"\nhostname = "a"\n[disk]\ntarget = "/dev/disk/by-id/x"\n[network]\nprivate_mtu = "9000"\n',
         "network.private_mtu", "must be an integer", "1500..9000"),
        ('role = "back-end"\nhostname = "a"\n[disk]\ntarget = "/dev/disk/by-id/x"\n[network]\nprivate_nic = "eth0"\n',
         "network.frontend", "must know its front-end", "discover"),
        ('role = "front-end"\nhostname = "a"\n[disk]\ntarget = "/dev/disk/by-id/x"\n[network]\nprivate_nic = "eth0"\n'
         'campus_nic = "eth1"\nfrontend = "10.0.0.1"\n',
         "network.frontend", "only a back-end has a front-end", "no network.frontend"),
        ('role = "back-end"\nhostname = "a"\n[disk]\ntarget = "/dev/disk/by-id/x"\n[network]\nprivate_nic = "eth0"\n'
         'frontend = "front.example"\n', "network.frontend", "not an IP address", "discover"),
        ('role = "back-end"\nhostname = "a"\n[disk]\ntarget = "/dev/disk/by-id/x"\n[network]\nprivate_nic = "eth0"\n'
         'frontend = "127.0.0.1"\n', "network.frontend", "loopback", "discover"),
        ('role = "all-in-one"\nhostname = "Node_1"\n[disk]\ntarget = "/dev/disk/by-id/x"\n',
         "hostname", "not in the allowed form", "lowercase letters, digits and '-'"),
        ('role = "all-in-one"\n[disk]\ntarget = "/dev/disk/by-id/x"\n',
         "hostname", "required key is missing", "lowercase letters"),
        ('role = "front-end"\nhostname = "a"\n[disk]\ntarget = "/dev/disk/by-id/x"\n[network]\nprivate_nic = "eth0"\n',
         "network.campus_nic", "campus network", "NIC name"),
        ('role = "front-end"\nhostname = "a"\n[disk]\ntarget = "/dev/disk/by-id/x"\n[network]\ncampus_nic = "eth0"\n',
         "network.private_nic", "private network", "NIC name"),
        ('role = "front-end"\nhostname = "a"\n[disk]\ntarget = "/dev/disk/by-id/x"\n[network]\nprivate_nic = "eth0"\n'
         'campus_nic = "eth0"\n', "network.campus_nic", "same NIC", "other than network.private_nic"),
        ('role = "all-in-one"\nhostname = "a"\n[disk]\ntarget = "/dev/disk/by-id/x"\n[root]\n'
         'password_hash = "hunter2"\n', "root.password_hash", "not in the allowed form", "openssl passwd -6"),
        ('role = "all-in-one"\nhostname = "a"\n[disk]\ntarget = "/dev/disk/by-id/x"\n[root]\n'
         f'password_hash = "{HASH}"\npassword_credential = "passwd.hashed-password.root"\n',
         "root.password_credential", "not both", "one of root.password_hash"),
        ('role = "all-in-one"\nhostname = "a"\n[disk]\ntarget = "/dev/disk/by-id/x"\n[root]\n'
         'ssh_authorized_keys = ["ssh-ed25519 not-base64!"]\n',
         "root.ssh_authorized_keys", "not an OpenSSH public key", "OpenSSH public keys"),
        ('role = "all-in-one"\nhostname = "a"\nafter = "shutdown"\n[disk]\ntarget = "/dev/disk/by-id/x"\n',
         "after", "not an allowed value", "reboot, poweroff, stay"),
        ('role = "all-in-one"\nhostname = "a"\n', "disk", "required key is missing", "target, confirm_serial"),
        ('role = "front-end"\nhostname = "a"\n[disk]\ntarget = "/dev/disk/by-id/x"\n[network]\nprivate_nic = "eth0"\n'
         'campus_nic = "eth1"\nprivate_address = "8.8.8.1/24"\n', "network.private_address", "not in a private range",
         "10.73.0.1/24"),
        ('role = "front-end"\nhostname = "a"\n[disk]\ntarget = "/dev/disk/by-id/x"\n[network]\nprivate_nic = "eth0"\n'
         'campus_nic = "eth1"\nprivate_address = "10.73.0.1"\n', "network.private_address", "prefix", "/8../27"),
        ('role = "front-end"\nhostname = "a"\n[disk]\ntarget = "/dev/disk/by-id/x"\n[network]\nprivate_nic = "eth0"\n'
         'campus_nic = "eth1"\nprivate_address = "10.73.0.0/24"\n', "network.private_address", "broadcast address",
         "private range"),
        ('role = "back-end"\nhostname = "a"\n[disk]\ntarget = "/dev/disk/by-id/x"\n[network]\nprivate_nic = "eth0"\n'
         'frontend = "discover"\nprivate_address = "10.73.0.9/24"\n', "network.private_address",
         "only a front-end", "DHCP"),
        ('role = "all-in-one"\nhostname = "a"\n[disk\ntarget = "x"\n', "line 3", "TOML syntax error", "TOML 1.0"),
    ],
    ids=["unknown-key", "unknown-key-in-section", "two-roles", "bad-role", "mtu-too-big", "mtu-string",
         "backend-without-frontend", "frontend-for-frontend", "frontend-not-ip", "frontend-loopback",
         "bad-hostname", "missing-hostname", "frontend-without-campus-nic", "frontend-without-private-nic",
         "same-nic-twice", "bad-password-hash", "hash-and-credential", "bad-ssh-key", "bad-after",
         "missing-disk", "private-address-public", "private-address-no-prefix", "private-address-network",
         "private-address-on-back-end", "toml-syntax"],
)
def test_bad_answer_file_alone(tmp_path, text, key, message, allowed):
    path = write(tmp_path, text, "bad.toml")
    with pytest.raises(AnswerError) as ei:
        load_answers(path)
    err = ei.value
    assert str(path) in str(err) and "nothing was written" in str(err)
    p = problem(err, key)
    assert message in p.message
    assert p.allowed is not None and allowed in p.allowed
    assert f"{key}: " in str(err) and "allowed: " in str(err)


def test_every_problem_is_reported_at_once(tmp_path):
    path = write(tmp_path, 'role = "back-end"\nhostname = "-x"\n[disk]\ntarget = "/dev/disk/by-id/x"\n'
                           "[network]\nprivate_mtu = 100\n")
    with pytest.raises(AnswerError) as ei:
        load_answers(path)
    keys = {p.key for p in ei.value.problems}
    # Field errors and the rules between keys together (a back-end needs a front-end and a private NIC).
    assert keys == {"hostname", "network.private_mtu", "network.frontend", "network.private_nic"}
    assert "(4 problems)" in str(ei.value)
    assert "100" in str(ei.value) and "'-x'" in str(ei.value)


def test_missing_file_names_the_file(tmp_path):
    with pytest.raises(AnswerError, match=r"(?s)no-such\.toml.*no such file"):
        load_answers(tmp_path / "no-such.toml")


def test_install_id_follows_what_is_written_not_after():
    base = 'role = "all-in-one"\nhostname = "a"\n[disk]\ntarget = "/dev/disk/by-id/x"\n'
    a = parse_answers(base)
    assert a.install_id == parse_answers(base + "").install_id
    assert a.install_id == parse_answers('after = "poweroff"\n' + base).install_id
    assert a.install_id != parse_answers(base.replace('"a"', '"b"')).install_id
    assert isinstance(parse_answers(a.to_toml()), Answers) and parse_answers(a.to_toml()) == a


def test_cmdline_names_answers_path():
    assert cmdline_answers_path("quiet cloudbox.answers=/cloudbox/n2.toml ro") == "/cloudbox/n2.toml"
    assert cmdline_answers_path("quiet ro") is None


def test_boot_entries_name_the_nodes_root():
    grub = ('set timeout=0\nmenuentry "x" {\n    linux /vmlinuz root=PARTUUID=aaaa console=ttyS0\n'
            "    initrd /initrd\n}\n")
    out = adapt_grub_cfg(grub, "1234")
    assert "root=PARTUUID=1234" in out and "aaaa" not in out and "console=ttyS0" in out
    entry = "title x\nlinux /vmlinuz\noptions console=ttyS0 root=/dev/sda2\ninitrd /initrd\n"
    out = adapt_entry(entry, "1234")
    assert "options console=ttyS0 root=PARTUUID=1234\n" in out and "/dev/sda2" not in out
    assert "options root=PARTUUID=9" in adapt_entry("title x\nlinux /v\n", "9")


# ------------------------------------------------------------------------------------------ against the machine
@root_only
def test_disks_are_classified(lab):
    lab.disk("blank", 9 * GiB)
    gpt = lab.disk("gpt", 9 * GiB)
    subprocess.run(["sfdisk", "--quiet", gpt], input="label: gpt\n,100M\n", text=True, check=True)
    ext4 = lab.disk("ext4", 9 * GiB)
    subprocess.run(["mkfs.ext4", "-q", "-L", "precious", ext4], check=True)
    junk = lab.disk("junk", 9 * GiB)
    with open(junk, "r+b") as f:
        f.write(os.urandom(4096))
    lab.disk("small", 1 * GiB)
    mounted = lab.disk("mounted", 9 * GiB)
    subprocess.run(["mkfs.ext4", "-q", mounted], check=True)
    mnt = lab.mount(mounted)
    disks = {os.path.basename(d.by_id[0]): d for d in lab.machine().disks if d.by_id}
    assert disks["loop-blank"].status == "offered"
    assert disks["loop-gpt"].status == "confirm" and "gpt partition table" in disks["loop-gpt"].signatures
    assert disks["loop-ext4"].status == "confirm"
    assert any("ext4" in s and "precious" in s for s in disks["loop-ext4"].signatures)
    assert disks["loop-junk"].status == "confirm" and "unrecognised data" in disks["loop-junk"].why()
    assert disks["loop-small"].status == "refused" and "too small" in disks["loop-small"].why()
    assert disks["loop-mounted"].status == "refused" and f"mounted on {mnt}" in disks["loop-mounted"].why()
    assert disks["loop-ext4"].serial == "ext4.img"  # a loop device's "serial" is its backing file's name


@root_only
def test_root_disk_is_the_boot_medium(lab):
    root = next((d for d in Machine.probe().disks if d.boot_medium), None)
    if root is None:
        pytest.skip("the root file system is not on a disk here (overlay, tmpfs or network)")
    assert root.status == "refused" and "boot medium: holds the running system" in root.why()


@root_only
def test_disk_not_found(lab, nic, tmp_path):
    lab.disk("blank", 9 * GiB)
    err = refused(write(tmp_path, good(lab.link("nope"), nic)), lab.machine())
    p = problem(err, "disk.target")
    assert p.message == "no such disk on this machine" and lab.link("nope") == p.value
    assert lab.link("blank") in (p.allowed or "")


@root_only
def test_disk_too_small(lab, nic, tmp_path):
    lab.disk("small", 2 * GiB)
    p = problem(refused(write(tmp_path, good(lab.link("small"), nic)), lab.machine()), "disk.target")
    assert "too small: 2.0 GiB" in p.message and "at least 8.0 GiB" in p.message


@root_only
def test_target_not_by_id(lab, nic, tmp_path):
    dev = lab.disk("blank", 9 * GiB)
    p = problem(refused(write(tmp_path, good(dev, nic)), lab.machine()), "disk.target")
    assert "by-id" in p.message and lab.link("blank") in (p.allowed or "")


@root_only
def test_target_is_the_boot_medium(lab, nic, tmp_path):
    root = next((d for d in Machine.probe().disks if d.boot_medium), None)
    if root is None:
        pytest.skip("the root file system is not on a disk here (overlay, tmpfs or network)")
    (lab.by_id / "loop-root").symlink_to(root.path)
    p = problem(refused(write(tmp_path, good(lab.link("root"), nic)), lab.machine()), "disk.target")
    assert "never installs onto this disk: boot medium" in p.message


@root_only
def test_target_with_mounted_file_system(lab, nic, tmp_path):
    dev = lab.disk("busy", 9 * GiB)
    subprocess.run(["mkfs.ext4", "-q", dev], check=True)
    mnt = lab.mount(dev)
    text = good(lab.link("busy"), nic, confirm="busy.img")  # even confirmed: a mounted disk is never written
    p = problem(refused(write(tmp_path, text), lab.machine()), "disk.target")
    assert f"is mounted on {mnt}" in p.message


@root_only
def test_data_needs_the_serial(lab, nic, tmp_path):
    dev = lab.disk("data", 9 * GiB)
    subprocess.run(["sfdisk", "--quiet", dev], input="label: gpt\n,\n", text=True, check=True)
    p = problem(refused(write(tmp_path, good(lab.link("data"), nic)), lab.machine()), "disk.confirm_serial")
    assert p.value is None and "gpt partition table" in p.message and p.allowed == f"'data.img' (erases {dev})"
    p = problem(refused(write(tmp_path, good(lab.link("data"), nic, confirm="other")), lab.machine()),
                "disk.confirm_serial")
    assert p.value == "other" and "does not match" in p.message and "'data.img'" in (p.allowed or "")
    r = check_answers(load_answers(write(tmp_path, good(lab.link("data"), nic, confirm="data.img"))), lab.machine())
    assert r.disk.path == dev and not r.resume


@root_only
def test_filesystem_signature_needs_the_serial(lab, nic, tmp_path):
    dev = lab.disk("fs", 9 * GiB)
    subprocess.run(["mkfs.ext4", "-q", dev], check=True)
    p = problem(refused(write(tmp_path, good(lab.link("fs"), nic)), lab.machine()), "disk.confirm_serial")
    assert "ext4 on whole disk" in p.message


@root_only
def test_nic_not_present(lab, nic, tmp_path):
    lab.disk("blank", 9 * GiB)
    text = good(lab.link("blank"), nic).replace(f'campus_nic = "{nic}"', 'campus_nic = "enp99s9"')
    p = problem(refused(write(tmp_path, text), lab.machine()), "network.campus_nic")
    assert p.message == "no such NIC on this machine" and nic in (p.allowed or "")


@root_only
def test_same_nic_by_name_and_mac(lab, nic, tmp_path):
    lab.disk("blank", 9 * GiB)
    mac = lab.machine().nic(nic).mac  # type: ignore[union-attr]
    text = good(lab.link("blank"), nic).replace("[network]", f'[network]\nprivate_nic = "{mac}"')
    p = problem(refused(write(tmp_path, text), lab.machine()), "network.campus_nic")
    assert "same NIC" in p.message


@root_only
def test_missing_password_credential(lab, nic, tmp_path):
    lab.disk("blank", 9 * GiB)
    text = good(lab.link("blank"), nic) + 'password_credential = "cloudbox.test-no-such"\n'
    m = lab.machine()
    m.cred_dirs = [tmp_path / "creds"]
    p = problem(refused(write(tmp_path, text), m), "root.password_credential")
    assert "no such credential" in p.message and str(tmp_path / "creds") in (p.allowed or "")
    (tmp_path / "creds").mkdir()
    (tmp_path / "creds" / "cloudbox.test-no-such").write_text(HASH + "\n")
    assert check_answers(load_answers(write(tmp_path, text)), m).password_hash == HASH


@root_only
def test_earlier_install_of_the_same_answers_is_recognised(lab, nic, tmp_path):
    """A disk whose partitions carry the UUIDs of these answers' install id is resumed without a confirmation;
    other answers see a disk holding data."""
    dev = lab.disk("mine", 9 * GiB)
    path = write(tmp_path, good(lab.link("mine"), nic))
    iid = load_answers(path).install_id
    table = "label: gpt\n" + "".join(
        f"size={size}, type={t}, uuid={part_uuid_for(iid, role)}\n"
        for role, t, size in (("esp", "U", "1G"), ("bios-boot", "21686148-6449-6E6F-744E-656564454649", "1M"),
                              ("root", "4F68BCE3-E8CD-4DB1-96E7-FBCAF984B709", "")))
    subprocess.run(["sfdisk", "--quiet", dev], input=table, text=True, check=True)
    r = check_answers(load_answers(path), lab.machine(), str(path))
    assert r.resume and detect_mode(r) == "resume"  # no journal on the root partition: interrupted
    other = write(tmp_path, good(lab.link("mine"), nic).replace("node1", "node2"), "other.toml")
    p = problem(refused(other, lab.machine()), "disk.confirm_serial")
    assert "gpt partition table" in p.message


# ------------------------------------------------------------------------------------------ planning
def _fake_esp(d: Path) -> Path:
    (d / "loader/entries").mkdir(parents=True)
    (d / "grub").mkdir()
    (d / "EFI/BOOT").mkdir(parents=True)
    (d / "EFI/BOOT/BOOTX64.EFI").write_bytes(b"MZ" + b"\0" * 1000)
    (d / "loader/entries/cloudbox-6.12.conf").write_text(
        "title cloudbox 6.12\nlinux /cloudbox/6.12/vmlinuz\noptions console=ttyS0,115200\ninitrd /cloudbox/initrd\n")
    (d / "grub/grub.cfg").write_text(
        'set timeout=0\nmenuentry "cloudbox" {\n    linux /cloudbox/6.12/vmlinuz root=PARTUUID=0000 console=ttyS0\n}\n')
    (d / "loader/random-seed").write_bytes(os.urandom(32))
    return d


def test_a_medium_starts_through_shim_when_its_second_stage_is_beside_it(tmp_path):
    """Secure Boot: on the cloudbox image shim is EFI/BOOT/BOOTX64.EFI and systemd-boot sits beside it as shim's
    second stage, grubx64.efi; the installer puts that shim back after bootctl. Names match as on FAT, in any case."""
    esp = _fake_esp(tmp_path / "esp")
    assert _shim(esp) is None  # systemd-boot started directly: nothing to put back
    (esp / "EFI/BOOT/grubx64.EFI").write_bytes(b"MZ" + b"\0" * 100)
    assert _shim(esp) == esp / "EFI/BOOT/BOOTX64.EFI"
    assert _efi_boot_file(esp, "GRUBX64.efi") == esp / "EFI/BOOT/grubx64.EFI"
    assert _shim(tmp_path) is None  # no EFI/BOOT at all


def _sha(path: str) -> str:
    """sha256 of a sparse file's content: every non-zero MiB with its offset (holes and zeros read alike, so
    the host file system's extent layout does not matter), found through SEEK_DATA/SEEK_HOLE."""
    h = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY)
    try:
        end, pos, seen = os.fstat(fd).st_size, 0, set()
        while pos < end:
            try:
                start = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError:
                break  # only a hole remains
            stop = os.lseek(fd, start, os.SEEK_HOLE)
            for block in range(start // MiB * MiB, stop, MiB):
                if block in seen:
                    continue
                seen.add(block)
                chunk = os.pread(fd, MiB, block)
                if chunk.count(0) != len(chunk):
                    h.update(block.to_bytes(8, "little") + chunk)
            pos = stop
    finally:
        os.close(fd)
    return h.hexdigest()


@root_only
def test_dry_run_plan_writes_nothing(lab, nic, tmp_path):
    dev = lab.disk("target", 9 * GiB)
    subprocess.run(["mkfs.ext4", "-q", "-L", "old", dev], check=True)
    esp = _fake_esp(tmp_path / "esp")
    img = str(lab.dir / "target.img")
    subprocess.run(["blockdev", "--flushbufs", dev], check=True)  # mkfs's writes reach the backing file
    before_disk, before_mounts = _sha(img), _mounts()
    path = write(tmp_path, good(lab.link("target"), nic, confirm="target.img"))
    r = check_answers(load_answers(path), lab.machine(), str(path))
    plan = make_plan(r, Sources(root="/", esp=str(esp)))
    text = plan.describe()
    root_uuid = part_uuid_for(r.install_id, "root")
    assert plan.mode == "fresh" and [p.role for p in plan.partitions] == ["esp", "bios-boot", "root"]
    assert plan.partitions[-1].offset + plan.partitions[-1].size <= 9 * GiB
    assert "ERASES what the disk holds: ext4 on whole disk (label 'old')" in text
    assert f"linux /cloudbox/6.12/vmlinuz console=ttyS0 root=PARTUUID={root_uuid}" in text
    assert f"options console=ttyS0,115200 root=PARTUUID={root_uuid}" in text
    assert f"UUID={root_uuid}" in text and "CopyFiles=/live-root:/" in text
    assert "EFI/BOOT/BOOTX64.EFI" in text and "loader/random-seed" not in text.split("2. Copied")[1].split("3.")[0]
    assert 'role = "all-in-one"' in text and "/etc/systemd/network/20-cloudbox-campus.network" in text
    assert KEY in text and "grub-bios-setup" in text
    # Nothing written, nothing left mounted.
    subprocess.run(["blockdev", "--flushbufs", dev], check=True)
    assert _sha(img) == before_disk
    assert _mounts() == before_mounts


@root_only
def test_plan_refuses_an_esp_without_entries(lab, nic, tmp_path):
    lab.disk("target", 9 * GiB)
    (tmp_path / "esp").mkdir()
    path = write(tmp_path, good(lab.link("target"), nic))
    r = check_answers(load_answers(path), lab.machine(), str(path))
    before = _mounts()
    with pytest.raises(InstallError, match="has no boot entries"):
        make_plan(r, Sources(root="/", esp=str(tmp_path / "esp")))
    assert _mounts() == before


# ------------------------------------------------------------------------------------------ command line
def _lab_hooks(lab, monkeypatch) -> None:
    """The installer's test hooks pointed at the lab: its loop devices are the disks, its by-id links their names."""
    monkeypatch.setenv("CLOUDBOX_INSTALL_LOOP", "1")
    monkeypatch.setenv("CLOUDBOX_INSTALL_BY_ID_DIR", str(lab.by_id))


@root_only
def test_cli_rejects_bad_answers_with_exit_2(lab, tmp_path, monkeypatch, cli_run):
    lab.disk("blank", 9 * GiB)
    path = write(tmp_path, 'role = "back-end"\nhostname = "a"\n[disk]\ntarget = "/dev/disk/by-id/x"\n'
                           '[network]\nprivate_mtu = 12000\n')
    _lab_hooks(lab, monkeypatch)
    rc, out, err = cli_run(["install", "--dry-run", "--answers", str(path)], stdin="")
    assert rc == 2 and out == ""
    assert str(path) in err and "network.private_mtu: out of range (got 12000); allowed: an integer 1500..9000" in err


@root_only
def test_cli_disks_json(lab, monkeypatch, cli_run):
    lab.disk("blank", 9 * GiB)
    _lab_hooks(lab, monkeypatch)
    rc, out, _ = cli_run(["install", "disks", "--json"], stdin="")
    assert rc == 0
    blank = next(d for d in json.loads(out) if lab.link("blank") in d["by_id"])
    assert blank["status"] == "offered" and blank["why"] == "blank: offered"


@root_only
def test_interview_asks_for_the_serial_of_a_disk_with_data(lab, nic):
    from cloudbox.cli.install import Interview

    dev = lab.disk("data", 9 * GiB)
    subprocess.run(["mkfs.ext4", "-q", dev], check=True)
    m = lab.machine()
    m.disks = [d for d in m.disks if d.path == dev]
    nics = [n.name for n in m.nics]
    replies = iter([
        "3",  # all-in-one
        "1",  # the only usable disk
        "wrong", "data.img",  # a wrong serial is asked again
        "Bad_Name", "aio",  # an invalid hostname is asked again
        *(["1"] if len(nics) >= 1 else []),  # campus NIC: the first
        "",  # no SSH key
        "",  # default: reboot
    ])
    out = io.StringIO()
    answers = Interview(m, ask=lambda prompt: next(replies), secret=lambda prompt: "", out=out).run()
    assert answers.role == "all-in-one" and answers.hostname == "aio"
    assert answers.disk.confirm_serial == "data.img" and answers.disk.target == lab.link("data")
    assert "that is not its serial" in out.getvalue() and "not in the allowed form" in out.getvalue()
    assert answers.root.password_hash is None and answers.after == "reboot"


def test_progress_lines_follow_sys_stdout(monkeypatch):
    """The unattended install redirects sys.stdout to the kernel log after import: progress must follow it."""
    from cloudbox.cli.install import ProgressPrinter
    from cloudbox.core.install import ProgressEvent

    buf = io.StringIO()
    monkeypatch.setattr("sys.stdout", buf)
    ProgressPrinter()(ProgressEvent("partition", 1, 7, "copying the root file system: 321 of ~642 MiB", 0.5))
    assert "[1/7 partition]  50.0% copying the root file system: 321 of ~642 MiB\n" in buf.getvalue()


@root_only
def test_unattended_answers_are_found_in_order(tmp_path):
    """Credential first, then the file the kernel command line names on the ESP, then /cloudbox/answers.toml;
    the ESP is viewed read-only and unmounted afterwards."""
    from cloudbox.core.install.unattended import find_answers

    esp = tmp_path / "esp"
    (esp / "cloudbox").mkdir(parents=True)
    (esp / "cloudbox/answers.toml").write_text("default\n")
    (esp / "cloudbox/n2.toml").write_text("named\n")
    m = Machine(disks=[], nics=[], cred_dirs=[tmp_path / "creds"])
    before = _mounts()
    found = find_answers(m, str(esp), cmdline="quiet")
    assert found is not None and found.text == "default\n" and found.source == f"{esp}:/cloudbox/answers.toml"
    found = find_answers(m, str(esp), cmdline="cloudbox.answers=/cloudbox/n2.toml")
    assert found is not None and found.text == "named\n"
    with pytest.raises(InstallError, match=r"names cloudbox.answers=/cloudbox/n3.toml, but .* has no such file"):
        find_answers(m, str(esp), cmdline="cloudbox.answers=/cloudbox/n3.toml")
    with pytest.raises(InstallError, match="must be an absolute path"):
        find_answers(m, str(esp), cmdline="cloudbox.answers=../etc/shadow")
    (tmp_path / "creds").mkdir()
    (tmp_path / "creds/cloudbox.answers").write_text("credential\n")
    found = find_answers(m, str(esp), cmdline="cloudbox.answers=/cloudbox/n2.toml")
    assert found is not None and found.text == "credential\n" and found.source.startswith("credential cloudbox.answers")
    (tmp_path / "creds/cloudbox.answers").unlink()
    (esp / "cloudbox/answers.toml").unlink()
    assert find_answers(m, str(esp), cmdline="quiet") is None
    assert _mounts() == before


@root_only
def test_cleanup_never_deletes_below_a_busy_mount(tmp_path):
    """A work directory whose mount cannot be unmounted (busy) is left alone: the installed root mounted there
    must never be emptied by the recursive delete. Stale runs (process gone) are unmounted and removed."""
    from cloudbox.core.install.apply import reap_stale, remove_work

    work = Path(tempfile.mkdtemp(prefix="cloudbox-test-work-", dir="/var/tmp"))
    try:
        run = work / "run-999999999"  # no such process: stale
        target = run / "target"
        target.mkdir(parents=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(target)], check=True)
        (target / "precious").write_text("installed system")
        with open(target / "precious") as busy:  # keeps the mount busy: umount fails
            assert remove_work(run) == [str(target)]
            assert (target / "precious").read_text() == "installed system"
            assert busy.read() == "installed system"
        assert reap_stale(work) == []  # no longer busy: unmounted, then removed
        assert not run.exists() and str(work) not in _mounts()
    finally:
        subprocess.run(["umount", "-R", str(work)], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


def _resolved_for(text: str):
    """Answers as `settings_files` sees them, with made-up NICs (settings need no disk or machine probe)."""
    from types import SimpleNamespace

    from cloudbox.core.install.machine import Nic

    a = parse_answers(text)
    pn = Nic("enp2s0", "52:54:00:cb:00:02") if a.network.private_nic else None
    cn = Nic("enp1s0", "52:54:00:cb:00:01") if a.network.campus_nic else None
    return SimpleNamespace(answers=a, private_nic=pn, campus_nic=cn, install_id="x")


def test_front_end_serves_the_private_network_and_back_ends_ask_it():
    from cloudbox.core.install.plan import node_settings_text, settings_files

    head = 'hostname = "n1"\n[disk]\ntarget = "/dev/disk/by-id/x"\n[network]\nprivate_nic = "enp2s0"\n'
    fe = _resolved_for('role = "front-end"\n' + head + 'campus_nic = "enp1s0"\n')
    net = settings_files(fe)["/etc/systemd/network/10-cloudbox-private.network"]  # type: ignore[arg-type]
    assert "Address=10.73.0.1/24\nDHCPServer=yes" in net and "MTUBytes=9000" in net and "EmitRouter=no" in net
    assert 'private_address = "10.73.0.1/24"' in node_settings_text(fe)  # type: ignore[arg-type]
    fe2 = _resolved_for('role = "front-end"\n' + head + 'campus_nic = "enp1s0"\nprivate_address = "192.168.7.1/27"\n'
                        'private_mtu = 1500\n')
    net2 = settings_files(fe2)["/etc/systemd/network/10-cloudbox-private.network"]  # type: ignore[arg-type]
    assert "Address=192.168.7.1/27" in net2 and "MTUBytes=1500" in net2
    assert "MulticastDNS=yes" in net and "Type=ether\nKind=!*" in net
    campus = settings_files(fe)["/etc/systemd/network/20-cloudbox-campus.network"]  # type: ignore[arg-type]
    assert "LLMNR=no\nMulticastDNS=no" in campus  # nothing answers for the node's name on the campus network
    resolved = (Path(__file__).resolve().parents[2] / "mkosi.extra/usr/lib/systemd/resolved.conf.d/50-cloudbox.conf")
    assert "\nLLMNR=no\n" in resolved.read_text()
    be = _resolved_for('role = "back-end"\n' + head + 'frontend = "discover"\n')
    bfiles = settings_files(be)  # type: ignore[arg-type]
    # The back-end's private NIC is a port of the bridge cbpriv0, which takes the DHCP address and its guests' taps.
    bnic = bfiles["/etc/systemd/network/10-cloudbox-private.network"]
    assert "Bridge=cbpriv0" in bnic and "MTUBytes=9000" in bnic and "DHCP" not in bnic and "Kind=!*" in bnic
    bdev = bfiles["/etc/systemd/network/10-cloudbox-private.netdev"]
    assert "Name=cbpriv0\nKind=bridge\nMTUBytes=9000" in bdev
    bnet = bfiles["/etc/systemd/network/11-cloudbox-private-bridge.network"]
    assert "Name=cbpriv0" in bnet and "DHCP=ipv4" in bnet and "DHCPServer=" not in bnet and "\nAddress=" not in bnet
    assert "UseRoutes=no" in bnet and "MulticastDNS=yes" in bnet
    assert "private_address" not in node_settings_text(be)  # type: ignore[arg-type]


def test_the_disks_own_write_rate_is_measured_and_its_file_removed():
    """What the installer prints beside its copy rate: a real dd (O_DIRECT) into a directory of this host's disk,
    its file gone after; a directory without room for it gets a reason naming it instead of a number."""
    from cloudbox.core.install.apply import CopyRate, disk_write_rate

    with tempfile.TemporaryDirectory(prefix="cloudbox-dd-", dir="/var/tmp") as tmp:
        rate = disk_write_rate(Path(tmp), mib=16)
        assert isinstance(rate, CopyRate), rate
        assert rate.bytes == 16 * 2**20 and rate.seconds > 0 and rate.mb_per_s == rate.bytes / rate.seconds / 1e6
        assert os.listdir(tmp) == []
        st = os.statvfs(tmp)
        too_big = st.f_bavail * st.f_frsize // 2**20
        assert disk_write_rate(Path(tmp), mib=too_big) == f"less than {too_big + 64} MiB free on {tmp}"
        assert os.listdir(tmp) == []


@root_only
def test_the_boot_mediums_read_rate_only_reads(lab):
    """The other bound of the copy: a real O_DIRECT read of the device holding a mounted file system (a loop device
    here), whose write count does not move; a directory on no block device gets a reason instead."""
    from cloudbox.core.install.apply import CopyRate, source_read_rate

    dev = lab.disk("medium", 1 * GiB)
    subprocess.run(["mkfs.ext4", "-q", dev], check=True)
    mnt = lab.mount(dev)
    stat = Path(f"/sys/block/{os.path.basename(dev)}/stat")
    written = stat.read_text().split()[6]
    rate = source_read_rate(str(mnt), mib=16)
    assert isinstance(rate, CopyRate) and rate.bytes == 16 * 2**20 and rate.seconds > 0, rate
    assert stat.read_text().split()[6] == written
    assert source_read_rate("/proc") == "/proc is not on a block device (an overlay or tmpfs)"
