"""Parsers of tool output (fio status lines and JSON, GNU and busybox dd, netperf, iperf3) on real captured output,
and the storage test catalogue's rules."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from cloudbox.core.bench import dd, fio, nettests, runners
from cloudbox.core.errors import CloudboxError
from cloudbox.core.spec import catalogue

DATA = Path(__file__).parent / "data"


def test_fio_status_lines():
    line = "Jobs: 1 (f=1), 0B/s-20.0MiB/s: [W(1)][45.0%][w=20.0MiB/s][w=320 IOPS][eta 00m:05s]"
    assert fio.parse_eta(line) == {"pct": 45.0, "mbps": 20.97, "eta": "00m:05s"}
    mixed = "Jobs: 1 (f=1): [m(1)][80.0%][r=10.0MiB/s,w=5000KiB/s][r=2560,w=1250 IOPS][eta 00m:01s]"
    assert fio.parse_eta(mixed)["mbps"] == pytest.approx(10.49 + 5.12, abs=0.01)
    assert fio.parse_eta("Jobs: 1 (f=1): [W(1)][-.-%][w=20.0MiB/s][w=320 IOPS][eta 00m:00s]")["pct"] == 0.0
    assert fio.parse_eta("fio-3.33") is None


def test_fio_json_captured():
    text = (DATA / "fio-seq-write-64k.json").read_text()
    r = fio.parse_fio("seq-write-64k", "some banner\n" + text)
    bw = json.loads(text)["jobs"][0]["write"]["bw_bytes"]
    assert r.mbps == pytest.approx(bw / 1e6) and r.mbps > 0 and r.iops > 0 and r.lat_us > 0


def test_fio_client_json_gives_each_server_and_fios_own_aggregate():
    """fio 3.33 --client against two fio --server on this host (captured): the servers' status lines first, then
    client_stats with a job per server and fio's "All clients" (all bytes over the longest job, not the sum)."""
    text = (DATA / "fio-clients-2-servers.txt").read_text()
    assert text.startswith("<")  # each server's own lines, named by its host, before the JSON
    total, each = fio.parse_fio_clients("fiocs-seq-write-64k", text, ["127.0.0.1", "127.0.0.2"])
    stats = json.loads(text[text.index("\n{") + 1:])["client_stats"]
    by_host = {c["hostname"]: c["write"]["bw_bytes"] / 1e6 for c in stats if c["jobname"] != "All clients"}
    assert [r.mbps for r in each] == [pytest.approx(by_host["127.0.0.1"]), pytest.approx(by_host["127.0.0.2"])]
    assert 0 < total.mbps < sum(r.mbps for r in each)  # fio's aggregate: the bytes over the longest runtime
    assert total.raw.startswith("{") and each[0].raw == ""
    _, swapped = fio.parse_fio_clients("fiocs-seq-write-64k", text, ["127.0.0.2", "127.0.0.1"])  # given order
    assert [r.mbps for r in swapped] == [r.mbps for r in reversed(each)]
    # without fio's aggregate (left out in one run in three here) the same sum is made here
    doc = json.loads(text[text.index("\n{") + 1:])
    doc["client_stats"] = [c for c in doc["client_stats"] if c["jobname"] != "All clients"]
    made, _ = fio.parse_fio_clients("fiocs-seq-write-64k", json.dumps(doc), ["127.0.0.1", "127.0.0.2"])
    assert made.mbps == pytest.approx(total.mbps, rel=0.001)
    with pytest.raises(CloudboxError, match=r"reported servers 127.0.0.1, 127.0.0.2; expected 127.0.0.1, 10.0.0.9"):
        fio.parse_fio_clients("fiocs-seq-write-64k", text, ["127.0.0.1", "10.0.0.9"])
    with pytest.raises(CloudboxError, match="printed no client_stats"):
        fio.parse_fio_clients("fiocs-seq-write-64k", "fio: connect: Connection refused", ["127.0.0.1"])


def test_a_fio_job_file_holds_the_tests_options_and_no_output_settings():
    job = fio.fio_job_file(catalogue.TESTS["fiocs-seq-write-64k"], "/dev/vda", 16 << 20, 5)
    lines = job.splitlines()
    assert lines[0] == "[fiocs-seq-write-64k]" and "filename=/dev/vda" in lines and "rw=write" in lines
    assert "bs=64k" in lines and "direct=1" in lines and f"size={16 << 20}" in lines
    assert not any(x.startswith(("output-format", "eta", "name=")) for x in lines)


def test_fio_errors_are_clear():
    with pytest.raises(CloudboxError, match="printed no JSON"):
        fio.parse_fio("seq-read-64k", "fio: pid=0, err=2/file:filesetup.c")
    with pytest.raises(CloudboxError, match="invalid JSON"):
        fio.parse_fio("seq-read-64k", "{not json")


def test_dd_gnu_and_busybox():
    gnu = subprocess.run(["dd", "if=/dev/zero", "of=/dev/null", "bs=64k", "count=64"], capture_output=True,
                         text=True).stderr
    assert dd.parse_dd("dd-read-64k", gnu).mbps > 0
    bb = subprocess.run(["sh", "-c", dd.timed_dd_script(["busybox", "dd", "if=/dev/zero", "of=/dev/null",
                                                              "bs=64k", "count=64"])], capture_output=True, text=True)
    assert "cloudbox-elapsed" in bb.stderr
    r = dd.parse_dd("dd-write-64k", "64+0 records in\n64+0 records out\ncloudbox-elapsed 10.00 10.50\n")
    assert r.mbps == pytest.approx(64 * 65536 / 0.5 / 1e6)
    with pytest.raises(CloudboxError, match="output not understood"):
        dd.parse_dd("dd-write-64k", "dd: /dev/vdz: No such file")


def test_netperf_and_iperf3():
    t = catalogue.NET_TESTS["tcp-stream"]
    r = nettests.parse_netperf(t, "20407.75,10^6bits/s,6.34\n")
    assert (r.value, r.lat_us, r.metric) == (20407.75, 6.34, "Mbit/s")
    rr = nettests.parse_netperf(catalogue.NET_TESTS["tcp-rr"], "18014.31,Trans/s,55.45\n")
    assert rr.metric == "trans/s" and rr.value == 18014.31
    with pytest.raises(CloudboxError, match="not understood"):
        nettests.parse_netperf(t, "establish control: are you sure there is a netserver listening")
    ip = nettests.parse_iperf3(catalogue.NET_TESTS["iperf3-tx"],
                              json.dumps({"end": {"sum_received": {"bits_per_second": 9.4e8}}}))
    assert ip.value == pytest.approx(940.0)
    with pytest.raises(CloudboxError, match="unable to connect"):
        nettests.parse_iperf3(catalogue.NET_TESTS["iperf3-rx"], json.dumps({"error": "unable to connect to server"}))


def test_storage_catalogue_rules():
    assert [t.id for t in catalogue.resolve_tests("smoke")] == ["seq-write-64k", "seq-read-64k", "randread-4k-qd32"]
    assert not runners.needs_fill(catalogue.resolve_tests("smoke"))
    assert runners.needs_fill(catalogue.resolve_tests("seq-read-1m"))
    for name, ids in catalogue.TEST_SETS.items():  # every set writes before it reads
        assert not runners.needs_fill(catalogue.resolve_tests(ids)), name
    args = fio.fio_args(catalogue.TESTS["seq-write-64k-buffered"], "/dev/vda", 1 << 20, 5)
    assert "--direct=0" in args and "--end_fsync=1" in args and "--ioengine=psync" in args
    args = fio.fio_args(catalogue.TESTS["randread-4k-qd32"], "/dev/vda", 1 << 20, 5)
    assert "--iodepth=32" in args and "--runtime=5" in args and "--direct=1" in args
    with pytest.raises(CloudboxError, match=r"\(did you mean seq-write-64k\?\); allowed: a set \(study, "):
        catalogue.resolve_tests("seq-write-7k")
