#!/usr/bin/env bats
# A two-node cloud from the USB image under QEMU TCG (the done-when of issue 5): unattended installs of a front-end
# and a back-end onto blank disks, both booted from their disks with a private virtual link (QEMU socket, MTU 9000
# set by the nodes), the back-end enrolled with a join code found by DHCP discovery (a wrong code refused first),
# and the quick storage and network suites run by the front-end on a guest on the back-end under nested KVM, the
# results read from the front-end's database with both nodes named. Slow: the tests build on each other in file
# order. Logs: $IMAGE_DIR/test-logs/cluster (NAME.serial.log, NAME.qemu.log, NAME.journal.txt, run.txt, run.json).

bats_require_minimum_version 1.5.0

FE_CAMPUS=52:54:00:cb:01:01
FE_PRIVATE=52:54:00:cb:01:02
BE_CAMPUS=52:54:00:cb:02:01
BE_PRIVATE=52:54:00:cb:02:02

setup_file() {
    load '../helpers/image-build'
    load '../helpers/image-boot'
    load '../helpers/image-install'
    load '../helpers/image-cluster'
    export IMAGE_DIR IMAGE
    export LOGS=${IMAGE_TEST_LOGS:-$IMAGE_DIR/test-logs}/cluster
    mkdir -p "$LOGS"
    if [ ! -f "$IMAGE" ]; then
        image_build "$IMAGE_DIR" >&3 2>&1
    fi
    [ -f "$IMAGE" ]
    rm -f "$LOGS"/*.seconds "$LOGS"/run*.txt "$LOGS"/*.json "$LOGS"/{booted,enrolled,run}.ok
    # IMAGE_CLUSTER_REUSE=1 (with IMAGE_CLUSTER_KEEP_DISKS=1 on the run before): keep the installed disks and
    # start at the boots, for iterating on the later tests.
    if [ "${IMAGE_CLUSTER_REUSE:-0}" != 1 ]; then
        rm -f "$LOGS"/*.raw "$LOGS"/*.toml "$LOGS"/*.ok
    fi
    image_make_credentials "$LOGS"
    openssl passwd -6 -stdin < "$LOGS/root-password" > "$LOGS/root-hash"
    install_disk "$LOGS/data.raw" 1G
    mkfs.ext4 -q -L precious "$LOGS/data.raw"
    sha256sum < "$LOGS/data.raw" | cut -d' ' -f1 > "$LOGS/data.sha"
    local key
    key=$(cat "$LOGS/id_ed25519.pub")
    cat > "$LOGS/fe.toml" <<TOML
role = "front-end"
hostname = "fe1"

[disk]
target = "/dev/disk/by-id/virtio-cbtarget"

[network]
private_nic = "$FE_PRIVATE"
campus_nic = "$FE_CAMPUS"
private_mtu = 9000

[root]
password_hash = "$(cat "$LOGS/root-hash")"
ssh_authorized_keys = ["$key"]
TOML
    cat > "$LOGS/be.toml" <<TOML
role = "back-end"
hostname = "be1"

[disk]
target = "/dev/disk/by-id/virtio-cbtarget"

[network]
private_nic = "$BE_PRIVATE"
campus_nic = "$BE_CAMPUS"
private_mtu = 9000
frontend = "discover"

[root]
ssh_authorized_keys = ["$key"]
TOML
    cluster_free_port > "$LOGS/fe.port"
    cluster_free_port > "$LOGS/be.port"
    cluster_free_port > "$LOGS/link.port"
}

teardown_file() {
    load '../helpers/image-boot'
    load '../helpers/image-cluster'
    cluster_stop "$LOGS" fe1 "$(cat "$LOGS/fe.port")"
    cluster_stop "$LOGS" be1 "$(cat "$LOGS/be.port")"
    if [ "${IMAGE_CLUSTER_KEEP_DISKS:-0}" != 1 ]; then
        rm -f "$LOGS"/*.raw
    fi
}

setup() {
    load '/usr/lib/bats/bats-support/load'
    load '/usr/lib/bats/bats-assert/load'
    load '../helpers/image-boot'
    load '../helpers/image-install'
    load '../helpers/image-cluster'
    FE_PORT=$(cat "$LOGS/fe.port") BE_PORT=$(cat "$LOGS/be.port")
}

teardown() {
    if [ "${BATS_TEST_COMPLETED:-}" != 1 ]; then
        echo "# logs kept in $LOGS" >&3
    fi
}

fe() { cluster_ssh "$LOGS" "$FE_PORT" "$@"; }
be() { cluster_ssh "$LOGS" "$BE_PORT" "$@"; }

# bats test_tags=slow,image,cluster
@test "a front-end and a back-end install unattended side by side; the disk with data is untouched" {
    if [ "${IMAGE_CLUSTER_REUSE:-0}" = 1 ] && [ -f "$LOGS/installed.ok" ]; then
        skip "IMAGE_CLUSTER_REUSE=1: the disks installed by an earlier run are used"
    fi
    install_disk "$LOGS/fe.raw" 12G
    install_disk "$LOGS/be.raw" 12G
    start=$(date +%s)
    (INSTALL_CAMPUS_MAC=$FE_CAMPUS INSTALL_PRIVATE_MAC=$FE_PRIVATE
     install_live uefi "$LOGS" fe-live overlay "$LOGS/fe.toml" "$LOGS/fe.raw:cbtarget") &
    fe_pid=$!
    (INSTALL_CAMPUS_MAC=$BE_CAMPUS INSTALL_PRIVATE_MAC=$BE_PRIVATE
     install_live uefi "$LOGS" be-live overlay "$LOGS/be.toml" "$LOGS/be.raw:cbtarget" "$LOGS/data.raw:cbdata") &
    be_pid=$!
    wait "$fe_pid" "$be_pid"
    echo $(( $(date +%s) - start )) > "$LOGS/install.seconds"
    echo "# both live boots + installs + reboots: $(cat "$LOGS/install.seconds") s (fe $(cat "$LOGS/fe-live.seconds"), be $(cat "$LOGS/be-live.seconds"))" >&3
    run -0 cat "$LOGS/fe-live.rc" "$LOGS/be-live.rc"
    assert_output $'0\n0'
    run -0 grep -a 'cloudbox: installed front-end fe1 on /dev/vd' "$LOGS/fe-live.serial.log"
    run -0 grep -a 'cloudbox: installed back-end be1 on /dev/vd' "$LOGS/be-live.serial.log"
    run -0 sh -c "sha256sum < '$LOGS/data.raw' | cut -d' ' -f1"
    assert_output "$(cat "$LOGS/data.sha")"
    run -0 grep -a '\[1/7 partition\].*copying the root file system' "$LOGS/fe-live.serial.log"
    # What the front-end got, read from its disk on the host (read-only); install.bats's UEFI front-end install
    # (tagged install-full) checks the same. Then what only the cluster's front-end has: the private network served.
    install_assert_frontend "$LOGS/fe.raw" "$FE_PRIVATE" "$LOGS"
    run -0 install_cat "$LOGS/fe.raw" /etc/systemd/network/10-cloudbox-private.network
    assert_line 'Address=10.73.0.1/24'
    assert_line 'DHCPServer=yes'
    run -0 install_cat "$LOGS/be.raw" /etc/shadow
    assert_line --regexp '^root:!:'  # no password in the back-end's answers: locked, SSH key only
    run -0 install_cat "$LOGS/be.raw" /etc/cloudbox/node.toml
    assert_line 'frontend = "discover"'
    run -0 install_cat "$LOGS/be.raw" /etc/systemd/network/10-cloudbox-private.netdev
    assert_line 'Name=cbpriv0'
    touch "$LOGS/installed.ok"
}

# bats test_tags=slow,image,cluster
@test "both nodes boot from their disks; the back-end gets its private address from the front-end; 9000-byte frames pass" {
    [ -f "$LOGS/installed.ok" ] || skip "needs the installs of the first test"
    start=$(date +%s)
    echo "$start" > "$LOGS/power-on.t"
    cluster_start "$LOGS" fe1 "$LOGS/fe.raw" "$FE_CAMPUS" "$FE_PRIVATE" "$FE_PORT" listen "$(cat "$LOGS/link.port")"
    sleep 2  # the front-end's QEMU listens on the link before the back-end's connects
    cluster_start "$LOGS" be1 "$LOGS/be.raw" "$BE_CAMPUS" "$BE_PRIVATE" "$BE_PORT" connect "$(cat "$LOGS/link.port")"
    cluster_wait_ssh "$LOGS" fe1 "$FE_PORT" 600
    cluster_wait_ssh "$LOGS" be1 "$BE_PORT" 600
    echo $(( $(date +%s) - start )) > "$LOGS/boot.seconds"
    echo "# power-on to SSH on both nodes: $(cat "$LOGS/boot.seconds") s" >&3
    run -0 fe ip -4 -o addr show
    assert_output --partial 'inet 10.73.0.1/24'
    run -0 fe cat /etc/hostname
    assert_output fe1
    # Booted from the installed disk (its root partition), not installing again, with its own host key and no
    # failed unit (what the self-test's verdict checks on a test boot; install.bats's install-full boots do that).
    run -0 grep -a 'Kernel command line:.* root=PARTUUID=' "$LOGS/fe1.serial.log"
    run -1 grep -a 'unattended install with the answers' "$LOGS/fe1.serial.log"
    run -0 fe test -s /etc/ssh/ssh_host_ed25519_key
    run -0 fe systemctl --failed --no-legend --plain
    assert_output ''
    run -0 be systemctl --failed --no-legend --plain
    assert_output ''
    # The back-end's lease from the front-end's DHCP server (networkd's) on the private NIC.
    for _ in $(seq 1 30); do
        be ip -4 -o addr show | grep -q 'inet 10\.73\.0\.' && break
        sleep 3
    done
    # ... on the bridge cbpriv0, whose port is the private NIC (the back-end's guests join that bridge).
    run -0 be ip -4 -o addr show dev cbpriv0
    assert_output --regexp 'inet 10\.73\.0\.[0-9]+/24'
    run -0 be "ip -o link | grep -i $BE_PRIVATE"
    assert_output --partial 'mtu 9000'
    assert_output --partial 'master cbpriv0'
    run -0 be ip -o link show dev cbpriv0
    assert_output --partial 'mtu 9000'
    # Names on the private network: multicast DNS (systemd-resolved), each way.
    for _ in $(seq 1 10); do
        be resolvectl query fe1.local 2>/dev/null | grep -q 10.73.0.1 && break
        sleep 3
    done
    run -0 be resolvectl query fe1.local
    assert_output --partial '10.73.0.1'
    run -0 fe getent ahostsv4 be1.local
    assert_output --regexp '10\.73\.0\.[0-9]+ +STREAM be1\.local'
    # Don't-fragment pings at full size cross the link; one byte more does not leave the NIC.
    run -0 be ping -c 3 -W 5 -M do -s 8972 10.73.0.1
    assert_output --partial '3 received'
    run be ping -c 1 -W 2 -M do -s 8973 10.73.0.1
    assert_failure
    assert_output --regexp '[Mm]essage too long'
    touch "$LOGS/booted.ok"
}

# bats test_tags=slow,image,cluster
@test "a wrong join code is refused; the right one enrols the back-end, which finds the front-end by DHCP" {
    [ -f "$LOGS/booted.ok" ] || skip "needs both nodes up (previous test)"
    start=$(date +%s)
    run -0 fe cloudbox node code --minutes 10
    echo "$output" > "$LOGS/code.txt"
    assert_output --partial 'on the back-end:  cloudbox node join --front-end 10.73.0.1 --code '
    code=$(grep -oE '[0-9A-Z]{4}-[0-9A-Z]{4}-[0-9A-Z]{4}-[0-9A-Z]{4}' "$LOGS/code.txt" | head -1)
    [ -n "$code" ]
    wrong=$(python3 -c "import random; a='0123456789ABCDEFGHJKMNPQRSTVWXYZ'; print('-'.join(''.join(random.choice(a) for _ in range(4)) for _ in range(4)))")
    [ "$wrong" != "$code" ]
    for _ in $(seq 1 10); do  # the enrolment server was just started: give it a moment to listen
        run be cloudbox node join --front-end discover --code "$wrong"
        grep -q 'cannot reach' <<<"$output" || break
        sleep 2
    done
    assert_failure
    assert_output --partial 'discovered the front-end at 10.73.0.1'
    assert_output --partial 'wrong join code'
    run -0 be test ! -e /var/lib/cloudbox/nodes/frontend.json  # nothing was installed
    run -0 be cloudbox node join --front-end discover --code "$code"
    assert_output --partial 'enrolled as be1 with front-end fe1 (10.73.0.1)'
    assert_output --partial 'be1 (cbpriv0) -> fe1 (10.73.0.1): 9000-byte frames pass'
    assert_output --partial 'libvirt on this node answers'
    run -0 be grep -c 'cloudbox-front-end' /root/.ssh/authorized_keys
    assert_output 1
    # The front-end reaches the back-end's libvirt over the pinned SSH. A check gives up after 10 s, and the TCG
    # back-end once missed the first one (CI, before the join started its libvirt): up to 3, each miss printed.
    local try
    for try in 1 2 3; do
        run fe cloudbox node check
        [ "$status" -eq 0 ] && break
        echo "# note: node check $try of 3: $output" >&3
    done
    assert_success
    assert_output --partial 'be1: up'
    assert_output --regexp 'be1: fe1 \([a-z0-9]+\) -> be1 \(10\.73\.0\.[0-9]+\): 9000-byte frames pass'
    # The installed front-end's monitor (cloudbox-node-check.service) runs; the back-end has none.
    run -0 fe systemctl is-active cloudbox-node-check.service
    run be systemctl is-active cloudbox-node-check.service
    assert_failure
    echo $(( $(date +%s) - $(cat "$LOGS/power-on.t") )) > "$LOGS/ready.seconds"
    echo $(( $(date +%s) - start )) > "$LOGS/enrol.seconds"
    echo "# enrolment: $(cat "$LOGS/enrol.seconds") s; power-on to cluster ready: $(cat "$LOGS/ready.seconds") s" >&3
    # A reused code is refused too (the code is spent).
    run be cloudbox node join --front-end discover --code "$code"
    assert_failure
    touch "$LOGS/enrolled.ok"
}

# bats test_tags=slow,image,cluster
@test "the front-end runs the quick storage and network suites on a guest on the back-end (nested KVM)" {
    [ -f "$LOGS/enrolled.ok" ] || skip "needs the enrolled back-end (previous test)"
    export CLUSTER_SSH_TIMEOUT_S=${IMAGE_CLUSTER_RUN_TIMEOUT_S:-1500}
    run fe cloudbox run --node be1 --profile virtio-disk --suite all --size quick
    echo "$output" > "$LOGS/run.txt"
    # One announced retry, only when the nested guest died while booting (docs/image.md, bench.bats does the same).
    if [ "$status" -ne 0 ] && grep -qE "^==> run (failed|aborted): .*stopped while booting" <<<"$output"; then
        mv "$LOGS/run.txt" "$LOGS/run-attempt1.txt"
        echo "# RETRY: the nested guest on be1 stopped while booting; attempt 1 in $LOGS/run-attempt1.txt" >&3
        run fe cloudbox run --node be1 --profile virtio-disk --suite all --size quick
        echo "$output" > "$LOGS/run.txt"
    fi
    lock=$(grep -a -m1 -E 'soft lockup|hard LOCKUP|rcu_[a-z]+ detected stalls' "$LOGS/be1.serial.log" || true)
    [ -z "$lock" ] || fail "the back-end's kernel locked up during the run (be1.serial.log: ${lock#*] })"
    # The reason (with the guest's last console lines when it died or went silent) comes before the results table.
    [ "$status" -eq 0 ] || fail "the run failed (exit $status); $LOGS/run.txt says: $(grep -a -A25 -m1 -E '^==> run (failed|aborted)|^cloudbox: ' "$LOGS/run.txt" || tail -25 "$LOGS/run.txt")"
    assert_output --partial 'be1: launching guest'
    CLUSTER_SSH_TIMEOUT_S=120 fe cloudbox results export --format json > "$LOGS/run.json"
    CLUSTER_SSH_TIMEOUT_S=60 fe cloudbox node propagations --json > "$LOGS/propagations.json"
    run -0 python3 - "$LOGS/run.json" "$LOGS/propagations.json" <<'PY'
import json, sys
run = json.load(open(sys.argv[1]))["runs"][-1]
props = json.load(open(sys.argv[2]))
prov = run["provenance"]
assert run["state"] == "completed", run["reason"]
assert run["node"] == "be1", run["node"]
assert prov["nodes"] == {"front-end": "fe1", "back-end": "be1"}, prov["nodes"]
assert prov["host"] == "be1" and prov["controller"]["host"] == "fe1", (prov["host"], prov["controller"])
assert prov["accelerator"]["name"] in ("kvm", "nested-kvm") and prov["accelerator"]["nested"], prov["accelerator"]
# the node's provenance came through: how many launches its guest needed (a second one is announced in the run)
assert prov.get("boot_attempts") in (1, 2), prov.get("boot_attempts")
sides = {(m["side"], m["test"]) for m in run["measurements"]}
tests = {t for _, t in sides}
assert any(s == "guest" for s, _ in sides) and any(s == "baseline" for s, _ in sides), sides
assert any(t.startswith("seq-") or "write" in t for t in tests), tests
assert any("tcp" in t for t in tests), tests
# Study A's guest -> other host: the guest on be1's private bridge to the front-end, beside be1's host -> fe1.
for t in ("tcp-stream-fe", "tcp-maerts-fe", "tcp-rr-fe"):
    assert ("guest", t) in sides and ("baseline", t) in sides, (t, sorted(sides))
for m in run["measurements"]:
    if m["side"] == "baseline" and m["test"].endswith("-fe"):
        assert "private-network" in m["labels"] and "nested" not in m["labels"], m
        assert "virtualized-host" in m["labels"], m  # be1 is a VM: its "bare metal" says so
net = prov["private_network"]  # the NIC's own knobs are the profile's (compare.knobs)
assert net["peer"] == "10.73.0.1" and net["bridge"] == "cbpriv0" and net["mtu"] == 9000, net
assert net["guest_ip"].startswith("10.73.0.") and net["guest_ip"] != net["host_ip"], net
assert prov["peer"]["peer"] == "10.73.0.1" and prov["peer"]["peer_netperf_port"] > 0, prov["peer"]
fe_tx = next(m["value"] for m in run["measurements"] if (m["side"], m["test"]) == ("guest", "tcp-stream-fe"))
for m in run["measurements"]:
    if m["side"] == "guest":
        assert "nested" in m["labels"], m
copies = [p for p in props if p["node"] == "be1" and not p["cached"]]
assert copies and copies[0]["bytes"] > 0 and copies[0]["mbps"] > 0, props
print(f"{len(run['measurements'])} measurements; guest boot attempts {prov['boot_attempts']}; "
      f"guest -> fe1 {fe_tx:.0f} Mbit/s; "
      f"image copy {copies[0]['bytes'] / 1e6:.1f} MB at {copies[0]['mbps']:.1f} MB/s")
PY
    echo "# $output" >&3
    touch "$LOGS/run.ok"
}

# bats test_tags=slow,image,cluster
@test "a back-end that disappears is shown down within 30 s" {
    [ -f "$LOGS/enrolled.ok" ] || skip "needs the enrolled back-end"
    kill -KILL "$(cat "$LOGS/be1.pid")"  # a power loss
    start=$(date +%s)
    # The front-end's monitor unit notices by itself: the registry's state, as `node list` and the TUI show it.
    state=
    while [ $(( $(date +%s) - start )) -le 40 ]; do
        state=$(CLUSTER_SSH_TIMEOUT_S=30 fe cloudbox node list --json |
                python3 -c 'import json, sys; print(next((n["shown_state"] for n in json.load(sys.stdin) if n["name"] == "be1"), "?"))') || :
        [ "$state" = down ] && break
        sleep 2
    done
    took=$(( $(date +%s) - start ))
    echo "# be1 shown down by cloudbox-node-check.service after $took s (state: $state)" >&3
    [ "$state" = down ]
    [ "$took" -le 30 ]
    CLUSTER_SSH_TIMEOUT_S=60 run fe cloudbox node check
    assert_failure
    assert_output --partial 'be1: down'
    if [ "${IMAGE_BENCH_RECORD:-0}" = 1 ] && [ -f "$LOGS/run.ok" ]; then
        cluster_record_bench "$LOGS"
    fi
}
