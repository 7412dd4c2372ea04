"""The run's ledger (core.ledger): written before each thing is made, read back whole after a kill, reclaimed guests
first and nothing else; every kind registered where the clean-up finds it; a run killed outright with a loop device
over a deleted file, undone by the clean-up."""

from __future__ import annotations

import ast
import dataclasses
import fcntl
import importlib
import json
import os
import pkgutil
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

import cloudbox.core
from cloudbox.core import ledger
from cloudbox.core.disks import backing
from cloudbox.core.errors import CloudboxError
from cloudbox.core.record.results import ResultStore
from cloudbox.core.run import reclaim
from cloudbox.core.virt.domain import CLOUDBOX_XMLNS

DONE: list[str] = []  # what the test kinds' release() did, in order


@dataclass(frozen=True)
class _Thing(ledger.Held):
    name: str = ""
    fails: bool = False

    def release(self) -> str:
        if self.fails:
            raise CloudboxError(f"{self.name} will not go")
        DONE.append(self.name)
        return f"undid {self.name}"


@ledger.kind
@dataclass(frozen=True)
class FakeThing(_Thing):
    kind: ClassVar[str] = "test-thing"


@ledger.kind
@dataclass(frozen=True)
class FakeGuest(_Thing):
    kind: ClassVar[str] = "test-guest"
    first: ClassVar[bool] = True


@pytest.fixture(autouse=True)
def _clean():
    DONE.clear()
    yield
    DONE.clear()


def _written(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_an_intent_is_written_before_the_thing_and_read_back_with_what_its_making_told(isolated):
    led = ledger.Ledger.create("a" * 32)
    assert led.path == isolated / "ledgers" / f"{'a' * 32}.jsonl"
    one = led.hold(FakeThing("loop"))
    assert [ln["op"] for ln in _written(led.path)] == ["hold"]  # on disk before anything is made
    two = led.hold(FakeThing("dir"))
    one.update(name="loop0")
    two.done()
    assert [(e.n, e.record) for e in ledger.read(led.path)] == [(1, FakeThing("loop0"))]
    with led.path.open("a") as f:  # a line a killed process could not finish is left out
        f.write('{"n": 1, "op": "fr')
    assert [e.record for e in ledger.read(led.path)] == [FakeThing("loop0")]
    assert [e.record for e in led.close()] == [FakeThing("loop0")]
    assert led.path.exists()  # something is still held: kept for a clean-up


def test_a_ledger_whose_things_were_all_taken_down_is_removed(isolated):
    led = ledger.Ledger.create("b" * 32)
    led.hold(FakeThing("x")).release()
    assert led.close() == [] and not led.path.exists() and DONE == ["x"]


def test_a_live_runs_ledger_is_never_taken_and_a_dead_ones_is(isolated):
    led = ledger.Ledger.create("c" * 32)
    led.hold(FakeThing("x"))
    assert ledger.reclaim(led.path, DONE.append) is None  # its run holds the lock: not a clean-up's to touch
    assert DONE == []
    led._fd, fd = -1, led._fd  # the run's process dies: the kernel drops its lock
    os.close(fd)
    said: list[str] = []
    assert ledger.reclaim(led.path, said.append) == [] and said == ["undid x"] and not led.path.exists()


def test_guests_go_first_then_the_rest_newest_first(isolated):
    led = ledger.Ledger.create("d" * 32)
    for rec in (FakeThing("work dir"), FakeThing("loop"), FakeGuest("guest"), FakeThing("bridge")):
        led.hold(rec)
    os.close(led._fd)
    assert ledger.reclaim(led.path, lambda _: None) == []
    assert DONE == ["guest", "bridge", "loop", "work dir"]


def test_a_guest_that_cannot_be_destroyed_keeps_its_storage_and_the_ledger(isolated):
    led = ledger.Ledger.create("e" * 32)
    led.hold(FakeThing("work dir"))
    led.hold(FakeGuest("guest", fails=True))
    os.close(led._fd)
    problems = ledger.reclaim(led.path, lambda _: None)
    assert problems is not None and len(problems) == 2 and "guest will not go" in problems[0]
    assert "left, as a guest of the run could not be destroyed" in problems[1]
    assert DONE == [] and [e.record for e in ledger.read(led.path)] == [FakeThing("work dir"),
                                                                         FakeGuest("guest", fails=True)]


def test_an_unknown_kind_is_kept_and_named(isolated):
    d = ledger.ledgers_dir()
    d.mkdir(parents=True)
    path = d / f"{'f' * 32}.jsonl"
    path.write_text('{"n":1,"op":"hold","kind":"hugepages","what":{"count":512}}\n')
    problems = ledger.reclaim(path, lambda _: None)
    assert problems and "hugepages" in problems[0] and "does not know how to undo it" in problems[0]
    assert path.exists()


@pytest.fixture
def reachable():
    """A directory QEMU could traverse to (new_work_dir checks its parents), removed after the test."""
    d = Path(tempfile.mkdtemp(prefix="cloudbox-test-ledger-", dir="/var/tmp"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_a_work_directory_that_was_there_before_is_never_taken(isolated, reachable):
    mine = reachable / "run-x"
    mine.mkdir()
    (mine / "keep").write_text("someone's")
    led = ledger.Ledger.create("9" * 32)
    with ledger.keeping(led), pytest.raises(CloudboxError, match="already exists"):
        backing.new_work_dir("sparse-file", mine, 1 << 20, "raw")
    assert led.close() == [] and (mine / "keep").exists()


def test_every_kind_in_the_core_is_registered_and_known_to_the_clean_up():
    """Each Held subclass of cloudbox.core is registered by its module, and that module is one the clean-up
    imports: a kind it did not know would be kept in a dead run's ledger for ever."""
    for m in pkgutil.walk_packages(cloudbox.core.__path__, "cloudbox.core."):
        importlib.import_module(m.name)
    found = {c for c in _subclasses(ledger.Held) if c.__module__.startswith("cloudbox.core.")
             and c is not ledger.Unknown}
    assert {c.kind for c in found} <= set(ledger.KINDS)
    assert {c.__module__ for c in found} <= {m.__name__ for m in reclaim.KIND_MODULES}
    assert {"guest", "loop", "md-array", "mount", "link", "netns", "process", "directory", "nvmet-export",
            "iscsi-session", "nvme-controller", "nbd-device", "aoe-device", "lv-activation"} <= set(ledger.KINDS)


def _subclasses(cls: type) -> set[type]:
    out = set()
    for sub in cls.__subclasses__():
        out |= {sub} | _subclasses(sub)
    return out


def test_each_kind_is_a_frozen_dataclass_with_a_documented_release():
    for name, cls in ledger.KINDS.items():
        if name.startswith("test-"):
            continue
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen, name  # type: ignore[attr-defined]
        assert cls.__doc__ and "release" in cls.__dict__, name
        assert all(f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
                   for f in dataclasses.fields(cls)), f"{name}: every field has a default (a ledger may lack it)"


def test_the_ledger_module_imports_only_shared_helpers():
    tree = ast.parse(Path(ledger.__file__).read_text())
    relative = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 1}
    assert relative <= {None, "errors"}, relative


KILLED_RUN = textwrap.dedent("""
    import os, signal, sys, uuid
    from pathlib import Path
    from cloudbox.core import ledger
    from cloudbox.core.disks import backing
    from cloudbox.core.record.results import ResultStore
    run_uuid = uuid.uuid4().hex
    with ResultStore() as store:
        rid = store.create_run(uuid=run_uuid, profile_name="killed", suite="storage")
        store.add_event(rid, "step", {"text": "preparing the backing store"})
    with ledger.keeping(ledger.Ledger.create(run_uuid)):
        store = backing.prepare("block-device", work_dir=Path(sys.argv[1]) / f"run-{run_uuid[:12]}",
                                size_bytes=16 << 20, fmt="raw")
        os.unlink(Path(sys.argv[1]) / f"run-{run_uuid[:12]}" / "loopdisk.raw")  # held by the loop alone now
        print(store.path, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
""")


def _loops_over(d: Path) -> list[str]:
    out = subprocess.run(["losetup", "--list", "--noheadings", "--output", "NAME,BACK-FILE"], capture_output=True,
                         text=True).stdout
    return [ln for ln in out.splitlines() if str(d) in ln]


@pytest.mark.root
def test_a_run_killed_with_a_loop_over_a_deleted_file_is_undone_by_the_next_clean_up(isolated, reachable):
    if os.geteuid() != 0 or shutil.which("losetup") is None:
        pytest.skip("needs root and losetup (it makes a loop device)")
    work = reachable / "work"
    work.mkdir()
    p = subprocess.run([sys.executable, "-c", KILLED_RUN, str(work)], capture_output=True, text=True,
                       env={**os.environ, "CLOUDBOX_STATE_DIR": str(isolated)})
    assert p.returncode == -signal.SIGKILL, p.stderr
    loop = p.stdout.strip()
    try:
        assert [ln for ln in _loops_over(work) if "(deleted)" in ln], _loops_over(work)
        said: list[str] = []
        with ResultStore() as store:
            assert reclaim.reclaim_dead_runs(store, said.append) == []
            (run,) = store.list_runs()
        assert run.state == "aborted" and run.reason.startswith("executor killed") and "last seen" in run.reason
        assert "during 'preparing the backing store'" in run.reason
        assert _loops_over(work) == [] and list(work.iterdir()) == [], said
        assert any(f"detached loop device {loop}" in s for s in said), said
        assert ledger.ledgers() == []
        with ResultStore() as store:  # a second clean-up finds nothing to do
            assert reclaim.reclaim_dead_runs(store, said.append) == [] and len(said) == 3, said
    finally:
        subprocess.run(["losetup", "-d", loop], capture_output=True)


def test_the_flock_is_per_open_file(isolated):
    """What `take` relies on: a second open of the file in the same process cannot take a held lock either."""
    led = ledger.Ledger.create("7" * 32)
    fd = os.open(led.path, os.O_RDONLY)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
        led.close()


# -- libvirtd going away under a run ---------------------------------------------------------------------------
class _DeadConn:
    """A connection whose libvirtd went away."""

    def isAlive(self) -> int:  # noqa: N802 (libvirt's name)
        return 0


class _Dom:
    def __init__(self, fails_with=None) -> None:
        self.fails_with = fails_with

    def name(self) -> str:
        return "cloudbox-t"

    def isActive(self) -> int:  # noqa: N802 (libvirt's name)
        if self.fails_with is not None:
            raise self.fails_with
        return 1

    def destroy(self) -> None:
        if self.fails_with is not None:
            raise self.fails_with


def _broken_pipe():
    libvirt = pytest.importorskip("libvirt")
    err = libvirt.libvirtError("Cannot write data: Broken pipe")
    err.err = (38, 7, "Cannot write data: Broken pipe", 2, None, None, None, 0, 0)  # VIR_ERR_SYSTEM_ERROR, RPC
    return err


def test_libvirtd_gone_is_named_not_taken_for_a_stopped_guest(monkeypatch):
    pytest.importorskip("libvirt_qemu")
    import libvirt_qemu

    from cloudbox.core.errors import GuestError, LibvirtLost
    from cloudbox.core.virt import guest

    def fail(*_args):
        raise _broken_pipe()

    monkeypatch.setattr(libvirt_qemu, "qemuAgentCommand", fail)
    monkeypatch.setattr(guest.daemons, "libvirtd_pid", lambda: None)
    g = guest.Guest(_DeadConn(), _Dom(_broken_pipe()))
    with pytest.raises(LibvirtLost) as info:
        g.agent("guest-exec-status", {"pid": 1})
    assert not isinstance(info.value, GuestError)
    assert str(info.value).startswith("libvirtd went away (its process is gone) during the run (guest agent, "
                                      "guest-exec-status: Cannot write data: Broken pipe)")
    with pytest.raises(LibvirtLost, match="libvirtd went away .* while guest cloudbox-t was booting"):
        g.wait_agent(timeout=5)


def test_a_guest_whose_libvirtd_went_away_is_destroyed_through_its_record(isolated, monkeypatch):
    from cloudbox.core.virt import guest

    released = []
    monkeypatch.setattr(guest.Domain, "release", lambda self: released.append(self.name) or "ended it")
    led = ledger.Ledger.create("8" * 32)
    entry = led.hold(guest.Domain("cloudbox-t", "qemu:///system", "8" * 32))
    g = guest.Guest(_DeadConn(), _Dom(_broken_pipe()), held=entry)
    g.destroy()
    assert released == ["cloudbox-t"] and led.close() == []


def test_a_domain_record_without_libvirt_ends_its_qemu(monkeypatch):
    from cloudbox.core.errors import LibvirtUnavailable
    from cloudbox.core.virt import guest

    def unreachable(*_a, **_k):
        raise LibvirtUnavailable("cannot reach libvirtd")

    ended = []
    monkeypatch.setattr(guest.daemons, "reconnect", unreachable)
    monkeypatch.setattr(guest, "_end_qemu", lambda name: ended.append(name) or f"ended QEMU of guest {name}")
    assert guest.Domain("cloudbox-t", "qemu:///system", "r").release() == "ended QEMU of guest cloudbox-t"
    assert ended == ["cloudbox-t"]


class _LiveConn:
    """A libvirt connection that has domain `cloudbox-t` of run `run`."""

    def __init__(self, run: str) -> None:
        self.run, self.destroyed = run, []

    def lookupByName(self, name):  # noqa: N802 (libvirt's name)
        conn = self

        class Dom:
            def metadata(self, *_a):
                return f'<cloudbox:profile xmlns:cloudbox="{CLOUDBOX_XMLNS}" name="p" run="{conn.run}"/>'

            def isActive(self):  # noqa: N802 (libvirt's name)
                return 1

            def destroy(self):
                conn.destroyed.append(name)

        return Dom()

    def close(self) -> None:
        pass


def test_a_domain_of_the_same_name_but_another_run_is_left_alone(monkeypatch):
    pytest.importorskip("libvirt")
    from cloudbox.core.virt import guest

    ended = []
    monkeypatch.setattr(guest, "_end_qemu", lambda name: ended.append(name) or f"ended QEMU of guest {name}")
    other = _LiveConn("another-run")
    monkeypatch.setattr(guest.daemons, "reconnect", lambda *_a, **_k: other)
    assert guest.Domain("cloudbox-t", "qemu:///system", "r").release() == ""
    assert other.destroyed == [] and ended == []
    mine = _LiveConn("r")
    monkeypatch.setattr(guest.daemons, "reconnect", lambda *_a, **_k: mine)
    assert guest.Domain("cloudbox-t", "qemu:///system", "r").release() == "destroyed guest cloudbox-t"
    assert mine.destroyed == ["cloudbox-t"] and ended == []


def test_at_boot_no_daemon_is_asked(isolated, monkeypatch):
    """`cloudbox reclaim --boot` runs before libvirtd: a dead run's guest is looked for as a QEMU process only (none
    survives a boot), its servers are not signalled (their pids are the last boot's), its files still go."""
    from cloudbox.core.virt import guest

    def asked(*_a, **_k):
        raise AssertionError("libvirtd asked for at boot")

    monkeypatch.setattr(guest.daemons, "reconnect", asked)
    monkeypatch.setattr(guest, "qemu_pids", lambda name: [])
    d = ledger.ledgers_dir()
    d.mkdir(parents=True)
    work = isolated / "work" / "run-x"
    work.mkdir(parents=True)
    path = d / f"{'6' * 32}.jsonl"
    lines = [{"n": 1, "op": "hold", "kind": "directory", "what": {"path": str(work)}},
             {"n": 2, "op": "hold", "kind": "process", "what": {"program": "init", "pid": 1, "start": 0}},
             {"n": 3, "op": "hold", "kind": "guest", "what": {"name": "cloudbox-x", "uri": "qemu:///system"}}]
    path.write_text("".join(json.dumps(ln) + "\n" for ln in lines))
    said: list[str] = []
    assert ledger.reclaim(path, said.append, boot=True) == []
    assert said == [f"removed {work}"] and not work.exists() and not path.exists()
    assert not ledger.booting()
