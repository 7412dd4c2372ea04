"""The guest serial console's tail (cloudbox.core.virt.guest.read_console_tail): what a run's abort reason quotes when
its guest died (captured-style input: kernel messages with CRLF, ANSI colours, a carriage-return progress line);
which agent failures count as the guest being unreachable; the KVM probe's time budget."""

from __future__ import annotations

import pytest

from cloudbox.core.virt.guest import read_console_tail


def test_tail_keeps_the_last_lines_as_text(tmp_path):
    log = tmp_path / "console.log"
    body = "".join(f"[    {i}.000000] line {i}\r\n" for i in range(40))
    log.write_bytes(
        body.encode()
        + b"\x1b[1;31mKernel panic - not syncing: Attempted to kill init! exitcode=0x00000100\x1b[0m\r\n"
        + b"progress 10%\rprogress 100%\r\n"
        + b"\r\n\r\n"
        + b"bad byte \xff here\x07\r\n"
    )
    tail = read_console_tail(log, 5)
    assert tail == [
        "[    38.000000] line 38",
        "[    39.000000] line 39",
        "Kernel panic - not syncing: Attempted to kill init! exitcode=0x00000100",
        "progress 100%",
        "bad byte \ufffd here",
    ]
    assert len(read_console_tail(log, 20)) == 20


def test_tail_of_missing_or_empty_log(tmp_path):
    assert read_console_tail(tmp_path / "nope.log") == []
    (tmp_path / "empty.log").write_bytes(b"")
    assert read_console_tail(tmp_path / "empty.log") == []
    (tmp_path / "blank.log").write_bytes(b"\r\n\n  \n")
    assert read_console_tail(tmp_path / "blank.log") == []


def test_tail_reads_only_the_end_of_a_big_log(tmp_path):
    log = tmp_path / "console.log"
    log.write_bytes(b"x" * 1_000_000 + b"\nlast line\n")
    assert read_console_tail(log, 1, max_bytes=4096) == ["last line"]


# ---- when the guest counts as unreachable (its console then goes into the abort reason) ------------------------
class _Domain:
    """Stands in for a libvirt domain handle: only what Guest.agent consults when the agent call fails."""

    def __init__(self, active: bool):
        self.active = active

    def name(self) -> str:
        return "cloudbox-t"

    def isActive(self) -> int:  # noqa: N802 (libvirt's name)
        return int(self.active)


def _agent_error(code: int, message: str):
    libvirt = pytest.importorskip("libvirt")
    err = libvirt.libvirtError(message)
    err.err = (code, 10, message, 2, None, None, None, 0, 0)  # the tuple virGetLastError() would give
    return err


@pytest.mark.parametrize(
    ("code", "active", "unreachable"),
    [
        (112, True, True),  # VIR_ERR_AGENT_COMMAND_TIMEOUT: "guest agent didn't respond to command within '10' s"
        (86, True, True),  # VIR_ERR_AGENT_UNRESPONSIVE
        (1, False, True),  # any error once the domain is gone ("domain is not running")
        (1, True, False),  # VIR_ERR_INTERNAL_ERROR from a live agent, e.g. guest-exec of a missing program
    ],
)
def test_agent_failures_classified(monkeypatch, code, active, unreachable):
    pytest.importorskip("libvirt_qemu")
    import libvirt_qemu

    from cloudbox.core.errors import GuestError, GuestUnreachable
    from cloudbox.core.virt.guest import Guest

    def fail(*_args):
        raise _agent_error(code, "agent trouble")

    monkeypatch.setattr(libvirt_qemu, "qemuAgentCommand", fail)
    guest = Guest(None, _Domain(active))
    with pytest.raises(GuestError) as info:
        guest.agent("guest-exec-status", {"pid": 1})
    assert isinstance(info.value, GuestUnreachable) == unreachable, info.value


@pytest.mark.parametrize(("value", "want"), [(None, 30.0), ("45", 45.0), ("2.5", 2.5)])
def test_kvm_probe_timeout(monkeypatch, value, want):
    from cloudbox.core.virt import accel

    if value is None:
        monkeypatch.delenv("CLOUDBOX_KVM_PROBE_TIMEOUT", raising=False)
    else:
        monkeypatch.setenv("CLOUDBOX_KVM_PROBE_TIMEOUT", value)
    assert accel._probe_timeout() == want


@pytest.mark.parametrize("value", ["soon", "0", "-3"])
def test_kvm_probe_timeout_bad_value(monkeypatch, value):
    from cloudbox.core.errors import CloudboxError
    from cloudbox.core.virt import accel

    monkeypatch.setenv("CLOUDBOX_KVM_PROBE_TIMEOUT", value)
    with pytest.raises(CloudboxError, match="CLOUDBOX_KVM_PROBE_TIMEOUT"):
        accel._probe_timeout()


def test_the_probe_tells_a_stuck_vcpu_from_a_slow_one(guest_image):
    """Real QEMU boots of the guest kernel, under TCG (the KVM here cannot run a guest): a running guest is seen by
    its firmware's first lines long before its banner (a silent decompression took over 20 s on a loaded host); a
    vCPU that never runs (-S: stopped at start) shows nothing and fails at the short limit, whatever the banner
    limit."""
    import shutil

    from cloudbox.core.virt import accel

    if shutil.which("qemu-system-x86_64") is None:
        pytest.skip("qemu-system-x86_64 is not installed (make test installs it)")
    ok, why, took = accel.boot_probe(guest_image.kernel, ["-accel", "tcg"], "TCG", 30, 120)
    assert ok and why.startswith("a test kernel printed its banner under TCG in "), why
    ok, why, took = accel.boot_probe(guest_image.kernel, ["-accel", "tcg", "-S"], "TCG", 2, 120)
    assert not ok and why == "a test kernel made no progress under TCG within 2 s (vCPU stuck)" and took < 10, why
    # runs (the firmware speaks at once) but cannot reach its banner in 0.01 s: too slow, not stuck
    ok, why, _ = accel.boot_probe(guest_image.kernel, ["-accel", "tcg"], "TCG", 20, 0.01)
    assert not ok and why == "a test kernel ran under TCG but printed no banner within 0 s (too slow to use)", why


def test_the_probe_gives_up_on_a_guest_that_starts_then_hangs(tmp_path):
    """Real QEMU under TCG: the firmware speaks, then a multiboot kernel that only spins (`jmp $`) adds nothing, as
    an ordinary kernel does under PVM's KVM on Intel hosts; the probe fails after the no-progress limit, not the
    banner limit, and its QEMU is gone."""
    import shutil
    import struct

    from cloudbox.core.virt import accel

    if shutil.which("qemu-system-x86_64") is None:
        pytest.skip("qemu-system-x86_64 is not installed (make test installs it)")
    magic, flags, base = 0x1BADB002, 0x00010000, 0x100000
    header = struct.pack("<8I", magic, flags, -(magic + flags) & 0xFFFFFFFF, base, base, 0, 0, base + 32)
    spin = tmp_path / "spin.bin"
    spin.write_bytes(header + b"\xeb\xfe")
    ok, why, took = accel.boot_probe(spin, ["-accel", "tcg"], "TCG", 3, 120)
    assert not ok and why.startswith("a test kernel started under TCG (firmware "), why
    assert why.endswith("but printed nothing more for 6 s and no banner (vCPU stuck)") and 6 <= took < 30, (why, took)


def test_the_verdict_line_says_usable_or_why_not_and_the_fallback():
    from cloudbox.core.virt.accel import Accelerator

    ok = Accelerator("nested-kvm", "kvm", False, True, "a test kernel printed its banner under KVM in 27.19 s", 27.19)
    assert ok.verdict == "kvm: usable (KVM (nested): a test kernel printed its banner under KVM in 27.19 s)"
    bad = Accelerator("tcg", "qemu", True, False, "/dev/kvm does not exist (no KVM module loaded); using TCG emulation")
    assert bad.verdict == ("kvm: unusable (/dev/kvm does not exist (no KVM module loaded)), "
                           "guests fall back to TCG (emulated)")


def test_a_pvm_only_kvm_is_told_apart_from_vmx_or_svm(tmp_path):
    from cloudbox.core.virt import accel

    for loaded, pvm_only in (((), False), (("kvm", "kvm_pvm"), True), (("kvm", "kvm_pvm", "kvm_amd"), False),
                             (("kvm", "kvm_intel"), False)):
        d = tmp_path / "-".join(loaded or ("none",))
        for m in loaded:
            (d / m).mkdir(parents=True)
        assert accel.pvm_only(d) is pvm_only, loaded


def test_host_verdict_probes_once_and_runs_reuse_the_answer(tmp_path, guest_image):
    """`cloudbox host --verdict` (what cloudbox-kvm-probe.service runs at boot): the real probe of this host, its
    exit status matching its line, and the answer cached for this boot where runs read it (accel.json)."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "CLOUDBOX_RUN_DIR": str(tmp_path), "CLOUDBOX_KVM_PROBE_TIMEOUT": "5"}
    env.pop("CLOUDBOX_ACCEL", None)
    cmd = [sys.executable, "-m", "cloudbox.cli", "host", "--verdict"]
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    line = first.stdout.strip()
    assert first.returncode == (0 if line.startswith("kvm: usable (") else 1), (first.returncode, line, first.stderr)
    assert line.startswith(("kvm: usable (", "kvm: unusable (")), line
    cached = json.loads((tmp_path / "accel.json").read_text())
    assert (cached["domain_type"] == "kvm") == line.startswith("kvm: usable ("), cached
    assert cached["boot_id"] == open("/proc/sys/kernel/random/boot_id").read().strip()
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert (again.returncode, again.stdout.strip()) == (first.returncode, line)
