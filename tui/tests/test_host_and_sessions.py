"""Host facts read from the real system, the active profile, and the run kinds the TUI adds: guest sessions
(suite "guest") and sweeps (several profiles one after another), the latter two against the real libvirtd."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from guest_session import wait_up

from cloudbox.cli import main
from cloudbox.core.errors import NotFound
from cloudbox.core.record.results import ResultStore
from cloudbox.core.run import runs
from cloudbox.core.spec import addresses, nodeconf, profiles
from cloudbox.core.spec.runspec import PlanStep, RunSpec
from cloudbox.core.views import host


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
    assert nodeconf.role() == ("back-end", str(cfg))
    cfg.write_text('role = "controller"\n')
    r, src = nodeconf.role()
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
    spec = RunSpec(profile="virtio-disk", suite="all", storage_tests="smoke", net_tests="netperf")
    plan = [(s.side, s.test) for s in spec.plan()]
    assert plan[:3] == [("baseline", "seq-write-64k"), ("baseline", "seq-read-64k"), ("baseline", "randread-4k-qd32")]
    assert plan[3] == ("guest", "boot") and plan[-2:] == [("guest", "tcp-rr"), ("baseline", "tcp-rr")]
    assert RunSpec(profile="x", suite="guest").plan() == [PlanStep("guest", "boot")]
    peer = RunSpec(profile="x", suite="network", net_tests="tcp-rr", peer="10.73.0.1").plan()
    assert [(s.side, s.test) for s in peer] == [("guest", "boot"), ("guest", "tcp-rr"), ("baseline", "tcp-rr"),
                                                ("guest", "tcp-rr-fe"), ("baseline", "tcp-rr-fe")]


@pytest.mark.parametrize("bad", [0, 9.5, 3601, -1])
def test_agent_timeout_out_of_range_is_refused(bad):
    from cloudbox.core.errors import CloudboxError

    with pytest.raises(CloudboxError, match=rf"--agent-timeout {bad:g} is not allowed; allowed: 10 to 3600 seconds"):
        RunSpec(profile="virtio-disk", agent_timeout=bad).validate()
    RunSpec(profile="virtio-disk", agent_timeout=10).validate()
    RunSpec(profile="virtio-disk", agent_timeout=3600).validate()


def test_sweep_needs_a_profile_and_valid_specs(state):
    from cloudbox.core.errors import CloudboxError

    with ResultStore() as store:
        with pytest.raises(CloudboxError, match="at least one profile"):
            runs.start_sweep([], store)
        with pytest.raises(CloudboxError, match="--suite 'bogus' is not allowed"):
            runs.start_sweep([RunSpec(profile="virtio-disk", suite="bogus")], store)
    assert runs.list_sweeps() == []


# -- real guests ---------------------------------------------------------------------------------------------
def _wait(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@pytest.mark.root
def test_a_bridge_with_a_guest_plugged_in_is_refused_naming_its_port():
    """Our bridge name taken by a bridge with a port (a run with another run dir, whose lock this run cannot
    see): refused, naming the port, and left as it was; a dead run's empty namespace and veth are removed."""
    from cloudbox.core.errors import CloudboxError
    from cloudbox.core.virt import network

    if os.geteuid() != 0:
        pytest.skip("needs root (creates a bridge and a network namespace)")
    ip = ["ip", "link", "add"]
    subprocess.run([*ip, addresses.BRIDGE, "type", "bridge"], check=True)
    try:
        subprocess.run([*ip, "cbtest0", "type", "veth", "peer", "name", "cbtest1"], check=True)
        subprocess.run(["ip", "link", "set", "cbtest0", "master", addresses.BRIDGE], check=True)
        with pytest.raises(CloudboxError, match=rf"link {addresses.BRIDGE} already exists and has ports cbtest0 "
                                                r"\(a guest is plugged in\)"):
            network.HostNetwork(9000).setup_bridge()
        assert network.link_exists("cbtest0") and network.link_exists(addresses.BRIDGE)
    finally:
        subprocess.run(["ip", "link", "del", "cbtest0"], check=False)
        subprocess.run(["ip", "link", "del", addresses.BRIDGE], check=False)
    subprocess.run(["ip", "netns", "add", addresses.NS], check=True)
    subprocess.run([*ip, addresses.VETH_HOST, "type", "veth", "peer", "name", addresses.VETH_NS], check=True)
    hn = network.HostNetwork(9000)
    try:
        hn.setup_netns()
        assert hn.reaped == [f"network namespace {addresses.NS} (nothing running in it)", f"link {addresses.VETH_HOST}"]
    finally:
        hn.teardown()
    assert not network.link_exists(addresses.VETH_HOST) and not os.path.exists(f"/run/netns/{addresses.NS}")


@pytest.mark.slow
@pytest.mark.root
def test_guest_session_runs_until_cancelled_then_cleans_up(state, libvirt_conn):
    from cloudbox.core.virt.guest import list_guests

    # a dead run's bridge, no guest on it: the session removes it and says so
    subprocess.run(["ip", "link", "add", addresses.BRIDGE, "type", "bridge"], check=True)
    with ResultStore() as store:
        rid = runs.start_detached(RunSpec(profile="virtio-disk", suite="guest"), store)
        try:
            wait_up(store, rid)
            assert f"removed bridge {addresses.BRIDGE} (no guest on it), left by a run that is gone" in [
                e.payload.get("text") for e in store.events_since(rid) if e.kind == "log"]
            (g,) = [g for g in list_guests(libvirt_conn) if g.run_uuid == store.get_run(rid).uuid]
            assert g.state == "running" and g.uptime() is not None and g.uptime() < 600
            time.sleep(2)
            assert store.get_run(rid).state == "running"  # it holds: no tests, no end of its own
        finally:
            state_after = runs.cancel(store, rid, timeout=120)
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
    started: list[runs.Sweep] = []
    try:
        _sweep_then_a_cancelled_one(spec, started)
    finally:  # a failed wait must not leave a sweep (and its guest session) running into the next tests
        for sw in started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(sw.pid, signal.SIGTERM)


def _sweep_then_a_cancelled_one(spec: dict, started: list) -> None:
    with ResultStore() as store:
        sweep = runs.start_sweep([RunSpec(profile=p, **spec) for p in ("virtio-disk", "virtio-file")], store)
        started.append(sweep)
        done = _wait(lambda: next((s for s in runs.list_sweeps() if s.id == sweep.id and s.state != "running"),
                                  None), 420, "the sweep to finish")
        assert done.state == "completed" and None not in done.runs
        items = [store.get_run(r) for r in done.runs]
        assert [r.profile_name for r in items] == ["virtio-disk", "virtio-file"]
        assert all(r.state == "completed" for r in items), [(r.state, r.reason) for r in items]
        assert items[0].finished_at <= items[1].started_at + 1  # one after the other, not at once
        # a sweep of three, cancelled during its first item: the rest never starts. The first item is a guest
        # session, which holds until cancelled, so the cancel cannot race the end of a short run.
        specs = [RunSpec(profile="virtio-disk", suite="guest"),
                 *[RunSpec(profile="virtio-disk", **spec)] * 2]
        sweep2 = runs.start_sweep(specs, store)
        started.append(sweep2)
        first = _wait(lambda: next((s.runs[0] for s in runs.list_sweeps() if s.id == sweep2.id), None), 60,
                      "the first run of the second sweep")
        wait_up(store, first, "the sweep's guest session")
        assert runs.cancel(store, first, timeout=120) == "completed"  # a stopped session ends normally
        final = _wait(lambda: next((s for s in runs.list_sweeps() if s.id == sweep2.id and s.state != "running"),
                                   None), 60, "the second sweep to stop")
        assert final.state == "cancelled" and final.runs[1:] == [None, None]
