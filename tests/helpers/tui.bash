# Helpers for tests/tui.bats: run the installed `cloudbox` TUI in a real terminal (a private tmux server),
# type keys into it and read its screen. Every capture is kept under $TUI_PANES so a failure can be read.
#
# Needs: TUI_SOCK (tmux socket path, short), TUI_PANES (a directory), CB (the cloudbox command),
# CLOUDBOX_STATE_DIR / CLOUDBOX_RUN_DIR (passed to the TUI and to every CLI call).

TUI_COLS=${TUI_COLS:-100}
TUI_ROWS=${TUI_ROWS:-32}

tui_tmux() { tmux -S "$TUI_SOCK" "$@"; }

# Our own tmux settings (no user config): the pane stays after cloudbox exits, so a traceback it printed
# can be read; no status line, so the pane is the whole window.
_tui_conf() {
    local conf="$BATS_FILE_TMPDIR/tmux.conf"
    [ -f "$conf" ] || printf '%s\n' 'set -g remain-on-exit on' 'set -g status off' \
        'set -g history-limit 2000' 'set -g escape-time 0' > "$conf"
    echo "$conf"
}

# tui_start SESSION [--size COLSxROWS] [--term TERM] [--cmd PROGRAM] [-- ARGS...]
# Starts `cloudbox ARGS` (or `PROGRAM ARGS`) in a new detached tmux session of that size (default 100x32,
# TERM xterm-256color, COLORTERM unset so the colour system follows TERM).
tui_start() {
    local s=$1 cols=$TUI_COLS rows=$TUI_ROWS term=xterm-256color cmd=$CB; shift
    while [ $# -gt 0 ]; do
        case $1 in
            --size) cols=${2%x*}; rows=${2#*x}; shift 2 ;;
            --term) term=$2; shift 2 ;;
            --cmd) cmd=$2; shift 2 ;;
            --) shift; break ;;
            *) echo "tui_start: unknown argument $1" >&2; return 2 ;;
        esac
    done
    rm -f "$TUI_PANES/$s.status"
    # The exit status goes to a file: tmux 3.3 may mark the pane dead before it has the status, or never.
    tui_tmux -f "$(_tui_conf)" new-session -d -s "$s" -x "$cols" -y "$rows" \
        sh -c 'st=$1; shift; "$@"; echo $? > "$st"' sh "$TUI_PANES/$s.status" env -u COLORTERM -u TMUX -u NO_COLOR "TERM=$term" \
        "CLOUDBOX_STATE_DIR=$CLOUDBOX_STATE_DIR" "CLOUDBOX_RUN_DIR=$CLOUDBOX_RUN_DIR" "$cmd" "$@"
}

# tui_capture SESSION [LABEL] [-e]: print the visible screen (and keep a copy under $TUI_PANES).
tui_capture() {
    local s=$1 label=${2:-capture} esc=()
    [ "${3:-}" = -e ] && esc=(-e)
    local f n
    n=$(find "$TUI_PANES" -maxdepth 1 -name '*.txt' | wc -l)   # a counter that survives `run` subshells
    f=$(printf '%s/%03d-%s-%s-%s.txt' "$TUI_PANES" "$((n + 1))" "${BATS_TEST_NUMBER:-0}" "$s" "${label//[^A-Za-z0-9_.-]/_}")
    tui_tmux capture-pane -p "${esc[@]}" -t "$s" > "$f" || return 1
    cat "$f"
}

# tui_keys SESSION KEY...: tmux key names (Down, Enter, Escape, Space, BTab) or literal characters.
tui_keys() {
    local s=$1; shift
    tui_tmux send-keys -t "$s" "$@"
}

# tui_type SESSION TEXT: the characters of TEXT, literally.
tui_type() { tui_tmux send-keys -t "$1" -l "$2"; }

# tui_dead SESSION: cloudbox has exited (its status is in $TUI_PANES/SESSION.status).
tui_dead() { [ -s "$TUI_PANES/$1.status" ]; }

# _tui_shows SESSION ERE LABEL: the screen matches ERE, and still does a moment later (a capture can catch a frame
# half drawn); that screen is kept in TUI_SCREEN. Also true, to end the wait, once cloudbox has exited or the session
# is gone (TUI_GONE=1); tui_wait tells which.
_tui_shows() {
    local s=$1 re=$2 label=$3 screen
    screen=$(tui_tmux capture-pane -p -t "$s" 2>/dev/null) || { TUI_GONE=1; return 0; }
    if grep -qE -- "$re" <<<"$screen"; then
        sleep 0.3
        TUI_SCREEN=$(tui_capture "$s" "$label") || TUI_SCREEN=
        grep -qE -- "$re" <<<"$TUI_SCREEN" && return 0
    fi
    tui_dead "$s"
}

# tui_wait SESSION TIMEOUT ERE [LABEL]: poll the screen until it matches ERE (grep -E), twice 0.3 s apart;
# prints the matching screen. On timeout, or if cloudbox exited meanwhile, prints the last screen and fails.
tui_wait() {
    local s=$1 timeout=$2 re=$3 label=${4:-wait}
    TUI_SCREEN='' TUI_GONE=0
    if ! wait_for "$timeout" 0.2 _tui_shows "$s" "$re" "$label" 2>/dev/null; then
        echo "tui_wait: no /$re/ on screen after ${timeout}s ($label); the screen:" >&2
        tui_capture "$s" "$label-timeout" >&2
        return 1
    fi
    if [ "$TUI_GONE" = 1 ]; then
        echo "tui_wait: session $s is gone" >&2
        return 1
    fi
    if ! grep -qE -- "$re" <<<"$TUI_SCREEN"; then
        echo "tui_wait: cloudbox exited while waiting for /$re/ ($label); its screen:" >&2
        tui_capture "$s" "$label-dead" >&2
        return 1
    fi
    printf '%s\n' "$TUI_SCREEN"
}

# _tui_lacks SESSION ERE: the screen does not match ERE.
_tui_lacks() {
    local screen
    screen=$(tui_tmux capture-pane -p -t "$1") || return 1
    ! grep -qE -- "$2" <<<"$screen"
}

# tui_wait_gone SESSION TIMEOUT ERE [LABEL]: poll until the screen no longer matches ERE.
tui_wait_gone() {
    local s=$1 timeout=$2 re=$3 label=${4:-gone}
    if ! wait_for "$timeout" 0.2 _tui_lacks "$s" "$re" 2>/dev/null; then
        echo "tui_wait_gone: /$re/ still on screen after ${timeout}s ($label):" >&2
        tui_capture "$s" "$label-timeout" >&2
        return 1
    fi
    tui_capture "$s" "$label" > /dev/null
}

# tui_quit SESSION: press q and wait until cloudbox has exited; fails unless its exit status is 0 and
# the screen it left holds no traceback.
tui_quit() {
    local s=$1 st screen
    tui_keys "$s" q
    if ! wait_for 20 0.1 tui_dead "$s" 2>/dev/null; then
        echo "tui_quit: cloudbox still running 20 s after q; its screen:" >&2
        tui_capture "$s" quit-timeout >&2
        return 1
    fi
    st=$(cat "$TUI_PANES/$s.status")
    screen=$(tui_capture "$s" quit) || screen=
    if [ "$st" != 0 ] || grep -q Traceback <<<"$screen"; then
        echo "tui_quit: cloudbox exited with status $st; its screen:" >&2
        tui_capture "$s" quit-failed >&2
        return 1
    fi
    tui_tmux kill-session -t "$s"
}

# tui_pick_select SESSION BTABS SEARCH OPTION_ERE: from the Tests screen's first focus (its tab bar),
# Shift+Tab BTABS times to reach a drop-down (counting back from the Start button: 4 = storage tests,
# 5 = size), open it, type SEARCH (Textual's type-to-search moves to the first option containing it and
# scrolls it into view), check that the open menu shows OPTION_ERE, and choose it with Enter. An open drop-down
# shows ▲ where a closed one shows ▼ (its menu may cover the key bar, so the bar's "Dismiss menu" is no sign).
tui_pick_select() {
    local s=$1 n=$2 search=$3 re=$4 i
    for ((i = 0; i < n; i++)); do tui_keys "$s" BTab; done
    tui_keys "$s" Down
    # The open menu shows ▲ unless the current value wraps over the arrow's line (the study set's long list):
    # then its options under it are the sign, which the search below waits for.
    tui_wait "$s" 3 '▲' "menu-open" > /dev/null || sleep 1
    tui_type "$s" "$search"
    tui_wait "$s" 10 "$re" "menu-shows" > /dev/null || return 1
    tui_keys "$s" Enter
    tui_wait_gone "$s" 10 '▲' "menu-closed"
}

# Leftovers of cloudbox runs on this host: guests (any cloudbox-* domain), loop devices backed by files
# under the state dir, files in its work dir.
cloudbox_domains() { virsh -q -c qemu:///system list --all --name 2>/dev/null | grep '^cloudbox-' || true; }
state_loops() { losetup --list --noheadings --output NAME,BACK-FILE | grep -F "$CLOUDBOX_STATE_DIR" || true; }
work_files() { [ -d "$CLOUDBOX_STATE_DIR/work" ] && find "$CLOUDBOX_STATE_DIR/work" -mindepth 1 || true; }

# run_field ID COLUMN: a run's field from the results DB (sqlite3), e.g. run_field 3 state.
run_field() { sqlite3 "$CLOUDBOX_STATE_DIR/results.db" "select $2 from runs where id = $1"; }

# cancel_running_runs: cancel every run of this state dir still running (cleans up like Ctrl-C).
cancel_running_runs() {
    local id
    [ -f "$CLOUDBOX_STATE_DIR/results.db" ] || return 0
    for id in $(sqlite3 "$CLOUDBOX_STATE_DIR/results.db" "select id from runs where state = 'running'"); do
        "$CB" cancel "$id" || true
    done
}

# _sql_some SQL: the query prints something other than 0 or nothing; kept in SQL_OUT.
_sql_some() {
    SQL_OUT=$(sqlite3 "$CLOUDBOX_STATE_DIR/results.db" "$1" 2>/dev/null) || SQL_OUT=
    [ -n "$SQL_OUT" ] && [ "$SQL_OUT" != 0 ]
}

# wait_sql TIMEOUT SQL: poll the results DB until the query prints something other than 0 or nothing; prints it.
wait_sql() {
    wait_for "$1" 0.5 _sql_some "$2" 2>/dev/null || { echo "wait_sql: nothing after ${1}s for: $2" >&2; return 1; }
    echo "$SQL_OUT"
}
