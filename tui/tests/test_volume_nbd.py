"""A volume exported over NBD with TLS for one run, without a guest: the export serves this box's certified client
(fio's nbd engine) and refuses a client without TLS; it goes away with the run, after a failure too, and with its
process when that is killed outright; host attach is refused here with the reason and where it works."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cloudbox.core.disks.volumes import attach, nbd, pki
from cloudbox.core.disks.volumes.store import VolumeStore
from cloudbox.core.errors import CloudboxError

MIB = 1024 * 1024

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="exports write the client credentials under /etc/pki (root)"),
    pytest.mark.skipif(not (shutil.which("qemu-nbd") and shutil.which("openssl") and shutil.which("fio")),
                       reason="needs qemu-nbd (qemu-utils), openssl and fio"),
]


def _qemu_nbd_pids(path: str) -> list[int]:
    out = subprocess.run(["pgrep", "-f", f"qemu-nbd .*{path}"], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _listening(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
        return True
    return False


def _fio(uri: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["fio", "--name=t", "--ioengine=nbd", f"--uri={uri}", "--rw=write", "--bs=64k",
                           "--size=4M", "--output-format=json"], capture_output=True, text=True, timeout=120)


@pytest.fixture
def volume(state):
    with VolumeStore() as vs:
        v = vs.create("ebs", 16 * MIB)
    return v


def _nothing_left(v, exp: nbd.NbdExport, work: Path) -> None:
    assert _qemu_nbd_pids(v.path) == []
    assert not _listening(exp.host, exp.port)
    assert not work.exists()
    with VolumeStore() as vs:
        assert vs.get("ebs").attached_run is None


def test_export_serves_the_certified_client_and_goes_away(volume, state):
    work = state / "work" / "run-a"
    ve = attach.export_for_run("nbd:ebs", "qemu", run_uuid="run-a", work_dir=work, size_bytes=8 * MIB)
    try:
        assert ve.store.baseline_target == ve.export.uri and ve.export.uri.startswith("nbds://127.0.0.1:")
        assert ve.store.network is not None and ve.store.network.tls
        with VolumeStore() as vs:
            assert vs.get("ebs").attached_run == "run-a"
        r = _fio(ve.export.uri)
        assert r.returncode == 0, r.stdout + r.stderr
        job = json.loads(r.stdout[r.stdout.index("{"):])["jobs"][0]
        assert job["write"]["io_bytes"] == 4 * MIB
        plain = _fio(ve.export.uri.replace("nbds://", "nbd://"))  # no TLS: the server refuses
        assert "requires TLS" in plain.stdout + plain.stderr
        key = pki.pki_dir() / "client" / "client-key.pem"
        assert key.stat().st_mode & 0o077 == 0
        with pytest.raises(CloudboxError, match="attached by run run-a"):
            attach.export_for_run("nbd:ebs", "qemu", run_uuid="run-b", work_dir=state / "work" / "run-b",
                                  size_bytes=8 * MIB)
    finally:
        ve.close()
    _nothing_left(volume, ve.export, work)
    ve.close()  # twice is harmless


def test_a_failure_after_the_export_leaves_nothing(volume, state):
    work = state / "work" / "run-a"
    with pytest.raises(RuntimeError), contextlib.ExitStack() as stack:
        ve = attach.export_for_run("nbd:ebs", "qemu", run_uuid="run-a", work_dir=work, size_bytes=8 * MIB)
        stack.callback(ve.close)
        assert _qemu_nbd_pids(volume.path)
        raise RuntimeError("the guest failed to boot")
    _nothing_left(volume, ve.export, work)


def test_a_failure_while_exporting_leaves_nothing(volume, state, monkeypatch):
    work = state / "work" / "run-a"
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    monkeypatch.setattr(nbd, "free_port", lambda host="": port)
    try:
        with pytest.raises(CloudboxError, match="qemu-nbd exited"):
            attach.export_for_run("nbd:ebs", "qemu", run_uuid="run-a", work_dir=work, size_bytes=8 * MIB)
    finally:
        taken.close()
    assert _qemu_nbd_pids(volume.path) == [] and not work.exists()
    with VolumeStore() as vs:
        assert vs.get("ebs").attached_run is None


def test_the_export_dies_with_a_killed_run(volume, state):
    code = ("import sys, time; from pathlib import Path; from cloudbox.core.disks.volumes import attach; "
            "ve = attach.export_for_run('nbd:ebs', 'qemu', run_uuid='run-k', work_dir=Path(sys.argv[1]), "
            "size_bytes=8 << 20); print(ve.export.pid, flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(state / "work" / "run-k")], stdout=subprocess.PIPE,
                            text=True)
    try:
        pid = int(proc.stdout.readline())
        assert _qemu_nbd_pids(volume.path) == [pid]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 10
    while _qemu_nbd_pids(volume.path) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _qemu_nbd_pids(volume.path) == []
    with VolumeStore() as vs:  # its process is gone: the volume is free again
        assert vs.get("ebs").attached_run is None


def test_host_attach_is_refused_with_why_and_where(volume, state):
    with pytest.raises(attach.AttachRefused) as e:
        attach.check_attach("nbd", "host", has_module=lambda m: False)
    msg = str(e.value)
    assert "host (nbd): this kernel has no nbd" in msg and "its nbd driver, which this kernel" in msg
    assert "disk.attach = qemu (nbd:, iscsi: volumes" in msg
    assert "disk.attach = guest (aoe:, nbd:, iscsi:, nvme-tcp:, nfs: volumes" in msg
    # a kernel with the driver but no initiator program: named with its package
    with pytest.raises(attach.AttachRefused, match=r"iscsiadm is not installed \(Debian package open-iscsi\)"):
        attach.check_attach("iscsi", "host", has_module=lambda m: True,
                            tool_problem=lambda s: "iscsiadm is not installed (Debian package open-iscsi): run x")
    with pytest.raises(attach.AttachRefused, match="a nfs: volume is a file system"):
        attach.check_attach("nfs", "host", has_module=lambda m: True)
    if not attach.kernel_module_available("nbd"):
        with pytest.raises(attach.AttachRefused, match="this kernel has no nbd"):  # before anything is made
            attach.export_for_run("nbd:ebs", "host", run_uuid="run-h", work_dir=state / "work" / "run-h",
                                  size_bytes=8 * MIB)
        assert not (state / "work").exists()


@pytest.mark.parametrize(("spec", "size", "match"), [
    ("nbd:nope", 8 * MIB, "no volume 'nope'"),
    ("nbd:ebs", 32 * MIB, "less than the test size"),
    ("nbd:Bad", 8 * MIB, "volume name 'Bad' is not allowed"),
])
def test_preflight(volume, spec, size, match):
    with pytest.raises(CloudboxError, match=match):
        attach.preflight(spec, "qemu", size)


def test_foreign_credentials_are_never_overwritten(state, tmp_path):
    creds = pki.ensure()
    theirs = tmp_path / "pki"
    theirs.mkdir()
    (theirs / "ca-cert.pem").write_text("someone else's CA\n")
    with pytest.raises(CloudboxError, match="did not make"):
        pki.install_client(creds, theirs)
    assert (theirs / "ca-cert.pem").read_text() == "someone else's CA\n"
    ours = tmp_path / "ours"
    pki.install_client(creds, ours)
    assert (ours / "client-key.pem").stat().st_mode & 0o777 == 0o640
    assert (ours / pki.MARKER).read_text().strip() == creds.fingerprint


def test_the_server_certificate_names_the_bridge_and_an_older_one_is_issued_again(state, monkeypatch):
    creds = pki.ensure()
    cert = creds.server_dir / "server-cert.pem"
    assert pki.server_names(cert) == {"IP:127.0.0.1", "DNS:localhost", "IP:169.254.100.1"}
    names = pki.SERVER_NAMES
    monkeypatch.setattr(pki, "SERVER_NAMES", ("IP:127.0.0.1", "DNS:localhost"))  # as a box made them before
    (creds.server_dir / "server-cert.pem").unlink()
    assert pki.ensure().fingerprint != creds.fingerprint  # an incomplete set is made again whole, a new CA
    narrow = pki.ensure()
    assert pki.server_names(cert) == {"IP:127.0.0.1", "DNS:localhost"}
    client = (narrow.client_dir / "client-cert.pem").read_bytes()
    monkeypatch.setattr(pki, "SERVER_NAMES", names)
    again = pki.ensure()
    assert pki.server_names(cert) == {"IP:127.0.0.1", "DNS:localhost", "IP:169.254.100.1"}
    assert again.fingerprint == narrow.fingerprint, "the CA is kept, so installed client credentials stay valid"
    assert (again.client_dir / "client-cert.pem").read_bytes() == client
    for name in ("server-cert.pem", "client/client-cert.pem"):
        path = again.server_dir / name if name == "server-cert.pem" else again.base / name
        r = subprocess.run(["openssl", "verify", "-CAfile", str(again.base / "ca-cert.pem"), str(path)],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    assert not list(again.base.glob(".server-*")), "no temporary directory is left"


@pytest.mark.skipif(attach.kernel_module_available("aoe"), reason="this kernel has aoe: host attach can run here")
def test_a_host_attach_run_is_refused_before_anything_is_made(state):
    """kvm-ebs-aoe attaches on the host: on a kernel without aoe refused before the run is recorded, with the
    reason, nothing made."""
    from cloudbox.core.disks.volumes.attach import kernel_module_available
    from cloudbox.core.record.results import ResultStore
    from cloudbox.core.run import preflight, runs
    from cloudbox.core.spec.runspec import RunSpec

    if kernel_module_available("aoe"):
        pytest.skip("this kernel has aoe: the host attach would run")
    with ResultStore() as store:
        with pytest.raises(preflight.Refused, match="disk.attach = host"):
            runs.executor(RunSpec(profile="kvm-ebs-aoe", suite="storage", size="32M"), store).execute()
        assert store.list_runs() == []
    assert not (state / "state" / "work").exists() or not any((state / "state" / "work").iterdir())


# -- one node's export: its own certificate and no other ---------------------------------------------------------
def _client_in(exp: nbd.NbdExport, client_dir: Path) -> tuple[bool, str]:
    """A TLS client (qemu-img) with the certificate in `client_dir` opening the export: (let in, what it said)."""
    r = subprocess.run(["qemu-img", "info", "--object", f"tls-creds-x509,id=c0,dir={client_dir},endpoint=client",
                        "--image-opts", f"driver=nbd,host={exp.host},port={exp.port},export={exp.name},tls-creds=c0"],
                       capture_output=True, text=True, timeout=60)
    return r.returncode == 0, (r.stdout + r.stderr).strip()


@pytest.mark.skipif(shutil.which("qemu-img") is None, reason="needs qemu-img (qemu-utils)")
def test_a_nodes_export_lets_in_that_nodes_certificate_and_no_other_of_the_ca(volume, state, tmp_path):
    from cloudbox.core.disks.volumes import nodecreds

    ca = pki.ensure()
    be1, be2 = nodecreds.make("be1", ca), nodecreds.make("be2", ca)
    old = tmp_path / "be1-before"  # what a removed (or reinstalled) be1 still holds
    shutil.copytree(be1.nbd_dir, old)

    def serve(creds: nodecreds.NodeCreds, run: str):
        return attach.export_for_node("nbd:ebs", "host", node="be1", creds=creds, run_uuid=run,
                                      work_dir=state / "work" / run, size_bytes=8 * MIB, address="127.0.0.1",
                                      link="lo")

    ve = serve(be1, "run-n1")
    try:
        assert isinstance(ve.export, nbd.NbdExport) and "and no other" in ve.tls
        ok, said = _client_in(ve.export, be1.nbd_dir)
        assert ok, said
        for intruder in (be2.nbd_dir, ca.client_dir):  # another back-end; this box's own (handed to its guests)
            ok, said = _client_in(ve.export, intruder)
            assert not ok and "abort" in said.lower(), said
        assert "authz check for O=cloudbox,CN=cloudbox NBD client be2-" in (state / "work" / "run-n1" /
                                                                            "qemu-nbd.log").read_text()
    finally:
        ve.close()
    nodecreds.forget("be1")  # `node remove be1`, or be1 enrolled again with a new host key
    new = nodecreds.make("be1", ca)
    assert pki.identity(new.nbd_dir / "client-cert.pem") != pki.identity(old / "client-cert.pem")
    ve = serve(new, "run-n2")
    try:
        assert _client_in(ve.export, new.nbd_dir)[0]
        ok, said = _client_in(ve.export, old)  # the old machine's certificate: still signed by the CA, refused
        assert not ok, said
    finally:
        ve.close()


def test_the_box_serves_its_own_certificate_only(volume, state, tmp_path):
    from cloudbox.core.disks.volumes import nodecreds

    ve = attach.export_for_run("nbd:ebs", "qemu", run_uuid="run-a", work_dir=state / "work" / "run-a",
                               size_bytes=8 * MIB)
    try:
        assert _fio(ve.export.uri).returncode == 0  # this box's initiators (libnbd's certificate in /etc/pki)
        if shutil.which("qemu-img"):
            node = nodecreds.make("be1", pki.ensure())  # a node's certificate of the same CA, as its guest holds
            ok, said = _client_in(ve.export, node.nbd_dir)
            assert not ok, said
    finally:
        ve.close()
