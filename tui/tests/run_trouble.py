"""What a real run in a test had to ride out, as a pytest warning, so CI's output carries the evidence of it."""

from __future__ import annotations

import warnings

# A tool killed as hung, a stalled guest network (with its hop and counters), a guest boot launched again.
TROUBLE = (" hung: ", "guest network:", "guest: its network stopped", "did not come up")


def warn_run_trouble(events) -> list[str]:
    """Warns with every step or log line of the run's stored events that names trouble; returns those lines."""
    lines = [e.payload.get("text", "") for e in events if e.kind in ("log", "step")]
    hits = [ln for ln in lines if any(k in ln for k in TROUBLE)]
    if hits:
        warnings.warn("this real run rode out trouble and passed:\n" + "\n".join(hits), stacklevel=2)
    return hits
