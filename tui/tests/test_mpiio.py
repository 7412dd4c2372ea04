"""MPI-IO across guests (core.bench.mpiio): cloudbox-mpiio from the guest image's MPI layer, run by its own Open MPI on
this
host (the bare-metal side's way), its figures and its check of what it reads back; the options' checks; the job's rows
in the tables; and real runs of two TCG guests, mpirun in the first reaching the second over dropbear (one on an NFS
export in make test, a file per process on each guest's own disk and Ctrl-C under `full`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from cloudbox.core.bench import mpiio
from cloudbox.core.disks.volumes import nfs
from cloudbox.core.errors import CloudboxError, GuestError, UsageError
from cloudbox.core.record.provenance import Guests, GuestStart, Provenance
from cloudbox.core.record.results import ResultStore
from cloudbox.core.run.multi import check_fits
from cloudbox.core.spec import catalogue
from cloudbox.core.spec.profiles import resolve_profile
from cloudbox.core.spec.runspec import RunSpec
from cloudbox.core.views import compare, render
from cloudbox.core.virt.guestimage import GuestImage

MIB = 1024 * 1024


@pytest.fixture(scope="module")
def layer(tmp_path_factory) -> Path:
    """The guest image's MPI layer unpacked, as the bare-metal side unpacks it."""
    try:
        image = GuestImage.locate()
        cpio = image.mpi_layer()
    except GuestError as e:
        pytest.skip(f"no benchmark guest image with an MPI layer here ({e}); make guest-image builds it")
    return mpiio.host_layer(cpio, tmp_path_factory.mktemp("mpi"))


def _job(layer: Path, cwd: Path, argvs: list[list[str]]) -> str:
    return mpiio.run_on_host(layer, argvs, lambda: False, cwd)


# -- the workload itself, from the image's layer -----------------------------------------------------------------
def _mpirun_pids(root: Path) -> list[int]:
    out = subprocess.run(["pgrep", "-f", f"^{root}/usr/bin/mpirun "], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


@pytest.mark.root
@pytest.mark.skipif(shutil.which("ss") is None or shutil.which("nsenter") is None, reason="needs ss and nsenter")
def test_the_bare_metal_job_listens_on_no_network(layer, tmp_path):
    """Open MPI's mpirun listens on every address (its out-of-band channel and PMIx's tools): the bare-metal job
    runs in a network namespace of its own with only loopback, so nothing on any network reaches it. Checked with
    ss while the job runs, from this host's namespace and from the job's."""
    t = catalogue.TESTS["mpiio-fpp-1m"]
    job = threading.Thread(target=_job, args=(layer, tmp_path, [mpiio.argv(t, str(tmp_path / "f"), 64 * MIB, 2,
                                                                            "write", local=True)] * 2))
    job.start()
    seen: dict[str, str] = {}
    try:
        deadline = time.monotonic() + 60
        while job.is_alive() and time.monotonic() < deadline and "inside" not in seen:
            for pid in _mpirun_pids(layer):
                ours = subprocess.run(["ss", "-tulpnH"], capture_output=True, text=True).stdout
                inside = subprocess.run(["nsenter", "-t", str(pid), "-n", "ss", "-tulnH"], capture_output=True,
                                        text=True).stdout
                links = subprocess.run(["nsenter", "-t", str(pid), "-n", "ip", "-o", "link"], capture_output=True,
                                       text=True).stdout
                if inside.strip():  # mpirun has opened its listeners
                    seen.update(ours=ours, inside=inside, links=links, pid=str(pid),
                                netns=os.readlink(f"/proc/{pid}/ns/net"))
            time.sleep(0.02)
    finally:
        job.join(120)
    assert "inside" in seen, "mpirun's listeners were not seen while the job ran"
    assert seen["netns"] != os.readlink("/proc/self/ns/net")
    assert f"pid={seen['pid']}," not in seen["ours"], seen["ours"]  # none of them in this host's namespace
    assert [line.split(":")[1].strip() for line in seen["links"].splitlines()] == ["lo"], seen["links"]


def test_two_ranks_write_a_shared_file_and_read_each_others_part_back(layer, tmp_path):
    t = catalogue.TESTS["mpiio-shared-1m"]
    path = str(tmp_path / "shared.dat")
    out = "".join(_job(layer, tmp_path, [mpiio.argv(t, path, 4 * MIB, 2, phase)] * 2) for phase in ("write", "read"))
    assert Path(path).stat().st_size == 8 * MIB  # one file: two ranks' 4 MiB, side by side
    res = mpiio.parse(t.id, out)
    assert res.library.startswith("Open MPI v4"), res.library
    assert len(res.ranks) == 2 and len(set(res.hosts)) == 1  # both on this host
    assert res.total.mbps > 0 and res.total.extra["read MB/s"] > 0
    # the job's figure is all bytes over its whole window: never above what the ranks made over their own times
    for metric in ("MB/s", "read MB/s"):
        each = [r.mbps if metric == "MB/s" else r.extra[metric] for r in res.ranks]
        job = res.total.mbps if metric == "MB/s" else res.total.extra[metric]
        assert 0 < job <= sum(each) * 1.0001, (metric, job, each)
    docs = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [d["reorder"] for d in docs] == [0, 1]  # the read job takes the next rank's data
    assert all(op["bytes"] == 8 * MIB and op["errors"] == 0 for d in docs for op in d["ops"])


def test_a_file_per_process_and_posix_give_a_file_each_and_one_file(layer, tmp_path):
    fpp, posix = catalogue.TESTS["mpiio-fpp-1m"], catalogue.TESTS["posix-shared-1m"]
    for t, files in ((fpp, ["f.dat.00000000", "f.dat.00000001"]), (posix, ["p.dat"])):
        path = str(tmp_path / files[0].split(".")[0]) + ".dat"
        _job(layer, tmp_path, [mpiio.argv(t, path, 2 * MIB, 2, "write")] * 2)
        assert sorted(p.name for p in tmp_path.glob(Path(path).name + "*")) == files
        assert sum(p.stat().st_size for p in tmp_path.glob(Path(path).name + "*")) == 4 * MIB


def test_parallel_hdf5_writes_one_dataset_independently_and_collectively(layer, tmp_path):
    """hdf5-shared-1m: an HDF5 file through its MPI-IO driver, one dataset every rank writes its part of."""
    t = catalogue.TESTS["hdf5-shared-1m"]
    for collective in (False, True):
        path = str(tmp_path / f"f{int(collective)}.h5")
        jobs = [mpiio.argv(t, path, 2 * MIB, 2, phase) + (["-c"] if collective else []) for phase in ("write", "read")]
        out = "".join(_job(layer, tmp_path, [argv] * 2) for argv in jobs)
        assert Path(path).read_bytes()[:8] == b"\x89HDF\r\n\x1a\n"  # an HDF5 file, 4 MiB of data in it
        assert Path(path).stat().st_size >= 4 * MIB
        res = mpiio.parse(t.id, out)
        assert res.total.mbps > 0 and res.total.extra["read MB/s"] > 0
        docs = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        assert all(d["api"] == "hdf5" and d["hdf5"].startswith("1.") and d["collective"] == int(collective)
                   for d in docs)
    assert "parallel HDF5 across guests" in catalogue.test_title(t.id)


def test_each_rank_on_a_target_of_its_own(layer, tmp_path):
    """MPMD, the bare-metal side of a run on disks of each guest's own: rank k on store k's baseline target."""
    t = catalogue.TESTS["mpiio-fpp-1m"]
    targets = [tmp_path / "a.img", tmp_path / "b.img"]
    for phase in ("write", "read"):
        out = _job(layer, tmp_path, [mpiio.argv(t, str(p), 2 * MIB, 2, phase, local=True) for p in targets])
    assert [p.stat().st_size for p in targets] == [2 * MIB, 2 * MIB]
    doc = json.loads(next(line for line in out.splitlines() if line.startswith("{")))
    assert doc["ops"][0]["errors"] == 0 and doc["reorder"] == 0  # each reads its own target back


def test_data_that_is_not_what_was_written_there_fails_the_test(layer, tmp_path):
    """Each transfer carries its offset and writer: read back with other transfer sizes, the offsets disagree."""
    path = str(tmp_path / "f.dat")
    t = catalogue.TESTS["posix-shared-1m"]
    out = _job(layer, tmp_path, [mpiio.argv(t, path, 2 * MIB, 1, "write")])
    argv = mpiio.argv(t, path, 2 * MIB, 1, "read")
    argv[argv.index("-t") + 1] = "512k"
    out += _job(layer, tmp_path, [argv])
    with pytest.raises(CloudboxError, match="transfers read back other data than was written there"):
        mpiio.parse(t.id, out)


def test_bad_arguments_are_named_by_the_workload(layer, tmp_path):
    r = subprocess.run([str(layer / "usr/bin/mpirun"), "--allow-run-as-root", "-np", "1",
                        str(layer / "usr/bin/cloudbox-mpiio"), "-o", str(tmp_path / "x"), "-t", "1m", "-b", "3m",
                        "-a", "netcdf"], env=mpiio.host_env(layer), capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "-a netcdf: allowed: mpiio, posix, hdf5" in r.stdout + r.stderr


def test_the_arguments_of_each_phase():
    t = catalogue.TESTS["mpiio-shared-1m"]
    assert mpiio.argv(t, "/mnt/f", 16 * MIB + 5, 2, "write") == [
        "cloudbox-mpiio", "-a", "mpiio", "-o", "/mnt/f", "-t", "1m", "-b", str(16 * MIB), "-s", "1", "-w", "-e"]
    assert mpiio.argv(t, "/mnt/f", 16 * MIB, 2, "read")[-2:] == ["-r", "-C"]
    local = mpiio.argv(catalogue.TESTS["mpiio-fpp-1m"], "/dev/vdb", 16 * MIB, 2, "read", local=True)
    assert local[-3:] == ["-r", "-F", "-L"]  # its own disk: no other rank's data to read
    with pytest.raises(UsageError, match="below one 1m transfer"):
        mpiio.argv(t, "/mnt/f", 1000, 2, "write")
    argv = mpiio.mpirun_argv(["cloudbox-g1", "cloudbox-g2"], ["cloudbox-mpiio"], "eth0")
    assert argv[argv.index("--host") + 1] == "cloudbox-g1:1,cloudbox-g2:1"
    assert ["--mca", "btl_tcp_if_include", "eth0"] == argv[argv.index("btl_tcp_if_include") - 1:][:3]


# -- checks before anything starts -------------------------------------------------------------------------------
def test_mpi_tests_need_two_guests_and_a_shared_file_an_nfs_export():
    with pytest.raises(UsageError, match=r"run one job \(MPI, or fio.s client/server\) across guests; allowed: "
                                         r"--guests 2 or more"):
        RunSpec(profile="nfs-async-tcp", suite="storage", storage_tests="mpi").validate()
    RunSpec(profile="nfs-async-tcp", suite="storage", storage_tests="mpi", guests=2).validate()
    RunSpec(profile="virtio-disk", suite="network", storage_tests="mpi").validate()  # no storage tests run
    spec = RunSpec(profile="virtio-disk", suite="storage", storage_tests="mpiio-shared-1m,mpiio-fpp-1m", guests=2)
    with pytest.raises(UsageError, match=r"profile virtio-disk: storage test\(s\) mpiio-shared-1m write one file "
                                         r"every guest sees.*allowed: a profile whose disk is an NFS export"):
        check_fits(spec, resolve_profile("virtio-disk"), available_mib=64000, host_cpus=8)
    check_fits(RunSpec(profile="virtio-disk", suite="storage", storage_tests="mpiio-fpp-1m", guests=2),
               resolve_profile("virtio-disk"), available_mib=64000, host_cpus=8)
    assert spec.wants_mpi and not RunSpec(profile="virtio-disk", suite="storage", guests=2).wants_mpi
    assert not set(catalogue.MPI_TESTS) & set(catalogue.TEST_SETS["full"])  # never in a run that did not ask


def test_the_mpi_layer_follows_the_initramfs_at_a_four_byte_boundary(tmp_path):
    (tmp_path / "initrd.img").write_bytes(b"z" * 4097)  # a compressed initramfs ends anywhere
    (tmp_path / "mpi.cpio").write_bytes(b"070701layer")
    image = GuestImage(tmp_path, tmp_path / "vmlinuz", tmp_path / "initrd.img", {})
    out = image.write_mpi_initrd("qemu", 1024, tmp_path / "initrd-mpi.cpio")
    data = out.read_bytes()
    assert data == b"z" * 4097 + b"\0" * 3 + b"070701layer" and out.stat().st_mode & 0o777 == 0o644
    (tmp_path / "mpi.cpio").unlink()
    with pytest.raises(GuestError, match="no MPI layer .* rebuild it with 'make guest-image'"):
        image.write_mpi_initrd("qemu", 1024, tmp_path / "again")


def test_the_compressed_layer_follows_a_compressed_initramfs_and_unpacks_the_same(tmp_path):
    """The appliance and the nodes carry mpi.img only: appended after initrd.img as it is, unpacked with zstd."""
    try:
        image = GuestImage.locate()
        cpio, img = image.mpi_layer(), image.mpi_layer(compressed=True)
    except GuestError as e:
        pytest.skip(f"no benchmark guest image with an MPI layer here ({e}); make guest-image builds it")
    assert (cpio.name, img.name) == ("mpi.cpio", "mpi.img")
    out = image.write_mpi_initrd("xen", 1024, tmp_path / "initrd-mpi")  # not QEMU: the compressed initramfs
    assert out.stat().st_size == -(-image.initrd.stat().st_size // 4) * 4 + img.stat().st_size
    a, b = mpiio.host_layer(cpio, tmp_path / "a"), mpiio.host_layer(img, tmp_path / "b")
    files = sorted(str(p.relative_to(a)) for p in a.rglob("*"))
    assert files == sorted(str(p.relative_to(b)) for p in b.rglob("*")) and "usr/bin/cloudbox-mpiio" in files
    assert (a / "usr/bin/cloudbox-mpiio").read_bytes() == (b / "usr/bin/cloudbox-mpiio").read_bytes()
    (tmp_path / "bad.img").write_bytes(b"not zstd")
    with pytest.raises(CloudboxError, match="zstd could not unpack .*bad.img"):
        mpiio.host_layer(tmp_path / "bad.img", tmp_path / "c")


# -- the job's rows in the tables ----------------------------------------------------------------------------------
def test_the_tables_show_the_jobs_own_figure_each_rank_and_the_read_job(tmp_path):
    test = "mpiio-shared-1m"
    with ResultStore(tmp_path / "r.db") as store:
        rid = store.create_run(profile_name="nfs-async-tcp", suite="storage", accelerator="tcg",
                               provenance=Provenance(guests=Guests(count=2, guests=[GuestStart(name="g1"),
                                                                                    GuestStart(name="g2")])))
        for side, job, each in (("guest", 30.0, (20.0, 16.0)), ("baseline", 500.0, (300.0, 260.0))):
            for k, v in enumerate(each, 1):
                store.add_measurement(rid, side=side, test=test, metric="MB/s", value=v, instance=k)
                store.add_measurement(rid, side=side, test=test, metric="read MB/s", value=2 * v, instance=k)
            store.add_measurement(rid, side=side, test=test, metric="MB/s", value=job)
            store.add_measurement(rid, side=side, test=test, metric="read MB/s", value=2 * job)
        run = store.get_run(rid)
    table = compare.compare_table([run])
    assert [(s.metric, s.title.endswith("the read job")) for s in table.sections] == [("MB/s", False),
                                                                                       ("read MB/s", True)]
    rows = [(r.cells["run"], r.cells["value"]) for r in table.sections[1].rows]
    assert rows == [("#1 job", 1000.0), ("#1 p1", 600.0), ("#1 p2", 520.0), ("#1 job", 60.0), ("#1 g1", 40.0),
                    ("#1 g2", 32.0)]
    text = render.to_text(table, width=200)
    assert ("#1 mpiio-shared-1m: one MPI job, a rank in each of 2 guests, 30.0 MB/s (all bytes over the job's time); "
            "per rank (over its own time) min 16.0 / median 18.0 / max 20.0") in text
    assert "Bare metal, one job of 2 ranks: 500.0" in text and "not IOR" in text
    assert "(rows: the MPI job's aggregate, then each rank; bare metal: 2 processes)" in table.legend[0]
    with ResultStore(tmp_path / "r.db") as store:  # beside a summed test, the legend names both
        store.add_measurement(rid, side="guest", test="seq-write-64k", metric="MB/s", value=9.0)
        mixed = compare.compare_table([store.get_run(rid)])
    assert "(rows: their sum (an MPI job: its aggregate), then each guest or rank;" in mixed.legend[0]
    sweep = compare.guest_sweep_table([run])
    assert [c.title for c in sweep.sections[0].columns][2] == "job MB/s"


# -- real runs: two TCG guests, mpirun in the first, dropbear to the second ----------------------------------------
def _mpi_processes() -> list[str]:
    r = subprocess.run(["pgrep", "-a", "-f", "orted|orterun|mpirun|cloudbox-mpiio"], capture_output=True, text=True)
    return [ln for ln in r.stdout.splitlines() if "pgrep" not in ln]


def _nothing_left(conn, state) -> None:
    from real_runs import leftovers, work_files

    left = leftovers(conn, state)
    assert not left["guests"] and not left["bridge"] and not left["loops"], left
    assert work_files(state) == []  # the layer unpacked for bare metal, the initramfs with it, the stores
    assert _mpi_processes() == []


def _check_job(run, test: str) -> None:
    for side in ("guest", "baseline"):
        for metric in ("MB/s", "read MB/s"):
            each = run.instances(side, test, metric)
            assert [m.instance for m in each] == [1, 2] and all(m.value > 0 for m in each), (side, metric)
            job = run.measurement(side, test, metric)
            # the job's figure is all bytes over its whole window: at most what the ranks made over their own times
            assert job is not None and 0 < job.value <= sum(m.value for m in each) * 1.0001, (side, metric)
    guest = run.measurement("guest", test, "MB/s")
    assert guest is not None and guest.host_avgqu is not None  # the host disk over the job's window
    docs = [json.loads(line) for line in guest.raw.splitlines() if line.startswith("{")]
    assert [d["ops"][0]["access"] for d in docs] == ["write", "read"]
    hosts = [rk["host"] for rk in docs[0]["ops"][0]["ranks"]]
    assert hosts == ["cloudbox-g1", "cloudbox-g2"], hosts  # a rank in each guest, in order
    assert docs[0]["mpi"].startswith("Open MPI v4")


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.skipif(bool(nfs.server_problem()), reason="needs nfs-ganesha, nfs-ganesha-vfs (make deps)")
def test_an_mpi_io_job_across_two_guests_on_one_nfs_export(state, libvirt_conn):
    """nfs-async-tcp --guests 2 --tests mpiio-shared-1m: both guests mount the export; mpirun in the first starts a
    rank in each, over dropbear, writing one shared file then reading the other rank's part; bare metal runs the
    same job with two processes on the export's directory."""
    from real_runs import completed_run

    run = completed_run(RunSpec(profile="nfs-async-tcp", suite="storage", size="32M",  # quick's 128M: 15 s more
                                storage_tests="mpiio-shared-1m", guests=2))
    _check_job(run, "mpiio-shared-1m")
    v = run.provenance.volume
    assert v is not None and (v.server_bytes_written or 0) >= 2 * 32 * MIB, v  # both ranks' parts reached the disk
    base = run.measurement("baseline", "mpiio-shared-1m", "MB/s")
    assert base is not None and "nfs-export-dir" in base.labels
    _nothing_left(libvirt_conn, state)


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.full
def test_a_file_per_process_on_each_guests_own_disk(state, libvirt_conn):
    """virtio-disk --guests 2: each rank on its guest's own disk (and, bare metal, on its own store's target)."""
    from real_runs import completed_run

    run = completed_run(RunSpec(profile="virtio-disk", suite="storage", size="quick", storage_tests="mpiio-fpp-1m",
                                guests=2))
    _check_job(run, "mpiio-fpp-1m")
    raw = run.measurement("guest", "mpiio-fpp-1m", "MB/s")
    assert raw is not None and '"path": "/dev/vd' in raw.raw  # the guests' own disks
    _nothing_left(libvirt_conn, state)


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.full
@pytest.mark.skipif(bool(nfs.server_problem()), reason="needs nfs-ganesha, nfs-ganesha-vfs (make deps)")
def test_posix_and_parallel_hdf5_jobs_on_one_nfs_export(state, libvirt_conn):
    from real_runs import completed_run

    run = completed_run(RunSpec(profile="nfs-async-tcp", suite="storage", size="quick",
                                storage_tests="posix-shared-1m,hdf5-shared-1m", guests=2))
    for test in ("posix-shared-1m", "hdf5-shared-1m"):
        _check_job(run, test)
    m = run.measurement("guest", "hdf5-shared-1m", "MB/s")
    assert m is not None and '"api": "hdf5"' in m.raw
    _nothing_left(libvirt_conn, state)


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.full
def test_ctrl_c_during_an_mpi_job_leaves_nothing(state, libvirt_conn):
    from real_runs import interrupt_cli_run

    got = interrupt_cli_run(["--profile", "virtio-disk", "--guests", "2", "--suite", "storage", "--size", "256M",
                             "--tests", "mpiio-fpp-1m"], phase=("guest: mpiio-fpp-1m",))
    assert got.returncode == 1, got.output
    assert got.run.state == "aborted" and "SIGINT" in (got.run.reason or ""), got.run.reason
    _nothing_left(libvirt_conn, state)
