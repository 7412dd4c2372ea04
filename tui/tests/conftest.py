"""Shared pytest fixtures: isolated state dirs, the CLI run in-process, and a real libvirtd (started and stopped by
the tests on hosts without systemd) for the slow suites that boot real guests."""

from __future__ import annotations

import io
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest

# Imported with the session, not inside a test: cli.run's Printer binds sys.stdout when its module is imported, and
# a test's captured stdout is closed when that test ends.
from cloudbox import cli
from cloudbox.core.spec import addresses

# One run dir for the whole session (run lock, accelerator probe cache, record of started daemons);
# state (results DB, work dirs) is per test.
_RUN_DIR = Path(tempfile.mkdtemp(prefix="cloudbox-test-run-", dir="/var/tmp"))
os.environ.setdefault("CLOUDBOX_RUN_DIR", str(_RUN_DIR))


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_RUN_DIR, ignore_errors=True)


def _is_root() -> bool:
    return os.geteuid() == 0


@pytest.fixture
def state(monkeypatch) -> Path:
    """A private CLOUDBOX_STATE_DIR/RUN_DIR that QEMU (user libvirt-qemu) can traverse."""
    base = Path(tempfile.mkdtemp(prefix="cloudbox-test-", dir="/var/tmp"))
    os.chmod(base, 0o755)
    monkeypatch.setenv("CLOUDBOX_STATE_DIR", str(base / "state"))
    yield base
    shutil.rmtree(base, ignore_errors=True)


# Where profiles and studies are looked for besides the checkout's and the state dir's: a test sees none of the
# developer's own.
SEARCH_PATHS = ("CLOUDBOX_PROFILE_PATH", "CLOUDBOX_PRESET_DIR", "CLOUDBOX_STUDY_DIR")


@pytest.fixture
def isolated(tmp_path, monkeypatch) -> Path:
    """A private CLOUDBOX_STATE_DIR (tmp_path/state, not made) and no profile or study search paths from the
    environment; returns the state dir. For tests without guests (`state` is for those with)."""
    monkeypatch.setenv("CLOUDBOX_STATE_DIR", str(tmp_path / "state"))
    for var in SEARCH_PATHS:
        monkeypatch.delenv(var, raising=False)
    return tmp_path / "state"


class Ran(NamedTuple):
    """What one `cloudbox` command run in-process did."""

    code: int
    out: str
    err: str

    @property
    def printed(self) -> str:
        """Everything it printed, stdout then stderr."""
        return self.out + self.err


@pytest.fixture
def cli_run(capsys, monkeypatch) -> Callable[..., Ran]:
    """`cli_run(argv, stdin=None)`: cloudbox.cli.main(argv) in this process, its exit code and what it printed (only
    what this command printed); with `stdin`, that text is what it reads."""

    def run(argv: list[str], stdin: str | None = None) -> Ran:
        if stdin is not None:
            monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
        capsys.readouterr()
        code = cli.main(list(argv))
        out, err = capsys.readouterr()
        return Ran(code, out, err)

    return run


@pytest.fixture(scope="session")
def guest_image():
    from cloudbox.core.errors import GuestError
    from cloudbox.core.virt.guestimage import GuestImage

    try:
        return GuestImage.locate()
    except GuestError as e:
        pytest.skip(f"no benchmark guest image: {e}")


@pytest.fixture(scope="session")
def libvirt_conn(guest_image):
    """A connection to the real system libvirtd; started here (and stopped at the end) without systemd."""
    if not _is_root():
        pytest.skip("real-libvirtd tests need root (they start libvirtd and create loop devices and bridges)")
    from cloudbox.core.virt import accel, daemons

    acc = accel.detect(guest_image.kernel)
    had_record = (Path(os.environ["CLOUDBOX_RUN_DIR"]) / "daemons.json").exists()
    conn = Reconnecting(lambda: daemons.connect(hide_kvm=not acc.kvm_usable))
    _LIVE["conn"] = conn
    yield conn
    _LIVE.pop("conn", None)
    conn.close()
    if not had_record and os.environ.get("CLOUDBOX_KEEP_DAEMONS") != "1":
        daemons.stop_started_daemons()


class Reconnecting:
    """The session's libvirt connection, opened again when libvirtd went away under it (a test kills libvirtd on
    purpose; the run it watches starts libvirtd again): every other call goes to the connection as it is."""

    def __init__(self, open_: Callable) -> None:
        self._open = open_
        self._conn = open_()

    def _alive(self) -> bool:
        try:
            return bool(self._conn.isAlive())
        except Exception:  # noqa: BLE001 - a connection whose daemon died raises
            return False

    def __getattr__(self, name: str):
        import libvirt

        if not callable(getattr(self._conn, name)):
            return getattr(self._conn, name)

        def call(*args, **kwargs):
            try:
                return getattr(self._conn, name)(*args, **kwargs)
            except libvirt.libvirtError:
                if self._alive():  # a real refusal, not a daemon gone (it tells only once a call failed)
                    raise
                self._conn = self._open()
                return getattr(self._conn, name)(*args, **kwargs)

        return call


# -- what a test module leaves behind ---------------------------------------------------------------------------
_LIVE: dict = {}  # the session's libvirt connection, once a test has asked for it


def _executors() -> set[int]:
    """This session's run executors and sweeps (python -m cloudbox.core.run.runs, started with this session's
    CLOUDBOX_RUN_DIR): another test session's or a real run's executor on the same host is none of ours."""
    from cloudbox.core.run.runs import ENTRY

    ours = f"CLOUDBOX_RUN_DIR={os.environ['CLOUDBOX_RUN_DIR']}".encode()
    found = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                argv = (d / "cmdline").read_bytes().split(b"\0")
                if ENTRY.encode() in argv and ours in (d / "environ").read_bytes().split(b"\0"):
                    found.add(int(d.name))
            except OSError:
                continue
    return found


def _cloudbox_things() -> dict[str, set]:
    from cloudbox.core.virt import network

    things: dict[str, set] = {
        "executor": _executors(),
        "link": {n for n in (addresses.BRIDGE, addresses.VETH_HOST) if network.link_exists(n)},
        "netns": {addresses.NS} if os.path.exists(f"/run/netns/{addresses.NS}") else set(),
        "guest": set(),
    }
    if "conn" in _LIVE:
        from cloudbox.core.virt.guest import list_guests

        things["guest"] = {g.name for g in list_guests(_LIVE["conn"]) if g.state == "running"}
    return things


def _remove(kind: str, name) -> None:
    import signal
    import subprocess
    import time

    if kind == "executor":
        try:
            os.kill(name, signal.SIGTERM)  # its own cleanup removes its guest, bridge and volumes
            deadline = time.monotonic() + 90
            while os.path.exists(f"/proc/{name}") and time.monotonic() < deadline:
                try:
                    os.waitpid(name, os.WNOHANG)
                except ChildProcessError:
                    pass
                time.sleep(0.5)
            if os.path.exists(f"/proc/{name}"):
                os.kill(name, signal.SIGKILL)
        except ProcessLookupError:
            pass
    elif kind == "guest" and "conn" in _LIVE:
        import libvirt

        try:
            _LIVE["conn"].lookupByName(name).destroy()
        except libvirt.libvirtError:
            pass
    elif kind == "link":
        subprocess.run(["ip", "link", "del", name], capture_output=True)
    elif kind == "netns":
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


EXIT_GRACE_S = 30.0


@pytest.fixture(scope="module", autouse=True)
def nothing_left_behind(request):
    """A module's real runs leave no executor, guest, bridge or namespace running after its last test: whatever
    one leaves is removed here and reported as that module's error, so the next module does not fail on it
    (bridge cbbr0 already exists...). Things that were there before the module started are not touched, nor is
    anything while only the module's quick tests run (a real run elsewhere on the host may make its bridge then)."""
    real = any(item.get_closest_marker("slow") or item.get_closest_marker("root")
               for item in request.session.items if item.module is request.module)
    if not _is_root() or not real:
        yield
        return
    before = _cloudbox_things()
    yield
    deadline = time.monotonic() + EXIT_GRACE_S  # a cancelled run's state is final a moment before its process ends
    while (after := _cloudbox_things())["executor"] - before["executor"] and time.monotonic() < deadline:
        time.sleep(0.5)
    executors = sorted(after["executor"] - before["executor"])
    for pid in executors:  # SIGTERM first, so it cleans up after itself
        _remove("executor", pid)
    if executors:
        after = _cloudbox_things()
    left = {k: after[k] - before[k] for k in ("guest", "link", "netns")}
    for k, names in left.items():
        for n in names:
            _remove(k, n)
    named = [f"run executor pid {p}" for p in executors] + [f"{k} {n}" for k, names in left.items()
                                                             for n in sorted(names)]
    if named:
        pytest.fail("this module left behind (now removed): " + ", ".join(named), pytrace=False)
