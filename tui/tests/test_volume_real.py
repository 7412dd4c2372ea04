"""A real quick storage run over a network volume: NBD with TLS attached by QEMU's own client (disk.attach = qemu),
under libvirt and QEMU (TCG here); the baseline is the same export from the host domain (fio's nbd engine)."""

from __future__ import annotations

import subprocess

import pytest
from real_runs import interrupt_cli_run, work_files
from run_trouble import warn_run_trouble

from cloudbox.core import runs
from cloudbox.core.compare import compare_table, to_text
from cloudbox.core.results import ResultStore
from cloudbox.core.runspec import RunSpec
from cloudbox.core.volumes.store import VolumeStore

pytestmark = [pytest.mark.slow, pytest.mark.root]


def test_quick_storage_run_over_nbd_attached_by_qemu(state, libvirt_conn):
    with VolumeStore() as vs:
        vol = vs.create("ebs", 160 * 1024 * 1024)
    spec = RunSpec(profile="kvm-ebs-nbd", suite="storage", size="quick", storage_tests="smoke", runtime=3)
    with ResultStore() as store:
        rid = runs.executor(spec, store).execute()
    with ResultStore() as store:
        run = store.get_run(rid)
        evs = store.events_since(rid, 0)
    assert run.state == "completed", run.reason
    prov = run.provenance
    assert prov.volume is not None
    assert (prov.volume.scheme, prov.volume.attach, prov.volume.name) == ("nbd", "qemu", "ebs")
    assert prov.volume.server.startswith("qemu-nbd") and "x509" in prov.volume.tls
    assert prov.domain_xml and "protocol='nbd'" in prov.domain_xml and "tls='yes'" in prov.domain_xml
    for side in ("guest", "baseline"):
        for test in ("seq-write-64k", "seq-read-64k", "randread-4k-qd32"):
            m = run.measurement(side, test, "MB/s")
            assert m is not None and m.value > 0, (side, test)
            assert ("volume-from-host" in m.labels) == (side == "baseline")
    text = to_text(compare_table([run]))
    assert "EBS (NBD)" in text and "host domain" in text and "QEMU's NBD" in text
    warn_run_trouble(evs)
    # the export went with the run: no qemu-nbd on the volume, the volume free again, no work files
    assert subprocess.run(["pgrep", "-f", f"qemu-nbd .*{vol.path}"], capture_output=True).returncode == 1
    with VolumeStore() as vs:
        assert vs.get("ebs").attached_run is None
    work = state / "state" / "work"
    assert not work.exists() or not any(work.rglob("*"))


@pytest.mark.full  # 46 s under TCG here: over the slow tier's 45 s, so make test-full
def test_ctrl_c_with_the_guest_on_the_volume_leaves_no_export(state, libvirt_conn):
    """SIGINT while the guest's QEMU holds the export: the run is aborted, the guest, the export and the attachment
    are gone, the volume is free for the next run."""
    from cloudbox.core.guest import list_guests

    with VolumeStore() as vs:
        vol = vs.create("ebs", 160 * 1024 * 1024)
    def exported() -> None:
        assert subprocess.run(["pgrep", "-f", f"qemu-nbd .*{vol.path}"], capture_output=True).returncode == 0

    got = interrupt_cli_run(["--profile", "kvm-ebs-nbd", "--suite", "storage", "--size", "64M",
                             "--tests", "standard", "--runtime", "30"], while_running=exported)
    assert got.returncode == 1, got.output
    assert got.run.state == "aborted" and "SIGINT" in (got.run.reason or ""), got.run.reason
    assert [g.name for g in list_guests(libvirt_conn) if "kvm-ebs-nbd" in g.name] == []
    assert subprocess.run(["pgrep", "-f", f"qemu-nbd .*{vol.path}"], capture_output=True).returncode == 1
    with VolumeStore() as vs:
        assert vs.get("ebs").attached_run is None
    assert work_files(state) == []
