"""Where each cell of a study's matrix stands (cellstates.cell_states), a study's counts (evidence.summarize), the
study run shared by `cloudbox study run` and the TUI (planning.prepare_run) and the report's cell text
(wording.ours_text), over runs recorded in a real results store through its own API."""

from __future__ import annotations

import platform

import pytest

from cloudbox.core.errors import UsageError
from cloudbox.core.record.results import ResultStore
from cloudbox.core.spec import profiles
from cloudbox.core.studies import cellstates, evidence, loading, markdown, planning, schema, verdicts, wording

T0 = 1_700_000_000.0


pytestmark = pytest.mark.usefixtures("isolated")


def record(store: ResultStore, profile: str, tests: dict[str, float], *, started_at: float, state: str = "completed",
           size: str = "study", accelerator: str = "kvm", suite: str = "storage", reason: str | None = None) -> int:
    prof = profiles.find_profile(profile)
    rid = store.create_run(profile_name=profile, profile_hash=prof.hash, suite=suite, size_label=size,
                           accelerator=accelerator, started_at=started_at, node=platform.node())
    for test, value in tests.items():
        store.add_measurement(rid, side="baseline", test=test, metric="MB/s", value=100.0)
        store.add_measurement(rid, side="guest", test=test, metric="MB/s", value=value)
    if state != "running":
        store.finish_run(rid, state, reason)
    return rid


def states(study: schema.Study) -> dict[tuple[str, str], cellstates.CellState]:
    with ResultStore() as store:
        stored = store.list_runs()
    ev = evidence.gather(study, [r for r in stored if r.state == "completed"])
    return {(c.profile, c.test): c for c in cellstates.cell_states(study, stored, ev.cells, unavailable=ev.unavailable)}


def test_every_cell_has_a_state_and_newer_runs_decide_it():
    a = loading.find_study("a")
    with ResultStore() as store:
        done = record(store, "eucalyptus-default", {"dd-write-64k": 2.0}, started_at=T0)
        failed = record(store, "virtio-disk", {}, started_at=T0, state="failed", reason="guest did not boot")
        older_failure = record(store, "kvm-scsi-phy", {}, started_at=T0 - 10, state="failed")
        scsi = record(store, "kvm-scsi-phy", {"dd-write-64k": 60.0}, started_at=T0)
        running = record(store, "eucalyptus-prealloc", {}, started_at=T0, state="running")
        everything = record(store, "virtio-file", {}, started_at=T0, state="failed", suite="all")
    s = states(a)
    assert len(s) == len(a.profiles) * len(a.tests)
    assert s[("eucalyptus-default", "dd-write-64k")].state == cellstates.DONE
    assert s[("eucalyptus-default", "dd-write-64k")].run_id == done
    assert s[("eucalyptus-default", "dd-read-64k")].state == cellstates.NOT_RUN
    assert s[("virtio-disk", "dd-write-64k")] == cellstates.CellState("virtio-disk", "dd-write-64k", cellstates.FAILED,
                                                                   run_id=failed, reason="guest did not boot")
    assert s[("virtio-disk", "tcp-stream")].state == cellstates.NOT_RUN  # a storage run does not measure it
    assert s[("kvm-scsi-phy", "dd-write-64k")].run_id == scsi  # the failure is older than the number
    assert s[("kvm-scsi-phy", "dd-read-64k")].run_id == older_failure
    assert s[("eucalyptus-prealloc", "dd-read-64k")].state == cellstates.RUNNING
    assert s[("eucalyptus-prealloc", "dd-read-64k")].run_id == running
    assert s[("virtio-file", "tcp-stream")].run_id == everything
    assert s[("virtio-file", "tcp-stream-fe")].state == cellstates.NOT_RUN  # it ran here, not on a back-end
    assert s[("xen-default", "dd-write-64k")].state == cellstates.CANNOT_RUN
    assert "Xen" in (s[("xen-default", "dd-write-64k")].reason or "")
    assert s[("eucalyptus-default", "tcp-stream-fe")].reason == "only a run on a back-end (--node) measures it"


def test_a_failed_rerun_keeps_the_stored_number_beside_it():
    a = loading.find_study("a")
    with ResultStore() as store:
        done = record(store, "eucalyptus-default", {"dd-write-64k": 2.0}, started_at=T0)
        again = record(store, "eucalyptus-default", {}, started_at=T0 + 10, state="aborted", reason="cancelled")
    c = states(a)[("eucalyptus-default", "dd-write-64k")]
    assert (c.state, c.run_id, c.reason) == (cellstates.FAILED, again, "cancelled")
    assert c.cell is not None and c.cell.run_id == done


def test_summary_counts_cells_with_results_and_findings():
    a = loading.find_study("a")
    with ResultStore() as store:
        record(store, "eucalyptus-default", {"dd-write-64k": 2.0, "dd-read-64k": 70.0}, started_at=T0)
        stored = store.list_runs(state="completed")
    s = evidence.summarize(evidence.gather(a, stored))
    assert (s.name, s.cells, s.with_results) == ("a", len(a.profiles) * len(a.tests), 2)
    assert s.findings == len(a.rules) and s.checked + s.verdicts[verdicts.INCONCLUSIVE] == s.findings
    assert s.reproduced <= s.checked


def test_ours_text_is_the_reports_with_its_labels():
    a = loading.find_study("a")
    with ResultStore() as store:
        record(store, "virtio-disk", {"dd-write-64k": 21.44}, started_at=T0, size="quick", accelerator="tcg")
        record(store, "kvm-scsi-phy", {"dd-write-64k": 60.0}, started_at=T0, accelerator="nested-kvm")
        stored = store.list_runs(state="completed")
    ev = evidence.gather(a, stored)
    assert wording.ours_text(ev.cells[("virtio-disk", "dd-write-64k")]) == "21.4 (emulated, quick)"
    assert wording.ours_text(ev.cells[("kvm-scsi-phy", "dd-write-64k")]) == "60.0 (nested)"
    report = markdown.to_markdown(ev)
    assert "| 21.4 (emulated, quick) |" in report and "| 60.0 (nested) |" in report
    assert wording.paper_text(a, "eucalyptus-default", "dd-write-64k") != "-"
    assert wording.paper_text(a, "eucalyptus-default", "tcp-stream-fe") == "-"


def test_prepare_run_plans_the_missing_cells_at_the_size_asked():
    a = planning.with_repeat_plan(loading.find_study("a"), "quick", repeats=1)  # `record` stores one sample
    with ResultStore() as store:
        stored_id = record(store, "eucalyptus-default", {"dd-write-64k": 2.0}, started_at=T0, size="quick")
        todo = planning.prepare_run(a, store.list_runs(state="completed"), size="quick")
    assert todo.size == "quick" and todo.node == "" and all(s.size == "quick" for s in todo.specs)
    assert todo.headline() == f"study a at quick size on this host: {len(todo.specs)} run(s) to do"
    default = next(s for s in todo.specs if s.profile == "eucalyptus-default")
    assert "dd-write-64k" not in default.storage_tests.split(",")
    assert f"  eucalyptus-default: run dd-read-64k, tcp-stream, tcp-maerts, one sample; stored dd-write-64k " \
           f"(#{stored_id}); " \
           "needs --node for tcp-stream-fe, tcp-maerts-fe" in todo.lines()
    assert not any(s.profile.startswith("xen") for s in todo.specs)
    assert planning.check_run(a, None) == "study"
    with pytest.raises(UsageError, match="not offered"):
        planning.check_run(a.model_copy(update={"sizes": ["study"]}), "quick")
