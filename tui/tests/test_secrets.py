"""A volume's secrets never reach a command line, a run's reason, its events or an export: each way a CHAP secret
or an NVMe credential travels (tgtd's account, open-iscsi's node record, the guest's iscsistart, the guest's NVMe
connect) is timed out or made to fail inside a run, and the results store's file, the run's events and `cloudbox
results export` are searched for it; results.db is root's alone (0600) from its first byte."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import time

import pytest

from cloudbox.core import procs
from cloudbox.core.disks.volumes import hostattach, iscsi, nvmet
from cloudbox.core.errors import CloudboxError, GuestTimeout, keep_secret, masked
from cloudbox.core.record.results import ResultStore
from cloudbox.core.run.context import RunContext
from cloudbox.core.run.lifecycle import Execution
from cloudbox.core.spec.runspec import RunSpec

SPEC = RunSpec(profile="virtio-disk", suite="storage", storage_tests="smoke")
SECRET = "5ec2e7" * 6  # 36 characters no ordinary text holds
TARGET_SECRET = "7a26e7" * 6
CHAP = iscsi.Chap("iqn.2026-11.org.cloudbox:node-t", "cloudbox-t", SECRET, "cloudbox-target-t", TARGET_SECRET)


def _run_failing(body) -> tuple[int, str]:
    """A run whose body fails as `body` does; (its id, the exception's own text)."""
    said: list[str] = []

    def wrapped(ctx: RunContext) -> None:
        try:
            body(ctx)
        except CloudboxError as e:
            said.append(str(e))
            raise
    with ResultStore() as store:
        rid = Execution(SPEC, store, wrapped).execute()
    assert said, "the body did not fail"
    return rid, said[0]


def _nothing_kept(rid: int, cli_run, *secrets: str) -> str:
    """The run's reason, after checking that neither the store's files, its events nor the export hold `secrets`."""
    with ResultStore() as store:
        run = store.get_run(rid)
        texts = [str(e.record) for e in store.events_since(rid)]
        path = store.path
    for f in (path, path.with_name(path.name + "-wal")):
        if f.exists():
            data = f.read_bytes()
            assert not any(s.encode() in data for s in secrets), f
    exported = cli_run(["results", "export", str(rid), "--format", "json", "--raw"])
    assert exported.code == 0, exported.printed
    for text in (run.reason or "", *texts, exported.out):
        assert not any(s in text for s in secrets), text
    assert run.state == "aborted"
    return run.reason or ""


def test_results_db_is_roots_alone_from_its_first_byte(state):
    with ResultStore() as store:
        store.create_run(profile_name="x")
        path = store.path
    for f in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        if f.exists():
            assert stat.S_IMODE(f.stat().st_mode) == 0o600, f


def test_a_secret_this_process_holds_is_masked_in_every_stored_text(state, cli_run):
    keep_secret(SECRET)
    assert masked(f"x {SECRET} y") == "x ******** y" and masked("short") == "short"

    def body(ctx: RunContext) -> None:
        ctx.sink.log(f"a tool printed {SECRET}")
        ctx.sink.step(f"step {SECRET}")
        raise CloudboxError(f"a tool failed saying {SECRET}")
    rid, _ = _run_failing(body)
    assert _nothing_kept(rid, cli_run, SECRET).endswith("a tool failed saying ********")


# -- tgtd: the account is made over its socket, never by tgtadm's argument ----------------------------------------
@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("tgtd") is None, reason="needs root and tgtd (make deps)")
def test_tgtd_gets_the_secrets_through_its_socket_and_a_silent_tgtd_times_out_without_them(state, tmp_path,
                                                                                          monkeypatch, cli_run):
    vol = tmp_path / "vol"
    vol.write_bytes(b"\0" * (4 << 20))
    argvs: list[list[str]] = []
    real_run = subprocess.run

    def recording(cmd, *a, **kw):
        argvs.append([str(c) for c in cmd])
        return real_run(cmd, *a, **kw)
    monkeypatch.setattr(iscsi.subprocess, "run", recording)
    monkeypatch.setattr(procs.subprocess, "Popen", _recording_popen(argvs))
    exp = iscsi.start("s", str(vol), CHAP, log=tmp_path / "tgtd.log")
    try:
        shown = subprocess.run(["tgtadm", "-C", str(exp.control_port), "--lld", "iscsi", "--mode", "account",
                                "--op", "show"], capture_output=True, text=True).stdout
        assert CHAP.user in shown and CHAP.target_user in shown  # made, the target's own too
        assert argvs and not any(SECRET in a or TARGET_SECRET in a for argv in argvs for a in argv), argvs
        assert exp.pid is not None
        os.kill(exp.pid, signal.SIGSTOP)  # tgtd stops answering its management socket
        try:
            rid, said = _run_failing(lambda ctx: iscsi.new_account(exp.control_port, "late", SECRET, timeout=1))
        finally:
            os.kill(exp.pid, signal.SIGCONT)
    finally:
        exp.stop()
    assert "did not answer" in said and SECRET not in said
    assert "did not answer making CHAP account late" in _nothing_kept(rid, cli_run, SECRET)


def _recording_popen(argvs: list[list[str]]):
    real = subprocess.Popen

    class Popen(real):  # type: ignore[misc, valid-type]
        def __init__(self, cmd, *a, **kw):
            argvs.append([str(c) for c in cmd])
            super().__init__(cmd, *a, **kw)
    return Popen


# -- open-iscsi on the host: iscsiadm that hangs, and one that repeats its arguments --------------------------------
@pytest.mark.parametrize("behaviour", ["hangs", "repeats"])
def test_iscsiadm_that_hangs_or_repeats_its_arguments_leaves_no_secret(state, tmp_path, monkeypatch, cli_run,
                                                                     behaviour):
    fake = tmp_path / "bin" / "iscsiadm"
    fake.parent.mkdir()
    act = "sleep 30" if behaviour == "hangs" else 'echo "iscsiadm: cannot set $*" >&2; exit 1'
    fake.write_text(f"#!/bin/sh\ncase \"$*\" in *password*) {act};; esac\nexit 0\n")  # fails at the secret
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    monkeypatch.setattr(hostattach, "_modprobe", lambda *a, **kw: None)
    monkeypatch.setattr(hostattach, "_iscsid", lambda: None)
    monkeypatch.setattr(hostattach, "ATTACH_TIMEOUT", 1.0)
    t0 = time.monotonic()
    rid, said = _run_failing(lambda ctx: hostattach.attach_iscsi("10.73.0.1", 3260, "iqn.x:vol.v", CHAP))
    assert time.monotonic() - t0 < 20
    assert SECRET not in said and TARGET_SECRET not in said
    reason = _nothing_kept(rid, cli_run, SECRET, TARGET_SECRET)
    assert ("did not answer" if behaviour == "hangs" else "********") in reason


# -- in the guest: iscsistart's login and the NVMe connect, timed out --------------------------------------------
class FakeGuest:
    """A guest whose agent writes files and whose long commands time out the way Guest.run reports them."""

    name = "cloudbox-t"

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.scripts: list[str] = []

    def run(self, argv: list[str], *, timeout: float = 120, check: bool = False, **kw):
        self.scripts.append(" ".join(argv))
        if "iscsistart -i" in argv[-1] or "nvme-fabrics" in argv[-1]:
            raise GuestTimeout(f"in guest: {' '.join(argv)} did not finish within {timeout:.0f} s (killed)")
        return _Done(argv)

    def sh(self, script: str, **kw):
        return self.run(["/bin/sh", "-c", script], **kw)

    def has(self, program: str) -> bool:
        return True

    def put_file(self, path: str, data: bytes, mode: int) -> None:
        self.files[path] = data


class _Done:
    def __init__(self, argv: list[str]) -> None:
        self.argv, self.exitcode, self.stdout, self.stderr = argv, 0, "", ""


def test_the_guests_iscsi_login_times_out_without_its_secrets(state, cli_run):
    guest = FakeGuest()
    exp = iscsi.IscsiExport("v", "", "169.254.100.1", 3260, iscsi.target_iqn("v"), 1)
    rid, said = _run_failing(lambda ctx: iscsi.attach_in_guest(guest, exp, CHAP))
    assert isinstance(said, str) and "did not finish" in said and SECRET not in said
    assert guest.files == {f"{iscsi.GUEST_CHAP}/secret": SECRET.encode(),
                           f"{iscsi.GUEST_CHAP}/target": TARGET_SECRET.encode()}  # by the agent's file write
    assert not any(SECRET in s or TARGET_SECRET in s for s in guest.scripts)
    assert f"rm -rf {iscsi.GUEST_CHAP}" in guest.scripts  # gone after the login, whatever it did
    assert "-U cloudbox-target-t" in said  # mutual CHAP: the guest checks the target
    _nothing_kept(rid, cli_run, SECRET, TARGET_SECRET)


def test_the_guests_nvme_connect_times_out_without_its_host_nqn(state, cli_run):
    guest = FakeGuest()
    nqn = "nqn.2026-11.org.cloudbox:host.run-3f9a2c-77aa"  # the guest's only credential
    exp = nvmet.NvmetExport("v", "", "169.254.100.1", 4420, nvmet.subsystem_nqn("v"), 1, (nqn,))
    rid, said = _run_failing(lambda ctx: nvmet.attach_in_guest(guest, exp, nqn, "hostid-1"))
    assert "did not finish" in said and nqn not in said and nqn not in repr(exp)
    assert nqn.encode() in guest.files[f"{nvmet.GUEST_CONNECT}/options"]
    assert not any(nqn in s for s in guest.scripts)
    _nothing_kept(rid, cli_run, nqn)


def test_a_killed_runs_iscsi_node_record_goes_at_the_next_reaping(tmp_path, monkeypatch):
    """A run killed outright leaves open-iscsi's node record of its target, the CHAP secrets in it; the next run's
    reaping deletes the records of cloudbox's targets and no other."""
    calls = tmp_path / "calls"
    fake = tmp_path / "bin" / "iscsiadm"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\necho \"$*\" >> {calls}\n"
                    "[ \"$*\" = '-m node' ] && printf '%s\\n' '10.73.0.1:3260,1 iqn.2026-11.org.cloudbox:vol.ebs' "
                    "'192.0.2.9:3260,1 iqn.2004-04.com.example:theirs'\nexit 0\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    monkeypatch.setattr(hostattach, "ISCSI_SESSIONS", tmp_path / "no-sessions")
    monkeypatch.setattr(hostattach, "NVME_CTRLS", tmp_path / "no-ctrls")
    gone = hostattach.reap()
    assert gone == ["iSCSI node record iqn.2026-11.org.cloudbox:vol.ebs (10.73.0.1:3260) and its CHAP secrets"]
    deleted = [c for c in calls.read_text().splitlines() if "-o delete" in c]
    assert deleted == ["-m node -T iqn.2026-11.org.cloudbox:vol.ebs -p 10.73.0.1:3260 -o delete"]
