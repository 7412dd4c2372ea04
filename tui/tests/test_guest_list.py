"""list_guests against libvirt's test driver: only domains with cloudbox metadata, in a stable order."""

from __future__ import annotations

import pytest

from cloudbox.core import domain, guest

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
