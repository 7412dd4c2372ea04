#!/usr/bin/env bats
# The installed `cloudbox` TUI in a real terminal (tmux), driven by keys, checked by reading the screen:
# profile switch, guest launch and stop, a quick storage test, a run that outlives the TUI, the results
# comparison; plus 80x24 and a 16-colour terminal. Real libvirtd and QEMU (TCG here), real fio.
#
# The slow tests share one state dir and build on each other (the comparison compares the runs the
# earlier tests made). Run them under the host's libvirtd lock when others share the machine:
#   flock /var/lock/cloudbox-libvirtd.lock bats tests/tui.bats
# On failure the screens captured so far and the run logs are kept (the path is printed).

load helpers/load

# The profiles the slow tests use: switched to in the TUI, then (second run) chosen with the CLI.
PROFILE_A=virtio-file   # virtio-blk on a pre-allocated raw file
PROFILE_B=virtio-disk   # virtio-blk on a whole block device (a loop device here)

setup_file() {
    export CB=${CLOUDBOX_CMD:-$REPO/tui/.venv/bin/cloudbox}
    # Under /var/tmp and world-traversable: QEMU (user libvirt-qemu) opens the file backings in work/.
    BASE=$(mktemp -d /var/tmp/cloudbox-tui.XXXXXX)
    chmod 755 "$BASE"
    mkdir -p "$BASE/panes"
    export BASE TUI_SOCK="$BASE/tmux.sock" TUI_PANES="$BASE/panes"
    export CLOUDBOX_STATE_DIR="$BASE/state" CLOUDBOX_RUN_DIR="$BASE/run"
    # The first preset of the list active: its row, marked active, is on screen (the presets outnumber a
    # terminal's rows), and the profile switch below moves down from it.
    "$CB" profile use "$("$CB" profile list | awk 'NR == 1 {print $1}')" > /dev/null
}

teardown_file() {
    [ -n "${BASE:-}" ] && [ -d "$BASE" ] || return 0
    tui_tmux kill-server 2>/dev/null || true
    cancel_running_runs   # no run outlives this file
    if [ -f "$BASE/failed" ]; then
        local keep
        keep=$(mktemp -d /var/tmp/cloudbox-tui-failed.XXXXXX)
        cp -a "$TUI_PANES" "$keep/panes"
        [ -d "$CLOUDBOX_STATE_DIR/logs" ] && cp -a "$CLOUDBOX_STATE_DIR/logs" "$keep/logs"
        echo "# tui.bats: screens and run logs kept in $keep" >&3
    fi
    # Daemons the runs started (recorded in our run dir) are stopped, as the pytest suites do.
    if [ -f "$CLOUDBOX_RUN_DIR/daemons.json" ] && [ "${CLOUDBOX_KEEP_DAEMONS:-0}" != 1 ]; then
        "$REPO/tui/.venv/bin/python" -c 'from cloudbox.core.virt import daemons; daemons.stop_started_daemons()' || true
    fi
    rm -rf "$BASE"
}

setup() {
    needs tmux
    [ -x "$CB" ] || skip "no cloudbox command at $CB (make venv)"
}

teardown() {
    if [ -z "${BATS_TEST_COMPLETED:-}" ]; then
        touch "$BASE/failed"
        local s
        for s in $(tui_tmux list-sessions -F '#S' 2>/dev/null); do
            echo "----- last screen of tmux session $s -----"
            tui_capture "$s" teardown || true
        done
        for f in "$CLOUDBOX_STATE_DIR"/logs/*.log; do
            [ -f "$f" ] || continue
            echo "----- $f (tail) -----"
            tail -n 30 "$f"
        done
        cancel_running_runs   # so that the next test starts from a quiet host
    fi
    tui_tmux kill-server 2>/dev/null || true
}

# Real guests need root, the benchmark guest image and libvirt/QEMU.
need_guests() {
    [ "$(id -u)" = 0 ] || skip "guest launches and runs need root (libvirtd, loop devices, a bridge)"
    needs qemu-system-x86_64 virsh
    local img=${CLOUDBOX_GUEST_IMAGE:-/var/cache/cloudbox/guest}
    [ -f "$img/manifest.json" ] || skip "no benchmark guest image in $img (make guest-image)"
}

# sgr_codes FILE: every SGR parameter list (the part between ESC[ and m) in a `capture-pane -e` dump.
sgr_codes() { grep -oE $'\e\\[[0-9;:]*m' "$1" | sed -E $'s/^\e\\[//; s/m$//' | sort -u; }

# extended_colours: the SGR lists that use 256-colour or true-colour (38/48/58 followed by 5 or 2).
extended_colours() { grep -E '(^|;)(38|48|58)[;:](5|2)([;:]|$)' || true; }

@test "80x24: the overview and the tests screen render, in words, without a traceback" {
    tui_start small --size 80x24
    run -0 tui_wait small 60 'Active profile +[a-z]' overview
    assert_output --partial '[1 Overview]'
    assert_output --regexp 'Accelerator +(KVM|TCG|nested|unknown)'
    assert_output --partial 'Nodes'
    refute_output --partial 'Traceback'
    # The bar names every screen, and at 80 columns the footer still shows the screen's own keys.
    assert_output --partial '5 Results'
    assert_output --partial 'r Refresh'
    # A 256-colour terminal gets 256-colour codes: the 16-colour check below can tell the difference.
    tui_capture small overview-sgr -e > "$BATS_TEST_TMPDIR/sgr"
    run -0 extended_colours < <(sgr_codes "$BATS_TEST_TMPDIR/sgr")
    assert_output --regexp '.'

    tui_keys small 4
    run -0 tui_wait small 20 'Storage tests' tests
    assert_output --partial '[4 Tests]'
    for w in Suite Size 'Profiles:' 'storage' 'quick (128 MiB'; do assert_output --partial "$w"; done
    assert_output --partial 'a sweep'   # the profile list's label wraps at 80 columns instead of being cut
    assert_output --partial 's Start'
    refute_output --partial 'Traceback'
    tui_quit small
}

@test "16-colour terminal: only 16-colour SGR codes on every screen, status spelled out" {
    tui_start c16 --term xterm-16color
    run -0 tui_wait c16 60 'Active profile +[a-z]' overview
    assert_output --regexp 'WARNING: TCG emulation|NOTE: nested KVM|Accelerator: '
    local key title
    for key in 1 2 3 4 5; do
        case $key in 1) title=Overview ;; 2) title=Profiles ;; 3) title=Guests ;; 4) title=Tests ;; 5) title=Results ;; esac
        tui_keys c16 "$key"
        run -0 tui_wait c16 20 "\[$key $title\]" "screen-$key"
        tui_capture c16 "screen-$key-sgr" -e > "$BATS_TEST_TMPDIR/sgr-$key"
        sgr_codes "$BATS_TEST_TMPDIR/sgr-$key" > "$BATS_TEST_TMPDIR/codes-$key"
        # Colour is used at all (foreground or background from the 16)...
        run -0 grep -cE '(^|;)(3[0-7]|9[0-7]|4[0-7]|10[0-7])(;|$)' "$BATS_TEST_TMPDIR/codes-$key"
        # ...and never from the 256-colour or true-colour palettes.
        run -0 extended_colours < "$BATS_TEST_TMPDIR/codes-$key"
        assert_output ''
    done
    # The active profile is marked by a word, not a colour; so is the current screen.
    tui_keys c16 2
    run -0 tui_wait c16 20 '^ active +[a-z]' profiles-active
    tui_quit c16
}

@test "make run in a terminal opens the TUI; q ends it" {
    [ "$(id -u)" = 0 ] || skip "make run needs root (it may install packages and starts libvirtd)"
    tui_start mkrun --cmd make -- -C "$REPO" --no-print-directory run
    run -0 tui_wait mkrun 300 'Active profile +[a-z]' overview
    assert_output --partial '[1 Overview]'
    tui_quit mkrun
}

# bats test_tags=slow
@test "make run without a terminal says so and runs one real quick run" {
    need_guests
    run -0 make -C "$REPO" --no-print-directory run < /dev/null
    assert_line --partial "no terminal (stdin/stdout not a tty): the commands and one real quick run instead of the TUI"
    assert_output --partial "==> stored runs"
    run -0 sqlite3 "$CLOUDBOX_STATE_DIR/results.db" "select state || ' ' || suite from runs order by id desc limit 1"
    assert_output "completed all"
}

# bats test_tags=slow
@test "profile switch: Profiles (2), move to $PROFILE_A, u; the row says active and the CLI agrees" {
    need_guests
    # Where the TUI lists it: the same order as `cloudbox profile list`.
    local idx
    idx=$("$CB" profile list | awk -v p="$PROFILE_A" '$1 == p {print NR - 1}')
    [ -n "$idx" ] && [ "$idx" -gt 0 ]
    run -0 "$CB" profile list
    refute_line --regexp "^$PROFILE_A .*\[active\]"

    tui_start prof
    run -0 tui_wait prof 60 'Active profile +[a-z]' overview
    tui_keys prof 2
    run -0 tui_wait prof 20 '^ active +[a-z]' profiles
    refute_output --regexp "^ active +$PROFILE_A "
    for ((i = 0; i < idx; i++)); do tui_keys prof Down; done
    # The detail pane follows the cursor: it shows the profile's knobs, not yet marked active.
    run -0 tui_wait prof 10 "│ $PROFILE_A \(preset\)" detail
    refute_output --partial "$PROFILE_A (preset)  [active]"
    tui_keys prof u
    run -0 tui_wait prof 20 "^ active +$PROFILE_A +preset" switched
    assert_output --partial "$PROFILE_A (preset)  [active]"
    run -0 grep -cE '^ active ' <<<"$output"
    assert_output 1
    tui_quit prof

    run -0 "$CB" profile list
    assert_line --regexp "^$PROFILE_A .*\[active\]$"
    run -0 grep -c '\[active\]' <<<"$output"
    assert_output 1
}

# bats test_tags=slow
@test "guest launch: Guests (3), l, Enter; running with the profile; XML; stop leaves nothing behind" {
    need_guests
    tui_start guests
    run -0 tui_wait guests 60 'Active profile +[a-z]' overview
    tui_keys guests 3
    run -0 tui_wait guests 20 '\[3 Guests\]' guests
    tui_keys guests l
    # The dialog offers every valid profile, the active one (switched to in the TUI above) highlighted.
    run -0 tui_wait guests 20 'Launch a guest with profile' pick
    assert_output --partial "$PROFILE_A"
    assert_output --partial "$PROFILE_B"
    tui_keys guests Enter
    run -0 tui_wait guests 300 "cloudbox-[^ ]+ +running +[0-9]+m[0-9]+s +$PROFILE_A +[0-9]+ \(guest\)" running
    local name
    name=$(grep -oE 'cloudbox-[^ ]+' <<<"$output" | head -1)

    local run_id
    run_id=$(grep -oE "$PROFILE_A +[0-9]+ \(guest\)" <<<"$output" | grep -oE '[0-9]+' | head -1)

    tui_keys guests x
    run -0 tui_wait guests 20 '<domain' xml
    assert_output --partial "$name: domain XML"
    tui_keys guests Escape
    tui_wait_gone guests 10 'domain XML' xml-closed

    # Stop it once the session is up (booted, NIC configured), the normal end of a guest session.
    run -0 wait_sql 300 "select count(*) from events where run_id = $run_id and kind = 'step' and payload like '%running; stop it with%'"
    run -0 run_field "$run_id" state
    assert_output running
    run -0 virsh -q -c qemu:///system domstate "$name"
    assert_output running
    tui_keys guests s
    run -0 tui_wait guests 10 'Stop guest' confirm
    assert_output --partial "Stop $name?"
    tui_keys guests y
    run -0 tui_wait guests 180 'No cloudbox guests' stopped
    refute_line --regexp "^ $name "
    tui_quit guests

    run -0 cloudbox_domains
    assert_output ''
    run -0 state_loops
    assert_output ''
    run -0 work_files
    assert_output ''
    # The guest session was a run: it ended as a clean stop, not as a crash.
    run -0 run_field "$run_id" "state || ' ' || coalesce(reason, '')"
    assert_output --regexp '^completed guest stopped'
}

# bats test_tags=slow
@test "quick storage test: Tests (4), quick size, smoke set, s; the live view reaches COMPLETED" {
    need_guests
    tui_start tests
    run -0 tui_wait tests 60 'Active profile +[a-z]' overview
    tui_keys tests 4
    run -0 tui_wait tests 20 'Storage tests' setup
    assert_output --partial "[x] $PROFILE_A"
    # From the tab bar, Shift+Tab goes back through Start, the profile list, vCPUs per host CPU, storage tests, size.
    tui_pick_select tests 4 smoke 'smoke: seq-write-64k'
    tui_pick_select tests 1 quick 'study-sized \(2x guest RAM'
    run -0 tui_capture tests chosen
    assert_output --partial 'smoke: seq-write-64k'
    refute_output --partial 'study: dd-write-64k'
    assert_output --partial 'quick (128 MiB, 5 s tests)'
    refute_output --partial 'study-sized'
    run -0 grep -cE '\[x\] [a-z]' <<<"$output"   # one profile ticked: a run, not a sweep
    assert_output 1

    tui_keys tests s
    run -0 tui_wait tests 30 "Run [0-9]+ · $PROFILE_A · storage" started
    local id
    id=$(grep -oE 'Run [0-9]+ ·' <<<"$output" | grep -oE '[0-9]+' | head -1)
    # While it runs: the current step, then the final state (numbers arrive in the log as they are measured).
    run -0 tui_wait tests 120 'Step: ' step
    run -0 tui_wait tests 900 'COMPLETED' completed
    assert_output --partial "Run $id · $PROFILE_A · storage"
    assert_output --regexp '[0-9:]+ ==> run completed'
    refute_output --partial 'Traceback'
    tui_quit tests

    run -0 run_field "$id" "state || ' ' || suite || ' ' || size_label || ' ' || profile_name"
    assert_output "completed storage quick $PROFILE_A"
    run -0 sqlite3 "$CLOUDBOX_STATE_DIR/results.db" \
        "select count(*) from measurements where run_id = $id and side = 'guest' and metric = 'MB/s' and value > 0"
    assert_output 3
}

# bats test_tags=slow
@test "a run started in the TUI outlives it (tmux session killed) and shows live again on reopening" {
    need_guests
    run -0 "$CB" profile use "$PROFILE_B"
    tui_start t1 -- tui --screen tests
    run -0 tui_wait t1 30 'Storage tests' setup
    assert_output --partial "[x] $PROFILE_B"
    tui_pick_select t1 4 smoke 'smoke: seq-write-64k'
    run -0 tui_capture t1 chosen
    assert_output --partial 'quick (128 MiB, 5 s tests)'
    tui_keys t1 s
    run -0 tui_wait t1 30 "Run [0-9]+ · $PROFILE_B · storage .*RUNNING" started
    local id pid
    id=$(grep -oE 'Run [0-9]+ ·' <<<"$output" | grep -oE '[0-9]+' | head -1)
    # Mid-run: once the bare-metal baseline is being measured, the terminal goes away (like a lost SSH).
    run -0 tui_wait t1 300 '= baseline seq-write-64k' baseline
    local tui_pid
    tui_pid=$(pgrep -P "$(tui_tmux display-message -p -t t1 '#{pane_pid}')")
    [ -n "$tui_pid" ]
    tui_tmux kill-session -t t1
    # The terminal is gone and so is the TUI (hung up); the run's executor got the same hang-up if it
    # had been attached to that terminal.
    wait_for 30 0.2 pid_gone "$tui_pid" || fail "TUI still running"
    pid=$(run_field "$id" pid)
    [ -n "$pid" ]
    run -0 run_field "$id" state
    assert_output running
    kill -0 "$pid"

    tui_start t2 -- tui --screen tests
    # The tests screen attaches to the run in progress and replays what happened so far...
    run -0 tui_wait t2 60 "Run $id · $PROFILE_B · storage .*RUNNING" reattached
    run -0 tui_wait t2 30 '━ +([1-9][0-9]?|100)% ' replayed
    # ...then follows it live to the end.
    run -0 tui_wait t2 900 'COMPLETED' completed
    assert_output --partial "Run $id · $PROFILE_B · storage"
    assert_output --regexp '[0-9:]+ ==> run completed'
    tui_quit t2

    run -0 run_field "$id" state
    assert_output completed
    run -0 cloudbox_domains
    assert_output ''
    run -0 state_loops
    assert_output ''
    run -0 work_files
    assert_output ''
}

# bats test_tags=slow
@test "results comparison: Results (5), mark two runs with space, c; both runs and % of bare metal" {
    need_guests
    local ids
    ids=$(sqlite3 "$CLOUDBOX_STATE_DIR/results.db" \
        "select id from runs where suite = 'storage' and state = 'completed' order by id desc limit 2" 2>/dev/null || true)
    [ "$(wc -w <<<"$ids")" -eq 2 ] || fail "needs the two storage runs of the tests above (found: '$ids')"
    local newer older
    newer=$(sed -n 1p <<<"$ids"); older=$(sed -n 2p <<<"$ids")

    tui_start res
    run -0 tui_wait res 60 'Active profile +[a-z]' overview
    tui_keys res 5
    # Newest first: the cursor starts on the newer run; space marks it and moves to the next one.
    # Columns: mark, run, profile, headline, accelerator, state, suite (the headline right after the profile,
    # so it stays visible in 80 columns).
    run -0 tui_wait res 20 "^ +$newer +$PROFILE_B .* completed +stor" results
    assert_line --regexp "^ +$older +$PROFILE_A .* completed +stor"
    tui_keys res Space Space
    run -0 tui_wait res 10 "^ x +$older +$PROFILE_A " marked
    assert_line --regexp "^ x +$newer +$PROFILE_B "
    tui_keys res c
    run -0 tui_wait res 30 '% of bare metal|% bare' compared
    local cmp
    cmp=$(sed -n '/^─/,$p' <<<"$output")   # the comparison pane, below the runs table
    # Rows of both runs (#ID), each with its own bare-metal row ("none") and a percentage.
    run -0 grep -cE "^ #$newer " <<<"$cmp"
    [ "$output" -ge 2 ]
    run -0 grep -cE "^ #$older " <<<"$cmp"
    [ "$output" -ge 2 ]
    run -0 grep -E "^ #$newer +none " <<<"$cmp"
    run -0 grep -E '^ #[0-9]+ .* [0-9.]+%' <<<"$cmp"
    run -0 grep -E 'sequential write' <<<"$cmp"
    if [ "$(run_field "$newer" emulated)" = 1 ]; then
        # Emulated rows carry the text marker * (not only a colour).
        run -0 grep -E "^ #$newer .*emulated\) \*" <<<"$cmp"
    else
        run -1 grep -E "emulated\) \*" <<<"$cmp"
    fi
    tui_quit res
}
