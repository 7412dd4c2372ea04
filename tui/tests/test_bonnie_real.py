"""Study B's two sweeps-in-one-test in a real run (TCG guest, quick size): Bonnie++ on an ext4 made on the benchmark
disk, in the guest and on bare metal on the same backing, then IOzone's file-size sweep on the raw disk; their
figures stored, and nothing left mounted, attached or written behind."""

from __future__ import annotations

from pathlib import Path

import pytest
from real_runs import leftovers, work_files

from cloudbox.core import paths
from cloudbox.core.bench import bonnie, iozone
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
    assert run.state == "completed", run.reason
    prov = run.provenance.to_stored()
    assert {"bonnie++", "e2fsprogs"} <= set(prov["versions"]["guest_packages"]), prov["versions"]["guest_packages"]
    guest = run.measurement("guest", "bonnie", "MB/s")
    assert guest is not None and guest.value > 0  # block write: seconds under TCG, never too quick to time
    assert guest.raw.startswith("1.98,2.00a,cloudbox-guest,") and "cloudbox-elapsed" in guest.raw
    parsed = bonnie.parse_bonnie("bonnie", guest.raw)
    assert guest.value == pytest.approx(parsed.mbps)
    assert ",96M," in guest.raw.splitlines()[0]  # the quick size's 128 MiB disk: a 96 MiB file
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
    assert raw.startswith("1.98,2.00a,") and ",96M," in raw
    assert {m.metric for m in rows} == {name for name, _ in measured(bonnie.parse_bonnie("bonnie", raw, base.value))}
    # IOzone's sweep: 16 MiB records over files of 16, 32, 64 and 128 MiB (the quick size), each pass on each side
    for side in ("guest", "baseline"):
        rows = {m.metric: m.value for m in run.measurements if m.side == side and m.test == "iozone-files-16m"}
        assert iozone.iozone_file_sizes(rows) == [16384, 32768, 65536, 131072], (side, sorted(rows))
        assert len(rows) == 1 + 4 * 4 and all(v > 0 for v in rows.values()), (side, rows)
        assert rows["MB/s"] == rows["write MB/s, 128 MiB file"]
    # nothing left behind: no mount, no mount point, no loop device, no guest, no file
    assert [ln for ln in Path("/proc/mounts").read_text().splitlines() if "cloudbox-bonnie" in ln] == []
    assert list(paths.run_dir().glob("cloudbox-bonnie-*")) == []
    assert leftovers(libvirt_conn, state) == {"guests": [], "bridge": False, "netns": False, "loops": []}
    assert work_files(state) == []
