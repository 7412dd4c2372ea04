# Two installed cloudbox nodes under QEMU TCG joined by a private virtual link (tests/image/cluster.bats).
# Each node boots its installed disk (UEFI) with two NICs: a campus NIC (QEMU user network, SSH forwarded to
# 127.0.0.1:PORT) and a private NIC on a QEMU socket link (the front-end listens on 127.0.0.1:LINK_PORT, the
# back-end connects), which carries Ethernet frames of any size: the nodes set MTU 9000 on it themselves.

# cluster_start LOGDIR NAME DISK CAMPUS_MAC PRIVATE_MAC SSH_PORT listen|connect LINK_PORT: starts the node in the
# background; its PID goes to LOGDIR/NAME.pid. CLUSTER_SMP (default 1: a nested KVM guest on one of two TCG vCPUs
# once locked the node's kernel, docs/image.md) and CLUSTER_MEM_MB (default 3072) size it.
cluster_start() {
    local logdir=$1 name=$2 disk=$3 campus=$4 private=$5 port=$6 mode=$7 link=$8 code
    code=$(image_ovmf_code) || { echo "no OVMF firmware found" >&2; return 1; }
    cp "${code/CODE/VARS}" "$logdir/$name-vars.fd"
    rm -f "$logdir/$name".{serial.log,qemu.log,pid}
    nice -n 10 qemu-system-x86_64 -machine q35 -accel tcg -cpu max -smp "${CLUSTER_SMP:-1}" -m "${CLUSTER_MEM_MB:-3072}" \
        -drive "if=pflash,format=raw,unit=0,readonly=on,file=$code" \
        -drive "if=pflash,format=raw,unit=1,file=$logdir/$name-vars.fd" \
        -display none -no-user-config -nodefaults -serial "file:$logdir/$name.serial.log" \
        -drive "if=none,id=disk,format=raw,file=$disk,discard=unmap" \
        -device virtio-blk-pci,drive=disk,serial=cbtarget,bootindex=1 \
        -nic "user,restrict=on,model=virtio-net-pci,mac=$campus,hostfwd=tcp:127.0.0.1:$port-:22" \
        -netdev "socket,id=private,$mode=127.0.0.1:$link" -device "virtio-net-pci,netdev=private,mac=$private" \
        > "$logdir/$name.qemu.log" 2>&1 &
    echo $! > "$logdir/$name.pid"
}

# cluster_ssh LOGDIR PORT CMD...: a command on a node as root (the answer files' SSH key). CLUSTER_SSH_TIMEOUT_S
# (default 300) bounds it: a hung node must not hold the suite.
cluster_ssh() {
    local logdir=$1 port=$2
    shift 2
    timeout --kill-after=10 "${CLUSTER_SSH_TIMEOUT_S:-300}" ssh -q -p "$port" -i "$logdir/id_ed25519" \
        -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o ConnectTimeout=10 -o BatchMode=yes \
        root@127.0.0.1 "$@"
}

# cluster_wait_ssh LOGDIR NAME PORT TIMEOUT_S: until the node answers over SSH; fails early when QEMU is gone.
cluster_wait_ssh() {
    local logdir=$1 name=$2 port=$3 limit=$4 t=0
    until CLUSTER_SSH_TIMEOUT_S=20 cluster_ssh "$logdir" "$port" true 2>/dev/null; do
        kill -0 "$(cat "$logdir/$name.pid")" 2>/dev/null || { echo "$name: QEMU exited" >&2; return 1; }
        [ "$t" -ge "$limit" ] && { echo "$name: no SSH after $t s" >&2; return 1; }
        sleep 5; t=$((t + 5))
    done
}

# cluster_stop LOGDIR NAME PORT: the node's journal to LOGDIR/NAME.journal.txt, a clean power-off, then its QEMU.
cluster_stop() {
    local logdir=$1 name=$2 port=$3 pid t=0
    pid=$(cat "$logdir/$name.pid" 2>/dev/null) || return 0
    if kill -0 "$pid" 2>/dev/null; then
        CLUSTER_SSH_TIMEOUT_S=60 cluster_ssh "$logdir" "$port" journalctl -b --no-pager > "$logdir/$name.journal.txt" 2>&1 || :
        CLUSTER_SSH_TIMEOUT_S=30 cluster_ssh "$logdir" "$port" systemctl poweroff 2>/dev/null || :
        while kill -0 "$pid" 2>/dev/null && [ "$t" -lt 60 ]; do sleep 2; t=$((t + 2)); done
        kill "$pid" 2>/dev/null || :
    fi
    rm -f "$logdir/$name.pid" "$logdir/$name-vars.fd"
}

# cluster_free_port: a TCP port on 127.0.0.1 nobody listens on now.
cluster_free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# cluster_record_bench LOGDIR: writes the <!-- bench:cluster --> section of docs/benchmarks.md from a finished
# cluster.bats run's logs (install, boot, enrolment seconds; the first guest image copy to the back-end).
cluster_record_bench() {
    local logs=$1 mbps
    mbps=$(python3 -c "import json; p=[x for x in json.load(open('$logs/propagations.json')) if not x['cached']][0]; print(f\"{p['bytes'] / 1e6:.1f} MB in {p['seconds']:.2f} s = {p['mbps']:.1f} MB/s (SHA-256 check on the node {p['verify_seconds']:.2f} s)\")")
    install_record_bench cluster "$(cat <<EOF
## Two-node cluster: power-on to cluster ready, image propagation (tests/image/cluster.bats)

Two nodes under QEMU TCG on one host (installs: \`-smp 2 -m 4096\` each, side by side; installed nodes: \`-smp 1
-m 3072\`, OVMF), private link a QEMU socket with MTU 9000; measured $(date -u +%Y-%m-%d) on $(nproc) cores of
$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'). Emulated (TCG) throughout: the target on
real hardware with an SSD is under 3 minutes per node. Command: \`make bench\` (its step \`make image-cluster-bench\`:
\`IMAGE_BENCH_RECORD=1 bats tests/image/cluster.bats\`); load average $(cut -d' ' -f1 /proc/loadavg) when written.

| phase | seconds |
| --- | --- |
| both live boots + unattended installs + reboot (side by side) | $(cat "$logs/install.seconds") |
| power-on of the installed nodes to SSH on both | $(cat "$logs/boot.seconds") |
| join code, wrong code refused, enrolment, first health check | $(cat "$logs/enrol.seconds") |
| **power-on (live stick) to cluster ready** | **$(( $(cat "$logs/install.seconds") + $(cat "$logs/ready.seconds") ))** |

Guest image propagation front-end -> back-end over the private link (emulated NICs on both ends): $mbps.
EOF
)"
}
