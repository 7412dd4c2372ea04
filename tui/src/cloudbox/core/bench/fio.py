"""fio's storage tests: its command line and job file (what fio --client sends a server), its volume engine for
nbd:// targets, and the parsers of its JSON (a random test's with its completion-latency histogram), its status line
and fio --client's per-server figures. A timed test's command line runs a warm-up job first, discarded by the parser.
"""

from __future__ import annotations

import json
import re

from ..errors import CloudboxError
from ..record.latency import Histogram
from ..spec.catalogue import IOZONE_TOOLS, StorageTest
from .result import MB, FioResult


def is_nbd_uri(target: str) -> bool:
    """A volume reached through fio's nbd engine (libnbd, user space) rather than a file or device."""
    return target.startswith(("nbd://", "nbds://", "nbd+unix://"))


def nbd_measures(t: StorageTest) -> str:
    """Why fio's nbd engine cannot run `t` on a volume ('' when it can: fio's tests, and dd's pattern)."""
    if t.tool in IOZONE_TOOLS or t.makes_fs:
        return (f"{'Bonnie++' if t.tool == 'bonnie' else 'IOzone'} needs a file or a file system on a local disk, "
                "and the host domain reaches this volume through fio's nbd engine")
    return ""


def histograms(t: StorageTest) -> bool:
    """Whether fio reports `t` with its completion-latency histogram (json+): the random tests, whose tail latency
    the tables show."""
    return t.rw.startswith("rand")


WARMUP_JOB = "warmup"  # the timed tests' first job: the same I/O for warmup_s seconds, not counted


def warmup_s(runtime: int) -> int:
    """The seconds a timed test's I/O runs first and is discarded (a job of its own) before its measured job: a fifth
    of `runtime`, at least 1 (1 s of a quick run's 5 s, 6 s of a study run's 30 s)."""
    return max(1, runtime // 5)


def fio_args(t: StorageTest, target: str, size: int, runtime: int, *, fill: bool = False) -> list[str]:
    """fio's command line for `t` (or the fill that lays down data before reads). A timed test (random I/O) runs
    first a warm-up job, the same I/O for warmup_s(runtime) seconds, and then, after it (stonewall), its measured job
    over the whole size for at most `runtime` s; the parser reads only the measured job. (Not fio's ramp_time: fio
    3.33 here reported a job that finished within it with no latency at all.)"""
    args = _job_args(t, target, size, runtime, fill=fill)
    if fill or not t.timed:
        return args
    options = [a for a in args[2:] if not a.startswith(("--output-format=", "--eta", "--end_fsync=", "--runtime="))]
    warmup = [f"--name={WARMUP_JOB}", *options, f"--runtime={warmup_s(runtime)}", "--time_based=1"]
    return [args[0], *warmup, args[1], "--stonewall", *args[2:]]


def _job_args(t: StorageTest, target: str, size: int, runtime: int, *, fill: bool = False) -> list[str]:
    """fio's command line for `t` as one job (fio --client's job file is made of it)."""
    rw = "write" if fill else t.rw
    if is_nbd_uri(target):
        # No page cache between fio and the server: every request goes over the wire, as with O_DIRECT.
        where = ["--ioengine=nbd", f"--uri={target}"]
    else:
        where = [f"--filename={target}", f"--direct={1 if (fill or t.direct) else 0}",
                 f"--ioengine={'libaio' if fill else t.engine}"]
    args = [
        "fio", f"--name={'fill' if fill else t.id}", *where[:1], f"--size={size}",
        f"--rw={rw}", f"--bs={'1m' if fill else t.bs}", f"--iodepth={1 if fill else t.iodepth}",
        *where[1:],
        f"--output-format={'json+' if histograms(t) and not fill else 'json'}",
        "--eta=always", "--eta-newline=1", "--eta-interval=1",
        "--group_reporting=1", "--randrepeat=0", "--norandommap=1",
    ]
    if not fill and t.writes and not t.direct:
        args.append("--end_fsync=1")  # like dd conv=fsync: the data must reach the disk
    if not fill and t.timed:
        args += [f"--runtime={runtime}"]
    return args


_ETA = re.compile(
    r"\[(?P<pct>[\d.]+|-\.-)%\]"
    r"\[(?:[rw]=(?P<bw1>[\d.]+)(?P<u1>[KMG]i?B)/s)?(?:,?\s*[rw]=(?P<bw2>[\d.]+)(?P<u2>[KMG]i?B)/s)?\]"
    r".*?\[eta (?P<eta>[^\]]+)\]")
_UNITS = {"KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "KB": 1000, "MB": MB, "GB": 1000**3}


def parse_eta(line: str) -> dict | None:
    """fio's status line -> {'pct': 45.0, 'mbps': 120.3, 'eta': '00m:05s'} (None if not a status line)."""
    m = _ETA.search(line)
    if not m:
        return None
    mbps = 0.0
    for bw, unit in ((m["bw1"], m["u1"]), (m["bw2"], m["u2"])):
        if bw:
            mbps += float(bw) * _UNITS.get(unit, 1) / MB
    pct = 0.0 if m["pct"] == "-.-" else float(m["pct"])
    return {"pct": pct, "mbps": round(mbps, 2), "eta": m["eta"]}


def parse_fio(test_id: str, text: str) -> FioResult:
    start = text.find("{")
    if start < 0:
        raise CloudboxError(f"fio ({test_id}) printed no JSON: {text.strip()[:300]}")
    try:
        data = json.loads(text[start:])
    except ValueError as e:
        raise CloudboxError(f"fio ({test_id}) printed invalid JSON: {e}") from e
    jobs = [j for j in data["jobs"] if j.get("jobname") != WARMUP_JOB]  # the warm-up is not counted
    if not jobs:
        raise CloudboxError(f"fio ({test_id}) reported no job besides its warm-up: {text[start:][:300]}")
    return _job_result(test_id, jobs[0], text[start:])


def _job_result(test_id: str, job: dict, raw: str, who: str = "") -> FioResult:
    """One job's (or one fio server's) figures from fio's JSON."""
    if job.get("error"):
        raise CloudboxError(f"fio ({test_id}{who}) failed with error {job['error']}")
    mbps = iops = lat = 0.0
    secs = 0.0
    hists = []
    for d in ("read", "write"):
        side = job.get(d, {})
        if side.get("io_bytes", 0) > 0:
            mbps += side["bw_bytes"] / MB
            iops += side["iops"]
            lat = max(lat, side.get("clat_ns", {}).get("mean", 0.0) / 1000)
            secs = max(secs, side.get("runtime", 0) / 1000)
            bins = side.get("clat_ns", {}).get("bins")
            if isinstance(bins, dict) and bins:  # json+ only
                try:
                    hists.append(Histogram.from_fio(bins))
                except ValueError as e:
                    raise CloudboxError(f"fio ({test_id}{who}) {d}: {e}") from e
    hist = Histogram.merged(hists) if hists else None
    return FioResult(test_id, mbps, iops, lat, secs, raw, latency=hist)


FIO_CLIENT_TOTAL = "All clients"  # fio --client's own aggregate over its servers, in client_stats


def fio_job_file(t: StorageTest, target: str, size: int, runtime: int) -> str:
    """`t` as a fio job file (what fio --client sends a server): fio_args's job options, one per line."""
    skip = ("--name=", "--output-format=", "--eta")
    lines = [f"[{t.id}]"] + [a[2:] for a in _job_args(t, target, size, runtime)[1:] if not a.startswith(skip)]
    return "\n".join(lines) + "\n"


def parse_fio_clients(test_id: str, text: str, servers: list[str]) -> tuple[FioResult, list[FioResult]]:
    """fio --client's JSON over `servers` (their addresses, in order): fio's aggregate ("All clients"), and each
    server's own figures in the servers' order. Each server must have reported once."""
    start = 0 if text.startswith("{") else text.find("\n{") + 1  # after the servers' own lines; 0 when none
    try:
        data = json.loads(text[start:]) if text[start:start + 1] == "{" else None
    except ValueError as e:
        raise CloudboxError(f"fio --client ({test_id}) printed invalid JSON: {e}") from e
    if not isinstance(data, dict) or not isinstance(data.get("client_stats"), list):
        raise CloudboxError(f"fio --client ({test_id}) printed no client_stats: {text.strip()[-300:]}")
    stats = data["client_stats"]
    raw = text[start:]
    each = {str(c.get("hostname")): c for c in stats if c.get("jobname") != FIO_CLIENT_TOTAL}
    if sorted(each) != sorted(servers):
        raise CloudboxError(f"fio --client ({test_id}) reported servers {', '.join(sorted(each)) or 'none'}; "
                            f"expected {', '.join(servers)}")
    results = [_job_result(test_id, each[ip], "", f" on {ip}") for ip in servers]
    total = next((c for c in stats if c.get("jobname") == FIO_CLIENT_TOTAL), None)
    if total is not None:
        return _job_result(test_id, total, raw), results
    # fio left its aggregate out (one run in three here, two TCG guests): the same sum, all bytes over the longest job
    sides = [c.get(d, {}) for c in each.values() for d in ("read", "write")]
    secs = max(x.get("runtime", 0) for x in sides) / 1000
    done = sum(x.get("io_bytes", 0) for x in sides)
    ios = sum(x.get("total_ios", 0) for x in sides)
    return (FioResult(test_id, done / MB / secs if secs else 0.0, ios / secs if secs else 0.0,
                      max(r.lat_us for r in results), secs, raw), results)
