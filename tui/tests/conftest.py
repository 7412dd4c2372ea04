"""Shared pytest fixtures: isolated state dirs, and a real libvirtd (started and stopped by the tests on hosts
without systemd) for the slow suites that boot real guests."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

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


@pytest.fixture(scope="session")
def guest_image():
    from cloudbox.core.errors import GuestError
    from cloudbox.core.guestimage import GuestImage

    try:
        return GuestImage.locate()
    except GuestError as e:
        pytest.skip(f"no benchmark guest image: {e}")


@pytest.fixture(scope="session")
def libvirt_conn(guest_image):
    """A connection to the real system libvirtd; started here (and stopped at the end) without systemd."""
    if not _is_root():
        pytest.skip("real-libvirtd tests need root (they start libvirtd and create loop devices and bridges)")
    from cloudbox.core import accel, daemons

    acc = accel.detect(guest_image.kernel)
    had_record = (Path(os.environ["CLOUDBOX_RUN_DIR"]) / "daemons.json").exists()
    conn = daemons.connect(hide_kvm=not acc.kvm_usable)
    yield conn
    conn.close()
    if not had_record and os.environ.get("CLOUDBOX_KEEP_DAEMONS") != "1":
        daemons.stop_started_daemons()
