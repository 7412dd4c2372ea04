#!/usr/bin/env bats
# The installed `cloudbox` command and the make entry points, as a user meets them (fast; no guests).

load helpers/load

CB=$REPO/tui/.venv/bin/cloudbox

setup() {
    export CLOUDBOX_STATE_DIR="$BATS_TEST_TMPDIR/state"
}

@test "make run as a non-root user says it needs root and why" {
    if ! su nobody -s /bin/sh -c "test -r '$REPO/Makefile'"; then
        skip "user nobody cannot reach this checkout ($REPO), so the non-root path cannot be exercised here"
    fi
    run su nobody -s /bin/bash -c "cd '$REPO' && make --no-print-directory run"
    assert_failure
    assert_output --partial "'make run' needs root"
    assert_output --partial "sudo make run"
}

@test "cloudbox --help lists the subcommands" {
    run -0 "$CB" --help
    for c in profile run watch cancel guests host results; do assert_output --partial "$c"; done
}

@test "profile list shows the presets with their descriptions" {
    run -0 "$CB" profile list
    assert_output --partial eucalyptus-default
    assert_output --partial virtio-disk
    assert_output --partial modern-tuned
}

@test "profile validate rejects a bad file naming file, key, value and allowed values" {
    f="$BATS_TEST_TMPDIR/bad.toml"
    printf 'name = "bad"\ndescription = "x"\n[guest]\nhypervisor = "kvm"\n[disk]\nbus = "virtio-blk"\ncache = "fast"\nbacking = "sparse-file"\n[network]\nmodel = "e1000"\n' > "$f"
    run -2 "$CB" profile validate "$f"
    assert_output --partial "$f"
    assert_output --partial "disk.cache"
    assert_output --partial "'fast'"
    assert_output --partial "writethrough"
}

@test "run with a bad argument fails before touching anything" {
    run -2 "$CB" run --profile virtio-disk --size lots  # a usage error: exit 2
    assert_output --partial "allowed: quick, study"
    [ ! -e "$CLOUDBOX_STATE_DIR/work" ]
    [ ! -e "$CLOUDBOX_STATE_DIR/results.db" ]
}

@test "results on an empty database explain themselves" {
    run -2 "$CB" results show 42  # a run that is not there is bad input: exit 2
    assert_output --partial "no run 42"
}
