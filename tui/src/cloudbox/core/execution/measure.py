"""One test, measured and stored: its step, the tool run, its measurement rows and the measurement event; a
storage test also with the host disk's counters over exactly the test's window (iostat over the whole test)."""

from __future__ import annotations

import time
from collections.abc import Callable

from .. import network, storage
from ..diskstats import delta, read_counters
from ..events import MeasurementEvent
from .context import RunContext, host_labels


def storage_test(ctx: RunContext, side: str, t: storage.StorageTest, run: Callable[[], storage.FioResult],
                 guest_drop: Callable[[], None] = lambda: None) -> None:
    """`run` measures `t` on `side`; read tests start with the page caches dropped (else labelled warm-cache)."""
    ctx.control.check()
    tl = list(dict.fromkeys([*ctx.labels, *t.labels]))
    if side == "baseline":
        tl = host_labels([*tl, *ctx.backing.baseline_labels], dom0=ctx.dom0)
    if "read" in t.rw:
        if not storage.drop_host_caches():
            tl.append("warm-cache")
        guest_drop()
    ctx.current_test = f"{side}:{t.id}"
    ctx.sink.step(f"{side}: {t.id}", side=side, test=t.id)
    # The 1 s sampler feeds the live timeline; the measurement gets the counters at the test's start and end.
    device = ctx.sampler.device if ctx.sampler else None
    c0 = read_counters(device) if device else None
    start = time.time()
    res = run()
    end = time.time()
    ctx.current_test = "idle"
    host: dict[str, float | None] = dict.fromkeys(("host_mbps", "host_avgrq_sectors", "host_avgqu", "host_util"))
    if device and c0 is not None:
        d = delta(c0, read_counters(device), device)
        host = {"host_mbps": d.read_mbps + d.write_mbps, "host_avgrq_sectors": d.avgrq_sectors,
                "host_avgqu": d.avgqu, "host_util": d.util}

    def record(metric: str, value: float, raw: str) -> None:
        ctx.store.add_measurement(ctx.run_id, side=side, test=t.id, metric=metric, value=value, raw=raw, labels=tl,
                                  started_at=start, finished_at=end, host_mbps=host["host_mbps"],
                                  host_avgrq_sectors=host["host_avgrq_sectors"], host_avgqu=host["host_avgqu"],
                                  host_util=host["host_util"])

    record("MB/s", res.mbps, res.raw)
    for metric, value in res.extra.items():  # IOzone's second pass: re-write, re-read
        record(metric, value, "")
    if t.timed:
        record("IOPS", res.iops, "")
        record("lat_us", res.lat_us, "")
    hr = {k: None if v is None else round(v, 2) for k, v in host.items()}
    ctx.sink.emit(MeasurementEvent(side, t.id, "MB/s", round(res.mbps, 2), tuple(tl), round(res.iops, 1),
                                   hr["host_mbps"], hr["host_avgrq_sectors"], hr["host_avgqu"], hr["host_util"]))


def net_test(ctx: RunContext, side: str, t: network.NetTest, run: Callable[[], network.NetResult],
             labels: list[str], note: str = "") -> None:
    """`run` measures `t` on `side`; a retry after a hang, and what was seen and done, go into the raw output."""
    ctx.control.check()
    ctx.sink.step(f"{side}: {t.id} ({t.direction})", side=side, test=t.id)
    start = time.time()
    res = run()
    end = time.time()
    tl = list(dict.fromkeys(labels))
    raw = res.raw
    if res.hung:  # the run's log says what was seen; the measurement keeps that it is a retry
        raw += f"\n# cloudbox: measured on attempt {res.hung + 1}; {res.hung} before it hung and was killed\n"
    for n in [*res.notes, *([note] if note else [])]:
        raw += f"# cloudbox: {n}\n"

    def record(metric: str, value: float, raw: str) -> None:
        ctx.store.add_measurement(ctx.run_id, side=side, test=t.id, metric=metric, value=value, raw=raw, labels=tl,
                                  started_at=start, finished_at=end)

    record(res.metric, res.value, raw)
    if res.lat_us is not None and t.kind == "TCP_RR":
        record("lat_us", res.lat_us, "")
    ctx.sink.emit(MeasurementEvent(side, t.id, res.metric, round(res.value, 2), tuple(tl)))
