# cloudbox: top-level entry points. `make run` and `make test` install what is missing first.
SHELL := /bin/bash
VENV := tui/.venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Debian's interpreter, not whatever python3 is first on PATH: libvirt-python is built against Debian's libvirt.
SYSPY := /usr/bin/python3

.PHONY: run test test-fast test-full deps deps-test venv guest-image lint bench clean

run: need-root-run deps venv guest-image
	@scripts/cloudbox-run

# The appliance image (mk/image.mk: installs the image toolchain, builds build/image; incremental when it exists) is
# built by scripts/run-tests in the background while lint and the tests without guests run.
test: need-root-test deps-test venv guest-image
	@scripts/run-tests

# Everything in `make test` plus the opt-in tiers: pytest -m full (each feature's full matrix) and the bats tags
# xen-full, install-full, boot-full, cluster-full, volumes-full, knobs and bench (docs/benchmarks.md: what each
# holds, costs).
test-full: need-root-test deps-test venv guest-image
	@CLOUDBOX_TEST_FULL=1 scripts/run-tests

# Quick iteration: everything except the suites that boot real guests or images.
test-fast: deps-test venv guest-image
	@CLOUDBOX_TEST_FAST=1 scripts/run-tests

need-root-%:
	@scripts/need-root $*

deps:
	@scripts/install-deps core

deps-test:
	@scripts/install-deps test

venv: $(STAMP)

$(STAMP): tui/requirements-dev.lock tui/pyproject.toml
	@test -x $(PY) || $(SYSPY) -m venv $(VENV)
	@$(PY) -m pip install -q --disable-pip-version-check --require-hashes -r tui/requirements-dev.lock
	@$(PY) -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e tui
	@touch $@

guest-image: deps
	@appliance/guest/build-guest-image --quiet

lint: venv
	$(VENV)/bin/ruff check tui tests
	$(VENV)/bin/mypy --config-file tui/pyproject.toml tui/src
	$(VENV)/bin/lint-imports --no-cache tui/pyproject.toml

bench: need-root-bench deps-test venv guest-image
	@scripts/run-bench

clean:
	rm -rf $(VENV) tui/src/*.egg-info

# Image build and image suites (make image, image-test, image-bench) live in mk/image.mk.
-include mk/*.mk
