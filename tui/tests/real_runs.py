"""Shared pieces of the real-run tests: what a run may leave behind, a `cloudbox run` interrupted by Ctrl-C, and
a second profile for a mixed run."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from cloudbox.core.record.results import ResultStore
from cloudbox.core.record.rows import Run


def completed_run(spec) -> Run:
    """`spec` run by the executor in this process; asserted completed, its warnings shown (run_trouble)."""
    from run_trouble import warn_run_trouble

    from cloudbox.core.run import runs

    with ResultStore() as store:
        rid = runs.executor(spec, store).execute()
    with ResultStore() as store:
        run = store.get_run(rid)
        evs = store.events_since(rid, 0)
    assert run.state == "completed", run.reason
    warn_run_trouble(evs)
    return run


# The CLI's progress lines that mean the guest is up and running its tests.
GUEST_PHASE = ("guest: storage tests", "guest: laying down")


def lsi_disk_profile(directory, vcpus=1):
    """virtio-disk as a guest of its own would differ in a mixed run (an emulated LSI SCSI disk with the host cache
    off, `vcpus` vCPUs): written as lsi-disk.toml in `directory`; (its path, the profile)."""
    from cloudbox.core.spec.profiles import resolve_profile

    p = resolve_profile("virtio-disk")
    lsi = p.model_copy(update={"name": "lsi-disk", "disk": p.disk.model_copy(update={"bus": "scsi-lsi",
                                                                                     "cache": "none"}),
                               "guest": p.guest.model_copy(update={"vcpus": vcpus})})
    path = directory / "lsi-disk.toml"
    path.write_text(lsi.to_toml())
    return path, lsi


def leftovers(conn, state) -> dict:
    """Guests, the test bridge and namespace, and loop devices over files in this test's state dir."""
    from cloudbox.core.spec.addresses import BRIDGE, NS
    from cloudbox.core.virt.guest import list_guests
    from cloudbox.core.virt.network import link_exists

    return {
        "guests": [g.name for g in list_guests(conn)],
        "bridge": link_exists(BRIDGE),
        "netns": os.path.exists(f"/run/netns/{NS}"),
        "loops": [ln for ln in subprocess.run(["losetup", "--list", "--noheadings", "--output", "NAME,BACK-FILE"],
                                              capture_output=True, text=True).stdout.splitlines()
                  if str(state) in ln],
    }


def work_files(state) -> list:
    work = state / "state" / "work"
    return sorted(str(p) for p in work.rglob("*")) if work.exists() else []


@dataclass
class Interrupted:
    returncode: int
    output: str
    run: Run


def interrupt_cli_run(args: list[str], while_running: Callable[[], None] | None = None,
                      phase: tuple[str, ...] = GUEST_PHASE) -> Interrupted:
    """Run `cloudbox run ARGS` in the foreground, send SIGINT once the guest runs its tests (a line with one of
    `phase`; after calling `while_running`, to check what the run holds at that moment), and return its exit code,
    output and stored run."""
    proc = subprocess.Popen([sys.executable, "-m", "cloudbox.cli", "run", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line)
            if any(mark in line for mark in phase):
                break
        else:
            pytest.fail("run ended before the guest phase:\n" + "".join(seen))
        if while_running is not None:
            while_running()
    except BaseException:
        proc.send_signal(2)
        proc.communicate(timeout=120)
        raise
    proc.send_signal(2)
    out = "".join(seen) + proc.stdout.read()
    rc = proc.wait(timeout=120)
    with ResultStore() as store:
        run = store.list_runs()[0]
    return Interrupted(rc, out, run)
