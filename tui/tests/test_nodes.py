"""The node registry, join codes and enrolment, with real parts: the enrolment server and client talk TCP on
127.0.0.1 (threads, and separate `cloudbox` processes), keys are real ed25519 keys made by ssh-keygen, the
registry is real SQLite, and (when sshd is installed) a private sshd proves the pinned keys work and that a
changed host key is refused."""

from __future__ import annotations

import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cloudbox.core.cluster import enrol, frontend, health, keys, protocol, registry
from cloudbox.core.errors import CloudboxError
from cloudbox.core.record.results import ResultStore
from cloudbox.core.spec import nodeconf

pytestmark = pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs ssh-keygen (openssh-client)")
SRC = Path(enrol.__file__).resolve().parents[3]


def _keypair(path: Path, comment: str = "test") -> keys.PublicKey:
    keys.generate_key(path, comment)
    return keys.read_public_key(path.with_name(path.name + ".pub"), what="test key")


class Front:
    def __init__(self, base: Path):
        self.base = base
        self.reg = registry.Registry(base / "nodes.db")
        self.host_key_path = base / "ssh_host_ed25519_key"
        self.ident = enrol.Identity("front", _keypair(self.host_key_path), keys.client_key(self.reg.client_key))
        self.log: list[str] = []
        self.server: enrol.EnrolServer | None = None
        self.thread: threading.Thread | None = None

    def serve(self, on_enrolled=None) -> int:
        """Start the enrolment server on 127.0.0.1 (an ephemeral port) in a thread; returns the port."""
        self.server = enrol.EnrolServer(self.reg, self.ident, host="127.0.0.1", port=0, log=self.log.append,
                                        io_timeout=5, on_enrolled=on_enrolled)
        _, port = self.server.open()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.server.serve, kwargs={"poll": 0.1, "stop": self.stop},
                                       daemon=True)
        self.thread.start()
        return int(port)

    def stopped(self, timeout: float = 5) -> bool:
        assert self.thread is not None
        self.thread.join(timeout)
        return not self.thread.is_alive()


class Back:
    def __init__(self, base: Path, name: str = "node2", ssh_port: int = 22, host_key: keys.PublicKey | None = None,
                 host_private_key: Path | None = None):
        base.mkdir(parents=True, exist_ok=True)
        self.base = base
        if host_key is None:
            host_key, host_private_key = _keypair(base / "ssh_host_ed25519_key"), base / "ssh_host_ed25519_key"
        self.ident = enrol.Identity(name, host_key, _keypair(base / "id_ed25519"), ssh_port, host_private_key)
        self.authorized_keys = base / "authorized_keys"
        self.pins = base / "pins"

    def join(self, address: str, code: str) -> enrol.JoinResult:
        return enrol.join(address, code, identity=self.ident, authorized_keys=self.authorized_keys,
                          pin_dir=self.pins, timeout=5)


@pytest.fixture
def front(tmp_path: Path):
    f = Front(tmp_path / "fe")
    yield f
    if f.thread is not None:
        f.stop.set()
        f.thread.join(10)
    f.reg.close()


@pytest.fixture
def back(tmp_path: Path) -> Back:
    return Back(tmp_path / "be")


def _expect_refused(reason: str, fn, *args):
    with pytest.raises(enrol.EnrolRefused) as e:
        fn(*args)
    assert e.value.reason == reason, str(e.value)
    return e.value


# -- codes --------------------------------------------------------------------------------------------


def test_code_format_entropy_and_normalisation(front: Front):
    code, rec = front.reg.make_code()
    assert len(code) == 19 and code.count("-") == 3
    assert registry.normalize_code(code.lower().replace("-", " ")) == code.replace("-", "")
    assert registry.normalize_code("oooo-iiii-llll-0000") == "0000111111110000"
    with pytest.raises(registry.CodeFormatError, match=r"--code: .*allowed: 16 characters"):
        registry.normalize_code("ABCD-EFGH-JKMN")
    with pytest.raises(registry.CodeFormatError, match="'U' are not allowed"):
        registry.normalize_code("ABCD-EFGH-JKMN-PQRU")
    assert rec.status() == "open" and 14 * 60 < rec.expires_at - rec.created_at <= 15 * 60
    # stored hashed: the code (in any spelling) is nowhere in the database file
    raw = (front.base / "nodes.db").read_bytes() + (front.base / "nodes.db-wal").read_bytes()
    assert code.encode() not in raw and code.replace("-", "").encode() not in raw
    assert len({registry.new_code() for _ in range(200)}) == 200
    with pytest.raises(Exception, match="--minutes: .*allowed"):
        front.reg.make_code(0)


def test_revoke(front: Front):
    _, a = front.reg.make_code()
    _, b = front.reg.make_code()
    assert front.reg.revoke(a.id) == [a.id]
    assert front.reg.code(a.id).status() == "revoked" and [c.id for c in front.reg.open_codes()] == [b.id]
    assert front.reg.revoke(None) == [b.id] and front.reg.open_codes() == []


# -- enrolment ----------------------------------------------------------------------------------------


def test_correct_code_enrols_and_pins_both_keys(front: Front, back: Back):
    code, rec = front.reg.make_code()
    port = front.serve()
    res = back.join(f"127.0.0.1:{port}", code)

    node = front.reg.node("node2")
    assert node.host_key == back.ident.host_key.line and node.client_key == back.ident.client_key.line
    assert node.address == "127.0.0.1" and node.role == "back-end" and node.state == "unknown"
    assert node.libvirt_uri.startswith("qemu+ssh://root@127.0.0.1/system?")
    assert f"command={front.reg.ssh_wrapper}" in node.libvirt_uri and "no_verify=0" in node.libvirt_uri
    assert f"keyfile={front.reg.client_key}" in node.libvirt_uri
    # the front-end pins the node's host key, and only that, in the known_hosts its ssh config names
    pinned = [ln for ln in front.reg.known_hosts.read_text().splitlines() if not ln.startswith("#")]
    assert pinned == [f"127.0.0.1 {back.ident.host_key.line}"]
    assert f"UserKnownHostsFile {front.reg.known_hosts}" in front.reg.ssh_config.read_text()
    assert "StrictHostKeyChecking yes" in front.reg.ssh_config.read_text()
    # the back-end authorises the front-end's management key (restricted, from its address) and pins its host key
    (line,) = back.authorized_keys.read_text().splitlines()
    assert line == f'restrict,from="127.0.0.1" {front.ident.client_key.line} cloudbox-front-end front'
    assert (back.pins / "frontend_known_hosts").read_text() == f"127.0.0.1 {front.ident.host_key.line}\n"
    pin = json.loads((back.pins / "frontend.json").read_text())
    assert pin["host_key"] == front.ident.host_key.line and pin["name"] == "front"
    assert res.frontend_host_key == front.ident.host_key
    # the code is spent, and with no code open the server stopped listening
    assert front.reg.code(rec.id).status() == "used"
    assert front.stopped()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    assert any("enrolled node node2" in m for m in front.log)
    # the back-end's confirmation arrives after its join returned
    for _ in range(50):
        if front.reg.node("node2").reason == "enrolled; not checked yet":
            break
        time.sleep(0.05)
    assert front.reg.node("node2").reason == "enrolled; not checked yet"


def test_authorized_keys_keeps_other_lines_and_replaces_an_old_front_end(front: Front, back: Back):
    back.authorized_keys.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIadmin admin@lab\n"
                                    "restrict ssh-ed25519 AAAAold cloudbox-front-end oldfront\n")
    code, _ = front.reg.make_code()
    back.join(f"127.0.0.1:{front.serve()}", code)
    lines = back.authorized_keys.read_text().splitlines()
    assert lines[0].endswith("admin@lab") and len(lines) == 2 and lines[1].endswith("cloudbox-front-end front")
    assert oct(back.authorized_keys.stat().st_mode & 0o777) == "0o600"


def test_wrong_code_is_refused_and_nothing_recorded(front: Front, back: Back):
    code, rec = front.reg.make_code()
    port = front.serve()
    wrong = registry.new_code()
    err = _expect_refused("wrong-code", back.join, f"127.0.0.1:{port}", wrong)
    assert "wrong join code" in str(err)
    assert front.reg.nodes() == [] and not back.authorized_keys.exists() and not back.pins.exists()
    assert front.reg.code(rec.id).status() == "open"
    assert [f["reason"] for f in front.reg.failures()] == ["wrong-code"]
    assert any("refused node2: refused (wrong-code)" in m or "wrong join code" in m for m in front.log)
    back.join(f"127.0.0.1:{port}", code)  # the right code still works afterwards
    assert [n.name for n in front.reg.nodes()] == ["node2"]


def test_reused_code_is_refused(front: Front, back: Back, tmp_path: Path):
    code, rec = front.reg.make_code()
    front.reg.make_code()  # a second open code keeps the server listening after the first is used
    port = front.serve()
    back.join(f"127.0.0.1:{port}", code)
    other = Back(tmp_path / "be3", "node3")
    err = _expect_refused("code-used", other.join, f"127.0.0.1:{port}", code)
    assert f"join code {rec.id} already used" in str(err) and "node2" in str(err)
    assert [n.name for n in front.reg.nodes()] == ["node2"] and not other.authorized_keys.exists()


def test_expired_code_is_refused(front: Front, back: Back):
    code, rec = front.reg.make_code()
    front.reg.make_code()
    with sqlite3.connect(front.base / "nodes.db") as db:
        db.execute("UPDATE join_codes SET expires_at = ? WHERE id = ?", (time.time() - 1, rec.id))
    err = _expect_refused("code-expired", back.join, f"127.0.0.1:{front.serve()}", code)
    assert "expired at" in str(err) and front.reg.nodes() == []


def test_revoked_code_is_refused(front: Front, back: Back):
    code, rec = front.reg.make_code()
    front.reg.make_code()
    front.reg.revoke(rec.id)
    _expect_refused("code-revoked", back.join, f"127.0.0.1:{front.serve()}", code)


def test_reenrolment_with_another_host_key_is_refused(front: Front, back: Back, tmp_path: Path):
    first, _ = front.reg.make_code()
    second, rec2 = front.reg.make_code()
    port = front.serve()
    back.join(f"127.0.0.1:{port}", first)
    impostor = Back(tmp_path / "impostor", "node2")
    err = _expect_refused("name-taken", impostor.join, f"127.0.0.1:{port}", second)
    assert "cloudbox node remove node2" in str(err)
    assert front.reg.node("node2").host_key == back.ident.host_key.line
    assert front.reg.code(rec2.id).status() == "open" and not impostor.authorized_keys.exists()
    # the same machine under a new name is refused too
    renamed = Back(tmp_path / "renamed", "node9", host_key=back.ident.host_key)
    _expect_refused("key-taken", renamed.join, f"127.0.0.1:{port}", second)
    # the same node with the same key may join again (a re-run join), which spends the code
    back.join(f"127.0.0.1:{port}", second)
    assert front.reg.code(rec2.id).status() == "used"


def test_not_listening_without_an_open_code(front: Front):
    server = enrol.EnrolServer(front.reg, front.ident, host="127.0.0.1", port=0)
    with pytest.raises(enrol.NoOpenCode, match="does not listen"):
        server.open()
    assert server.sock is None
    # a code that expires closes the listener
    _, rec = front.reg.make_code()
    port = front.serve()
    socket.create_connection(("127.0.0.1", port), timeout=2).close()
    front.reg.revoke(rec.id)
    assert front.stopped()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_the_code_never_crosses_the_wire(front: Front, back: Back):
    code, rec = front.reg.make_code()
    port = front.serve()
    proxy = socket.socket()
    proxy.bind(("127.0.0.1", 0))
    proxy.listen(1)
    sent: list[bytes] = []
    received: list[bytes] = []

    def relay():
        c, _ = proxy.accept()
        s = socket.create_connection(("127.0.0.1", port))

        def pump(a, b, into):
            while data := a.recv(65536):
                into.append(data)
                b.sendall(data)
            b.shutdown(socket.SHUT_WR)

        t = threading.Thread(target=pump, args=(s, c, received))
        t.start()
        pump(c, s, sent)
        t.join()
        c.close()
        s.close()

    t = threading.Thread(target=relay, daemon=True)
    t.start()
    back.join(f"127.0.0.1:{proxy.getsockname()[1]}", code)
    t.join(5)
    proxy.close()
    wire = b"".join(sent) + b"".join(received)
    assert b'"type":"hello"' in wire and b'"type":"proof"' in wire and b'"type":"welcome"' in wire
    key = front.reg.code(rec.id).key
    for secret in (code, code.replace("-", ""), code.lower(), code.replace("-", "").lower()):
        assert secret.encode() not in wire
    assert key not in wire and key.hex().encode() not in wire


def test_a_tampered_challenge_fails_both_proofs(front: Front, back: Back):
    """A man in the middle who swaps the front-end's keys in the challenge cannot make either MAC verify."""
    code, _ = front.reg.make_code()
    port = front.serve()
    evil = _keypair(back.base / "evil")
    proxy = socket.socket()
    proxy.bind(("127.0.0.1", 0))
    proxy.listen(1)

    def relay():
        c, _ = proxy.accept()
        s = socket.create_connection(("127.0.0.1", port))
        cf, sf = c.makefile("rb"), s.makefile("rb")
        s.sendall(cf.readline())  # hello
        challenge = json.loads(sf.readline())
        challenge["mgmt_key"] = evil.line  # try to get the back-end to authorise the attacker's key
        c.sendall(json.dumps(challenge).encode() + b"\n")
        s.sendall(cf.readline())  # proof
        c.sendall(sf.readline())  # refusal
        c.close()
        s.close()

    threading.Thread(target=relay, daemon=True).start()
    _expect_refused("wrong-code", back.join, f"127.0.0.1:{proxy.getsockname()[1]}", code)
    assert not back.authorized_keys.exists() and front.reg.nodes() == []


def test_rate_limit(front: Front, back: Back):
    code, _ = front.reg.make_code()
    port = front.serve()
    for _ in range(registry.PEER_FAILURE_LIMIT):
        _expect_refused("wrong-code", back.join, f"127.0.0.1:{port}", registry.new_code())
    err = _expect_refused("rate-limited", back.join, f"127.0.0.1:{port}", code)  # even the right code
    assert "too many failed attempts from 127.0.0.1" in str(err)
    assert front.reg.nodes() == []


def test_many_failures_in_all_warn_but_never_revoke_the_open_codes(front: Front):
    _, rec = front.reg.make_code()
    for i in range(registry.TOTAL_FAILURE_LIMIT):
        front.reg.record_failure(f"10.0.0.{i}", "x", "wrong-code")
    server = enrol.EnrolServer(front.reg, front.ident, host="127.0.0.1", port=0, log=front.log.append)
    server._total_alarm()
    assert front.reg.code(rec.id).status() == "open"
    assert any("refused enrolment attempts since the oldest open code" in m for m in front.log)


def test_join_errors_name_the_field(back: Back):
    with pytest.raises(Exception, match="--front-end discover: resolve it"):
        enrol.join("discover", registry.new_code(), identity=back.ident)
    with pytest.raises(Exception, match="--code: not a join code"):
        enrol.join("127.0.0.1", "1234", identity=back.ident)
    with pytest.raises(Exception, match="--front-end: port '99999' is out of range"):
        enrol.join("127.0.0.1:99999", registry.new_code(), identity=back.ident)
    with pytest.raises(Exception, match="listens only while a join code is open"):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
        s.close()
        enrol.join(f"127.0.0.1:{free}", registry.new_code(), identity=back.ident, timeout=2)


def test_server_refuses_malformed_hello(front: Front):
    front.reg.make_code()
    port = front.serve()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b'{"type":"hello","v":%d,"name":"Bad_Name"}\n' % protocol.VERSION)
        reply = json.loads(s.makefile("rb").readline())
    assert reply["type"] == "refused" and reply["reason"] == "bad-request" and "field name" in reply["message"]


# -- as separate processes, through the CLI ----------------------------------------------------------------


def _cli(env: dict[str, str], *args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-m", "cloudbox.cli", *args], env=env, capture_output=True, text=True,
                         timeout=60, **kw)
    if check:
        assert out.returncode == 0, out.stdout + out.stderr
    return out


def _env(base: Path, role: str, **extra: str) -> dict[str, str]:
    base.mkdir(parents=True, exist_ok=True)
    (base / "node.toml").write_text(f'role = "{role}"\nhostname = "{base.name}"\n')
    _keypair(base / "ssh_host_ed25519_key")
    return {**os.environ, "PYTHONPATH": str(SRC), "CLOUDBOX_STATE_DIR": str(base / "state"),
            "CLOUDBOX_RUN_DIR": str(base / "run"), "CLOUDBOX_NODE_CONFIG": str(base / "node.toml"),
            "CLOUDBOX_SSH_HOST_KEY": str(base / "ssh_host_ed25519_key.pub"), **extra}


def test_cli_enrolment_between_processes(tmp_path: Path):
    fe = _env(tmp_path / "front", "front-end")
    be = _env(tmp_path / "node5", "back-end", CLOUDBOX_AUTHORIZED_KEYS=str(tmp_path / "node5" / "authorized_keys"))
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = str(s.getsockname()[1])
    s.close()
    made = _cli(fe, "node", "code", "--no-listen").stdout
    code = made.split("join code 1:", 1)[1].split()[0]
    server = subprocess.Popen([sys.executable, "-m", "cloudbox.cli", "node", "enrol-server", "--bind", "127.0.0.1",
                               "--port", port], env=fe, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", int(port)), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        wrong = _cli(be, "node", "join", "--front-end", f"127.0.0.1:{port}", "--code", registry.new_code(),
                     check=False)
        assert wrong.returncode == 1 and "refused (wrong-code)" in wrong.stderr
        joined = _cli(be, "node", "join", "--front-end", f"127.0.0.1:{port}", "--code", code.lower())
        assert "front-end front at 127.0.0.1" in joined.stdout
        # libvirt here may or may not run: either way the join says whether the front-end can manage the node
        assert ("libvirt on this node answers" in joined.stdout) != ("libvirt on this node does not answer"
                                                                    in joined.stderr), joined
        out, _ = server.communicate(timeout=10)  # exits by itself: its only code is spent
        assert server.returncode == 0 and "enrolled node node5" in out and "not listening" in out
    finally:
        if server.poll() is None:
            server.kill()
    listed = json.loads(_cli(fe, "node", "list", "--json").stdout)
    assert [(n["name"], n["address"], n["shown_state"]) for n in listed] == [("node5", "127.0.0.1", "unknown")]
    assert "node5" in _cli(fe, "node", "list").stdout
    codes = _cli(fe, "node", "code", "--list").stdout
    assert "used" in codes and code not in codes
    # a back-end does not make codes; the front-end does not join
    refused = _cli(be, "node", "code", check=False)
    assert refused.returncode == 1 and "role: this node is a back-end" in refused.stderr
    refused = _cli(fe, "node", "join", "--front-end", "127.0.0.1", "--code", code, check=False)
    assert refused.returncode == 1 and "role: this node is a front-end" in refused.stderr
    assert "removed node node5" in _cli(fe, "node", "remove", "node5").stdout
    assert _cli(fe, "node", "list", "--json").stdout.strip() == "[]"
    gone = _cli(fe, "node", "remove", "node5", check=False)
    assert gone.returncode == 2 and "node 'node5': not enrolled" in gone.stderr


def test_cli_code_starts_a_detached_server_that_stops_when_the_code_is_revoked(tmp_path: Path):
    fe = _env(tmp_path / "front", "front-end")
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    out = _cli(fe, "node", "code", "--bind", "127.0.0.1", "--port", str(port), "--minutes", "5").stdout
    pid = int(out.split("enrolment server started (pid ", 1)[1].split(")")[0])
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.05)
    else:
        pytest.fail("the detached enrolment server did not listen")
    assert "revoked: 1" in _cli(fe, "node", "code", "--revoke", "all").stdout
    for _ in range(100):
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        if not Path(f"/proc/{pid}").exists():
            break
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


# -- health --------------------------------------------------------------------------------------------


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return int(port)


def test_a_node_that_is_gone_is_down_and_its_runs_fail(front: Front, back: Back, tmp_path: Path):
    back.ident.ssh_port = _closed_port()  # nothing listens there: the node has disappeared
    code, _ = front.reg.make_code()
    back.join(f"127.0.0.1:{front.serve()}", code)
    dead = subprocess.Popen(["true"])
    dead.wait()
    with ResultStore(tmp_path / "results.db") as store:
        # A run on the node whose executor is gone, and one whose executor (this process) still follows it.
        run_id = store.create_run(profile_name="x", suite="storage", node="node2", pid=dead.pid)
        followed = store.create_run(profile_name="x", suite="storage", node="node2")
        other = store.create_run(profile_name="x", suite="storage")  # this host's run is not touched
        t0 = time.monotonic()
        (h,) = health.check_all(front.reg, store, timeout=10)  # the real libvirt client over the ssh wrapper
        took = time.monotonic() - t0
        assert h.state == "down" and took < 30, (h, took)
        assert "refused" in h.reason.lower() or "closed" in h.reason.lower(), h.reason
        node = front.reg.node("node2")
        assert node.state == "down" and node.reason == h.reason and node.last_seen is None
        run = store.get_run(run_id)
        assert run.state == "failed" and run.reason == f"node node2 down: {h.reason}"
        assert h.failed_runs == [run_id] and store.get_run(other).state == "running"
        assert store.get_run(followed).state == "running"  # its executor ends it when the stream drops
    assert health.shown_state(node)[0] == "down"
    node.checked_at = time.time() - 60
    assert health.shown_state(node)[0] == "unknown"


def test_health_timeout_marks_down(front: Front, back: Back):
    code, _ = front.reg.make_code()
    back.join(f"127.0.0.1:{front.serve()}", code)
    release = threading.Event()
    calls: list[str] = []

    def stuck(n):
        calls.append(n.name)
        release.wait(30)
        return {}

    def fine(n):
        calls.append(n.name)
        return {"hostname": "node2", "libvirt": "9.0.0"}

    (h,) = health.check_all(front.reg, None, probe=stuck, timeout=0.3)
    assert h.state == "down" and "within 0.3 s" in h.reason
    # While that probe still waits, the next check starts no second one (no pile of SSH logins on a busy node).
    (h,) = health.check_all(front.reg, None, probe=fine, timeout=0.3)
    assert h.state == "down" and "is still waiting" in h.reason and calls == ["node2"], (h, calls)
    release.set()  # the stuck probe ends: the next check probes again
    deadline = time.monotonic() + 10
    while (h := health.check_all(front.reg, None, probe=fine)[0]).state != "up" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert h.state == "up" and front.reg.node("node2").last_seen is not None and calls == ["node2", "node2"]


def test_gather_lists_registry_nodes_on_a_front_end(tmp_path: Path, monkeypatch, front: Front, back: Back):
    from cloudbox.core.views import host

    monkeypatch.setenv("CLOUDBOX_STATE_DIR", str(tmp_path / "fe"))  # front.reg lives at <state>/nodes.db
    monkeypatch.setenv("CLOUDBOX_ACCEL", "tcg")
    conf = tmp_path / "node.toml"
    conf.write_text('role = "front-end"\n')
    monkeypatch.setenv("CLOUDBOX_NODE_CONFIG", str(conf))
    assert [n.role for n in host.gather(probe=False).nodes] == ["front-end"]
    code, _ = front.reg.make_code()
    back.join(f"127.0.0.1:{front.serve()}", code)
    front.reg.set_health("node2", "up", "libvirt 9.0.0 on node2", {"hostname": "node2"})
    nodes = host.gather(probe=False).nodes
    assert [(n.name, n.role, n.state) for n in nodes][1:] == [("node2", "back-end", "up")]
    assert nodes[1].address == "127.0.0.1" and nodes[1].last_seen is not None
    conf.write_text('role = "all-in-one"\n')  # an all-in-one may enrol back-ends too (`node code` runs there)
    assert [n.name for n in host.gather(probe=False).nodes][1:] == ["node2"]
    conf.write_text('role = "back-end"\n')
    assert len(host.gather(probe=False).nodes) == 1


# -- end to end with a real sshd ---------------------------------------------------------------------------

SSHD = shutil.which("sshd") or ("/usr/sbin/sshd" if Path("/usr/sbin/sshd").exists() else None)


class Sshd:
    """A private sshd on 127.0.0.1:port with its own host key and authorized_keys file."""

    def __init__(self, base: Path, port: int, host_key: Path, authorized_keys: Path, extra: tuple[str, ...] = ()):
        self.port = port
        self.config = base / "sshd_config"
        self.config.write_text("\n".join([
            f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {host_key}",
            f"AuthorizedKeysFile {authorized_keys}", "StrictModes no", "PermitRootLogin prohibit-password",
            "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no",
            f"PidFile {base / 'sshd.pid'}", "LogLevel VERBOSE", *extra, "",
        ]))
        self.log = base / "sshd.log"
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(self.config)], stdout=subprocess.DEVNULL,
                                     stderr=open(self.log, "w"))  # noqa: SIM115
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"sshd did not start: {self.log.read_text()}")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def _enrolled_behind_sshd(front: Front, tmp_path: Path, name: str) -> tuple[Back, Sshd]:
    """A back-end `name` with its own host key behind a private sshd on 127.0.0.1, enrolled with the front-end."""
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
    base = tmp_path / "node"
    base.mkdir()
    host_key = base / "ssh_host_ed25519_key"
    port = _closed_port()
    back = Back(base, name, port, host_key=_keypair(host_key))
    sshd = Sshd(base, port, host_key, back.authorized_keys)
    try:
        code, _ = front.reg.make_code()
        back.join(f"127.0.0.1:{front.serve()}", code)
    except BaseException:
        sshd.stop()
        raise
    return back, sshd


@pytest.mark.skipif(SSHD is None or os.geteuid() != 0, reason="needs sshd (openssh-server, `scripts/install-deps "
                    "test`) and root")
def test_end_to_end_with_sshd(front: Front, tmp_path: Path):
    back, sshd = _enrolled_behind_sshd(front, tmp_path, "node7")
    base, port = back.base, sshd.port
    try:
        node = front.reg.node("node7")
        ok = subprocess.run([*front.reg.ssh_args(node), "echo", "reached-$(hostname)"], capture_output=True,
                            text=True, timeout=30)
        assert ok.returncode == 0 and ok.stdout.startswith("reached-"), ok.stderr
        # plain ssh with only the pinned known_hosts and strict checking (what the brief's operator would type)
        strict = subprocess.run(["ssh", "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile="
                                 f"{front.reg.known_hosts}", "-o", "GlobalKnownHostsFile=/dev/null", "-o",
                                 "BatchMode=yes", "-i", str(front.reg.client_key), "-p", str(port),
                                 "root@127.0.0.1", "true"], capture_output=True, text=True, timeout=30)
        assert strict.returncode == 0, strict.stderr
        # the node's host key changes (a reinstall, or an impostor on its address): refused, by ssh and by libvirt
        sshd.stop()
        _keypair(base / "other_host_key")
        sshd = Sshd(base, port, base / "other_host_key", back.authorized_keys)
        bad = subprocess.run([*front.reg.ssh_args(node), "true"], capture_output=True, text=True, timeout=30)
        assert bad.returncode == 255 and "Host key verification failed" in bad.stderr, bad.stderr
        (h,) = health.check_all(front.reg, None, timeout=20)
        assert h.state == "down" and "verification failed" in h.reason.lower(), h.reason
    finally:
        sshd.stop()


@pytest.mark.slow
@pytest.mark.skipif(SSHD is None or os.geteuid() != 0, reason="needs sshd (openssh-server, `scripts/install-deps "
                    "test`) and root")
@pytest.mark.skipif(shutil.which("virt-ssh-helper") is None, reason="needs virt-ssh-helper (libvirt-daemon)")
def test_libvirt_over_the_pinned_ssh(front: Front, tmp_path: Path, libvirt_conn):
    """The health check reaches this host's real libvirtd through the node's libvirt URI (qemu+ssh, the pinned
    ssh wrapper, virt-ssh-helper on the node's side) after enrolment: the node is up with libvirt's version."""
    _, sshd = _enrolled_behind_sshd(front, tmp_path, "node8")
    try:
        (h,) = health.check_all(front.reg, None, timeout=30)
        assert h.state == "up", h.reason
        assert front.reg.node("node8").detail["libvirt"].count(".") == 2
    finally:
        sshd.stop()


# -- removing a node takes the front-end's key off it -----------------------------------------------------------

ADMIN_LINE = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIadmin admin@lab"


def _front_end_env(tmp_path: Path, front: Front) -> dict[str, str]:
    conf = tmp_path / "fe-node.toml"
    conf.write_text('role = "front-end"\n')
    return {**os.environ, "PYTHONPATH": str(SRC), "CLOUDBOX_NODE_CONFIG": str(conf),
            "CLOUDBOX_STATE_DIR": str(front.base), "CLOUDBOX_RUN_DIR": str(tmp_path / "run")}


@pytest.mark.skipif(SSHD is None or os.geteuid() != 0, reason="needs sshd (openssh-server, `scripts/install-deps "
                    "test`) and root")
def test_remove_deletes_the_front_ends_line_on_the_node_and_keeps_the_others(front: Front, tmp_path: Path):
    back, sshd = _enrolled_behind_sshd(front, tmp_path, "node7")
    try:
        ak = back.authorized_keys
        (ours,) = ak.read_text().splitlines()
        other_front = "restrict ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIother cloudbox-front-end elsewhere"
        ak.write_text(f"{ADMIN_LINE}\n{ours}\n# a comment\n{other_front}\n")
        ak.chmod(0o600)
        node = front.reg.node("node7")
        assert frontend.remove_authorized_line(front.reg, node, str(back.base / "absent")) == 0
        # a path with a space and a quote reaches the node as one argument
        odd = back.base / "it's here"
        odd.write_text(f"{ours}\n")
        assert frontend.remove_authorized_line(front.reg, node, str(odd)) == 1 and odd.read_text() == ""
        out = _cli(_front_end_env(tmp_path, front), "node", "--db", str(front.base / "nodes.db"), "remove", "node7",
                   "--authorized-keys", str(ak))
        assert "removed node node7 (127.0.0.1" in out.stdout
        assert f"the front-end's key is no longer in node7's {ak}" in out.stdout and out.stderr == ""
        # only the line with this front-end's key went: the admin's, a comment and another front-end's stay
        assert ak.read_text().splitlines() == [ADMIN_LINE, "# a comment", other_front]
        assert oct(ak.stat().st_mode & 0o777) == "0o600"
        assert front.reg.nodes() == [] and "127.0.0.1" not in front.reg.known_hosts.read_text()
    finally:
        sshd.stop()


@pytest.mark.skipif(SSHD is None or os.geteuid() != 0, reason="needs sshd (openssh-server, `scripts/install-deps "
                    "test`) and root")
def test_remove_of_an_unreachable_node_forgets_it_and_says_the_line_remains(front: Front, tmp_path: Path, monkeypatch):
    back, sshd = _enrolled_behind_sshd(front, tmp_path, "node7")
    sshd.stop()  # the node is gone
    before = back.authorized_keys.read_text()
    conf = tmp_path / "fe.toml"
    conf.write_text('role = "front-end"\n')
    monkeypatch.setenv("CLOUDBOX_NODE_CONFIG", str(conf))
    removal = frontend.remove_node(front.reg, "node7", authorized_keys=str(back.authorized_keys))
    assert not removal.cleaned and removal.lines_removed is None
    assert "ssh could not reach it or was refused (exit 255)" in (removal.problem or "")
    assert "Connection refused" in (removal.problem or "")
    assert "could not be reached" in removal.on_node and "STILL in its" in removal.on_node
    assert "delete that line there as root with: sed" in removal.on_node
    assert f"sed -i '/ cloudbox-front-end /d' {back.authorized_keys}" in removal.on_node
    assert front.reg.nodes() == [] and back.authorized_keys.read_text() == before
    # the hand-made command does what it says
    subprocess.run(["sh", "-c", removal.manual], check=True)
    assert back.authorized_keys.read_text() == ""


def test_cli_remove_of_an_unreachable_node_warns_and_exits_0(front: Front, back: Back, tmp_path: Path):
    back.ident.ssh_port = _closed_port()
    code, _ = front.reg.make_code()
    back.join(f"127.0.0.1:{front.serve()}", code)
    out = _cli(_front_end_env(tmp_path, front), "node", "--db", str(front.base / "nodes.db"), "remove", "node2")
    assert "removed node node2" in out.stdout
    assert out.stderr.startswith("cloudbox: warning: node2 could not be reached (node node2 (127.0.0.1): editing "
                                 "/root/.ssh/authorized_keys failed: ssh could not reach it or was refused")
    assert "the front-end's key is STILL in its /root/.ssh/authorized_keys" in out.stderr
    assert "sed -i '/ cloudbox-front-end /d' /root/.ssh/authorized_keys" in out.stderr
    assert front.reg.nodes() == []
    # a back-end removes nothing
    be = _front_end_env(tmp_path, front)
    Path(be["CLOUDBOX_NODE_CONFIG"]).write_text('role = "back-end"\n')
    refused = _cli(be, "node", "--db", str(front.base / "nodes.db"), "remove", "node2", check=False)
    assert refused.returncode == 1 and "role: this node is a back-end" in refused.stderr


# -- the health monitor unit ---------------------------------------------------------------------------------

REPO = SRC.parents[1]


def test_watch_prints_a_node_only_when_its_state_changes():
    from cloudbox.cli.node import changed

    last: dict[str, tuple[str, str]] = {}
    up = health.Health("n1", "up", "libvirt 11.3.0 on n1")
    down = health.Health("n2", "down", "no answer")
    assert changed(last, [up, down]) == [up, down]  # the first round: every node
    assert changed(last, [up, down]) == []  # nothing new: no journal line every 10 s
    back = health.Health("n2", "up", "libvirt 11.3.0 on n2")
    failed = health.Health("n1", "up", "libvirt 11.3.0 on n1", failed_runs=[7])
    assert changed(last, [failed, back]) == [failed, back]


def test_node_check_unit_runs_on_an_installed_front_end_or_all_in_one_only(tmp_path: Path):
    import shlex

    unit = (REPO / "appliance" / "units" / "cloudbox-node-check.service").read_text()
    assert unit.startswith("# ") and "\n[Unit]\n" in unit  # the one-line header, like the other units
    lines = dict(ln.split("=", 1) for ln in unit.splitlines() if "=" in ln and not ln.startswith("#"))
    assert lines["ConditionPathExists"] == "/etc/cloudbox/node.toml"
    assert lines["ExecStart"] == "/usr/bin/cloudbox node check --watch" and lines["Restart"] == "on-failure"
    condition = shlex.split(lines["ExecCondition"])  # systemd's quoting of this line is the shell's
    conf = Path(condition[-1])
    assert conf == Path("/etc/cloudbox/node.toml")
    for role, runs in (("front-end", True), ("all-in-one", True), ("back-end", False)):
        f = tmp_path / f"{role}.toml"
        # as `cloudbox install` writes it (install/plan.py, node_settings_text)
        f.write_text(f"# This node's role and settings\nrole = {json.dumps(role)}\nhostname = \"n1\"\n")
        grep = subprocess.run(["grep", *condition[1:-1], str(f)])
        assert (grep.returncode == 0) == runs, role
        assert grep.returncode in (0, 1)  # 1..254 skips the unit; it does not fail it
    preset = (REPO / "mkosi.extra/usr/lib/systemd/system-preset/10-cloudbox.preset").read_text().splitlines()
    assert "enable cloudbox-node-check.service" in preset
    assert "ExtraTrees=appliance/units:/usr/lib/systemd/system" in (REPO / "mkosi.conf").read_text()


def _console_cluster_status(env: dict[str, str]) -> str:
    """The live console's cluster lines (cloudbox-console's cluster_status, run on its own)."""
    script = (REPO / "appliance/libexec/cloudbox-console").read_text()
    body = script[script.index("node_toml="):]  # its settings variables and the function
    body = body[:body.index("\n}\n") + 3]
    out = subprocess.run(["bash", "-c", f"set -u\n{body}cluster_status"], env=env, capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    return out.stdout


def test_console_shows_the_node_count_and_how_to_get_a_join_code(front: Front, back: Back, tmp_path: Path):
    conf = tmp_path / "node.toml"
    env = {"PATH": os.environ["PATH"], "CLOUDBOX_NODE_CONFIG": str(conf), "CLOUDBOX_STATE_DIR": str(front.base)}
    assert _console_cluster_status(env) == ""  # the live system: the install text instead
    conf.write_text('role = "front-end"\nhostname = "fe1"\n')
    assert "Nodes: 0 back-end(s) enrolled, 0 up" in _console_cluster_status(env)
    code, _ = front.reg.make_code()
    back.join(f"127.0.0.1:{front.serve()}", code)
    out = _console_cluster_status(env)
    assert "Nodes: 1 back-end(s) enrolled, 0 up at the last check" in out
    front.reg.set_health("node2", "up", "libvirt 9.0.0 on node2")
    out = _console_cluster_status(env)
    assert out.startswith(f"Installed node, role front-end ({conf}); the cloudbox TUI")
    assert "Nodes: 1 back-end(s) enrolled, 1 up at the last check" in out
    assert "run 'cloudbox node code' (or press j on the TUI's Overview)" in out and code not in out
    # a back-end names the front-end it is enrolled with (the pin enrolment wrote), or says how to join
    conf.write_text('role = "back-end"\n')
    env["CLOUDBOX_STATE_DIR"] = str(tmp_path / "be-state")
    assert "Not enrolled yet" in _console_cluster_status(env)
    (tmp_path / "be-state" / "nodes").mkdir(parents=True)
    shutil.copy(back.pins / "frontend.json", tmp_path / "be-state" / "nodes" / "frontend.json")
    assert "Managed by front-end front (127.0.0.1); join codes" in _console_cluster_status(env)


def _fake_nic(sys_net: Path, name: str, ifindex: int, mac: str) -> None:
    (sys_net / name).mkdir(parents=True)
    (sys_net / name / "ifindex").write_text(f"{ifindex}\n")
    (sys_net / name / "address").write_text(mac + "\n")


def test_discover_reads_the_dhcp_server_of_the_private_nics_lease(tmp_path: Path):
    from cloudbox.core.cluster import discover

    sys_net, leases = tmp_path / "net", tmp_path / "leases"
    leases.mkdir()
    _fake_nic(sys_net, "enp1s0", 2, "52:54:00:cb:00:01")
    _fake_nic(sys_net, "enp2s0", 3, "52:54:00:cb:00:02")
    # The shape networkd writes (sd_dhcp_lease_save): comments, KEY=VALUE lines.
    (leases / "3").write_text("# This is private data. Do not parse.\nADDRESS=10.73.0.57\nNETMASK=255.255.255.0\n"
                              "SERVER_ADDRESS=10.73.0.1\nLIFETIME=3600\n")
    assert nodeconf.nic_by_mac("52:54:00:CB:00:02", sys_net) == "enp2s0"
    assert discover.discover_frontend("enp2s0", lease_dir=leases, sys_net=sys_net) == "10.73.0.1"
    assert discover.discover_frontend(None, lease_dir=leases, sys_net=sys_net) == "10.73.0.1"  # the only lease
    with pytest.raises(CloudboxError, match=r"the private NIC enp1s0 has no DHCP lease yet .*leases/2"):
        discover.discover_frontend("enp1s0", lease_dir=leases, sys_net=sys_net)
    with pytest.raises(CloudboxError, match="the private NIC eth9 .* does not exist here"):
        discover.discover_frontend("eth9", lease_dir=leases, sys_net=sys_net)
    (leases / "2").write_text("ADDRESS=10.0.0.5\n")
    with pytest.raises(CloudboxError, match=r"names no DHCP server \(SERVER_ADDRESS=''\); give the front-end's"):
        discover.discover_frontend("enp1s0", lease_dir=leases, sys_net=sys_net)
    with pytest.raises(CloudboxError, match="2 NICs have DHCP leases"):
        discover.discover_frontend(None, lease_dir=leases, sys_net=sys_net)


def test_a_back_ends_private_link_is_the_bridge_its_private_nic_is_a_port_of(tmp_path: Path):
    """A back-end's address (and DHCP lease) is on the bridge cbpriv0 that its guests join; a front-end's on the
    NIC. The bridge has the NIC's MAC here, as a kernel bridge can: the NIC is still the one found by MAC first."""
    sys_net = tmp_path / "net"
    _fake_nic(sys_net, "enp2s0", 3, "52:54:00:cb:00:02")
    settings = {"network": {"private_nic": "enp2s0", "private_mac": "52:54:00:cb:00:02"}}
    assert nodeconf.private_link(settings, sys_net) == "enp2s0"  # a front-end: no bridge
    _fake_nic(sys_net, "cbpriv0", 9, "52:54:00:cb:00:02")
    (sys_net / "cbpriv0" / "bridge").mkdir()
    (sys_net / "enp2s0" / "master").symlink_to(sys_net / "cbpriv0")
    assert nodeconf.private_nic(settings, sys_net) == "enp2s0"
    assert nodeconf.private_link(settings, sys_net) == "cbpriv0"
    assert nodeconf.private_link({}, sys_net) is None


def test_the_private_nic_is_found_by_its_mac_when_its_name_changed(tmp_path: Path):
    """The installer records the live system's NIC name and MAC; on the installed node PCI slots (so names) can
    differ: the MAC decides."""
    sys_net = tmp_path / "net"
    _fake_nic(sys_net, "enp0s3", 2, "52:54:00:cb:01:02")
    settings = {"network": {"private_nic": "enp0s4", "private_mac": "52:54:00:cb:01:02"}}
    assert nodeconf.private_nic(settings, sys_net) == "enp0s3"
    assert nodeconf.private_nic({"network": {"private_nic": "enp0s4"}}, sys_net) == "enp0s4"
    assert nodeconf.private_nic({}, sys_net) is None


def test_the_front_end_hears_of_each_node_once_it_has_installed_the_key(front: Front, back: Back):
    """The hook that installs a node's volume credentials runs once the node confirmed the front-end's key (so the
    front-end's SSH can reach it), not for a refused join."""
    seen: list[str] = []
    code, _ = front.reg.make_code()
    port = front.serve(on_enrolled=seen.append)
    _expect_refused("wrong-code", back.join, f"127.0.0.1:{port}", "0000-0000-0000-0000")
    back.join(f"127.0.0.1:{port}", code)
    deadline = time.monotonic() + 5
    while not seen and time.monotonic() < deadline:
        time.sleep(0.05)
    assert seen == ["node2"]


def test_volume_credentials_go_on_in_a_thread_that_the_server_waits_for(state):
    """Started from the server's connection thread (a daemon), the installer's thread is not one: the server's
    process waits for it before it exits. A node it cannot reach is logged, not raised."""
    from cloudbox.core.cluster import volumecreds

    said: list[str] = []
    box: list[threading.Thread] = []
    caller = threading.Thread(target=lambda: box.append(volumecreds.install_in_background("ghost", said.append)),
                              daemon=True)
    caller.start()
    caller.join(5)
    assert box and box[0].daemon is False
    box[0].join(30)
    assert len(said) == 1 and said[0].startswith("node ghost: volume credentials not installed yet (")
