"""Study B's two sweeps-in-one-test in a real run (TCG guest, quick size): Bonnie++ on an ext4 made on the benchmark
disk, in the guest and on bare metal on the same backing, then IOzone's file-size sweep on the raw disk; their
figures stored, their progress reported as they ran, and nothing left mounted, attached or written behind."""

from __future__ import annotations

from pathlib import Path

import pytest
from real_runs import leftovers, work_files

from cloudbox.core import paths
from cloudbox.core.bench import bonnie, iozone
from cloudbox.core.record.events import ProgressEvent
from cloudbox.core.record.results import ResultStore
from cloudbox.core.run import runs
from cloudbox.core.run.measure import measured
from cloudbox.core.spec.runspec import RunSpec

pytestmark = [pytest.mark.slow, pytest.mark.root]


def test_bonnie_and_iozones_file_sweep_in_the_guest_and_on_bare_metal(state, libvirt_conn):
    spec = RunSpec(profile="virtio-disk", suite="storage", size="quick", storage_tests="bonnie,iozone-files-16m")
    with ResultStore() as store:
        rid = runs.executor(spec, store).execute()
        run = store.get_run(rid)
        progress = [e.record for e in store.events_since(rid, 0, limit=100_000)
                    if isinstance(e.record, ProgressEvent) and e.record.done]
    assert run.state == "completed", run.reason
    prov = run.provenance.to_stored()
    assert {"bonnie++", "e2fsprogs"} <= set(prov["versions"]["guest_packages"]), prov["versions"]["guest_packages"]
    guest = run.measurement("guest", "bonnie", "MB/s")
    assert guest is not None and guest.value > 0  # block write: seconds under TCG, never too quick to time
    csv_line = next(ln for ln in guest.raw.splitlines() if ln.startswith("1.98,"))
    assert csv_line.startswith("1.98,2.00a,cloudbox-guest,") and "cloudbox-elapsed" in guest.raw
    assert "Delete files in random order...done." in guest.raw  # its phases, read for its progress as it ran
    parsed = bonnie.parse_bonnie("bonnie", guest.raw)
    assert guest.value == pytest.approx(parsed.mbps)
    assert ",96M," in csv_line  # the quick size's 128 MiB disk: a 96 MiB file
    for metric in ("seconds", "write %CPU"):
        m = run.measurement("guest", "bonnie", metric)
        assert m is not None and m.value > 0 and m.value == pytest.approx(parsed.extra[metric]), metric
    # a later pass may be too quick to time ("+++++", e.g. a rewrite from the guest's page cache): then not stored
    csv = next(ln for ln in guest.raw.splitlines() if ln.startswith("1.98,")).split(",")
    for metric, field in (("rewrite MB/s", 13), ("rewrite %CPU", 14), ("read MB/s", 17), ("read %CPU", 18)):
        m, want = run.measurement("guest", "bonnie", metric), parsed.extra[metric]
        if csv[field].startswith("+"):
            assert want is None and m is None, (metric, csv[field], m)
        else:
            assert m is not None and want is not None and m.value == pytest.approx(want), (metric, csv[field])
    if run.emulated:
        assert "emulated" in guest.labels
    # bare metal: the same Bonnie++ on the same backing; what it timed is stored, its run's seconds always
    base = run.measurement("baseline", "bonnie", "seconds")
    assert base is not None and base.value > 0
    rows = [m for m in run.measurements if m.side == "baseline" and m.test == "bonnie"]
    raw = next(m.raw for m in rows if m.raw)
    assert bonnie.bonnie_version(raw) == "2.00a" and ",96M," in raw
    assert {m.metric for m in rows} == {name for name, _ in measured(bonnie.parse_bonnie("bonnie", raw, base.value))}
    # IOzone's sweep: 16 MiB records over files of 16, 32, 64 and 128 MiB (the quick size), each pass on each side
    for side in ("guest", "baseline"):
        rows = {m.metric: m.value for m in run.measurements if m.side == side and m.test == "iozone-files-16m"}
        assert iozone.iozone_file_sizes(rows) == [16384, 32768, 65536, 131072], (side, sorted(rows))
        assert len(rows) == 1 + 4 * 4 and all(v > 0 for v in rows.values()), (side, rows)
        assert rows["MB/s"] == rows["write MB/s, 128 MiB file"]
    # their progress as they ran: Bonnie++'s phases (its seeks alone take seconds: the guest's read every 2 s sees
    # them), IOzone's cells (bare metal's read from the start)
    seen = {(p.side, p.test) for p in progress if p.elapsed is not None}
    assert {("guest", "bonnie"), ("baseline", "bonnie"), ("baseline", "iozone-files-16m")} <= seen, seen
    assert any(p.side == "guest" and p.test == "bonnie" and p.done.startswith("phase ") for p in progress)
    assert all(p.done.startswith(("cell ", "4 of 4 cells")) for p in progress if p.test == "iozone-files-16m")
    # nothing left behind: no mount, no mount point, no loop device, no guest, no file
    assert [ln for ln in Path("/proc/mounts").read_text().splitlines() if "cloudbox-bonnie" in ln] == []
    assert list(paths.run_dir().glob("cloudbox-bonnie-*")) == []
    assert leftovers(libvirt_conn, state) == {"guests": [], "bridge": False, "netns": False, "loops": []}
    assert work_files(state) == []
