"""Network tests: netperf (TCP_STREAM, TCP_MAERTS, TCP_RR) or iperf3 between a guest (or the bare-metal namespace)
and its peer, their command lines and parsers, and the hang detection that kills and retries a test whose tool
stops answering."""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .. import procs
from ..errors import Aborted, CloudboxError, GuestError, GuestTimeout
from ..spec.addresses import HOST_IP, NS, NS_HOST_IP
from ..spec.catalogue import NetTest
from ..virt.network import GuestLink, link_stats
from .barrier import barrier_script, read_start_stamp


@dataclass
class NetResult:
    test: str
    value: float
    metric: str
    lat_us: float | None
    raw: str
    hung: int = 0  # attempts before this one that hung and were killed (see _retrying)
    notes: list[str] = field(default_factory=list)  # what was seen and done between attempts, for the raw output
    started_uptime: float | None = None  # a guest test held at a barrier: the guest's uptime when it was let go


def netperf_args(t: NetTest, host: str, port: int, seconds: int) -> list[str]:
    """The test's netperf command; the test-specific `-H` names the server's data address too, so that netserver
    binds the test's data socket there rather than to the wildcard address (its `-L` covers the control port only)."""
    return ["netperf", "-H", host, "-p", str(port), "-t", t.kind, "-l", str(seconds), "-P", "0", "--",
            "-H", host, "-o", "THROUGHPUT,THROUGHPUT_UNITS,MEAN_LATENCY"]


def iperf3_args(t: NetTest, host: str, port: int, seconds: int) -> list[str]:
    return ["iperf3", "-c", host, "-p", str(port), "-t", str(seconds), "-J", *(["-R"] if t.kind == "rx" else [])]


def parse_netperf(t: NetTest, text: str) -> NetResult:
    for line in reversed(text.strip().splitlines()):
        parts = line.strip().split(",")
        if len(parts) >= 3:
            try:
                value, lat = float(parts[0]), float(parts[2])
            except ValueError:
                continue
            return NetResult(t.id, value, t.metric, lat, text)
    raise CloudboxError(f"netperf ({t.id}) output not understood: {text.strip()[-300:]}")


def parse_iperf3(t: NetTest, text: str) -> NetResult:
    try:
        data = json.loads(text)
    except ValueError as e:
        raise CloudboxError(f"iperf3 ({t.id}) printed invalid JSON: {text.strip()[-300:]}") from e
    if "error" in data:
        raise CloudboxError(f"iperf3 ({t.id}): {data['error']}")
    bps = data["end"]["sum_received"]["bits_per_second"]
    return NetResult(t.id, bps / 1e6, "Mbit/s", None, text)


def parse(t: NetTest, text: str) -> NetResult:
    return parse_netperf(t, text) if t.tool == "netperf" else parse_iperf3(t, text)


ATTEMPTS = 2  # a test tool that hangs is killed and the test run once more


def hang_limit(seconds: int) -> float:
    """How long a network test of `seconds` may take before it counts as hung: twice its length plus 40 s for
    the tool's start and end under emulation (a 3 s netperf takes about 5 s in a TCG guest)."""
    return seconds * 2 + 40


class _Hung(Exception):
    """One attempt did not finish within its limit (or its NIC went quiet) and was killed; the text says what was
    seen at the time, `why` what gave it up."""

    def __init__(self, seen: str, why: str):
        super().__init__(seen)
        self.why = why


# A guest test during which no frame reaches the guest's NIC for this long has stalled: every test kind has frames
# flowing to the guest the whole time (data, ACKs, answers), so it is given up at once, not at the time limit.
QUIET_S = 15.0


class _Quiet:
    """Seconds since the packet counter of the host's tap toward the guest last moved."""

    def __init__(self, tap: str):
        self.tap = tap
        self.last = self._read()
        self.since = time.monotonic()

    def _read(self) -> int | None:
        st = link_stats(self.tap)
        return st["tx_packets"] if st else None

    def seconds(self) -> float:
        now = self._read()
        if now != self.last:
            self.last, self.since = now, time.monotonic()
        return time.monotonic() - self.since


def _retrying(where: str, t: NetTest, target: str, port: int, limit: float, attempts: int,
              log: Callable[[str], None], once: Callable[[], str],
              after_hang: Callable[[], str] = lambda: "") -> NetResult:
    """Run `once` (one attempt, its output) up to `attempts` times while it hangs. A hang is logged with the
    sockets it held; `after_hang` then checks the path (and may bring it back, or raise NicStalled) and says what
    it found, and the test runs again. The result says how many attempts hung (NetResult.hung) and what was found
    (NetResult.notes); hanging every time is an error naming the tool, the test and the server."""
    seen: list[str] = []
    whys: list[str] = []
    notes: list[str] = []
    for attempt in range(1, attempts + 1):
        try:
            out = once()
        except _Hung as e:
            seen.append(str(e))
            whys.append(e.why)
            log(f"{where}: {t.tool} ({t.id}) to {target} port {port} hung: {e.why}, killed "
                f"(attempt {attempt} of {attempts}){'; running it again' if attempt < attempts else ''}. "
                f"Sockets then: {e}")
            note = after_hang()
            if note:
                notes.append(f"attempt {attempt} hung: {note}")
            continue
        res = parse(t, out)
        res.hung = len(seen)
        res.notes = notes
        return res
    raise CloudboxError(f"{where}: {t.tool} ({t.id}) to {target} port {port} hung {attempts} times ({whys[-1]}, "
                        f"killed): is the server there still answering? Sockets at the last hang: "
                        f"{seen[-1] if seen else '-'}")


def _progress_of(seconds: int, progress: Callable[[dict], None]) -> Callable[[float], None]:
    def report(start: float) -> None:
        el = time.monotonic() - start
        progress({"pct": min(99.0, 100 * el / seconds), "eta": f"{max(0, seconds - el):.0f}s"})
    return report


def run_in_guest(guest, t: NetTest, port: int, seconds: int, progress: Callable[[dict], None],
                 cancelled: Callable[[], bool], target: str = HOST_IP, *, hang_s: float | None = None,
                 attempts: int = ATTEMPTS, log: Callable[[str], None] = lambda _: None,
                 link: GuestLink | None = None, quiet_s: float = QUIET_S,
                 start_uptime: float | None = None) -> NetResult:
    """The test from the guest to `target`, through the guest agent; a hang (no end after `hang_s`, by default
    hang_limit(seconds)) is killed in the guest, and the test runs again. With `link` (the guest's NIC and its
    path), a test during which nothing reaches the guest's NIC for `quiet_s` counts as hung at once, and a hang
    first has the path probed hop by hop; a dead path is brought back (GuestLink.replug) before the
    next attempt, or the test fails at once with NicStalled naming the hop where frames stop: repeating the tool
    on a dead path cannot help. With `start_uptime`, the tool waits until the guest's uptime reaches it
    (barrier_script: N guests' tests started at one instant) and the result says when it was let go."""
    args = (netperf_args if t.tool == "netperf" else iperf3_args)(t, target, port, seconds)
    if start_uptime is not None:
        args = ["/bin/sh", "-c", barrier_script(start_uptime) + "exec " + shlex.join(args)]
    limit = hang_s if hang_s is not None else hang_limit(seconds)
    report = _progress_of(seconds, progress)

    def once() -> str:
        start = time.monotonic()

        def poll() -> None:
            if cancelled():
                raise Aborted("cancelled during a guest network test")
            report(start)

        seen = ["not looked at"]

        def look() -> None:  # the hung tool's sockets, before it is killed (busybox netstat: no ss there)
            try:
                ns = guest.sh(f"netstat -tn 2>&1 | grep -F ' {target}:'", timeout=20)
                seen[0] = " | ".join(" ".join(ln.split()) for ln in ns.stdout.strip().splitlines()) or "none"
            except GuestError as e:
                seen[0] = f"not readable ({e})"

        quiet = _Quiet(link.tap) if link is not None and link.tap else None

        def give_up() -> str | None:
            q = quiet.seconds() if quiet else 0.0
            return f"no frame reached the guest's NIC for {q:.0f} s" if q >= quiet_s else None

        try:
            r = guest.run(args, timeout=limit, poll=poll, interval=1.0, on_timeout=look, give_up=give_up)
        except GuestTimeout as e:
            raise _Hung(f"in the guest: {seen[0]}", e.why or f"no end after {limit:.0f} s") from e
        if r.exitcode != 0:
            raise GuestError(f"{t.tool} ({t.id}) in the guest exited {r.exitcode}: {(r.stderr or r.stdout)[-300:]}")
        return r.stdout

    def after_hang() -> str:
        if link is None:
            return ""
        return link.after_hang(f"{t.tool} ({t.id}) to {target} port {port}", log)

    res = _retrying("guest", t, target, port, limit, attempts, log, once, after_hang)
    if start_uptime is not None:
        res.started_uptime = read_start_stamp(guest)
    return res


def run_baseline(t: NetTest, port: int, seconds: int, progress: Callable[[dict], None],
                 cancelled: Callable[[], bool], target: str = NS_HOST_IP, netns: str | None = NS, *,
                 hang_s: float | None = None, attempts: int = ATTEMPTS,
                 log: Callable[[str], None] = lambda _: None) -> NetResult:
    """The bare-metal side: from the namespace to the host over veth, or (netns None) from the host itself to
    `target` (a back-end host -> the front-end). A hang is killed and retried as in the guest."""
    args = (netperf_args if t.tool == "netperf" else iperf3_args)(t, target, port, seconds)
    limit = hang_s if hang_s is not None else hang_limit(seconds)
    report = _progress_of(seconds, progress)
    prefix = ["ip", "netns", "exec", netns] if netns else []

    def once() -> str:
        proc = subprocess.Popen([*prefix, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=procs.die_with_parent())  # noqa: PLW1509 - only prctl: a killed executor's tool dies with it
        start = time.monotonic()

        def hang_or_report() -> None:
            if time.monotonic() - start > limit:
                ss = subprocess.run([*prefix, "ss", "-tn", "dst", target], capture_output=True, text=True)
                seen = " | ".join(" ".join(ln.split()) for ln in ss.stdout.strip().splitlines()[1:]) or "none"
                raise _Hung(f"on {'namespace ' + netns if netns else 'this host'}: {seen}",
                            f"no end after {limit:.0f} s")
            report(start)

        out, err = procs.wait_cancellable(proc, cancelled, "a bare-metal network test", every=hang_or_report)
        if proc.returncode != 0:
            raise CloudboxError(f"bare-metal {t.tool} ({t.id}) exited {proc.returncode}: {(err or out)[-300:]}")
        return out

    return _retrying("bare metal", t, target, port, limit, attempts, log, once)
