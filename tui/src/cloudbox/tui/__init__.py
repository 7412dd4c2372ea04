"""The `cloudbox` terminal UI (Textual): a thin layer over cloudbox.core. `create_app()` builds it."""

from cloudbox.tui.app import CloudboxApp, create_app

__all__ = ["CloudboxApp", "create_app"]
