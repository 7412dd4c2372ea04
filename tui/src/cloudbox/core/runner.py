"""The run executor: one benchmark run from lock to cleanup, with progress and results flowing into the
results store (events table) so any process — the CLI, the TUI, a later controller — can watch it.

A run: take the host's run lock, prepare the backing store, run the bare-metal baseline, launch the guest
under the profile, run the same tests inside it while sampling the host disk, store everything with
provenance, and clean up. Ctrl-C, SIGTERM (`cloudbox cancel`) or any failure: the guest is destroyed,
the backing store, bridge, namespace and temp files removed, and the partial run stored as `aborted`
with the reason. The guest's serial console is logged to console.log in the run's work directory (removed
with it); when the guest dies or its agent stops answering, the reason ends with the console's last lines.
`start_detached()` runs the executor in its own session so it outlives the caller.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import platform
import signal
import subprocess
import sys
import time
import uuid as uuidlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import accel, backing, daemons, network, nodeconf, paths, storage
from .diskstats import delta, read_counters
from .errors import Aborted, CloudboxError, GuestUnreachable, NicStalled, RunBusy
from .events import (
    LogEvent,
    MeasurementEvent,
    ProgressEvent,
    RunEvent,
    SampleEvent,
    StateEvent,
    StepEvent,
    parse,
)
from .guest import QEMU_LOG_DIR, Guest, reap_orphans
from .guestimage import CMDLINE, GuestImage
from .provenance import (
    BackingInfo,
    Controller,
    GuestImageInfo,
    NicStall,
    NodeInfo,
    Nodes,
    PeerServers,
    PrivateNetwork,
    Provenance,
    Versions,
)
from .results import MEASUREMENT_COLUMNS
from .runlock import RunLock, check_not_busy
from .runspec import BOOT, RunSpec, parse_size, resolve_net_tests

CONSOLE_TAIL_LINES = 20  # lines of the guest's serial console kept in the reason of a run whose guest died
QEMU_LOG_TAIL_LINES = 8  # and of libvirt's log of its QEMU process


# Launches of one guest under emulation or nested virtualization before a silent or dead boot fails the run.
BOOT_ATTEMPTS = 2
NIC_RELAUNCHES = 1  # a guest whose network stopped for good is launched afresh this often per run


# --------------------------------------------------------------------------------------- executor
EmitFn = Callable[[RunEvent], None]


@dataclass
class Executor:
    spec: RunSpec
    store: object  # results.ResultStore
    emit: EmitFn | None = None  # extra consumer (the foreground CLI prints events)
    run_id: int | None = None  # pre-created by start_detached()
    _cancel: bool = field(default=False, init=False)
    _cleaning: bool = field(default=False, init=False)
    _deferred: int = field(default=0, init=False)
    _current_test: str = field(default="idle", init=False)  # tags host samples with the running test
    _last_progress: float = field(default=0.0, init=False)
    _holding: bool = field(default=False, init=False)  # a guest session is up and waiting to be stopped
    _guest: Guest | None = field(default=None, init=False)  # the running guest, for its console on failure

    # -- events ----------------------------------------------------------------------------
    def event(self, ev: RunEvent) -> None:
        if isinstance(ev, ProgressEvent):
            now = time.monotonic()
            if now - self._last_progress < 0.5 and ev.pct < 100:
                return
            self._last_progress = now
        if self.run_id is not None:
            self.store.add_event(self.run_id, ev.kind, ev.to_payload())  # type: ignore[attr-defined]
        if self.emit:
            self.emit(ev)

    def step(self, text: str, side: str | None = None, test: str | None = None) -> None:
        self.event(StepEvent(text, side, test))

    def log(self, text: str) -> None:
        self.event(LogEvent(text))

    def cancelled(self) -> bool:
        return self._cancel

    def _on_signal(self, signum, _frame) -> None:
        self._cancel = True
        self._signal_name = signal.Signals(signum).name
        if not self._cleaning and not self._deferred:
            raise Aborted(f"cancelled by {self._signal_name}")

    _signal_name = ""

    @contextlib.contextmanager
    def _atomic(self):
        """Create a resource and register its cleanup with no cancellation in between: a signal that
        arrives meanwhile is held and raised right after (else e.g. a guest could start unregistered)."""
        self._deferred += 1
        try:
            yield
        finally:
            self._deferred -= 1
        if self._cancel and not self._deferred and not self._cleaning:
            raise Aborted(f"cancelled by {self._signal_name or 'request'}")

    # -- the run -----------------------------------------------------------------------------
    def execute(self) -> int:
        from .profiles import resolve_profile

        spec = self.spec
        spec.validate()
        profile = resolve_profile(spec.profile)
        size, size_label = parse_size(spec.size, profile.guest.memory_mib)
        quick = size_label == "quick" or size < 2 * profile.guest.memory_mib * 1024**2
        run_uuid = uuidlib.uuid4().hex
        lock = RunLock(spec.node)
        lock.acquire({"pid": os.getpid(), "profile": profile.name, "run_id": self.run_id})
        old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        for s in old:
            signal.signal(s, self._on_signal)
        stack = contextlib.ExitStack()
        state: str = "aborted"
        reason: str | None = "unknown"
        try:
            fields = dict(uuid=run_uuid, profile_name=profile.name, profile_hash=profile.hash,
                          profile_toml=profile.to_toml(), suite=spec.suite, size_bytes=size,
                          size_label=size_label, state="running", node=spec.node or platform.node(), pid=os.getpid(),
                          started_at=time.time())
            if self.run_id is None:
                self.run_id = self.store.create_run(**fields)  # type: ignore[attr-defined]
            else:
                self.store.update_run(self.run_id, **fields)  # type: ignore[attr-defined]
            self.store.set_provenance(self.run_id, Provenance(controller=Controller.this_host()))  # type: ignore[attr-defined]
            lock.update({"pid": os.getpid(), "profile": profile.name, "run_id": self.run_id})
            self.event(StateEvent("running", profile=profile.name, suite=spec.suite, plan=tuple(spec.plan())))
            if spec.node:
                self._run_on_node(profile, stack)
            else:
                self._run(profile, size, size_label, quick, run_uuid, stack)
            state, reason = "completed", None
            if spec.suite == "guest":
                reason = "the guest shut down"
        except (Aborted, KeyboardInterrupt) as e:
            reason = str(e) or "cancelled (Ctrl-C)"
            if self._holding:  # stopping a guest session is its normal end
                state, reason = "completed", f"guest stopped ({reason})"
        except CloudboxError as e:
            reason = str(e) + self._console_note(e)
        except Exception as e:  # a bug: still clean up and record it
            reason = f"internal error: {e.__class__.__name__}: {e}"
            raise
        finally:
            self._cleaning = True
            self.step("cleaning up")
            try:
                stack.close()
            except Exception as e:  # noqa: BLE001
                reason = f"{reason or ''} (cleanup problem: {e})".strip()
            if self.run_id is not None:
                # finish_run also appends the final `state` event, atomically with the state change.
                self.store.finish_run(self.run_id, state, reason)  # type: ignore[attr-defined]
                if self.emit:
                    self.emit(StateEvent(state, reason))
            for s, h in old.items():
                signal.signal(s, h)
            lock.release()
        assert self.run_id is not None
        return self.run_id

    def _console_note(self, err: CloudboxError) -> str:
        """When the guest died or its agent went silent: the last lines of its serial console (read before the
        work directory holding the log is removed) and of libvirt's log of its QEMU process (a guest reset without
        a word, a KVM error), to go after the abort reason. Else ""."""
        g = self._guest
        if g is None or g.console_log is None:
            return ""
        if not isinstance(err, GuestUnreachable) and g.is_active():
            return ""
        tail = g.console_tail(CONSOLE_TAIL_LINES)
        if tail:
            note = (f"\nlast {len(tail)} lines of the guest's serial console:\n"
                    + "\n".join(f"  | {line}" for line in tail))
        else:
            note = f"\n(guest {g.name} printed nothing on its serial console)"
        qemu = g.qemu_log_tail(QEMU_LOG_TAIL_LINES)
        if qemu:
            note += (f"\nlast {len(qemu)} lines of its QEMU log ({QEMU_LOG_DIR / (g.name + '.log')}):\n"
                     + "\n".join(f"  : {line}" for line in qemu))
        return note

    def _launch(self, conn, xml: str, console_log: Path, acc, stack: contextlib.ExitStack
                ) -> tuple[Guest, float, float, int]:
        """Start the guest and wait for its agent: (guest, seconds waited, seconds since this attempt's launch,
        attempts). Under emulation or nested virtualization (acc.emulated or acc.nested) a guest that dies while
        booting or whose agent stays silent is launched once more, announced as a step with its console's last
        lines (the first console is kept as console-attempt1.log): multi-threaded TCG and nested KVM inside TCG
        lose a boot now and then (docs/image.md). With KVM on bare metal that means something is wrong: no retry."""
        attempts = BOOT_ATTEMPTS if (acc.emulated or acc.nested) else 1
        for attempt in range(1, attempts + 1):
            t0 = time.monotonic()
            with self._atomic():
                guest = Guest.start(conn, xml, console_log=console_log)
                stack.callback(guest.destroy)
                self._guest = guest
            try:
                waited = guest.wait_agent(timeout=self.spec.agent_timeout,
                                          on_wait=lambda s: self._check_cancel_and(
                                              lambda: self.event(ProgressEvent("guest", BOOT, 0, f"{s:.0f}s"))))
                return guest, waited, time.monotonic() - t0, attempt
            except GuestUnreachable as e:
                if attempt == attempts or self.cancelled():
                    raise
                note = self._console_note(e)
                with self._atomic():
                    guest.destroy()
                    self._guest = None
                kept = console_log.with_name(f"console-attempt{attempt}.log")
                with contextlib.suppress(OSError):
                    console_log.replace(kept)
                self.step(f"guest {guest.name} did not come up ({e}); {acc.label} loses a boot now and then: "
                          f"launching it again (attempt {attempt + 1} of {attempts})")
                if note:
                    self.log(note.strip("\n") + f"\n(attempt {attempt}'s console: {kept})")
        raise AssertionError("unreachable")

    def _run(self, profile, size: int, size_label: str, quick: bool, run_uuid: str,
             stack: contextlib.ExitStack) -> None:
        from .domain import render_domain

        spec = self.spec
        want_storage = spec.suite in ("storage", "all")
        want_net = spec.suite in ("network", "all")
        session = spec.suite == "guest"
        tests = storage.resolve_tests(spec.storage_tests) if want_storage else []
        net_tests = resolve_net_tests(spec.net_tests) if want_net else []
        runtime = spec.runtime or (5 if quick else 30)
        net_seconds = spec.net_seconds or (5 if quick else 30)

        self.step("checking the benchmark guest image")
        image = GuestImage.locate()
        self.step("probing the accelerator")
        acc = accel.detect(image.kernel)
        self.log(f"accelerator: {acc.label}: {acc.reason}")
        if profile.guest.hypervisor == "xen":
            raise CloudboxError(
                f"profile {profile.name} needs the Xen hypervisor, but this host runs Linux without Xen "
                "(/proc/xen not present); boot the appliance's Xen entry to run Xen profiles")
        labels = []
        if acc.emulated:
            labels.append("emulated")
        if acc.nested:
            labels.append("nested")
        if quick:
            labels.append("quick-size")

        self.step("connecting to libvirt")
        with self._atomic():
            conn = daemons.connect(hide_kvm=not acc.kvm_usable)
            stack.callback(conn.close)
        live = {r.uuid for r in self.store.active_runs()}  # type: ignore[attr-defined]
        for name in reap_orphans(conn, live | {run_uuid}):
            self.log(f"destroyed orphan guest {name} left by a dead run")

        base = Path(spec.work_dir) if spec.work_dir else paths.state_dir() / "work"
        self.step(f"preparing the backing store ({profile.disk.backing}, {backing.human_size(size)})")
        work_dir = base / f"run-{run_uuid[:12]}"
        with self._atomic():
            store = backing.prepare(profile.disk.backing, work_dir=work_dir,
                                    size_bytes=size, fmt=profile.disk.format, device=spec.device or None,
                                    confirm=spec.destroy or None, volume=profile.disk.volume)
            stack.callback(store.remove)
        labels += store.labels
        prov = self._provenance(conn, acc, image, store)
        self.store.update_run(self.run_id, accelerator=acc.name, emulated=int(acc.emulated or acc.nested))  # type: ignore[attr-defined]
        self.store.set_provenance(self.run_id, prov)  # type: ignore[attr-defined]

        sampler = None
        if store.host_device and want_storage:
            from .diskstats import Sampler

            def on_sample(s) -> None:
                row = s.as_dict()
                row["test"] = self._current_test
                # One transaction: the timeline row and its live `sample` event.
                self.store.add_samples(self.run_id, [row], event=True)  # type: ignore[attr-defined]
                if self.emit:
                    self.emit(SampleEvent.from_payload(row))

            with self._atomic():
                sampler = stack.enter_context(Sampler(store.host_device, on_sample))

        # ---- bare-metal storage baseline --------------------------------------------------
        host_runner = storage.HostRunner(self.cancelled)
        if want_storage:
            self.step("bare metal: storage tests", side="baseline")
            if storage.needs_fill(tests):
                self.step("bare metal: laying down data for read tests", side="baseline")
                host_runner.fill(store.baseline_target, size)
            for t in tests:
                run_host = functools.partial(host_runner.run, t, store.baseline_target, size, runtime,
                                             self._progress("baseline", t.id))
                self._storage_test("baseline", t, run_host, sampler, labels, lambda: None)
            if not store.is_block:
                Path(store.baseline_target).unlink(missing_ok=True)

        # ---- network plumbing (before the guest: its NIC attaches to the bridge) ------------
        hostnet = None
        peer = spec.peer if want_net else ""
        if peer:
            private = self._check_private_network(peer)
            prov.private_network = PrivateNetwork(bridge=private, peer=peer)
        if want_net or session:
            hostnet = network.HostNetwork(profile.network.mtu)
            stack.callback(hostnet.teardown)
            with self._atomic():
                if peer:
                    hostnet.use_bridge(private)
                    self.step(f"network: the private bridge {private} ({hostnet.host_ip}) and the baseline "
                              f"namespace, MTU {profile.network.mtu}")
                else:
                    self.step(f"network: bridge {network.BRIDGE} and baseline namespace, MTU {profile.network.mtu}")
                    hostnet.setup_bridge()
                if want_net:
                    hostnet.setup_netns()
            for what in hostnet.reaped:
                self.log(f"removed {what}, left by a run that is gone")

        # ---- the guest ---------------------------------------------------------------------
        name = f"cloudbox-{profile.name}-{run_uuid[:8]}"
        # virtlogd (root) writes it; it goes with the work directory when the store is removed.
        console_log = work_dir / "console.log"
        xml = render_domain(profile, name=name, domain_type=acc.domain_type, kernel=str(image.kernel),
                            initrd=str(image.initrd), cmdline=CMDLINE, disk_path=store.path,
                            disk_is_block=store.is_block, bridge=hostnet.bridge if hostnet else None,
                            mac=None, run_uuid=run_uuid, console_log=str(console_log))
        self.step(f"launching guest {name} ({acc.label})")
        guest, waited, boot_s, attempts = self._launch(conn, xml, console_log, acc, stack)
        self.log(f"guest agent ready after {waited:.1f} s" + (f" (boot attempt {attempts})" if attempts > 1 else ""))
        guest_kernel = guest.sh("uname -r", timeout=30).stdout.strip()
        prov.domain_xml = guest.xml()
        prov.guest_kernel = guest_kernel
        prov.launch_to_agent_s = round(boot_s, 2)
        prov.boot_attempts = attempts
        self.store.set_provenance(self.run_id, prov)  # type: ignore[attr-defined]
        self.event(ProgressEvent("guest", BOOT, 100))

        if session:
            self._hold(guest, profile.network.mtu, boot_s)
            return

        if want_storage:
            gr = storage.GuestRunner(guest, self.cancelled)
            gr.check_tools(tests)
            disk = gr.disk()
            self.log(f"guest benchmark disk: {disk} (bus {profile.disk.bus})")
            self.step("guest: storage tests", side="guest")
            if storage.needs_fill(tests):
                self.step("guest: laying down data for read tests", side="guest")
                gr.fill(disk, size)
            for t in tests:
                run_guest = functools.partial(gr.run, t, disk, size, runtime, self._progress("guest", t.id))
                self._storage_test("guest", t, run_guest, sampler, labels, gr.drop_caches)

        if want_net and hostnet is not None:
            self._net_tests(profile, guest, hostnet, net_tests, net_seconds, labels, prov,
                            relaunch=lambda: self._launch(conn, xml, console_log, acc, stack)[0])

    def _net_tests(self, profile, guest: Guest, hostnet: network.HostNetwork, net_tests: list[network.NetTest],
                   net_seconds: int, labels: list[str], prov: Provenance, relaunch: Callable[[], Guest]) -> None:
        """The network tests, guest and bare metal side by side. A guest test whose path stops for good
        (NicStalled: re-plugging the NIC did not bring it back) has the guest relaunched once and runs again."""
        spec, peer = self.spec, self.spec.peer
        mtu = profile.network.mtu

        def configure(g: Guest) -> network.GuestLink:
            self.step("guest: configuring the NIC and checking the MTU end to end")
            nic, guest_ip = network.configure_guest(g, mtu, host_ip=hostnet.host_ip, dhcp=bool(peer))
            self.log(f"MTU {mtu} verified end to end (guest {nic} {guest_ip} -> bridge {hostnet.bridge} "
                     f"{hostnet.host_ip})")
            if peer:
                network.guest_path(g, peer, mtu)
                self.log(f"MTU {mtu} verified end to end (guest {guest_ip} -> the front-end {peer})")
                assert prov.private_network is not None
                prov.private_network.host_ip, prov.private_network.guest_ip = hostnet.host_ip, guest_ip
                prov.private_network.mtu = mtu
                self.store.set_provenance(self.run_id, prov)  # type: ignore[attr-defined]
            return network.GuestLink(g, nic, hostnet.host_ip, hostnet.bridge, mtu)

        current = configure(guest)
        relaunches = 0

        def in_guest(t: network.NetTest, port: int, target: str) -> None:
            nonlocal current, relaunches
            while True:
                link = current
                if target != link.target:
                    link = network.GuestLink(link.guest, link.nic, target, link.bridge, mtu, local=False)
                run = functools.partial(network.run_in_guest, link.guest, t, port, net_seconds,
                                        self._progress("guest", t.id), self.cancelled, target=target, log=self.log,
                                        link=link)
                try:
                    self._net_test("guest", t, run, labels, note="measured on a guest relaunched after its network "
                                   "stopped" if relaunches else "")
                    return
                except NicStalled as e:
                    if relaunches >= NIC_RELAUNCHES or self.cancelled():
                        raise
                    relaunches += 1
                    prov.add_nic_stall(NicStall(test=t.id, hop=e.hop, remedy="relaunch"))
                    self.step(f"guest: its network stopped and re-plugging the NIC did not help ({e.hop}): "
                              f"relaunching the guest (relaunch {relaunches} of {NIC_RELAUNCHES})")
                    with self._atomic():
                        link.guest.destroy()
                    if link.guest.console_log is not None:  # keep the stalled guest's console beside the new one
                        with contextlib.suppress(OSError):
                            link.guest.console_log.replace(link.guest.console_log.with_name(
                                f"console-stall{relaunches}.log"))
                    current = configure(relaunch())
                    self.store.set_provenance(self.run_id, prov)  # type: ignore[attr-defined]

        ports = {"netperf": 0, "iperf3": 0}
        bports = {"netperf": 0, "iperf3": 0}
        peer_ports = {"netperf": spec.peer_netperf_port, "iperf3": spec.peer_iperf3_port}
        plain = host_labels(labels)
        bare_labels = [*plain, "veth-netns"]
        for nt in net_tests:
            if not current.guest.has(nt.tool):
                raise CloudboxError(f"{nt.tool} is not installed in the guest; rebuild it with 'make guest-image'")
            if not ports[nt.tool]:
                start = hostnet.start_netserver if nt.tool == "netperf" else hostnet.start_iperf3
                ports[nt.tool] = start(hostnet.host_ip)
                bports[nt.tool] = start(network.NS_HOST_IP)
            in_guest(nt, ports[nt.tool], hostnet.host_ip)
            self._net_test("baseline", nt, functools.partial(
                network.run_baseline, nt, bports[nt.tool], net_seconds,
                self._progress("baseline", nt.id), self.cancelled, log=self.log), bare_labels)
            if not peer:
                continue
            if not peer_ports[nt.tool]:
                raise CloudboxError(f"the front-end {peer} opened no {nt.tool} server for this run "
                                    "(peer_netperf_port / peer_iperf3_port)")
            fe = network.frontend_test(nt)
            in_guest(fe, peer_ports[nt.tool], peer)
            self._net_test("baseline", fe, functools.partial(
                network.run_baseline, fe, peer_ports[nt.tool], net_seconds,
                self._progress("baseline", fe.id), self.cancelled, target=peer, netns=None, log=self.log),
                [*plain, "private-network"])

    def _check_private_network(self, peer: str) -> str:
        """The private bridge of this back-end, after proving that full-size frames reach the front-end `peer`."""
        self.step(f"network: checking the private network to the front-end {peer}")
        found = nodeconf.check_private_path(peer, "the front-end")
        if found is None:
            raise CloudboxError(f"the front-end {peer} asked for network tests to it, but this host's node settings "
                                f"({nodeconf.node_settings_file()}) name no private NIC: it is not an installed "
                                "back-end")
        link, pc = found
        self.log(pc.message)
        if not pc.ok:
            raise CloudboxError(pc.message)
        return link

    def _run_on_node(self, profile, stack: contextlib.ExitStack) -> None:
        """The run on an enrolled node: check it is up, propagate the guest image (timed), start the node's own
        executor there, mirror its events here live, then bring its measurements and provenance into this
        database. Cancelling here cancels the node's run (its guest and stores are removed there)."""
        from .nodes import health, registry, remote

        spec = self.spec
        self.step(f"checking node {spec.node}")
        with registry.Registry() as reg:
            try:
                node = reg.node(spec.node)
            except CloudboxError:
                known = ", ".join(n.name for n in reg.nodes()) or "none enrolled"
                raise CloudboxError(f"--node {spec.node!r}: no such node; allowed: {known}") from None
            shell = remote.NodeShell.for_node(reg, node)
        h = health.check_node(node)
        if h.state != "up":
            raise CloudboxError(f"node {node.name} is down: {h.reason}")
        self.log(f"node {node.name} ({node.address}) is up: {h.reason}")
        image = GuestImage.locate()
        self.step(f"propagating the guest image to {node.name}", side="guest")
        prop = remote.propagate_image(
            shell, image, cancelled=self.cancelled,
            progress=lambda done, total: self.event(ProgressEvent("guest", BOOT, 0, f"copy {done * 100 // total}%")))
        self.log(prop.describe())
        with registry.Registry() as reg:
            reg.add_propagation(asdict(prop))
        # The front-end's part of the provenance; the node's own (host, CPU, versions, domain XML) joins it at the end.
        ours = Provenance(controller=Controller.this_host(), nodes=Nodes(front_end=platform.node(), back_end=node.name),
                          node=NodeInfo(name=node.name, address=node.address,
                                        host_key_fingerprint=node.host_key_fingerprint),
                          propagation=prop)
        self.store.set_provenance(self.run_id, ours)  # type: ignore[attr-defined]
        remote_spec = {k: v for k, v in asdict(spec).items() if k != "node"}
        if spec.suite in ("network", "all"):
            remote_spec.update(self._serve_peer(profile, stack))
            if remote_spec.get("peer"):
                ours.peer = PeerServers(peer=remote_spec["peer"], peer_netperf_port=remote_spec["peer_netperf_port"],
                                        peer_iperf3_port=remote_spec["peer_iperf3_port"])
        self.step(f"starting the run on {node.name}")
        with self._atomic():
            rr = remote.start_run(shell, remote_spec, profile.to_toml(), prop.remote_dir)
            finished = {"done": False}

            def stop_remote() -> None:
                if not finished["done"]:
                    try:
                        self.log(f"cancelling run {rr.run_id} on {node.name}: {remote.cancel_run(shell, rr)}")
                    except CloudboxError as e:
                        self.log(f"could not cancel run {rr.run_id} on {node.name}: {e}")

            stack.callback(stop_remote)
        ours.remote_run = rr
        self.store.set_provenance(self.run_id, ours)  # type: ignore[attr-defined]
        self.log(f"run {rr.run_id} on {node.name} started; its own record stays there")
        seq, final = 0, dict[str, object]()
        self._holding = spec.suite == "guest"  # stopping a guest session is its normal end, as on this host
        dropped_at: float | None = None  # when the stream first dropped without the run having ended
        while True:
            try:
                for ev_seq, kind, payload in remote.follow(shell, rr, cancelled=self.cancelled, after_seq=seq):
                    seq = ev_seq  # where a re-attached stream picks up
                    dropped_at = None
                    self._mirror(kind, payload, final)
                break
            except remote.NodeError as e:
                if self._cancel:
                    break
                now = time.monotonic()
                dropped_at = dropped_at or now
                if now - dropped_at > remote.REATTACH_WITHIN_S:
                    h = health.check_node(node)
                    raise CloudboxError(f"lost node {node.name} during the run: no event stream for "
                                        f"{now - dropped_at:.0f} s ({e}); its health check: {h.state}, {h.reason}; "
                                        f"run {rr.run_id} there is left to finish or be cleaned up by the node") \
                        from None
                self.log(f"re-attaching to run {rr.run_id} on {node.name} in 10 s ({e})")
                time.sleep(10)
        if self._cancel:
            raise Aborted(f"cancelled by {self._signal_name or 'request'}")
        self._holding = False
        data = remote.fetch_run(shell, rr)
        rr.uuid = str(data.get("uuid") or rr.uuid)  # the node's executor gives its run its final uuid
        finished["done"] = data.get("state") != "running"
        ours.remote_run = rr
        self.store.update_run(self.run_id, accelerator=data.get("accelerator"),  # type: ignore[attr-defined]
                              emulated=int(bool(data.get("emulated"))), size_bytes=data.get("size_bytes"),
                              size_label=data.get("size_label"))
        self.store.set_provenance(self.run_id, Provenance.from_stored(data.get("provenance")).under(ours))  # type: ignore[attr-defined]
        for m in data.get("measurements") or []:  # as the node's export wrote them (its own columns)
            self.store.add_measurement(self.run_id, **{k: m.get(k) for k in MEASUREMENT_COLUMNS if k in m})  # type: ignore[attr-defined]
        if data.get("state") != "completed":
            raise CloudboxError(f"the run on {node.name} (its run {rr.run_id}) ended {data.get('state')}: "
                                f"{data.get('reason') or final.get('reason') or 'no reason given'}")

    def _serve_peer(self, profile, stack: contextlib.ExitStack) -> dict:
        """The front-end's side of the cross-node network tests: netserver and iperf3 on its private address for
        the length of the run (stopped with it). {} when this host has no private network (not an installed
        front-end): the node's guest -> front-end tests are then left out, and the log says so."""
        addr = nodeconf.private_address()
        if addr == "0.0.0.0":
            self.log("this host has no private network address (its node settings name no private NIC): the "
                     "guest -> front-end network tests are left out of this run")
            return {}
        tools = {nt.tool for nt in resolve_net_tests(self.spec.net_tests)}
        servers = network.HostNetwork(profile.network.mtu)
        stack.callback(servers.teardown)
        fields = {"peer": addr,
                  "peer_netperf_port": servers.start_netserver(addr) if "netperf" in tools else 0,
                  "peer_iperf3_port": servers.start_iperf3(addr) if "iperf3" in tools else 0}
        self.log(f"serving the cross-node network tests on {addr}: "
                 + ", ".join(f"{t} port {fields[f'peer_{t}_port']}" for t in sorted(tools)))
        return fields

    def _mirror(self, kind: str, payload: dict, final: dict) -> None:
        """One event of the node's run, re-emitted here (samples stored as this run's timeline)."""
        ev = parse(kind, payload)
        if isinstance(ev, StateEvent):
            if ev.state == "running":
                self.event(ev)
            else:
                final.update(ev.to_payload())
            return
        if isinstance(ev, SampleEvent):
            self.store.add_samples(self.run_id, [ev.to_payload()], event=True)  # type: ignore[attr-defined]
            if self.emit:
                self.emit(ev)
            return
        if isinstance(ev, StepEvent):
            ev = dataclasses.replace(ev, text=f"{self.spec.node}: {ev.text}")
        if ev is not None:
            self.event(ev)

    def _hold(self, guest: Guest, mtu: int, boot_s: float) -> None:
        """A guest session: bring up its NIC, then keep the guest until it shuts down or is stopped."""
        self.step("guest: configuring the NIC and checking the MTU end to end")
        nic, ip = network.configure_guest(guest, mtu)
        self.log(f"guest {guest.name} is up: {nic} {ip} on bridge {network.BRIDGE} (MTU {mtu}), "
                 f"launch to agent {boot_s:.1f} s")
        self.step(f"guest {guest.name} running; stop it with 'cloudbox cancel {self.run_id}'")
        self._holding = True
        while guest.is_active():
            if self._cancel:
                raise Aborted(f"cancelled by {self._signal_name or 'request'}")
            time.sleep(1.0)
        self._holding = False

    def _check_cancel_and(self, fn: Callable[[], None]) -> None:
        if self._cancel:
            raise Aborted("cancelled while the guest was booting")
        fn()

    def _progress(self, side: str, test: str) -> Callable[[dict], None]:
        return lambda p: self.event(ProgressEvent.from_payload({"side": side, "test": test, **p}))

    def _storage_test(self, side: str, t: storage.StorageTest, run: Callable[[], storage.FioResult],
                      sampler, labels: list[str], guest_drop: Callable[[], None]) -> None:
        if self._cancel:
            raise Aborted("cancelled")
        tl = list(dict.fromkeys([*labels, *t.labels]))
        if side == "baseline":
            tl = host_labels(tl)
        if "read" in t.rw:
            if not storage.drop_host_caches():
                tl.append("warm-cache")
            guest_drop()
        self._current_test = f"{side}:{t.id}"
        self.step(f"{side}: {t.id}", side=side, test=t.id)
        # Host metrics for the measurement: the device's counters at exactly the test's start and end
        # (iostat over the whole test); the 1 s sampler feeds the live timeline.
        c0 = read_counters(sampler.device) if sampler else None
        start = time.time()
        res = run()
        end = time.time()
        self._current_test = "idle"
        host = None
        if sampler and c0 is not None:
            d = delta(c0, read_counters(sampler.device), sampler.device)
            host = {"host_mbps": d.read_mbps + d.write_mbps, "host_avgrq_sectors": d.avgrq_sectors,
                    "host_avgqu": d.avgqu, "host_util": d.util}
        common = dict(side=side, test=t.id, labels=tl, started_at=start, finished_at=end,
                      **(host or {}))
        self.store.add_measurement(self.run_id, metric="MB/s", value=res.mbps, raw=res.raw, **common)  # type: ignore[attr-defined]
        if t.timed:
            self.store.add_measurement(self.run_id, metric="IOPS", value=res.iops, raw="", **common)  # type: ignore[attr-defined]
            self.store.add_measurement(self.run_id, metric="lat_us", value=res.lat_us, raw="", **common)  # type: ignore[attr-defined]
        hr = {k: round(v, 2) for k, v in (host or {}).items()}
        self.event(MeasurementEvent(side, t.id, "MB/s", round(res.mbps, 2), tuple(tl), round(res.iops, 1),
                                    hr.get("host_mbps"), hr.get("host_avgrq_sectors"), hr.get("host_avgqu"),
                                    hr.get("host_util")))

    def _net_test(self, side: str, t: network.NetTest, run: Callable[[], network.NetResult],
                  labels: list[str], note: str = "") -> None:
        if self._cancel:
            raise Aborted("cancelled")
        self.step(f"{side}: {t.id} ({t.direction})", side=side, test=t.id)
        start = time.time()
        res = run()
        end = time.time()
        tl = list(dict.fromkeys(labels))
        common = dict(side=side, test=t.id, labels=tl, started_at=start, finished_at=end)
        raw = res.raw
        if res.hung:  # the run's log says what was seen; the measurement keeps that it is a retry
            raw += f"\n# cloudbox: measured on attempt {res.hung + 1}; {res.hung} before it hung and was killed\n"
        for n in [*res.notes, *([note] if note else [])]:
            raw += f"# cloudbox: {n}\n"
        self.store.add_measurement(self.run_id, metric=res.metric, value=res.value, raw=raw, **common)  # type: ignore[attr-defined]
        if res.lat_us is not None and t.kind == "TCP_RR":
            self.store.add_measurement(self.run_id, metric="lat_us", value=res.lat_us, raw="", **common)  # type: ignore[attr-defined]
        self.event(MeasurementEvent(side, t.id, res.metric, round(res.value, 2), tuple(tl)))

    def _provenance(self, conn, acc, image: GuestImage, store: backing.BackingStore) -> Provenance:
        from .. import __version__

        def ver(cmd: list[str]) -> str:
            try:
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
                return (out.stdout or out.stderr).strip().splitlines()[0]
            except (OSError, IndexError, subprocess.TimeoutExpired):
                return "not installed"

        def lv(n: int) -> str:
            return f"{n // 1000000}.{n // 1000 % 1000}.{n % 1000}"

        return Provenance(
            controller=Controller.this_host(), host=platform.node(), host_kernel=platform.release(), cpu=_cpu_model(),
            accelerator=acc,
            versions=Versions(cloudbox=__version__, qemu=ver(["qemu-system-x86_64", "--version"]),
                              libvirt=lv(conn.getLibVersion()), hypervisor=lv(conn.getVersion()),
                              fio=ver(["fio", "--version"]), netperf=ver(["netperf", "-V"]),
                              iperf3=ver(["iperf3", "--version"]), guest_packages=image.packages),
            guest_image=GuestImageInfo(kernel_version=image.kernel_version, sha256=image.manifest.get("sha256", {})),
            backing=BackingInfo(kind=store.kind, path=store.path, device=store.host_device, model=store.model,
                                size_bytes=store.size_bytes, format=store.format, is_block=store.is_block),
            spec=self.spec)


def host_labels(labels: list[str]) -> list[str]:
    """A run's labels as the host side (the baseline) carries them: never "emulated" (no guest there); and
    "nested" (this host is itself a virtual machine) becomes "virtualized-host": the "bare metal" side ran on a
    VM, and says so wherever it is shown."""
    out = [x for x in labels if x not in ("emulated", "nested")]
    return [*out, "virtualized-host"] if "nested" in labels else out


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


# ------------------------------------------------------------------------------------- detached
def start_detached(spec: RunSpec, store) -> int:
    """Start the executor in its own session (it outlives the caller); returns the run id at once."""
    spec.validate()
    check_not_busy(spec.node)
    run_id = store.create_run(uuid=uuidlib.uuid4().hex, profile_name=spec.profile, suite=spec.suite,
                              state="running", node=spec.node or platform.node(), started_at=time.time(),
                              provenance=Provenance(controller=Controller.this_host()))
    log_dir = paths.state_dir() / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log = open(log_dir / f"run-{run_id}.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "cloudbox.core.runner", str(run_id), json.dumps(asdict(spec))],
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    log.close()
    store.update_run(run_id, pid=proc.pid)
    return run_id


def cancel(store, run_id: int, timeout: float = 60.0) -> str:
    """Ask a run's executor to stop (SIGTERM: it cleans up and stores the run as aborted)."""
    run = store.get_run(run_id)
    if run.state != "running":
        return run.state
    if not run.pid:
        raise CloudboxError(f"run {run_id} has no executor pid recorded")
    try:
        os.kill(run.pid, signal.SIGTERM)
    except ProcessLookupError:
        store.reap_dead_runs()
        return store.get_run(run_id).state
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = store.get_run(run_id).state
        if state != "running":
            return state
        time.sleep(0.5)
    return "running"


# ----------------------------------------------------------------------------------------- sweeps
@dataclass
class Sweep:
    """Several runs queued one after another (profiles x one suite), executed by one detached process.

    Its state lives in <state dir>/sweeps/<id>.json, rewritten by the sweep process after every change:
    `runs[i]` is the run id of `specs[i]` once it has started (None while queued), `state` is running,
    completed (every item ran, whatever each run's outcome) or cancelled (the rest was skipped)."""

    id: str
    specs: list[RunSpec]
    runs: list[int | None]
    state: str = "running"
    pid: int | None = None
    started_at: float = 0.0
    finished_at: float | None = None

    @property
    def path(self) -> Path:
        return sweeps_dir() / f"{self.id}.json"

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = {**asdict(self), "specs": [asdict(s) for s in self.specs]}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, self.path)

    @classmethod
    def load(cls, path: Path) -> Sweep:
        data = json.loads(path.read_text())
        data["specs"] = [RunSpec(**s) for s in data["specs"]]
        return cls(**data)

    @property
    def queued(self) -> int:
        return sum(1 for r in self.runs if r is None) if self.state == "running" else 0


SWEEP_START_GRACE_S = 60.0  # how long a new sweep may take to record its process before it counts as dead


def sweeps_dir() -> Path:
    return paths.state_dir() / "sweeps"


def list_sweeps() -> list[Sweep]:
    """Known sweeps, newest first. A 'running' sweep whose process is gone is reported as 'died'."""
    from .results import pid_alive

    out = []
    d = sweeps_dir()
    for f in sorted(d.glob("*.json"), reverse=True) if d.is_dir() else []:
        try:
            sw = Sweep.load(f)
        except (OSError, ValueError, TypeError):
            continue
        if sw.state == "running":
            if sw.pid is None:
                if time.time() - sw.started_at > SWEEP_START_GRACE_S:
                    sw.state = "died"  # its process never recorded itself
            elif not pid_alive(sw.pid, sw.started_at):
                sw.state = "died"
        out.append(sw)
    return out


def start_sweep(specs: list[RunSpec], store) -> Sweep:
    """Queue `specs` to run one after another in a detached process (it outlives the caller)."""
    if not specs:
        raise CloudboxError("a sweep needs at least one profile")
    for spec in specs:
        spec.validate()
    for node in dict.fromkeys(spec.node for spec in specs):
        check_not_busy(node)
    sweep = Sweep(id=time.strftime("sweep-%Y%m%d-%H%M%S-") + uuidlib.uuid4().hex[:6], specs=specs,
                  runs=[None] * len(specs), started_at=time.time())
    sweep.save()
    log_dir = paths.state_dir() / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / f"{sweep.id}.log", "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "cloudbox.core.runner", "--sweep", str(sweep.path)],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    # Only the child writes the file from now on (it records its own pid first): a second writer here could
    # overwrite the child's progress. Until the pid appears, list_sweeps() reports the sweep as starting.
    sweep.pid = proc.pid
    return sweep


def _run_sweep(path: Path) -> int:
    from .results import ResultStore

    sweep = Sweep.load(path)
    sweep.pid = os.getpid()
    sweep.save()
    stop = {"signal": ""}

    def on_signal(signum, _frame) -> None:
        stop["signal"] = signal.Signals(signum).name

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, on_signal)
    rc = 0
    with ResultStore() as store:
        for i, spec in enumerate(sweep.specs):
            if stop["signal"]:
                break
            run_id = store.create_run(uuid=uuidlib.uuid4().hex, profile_name=spec.profile, suite=spec.suite,
                                      state="running", node=platform.node(), started_at=time.time())
            sweep.runs[i] = run_id
            sweep.save()
            ex = Executor(spec, store, run_id=run_id)
            try:
                ex.execute()
            except RunBusy as e:  # raised before the executor owns the run: record it here
                store.finish_run(run_id, "failed", str(e))
                rc = 1
            except Exception as e:  # noqa: BLE001 - the executor recorded it in the run
                print(f"sweep {sweep.id}: run {run_id}: {e}", file=sys.stderr)
                rc = 1
            if ex.cancelled():
                stop["signal"] = stop["signal"] or "cancel"
    sweep.state = "cancelled" if stop["signal"] else "completed"
    sweep.finished_at = time.time()
    sweep.save()
    return rc


def _main(argv: list[str]) -> int:
    from .results import ResultStore

    if argv and argv[0] == "--sweep":
        return _run_sweep(Path(argv[1]))
    run_id, spec = int(argv[0]), RunSpec(**json.loads(argv[1]))
    with ResultStore() as store:
        ex = Executor(spec, store, run_id=run_id)
        try:
            ex.execute()
        except Exception as e:  # noqa: BLE001 - recorded in the run already
            print(f"executor: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
