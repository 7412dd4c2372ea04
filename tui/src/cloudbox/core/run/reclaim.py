"""Cleaning up after runs whose executor is gone: each such run marked aborted ("executor killed", when it was last
seen), then what its ledger (core.ledger) still holds undone on this host, guests first, and nothing else; for this
state directory's runs and for this host's parts of spread runs (their own store under parts/).

The next run does it at its start (core.run.lifecycle), `cloudbox guests --destroy-orphans` and `cloudbox reclaim`
on request, and `cloudbox reclaim --boot` at boot (cloudbox-reclaim.service, before libvirtd and the runs): what
survives a boot is the runs' files and the records in other daemons' state (an iSCSI node record), and no daemon is
asked then.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

from .. import ledger, paths
from ..disks import backing, hostraid, mounts
from ..disks.volumes import hostattach, lvm, nvmet
from ..errors import CloudboxError
from ..record.results import ResultStore
from ..virt import guest
from .spread import parts_state_dir

# The modules whose ledger kinds a dead run's ledger may name: imported so that every kind is known here (a kind
# defined in a module not listed would be kept in the ledger, never undone; tests/test_ledger.py checks the list).
KIND_MODULES = (ledger, backing, hostraid, mounts, hostattach, lvm, nvmet, guest)

Say = Callable[[str], None]


def _places() -> list[Path]:
    """The state directories whose runs this host executes: this one, and its spread runs' parts."""
    here = paths.state_dir()
    parts = parts_state_dir()
    return [here] + ([parts] if parts != here and (parts / "results.db").exists() else [])


def reclaim_dead_runs(store: ResultStore, say: Say, *, boot: bool = False) -> list[str]:
    """Mark the runs whose executor is gone aborted and undo what their ledgers hold; what was done goes to `say`.
    Returns the problems: what could not be undone (kept in its ledger for the next clean-up)."""
    problems: list[str] = []
    for state in _places():
        with contextlib.ExitStack() as stack:
            s = store if state == paths.state_dir() and store.path == paths.results_db() else \
                stack.enter_context(ResultStore(state / "results.db"))
            try:
                for r in s.reap_dead_runs():
                    say(f"run {r.id} marked aborted: {r.reason}")
            except CloudboxError as e:  # a store another process has locked: its runs wait for the next clean-up
                problems.append(str(e))
        for path in ledger.ledgers(state):
            run = path.stem[:12]

            def said(what: str, run: str = run) -> None:
                say(f"{what}, left by run {run}")

            left = ledger.reclaim(path, said, boot=boot)
            if left:
                problems += [f"run {run}: {p}" for p in left]
    return problems
