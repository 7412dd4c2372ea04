"""The start-run request a front-end sends a node, built by the front-end's own code (core.run.mirror, spread and
client), is accepted by the node's reader (agent.requests.read_request), for every run setting it can carry; one bad
value of each declared type is refused with the setting named."""

from __future__ import annotations

import dataclasses
import io
from typing import Any, cast

import pytest

from cloudbox.agent import requests
from cloudbox.core.cluster import client
from cloudbox.core.disks.volumes.nfs import NfsExport
from cloudbox.core.record.provenance import PeerServers
from cloudbox.core.run import mirror, spread
from cloudbox.core.spec.profiles import resolve_profile
from cloudbox.core.spec.runspec import RunSpec

PROFILE = resolve_profile("virtio-disk")
NFS = NfsExport("r1", "", "10.73.0.1", 20490, "", "nfs-ganesha (front-end)")


def _node_requests() -> list[dict[str, Any]]:
    """Every kind of spec the front-end sends a node, through mirror.node_spec and spread.part_request_spec."""
    out = []
    base = dict(profile="virtio-disk", node="be1")
    # one guest, both network tools, the front-end's servers
    out.append(mirror.node_spec(RunSpec(**base, net_tests="both", net_seconds=7, runtime=9, size="64M"),
                                peer=PeerServers(peer="10.73.0.1", peer_netperf_port=12865, peer_iperf3_port=5201)))
    # N guests with iperf3: one iperf3 server per guest (the request refused before the types were declared)
    out.append(mirror.node_spec(RunSpec(**base, guests=2, net_tests="iperf3", cpu_overcommit=2.0),
                                peer=PeerServers(peer="10.73.0.1", peer_iperf3_port=5201,
                                                 peer_iperf3_ports=[5201, 5202])))
    # storage settings, a node's device and NIC (an SR-IOV profile's), an agent timeout
    out.append(mirror.node_spec(RunSpec(**base, suite="storage", storage_tests="smoke", work_dir="/var/tmp/x",
                                        device="/dev/vdb", destroy="vdb", agent_timeout=120.5, nic="enp5s0f0")))
    # an NFS profile's run on the front-end's export, and a block volume served by the front-end
    out.append(mirror.node_spec(RunSpec(**base, suite="storage"), nfs_export=NFS))
    out.append(mirror.node_spec(RunSpec(**base, suite="storage"), volume_uri="nbds://10.73.0.1:10809/vol1"))
    # a repeated run: across boots, and until its ratios are sure
    out.append(mirror.node_spec(RunSpec(**base, suite="storage", repeats=3, boots=2)))
    out.append(mirror.node_spec(RunSpec(**base, suite="storage", repeats=4, until_width=2.5, max_repeats=12)))
    # one run of a study run, with its study's seed and the profiles' order (kept in the run's provenance)
    out.append(mirror.node_spec(RunSpec(**base, suite="storage", repeats=3,
                                        study_run={"study": "a", "seed": 7, "order": ["virtio-disk", "virtio-file"]})))
    # a propagation run (study B's sweep) on a node
    out.append(mirror.node_spec(RunSpec(**base, suite="propagation", propagate=[64 * 1024**2, 128 * 1024**2])))
    # a spread run's part on a node, numbered from its first guest, on the front-end's NFS export
    whole = RunSpec(profile="virtio-disk", node="local,be1", guests=3, suite="storage")
    part = spread.Part("be1", 2, 2, shell=cast(Any, None))
    out.append(spread.part_request_spec(whole, part, "fe1 run 12", nfs_export=NFS))
    return out


def _read(spec: dict[str, Any]) -> dict[str, Any]:
    raw = client.start_run_request(spec, PROFILE.to_toml(), "/var/lib/cloudbox/images/x")
    return requests.read_request(io.BytesIO(raw))


@pytest.mark.parametrize("spec", _node_requests(), ids=lambda s: ",".join(sorted(s)))
def test_the_node_accepts_every_request_the_front_end_builds(spec):
    assert _read(spec)["spec"] == spec


def test_the_requests_cover_every_run_setting_a_node_is_sent():
    sent = set().union(*(_node_requests()))
    assert sent == {f.name for f in dataclasses.fields(RunSpec)} - {"node"}


@pytest.mark.parametrize(("key", "bad", "allowed"), [
    ("suite", 3, "allowed: str"),
    ("net_seconds", "5", "allowed: int"),
    ("net_seconds", True, "allowed: int"),
    ("agent_timeout", "60", "allowed: int or float"),
    ("agent_timeout", float("nan"), "allowed: int or float"),
    ("peer_iperf3_ports", [5201, "5202"], "allowed: a list of int"),
    ("peer_iperf3_ports", 5201, "allowed: a list of int"),
    ("propagate", [True], "allowed: a list of int"),
    ("work_dir", "/tmp/\x1b[2J", "without control characters"),
])
def test_one_bad_value_of_each_type_is_refused_with_its_setting_named(key, bad, allowed):
    spec = {"profile": "x", "suite": "storage", key: bad}
    with pytest.raises(requests.BadRequest, match=rf"start-run: run setting {key}: .*{allowed}"):
        _read(spec)
