"""The installer's pages (cloudbox.tui.install_app): role, disk, node settings, review, progress, the end."""
