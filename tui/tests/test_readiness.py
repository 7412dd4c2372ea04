"""The readiness report's facts (core.views.readiness): the firmware's Secure Boot variable, the IOMMU, the CPU's
virtualization flag, a real read-only fio on a block device whose bytes stay what they were, the private link's
facts against this machine's own NIC, and a ping and iperf3 across a veth pair to a namespace standing for a node."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from cloudbox.core.views import readiness


def test_secure_boot_is_read_from_the_firmwares_variable(tmp_path):
    assert readiness.secure_boot_state(tmp_path) == "legacy BIOS boot (no UEFI)"
    efivars = tmp_path / "firmware" / "efi" / "efivars"
    efivars.mkdir(parents=True)
    assert readiness.secure_boot_state(tmp_path).startswith("off (the firmware has no SecureBoot variable)")
    var = efivars / readiness.SECURE_BOOT_VAR
    var.write_bytes(b"\x06\x00\x00\x00\x01")  # attributes, then the value
    assert readiness.secure_boot_state(tmp_path) == "on"
    var.write_bytes(b"\x06\x00\x00\x00\x00")
    assert readiness.secure_boot_state(tmp_path) == "off"


def test_the_iommu_is_on_with_groups_and_named_when_only_the_firmware_table_is_there(tmp_path):
    text, on = readiness.iommu_state(tmp_path)
    assert not on and text.startswith("none found")
    (tmp_path / "firmware" / "acpi" / "tables").mkdir(parents=True)
    (tmp_path / "firmware" / "acpi" / "tables" / "DMAR").write_bytes(b"x")
    text, on = readiness.iommu_state(tmp_path)
    assert not on and "intel_iommu=on" in text and "DMAR" in text
    for g in ("0", "1", "2"):
        (tmp_path / "kernel" / "iommu_groups" / g).mkdir(parents=True)
    assert readiness.iommu_state(tmp_path) == ("enabled (3 groups)", True)


def test_cpu_flags_and_memory_are_read_from_proc():
    model, flag = readiness.cpu_facts("processor: 0\nmodel name : AMD EPYC 7B13\nflags : fpu svm lm\n")
    assert (model, flag) == ("AMD EPYC 7B13", "svm")
    assert readiness.cpu_facts("model name: X\nflags: fpu\n") == ("X", "")
    assert readiness.memory_bytes("MemTotal:       24589412 kB\n") == 24589412 * 1024


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("fio") is None, reason="needs root (a loop device) and fio")
def test_the_read_only_fio_measures_a_device_and_leaves_its_bytes_as_they_were(tmp_path):
    img = tmp_path / "disk.img"
    img.write_bytes(os.urandom(8 * 1024 * 1024))
    before = hashlib.sha256(img.read_bytes()).hexdigest()
    loop = subprocess.run(["losetup", "--find", "--show", str(img)], capture_output=True, text=True,
                          check=True).stdout.strip()
    try:
        r = readiness.gather(fio_seconds=1, devices=[loop])
        (d,) = r.disks
        assert d.name == Path(loop).name and d.size_bytes == 8 * 1024 * 1024 and not d.in_use
        assert d.qd1_iops and d.qd1_iops > 0 and d.qd32_iops and d.qd32_iops > 0, d.read_note
        assert "--readonly" in readiness.read_only_fio_args(loop, 1, 1)
        text = "\n".join(readiness.lines(r))
        assert f"disk {d.name}" in text and "(read-only)" in text and "Secure Boot" in text
    finally:
        subprocess.run(["losetup", "-d", loop], check=False)
    assert hashlib.sha256(img.read_bytes()).hexdigest() == before
    assert r.as_dict()["disks"][0]["name"] == Path(loop).name


def test_a_disk_that_is_not_there_is_named_with_what_is():
    r = readiness.gather(fio_seconds=0, devices=["/dev/nosuchdisk9"])
    assert r.disks == [] and any(p.startswith("no such disk: nosuchdisk9; allowed: ") for p in r.problems)


def _box(cpus: int = 8, gib: int = 32, spare: bool = True) -> readiness.Readiness:
    disks = [readiness.DiskReadiness("vdb", "-", "-", "-", 64 << 30, False, "-", [], "passed")] if spare else []
    return readiness.Readiness("box", "CPU", cpus, "vmx", "KVM", "enabled (1 groups)", True, "on", gib << 30, 1,
                               disks=disks)


def test_what_a_box_can_answer_names_what_each_study_misses(isolated):
    from cloudbox.core.studies import capability, loading

    d, a = loading.find_study("d"), loading.find_study("a")
    small = capability.capability(d, _box(cpus=2), size="study", nodes=[])
    assert not small.whole and small.runnable == 0
    assert any("4 CPUs for 4 guests of 1 vCPU (this box has 2)" in m for m in small.missing)
    assert capability.capability(d, _box(cpus=2), size="quick", nodes=[]).whole
    lone = capability.capability(a, _box(spare=False), size="study", nodes=[])
    assert any(m.startswith("needs a back-end enrolled") and "tcp-stream-fe" in m
               and m.endswith(", and a second NIC on this box for the private network (it has no NICs)")
               for m in lone.missing)
    nic = readiness.NicReadiness("eno1", "igb", "up", 1000, 1500, 9216, None, [])
    two = _box(spare=False)
    two.nics = [nic, dataclasses.replace(nic, name="eno2")]
    assert not any("second NIC" in m for m in capability.capability(a, two, size="study", nodes=[]).missing)
    assert set(lone.loop_device) == {"virtio-disk", "kvm-scsi-phy"}
    text = "\n".join(capability.lines([lone]))
    assert "else a loop device stands in and their verdicts are inconclusive: " in text
    paired = capability.capability(a, _box(), size="study", nodes=["be1"])
    assert paired.loop_device == [] and not any("back-end" in m for m in paired.missing)
    assert paired.runnable > lone.runnable


def test_the_readiness_command_prints_json_and_refuses_a_bad_duration(isolated, cli_run):
    import json

    ran = cli_run(["host", "readiness", "--fio-seconds", "0", "--json"])
    data = json.loads(ran.out)
    assert {"cpus", "iommu", "secure_boot", "disks", "nics", "studies"} <= set(data)
    assert {c["study"] for c in data["studies"]} >= {"a", "b", "c", "d"}
    assert ran.code == (1 if data["problems"] else 0)
    bad = cli_run(["host", "readiness", "--fio-seconds", "99"])
    assert bad.code == 2 and "--fio-seconds 99 is not allowed; allowed: 0 to 60" in bad.err


def test_the_installer_says_what_the_machine_offers_in_a_few_lines():
    from cloudbox.core.install.actions import readiness_lines

    lines = readiness_lines()
    assert lines[0].startswith("this machine: ") and "IOMMU " in lines[0] and "Secure Boot " in lines[0]
    assert all(ln.startswith("problem: ") for ln in lines[1:])


# -- the private link and the path to the nodes --------------------------------------------------------------
def test_without_a_private_nic_or_a_node_the_link_checks_say_why_they_were_skipped(isolated, tmp_path, monkeypatch,
                                                                                   cli_run):
    import json

    monkeypatch.setenv("CLOUDBOX_NODE_CONFIG", str(tmp_path / "no-node.toml"))
    r = readiness.gather(fio_seconds=0, devices=[])
    assert r.private_link is None and r.links == []
    assert r.link_note.startswith(f"no private NIC in the node settings ({tmp_path / 'no-node.toml'})")
    assert r.link_note.endswith("no node enrolled: the jumbo-frame ping and iperf3 to another node are skipped")
    assert f"links        {r.link_note}" in readiness.lines(r)
    ran = cli_run(["host", "readiness", "--fio-seconds", "0", "--json"])
    data = json.loads(ran.out)
    assert data["private_link"] is None and data["links"] == [] and "no node enrolled" in data["link_note"]
    bad = cli_run(["host", "readiness", "--link-seconds", "31"])
    assert bad.code == 2 and "--link-seconds 31 is not allowed; allowed: 0 to 30" in bad.err


def _real_nics() -> list[str]:
    net = Path("/sys/class/net")
    return sorted(p.name for p in net.iterdir() if (p / "device").exists())


@pytest.mark.skipif(not _real_nics(), reason="no NIC with a device behind it here")
def test_the_private_links_facts_are_this_machines_own(isolated, tmp_path, monkeypatch):
    import json

    nic = _real_nics()[0]
    sysfs = Path("/sys/class/net") / nic
    ip = json.loads(subprocess.run(["ip", "-details", "-json", "link", "show", "dev", nic], capture_output=True,
                                   text=True, check=True).stdout)[0]
    conf = tmp_path / "node.toml"
    conf.write_text(f'role = "front-end"\n[network]\nprivate_nic = "{nic}"\n')
    monkeypatch.setenv("CLOUDBOX_NODE_CONFIG", str(conf))
    r = readiness.gather(fio_seconds=0, devices=[], link_seconds=0)
    lk = r.private_link
    assert lk is not None and (lk.name, lk.nic) == (nic, nic)
    assert lk.mtu == int((sysfs / "mtu").read_text()) == ip["mtu"]
    assert lk.state == (sysfs / "operstate").read_text().strip() and lk.max_mtu == ip.get("max_mtu")
    try:
        speed = int((sysfs / "speed").read_text())
    except (OSError, ValueError):
        speed = -1
    assert lk.speed_mbps == (speed if speed > 0 else None)
    assert lk.jumbo == (None if lk.max_mtu is None else lk.max_mtu >= 9000)
    assert r.link_note == "no node enrolled: the jumbo-frame ping and iperf3 to another node are skipped"
    assert any(line.startswith(f"private link {nic}: {lk.state}, ") for line in readiness.lines(r))
    with pytest.raises(ValueError, match="no network link nosuchnic0; links here: .*lo"):
        readiness.link_facts("nosuchnic0")


def test_a_bridges_speed_and_duplex_are_its_nics_and_a_nic_without_carrier_has_no_speed(tmp_path):
    net = tmp_path / "class" / "net"
    for name, files in (("cbpriv0", {"mtu": "9000", "operstate": "up"}),
                        ("cbtestnic9", {"mtu": "9000", "operstate": "up", "speed": "10000", "duplex": "full"}),
                        ("cbtestnic8", {"mtu": "1500", "operstate": "down", "duplex": "unknown"})):
        (net / name).mkdir(parents=True)
        for f, v in files.items():
            (net / name / f).write_text(v + "\n")
    (net / "cbpriv0" / "bridge").mkdir()
    (net / "cbpriv0" / "brif" / "cbtestnic9").mkdir(parents=True)
    (net / "cbtestnic9" / "device").mkdir()
    lk = readiness.link_facts("cbpriv0", tmp_path)  # ip knows none of these names: the largest MTU is not known
    assert lk == readiness.LinkFacts("cbpriv0", "cbtestnic9", "up", 10000, "full", 9000, None)
    assert readiness.link_line(lk) == ("cbpriv0 (over cbtestnic9): up, 10000 Mb/s full duplex, MTU 9000, jumbo "
                                       "frames: the driver does not say")
    down = readiness.link_facts("cbtestnic8", tmp_path)
    assert (down.state, down.speed_mbps, down.duplex) == ("down", None, "unknown")


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("iperf3") is None, reason="needs root (a netns) and iperf3")
def test_a_node_behind_a_veth_is_pinged_at_9000_bytes_and_measured_with_iperf3(isolated, tmp_path, monkeypatch):
    """A veth pair stands for the private link, a network namespace for the node: its one-shot iperf3 server is
    started there the way ssh starts it on a node."""
    tag = f"{os.getpid() % 100000}"
    here, there, ns = f"cbrdy{tag}", f"cbrdn{tag}", f"cbready-{tag}"

    def sh(*argv: str) -> None:
        subprocess.run(["ip", *argv], check=True, capture_output=True)

    sh("netns", "add", ns)
    try:
        sh("link", "add", here, "mtu", "9000", "type", "veth", "peer", "name", there, "mtu", "9000")
        sh("link", "set", there, "netns", ns)
        sh("addr", "add", "10.250.77.1/24", "dev", here)
        sh("link", "set", here, "up")
        sh("-n", ns, "addr", "add", "10.250.77.2/24", "dev", there)
        sh("-n", ns, "link", "set", there, "up")
        sh("-n", ns, "link", "set", "lo", "up")
        lk = readiness.link_facts(here)
        assert (lk.state, lk.mtu, lk.speed_mbps, lk.duplex) == ("up", 9000, 10000, "full")  # what veth reports
        assert lk.jumbo is True and lk.max_mtu is not None and lk.max_mtu >= 9000
        conf = tmp_path / "node.toml"
        conf.write_text(f'role = "front-end"\n[network]\nprivate_nic = "{here}"\n')
        monkeypatch.setenv("CLOUDBOX_NODE_CONFIG", str(conf))

        def server(argv: list[str]) -> subprocess.Popen[bytes]:
            return subprocess.Popen(["ip", "netns", "exec", ns, *argv], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE)

        check = readiness.check_node("be1", "10.250.77.2", 1, server)
        assert check.jumbo_ok is True and check.mtu == 9000 and "9000-byte frames pass" in check.detail
        assert check.iperf3_mbps and check.iperf3_mbps > 0, check.iperf3_note
        skipped = readiness.check_node("be1", "10.250.77.2", 0, server)
        assert skipped.iperf3_mbps is None and skipped.iperf3_note == "not measured (--link-seconds 0)"
        r = readiness.gather(fio_seconds=0, devices=[], link_seconds=0)
        assert r.private_link is not None and r.private_link.name == here
        print(f"veth {here}: {readiness.link_line(lk)}; iperf3 {check.iperf3_mbps:.0f} Mb/s over 1 s")
    finally:
        subprocess.run(["ip", "link", "del", here], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
