"""The SQLite results store: round trips, WAL, cross-process readers, events paging, dead executors."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from conftest_results import FIO_JSON, add_study_a_default, add_virtio_tcg, study_a_store

from cloudbox.core import db
from cloudbox.core.errors import CloudboxError, NotFound
from cloudbox.core.record import results, schema
from cloudbox.core.record.provenance import Controller, Provenance, Versions
from cloudbox.core.record.results import ResultStore
from cloudbox.core.record.schema import SCHEMA_VERSION

SRC = str(Path(results.__file__).resolve().parents[3])


@pytest.fixture
def store(tmp_path: Path):
    with ResultStore(tmp_path / "results.db") as s:
        yield s


def _count(db: Path, table: str, run_id: int) -> int:
    with sqlite3.connect(db) as c:
        return c.execute(f"SELECT COUNT(*) FROM {table} WHERE run_id = ?", (run_id,)).fetchone()[0]


def test_round_trip_run_and_measurements(tmp_path: Path):
    db = tmp_path / "results.db"
    with ResultStore(db) as store:
        rid = add_study_a_default(store)
    with ResultStore(db) as store:  # a fresh connection reads what the first one committed
        run = store.get_run(rid)
    assert run.profile_name == "study-a-default"
    assert run.suite == "all" and run.size_label == "study" and run.size_bytes == 20 * 2**30
    assert run.state == "completed" and run.finished_at is not None and run.reason is None
    assert run.accelerator == "kvm" and run.emulated is False
    assert run.node == "node1" and run.pid == os.getpid()
    assert run.provenance.backing is not None and run.provenance.backing.kind == "sparse-file"
    assert run.provenance.versions is not None and run.provenance.versions.fio == "3.33"
    assert "<controller type='scsi'" in (run.provenance.domain_xml or "")
    m = run.measurement("guest", "seq-write-64k", "MB/s")
    assert m is not None
    assert (m.value, m.host_avgrq_sectors, m.host_avgqu, m.host_util) == (1.3, 30, 0.9, 90)
    assert json.loads(m.raw or "") == FIO_JSON
    assert run.value("baseline", "seq-write-64k", "MB/s") == 111.0
    assert run.tests()[:2] == ["seq-write-64k", "dd-write-64k"]
    assert len(run.uuid) == 36


def test_wal_mode_and_pragmas(store: ResultStore):
    assert store.journal_mode == "wal"
    assert store.schema_version == SCHEMA_VERSION
    conn = store._conn
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 5000
    store.create_run(profile_name="p")
    assert store.path.with_name("results.db-wal").exists()
    # WAL is persistent: a plain sqlite3 connection sees it too
    with sqlite3.connect(store.path) as c:
        assert c.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert c.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_default_path_follows_state_dir(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("CLOUDBOX_STATE_DIR", str(tmp_path / "state" / "nested"))
    with ResultStore() as s:
        assert s.path == tmp_path / "state" / "nested" / "results.db"
        assert s.path.exists()


def test_migration_from_empty_and_refuses_newer(tmp_path: Path):
    db = tmp_path / "old.db"
    sqlite3.connect(db).close()  # user_version 0, no tables
    with ResultStore(db) as s:
        assert s.schema_version == SCHEMA_VERSION
        s.create_run(profile_name="x")
    with ResultStore(db) as s:  # re-opening does not re-run migrations
        assert len(s.list_runs()) == 1
    newer = tmp_path / "newer.db"
    with sqlite3.connect(newer) as c:
        c.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(CloudboxError, match="newer|upgrade cloudbox"):
        ResultStore(newer)


def test_schema_1_database_upgrades_in_place_keeping_runs_and_measurements(tmp_path: Path):

    db = tmp_path / "v1.db"
    with sqlite3.connect(db) as c:  # a database as cloudbox 0.1 (schema 1) left it
        schema._migrate_0_to_1(c)
        c.execute("PRAGMA user_version = 1")
        c.execute("INSERT INTO runs (id, uuid, suite, state) VALUES (7, 'u7', 'storage', 'completed')")
        c.execute("INSERT INTO measurements (run_id, side, test, metric, value) VALUES (7, 'guest', 't', 'MB/s', 5)")
        c.execute("INSERT INTO events (run_id, seq, t, kind) VALUES (7, 1, 0, 'state')")
        with pytest.raises(sqlite3.IntegrityError):
            c.execute("INSERT INTO runs (uuid, suite) VALUES ('g', 'guest')")  # schema 1 refuses guest sessions
    with ResultStore(db) as s:
        assert s.schema_version == SCHEMA_VERSION == 6
        run = s.get_run(7)
        assert run.value("guest", "t", "MB/s") == 5 and len(s.events_since(7)) == 1
        m = run.measurements[0]
        assert (m.instance, m.repeat, m.boot, m.iteration) == (None, 1, 1, 1)
        gid = s.create_run(suite="guest")
        assert s.get_run(gid).suite == "guest"
    with sqlite3.connect(db) as c:
        assert c.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert c.execute("PRAGMA foreign_key_check").fetchall() == []
        with pytest.raises(sqlite3.IntegrityError):  # the CHECK still refuses what is not a suite
            c.execute("INSERT INTO runs (uuid, suite) VALUES ('b', 'bogus')")


CURRENT = Path(__file__).parent / "data" / "results-2026-12.db"


def test_a_store_written_by_the_previous_release_reads_back_unchanged(tmp_path: Path):
    """data/results-2026-12.db was written by the release before the store was split into schema, rows and store
    (commit 18855e2), and data/results-2026-12.json is what that release read from it: runs with their provenance
    and every measurement (raw output, labels, instances), samples and events. This release reads the same, and
    builds the same tables for the same schema version."""
    expected = json.loads(CURRENT.with_suffix(".json").read_text())
    copy = tmp_path / "results.db"
    copy.write_bytes(CURRENT.read_bytes())  # opening it sets WAL mode: never on the committed file
    with ResultStore(copy) as s:
        assert expected["user_version"] == 4 and s.schema_version == SCHEMA_VERSION
        # every sample it held is its figure's only one: repeat 1 of boot 1; none has a latency histogram
        once = {"repeat": 1, "boot": 1, "iteration": 1, "clat_hist": None}
        for run in expected["runs"]:
            run["measurements"] = [{**m, **once} for m in run["measurements"]]
        assert [s.get_run(i).as_dict(raw=True) for i in s.run_ids()] == expected["runs"]
        for i in s.run_ids():
            assert [dataclasses.asdict(x) for x in s.samples(i)] == expected["samples"][str(i)], i
            assert [[e.seq, e.t, e.kind, e.payload] for e in s.events_since(i)] == expected["events"][str(i)], i
    fresh = tmp_path / "fresh.db"
    with sqlite3.connect(fresh) as c:
        db.migrate(c, expected["user_version"], schema.MIGRATIONS, "fresh")
    tables = "SELECT type, name, sql FROM sqlite_master ORDER BY name"
    with sqlite3.connect(f"file:{CURRENT}?mode=ro", uri=True) as old, sqlite3.connect(fresh) as new:
        assert new.execute(tables).fetchall() == old.execute(tables).fetchall()
    # upgraded, it has the tables a database made today has
    today = tmp_path / "today.db"
    with ResultStore(today):
        pass
    with sqlite3.connect(copy) as upgraded, sqlite3.connect(today) as new:
        assert upgraded.execute(tables).fetchall() == new.execute(tables).fetchall()
        assert upgraded.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_not_a_database_is_a_cloudbox_error(tmp_path: Path):
    bad = tmp_path / "results.db"
    bad.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(CloudboxError, match="cannot open the results database"):
        ResultStore(bad)


def test_emulated_is_forced_for_tcg_and_nested(store: ResultStore):
    tcg = store.create_run(accelerator="tcg")
    nested = store.create_run(accelerator="nested-kvm", emulated=False)
    kvm = store.create_run(accelerator="kvm")
    xen_flagged = store.create_run(accelerator="xen", emulated=True)
    assert store.get_run(tcg).emulated and store.get_run(nested).emulated
    assert not store.get_run(kvm).emulated
    assert store.get_run(xen_flagged).emulated
    store.update_run(kvm, accelerator="tcg")  # fell back after the probe
    assert store.get_run(kvm).emulated
    mid = store.add_measurement(tcg, side="guest", test="seq-write-64k", metric="MB/s", value=5.0,
                                labels=["quick-size"])
    m = store.get_run(tcg).measurements[0]
    assert m.id == mid and m.labels == ["quick-size", "emulated"]


def test_update_run_and_validation(store: ResultStore):
    rid = store.create_run(profile_name="p", suite="storage")
    store.update_run(rid, size_bytes=123, size_label="custom")
    store.set_provenance(rid, Provenance(guest_kernel="6.12", versions=Versions(fio="3.33")))
    run = store.get_run(rid)
    assert run.size_bytes == 123 and run.size_label == "custom"
    assert run.provenance == Provenance(guest_kernel="6.12", versions=Versions(fio="3.33"))
    assert run.as_dict()["provenance"] == {"guest_kernel": "6.12", "versions": {
        "cloudbox": "", "qemu": "", "libvirt": "", "hypervisor": "", "fio": "3.33", "netperf": "", "iperf3": "",
        "guest_packages": {}}}
    with pytest.raises(ValueError, match="set_provenance"):
        store.update_run(rid, provenance=Provenance())
    with pytest.raises(ValueError, match="unknown run field"):
        store.update_run(rid, colour="red")
    with pytest.raises(ValueError, match="suite"):
        store.create_run(suite="disk")
    with pytest.raises(ValueError, match="side"):
        store.add_measurement(rid, side="host", test="t", metric="MB/s", value=1)
    with pytest.raises(ValueError, match="state"):
        store.finish_run(rid, "running")
    with pytest.raises(ValueError, match="kind"):
        store.add_event(rid, "chatter", {})


def test_finish_run_appends_final_state_event(store: ResultStore):
    rid = store.create_run(profile_name="p")
    store.add_event(rid, "step", {"name": "boot guest"})
    store.finish_run(rid, "aborted", "cancelled by user")
    run = store.get_run(rid)
    assert run.state == "aborted" and run.reason == "cancelled by user" and run.finished_at
    events = store.events_since(rid)  # create_run emits nothing; finish_run the final state
    assert [(e.seq, e.kind) for e in events] == [(1, "step"), (2, "state")]
    assert events[-1].payload == {"state": "aborted", "reason": "cancelled by user"}


def test_events_and_finish_at_given_times(store: ResultStore):
    """Recorded runs (demo data, imports) keep their own clock: events and the end at the times given."""
    rid = store.create_run(profile_name="p", started_at=1_700_000_000.0)
    store.add_event(rid, "step", {"text": "a"}, t=1_700_000_001.5)
    store.add_event(rid, "log", {"text": "b"})  # default: now
    store.finish_run(rid, "completed", finished_at=1_700_000_042.0)
    run = store.get_run(rid)
    assert run.finished_at == 1_700_000_042.0 and run.duration == 42.0
    first, second, last = store.events_since(rid)
    assert first.t == 1_700_000_001.5
    assert abs(second.t - time.time()) < 60
    assert (last.kind, last.t) == ("state", 1_700_000_042.0)


def test_events_since_paging(store: ResultStore):
    rid = store.create_run(profile_name="p")
    store.add_event(rid, "state", {"state": "running"})
    seqs = [store.add_event(rid, "progress", {"i": i, "pct": i * 4}) for i in range(25)]
    assert seqs == list(range(2, 27))
    got, after = [], 0
    pages = []
    while True:
        page = store.events_since(rid, after, limit=10)
        if not page:
            break
        pages.append(len(page))
        got += page
        after = page[-1].seq
    assert pages == [10, 10, 6]
    assert [e.seq for e in got] == list(range(1, 27))
    assert got[5].payload == {"i": 4, "pct": 16} and got[5].kind == "progress"
    assert store.events_since(rid, 26) == []
    assert store.last_seq(rid) == 26
    other = store.create_run(profile_name="q")
    assert store.events_since(other) == [] and store.last_seq(other) == 0
    assert store.add_event(other, "log", {"text": "x"}) == 1  # seq counts per run
    assert store.events_since(9999) == []
    with pytest.raises(NotFound):
        store.add_event(9999, "log", {"line": "x"})


READER = textwrap.dedent("""
    import json, sys, time
    sys.path.insert(0, {src!r})
    from cloudbox.core.record.results import ResultStore
    store = ResultStore({db!r})
    run_id, want = int(sys.argv[1]), int(sys.argv[2])
    print("ready", flush=True)
    seen, after, deadline = [], 0, time.time() + 30
    while len(seen) < want and time.time() < deadline:
        for e in store.events_since(run_id, after):
            seen.append([e.seq, e.kind, e.payload])
            after = e.seq
        time.sleep(0.02)
    print(json.dumps({{"seen": seen, "state": store.get_run(run_id).state}}), flush=True)
""")


def test_reader_process_sees_events_while_writer_connection_is_open(tmp_path: Path):
    db = tmp_path / "results.db"
    writer = ResultStore(db)
    rid = writer.create_run(profile_name="live", accelerator="tcg")
    writer.add_event(rid, "state", {"state": "running"})
    script = READER.format(src=SRC, db=str(db))
    proc = subprocess.Popen([sys.executable, "-c", script, str(rid), "21"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        for i in range(20):  # the writer keeps its connection open throughout
            writer.add_event(rid, "sample", {"write_mbps": 100.0 + i})
            time.sleep(0.01)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    result = json.loads(out.strip().splitlines()[-1])
    assert [s[0] for s in result["seen"]] == list(range(1, 22))
    assert result["seen"][-1] == [21, "sample", {"write_mbps": 119.0}]
    assert result["state"] == "running"
    writer.close()


WRITER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {src!r})
    from cloudbox.core.record.results import ResultStore
    with ResultStore({db!r}) as store:
        for i in range(40):
            store.add_event(int(sys.argv[1]), "log", {{"who": sys.argv[2], "i": i}})
""")


def test_concurrent_writers_get_unique_gapless_seqs(tmp_path: Path):
    db = tmp_path / "results.db"
    with ResultStore(db) as store:
        rid = store.create_run(profile_name="p")
        script = WRITER.format(src=SRC, db=str(db))
        procs = [subprocess.Popen([sys.executable, "-c", script, str(rid), name]) for name in ("a", "b")]
        # and a thread in this process, sharing this store's connection
        t = threading.Thread(
            target=lambda: [store.add_event(rid, "log", {"who": "t", "i": i}) for i in range(40)]
        )
        t.start()
        for p in procs:
            assert p.wait(timeout=60) == 0
        t.join()
        events = store.events_since(rid, 0, limit=10_000)
    assert [e.seq for e in events] == list(range(1, 121))
    assert sorted(e.payload["who"] for e in events).count("b") == 40


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_reap_dead_runs(store: ResultStore):
    dead = store.create_run(profile_name="crashed", pid=_dead_pid())
    alive = store.create_run(profile_name="live")  # pid = this process
    recycled = store.create_run(profile_name="recycled", pid=os.getpid(), started_at=time.time() - 10**7)
    remote = store.create_run(profile_name="remote", pid=_dead_pid(), node="some-other-host")
    done = store.create_run(profile_name="done", pid=_dead_pid())
    store.finish_run(done, "completed")

    assert {r.id for r in store.active_runs()} == {alive, remote}
    assert {r.id for r in store.dead_runs()} == {dead, recycled}
    store.add_event(dead, "step", {"text": "guest: storage tests"}, t=1_700_000_000.0)
    store.add_measurement(dead, side="baseline", test="seq-write-64k", metric="MB/s", value=12.5)
    reaped = store.reap_dead_runs()
    assert {r.id for r in reaped} == {dead, recycled}
    for rid in (dead, recycled):
        run = store.get_run(rid)
        assert run.state == "aborted" and run.reason.startswith("executor killed") and run.finished_at
        assert store.events_since(rid)[-1].payload == {"state": "aborted", "reason": run.reason}
    seen = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(1_700_000_000.0))
    run = store.get_run(dead)
    assert run.reason == (f"executor killed: executor pid {run.pid} gone, last seen {seen} during 'guest: storage "
                          "tests'"), run.reason
    assert run.measurement("baseline", "seq-write-64k", "MB/s").value == 12.5  # its figures stay
    assert "last seen" in store.get_run(recycled).reason  # never wrote an event: its start
    assert store.get_run(done).state == "completed"
    assert store.reap_dead_runs() == []
    assert store.get_run(alive).state == "running"


def test_pid_alive():
    assert results.pid_alive(os.getpid())
    assert results.pid_alive(os.getpid(), since=time.time())
    assert not results.pid_alive(os.getpid(), since=time.time() - 10**7)  # started after its run: recycled
    assert not results.pid_alive(_dead_pid())
    assert not results.pid_alive(None) and not results.pid_alive(0)
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.time() + 10
    while Path(f"/proc/{zombie.pid}/stat").read_text().split(") ")[1][0] != "Z" and time.time() < deadline:
        time.sleep(0.01)
    assert not results.pid_alive(zombie.pid)  # exited but not yet waited for
    zombie.wait()
    other = subprocess.Popen(["sleep", "30"])  # alive, but not a python/cloudbox executor: recycled pid
    try:
        deadline = time.time() + 10  # until the forked child has exec'd sleep
        while b"sleep" not in Path(f"/proc/{other.pid}/cmdline").read_bytes() and time.time() < deadline:
            time.sleep(0.01)
        assert not results.pid_alive(other.pid)
    finally:
        other.kill()
        other.wait()


def test_list_runs_filters_and_order(tmp_path: Path):
    store, default, virtio = study_a_store(tmp_path / "r.db")
    running = store.create_run(profile_name="virtio-phy")  # started now: newest
    with store:
        assert [r.id for r in store.list_runs()] == [running, virtio, default]
        assert [r.id for r in store.list_runs(limit=2)] == [running, virtio]
        assert [r.id for r in store.list_runs(state="completed")] == [virtio, default]
        assert [r.id for r in store.list_runs(profile="virtio-phy")] == [running, virtio]
        assert [r.id for r in store.list_runs(state="running", profile="study-a-default")] == []
        listed = store.list_runs(state="completed")[1]
        assert listed.measurements and all(m.raw is None for m in listed.measurements)
        assert [r.id for r in store.active_runs()] == [running]


def test_samples(store: ResultStore):
    rid = store.create_run(profile_name="p")
    store.add_samples(rid, [
        {"t": 1.0, "device": "sdb", "test": "seq-write-64k", "write_mbps": 110.0, "avgrq_sectors": 1024.0,
         "avgqu": 140.0, "util": 100.0},
        {"t": 2.0, "device": "sdb", "test": "seq-read-64k", "read_mbps": 108.0, "avgrq_kb": 256.0},
    ])
    s = store.samples(rid)
    assert [x.t for x in s] == [1.0, 2.0]
    assert s[0].avgrq_kb == 512.0 and s[1].avgrq_sectors == 512.0
    assert [x.test for x in store.samples(rid, test="seq-read-64k")] == ["seq-read-64k"]
    assert [x.t for x in store.samples(rid, since=1.5)] == [2.0]
    with pytest.raises(ValueError, match="unknown sample field"):
        store.add_samples(rid, [{"t": 3.0, "iops": 5}])


def test_delete_run_cascades(tmp_path: Path):
    store, default, virtio = study_a_store(tmp_path / "r.db")
    db = store.path
    assert _count(db, "samples", default) == 5
    with store:
        store.delete_run(default)
        with pytest.raises(NotFound):
            store.get_run(default)
        assert [r.id for r in store.list_runs()] == [virtio]
    for table in ("measurements", "samples", "events"):
        assert _count(db, table, default) == 0
    assert _count(db, "measurements", virtio) == 4


def test_not_found_message_lists_newest_ids(tmp_path: Path):
    with ResultStore(tmp_path / "r.db") as store:
        with pytest.raises(NotFound, match="holds no runs yet"):
            store.get_run(1)
        ids = [store.create_run(profile_name=f"p{i}") for i in range(7)]
        with pytest.raises(NotFound) as exc:
            store.get_run(42)
        msg = str(exc.value)
        assert "no run 42" in msg and str(store.path) in msg
        assert "newest runs: " + ", ".join(map(str, reversed(ids[-5:]))) in msg
        for call in (lambda: store.update_run(42, reason="x"), lambda: store.finish_run(42, "failed"),
                     lambda: store.delete_run(42), lambda: store.add_measurement(
                         42, side="guest", test="t", metric="MB/s", value=1.0)):
            with pytest.raises(NotFound, match="no run 42"):
                call()


def test_resolve_by_id_and_uuid_prefix(store: ResultStore):
    rid = add_virtio_tcg(store)
    run = store.get_run(rid)
    assert store.resolve(str(rid)) == rid
    assert store.resolve(rid) == rid
    assert store.resolve(run.uuid) == rid
    assert store.resolve(run.uuid[:8]) == rid
    hexed = store.create_run(uuid="1234abcd" * 4)  # the executor stores uuid4().hex: prefixes may be digits
    assert store.resolve("1234") == hexed and store.resolve(str(hexed)) == hexed
    with pytest.raises(NotFound):
        store.resolve("zzzz")
    with pytest.raises(NotFound):
        store.resolve("999")


def test_core_never_imports_textual():
    code = (f"import sys; sys.path.insert(0, {SRC!r}); "
            "import cloudbox.core.record.results, cloudbox.core.views.compare; print('textual' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_a_locked_database_is_a_cloudbox_error(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(db, "BUSY_TIMEOUT_MS", 200)
    with ResultStore(tmp_path / "r.db") as store:
        rid = store.create_run(profile_name="p")
        store._conn.execute("PRAGMA busy_timeout = 200")
        other = sqlite3.connect(store.path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another writer holds the lock past busy_timeout
        try:
            with pytest.raises(CloudboxError, match="cannot write to the results database: .*locked"):
                store.add_event(rid, "log", {"text": "x"})
            assert store.events_since(rid) == []  # readers are not blocked by a writer (WAL)
        finally:
            other.execute("ROLLBACK")
            other.close()
        assert store.add_event(rid, "log", {"text": "x"}) == 1  # the store is still usable


def test_a_node_run_mirrored_here_is_reaped_when_its_executor_here_dies(store: ResultStore):
    """A run on an enrolled node (node = the back-end) is executed by this host when this host is its controller:
    a dead executor here must not leave it 'running' forever; a run controlled elsewhere is left alone."""
    here = Provenance(controller=Controller(host=platform.node()))
    mine = store.create_run(profile_name="on-node", pid=_dead_pid(), node="be1", provenance=here)
    theirs = store.create_run(profile_name="elsewhere", pid=_dead_pid(), node="be1",
                              provenance=Provenance(controller=Controller(host="another-front-end")))
    assert {r.id for r in store.reap_dead_runs()} == {mine}
    assert store.get_run(theirs).state == "running"


def test_follow_streams_every_event_until_the_run_ends(store: ResultStore):
    rid = store.create_run(profile_name="p")
    store.add_event(rid, "step", {"text": "one"})
    store.add_event(rid, "step", {"text": "two"})
    store.finish_run(rid, "completed")
    evs = list(store.follow(rid, poll=0.01))
    assert [e.kind for e in evs] == ["step", "step", "state"] and evs[-1].payload["state"] == "completed"
    assert [e.payload.get("text") for e in store.follow(rid, after_seq=1, poll=0.01)][:1] == ["two"]
    dead = store.create_run(profile_name="d", pid=_dead_pid())
    store.add_event(dead, "step", {"text": "x"})
    assert [e.kind for e in store.follow(dead, poll=0.01)] == ["step", "state"]  # reaped on the way: it ends


def test_a_write_cut_by_a_signal_leaves_no_open_transaction(store: ResultStore):
    """The executor turns SIGINT/SIGTERM into an exception raised wherever Python is: between BEGIN and the
    try, or just before COMMIT. Found by test_ctrl_c_in_foreground_cli: the run's final state then failed with
    "cannot start a transaction within a transaction". Signals every 50 us, each raising, for 1.5 s of writes and
    reads: each is cut somewhere, and afterwards the store still writes, with only whole events in it."""
    import signal

    class Cut(Exception):
        pass

    armed = [False]

    def cut(_signum, _frame):
        if armed[0]:  # one cut per attempt, and only inside it (not in pytest's own code)
            armed[0] = False
            raise Cut

    rid = store.create_run(profile_name="p", suite="storage")
    old = signal.signal(signal.SIGALRM, cut)
    cuts = attempts = 0
    deadline = time.monotonic() + 1.5
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.00005, 0.00005)
        while time.monotonic() < deadline:
            attempts += 1
            try:
                armed[0] = True
                store.add_event(rid, "log", {"text": "x" * 64})
                store.events_since(rid, 0, limit=5)
                armed[0] = False
            except Cut:
                cuts += 1
            except CloudboxError as e:  # the bug: a transaction left open by an earlier cut
                armed[0] = False
                pytest.fail(f"after {cuts} cuts in {attempts} attempts: {e}")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert cuts > 100, (cuts, attempts)  # the cuts did land
    seq = store.add_event(rid, "log", {"text": "after"})
    events = store.events_since(rid, 0, limit=100000)
    assert events[-1].seq == seq and events[-1].payload == {"text": "after"}
    assert all(e.payload.get("text") in ("x" * 64, "after") for e in events if e.kind == "log")
    assert [e.seq for e in events] == list(range(1, len(events) + 1))  # gapless: no half-written event
