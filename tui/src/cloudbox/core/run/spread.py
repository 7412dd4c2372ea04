"""A run of N guests spread over several places (--node local,be1 --guests N), coordinated by this host.

Each place runs its share of the guests as a run of its own, held at every test's start barrier (spec.hold,
core.run.hold): an enrolled node's through core.cluster.client over the pinned SSH, this host's (`local`) as a
detached run in a results store of its own (parts/ under the state dir) through the same agent commands. Each
place's events are mirrored here live, its guests numbered after the places before it. When every place has
announced a test's barrier, the front-end measures each place's clock through a coordination channel kept open to
it (`cloudbox node local coord`: the quickest of five round trips), picks one instant SPREAD_LEAD_S ahead and hands
each place that instant on its own clock. At the end every place's measurements come here: each guest's and each
bare-metal process's rows renumbered, and the run's row the sum over all places; the start skew across places is
computed from each place's stamps converted to this host's clock. Bare metal's tests are held the same way (key
`baseline.<test>`), each place's processes on its own disk or its mount of the run's one NFS export, which this
front-end serves for every place when the profile's disk is one.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import queue
import select
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .. import paths
from ..cluster import client, health, registry
from ..cluster.registry import NodeRecord
from ..disks.volumes.nfs import NfsExport
from ..errors import CloudboxError
from ..inputs import printable
from ..record.events import (
    LogEvent,
    MeasurementEvent,
    ProgressEvent,
    SampleEvent,
    StateEvent,
    StepEvent,
    counted,
    parse,
)
from ..record.provenance import Controller, Guests, GuestStart, Nodes, Place, Provenance, RemoteRun
from ..record.results import ResultStore
from ..record.rows import MEASUREMENT_COLUMNS, REPETITION_COLUMNS
from ..spec import addresses
from ..spec.runspec import BOOT, LOCAL_PLACE, RunSpec, split_guests
from ..virt.guestimage import GuestImage
from . import hold, mirror
from .context import RunContext

SPREAD_LEAD_S = 5.0  # from the release to the instant: a channel round trip per place, then each guest's shell (2 s)
CLOCK_TRIES = 5
CHANNEL_TIMEOUT_S = 30.0
CHANNEL_LINE_MAX = 4096  # bytes in one answer on a place's coordination channel: a clock or "ok" is a few dozen
SUMMED = ("MB/s", "IOPS")  # with IOzone's extra passes: the figures added over the instances; latency is averaged


def parts_state_dir() -> Path:
    """Where this host's parts of spread runs keep their own results store (their rows are merged into the run's)."""
    return paths.state_dir() / "parts"


class LocalShell(client.NodeShell):
    """This host as a place: the same agent commands as a node's, run here, against the parts store."""

    @property
    def where(self) -> str:
        return f"this host ({LOCAL_PLACE})"

    def argv(self, *cmd: str, patient: bool = False) -> list[str]:
        args = list(cmd)
        if args[:1] == ["cloudbox"]:
            args[:1] = [sys.executable, "-m", "cloudbox.cli"]
        return ["env", f"CLOUDBOX_STATE_DIR={parts_state_dir()}", *args]


def prune_parts() -> int:
    """This host's parts of earlier spread runs that have ended, deleted from the parts store (their rows, events and
    provenance were merged into the coordinating run's record); how many."""
    db = parts_state_dir() / "results.db"
    if not db.exists():
        return 0
    gone = 0
    with ResultStore(db) as store:
        for r in store.list_runs():
            if r.state != "running":
                store.delete_run(r.id)
                gone += 1
    return gone


def local_record() -> NodeRecord:
    return NodeRecord(name=LOCAL_PLACE, role="front-end", address="127.0.0.1", ssh_port=0, host_key="",
                      client_key=None, libvirt_uri="qemu:///system", enrolled_at=0.0, last_seen=None,
                      checked_at=None, state="up", reason=None)


@dataclass
class Part:
    """One place's share of the run, as the coordination goes."""

    name: str
    guests: int
    first: int  # its first guest's instance number in the whole run
    shell: client.NodeShell
    run: RemoteRun | None = None
    channel: subprocess.Popen[bytes] | None = None
    offset_s: float = 0.0  # the place's clock minus this host's
    rtt_s: float = 0.0
    ready: set[str] = field(default_factory=set)
    ended: bool = False
    image_dir: str = ""
    pending: bytes = b""  # what the coordination channel sent after the last answer line

    @property
    def local(self) -> bool:
        return self.name == LOCAL_PLACE

    def ask(self, line: str, timeout: float = CHANNEL_TIMEOUT_S) -> str:
        """One line to the place's coordination channel, and its answer."""
        ch = self.channel
        assert ch is not None and ch.stdin is not None and ch.stdout is not None
        try:
            ch.stdin.write(line.encode() + b"\n")
            ch.stdin.flush()
        except OSError as e:
            raise CloudboxError(f"{self.shell.where}: the coordination channel is closed ({e})") from None
        answer = self._read_line(ch.stdout.fileno(), timeout)
        if not answer:
            raise CloudboxError(f"{self.shell.where}: no answer to {line.split()[0]!r} on the coordination channel "
                                f"within {timeout:g} s")
        if answer.startswith("error"):
            raise CloudboxError(f"{self.shell.where}: {line.split()[0]}: {answer}")
        return answer

    def _read_line(self, fd: int, timeout: float) -> str:
        """The place's next answer line: at most CHANNEL_LINE_MAX bytes within `timeout` seconds ('' for none);
        a place that sends more, or no newline in time, cannot hold the run. Bytes after the line wait for the next."""
        deadline = time.monotonic() + timeout
        buf = self.pending
        while b"\n" not in buf and len(buf) <= CHANNEL_LINE_MAX:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                break
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            buf += chunk
        line, nl, rest = buf.partition(b"\n")
        if not nl:
            self.pending = b""
            if len(line) > CHANNEL_LINE_MAX:
                raise CloudboxError(f"{self.shell.where}: an answer on the coordination channel is longer than "
                                    f"{CHANNEL_LINE_MAX} bytes; stopped reading it")
            return ""
        self.pending = rest
        return line.decode(errors="replace").strip()

    def measure_clock(self, tries: int = CLOCK_TRIES) -> None:
        """The place's clock against this host's: the quickest of `tries` round trips (uncertain by half of it)."""
        best: tuple[float, float] | None = None
        for _ in range(tries):
            t0 = time.time()
            there = finite(self.ask("clock"), f"{self.shell.where}: its clock")
            t1 = time.time()
            if best is None or t1 - t0 < best[1]:
                best = (there - (t0 + t1) / 2, t1 - t0)
        assert best is not None
        self.offset_s, self.rtt_s = best


def finite(value: object, what: str) -> float:
    """A number a place sent, refused (CloudboxError naming `what`) when it is not one or not finite (NaN, inf)."""
    try:
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        x = math.nan
    if not math.isfinite(x):
        raise CloudboxError(f"{what}: {printable(str(value))[:80]!r} is not a finite number")
    return x


def run_spread(ctx: RunContext) -> None:
    """The run's body for a spread spec (core.run.lifecycle.Execution runs it)."""
    parts = find_places(ctx)
    record_places(ctx, parts)
    image = GuestImage.locate()
    for p in parts:
        propagate(ctx, p, image)
    # an NFS profile: one export on this front-end that every place's guests mount (this host's through its bridge)
    mirror.serve_export(ctx, f"--node {ctx.spec.node}", "the guests of " + ", ".join(p.name for p in parts),
                        also=addresses.bridge_subnet() if any(p.local for p in parts) else "")
    for p in parts:
        start(ctx, p)
    coordinate(ctx, parts)
    gather(ctx, parts)


def find_places(ctx: RunContext) -> list[Part]:
    """Each place, up, with its share of the guests (split_guests: the first places take one more)."""
    spec, out = ctx.spec, []
    shares = split_guests(spec.guests, len(spec.places))
    first = 1
    with registry.Registry() as reg:
        for name, k in zip(spec.places, shares, strict=True):
            ctx.sink.step(f"checking {name}")
            if name == LOCAL_PLACE:
                shell: client.NodeShell = LocalShell(local_record(), [])
            else:
                try:
                    node = reg.node(name)
                except CloudboxError:
                    known = ", ".join(n.name for n in reg.nodes()) or "none enrolled"
                    raise CloudboxError(f"--node {spec.node}: no node {name!r}; allowed: {known}, "
                                        f"{LOCAL_PLACE}") from None
                h = health.check_node(node)
                if h.state != "up":
                    raise CloudboxError(f"node {node.name} is down: {h.reason}")
                shell = client.NodeShell.for_node(reg, node)
            out.append(Part(name, k, first, shell))
            first += k
    ctx.sink.log("guests spread: " + ", ".join(f"{p.name} {_numbers(p)}" for p in out))
    return out


def _numbers(p: Part) -> str:
    return f"g{p.first}" if p.guests == 1 else f"g{p.first}-g{p.first + p.guests - 1}"


def record_places(ctx: RunContext, parts: list[Part]) -> None:
    remote = [p.name for p in parts if not p.local]
    ctx.provenance = Provenance(controller=Controller.this_host(),
                                nodes=Nodes(front_end=platform.node(), back_end=", ".join(remote)),
                                guests=Guests(count=ctx.spec.guests, barrier=_barrier_note(),
                                              places=[Place(name=p.name, guests=p.guests, first=p.first)
                                                      for p in parts]))
    ctx.save_provenance()


def _barrier_note() -> str:
    return (f"spread: each place held at every test until all were ready, then released for one instant "
            f"{SPREAD_LEAD_S:g} s ahead on each place's clock (measured through its coordination channel, the "
            f"quickest of {CLOCK_TRIES} round trips); each place's guests start at it through their own barrier")


def propagate(ctx: RunContext, p: Part, image: GuestImage) -> None:
    """The guest image into a node's cache (timed, in the log); this host's part uses the image here."""
    if p.local:
        p.image_dir = str(image.directory)
        return
    ctx.sink.step(f"propagating the guest image to {p.name}", side="guest")
    prop = client.propagate_image(
        p.shell, image, cancelled=ctx.control.cancelled,
        progress=lambda done, total: ctx.sink.emit(
            ProgressEvent("guest", BOOT, 0, f"copying the image to {p.name}, {done * 100 // total}%")))
    ctx.sink.log(prop.describe())
    with registry.Registry() as reg:
        reg.add_propagation(asdict(prop))
    p.image_dir = prop.remote_dir


def part_request_spec(spec: RunSpec, p: Part, coordinator: str, *, nfs_export: NfsExport | None = None
                      ) -> dict[str, Any]:
    """The run settings a place's part is sent: its guests, held at every test by `coordinator` ("fe1 run 12"),
    numbered from its first guest in the whole run, and the front-end's NFS export when there is one."""
    part_spec = {k: v for k, v in spec.as_dict().items() if k != "node"}
    part_spec.update(guests=p.guests, hold=f"{coordinator}, {p.name} {_numbers(p)} of {spec.guests} guests")
    if p.first > 1:
        part_spec.update(first_guest=p.first)
    if nfs_export is not None:
        # a node reaches it over its private bridge; this host's part through its own bridge (the address is ours)
        part_spec.update(nfs_host=nfs_export.host, nfs_port=nfs_export.port,
                         **({} if p.local else {"peer": nfs_export.host}))
    return part_spec


def start(ctx: RunContext, p: Part) -> None:
    """The place's part (held at every test), cancelled when this run ends before it did; its channel opened."""
    exp = ctx.volume.export if ctx.volume is not None and isinstance(ctx.volume.export, NfsExport) else None
    part_spec = part_request_spec(ctx.spec, p, f"{platform.node()} run {ctx.run_id}", nfs_export=exp)
    ctx.sink.step(f"starting the part on {p.name} ({_numbers(p)})")
    if p.local and (gone := prune_parts()):
        ctx.sink.log(f"removed {counted(gone, 'part')} of earlier spread runs from {parts_state_dir()} (their "
                     "coordinating runs keep their records)")
    with ctx.control.atomic():
        # a mixed run's part gets its own guests' profiles, in their order (its guests then take them in turn)
        mine = [ctx.guest_profile(k) for k in range(p.first, p.first + p.guests)]
        rr = p.run = client.start_run(p.shell, part_spec, mine[0].to_toml(), p.image_dir,
                                      mix_tomls=[x.to_toml() for x in mine] if ctx.mix else ())

        def stop_part() -> None:
            if not p.ended:
                try:
                    ctx.sink.log(f"cancelling run {rr.run_id} on {p.name}: {client.cancel_run(p.shell, rr)}")
                except CloudboxError as e:
                    ctx.sink.log(f"could not cancel run {rr.run_id} on {p.name}: {e}")

        ctx.stack.callback(stop_part)
        p.channel = p.shell.popen("cloudbox", "node", "local", "coord", stdin=subprocess.PIPE, patient=True)
        ctx.stack.callback(_close, p.channel)
    place = _place(ctx, p)
    place.run_id = rr.run_id
    p.measure_clock()
    place.clock_offset_s, place.clock_rtt_s = round(p.offset_s, 4), round(p.rtt_s, 4)
    ctx.save_provenance()
    ctx.sink.log(f"run {rr.run_id} on {p.name} started ({counted(p.guests, 'guest')}); its clock "
                 f"{p.offset_s * 1000:+.1f} ms from this host's (round trip {p.rtt_s * 1000:.1f} ms)")


def _close(ch: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(OSError):
        if ch.stdin:
            ch.stdin.close()
    try:
        ch.wait(timeout=5)
    except subprocess.TimeoutExpired:
        ch.kill()
        ch.wait()


def _place(ctx: RunContext, p: Part) -> Place:
    g = ctx.provenance.guests
    assert g is not None
    return next(pl for pl in g.places if pl.name == p.name)


# ------------------------------------------------------------------------------------------------ coordination
_END = "end"


def _follow(p: Part, out: queue.Queue[tuple[Part, str, Any]], stop: threading.Event) -> None:
    """The place's events into `out` until its run ends; a dropped stream re-attached where it stopped."""
    rr = p.run
    assert rr is not None

    def lost(seconds: float, e: client.NodeError) -> CloudboxError:
        return CloudboxError(f"lost {p.name} during the run: no event stream for {seconds:.0f} s ({e}); run "
                             f"{rr.run_id} there is left to finish or be cleaned up")

    try:
        for _, kind, payload in client.follow_through_drops(
                p.shell, rr, cancelled=stop.is_set, say=lambda text: out.put((p, "log", {"text": text})), lost=lost):
            out.put((p, kind, payload))
        out.put((p, _END, None))
    except BaseException as e:  # noqa: BLE001 - handed to the run's thread
        out.put((p, _END, e))


class _Sums:
    """The run's own figure of a test as the places report theirs: emitted once every place has."""

    def __init__(self, parts: list[Part]) -> None:
        self.n = len(parts)
        self.seen: dict[tuple[str, str, str], dict[str, MeasurementEvent]] = {}

    def add(self, p: Part, ev: MeasurementEvent) -> MeasurementEvent | None:
        key = (ev.side, ev.test, ev.metric)
        got = self.seen.setdefault(key, {})
        got[p.name] = ev
        if len(got) < self.n:
            return None
        evs = list(got.values())
        labels = tuple(dict.fromkeys(label for e in evs for label in e.labels))
        iops = [e.iops for e in evs if e.iops is not None]
        return MeasurementEvent(ev.side, ev.test, ev.metric, round(sum(e.value for e in evs), 2), labels,
                                round(sum(iops), 1) if len(iops) == len(evs) else None)


def coordinate(ctx: RunContext, parts: list[Part]) -> None:
    """Every place's events mirrored here until all have ended; each test released once every place holds it."""
    events: queue.Queue[tuple[Part, str, Any]] = queue.Queue()
    stop = threading.Event()
    ctx.stack.callback(stop.set)
    for p in parts:
        threading.Thread(target=_follow, args=(p, events, stop), name=f"cloudbox-place-{p.name}", daemon=True).start()
    sums, left = _Sums(parts), len(parts)
    while left:
        ctx.control.check()
        try:
            p, kind, payload = events.get(timeout=0.2)
        except queue.Empty:
            continue
        if kind == _END:
            left -= 1
            if isinstance(payload, BaseException):
                raise payload
            continue
        ev = parse(kind, payload)
        if isinstance(ev, StepEvent) and ev.held and ev.test:
            held = hold.key(ev.side or "guest", ev.test)
            p.ready.add(held)
            ctx.sink.log(f"{p.name}: {ev.text.split(', waiting')[0]}")
            if all(held in q.ready for q in parts):
                release(ctx, parts, held)
        elif isinstance(ev, StateEvent):
            if ev.final:
                p.ended = True
                if ev.state != "completed":
                    rid = p.run.run_id if p.run else "?"
                    raise CloudboxError(f"the part on {p.name} (its run {rid}) ended {ev.state}: "
                                        f"{ev.reason or 'no reason given'}")
        elif isinstance(ev, MeasurementEvent):
            if ev.instance is not None:
                ctx.sink.emit(MeasurementEvent(ev.side, ev.test, ev.metric, ev.value, ev.labels, ev.iops,
                                               instance=ev.instance + p.first - 1))
            elif (total := sums.add(p, ev)) is not None:
                ctx.sink.emit(total)
        elif isinstance(ev, ProgressEvent):
            if ev.instance is not None:
                ctx.sink.emit(ProgressEvent.from_payload({**ev.to_payload(), "instance": ev.instance + p.first - 1}))
            elif p.first == 1:  # a boot's progress: the first place's stands for all
                ctx.sink.emit(ev)
        elif isinstance(ev, SampleEvent):
            ctx.sink.sample(SampleEvent.from_payload({**ev.to_payload(), "device": f"{p.name}:{ev.device}"}))
        elif isinstance(ev, StepEvent):
            ctx.sink.emit(StepEvent(f"{p.name}: {ev.text}", ev.side, ev.test))
        elif isinstance(ev, LogEvent):
            ctx.sink.log(f"{p.name}: {ev.text}")
    stop.set()


def release(ctx: RunContext, parts: list[Part], test: str) -> None:
    """`test` starts at one instant on every place: each clock measured again, the instant picked, sent to each."""
    for p in parts:
        p.measure_clock()
    at = time.time() + SPREAD_LEAD_S
    for p in parts:
        p.ask(f"go {p.run.run_id if p.run else 0} {test} {at + p.offset_s:.6f}")
    for p in parts:
        place = _place(ctx, p)
        place.clock_offset_s, place.clock_rtt_s = round(p.offset_s, 4), round(p.rtt_s, 4)
    ctx.save_provenance()
    ctx.sink.log(f"{test}: every place ready; released for {SPREAD_LEAD_S:g} s ahead ("
                 + ", ".join(f"{p.name} clock {p.offset_s * 1000:+.1f} ms, round trip {p.rtt_s * 1000:.1f} ms"
                             for p in parts) + ")")


# ------------------------------------------------------------------------------------------------ gathering
def gather(ctx: RunContext, parts: list[Part]) -> None:
    """Every place's run into this database: its rows renumbered, the sum over all places as the run's rows, the
    guests' records and starts on this host's clock, each place's facts."""
    datas = []
    for p in parts:
        assert p.run is not None
        data = client.fetch_run(p.shell, p.run)
        p.ended = data.get("state") != "running"
        if data.get("state") != "completed":
            raise CloudboxError(f"the part on {p.name} (its run {p.run.run_id}) ended {data.get('state')}: "
                                f"{data.get('reason') or 'no reason given'}")
        datas.append(data)
    rows = merged_rows(parts, [d.get("measurements") or [] for d in datas])
    for m in rows:
        ctx.store.add_measurement(ctx.run_id, **m)
    ctx.store.update_run(ctx.run_id, accelerator=least_native([d.get("accelerator") for d in datas]),
                         emulated=int(any(d.get("emulated") for d in datas)),
                         size_bytes=datas[0].get("size_bytes"), size_label=datas[0].get("size_label"))
    provs = [Provenance.from_stored(d.get("provenance")) for d in datas]
    ctx.provenance = merged_provenance(ctx.provenance, parts, provs, datas)
    info = ctx.provenance.guests
    assert info is not None
    if ctx.mix:
        record_mix(ctx, info, parts, provs)
    ctx.save_provenance()
    mirror.record_nfs(ctx)  # what this front-end's server wrote for every place
    for test, skew in info.skew_s.items():
        ctx.sink.log(f"{test}: start skew {skew * 1000:.0f} ms over {info.count} guests on {len(parts)} places")


def record_mix(ctx: RunContext, info: Guests, parts: list[Part], provs: list[Provenance]) -> None:
    """A mixed run's profiles, each guest's, and each profile's first guest's domain XML as its place ran it."""
    info.profiles = {x.name: x.to_toml() for x in ctx.mix}
    for k, rec in enumerate(info.guests, 1):
        rec.profile = ctx.guest_profile(k).name
    for p, pv in zip(parts, provs, strict=True):
        xmls = dict(pv.guests.domain_xml) if pv.guests else {}
        if pv.domain_xml:  # the part's first guest's (a part of one guest records no mix of its own)
            xmls.setdefault(ctx.guest_profile(p.first).name, pv.domain_xml)
        for name, xml in xmls.items():
            info.domain_xml.setdefault(name, xml)


ACCEL_ORDER = ("tcg", "nested-kvm", "xen", "kvm")  # the run is labelled by its least native place's accelerator


def least_native(accels: list[Any]) -> str | None:
    """The run's accelerator: the least native of its places' (each place's own is kept with the place)."""
    known = [a for a in accels if a in ACCEL_ORDER]
    return min(known, key=ACCEL_ORDER.index) if known else None


def merged_rows(parts: list[Part], per_part: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The rows this run stores: per (side, test), every place's instances renumbered after the places before it,
    then the run's rows: the sum over all instances (MB/s, IOPS, IOzone's passes, Mbit/s, trans/s), the mean
    latency, the window from the first start to the last finish, the host disks' MB/s added (queue depth and
    utilisation are each place's own: kept with the place). A repeated test's sums are one per repeat."""
    order: list[tuple[str, str, int, int, int]] = []
    inst: dict[tuple[str, str, int, int, int], list[dict[str, Any]]] = {}
    sums: dict[tuple[str, str, int, int, int], list[dict[str, Any]]] = {}
    for p, rows in zip(parts, per_part, strict=True):
        for m in rows:
            key = (str(m.get("side")), str(m.get("test")), int(m.get("repeat") or 1), int(m.get("boot") or 1),
                   int(m.get("iteration") or 1))
            if key not in inst:
                order.append(key)
                inst[key], sums[key] = [], []
            row = {k: m.get(k) for k in MEASUREMENT_COLUMNS if k in m}
            if m.get("instance") is None:
                sums[key].append(row)
            else:
                row["instance"] = int(m["instance"]) + p.first - 1
                inst[key].append(row)
    out: list[dict[str, Any]] = []
    for key in order:
        rows = inst[key]
        out += rows
        metrics = list(dict.fromkeys(r["metric"] for r in rows))
        for metric in metrics:
            mine = [r for r in rows if r["metric"] == metric]
            values = [finite(r["value"], f"{key[0]} {key[1]} {metric} from a place") for r in mine]
            value = sum(values) / len(values) if metric == "lat_us" else sum(values)
            part_sums = [r for r in sums[key] if r["metric"] == metric]
            host = [r.get("host_mbps") for r in part_sums]
            labels = list(dict.fromkeys(label for r in mine for label in (r.get("labels") or [])))
            out.append({"side": key[0], "test": key[1], "metric": metric, "value": value, "raw": "",
                        "labels": labels, "instance": None, **dict(zip(REPETITION_COLUMNS, key[2:], strict=True)),
                        "started_at": min(r["started_at"] for r in mine if r.get("started_at") is not None),
                        "finished_at": max(r["finished_at"] for r in mine if r.get("finished_at") is not None),
                        "host_mbps": sum(h for h in host if h is not None)
                        if host and all(h is not None for h in host) else None,
                        "host_avgrq_sectors": None, "host_avgqu": None, "host_util": None})
    return out


def merged_provenance(front: Provenance, parts: list[Part], provs: list[Provenance],
                      datas: list[dict[str, Any]]) -> Provenance:
    """The first place's facts (its backing, image, versions) under the front-end's, with the guests of every place
    and their starts on this host's clock."""
    info = front.guests
    assert info is not None
    merged = provs[0].under(front)
    hosts = [pv.host or p.name for p, pv in zip(parts, provs, strict=True)]
    merged.host = ", ".join(dict.fromkeys(hosts))
    guests: list[GuestStart] = []
    for p, pv, place, data, host in zip(parts, provs, info.places, datas, hosts, strict=True):
        g = pv.guests
        place.host, place.accelerator = host, data.get("accelerator")
        for m in data.get("measurements") or []:
            if m.get("instance") is None and m.get("metric") in ("MB/s", "Mbit/s", "trans/s"):
                place.host_metrics[f"{m.get('side')}:{m.get('test')}"] = {
                    h: m.get(h) for h in ("host_mbps", "host_avgqu", "host_util")}
        if g is None:
            guests.append(GuestStart(name=f"{p.name} guest", place=p.name))
            continue
        guests += [rec.model_copy(update={"place": p.name}) for rec in g.guests]
        place.vcpus, place.host_cpus = g.vcpus, g.host_cpus
        if g.baseline_processes:
            info.baseline_processes = (info.baseline_processes or 0) + g.baseline_processes
    info.guests = guests
    tests = set.intersection(*(set(pv.guests.started_at) if pv.guests else set() for pv in provs))
    for test in sorted(tests, key=lambda t: min(pv.guests.started_at[t] for pv in provs if pv.guests)):
        starts: list[float] = []
        for p, pv in zip(parts, provs, strict=True):
            assert pv.guests is not None
            first = pv.guests.started_at[test] - p.offset_s  # this host's clock
            starts += [first + off for off in pv.guests.start_offsets_s.get(test, [0.0] * p.guests)]
        t0 = min(starts)
        info.start_offsets_s[test] = [round(s - t0, 4) for s in starts]
        info.skew_s[test] = round(max(starts) - t0, 4)
        info.started_at[test] = round(t0, 4)
    merged.guests = info
    return merged

