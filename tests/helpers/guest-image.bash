# Helpers for tests/guest-image.bats: boot the benchmark guest under QEMU and talk to its agent.

GUEST_BUILDER=${GUEST_BUILDER:-$REPO/appliance/guest/build-guest-image}

# qga SOCKET sync TIMEOUT | exec TIMEOUT PATH ARG... | send JSON: talk to the guest's agent (tests/helpers/qga.py).
qga() {
    /usr/bin/python3 "$REPO/tests/helpers/qga.py" "$@"
}

# guest_boot NAME QEMU-ARGS...   start QEMU (TCG) on the image in $GUEST_DIR; files in $GUEST_RUN/NAME.*
guest_boot() {
    local name=$1; shift
    : > "$GUEST_RUN/$name.log"
    qemu-system-x86_64 -accel tcg,thread=multi -smp 2 -m 512 -nodefaults -display none \
        -kernel "$GUEST_DIR/vmlinuz" -initrd "$GUEST_DIR/initrd.img" -append "console=ttyS0 ${GUEST_APPEND:-}" \
        -serial "file:$GUEST_RUN/$name.log" \
        -device virtio-serial -chardev "socket,path=$GUEST_RUN/$name.qga,server=on,wait=off,id=qga0" \
        -device virtserialport,chardev=qga0,name=org.qemu.guest_agent.0 \
        -pidfile "$GUEST_RUN/$name.pid" -daemonize "$@"
}

# _guest_ready_or_failed NAME: the guest printed its ready line, or that it failed (guest_wait_ready tells which).
_guest_ready_or_failed() {
    grep -q -e '^cloudbox-guest: ready' -e '^cloudbox-guest: failed' "$GUEST_RUN/$1.log" 2>/dev/null
}

# guest_wait_ready NAME TIMEOUT   wait for the ready line and an answering agent; prints seconds taken
guest_wait_ready() {
    local name=$1 timeout=$2 start=$EPOCHREALTIME end=$((SECONDS + $2)) rc=0
    wait_for --alive "$(cat "$GUEST_RUN/$name.pid")" "$timeout" 0.2 _guest_ready_or_failed "$name" 2>/dev/null || rc=$?
    case $rc in
        1) echo "no ready line after ${timeout}s" >&2; return 1 ;;
        2) echo "QEMU exited before ready" >&2; return 1 ;;
    esac
    if grep -q '^cloudbox-guest: failed' "$GUEST_RUN/$name.log"; then
        grep '^cloudbox-guest: error' "$GUEST_RUN/$name.log" >&2
        return 1
    fi
    qga "$GUEST_RUN/$name.qga" sync $((end - SECONDS + 1)) || return 1
    awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.1f\n", b - a}'
}

guest_running() {
    local pid
    pid=$(cat "$GUEST_RUN/$1.pid" 2>/dev/null) && kill -0 "$pid" 2>/dev/null
}

# guest_wait_exit NAME TIMEOUT    wait for QEMU to exit by itself (guest powered off)
guest_wait_exit() {
    wait_for "$2" 0.2 pid_gone "$(cat "$GUEST_RUN/$1.pid")"
}

# guest_kill_all: stops every guest of this test: TERM, then KILL what is still there 2 s later.
guest_kill_all() {
    local f pid
    for f in "$GUEST_RUN"/*.pid; do
        [ -f "$f" ] || continue
        pid=$(cat "$f" 2>/dev/null) || continue
        kill "$pid" 2>/dev/null || true
    done
    for f in "$GUEST_RUN"/*.pid; do
        [ -f "$f" ] || continue
        pid=$(cat "$f" 2>/dev/null) || continue
        wait_for 2 0.2 pid_gone "$pid" 2>/dev/null || kill -9 "$pid" 2>/dev/null || true
    done
}

guest_dump_logs() {
    local f
    for f in "$GUEST_RUN"/*.log; do
        [ -f "$f" ] || continue
        echo "----- serial log $f -----"
        tail -n 80 "$f"
    done
}
