"""Real quick storage runs on an NFS export under libvirt and QEMU (TCG here): nfs-ganesha serves a fresh directory of
the run's on the guest's bridge, the guest's NFSv4 client mounts it with the profile's [nfs] options and fio runs on
a file in it; the baseline runs on a file in the same directory from the host domain, without NFS."""

from __future__ import annotations

import os
import subprocess

import pytest
from real_runs import completed_run, interrupt_cli_run, work_files

from cloudbox.core.disks.volumes import attach, nfs
from cloudbox.core.record.rows import Run
from cloudbox.core.spec.addresses import BRIDGE, GUEST_IP, HOST_IP, PREFIX
from cloudbox.core.spec.runspec import RunSpec
from cloudbox.core.views import labels
from cloudbox.core.views.compare import compare_table
from cloudbox.core.views.render import to_text

pytestmark = [pytest.mark.slow, pytest.mark.root,
              pytest.mark.skipif(bool(nfs.server_problem()), reason="needs nfs-ganesha, nfs-ganesha-vfs (make deps)")]

SMOKE = ("seq-write-64k", "seq-read-64k", "randread-4k-qd32")


def _ganeshas() -> list[str]:
    r = subprocess.run(["pgrep", "-a", "-x", "ganesha.nfsd"], capture_output=True, text=True)
    return r.stdout.splitlines()


def _nfs_run(profile: str, state, guests: int = 1, tests: str = "smoke") -> Run:
    before = _ganeshas()
    run = completed_run(RunSpec(profile=profile, suite="storage", size="quick", storage_tests=tests, runtime=3,
                                guests=guests))
    assert _ganeshas() == before  # the run's server is gone
    assert not os.path.exists(f"/sys/class/net/{BRIDGE}")
    assert work_files(state) == []  # the export's directory with it
    return run


def test_quick_storage_run_on_an_nfs_export_mounted_by_the_guest(state, libvirt_conn):
    """nfs-async-tcp: the guest has no disk, mounts the export NFSv4.2 over TCP through its NIC, and its writes
    went through ganesha to the server's disk; the baseline is the export's directory without NFS."""
    run = _nfs_run("nfs-async-tcp", state)
    prov = run.provenance
    v = prov.volume
    assert v is not None and (v.scheme, v.attach, v.name) == ("nfs", "guest", "share")
    assert prov.domain_xml and "<disk" not in prov.domain_xml
    assert v.uri.startswith("nfs://169.254.") and v.server.startswith("nfs-ganesha")
    assert "guests' addresses only" in v.tls
    # the mount as the guest's kernel settled it
    assert " /mnt/nfs nfs4 " in v.mount and "vers=4.2" in v.mount and "proto=tcp" in v.mount, v.mount
    assert f"port={v.uri.rsplit(':', 1)[1].split('/')[0]}" in v.mount and "hard" in v.mount, v.mount
    assert (v.server_bytes_written or 0) >= 16 * 1024 * 1024, v  # the guest's writes reached the server's disk
    for side in ("guest", "baseline"):
        for test in SMOKE:
            m = run.measurement(side, test, "MB/s")
            assert m is not None and m.value > 0, (side, test)
            assert ("nfs-export-dir" in m.labels) == (side == "baseline"), m.labels
    assert "without NFS" in v.baseline
    assert labels.target_label(run) == "NFS"
    assert labels.driver_label(run) == "virtio-net NIC, the guest's NFSv4.2 client (async)"
    table = compare_table([run])
    drivers = {r.kind: r.cells["driver"] for sec in table.sections for r in sec.rows}
    assert drivers == {"baseline": "the export's directory, no NFS",
                       "guest": "virtio-net NIC, the guest's NFSv4.2 client (async)"}, drivers
    assert "NFS" in to_text(table)


@pytest.mark.full
def test_sync_writes_with_1_mib_transfers_and_jumbo_frames_reach_the_mount(state, libvirt_conn):
    """nfs-sync-tcp and nfs-async-tcp-9000: the options the kernel settled on are the profile's (sync, one
    connection, study C's 1 MiB reads and writes; MTU 9000 on the guest's NIC for the export's traffic)."""
    sync = _nfs_run("nfs-sync-tcp", state).provenance.volume
    assert sync is not None and ",sync," in f",{sync.mount.split()[3]}," and "nconnect=1" in sync.mount, sync.mount
    assert "rsize=1048576,wsize=1048576" in sync.mount, sync.mount
    jumbo = _nfs_run("nfs-async-tcp-9000", state)
    v = jumbo.provenance.volume
    assert v is not None and ",sync," not in f",{v.mount.split()[3]},", v.mount
    assert labels.nic_label(jumbo) == "virtio-net, MTU 9000"


@pytest.mark.full
def test_two_guests_share_the_export_each_writing_its_own_file(state, libvirt_conn):
    """--guests 2 on nfs-async-tcp: one ganesha, both guests mount its export and write at once through the
    barrier, their sum stored beside two bare-metal processes on two files in the export's directory."""
    run = _nfs_run("nfs-async-tcp", state, guests=2, tests="seq-write-64k")
    v, info = run.provenance.volume, run.provenance.guests
    assert v is not None and info is not None and [g.disk for g in info.guests] == [v.uri, v.uri]
    assert (v.server_bytes_written or 0) >= 2 * 16 * 1024 * 1024, v  # both guests' files reached the server
    for side in ("guest", "baseline"):
        each = run.instances(side, "seq-write-64k", "MB/s")
        assert [m.instance for m in each] == [1, 2] and all(m.value > 0 for m in each), side
        total = run.measurement(side, "seq-write-64k", "MB/s")
        assert total is not None and total.value == pytest.approx(sum(m.value for m in each), rel=1e-9)
        assert ("nfs-export-dir" in total.labels) == (side == "baseline")


@pytest.mark.full
def test_ctrl_c_while_the_guest_writes_to_the_export_leaves_nothing(state, libvirt_conn):
    """SIGINT while the guest's fio writes over NFS: aborted, and the guest, ganesha, the bridge and the export's
    directory are gone."""
    from cloudbox.core.virt.guest import list_guests

    before = _ganeshas()

    def served() -> None:
        assert len(_ganeshas()) > len(before)

    got = interrupt_cli_run(["--profile", "nfs-async-tcp", "--suite", "storage", "--size", "64M", "--tests",
                             "standard", "--runtime", "30"], while_running=served)
    assert got.returncode == 1, got.output
    assert got.run.state == "aborted" and "SIGINT" in (got.run.reason or ""), got.run.reason
    assert [g.name for g in list_guests(libvirt_conn) if "nfs-async-tcp" in g.name] == []
    assert _ganeshas() == before
    assert not os.path.exists(f"/sys/class/net/{BRIDGE}")
    assert work_files(state) == []


@pytest.mark.full
@pytest.mark.parametrize("guests", [1, 2])
def test_a_back_ends_run_mounts_the_front_ends_export_and_leaves_its_server_alone(state, libvirt_conn, tmp_path,
                                                                                  guests):
    """The back-end's side of `--node` with an NFS profile, on one host: a server the run did not start (here the
    test's ganesha, on every address, as the front-end's is on its private one) is mounted by the guest (or each of
    two) from nfs_host:nfs_port; the run starts no server, stops none, and its baseline is this host's own mount of
    the same export, or none, saying why, on a kernel without an NFS client (this one)."""
    export_dir = tmp_path / "export"
    export_dir.mkdir()
    tmp_path.chmod(0o755)
    exp = nfs.start("share", str(export_dir), iface="", host="0.0.0.0", work_dir=tmp_path / "ganesha",
                    clients=f"{GUEST_IP}/{PREFIX}")
    try:
        before = _ganeshas()
        run = completed_run(RunSpec(profile="nfs-async-tcp", suite="storage", size="quick",
                                    storage_tests="seq-write-64k", runtime=3, nfs_host=HOST_IP, nfs_port=exp.port,
                                    guests=guests))
        assert _ganeshas() == before and exp.child is not None and exp.child.proc.poll() is None
        v = run.provenance.volume
        assert v is not None and v.uri == f"nfs://{HOST_IP}:{exp.port}/cloudbox/share", v
        assert v.server.startswith(f"nfs-ganesha on the front-end {HOST_IP}") and f"addr={HOST_IP}" in v.mount
        assert exp.io()["write_bytes"] >= guests * 16 * 1024 * 1024  # the guests' writes reached the test's server
        assert run.measurement("guest", "seq-write-64k", "MB/s").value > 0
        problem = nfs.host_client_problem(attach.kernel_module_available)
        base = run.measurement("baseline", "seq-write-64k", "MB/s")
        if problem:
            assert base is None and v.baseline.startswith("no baseline: this host's kernel"), v.baseline
        else:
            assert base is not None and "volume-from-host" in base.labels and " nfs4 " in v.host_mount
        assert work_files(state) == [] and os.listdir(export_dir) == []  # its files, mount and directory gone
    finally:
        exp.stop()
