"""The TUI's one door to cloudbox.core: results store, host facts and readiness, the cluster (nodes, join codes),
profiles, guests, runs, sweeps and volumes.

Every method may block (SQLite, libvirt, lsblk, an accelerator probe) and is called from worker
threads, never from the UI thread. Tests and screenshots pass fixed host facts (and readiness), a libvirt URI
(e.g. libvirt's test:///default) and fixed volume exports so what the screens show is deterministic.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cloudbox.core import paths
from cloudbox.core.cluster import enrol, frontend, protocol, registry
from cloudbox.core.disks import hostraid
from cloudbox.core.disks.volumes import attach as vattach
from cloudbox.core.disks.volumes.store import Volume, VolumeStore, volumes_db
from cloudbox.core.errors import CloudboxError, LibvirtUnavailable, NotFound
from cloudbox.core.record.results import ResultStore
from cloudbox.core.record.rows import Event, Run
from cloudbox.core.run import runs
from cloudbox.core.run.runs import Sweep
from cloudbox.core.spec import profiles
from cloudbox.core.spec.profiles import Profile, ProfileEntry
from cloudbox.core.spec.runspec import RunSpec
from cloudbox.core.studies import capability, cellstates, evidence, loading, markdown, planning, schema
from cloudbox.core.views import compare, host, render
from cloudbox.core.virt import accel, daemons, guest


@dataclass
class Cluster:
    """What the overview says about the cluster besides the node rows."""

    open_codes: list[registry.JoinCode] = field(default_factory=list)
    server_running: bool = False
    front_end: dict[str, Any] | None = None  # on an enrolled back-end: the pinned front-end (frontend.json)
    problem: str | None = None


@dataclass
class Volumes:
    """The Volumes screen's data: the registry's volumes, the runs attached to them and how this host exports."""

    volumes: list[Volume] = field(default_factory=list)
    runs: dict[str, Run] = field(default_factory=dict)  # attached run uuid -> its run in the results store
    exports: list[vattach.Export] = field(default_factory=list)


class Backend:
    def __init__(self, *, db: Path | str | None = None, facts: host.HostFacts | None = None,
                 libvirt_uri: str | None = None, enrol_bind: str | None = None, enrol_port: int = protocol.PORT,
                 exports: list[vattach.Export] | None = None, answers: capability.Answers | None = None):
        self._db = db
        self._fixed_facts = facts
        self._fixed_answers = answers  # the readiness report, fixed for screenshots (None: this host's)
        self._fixed_exports = exports  # how volumes are exported, fixed for screenshots (None: this host's)
        self._exports: dict[str, list[vattach.Export]] = {}  # this host's, per hypervisor, until forget_exports()
        self._uri = libvirt_uri
        self._enrol_bind = enrol_bind  # None: the private NIC's address (nodeconf.private_address)
        self._enrol_port = enrol_port
        self._store: ResultStore | None = None
        self._lock = threading.Lock()

    # -- results store -----------------------------------------------------------------------------
    @property
    def store(self) -> ResultStore:
        with self._lock:
            if self._store is None:
                self._store = ResultStore(self._db)
            return self._store

    def close(self) -> None:
        with self._lock:
            if self._store is not None:
                self._store.close()
                self._store = None

    # -- host ----------------------------------------------------------------------------------------
    def facts(self, *, probe: bool = True) -> host.HostFacts:
        """This host's facts. Fixed facts (tests, screenshots) stand for the host; the enrolled nodes still come
        from the node registry in the state dir, as they do in host.gather()."""
        f = self._fixed_facts
        if f is None:
            return host.gather(probe=probe)
        problems = list(f.problems)
        enrolled = host.registry_nodes(f.role, problems)
        if not enrolled and problems == f.problems:
            return f
        return dataclasses.replace(f, nodes=[*f.nodes, *enrolled], problems=problems)

    def readiness(self) -> capability.Answers:
        """What `cloudbox host readiness --fio-seconds 0 --link-seconds 0` reports: the box's facts (no disk is
        read, no stream sent; each node is pinged) and, per study and size, the cells it can run here."""
        if self._fixed_answers is not None:
            return self._fixed_answers
        return capability.answers(self.facts(probe=False).accelerator, fio_seconds=0, link_seconds=0)

    # -- the cluster -------------------------------------------------------------------------------------
    def boot(self) -> accel.Boot:
        """What this box is booted into (Xen's dom0, KVM or TCG), without probing; fixed facts stand for the host."""
        f = self._fixed_facts
        if f is None:
            return dataclasses.replace(host.boot(), host_raid=self._host_raid)
        return accel.boot_of(f.accelerator, xen=f.accelerator is not None and f.accelerator.name == "xen")

    @functools.cached_property
    def _host_raid(self) -> str:
        """Why this host cannot build a RAID of its own (its md and mdadm do not change while the TUI runs)."""
        return hostraid.problem()

    def cluster(self, role: str) -> Cluster:
        """Open join codes and the enrolment server (front-end, all-in-one), or the pinned front-end (back-end).
        Creates nothing: a node without a registry has no codes."""
        if role == "back-end":
            pin, _ = enrol.pin_paths()
            try:
                return Cluster(front_end=json.loads(pin.read_text()))
            except FileNotFoundError:
                return Cluster()
            except (OSError, ValueError) as e:
                return Cluster(problem=f"{pin}: unreadable: {e}")
        if not registry.nodes_db().exists():
            return Cluster(server_running=frontend.server_running())
        try:
            with registry.Registry() as reg:
                codes = reg.open_codes()
        except CloudboxError as e:
            return Cluster(problem=str(e))
        return Cluster(codes, frontend.server_running())

    def make_join_code(self, minutes: float = registry.DEFAULT_CODE_MINUTES) -> frontend.CodeOffer:
        """A join code, and the detached enrolment server (as `cloudbox node code` does)."""
        frontend.require_role("making join codes")  # before the registry is made
        with registry.Registry() as reg:
            return frontend.make_code(reg, minutes, bind=self._enrol_bind, port=self._enrol_port)

    def join_code(self, code_id: int) -> registry.JoinCode:
        with registry.Registry() as reg:
            return reg.code(code_id)

    def revoke_codes(self, code_id: int | None = None) -> list[int]:
        frontend.require_role("revoking join codes")
        if not registry.nodes_db().exists():
            return []
        with registry.Registry() as reg:
            return frontend.revoke_codes(reg, code_id)

    def remove_node(self, name: str) -> frontend.Removal:
        """Take the front-end's key off the node over SSH (if it answers), then forget it."""
        frontend.require_role("removing nodes")
        with registry.Registry() as reg:
            return frontend.remove_node(reg, name)

    # -- profiles ------------------------------------------------------------------------------------
    def profiles(self) -> list[ProfileEntry]:
        return profiles.list_profiles()

    def profile(self, name: str) -> Profile:
        return profiles.find_profile(name)

    def active_profile(self) -> str:
        return profiles.active_profile_name()

    def set_active_profile(self, name: str) -> Profile:
        return profiles.set_active_profile(name)

    def save_profile(self, data: dict, source: str) -> Path:
        prof = profiles.validate_data(data, source)
        return profiles.save_user_profile(prof)

    def delete_user_profile(self, name: str) -> Path:
        f = profiles.find_profile_path(name)
        if f.parent.resolve() != paths.user_profiles_dir().resolve():
            raise CloudboxError(f"{name} is a shipped preset ({f}); only user profiles can be deleted")
        f.unlink()
        return f

    # -- guests --------------------------------------------------------------------------------------
    def _conn(self, *, start: bool):
        return daemons.connect(self._uri, start=start)

    def guests(self) -> tuple[list[guest.GuestInfo], str | None]:
        """(guests, why the list may be incomplete). Does not start libvirtd just to list."""
        try:
            conn = self._conn(start=False)
        except (LibvirtUnavailable, CloudboxError) as e:
            return [], str(e)
        try:
            return guest.list_guests(conn), None
        finally:
            conn.close()

    def guest_xml(self, name: str) -> str:
        import libvirt

        conn = self._conn(start=False)
        try:
            return conn.lookupByName(name).XMLDesc(0)
        except libvirt.libvirtError as e:
            raise NotFound(f"guest {name}: {e}") from e
        finally:
            conn.close()

    def launch_guest(self, profile: str) -> int:
        """A guest session (suite 'guest'): detached, outlives the TUI, stopped by stop_guest()."""
        return runs.start_detached(RunSpec(profile=profile, suite="guest"), self.store)

    def stop_guest(self, info: guest.GuestInfo) -> str:
        """Stop a guest through its run (cleans up like Ctrl-C); an orphan is destroyed directly."""
        return runs.stop_guest(self.store, info, self._uri)

    def destroy_guest(self, info: guest.GuestInfo) -> None:
        """Power the guest off at once (libvirt destroy); its run, if any, then cleans up the rest."""
        guest.destroy_guest(info.name, self._uri)

    # -- runs ----------------------------------------------------------------------------------------
    def run_targets(self) -> list[tuple[str, str]]:
        """Where a run can go, as (label, --node value): this host (""), then every enrolled node with the state
        the overview shows, then a run's guests spread over this host and every node (and over the nodes alone,
        with two or more). Only this host when there is no node registry."""
        from cloudbox.core.cluster import health
        from cloudbox.core.spec.runspec import LOCAL_PLACE, MAX_PLACES

        out = [("this host", "")]
        if not registry.nodes_db().exists():
            return out
        with registry.Registry() as reg:
            names = []
            for n in reg.nodes():
                state, _ = health.shown_state(n)
                out.append((f"node {n.name} ({state})", n.name))
                names.append(n.name)
        names = names[:MAX_PLACES - 1]
        if names:
            out.append((f"spread: this host, {', '.join(names)}", ",".join([LOCAL_PLACE, *names])))
        if len(names) > 1:
            out.append((f"spread: {', '.join(names)}", ",".join(names)))
        return out

    def start_runs(self, specs: list[RunSpec]) -> tuple[int | None, Sweep | None]:
        """One spec: a detached run (its id). Several: a sweep that runs them one after another. Every spec is
        checked first, a run of N guests also against this host's memory and CPUs (as `cloudbox run` does)."""
        for spec in specs:
            spec.validate()
            if spec.guests > 1:
                runs.check_guests_fit(spec)
        if len(specs) == 1:
            return runs.start_detached(specs[0], self.store), None
        return None, runs.start_sweep(specs, self.store)

    def cancel(self, run_id: int) -> str:
        return runs.cancel(self.store, run_id)

    def cancel_sweep(self, sweep_id: str) -> str:
        """Stop a sweep (also one waiting for its next run's start), as `cloudbox cancel SWEEP-ID` does."""
        return runs.cancel_sweep(sweep_id)

    def active_runs(self) -> list[Run]:
        store = self.store
        store.reap_dead_runs()
        return store.active_runs()

    def sweeps(self) -> list[Sweep]:
        return runs.list_sweeps()

    def live(self, run_id: int, after_seq: int) -> tuple[Run, list[Event]]:
        store = self.store
        events = store.events_since(run_id, after_seq)
        run = store.get_run(run_id, raw=False)
        if run.state == "running" and store.reap_dead_runs():  # its executor was killed: aborted, as it shows now
            events += store.events_since(run_id, events[-1].seq if events else after_seq)
            run = store.get_run(run_id, raw=False)
        return run, events

    def runs(self, limit: int = 500) -> list[Run]:
        store = self.store
        store.reap_dead_runs()
        return store.list_runs(limit=limit)

    def get_runs(self, ids: list[int]) -> list[Run]:
        return [self.store.get_run(i, raw=False) for i in ids]

    def compare_text(self, ids: list[int], width: int) -> str:
        return render.to_text(compare.compare_table(self.get_runs(ids)), width=width)

    def export(self, ids: list[int], fmt: str, path: Path) -> Path:
        chosen = [self.store.get_run(i, raw=fmt == "json") for i in ids]
        if fmt == "json":
            text = render.to_json(chosen)
        elif fmt == "csv":
            text = render.to_csv(compare.compare_table(chosen))
        elif fmt == "markdown":
            text = render.to_markdown(compare.compare_table(chosen))
        else:
            raise CloudboxError(f"export format {fmt!r} is not one of json, csv, markdown")
        path = path.expanduser()
        if path.is_dir():
            raise CloudboxError(f"{path} is a directory; give a file name")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
            tmp.write_text(text)
            os.replace(tmp, path)
        except OSError as e:
            raise CloudboxError(f"cannot write {path}: {e.strerror or e}") from e
        return path

    def delete_run(self, run_id: int) -> None:
        run = self.store.get_run(run_id, raw=False)
        if run.state == "running":
            raise CloudboxError(f"run {run_id} is still running; cancel it first")
        self.store.delete_run(run_id)

    # -- volumes -------------------------------------------------------------------------------------
    def volumes(self) -> Volumes:
        """Every volume, the live run attached to each (from the results store, when it is there) and how this host
        can export them. Creates no registry: without volumes.db there are no volumes."""
        exports = self._fixed_exports
        if exports is None:  # the modes the run's first step accepts on what this box is booted into
            hypervisor = "xen" if self.boot().xen else "kvm"
            with self._lock:
                exports = self._exports.get(hypervisor)
            if exports is None:
                exports = vattach.exports_here(hypervisor=hypervisor)
                with self._lock:
                    self._exports[hypervisor] = exports
        if not volumes_db().exists():
            return Volumes(exports=exports)
        with VolumeStore() as vs:
            vols = vs.list()
        attached = {v.attached_run for v in vols if v.attached_run}
        runs = {r.uuid: r for r in self.active_runs() if r.uuid in attached} if attached else {}
        return Volumes(vols, runs, exports)

    def forget_exports(self) -> None:
        """Look again at the installed servers and the kernel's modules on the next volumes() (they change only when
        packages or the kernel do, so the screen's periodic reload does not ask)."""
        with self._lock:
            self._exports.clear()

    def create_volume(self, name: str, size_bytes: int, vg: str | None = None) -> Volume:
        """A new volume, a pre-allocated file or an LV in `vg`, as `cloudbox volume create` makes it (name, size,
        group and free space checked)."""
        with VolumeStore() as vs:
            return vs.create(name, size_bytes, field="size", vg=vg, vg_field="volume group")

    def delete_volume(self, name: str) -> Volume:
        """Remove a volume and its file; refused (VolumeBusy) while a live run has it attached."""
        with VolumeStore() as vs:
            return vs.delete(name)

    # -- studies -------------------------------------------------------------------------------------
    def study_summaries(self) -> list[evidence.StudySummary]:
        """Every study file with its counts over the stored runs; an invalid one with its problem."""
        completed = self.store.list_runs(state="completed")
        out = []
        for e in loading.list_studies():
            if e.problem is not None:
                out.append(evidence.StudySummary(e.name, "", 0, 0, {}, problem=e.problem))
                continue
            out.append(evidence.summarize(evidence.gather(loading.find_study(e.name), completed)))
        return out

    def study_matrix(self, name: str) -> tuple[schema.Study, list[cellstates.CellState]]:
        """The study and each cell's state over every stored run (running and failed ones too)."""
        study = loading.find_study(name)
        store = self.store
        store.reap_dead_runs()
        stored = store.list_runs()
        ev = evidence.gather(study, [r for r in stored if r.state == "completed"])
        return study, cellstates.cell_states(study, stored, ev.cells, unavailable=ev.unavailable, series=ev.series)

    def study_report(self, name: str) -> str:
        """The Markdown report `cloudbox study report NAME` prints."""
        study = loading.find_study(name)
        return markdown.to_markdown(evidence.gather(study, self.store.list_runs()))

    def start_study(self, name: str, size: str = "quick") -> tuple[planning.StudyRun, Sweep | None]:
        """Start the study's missing cells on this host in the background as a sweep, as `cloudbox study run NAME
        --size SIZE --detach` does; nothing starts (no sweep) when every cell is stored."""
        study = loading.find_study(name)
        todo = planning.prepare_run(study, self.store.list_runs(), size=size)
        if not todo.specs:
            return todo, None
        return todo, runs.start_sweep(todo.specs, self.store, offsets=todo.offsets)

    def run_log(self, run_id: int, lines: int = 200) -> str:
        f = paths.state_dir() / "logs" / f"run-{run_id}.log"
        try:
            return "\n".join(f.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""
