# Unattended installs of the appliance under QEMU TCG (tests/image/install.bats): boot the live image with an answer
# file (systemd credential cloudbox.answers) and disks to install onto; boot the installed disk alone; read files
# from an installed disk on the host (debugfs over a read-only loop device: nothing is mounted or written).
# Disks are raw sparse files named "FILE:SERIAL" (QEMU virtio-blk serial -> /dev/disk/by-id/virtio-SERIAL).

# The two NICs every live boot has, by MAC (answer files name NICs by MAC: names depend on PCI slots).
INSTALL_CAMPUS_MAC=52:54:00:cb:00:01
INSTALL_PRIVATE_MAC=52:54:00:cb:00:02

# install_disk FILE SIZE: a new sparse raw disk image.
install_disk() {
    rm -f "$1" && truncate -s "$2" "$1"
}

# _install_fw FIRMWARE LOGDIR NAME: sets INSTALL_FW to the firmware arguments (a fresh copy of OVMF's VARS).
_install_fw() {
    local code
    INSTALL_FW=()
    case $1 in
        uefi)
            code=$(image_ovmf_code) || { echo "no OVMF firmware found" >&2; return 1; }
            cp "${code/CODE/VARS}" "$2/$3-vars.fd"
            INSTALL_FW=(-drive "if=pflash,format=raw,unit=0,readonly=on,file=$code"
                        -drive "if=pflash,format=raw,unit=1,file=$2/$3-vars.fd") ;;
        bios) ;;
        *) echo "firmware must be uefi or bios" >&2; return 1 ;;
    esac
}

# _install_disks FILE:SERIAL...: sets INSTALL_DISKS to the QEMU arguments of the extra disks.
_install_disks() {
    local i=0 spec file serial
    INSTALL_DISKS=()
    for spec in "$@"; do
        file=${spec%%:*} serial=${spec#*:}
        INSTALL_DISKS+=(-drive "if=none,id=d$i,format=raw,file=$file,discard=unmap"
                        -device "virtio-blk-pci,drive=d$i,serial=$serial")
        i=$((i + 1))
    done
}

# install_live FIRMWARE LOGDIR NAME STICK ANSWERS DISK... : boots the live system from STICK (raw; a qcow2
# overlay of $IMAGE when STICK is "overlay") with ANSWERS as the credential cloudbox.answers and the DISKs,
# and waits until QEMU exits (the install reboots; -no-reboot turns that into an exit) or the timeout
# (INSTALL_TIMEOUT_S, default 900). With INSTALL_KILL_AT=REGEX, QEMU is killed (a power loss) as soon as the
# serial log matches REGEX; with INSTALL_STOP_AT=REGEX, it is killed once REGEX shows (the live system stays up
# when there is nothing to do). Leaves LOGDIR/NAME.serial.log, NAME.qemu.log, NAME.seconds, NAME.rc.
install_live() {
    local fw=$1 logdir=$2 name=$3 stick=$4 answers=$5 start pid t=0 rc= stickargs
    shift 5
    mkdir -p "$logdir"
    rm -f "$logdir/$name".{serial.log,qemu.log,seconds,rc}
    _install_fw "$fw" "$logdir" "$name" || return 1
    _install_disks "$@"
    if [ "$stick" = overlay ]; then
        qemu-img create -q -f qcow2 -b "$IMAGE" -F raw "$logdir/$name-stick.qcow2" 8G || return 1
        stickargs=(-drive "if=none,id=stick,format=qcow2,file=$logdir/$name-stick.qcow2")
    else
        stickargs=(-drive "if=none,id=stick,format=raw,file=$stick")
    fi
    start=$(date +%s)
    nice -n 10 qemu-system-x86_64 -machine q35 -accel tcg -cpu max -smp 2 -m 4096 "${INSTALL_FW[@]}" \
        -display none -no-user-config -nodefaults -no-reboot -serial "file:$logdir/$name.serial.log" \
        "${stickargs[@]}" -device virtio-blk-pci,drive=stick,serial=cbstick,bootindex=1 \
        "${INSTALL_DISKS[@]}" \
        -nic "user,restrict=on,model=virtio-net-pci,mac=$INSTALL_CAMPUS_MAC" \
        -nic "user,restrict=on,model=virtio-net-pci,mac=$INSTALL_PRIVATE_MAC" \
        -smbios "type=11,value=io.systemd.credential.binary:cloudbox.answers=$(base64 -w0 "$answers")" \
        > "$logdir/$name.qemu.log" 2>&1 &
    pid=$!
    while kill -0 "$pid" 2>/dev/null; do
        if [ -n "${INSTALL_KILL_AT:-}" ] && grep -aqE "$INSTALL_KILL_AT" "$logdir/$name.serial.log" 2>/dev/null; then
            kill -KILL "$pid"; echo "killed (power loss) at: $INSTALL_KILL_AT" >> "$logdir/$name.qemu.log"; break
        fi
        if [ -n "${INSTALL_STOP_AT:-}" ] && grep -aqE "$INSTALL_STOP_AT" "$logdir/$name.serial.log" 2>/dev/null; then
            sleep 5; kill -TERM "$pid"; echo "stopped at: $INSTALL_STOP_AT" >> "$logdir/$name.qemu.log"; break
        fi
        if [ "$t" -ge "${INSTALL_TIMEOUT_S:-900}" ]; then
            kill -KILL "$pid"; echo "timeout after $t s" >> "$logdir/$name.qemu.log"; break
        fi
        sleep 2; t=$((t + 2))
    done
    wait "$pid" 2>/dev/null || rc=$?
    echo "${rc:-0}" > "$logdir/$name.rc"
    echo $(( $(date +%s) - start )) > "$logdir/$name.seconds"
    rm -f "$logdir/$name-stick.qcow2" "$logdir/$name-vars.fd"
}

# install_boot_installed FIRMWARE LOGDIR NAME DISK: boots DISK alone (no stick) with the self-test; leaves
# LOGDIR/NAME.status (the self-test's status), NAME.serial.log, NAME.seconds.
install_boot_installed() {
    local fw=$1 logdir=$2 name=$3 disk=$4 start rc=
    rm -f "$logdir/$name".{serial.log,qemu.log,seconds,status,journal.txt}
    _install_fw "$fw" "$logdir" "$name" || return 1
    : > "$logdir/$name.status"; : > "$logdir/$name.journal.txt"
    start=$(date +%s)
    timeout --kill-after=10 "${INSTALL_BOOT_TIMEOUT_S:-600}" nice -n 10 qemu-system-x86_64 -machine q35 -accel tcg \
        -cpu max -smp 2 -m 4096 "${INSTALL_FW[@]}" \
        -display none -no-user-config -nodefaults -no-reboot -serial "file:$logdir/$name.serial.log" \
        -drive "if=none,id=disk,format=raw,file=$disk" -device virtio-blk-pci,drive=disk,serial=cbtarget,bootindex=1 \
        -nic "user,restrict=on,model=virtio-net-pci,mac=$INSTALL_CAMPUS_MAC" \
        -device virtio-serial-pci \
        -chardev "file,id=selftest,path=$logdir/$name.status" \
        -device virtserialport,chardev=selftest,name=org.cloudbox.selftest \
        -chardev "file,id=journal,path=$logdir/$name.journal.txt" \
        -device virtserialport,chardev=journal,name=org.cloudbox.journal \
        -smbios "type=11,value=io.systemd.credential:cloudbox.selftest=1" \
        > "$logdir/$name.qemu.log" 2>&1 || rc=$?
    echo "qemu exit ${rc:-0}" >> "$logdir/$name.qemu.log"
    echo $(( $(date +%s) - start )) > "$logdir/$name.seconds"
    rm -f "$logdir/$name-vars.fd"
}

# install_status LOGDIR NAME: the self-test status of an installed boot (virtio-serial port, else serial log).
install_status() {
    local s
    s=$(tr -dc '0-9' < "$1/$2.status" 2>/dev/null)
    [ -n "$s" ] || s=$(grep -ao 'cloudbox-selftest: status=[0-9]*' "$1/$2.serial.log" 2>/dev/null | tail -1 | cut -d= -f2)
    echo "$s"
}

# _install_root_loop DISK: prints a read-only loop device over partition 3 (the installed root) of the raw image
# DISK (partx reads the table from the file; no partition scanning or udev needed).
_install_root_loop() {
    local start size
    start=$(partx --noheadings -o START -n 3 "$1" 2>/dev/null | tr -d ' ')
    size=$(partx --noheadings -o SECTORS -n 3 "$1" 2>/dev/null | tr -d ' ')
    [ -n "$start" ] && [ -n "$size" ] || { echo "$1 has no partition 3" >&2; return 1; }
    losetup --find --show --read-only --offset $((start * 512)) --sizelimit $((size * 512)) "$1"
}

# install_cat DISK PATH: prints a file of the installed root file system. Read-only: a read-only loop device
# and debugfs (which opens the file system read-only); nothing is mounted.
install_cat() {
    local part rc=0
    part=$(_install_root_loop "$1") || return 1
    debugfs -R "cat $2" "$part" 2>/dev/null || rc=$?
    losetup -d "$part"
    return "$rc"
}

# install_exists DISK PATH: whether PATH exists on the installed root (read-only, as install_cat).
install_exists() {
    local part out
    part=$(_install_root_loop "$1") || return 1
    out=$(debugfs -R "stat $2" "$part" 2>&1)
    losetup -d "$part"
    ! grep -q 'File not found' <<<"$out"
}

# install_assert_frontend DISK PRIVATE_MAC LOGS: what an unattended front-end install (hostname fe1, root password
# hash in LOGS/root-hash, key LOGS/id_ed25519.pub) wrote on DISK, read on the host (read-only) before its first
# boot: node.toml, the private NIC's unit, hostname, key, password, a first boot still to come, the live session's
# SSH host keys left behind, the install journal complete. install.bats and cluster.bats call it (bats-assert).
install_assert_frontend() {
    local disk=$1 mac=$2 logs=$3
    run -0 install_cat "$disk" /etc/cloudbox/node.toml
    assert_line 'role = "front-end"'
    assert_line 'hostname = "fe1"'
    assert_line "private_mac = \"$mac\""
    assert_line 'private_mtu = 9000'
    run -0 install_cat "$disk" /etc/systemd/network/10-cloudbox-private.network
    assert_line 'MTUBytes=9000'
    assert_line "MACAddress=$mac"
    run -0 install_cat "$disk" /etc/hostname
    assert_output fe1
    run -0 install_cat "$disk" /root/.ssh/authorized_keys
    assert_output "$(cat "$logs/id_ed25519.pub")"
    run -0 install_cat "$disk" /etc/shadow
    assert_line --regexp "^root:$(sed 's/[$./]/\\&/g' "$logs/root-hash"):"
    run -0 install_cat "$disk" /etc/machine-id
    assert_output uninitialized  # first boot on the node
    run ! install_exists "$disk" /etc/ssh/ssh_host_ed25519_key
    run -0 install_cat "$disk" /var/lib/cloudbox/install/journal.jsonl
    assert_line --partial '"event": "complete"'
}

# install_boot_regions_sha STICK: one sha256 over what an installer could wrongly write on the stick: the first
# and last MiB (protective MBR with grub's boot code, both GPT copies), the BIOS boot partition (grub's core
# image) byte for byte, and every file of the ESP (boot loaders, entries, kernels, grub.cfg) with its content.
# The ESP is compared file by file, not byte by byte: the live system's own reads there (systemd-boot-update
# comparing versions at boot) update FAT access dates. Its root partition is the live session's writable root.
install_boot_regions_sha() {
    local stick=$1 bstart bsize estart tmp
    bstart=$(partx --noheadings -o START -n 2 "$stick" | tr -d ' ')
    bsize=$(partx --noheadings -o SECTORS -n 2 "$stick" | tr -d ' ')
    estart=$(partx --noheadings -o START -n 1 "$stick" | tr -d ' ')
    tmp=$(mktemp -d /var/tmp/cloudbox-esp.XXXXXX) || return 1
    MTOOLS_SKIP_CHECK=1 mcopy -s -p -m -i "$stick@@$((estart * 512))" '::*' "$tmp/" 2>/dev/null
    {
        head -c $((1024 * 1024)) "$stick"
        tail -c $((1024 * 1024)) "$stick"
        dd if="$stick" bs=512 skip="$bstart" count="$bsize" status=none
        (cd "$tmp" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)
    } | sha256sum | cut -d' ' -f1
    rm -rf "$tmp"
}

# install_record_bench NAME BODY: replaces the <!-- bench:NAME --> section of docs/benchmarks.md with BODY.
install_record_bench() {
    local doc
    doc="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/docs/benchmarks.md"
    python3 - "$doc" "$1" "$2" <<'PY'
import sys
doc, name, body = sys.argv[1:]
start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
text = open(doc).read()
block = f"{start}\n{body.rstrip()}\n{end}"
if start in text and end in text:
    text = text[: text.index(start)] + block + text[text.index(end) + len(end):]
else:
    text = text.rstrip("\n") + "\n\n" + block + "\n"
open(doc, "w").write(text)
PY
}
