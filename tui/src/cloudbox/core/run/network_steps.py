"""The network side of a run on this host: the private network check of a back-end, the bridge and namespace, the
network tests (guest and bare metal side by side, a stalled guest launched afresh once), and a guest session's
hold."""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable

from ..bench import nettests
from ..errors import CloudboxError, NicStalled
from ..record.provenance import NicStall, PrivateNetwork
from ..record.rows import Repetition
from ..spec import addresses, catalogue, nodeconf
from ..spec.runspec import resolve_net_tests
from ..virt import network, sriov
from ..virt.guest import Guest
from .context import RunContext, host_labels
from .launch import launch
from .measure import net_test
from .sink import EventSink

NIC_RELAUNCHES = 1  # a guest whose network stopped for good is launched afresh this often per run
# One repeat of a network test, guest then bare metal: (bare metal's figure, the guest's)
Pair = Callable[[Repetition | None], tuple[float | None, float | None]]
# Takes a test's samples: calls its pair once per repeat (a repeated run, core.run.repeated), or once (None)
Repeater = Callable[[str, Pair], None]


def once(_test: str, pair: Pair) -> None:
    """A run that measures each test once."""
    pair(None)


def check_private_network(sink: EventSink, peer: str) -> str:
    """The private bridge of this back-end, after proving that full-size frames reach the front-end `peer`."""
    sink.step(f"network: checking the private network to the front-end {peer}")
    found = network.check_private_path(peer, "the front-end")
    if found is None:
        raise CloudboxError(f"the front-end {peer} asked for network tests to it, but this host's node settings "
                            f"({nodeconf.node_settings_file()}) name no private NIC: it is not an installed "
                            "back-end")
    link, pc = found
    sink.log(pc.message)
    if not pc.ok:
        raise CloudboxError(pc.message)
    return link


def plumb(ctx: RunContext) -> None:
    """The bridge the guest's NIC joins (the node's private bridge for tests to the front-end or its volume, else
    the run's own) and the baseline's namespace; before the guest, whose NIC attaches to the bridge."""
    spec, mtu = ctx.spec, ctx.profile.network.mtu
    # the front-end is reached over the private bridge: its network tests' servers, or its NFS export
    peer = spec.peer if spec.wants_network or spec.nfs_host or spec.volume_uri else ""
    if peer:
        ctx.private_bridge = check_private_network(ctx.sink, peer)
        ctx.provenance.private_network = PrivateNetwork(bridge=ctx.private_bridge, peer=peer)
    d = ctx.profile.disk
    guest_attach = d.backing == "network-volume" and d.attach == "guest"  # the volume reaches it over its NIC
    if not (spec.wants_network or spec.session or guest_attach or spec.wants_links):  # MPI ranks, fio's clients
        return
    attach = ctx.profile.network.attach
    if peer and attach != "bridge":
        raise CloudboxError(f"profile {ctx.profile.name}: network.attach = {attach} puts the guest on a link of this "
                            f"host's own, and the tests to the front-end {peer} (or its volume) go over the private "
                            "bridge; allowed here: network.attach = bridge")
    hostnet = ctx.hostnet = network.HostNetwork(mtu)
    ctx.stack.callback(hostnet.teardown)
    with ctx.control.atomic():
        ns = " and the baseline namespace" if spec.wants_network else ""
        if peer:
            hostnet.use_bridge(ctx.private_bridge)
            ctx.sink.step(f"network: the private bridge {ctx.private_bridge} ({hostnet.host_ip}){ns}, MTU {mtu}")
        elif attach == "macvtap":
            ctx.sink.step(f"network: link {addresses.MACVTAP_LINK} for the guest's macvtap, the host's macvlan "
                          f"{addresses.MACVLAN_HOST} beside it ({hostnet.host_ip}){ns}, MTU {mtu}")
            hostnet.setup_macvtap()
        elif attach == "sriov":
            vfs = sriov.VirtualFunctions(spec.nic) if spec.nic else None
            if vfs is None:
                raise CloudboxError(f"profile {ctx.profile.name}: network.attach = sriov hands the guest a virtual "
                                    "function of one of this host's NICs, which the run must be given: --nic NAME "
                                    f"(NICs with SR-IOV here: {', '.join(sriov.sriov_nics()) or 'none'})")
            ctx.stack.callback(vfs.remove)  # before they are made
            ctx.sink.step(f"network: two virtual functions of {spec.nic}, the host's end ({hostnet.host_ip}) and the "
                          f"guest's{ns}, MTU {mtu}")
            hostnet.setup_sriov(vfs)
        else:
            ctx.sink.step(f"network: bridge {addresses.BRIDGE}{ns}, MTU {mtu}")
            hostnet.setup_bridge()
        if spec.wants_network:
            hostnet.setup_netns()
    for what in hostnet.reaped:
        ctx.sink.log(f"removed {what}, left by a run that is gone")


def configure_nic(ctx: RunContext, guest: Guest, address: str = addresses.GUEST_IP) -> tuple[str, str]:
    """The guest's NIC: `address` on the run's bridge, or on a back-end's private bridge a lease from the
    front-end's DHCP and the full-size path to the front-end checked (the first guest's recorded). -> (NIC, IP)"""
    hostnet, mtu, peer = ctx.hostnet, ctx.profile.network.mtu, ctx.spec.peer
    assert hostnet is not None
    nic, ip = network.configure_guest(guest, mtu, host_ip=hostnet.host_ip, dhcp=bool(ctx.private_bridge),
                                      address=address)
    pn = ctx.provenance.private_network
    if ctx.private_bridge and peer and pn is not None:
        network.guest_path(guest, peer, mtu)
        ctx.sink.log(f"MTU {mtu} verified end to end (guest {ip} -> the front-end {peer})")
        if not pn.guest_ip:
            pn.host_ip, pn.guest_ip, pn.mtu = hostnet.host_ip, ip, mtu
            ctx.save_provenance()
    return nic, ip


def network_tests(ctx: RunContext, guest: Guest, repeat: Repeater = once,
                  where: Callable[[Repetition | None], str] = lambda _rep: "") -> None:
    """The network tests, guest and bare metal side by side; `repeat` takes each test's samples (once, or a repeated
    run's repeats, each step saying `where` the sample stands). A guest test whose path stops for good (NicStalled:
    re-plugging the NIC did not bring it back) has the guest relaunched once and runs again."""
    hostnet = ctx.hostnet
    assert hostnet is not None
    spec, sink, control, prov = ctx.spec, ctx.sink, ctx.control, ctx.provenance
    peer, mtu, seconds = spec.peer, ctx.profile.network.mtu, ctx.net_seconds

    def configure(g: Guest) -> network.GuestLink:
        sink.step("guest: configuring the NIC and checking the MTU end to end")
        nic, guest_ip = network.configure_guest(g, mtu, host_ip=hostnet.host_ip, dhcp=bool(peer))
        sink.log(f"MTU {mtu} verified end to end (guest {nic} {guest_ip} -> bridge {hostnet.bridge} "
                 f"{hostnet.host_ip})")
        if peer:
            network.guest_path(g, peer, mtu)
            sink.log(f"MTU {mtu} verified end to end (guest {guest_ip} -> the front-end {peer})")
            assert prov.private_network is not None
            prov.private_network.host_ip, prov.private_network.guest_ip = hostnet.host_ip, guest_ip
            prov.private_network.mtu = mtu
            ctx.save_provenance()
        return network.GuestLink(g, nic, hostnet.host_ip, hostnet.bridge, mtu)

    current = configure(guest)
    relaunches = 0

    def in_guest(t: catalogue.NetTest, port: int, target: str, rep: Repetition | None) -> nettests.NetResult:
        nonlocal current, relaunches
        while True:
            link = current
            if target != link.target:
                link = network.GuestLink(link.guest, link.nic, target, link.bridge, mtu, local=False)
            run = functools.partial(nettests.run_in_guest, link.guest, t, port, seconds, sink.progress("guest", t.id),
                                    control.cancelled, target=target, log=sink.log, link=link)
            try:
                return net_test(ctx, "guest", t, run, ctx.labels, rep=rep, where=where(rep),
                                note="measured on a guest relaunched after its network stopped" if relaunches else "")
            except NicStalled as e:
                if relaunches >= NIC_RELAUNCHES or control.cancelled():
                    raise
                relaunches += 1
                prov.add_nic_stall(NicStall(test=t.id, hop=e.hop, remedy="relaunch"))
                sink.step(f"guest: its network stopped and re-plugging the NIC did not help ({e.hop}): "
                          f"relaunching the guest (relaunch {relaunches} of {NIC_RELAUNCHES})")
                with control.atomic():
                    link.guest.destroy()
                if link.guest.console_log is not None:  # keep the stalled guest's console beside the new one
                    with contextlib.suppress(OSError):
                        link.guest.console_log.replace(link.guest.console_log.with_name(
                            f"console-stall{relaunches}.log"))
                current = configure(launch(ctx).guest)
                ctx.save_provenance()

    ports = {"netperf": 0, "iperf3": 0}
    bports = {"netperf": 0, "iperf3": 0}
    peer_ports = {"netperf": spec.peer_netperf_port, "iperf3": spec.peer_iperf3_port}
    plain = host_labels(ctx.labels, dom0=ctx.dom0)
    bare_labels = [*plain, "veth-netns"]

    def pair(nt: catalogue.NetTest, port: int, bport: int, peer_port: int,
             rep: Repetition | None) -> tuple[float | None, float | None]:
        """One sample of `nt` in the guest and on bare metal (and both to the front-end on a back-end)."""
        g = in_guest(nt, port, hostnet.host_ip, rep)
        b = net_test(ctx, "baseline", nt, functools.partial(
            nettests.run_baseline, nt, bport, seconds, sink.progress("baseline", nt.id), control.cancelled,
            log=sink.log), bare_labels, rep=rep, where=where(rep))
        if peer:
            fe = catalogue.frontend_test(nt)
            in_guest(fe, peer_port, peer, rep)
            # like with like: the host's baseline at the guest's MTU, not the private link's (often 9000 to 1500)
            with network.frames_to(peer, mtu, sink.log):
                net_test(ctx, "baseline", fe, functools.partial(
                    nettests.run_baseline, fe, peer_port, seconds, sink.progress("baseline", fe.id),
                    control.cancelled, target=peer, netns=None, log=sink.log), [*plain, "private-network"], rep=rep,
                    where=where(rep))
        return b.value, g.value

    for nt in resolve_net_tests(spec.net_tests):
        if not current.guest.has(nt.tool):
            raise CloudboxError(f"{nt.tool} is not installed in the guest; rebuild it with 'make guest-image'")
        if not ports[nt.tool]:
            start = hostnet.start_netserver if nt.tool == "netperf" else hostnet.start_iperf3
            ports[nt.tool] = start(hostnet.host_ip)
            bports[nt.tool] = start(addresses.NS_HOST_IP)
        if peer and not peer_ports[nt.tool]:
            raise CloudboxError(f"the front-end {peer} opened no {nt.tool} server for this run "
                                "(peer_netperf_port / peer_iperf3_port)")
        repeat(nt.id, functools.partial(pair, nt, ports[nt.tool], bports[nt.tool], peer_ports[nt.tool]))


def hold(ctx: RunContext, guest: Guest, boot_s: float) -> None:
    """A guest session: bring up its NIC, then keep the guest until it shuts down or is stopped."""
    mtu = ctx.profile.network.mtu
    ctx.sink.step("guest: configuring the NIC and checking the MTU end to end")
    nic, ip = network.configure_guest(guest, mtu)
    ctx.sink.log(f"guest {guest.name} is up: {nic} {ip} on bridge {addresses.BRIDGE} (MTU {mtu}), "
                 f"launch to agent {boot_s:.1f} s")
    ctx.sink.step(f"guest {guest.name} running; stop it with 'cloudbox cancel {ctx.run_id}'")
    ctx.control.holding = True
    while guest.is_active():
        if ctx.control.cancelled():
            raise ctx.control.aborted()
        time.sleep(1.0)
    ctx.control.holding = False
