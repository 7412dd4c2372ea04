"""The guest agent's protocol over a socket (Xen guests): framing, resynchronising after stale bytes, replies."""

from __future__ import annotations

import json

import pytest

from cloudbox.core.virt import qga
from cloudbox.core.virt.domain import read_domain


def test_frame_is_one_json_line():
    assert qga.frame("guest-ping") == b'{"execute":"guest-ping"}\n'
    line = qga.frame("guest-exec", {"path": "/bin/sh", "arg": ["-c", "echo é"]})
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert json.loads(line) == {"execute": "guest-exec", "arguments": {"path": "/bin/sh", "arg": ["-c", "echo é"]}}


@pytest.mark.parametrize(
    ("buf", "synced", "rest"),
    [
        (b'\xff{"return": 7}\n', True, b""),
        (b'\xff{"return": 7}\n{"return": {}}\n', True, b'{"return": {}}\n'),
        # an earlier client's half-read answer and an older sync before ours
        (b'{"return": {"pid": 3}}\n\xff{"return": 6}\n\xff{"return": 7}\nX', True, b"X"),
        (b'\xff{"return": 6}\n', False, b""),  # not our id
        (b'\xff{"return": 7}', False, b""),  # our answer, not complete yet
        (b"garbage without a sync byte\n", False, b""),
        (b'\xffnot json\n\xff{"return": 7}\n', True, b""),
    ],
)
def test_split_sync(buf, synced, rest):
    assert qga.split_sync(buf, 7) == (synced, rest)


def test_parse_reply():
    assert qga.parse_reply(b'{"return": {}}\n') == ({}, b"")
    assert qga.parse_reply(b'\r\n\xff{"return": {"pid": 12}}\n{"return": 1}\n') == ({"pid": 12}, b'{"return": 1}\n')
    assert qga.parse_reply(b'{"return": {"pid"') is None  # incomplete: read more
    assert qga.parse_reply(b'noise\n{"event": "x"}\n{"return": 5}\n') == (5, b"")
    with pytest.raises(qga.AgentError, match="GenericError: Guest agent command failed"):
        qga.parse_reply(b'{"error": {"class": "GenericError", "desc": "Guest agent command failed"}}\n')


def test_a_missing_socket_is_silence_not_a_crash(tmp_path):
    sock = qga.AgentSocket(str(tmp_path / "absent.sock"))
    with pytest.raises(qga.AgentSilent, match="cannot connect"):
        sock.command("guest-ping", timeout=0.5)


def test_agent_socket_from_the_domain_xml():
    xen = """<domain type='xen'><devices>
      <channel type='pty'><target type='xen' name='other'/></channel>
      <channel type='unix'><source mode='bind' path='/run/cloudbox/g.agent'/>
        <target type='xen' name='org.qemu.guest_agent.0'/></channel></devices></domain>"""
    assert read_domain(xen).agent_socket == "/run/cloudbox/g.agent"
    kvm = """<domain type='kvm'><devices><channel type='unix'><source mode='bind' path='/var/lib/libvirt/q.sock'/>
        <target type='virtio' name='org.qemu.guest_agent.0'/></channel></devices></domain>"""
    assert read_domain(kvm).agent_socket is None  # reached through libvirt's agent commands
    assert read_domain("<not xml").agent_socket is None


@pytest.fixture
def real_agent(guest_image, tmp_path):
    """The benchmark guest image's own qemu-ga, run from its unpacked root (chroot) on a unix socket: the agent
    Xen guests run on their channel, served here without a guest."""
    import os
    import shutil
    import subprocess
    import time

    cpio = guest_image.directory / "initrd.cpio"
    if os.geteuid() != 0 or shutil.which("cpio") is None or not cpio.exists():
        pytest.skip("needs root (chroot), cpio and the guest image's uncompressed initrd.cpio (make guest-image)")
    root = tmp_path / "root"
    root.mkdir()
    with cpio.open("rb") as f:
        subprocess.run(["cpio", "-id", "--quiet"], stdin=f, cwd=root, check=True)
    proc = subprocess.Popen(["chroot", str(root), "/usr/sbin/qemu-ga", "--method=unix-listen", "--path=/run/qga.sock",
                             "--statedir=/run"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sock = root / "run" / "qga.sock"
    try:
        deadline = time.monotonic() + 10
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        yield str(sock)
    finally:
        proc.kill()
        proc.wait()


def test_the_guest_images_agent_answers_over_the_socket(real_agent):
    import socket

    half = socket.socket(socket.AF_UNIX)
    half.connect(real_agent)
    half.sendall(b'{"execute":"guest-pi')  # a client that went away mid-command
    half.close()
    agent = qga.AgentSocket(real_agent)
    try:
        assert agent.command("guest-ping") == {}
        with pytest.raises(qga.AgentError, match="CommandNotFound"):
            agent.command("no-such-command")
        assert isinstance(agent.command("guest-get-time"), int)  # the connection still works after an error
    finally:
        agent.close()
    again = qga.AgentSocket(real_agent)
    try:
        info = again.command("guest-info")
        assert isinstance(info, dict) and info["version"]
    finally:
        again.close()
