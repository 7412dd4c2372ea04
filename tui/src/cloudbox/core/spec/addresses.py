"""The names and addresses a run's network takes on one host: the run bridge and the guests' addresses on it (or the
macvtap's link and the host's macvlan), and the network namespace (with its veth pair) that stands in for the
bare-metal peer of the network tests."""

from __future__ import annotations

import ipaddress

BRIDGE = "cbbr0"
HOST_IP = "169.254.100.1"
GUEST_IP = "169.254.100.2"
NS = "cbns0"
VETH_HOST, VETH_NS = "cbveth0", "cbveth1"
NS_HOST_IP, NS_IP = "169.254.101.1", "169.254.101.2"
PREFIX = 24
# network.attach = macvtap: the guest's macvtap and the host's macvlan (HOST_IP) share a link of the run's, one end
# of a veth pair (any Ethernet link takes macvlans; the run makes its own rather than touch the host's NICs), and
# reach each other through macvlan's bridge mode.
MACVTAP_LINK, MACVTAP_PEER, MACVLAN_HOST = "cbmv0", "cbmv1", "cbmvh0"


def guest_ip(k: int) -> str:
    """Guest k's address on the run's bridge (k from 1; guest 1's is GUEST_IP): N guests of one run side by side."""
    if not 1 <= k <= 250:
        raise ValueError(f"guest number {k} has no address on the run's bridge; allowed: 1 to 250")
    return f"169.254.100.{1 + k}"


def bridge_subnet() -> str:
    """The run bridge's subnet, where every guest of a run on this host has its address (169.254.100.0/24)."""
    return str(ipaddress.ip_interface(f"{HOST_IP}/{PREFIX}").network)
