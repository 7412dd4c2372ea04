"""list_guests against libvirt's test driver: only domains with cloudbox metadata, in a stable order."""

from __future__ import annotations

import pytest

from cloudbox.core.virt import domain, guest

libvirt = pytest.importorskip("libvirt")

NAMES = ["cloudbox-f", "cloudbox-b", "cloudbox-e", "cloudbox-a", "cloudbox-d", "cloudbox-c"]


def _xml(name: str, meta: bool) -> str:
    tag = (f'<metadata><cloudbox:profile xmlns:cloudbox="{domain.CLOUDBOX_XMLNS}" name="p-{name[-1]}" '
           f'hash="0" run="run-{name[-1]}"/></metadata>') if meta else ""
    return (f"<domain type='test'><name>{name}</name>{tag}<memory unit='MiB'>64</memory>"
            "<os><type>hvm</type></os></domain>")


def test_cloudbox_guests_sorted_by_name_with_their_metadata():
    libvirt.registerErrorHandler(lambda *_: None, None)
    conn = libvirt.open("test:///default")  # fresh state: the test driver forgets it when the last connection closes
    try:
        for n in NAMES:
            conn.createXML(_xml(n, meta=True), 0)
        conn.createXML(_xml("not-ours", meta=False), 0)
        found = guest.list_guests(conn)
        assert [g.name for g in found] == sorted(NAMES)  # libvirt's own order is a hash table's
        assert {(g.name, g.profile, g.run_uuid, g.state) for g in found} == {
            (n, f"p-{n[-1]}", f"run-{n[-1]}", "running") for n in NAMES}
        assert all(g.uptime() is None for g in found)  # no QEMU pid file to date the start
    finally:
        for d in conn.listAllDomains(0):
            if d.name() != "test":
                d.destroy()
        conn.close()


def test_reaping_leaves_the_guests_of_another_results_database_alone():
    """An executor reaps the guests of its own database's dead runs; a guest of a run it does not know belongs to
    another state directory on this host (another user, a test session) and stays."""
    libvirt.registerErrorHandler(lambda *_: None, None)
    conn = libvirt.open("test:///default")
    try:
        for n in ("cloudbox-a", "cloudbox-b", "cloudbox-c"):
            conn.createXML(_xml(n, meta=True), 0)
        assert guest.reap_orphans(conn, {"run-a"}, known_runs={"run-a", "run-b"}) == ["cloudbox-b"]
        assert [g.name for g in guest.list_guests(conn)] == ["cloudbox-a", "cloudbox-c"]
        assert guest.reap_orphans(conn, {"run-a"}) == ["cloudbox-c"]  # no database given: every orphan
    finally:
        for d in conn.listAllDomains(0):
            if d.name() != "test":
                d.destroy()
        conn.close()


def test_the_tui_destroys_a_transient_guest_without_an_error():
    """A cloudbox guest is transient: gone once destroyed, so the Guests screen's destroy must not ask libvirt
    about it afterwards."""
    from cloudbox.tui.backend import Backend

    libvirt.registerErrorHandler(lambda *_: None, None)
    conn = libvirt.open("test:///default")  # held open: the backend's own connection sees the same state
    try:
        conn.createXML(_xml("cloudbox-a", meta=True), 0)
        (info,) = guest.list_guests(conn)
        Backend(libvirt_uri="test:///default").destroy_guest(info)
        assert guest.list_guests(conn) == []
    finally:
        conn.close()


def test_stopping_an_orphan_destroys_it_and_says_so(state):
    """A guest whose run is not live (an orphan) has no executor to cancel: the core destroys it directly."""
    from cloudbox.core.errors import GuestError
    from cloudbox.core.record.results import ResultStore
    from cloudbox.core.run import runs

    libvirt.registerErrorHandler(lambda *_: None, None)
    conn = libvirt.open("test:///default")
    try:
        conn.createXML(_xml("cloudbox-a", meta=True), 0)
        (info,) = guest.list_guests(conn)
        with ResultStore() as store:
            assert runs.run_of_guest(store, info) is None
            assert runs.stop_guest(store, info, "test:///default") == "destroyed (it had no live run)"
        assert guest.list_guests(conn) == []
        with pytest.raises(GuestError, match="could not destroy guest cloudbox-a: "):  # gone: libvirt says so
            guest.destroy_guest("cloudbox-a", "test:///default")
    finally:
        conn.close()
