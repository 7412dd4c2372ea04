"""N guests' tests started at one instant: the shell barrier that holds a guest's test until its uptime reaches a
given second, and the stamp of when it let the test go (storage and network tests alike)."""

from __future__ import annotations

from ..errors import CloudboxError

START_STAMP = "/tmp/cloudbox-start"


def barrier_script(start_uptime: float) -> str:
    """Shell that waits until the guest's uptime (/proc/uptime, 10 ms steps) reaches `start_uptime` seconds, writes
    the uptime it left at to START_STAMP, and goes on to what follows it (N guests' tests started at one instant).
    It sleeps until half a second before, then spins on shell builtins: under emulation a `sleep` process costs
    tens of milliseconds to start, more than the clock's step."""
    cs = int(-(-start_uptime * 100 // 1))
    return (f"t={cs}; while :; do read u _ < /proc/uptime; u=${{u%.*}}${{u#*.}}; [ \"$u\" -ge \"$t\" ] && break; "
            "[ $((t - u)) -gt 50 ] && sleep 0.2; done; "
            f"echo \"$u\" > {START_STAMP}; ")


def parse_start_stamp(text: str) -> float:
    """START_STAMP's centiseconds of uptime -> seconds."""
    try:
        return int(text.strip()) / 100
    except ValueError:
        raise CloudboxError(f"the guest's start stamp {START_STAMP} holds {text.strip()[:40]!r}, not centiseconds "
                            "of uptime") from None


def read_start_stamp(guest) -> float:
    """When the barrier let `guest`'s test go: its START_STAMP, in seconds of the guest's uptime."""
    return parse_start_stamp(guest.sh(f"cat {START_STAMP}", timeout=30).check().stdout)
