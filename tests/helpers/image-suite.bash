# The life of an appliance suite (tests/image/*.bats: its setup_file and teardown_file) in one place, after Lima's
# ensure_instance. IMAGE_REUSE=1 is its one switch: what a suite makes is kept when it ends (its running appliance, its
# installed disks, its image copy) and taken up again by the suite's next run while it is still there, for iterating
# on a suite's later tests without its boots and installs. Without it (the default, and in make test) every run starts
# from nothing and leaves only its logs. The tests are the same either way.

# reusing: whether this run keeps what its suite makes and takes up what a run before kept (IMAGE_REUSE=1).
reusing() { [ "${IMAGE_REUSE:-0}" = 1 ]; }

# suite_begin [NAME]: the suite's log directory, $IMAGE_TEST_LOGS (default $IMAGE_DIR/test-logs) or NAME under it,
# made and exported as SUITE_LOGS; the image is built when it is missing (image_ensure).
suite_begin() {
    SUITE_LOGS=${IMAGE_TEST_LOGS:-$IMAGE_DIR/test-logs}${1:+/$1}
    export SUITE_LOGS
    mkdir -p "$SUITE_LOGS"
    image_ensure >&3 2>&1
}

# suite_fresh FILE...: in setup_file, removes what a run before left, unless IMAGE_REUSE=1 takes it up.
suite_fresh() {
    reusing || rm -f "$@"
}

# suite_done FILE...: in teardown_file, removes what this run made (disk images, copies of the image), unless
# IMAGE_REUSE=1 keeps it for the next run; the logs stay either way.
suite_done() {
    if reusing; then
        [ $# -eq 0 ] || note "IMAGE_REUSE=1: kept for the next run: $*"
        return 0
    fi
    rm -f "$@"
}

# appliance_ensure LOGDIR PORT [QEMU_ARG...]: a live appliance (image_start: UEFI, SSH on 127.0.0.1:PORT, QEMU_ARGs
# added) with one SSH connection
# shared, QEMU_PID its process. With IMAGE_REUSE=1 it is the one this suite left running in LOGDIR, when that still
# answers over SSH (on the port it was started with); otherwise a fresh boot, after stopping any one left. Exports
# APPLIANCE_PORT (the port it answers on) and APPLIANCE_REUSED (1 when taken up, else 0).
appliance_ensure() {
    local logdir=$1 port=$2 left old_port
    shift 2
    left=$(_appliance_left "$logdir") || left=
    old_port=$(cat "$logdir/appliance.port" 2>/dev/null) || old_port=0
    APPLIANCE_REUSED=0
    if reusing && [ -n "$left" ] && _machine_answers "$logdir" "$old_port"; then
        QEMU_PID=$left APPLIANCE_PORT=$old_port APPLIANCE_REUSED=1
        export APPLIANCE_PORT APPLIANCE_REUSED
        machine_ssh_share "$logdir" "$old_port"
        note "IMAGE_REUSE=1: the appliance a run before left (QEMU pid $left, SSH port $old_port)"
        return 0
    fi
    if [ -n "$left" ]; then
        machine_stop "$logdir" "$old_port" "$left" "$logdir/journal.txt"
    fi
    rm -f "$logdir/appliance.pid" "$logdir/appliance.port"
    APPLIANCE_PORT=$port
    export APPLIANCE_PORT APPLIANCE_REUSED
    image_start uefi "$logdir" "$port" "$@" || return 1
    echo "$QEMU_PID" > "$logdir/appliance.pid"
    echo "$port" > "$logdir/appliance.port"
    machine_wait_ssh "$logdir" "$port" "$QEMU_PID" "${IMAGE_BOOT_TIMEOUT_S:-600}" || return 1
    note "appliance reachable over SSH after $WAITED_S s"
}

# appliance_release LOGDIR: in teardown_file, the appliance's journal, a clean power-off and its overlay removed
# (machine_stop); with IMAGE_REUSE=1 it stays up for the next run instead.
appliance_release() {
    local logdir=$1
    if reusing && [ -n "${QEMU_PID:-}" ] && kill -0 "$QEMU_PID" 2>/dev/null; then
        machine_ssh_unshare "${APPLIANCE_PORT:-0}"
        note "IMAGE_REUSE=1: the appliance stays up for the next run (QEMU pid $QEMU_PID, SSH port ${APPLIANCE_PORT:-?})"
        return 0
    fi
    machine_stop "$logdir" "${APPLIANCE_PORT:-0}" "${QEMU_PID:-}" "$logdir/journal.txt"
    rm -f "$logdir/disk.qcow2" "$logdir/appliance.pid" "$logdir/appliance.port"
}

# _appliance_left LOGDIR: the PID of the appliance a run before left running from LOGDIR: the recorded process, if it
# is still a QEMU on LOGDIR's overlay (a PID alone may have been reused by another process since).
_appliance_left() {
    local pid
    pid=$(cat "$1/appliance.pid" 2>/dev/null) || return 1
    [ -n "$pid" ] && tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -qF "file=$1/disk.qcow2" || return 1
    echo "$pid"
}
