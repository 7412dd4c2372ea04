"""Children started with procs.die_with_parent: they die with the parent, and forking them from a threaded parent
does not hang (the hook runs no loader code between fork and exec). procs.stop against real children: one that ends
on SIGTERM, one that ignores it, one already gone. procs.wait_cancellable with real short programs: their output,
their exit status, cancelled, given up by its every() hook. procs.Child with real programs: one that becomes
ready, one that exits first, one never ready, one not installed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from cloudbox.core import procs
from cloudbox.core.errors import Aborted, CloudboxError
from cloudbox.core.procs import process_exists


def _wait_gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not process_exists(pid):
            return True
        time.sleep(0.05)
    return False


def test_a_child_dies_when_its_parent_is_killed():
    parent = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import subprocess, sys, time
        from cloudbox.core.procs import die_with_parent
        child = subprocess.Popen(["sleep", "600"], preexec_fn=die_with_parent())
        print(child.pid, flush=True)
        time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert process_exists(child)
    finally:
        parent.kill()
        parent.wait()
    gone = _wait_gone(child, 10)
    if not gone:
        os.kill(child, signal.SIGKILL)
    assert gone, f"sleep {child} outlived its killed parent"


def test_forking_from_a_threaded_parent_that_loads_libraries_does_not_hang():
    script = textwrap.dedent("""
        import ctypes, ctypes.util, subprocess, threading
        from cloudbox.core.procs import die_with_parent
        stop = threading.Event()
        names = [n for n in (ctypes.util.find_library(x) for x in ("m", "z", "crypt", "uuid")) if n]
        def churn():
            while not stop.is_set():
                for n in names:
                    ctypes.CDLL(n)
        threads = [threading.Thread(target=churn, daemon=True) for _ in range(4)]
        for t in threads:
            t.start()
        for _ in range(40):
            subprocess.run(["true"], preexec_fn=die_with_parent(), check=True)
        stop.set()
        print("forked 40")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "forked 40"

# Prints "ready" once its SIGTERM handler is set, so the test never signals it before that.
_IGNORES_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); " \
                "time.sleep(60)"


def _child(code: str) -> subprocess.Popen[str]:
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return p


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace():
    p = _child(_IGNORES_TERM)
    t0 = time.monotonic()
    rc = procs.stop(p, 0.5)
    took = time.monotonic() - t0
    assert rc == -9 and p.returncode == -9
    assert 0.5 <= took < 5, took  # waited the grace, then SIGKILL
    assert not procs.process_exists(p.pid)


def test_a_child_that_honours_sigterm_ends_on_it_without_waiting_the_grace():
    p = _child("import time; print('ready', flush=True); time.sleep(60)")
    t0 = time.monotonic()
    assert procs.stop(p, 30) == -15
    assert time.monotonic() - t0 < 5


def test_an_exited_child_is_only_reaped():
    p = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    p.wait()
    assert procs.stop(p, 0.1) == 3


def test_a_child_server_is_returned_once_ready_and_stopped_with_its_log(tmp_path):
    marker, log = tmp_path / "up", tmp_path / "srv.log"
    seen: list[int] = []

    def ready(pid: int) -> bool:
        seen.append(pid)
        return marker.exists()

    child = procs.Child.start(["sh", "-c", f"sleep 0.3; touch {marker}; exec sleep 60"], log=log, ready=ready,
                              serving="test", ready_is="touch its marker", timeout=10)
    pid = child.pid
    assert pid is not None and process_exists(pid) and log.exists()
    assert len(seen) > 1 and set(seen) == {pid}  # asked again until ready, about its own pid
    child.stop()
    assert child.pid is None and not process_exists(pid) and not log.exists()
    child.stop()  # twice is fine


def test_a_child_server_that_exits_first_is_named_with_its_output(tmp_path):
    log = tmp_path / "srv.log"
    with pytest.raises(CloudboxError, match=r"^sh exited 3 before serving volume ebs: no such volume$"):
        procs.Child.start(["sh", "-c", "echo no such volume >&2; exit 3"], log=log, ready=lambda pid: False,
                          serving="volume ebs", ready_is="listen", timeout=10)
    assert not log.exists()


def test_a_child_server_never_ready_is_stopped_after_the_timeout(tmp_path):
    log, pidfile = tmp_path / "srv.log", tmp_path / "pid"
    t0 = time.monotonic()
    with pytest.raises(CloudboxError, match=r"^sh did not listen on 127.0.0.1:9 within 1 s: starting$"):
        procs.Child.start(["sh", "-c", f"echo $$ > {pidfile}; echo starting; exec sleep 60"], log=log,
                          ready=lambda pid: False, serving="x", ready_is="listen on 127.0.0.1:9", timeout=1)
    assert 1 <= time.monotonic() - t0 < 5
    assert not process_exists(int(pidfile.read_text())) and not log.exists()


def test_a_child_server_not_installed_leaves_no_log(tmp_path):
    log = tmp_path / "srv.log"
    with pytest.raises(FileNotFoundError):
        procs.Child.start(["cloudbox-no-such-server"], log=log, ready=lambda pid: True, serving="x", ready_is="y",
                          timeout=1)
    assert not log.exists()


def test_wait_cancellable_returns_the_output_and_leaves_the_status_to_the_caller():
    never = lambda: False  # noqa: E731
    p = subprocess.Popen(["sh", "-c", "echo out; echo err >&2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    assert procs.wait_cancellable(p, never, "x") == ("out\n", "err\n") and p.returncode == 0
    p = subprocess.Popen(["true"])
    assert procs.wait_cancellable(p, never, "x") == (None, None) and p.returncode == 0
    p = subprocess.Popen(["false"])
    assert procs.wait_cancellable(p, never, "x") == (None, None) and p.returncode == 1
    # more output than a pipe holds: read while waiting, so the child never blocks on a full pipe
    p = subprocess.Popen(["head", "-c", "1000000", "/dev/zero"], stdout=subprocess.PIPE)
    out, _ = procs.wait_cancellable(p, never, "x", interval=0.05)
    assert len(out) == 1_000_000 and p.returncode == 0


def test_wait_cancellable_kills_the_child_when_cancelled():
    p = subprocess.Popen(["sleep", "60"])
    t0 = time.monotonic()
    with pytest.raises(Aborted, match=r"^cancelled during a test sleep$"):
        procs.wait_cancellable(p, lambda: time.monotonic() - t0 > 0.3, "a test sleep", interval=0.1)
    assert time.monotonic() - t0 < 5
    assert p.returncode == -signal.SIGKILL and not process_exists(p.pid)


def test_wait_cancellable_calls_every_each_round_and_kills_the_child_when_it_raises():
    calls: list[float] = []

    def every() -> None:
        calls.append(time.monotonic())
        if len(calls) == 4:
            raise TimeoutError("hung")

    p = subprocess.Popen(["sleep", "60"])
    with pytest.raises(TimeoutError, match="hung"):
        procs.wait_cancellable(p, lambda: False, "x", every=every, interval=0.1)
    assert len(calls) == 4 and calls[-1] - calls[0] >= 0.25  # once an interval
    assert p.returncode == -signal.SIGKILL and not process_exists(p.pid)
    p = subprocess.Popen(["sleep", "0.3"])  # ends while every() lets it run: its status is its own
    calls.clear()
    assert procs.wait_cancellable(p, lambda: False, "x", every=lambda: calls.append(0), interval=0.1) == (None, None)
    assert len(calls) >= 2 and p.returncode == 0


def test_a_child_servers_io_counts_what_it_wrote_and_nothing_once_stopped(tmp_path):
    out, done = tmp_path / "data", tmp_path / "done"
    writer = (f"import os; fd = os.open({str(out)!r}, os.O_WRONLY | os.O_CREAT); os.write(fd, b'x' * (4 << 20)); "
              f"os.fsync(fd); open({str(done)!r}, 'w').close(); import time; time.sleep(60)")
    child = procs.Child.start([sys.executable, "-c", writer], log=tmp_path / "log", ready=lambda pid: done.exists(),
                              serving="a file", ready_is="written", timeout=10)
    try:
        assert child.io()["write_bytes"] >= 4 << 20, child.io()
    finally:
        child.stop()
    assert child.io() == {}
