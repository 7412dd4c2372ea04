"""IOzone's grids in a real `cloudbox study run` (real libvirtd and QEMU, TCG here) at quick size: iozone -a over every
record from 64 kB (iozone-grid) or 4 kB (iozone-grid-4k) to 16 MB and every file from the smallest record to 128 MiB,
in the guest and on bare metal, each row stored, then the study's HTML report plotting the write pass per record
size; nothing left behind."""

from __future__ import annotations

from xml.etree import ElementTree

import pytest
from real_runs import leftovers, work_files

from cloudbox import cli
from cloudbox.core.bench import iozone
from cloudbox.core.record.results import ResultStore

pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.full]

GRID = """\
name = "g"
title = "IOzone's grid"
description = "IOzone's automatic mode over record and file sizes, KVM with the host cache off."
sizes = ["quick"]

[[profiles]]
name = "kvm-cache-none"
row = "KVM, emulated IDE, raw file, host cache off"

[[tests]]
id = "TEST"
table = "IOzone's automatic mode"

[plan.quick]
repeats = 1  # one grid a side: the 4 kB grid alone takes minutes
"""


@pytest.mark.parametrize("test,smallest", [("iozone-grid", 64), ("iozone-grid-4k", 4)])
def test_the_grid_in_the_guest_and_on_bare_metal_then_plotted(test, smallest, state, libvirt_conn, tmp_path,
                                                              monkeypatch, capsys):
    records_kib = [smallest << i for i in range((16384 // smallest).bit_length())]  # the smallest .. 16 MiB
    n = len(records_kib)
    (tmp_path / "g.toml").write_text(GRID.replace("TEST", test))
    monkeypatch.setenv("CLOUDBOX_STUDY_DIR", str(tmp_path))
    code = cli.main(["study", "run", "g", "--size", "quick"])
    out = capsys.readouterr()
    assert code == 0, out
    with ResultStore() as store:
        [run] = store.list_runs()
        run = store.get_run(run.id)
    assert run.state == "completed", run.reason
    for side in ("guest", "baseline"):
        rows = {m.metric: m for m in run.measurements if m.side == side and m.test == test}
        cells = iozone.iozone_sweep_cells(rows)
        # files from the smallest record to 128 MiB, each with every record up to its size: 1 + 2 + ... + n (up to
        # the 16 MiB file), then n for each larger file (32 to 128 MiB)
        assert len(cells) == n * (n + 1) // 2 + 3 * n and sorted({r for _, r in cells}) == records_kib, (side, cells)
        assert len(rows) == 1 + 4 * len(cells) and all(m.value > 0 for m in rows.values()), side
        assert rows["MB/s"].value == rows["write MB/s, 128 MiB file, 16 MiB records"].value
        assert f"-y {smallest}k -q 16m -n {smallest}k -g 131072k -I -e -w" in rows["MB/s"].raw
        if run.emulated and side == "guest":
            assert "emulated" in rows["MB/s"].labels
    code = cli.main(["study", "report", "g", "--format", "html"])
    page = capsys.readouterr().out
    assert code == 0
    [fig] = [f.split("</figure>")[0] for f in page.split("<figure>")[1:] if "against file size" in f]
    ns = "{http://www.w3.org/2000/svg}"
    svgs = [ElementTree.fromstring("<svg" + c.split("</svg>")[0] + "</svg>") for c in fig.split("<svg")[1:]]
    assert len(svgs) == 2  # bare metal, the guest
    for svg in svgs:
        lines = {"".join(p.itertext()): p.get("points").split() for p in svg.iter(f"{ns}polyline")}
        # a line per record size, over the files from that record's size up to 128 MiB
        assert [len(pts) for pts in lines.values()] == list(range(n + 3, 3, -1)), lines.keys()
    heading = next(t.text for t in svgs[1].iter(f"{ns}text"))
    assert heading == "kvm-cache-none, guest (" + ("emulated, " if run.emulated else "") + "quick)"
    assert leftovers(libvirt_conn, state) == {"guests": [], "bridge": False, "netns": False, "loops": []}
    assert work_files(state) == []
