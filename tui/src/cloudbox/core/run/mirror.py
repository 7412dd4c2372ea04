"""The front-end's run of a spec on an enrolled node (spec.node): the node is checked, the guest image propagated
to it (timed), the node's own executor started there (detached, through core.cluster.client), its events mirrored
here live, and at the end its measurements and provenance brought into this database with the front-end's facts
over them. It runs inside the same lifecycle as a run on this host (core.run.lifecycle), so cancelling here
cancels the node's run (its guest and stores are removed there) and a failure there is this run's reason."""

from __future__ import annotations

import dataclasses
import platform
from dataclasses import asdict, dataclass
from typing import Any

from .. import paths
from ..cluster import client, health, registry, volumecreds
from ..cluster.registry import NodeRecord
from ..disks.diskstats import Counters, Sample, Sampler, read_counters
from ..disks.volumes.attach import AttachRefused, export_for_node, export_for_run, parse_volume
from ..disks.volumes.nfs import NfsExport
from ..disks.volumes.nfs import subnet as nfs_subnet
from ..disks.volumes.store import VolumeBusy, VolumeStore
from ..errors import CloudboxError
from ..record.events import ProgressEvent, SampleEvent, StateEvent, StepEvent, parse
from ..record.provenance import Controller, NodeInfo, Nodes, PeerServers, Provenance, RemoteRun
from ..record.rows import MEASUREMENT_COLUMNS
from ..spec import nodeconf
from ..spec.knobs import is_nfs
from ..spec.runspec import BOOT, RunSpec, resolve_net_tests
from ..spec.schemes import SCHEMES
from ..virt import network
from ..virt.guestimage import GuestImage
from .context import RunContext


@dataclass
class NodeRun:
    """The node and the run on it, as the mirroring goes."""

    node: NodeRecord
    shell: client.NodeShell
    run: RemoteRun | None = None
    finished: bool = False  # the node's run has ended: nothing to cancel there any more
    reason: str | None = None  # its final state event's
    server_counters: Counters | None = None  # the disk under a served volume's file, as the node's run started


def run_on_node(ctx: RunContext) -> None:
    """The run's body on spec.node (core.run.lifecycle.Execution runs it)."""
    there = find_node(ctx)
    check_block_volume(ctx, there)
    propagate(ctx, there)
    serve_nfs(ctx, there)
    serve_block_volume(ctx, there)
    start(ctx, there)
    follow(ctx, there)
    fetch(ctx, there)
    record_nfs(ctx)
    record_block_volume(ctx, there)


def find_node(ctx: RunContext) -> NodeRun:
    """The enrolled node, up (its libvirt answers over the pinned SSH)."""
    name = ctx.spec.node
    ctx.sink.step(f"checking node {name}")
    with registry.Registry() as reg:
        try:
            node = reg.node(name)
        except CloudboxError:
            known = ", ".join(n.name for n in reg.nodes()) or "none enrolled"
            raise CloudboxError(f"--node {name!r}: no such node; allowed: {known}") from None
        shell = client.NodeShell.for_node(reg, node)
    h = health.check_node(node)
    if h.state != "up":
        raise CloudboxError(f"node {node.name} is down: {h.reason}")
    ctx.sink.log(f"node {node.name} ({node.address}) is up: {h.reason}")
    return NodeRun(node, shell)


def propagate(ctx: RunContext, there: NodeRun) -> None:
    """The guest image into the node's cache (timed, recorded); the front-end's part of the provenance."""
    sink, node = ctx.sink, there.node
    sink.step(f"propagating the guest image to {node.name}", side="guest")
    prop = client.propagate_image(
        there.shell, GuestImage.locate(), cancelled=ctx.control.cancelled,
        progress=lambda done, total: sink.emit(
            ProgressEvent("guest", BOOT, 0, f"copying the image, {done * 100 // total}%")))
    sink.log(prop.describe())
    with registry.Registry() as reg:
        reg.add_propagation(asdict(prop))
    # The node's own provenance (host, CPU, versions, domain XML) joins this at the end.
    ctx.provenance = Provenance(controller=Controller.this_host(),
                                nodes=Nodes(front_end=platform.node(), back_end=node.name),
                                node=NodeInfo(name=node.name, address=node.address,
                                              host_key_fingerprint=node.host_key_fingerprint),
                                propagation=prop)
    ctx.save_provenance()


def serve_peer(ctx: RunContext) -> PeerServers | None:
    """The front-end's side of the cross-node network tests: netserver and iperf3 on its private address for
    the length of the run (stopped with it). None when this host has no private network (not an installed
    front-end): the node's guest -> front-end tests are then left out, and the log says so."""
    addr = network.private_address()
    if addr == "0.0.0.0":
        ctx.sink.log("this host has no private network address (its node settings name no private NIC): the "
                     "guest -> front-end network tests are left out of this run")
        return None
    tools = {nt.tool for nt in resolve_net_tests(ctx.spec.net_tests)}
    n = ctx.spec.guests
    servers = network.HostNetwork(ctx.profile.network.mtu)
    ctx.stack.callback(servers.teardown)
    # netserver forks a child per client; iperf3 serves one client at a time, so N guests need N of it
    iperf3 = [servers.start_iperf3(addr) for _ in range(n)] if "iperf3" in tools else []
    peer = PeerServers(peer=addr, peer_netperf_port=servers.start_netserver(addr) if "netperf" in tools else 0,
                       peer_iperf3_port=iperf3[0] if iperf3 else 0, peer_iperf3_ports=iperf3 if n > 1 else None)
    ports = {"netperf": str(peer.peer_netperf_port), "iperf3": ", ".join(map(str, iperf3))}
    ctx.sink.log(f"serving the cross-node network tests on {addr}: "
                 + ", ".join(f"{t} port{'s' if t == 'iperf3' and n > 1 else ''} {ports[t]}" for t in sorted(tools)))
    return peer


def serve_nfs(ctx: RunContext, there: NodeRun) -> None:
    """An NFS profile's export (disk.volume = nfs:<name>), served by this front-end on its private address for the
    length of the run: the node's guests and, for the baseline, its host mount it over the private network."""
    serve_export(ctx, f"node {there.node.name}", there.node.name)


def serve_export(ctx: RunContext, where: str, to: str, also: str = "") -> None:
    """The NFS profile's export served by this front-end on its private address (to the private network's subnet,
    and `also`, another subnet, when given) for the length of the run, as ctx.volume (nothing without one); its
    directory a fresh one of this run's, on this host's disk (stopped and removed with the run), that disk sampled
    on the run's timeline. `where`: the run's places as the refusal names them; `to`: who mounts it."""
    d, spec = ctx.profile.disk, ctx.spec
    if not (is_nfs(d) and spec.wants_storage):
        return
    addr, link = _private(ctx, where, "export", "its guest mounts")
    ctx.work_dir = paths.work_base("") / f"run-{ctx.run_uuid[:12]}"
    ctx.sink.step(f"volume: serving {d.volume} to {to} over NFSv4 (nfs-ganesha) on {addr}, to the private "
                  f"network's subnet{' and ' + also if also else ''} only")
    with ctx.control.atomic():
        ctx.volume = v = export_for_run(d.volume, d.attach, run_uuid=ctx.run_uuid, work_dir=ctx.work_dir,
                                        size_bytes=ctx.size, hypervisor=ctx.profile.guest.hypervisor,
                                        guests=spec.guests)
        ctx.stack.callback(v.close)
        v.serve(link, addr, clients=f"{nfs_subnet(link, addr)}, {also}" if also else None)
    ctx.sink.log(f"volume exported: {v.uri} ({v.server}) from {v.path}")
    if v.store.host_device:
        _sample_disk(ctx, v.store.host_device)
    else:
        ctx.sink.log(f"the disk under {v.path} is not one /proc/diskstats names: the export's disk is not sampled")


def record_nfs(ctx: RunContext) -> None:
    """What this front-end's NFS server read and wrote of the export's disk over the node's run, into the volume
    record the node made (the node cannot see it)."""
    v, pv = ctx.volume, ctx.provenance.volume
    if v is None or pv is None or not isinstance(v.export, NfsExport):
        return
    io = v.export.io()
    pv.server = v.server
    pv.server_bytes_read, pv.server_bytes_written = io.get("read_bytes"), io.get("write_bytes")
    pv.server_device = f"{platform.node()}:{v.store.host_device}" if v.store.host_device else ""
    ctx.save_provenance()
    ctx.sink.log(f"{v.export.server} on this front-end read {pv.server_bytes_read} and wrote "
                 f"{pv.server_bytes_written} bytes of the export's disk")


def _block_volume(ctx: RunContext) -> bool:
    d = ctx.profile.disk
    return d.backing == "network-volume" and not is_nfs(d) and ctx.spec.wants_storage


def _private(ctx: RunContext, where: str, what: str, then: str) -> tuple[str, str]:
    """This front-end's private address and link, which serve the `what` (export, volume) to `where`; a refusal
    naming what the profile without --node does instead (this host serves and `then`) when it has none."""
    addr, link = network.private_address(), nodeconf.private_link(nodeconf.settings())
    if addr == "0.0.0.0" or not link:
        raise CloudboxError(f"profile {ctx.profile.name}: disk.volume = {ctx.profile.disk.volume} on {where}: the "
                            f"front-end serves the {what} on its private network, and this host's node settings "
                            f"({nodeconf.node_settings_file()}) name no private NIC with an address (it is not an "
                            "installed front-end); allowed here: the profile without --node (this host serves and "
                            f"{then})")
    return addr, link


def check_block_volume(ctx: RunContext, there: NodeRun) -> None:
    """A block volume's checks on this front-end before anything is copied or started: this host serves it on its
    private network, the volume exists, is free and holds the test size, the attach mode works across nodes."""
    if not _block_volume(ctx):
        return
    d = ctx.profile.disk
    _private(ctx, f"node {there.node.name}", "volume", "attaches it")
    if d.attach == "qemu":
        raise AttachRefused("disk.attach = qemu on a back-end is not supported: QEMU there would need the front-end's "
                            "credentials in libvirt; allowed on a back-end: disk.attach = host or guest")
    with VolumeStore() as vs:
        vol = vs.get(parse_volume(d.volume)[1])
    if vol.attached_run:
        raise VolumeBusy(f"volume {vol.name!r} is attached by run {vol.attached_run}; a volume serves one run at a "
                         "time")


def serve_block_volume(ctx: RunContext, there: NodeRun) -> None:
    """A stored volume (iscsi:, nbd:, nvme-tcp:, aoe:) served by this front-end on its private network to the node
    only (its own credentials, installed on it first), for the length of the run; the disk under the volume's file
    sampled here on the run's timeline (the front-end's view beside the node's)."""
    if not _block_volume(ctx):
        return
    d, node = ctx.profile.disk, there.node
    addr, link = _private(ctx, f"node {there.node.name}", "volume", "attaches it")
    ctx.sink.step(f"volume: installing {node.name}'s credentials for this front-end's volumes (if it lacks them)")
    creds = volumecreds.ensure(there.shell)
    ctx.work_dir = paths.work_base("") / f"run-{ctx.run_uuid[:12]}"
    s = SCHEMES[d.volume.partition(":")[0]]
    ctx.sink.step(f"volume: serving {d.volume} to {node.name} over {s.title} on {link if s.layer2 else addr}")
    with ctx.control.atomic():
        ctx.volume = v = export_for_node(d.volume, d.attach, node=node.name, creds=creds, run_uuid=ctx.run_uuid,
                                         work_dir=ctx.work_dir, size_bytes=ctx.size, address=addr, link=link,
                                         peer=node.address)
        ctx.stack.callback(v.close)
    ctx.sink.log(f"volume exported: {v.store.path} ({v.server}; {v.tls})")
    if v.server_device:
        _sample_here(ctx, there, v.server_device)


def _sample_here(ctx: RunContext, there: NodeRun, device: str) -> None:
    """The disk under what this front-end serves, sampled (_sample_disk), and its counters as the node's run
    starts."""
    _sample_disk(ctx, device)
    there.server_counters = read_counters(device)


def _sample_disk(ctx: RunContext, device: str) -> None:
    """The disk under what this front-end serves, sampled once a second on the run's timeline beside the node's
    own devices."""
    host = platform.node()

    def on_sample(smp: Sample) -> None:  # named as the front-end's: the node's samples are its own devices
        ctx.sink.sample(SampleEvent.from_payload({**smp.as_dict(), "device": f"{host}:{smp.device}"}))
    with ctx.control.atomic():
        ctx.stack.enter_context(Sampler(device, on_sample))


def record_block_volume(ctx: RunContext, there: NodeRun) -> None:
    """What this front-end's server read and wrote of the volume's disk over the node's run, into the volume record
    the node made (the node cannot see it): the server's own I/O counters, or for the kernel's NVMe target the
    disk's."""
    v, pv = ctx.volume, ctx.provenance.volume
    if v is None or pv is None or isinstance(v.export, NfsExport) or v.export is None:
        return
    io = v.export.io()
    if not io and v.server_device and there.server_counters is not None:
        now, then = read_counters(v.server_device), there.server_counters
        io = {"read_bytes": (now.rsect - then.rsect) * 512, "write_bytes": (now.wsect - then.wsect) * 512}
    pv.server = f"{v.server} (this front-end, {platform.node()})"
    pv.tls = v.tls  # what the server checked, as the server knows it
    pv.server_device = f"{platform.node()}:{v.server_device}" if v.server_device else ""
    pv.server_bytes_read, pv.server_bytes_written = io.get("read_bytes"), io.get("write_bytes")
    ctx.save_provenance()
    ctx.sink.log(f"{v.export.server} on this front-end read {pv.server_bytes_read} and wrote "
                 f"{pv.server_bytes_written} bytes of the volume's disk")


def node_spec(spec: RunSpec, *, peer: PeerServers | None = None, nfs_export: NfsExport | None = None,
              volume_uri: str = "") -> dict[str, Any]:
    """The run settings the node is sent for `spec`: the front-end's servers for the cross-node network tests
    (`peer`), the NFS export it serves, or the block volume's URI it serves (`volume_uri`)."""
    remote_spec = {k: v for k, v in spec.as_dict().items() if k != "node"}
    if peer is not None:
        remote_spec.update(peer.model_dump(exclude_none=True))
    if nfs_export is not None:
        remote_spec.update(peer=nfs_export.host, nfs_host=nfs_export.host, nfs_port=nfs_export.port)
    elif volume_uri:
        remote_spec.update(peer=network.private_address(), volume_uri=volume_uri)
    return remote_spec


def start(ctx: RunContext, there: NodeRun) -> None:
    """The node's executor, detached there, with this spec and the front-end's resolved profile; cancelled
    there when this run ends before it did."""
    spec, sink, node = ctx.spec, ctx.sink, there.node
    peer = serve_peer(ctx) if spec.wants_network else None
    if peer is not None:
        ctx.provenance.peer = peer
    nfs_export = ctx.volume.export if ctx.volume is not None and isinstance(ctx.volume.export, NfsExport) else None
    volume_uri = ctx.volume.store.path if ctx.volume is not None and nfs_export is None else ""
    remote_spec = node_spec(spec, peer=peer, nfs_export=nfs_export, volume_uri=volume_uri)
    sink.step(f"starting the run on {node.name}")
    assert ctx.provenance.propagation is not None
    with ctx.control.atomic():
        rr = there.run = client.start_run(there.shell, remote_spec, ctx.profile.to_toml(),
                                          ctx.provenance.propagation.remote_dir,
                                          mix_tomls=[p.to_toml() for p in ctx.mix])

        def stop_remote() -> None:
            if not there.finished:
                try:
                    sink.log(f"cancelling run {rr.run_id} on {node.name}: {client.cancel_run(there.shell, rr)}")
                except CloudboxError as e:
                    sink.log(f"could not cancel run {rr.run_id} on {node.name}: {e}")

        ctx.stack.callback(stop_remote)
    ctx.provenance.remote_run = rr
    ctx.save_provenance()
    sink.log(f"run {rr.run_id} on {node.name} started; its own record stays there")


def follow(ctx: RunContext, there: NodeRun) -> None:
    """The node's events, mirrored here until its run ends; a dropped stream is re-attached where it stopped for
    REATTACH_WITHIN_S before the node counts as lost."""
    control, node, rr = ctx.control, there.node, there.run
    assert rr is not None
    control.holding = ctx.spec.session  # stopping a guest session is its normal end, as on this host

    def lost(seconds: float, e: client.NodeError) -> CloudboxError:
        h = health.check_node(node)
        return CloudboxError(f"lost node {node.name} during the run: no event stream for {seconds:.0f} s ({e}); its "
                             f"health check: {h.state}, {h.reason}; run {rr.run_id} there is left to finish or be "
                             "cleaned up by the node")

    for _, kind, payload in client.follow_through_drops(there.shell, rr, cancelled=control.cancelled,
                                                        say=ctx.sink.log, lost=lost):
        mirror(ctx, there, kind, payload)
    if control.cancelled():
        raise control.aborted()
    control.holding = False


def mirror(ctx: RunContext, there: NodeRun, kind: str, payload: dict[str, Any]) -> None:
    """One event of the node's run, re-emitted here (its steps named after the node, its samples stored as this
    run's timeline, its final state kept for the reason)."""
    ev = parse(kind, payload)
    if isinstance(ev, StateEvent):
        if ev.state == "running":
            ctx.sink.emit(ev)
        else:
            there.reason = ev.reason
        return
    if isinstance(ev, SampleEvent):
        ctx.sink.sample(ev)
        return
    if isinstance(ev, StepEvent):
        ev = dataclasses.replace(ev, text=f"{ctx.spec.node}: {ev.text}")
    if ev is not None:
        ctx.sink.emit(ev)


def fetch(ctx: RunContext, there: NodeRun) -> None:
    """The node's run into this database: its accelerator and sizes, its measurements as the node stored them,
    its provenance under the front-end's."""
    rr = there.run
    assert rr is not None
    data = client.fetch_run(there.shell, rr)
    rr.uuid = str(data.get("uuid") or rr.uuid)  # the node's executor gives its run its final uuid
    there.finished = data.get("state") != "running"
    ctx.provenance.remote_run = rr
    ctx.store.update_run(ctx.run_id, accelerator=data.get("accelerator"), emulated=int(bool(data.get("emulated"))),
                         size_bytes=data.get("size_bytes"), size_label=data.get("size_label"))
    ctx.provenance = Provenance.from_stored(data.get("provenance")).under(ctx.provenance)
    ctx.save_provenance()
    for m in data.get("measurements") or []:  # as the node's export wrote them (its own columns)
        ctx.store.add_measurement(ctx.run_id, **{k: m.get(k) for k in MEASUREMENT_COLUMNS if k in m})
    if data.get("state") != "completed":
        raise CloudboxError(f"the run on {there.node.name} (its run {rr.run_id}) ended {data.get('state')}: "
                            f"{data.get('reason') or there.reason or 'no reason given'}")
