"""Installing cloudbox from the live USB onto a node's disk (no Textual here; the CLI and the TUI call this).

The API, in the order a front end calls it:

    machine = Machine.probe()                          # disks (with why each is offered or not) and NICs
    answers = load_answers(path) / parse_answers(text) # the answer file alone -> Answers, or AnswerError
    resolved = check_answers(answers, machine, source) # against this machine -> Resolved, or AnswerError
    plan = make_plan(resolved, find_sources(machine))  # every decision; plan.describe() is the dry run
    apply(plan, progress=callback)                     # writes; resumable; False when already installed

Modules: `answers` (schema and checks), `disks` (discovery and safety), `machine` (NICs, credentials),
`plan` (what is written), `apply` (the steps), `unattended` (where an unattended install finds answers),
`actions` (what both front ends do besides: the machine probed with the test hooks, the root password hashed, the
reboot or power-off at the end).
"""

from cloudbox.core.install.answers import Answers, Resolved, check_answers, load_answers, parse_answers
from cloudbox.core.install.apply import STEPS, Progress, ProgressEvent, apply
from cloudbox.core.install.disks import MIN_DISK_BYTES, Disk, probe_disks
from cloudbox.core.install.machine import Machine, Nic
from cloudbox.core.install.plan import InstallPlan, Sources, find_sources, make_plan
from cloudbox.core.install.unattended import AnswerSource, find_answers

__all__ = [
    "MIN_DISK_BYTES",
    "STEPS",
    "AnswerSource",
    "Answers",
    "Disk",
    "InstallPlan",
    "Machine",
    "Nic",
    "Progress",
    "ProgressEvent",
    "Resolved",
    "Sources",
    "apply",
    "check_answers",
    "find_answers",
    "find_sources",
    "load_answers",
    "make_plan",
    "parse_answers",
    "probe_disks",
]
