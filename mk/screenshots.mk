# TUI screenshots for docs/tui.md: docs/screens/*.svg, exported by Textual from the demo data the snapshot
# tests use (tui/tests/tui_demo.py). Regenerate after a change to a screen and commit the SVGs.
.PHONY: screenshots

screenshots: venv
	@scripts/tui-screenshots
