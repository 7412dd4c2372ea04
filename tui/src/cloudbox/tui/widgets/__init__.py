"""Widgets shared by the screens: the screen bar, dialogs, live charts."""
