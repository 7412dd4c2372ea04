"""The Tests screen's Setup form: suite, size, test set, guests at once, where, repeats, and the profiles (several = a
sweep, or one run whose guests take them in turn); its start posts `SetupForm.Started`, which the Live view
follows."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from textual import getters
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Button, Checkbox, Input, Label, Select, Static

from cloudbox.core.errors import UsageError
from cloudbox.core.record.rows import Run
from cloudbox.core.run.runs import Sweep
from cloudbox.core.spec.profiles import MIX
from cloudbox.core.spec.runspec import MAX_GUESTS, RunSpec, option
from cloudbox.core.virt import accel
from cloudbox.tui.app_base import CloudboxAppBase
from cloudbox.tui.widgets.checklist import CheckList
from cloudbox.tui.widgets.runoption import run_control

# The form's controls, from the run options' one declaration (core.spec.runspec.run_option).
SUITE, SIZE, TESTS, WHERE, GUESTS, CPUS, REPEATS = (option(f) for f in ("suite", "size", "storage_tests", "node",
                                                                         "guests", "cpu_overcommit", "repeats"))
PLACEMENT = WHERE.choices[0].title  # where a run's N guests go when Where is blank: all on one host


@dataclass
class SetupData:
    profiles: list[tuple[str, str]]
    active: str
    boot: accel.Boot  # what this box is booted into
    blocked: dict[str, str]  # profiles that cannot run on this boot, with the reason (core: accel.Boot.refusal)
    runs: list[Run]
    targets: list[tuple[str, str]]  # where a run can go: ("this host", ""), then enrolled nodes


N = TypeVar("N", int, float)


def _number(kind: Callable[[str], N], text: str, problem: str) -> N:
    """`text` read as a `kind`; else a UsageError saying `problem`."""
    try:
        return kind(text)
    except ValueError:
        raise UsageError(problem) from None


class SetupForm(VerticalScroll):
    """The Setup tab's form. It reads the setup data the screen fetches (show) and starts the runs it describes."""

    class Started(Message):
        """Runs were started from the form: one run (`run_id`) or a sweep whose first run is still to come."""

        def __init__(self, run_id: int | None, sweep: Sweep | None) -> None:
            super().__init__()
            self.run_id = run_id
            self.sweep = sweep

    app = getters.app(CloudboxAppBase)

    def __init__(self) -> None:
        super().__init__()
        self.setup: SetupData | None = None
        self._targets: list[tuple[str, str]] = []

    def compose(self) -> ComposeResult:
        with Horizontal(id="setup-row"):
            with Vertical(classes="setup-col"):
                yield Label(SUITE.title, classes="section")
                yield run_control(SUITE, id="suite")
                # Before Size: Shift+Tab from the tab bar reaches Start, Profiles, Storage tests, Size.
                yield Label(f"{GUESTS.title} (on {PLACEMENT})", classes="section", id="guests-label", markup=False)
                with Horizontal(id="guests-row"):
                    yield run_control(GUESTS, id="guest-count",
                                      tooltip=f"{GUESTS.help}. Placement: every guest on the host under "
                                              f"{WHERE.title} ({PLACEMENT} or one node), or spread "
                                              "over its places (a spread entry).")
                    yield Static(f"1 to {MAX_GUESTS}; 1,2,4 = a sweep", id="guests-hint", markup=False)
                yield Static("", id="guest-note", markup=False)
                # Before Size too: the Shift+Tab order from the tab bar to the storage tests stays as it was.
                with Horizontal(id="repeats-row"):
                    yield run_control(REPEATS, id="repeats", tooltip=f"{REPEATS.title} ({REPEATS.flag}): "
                                                                     f"{REPEATS.help}.")
                    yield Static(f"{REPEATS.title} of each test (ABAB)", id="repeats-label",
                                 markup=False)
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

    def spec_choices(self) -> tuple[list[str], str, str, str, str]:
        suite = str(self.query_one("#suite", Select).value)
        size = str(self.query_one("#size", Select).value)
        tests = str(self.query_one("#test-set", Select).value)
        names = self.query_one("#run-profiles", CheckList).selected
        where = self.query_one("#where", Select).value
        return names, suite, size, tests, where if isinstance(where, str) else ""

    def toggle_mix(self) -> None:
        mix = self.query_one("#mix", Checkbox)
        mix.value = not mix.value

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "start":
            self.start()

    def on_select_changed(self, event: Select.Changed) -> None:
        if event.select.id == "where":  # N guests go where the run goes, or spread over its places
            value = str(event.value or "")
            on = f"spread over {value.replace(',', ', ')}" if "," in value else f"on {value or PLACEMENT}"
            self.query_one("#guests-label", Label).update(f"{GUESTS.title} ({on})")

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id in ("guest-count", "cpu-overcommit", "repeats"):
            event.input.remove_class("-invalid")
            self.guest_note("")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        """Enter in the guest count (or vCPUs per CPU) checks it (typed letters go to the field, so s cannot start
        from there)."""
        if event.input.id not in ("guest-count", "cpu-overcommit", "repeats"):
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
        self.screen.set_focus(self.query_one("#start", Button))

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
        repeats_text = self.query_one("#repeats", Input).value.strip()
        repeats = _number(int, repeats_text, f"{REPEATS.title} {repeats_text!r} is not a whole number; allowed: 1 "
                          f"(each test once) or more ({REPEATS.flag})")
        ratio_text = self.query_one("#cpu-overcommit", Input).value.strip()
        ratio = _number(float, ratio_text, f"{GUESTS.title}: {CPUS.title} {ratio_text!r} is not a number; allowed: "
                        f"{CPUS.default:g} to 16 guest vCPUs per host CPU ({CPUS.flag})")
        if len(names) > 1 and self.query_one("#mix", Checkbox).value:
            names = [MIX.join(names)]  # one run per count, its guests taking the ticked profiles in turn
        specs = []
        for n in names:
            # the form's other fields first (a spread's places need a count: checked with it below)
            RunSpec(profile=n.split(MIX)[0], suite=suite, size=size, storage_tests=tests,
                    node="" if "," in node else node, repeats=repeats).validate()
            for count in counts:
                spec = RunSpec(profile=n, suite=suite, size=size, storage_tests=tests, node=node, guests=count,
                               cpu_overcommit=ratio, repeats=repeats)
                try:
                    spec.validate()
                except UsageError as e:
                    raise UsageError(f"{GUESTS.title}: {e}") from None
                specs.append(spec)
        return specs

    def refuse(self, err: BaseException, notify: bool = True) -> None:
        """A run the form's settings cannot start: a guest count's (or a repeat count's) refusal also under its
        field."""
        msg = str(err)
        repeats = isinstance(err, UsageError) and (msg.startswith(REPEATS.title) or f"{REPEATS.flag} " in msg)
        if not (isinstance(err, UsageError) and (msg.startswith(GUESTS.title) or "--guests" in msg or repeats)):
            self.app.report_error(err, "starting the run")
            return
        text = f"not started: {err}"
        self.guest_note(text, error=True)
        field = "#repeats" if repeats else "#cpu-overcommit" if CPUS.title in msg or \
            f"{CPUS.flag} " in msg.split(";")[0] else "#guest-count"
        self.query_one(field, Input).add_class("-invalid")
        if notify:
            self.notify(text, title="tests", severity="error", markup=False)

    def start(self) -> None:
        """Start the runs the form describes (s, or the Start button): posts Started once they are."""
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
            else:
                self.notify(f"run {run_id} started{where} ({profiles[0]}, {suite}, {size}{many})", title="tests")
            self.post_message(self.Started(run_id, sweep))

        self.app.work_in_thread(self.app.backend.start_runs, specs, done=started, failed=self.refuse,
                                name="starting the run")
