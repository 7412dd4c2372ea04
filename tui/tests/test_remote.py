"""Runs on an enrolled node from the front-end (core.cluster.client and core.run.mirror; the node's side is
agent.agent): guest image propagation and a run on the node, through a real sshd on 127.0.0.1 with the node's own
host key, the pinned ssh wrapper and the management key (the same path libvirt's qemu+ssh takes). The node's side
is this host's cloudbox with its own state directory (sshd's SetEnv), so "front-end" and "node" keep separate
databases as on two machines.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

import pytest
from test_nodes import SSHD, Front, Sshd, _enrolled_behind_sshd

import cloudbox
from cloudbox.core.cluster import client, protocol
from cloudbox.core.record.results import ResultStore
from cloudbox.core.record.runlock import RunLock
from cloudbox.core.run import runs
from cloudbox.core.spec.runspec import RunSpec
from cloudbox.core.virt.guestimage import GuestImage

pytestmark = pytest.mark.skipif(SSHD is None or os.geteuid() != 0,
                                reason="needs sshd (openssh-server, `scripts/install-deps test`) and root")


class Cluster:
    def __init__(self, front: Front, node_state: Path, sshd: Sshd, name: str):
        self.front, self.node_state, self.sshd, self.name = front, node_state, sshd, name

    @property
    def shell(self) -> client.NodeShell:
        return client.NodeShell.for_node(self.front.reg, self.front.reg.node(self.name))

    def node_store(self) -> ResultStore:
        return ResultStore(self.node_state / "results.db")


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch):
    """A front-end (state dir = its registry's directory) and node7 behind a private sshd whose sessions run this
    cloudbox with the node's own state directory (traversable by QEMU's user, like the `state` fixture's)."""
    fe_base = tmp_path / "fe"
    monkeypatch.setenv("CLOUDBOX_STATE_DIR", str(fe_base))  # the executor opens the default registry and results
    front = Front(fe_base)
    back, sshd = _enrolled_behind_sshd(front, tmp_path, "node7")
    sshd.stop()
    node_base = Path(tempfile.mkdtemp(prefix="cloudbox-test-node-", dir="/var/tmp"))
    os.chmod(node_base, 0o755)
    src = str(Path(cloudbox.__file__).resolve().parent.parent)
    path = f"{Path(sys.executable).parent}:/usr/sbin:/usr/bin:/sbin:/bin"
    env = [f"CLOUDBOX_STATE_DIR={node_base / 'state'}", f"CLOUDBOX_RUN_DIR={os.environ['CLOUDBOX_RUN_DIR']}",
           f"PYTHONPATH={src}", f"PATH={path}"]
    if os.environ.get("CLOUDBOX_GUEST_IMAGE"):
        env.append(f"CLOUDBOX_GUEST_IMAGE={os.environ['CLOUDBOX_GUEST_IMAGE']}")
    sshd = Sshd(back.base, sshd.port, back.base / "ssh_host_ed25519_key", back.authorized_keys,
                extra=("SetEnv " + " ".join(env),))
    front.reg.set_health("node7", "up", "test")
    yield Cluster(front, node_base / "state", sshd, "node7")
    sshd.stop()
    front.reg.close()
    shutil.rmtree(node_base, ignore_errors=True)


def _same_files(a: Path, b: Path) -> bool:
    return all((a / n).read_bytes() == (b / n).read_bytes() for n in protocol.IMAGE_FILES)


def test_guest_image_propagation_is_timed_verified_and_cached(cluster: Cluster, guest_image: GuestImage):
    shell = cluster.shell
    seen: list[tuple[int, int]] = []
    p = client.propagate_image(shell, guest_image, progress=lambda d, t: seen.append((d, t)))
    total = sum((guest_image.directory / n).stat().st_size for n in protocol.IMAGE_FILES)
    assert not p.cached and p.bytes == total and p.seconds > 0 and p.mbps == pytest.approx(total / p.seconds / 1e6,
                                                                                         rel=0.01)
    copy = cluster.node_state / "images" / p.image_id
    assert Path(p.remote_dir) == copy and _same_files(guest_image.directory, copy)
    assert seen and seen[-1] == (total, total)
    assert not list((cluster.node_state / "images").glob("*.part"))
    again = client.propagate_image(shell, guest_image)
    assert again.cached and again.bytes == 0 and again.image_id == p.image_id
    # A damaged copy on the node is not taken for the image: it is copied again.
    with open(copy / "initrd.img", "r+b") as f:
        f.write(b"\0damaged")
    fixed = client.propagate_image(shell, guest_image)
    assert not fixed.cached and _same_files(guest_image.directory, copy)
    # The front-end's record (what `cloudbox node propagations` shows).
    cluster.front.reg.add_propagation(asdict(fixed))
    (row,) = cluster.front.reg.propagations("node7")
    assert row["bytes"] == total and not row["cached"] and row["mbps"] > 0
    # The node's cache, listed and cleared from the front-end (`cloudbox node images NAME [--clear]`).
    older = cluster.node_state / "images" / "00000000000000aa"
    older.mkdir()
    (older / "vmlinuz").write_bytes(b"x" * 10)
    (older / ".complete").touch()
    os.utime(older, (1, 1))
    listed = client.node_images(shell)
    assert [(i["id"], i["complete"]) for i in listed["images"]] == [(p.image_id, True), ("00000000000000aa", True)]
    assert listed["images"][0]["bytes"] >= total and listed["removed"] == []
    kept = client.node_images(shell, clear=True, keep=1)
    assert kept["removed"] == ["00000000000000aa"] and [i["id"] for i in kept["images"]] == [p.image_id]
    # Refused while a run goes on the node (its guest may boot from the cache), and nothing is removed.
    lock = RunLock()
    lock.acquire({"pid": os.getpid(), "profile": "test", "run_id": 1})
    try:
        with pytest.raises(client.NodeError, match="listing the image cache failed: .*run"):
            client.node_images(shell, clear=True)
    finally:
        lock.release()
    assert copy.is_dir()
    assert client.node_images(shell, clear=True)["removed"] == [p.image_id] and not copy.exists()


def test_a_bad_image_id_and_a_damaged_stream_leave_nothing(cluster: Cluster, guest_image: GuestImage):
    with pytest.raises(client.NodeError, match="image id 'x/../y': allowed: 16 lowercase hex digits"):
        cluster.shell.run("cloudbox", "node", "local", "receive-image", "x/../y", input=b"", what="receive")
    with pytest.raises(client.NodeError, match="receive"):
        cluster.shell.run("cloudbox", "node", "local", "receive-image", "0123456789abcdef", input=b"not a tar",
                          what="receive")
    assert not list((cluster.node_state / "images").glob("*"))


@pytest.mark.slow
def test_a_run_the_node_refuses_is_mirrored_with_both_nodes_in_its_provenance(cluster: Cluster, libvirt_conn):
    """A Xen profile on this KVM node: the node's own preflight refuses it when the run starts, before it records
    anything, which exercises the health check (libvirt over the pinned SSH), image propagation, the start request and
    the failure path end to end without booting a guest; the front-end's run says why, naming the node."""
    events: list[tuple[str, dict]] = []
    with ResultStore() as store:
        ex = runs.executor(RunSpec(profile="xen-default", suite="storage", node="node7"), store,
                           emit=lambda ev: events.append((ev.kind, ev.to_payload())))
        rid = ex.execute()
        run = store.get_run(rid)
    reason = run.reason or ""
    assert run.state == "aborted" and run.node == "node7"
    assert "node node7" in reason and "starting the run failed" in reason and "needs the Xen hypervisor" in reason
    prov = run.provenance.to_stored()  # the stored form, as `results export` shows it
    assert prov["nodes"]["back-end"] == "node7" and prov["nodes"]["front-end"] == prov["controller"]["host"]
    assert prov["propagation"]["node"] == "node7"
    steps = [p["text"] for k, p in events if k == "step"]
    assert steps[:3] == ["checking node node7", "propagating the guest image to node7", "starting the run on node7"]
    if (cluster.node_state / "results.db").exists():  # refused before it was recorded there
        with cluster.node_store() as ns:
            assert ns.list_runs() == []


@pytest.mark.slow
def test_unknown_or_down_nodes_are_refused_before_anything_starts(cluster: Cluster):
    """Before the run is recorded (core.run.preflight): an unknown node is bad input, a node that is down a host
    that cannot; neither leaves a run here or there."""
    from cloudbox.core.errors import UsageError
    from cloudbox.core.run import preflight

    with ResultStore() as store:
        with pytest.raises(UsageError, match="--node 'nosuch': no such node; allowed: node7"):
            runs.executor(RunSpec(profile="virtio-disk", node="nosuch"), store).execute()
        assert store.list_runs() == []
    cluster.sshd.stop()
    with ResultStore() as store:
        with pytest.raises(preflight.Refused, match="node node7 is down"):
            runs.executor(RunSpec(profile="virtio-disk", node="node7"), store).execute()
        assert store.list_runs() == []
    assert not (cluster.node_state / "results.db").exists()  # nothing started there


@pytest.mark.slow
def test_a_real_storage_run_on_the_node_comes_back_with_its_measurements(cluster: Cluster, libvirt_conn):
    """The node boots the guest (TCG here) from the propagated image and runs the smoke storage tests; the
    front-end's run holds the same measurements, labels and host metrics, the timeline, and both nodes."""
    events: list[tuple[str, dict]] = []
    with ResultStore() as store:
        ex = runs.executor(RunSpec(profile="virtio-disk", suite="storage", storage_tests="smoke", node="node7"),
                           store, emit=lambda ev: events.append((ev.kind, ev.to_payload())))
        rid = ex.execute()
        run = store.get_run(rid)
        samples = store.samples(rid)
    assert run.state == "completed", run.reason
    prov = run.provenance.to_stored()  # the stored form, as `results export` shows it
    with cluster.node_store() as ns:
        there = ns.get_run(prov["remote_run"]["run_id"])
    assert there.state == "completed" and there.uuid == prov["remote_run"]["uuid"]
    key = [(m.side, m.test, m.metric, m.value, tuple(m.labels)) for m in run.measurements]
    assert key == [(m.side, m.test, m.metric, m.value, tuple(m.labels)) for m in there.measurements]
    assert {m.side for m in run.measurements} == {"guest", "baseline"}
    assert run.emulated == there.emulated and run.accelerator == there.accelerator
    guest_rows = [m for m in run.measurements if m.side == "guest"]
    if run.emulated:
        assert all("emulated" in m.labels for m in guest_rows)
    # The node's own provenance (its kernel, the guest's domain XML) with the front-end's on top.
    assert "<domain" in prov["domain_xml"] and prov["guest_image"]["kernel_version"]
    assert prov["nodes"] == {"front-end": prov["controller"]["host"], "back-end": "node7"}
    assert str(cluster.node_state / "images") in prov["domain_xml"]  # the guest booted the propagated copy
    assert samples and any(k == "measurement" for k, _ in events)


def test_a_runs_own_ssh_traffic_is_patient_and_health_checks_are_not(cluster: Cluster):
    """A busy TCG node once left sshd silent past the registry's 5 s connect timeout: the event stream, fetch and
    cancel wait longer (their options go before the host), a plain command keeps the registry's settings."""
    shell = cluster.shell
    plain, patient = shell.argv("true"), shell.argv("true", patient=True)
    assert "-o" not in plain
    at = patient.index("--")
    assert patient[at - 4:at] == ["-o", f"ConnectTimeout={client.PATIENT_CONNECT_S}", "-o",
                                  f"ServerAliveCountMax={client.PATIENT_KEEPALIVE_COUNT}"]
    assert shell.run("echo", "ok", patient=True).strip() == "ok"  # ssh takes them
