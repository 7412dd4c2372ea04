# Boots the appliance image under QEMU (TCG) and reads the self-test's verdict (tests/image/*.bats, scripts/image-bench);
# reads the image's ESP with mtools. Command lines come from qemu.bash.
# IMAGE_QEMU_CPU (default max: TCG emulates AMD SVM, so KVM works inside the appliance) and IMAGE_QEMU_SMP (default
# 2) size the appliance; IMAGE_QEMU_EXTRA adds QEMU arguments to image_boot.

IMAGE_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
IMAGE_DIR=${IMAGE_DIR:-$IMAGE_REPO/build/image}
IMAGE=${IMAGE:-$IMAGE_DIR/out/cloudbox.raw}

# The image the suites boot: what `make image` built, else built now the same way (scripts/build-image).
image_ensure() {
    [ -f "$IMAGE" ] || "$IMAGE_REPO/scripts/build-image" || return 1
    [ -f "$IMAGE" ] || { echo "no image at $IMAGE (scripts/build-image writes build/image/out/cloudbox.raw)" >&2; return 1; }
}

# image_make_credentials DIR: DIR/id_ed25519{,.pub} and DIR/root-password (random), unless they exist.
image_make_credentials() {
    local dir=$1
    [ -f "$dir/id_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C cloudbox-test -f "$dir/id_ed25519"
    [ -f "$dir/root-password" ] || head -c 12 /dev/urandom | base64 | tr -d '/+=' > "$dir/root-password"
}

# image_machine FIRMWARE LOGDIR SIZE [QEMU_ARG...]: a new command line (qemu.bash) for the live appliance: a qcow2
# overlay of $IMAGE (SIZE) as its boot disk, root's password hash and SSH key (LOGDIR's credentials) as systemd
# credentials. QEMU_ARGs (devices of a suite's own, e.g. an emulated IOMMU) come before the boot disk: an IOMMU
# must exist before the PCI devices it translates for.
image_machine() {
    local firmware=$1 logdir=$2 size=$3
    shift 3
    mkdir -p "$logdir"
    image_make_credentials "$logdir"
    qemu_overlay "$logdir/disk.qcow2" "$size" || return 1
    qemu_new "$logdir/serial.log" --cpu "${IMAGE_QEMU_CPU:-max}" --smp "${IMAGE_QEMU_SMP:-2}" --no-reboot
    qemu_firmware "$firmware" "$logdir/ovmf-vars.fd" || return 1
    QEMU_ARGS+=("$@")
    qemu_disk disk qcow2 "$logdir/disk.qcow2" --boot --discard
    qemu_credential passwd.hashed-password.root "$(openssl passwd -6 -stdin < "$logdir/root-password")"
    qemu_credential ssh.authorized_keys.root "$(cat "$logdir/id_ed25519.pub")"
}

# image_boot FIRMWARE LOGDIR [TIMEOUT_S]: boots the appliance with FIRMWARE (uefi: OVMF, bios: SeaBIOS) and the
# self-test, until it powers off (or TIMEOUT_S, default 600). Leaves in LOGDIR: serial.log, status (the self-test's
# status line), journal.txt (the boot's journal, sent by the guest on failure), qemu.log, boot-seconds.
image_boot() {
    local firmware=$1 logdir=$2 timeout_s=${3:-600} start rc=0
    mkdir -p "$logdir"
    rm -f "$logdir"/{serial.log,status,journal.txt,qemu.log,boot-seconds,disk.qcow2}
    image_machine "$firmware" "$logdir" 8G || return 1
    qemu_nic
    qemu_selftest "$logdir/status" "$logdir/journal.txt"
    # shellcheck disable=SC2206 # a word list on purpose
    QEMU_ARGS+=(${IMAGE_QEMU_EXTRA:-})
    start=$SECONDS
    qemu_run "$timeout_s" "$logdir/qemu.log" || rc=$?
    echo $((SECONDS - start)) > "$logdir/boot-seconds"
    echo "qemu exit $rc after $((SECONDS - start)) s ($firmware)" >> "$logdir/qemu.log"
    rm -f "$logdir/disk.qcow2"
}

# image_boot_until FIRMWARE LOGDIR PATTERN TIMEOUT_S: boots like image_boot without the self-test and stops QEMU, by
# its PID, as soon as PATTERN (grep -E) shows in the serial log, or after TIMEOUT_S. Returns 0 when the pattern was
# seen. Leaves serial.log, qemu.log and boot-seconds (seconds until the pattern) in LOGDIR.
image_boot_until() {
    local firmware=$1 logdir=$2 pattern=$3 timeout_s=$4 rc=0
    mkdir -p "$logdir"
    rm -f "$logdir"/{serial.log,qemu.log,boot-seconds,disk.qcow2}
    image_machine "$firmware" "$logdir" 8G || return 1
    qemu_nic
    : > "$logdir/serial.log"
    qemu_start "$logdir/qemu.log"
    wait_for --alive "$QEMU_PID" "$timeout_s" 1 grep -aqE "$pattern" "$logdir/serial.log" 2>/dev/null || rc=$?
    echo "$WAITED_S" > "$logdir/boot-seconds"
    kill "$QEMU_PID" 2>/dev/null || :
    wait "$QEMU_PID" 2>/dev/null || :
    if [ "$rc" = 0 ]; then
        echo "qemu stopped after $WAITED_S s ($firmware): serial log matched /$pattern/" >> "$logdir/qemu.log"
    else
        echo "no /$pattern/ in the serial log after $WAITED_S s ($firmware)" >> "$logdir/qemu.log"
    fi
    rm -f "$logdir/disk.qcow2"
    return $((rc != 0))
}

# image_start FIRMWARE LOGDIR SSH_PORT [QEMU_ARG...]: starts the appliance in the background for use over SSH (no
# self-test, no power-off; 16 GiB overlay), SSH on 127.0.0.1:SSH_PORT only, with QEMU_ARGs (image_machine) added;
# QEMU_PID is its process. machine_* (qemu.bash) reach and stop it with LOGDIR's key.
image_start() {
    local firmware=$1 logdir=$2 port=$3
    shift 3
    rm -f "$logdir"/{serial.log,qemu.log,disk.qcow2}
    image_machine "$firmware" "$logdir" 16G "$@" || return 1
    qemu_nic --ssh "$port"
    qemu_start "$logdir/qemu.log"
}

# run_again_if_guest_died_booting OUT CMD...: after a failed `run` of a `cloudbox run` whose output is in OUT: when
# it failed because its nested guest stopped while booting (docs/image.md, "When a benchmark guest dies"), keeps OUT
# as OUT-attempt1, announces it with the reason, and runs CMD again (`run`; output to OUT; RUN_AGAIN_AT is $SECONDS
# when it started). Returns 1, running nothing, for any other outcome.
run_again_if_guest_died_booting() {
    local out=$1 first=${1%.txt}-attempt1.txt line
    shift
    # shellcheck disable=SC2154 # status and output: bats' run
    [ "$status" -ne 0 ] && grep -qE '^==> run (failed|aborted): .*stopped while booting' <<<"$output" || return 1
    mv "$out" "$first"
    note "RETRY: the nested guest stopped while booting; attempt 1 in $first:"
    grep -A 40 -E '^==> run (failed|aborted)' "$first" | sed -n '/^$/q;s/^/  /p' | while IFS= read -r line; do
        note "$line"
    done || true
    # shellcheck disable=SC2034 # for the caller
    RUN_AGAIN_AT=$SECONDS
    run "$@"
    echo "$output" > "$out"
}

# image_tcg_oops LOGDIR: the first line of a kernel oops or panic in LOGDIR/serial.log, without its timestamp; nothing
# when there is none (docs/image.md, "Known flake").
image_tcg_oops() {
    local line
    line=$(grep -a -m1 -E 'Oops: |Kernel panic - not syncing' "$1/serial.log" 2>/dev/null) || return 0
    echo "${line#*] }"
}

# selftest_status STATUS SERIAL_LOG: the self-test's status as the guest reported it (its virtio-serial port, else
# the serial log), or nothing.
selftest_status() {
    local s
    s=$(tr -dc '0-9' < "$1" 2>/dev/null) || s=
    if [ -z "$s" ]; then
        s=$(grep -ao 'cloudbox-selftest: status=[0-9]*' "$2" 2>/dev/null | tail -1 | cut -d= -f2) || s=
    fi
    echo "$s"
}

# image_selftest_status LOGDIR: the self-test's status of an image_boot.
image_selftest_status() {
    selftest_status "$1/status" "$1/serial.log"
}

# image_esp RAW: the ESP of a disk image as mtools' IMAGE@@OFFSET.
image_esp() {
    local raw=$1 start
    start=$(partx --show --output START,TYPE --noheadings "$raw" |
        awk '$2 == "c12a7328-f81f-11d2-ba4b-00a0c93ec93b" {print $1}')
    [ -n "$start" ] || { echo "image_esp: no EFI system partition in $raw" >&2; return 1; }
    echo "$raw@@$((start * 512))"
}

# image_esp_cat RAW PATH: a file of the image's ESP (CRs removed).
image_esp_cat() {
    local esp
    esp=$(image_esp "$1") || return 1
    MTOOLS_SKIP_CHECK=1 mtype -i "$esp" "::$2" | tr -d '\r'
}

# image_esp_size RAW PATH: the size in bytes of a file on the image's ESP (fails if it is not there).
image_esp_size() {
    local esp
    esp=$(image_esp "$1") || return 1
    MTOOLS_SKIP_CHECK=1 mdir -b -i "$esp" "::$2" >/dev/null || return 1
    MTOOLS_SKIP_CHECK=1 mcopy -n -i "$esp" "::$2" - | wc -c
}

# image_esp_put RAW FILE PATH: FILE written over PATH on the ESP of the disk image RAW (tests change copies only).
image_esp_put() {
    local esp
    esp=$(image_esp "$1") || return 1
    MTOOLS_SKIP_CHECK=1 mcopy -o -i "$esp" "$2" "::$3"
}

# image_linux_entry RAW: the path on the ESP of the Linux boot entry (systemd-boot's type-1 entry, cloudbox-<kernel>).
image_linux_entry() {
    local esp
    esp=$(image_esp "$1") || return 1
    MTOOLS_SKIP_CHECK=1 mdir -b -i "$esp" ::/loader/entries/ |
        sed -n 's|^::\(/loader/entries/cloudbox-[0-9][^/]*\.conf\)$|\1|p' | head -1 | grep .
}

# image_xen_default SRC DST: a sparse copy of the image whose boot loaders both default to the Xen entry, as a lab
# would pick it in the menu (later settings win in grub.cfg and loader.conf). dom0 also gets
# systemd.default_device_timeout_sec=600: under TCG its root device can take longer than systemd's 90 s to appear.
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
