#!/usr/bin/env bats
# Network block volumes on one box, with the appliance's own kernel (this build host's kernel has no initiators and
# no nvmet): the live appliance under QEMU TCG serves a volume over AoE, iSCSI, NBD and NVMe/TCP and attaches it with
# its own kernel (disk.attach = host: aoe, open-iscsi, nbd-client, nvme_tcp), handing the device to a guest under
# nested KVM; NVMe/TCP and AoE attached by the guest itself, with the host domain's row first; a run cancelled while
# its guest writes to a host-attached volume leaves no target, session, device, nvmet port or veth. Slow: each run
# boots a nested guest. Opt-in (tag volumes-full, make test-full); the cluster suite's make-test run covers one scheme
# across two nodes. Logs: $IMAGE_DIR/test-logs/volumes (serial.log, journal.txt, NAME.txt, NAME.json).

load ../helpers/load

setup_file() {
    suite_begin volumes
    export VOL_LOGS=$SUITE_LOGS
    # One vCPU: a nested KVM guest on one of two TCG vCPUs can leave the other waiting on an IPI (docs/image.md).
    export IMAGE_QEMU_SMP=${IMAGE_QEMU_SMP:-1}
    rm -f "$VOL_LOGS"/*.txt "$VOL_LOGS"/*.json
    appliance_ensure "$VOL_LOGS" "${IMAGE_VOLUMES_SSH_PORT:-$(free_port)}"
    export VOL_PORT=$APPLIANCE_PORT
    # A reused appliance has its volume still (each test leaves it detached: assert_nothing_left).
    if [ "$APPLIANCE_REUSED" != 1 ] || ! grep -q '^ebs ' <<<"$(appliance cloudbox volume list)"; then
        appliance cloudbox volume create ebs --size 48M >&3
    fi
}

teardown_file() {
    appliance_release "$VOL_LOGS"
}

teardown() {
    if [ "${BATS_TEST_COMPLETED:-}" != 1 ]; then
        echo "# logs kept in $VOL_LOGS (serial.log, journal.txt, the run's NAME.txt)" >&3
    fi
}

appliance() { machine_ssh "$VOL_LOGS" "$VOL_PORT" "$@"; }
checks() { python3 "$REPO/tests/helpers/cluster_checks.py" "$@"; }

# leftovers: what a volume run could leave in the appliance, one line per kind; empty lines when nothing is left.
leftovers() {
    appliance 'echo "sessions: $(iscsiadm -m session 2>/dev/null)"
        echo "nvmet: $(ls /sys/kernel/config/nvmet/ports /sys/kernel/config/nvmet/subsystems 2>/dev/null | grep -v : )"
        echo "nvme: $(ls /sys/class/nvme 2>/dev/null)"
        echo "nbd: $(ls /sys/block/nbd*/pid 2>/dev/null)"
        echo "aoe: $(ls /sys/block | grep etherd)"
        echo "servers: $(pgrep -a -x "tgtd|vblade|qemu-nbd|nbd-client")"
        echo "veth: $(ip -o link | grep -o "cbv[0-9a-f]*[sh]")"
        echo "work: $(ls /var/lib/cloudbox/work 2>/dev/null)"
        echo "attached: $(cloudbox volume list | grep -c " run ")"'
}

assert_nothing_left() {
    run -0 leftovers
    echo "$output" > "$VOL_LOGS/leftovers-$1.txt"
    local line
    while IFS= read -r line; do
        case "$line" in
            "attached: 0" | *": ") ;;
            *) fail "left after $1: $line (all: $output)" ;;
        esac
    done <<<"$output"
}

# volume_run NAME PROFILE SCHEME ATTACH: `cloudbox run` of PROFILE (a preset or a file in the appliance) on volume ebs,
# one storage test at 16 MiB; checks its three rows (guest, host domain on the same volume, the attachment named)
# and that nothing is left.
volume_run() {
    local name=$1 profile=$2 scheme=$3 attach=$4
    export MACHINE_SSH_TIMEOUT_S=${IMAGE_VOLUMES_RUN_TIMEOUT_S:-900}
    run appliance cloudbox run --profile "$profile" --suite storage --size 16M --tests seq-write-64k
    echo "$output" > "$VOL_LOGS/$name.txt"
    if run_again_if_guest_died_booting "$VOL_LOGS/$name.txt" appliance cloudbox run --profile "$profile" \
        --suite storage --size 16M --tests seq-write-64k; then :; fi
    [ "$status" -eq 0 ] || fail "the $profile run failed (exit $status); $VOL_LOGS/$name.txt: $(tail -20 "$VOL_LOGS/$name.txt")"
    assert_output --partial "accelerator: KVM (nested)"
    MACHINE_SSH_TIMEOUT_S=120 appliance cloudbox results export --format json > "$VOL_LOGS/$name.json"
    run -0 checks volume-run "$VOL_LOGS/$name.json" "$scheme" "$attach"
    echo "# $output" >&3
    assert_nothing_left "$name"
}

# bats test_tags=slow,image,volumes,volumes-full
@test "the appliance's kernel attaches AoE (over a veth pair) and hands the device to the guest on emulated SCSI" {
    volume_run aoe-host kvm-ebs-aoe aoe host
}

# bats test_tags=slow,image,volumes,volumes-full
@test "open-iscsi logs the host in to the box's tgtd with CHAP; the disk goes to the guest on emulated SCSI" {
    volume_run iscsi-host kvm-ebs-iscsi-host iscsi host
}

# bats test_tags=slow,image,volumes,volumes-full
@test "nbd-client attaches the box's TLS export on the host; the device goes to the guest on virtio-blk" {
    appliance "sed -e 's/^name = .*/name = \"kvm-ebs-nbd-host\"/' -e 's/^attach = .*/attach = \"host\"/' \
        /usr/share/cloudbox/profiles/kvm-ebs-nbd.toml > /root/kvm-ebs-nbd-host.toml"
    volume_run nbd-host /root/kvm-ebs-nbd-host.toml nbd host
}

# bats test_tags=slow,image,volumes,volumes-full
@test "the kernel's NVMe/TCP target and host: DH-HMAC-CHAP where the kernel has it, virtio-blk, cache none, io_uring" {
    volume_run nvme-host kvm-ebs-nvme nvme-tcp host
    run -0 grep -E 'volume exported: nvme\+tcp://127\.0\.0\.1:[0-9]+/nqn\.2026-11\.org\.cloudbox:vol\.ebs' \
        "$VOL_LOGS/nvme-host.txt"
}

# bats test_tags=slow,image,volumes,volumes-full
@test "the guest's own nvme_tcp attaches the volume over its NIC, after the host domain's row" {
    volume_run nvme-guest kvm-ebs-nvme-guest nvme-tcp guest
}

# bats test_tags=slow,image,volumes,volumes-full
@test "a volume in a volume group: an LV made and removed by cloudbox, served over NVMe/TCP, its dm device sampled" {
    # The user's group, made by hand on a disk they chose (here a loop file); cloudbox only adds and removes its LV.
    appliance 'truncate -s 128M /var/tmp/cbvg.img && losetup -f --show /var/tmp/cbvg.img > /var/tmp/cbvg.loop &&
        pvcreate -q "$(cat /var/tmp/cbvg.loop)" && vgcreate -q cbtest "$(cat /var/tmp/cbvg.loop)"' 2>&1 | grep -v leaked >&3 || true
    # The image's lvmlocal.conf: no group is activated by itself (a lab's disks stay as they were).
    run -0 appliance lvmconfig activation/auto_activation_volume_list
    assert_output --regexp 'auto_activation_volume_list *= *\[ *\]'
    run -1 appliance cloudbox volume create lvebs --size 1G --vg cbtest
    assert_output --partial "--vg 'cbtest' has"
    assert_output --partial "allowed: at most"
    run -2 appliance cloudbox volume create lvebs --size 48M --vg nosuch
    assert_output --partial "no such volume group on this box; allowed: cbtest"
    run -0 appliance cloudbox volume create lvebs --size 48M --vg cbtest
    assert_output --partial "48.0 MiB a logical volume in cbtest at /dev/cbtest/cloudbox-lvebs"
    run -0 appliance cloudbox volume list
    assert_output --regexp 'lvebs +48\.0 MiB +LV in cbtest'
    appliance "sed -e 's/^name = .*/name = \"kvm-ebs-nvme-lv\"/' -e 's/nvme-tcp:ebs/nvme-tcp:lvebs/' \
        /usr/share/cloudbox/profiles/kvm-ebs-nvme.toml > /var/tmp/kvm-ebs-nvme-lv.toml"
    volume_run nvme-lv /var/tmp/kvm-ebs-nvme-lv.toml nvme-tcp host
    # The server's side sampled on the LV itself (device-mapper), beside the attached NVMe device.
    rid=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["runs"][-1]["id"])' "$VOL_LOGS/nvme-lv.json")
    run -0 appliance cloudbox results show "$rid"
    assert_output --regexp 'sampled +.*dm-[0-9]+ [0-9]+ s'
    run -0 appliance cloudbox volume delete lvebs
    assert_output --partial "/dev/cbtest/cloudbox-lvebs removed"
    run -0 appliance 'lvs --noheadings -o lv_name cbtest 2>/dev/null; vgs --noheadings -o vg_name 2>/dev/null'
    refute_output --partial cloudbox-lvebs
    assert_output --partial cbtest  # the user's group stays
    appliance 'vgremove -q -f cbtest && pvremove -q "$(cat /var/tmp/cbvg.loop)"; losetup -d "$(cat /var/tmp/cbvg.loop)";
        rm -f /var/tmp/cbvg.img /var/tmp/cbvg.loop /var/tmp/kvm-ebs-nvme-lv.toml' 2>&1 | grep -v leaked >&3 || true
}

# bats test_tags=slow,image,volumes,volumes-full
@test "the host's own RAID 0: mdadm stripes three loop devices; the guest's one disk and the baseline on the array" {
    # The image assembles no array by itself and runs no md monitor or check (a lab's RAID disks stay as they are).
    run -0 appliance 'grep -x "AUTO -all" /etc/mdadm/mdadm.conf; systemctl is-enabled mdmonitor.service mdcheck_start.timer; :'
    assert_output $'AUTO -all\nmasked\nmasked'
    export MACHINE_SSH_TIMEOUT_S=${IMAGE_VOLUMES_RUN_TIMEOUT_S:-900}
    run appliance cloudbox run --profile virtio-raid0-host --suite storage --size 16M --tests seq-write-64k
    echo "$output" > "$VOL_LOGS/raid-host.txt"
    if run_again_if_guest_died_booting "$VOL_LOGS/raid-host.txt" appliance cloudbox run --profile virtio-raid0-host \
        --suite storage --size 16M --tests seq-write-64k; then :; fi
    [ "$status" -eq 0 ] || fail "the virtio-raid0-host run failed (exit $status); $VOL_LOGS/raid-host.txt: $(tail -20 "$VOL_LOGS/raid-host.txt")"
    assert_output --regexp 'host md array: /dev/md1[0-9][0-9], RAID 0 over loop[0-9]+, loop[0-9]+, loop[0-9]+ \(64 KiB chunks\)'
    MACHINE_SSH_TIMEOUT_S=120 appliance cloudbox results export --format json > "$VOL_LOGS/raid-host.json"
    run -0 checks host-raid "$VOL_LOGS/raid-host.json"
    echo "# $output" >&3
    # The array stopped and its loops detached before the run's files went.
    run -0 appliance 'ls /sys/block | grep "^md"; losetup -a | grep /var/lib/cloudbox/work; ls /var/lib/cloudbox/work; :'
    assert_output ''
}

# bats test_tags=slow,image,volumes,volumes-full
@test "the guest's own aoe driver reads the volume; the host domain's row first, over a veth pair" {
    volume_run aoe-guest kvm-ebs-aoe-guest aoe guest
}

# bats test_tags=slow,image,volumes,volumes-full
@test "a host-attached iSCSI run cancelled while its guest writes leaves no session, target, device or export" {
    export MACHINE_SSH_TIMEOUT_S=300
    run -0 appliance cloudbox run --profile kvm-ebs-iscsi-host --suite storage --size 16M --tests smoke --detach
    rid=$(grep -oE 'run [0-9]+ started' <<<"$output" | grep -oE '[0-9]+')
    [ -n "$rid" ] || fail "no run id in: $output"
    guest_up() { appliance virsh -c qemu:///system list --name 2>/dev/null | grep -q '^cloudbox-kvm-ebs-iscsi-host-'; }
    wait_for 600 3 guest_up || fail "run $rid never launched its guest: $(appliance cloudbox results show "$rid" | tail -20)"
    sleep 10  # into the guest's tests
    run -0 appliance iscsiadm -m session  # attached while it runs: the check below could find something
    assert_output --partial 'iqn.2026-11.org.cloudbox:vol.ebs'
    run -0 appliance cloudbox cancel "$rid"
    stopped() { ! appliance cloudbox results show "$rid" | grep -qE '^  state +running'; }
    wait_for 180 3 stopped || fail "run $rid still running 180 s after cancel"
    run -0 appliance cloudbox results show "$rid"
    assert_output --regexp '  state +aborted'
    run -0 appliance virsh -c qemu:///system list --name
    refute_output --partial 'cloudbox-'
    assert_nothing_left cancel
}

# bats test_tags=slow,image,volumes,volumes-full
@test "the box's servers refuse a wrong CHAP secret, an NBD client without its certificate, an NQN off the allow-list and a wrong key" {
    export MACHINE_SSH_TIMEOUT_S=300
    appliance 'cat > /root/volume_refusals.py' < "$REPO/tests/helpers/volume_refusals.py"
    # The servers run while the serving side's standard input stays open: a fifo held by a sleep here.
    appliance 'rm -f /root/refusals.in; mkfifo /root/refusals.in; (sleep 600 > /root/refusals.in 2>/dev/null &)
        nohup /usr/lib/cloudbox/venv/bin/python /root/volume_refusals.py serve - 127.0.0.1 < /root/refusals.in \
            > /root/refusals.json 2> /root/refusals.err &'
    served() { appliance test -s /root/refusals.json; }
    wait_for 60 1 served || fail "the servers did not start: $(appliance cat /root/refusals.err)"
    run appliance '/usr/lib/cloudbox/venv/bin/python /root/volume_refusals.py try "$(cat /root/refusals.json)"'
    echo "$output" > "$VOL_LOGS/refusals.txt"
    appliance 'pkill -f "sleep 60[0]"; sleep 3; :'  # [0]: the pattern does not match this command line itself
    echo "$output" | sed 's/^/# /' >&3
    assert_success
    assert_line --partial 'iSCSI with a wrong CHAP secret: refused'
    assert_line --partial 'NBD without a client certificate: refused'
    assert_line --partial 'NVMe/TCP from a host NQN not on the allow-list: refused'
    assert_line --partial "iSCSI with this node's own CHAP secret: let in"
    assert_nothing_left refusals
}
