"""Host facts read from the real system, the active profile, and the run kinds the TUI adds: guest sessions
(suite "guest") and sweeps (several profiles one after another), the latter two against the real libvirtd."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from cloudbox.cli import main
from cloudbox.core import host, profiles, runner
from cloudbox.core.errors import NotFound
from cloudbox.core.results import ResultStore


def test_gather_reads_this_hosts_disks_and_nics(state, monkeypatch, tmp_path):
    monkeypatch.setenv("CLOUDBOX_NODE_CONFIG", str(tmp_path / "absent.toml"))
    f = host.gather(probe=False)
    assert f.role == "all-in-one" and "not installed" in f.role_source
    assert f.disks, "lsblk found no disk"
    assert all(d.size_bytes > 0 for d in f.disks)
    names = {n.name for n in f.nics}
    assert "lo" not in names and all(n.mtu >= 68 for n in f.nics)
    assert f.nodes[0].name == f.hostname and f.nodes[0].state == "up"


def test_role_comes_from_the_node_settings_file(monkeypatch, tmp_path):
    cfg = tmp_path / "node.toml"
    monkeypatch.setenv("CLOUDBOX_NODE_CONFIG", str(cfg))
    cfg.write_text('role = "back-end"\n')
    assert host.role() == ("back-end", str(cfg))
    cfg.write_text('role = "controller"\n')
    r, src = host.role()
    assert r == "all-in-one" and "'controller' is not one of front-end, back-end, all-in-one" in src


def test_active_profile_defaults_switches_and_survives_a_deleted_profile(state, capsys):
    assert profiles.active_profile_name() == profiles.DEFAULT_ACTIVE
    with pytest.raises(NotFound, match="no profile named 'nope'"):
        profiles.set_active_profile("nope")
    assert main(["profile", "use", "kvm-cache-none"]) == 0
    assert "active profile: kvm-cache-none" in capsys.readouterr().out
    assert main(["profile", "list"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("kvm-cache-none "))
    assert line.endswith("[active]")
    assert main(["profile", "list", "--json"]) == 0
    assert [e["name"] for e in json.loads(capsys.readouterr().out) if e["active"]] == ["kvm-cache-none"]
    data = profiles.find_profile("virtio-disk").model_dump()
    data["name"] = "gone-soon"
    path = profiles.save_user_profile(profiles.validate_data(data, "test"))
    profiles.set_active_profile("gone-soon")
    path.unlink()
    assert profiles.active_profile_name() == profiles.DEFAULT_ACTIVE


def test_run_plan_lists_every_step_in_order():
    spec = runner.RunSpec(profile="virtio-disk", suite="all", storage_tests="smoke", net_tests="netperf")
    plan = spec.plan()
    assert plan[:3] == ["baseline:seq-write-64k", "baseline:seq-read-64k", "baseline:randread-4k-qd32"]
    assert plan[3] == "guest:boot" and plan[-2:] == ["guest:tcp-rr", "baseline:tcp-rr"]
    assert runner.RunSpec(profile="x", suite="guest").plan() == ["guest:boot"]


@pytest.mark.parametrize("bad", [0, 9.5, 3601, -1])
def test_agent_timeout_out_of_range_is_refused(bad):
    from cloudbox.core.errors import CloudboxError

    with pytest.raises(CloudboxError, match=rf"--agent-timeout {bad:g} is not allowed; allowed: 10 to 3600 seconds"):
        runner.RunSpec(profile="virtio-disk", agent_timeout=bad).validate()
    runner.RunSpec(profile="virtio-disk", agent_timeout=10).validate()
    runner.RunSpec(profile="virtio-disk", agent_timeout=3600).validate()


def test_sweep_needs_a_profile_and_valid_specs(state):
    from cloudbox.core.errors import CloudboxError

    with ResultStore() as store:
        with pytest.raises(CloudboxError, match="at least one profile"):
            runner.start_sweep([], store)
        with pytest.raises(CloudboxError, match="--suite 'bogus' is not allowed"):
            runner.start_sweep([runner.RunSpec(profile="virtio-disk", suite="bogus")], store)
    assert runner.list_sweeps() == []


# -- real guests ---------------------------------------------------------------------------------------------
def _wait(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@pytest.mark.slow
@pytest.mark.root
def test_guest_session_runs_until_cancelled_then_cleans_up(state, libvirt_conn):
    from cloudbox.core.guest import list_guests

    with ResultStore() as store:
        rid = runner.start_detached(runner.RunSpec(profile="virtio-disk", suite="guest"), store)
        try:
            _wait(lambda: any("running; stop it" in (e.payload.get("text") or "") for e in store.events_since(rid)),
                  240, "the guest session to come up")
            (g,) = [g for g in list_guests(libvirt_conn) if g.run_uuid == store.get_run(rid).uuid]
            assert g.state == "running" and g.uptime() is not None and g.uptime() < 600
            time.sleep(2)
            assert store.get_run(rid).state == "running"  # it holds: no tests, no end of its own
        finally:
            state_after = runner.cancel(store, rid, timeout=120)
        run = store.get_run(rid)
        assert state_after == "completed" and run.reason.startswith("guest stopped (cancelled by SIGTERM")
        assert run.measurements == []
    assert not list_guests(libvirt_conn)
    work = Path(os.environ["CLOUDBOX_STATE_DIR"]) / "work"
    assert not work.exists() or not list(work.glob("*"))


@pytest.mark.slow
@pytest.mark.root
def test_sweep_runs_profiles_one_after_another_and_cancel_skips_the_rest(state, libvirt_conn):
    spec = dict(suite="storage", size="16M", storage_tests="dd-write-64k")
    with ResultStore() as store:
        sweep = runner.start_sweep([runner.RunSpec(profile=p, **spec) for p in ("virtio-disk", "virtio-file")],
                                   store)
        done = _wait(lambda: next((s for s in runner.list_sweeps() if s.id == sweep.id and s.state != "running"),
                                  None), 420, "the sweep to finish")
        assert done.state == "completed" and None not in done.runs
        runs = [store.get_run(r) for r in done.runs]
        assert [r.profile_name for r in runs] == ["virtio-disk", "virtio-file"]
        assert all(r.state == "completed" for r in runs), [(r.state, r.reason) for r in runs]
        assert runs[0].finished_at <= runs[1].started_at + 1  # one after the other, not at once
        # a sweep of three, cancelled during its first item: the rest never starts. The first item is a guest
        # session, which holds until cancelled, so the cancel cannot race the end of a short run.
        specs = [runner.RunSpec(profile="virtio-disk", suite="guest"),
                 *[runner.RunSpec(profile="virtio-disk", **spec)] * 2]
        sweep2 = runner.start_sweep(specs, store)
        first = _wait(lambda: next((s.runs[0] for s in runner.list_sweeps() if s.id == sweep2.id), None), 60,
                      "the first run of the second sweep")
        _wait(lambda: any("running; stop it" in (e.payload.get("text") or "") for e in store.events_since(first)),
              240, "the sweep's guest session to come up")
        assert runner.cancel(store, first, timeout=120) == "completed"  # a stopped session ends normally
        final = _wait(lambda: next((s for s in runner.list_sweeps() if s.id == sweep2.id and s.state != "running"),
                                   None), 60, "the second sweep to stop")
        assert final.state == "cancelled" and final.runs[1:] == [None, None]
