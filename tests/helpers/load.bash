# Loaded once at the top of every suite (`load helpers/load`; `load ../helpers/load` under tests/image): strict
# mode, bats-support, bats-assert and bats-file, the shared waiting helpers, and every helper file in this directory.
set -o errexit -o nounset -o pipefail

bats_require_minimum_version 1.5.0
bats_load_library bats-support
bats_load_library bats-assert
bats_load_library bats-file

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

# needs TOOL...: skips the test (or, in setup_file, the file), naming every TOOL that is not on PATH.
needs() {
    local t missing=()
    for t in "$@"; do
        command -v "$t" > /dev/null || missing+=("$t")
    done
    [ ${#missing[@]} -eq 0 ] || skip "needs ${missing[*]} (scripts/install-deps test installs the test tools)"
}

# note TEXT: a line on the TAP stream (bats shows it at once), or on stderr outside a test.
note() {
    if { true >&3; } 2>/dev/null; then echo "# $*" >&3; else echo "$*" >&2; fi
}

# retry N DELAY_S CMD...: runs CMD up to N times, DELAY_S seconds apart, until it succeeds; each failed attempt but
# the last is announced (# retry). Returns CMD's last status. In CMD errexit is off: its status is its last command's.
retry() {
    local _tries=$1 _delay=$2 _i _rc
    shift 2
    for ((_i = 1; ; _i++)); do
        _rc=0
        "$@" || _rc=$?
        [ "$_rc" -eq 0 ] && return 0
        [ "$_i" -ge "$_tries" ] && return "$_rc"
        note "retry: attempt $_i of $_tries failed (exit $_rc): $*"
        sleep "$_delay"
    done
}

# wait_for [--alive PID] TIMEOUT_S INTERVAL_S CMD...: runs CMD every INTERVAL_S seconds until it succeeds, for at most
# TIMEOUT_S seconds; with --alive, gives up as soon as process PID has ended. Returns 0, 1 (timeout) or 2 (PID
# ended), saying which on stderr; WAITED_S holds the seconds waited either way.
wait_for() {
    local _pid='' _start _timeout _interval
    if [ "$1" = --alive ]; then
        _pid=$2
        shift 2
    fi
    _timeout=$1 _interval=$2
    shift 2
    _start=$SECONDS
    until "$@"; do
        WAITED_S=$((SECONDS - _start))
        if [ -n "$_pid" ] && ! kill -0 "$_pid" 2> /dev/null; then
            echo "wait_for: process $_pid ended after $WAITED_S s, before: $*" >&2
            return 2
        fi
        if [ "$WAITED_S" -ge "$_timeout" ]; then
            echo "wait_for: gave up after $WAITED_S s: $*" >&2
            return 1
        fi
        sleep "$_interval"
    done
    WAITED_S=$((SECONDS - _start))
}

# pid_gone PID: whether process PID has ended (for wait_for).
pid_gone() { ! kill -0 "$1" 2> /dev/null; }

for _helper in qemu image-boot image-suite image-install image-cluster guest-image tui; do
    # shellcheck source=/dev/null
    source "$REPO/tests/helpers/$_helper.bash"
done
unset _helper
