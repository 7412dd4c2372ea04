#!/usr/bin/env bats
# `cloudbox install` as a user meets it on any machine (fast; writes nothing). Installs themselves boot the
# appliance image: tests/image/install.bats.

load helpers/load

CB=$REPO/tui/.venv/bin/cloudbox

@test "cloudbox install --help names the answer file, the dry run and the unattended mode" {
    run -0 "$CB" install --help
    for o in --answers --dry-run --yes --unattended disks; do assert_output --partial -- "$o"; done
}

@test "a bad answer file is refused with exit 2, naming the file, each key, value and the allowed values" {
    f="$BATS_TEST_TMPDIR/node.toml"
    printf 'role = "back-end"\nhostname = "Node_1"\ncolour = "red"\n[disk]\ntarget = "/dev/sdb"\n[network]\nprivate_nic = "eth0"\nprivate_mtu = 9600\n' > "$f"
    run -2 "$CB" install --dry-run --answers "$f"
    assert_output --partial "$f: invalid answer file (4 problems); nothing was written"
    assert_output --partial "hostname: not in the allowed form (got 'Node_1'); allowed: lowercase letters"
    assert_output --partial "colour: unknown key (got 'red'); allowed: known keys: role, hostname"
    assert_output --partial "network.private_mtu: out of range (got 9600); allowed: an integer 1500..9000"
    assert_output --partial "network.frontend: a back-end must know its front-end; allowed"
}

@test "an answer file naming a disk by /dev/sdX is refused: targets are named by /dev/disk/by-id" {
    [ "$(id -u)" = 0 ] || skip "probing disks (wipefs, blkid) needs root"
    f="$BATS_TEST_TMPDIR/node.toml"
    printf 'role = "all-in-one"\nhostname = "aio"\n[disk]\ntarget = "/dev/sdb"\n' > "$f"
    run -2 "$CB" install --dry-run --answers "$f"
    assert_output --partial "disk.target: name the disk by its /dev/disk/by-id/ path"
    assert_output --partial "(got '/dev/sdb')"
}

@test "cloudbox install disks never offers the disk holding the running system" {
    [ "$(id -u)" = 0 ] || skip "probing disks (wipefs, blkid) needs root"
    root=$(findmnt -n -o SOURCE / | sed 's/\[.*//')
    case $root in /dev/*) ;; *) skip "the root file system is not on a disk here ($root)" ;; esac
    run -0 "$CB" install disks
    assert_output --partial "refused: boot medium: holds the running system (/ on $root)"
}
