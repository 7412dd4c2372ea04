"""A run killed at any step leaves the host as it found it once a clean-up ran, and says it was killed: a real quick
run's detached executor (`python -m cloudbox.core.run.runs`) killed with SIGKILL after its store is made, during the
bare-metal baseline and during a guest test, each step known from the run's own event stream; then a clean-up path
(the next run's, `cloudbox guests --destroy-orphans`, `cloudbox reclaim`), and the host compared with a snapshot
taken before the run: loop devices, mounts, links, network namespaces, md arrays, processes, libvirt domains. And
libvirtd killed during a guest test: the run names it in its reason, starts it again, destroys its guest through it
before the storage goes, and leaves nothing.

In the opt-in tier (`full`): the kill once its guest runs and during its cleanup (a guest boot each, the cleanup's
after the whole run), and the same kill during a guest test for a run on each network-volume scheme (NBD, iSCSI,
AoE and NVMe/TCP served here and attached by the guest or by QEMU) and on an NFS export."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cloudbox.core import ledger
from cloudbox.core.record.results import ResultStore
from cloudbox.core.record.rows import Event
from cloudbox.core.run import reclaim, runs
from cloudbox.core.spec.runspec import RunSpec
from cloudbox.core.virt import daemons
from cloudbox.core.virt.domain import CLOUDBOX_XMLNS

pytestmark = [pytest.mark.slow, pytest.mark.root]

STEP_TIMEOUT_S = 300.0  # a TCG guest's boot on a loaded host, and the run's steps before it


# ------------------------------------------------------------------------------------------------- the host
DAEMONS = ("libvirtd", "virtqemud", "virtlogd")  # the host's, started again when a test kills one: not a run's


def _processes(marks: tuple[str, ...]) -> set[str]:
    """Processes whose command line or environment names one of `marks` (this test's state and run directories):
    the run's executor, its tools and servers, and its guest's QEMU (its disk is in the work directory)."""
    found = set()
    me = os.getpid()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == me:
            continue
        try:
            if (d / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue  # a dead child this test has not waited for yet
            text = (d / "cmdline").read_bytes() + b"\0" + (d / "environ").read_bytes()
        except OSError:
            continue
        program = text.split(b"\0")[0].decode(errors="replace")
        if any(m.encode() in text for m in marks) and Path(program).name not in DAEMONS:
            found.add(f"{d.name} {program}")
    return found


def _domains(conn) -> set[str]:
    import libvirt

    out = set()
    for dom in conn.listAllDomains(0):
        try:
            dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, CLOUDBOX_XMLNS, 0)
            out.add(dom.name())
        except libvirt.libvirtError:
            continue
    return out


def _loops(marks: tuple[str, ...]) -> set[str]:
    """The loop devices over a file under one of `marks` (deleted or not: the kernel keeps its name)."""
    out = subprocess.run(["losetup", "--list", "--noheadings", "--output", "NAME,BACK-FILE"], capture_output=True,
                         text=True).stdout
    return {ln.strip() for ln in out.splitlines() if any(m in ln for m in marks)}


def _md(marks: tuple[str, ...]) -> set[str]:
    """The md arrays over one of those loop devices."""
    found = set()
    for md in Path("/sys/block").glob("md*"):
        for member in (md / "slaves").glob("loop*"):
            try:
                backing = (member / "loop" / "backing_file").read_text()
            except OSError:
                continue
            if any(m in backing for m in marks):
                found.add(md.name)
    return found


def snapshot(conn, marks: tuple[str, ...]) -> dict[str, set[str]]:
    """What a run could change on this host. Loop devices, mounts and md arrays are those over this test's
    directories (`marks`: where its runs' work directories, mounts and servers are); the host's other engineers
    make loop devices and mounts of their own outside the slow-test lock. Links, namespaces and domains are the
    host's: only runs under the lock make them."""
    mountinfo = Path("/proc/self/mountinfo").read_text().splitlines()
    return {
        "loops": _loops(marks),
        "mounts": {ln.split()[4] for ln in mountinfo if any(ln.split()[4].startswith(m) for m in marks)},
        "links": set(os.listdir("/sys/class/net")),
        "netns": set(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else set(),
        "md": _md(marks),
        "processes": _processes(marks),
        "domains": _domains(conn),
    }


# ---------------------------------------------------------------------------------------------- the kill
def _wait_for(rid: int, store: ResultStore, hit: Callable[[Event], bool], what: str) -> Event:
    """The first event of run `rid` for which `hit` holds, read from the results store as it is appended."""
    seq, deadline = 0, time.monotonic() + STEP_TIMEOUT_S
    while time.monotonic() < deadline:
        for ev in store.events_since(rid, seq):
            seq = ev.seq
            if hit(ev):
                return ev
            if ev.kind == "state" and ev.payload.get("state") not in (None, "running"):
                raise AssertionError(f"run {rid} ended before {what}: {ev.payload}")
        time.sleep(0.02)
    raise AssertionError(f"run {rid} did not reach {what} within {STEP_TIMEOUT_S:.0f} s")


def _step(text: str) -> Callable[[Event], bool]:
    return lambda ev: ev.kind == "step" and str(ev.payload.get("text", "")).startswith(text)


def _log(text: str) -> Callable[[Event], bool]:
    return lambda ev: ev.kind == "log" and str(ev.payload.get("text", "")).startswith(text)


def _progress(side: str, test: str | None = None) -> Callable[[Event], bool]:
    return lambda ev: (ev.kind == "progress" and ev.payload.get("side") == side
                       and (test is None or ev.payload.get("test") == test))


def _guest_test(ev: Event) -> bool:
    return ev.kind == "step" and ev.payload.get("side") == "guest" and bool(ev.payload.get("test"))


# The steps of a quick storage and network run, as its events show them (each known from the run's own stream). Those
# in make test cost one guest boot between them (the first two come before the guest) and make every kind of thing a
# local run makes; the other two boot a guest each, the cleanup's after the whole run: the opt-in tier.
STEPS: dict[str, Callable[[Event], bool]] = {
    "the store made": _log("backing store ready"),
    "the baseline": _step("baseline: randwrite-4k-qd1"),
    "a guest test": _guest_test,
}
FULL_STEPS: dict[str, Callable[[Event], bool]] = {
    "the guest started": _progress("guest", "boot"),
    "its cleanup": _step("cleaning up"),
}


def _spec(**over) -> RunSpec:
    """A quick run that makes every kind of thing a local run makes: a loop device (block-device without --device),
    a work directory, the bridge with the guest's tap, the baseline's namespace and veth pair, fio on bare metal,
    the guest; its network test's netserver."""
    fields = dict(profile="virtio-disk", suite="all", size="16M", storage_tests="randwrite-4k-qd1",
                  net_tests="tcp-stream", runtime=2, net_seconds=2)
    fields.update(over)
    return RunSpec(**fields)


def _kill_at(spec: RunSpec, step: str, hit: Callable[[Event], bool], *,
             kill: Callable[[int], None] | None = None) -> int:
    """Start `spec` detached and SIGKILL its executor (or do `kill(pid)`) at the step `hit` finds; returns the run."""
    with ResultStore() as store:
        rid = runs.start_detached(spec, store)
        pid = store.get_run(rid).pid
        assert pid
        _wait_for(rid, store, hit, step)
        if kill is None:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)  # this test started it: its child, reaped here
        else:
            kill(pid)
    return rid


def _clean_up(path: str, cli_run) -> list[str]:
    """One of the clean-up paths, as each front door runs it; what it printed."""
    if path == "the next run":
        said: list[str] = []
        with ResultStore() as store:
            problems = reclaim.reclaim_dead_runs(store, said.append)  # what the lifecycle does before a run's body
        assert problems == [], problems
        return said
    argv = ["guests", "--destroy-orphans"] if path == "guests --destroy-orphans" else ["reclaim"]
    r = cli_run(argv)
    assert r.code == 0 and "could not undo" not in r.err, r.printed
    return r.out.splitlines()


def _assert_left_nothing(before: dict, conn, marks: tuple[str, ...], said: list[str]) -> None:
    after = snapshot(conn, marks)
    left = {k: sorted(after[k] - before[k]) for k in before if after[k] - before[k]}
    assert left == {}, f"left behind: {left}; the clean-up said: {said}"
    assert ledger.ledgers() == [], [p.read_text() for p in ledger.ledgers()]


@pytest.fixture
def marks(state) -> tuple[str, ...]:
    return (str(state), os.environ["CLOUDBOX_RUN_DIR"])


CLEAN_UPS = ("the next run", "guests --destroy-orphans", "reclaim")


def _kill_each(steps: dict[str, Callable[[Event], bool]], libvirt_conn, marks: tuple[str, ...], cli_run) -> None:
    """Each step of `steps` in a run of its own: killed there, one of the clean-up paths in turn, the host checked."""
    timings = {}
    for i, (step, hit) in enumerate(steps.items()):
        before = snapshot(libvirt_conn, marks)
        t0 = time.monotonic()
        rid = _kill_at(_spec(), step, hit)
        said = _clean_up(CLEAN_UPS[i % len(CLEAN_UPS)], cli_run)
        timings[step] = round(time.monotonic() - t0, 1)
        _assert_left_nothing(before, libvirt_conn, marks, said)
        with ResultStore() as store:
            run = store.get_run(rid)
        assert run.state == "aborted", (step, run.state, run.reason)
        assert re.match(r"executor killed: executor pid \d+ gone, last seen \d{4}-\d\d-\d\d \d\d:\d\d:\d\d during '",
                        run.reason or ""), (step, run.reason)
        if step in ("a guest test", "its cleanup"):  # what it measured before the kill stays
            assert run.measurement("baseline", "randwrite-4k-qd1", "MB/s") is not None, step
    print(f"kill, clean-up and check per step (s): {timings}")


def test_a_run_killed_at_each_step_leaves_nothing_once_cleaned_up_and_is_aborted(state, libvirt_conn, marks,
                                                                                cli_run):
    _kill_each(STEPS, libvirt_conn, marks, cli_run)


@pytest.mark.full
def test_a_run_killed_once_its_guest_runs_or_in_its_cleanup_leaves_nothing(state, libvirt_conn, marks, cli_run):
    _kill_each(FULL_STEPS, libvirt_conn, marks, cli_run)


def _libvirtd_pid() -> int:
    pid = daemons.libvirtd_pid()
    assert pid, "no libvirtd pid file (the session's libvirt_conn started or found one)"
    return pid


def _ended(ev: Event) -> bool:
    return ev.kind == "state" and ev.payload.get("state") not in (None, "running")


def test_libvirtd_killed_during_a_guest_test_is_named_and_the_run_leaves_nothing(state, libvirt_conn, marks):
    before = snapshot(libvirt_conn, marks)
    try:
        with ResultStore() as store:
            rid = runs.start_detached(_spec(suite="storage"), store)
            executor = store.get_run(rid).pid
            assert executor
            _wait_for(rid, store, _guest_test, "a guest test")
            gone = _libvirtd_pid()
            os.kill(gone, signal.SIGKILL)
            _wait_for(rid, store, _ended, "its end")
            os.waitpid(executor, 0)
            run = store.get_run(rid)
    finally:  # libvirtd back for the tests after this one, whatever the run did
        if daemons.libvirtd_pid() is None:
            daemons.reconnect().close()
    assert run.state == "aborted", run.reason
    assert "libvirtd went away" in (run.reason or "") and "guest agent" in run.reason, run.reason
    assert "stopped (guest agent" not in run.reason, run.reason  # not taken for a guest that stopped
    assert daemons.libvirtd_pid() not in (None, gone)  # started again by the run
    _assert_left_nothing(before, libvirt_conn, marks, [])


# ------------------------------------------------------------------------------------------- opt-in: volumes
# One per scheme, each attached the way that makes the most on this host: QEMU's NBD client, open-iscsi's session,
# vblade on the guest's bridge, the kernel's NVMe/TCP target and host, ganesha and the guest's NFS mount.
VOLUME_PROFILES = ("kvm-ebs-nbd", "kvm-ebs-iscsi-host", "kvm-ebs-aoe-guest", "kvm-ebs-nvme", "nfs-async-tcp")


@pytest.mark.full
@pytest.mark.parametrize("profile", VOLUME_PROFILES)
def test_a_run_on_a_network_volume_killed_during_a_guest_test_leaves_nothing(profile, state, libvirt_conn, marks,
                                                                             cli_run):
    from cloudbox.core.disks.volumes import attach, hostattach, nvmet
    from cloudbox.core.disks.volumes.store import VolumeStore
    from cloudbox.core.errors import CloudboxError
    from cloudbox.core.spec.profiles import resolve_profile

    d = resolve_profile(profile).disk
    block = not d.volume.startswith("nfs:")
    if block:
        with VolumeStore() as vs:
            vs.create(d.volume.partition(":")[2], 64 << 20)
    try:
        attach.preflight(d.volume, d.attach, 16 << 20)
    except CloudboxError as e:
        pytest.skip(f"{profile}: {e}")
    before = snapshot(libvirt_conn, marks)
    before_kernel = (hostattach.leftovers(), nvmet.exports())
    rid = _kill_at(_spec(profile=profile, suite="storage", storage_tests="seq-write-64k"), "a guest test",
                   _guest_test)
    said = _clean_up("reclaim", cli_run)
    _assert_left_nothing(before, libvirt_conn, marks, said)
    assert (hostattach.leftovers(), nvmet.exports()) == before_kernel, said
    with ResultStore() as store:
        assert store.get_run(rid).state == "aborted"
    if block:
        with VolumeStore() as vs:  # free again: its mark's process is gone
            vs.delete(d.volume.partition(":")[2])
