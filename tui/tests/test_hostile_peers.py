"""Hostile peers at the network doors, against a real enrolment server on loopback addresses (127.0.0.0/8, several
source addresses): floods of wrong proofs, tricklers, connection hogs, malformed hellos, relays, re-enrolment
without the host key, rogue answers printed on a terminal, and the registry's files on disk."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import sqlite3
import stat
import threading
import time
from pathlib import Path

import pytest
import test_nodes
from test_nodes import Back, Front, _expect_refused, _keypair

from cloudbox.core.cluster import enrol, frontend, keys, protocol, registry
from cloudbox.core.errors import CloudboxError

front, back = test_nodes.front, test_nodes.back  # the same fixtures: a front-end's registry and a back-end
ATTACKERS = [f"127.0.0.{i}" for i in range(2, 7)]  # five source addresses besides the real node's 127.0.0.1


def _connect(port: int, src: str, timeout: float = 5) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=timeout, source_address=(src, 0))


def _hello(name: str, host_key: str, client_key: str, src: str) -> dict:
    return {"type": "hello", "v": protocol.VERSION, "name": name, "role": "back-end", "ssh_port": 22,
            "nonce": secrets.token_hex(32), "host_key": host_key, "client_key": client_key, "address": src,
            "front_end_address": "127.0.0.1"}


def _wrong_proof(port: int, src: str, hk: keys.PublicKey) -> str:
    """One complete exchange with a made-up proof; the reason of the refusal (or what ended it)."""
    try:
        with _connect(port, src) as s:
            f = s.makefile("rb")
            s.sendall(json.dumps(_hello("evil", hk.line, hk.line, src)).encode() + b"\n")
            msg = json.loads(f.readline() or b"{}")
            if msg.get("type") != "challenge":
                return str(msg.get("reason", "closed"))
            s.sendall(json.dumps({"type": "proof", "mac": secrets.token_hex(32)}).encode() + b"\n")
            return str(json.loads(f.readline() or b"{}").get("reason", "closed"))
    except OSError as e:
        return f"oserror {e}"


def test_the_real_node_joins_during_a_flood_of_wrong_proofs_from_several_addresses(front: Front, back: Back):
    code, rec = front.reg.make_code()
    port = front.serve()
    hk = _keypair(back.base / "evil_host")
    stop = threading.Event()
    reasons: list[str] = []
    hogs: list[socket.socket] = []

    def flood(src: str, n: int) -> None:
        for _ in range(n):
            if stop.is_set():
                return
            reasons.append(_wrong_proof(port, src, hk))

    # first wave: 5 addresses x 4 wrong proofs, the total that used to revoke every open code
    first = [threading.Thread(target=flood, args=(src, 4)) for src in ATTACKERS]
    for t in first:
        t.start()
    for t in first:
        t.join(60)
    assert reasons.count("wrong-code") >= registry.TOTAL_FAILURE_LIMIT, reasons
    for src in ATTACKERS:  # then each address also holds a connection open, sending nothing
        hogs.append(_connect(port, src))
    # second wave, going on while the real node joins
    threads = [threading.Thread(target=flood, args=(src, 20)) for src in ATTACKERS]
    for t in threads:
        t.start()
    time.sleep(0.2)
    res = back.join(f"127.0.0.1:{port}", code)
    stop.set()
    for t in threads:
        t.join(30)
    for h in hogs:
        h.close()
    assert res.frontend_name == "front" and front.reg.node("node2").address == "127.0.0.1"
    assert front.reg.code(rec.id).status() == "used"
    assert "rate-limited" in reasons
    assert set(reasons) <= {"wrong-code", "rate-limited", "busy"}, reasons


def test_a_trickling_peer_is_cut_at_the_connection_deadline(front: Front):
    front.reg.make_code()
    server = enrol.EnrolServer(front.reg, front.ident, host="127.0.0.1", port=0, log=front.log.append,
                               io_timeout=1.5, deadline=2.5)
    _, port = server.open()
    stop = threading.Event()
    t = threading.Thread(target=server.serve, kwargs={"poll": 0.1, "stop": stop}, daemon=True)
    t.start()
    s = _connect(port, "127.0.0.2", timeout=10)

    def trickle() -> None:  # one byte every 0.5 s: each read is well within io_timeout
        for ch in b'{"type":"hello","v":2,"name":"' + b"a" * 40:
            if stop.is_set():
                return
            try:
                s.sendall(bytes([ch]))
            except OSError:
                return
            time.sleep(0.5)

    sender = threading.Thread(target=trickle, daemon=True)
    t0 = time.monotonic()
    sender.start()
    got = b""
    try:
        s.settimeout(10)
        while b"\n" not in got:
            data = s.recv(4096)
            if not data:
                break
            got += data
        cut_after = time.monotonic() - t0
    finally:
        stop.set()
        s.close()
        t.join(10)
    assert cut_after < 5, f"a trickling peer kept its connection {cut_after:.1f} s"
    assert b"did not finish in time" in got


def test_connections_are_capped_per_address_and_in_all(front: Front):
    front.reg.make_code()
    server = enrol.EnrolServer(front.reg, front.ident, host="127.0.0.1", port=0, log=front.log.append,
                               max_connections=3, max_per_peer=2)
    _, port = server.open()
    stop = threading.Event()
    t = threading.Thread(target=server.serve, kwargs={"poll": 0.05, "stop": stop}, daemon=True)
    t.start()
    held = []
    try:
        held += [_connect(port, "127.0.0.2"), _connect(port, "127.0.0.2")]
        time.sleep(0.3)
        with _connect(port, "127.0.0.2") as third:
            reply = json.loads(third.makefile("rb").readline())
        assert reply["reason"] == "busy" and "127.0.0.2 already has 2" in reply["message"]
        held.append(_connect(port, "127.0.0.3"))
        time.sleep(0.3)
        with _connect(port, "127.0.0.4") as over:
            reply = json.loads(over.makefile("rb").readline())
        assert reply["reason"] == "busy" and "serving 3 connections" in reply["message"]
    finally:
        for h in held:
            h.close()
        stop.set()
        t.join(10)
    assert len([m for m in front.log if "turned away (busy)" in m]) == 2


def test_malformed_hellos_are_rate_limited_and_failure_rows_stay_few(front: Front):
    front.reg.make_code()
    port = front.serve()
    reasons = []
    assert front.server is not None
    for _ in range(40):
        with _connect(port, "127.0.0.2") as s:
            s.sendall(b'{"type":"hello","v":2,"name":"x"}\n')
            reasons.append(json.loads(s.makefile("rb").readline() or b"{}").get("reason"))
        # one attempt at a time: the handler ends a moment after its reply, and a peer with two still open would
        # be turned away as busy (its own test above), not for its failures
        deadline = time.monotonic() + 5
        while front.server.serving("127.0.0.2") and time.monotonic() < deadline:
            time.sleep(0.01)
    assert reasons[: registry.PEER_FAILURE_LIMIT] == ["bad-request"] * registry.PEER_FAILURE_LIMIT
    assert set(reasons[registry.PEER_FAILURE_LIMIT:]) == {"rate-limited"}
    with sqlite3.connect(front.base / "nodes.db") as db:
        rows = db.execute("SELECT count(*) FROM enrol_failures").fetchone()[0]
    assert rows == registry.PEER_FAILURE_LIMIT
    assert len([m for m in front.log if "127.0.0.2" in m]) <= registry.PEER_FAILURE_LIMIT + 1


def test_failure_rows_are_pruned_by_age_and_count(front: Front):
    with sqlite3.connect(front.base / "nodes.db") as db:
        db.executemany("INSERT INTO enrol_failures (t, peer, name, reason, counts) VALUES (?, ?, ?, ?, 1)",
                       [(time.time() - 2 * 86400, "10.0.0.1", "x", "wrong-code")] * 50
                       + [(time.time(), f"10.0.{i // 256}.{i % 256}", "x", "wrong-code") for i in range(1500)])
    front.reg.record_failure("10.9.9.9", "y", "wrong-code")
    with sqlite3.connect(front.base / "nodes.db") as db:
        rows = db.execute("SELECT count(*), min(t) FROM enrol_failures").fetchone()
    assert rows[0] == registry.MAX_FAILURE_ROWS and rows[1] > time.time() - 3600


@pytest.fixture
def fe_env(tmp_path: Path, monkeypatch):
    (tmp_path / "node.toml").write_text('role = "front-end"\nhostname = "fe"\n')
    _keypair(tmp_path / "ssh_host_ed25519_key")
    monkeypatch.setenv("CLOUDBOX_NODE_CONFIG", str(tmp_path / "node.toml"))
    monkeypatch.setenv("CLOUDBOX_SSH_HOST_KEY", str(tmp_path / "ssh_host_ed25519_key.pub"))
    monkeypatch.setenv("CLOUDBOX_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("CLOUDBOX_STATE_DIR", str(tmp_path / "state"))
    return tmp_path


def test_the_lock_goes_with_the_socket_not_with_the_last_connection(fe_env: Path):
    reg = registry.Registry(fe_env / "state" / "nodes.db")
    _, rec = reg.make_code()
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    t = threading.Thread(target=frontend.serve, args=(reg, "127.0.0.1", port, lambda m: None), daemon=True)
    t.start()
    for _ in range(100):
        if frontend.server_running():
            break
        time.sleep(0.05)
    slow = _connect(port, "127.0.0.2")  # a connection in progress, sending nothing
    time.sleep(0.2)
    reg.revoke(rec.id)
    t0 = time.monotonic()
    while frontend.server_running() and time.monotonic() - t0 < 10:
        time.sleep(0.05)
    released = time.monotonic() - t0
    slow.close()
    t.join(40)
    reg.close()
    assert released < 3, f"the lock was held {released:.1f} s after the socket closed"


def test_no_bind_to_every_address(fe_env: Path):
    reg = registry.Registry(fe_env / "state" / "nodes.db")
    reg.make_code()
    ident = enrol.Identity("fe", keys.host_key(), keys.client_key(reg.client_key))
    for host in ("0.0.0.0", "::"):
        with pytest.raises(CloudboxError, match="will not listen on every address"):
            enrol.EnrolServer(reg, ident, host=host, port=0).open()
    with pytest.raises(CloudboxError, match="none was found .* --bind ADDR"):
        frontend.enrol_bind()  # the node settings name no private NIC
    before = len(reg.codes())
    with pytest.raises(CloudboxError, match="--bind ADDR"):
        frontend.make_code(reg, 5)
    assert len(reg.codes()) == before  # refused before a code was made that nothing could serve
    reg.close()


def test_reenrolment_needs_proof_of_the_host_key_or_a_replace_code(front: Front, back: Back, tmp_path: Path):
    first, _ = front.reg.make_code()
    second, rec2 = front.reg.make_code()
    port = front.serve()
    back.join(f"127.0.0.1:{port}", first)
    third, rec3 = front.reg.make_code(replaces="node2")
    # someone with a valid code and the node's (public) host key, but not its private key
    thief = Back(tmp_path / "thief", "node2", host_key=back.ident.host_key)
    err = _expect_refused("key-unproven", thief.join, f"127.0.0.1:{port}", second)
    assert "--replace node2" in str(err)
    # a signature by another key does not pass for the node's
    forger = Back(tmp_path / "forger", "node2", host_key=back.ident.host_key,
                  host_private_key=tmp_path / "forger" / "id_ed25519")
    _expect_refused("bad-request", forger.join, f"127.0.0.1:{port}", second)
    assert front.reg.node("node2").client_key == back.ident.client_key.line
    assert front.reg.code(rec2.id).status() == "open"
    # the node itself (it signs with its host key) may join again, as before
    back.join(f"127.0.0.1:{port}", second)
    # a reinstalled node (a new key) joins with a code the admin made to replace it
    reinstalled = Back(tmp_path / "reinstalled", "node2")
    reinstalled.join(f"127.0.0.1:{port}", third)
    assert front.reg.node("node2").host_key == reinstalled.ident.host_key.line
    assert front.reg.code(rec3.id).replaces == "node2"


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl (the NBD client certificate)")
def test_a_node_enrolled_again_with_another_host_key_loses_the_old_machines_volume_credentials(
        front: Front, back: Back, tmp_path: Path, monkeypatch):
    from cloudbox.core.disks.volumes import nodecreds, pki

    monkeypatch.setenv("CLOUDBOX_STATE_DIR", str(tmp_path / "state"))
    first, _ = front.reg.make_code()
    again, _ = front.reg.make_code()
    port = front.serve()
    back.join(f"127.0.0.1:{port}", first)
    replace, _ = front.reg.make_code(replaces="node2")  # while a code is open: the server stays
    old = nodecreds.make("node2", pki.ensure())  # what the node was given, and keeps on its disk
    old_cert = pki.identity(old.nbd_dir / "client-cert.pem")
    back.join(f"127.0.0.1:{port}", again)  # the same machine (it signs with its key): its set stays
    assert nodecreds.make("node2", pki.ensure()).fingerprint == old.fingerprint
    Back(tmp_path / "reinstalled", "node2").join(f"127.0.0.1:{port}", replace)  # another machine under the name
    assert not nodecreds.front_end_dir("node2").exists()
    new = nodecreds.make("node2", pki.ensure())
    assert new.chap.secret != old.chap.secret and new.nvme.nqn != old.nvme.nqn and new.nvme.key != old.nvme.key
    assert pki.identity(new.nbd_dir / "client-cert.pem") != old_cert  # its servers refuse the old one
    assert any("its old volume credentials are forgotten" in line for line in front.log)


def test_a_relay_between_the_two_is_refused_by_the_address_views(front: Front, back: Back):
    code, rec = front.reg.make_code()
    port = front.serve()
    relay = socket.socket()
    relay.bind(("127.0.0.2", 0))
    relay.listen(1)

    def pump(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for x in (a, b):
                try:
                    x.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def run_relay() -> None:
        c, _ = relay.accept()
        s = _connect(port, "127.0.0.3")
        t = threading.Thread(target=pump, args=(s, c), daemon=True)
        t.start()
        pump(c, s)
        t.join(5)

    threading.Thread(target=run_relay, daemon=True).start()
    _expect_refused("address-mismatch", back.join, f"127.0.0.2:{relay.getsockname()[1]}", code)
    relay.close()
    assert front.reg.nodes() == [] and not back.authorized_keys.exists() and not back.pins.exists()
    assert front.reg.code(rec.id).status() == "open"


def test_a_name_with_a_trailing_newline_is_refused(front: Front):
    front.reg.make_code()
    port = front.serve()
    hk = _keypair(front.base / "x_host")
    with _connect(port, "127.0.0.2") as s:
        s.sendall(json.dumps(_hello("node2\n", hk.line, hk.line, "127.0.0.2")).encode() + b"\n")
        reply = json.loads(s.makefile("rb").readline())
    assert reply["reason"] == "bad-request" and "field name" in reply["message"]


def test_the_registry_files_are_private_from_their_first_byte(tmp_path: Path, monkeypatch):
    import sqlite3 as real_sqlite

    from cloudbox.core import db as core_db

    seen: list[int | None] = []
    connect = real_sqlite.connect

    def spy(path, *a, **k):
        p = Path(path)
        seen.append(stat.S_IMODE(p.stat().st_mode) if p.exists() else None)
        return connect(path, *a, **k)

    monkeypatch.setattr(core_db.sqlite3, "connect", spy)
    old = os.umask(0o022)
    try:
        state = tmp_path / "state"
        reg = registry.Registry(state / "nodes.db")
        reg.make_code()
        modes = {f.name: stat.S_IMODE(f.stat().st_mode) for f in state.glob("nodes.db*")}
        dir_mode = stat.S_IMODE(state.stat().st_mode)
        reg.close()
    finally:
        os.umask(old)
    assert seen and seen[0] == 0o600, "SQLite opened nodes.db before it was private (its -wal/-shm copy the mode)"
    assert modes == {"nodes.db": 0o600, "nodes.db-wal": 0o600, "nodes.db-shm": 0o600}, modes
    assert dir_mode == 0o700
    # an existing state dir that others could write to loses those bits, and older side files are made private
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)
    (shared / "nodes.db-wal").write_bytes(b"")
    os.chmod(shared / "nodes.db-wal", 0o644)
    registry.Registry(shared / "nodes.db").close()
    assert stat.S_IMODE(shared.stat().st_mode) == 0o755
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in shared.glob("nodes.db*"))


def test_a_rogue_answer_on_the_enrolment_port_reaches_the_terminal_escaped(back: Back):
    rogue = socket.socket()
    rogue.bind(("127.0.0.2", 0))
    rogue.listen(1)

    def answer() -> None:
        c, _ = rogue.accept()
        c.makefile("rb").readline()
        c.sendall(json.dumps({"type": "refused", "reason": "x\x1b[2J", "message": "ok\n\x1b]0;pwned\x07" + "y" * 5000})
                  .encode() + b"\n")
        c.close()

    threading.Thread(target=answer, daemon=True).start()
    with pytest.raises(enrol.EnrolRefused) as e:
        back.join(f"127.0.0.2:{rogue.getsockname()[1]}", registry.new_code())
    rogue.close()
    text = str(e.value)
    assert "\x1b" not in text and "\n" not in text and "\x07" not in text and len(text) < 700
    assert "\\x1b[2J" in text and "ok\\n\\x1b]0;pwned\\x07" in text


def test_node_list_prints_a_nodes_reason_escaped_so_it_cannot_forge_rows(front: Front, back: Back, capsys):
    from cloudbox import cli

    code, _ = front.reg.make_code()
    back.join(f"127.0.0.1:{front.serve()}", code)
    assert front.stopped(10)  # the back-end's confirmation, which sets the reason, arrived
    front.reg.set_health("node2", "down", "gone\nbe9   up   10.0.0.9:22   now   SHA256:forged… fine\x1b[31m")
    assert cli.main(["node", "--db", str(front.base / "nodes.db"), "list"]) == 0
    out = capsys.readouterr().out
    assert len(out.splitlines()) == 2 and "\x1b" not in out and "gone\\nbe9" in out


def test_the_join_code_can_come_from_a_file_or_standard_input(tmp_path: Path, monkeypatch):
    import io

    from cloudbox.cli import build_parser
    from cloudbox.cli import node as cli_node

    code = registry.new_code()
    f = tmp_path / "code"
    f.write_text(code + "\n")
    args = build_parser().parse_args(["node", "join", "--front-end", "10.0.0.1", "--code-file", str(f)])
    assert cli_node._join_code(args) == code
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(code.encode() + b"\n")))
    args = build_parser().parse_args(["node", "join", "--front-end", "10.0.0.1", "--code", "-"])
    assert cli_node._join_code(args) == code
    os.mkfifo(tmp_path / "fifo")
    args = build_parser().parse_args(["node", "join", "--code-file", str(tmp_path / "fifo")])
    with pytest.raises(CloudboxError, match="not a regular file"):
        cli_node._join_code(args)


def test_the_image_starts_no_unauthenticated_test_server_at_boot():
    """What tests/image/cluster.bats checks on both installed nodes, checked on the tree: Debian's iperf3.service is
    disabled by the preset, netperf's SysV netserver masked, and the allow-list names neither."""
    repo = Path(__file__).resolve().parents[2]
    preset = (repo / "mkosi.extra/usr/lib/systemd/system-preset/10-cloudbox.preset").read_text().splitlines()
    assert "disable iperf3.service" in preset
    mask = repo / "appliance/units/netperf.service"
    assert mask.is_symlink() and os.readlink(mask) == "/dev/null"
    doc = (repo / "docs/cluster.md").read_text()
    table = doc.split("<!-- listeners:begin -->", 1)[1].split("<!-- listeners:end -->", 1)[0]
    idle = [[c.strip() for c in row.split("|")[1:-1]] for row in table.splitlines()[3:] if row.startswith("|")]
    assert all(len(r) == 8 and r[4] in ("yes", "no") for r in idle), idle
    assert {r[2] for r in idle if r[4] == "yes"} == {"sshd", "systemd-resolve", "systemd-network"}
