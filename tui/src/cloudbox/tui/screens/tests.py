"""Tests: choose suite, size, test set, guests at once and profile(s), start (several profiles or guest counts = a
sweep, run one after another; several profiles mixed = one run whose guests take them in turn); while a run goes:
overall progress with ETA, live charts of guest throughput (in a run
of N guests each guest's and their sum) and of the host disk's request size, queue depth and utilisation (the studies'
three host metrics), the step, each guest's figures, the log.

The screen holds two tabs: the Setup form (tests_setup.SetupForm) and the Live view (tests_live.LiveView). The form
says what it started with one message, SetupForm.Started, which the screen hands to the view to follow.
"""

from __future__ import annotations

from textual import getters
from textual.app import ComposeResult
from textual.widgets import TabbedContent, TabPane

from cloudbox.tui.screens.base import BaseScreen
from cloudbox.tui.screens.keys import screen_keys
from cloudbox.tui.screens.tests_live import LiveView
from cloudbox.tui.screens.tests_setup import SetupData, SetupForm


class TestsScreen(BaseScreen[SetupData]):
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
    BINDINGS = screen_keys(MODE)

    def body(self) -> ComposeResult:
        with TabbedContent(id="tests-tabs", initial="setup"):
            with TabPane("Setup", id="setup"):
                yield SetupForm()
            with TabPane("Live", id="live"):
                yield LiveView()

    form = getters.query_one(SetupForm)
    live = getters.query_one(LiveView)

    def on_screen_resume(self) -> None:
        super().on_screen_resume()
        # Hidden, the screen keeps following its run (log, progress, the end notice) but draws no charts;
        # shown again, its first frame has the charts as last drawn and they are redrawn right after it, so
        # the screen key is answered without waiting for three plots (make bench, "tui").
        live = self.live
        if live.charts_stale:
            self.call_after_refresh(live.redraw_charts)

    def fetch(self) -> SetupData:
        b = self.app.backend
        valid = [e for e in b.profiles() if e.problem is None]
        boot = b.boot()
        blocked = {e.name: why for e in valid if (why := boot.refusal(e.hypervisor, e.xen_type, e.raid_on))}
        return SetupData([(e.name, e.description) for e in valid], b.active_profile(), boot, blocked,
                         b.active_runs(), b.run_targets())

    def show(self, data: SetupData) -> None:
        self.form.show(data)
        live = self.live
        if live.run_id is None and data.runs:
            live.attach(data.runs[0].id)

    def on_setup_form_started(self, message: SetupForm.Started) -> None:
        """The form started a run (follow it) or a sweep (follow its first run once it exists)."""
        live = self.live
        if message.sweep is not None:
            live.follow_sweep(message.sweep.id)
        elif message.run_id is not None:
            live.attach(message.run_id)
        live.bring_forward()

    # -- the keys: each goes to the tab that does it ---------------------------------------------------------
    def action_start(self) -> None:
        self.form.start()

    def action_toggle_mix(self) -> None:
        self.form.toggle_mix()

    def action_cancel_run(self) -> None:
        self.live.cancel_run()

    def action_attach(self, run_id: int) -> None:
        self.live.attach(run_id)

    def action_attach_pick(self) -> None:
        self.live.attach_pick()

    def action_show_log(self) -> None:
        self.live.show_log()
