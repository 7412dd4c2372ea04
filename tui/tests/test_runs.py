"""Starting runs (core.run.runs): the detached executor's process (`python -m cloudbox.core.run.runs`) and the sweep
files
it and the TUI read. No guest is booted here."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from cloudbox.core import paths
from cloudbox.core.errors import NotFound
from cloudbox.core.record.results import ResultStore
from cloudbox.core.run import runs
from cloudbox.core.spec.runspec import RunSpec


def test_a_detached_executor_is_its_own_process_and_reports_there(state):
    """An executor whose spec its cloudbox cannot read ends at once, saying why on its output (the run's log)."""
    with ResultStore() as store:
        rid = store.create_run(profile_name="p", suite="storage")
        proc = subprocess.run([sys.executable, "-m", runs.ENTRY, str(rid), json.dumps({"profile": "p", "colour": 1})],
                              capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "unknown run setting(s) colour" in proc.stderr and "the detached executor's argument" in proc.stderr


def test_a_sweep_file_this_cloudbox_cannot_read_is_passed_over(state):
    good = runs.Sweep("sweep-1", [RunSpec(profile="virtio-disk")], [None], state="completed", started_at=1.0)
    good.save()
    (runs.sweeps_dir() / "sweep-2.json").write_text(json.dumps({"id": "sweep-2", "specs": [{"profile": "x",
                                                                                           "colour": 1}],
                                                                 "runs": [None]}))
    (runs.sweeps_dir() / "sweep-3.json").write_text("{not json")
    assert [s.id for s in runs.list_sweeps()] == ["sweep-1"]
    assert runs.list_sweeps()[0].specs == good.specs


def test_a_sweep_that_never_recorded_its_process_counts_as_died(state):
    sw = runs.Sweep("sweep-old", [RunSpec(profile="virtio-disk")], [None], started_at=time.time() - 3600)
    sw.save()
    (died,) = runs.list_sweeps()
    assert died.state == "died" and died.queued == 0
    assert (paths.state_dir() / "sweeps" / "sweep-old.json").is_file()


def test_cancelling_a_finished_run_changes_nothing(state):
    with ResultStore() as store:
        rid = store.create_run(profile_name="p")
        store.finish_run(rid, "completed")
        assert runs.cancel(store, rid) == "completed"
        other = store.create_run(profile_name="p", pid=0)
        with pytest.raises(Exception, match=f"run {other} has no executor pid recorded"):
            runs.cancel(store, other)


def test_cancel_never_signals_a_process_that_took_a_dead_executors_pid(state):
    """A run whose executor died (a reboot) keeps its pid, which another program may have by now: cancel finds the
    executor gone, stores the run aborted and leaves that program alone."""
    stranger = subprocess.Popen(["sleep", "60"])
    try:
        with ResultStore() as store:
            rid = store.create_run(profile_name="p", pid=stranger.pid)
            assert runs.cancel(store, rid, timeout=2) == "aborted"
            assert "executor killed" in (store.get_run(rid).reason or "")
        time.sleep(0.2)
        assert stranger.poll() is None  # not signalled
    finally:
        stranger.kill()
        stranger.wait()


def test_cancel_of_a_run_another_host_executes_names_that_host(state):
    from cloudbox.core.record.provenance import Controller, Provenance

    me = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # a pid that looks like ours
    try:
        with ResultStore() as store:
            rid = store.create_run(profile_name="p", pid=me.pid, node="be7")
            store.set_provenance(rid, Provenance(controller=Controller(host="fe7")))
            with pytest.raises(Exception, match=f"run {rid} is executed by fe7, not by this host: cancel it on fe7"):
                runs.cancel(store, rid, timeout=2)
            assert store.get_run(rid).state == "running"
        assert me.poll() is None
    finally:
        me.kill()
        me.wait()


def test_a_profile_that_does_not_exist_is_refused_before_a_detached_run_is_recorded(state):
    """As a run in the foreground is: not a run that starts, then fails as a dead executor."""
    with ResultStore() as store:
        with pytest.raises(NotFound, match="no profile named 'no-such-profile'; known profiles: .*virtio-disk"):
            runs.start_detached(RunSpec(profile="no-such-profile"), store)
        with pytest.raises(NotFound, match="no profile named 'no-such-profile'"):
            runs.start_sweep([RunSpec(profile="virtio-disk"), RunSpec(profile="no-such-profile")], store)
        assert store.list_runs() == []
    assert runs.list_sweeps() == []
