# The example study reports in docs/examples (docs/studies.md, "Example reports"): `make examples` writes them from
# the runs they were made from (docs/examples/runs.db), so a report that the code, a study file or a preset changed
# shows as a diff; `make examples-runs` (root, real guests: about an hour under TCG) first measures what those
# runs lack, each study's quick run on this host, then study A again from nothing for `study compare`.
.PHONY: examples examples-runs

examples: venv
	@scripts/study-examples

examples-runs: need-root-examples-runs deps-test venv guest-image
	@scripts/study-examples --measure
