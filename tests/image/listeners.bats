#!/usr/bin/env bats
# Boots the appliance (live system, UEFI, TCG) and lists every listening TCP and UDP socket (`ss -tulpn`) against the
# allow-list in docs/cluster.md ("Listening sockets", the rows an idle node may show): a package that starts a server
# fails this the day it is added. Slow: one boot, minutes under TCG.

bats_require_minimum_version 1.5.0

setup_file() {
    load '../helpers/image-build'
    load '../helpers/image-boot'
    export IMAGE_DIR IMAGE
    export LISTEN_LOGS=${IMAGE_TEST_LOGS:-$IMAGE_DIR/test-logs}/listeners
    export LISTEN_PORT=${IMAGE_LISTENERS_SSH_PORT:-10024}
    mkdir -p "$LISTEN_LOGS"
    if [ ! -f "$IMAGE" ]; then
        image_build "$IMAGE_DIR" >&3 2>&1
    fi
    start=$(date +%s)
    image_start uefi "$LISTEN_LOGS" "$LISTEN_PORT"
    echo "$IMAGE_QEMU_PID" > "$LISTEN_LOGS/qemu.pid"
    image_wait_ssh "$LISTEN_LOGS" "$LISTEN_PORT" "${IMAGE_BOOT_TIMEOUT_S:-600}"
    # Every unit started (or failed): what listens at boot listens now. `--wait` ends with running or degraded.
    IMAGE_SSH_TIMEOUT_S=600 image_ssh "$LISTEN_LOGS" "$LISTEN_PORT" systemctl is-system-running --wait \
        > "$LISTEN_LOGS/system-state" 2>&1 || :
    echo "# appliance booted ($(cat "$LISTEN_LOGS/system-state")) after $(( $(date +%s) - start )) s" >&3
}

teardown_file() {
    load '../helpers/image-boot'
    IMAGE_QEMU_PID=$(cat "$LISTEN_LOGS/qemu.pid" 2>/dev/null)
    IMAGE_SSH_TIMEOUT_S=120 image_ssh "$LISTEN_LOGS" "$LISTEN_PORT" journalctl -b --no-pager \
        > "$LISTEN_LOGS/journal.txt" 2>&1 || :
    image_stop "$LISTEN_LOGS" "$LISTEN_PORT"
}

setup() {
    load '/usr/lib/bats/bats-support/load'
    load '/usr/lib/bats/bats-assert/load'
    load '../helpers/image-boot'
    REPO=$(cd "$BATS_TEST_DIRNAME/../.." && pwd)
}

teardown() {
    if [ "${BATS_TEST_COMPLETED:-}" != 1 ]; then
        echo "# guest logs kept in $LISTEN_LOGS (serial.log, journal.txt, qemu.log, ss.txt)" >&3
    fi
}

# The allow-list's idle rows as "PROTO PORT PROCESS BIND" lines (one per protocol of a row).
allowed_listeners() {
    sed -n '/<!-- listeners:begin -->/,/<!-- listeners:end -->/p' "$REPO/docs/cluster.md" |
        awk -F'|' '/^\|/ {
            for (i = 2; i <= 6; i++) { gsub(/^ +| +$/, "", $i) }
            if ($6 != "yes") next
            n = split($2, protos, /, */)
            for (j = 1; j <= n; j++) print protos[j], $3, $4, ($5 == "loopback" ? "loopback" : "any")
        }'
}

# `ss -Htulpn` lines as "PROTO PORT PROCESS ADDRESS" (address without brackets or %interface).
listening() {
    awk '{
        local = $5; port = local; sub(/.*:/, "", port)
        addr = local; sub(/:[^:]*$/, "", addr); sub(/%.*/, "", addr); gsub(/[][]/, "", addr)
        proc = "-"; if (match($0, /users:\(\("[^"]+"/)) { proc = substr($0, RSTART + 9, RLENGTH - 10) }
        print $1, port, proc, addr
    }' "$1"
}

# bats test_tags=slow,image
@test "the allow-list in docs/cluster.md parses and names sshd" {
    run -0 allowed_listeners
    assert_line "tcp 22 sshd any"
    assert_line "udp 53 systemd-resolve loopback"
}

# bats test_tags=slow,image
@test "every listening socket on a booted node is on the allow-list (ss -tulpn)" {
    run -0 image_ssh "$LISTEN_LOGS" "$LISTEN_PORT" ss -Htulpn
    printf '%s\n' "$output" > "$LISTEN_LOGS/ss.txt"
    [ -n "$output" ]  # sshd at least: we are talking to it
    allowed=$(allowed_listeners)
    offenders=()
    while read -r proto port proc addr; do
        [ -n "$proto" ] || continue
        ok=
        while read -r a_proto a_port a_proc a_bind; do
            [ "$proto" = "$a_proto" ] && [ "$port" = "$a_port" ] && [ "$proc" = "$a_proc" ] || continue
            if [ "$a_bind" = loopback ] && ! [[ "$addr" =~ ^127\. || "$addr" = ::1 ]]; then
                continue
            fi
            ok=1
            break
        done <<< "$allowed"
        [ -n "$ok" ] || offenders+=("$proto $addr:$port ($proc)")
    done < <(listening "$LISTEN_LOGS/ss.txt")
    if [ "${#offenders[@]}" -gt 0 ]; then
        fail "listening but not on the allow-list in docs/cluster.md (\"Listening sockets\"): ${offenders[*]}; all of ss -tulpn is in $LISTEN_LOGS/ss.txt"
    fi
}

# bats test_tags=slow,image
@test "Debian's iperf3 server and netperf's boot-time netserver do not run" {
    run image_ssh "$LISTEN_LOGS" "$LISTEN_PORT" systemctl is-enabled iperf3.service netperf.service
    assert_line --index 0 disabled
    assert_line --index 1 --regexp "^masked"
    run -1 image_ssh "$LISTEN_LOGS" "$LISTEN_PORT" pgrep -x 'iperf3|netserver'
}
