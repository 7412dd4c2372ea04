"""Decides which accelerator guests get: KVM only if a real kernel makes progress under it, else TCG.

/dev/kvm existing (and even KVM_CREATE_VM succeeding) proves nothing: on some hosts a vCPU never
leaves the kernel. So the probe boots the benchmark guest's own kernel under QEMU with -accel kvm
and waits a few seconds for the kernel banner on the serial port. The answer is cached per boot.
Nested virtualization (this host itself a guest) is detected and recorded: numbers measured there
are labelled, as are TCG ones.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from . import paths
from .errors import CloudboxError

# Long enough for a guest under nested KVM on a busy (or emulated) host: inside the appliance booted under TCG on
# 2 loaded cores the banner took more than 8 s, and a run fell back to TCG inside TCG. CLOUDBOX_KVM_PROBE_TIMEOUT
# overrides it (seconds). Where KVM is broken (the vCPU never runs) the probe always takes this long, once per boot.
PROBE_TIMEOUT_S = 30.0
BANNER = b"Linux version"


@dataclass
class Accelerator:
    name: str  # "kvm" | "nested-kvm" | "tcg" | "xen"
    domain_type: str  # libvirt <domain type=...>: "kvm" | "qemu" | "xen"
    emulated: bool  # True for TCG: numbers are not overhead figures
    nested: bool  # this host is itself a VM
    reason: str  # one line: why this accelerator was chosen
    probe_seconds: float | None = None

    @property
    def label(self) -> str:
        if self.name == "tcg":
            return "TCG (emulated)"
        if self.name == "nested-kvm":
            return "KVM (nested)"
        return self.name.upper()

    @property
    def kvm_usable(self) -> bool:
        return self.domain_type == "kvm"


def host_is_virtualized() -> bool:
    """True when this host runs under a hypervisor (CPUID hypervisor bit, seen as a cpuinfo flag)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return " hypervisor" in line
    except OSError:
        pass
    return False


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def probe_kvm(kernel: Path, timeout: float = PROBE_TIMEOUT_S) -> tuple[bool, str, float]:
    """Boot `kernel` under QEMU with KVM; True if its banner reaches the serial port in time."""
    if not os.path.exists("/dev/kvm"):
        return False, "/dev/kvm does not exist (no KVM module loaded or no hardware virtualization)", 0.0
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return False, "/dev/kvm is not accessible to this user (needs root or the kvm group)", 0.0
    qemu = shutil.which("qemu-system-x86_64")
    if qemu is None:
        return False, "qemu-system-x86_64 not installed", 0.0
    with tempfile.TemporaryDirectory(prefix="cloudbox-kvmprobe-") as tmp:
        serial = Path(tmp) / "serial.log"
        cmd = [
            qemu, "-accel", "kvm", "-cpu", "host", "-m", "128", "-nodefaults", "-display", "none",
            "-no-reboot", "-serial", f"file:{serial}", "-kernel", str(kernel),
            "-append", "console=ttyS0 earlyprintk=ttyS0 panic=-1 loglevel=4",
        ]
        start = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        ok = False
        try:
            while time.monotonic() - start < timeout:
                if serial.exists() and BANNER in serial.read_bytes():
                    ok = True
                    break
                if proc.poll() is not None:
                    break
                time.sleep(0.05)
        finally:
            proc.kill()
            _, err = proc.communicate()
        took = time.monotonic() - start
        if ok:
            return True, f"a test kernel printed its banner under KVM in {took:.2f} s", took
        if proc.returncode not in (None, -9) and err:
            msg = err.decode(errors="replace").strip().splitlines()[-1]
            return False, f"QEMU with KVM failed: {msg}", took
        return False, f"a test kernel made no progress under KVM within {timeout:.0f} s (vCPU stuck)", took


def _probe_timeout() -> float:
    raw = os.environ.get("CLOUDBOX_KVM_PROBE_TIMEOUT")
    if not raw:
        return PROBE_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if value <= 0:
        raise CloudboxError(f"CLOUDBOX_KVM_PROBE_TIMEOUT={raw!r}: expected a number of seconds greater than 0")
    return value


def _cache_file() -> Path:
    return paths.run_dir() / "accel.json"


def detect(kernel: Path | None = None, *, use_cache: bool = True) -> Accelerator:
    """The accelerator for guests on this host. `CLOUDBOX_ACCEL=tcg|kvm` forces a choice."""
    forced = os.environ.get("CLOUDBOX_ACCEL")
    nested = host_is_virtualized()
    if forced == "tcg":
        return Accelerator("tcg", "qemu", True, nested, "forced by CLOUDBOX_ACCEL=tcg")
    if forced == "kvm":
        return Accelerator("nested-kvm" if nested else "kvm", "kvm", False, nested,
                           "forced by CLOUDBOX_ACCEL=kvm")
    cache = _cache_file()
    if use_cache and cache.exists():
        try:
            data = json.loads(cache.read_text())
            if data.get("boot_id") == _boot_id():
                data.pop("boot_id")
                return Accelerator(**data)
        except (ValueError, TypeError):
            pass
    if kernel is None:
        from .guestimage import GuestImage

        kernel = GuestImage.locate().kernel
    ok, why, took = probe_kvm(kernel, _probe_timeout())
    if ok:
        acc = Accelerator("nested-kvm" if nested else "kvm", "kvm", False, nested, why, took)
    else:
        acc = Accelerator("tcg", "qemu", True, nested, f"{why}; using TCG emulation", took)
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps({**asdict(acc), "boot_id": _boot_id()}))
    except OSError:
        pass
    return acc
