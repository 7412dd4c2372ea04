"""NFS exports (disk.volume = nfs:<name>): the [nfs] table's validation, the server's configuration and the guest's
mount options, the tables' words, and nfs-ganesha itself serving a directory on loopback, read by libnfs's nfs-ls
(user space: this kernel has no NFS client). The guest's run is in test_nfs_real.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import types
from pathlib import Path

import pytest

from cloudbox.core.disks.volumes import attach, nfs, transports
from cloudbox.core.errors import CloudboxError, ProfileError, UsageError
from cloudbox.core.record.provenance import BackingInfo, Provenance
from cloudbox.core.record.results import ResultStore
from cloudbox.core.record.rows import Run
from cloudbox.core.run import runs
from cloudbox.core.spec import knobs, profiles
from cloudbox.core.spec.profiles import resolve_profile
from cloudbox.core.spec.runspec import MIB, RunSpec
from cloudbox.core.views import labels


def _profile(nfs_table: str = "", **disk: str) -> str:
    d = {"bus": '"virtio-blk"', "cache": '"none"', "backing": '"network-volume"', "volume": '"nfs:share"',
         "attach": '"guest"', **{k: f'"{v}"' for k, v in disk.items()}}
    return ('name = "t"\ndescription = "t"\n[guest]\nhypervisor = "kvm"\n[disk]\n'
            + "".join(f"{k} = {v}\n" for k, v in d.items())
            + '[network]\nmodel = "virtio"\n' + (f"[nfs]\n{nfs_table}" if nfs_table else ""))


def _problems(text: str) -> dict[str, profiles.ProfileProblem]:
    with pytest.raises(ProfileError) as e:
        profiles.parse_profile(text, "t.toml")
    return {p.key: p for p in e.value.problems}


def test_the_preset_mounts_nfsv4_2_async_over_tcp_and_says_so():
    p = profiles.find_profile("nfs-async-tcp")
    assert knobs.is_nfs(p.disk) and p.nfs == knobs.Nfs(rsize_kib=1024, wsize_kib=1024)  # study C's 1 MB over TCP
    assert p.sections() == ("guest", "disk", "network", "nfs")
    assert ("disk: NFSv4.2 export share mounted by the guest's kernel over tcp (async, nconnect 1, rsize 1024 KiB, "
            "wsize 1024 KiB); net:") in p.describe()
    assert profiles.parse_profile(p.to_toml(), "again.toml") == p
    assert '"nfs":' in p.canonical_json()


def test_a_profile_without_an_export_has_no_nfs_table_and_keeps_its_hash():
    p = profiles.find_profile("virtio-disk")
    assert "nfs" not in p.sections() and "[nfs]" not in p.to_toml() and '"nfs"' not in p.canonical_json()
    assert not any(k.startswith("nfs.") for k in p.knobs())


def test_nfs_knobs_are_checked_against_each_other_naming_key_and_allowed_values():
    udp = _problems(_profile('proto = "udp"\n'))["nfs.proto"]
    assert "NFSv4 runs over TCP only" in udp.message and "CONFIG_NFS_DISABLE_UDP_SUPPORT" in udp.message
    assert udp.allowed == "tcp"
    four0 = _problems(_profile('vers = "4.0"\nnconnect = 4\n'))["nfs.nconnect"]
    assert four0.value == 4 and "2..16 needs nfs.vers 4.1 or 4.2" in (four0.allowed or "")
    host = _problems(_profile(attach="host"))["disk.attach"]
    assert "an NFS export is a file system" in host.message and host.allowed == "guest (with disk.volume = nfs:<name>)"
    stray = _problems(_profile('writes = "sync"\n', volume="nbd:ebs"))["nfs.writes"]
    assert "this profile has none" in stray.message and "disk.volume = nfs:<name>" in (stray.allowed or "")
    sizes = _problems(_profile("rsize_kib = 48\n"))["nfs.rsize_kib"]
    assert sizes.allowed == "0 (what client and server agree) or a power of two 4..1024 (KiB)"
    assert _problems(_profile('vers = "3"\n'))["nfs.vers"].allowed == "4.0, 4.1, 4.2"
    assert _problems(_profile("nconnect = 17\n"))["nfs.nconnect"].allowed == "1..16"
    unknown = _problems(_profile("wat = 1\n"))["nfs.wat"]
    assert unknown.allowed == "known keys: vers, proto, writes, nconnect, rsize_kib, wsize_kib"


def test_the_guests_mount_options_follow_the_nfs_table():
    exp = nfs.NfsExport("share", "/d", "169.254.100.1", 40123, "169.254.100.0/24")
    assert nfs.mount_options(exp, knobs.Nfs()) == ("vers=4.2,proto=tcp,port=40123,addr=169.254.100.1,async,"
                                                           "hard,nconnect=1")
    tuned = knobs.Nfs(vers="4.1", writes="sync", nconnect=4, rsize_kib=64, wsize_kib=1024)
    assert nfs.mount_options(exp, tuned).endswith(",sync,hard,nconnect=4,rsize=65536,wsize=1048576")
    assert exp.uri == "nfs://169.254.100.1:40123/cloudbox/share" and exp.target == "169.254.100.1:/cloudbox/share"


def test_the_server_serves_one_directory_over_nfsv4_tcp_to_one_subnet():
    conf = nfs.ganesha_conf('/w/ex "a"', "/cloudbox/share", "169.254.100.1", 40123, "169.254.100.0/24", "/w/rec")
    assert "Protocols = 4;" in conf and "Enable_UDP = false;" in conf and "Transports = TCP;" in conf
    assert "Bind_addr = 169.254.100.1;" in conf and "NFS_Port = 40123;" in conf
    assert 'Path = "/w/ex \\"a\\"";' in conf  # quoted for ganesha's parser
    assert "EXPORT_DEFAULTS { Access_Type = None; }" in conf  # nobody but the subnet below
    assert "CLIENT { Clients = 169.254.100.0/24; Access_Type = RW; }" in conf
    assert nfs.subnet("lo", "127.0.0.1") == "127.0.0.0/8"
    with pytest.raises(CloudboxError, match="192.0.2.7 is not an address of lo"):
        nfs.subnet("lo", "192.0.2.7")


def _run(provenance: Provenance, toml: str, labels: tuple[str, ...] = ()) -> Run:
    return Run(id=1, uuid="u", profile_name="t", profile_hash=None, profile_toml=toml, suite="storage",
               size_bytes=None, size_label=None, state="completed", reason=None, accelerator="kvm", emulated=False,
               node="n", pid=None, started_at=None, finished_at=None, provenance=provenance)


def test_the_tables_call_an_export_nfs_with_the_clients_version_and_writes():
    r = _run(Provenance(backing=BackingInfo(kind="network-volume", path="nfs://x")),
             _profile('vers = "4.1"\nwrites = "sync"\n'))
    assert labels.target_label(r) == "NFS"
    assert labels.driver_label(r) == "virtio-net NIC, the guest's NFSv4.1 client (sync)"
    # a back-end's host on the front-end's export (labelled volume-from-host)
    assert labels.volume_baseline_driver(r) == "NFSv4.1, the host's kernel client (sync)"


needs_ganesha = pytest.mark.skipif(bool(nfs.server_problem()) or shutil.which("nfs-ls") is None,
                                   reason="needs nfs-ganesha, nfs-ganesha-vfs and libnfs-utils (make deps-test)")


@needs_ganesha
@pytest.mark.root
def test_ganesha_exports_a_directory_on_loopback_and_stop_leaves_nothing(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("ganesha's VFS back-end opens files by handle: root only")
    export = tmp_path / "export"
    export.mkdir()
    (export / "hello.txt").write_text("from the server's disk\n")
    exp = nfs.start("share", str(export), iface="lo", host="127.0.0.1", work_dir=tmp_path / "ganesha")
    try:
        assert exp.clients == "127.0.0.0/8" and exp.server.startswith("nfs-ganesha")
        assert nfs.running(str(export)) == [exp.pid]
        url = f"nfs://127.0.0.1{exp.pseudo}/?version=4&nfsport={exp.port}"
        listing = subprocess.run(["nfs-ls", url], capture_output=True, text=True, timeout=30)
        assert listing.returncode == 0, listing.stderr
        assert "hello.txt" in listing.stdout
        wrong = subprocess.run(["nfs-ls", f"nfs://127.0.0.1/cloudbox/other/?version=4&nfsport={exp.port}"],
                               capture_output=True, text=True, timeout=30)
        assert wrong.returncode != 0  # only the run's export is served
    finally:
        exp.stop()
    deadline = time.monotonic() + 10
    while nfs.running(str(export)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert nfs.running(str(export)) == [] and not (tmp_path / "ganesha").exists()
    assert (export / "hello.txt").read_text() == "from the server's disk\n"
    exp.stop()  # twice is fine


def test_a_server_that_cannot_start_says_why_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(nfs, "server_problem", lambda: "")
    monkeypatch.setattr(nfs, "_version", lambda: "nfs-ganesha")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    (tmp_path / "bin").mkdir()
    fake = tmp_path / "bin" / "ganesha.nfsd"
    fake.write_text("#!/bin/sh\necho 'config: no such export' >&2\nexit 2\n")
    fake.chmod(0o755)
    with pytest.raises(CloudboxError, match=r"ganesha.nfsd exited 2 before serving NFS export share: config: no such"):
        nfs.start("share", str(tmp_path), iface="lo", host="127.0.0.1", work_dir=tmp_path / "ganesha")
    assert not (tmp_path / "ganesha").exists()


def test_a_run_with_a_test_that_needs_a_block_device_is_refused_before_anything_starts(state):
    spec = RunSpec(profile="nfs-async-tcp", suite="storage", size="quick", storage_tests="seq-write-64k,bonnie")
    with ResultStore() as store:
        rid = runs.executor(spec, store).execute()
        run = store.get_run(rid)
    assert run.state == "aborted", run.reason
    assert "bonnie makes a file system on a block device, and nfs:share is an NFS export" in (run.reason or "")
    assert "every other storage test (fio, dd, IOzone)" in (run.reason or "")
    assert not (Path(os.environ["CLOUDBOX_STATE_DIR"]) / "work").exists() or not any(
        (Path(os.environ["CLOUDBOX_STATE_DIR"]) / "work").iterdir())


def test_without_ganesha_a_run_on_an_export_is_refused_naming_the_packages(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert nfs.server_problem() == ("nfs-ganesha is not installed (Debian packages nfs-ganesha, nfs-ganesha-vfs): "
                                    "run 'make deps'")
    with pytest.raises(attach.AttachRefused, match="nfs-ganesha is not installed"):
        attach.preflight("nfs:share", "guest", 1 << 20)


def test_host_attach_of_an_export_is_refused_with_why():
    for has in (False, True):  # whatever the kernel has: an export is a file system, not a block device
        with pytest.raises(attach.AttachRefused, match=r"disk.attach = host \(nfs\): the host hands the guest a "
                                                       r"block device, and a nfs: volume is a file system"):
            attach.check_attach("nfs", "host", has_module=lambda m, has=has: has)
    with pytest.raises(attach.AttachRefused, match="implemented under KVM/QEMU only"):
        attach.check_attach("nfs", "guest", hypervisor="xen")


# -- the front-end's export on a back-end ------------------------------------------------------------------------
def test_a_back_ends_run_names_the_front_ends_server_and_keeps_older_requests_as_they_were():
    spec = RunSpec(profile="nfs-async-tcp-9000", suite="storage", peer="10.73.0.1", nfs_host="10.73.0.1",
                   nfs_port=40123)
    spec.validate()
    assert RunSpec.from_dict(spec.as_dict()) == spec
    assert "nfs_host" not in RunSpec(profile="nfs-async-tcp").as_dict()  # an older node reads other requests
    for host, port in (("fe1", 2049), ("10.73.0.1", 0), ("10.73.0.1", 70000), ("", 2049), ("::1", 2049)):
        with pytest.raises(UsageError, match=rf"NFS server {host!r} port {port!r} is not allowed; allowed: the "
                                             r"front-end's private IPv4 address and a port from 1 to 65535"):
            RunSpec(profile="nfs-async-tcp", nfs_host=host, nfs_port=port).validate()
    # N guests on a node test the network to the front-end too, all at once
    many = RunSpec(profile="nfs-async-tcp", suite="all", guests=2, node="be1", peer="10.73.0.1",
                   net_tests="tcp-stream")
    many.validate()
    assert [s.test for s in many.plan() if s.test.endswith("-fe")] == ["tcp-stream-fe", "tcp-stream-fe"]
    one = RunSpec(profile="virtio-disk", suite="network", peer="10.73.0.1", net_tests="tcp-stream")
    assert [s.test for s in one.plan() if s.test.endswith("-fe")] == ["tcp-stream-fe", "tcp-stream-fe"]


def test_the_front_ends_export_is_mounted_here_never_served_and_its_baseline_needs_an_nfs_client(state):
    tmp_path = state
    v = attach.export_for_run("nfs:shared", "guest", run_uuid="c" * 32, work_dir=tmp_path / "run", size_bytes=MIB,
                              nfs_server=("10.73.0.1", 40123))
    try:
        assert isinstance(v.export, nfs.NfsExport) and v.export.child is None and not v.path
        assert v.uri == "nfs://10.73.0.1:40123/cloudbox/shared" and v.export.target == "10.73.0.1:/cloudbox/shared"
        assert v.server == "nfs-ganesha on the front-end 10.73.0.1 on 10.73.0.1:40123 as 10.73.0.1:/cloudbox/shared"
        assert v.store.baseline_target == str(tmp_path / "run" / transports.NFS_HOST_MOUNT / "baseline.dat")
        assert v.store.baseline_labels == [transports.BASELINE_LABEL]
        if nfs.host_client_problem(attach.kernel_module_available):
            assert v.no_baseline.startswith("no baseline: this host's kernel (") and "nfsv4" in v.no_baseline
        with pytest.raises(CloudboxError, match="served already"):  # never served from here
            v.serve("lo", "10.73.0.1")
    finally:
        v.close()
    assert not (tmp_path / "run").exists()
    assert nfs.host_client_problem(lambda m: m == "nfsv4") == ""


def test_a_front_end_without_a_private_network_refuses_an_nfs_run_on_a_node(state, monkeypatch):
    from cloudbox.core.run import mirror

    monkeypatch.setattr(mirror.network, "private_address", lambda: "0.0.0.0")
    ctx = types.SimpleNamespace(profile=resolve_profile("nfs-async-tcp"), spec=RunSpec(profile="nfs-async-tcp",
                                                                                      suite="storage", node="be1"))
    there = types.SimpleNamespace(node=types.SimpleNamespace(name="be1"))
    with pytest.raises(CloudboxError, match=r"profile nfs-async-tcp: disk.volume = nfs:.* on node be1: the front-end "
                                            r"serves the export on its private network, .*allowed here: the profile "
                                            r"without --node"):
        mirror.serve_nfs(ctx, there)
    ctx.spec = RunSpec(profile="nfs-async-tcp", suite="network", node="be1")
    mirror.serve_nfs(ctx, there)  # no storage tests: nothing to export


def test_results_show_names_both_mounts_of_a_back_ends_run(state, capsys):
    from cloudbox import cli
    from cloudbox.core.record.provenance import VolumeInfo

    guest = "10.73.0.1:/cloudbox/share /mnt/nfs nfs4 rw,vers=4.2,addr=10.73.0.1 0 0"
    host = "10.73.0.1:/cloudbox/share /var/lib/cloudbox/work/run-x/nfs-host nfs4 rw,vers=4.2,addr=10.73.0.1 0 0"
    with ResultStore() as store:
        one = store.create_run(profile_name="nfs-async-tcp-9000", node="be1", provenance=Provenance(
            volume=VolumeInfo(name="share", scheme="nfs", attach="guest", mount=guest, host_mount=host,
                              baseline="the same export mounted by this back-end's host")))
        other = store.create_run(profile_name="nfs-async-tcp", provenance=Provenance(
            volume=VolumeInfo(name="share", scheme="nfs", attach="guest", mount=guest)))
    assert cli.main(["results", "show", str(one)]) == 0
    out = capsys.readouterr().out
    assert f"  guest mount  {guest}\n  host mount   {host}\n" in out, out
    assert cli.main(["results", "show", str(other)]) == 0
    assert "host mount" not in capsys.readouterr().out  # one box: its host serves and does not mount


def test_results_show_names_the_front_ends_disk_under_a_back_ends_export(state, capsys):
    """A back-end's NFS run has no disk of its own to sample; the front-end's disk under the export, sampled there,
    is shown even though it is the only device."""
    from cloudbox import cli
    from cloudbox.core.record.provenance import VolumeInfo

    with ResultStore() as store:
        rid = store.create_run(profile_name="nfs-async-tcp-9000", node="be1", provenance=Provenance(
            volume=VolumeInfo(name="share", scheme="nfs", attach="guest", server_device="fe1:vda")))
        store.add_samples(rid, [{"t": 1.0 + k, "device": "fe1:vda", "write_mbps": 40.0, "util": 50.0}
                                for k in range(3)])
        bare = store.create_run(profile_name="nfs-async-tcp", provenance=Provenance(
            volume=VolumeInfo(name="share", scheme="nfs", attach="guest")))
        store.add_samples(bare, [{"t": 1.0, "device": "vda", "write_mbps": 40.0, "util": 50.0}])
    assert cli.main(["results", "show", str(rid)]) == 0
    assert "  sampled      fe1:vda 3 s, mean 40.0 MB/s, util 50%\n" in capsys.readouterr().out
    assert cli.main(["results", "show", str(bare)]) == 0
    assert "sampled " not in capsys.readouterr().out  # one device of this host's: the table's columns say it
