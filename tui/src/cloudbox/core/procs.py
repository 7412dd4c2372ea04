"""Process facts shared by the core: whether a pid names a live process."""

from __future__ import annotations

import os


def process_exists(pid: int | None) -> bool:
    """True if a process with this pid exists (possibly owned by another user)."""
    if not pid or pid <= 0:  # kill(0, ...) would signal our own process group
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
