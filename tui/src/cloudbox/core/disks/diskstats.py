"""Host-side disk metrics, iostat-style, sampled from /proc/diskstats once a second in a thread.

Per interval: read/write MB/s, average request size (512-byte sectors, the studies' avgrq-sz, and kB),
average queue depth (avgqu-sz, from the weighted time-in-queue field) and % utilisation (io_ticks).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass


@dataclass
class Counters:
    t: float
    reads: int
    rsect: int
    writes: int
    wsect: int
    ticks_ms: int  # time the device had I/O in flight
    weighted_ms: int  # time-in-queue, weighted by the number of requests


@dataclass
class Sample:
    t: float  # wall-clock time (epoch) at the end of the interval
    device: str
    read_mbps: float
    write_mbps: float
    avgrq_sectors: float
    avgrq_kb: float
    avgqu: float
    util: float  # percent

    def as_dict(self) -> dict:
        return asdict(self)


def read_counters(device: str, path: str = "/proc/diskstats") -> Counters:
    with open(path) as f:
        for line in f:
            fld = line.split()
            if len(fld) >= 14 and fld[2] == device:
                return Counters(time.monotonic(), int(fld[3]), int(fld[5]), int(fld[7]), int(fld[9]),
                                int(fld[12]), int(fld[13]))
    raise KeyError(f"block device {device!r} not found in {path}")


def delta(a: Counters, b: Counters, device: str, wall: float | None = None) -> Sample:
    dt = max(b.t - a.t, 1e-6)
    ios = (b.reads - a.reads) + (b.writes - a.writes)
    sect = (b.rsect - a.rsect) + (b.wsect - a.wsect)
    avgrq = sect / ios if ios else 0.0
    return Sample(
        t=wall if wall is not None else time.time(),
        device=device,
        read_mbps=(b.rsect - a.rsect) * 512 / dt / 1e6,
        write_mbps=(b.wsect - a.wsect) * 512 / dt / 1e6,
        avgrq_sectors=avgrq,
        avgrq_kb=avgrq / 2,
        avgqu=(b.weighted_ms - a.weighted_ms) / (dt * 1000),
        util=min(100.0, (b.ticks_ms - a.ticks_ms) / (dt * 1000) * 100),
    )


class Sampler:
    """Samples one device every `interval` seconds until stopped; calls `on_sample` for each."""

    def __init__(self, device: str, on_sample: Callable[[Sample], None], interval: float = 1.0):
        read_counters(device)  # fail early, in the caller, for an unknown device
        self.device = device
        self.on_sample = on_sample
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"diskstats-{device}", daemon=True)
        self.count = 0  # samples taken (they go to on_sample; none are kept here)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        try:
            prev = read_counters(self.device)
        except KeyError:
            return
        next_t = prev.t + self.interval
        while not self._stop.wait(max(0.0, next_t - time.monotonic())):
            try:
                cur = read_counters(self.device)
            except KeyError:  # the device went (an NVMe controller handed to the guest): its samples end there
                return
            s = delta(prev, cur, self.device)
            prev = cur
            next_t += self.interval
            self.count += 1
            try:
                self.on_sample(s)
            except Exception:  # a failing consumer must not kill the sampler  # noqa: BLE001
                pass
