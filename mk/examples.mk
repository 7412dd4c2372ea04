# The example study reports in docs/examples: regenerated from real quick runs of each study on this host
# (scripts/make-examples: about 15 minutes under TCG on 2 cores), never edited by hand. Run it after a change to the
# studies, the presets or the report, and commit what it writes.
.PHONY: examples

examples: need-root-examples deps venv guest-image
	@scripts/make-examples
