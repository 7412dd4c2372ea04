# Boots the appliance image under QEMU (TCG, -cpu max) and reads the self-test's exit status (tests/image/*.bats).
# image_boot FIRMWARE LOGDIR [TIMEOUT_S] boots a throw-away qcow2 overlay of $IMAGE with FIRMWARE uefi (OVMF)
# or bios (SeaBIOS), passes the self-test request and root credentials as SMBIOS type 11 systemd credentials,
# waits for the guest to power off and leaves in LOGDIR: serial.log, status (the self-test's status line),
# journal.txt (the guest journal, written by the guest on failure), qemu.log, boot-seconds.
# IMAGE_QEMU_CPU picks the CPU model (default max: TCG emulates AMD SVM, so KVM works inside the appliance).
# image_esp_* read the image's ESP with mtools; image_xen_default makes a copy of the image that boots Xen.

IMAGE_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
IMAGE_DIR=${IMAGE_DIR:-$IMAGE_REPO/build/image}
IMAGE=${IMAGE:-$IMAGE_DIR/out/cloudbox.raw}

# The image the suites boot: what `make image` built, else built now the same way (scripts/build-image).
image_ensure() {
    [ -f "$IMAGE" ] || "$IMAGE_REPO/scripts/build-image" || return 1
    [ -f "$IMAGE" ] || { echo "no image at $IMAGE (scripts/build-image writes build/image/out/cloudbox.raw)" >&2; return 1; }
}

image_ovmf_code() {
    local f
    for f in /usr/share/OVMF/OVMF_CODE_4M.fd /usr/share/OVMF/OVMF_CODE.fd; do
        [ -r "$f" ] && { echo "$f"; return 0; }
    done
    return 1
}

# Writes LOGDIR/id_ed25519{,.pub} and LOGDIR/root-password (random) for the credentials.
image_make_credentials() {
    local logdir=$1
    [ -f "$logdir/id_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C cloudbox-test -f "$logdir/id_ed25519"
    [ -f "$logdir/root-password" ] || head -c 12 /dev/urandom | base64 | tr -d '/+=' > "$logdir/root-password"
}

# Prepares LOGDIR for one boot (overlay disk of SIZE, firmware vars, credentials) and sets the array
# IMAGE_QEMU_ARGS to the QEMU arguments every appliance boot shares: _image_qemu_args FIRMWARE LOGDIR SIZE
_image_qemu_args() {
    local firmware=$1 logdir=$2 size=$3 hash code
    local -a fw=()
    mkdir -p "$logdir"
    image_make_credentials "$logdir"
    hash=$(openssl passwd -6 -stdin < "$logdir/root-password")
    qemu-img create -q -f qcow2 -b "$IMAGE" -F raw "$logdir/disk.qcow2" "$size" || return 1
    case $firmware in
        uefi)
            code=$(image_ovmf_code) || { echo "no OVMF firmware found" >&2; return 1; }
            cp "${code/CODE/VARS}" "$logdir/ovmf-vars.fd"
            fw=(-drive "if=pflash,format=raw,unit=0,readonly=on,file=$code"
                -drive "if=pflash,format=raw,unit=1,file=$logdir/ovmf-vars.fd") ;;
        bios) fw=() ;;  # QEMU's default firmware is SeaBIOS
        *) echo "image_boot: firmware must be uefi or bios" >&2; return 1 ;;
    esac
    # IMAGE_QEMU_SMP: vCPUs (default 2). tests/image/bench.bats uses 1: with 2, a nested KVM guest on one
    # TCG vCPU once never answered the other's IPI and the appliance's kernel locked up (docs/image.md).
    IMAGE_QEMU_ARGS=(
        -machine q35 -accel tcg -cpu "${IMAGE_QEMU_CPU:-max}" -smp "${IMAGE_QEMU_SMP:-2}" -m 4096
        "${fw[@]}"
        -display none -no-user-config -nodefaults -no-reboot
        -serial "file:$logdir/serial.log"
        -drive "if=none,id=disk,format=qcow2,file=$logdir/disk.qcow2,discard=unmap"
        -device virtio-blk-pci,drive=disk,bootindex=1
        -smbios "type=11,value=io.systemd.credential:passwd.hashed-password.root=$hash"
        -smbios "type=11,value=io.systemd.credential:ssh.authorized_keys.root=$(cat "$logdir/id_ed25519.pub")"
    )
}

image_boot() {
    local firmware=$1 logdir=$2 timeout_s=${3:-600} start end rc=
    mkdir -p "$logdir"
    rm -f "$logdir"/{serial.log,status,journal.txt,qemu.log,boot-seconds,disk.qcow2}
    _image_qemu_args "$firmware" "$logdir" 8G || return 1
    : > "$logdir/status"
    : > "$logdir/journal.txt"
    start=$(date +%s)
    # shellcheck disable=SC2086 # IMAGE_QEMU_EXTRA is a word list on purpose
    timeout --kill-after=10 "$timeout_s" nice -n 10 qemu-system-x86_64 "${IMAGE_QEMU_ARGS[@]}" \
        -nic user,restrict=on,model=virtio-net-pci \
        -device virtio-serial-pci \
        -chardev "file,id=selftest,path=$logdir/status" \
        -device virtserialport,chardev=selftest,name=org.cloudbox.selftest \
        -chardev "file,id=journal,path=$logdir/journal.txt" \
        -device virtserialport,chardev=journal,name=org.cloudbox.journal \
        -smbios "type=11,value=io.systemd.credential:cloudbox.selftest=1" \
        ${IMAGE_QEMU_EXTRA:-} \
        > "$logdir/qemu.log" 2>&1 || rc=$?
    rc=${rc:-0}
    end=$(date +%s)
    echo $((end - start)) > "$logdir/boot-seconds"
    echo "qemu exit $rc after $((end - start)) s ($firmware)" >> "$logdir/qemu.log"
    rm -f "$logdir/disk.qcow2"
    return 0
}

# Boots like image_boot (no self-test request) and stops QEMU, by its PID, as soon as PATTERN (grep -E) shows in
# the serial log, or after TIMEOUT_S: image_boot_until FIRMWARE LOGDIR PATTERN TIMEOUT_S. Returns 0 when the
# pattern was seen. Leaves serial.log, qemu.log and boot-seconds (seconds until the pattern) in LOGDIR.
image_boot_until() {
    local firmware=$1 logdir=$2 pattern=$3 timeout_s=$4 start pid rc=1
    mkdir -p "$logdir"
    rm -f "$logdir"/{serial.log,qemu.log,boot-seconds,disk.qcow2}
    _image_qemu_args "$firmware" "$logdir" 8G || return 1
    : > "$logdir/serial.log"
    start=$(date +%s)
    nice -n 10 qemu-system-x86_64 "${IMAGE_QEMU_ARGS[@]}" -nic user,restrict=on,model=virtio-net-pci \
        > "$logdir/qemu.log" 2>&1 &
    pid=$!
    while :; do
        if grep -aqE "$pattern" "$logdir/serial.log"; then rc=0; break; fi
        kill -0 "$pid" 2>/dev/null || break
        [ $(($(date +%s) - start)) -ge "$timeout_s" ] && break
        sleep 1
    done
    echo $(($(date +%s) - start)) > "$logdir/boot-seconds"
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    if [ "$rc" = 0 ]; then
        echo "qemu stopped after $(cat "$logdir/boot-seconds") s ($firmware): serial log matched /$pattern/" >> "$logdir/qemu.log"
    else
        echo "no /$pattern/ in the serial log after $(cat "$logdir/boot-seconds") s ($firmware)" >> "$logdir/qemu.log"
    fi
    rm -f "$logdir/disk.qcow2"
    return $rc
}

# Prints the self-test status the guest reported (virtio-serial port, else the serial log), or nothing.
# The first line of a kernel oops or panic of the appliance under TCG (docs/image.md, "Known flake") in
# LOGDIR/serial.log, without its timestamp; nothing when there is none.
image_tcg_oops() {
    local line
    line=$(grep -a -m1 -E 'Oops: |Kernel panic - not syncing' "$1/serial.log" 2>/dev/null) || return 0
    echo "${line#*] }"
}

image_selftest_status() {
    local logdir=$1 s
    s=$(tr -dc '0-9' < "$logdir/status" 2>/dev/null)
    if [ -z "$s" ]; then
        s=$(grep -ao 'cloudbox-selftest: status=[0-9]*' "$logdir/serial.log" 2>/dev/null | tail -1 | cut -d= -f2)
    fi
    echo "$s"
}

# Starts the appliance in the background for interactive use over SSH (no self-test, no power-off):
# image_start FIRMWARE LOGDIR SSH_PORT. Sets IMAGE_QEMU_PID. SSH listens on 127.0.0.1:SSH_PORT only.
image_start() {
    local firmware=$1 logdir=$2 port=$3
    rm -f "$logdir"/{serial.log,qemu.log,disk.qcow2}
    _image_qemu_args "$firmware" "$logdir" 16G || return 1
    nice -n 10 qemu-system-x86_64 "${IMAGE_QEMU_ARGS[@]}" \
        -nic "user,restrict=on,model=virtio-net-pci,hostfwd=tcp:127.0.0.1:$port-:22" \
        > "$logdir/qemu.log" 2>&1 &
    IMAGE_QEMU_PID=$!
}

# Runs a command in the appliance started by image_start: image_ssh LOGDIR PORT CMD...
# With IMAGE_SSH_TIMEOUT_S set, the command is killed after that many seconds (exit 124): a hung appliance
# (its kernel locked up) can keep an SSH session open forever.
image_ssh() {
    local logdir=$1 port=$2 limit=()
    shift 2
    [ -n "${IMAGE_SSH_TIMEOUT_S:-}" ] && limit=(timeout --kill-after=10 "$IMAGE_SSH_TIMEOUT_S")
    "${limit[@]}" ssh -q -p "$port" -i "$logdir/id_ed25519" -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null \
        -o ConnectTimeout=10 -o BatchMode=yes root@127.0.0.1 "$@"
}

# Waits until SSH answers (up to TIMEOUT_S): image_wait_ssh LOGDIR PORT TIMEOUT_S
image_wait_ssh() {
    local logdir=$1 port=$2 timeout_s=${3:-600} t=0
    until image_ssh "$logdir" "$port" true 2>/dev/null; do
        kill -0 "$IMAGE_QEMU_PID" 2>/dev/null || return 1
        [ "$t" -ge "$timeout_s" ] && return 1
        sleep 5; t=$((t + 5))
    done
}

# Stops the appliance started by image_start: a clean power-off, then the QEMU process by its PID.
image_stop() {
    local logdir=$1 port=$2 t=0
    [ -n "${IMAGE_QEMU_PID:-}" ] || return 0
    IMAGE_SSH_TIMEOUT_S=60 image_ssh "$logdir" "$port" systemctl poweroff 2>/dev/null || :
    while kill -0 "$IMAGE_QEMU_PID" 2>/dev/null && [ "$t" -lt 60 ]; do sleep 2; t=$((t + 2)); done
    kill "$IMAGE_QEMU_PID" 2>/dev/null || :
    wait "$IMAGE_QEMU_PID" 2>/dev/null || :
    rm -f "$logdir/disk.qcow2"
    IMAGE_QEMU_PID=
}

# The ESP of a disk image as mtools' IMAGE@@OFFSET: image_esp RAW
image_esp() {
    local raw=$1 start
    start=$(partx --show --output START,TYPE --noheadings "$raw" |
        awk '$2 == "c12a7328-f81f-11d2-ba4b-00a0c93ec93b" {print $1}')
    [ -n "$start" ] || { echo "image_esp: no EFI system partition in $raw" >&2; return 1; }
    echo "$raw@@$((start * 512))"
}

# Prints a file of the image's ESP (CRs removed): image_esp_cat RAW PATH
image_esp_cat() {
    local esp
    esp=$(image_esp "$1") || return 1
    MTOOLS_SKIP_CHECK=1 mtype -i "$esp" "::$2" | tr -d '\r'
}

# Prints the size in bytes of a file on the image's ESP (fails if it is not there): image_esp_size RAW PATH
image_esp_size() {
    local esp
    esp=$(image_esp "$1") || return 1
    MTOOLS_SKIP_CHECK=1 mdir -b -i "$esp" "::$2" >/dev/null || return 1
    MTOOLS_SKIP_CHECK=1 mcopy -n -i "$esp" "::$2" - | wc -c
}

# Copies the image to DST (sparse) and makes the Xen entry the default of both boot loaders there, the way a
# lab would pick it in the menu: image_xen_default SRC DST. Later settings win in grub.cfg and loader.conf.
# dom0 also gets systemd.default_device_timeout_sec=600: a PV dom0 under TCG on a loaded host needed more than
# systemd's 90 s for the root device to appear (udev coldplug alone took ~2 min) and went to emergency mode.
image_xen_default() {
    local src=$1 dst=$2 esp tmp slow=systemd.default_device_timeout_sec=600
    cp --sparse=always "$src" "$dst" || return 1
    esp=$(image_esp "$dst") || return 1
    tmp=$(mktemp -d) || return 1
    image_esp_cat "$dst" /grub/grub.cfg | sed -E "/^ +module2 \/xen\/vmlinuz /s/\$/ $slow/" > "$tmp/grub.cfg" &&
        echo 'set default=cloudbox-xen' >> "$tmp/grub.cfg" &&
        image_esp_cat "$dst" /xen/xen.cfg | sed -E "/^kernel=/s/\$/ $slow/" > "$tmp/xen.cfg" &&
        image_esp_cat "$dst" /loader/loader.conf > "$tmp/loader.conf" &&
        echo 'default cloudbox-xen.conf' >> "$tmp/loader.conf" &&
        MTOOLS_SKIP_CHECK=1 mcopy -o -i "$esp" "$tmp/grub.cfg" ::/grub/grub.cfg &&
        MTOOLS_SKIP_CHECK=1 mcopy -o -i "$esp" "$tmp/xen.cfg" ::/xen/xen.cfg &&
        MTOOLS_SKIP_CHECK=1 mcopy -o -i "$esp" "$tmp/loader.conf" ::/loader/loader.conf
    local rc=$?
    rm -rf "$tmp"
    return $rc
}
