"""Fixture data for the results-store tests, modelled on Study A (docs/studies.md, Tables 1 and 2).

Imported by test_results.py, test_compare.py and test_cli_results.py (not a pytest conftest).

Run "default": KVM on real hardware, emulated SCSI (LSI) over a sparse file: write collapses to
1.3 MB/s (30-sector requests, queue 0.9, 90% util) against a 111 MB/s bare-metal disk; reads 71.9.
Run "virtio": virtio on the whole disk but measured under TCG (so emulated): guest 55.0 MB/s against
110.0 MB/s measured bare-metal in the same run, i.e. exactly 50.0 %.
"""

from __future__ import annotations

from pathlib import Path

from cloudbox.core.record.provenance import BackingInfo, Provenance, Versions
from cloudbox.core.record.results import ResultStore

DOMAIN_XML_SCSI_SPARSE = """\
<domain type='kvm'>
  <name>cloudbox-bench</name>
  <devices>
    <controller type='scsi' index='0' model='lsilogic'/>
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw' cache='none'/>
      <source file='/var/lib/cloudbox/backing/bench.img'/>
      <target dev='sda' bus='scsi'/>
      <address type='drive' controller='0' bus='0' target='0' unit='0'/>
    </disk>
    <interface type='bridge'>
      <source bridge='cbbr0'/>
      <model type='e1000'/>
    </interface>
  </devices>
</domain>
"""

# Profiles in the schema of cloudbox.core.spec.profiles ([guest], [disk], [network]).
PROFILE_DEFAULT = """\
name = "study-a-default"
description = "Study A's KVM default: emulated SCSI over a sparse file"
[guest]
hypervisor = "kvm"
[disk]
bus = "scsi-lsi"
cache = "writethrough"
backing = "sparse-file"
[network]
model = "e1000"
mtu = 9000
"""

PROFILE_VIRTIO_PHY = """\
name = "virtio-phy"
[guest]
hypervisor = "kvm"
[disk]
bus = "virtio-blk"
cache = "none"
io = "native"
backing = "block-device"
volume = "/dev/sdb"
[network]
model = "virtio"
vhost = true
mtu = 9000
"""

FIO_JSON = {"fio version": "fio-3.33", "jobs": [{"jobname": "seq-write-64k", "write": {"bw": 1331}}]}


def _prov(**extra: object) -> Provenance:
    return Provenance(
        host_kernel="6.1.0-28-amd64", guest_kernel="6.12.9-amd64",
        versions=Versions(qemu="7.2.15", libvirt="9.0.0", fio="3.33", netperf="2.7.0", iperf3="3.12",
                          cloudbox="0.1.0"),
        **extra)


def add_study_a_default(store: ResultStore, started_at: float = 1_700_000_000.0, node: str = "node1",
                        write_baseline: float = 111.0) -> int:
    """KVM, SCSI over a sparse file (Study A's default row), its bare metal writing `write_baseline` MB/s in
    seq-write-64k. Returns the run id."""
    rid = store.create_run(
        profile_name="study-a-default", profile_hash="a1b2c3d4e5f6a7b8", profile_toml=PROFILE_DEFAULT,
        suite="all", size_bytes=20 * 2**30, size_label="study", accelerator="kvm", node=node,
        started_at=started_at,
        provenance=_prov(
            domain_xml=DOMAIN_XML_SCSI_SPARSE,
            backing=BackingInfo(kind="sparse-file", path="/var/lib/cloudbox/backing/bench.img", device="sdb",
                                model="WDC WD5003ABYX", size_bytes=20 * 2**30),
        ),
    )
    m = store.add_measurement
    # Table 1 (write) and Table 2 (read), 64 kB requests: baseline, then guest.
    for test in ("seq-write-64k", "dd-write-64k"):
        m(rid, side="baseline", test=test, metric="MB/s", value=write_baseline if test == "seq-write-64k" else 111.0,
          host_mbps=111.0,
          host_avgrq_sectors=1024, host_avgqu=140, host_util=100)
        m(rid, side="guest", test=test, metric="MB/s", value=1.3, host_mbps=1.3,
          host_avgrq_sectors=30, host_avgqu=0.9, host_util=90, raw=FIO_JSON)
    for test in ("seq-read-64k", "dd-read-64k"):
        m(rid, side="baseline", test=test, metric="MB/s", value=108.0, host_mbps=108.0,
          host_avgrq_sectors=512, host_avgqu=0.94, host_util=96)
        m(rid, side="guest", test=test, metric="MB/s", value=71.9, host_mbps=72.0,
          host_avgrq_sectors=256, host_avgqu=0.6, host_util=66)
    m(rid, side="baseline", test="randread-4k-qd32", metric="IOPS", value=180.0, host_avgqu=31.5,
      host_util=100)
    m(rid, side="guest", test="randread-4k-qd32", metric="IOPS", value=150.0, host_avgqu=20.0, host_util=99)
    # Network: default configuration kept 71 % (transmit) and 45 % (receive) of 940 Mb/s.
    m(rid, side="baseline", test="tcp-stream", metric="Mbit/s", value=940.0, raw="TCP STREAM TEST ... 940.12")
    m(rid, side="guest", test="tcp-stream", metric="Mbit/s", value=667.4)
    m(rid, side="baseline", test="tcp-maerts", metric="Mbit/s", value=940.0)
    m(rid, side="guest", test="tcp-maerts", metric="Mbit/s", value=423.0)
    m(rid, side="baseline", test="tcp-rr", metric="trans/s", value=9800.0)
    m(rid, side="guest", test="tcp-rr", metric="trans/s", value=4900.0)
    store.add_samples(rid, [
        {"t": started_at + i, "device": "sdb", "test": "seq-write-64k", "read_mbps": 0.0, "write_mbps": 1.3,
         "avgrq_sectors": 30.0, "avgqu": 0.9, "util": 90.0}
        for i in range(5)
    ])
    store.finish_run(rid, "completed")
    return rid


def add_virtio_tcg(store: ResultStore, started_at: float = 1_700_003_600.0, node: str = "node1") -> int:
    """virtio on the whole disk, measured under TCG (emulated): 55.0 of 110.0 MB/s = 50.0 %."""
    rid = store.create_run(
        profile_name="virtio-phy", profile_hash="0f1e2d3c4b5a6978", profile_toml=PROFILE_VIRTIO_PHY,
        suite="storage", size_bytes=2 * 2**30, size_label="quick", accelerator="tcg", node=node,
        started_at=started_at,
        provenance=_prov(
            backing=BackingInfo(kind="block-device", path="/dev/sdb", device="sdb", model="WDC WD5003ABYX",
                                size_bytes=500 * 10**9),
        ),
    )
    m = store.add_measurement
    m(rid, side="baseline", test="seq-write-64k", metric="MB/s", value=110.0, host_mbps=110.0,
      host_avgrq_sectors=1024, host_avgqu=140, host_util=100)
    m(rid, side="guest", test="seq-write-64k", metric="MB/s", value=55.0, host_mbps=55.0,
      host_avgrq_sectors=1024, host_avgqu=60, host_util=100, labels=["quick-size"])
    m(rid, side="baseline", test="seq-read-64k", metric="MB/s", value=108.0, host_mbps=108.0,
      host_avgrq_sectors=512, host_avgqu=0.94, host_util=96)
    m(rid, side="guest", test="seq-read-64k", metric="MB/s", value=76.2, host_mbps=76.2,
      host_avgrq_sectors=512, host_avgqu=0.5, host_util=57, labels=["quick-size"])
    store.finish_run(rid, "completed")
    return rid


def study_a_store(path: Path) -> tuple[ResultStore, int, int]:
    """A store at `path` holding both runs: (store, default_run_id, virtio_tcg_run_id)."""
    store = ResultStore(path)
    return store, add_study_a_default(store), add_virtio_tcg(store)


# A run of virtio over a whole disk on KVM whose tests were repeated, guest and bare metal alternating (ABAB), the
# way `--repeats` stores them: seq-write-64k 8 times a side (a steady guest near 96% of bare metal), seq-read-64k 8
# times with a guest whose page cache sometimes holds the file (CV over 10%: flagged), tcp-stream 3 times a side
# (too few for a median's interval; the ratio's is the range of its pairs, 90%).
REPEATED_WRITE_GUEST = (74.2, 71.0, 76.9, 73.5, 75.8, 72.4, 74.9, 73.1)
REPEATED_WRITE_BARE = (77.0, 76.1, 78.3, 76.8, 77.5, 75.9, 78.0, 77.2)
REPEATED_READ_GUEST = (70.0, 95.0, 68.5, 99.0, 71.2, 69.8, 97.5, 70.4)
REPEATED_READ_BARE = (108.0, 107.5, 108.4, 107.9, 108.8, 107.1, 108.2, 108.1)
REPEATED_TCP_GUEST = (900.0, 912.0, 905.0)
REPEATED_TCP_BARE = (940.0, 938.0, 941.0)


def add_repeated_virtio(store: ResultStore, started_at: float = 1_700_007_200.0, node: str = "node1") -> int:
    """The repeated run above, stored sample by sample through the store (each side's repeat k in the order it was
    measured: bare metal, then guest); returns its id."""
    rid = store.create_run(
        profile_name="virtio-phy", profile_hash="0f1e2d3c4b5a6978", profile_toml=PROFILE_VIRTIO_PHY,
        suite="all", size_bytes=20 * 2**30, size_label="study", accelerator="kvm", node=node, started_at=started_at,
        provenance=_prov(backing=BackingInfo(kind="block-device", path="/dev/sdb", device="sdb",
                                             model="WDC WD5003ABYX", size_bytes=500 * 10**9)),
    )
    m = store.add_measurement
    t = started_at
    for test, metric, guest, bare in (("seq-write-64k", "MB/s", REPEATED_WRITE_GUEST, REPEATED_WRITE_BARE),
                                      ("seq-read-64k", "MB/s", REPEATED_READ_GUEST, REPEATED_READ_BARE),
                                      ("tcp-stream", "Mbit/s", REPEATED_TCP_GUEST, REPEATED_TCP_BARE)):
        storage = metric == "MB/s"
        for k, (g, b) in enumerate(zip(guest, bare, strict=True), 1):
            host_b = {"host_mbps": b, "host_avgrq_sectors": 128.0, "host_avgqu": 1.0 + k / 10, "host_util": 100.0}
            host_g = {"host_mbps": g, "host_avgrq_sectors": 128.0, "host_avgqu": 0.9, "host_util": 90.0 + k}
            m(rid, side="baseline", test=test, metric=metric, value=b, repeat=k, boot=1, iteration=k,
              started_at=t, finished_at=t + 10, **(host_b if storage else {}))
            m(rid, side="guest", test=test, metric=metric, value=g, repeat=k, boot=1, iteration=k,
              started_at=t + 10, finished_at=t + 20, **(host_g if storage else {}))
            t += 20
    store.finish_run(rid, "completed")
    return rid
