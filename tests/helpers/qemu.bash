# The one QEMU command-line builder for the appliance's machines (tests/image), and the life of a machine reached
# over SSH. qemu_new starts a command line in the array QEMU_ARGS; each other qemu_* call adds one part to it, in
# call order (device order sets PCI slots, so disk and NIC names in the guest follow it); qemu_run and qemu_start
# run it under nice.

# The OVMF firmware code file (the 4 MiB build when there is one).
image_ovmf_code() {
    local f
    for f in /usr/share/OVMF/OVMF_CODE_4M.fd /usr/share/OVMF/OVMF_CODE.fd; do
        [ -r "$f" ] && { echo "$f"; return 0; }
    done
    echo "no OVMF firmware found (scripts/install-deps image installs ovmf)" >&2
    return 1
}

# The OVMF build that enforces Secure Boot (it needs SMM) and its VARS template with Microsoft's keys enrolled, as
# "CODE VARS". Debian 12's and 13's ovmf name them the same; their db holds Microsoft's UEFI CA 2011 and Windows
# Production PCA 2011, not the 2023 CAs.
image_ovmf_secboot() {
    local code=/usr/share/OVMF/OVMF_CODE_4M.secboot.fd vars=/usr/share/OVMF/OVMF_VARS_4M.ms.fd
    [ -r "$code" ] && [ -r "$vars" ] ||
        { echo "no Secure Boot OVMF ($code and $vars; scripts/install-deps image installs ovmf)" >&2; return 1; }
    echo "$code $vars"
}

# qemu_new SERIAL_LOG [--cpu MODEL] [--smp N] [--mem MIB] [--no-reboot]: a q35 machine under TCG (default -cpu max,
# 2 vCPUs, 4096 MiB) without display or default devices, its serial console written to SERIAL_LOG.
qemu_new() {
    local serial=$1 cpu=max smp=2 mem=4096 reboot=()
    shift
    while [ $# -gt 0 ]; do
        case $1 in
            --cpu) cpu=$2; shift 2 ;;
            --smp) smp=$2; shift 2 ;;
            --mem) mem=$2; shift 2 ;;
            --no-reboot) reboot=(-no-reboot); shift ;;
            *) echo "qemu_new: unknown option '$1' (allowed: --cpu, --smp, --mem, --no-reboot)" >&2; return 1 ;;
        esac
    done
    QEMU_ARGS=(-machine q35 -accel tcg -cpu "$cpu" -smp "$smp" -m "$mem"
               -display none -no-user-config -nodefaults "${reboot[@]}" -serial "file:$serial")
}

# console_dead SERIAL_LOG: whether the machine's console shows it will never go on (PID 1 frozen, e.g. when its
# generators ran past their 90 s under a loaded emulator; a kernel panic); prints the line.
console_dead() {
    grep -aoE 'systemd\[1\]: Freezing execution|Kernel panic - not syncing.*' "$1" 2>/dev/null | head -1 | grep .
}

# qemu_firmware uefi VARS | uefi-sb VARS | bios: UEFI boots OVMF with a fresh copy of its VARS template at VARS (the
# machine's own NVRAM); uefi-sb the OVMF that enforces Secure Boot, Microsoft's keys enrolled (SMM on, its flash
# writable only from SMM), or the keys of the template QEMU_SB_VARS names; BIOS is QEMU's default SeaBIOS.
qemu_firmware() {
    local code vars
    case $1 in
        uefi)
            code=$(image_ovmf_code) || return 1
            cp "${code/CODE/VARS}" "$2" || return 1
            QEMU_ARGS+=(-drive "if=pflash,format=raw,unit=0,readonly=on,file=$code"
                        -drive "if=pflash,format=raw,unit=1,file=$2") ;;
        uefi-sb)
            read -r code vars < <(image_ovmf_secboot) && [ -n "$vars" ] || return 1
            cp "${QEMU_SB_VARS:-$vars}" "$2" || return 1
            QEMU_ARGS+=(-machine smm=on -global driver=cfi.pflash01,property=secure,value=on
                        -drive "if=pflash,format=raw,unit=0,readonly=on,file=$code"
                        -drive "if=pflash,format=raw,unit=1,file=$2") ;;
        bios) ;;
        *) echo "firmware must be uefi, uefi-sb or bios (got '$1')" >&2; return 1 ;;
    esac
}

# qemu_disk ID FORMAT FILE [--serial SERIAL] [--boot] [--discard]: a virtio-blk disk; SERIAL names it in the guest
# (/dev/disk/by-id/virtio-SERIAL), --boot makes it the first boot device, --discard passes the guest's TRIM through.
qemu_disk() {
    local id=$1 format=$2 file=$3 drive dev
    shift 3
    drive="if=none,id=$id,format=$format,file=$file"
    dev="virtio-blk-pci,drive=$id"
    while [ $# -gt 0 ]; do
        case $1 in
            --serial) dev+=",serial=$2"; shift 2 ;;
            --boot) dev+=",bootindex=1"; shift ;;
            --discard) drive+=",discard=unmap"; shift ;;
            *) echo "qemu_disk: unknown option '$1' (allowed: --serial, --boot, --discard)" >&2; return 1 ;;
        esac
    done
    QEMU_ARGS+=(-drive "$drive" -device "$dev")
}

# qemu_overlay FILE SIZE: a throw-away qcow2 overlay of $IMAGE at FILE, SIZE big (repart grows the root into it).
qemu_overlay() {
    rm -f "$1"
    qemu-img create -q -f qcow2 -b "$IMAGE" -F raw "$1" "$2"
}

# qemu_nic [--mac MAC] [--ssh PORT]: a virtio NIC on QEMU's user network (no access to the host's other ports);
# --ssh forwards 127.0.0.1:PORT on the host to the machine's port 22.
qemu_nic() {
    local nic=user,restrict=on,model=virtio-net-pci
    while [ $# -gt 0 ]; do
        case $1 in
            --mac) nic+=",mac=$2"; shift 2 ;;
            --ssh) nic+=",hostfwd=tcp:127.0.0.1:$2-:22"; shift 2 ;;
            *) echo "qemu_nic: unknown option '$1' (allowed: --mac, --ssh)" >&2; return 1 ;;
        esac
    done
    QEMU_ARGS+=(-nic "$nic")
}

# qemu_link listen|connect PORT MAC: a virtio NIC on a QEMU socket link between two machines on this host (one
# listens on 127.0.0.1:PORT, the other connects); it carries Ethernet frames of any size.
qemu_link() {
    QEMU_ARGS+=(-netdev "socket,id=private,$1=127.0.0.1:$2" -device "virtio-net-pci,netdev=private,mac=$3")
}

# qemu_credential NAME VALUE: a systemd credential, as SMBIOS type 11.
qemu_credential() {
    QEMU_ARGS+=(-smbios "type=11,value=io.systemd.credential:$1=$2")
}

# qemu_credential_file NAME FILE: a systemd credential holding FILE's bytes.
qemu_credential_file() {
    QEMU_ARGS+=(-smbios "type=11,value=io.systemd.credential.binary:$1=$(base64 -w0 "$2")")
}

# qemu_selftest STATUS JOURNAL: asks for the self-test (cloudbox-selftest.service) and gives it its two virtio-serial
# ports: its status line goes to the file STATUS, the boot's journal (on failure) to JOURNAL.
qemu_selftest() {
    : > "$1"
    : > "$2"
    # shellcheck disable=SC2054 # the commas belong to QEMU's option values
    QEMU_ARGS+=(-device virtio-serial-pci
                -chardev "file,id=selftest,path=$1" -device virtserialport,chardev=selftest,name=org.cloudbox.selftest
                -chardev "file,id=journal,path=$2" -device virtserialport,chardev=journal,name=org.cloudbox.journal)
    qemu_credential cloudbox.selftest 1
}

# The QEMU that runs the machines: IMAGE_QEMU_BIN, else the one on PATH (knobs.bats names a QEMU with devices
# Debian 12's 7.2 lacks, such as igb).
qemu_bin() { echo "${IMAGE_QEMU_BIN:-qemu-system-x86_64}"; }

# qemu_run TIMEOUT_S LOG: runs the machine until it powers off, or kills it after TIMEOUT_S; QEMU's output to LOG.
# Returns QEMU's exit status (124 or 137: the timeout).
qemu_run() {
    timeout --kill-after=10 "$1" nice -n 10 "$(qemu_bin)" "${QEMU_ARGS[@]}" > "$2" 2>&1
}

# qemu_start LOG: starts the machine in the background; QEMU_PID is its process. It keeps none of the caller's file
# descriptors past stderr (bats' own pipes among them), so a machine left running (IMAGE_REUSE=1, image-suite.bash)
# does not hold bats open.
qemu_start() {
    (
        local fd
        for fd in /proc/"$BASHPID"/fd/*; do
            fd=${fd##*/}
            [ "$fd" -le 2 ] || exec {fd}>&-
        done
        exec nice -n 10 "$(qemu_bin)" "${QEMU_ARGS[@]}"
    ) > "$1" 2>&1 &
    # shellcheck disable=SC2034 # for the caller
    QEMU_PID=$!
}

# free_port: a TCP port on 127.0.0.1 nobody listens on now.
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# machine_ssh KEYDIR PORT CMD...: CMD as root on the machine whose SSH is forwarded to 127.0.0.1:PORT, with the key
# KEYDIR/id_ed25519. MACHINE_SSH_TIMEOUT_S (default 300) bounds it: a hung machine can hold a session open forever.
# Commands go through the machine's shared connection (machine_ssh_share) when there is one, else connect afresh.
machine_ssh() {
    local keydir=$1 port=$2
    shift 2
    timeout --kill-after=10 "${MACHINE_SSH_TIMEOUT_S:-300}" ssh -q -p "$port" -i "$keydir/id_ed25519" \
        -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o ConnectTimeout=10 -o BatchMode=yes \
        -o ControlMaster=no -o "ControlPath=$(_machine_mux "$port")" root@127.0.0.1 "$@"
}
# A short path: a unix socket's name is limited to 108 bytes, and ssh adds 17 while it creates it.
_machine_mux() { echo "${TMPDIR:-/tmp}/cbmux-$(id -u)-$1"; }

# machine_ssh_share KEYDIR PORT: one SSH connection to the machine that later machine_ssh calls share. Under TCG a
# login (key exchange, PAM and logind session, often a user manager) costs the machine's one vCPU seconds each time.
# The connection ends with the machine; stdio and bats' fd 3 are closed so it never holds a test open.
machine_ssh_share() {
    local keydir=$1 port=$2 mux
    mux=$(_machine_mux "$port")
    ssh -q -O check -o "ControlPath=$mux" root@127.0.0.1 2>/dev/null && return 0
    rm -f "$mux"  # left by a connection that was killed
    timeout 60 ssh -q -f -N -M -p "$port" -i "$keydir/id_ed25519" \
        -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o ConnectTimeout=10 -o BatchMode=yes \
        -o "ControlPath=$mux" root@127.0.0.1 < /dev/null > /dev/null 2>&1 3>&- || :
}

# machine_ssh_unshare PORT: ends the shared connection, if any (it also ends by itself when the machine goes).
machine_ssh_unshare() {
    ssh -q -O exit -o "ControlPath=$(_machine_mux "$1")" root@127.0.0.1 2>/dev/null || :
    rm -f "$(_machine_mux "$1")"
}

# machine_wait_ssh KEYDIR PORT PID TIMEOUT_S: until the machine (QEMU process PID) answers over SSH, then shares one
# connection to it; fails at once when QEMU has exited.
machine_wait_ssh() {
    MACHINE_SSH_TIMEOUT_S=20 wait_for --alive "$3" "$4" 5 _machine_answers "$1" "$2" || return
    machine_ssh_share "$1" "$2"
}
_machine_answers() { machine_ssh "$1" "$2" true 2>/dev/null; }

# machine_stop KEYDIR PORT PID JOURNAL: the machine's journal to the file JOURNAL, a clean power-off, then its QEMU
# process, by its PID, if it is still there after 60 s.
machine_stop() {
    local keydir=$1 port=$2 pid=$3 journal=$4
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || { machine_ssh_unshare "$port"; return 0; }
    MACHINE_SSH_TIMEOUT_S=120 machine_ssh "$keydir" "$port" journalctl -b --no-pager > "$journal" 2>&1 || :
    MACHINE_SSH_TIMEOUT_S=30 machine_ssh "$keydir" "$port" systemctl poweroff 2>/dev/null || :
    wait_for 60 2 pid_gone "$pid" 2>/dev/null || kill "$pid" 2>/dev/null || :
    machine_ssh_unshare "$port"
}
