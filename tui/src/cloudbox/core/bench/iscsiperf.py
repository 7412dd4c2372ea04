"""The bare-metal side of an iSCSI volume's reads: libiscsi's own reader, iscsi-perf, straight to the target (no
relay between), logged in as this box with CHAP."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Callable

from ..disks.volumes.iscsi import LUN, Chap, IscsiExport
from ..errors import Aborted, CloudboxError
from ..procs import die_with_parent
from ..spec import catalogue
from .result import MB, FioResult

PERF_BLOCK = 512  # the LUN's block size (tgtd's default); iscsi-perf counts transfers in blocks


PERF_STOP_S = 10.0  # how long iscsi-perf may take to print its average after SIGINT


PERF_MAX_FILL = 4  # the largest volume, in test sizes, laid with data for the baseline's reads


_PERF_AVG = re.compile(r"iops average (\d+)")


def perf_measures(t: catalogue.StorageTest) -> bool:
    """Whether libiscsi's iscsi-perf can measure `t` from the host domain: fio's direct sequential and random reads
    (it reads only; its transfers are whole blocks)."""
    return (t.tool == "fio" and t.rw in ("read", "randread") and t.direct
            and catalogue.block_bytes(t.bs) % PERF_BLOCK == 0)


def perf_args(t: catalogue.StorageTest, url: str, initiator: str) -> list[str]:
    """iscsi-perf reading `url` as `t` reads: its transfer size in blocks, its queue depth as requests in flight."""
    return ["iscsi-perf", "-i", initiator, *(["-r"] if t.rw == "randread" else []),
            "-b", str(catalogue.block_bytes(t.bs) // PERF_BLOCK), "-m", str(t.iodepth), url]


def parse_perf(t: catalogue.StorageTest, text: str, seconds: float) -> FioResult:
    """iscsi-perf's last running average (its lines are one a second): IOPS, and MB/s from the transfer size."""
    avgs = _PERF_AVG.findall(text)
    if not avgs:
        raise CloudboxError(f"iscsi-perf ({t.id}) printed no average: {text.strip()[-300:]}")
    iops = float(avgs[-1])
    return FioResult(t.id, iops * catalogue.block_bytes(t.bs) / MB, iops, 0.0, seconds, text)


def perf(t: catalogue.StorageTest, exp: IscsiExport, creds: Chap, runtime: float,
         cancelled: Callable[[], bool]) -> FioResult:
    """`t` read from the host domain through libiscsi (QEMU's initiator library) for `runtime` seconds, logged in as
    this box; the secret goes through libiscsi's environment, never on a command line or into the output kept."""
    url = f"iscsi://{creds.user}@{exp.host}:{exp.port}/{exp.iqn}/{LUN}"
    env = {**os.environ, "LIBISCSI_CHAP_PASSWORD": creds.secret}
    start = time.monotonic()
    proc = subprocess.Popen(perf_args(t, url, creds.initiator), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env, start_new_session=True,
                            preexec_fn=die_with_parent())  # noqa: PLW1509 - only prctl: a killed executor's tool dies with it
    try:
        while time.monotonic() - start < runtime and proc.poll() is None:
            if cancelled():
                raise Aborted("cancelled during a bare-metal iscsi-perf run")
            time.sleep(0.2)
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # it reads until interrupted, then prints "finished."
        out, _ = proc.communicate(timeout=PERF_STOP_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    seconds = time.monotonic() - start
    if proc.returncode != 0 or "finished." not in out:
        raise CloudboxError(f"iscsi-perf ({t.id}) exited {proc.returncode}: {out.strip()[-400:]}")
    return parse_perf(t, out.replace("\r", "\n"), seconds)
