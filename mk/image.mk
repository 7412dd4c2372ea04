# Appliance image targets: `make image`, `make image-test`, `make image-bench`. See docs/image.md.
# Where mkosi.conf puts the build (OutputDirectory=, CacheDirectory=); the suites keep their logs under it too.
IMAGE_DIR       := build/image
IMAGE_BATS      ?= bats
# Arguments for bats in image-test; the default runs what make test runs: not the nested benchmark (image-bench
# runs it) nor the opt-in tiers (docs/benchmarks.md, "Test tiers").
IMAGE_BATS_ARGS ?= --timing --filter-tags '!bench,!xen-full,!install-full,!boot-full,!cluster-full,!volumes-full,!knobs'

.PHONY: image image-test image-bench image-cluster-bench image-clean release

# Incremental: mkosi reuses build/image/cache (packages installed); a cold build starts from nothing.
image:
	@scripts/install-deps image
	@scripts/build-image

# What a release publishes (scripts/make-release): the image compressed, its bmap, its package manifest and
# SHA256SUMS, in build/release/.
release: image
	@scripts/make-release

# Boots the image under TCG with OVMF and SeaBIOS and checks the self-test verdict 123.
image-test: image
	@scripts/install-deps test
	@IMAGE_DIR="$(abspath $(IMAGE_DIR))" $(IMAGE_BATS) $(IMAGE_BATS_ARGS) tests/image

# Runs the quick storage suite inside the appliance under nested KVM, then measures builds, sizes and boots
# (scripts/image-bench) into docs/benchmarks.md.
image-bench: image venv
	@scripts/install-deps test
	@IMAGE_DIR="$(abspath $(IMAGE_DIR))" $(IMAGE_BATS) --timing --filter-tags bench tests/image
	@IMAGE_TEST_LOGS="$(abspath $(IMAGE_DIR))/test-logs" scripts/image-bench

# The two-node cluster suite with its figures recorded (power-on to cluster ready, image propagation) into
# docs/benchmarks.md (section "cluster"); `make bench` runs it last (CLOUDBOX_BENCH_CLUSTER=0 leaves it out).
image-cluster-bench: image venv
	@scripts/install-deps test
	@IMAGE_BENCH_RECORD=1 IMAGE_DIR="$(abspath $(IMAGE_DIR))" $(IMAGE_BATS) --timing tests/image/cluster.bats

image-clean:
	rm -rf "$(IMAGE_DIR)"
