"""Widgets shared by the screens: the screen bar, dialogs, live charts, the run form's controls."""
