"""A bounded fuzz pass on the two request parsers that face another machine: the enrolment server (a real server on
127.0.0.1, real TCP) and the node's `cloudbox node local start-run` request. Truncated, oversized, malformed and
replayed messages get a clean refusal (or a closed connection) within the connection deadline, and the server
keeps serving: a real back-end joins after the fuzz. Hypothesis draws a fixed, derandomized set of cases
(FUZZ_CASES; about 15 s in all)."""

from __future__ import annotations

import json
import secrets
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import test_nodes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_nodes import SRC, Back, Front, _keypair

from cloudbox.agent import requests as node_requests
from cloudbox.core.cluster import enrol, protocol, registry

FUZZ_CASES = 60
DEADLINE_S = 2.0
FUZZ = settings(max_examples=FUZZ_CASES, derandomize=True, database=None, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


class Server:
    """One enrolment server for the whole module (a fuzz case is one connection to it)."""

    def __init__(self, base: Path):
        self.front = Front(base)
        # one code for the replayed enrolment, one for the real join after the fuzz, one that keeps it listening
        self.codes = [self.front.reg.make_code(60)[0] for _ in range(3)]
        self.server = enrol.EnrolServer(self.front.reg, self.front.ident, host="127.0.0.1", port=0,
                                        log=self.front.log.append, io_timeout=1.0, deadline=DEADLINE_S,
                                        peer_failure_limit=10**6)  # parsing is fuzzed here; the limit elsewhere
        _, self.port = self.server.open()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.server.serve, kwargs={"poll": 0.05, "stop": self.stop},
                                       daemon=True)
        self.thread.start()
        hk = _keypair(base / "fuzz_host")
        self.hello = {"type": "hello", "v": protocol.VERSION, "name": "fuzz", "role": "back-end", "ssh_port": 22,
                      "nonce": secrets.token_hex(32), "host_key": hk.line, "client_key": hk.line,
                      "address": "127.0.0.1", "front_end_address": "127.0.0.1"}

    def exchange(self, chunks: list[bytes], *, half_close: bool) -> tuple[list[dict[str, Any]], float]:
        """Send the chunks, read every reply line until the server closes; (replies, seconds taken)."""
        t0 = time.monotonic()
        replies: list[dict[str, Any]] = []
        with socket.create_connection(("127.0.0.1", self.port), timeout=DEADLINE_S + 3) as s:
            try:
                for c in chunks:
                    s.sendall(c)
                if half_close:
                    s.shutdown(socket.SHUT_WR)
            except OSError:
                pass  # the server refused and closed while we were still sending
            buf = b""
            try:
                while data := s.recv(65536):
                    buf += data
            except OSError:
                pass
        for line in buf.splitlines():
            replies.append(json.loads(line))
        return replies, time.monotonic() - t0


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("fuzz"))
    yield srv
    srv.stop.set()
    srv.thread.join(10)
    srv.front.reg.close()


def _line(obj: Any) -> bytes:
    return json.dumps(obj).encode() + b"\n"


def _hello_variants(base: dict[str, Any]) -> st.SearchStrategy[bytes]:
    junk = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False),
                     st.text(max_size=40), st.lists(st.integers(), max_size=3),
                     st.dictionaries(st.text(max_size=5), st.integers(), max_size=2))
    mutated = st.tuples(st.sampled_from(sorted(base)), junk).map(lambda kv: _line({**base, kv[0]: kv[1]}))
    dropped = st.sampled_from(sorted(base)).map(lambda k: _line({x: v for x, v in base.items() if x != k}))
    return st.one_of(mutated, dropped)


def cases(base: dict[str, Any]) -> st.SearchStrategy[tuple[str, list[bytes], bool]]:
    """(kind, chunks, half_close) of one connection."""
    whole = _line(base)
    return st.one_of(
        st.tuples(st.just("truncated"), st.integers(0, len(whole) - 2).map(lambda n: [whole[:n]]), st.just(True)),
        st.tuples(st.just("oversized"), st.just([b'{"type":"hello","name":"' + b"a" * (protocol.MAX_LINE + 10)]),
                  st.booleans()),
        st.tuples(st.just("oversized-line"), st.just([b"a" * (protocol.MAX_LINE + 10) + b"\n"]), st.just(False)),
        st.tuples(st.just("bytes"), st.binary(min_size=1, max_size=300).map(lambda b: [b + b"\n"]), st.booleans()),
        st.tuples(st.just("deep"), st.integers(5, 50_000).map(lambda n: [b"[" * n + b"]" * n + b"\n"]),
                  st.just(False)),
        st.tuples(st.just("huge-number"), st.integers(101, 10_000).map(
            lambda n: [b'{"type":"hello","v":' + b"9" * n + b"}\n"]), st.just(False)),
        st.tuples(st.just("not-object"), st.sampled_from([b"[]\n", b"1\n", b'"x"\n', b"null\n", b"\n", b"\x00\n"])
                  .map(lambda b: [b]), st.just(False)),
        st.tuples(st.just("hello-mutated"), _hello_variants(base).map(lambda b: [b]), st.just(False)),
        st.tuples(st.just("wrong-order"), st.sampled_from(["proof", "installed", "welcome", "refused", "error"]).map(
            lambda t: [_line({"type": t, "mac": "0" * 64, "reason": "x\x1b", "message": "m"})]), st.just(False)),
        st.tuples(st.just("after-challenge"), st.one_of(st.binary(max_size=100), st.just(b"")).map(
            lambda b: [whole, b + b"\n"]), st.booleans()),
    )


@FUZZ
@given(case=st.data())
def test_fuzzed_messages_get_a_clean_refusal_and_the_server_keeps_serving(server: Server, case):
    kind, chunks, half_close = case.draw(cases(server.hello))
    replies, took = server.exchange(chunks, half_close=half_close)
    assert took < DEADLINE_S + 2, f"{kind}: the connection stayed {took:.1f} s"
    assert all(r.get("type") in ("challenge", "refused") for r in replies), (kind, replies)
    refusals = [r for r in replies if r["type"] == "refused"]
    for r in refusals:
        assert r["reason"] in protocol.REASONS and r["message"], (kind, r)
    if kind in ("oversized", "oversized-line", "deep", "huge-number", "not-object", "wrong-order"):
        assert [r["reason"] for r in refusals] == ["bad-request"], (kind, replies)
    assert server.thread.is_alive()


def test_a_replayed_hello_and_proof_are_refused(server: Server, tmp_path: Path):
    """A proof recorded from a real enrolment does not work again: the front-end's nonce is new each time."""
    node = Back(tmp_path / "replayed", "replayed")
    hello = {"type": "hello", "v": protocol.VERSION, "name": node.ident.name, "role": "back-end", "ssh_port": 22,
             "nonce": secrets.token_hex(32), "host_key": node.ident.host_key.line,
             "client_key": node.ident.client_key.line, "address": "127.0.0.1", "front_end_address": "127.0.0.1"}
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        f = s.makefile("rb")
        s.sendall(_line(hello))
        challenge = json.loads(f.readline())
        key = registry.derive_key(server.codes[0], challenge["salt"])
        proof = {"type": "proof", "mac": enrol.mac(key, "back-end", enrol.transcript(hello, challenge))}
        s.sendall(_line(proof))
        welcome = json.loads(f.readline())
        s.sendall(_line({"type": "installed"}))
    assert welcome["type"] == "welcome"
    replies, _ = server.exchange([_line(hello), _line(proof)], half_close=False)
    assert [r["type"] for r in replies] == ["challenge", "refused"] and replies[1]["reason"] == "wrong-code"


def test_after_the_fuzz_a_real_back_end_joins(server: Server, tmp_path: Path):
    node = Back(tmp_path / "real", "after-fuzz")
    res = node.join(f"127.0.0.1:{server.port}", server.codes[1])
    assert res.frontend_name == "front" and server.front.reg.node("after-fuzz").address == "127.0.0.1"


# -- the node's side: `cloudbox node local start-run` -------------------------------------------------------
json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                      max_size=3), max_leaves=10)
start_run_requests = st.one_of(
    st.binary(max_size=400),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({"spec": json_values | st.dictionaries(st.sampled_from(
        ["profile", "suite", "size", "agent_timeout", "net_seconds", "node", "peer", "x"]), json_values, max_size=4),
        "profile_toml": json_values | st.sampled_from(["", "name = 1", 'name = "a"', "[" * 5000])},
        optional={"image_dir": json_values | st.sampled_from(["/x/../y", "rel", "/ok"]), "extra": json_values})
    .map(lambda d: json.dumps(d).encode()),
)


class _Stream:
    def __init__(self, data: bytes):
        self.data = data

    def read(self, n: int) -> bytes:
        return self.data[:n]


@settings(max_examples=FUZZ_CASES * 3, derandomize=True, database=None, deadline=None)
@given(start_run_requests)
def test_the_start_run_request_parser_refuses_cleanly(raw: bytes):
    try:
        req = node_requests.read_request(_Stream(raw))
    except node_requests.BadRequest as e:
        assert str(e).startswith("start-run") and "\x1b" not in str(e)
        return
    assert isinstance(req["spec"], dict) and isinstance(req["profile_toml"], str)


def test_the_start_run_request_refusals_exit_2_without_a_traceback(tmp_path: Path):
    env = {"PYTHONPATH": str(SRC), "CLOUDBOX_STATE_DIR": str(tmp_path / "state"), "PATH": "/usr/bin:/bin"}
    for raw in (b"[" * 200_000, b'{"spec": {"suite": "all\\u001b[2J"}, "profile_toml": "x"}', b"\xff" * 10,
                b"a" * (protocol.MAX_REQUEST_BYTES + 1)):
        out = subprocess.run([sys.executable, "-m", "cloudbox.cli", "node", "local", "start-run"], input=raw,
                             capture_output=True, env=env, timeout=60)
        assert out.returncode == 2, out.stderr
        assert out.stderr.startswith(b"cloudbox: start-run") and b"Traceback" not in out.stderr
    assert not (tmp_path / "state" / "results.db").exists()  # refused before anything was started or stored


_ = test_nodes  # the Front/Back helpers live there
