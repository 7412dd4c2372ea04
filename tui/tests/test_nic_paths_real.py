"""A real run with the guest's NIC on a macvtap (network.attach = macvtap; TCG here): libvirt's macvtap on the run's
veth end beside the host's macvlan, netperf between guest and host through macvlan's bridge mode, nothing left.
In make test-full (a network run of its own, about 30 s); the domain XML of every NIC path is in the fast tier
(test_nic_paths.py)."""

from __future__ import annotations

import pytest
from real_runs import completed_run, leftovers

from cloudbox.core.spec.addresses import MACVLAN_HOST, MACVTAP_LINK
from cloudbox.core.spec.runspec import RunSpec
from cloudbox.core.virt.domain import read_domain
from cloudbox.core.virt.network import link_exists

pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.full]

MACVTAP = """
name = "virtio-macvtap"
description = "virtio-net in userspace on a macvtap"
[guest]
hypervisor = "kvm"
[disk]
bus = "virtio-blk"
cache = "none"
backing = "prealloc-file"
[network]
model = "virtio"
attach = "macvtap"
"""


def test_netperf_through_a_macvtap(state, libvirt_conn, tmp_path):
    path = tmp_path / "virtio-macvtap.toml"
    path.write_text(MACVTAP)
    run = completed_run(RunSpec(profile=str(path), suite="network", net_tests="tcp-stream", net_seconds=3))
    for side in ("guest", "baseline"):
        assert run.measurement(side, "tcp-stream", "Mbit/s").value > 0, side
    iface = read_domain(run.provenance.domain_xml or "").interface
    assert iface is not None and iface.lower == MACVTAP_LINK and iface.mode == "bridge"
    assert (iface.tap or "").startswith("macvtap"), iface.tap
    assert not link_exists(MACVTAP_LINK) and not link_exists(MACVLAN_HOST)
    assert leftovers(libvirt_conn, state)["guests"] == []
