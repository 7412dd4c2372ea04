"""iSCSI volumes attached by QEMU (disk.attach = qemu): the box's CHAP credentials, the domain's network disk with its
auth, the checks before a run, and a real tgtd (started, refusing a wrong CHAP secret and a stranger's initiator
name, serving this box's, stopped with nothing left: no tgtd, no libvirt secret, no socket, no work directory)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from cloudbox.core import procs
from cloudbox.core.bench import fio, iscsiperf, runners
from cloudbox.core.disks.backing import NetworkSource
from cloudbox.core.disks.volumes import attach, iscsi
from cloudbox.core.disks.volumes.store import VolumeStore
from cloudbox.core.errors import Aborted, CloudboxError
from cloudbox.core.spec import catalogue, profiles
from cloudbox.core.studies import loading
from cloudbox.core.virt.domain import DomainPlan, render_domain

MIB = 1024 * 1024


def test_chap_credentials_are_made_once_per_box_and_private(state):
    c = iscsi.chap()
    f = iscsi.chap_file()
    assert f.stat().st_mode & 0o777 == 0o600 and f.parent.stat().st_mode & 0o777 == 0o700
    assert iscsi.chap() == c  # made once, then read
    assert len(c.secret) == 32 and c.initiator.startswith(iscsi.IQN_PREFIX + ":box-")
    assert c.secret not in repr(c)
    f.unlink()
    assert iscsi.chap().secret != c.secret  # a new box gets a new secret, never a fixed one
    f.write_text("{not json")
    with pytest.raises(CloudboxError, match="chap.json: this box's iSCSI CHAP credentials cannot be read"):
        iscsi.chap()


def test_control_ports_are_in_tgtds_range_and_skip_taken_sockets(tmp_path, monkeypatch):
    monkeypatch.setattr(iscsi, "SOCKET_DIR", tmp_path)
    assert all(1 <= iscsi.control_port(p) <= iscsi.MAX_CONTROL for p in (0, 1, 32767, 32768, 65535))
    n = iscsi.control_port(40000)
    (tmp_path / f"socket.{n}.lock").touch()
    assert iscsi.control_port(40000) == n + 1


def test_the_domain_logs_in_with_chap_from_a_libvirt_secret():
    prof = profiles.find_profile("kvm-ebs-iscsi")
    net = NetworkSource("iscsi", "iqn.2026-11.org.cloudbox:vol.ebs/1", "127.0.0.1", 3261, tls=False,
                        initiator="iqn.2026-11.org.cloudbox:box-1", auth_user="cloudbox-1",
                        auth_usage="cloudbox-iscsi-run")
    xml = render_domain(DomainPlan(prof, name="g", domain_type="qemu", kernel="/k", initrd="/i", cmdline="c",
                                   disk_path="x", disk_is_block=False, bridge=None, network_source=net))
    disk = ET.fromstring(xml).find("devices/disk")
    assert disk.get("type") == "network"
    src = disk.find("source")
    assert (src.get("protocol"), src.get("name"), src.get("tls")) == ("iscsi", "iqn.2026-11.org.cloudbox:vol.ebs/1",
                                                                     None)
    assert src.find("host").attrib == {"name": "127.0.0.1", "port": "3261"}
    assert src.find("initiator/iqn").get("name") == "iqn.2026-11.org.cloudbox:box-1"
    auth = src.find("auth")
    assert auth.get("username") == "cloudbox-1"
    assert auth.find("secret").attrib == {"type": "iscsi", "usage": "cloudbox-iscsi-run"}
    assert "password" not in xml.lower()  # the secret itself is in libvirt, never in the domain


def test_the_preset_is_valid_and_qemu_attach_is_accepted():
    prof = profiles.find_profile("kvm-ebs-iscsi")
    assert (prof.disk.backing, prof.disk.attach, prof.disk.volume) == ("network-volume", "qemu", "iscsi:ebs")
    attach.check_attach("iscsi", "qemu", has_module=lambda m: False)
    assert loading.cannot_run(prof) is None
    with pytest.raises(attach.AttachRefused, match="iscsi_tcp driver"):
        attach.check_attach("iscsi", "host", has_module=lambda m: False)
    guest = profiles.find_profile("kvm-ebs-iscsi-guest")
    assert (guest.disk.backing, guest.disk.attach, guest.disk.volume) == ("network-volume", "guest", "iscsi:ebs")
    attach.check_attach("iscsi", "guest", has_module=lambda m: False)  # the host needs no iscsi_tcp for it
    assert loading.cannot_run(guest) is None
    with pytest.raises(attach.AttachRefused, match="KVM/QEMU only, not guest.hypervisor = xen"):
        attach.check_attach("iscsi", "guest", hypervisor="xen")


PERF_OUT = """iscsi-perf version 0.1 - (c) 2014-2015 by Peter Lieven <pl@kamp.de>

connected to iscsi://cloudbox-3de4094f@127.0.0.1:36301/iqn.2026-11.org.cloudbox:vol.ebs/1
capacity is 131072 blocks or 67108864 byte (64 MB)
performing RANDOM READ with 32 parallel requests
FIXED transfer size of 8 blocks (4096 byte)
infinite runtime - press CTRL-C to abort.

00:00:01 - lba 113828, iops current 80907 (316 MB/s), iops average 80907 (316 MB/s), in_flight 32, busy 0
00:00:02 - lba 66399, iops current 76629 (299 MB/s), iops average 78768 (307 MB/s), in_flight 32, busy 0

finished.
"""


def test_iscsi_perf_reads_as_the_test_does_and_its_average_is_the_result():
    t = catalogue.TESTS["randread-4k-qd32"]
    assert iscsiperf.perf_measures(t) and iscsiperf.perf_measures(catalogue.TESTS["seq-read-64k"])
    for other in ("seq-write-64k", "dd-read-64k", "iozone-read-16m", "bonnie"):
        assert not iscsiperf.perf_measures(catalogue.TESTS[other]), other
    url = "iscsi://u@127.0.0.1:3260/iqn.x/1"
    assert iscsiperf.perf_args(t, url, "iqn.i") == ["iscsi-perf", "-i", "iqn.i", "-r", "-b", "8", "-m", "32", url]
    seq = iscsiperf.perf_args(catalogue.TESTS["seq-read-64k"], url, "iqn.i")
    assert seq == ["iscsi-perf", "-i", "iqn.i", "-b", "128", "-m", "1", url]
    r = iscsiperf.parse_perf(t, PERF_OUT, 2.1)
    assert r.iops == 78768 and r.mbps == pytest.approx(78768 * 4096 / 1e6) and r.seconds == 2.1
    with pytest.raises(CloudboxError, match="printed no average"):
        iscsiperf.parse_perf(t, "iscsi-perf version 0.1\nLogin Failed\n", 0.5)


def test_the_host_domains_relay_logs_in_with_the_secret_from_a_file_and_measures_what_fio_can(tmp_path):
    exp = iscsi.IscsiExport("ebs", "/v", "127.0.0.1", 3260, "iqn.x:vol.ebs", 7)
    c = iscsi.Chap("iqn.x:box", "cloudbox-u", "s3cret")
    argv = iscsi.relay_args(exp, c, tmp_path / "chap.secret", tmp_path / "nbd.sock")
    assert argv[:3] == ["qemu-nbd", "--object", f"secret,id=chap0,file={tmp_path / 'chap.secret'}"]
    assert ("driver=raw,file.driver=iscsi,file.transport=tcp,file.portal=127.0.0.1:3260,file.target=iqn.x:vol.ebs,"
            f"file.lun={iscsi.LUN},file.user=cloudbox-u,file.password-secret=chap0,file.initiator-name=iqn.x:box"
            ) in argv
    assert "s3cret" not in " ".join(argv)
    relay = iscsi.HostRelay(tmp_path / "nbd.sock", tmp_path)
    assert fio.is_nbd_uri(relay.uri) and relay.uri == f"nbd+unix:///lun?socket={tmp_path / 'nbd.sock'}"
    for measured in ("seq-write-64k", "seq-read-64k", "randread-4k-qd32", "dd-write-64k"):
        assert fio.nbd_measures(catalogue.TESTS[measured]) == "", measured
    for other in ("iozone-read-16m", "bonnie"):
        assert "needs a file or a file system on a local disk" in fio.nbd_measures(catalogue.TESTS[other])


def test_exports_here_name_iscsi_and_what_it_lacks(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    got = {e.scheme: e for e in attach.exports_here(has_module=lambda _m: False)}
    want = ("guest", "qemu") if iscsi.qemu_driver() else ("guest",)
    assert got["iscsi"].attach == want and got["iscsi"].server == "tgtd"
    assert got["iscsi"].problem == "tgtd is not installed (Debian package tgt): run 'make deps'"
    if shutil.which("tgtd", path="/usr/sbin"):
        (tmp_path / "tgtd").symlink_to("/usr/sbin/tgtd")
        monkeypatch.setattr(iscsi, "QEMU_ISCSI", [tmp_path / "none.so"])
        e = {e.scheme: e for e in attach.exports_here()}["iscsi"]
        # without QEMU's libiscsi driver only the guest's own initiator attaches
        assert e.attach == ("guest",) and e.usable and e.problem == ""


def test_preflight_refuses_a_missing_target_server(state, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(attach.AttachRefused, match="Debian package tgt"):
        attach.preflight("iscsi:ebs", "qemu", 8 * MIB)


# -- a real tgtd -----------------------------------------------------------------------------------------------------
def _login(exp: iscsi.IscsiExport, user: str, secret: str, initiator: str) -> subprocess.CompletedProcess[str]:
    url = f"iscsi://{user}%{secret}@{exp.host}:{exp.port}/{exp.iqn}/{iscsi.LUN}"
    return subprocess.run(["iscsi-readcapacity16", "-i", initiator, url], capture_output=True, text=True, timeout=30)


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="tgtd's management socket is under /var/run/tgtd (root)")
@pytest.mark.skipif(not (shutil.which("tgtd") and shutil.which("iscsi-readcapacity16")),
                    reason="needs tgtd (tgt) and iscsi-readcapacity16 (libiscsi-bin): make deps-test")
def test_tgtd_refuses_a_wrong_secret_and_a_stranger_and_leaves_nothing(state, libvirt_conn):
    with VolumeStore() as vs:
        vol = vs.create("ebs", 16 * MIB)
    work = state / "work" / "run-i"
    ve = attach.export_for_run("iscsi:ebs", "qemu", run_uuid="run-iscsi-1", work_dir=work, size_bytes=8 * MIB,
                               conn=libvirt_conn)
    exp = ve.export
    assert isinstance(exp, iscsi.IscsiExport)
    control = exp.control_port
    usage = iscsi.secret_usage("run-iscsi-1")
    try:
        c = iscsi.chap()
        assert iscsi.running(vol.path) == [exp.pid] and exp.host == "127.0.0.1"
        assert iscsi.secrets_named(libvirt_conn, usage) == [ve.secret_uuid]
        ok = _login(exp, c.user, c.secret, c.initiator)
        assert ok.returncode == 0 and f"Total size:{16 * MIB}" in ok.stdout, ok.stdout + ok.stderr
        wrong = _login(exp, c.user, "0" * 32, c.initiator)
        assert wrong.returncode != 0 and "Authentication failure" in wrong.stderr, wrong.stdout + wrong.stderr
        stranger = _login(exp, c.user, c.secret, "iqn.2026-11.org.example:someone")
        assert stranger.returncode != 0 and "Login Failed" in stranger.stderr
        assert c.secret not in (work / "tgtd.log").read_text()
        if shutil.which("iscsi-perf"):  # the baseline's reader: logged in as this box, the secret in its env only
            r = iscsiperf.perf(catalogue.TESTS["seq-read-64k"], exp, c, 1.5, lambda: False)
            assert r.mbps > 0 and r.iops > 0 and 1.5 <= r.seconds < 1.5 + iscsiperf.PERF_STOP_S
            assert c.secret not in r.raw
            with pytest.raises(Aborted, match="iscsi-perf"):
                iscsiperf.perf(catalogue.TESTS["randread-4k-qd32"], exp, c, 30, lambda: True)
            assert subprocess.run(["pgrep", "-f", f"iscsi-perf .*:{exp.port}/"], capture_output=True).returncode == 1
        if not iscsi.relay_problem():  # the baseline's way in: QEMU's libiscsi in qemu-nbd, logged in as this box
            relay = iscsi.host_relay(exp, c, work / "iscsi-host")
            try:
                assert (work / "iscsi-host").stat().st_mode & 0o777 == 0o700
                assert ((work / "iscsi-host" / "chap.secret").stat().st_mode & 0o777) == 0o600
                w = runners.HostRunner(lambda: False).run(catalogue.TESTS["seq-write-64k"], relay.uri, 4 * MIB, 1,
                                                          lambda _p: None)
                assert w.mbps > 0 and c.secret not in w.raw
                assert c.secret not in " ".join(Path(f"/proc/{relay.pid}/cmdline").read_text().split("\0"))
            finally:
                relay.stop()
            assert not (work / "iscsi-host").exists()
            with pytest.raises(CloudboxError, match=r"qemu-nbd exited 1 before serving the target .*"
                                                    r"(?i:authentication|login)"):  # a wrong secret is refused
                iscsi.host_relay(exp, iscsi.Chap(c.initiator, c.user, "0" * 32), work / "iscsi-bad")
            assert not (work / "iscsi-bad").exists()
        with pytest.raises(CloudboxError, match="attached by run run-iscsi-1"):
            attach.export_for_run("iscsi:ebs", "qemu", run_uuid="run-j", work_dir=state / "work" / "run-j",
                                  size_bytes=8 * MIB, conn=libvirt_conn)
    finally:
        ve.close()
    assert iscsi.running(vol.path) == [] and iscsi.secrets_named(libvirt_conn, usage) == []
    assert not (iscsi.SOCKET_DIR / f"socket.{control}").exists() and not work.exists()
    with VolumeStore() as vs:
        assert vs.get("ebs").attached_run is None
    ve.close()  # twice is harmless


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("tgtd"), reason="needs root and tgtd (make deps)")
def test_a_failure_while_exporting_leaves_nothing(state, libvirt_conn, monkeypatch):
    with VolumeStore() as vs:
        vol = vs.create("ebs", 16 * MIB)
    work = state / "work" / "run-f"

    def refuse(*a, **kw):
        raise CloudboxError("libvirt refused the secret")

    monkeypatch.setattr(iscsi, "define_secret", refuse)
    sockets = set(Path(iscsi.SOCKET_DIR).glob("socket.*"))
    with pytest.raises(CloudboxError, match="refused the secret"):
        attach.export_for_run("iscsi:ebs", "qemu", run_uuid="run-f", work_dir=work, size_bytes=8 * MIB,
                              conn=libvirt_conn)
    assert iscsi.running(vol.path) == [] and not work.exists()
    assert set(Path(iscsi.SOCKET_DIR).glob("socket.*")) <= sockets  # tgtd's socket went with it
    with VolumeStore() as vs:
        assert vs.get("ebs").attached_run is None


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="the system libvirtd's secrets need root")
def test_a_dead_runs_secret_is_reaped_and_anothers_is_left(libvirt_conn):
    dead, live = iscsi.secret_usage("deadbeef0001-run"), iscsi.secret_usage("feedface0002-run")
    made = [iscsi.define_secret(libvirt_conn, u, "x" * 32) for u in (dead, live)]
    try:
        # a store that does not know either run leaves both (another session's runs share this libvirtd)
        assert iscsi.reap_secrets(libvirt_conn, set(), {"0123"}) == []
        assert iscsi.reap_secrets(libvirt_conn, {"feedface0002-run"}, {"deadbeef0001-run", "feedface0002-run"}) \
            == [dead]
        assert iscsi.secrets_named(libvirt_conn, dead) == [] and iscsi.secrets_named(libvirt_conn, live) == [made[1]]
    finally:
        for u in made:
            iscsi.undefine_secret(libvirt_conn, u)


def _mutual_login(host: str, port: int, iqn: str, c: iscsi.Chap, target_secret: str) -> subprocess.CompletedProcess:
    """libiscsi logging in as `c` and checking the target's answer against `target_secret` (mutual CHAP)."""
    url = (f"iscsi://{c.user}%{c.secret}@{host}:{port}/{iqn}/{iscsi.LUN}"
           f"?target_user={c.target_user}&target_password={target_secret}")
    return subprocess.run(["iscsi-readcapacity16", "-i", c.initiator, url], capture_output=True, text=True,
                          timeout=30)


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="tgtd's management socket is under /var/run/tgtd (root)")
@pytest.mark.skipif(not (shutil.which("tgtd") and shutil.which("iscsi-readcapacity16")),
                    reason="needs tgtd (tgt) and iscsi-readcapacity16 (libiscsi-bin): make deps-test")
def test_a_target_that_cannot_prove_its_secret_hands_an_initiator_no_disk(state, tmp_path):
    """Mutual CHAP: the real target answers with its own secret; a host answering on its address (asking for no
    CHAP at all, as an impostor would) lets a one-way initiator in, and one that checks the target is refused."""
    vol = tmp_path / "vol"
    vol.write_bytes(b"\0" * (16 * MIB))
    c = iscsi.chap()
    assert c.mutual and c.target_secret != c.secret
    exp = iscsi.start("m", str(vol), c, log=tmp_path / "tgtd.log")
    try:
        ok = _mutual_login(exp.host, exp.port, exp.iqn, c, c.target_secret)
        assert ok.returncode == 0 and f"Total size:{16 * MIB}" in ok.stdout, ok.stdout + ok.stderr
        bad = _mutual_login(exp.host, exp.port, exp.iqn, c, "0" * 32)  # not the target we know
        assert bad.returncode != 0 and "CHAP_R" in bad.stderr, bad.stderr
    finally:
        exp.stop()
    # the impostor: the same target name on an address of its own, no account, any initiator let in
    port = procs.free_port("127.0.0.1")
    control = iscsi.control_port(port)
    child = procs.Child.start(["tgtd", "-f", "-C", str(control), "--iscsi", f"portal=127.0.0.1:{port}"],
                              log=tmp_path / "impostor.log", ready=lambda pid: procs.listens(pid, port),
                              serving="an impostor", ready_is=f"listen on {port}", timeout=30,
                              death_signal=signal.SIGKILL)
    try:
        iscsi.tgtadm(control, "--mode", "target", "--op", "new", "--tid", "1", "--targetname", exp.iqn)
        iscsi.tgtadm(control, "--mode", "logicalunit", "--op", "new", "--tid", "1", "--lun", "1", "--backing-store",
                     str(vol))
        iscsi.tgtadm(control, "--mode", "target", "--op", "bind", "--tid", "1", "--initiator-address", "ALL")
        assert _login(iscsi.IscsiExport("m", "", "127.0.0.1", port, exp.iqn, control), c.user, c.secret,
                      c.initiator).returncode == 0  # one-way CHAP: handed the impostor's disk
        refused = _mutual_login("127.0.0.1", port, exp.iqn, c, c.target_secret)
        assert refused.returncode != 0 and "CHAP_N" in refused.stderr, refused.stderr
    finally:
        with contextlib.suppress(CloudboxError):
            iscsi.tgtadm(control, "--mode", "system", "--op", "delete", lld=False)
        child.stop()
        for leftover in (f"socket.{control}", f"socket.{control}.lock"):
            (iscsi.SOCKET_DIR / leftover).unlink(missing_ok=True)
