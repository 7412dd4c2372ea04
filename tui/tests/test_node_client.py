"""The front-end's client of a node (core.cluster.client) reads what a node sends with a size limit: a node that
sends more is an error naming it and the limit, not unbounded memory. The transport here is `sh -c SCRIPT` in
the place of the pinned ssh (NodeShell's argv is its base command plus the node's command line), so each test
says exactly what the "node" prints."""

from __future__ import annotations

import json

import pytest

from cloudbox.core.cluster import client
from cloudbox.core.cluster.registry import NodeRecord
from cloudbox.core.errors import CloudboxError
from cloudbox.core.record.provenance import RemoteRun

RUN = RemoteRun("be1", 7, "u" * 32)


def shell(script: str) -> client.NodeShell:
    node = NodeRecord("be1", "back-end", "10.73.0.17", 22, "ssh-ed25519 AAAA", None, "qemu+ssh://x/system", 0.0,
                      None, None, "up", None)
    return client.NodeShell(node, ["sh", "-c", script, "ssh"])


def test_a_run_export_larger_than_the_limit_is_refused_naming_the_node():
    big = shell("head -c 3000000 /dev/zero")
    with pytest.raises(client.NodeError, match=r"node be1 \(10\.73\.0\.17\): reading run 7 sent more than 2 MiB, "
                                               r"the limit; stopped"):
        client.fetch_run(big, RUN, limit=2 * 1024**2)
    doc = {"runs": [{"id": 7, "uuid": "v" * 32, "state": "completed", "measurements": []}]}
    ok = shell(f"printf '%s' '{json.dumps(doc)}'")
    assert client.fetch_run(ok, RUN)["uuid"] == "v" * 32


def test_an_event_longer_than_the_limit_stops_the_stream_naming_the_node():
    long = shell("printf '%s\\n' '{\"seq\": 1, \"kind\": \"log\", \"payload\": {\"text\": \"hi\"}}'; "
                 "head -c 5000 /dev/zero | tr '\\0' x; echo")
    events = client.follow(long, RUN, line_limit=4096)
    assert next(events) == (1, "log", {"text": "hi"})
    with pytest.raises(CloudboxError, match=r"node be1 \(10\.73\.0\.17\): an event of run 7 there is longer than "
                                            r"4096 bytes, the limit; stopped following it") as e:
        next(events)
    assert not isinstance(e.value, client.NodeError)  # not a dropped stream to re-attach to


def test_a_stream_that_ends_before_the_run_did_is_a_dropped_one():
    lines = [{"seq": 1, "kind": "step", "payload": {"text": "a"}},
             {"seq": 2, "kind": "state", "payload": {"state": "completed", "reason": None}}]
    whole = shell("; ".join(f"printf '%s\\n' '{json.dumps(x)}'" for x in lines))
    assert [s for s, _, _ in client.follow(whole, RUN)] == [1, 2]
    cut = shell(f"printf '%s\\n' '{json.dumps(lines[0])}'; echo 'Connection reset' >&2; exit 255")
    with pytest.raises(client.NodeError, match=r"lost the run's event stream before it ended \(ssh could not "
                                               r"reach it or was refused \(exit 255\): Connection reset\)"):
        list(client.follow(cut, RUN))


def test_a_dropped_stream_is_re_attached_where_it_stopped_until_the_node_counts_as_lost(monkeypatch):
    monkeypatch.setattr(client, "REATTACH_PAUSE_S", 0.0)
    first = {"seq": 1, "kind": "step", "payload": {"text": "a"}}
    rest = [{"seq": 2, "kind": "step", "payload": {"text": "b"}},
            {"seq": 3, "kind": "state", "payload": {"state": "completed", "reason": None}}]
    # the "node" sends event 1 and drops; asked again after it (--after 1), it sends the rest
    flaky = shell("case \"$*\" in *'--after 1'*) " + "; ".join(f"printf '%s\\n' '{json.dumps(x)}'" for x in rest)
                  + ";; *) " + f"printf '%s\\n' '{json.dumps(first)}'; exit 255;; esac")
    said: list[str] = []
    got = list(client.follow_through_drops(flaky, RUN, cancelled=lambda: False, say=said.append,
                                           lost=lambda s, e: CloudboxError("lost")))
    assert [s for s, _, _ in got] == [1, 2, 3]
    assert len(said) == 1 and said[0].startswith("re-attaching to run 7 on be1 in 0 s (")
    monkeypatch.setattr(client, "REATTACH_WITHIN_S", 0.0)
    gone = shell("exit 255")
    with pytest.raises(CloudboxError, match=r"^lost after 0 s: node be1"):
        list(client.follow_through_drops(gone, RUN, cancelled=lambda: False, say=said.append,
                                         lost=lambda s, e: CloudboxError(f"lost after {s:.0f} s: {e}")))


def test_a_failed_or_slow_command_says_why():
    with pytest.raises(client.NodeError, match=r"node be1 \(10\.73\.0\.17\): cancelling run 7 failed: exit "
                                               r"status 3: no such run"):
        client.cancel_run(shell("echo 'no such run' >&2; exit 3"), RUN)
    with pytest.raises(client.NodeError, match="did not finish within 0.5 s"):
        shell("exec sleep 5").run("true", timeout=0.5)
    assert shell("cat").run("ignored", input=b"sent on stdin") == "sent on stdin"
    with pytest.raises(client.NodeError, match="sent more than 100 bytes, the limit"):
        shell("cat").run("ignored", input=b"x" * 5000, limit=100)
