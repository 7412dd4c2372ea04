"""The Tests screen's Live view: one run followed through its event stream (overall progress with ETA, live charts
of guest throughput, in a run of N guests each guest's and their sum, and of the host disk's request size, queue
depth and utilisation, the step, the current test's progress (time elapsed and left, what of its plan is done),
each guest's figures, a repeated test's figures with their intervals so far, the
log), cancelling it, attaching to another."""

from __future__ import annotations

import time
from dataclasses import dataclass

from textual import getters
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Log, ProgressBar, Static, TabbedContent, TabPane, Tabs

from cloudbox.core.record.events import (
    InstanceFigures,
    MeasurementEvent,
    PlanProgress,
    ProgressEvent,
    RepeatFigures,
    SampleEvent,
    StateEvent,
    StepEvent,
    describe,
    instance_name,
    progress_line,
    stamped,
)
from cloudbox.core.record.results import Event, Run
from cloudbox.core.run.runs import Sweep
from cloudbox.core.views.compare import guest_count
from cloudbox.tui.app_base import CloudboxAppBase
from cloudbox.tui.widgets.charts import LiveChart
from cloudbox.tui.widgets.dialogs import ConfirmDialog, PickDialog, TextDialog

CHARTED_GUESTS = 4  # guests with a line of their own in the throughput chart; the figures line names them all
POLL_S = 0.5  # how often the followed run's new events are fetched
REPEATED_LINES = 2  # repeated tests whose figures so far are shown, the latest last


@dataclass
class SweepFirstRun:
    """What a poll found of a sweep just started: its first run, once that exists."""

    run_id: int | None


@dataclass
class RunNews:
    """What a poll found of the followed run: its row, its events since the last poll, the run to follow once it
    is finished (another in progress, if any) and the sweep it belongs to."""

    run: Run
    events: list[Event]
    next_run: int | None
    sweep: Sweep | None


class LiveView(Vertical):
    """The Live tab: follows one run (attach) or a started sweep's first run (follow_sweep)."""

    app = getters.app(CloudboxAppBase)

    def __init__(self) -> None:
        super().__init__()
        self.run_id: int | None = None
        self.run: Run | None = None
        self.seq = 0
        self.progress = PlanProgress()
        self.polling = False
        self.last_redraw = 0.0
        self.sweep: Sweep | None = None
        self.pending_sweep: str | None = None  # a sweep started here whose first run is not known yet
        self.figures = InstanceFigures()
        self.repeats = RepeatFigures()
        self.first_device: str | None = None  # the run's own disk; another (a volume's server disk) is named

    def compose(self) -> ComposeResult:
        yield Static("No run attached. Start one in Setup, or press a to attach.", id="run-head", markup=False)
        yield ProgressBar(total=100, show_eta=True, id="run-progress")
        yield Static("", id="run-step", markup=False)
        yield Static("", id="run-test", markup=False)
        yield Static("", id="run-guests", markup=False)
        yield Static("", id="run-repeats", markup=False)
        with Horizontal(id="charts"):
            yield LiveChart("Throughput MB/s", ["guest", "bare metal"], id="chart-mbps")
            yield LiveChart("Host request size (sectors)", ["avgrq"], id="chart-rq")
            yield LiveChart("Host queue / util %", ["avgqu", "util %"], id="chart-qu")
        yield Log(id="run-log", max_lines=400)

    def on_mount(self) -> None:
        self.set_interval(POLL_S, self.poll)

    @property
    def charts_stale(self) -> bool:
        return any(c.stale for c in self.query(LiveChart))

    def redraw_charts(self) -> None:
        self.last_redraw = time.monotonic()
        for c in self.query(LiveChart):
            if c.stale:  # only the charts that got points: a plot costs milliseconds to build
                c.redraw()

    def bring_forward(self) -> None:
        """Switch to this view's tab. Focus leaves the Setup form first: a focused widget in a hidden pane
        would get focus back and with it switch TabbedContent back to Setup (s pressed in a drop-down)."""
        tabbed = self.query_ancestor(TabbedContent)
        self.screen.set_focus(tabbed.query_one(Tabs))
        tabbed.active = self.query_ancestor(TabPane).id or ""

    def follow_sweep(self, sweep_id: str) -> None:
        """Follow the sweep started here: its first run once it exists."""
        self.pending_sweep = sweep_id

    def attach(self, run_id: int) -> None:
        if run_id == self.run_id:
            return
        self.run_id, self.run, self.seq = run_id, None, 0
        self.progress = PlanProgress()
        self.figures = InstanceFigures()
        self.repeats = RepeatFigures()
        self.first_device = None
        for box in (self.query_one("#run-guests", Static), self.query_one("#run-repeats", Static)):
            box.update("")
            box.display = False
        for c in self.query(LiveChart):
            c.clear()
        self.query_one("#run-log", Log).clear()
        self.show_test("")
        self.query_one("#run-progress", ProgressBar).update(total=100, progress=0)
        self.query_one("#run-head", Static).update(f"Run {run_id}: loading…")
        self.bring_forward()

    def poll(self) -> None:
        if self.polling:
            return
        if self.run_id is None and self.pending_sweep is None:
            return
        self.polling = True
        self.app.work_in_thread(self._poll_fetch, self.run_id, self.seq, done=self._poll_show,
                                group="tests-live", name="following the run")

    def _poll_fetch(self, run_id: int | None, seq: int) -> SweepFirstRun | RunNews:
        b = self.app.backend
        try:
            if run_id is None:  # a sweep was started: follow its first run once it exists
                sw = next((s for s in b.sweeps() if s.id == self.pending_sweep), None)
                first = next((r for r in (sw.runs if sw else []) if r is not None), None)
                return SweepFirstRun(first)
            run, events = b.live(run_id, seq)
            next_run = None
            if run.finished:
                active = b.active_runs()
                next_run = active[0].id if active else None
            sweep = next((s for s in b.sweeps() if run_id in s.runs), None)
            return RunNews(run, events, next_run, sweep)
        finally:
            self.polling = False

    def _poll_show(self, news: SweepFirstRun | RunNews) -> None:
        if isinstance(news, SweepFirstRun):
            if news.run_id is not None:
                self.pending_sweep = None
                self.attach(news.run_id)
            return
        run, events, next_run, sweep = news.run, news.events, news.next_run, news.sweep
        if run.id != self.run_id:
            return
        self.run, self.sweep = run, sweep
        log = self.query_one("#run-log", Log)
        figures_changed = repeats_changed = False
        for ev in events:
            self.seq = ev.seq
            rec = ev.record
            if rec is None:
                continue
            self.progress.feed(rec)
            if isinstance(rec, ProgressEvent) and (rec.instance or 1) == 1:  # one line: the first of N guests'
                self.show_test("Test:" + progress_line(rec).removeprefix(" "))
            repeats_changed = self.repeats.feed(rec) or repeats_changed
            line = describe(rec)
            if line is not None:
                log.write_line(stamped(ev.t, line))
            if self.figures.feed(rec) and isinstance(rec, ProgressEvent | MeasurementEvent):
                figures_changed = True
                self.chart_instances(rec, ev.t)
            elif isinstance(rec, StepEvent):
                self.query_one("#run-step", Static).update(f"Step: {rec.text}")
                self.show_test("")  # the next test has shown no progress yet
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
        if repeats_changed and self.repeats.repeated:  # a run that measures each test once shows no such line
            box = self.query_one("#run-repeats", Static)
            box.update("\n".join(self.repeats.lines(REPEATED_LINES)))
            box.display = True
        self.show_head(run, sweep)
        pct = 100.0 if run.state == "completed" else self.progress.percent
        bar = self.query_one("#run-progress", ProgressBar)
        if pct is not None:
            bar.update(total=100, progress=pct)
        bar.query_one("#eta").display = not run.finished  # a finished run has no ETA (it showed a stale one)
        if self.charts_stale and self.screen.is_current and time.monotonic() - self.last_redraw > 1.0:
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

    def show_test(self, line: str) -> None:
        """The current test's progress line (progress_line: percent, time elapsed and left, what is done); hidden
        while there is none."""
        box = self.query_one("#run-test", Static)
        box.update(line)
        box.display = bool(line)

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

    def cancel_run(self) -> None:
        """Cancel the run followed here, after confirmation; between two runs of a sweep, the sweep's queued runs."""
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

    def attach_pick(self) -> None:
        """Pick another run in progress to follow."""
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

    def show_log(self) -> None:
        """The followed run's executor log, in a dialog."""
        if self.run_id is None:
            self.notify("no run attached", severity="warning")
            return
        rid = self.run_id
        self.app.work_in_thread(self.app.backend.run_log, rid, name="reading the run log",
                                done=lambda text: self.app.push_screen(
                                     TextDialog(f"run {rid}: executor log", text or "(empty)")))
