#!/usr/bin/env bats
# Boots the appliance (TCG, -cpu max) and runs the quick storage suite in it under nested KVM (second milestone).
# Slow and heavy: tagged bench; `make image-bench` (and so `make bench`) runs it, `make test` does not (cluster.bats
# runs the same nested-KVM suites, network included, on the installed back-end).

load ../helpers/load

setup_file() {
    export BENCH_LOGS=${IMAGE_TEST_LOGS:-$IMAGE_DIR/test-logs}/bench
    export BENCH_PORT=${IMAGE_BENCH_SSH_PORT:-10022}
    # One vCPU: a nested KVM guest on one of two TCG vCPUs can leave the other waiting on an IPI (docs/image.md).
    export IMAGE_QEMU_SMP=${IMAGE_QEMU_SMP:-1}
    mkdir -p "$BENCH_LOGS"
    rm -f "$BENCH_LOGS/quick-suite-seconds" "$BENCH_LOGS/run-attempt1.txt"  # quick-suite-seconds: for scripts/image-bench
    image_ensure >&3 2>&1
    image_start uefi "$BENCH_LOGS" "$BENCH_PORT"
    machine_wait_ssh "$BENCH_LOGS" "$BENCH_PORT" "$QEMU_PID" "${IMAGE_BOOT_TIMEOUT_S:-600}"
    echo "# appliance reachable over SSH after $WAITED_S s" >&3
}

# The appliance's QEMU is a child of this shell: setup_file and teardown_file run in the same one.
teardown_file() {
    machine_stop "$BENCH_LOGS" "$BENCH_PORT" "${QEMU_PID:-}" "$BENCH_LOGS/journal.txt"
    rm -f "$BENCH_LOGS/disk.qcow2"
}

teardown() {
    if [ "${BATS_TEST_COMPLETED:-}" != 1 ]; then
        echo "# guest logs kept in $BENCH_LOGS (serial.log, journal.txt, qemu.log)" >&3
    fi
}

appliance() { machine_ssh "$BENCH_LOGS" "$BENCH_PORT" "$@"; }

# Fails with the reason when the run failed or hit its time limit and the appliance's kernel reported a lockup
# (serial.log). A lockup the run came through is reported, not failed on: the run's numbers are complete.
bench_lockup_check() {
    local lock
    lock=$(grep -a -m1 -E 'soft lockup|hard LOCKUP|rcu_[a-z]+ detected stalls' "$BENCH_LOGS/serial.log" || true)
    if [ -n "$lock" ] && [ "$status" -ne 0 ]; then
        fail "the appliance's kernel locked up during the run (serial.log: ${lock#*] }); the run's output: $BENCH_LOGS/run.txt"
    fi
    if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
        fail "the run in the appliance did not end within $MACHINE_SSH_TIMEOUT_S s (IMAGE_BENCH_RUN_TIMEOUT_S); output: $BENCH_LOGS/run.txt"
    fi
    if [ -n "$lock" ]; then
        echo "# note: the appliance's kernel reported '${lock#*] }' during the run, which completed; $BENCH_LOGS/serial.log" >&3
    fi
}

# bats test_tags=slow,bench
@test "the appliance's guests get nested KVM" {
    run -0 appliance cloudbox host --verdict
    assert_output --regexp '^kvm: usable \(KVM \(nested\): a test kernel printed its banner under KVM in '
}

# bats test_tags=slow,bench
@test "cloudbox runs the quick storage suite on virtio-disk inside the appliance" {
    start=$SECONDS
    # A hard limit (normally 5-7 min): a locked-up appliance kernel would otherwise hold the session forever.
    export MACHINE_SSH_TIMEOUT_S=${IMAGE_BENCH_RUN_TIMEOUT_S:-1500}
    run appliance cloudbox run --profile virtio-disk --suite storage --size quick
    echo "$output" > "$BENCH_LOGS/run.txt"
    bench_lockup_check
    if run_again_if_guest_died_booting "$BENCH_LOGS/run.txt" appliance cloudbox run --profile virtio-disk \
        --suite storage --size quick; then
        start=$RUN_AGAIN_AT
        bench_lockup_check
    fi
    unset MACHINE_SSH_TIMEOUT_S
    assert_success
    # The guest ran under nested KVM, not emulated inside the emulated appliance (cloudbox falls back to TCG when its
    # KVM probe times out; the numbers would then be labelled emulated and take many times longer).
    assert_output --partial "accelerator: KVM (nested)"
    echo "$((SECONDS - start))" > "$BENCH_LOGS/quick-suite-seconds"
    echo "# quick storage suite in the appliance: $(cat "$BENCH_LOGS/quick-suite-seconds") s" >&3
}
