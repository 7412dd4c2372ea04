# Helpers for tests/guest-image.bats: boot the benchmark guest under QEMU and talk to its agent.

GUEST_BUILDER=${GUEST_BUILDER:-$BATS_TEST_DIRNAME/../appliance/guest/build-guest-image}

# qga SOCKET sync TIMEOUT            wait until qemu-ga answers guest-sync
# qga SOCKET exec TIMEOUT PATH ARG.. run PATH via guest-exec: its stdout/stderr and exit code
# qga SOCKET send JSON               send one command, do not wait for an answer (guest-shutdown)
qga() {
    /usr/bin/python3 - "$@" <<'PY'
import base64, json, os, random, socket, sys, time

sock_path, cmd = sys.argv[1], sys.argv[2]
deadline = time.monotonic() + (float(sys.argv[3]) if cmd in ("sync", "exec") else 10)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sock_path)
buf = b""

def left():
    t = deadline - time.monotonic()
    if t <= 0:
        sys.exit("qga: timed out")
    return t

def send(obj):
    s.sendall(json.dumps(obj).encode() + b"\n")

def reply():
    global buf
    while True:
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            line = line.strip(b"\xff \r\t")
            if not line:
                continue
            try:
                return json.loads(line)
            except ValueError:
                continue
        s.settimeout(left())
        try:
            data = s.recv(65536)
        except socket.timeout:
            sys.exit("qga: timed out")
        if not data:
            sys.exit("qga: agent socket closed")
        buf += data

def call(execute, **arguments):
    msg = {"execute": execute}
    if arguments:
        msg["arguments"] = arguments
    send(msg)
    r = reply()
    if "error" in r:
        sys.exit(f"qga: {execute}: {r['error']}")
    return r["return"]

def sync():
    tag = random.randrange(1, 2**31)
    send({"execute": "guest-sync", "arguments": {"id": tag}})
    while reply().get("return") != tag:
        pass

if cmd == "sync":
    sync()
elif cmd == "exec":
    sync()
    pid = call("guest-exec", path=sys.argv[4], arg=sys.argv[5:], **{"capture-output": True})["pid"]
    while True:
        st = call("guest-exec-status", pid=pid)
        if st.get("exited"):
            break
        left()
        time.sleep(0.1)
    sys.stdout.buffer.write(base64.b64decode(st.get("out-data", "")))
    sys.stderr.buffer.write(base64.b64decode(st.get("err-data", "")))
    sys.exit(st.get("exitcode", 128 + st.get("signal", 0)))
elif cmd == "send":
    sync()
    send(json.loads(sys.argv[3]))
    time.sleep(0.5)
else:
    sys.exit(f"qga: unknown command {cmd}")
PY
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

# guest_wait_ready NAME TIMEOUT   wait for the ready line and an answering agent; prints seconds taken
guest_wait_ready() {
    local name=$1 timeout=$2 start=$EPOCHREALTIME
    local end=$((SECONDS + timeout))
    until grep -q '^cloudbox-guest: ready' "$GUEST_RUN/$name.log" 2>/dev/null; do
        [ $SECONDS -lt $end ] || { echo "no ready line after ${timeout}s" >&2; return 1; }
        guest_running "$name" || { echo "QEMU exited before ready" >&2; return 1; }
        if grep -q '^cloudbox-guest: failed' "$GUEST_RUN/$name.log"; then
            grep '^cloudbox-guest: error' "$GUEST_RUN/$name.log" >&2
            return 1
        fi
        sleep 0.2
    done
    qga "$GUEST_RUN/$name.qga" sync $((end - SECONDS + 1)) || return 1
    awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.1f\n", b - a}'
}

guest_running() {
    local pid
    pid=$(cat "$GUEST_RUN/$1.pid" 2>/dev/null) && kill -0 "$pid" 2>/dev/null
}

# guest_wait_exit NAME TIMEOUT    wait for QEMU to exit by itself (guest powered off)
guest_wait_exit() {
    local end=$((SECONDS + $2))
    while guest_running "$1"; do
        [ $SECONDS -lt $end ] || return 1
        sleep 0.2
    done
}

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
        for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        kill -9 "$pid" 2>/dev/null || true
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
