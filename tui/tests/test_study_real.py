"""A real `cloudbox study run` (real libvirtd and QEMU, TCG here) of a one-cell study, run again (nothing left to
measure), then reported in Markdown and HTML: the cell's number labelled emulated (in the table and on the figure)
and the rule inconclusive for that reason."""

from __future__ import annotations

import time
from pathlib import Path
from xml.etree import ElementTree

import pytest

from cloudbox.core.record.results import ResultStore

pytestmark = [pytest.mark.slow, pytest.mark.root]

ONE_CELL = """\
name = "t"
title = "virtio's writes"
description = "One cell: dd writes on the whole disk through virtio, against bare metal."
sizes = ["quick"]

[[profiles]]
name = "virtio-disk"
row = "KVM, local disk, virtio"

[[tests]]
id = "dd-write-64k"
table = "Writes (dd, 64 kB blocks)"

[[rules]]
id = "T1"
finding = "virtio writes at nearly native speed."
cell = "virtio-disk/dd-write-64k"
against = "native"
op = ">="
percent = 90
why = "The study measured 99%."

[plan.quick]
repeats = 1  # one sample: make test's time (a repeated run has tests/test_repeat_run_real.py)
"""


def test_a_study_runs_its_missing_cell_then_reports_it(state, libvirt_conn, tmp_path, monkeypatch, cli_run):
    studies = tmp_path / "studies"
    studies.mkdir()
    (studies / "t.toml").write_text(ONE_CELL)
    monkeypatch.setenv("CLOUDBOX_STUDY_DIR", str(studies))

    ran = cli_run(["study", "run", "t", "--size", "quick"])
    code, out = ran.code, ran.printed
    assert code == 0, out
    assert "study t at quick size on this host: 1 run(s) to do" in out
    assert "virtio-disk: run dd-write-64k" in out
    assert "\n== study t: run 1 of 1: virtio-disk (" in out, "the run's heading is on a line of its own"
    with ResultStore() as store:
        [run] = store.list_runs()
        run = store.get_run(run.id)
    assert run.state == "completed", run.reason
    for side in ("guest", "baseline"):
        assert run.measurement(side, "dd-write-64k", "MB/s").value > 0

    ran = cli_run(["study", "run", "t", "--size", "quick"])  # resumable: the cell is stored
    code, out = ran.code, ran.printed
    assert code == 0, out
    assert "0 run(s) to do" in out and f"stored dd-write-64k (#{run.id})" in out
    with ResultStore() as store:
        assert len(store.list_runs()) == 1

    report = tmp_path / "t.md"
    ran = cli_run(["study", "report", "t", "-o", str(report)])
    code, out = ran.code, ran.printed
    assert code == 0, out
    text = Path(report).read_text()
    assert f"- run #{run.id}: profile `virtio-disk`, quick size" in text  # the runs it used are listed
    guest = run.measurement("guest", "dd-write-64k", "MB/s").value
    if run.accelerator == "tcg":
        assert f"{guest:.1f} (emulated" in text  # more qualifiers may follow (quick, loop device)
        assert "inconclusive" in text and "emulat" in text.split("T1", 1)[1]
    else:
        assert f"{guest:.1f}" in text

    # The HTML page parses as XML where it must (its figure), and the figure's bar is the run's % of native.
    page = tmp_path / "t.html"
    ran = cli_run(["study", "report", "t", "-o", str(page)])
    code, out = ran.code, ran.printed
    assert code == 0, out
    html = page.read_text()
    svg = ElementTree.fromstring(html[html.index("<svg"):html.index("</svg>") + len("</svg>")])
    texts = ["".join(t.itertext()) for t in svg.iter("{http://www.w3.org/2000/svg}text")]
    pct = guest / run.measurement("baseline", "dd-write-64k", "MB/s").value * 100.0
    ours = [t for t in texts if t.startswith(f"{pct:.1f} %")]
    assert ours, texts
    assert ("(emulated" in ours[0]) == (run.accelerator == "tcg")  # labelled on the plot as in the table


# The same cell measured as a series: two repeats back to back of two guests at once (study D's instances), no rule.
SERIES = (ONE_CELL.split("[[rules]]")[0].replace('name = "t"', 'name = "s"', 1)
          + "[series.quick]\nevery_minutes = 0\nrepeats = 2\nguests = 2\n")


def test_a_series_runs_detached_then_reports_its_spread(state, libvirt_conn, tmp_path, monkeypatch, cli_run):
    from cloudbox.core.run import runs

    studies = tmp_path / "studies"
    studies.mkdir()
    (studies / "s.toml").write_text(SERIES)
    monkeypatch.setenv("CLOUDBOX_STUDY_DIR", str(studies))

    ran = cli_run(["study", "run", "s", "--size", "quick", "--detach"])
    code, out = ran.code, ran.printed
    assert code == 0, out
    assert "a series of 2 repeats back to back, 2 guests at once" in out and "cloudbox cancel sweep-" in out
    sweep_id = out.split("cloudbox cancel ", 1)[1].split("`", 1)[0]
    assert not runs.wait_until(time.time() + 600, lambda: any(
        s.id == sweep_id and s.state != "running" for s in runs.list_sweeps())), "the series did not end in 600 s"
    with ResultStore() as store:
        done = [store.get_run(r.id) for r in store.list_runs()]
    assert [r.state for r in done] == ["completed", "completed"], [r.reason for r in done]
    # every guest's own figure is a sample: 2 repeats x 2 guests
    each = [[m.value for m in r.instances("guest", "dd-write-64k", "MB/s")] for r in done]
    assert [len(v) for v in each] == [2, 2] and all(x > 0 for v in each for x in v), each
    values = sorted(x for v in each for x in v)

    ran = cli_run(["study", "report", "s"])
    code, out = ran.code, ran.printed
    assert code == 0, out
    row = next(line for line in out.splitlines()
               if line.startswith("| virtio-disk | dd-write-64k | 2 of 2 (quick, 2 guests each)"))
    median = f"{(values[1] + values[2]) / 2:.1f}"
    emulated = done[0].accelerator == "tcg"
    assert f"| {median} (emulated, quick) MB/s |" in row if emulated else f"| {median} (quick) MB/s |" in row
    assert f"{values[0]:.1f} - {values[-1]:.1f}" in row
    assert "virtio-disk dd-write-64k by guest over time (MB/s): g1 median " in out and "Jain's fairness index" in out
    ran = cli_run(["study", "run", "s", "--size", "quick"])  # the series is whole: nothing to do
    code, out = ran.code, ran.printed
    assert code == 0 and "2 of 2 repeats stored" in out and "0 run(s) to do" in out
