# Two installed cloudbox nodes under QEMU TCG joined by a private virtual link (tests/image/cluster.bats).
# Each node boots its installed disk (UEFI) with two NICs: a campus NIC (QEMU user network, SSH forwarded to
# 127.0.0.1:PORT) and a private NIC on a QEMU socket link (the front-end listens on 127.0.0.1:LINK_PORT, the
# back-end connects), which carries Ethernet frames of any size: the nodes set MTU 9000 on it themselves.

# cluster_start LOGDIR NAME DISK CAMPUS_MAC PRIVATE_MAC SSH_PORT listen|connect LINK_PORT: starts the node in the
# background (UEFI); its PID goes to LOGDIR/NAME.pid. CLUSTER_SMP (default 1: one vCPU leaves a nested KVM guest no
# other vCPU to stall, docs/image.md) and CLUSTER_MEM_MB (default 3072) size it.
cluster_start() {
    local logdir=$1 name=$2 disk=$3 campus=$4 private=$5 port=$6 mode=$7 link=$8
    rm -f "$logdir/$name".{serial.log,qemu.log,pid}
    qemu_new "$logdir/$name.serial.log" --smp "${CLUSTER_SMP:-1}" --mem "${CLUSTER_MEM_MB:-3072}"
    qemu_firmware uefi "$logdir/$name-vars.fd" || return 1
    qemu_disk disk raw "$disk" --serial cbtarget --boot --discard
    qemu_nic --mac "$campus" --ssh "$port"
    qemu_link "$mode" "$link" "$private"
    qemu_start "$logdir/$name.qemu.log"
    echo "$QEMU_PID" > "$logdir/$name.pid"
}

# cluster_wait_ssh LOGDIR NAME PORT TIMEOUT_S: until the node answers over SSH; fails at once when its QEMU is gone
# or its console shows it dead (console_dead), and then prints the console's last lines.
cluster_wait_ssh() {
    local logdir=$1 name=$2 rc=0
    MACHINE_SSH_TIMEOUT_S=20 wait_for --alive "$(cat "$logdir/$name.pid")" "$4" 5 \
        _cluster_up_or_dead "$logdir" "$3" "$logdir/$name.serial.log" || rc=$?
    if [ "$rc" = 0 ] && ! console_dead "$logdir/$name.serial.log" > /dev/null; then
        machine_ssh_share "$logdir" "$3"
        return 0
    fi
    echo "$name: no SSH after ${WAITED_S:-?} s; its console's last lines:" >&2
    install_console_tail "$logdir/$name.serial.log" >&2
    return 1
}
_cluster_up_or_dead() { console_dead "$3" > /dev/null || _machine_answers "$1" "$2"; }

# cluster_stop LOGDIR NAME PORT: the node's journal to LOGDIR/NAME.journal.txt, a clean power-off, then its QEMU.
cluster_stop() {
    local logdir=$1 name=$2 port=$3 pid
    pid=$(cat "$logdir/$name.pid" 2>/dev/null) || return 0
    machine_stop "$logdir" "$port" "$pid" "$logdir/$name.journal.txt"
    rm -f "$logdir/$name.pid" "$logdir/$name-vars.fd"
}

# cluster_record_bench LOGDIR: writes the <!-- bench:cluster --> section of docs/benchmarks.md from a finished
# cluster.bats run's logs (install, boot, enrolment seconds; the first guest image copy to the back-end).
cluster_record_bench() {
    local logs=$1 mbps
    mbps=$(python3 "$REPO/tests/helpers/cluster_checks.py" propagation "$logs/propagations.json")
    install_record_bench cluster "$(cat <<EOF
## Two-node cluster: power-on to cluster ready, image propagation (tests/image/cluster.bats)

Two nodes under QEMU TCG on one host (installs: \`-smp 1 -m 4096\` each, side by side; installed nodes: \`-smp 1
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
