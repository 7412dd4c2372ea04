"""The cloudbox app as its screens use it: the backend, the poll interval and work off the UI thread.

app.py's CloudboxApp adds the screens themselves (modes, global keys, help, the command palette). The screens reach
the app through `app = getters.app(CloudboxAppBase)` and import this module, never app.py, which imports them.
"""

from __future__ import annotations

from cloudbox.tui.backend import Backend
from cloudbox.tui.background import BackgroundApp


class CloudboxAppBase(BackgroundApp[None]):
    def __init__(self, backend: Backend | None = None, *, poll_interval: float = 1.0):
        super().__init__()
        self.backend = backend or Backend()
        self.poll_interval = poll_interval  # seconds between a screen's reloads, at least

    def on_unmount(self) -> None:
        self.backend.close()
