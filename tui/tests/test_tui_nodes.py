"""Pilot tests of the cluster on the Overview, against the real core: a real node registry in a temporary state
dir, the real detached enrolment server (`cloudbox node enrol-server`, a child process on 127.0.0.1), a real
back-end enrolling over TCP with what the dialog shows, ssh for the removal, and the role from a real node
settings file."""

from __future__ import annotations

import asyncio
import re
import shutil
import socket
import time
from pathlib import Path

import pytest
from test_tui_pilot import rows
from test_tui_pilot import until as _until

from cloudbox.core.cluster import enrol, frontend, keys, registry
from cloudbox.core.views import host
from cloudbox.core.virt import accel
from cloudbox.tui import create_app
from cloudbox.tui.backend import Backend
from cloudbox.tui.screens.join_code import JoinCodeDialog
from cloudbox.tui.widgets.dialogs import ConfirmDialog

pytestmark = pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs ssh-keygen (openssh-client)")
SIZE = (100, 32)


def facts(role: str, source: str) -> host.HostFacts:
    return host.HostFacts(
        hostname="lab1", role=role, role_source=source, nodes=[host.Node("lab1", role, "up", "this box")],
        accelerator=accel.Accelerator("kvm", "kvm", False, False, "KVM usable (test facts)"),
        accelerator_problem=None, libvirtd="libvirtd running (test facts)", disks=[], nics=[])


def text(widget) -> str:
    v = widget.content
    return v.plain if hasattr(v, "plain") else str(v)


def notices(app) -> str:
    return "\n".join(str(n.message) for n in app._notifications)


async def until(pilot, cond, timeout: float = 15.0, what: str = "") -> None:
    """test_tui_pilot's until() with more time: these tests wait on a real server and a real join."""
    await _until(pilot, cond, timeout, what)


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = int(s.getsockname()[1])
    s.close()
    return port


def _keypair(path: Path) -> keys.PublicKey:
    keys.generate_key(path, "test")
    return keys.read_public_key(path.with_name(path.name + ".pub"), what="test key")


class Node:
    """A role (node settings file), state and run dirs, and an SSH host key: what the enrolment server reads."""

    def __init__(self, base: Path, role: str, monkeypatch):
        self.base = base
        self.conf = base / "node.toml"
        self.conf.write_text(f'role = "{role}"\nhostname = "fe1"\n')
        _keypair(base / "ssh_host_ed25519_key")
        env = {"CLOUDBOX_NODE_CONFIG": self.conf, "CLOUDBOX_STATE_DIR": base / "state",
               "CLOUDBOX_RUN_DIR": base / "run", "CLOUDBOX_SSH_HOST_KEY": base / "ssh_host_ed25519_key.pub"}
        for k, v in env.items():
            monkeypatch.setenv(k, str(v))
        self.port = _free_port()
        self.backend = Backend(facts=facts(role, str(self.conf)), libvirt_uri="test:///default",
                               enrol_bind="127.0.0.1", enrol_port=self.port)

    def stop_server(self) -> None:
        """No enrolment server outlives the test: revoke what is open, and it exits within a second."""
        if registry.nodes_db().exists():
            with registry.Registry() as reg:
                reg.revoke(None)
        for _ in range(100):
            if not frontend.server_running():
                return
            time.sleep(0.05)
        raise AssertionError("the enrolment server did not stop after its codes were revoked")


@pytest.fixture
def front_end(tmp_path, monkeypatch):
    n = Node(tmp_path, "front-end", monkeypatch)
    yield n
    n.stop_server()
    n.backend.close()


async def test_join_code_enrol_revoke_and_remove(front_end: Node, tmp_path: Path):
    be = tmp_path / "be"
    be.mkdir()
    ident = enrol.Identity("node2", _keypair(be / "host_key"), _keypair(be / "id_ed25519"), ssh_port=_free_port())

    app = create_app(front_end.backend)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: "No back-end enrolled yet" in text(app.screen.query_one("#cluster")))
        await pilot.press("j")
        # the screen is pushed before its widgets are mounted (CI once queried #code in between): wait for the
        # last one
        await until(pilot, lambda: isinstance(app.screen, JoinCodeDialog)
                    and bool(app.screen.query("#code-status")), timeout=30, what="the code dialog")
        dlg = app.screen
        code = dlg.offer.code
        assert re.fullmatch(r"([0-9A-Z] ){3}[0-9A-Z](  -  ([0-9A-Z] ){3}[0-9A-Z]){3}", text(dlg.query_one("#code")))
        assert text(dlg.query_one("#code")).replace(" ", "") == code
        port = front_end.port
        assert text(dlg.query_one("#code-command")).strip() == \
            f"cloudbox node join --front-end 127.0.0.1:{port} --code {code}"
        assert f"Enrolment server: 127.0.0.1:{port}, pid {dlg.offer.pid}, listens" in \
            text(dlg.query_one("#code-server"))
        assert "(15 min), one node only" in str(dlg.query_one("#code").border_title)
        await until(pilot, lambda: "open for 14 min" in text(dlg.query_one("#code-status")))
        assert frontend.server_running()

        # a back-end joins with what the dialog shows; the dialog sees the code used
        joined = await asyncio.to_thread(enrol.join, f"127.0.0.1:{port}", code.lower(), identity=ident,
                                         authorized_keys=be / "authorized_keys", pin_dir=be / "pins", timeout=10)
        assert joined.frontend_name == "fe1"
        await until(pilot, lambda: "USED by node2 (127.0.0.1)" in text(dlg.query_one("#code-status")))
        await pilot.press("escape")
        table = app.screen.query_one("#nodes")
        await until(pilot, lambda: [r[0] for r in rows(table)] == ["lab1", "node2"], what="node2 in the table")
        node2 = rows(table)[1]
        assert node2[1:4] == ["back-end", "UNKNOWN", f"127.0.0.1:{ident.ssh_port}"] and node2[4] == "-"
        assert "not checked yet" in node2[5]
        await until(pilot, lambda: not frontend.server_running(), what="the server to stop (its code is spent)")

        # another code, then v revokes it and the server stops
        await pilot.press("j")
        await until(pilot, lambda: isinstance(app.screen, JoinCodeDialog), timeout=30)
        second = app.screen.offer.record.id
        await pilot.press("escape")
        await until(pilot, lambda: "Join codes: 1 open" in text(app.screen.query_one("#cluster")))
        await pilot.press("v")
        await until(pilot, lambda: f"revoked join code {second}; the enrolment server stops" in notices(app))
        await until(pilot, lambda: not frontend.server_running(), what="the server to stop (code revoked)")
        with registry.Registry() as reg:
            assert reg.code(second).status() == "revoked"

        # x on this box says what to do; on node2 it asks, naming the node, and removes it
        table.focus()
        table.move_cursor(row=0)
        await pilot.press("x")
        await until(pilot, lambda: "highlight the node to remove" in notices(app))
        assert "enrolled: node2" in notices(app)
        table.move_cursor(row=1)
        await until(pilot, lambda: "node2: UNKNOWN, enrolled; not checked yet" in
                    text(app.screen.query_one("#node-detail")))
        await pilot.press("x")
        await until(pilot, lambda: isinstance(app.screen, ConfirmDialog))
        assert app.screen.question.startswith(f"Remove node node2 (127.0.0.1:{ident.ssh_port})?")
        await pilot.press("y")
        # nothing listens on node2's SSH port: it is forgotten all the same, and the notice says what is left
        await until(pilot, lambda: [r[0] for r in rows(table)] == ["lab1"], what="node2 gone from the table")
        await until(pilot, lambda: "could not be reached" in notices(app))
        msg = notices(app)
        assert "removed node node2" in msg and "STILL in its /root/.ssh/authorized_keys" in msg
        assert "sed -i '/ cloudbox-front-end /d' /root/.ssh/authorized_keys" in msg
        with registry.Registry() as reg:
            assert reg.nodes() == []
        assert app.errors == []


async def test_server_that_cannot_listen_is_an_error_naming_the_address(front_end: Node):
    busy = socket.socket()
    busy.bind(("127.0.0.1", front_end.port))
    busy.listen(1)

    try:
        app = create_app(front_end.backend)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: "No back-end enrolled yet" in text(app.screen.query_one("#cluster")))
            await pilot.press("j")
            await until(pilot, lambda: app.errors, timeout=30, what="an error notice")
            err = app.errors[0]
            assert f"the enrolment server did not start on 127.0.0.1:{front_end.port}" in err
            assert f"cannot listen on 127.0.0.1:{front_end.port}: Address already in use" in err
            assert "is revoked" in err and not isinstance(app.screen, JoinCodeDialog)
            with registry.Registry() as reg:
                assert reg.open_codes() == []  # the code nobody could use is revoked
    finally:
        busy.close()


async def test_back_end_keys_say_why_they_are_not_available(tmp_path, monkeypatch):
    n = Node(tmp_path, "back-end", monkeypatch)

    app = create_app(n.backend)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: "Not enrolled yet" in text(app.screen.query_one("#cluster")))
        for key, what in (("j", "making join codes"), ("v", "revoking join codes"), ("x", "removing nodes")):
            await pilot.press(key)
            await until(pilot, lambda w=what: f"role: this node is a back-end ({n.conf}); {w} runs on a "
                        "front-end or an all-in-one" in notices(app), what=f"the refusal of {key}")
        assert not isinstance(app.screen, JoinCodeDialog) and app.errors == []
        # once enrolled, the back-end names its front-end
        pin, known = enrol.pin_paths()
        pin.parent.mkdir(parents=True)
        pin.write_text('{"name": "fe1", "address": "10.0.0.1", "host_key_fingerprint": "SHA256:abc"}\n')
        await pilot.press("r")
        await until(pilot, lambda: "Managed by front-end fe1 at 10.0.0.1 (its host key SHA256:abc is pinned)"
                    in text(app.screen.query_one("#cluster")))
    assert not registry.nodes_db().exists()  # a back-end's keys made no registry


async def test_tests_setup_places_a_run_on_an_enrolled_node(front_end: Node):
    """Where (on the Tests screen) lists this host and the enrolled nodes with their state; the spec started
    carries the node chosen. Without nodes the choice is not shown: an all-in-one box runs here."""
    from textual.widgets import Label, Select

    from cloudbox.core.record.results import ResultStore

    with ResultStore() as store:
        rid = store.create_run(profile_name="virtio-disk", suite="storage", size_label="quick", state="completed")
    started: list = []

    def start_runs(specs):
        started.append(specs)
        return rid, None

    front_end.backend.start_runs = start_runs  # type: ignore[method-assign]

    async def go(expect_nodes: bool):
        app = create_app(front_end.backend, mode="tests", poll_interval=0.2)
        async with app.run_test(size=SIZE) as pilot:
            where = app.screen.query_one("#where", Select)
            await until(pilot, lambda: app.screen.form.setup is not None, what="the setup data")  # type: ignore[attr-defined]
            assert where.display is expect_nodes and app.screen.query_one("#where-label", Label).display is expect_nodes
            if expect_nodes:
                assert [label for label, _ in app.screen.form.setup.targets] == \
                    ["this host", "node be1 (up)", "spread: this host, be1"]  # type: ignore[attr-defined]
                assert app.screen.form.setup.targets[2][1] == "local,be1"  # type: ignore[attr-defined]
                where.value = "be1"
            await pilot.press("s")
            await until(pilot, lambda: len(started) == (2 if expect_nodes else 1), what="the run started")
            assert (f"run {rid} started on node be1" in notices(app)) is expect_nodes

    await go(False)
    assert [s.node for s in started[0]] == [""]
    with registry.Registry() as reg:
        _, rec = reg.make_code()
        be = _keypair(front_end.base / "be_host_key")
        cl = _keypair(front_end.base / "be_client_key")
        reg.enrol(name="be1", role="back-end", address="10.73.0.20", ssh_port=22, host_key=be.line,
                  client_key=cl.line, code_key=rec.key, peer="10.73.0.20")
        reg.set_health("be1", "up", "libvirt 11.3.0 on be1")
    await go(True)
    assert [(s.node, s.profile) for s in started[1]] == [("be1", started[0][0].profile)]
