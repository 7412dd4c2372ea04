"""`cloudbox results ...` against a real results database in tmp_path."""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from conftest_results import REPEATED_WRITE_BARE, REPEATED_WRITE_GUEST, add_repeated_virtio, study_a_store

from cloudbox.core.record import stats
from cloudbox.core.record.provenance import DiskStall, NicStall
from cloudbox.core.record.results import ResultStore
from cloudbox.core.record.schema import SCHEMA_VERSION
from cloudbox.core.views import labels, render, rundetail


@pytest.fixture
def db(tmp_path: Path) -> tuple[Path, int, int]:
    store, default, virtio = study_a_store(tmp_path / "results.db")
    store.close()
    return store.path, default, virtio


def test_list_text_and_json(db, cli_run):
    path, default, virtio = db
    code, out, err = cli_run(["results", "--db", str(path), "list"])
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["ID", "STARTED", "STATE"]
    assert lines[1].split()[0] == str(virtio) and lines[2].split()[0] == str(default)  # newest first
    assert "tcg*" in lines[1] and "55.0 (50%)" in lines[1]
    assert "1.3 (1%)" in lines[2] and "667" in lines[2]
    assert labels.EMULATED_NOTE in out
    assert max(len(line) for line in lines[:3]) <= 80

    code, out, _ = cli_run(["results", "--db", str(path), "list", "--json"])
    data = json.loads(out)
    assert [d["id"] for d in data] == [virtio, default]
    assert data[0]["seq_write_pct"] == 50.0 and data[0]["emulated"] is True

    code, out, _ = cli_run(["results", "--db", str(path), "list", "--state", "running"])
    assert code == 0 and out.strip() == "no runs in state running"


def test_list_marks_a_running_run_whose_executor_died_aborted(db, cli_run):
    path, _, _ = db
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with ResultStore(path) as store:
        rid = store.create_run(profile_name="crashed", pid=dead.pid, accelerator="kvm")
    code, out, _ = cli_run(["results", "--db", str(path), "list", "--state", "running"])
    assert code == 0 and out.strip() == "no runs in state running"  # the first command that looks ends it
    code, out, _ = cli_run(["results", "--db", str(path), "list", "--json", "--state", "aborted"])
    (listed,) = json.loads(out)
    assert listed["id"] == rid and listed["executor_alive"] is None
    code, out, _ = cli_run(["results", "--db", str(path), "show", str(rid)])
    assert "aborted" in out and f"executor killed: executor pid {dead.pid} gone, last seen" in out
    # a dead run can be deleted; a live one (this process) cannot
    with ResultStore(path) as store:
        live = store.create_run(profile_name="live")
    code, _, err = cli_run(["results", "--db", str(path), "delete", str(live)])
    assert code == 1 and "still running" in err
    code, out, _ = cli_run(["results", "--db", str(path), "delete", str(rid)])
    assert code == 0 and out.strip() == f"deleted run #{rid}"


def test_show_prints_the_core_run_detail_view(db, cli_run):
    """`results show` is the core's run-detail text, printed; the view needs no store."""
    path, default, _ = db
    with ResultStore(path) as store:
        run, samples = store.get_run(default), store.samples(default)
    code, out, _ = cli_run(["results", "--db", str(path), "show", str(default), "--raw"])
    assert code == 0 and out == rundetail.run_detail(run, samples, raw=True)
    gone = rundetail.run_detail(dataclasses.replace(run, state="running"), samples, executor_alive=False)
    assert "  state        running - executor process gone\n" in gone


def test_show_text_json_raw(db, cli_run):
    path, default, virtio = db
    code, out, _ = cli_run(["results", "--db", str(path), "show", str(virtio)])
    assert code == 0
    assert f"run #{virtio}" in out and "EMULATED" in out
    assert "KVM (TCG, emulated); local disk; virtio-blk, phy" in out
    assert "50.0%" in out and labels.EMULATED_NOTE in out
    assert "--- raw" not in out
    assert "guest boot" not in out  # a run without the launch time (older runs) shows no line

    # the guest's launch-to-agent time, and a lost first boot said in words
    with ResultStore(path) as store:
        stall = NicStall(test="tcp-maerts", hop="the host's tap vnet3: it is down", remedy="relaunch")
        disk = DiskStall(test="randread-4k-qd32", disks=["vda"], seen="in flight 32 on vda, none completed for 120 s")
        with_packages = store.get_run(default).provenance.versions.model_copy(  # type: ignore[union-attr]
            update={"guest_packages": {"fio": "3.33-3", "netperf": "2.7.0-0.1"}})
        for rid, extra in ((default, {"launch_to_agent_s": 1.4, "versions": with_packages}),
                           (virtio, {"launch_to_agent_s": 95.2, "boot_attempts": 2, "nic_stalls": [stall],
                                     "disk_stalls": [disk]})):
            store.set_provenance(rid, store.get_run(rid).provenance.model_copy(update=extra))
    code, out, _ = cli_run(["results", "--db", str(path), "show", str(virtio)])
    assert "guest boot   95 s to its agent (launch 2: the guest's first boot was lost and it was launched again)" \
        in out, out
    assert ("network      the guest's network stopped during tcp-maerts (frames stopped at the host's tap vnet3: it "
            "is down); re-plugging its NIC did not help, the guest was launched afresh") in out, out
    assert ("disk         the guest's disk stopped completing requests during randread-4k-qd32 (in flight 32 on "
            "vda, none completed for 120 s); the guest was launched afresh and randread-4k-qd32 and the tests after "
            "it ran on the new guest") in out, out
    code, out, _ = cli_run(["results", "--db", str(path), "show", str(default)])
    assert "guest boot   1 s to its agent\n" in out, out
    # The tools' versions in one line; the guest image's packages stay in the JSON (a run lists dozens).
    (versions,) = [line for line in out.splitlines() if line.startswith("  versions")]
    assert versions == ("  versions     cloudbox 0.1.0, fio 3.33, iperf3 3.12, libvirt 9.0.0, netperf 2.7.0, "
                        "qemu 7.2.15"), versions
    assert "network      the guest's network stopped" not in out and "disk         the guest's disk" not in out

    code, out, _ = cli_run(["results", "--db", str(path), "show", str(default), "--raw"])
    assert "--- raw: guest seq-write-64k MB/s" in out and "fio-3.33" in out
    assert "TCP STREAM TEST" in out

    code, out, _ = cli_run(["results", "--db", str(path), "show", str(default), "--json"])
    doc = json.loads(out)
    assert doc["runs"][0]["provenance"]["host_kernel"] == "6.1.0-28-amd64"
    assert all("raw" not in m for m in doc["runs"][0]["measurements"])

    with ResultStore(path) as store:
        uuid = store.get_run(default).uuid
    code, out, _ = cli_run(["results", "--db", str(path), "show", uuid[:8], "--json", "--raw"])
    assert json.loads(out)["runs"][0]["id"] == default
    assert any(m["raw"] for m in json.loads(out)["runs"][0]["measurements"])


@pytest.mark.parametrize("fmt", ["text", "md", "csv", "json"])
def test_compare_formats(db, fmt, cli_run):
    path, default, virtio = db
    code, out, err = cli_run(["results", "--db", str(path), "compare", str(default), str(virtio),
                              "--format", fmt])
    assert code == 0 and err == ""
    if fmt == "text":
        assert "50.0%" in out and "* measured under TCG emulation" in out
    elif fmt == "md":
        assert "| 55.0 | 50.0% |" in out and "\\* measured under TCG emulation" in out
    elif fmt == "csv":
        rows = list(csv.DictReader(io.StringIO(out)))
        guest = [r for r in rows
                 if r["run"] == f"#{virtio}" and r["test"] == "seq-write-64k" and r["row"] == "guest"]
        assert guest[0]["pct_of_baseline"] == "50.0" and guest[0]["marker"].startswith("*")
    else:
        assert [r["id"] for r in json.loads(out)["runs"]] == [default, virtio]


def test_export_to_file_and_stdout(db, tmp_path: Path, cli_run):
    path, default, virtio = db
    target = tmp_path / "out" / "all.json"
    code, out, err = cli_run(["results", "--db", str(path), "export", "-o", str(target)])
    assert code == 0 and out == "" and f"wrote 2 runs to {target}" in err
    doc = json.loads(target.read_text())
    assert [r["id"] for r in doc["runs"]] == [default, virtio]  # oldest first
    assert doc["runs"][0]["provenance"]["backing"]["kind"] == "sparse-file"
    assert doc["runs"][1]["provenance"]["versions"]["cloudbox"] == "0.1.0"

    code, out, _ = cli_run(["results", "--db", str(path), "export", str(virtio), "--format", "md"])
    assert code == 0 and out.startswith(f"## Run #{virtio}") and "\\* measured under TCG" in out

    code, out, _ = cli_run(["results", "--db", str(path), "export", "--format", "csv"])
    assert out.splitlines()[0] == ",".join(render.CSV_FIELDS)


def test_not_found_goes_to_stderr_with_exit_2(db, cli_run):
    path, default, virtio = db
    for argv in (["show", "99"], ["compare", str(default), "99"], ["delete", "99"], ["export", "99"]):
        code, out, err = cli_run(["results", "--db", str(path), *argv])
        assert code == 2 and out == ""
        assert err.startswith("cloudbox: no run 99") and f"newest runs: {virtio}, {default}" in err


def test_delete(db, cli_run):
    path, default, virtio = db
    code, out, _ = cli_run(["results", "--db", str(path), "delete", str(default)])
    assert code == 0 and out.strip() == f"deleted run #{default}"
    with ResultStore(path) as store:
        assert [r.id for r in store.list_runs()] == [virtio]


def test_registered_in_the_cloudbox_command(db, monkeypatch, capsys):
    path, _, virtio = db
    monkeypatch.setenv("CLOUDBOX_STATE_DIR", str(path.parent))
    from cloudbox.cli import main

    assert main(["results", "list", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["id"] == virtio


def test_a_repeated_run_shows_its_intervals_in_every_command(db, cli_run):
    """A run whose tests were repeated, stored sample by sample: list, show, compare in each format and the export
    give each figure's median with its interval and n, and its samples."""
    path, default, _ = db
    with ResultStore(path) as store:
        rep = add_repeated_virtio(store)
    s = stats.summarize(REPEATED_WRITE_GUEST)
    q = stats.ratio(REPEATED_WRITE_GUEST, REPEATED_WRITE_BARE)
    assert s.low is not None and s.high is not None and q is not None
    interval, pct = f"[{s.low:.1f}, {s.high:.1f}]", f"[{q.low:.1f}, {q.high:.1f}]"

    code, out, _ = cli_run(["results", "--db", str(path), "list"])
    (line,) = [x for x in out.splitlines() if x.split()[0] == str(rep)]
    assert code == 0 and f"{s.median:.1f} ({q.percent:.0f}%) n=8" in line and "905 n=3" in line
    assert "n=k: the median of k repeats (results show gives its interval and samples)\n" in out

    code, out, _ = cli_run(["results", "--db", str(path), "show", str(rep)])
    assert code == 0 and interval in out and pct in out and "n=8+8" in out and labels.INTERVAL_NOTE.split()[0] in out
    assert "Repeated figures" in out and " ".join(f"{v:.1f}" for v in REPEATED_WRITE_GUEST) in out

    code, out, _ = cli_run(["results", "--db", str(path), "compare", str(default), str(rep)])
    assert interval in out and pct in out and labels.ONCE_SOME_NOTE in " ".join(out.split())
    code, out, _ = cli_run(["results", "--db", str(path), "compare", str(rep), "--format", "md"])
    assert f"| {s.median:.1f} {interval} n=8 | {q.percent:.1f}% {pct} n=8\\+8 |" in out
    for cmd in (["compare", str(rep), "--format", "csv"], ["export", str(rep), "--format", "csv"]):
        code, out, _ = cli_run(["results", "--db", str(path), *cmd])
        (row,) = [r for r in csv.DictReader(io.StringIO(out)) if r["test"] == "seq-write-64k" and r["row"] == "guest"]
        assert row["n"] == "8" and row["samples"].split() == [str(v) for v in REPEATED_WRITE_GUEST], cmd
    code, out, _ = cli_run(["results", "--db", str(path), "export", str(rep)])
    run = json.loads(out)["runs"][0]
    (fig,) = [f for f in run["figures"] if (f["side"], f["test"]) == ("guest", "seq-write-64k")]
    assert fig["samples"] == list(REPEATED_WRITE_GUEST) and (fig["low"], fig["high"]) == (s.low, s.high)
    assert sorted(m["repeat"] for m in run["measurements"] if (m["side"], m["test"]) == ("guest", "seq-write-64k")) \
        == list(range(1, 9))


# ---------------------------------------------------------------------------------------- another machine's file
@pytest.mark.parametrize("name", ["results-2026-12.db", "provenance-2026-11.db"])
def test_a_database_in_an_older_schema_is_read_without_being_changed(name, tmp_path, cli_run, isolated):
    """`results --db`, `study report --db` and `study compare` read an older cloudbox's file from an upgraded copy:
    the file's bytes, mode and neighbours (no -wal or -shm beside it) stay as they were."""
    old = tmp_path / "old" / name
    old.parent.mkdir()
    shutil.copyfile(Path(__file__).parent / "data" / name, old)
    old.chmod(0o644)
    digest = hashlib.sha256(old.read_bytes()).hexdigest()
    with sqlite3.connect(f"file:{old}?mode=ro", uri=True) as ro:
        assert int(ro.execute("PRAGMA user_version").fetchone()[0]) < SCHEMA_VERSION  # a file worth the test
    listed = cli_run(["results", "--db", str(old), "list"])
    assert listed.code == 0, listed.err
    assert len([ln for ln in listed.out.splitlines() if ln.strip()]) > 1, listed.out  # its runs were read
    assert cli_run(["results", "--db", str(old), "show", "1"]).code == 0
    assert cli_run(["study", "report", "a", "--db", str(old)]).code == 0
    assert cli_run(["study", "compare", "a", str(old), str(old)]).code in (0, 1)
    assert hashlib.sha256(old.read_bytes()).hexdigest() == digest
    assert sorted(p.name for p in old.parent.iterdir()) == [name] and (old.stat().st_mode & 0o777) == 0o644
    # a command that writes upgrades it in place, as before
    assert cli_run(["results", "--db", str(old), "delete", "1"]).code == 0
    with sqlite3.connect(f"file:{old}?mode=ro", uri=True) as ro:
        assert int(ro.execute("PRAGMA user_version").fetchone()[0]) == SCHEMA_VERSION


def test_a_database_that_is_not_one_is_named(tmp_path, cli_run, isolated):
    bad = tmp_path / "notes.db"
    bad.write_text("not a database\n" * 100)
    got = cli_run(["study", "compare", "a", str(bad), str(bad)])
    assert got.code == 1 and f"{bad}: cannot open the results database" in got.err, got.err
    assert bad.read_text() == "not a database\n" * 100
