"""Comparison views: Study A's Table 1/2 layout, % of the same run's baseline, emulated markers."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from conftest_results import PROFILE_DEFAULT, add_study_a_default, study_a_store

from cloudbox.core.record.provenance import BackingInfo, PrivateNetwork, Provenance
from cloudbox.core.record.results import ResultStore
from cloudbox.core.record.rows import Run
from cloudbox.core.spec import catalogue
from cloudbox.core.views import compare, labels, render


@pytest.fixture
def runs(tmp_path: Path) -> list[Run]:
    store, default, virtio = study_a_store(tmp_path / "results.db")
    with store:
        return [store.get_run(default), store.get_run(virtio)]


def _row(table: compare.Table, test: str, run_id: int, kind: str = "guest") -> compare.Row:
    section = table.section(test)
    assert section is not None, test
    matches = [r for r in section.rows if r.kind == kind and run_id in r.run_ids]
    assert len(matches) == 1, (test, run_id, kind)
    return matches[0]


def test_percent_of_baseline_uses_the_same_run(runs: list[Run]):
    default, virtio = runs
    table = compare.compare_table(runs)
    row = _row(table, "seq-write-64k", virtio.id)
    assert row.cells["value"] == 55.0
    assert row.cells["pct"] == pytest.approx(50.0)  # 55 of this run's 110, not of the other run's 111
    assert _row(table, "seq-write-64k", default.id).cells["pct"] == pytest.approx(1.3 / 111 * 100)
    assert _row(table, "seq-read-64k", virtio.id).cells["pct"] == pytest.approx(76.2 / 108 * 100)
    assert compare.percent_of_baseline(virtio, "seq-write-64k", "MB/s") == pytest.approx(50.0)
    assert compare.percent_of_baseline(virtio, "tcp-stream", "Mbit/s") is None


def test_layout_follows_study_a_tables(runs: list[Run]):
    default, virtio = runs
    table = compare.compare_table(runs)
    assert [s.test for s in table.sections] == [
        "seq-write-64k", "dd-write-64k", "seq-read-64k", "dd-read-64k", "randread-4k-qd32",
        "tcp-stream", "tcp-maerts", "tcp-rr",
    ]
    sw = table.section("seq-write-64k")
    assert sw is not None and sw.metric == "MB/s"
    assert [c.title for c in sw.columns] == [
        "run", "VMM", "target", "driver", "MB/s", "% of bare metal", "avgrq (sectors)", "avgqu", "util %",
    ]
    # per target group: the bare-metal row ("none", target, "-") then the run's row
    rows = [(r.kind, r.cells["vmm"], r.cells["target"], r.cells["driver"], r.cells["value"]) for r in sw.rows]
    assert rows == [
        ("baseline", "none", "local file", "-", 111.0),
        ("guest", "KVM", "local file", "scsi-lsi, sparse file", 1.3),
        ("baseline", "none", "local disk", "-", 110.0),
        ("guest", "KVM (TCG, emulated)", "local disk", "virtio-blk, phy", 55.0),
    ]
    base = sw.rows[0].cells
    assert (base["avgrq"], base["avgqu"], base["util"]) == (1024, 140, 100)
    assert (sw.rows[1].cells["avgrq"], sw.rows[1].cells["avgqu"], sw.rows[1].cells["util"]) == (30, 0.9, 90)
    assert table.section("randread-4k-qd32").metric == "IOPS"  # type: ignore[union-attr]
    rr = table.section("tcp-rr")
    assert rr is not None and rr.metric == "trans/s"
    assert [c.title for c in rr.columns][-2:] == ["trans/s", "% of baseline"]
    stream = _row(table, "tcp-stream", default.id)
    assert stream.cells["pct"] == pytest.approx(667.4 / 940 * 100)
    assert stream.cells["driver"] == "e1000, MTU 9000"  # from the profile's [network]


def test_test_order_writes_then_reads_64k_first():
    names = ["tcp-rr", "seq-read-1m", "randread-4k-qd1", "seq-write-64k-buffered", "seq-read-64k",
             "dd-write-64k", "seq-write-1m", "randwrite-4k-qd32", "iperf3-tx", "seq-write-64k", "weird"]
    assert sorted(names, key=catalogue.test_sort_key) == [
        "seq-write-64k", "seq-write-64k-buffered", "dd-write-64k", "seq-write-1m", "randwrite-4k-qd32",
        "seq-read-64k", "seq-read-1m", "randread-4k-qd1", "weird", "tcp-rr", "iperf3-tx",
    ]
    assert "page cache" in catalogue.test_title("seq-read-64k-buffered")
    assert "O_DIRECT" in catalogue.test_title("seq-read-64k")


def test_emulated_marker_and_footnote_in_every_rendering(runs: list[Run]):
    default, virtio = runs
    table = compare.compare_table(runs)
    row = _row(table, "seq-write-64k", virtio.id)
    assert row.emulated and labels.EMULATED_MARK in row.markers
    assert not _row(table, "seq-write-64k", default.id).emulated
    assert labels.EMULATED_NOTE in table.footnotes

    text = render.to_text(table)
    assert "KVM (TCG, emulated) *" in " ".join(text.split()) or "emulated) *" in text
    assert "* measured under TCG emulation: not an overhead figure" in text
    assert "50.0%" in text and "1.2%" in text

    md = render.to_markdown(table)
    assert "KVM (TCG, emulated) \\*" in md
    assert "\\* measured under TCG emulation: not an overhead figure" in md
    assert "| none | local disk | \\- |" in md or "| none | local disk | - |" in md

    rows = list(csv.DictReader(io.StringIO(render.to_csv(table))))
    sw = [r for r in rows if r["test"] == "seq-write-64k"]
    emu = [r for r in sw if r["run"] == f"#{virtio.id}" and r["row"] == "guest"]
    assert len(emu) == 1
    assert emu[0]["emulated"] == "yes" and emu[0]["marker"].startswith("*")
    assert "measured under TCG emulation: not an overhead figure" in emu[0]["note"]
    assert emu[0]["pct_of_baseline"] == "50.0" and emu[0]["value"] == "55.0"
    kvm = [r for r in sw if r["run"] == f"#{default.id}" and r["row"] == "guest"]
    assert kvm[0]["emulated"] == "no" and kvm[0]["marker"] == "" and kvm[0]["note"] == ""
    base = [r for r in rows if r["test"] == "seq-write-64k" and r["row"] == "baseline"]
    assert [b["vmm"] for b in base] == ["none", "none"] and base[0]["pct_of_baseline"] == ""


def test_caveat_labels_get_their_own_marker(runs: list[Run]):
    table = compare.compare_table(runs)
    row = _row(table, "seq-write-64k", runs[1].id)
    assert row.marker == "*+"
    assert any(n.startswith(f"+ caveats: #{runs[1].id}: quick-size") for n in table.footnotes)


def test_text_fits_80_columns(runs: list[Run]):
    text = render.to_text(compare.compare_table(runs))
    assert max(len(line) for line in text.splitlines()) <= 80
    narrow = render.to_text(compare.compare_table(runs), width=70)
    assert max(len(line) for line in narrow.splitlines()) <= 70
    assert "emulated)" in narrow  # wrapped, not lost


def test_shared_baseline_row_is_a_marked_mean(tmp_path: Path):
    with ResultStore(tmp_path / "r.db") as store:
        a = add_study_a_default(store, started_at=1_700_000_000.0)
        b = add_study_a_default(store, started_at=1_700_100_000.0, write_baseline=109.0)
        runs = [store.get_run(a), store.get_run(b)]
    table = compare.compare_table(runs)
    sw = table.section("seq-write-64k")
    assert sw is not None
    assert [r.kind for r in sw.rows] == ["baseline", "guest", "guest"]
    base = sw.rows[0]
    assert base.run_ids == [a, b] and base.cells["value"] == pytest.approx(110.0)
    assert base.marker == labels.MEAN_BASELINE_MARK
    assert any("each run's % uses its own baseline" in n for n in table.footnotes)
    assert _row(table, "seq-write-64k", b).cells["pct"] == pytest.approx(1.3 / 109 * 100)


def test_labels_from_the_profile_and_the_backing_store_used():
    def run(provenance: Provenance | None = None, **kw) -> Run:
        base = dict(id=1, uuid="u", profile_name=None, profile_hash=None, profile_toml=None, suite="storage",
                    size_bytes=None, size_label=None, state="completed", reason=None, accelerator="kvm",
                    emulated=False, node="n", pid=None, started_at=None, finished_at=None)
        base.update(kw)
        return Run(**base, provenance=provenance or Provenance())  # type: ignore[arg-type]

    sparse = BackingInfo(kind="sparse-file", path="/var/lib/cloudbox/backing/bench.img")
    r = run(Provenance(backing=sparse), profile_toml=PROFILE_DEFAULT)
    assert (labels.vmm_label(r), labels.target_label(r), labels.driver_label(r)) == (
        "KVM", "local file", "scsi-lsi, sparse file")
    assert labels.nic_label(r) == "e1000, MTU 9000"
    # The backing store the run used, over the one its profile asked for (they agree on every run so far).
    r = run(Provenance(backing=BackingInfo(kind="prealloc-file")), accelerator="xen",
            profile_toml='[guest]\nhypervisor = "xen"\n[disk]\nbus = "xen-vbd"\nbacking = "sparse-file"\n')
    assert (labels.vmm_label(r), labels.driver_label(r)) == ("Xen (PV)", "xvd, pre-allocated file")
    r = run(Provenance(backing=BackingInfo(kind="network-volume")), accelerator="nested-kvm", emulated=True,
            profile_toml='[guest]\nhypervisor = "kvm"\n[disk]\nbus = "virtio-scsi"\n'
                         'backing = "network-volume"\nvolume = "aoe:e0.1"\n'
                         '[network]\nmodel = "virtio"\nvhost = true\n')
    assert labels.vmm_label(r) == "KVM (nested, emulated)"
    assert (labels.target_label(r), labels.driver_label(r)) == ("EBS (AoE)", "virtio-scsi, phy")
    assert labels.nic_label(r) == "virtio-net (vhost)"
    # A run on a back-end with network tests: its private network in provenance, under the key it had before
    # (old rows) and under its own key now; the NIC's knobs still come from the profile, vhost included.
    private = {"bridge": "cbpriv0", "peer": "10.73.0.1", "host_ip": "10.73.0.17", "guest_ip": "10.73.0.101",
               "mtu": 9000}
    toml = '[guest]\nhypervisor = "kvm"\n[network]\nmodel = "virtio"\nvhost = true\nmtu = 9000\n'
    for stored in ({"network": private}, {"private_network": private}):
        prov = Provenance.from_stored(stored)
        assert prov.private_network == PrivateNetwork(**private), stored
        assert labels.nic_label(run(prov, profile_toml=toml)) == "virtio-net (vhost), MTU 9000", stored
    r = run(accelerator="xen", profile_toml='[guest]\nhypervisor = "xen"\n[disk]\nbus = "xen-vbd"\n'
            'backing = "prealloc-file"\n')
    assert (labels.vmm_label(r), labels.target_label(r), labels.driver_label(r)) == (
        "Xen (PV)", "local file", "xvd, pre-allocated file")
    r = run(accelerator="xen", emulated=True, profile_toml='[guest]\nhypervisor = "xen"\n[disk]\nbus = "scsi-lsi"\n')
    assert labels.vmm_label(r) == "Xen (HVM, emulated)"
    r = run(accelerator="xen", profile_toml='[guest]\nhypervisor = "xen"\nxen_type = "pvh"\n[disk]\nbus = "xen-vbd"\n')
    assert labels.vmm_label(r) == "Xen (PVH)"  # the stated guest type, not the one the bus implies
    assert labels.driver_label(run()) == "?, ?"
    assert labels.driver_label(run(profile_toml="not [toml")) == "?, ?"


def test_a_xen_run_has_its_dom0_baseline_beside_a_kvm_run(tmp_path: Path):
    """Xen's baseline is dom0 (Study A's driver domain): its own row, named so, never averaged with KVM's bare metal."""
    xen_toml = '[guest]\nhypervisor = "xen"\n[disk]\nbus = "xen-vbd"\nbacking = "block-device"\n'
    kvm_toml = '[guest]\nhypervisor = "kvm"\n[disk]\nbus = "virtio-blk"\nbacking = "block-device"\n'
    with ResultStore(tmp_path / "r.db") as store:
        ids = []
        for acc, toml, base, guest, host in (("xen", xen_toml, 100.0, 50.0, ["dom0", "virtualized-host"]),
                                             ("tcg", kvm_toml, 120.0, 30.0, ["virtualized-host"])):
            rid = store.create_run(accelerator=acc, emulated=True, profile_toml=toml,
                                   provenance=Provenance(backing=BackingInfo(kind="block-device")))
            store.add_measurement(rid, side="baseline", test="seq-write-64k", metric="MB/s", value=base, labels=host)
            store.add_measurement(rid, side="guest", test="seq-write-64k", metric="MB/s", value=guest,
                                  labels=["emulated"])
            ids.append(rid)
        runs = [store.get_run(i) for i in ids]
    sw = compare.compare_table(runs).section("seq-write-64k")
    assert sw is not None
    rows = [(r.kind, r.cells["vmm"], r.cells["value"], r.cells["pct"]) for r in sw.rows]
    assert rows == [("baseline", "dom0", 100.0, None), ("guest", "Xen (PV, emulated)", 50.0, pytest.approx(50.0)),
                    ("baseline", "none", 120.0, None), ("guest", "KVM (TCG, emulated)", 30.0, pytest.approx(25.0))]
    assert "dom0" in sw.rows[0].labels


def test_missing_baseline_shows_a_dash(tmp_path: Path):
    with ResultStore(tmp_path / "r.db") as store:
        rid = store.create_run(accelerator="kvm", provenance=Provenance(backing=BackingInfo(kind="block-device")))
        store.add_measurement(rid, side="guest", test="seq-write-1m", metric="MB/s", value=87.0)
        run = store.get_run(rid)
    table = compare.compare_table([run])
    sw = table.section("seq-write-1m")
    assert sw is not None and [r.kind for r in sw.rows] == ["guest"]
    assert sw.rows[0].cells["pct"] is None
    assert table.footnotes == [labels.ONCE_NOTE]  # measured once: no interval, said once
    line = [x for x in render.to_text(table).splitlines() if x.startswith("#")][0]
    assert line.split()[-4:] == ["-", "-", "-", "-"]
    assert render.to_text(compare.compare_table([])).strip().endswith("(no measurements)")


def test_to_json_has_provenance_and_raw_on_request(runs: list[Run]):
    doc = json.loads(render.to_json(runs))
    assert doc["format"] == "cloudbox-results" and doc["version"] == 1
    assert [r["id"] for r in doc["runs"]] == [r.id for r in runs]
    first = doc["runs"][0]
    assert first["provenance"]["backing"]["kind"] == "sparse-file"
    assert first["provenance"]["versions"]["qemu"] == "7.2.15"
    assert first["profile_toml"].startswith('name = "study-a-default"')
    assert all("raw" not in m for m in first["measurements"])
    assert doc["runs"][1]["emulated"] is True and doc["runs"][1]["summary"]["seq_write_pct"] == 50.0
    with_raw = json.loads(render.to_json(runs, raw=True))
    raws = [m["raw"] for m in with_raw["runs"][0]["measurements"] if m["raw"]]
    assert any(json.loads(r)["fio version"] == "fio-3.33" for r in raws if r.startswith("{"))


def test_run_summary(runs: list[Run]):
    default, virtio = runs
    s = compare.run_summary(virtio)
    assert s["seq_write_test"] == "seq-write-64k"
    assert (s["seq_write_mbps"], s["seq_write_pct"]) == (55.0, 50.0)
    assert s["seq_read_mbps"] == 76.2 and s["seq_read_pct"] == pytest.approx(70.56, abs=0.01)
    assert s["tcp_stream_mbits"] is None and s["emulated"] is True
    assert s["vmm"] == "KVM (TCG, emulated)"
    d = compare.run_summary(default)
    assert d["tcp_stream_mbits"] == 667.4 and d["tcp_stream_pct"] == pytest.approx(71.0, abs=0.1)
    assert d["emulated"] is False and d["state"] == "completed"
