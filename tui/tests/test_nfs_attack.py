"""A client of a run's NFS export replaces the bare-metal tests' file with a symbolic link to a file outside the
export, or with a device node, during a real NFS run (real libvirtd, QEMU, nfs-ganesha, fio): the host's root fio
must not write there. The test plays that client on the export's directory: just before the host makes its file,
or just before fio opens it. The run stops with the reason; the target's bytes are unchanged."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest
from real_runs import work_files

from cloudbox.core.bench import runners
from cloudbox.core.disks.volumes import nfs
from cloudbox.core.record.results import ResultStore
from cloudbox.core.run import local, runs
from cloudbox.core.spec.runspec import RunSpec

pytestmark = [pytest.mark.slow, pytest.mark.root,
              pytest.mark.skipif(bool(nfs.server_problem()), reason="needs nfs-ganesha, nfs-ganesha-vfs (make deps)")]

PRECIOUS = b"root's keys: this file is outside the export\n" * 64


def _baseline_name(state: Path) -> Path:
    found = list((state / "state" / "work").glob("run-*/export"))
    assert len(found) == 1, found
    return found[0] / "baseline.dat"


def _run() -> tuple[str, str]:
    spec = RunSpec(profile="nfs-async-tcp", suite="storage", size="16M", storage_tests="seq-write-64k", runtime=3)
    with ResultStore() as store:
        rid = runs.executor(spec, store).execute()
        run = store.get_run(rid)
    return run.state, run.reason or ""


@pytest.fixture
def victim(tmp_path) -> Path:
    p = tmp_path / "authorized_keys"
    p.write_bytes(PRECIOUS)
    return p


def test_a_link_planted_before_the_host_makes_its_file_is_refused(state, libvirt_conn, victim, monkeypatch):
    real = local.mount_export_on_host

    def then_plant(ctx):
        real(ctx)
        os.symlink(victim, _baseline_name(state))

    monkeypatch.setattr(local, "mount_export_on_host", then_plant)
    st, reason = _run()
    assert st != "completed", reason
    assert "already holds a symbolic link" in reason and str(victim) in reason, reason
    assert victim.read_bytes() == PRECIOUS
    assert work_files(state) == []


def test_a_device_node_planted_before_the_host_makes_its_file_is_refused(state, libvirt_conn, tmp_path,
                                                                          monkeypatch):
    disk = tmp_path / "disk.raw"
    disk.write_bytes(PRECIOUS * 16)
    loop = subprocess.run(["losetup", "--find", "--show", str(disk)], capture_output=True, text=True,
                          check=True).stdout.strip()
    try:
        real = local.mount_export_on_host

        def then_plant(ctx):
            real(ctx)
            os.mknod(_baseline_name(state), 0o600 | stat.S_IFBLK, os.stat(loop).st_rdev)

        monkeypatch.setattr(local, "mount_export_on_host", then_plant)
        st, reason = _run()
    finally:
        subprocess.run(["losetup", "-d", loop], check=False)
    assert st != "completed", reason
    assert "already holds a block device" in reason, reason
    assert disk.read_bytes() == PRECIOUS * 16
    assert work_files(state) == []


def test_a_link_swapped_in_just_before_fio_opens_the_file_is_not_written_through(state, libvirt_conn, victim,
                                                                                  monkeypatch):
    real = runners.HostRunner.run

    def swap_then_run(self, t, target, *args, **kw):
        name = _baseline_name(state)
        os.symlink(victim, name.with_suffix(".swap"))
        os.replace(name.with_suffix(".swap"), name)  # rename(2) over the file, as a client's RENAME does
        return real(self, t, target, *args, **kw)

    monkeypatch.setattr(runners.HostRunner, "run", swap_then_run)
    st, reason = _run()
    assert st != "completed", reason
    assert "now holds a symbolic link" in reason and str(victim) in reason, reason
    assert victim.read_bytes() == PRECIOUS
    assert work_files(state) == []


def test_the_export_admits_the_runs_guests_only(state, libvirt_conn, monkeypatch):
    """Another address on the run's bridge (here the host's own, 169.254.100.1) is refused by ganesha; before, the
    whole subnet was admitted."""
    seen = {}

    def look_then_stop(ctx):
        exp = ctx.volume.export
        url = f"nfs://{exp.host}{exp.pseudo}/?version=4&nfsport={exp.port}"
        Path(ctx.volume.path, "seen-by-the-guests-only").write_text("x")
        r = subprocess.run(["nfs-ls", url], capture_output=True, text=True, timeout=60)
        seen.update(rc=r.returncode, out=(r.stdout + r.stderr).strip())
        raise local.CloudboxError("the test stops here")

    monkeypatch.setattr(local, "launch_guest", look_then_stop)
    st, reason = _run()
    assert "the test stops here" in reason
    assert seen["rc"] != 0 and "seen-by-the-guests-only" not in seen["out"], seen
    assert work_files(state) == []
