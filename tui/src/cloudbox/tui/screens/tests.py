"""Tests: choose suite, size, test set, guests at once and profile(s), start (several profiles or guest counts = a
sweep, run one after another; several profiles mixed = one run whose guests take them in turn); while a run goes:
overall progress with ETA, live charts of guest throughput (in a run
of N guests each guest's and their sum) and of the host disk's request size, queue depth and utilisation (the studies'
three host metrics), the step, each guest's figures, the log."""

from __future__ import annotations

import time
from dataclasses import dataclass

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import (
    Button,
    Checkbox,
    Input,
    Label,
    Log,
    ProgressBar,
    Select,
    Static,
    TabbedContent,
    TabPane,
    Tabs,
)

from cloudbox.core.errors import UsageError
from cloudbox.core.record.events import (
    InstanceFigures,
    MeasurementEvent,
    PlanProgress,
    ProgressEvent,
    SampleEvent,
    StateEvent,
    StepEvent,
    describe,
    instance_name,
    stamped,
)
from cloudbox.core.record.rows import Run
from cloudbox.core.run.runs import Sweep
from cloudbox.core.spec.profiles import MIX
from cloudbox.core.spec.runspec import MAX_GUESTS, RunSpec, option
from cloudbox.core.views.compare import guest_count
from cloudbox.core.virt import accel
from cloudbox.tui.screens.base import BaseScreen
from cloudbox.tui.widgets.charts import LiveChart
from cloudbox.tui.widgets.checklist import CheckList
from cloudbox.tui.widgets.dialogs import ConfirmDialog, PickDialog, TextDialog
from cloudbox.tui.widgets.runoption import run_control

# The form's controls, from the run options' one declaration (core.spec.runspec.run_option).
SUITE, SIZE, TESTS, WHERE, GUESTS, CPUS = (option(f) for f in ("suite", "size", "storage_tests", "node", "guests",
                                                                "cpu_overcommit"))
PLACEMENT = WHERE.choices[0].title  # where a run's N guests go when Where is blank: all on one host
CHARTED_GUESTS = 4  # guests with a line of their own in the throughput chart; the figures line names them all


@dataclass
class SetupData:
    profiles: list[tuple[str, str]]
    active: str
    boot: accel.Boot  # what this box is booted into
    blocked: dict[str, str]  # profiles that cannot run on this boot, with the reason (core: accel.Boot.refusal)
    runs: list[Run]
    targets: list[tuple[str, str]]  # where a run can go: ("this host", ""), then enrolled nodes


class TestsScreen(BaseScreen):
    MODE = "tests"
    RELOAD_EVERY = 5.0
    HELP = ("Start storage (fio, dd) and network (netperf, iperf3) tests: each run measures bare metal first, "
            "then a guest under the profile, on the same hardware. Pick one profile for a run, several for a "
            "sweep (run one after another), or several with 'mix' ticked (m) for one run whose guests take the "
            "profiles in turn (at least one guest each). Guests at once runs N guests of the profile together on "
            "this host (storage, network or both), each with a disk and a NIC of its own; a list such as 1,2,4 is a "
            "sweep, one run per count; vCPUs per host CPU above 1 lets their vCPUs outnumber the host's CPUs "
            "(--cpu-overcommit; their figures are marked vcpu-overcommit). Live then charts each guest's MB/s and "
            "their sum and lists each guest's figures; Results compares "
            "them (sum, each guest, min / median / max, Jain's index). "
            "On a front-end with enrolled nodes, Where places the run on a "
            "back-end (its guest, disk and network; followed live here), or spreads its guests over this host and "
            "the nodes (each storage and network test started on every place at one instant; an NFS profile's "
            "one export served by this front-end to every place). Runs go on when the TUI "
            "closes; reopening shows them live. "
            "c cancels the run you are watching (after confirmation; cleans up like Ctrl-C in the CLI), "
            "a attaches to another run in progress, l shows the run's full log.")
    BINDINGS = [
        Binding("s", "start", "Start", id="tests.start", tooltip="start the run or sweep set up here"),
        Binding("c", "cancel_run", "Cancel run", id="tests.cancel"),
        Binding("a", "attach_pick", "Attach", id="tests.attach", tooltip="watch another run in progress"),
        Binding("l", "show_log", "Full log", id="tests.log"),
        # off the footer and the Tab order (scripts count Shift+Tabs to the fields): its label names the key
        Binding("m", "toggle_mix", "Mix profiles", id="tests.mix", show=False,
                tooltip="run the ticked profiles mixed in one run instead of a sweep"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.run_id: int | None = None
        self.run: Run | None = None
        self.seq = 0
        self.progress = PlanProgress()
        self.polling = False
        self.setup: SetupData | None = None
        self.last_redraw = 0.0
        self.sweep: Sweep | None = None
        self._targets: list[tuple[str, str]] = []
        self.figures = InstanceFigures()
        self.first_device: str | None = None  # the run's own disk; another (a volume's server disk) is named

    def body(self) -> ComposeResult:
        with TabbedContent(id="tests-tabs", initial="setup"):
            with TabPane("Setup", id="setup"):
                with VerticalScroll():
                    with Horizontal(id="setup-row"):
                        with Vertical(classes="setup-col"):
                            yield Label(SUITE.title, classes="section")
                            yield run_control(SUITE, id="suite")
                            # Before Size: Shift+Tab from the tab bar reaches Start, Profiles, Storage tests, Size.
                            yield Label(f"{GUESTS.title} (on {PLACEMENT})", classes="section", id="guests-label",
                                        markup=False)
                            with Horizontal(id="guests-row"):
                                yield run_control(GUESTS, id="guest-count",
                                                  tooltip=f"{GUESTS.help}. Placement: every guest on the host under "
                                                          f"{WHERE.title} ({PLACEMENT} or one node), or spread "
                                                          "over its places (a spread entry).")
                                yield Static(f"1 to {MAX_GUESTS}; 1,2,4 = a sweep", id="guests-hint", markup=False)
                            yield Static("", id="guest-note", markup=False)
                            yield Label(SIZE.title, classes="section")
                            yield run_control(SIZE, id="size")
                            yield Label(TESTS.title, classes="section")
                            yield run_control(TESTS, id="test-set")
                            # Shown once nodes are enrolled (a front-end); an all-in-one box runs here.
                            yield Label(WHERE.title, classes="section", id="where-label")
                            yield run_control(WHERE, id="where")
                            # Last in the column: the selects above keep their places (their menus open below them).
                            with Horizontal(id="cpus-row"):
                                yield run_control(CPUS, id="cpu-overcommit",
                                                  tooltip=f"{CPUS.title} ({CPUS.flag}): {CPUS.help}.")
                                yield Static(f"{CPUS.title} (guests at once)", id="cpus-label", markup=False)
                        with Vertical(classes="setup-col"):
                            yield Label("Profiles: space ticks [x]; several = a sweep or a mix", classes="section",
                                        markup=False, id="profiles-label")
                            yield CheckList(id="run-profiles")
                            mix = Checkbox("mix (m): one run, guests in turn", id="mix",
                                           compact=True,
                                           tooltip="With several profiles ticked and Guests at once N: one run "
                                                   f"whose guests take the ticked profiles in turn (--profile "
                                                   f"a{MIX}b), instead of a sweep of one run per profile. The "
                                                   "profiles may differ only in each guest's own hardware.")
                            mix.can_focus = False
                            yield mix
                    yield Button("Start (s)", id="start", variant="primary")
                    yield Static("", id="setup-note", markup=False)
            with TabPane("Live", id="live"):
                with Vertical():
                    yield Static("No run attached. Start one in Setup, or press a to attach.", id="run-head",
                                 markup=False)
                    yield ProgressBar(total=100, show_eta=True, id="run-progress")
                    yield Static("", id="run-step", markup=False)
                    yield Static("", id="run-guests", markup=False)
                    with Horizontal(id="charts"):
                        yield LiveChart("Throughput MB/s", ["guest", "bare metal"], id="chart-mbps")
                        yield LiveChart("Host request size (sectors)", ["avgrq"], id="chart-rq")
                        yield LiveChart("Host queue / util %", ["avgqu", "util %"], id="chart-qu")
                    yield Log(id="run-log", max_lines=400)

    def on_mount(self) -> None:
        super().on_mount()
        self.set_interval(0.5, self.poll)

    def on_screen_resume(self) -> None:
        super().on_screen_resume()
        # Hidden, the screen keeps following its run (log, progress, the end notice) but draws no charts;
        # shown again, its first frame has the charts as last drawn and they are redrawn right after it, so
        # the screen key is answered without waiting for three plots (make bench, "tui").
        if self.charts_stale:
            self.call_after_refresh(self.redraw_charts)

    @property
    def charts_stale(self) -> bool:
        return any(c.stale for c in self.query(LiveChart))

    def redraw_charts(self) -> None:
        self.last_redraw = time.monotonic()
        for c in self.query(LiveChart):
            if c.stale:  # only the charts that got points: a plot costs milliseconds to build
                c.redraw()

    # -- setup ---------------------------------------------------------------------------------------
    def fetch(self) -> SetupData:
        b = self.app.backend
        valid = [e for e in b.profiles() if e.problem is None]
        boot = b.boot()
        blocked = {e.name: why for e in valid if (why := boot.refusal(e.hypervisor, e.xen_type, e.raid_on))}
        return SetupData([(e.name, e.description) for e in valid], b.active_profile(), boot, blocked,
                         b.active_runs(), b.run_targets())

    def show(self, data: SetupData) -> None:
        first = self.setup is None
        self.setup = data
        cl = self.query_one("#run-profiles", CheckList)
        if first or [n for n, _ in cl.items] != [n for n, _ in data.profiles] or cl.blocked != data.blocked:
            cl.set_items(data.profiles, set(cl.selected) or {data.active}, data.blocked)
        self.query_one("#profiles-label", Label).update(
            f"Profiles: space ticks [x]; several = a sweep or a mix (booted into {data.boot.label})")
        where = self.query_one("#where", Select)
        if first or self._targets != data.targets:
            keep = where.value if any(v == where.value for _, v in data.targets) else ""
            self._targets = list(data.targets)
            where.set_options(data.targets)
            where.value = keep
        shown = len(data.targets) > 1
        where.display = self.query_one("#where-label", Label).display = shown
        note = self.query_one("#setup-note", Static)
        note.update(f"{len(data.runs)} run(s) in progress: " + ", ".join(f"{r.id} ({r.profile_name})"
                                                                           for r in data.runs)
                    if data.runs else "No run in progress.")
        if self.run_id is None and data.runs:
            self.attach(data.runs[0].id)

    def spec_choices(self) -> tuple[list[str], str, str, str, str]:
        suite = str(self.query_one("#suite", Select).value)
        size = str(self.query_one("#size", Select).value)
        tests = str(self.query_one("#test-set", Select).value)
        names = self.query_one("#run-profiles", CheckList).selected
        where = self.query_one("#where", Select).value
        return names, suite, size, tests, where if isinstance(where, str) else ""

    def action_toggle_mix(self) -> None:
        mix = self.query_one("#mix", Checkbox)
        mix.value = not mix.value

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "start":
            self.action_start()

    def on_select_changed(self, event: Select.Changed) -> None:
        if event.select.id == "where":  # N guests go where the run goes, or spread over its places
            value = str(event.value or "")
            on = f"spread over {value.replace(',', ', ')}" if "," in value else f"on {value or PLACEMENT}"
            self.query_one("#guests-label", Label).update(f"{GUESTS.title} ({on})")

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id in ("guest-count", "cpu-overcommit"):
            event.input.remove_class("-invalid")
            self.guest_note("")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        """Enter in the guest count (or vCPUs per CPU) checks it (typed letters go to the field, so s cannot start
        from there)."""
        if event.input.id not in ("guest-count", "cpu-overcommit"):
            return
        try:
            specs = self.specs()
        except UsageError as e:
            self.refuse(e, notify=False)
            return
        if not specs:
            self.guest_note("tick at least one profile (space in the Profiles list)", error=True)
            return
        counts = sorted({s.guests for s in specs})
        runs = f"a sweep of {len(specs)} runs" if len(specs) > 1 else "one run"
        node = specs[0].node
        on = f"spread over {node.replace(',', ', ')}" if specs[0].spread else f"on {node or PLACEMENT}"
        self.guest_note(f"{', '.join(map(str, counts))} {on}: {runs}; Start (s) begins")
        self.set_focus(self.query_one("#start", Button))

    def guest_note(self, text: str, error: bool = False) -> None:
        """The line under the guest count: what the count means, or why the form cannot start."""
        note = self.query_one("#guest-note", Static)
        note.update(text)
        note.set_class(error, "field-error")
        note.display = bool(text)

    def specs(self) -> list[RunSpec]:
        """The runs the form asks for: one per ticked profile and guest count (the count parsed and every spec
        checked as `cloudbox run --guests` does); a UsageError naming the form's field otherwise."""
        names, suite, size, tests, node = self.spec_choices()
        text = self.query_one("#guest-count", Input).value
        try:
            counts = GUESTS.values(text.strip())
        except UsageError as e:
            raise UsageError(f"{GUESTS.title}: {e}") from None
        ratio_text = self.query_one("#cpu-overcommit", Input).value.strip()
        try:
            ratio = float(ratio_text)
        except ValueError:
            raise UsageError(f"{GUESTS.title}: {CPUS.title} {ratio_text!r} is not a number; allowed: "
                             f"{CPUS.default:g} to 16 guest vCPUs per host CPU ({CPUS.flag})") from None
        if len(names) > 1 and self.query_one("#mix", Checkbox).value:
            names = [MIX.join(names)]  # one run per count, its guests taking the ticked profiles in turn
        specs = []
        for n in names:
            # the form's other fields first (a spread's places need a count: checked with it below)
            RunSpec(profile=n.split(MIX)[0], suite=suite, size=size, storage_tests=tests,
                    node="" if "," in node else node).validate()
            for count in counts:
                spec = RunSpec(profile=n, suite=suite, size=size, storage_tests=tests, node=node, guests=count,
                               cpu_overcommit=ratio)
                try:
                    spec.validate()
                except UsageError as e:
                    raise UsageError(f"{GUESTS.title}: {e}") from None
                specs.append(spec)
        return specs

    def refuse(self, err: BaseException, notify: bool = True) -> None:
        """A run the form's settings cannot start: a guest count's refusal also under its field."""
        if not (isinstance(err, UsageError) and (str(err).startswith(GUESTS.title) or "--guests" in str(err))):
            self.app.report_error(err, "starting the run")
            return
        text = f"not started: {err}"
        self.guest_note(text, error=True)
        field = "#cpu-overcommit" if CPUS.title in str(err) or f"{CPUS.flag} " in str(err).split(";")[0] \
            else "#guest-count"
        self.query_one(field, Input).add_class("-invalid")
        if notify:
            self.notify(text, title="tests", severity="error", markup=False)

    def action_start(self) -> None:
        names, suite, size, tests, node = self.spec_choices()
        if not names:
            self.notify("tick at least one profile (space in the Profiles list)", severity="warning")
            return
        blocked = [n for n in names if n in self.query_one("#run-profiles", CheckList).blocked]
        if blocked and not node:  # a node's own boot decides there; its executor refuses what it cannot run
            cl = self.query_one("#run-profiles", CheckList)
            self.notify("cannot run on this boot: " + "; ".join(f"{n} ({cl.blocked[n]})" for n in blocked),
                        severity="warning")
            return
        try:
            specs = self.specs()
        except UsageError as e:
            self.refuse(e)
            return
        where = f" on node {node}" if node else ""
        counts = sorted({s.guests for s in specs})
        many = f", {'/'.join(map(str, counts))} guests at once" if counts != [1] else ""

        def started(result: tuple[int | None, Sweep | None]) -> None:
            run_id, sweep = result
            profiles = list(dict.fromkeys(s.profile for s in specs))  # a mix is one entry: "a+b"
            if sweep is not None:
                what = (f"{len(specs)} runs: {', '.join(profiles)} x {', '.join(map(str, counts))} guests"
                        if len(counts) > 1 else f"{len(profiles)} profiles: {', '.join(profiles)}")
                self.notify(f"sweep of {what} started{where}", title="tests")
                self.pending_sweep = sweep.id
            else:
                self.notify(f"run {run_id} started{where} ({profiles[0]}, {suite}, {size}{many})", title="tests")
                assert run_id is not None
                self.attach(run_id)
            self.show_live()

        self.app.work_in_thread(self.app.backend.start_runs, specs, done=started, failed=self.refuse,
                                name="starting the run")

    pending_sweep: str | None = None

    # -- live ----------------------------------------------------------------------------------------
    def attach(self, run_id: int) -> None:
        if run_id == self.run_id:
            return
        self.run_id, self.run, self.seq = run_id, None, 0
        self.progress = PlanProgress()
        self.figures = InstanceFigures()
        self.first_device = None
        self.query_one("#run-guests", Static).update("")
        self.query_one("#run-guests", Static).display = False
        for c in self.query(LiveChart):
            c.clear()
        self.query_one("#run-log", Log).clear()
        self.query_one("#run-progress", ProgressBar).update(total=100, progress=0)
        self.query_one("#run-head", Static).update(f"Run {run_id}: loading…")
        self.show_live()

    def show_live(self) -> None:
        """Switch to the Live tab. Focus leaves the Setup form first: a focused widget in a hidden pane
        would get focus back and with it switch TabbedContent back to Setup (s pressed in a drop-down)."""
        tabbed = self.query_one("#tests-tabs", TabbedContent)
        self.set_focus(tabbed.query_one(Tabs))
        tabbed.active = "live"

    def action_attach(self, run_id: int) -> None:
        self.attach(run_id)

    def poll(self) -> None:
        if self.polling:
            return
        if self.run_id is None and self.pending_sweep is None:
            return
        self.polling = True
        self.app.work_in_thread(self._poll_fetch, self.run_id, self.seq, done=self._poll_show,
                                group="tests-live", name="following the run")

    def _poll_fetch(self, run_id: int | None, seq: int):
        b = self.app.backend
        try:
            if run_id is None:  # a sweep was started: follow its first run once it exists
                sw = next((s for s in b.sweeps() if s.id == self.pending_sweep), None)
                first = next((r for r in (sw.runs if sw else []) if r is not None), None)
                return ("sweep-start", first)
            run, events = b.live(run_id, seq)
            next_run = None
            if run.finished:
                active = b.active_runs()
                next_run = active[0].id if active else None
            sweep = next((s for s in b.sweeps() if run_id in s.runs), None)
            return ("events", (run, events, next_run, sweep))
        finally:
            self.polling = False

    def _poll_show(self, result) -> None:
        kind, data = result
        if kind == "sweep-start":
            if data is not None:
                self.pending_sweep = None
                self.attach(data)
            return
        run, events, next_run, sweep = data
        if run.id != self.run_id:
            return
        self.run, self.sweep = run, sweep
        log = self.query_one("#run-log", Log)
        figures_changed = False
        for ev in events:
            self.seq = ev.seq
            rec = ev.record
            if rec is None:
                continue
            self.progress.feed(rec)
            line = describe(rec)
            if line is not None:
                log.write_line(stamped(ev.t, line))
            if self.figures.feed(rec) and isinstance(rec, ProgressEvent | MeasurementEvent):
                figures_changed = True
                self.chart_instances(rec, ev.t)
            elif isinstance(rec, StepEvent):
                self.query_one("#run-step", Static).update(f"Step: {rec.text}")
            elif isinstance(rec, ProgressEvent) and rec.mbps is not None:
                name = "guest" if rec.side == "guest" else "bare metal"
                self.query_one("#chart-mbps", LiveChart).add(name, ev.t, rec.mbps)
            elif isinstance(rec, MeasurementEvent) and rec.metric == "MB/s":
                name = "guest" if rec.side == "guest" else "bare metal"
                self.query_one("#chart-mbps", LiveChart).add(name, ev.t, rec.value)
            elif isinstance(rec, SampleEvent):
                self.first_device = self.first_device or rec.device
                on = "" if rec.device == self.first_device else f" {rec.device}"  # both ends of a volume
                self.query_one("#chart-rq", LiveChart).add("avgrq" + on, ev.t, rec.avgrq_sectors)
                self.query_one("#chart-qu", LiveChart).add("avgqu" + on, ev.t, rec.avgqu)
                self.query_one("#chart-qu", LiveChart).add("util %" + on, ev.t, rec.util)
        if figures_changed:
            box = self.query_one("#run-guests", Static)
            box.update(self.figures.line())
            box.display = self.figures.many
        self.show_head(run, sweep)
        pct = 100.0 if run.state == "completed" else self.progress.percent
        bar = self.query_one("#run-progress", ProgressBar)
        if pct is not None:
            bar.update(total=100, progress=pct)
        bar.query_one("#eta").display = not run.finished  # a finished run has no ETA (it showed a stale one)
        if self.charts_stale and self.is_current and time.monotonic() - self.last_redraw > 1.0:
            self.redraw_charts()
        if run.finished:
            if any(isinstance(rec := e.record, StateEvent) and rec.final for e in events):
                self.redraw_charts()
                sev = "information" if run.state == "completed" else "warning"
                self.notify(f"run {run.id} {run.state}" + (f": {run.reason}" if run.reason else ""),
                            title="tests", severity=sev)  # type: ignore[arg-type]
            if next_run is not None and next_run != run.id:
                self.attach(next_run)
        elif len(events) >= 1000:
            self.call_later(self.poll)  # catching up with a long run: fetch the next page at once

    def chart_instances(self, rec: ProgressEvent | MeasurementEvent, t: float) -> None:
        """A run of N at once: a guest's figure on its own line (the first CHARTED_GUESTS guests), and the sum so
        far of the guests' (or the bare-metal processes') on the sum's; a network test's figures only in the line."""
        if isinstance(rec, MeasurementEvent) and rec.metric != "MB/s":
            return
        chart = self.query_one("#chart-mbps", LiveChart)
        total = "guests' sum" if rec.side == "guest" else "bare metal"
        chart.add_series(total)
        if rec.instance is None:  # the run's own row of a finished test: the instances' sum
            chart.add(total, t, rec.value if isinstance(rec, MeasurementEvent) else None)
            return
        value = rec.value if isinstance(rec, MeasurementEvent) else rec.mbps
        if rec.side == "guest" and rec.instance <= CHARTED_GUESTS:
            name = instance_name(rec.side, rec.instance)
            chart.add_series(name)
            chart.add(name, t, value)
        if isinstance(rec, ProgressEvent):
            chart.add(total, t, self.figures.total())

    def show_head(self, run: Run, sweep: Sweep | None) -> None:
        acc = run.accelerator or "accelerator not known yet"
        emu = " (EMULATED: not overhead figures)" if run.accelerator == "tcg" else (
            " (nested)" if run.accelerator == "nested-kvm" else "")
        state = run.state.upper() + (f": {run.reason}" if run.reason and run.finished else "")
        n = guest_count(run)
        guests = f" · {n} guests" if n > 1 else ""
        text = (f"Run {run.id} · {run.profile_name} · {run.suite}{guests} · {run.size_label or '?'} · {acc}{emu} · "
                f"{state} · {run.duration or 0:.0f} s")
        if sweep is not None:
            pos = sweep.runs.index(run.id) + 1
            text += f"\nSweep {sweep.id}: run {pos} of {len(sweep.runs)}, {sweep.queued} queued ({sweep.state})"
            if sweep.state == "running" and sweep.waiting_until:
                text += f"; the next run starts at {time.strftime('%H:%M:%S', time.localtime(sweep.waiting_until))}"
        self.query_one("#run-head", Static).update(text)

    def action_cancel_run(self) -> None:
        run = self.run
        waiting = self.sweep if self.sweep is not None and self.sweep.state == "running" and self.sweep.queued else None
        if run is not None and run.finished and waiting is not None:
            self._cancel_sweep(waiting)
            return
        if run is None or run.finished:
            self.notify("no run in progress to cancel", severity="warning")
            return
        sw = self.sweep
        sweep_note = f" and the {sw.queued} queued run(s) of its sweep" if sw and sw.queued else ""

        def answer(yes: bool | None) -> None:
            if yes:
                self.notify(f"cancelling run {run.id}…", title="tests")
                self.app.work_in_thread(self.app.backend.cancel, run.id, name=f"cancelling run {run.id}",
                                        done=lambda st: self.notify(f"run {run.id}: {st}", title="tests"))

        self.app.push_screen(ConfirmDialog(
            "Cancel run", f"Cancel run {run.id} ({run.profile_name}){sweep_note}? The guest is destroyed, the "
            "backing store and network removed; the partial run is kept as aborted.", yes="Cancel run",
            no="Keep running"), answer)

    def _cancel_sweep(self, sweep: Sweep) -> None:
        """Between two runs of a sweep (a series waiting for its next start): skip the runs still queued."""
        def answer(yes: bool | None) -> None:
            if yes:
                self.app.work_in_thread(self.app.backend.cancel_sweep, sweep.id, name=f"cancelling {sweep.id}",
                                        done=lambda st: self.notify(f"sweep {sweep.id}: {st}", title="tests"))

        self.app.push_screen(ConfirmDialog(
            "Cancel sweep", f"Cancel sweep {sweep.id}? Its {sweep.queued} queued run(s) are skipped; the runs it "
            "finished are kept.", yes="Cancel sweep", no="Keep it"), answer)

    def action_attach_pick(self) -> None:
        def got(runs: list[Run]) -> None:
            if not runs:
                self.notify("no run in progress", severity="warning")
                return
            opts = [(str(r.id), f"{r.profile_name} {r.suite} ({r.duration or 0:.0f} s)") for r in runs]
            self.app.push_screen(PickDialog("Attach to run", opts), picked)

        def picked(value: str | None) -> None:
            if value:
                self.attach(int(value))

        self.app.work_in_thread(self.app.backend.active_runs, done=got, name="listing runs")

    def action_show_log(self) -> None:
        if self.run_id is None:
            self.notify("no run attached", severity="warning")
            return
        rid = self.run_id
        self.app.work_in_thread(self.app.backend.run_log, rid, name="reading the run log",
                                done=lambda text: self.app.push_screen(
                                     TextDialog(f"run {rid}: executor log", text or "(empty)")))
