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

# _install_disks FILE:SERIAL...: the disks to install onto, in order (raw, TRIM passed through).
_install_disks() {
    local i=0 spec
    for spec in "$@"; do
        qemu_disk "d$i" raw "${spec%%:*}" --serial "${spec#*:}" --discard
        i=$((i + 1))
    done
}

# _install_event LOG: whether the serial log LOG shows INSTALL_KILL_AT or INSTALL_STOP_AT (grep -E), or a machine
# that will never go on (console_dead).
_install_event() {
    console_dead "$1" ||
        { [ -n "${INSTALL_KILL_AT:-}" ] && grep -aqE "$INSTALL_KILL_AT" "$1" 2>/dev/null; } ||
        { [ -n "${INSTALL_STOP_AT:-}" ] && grep -aqE "$INSTALL_STOP_AT" "$1" 2>/dev/null; }
}

# install_live FIRMWARE LOGDIR NAME STICK ANSWERS DISK... : boots the live system from STICK (raw; a qcow2
# overlay of $IMAGE when STICK is "overlay") with ANSWERS as the credential cloudbox.answers and the DISKs,
# and waits until QEMU exits (the install reboots; -no-reboot turns that into an exit) or the timeout
# (INSTALL_TIMEOUT_S, default 900) or a dead machine (console_dead; for both, the console's last lines go to stderr).
# INSTALL_SMP: vCPUs (default 2).
# With INSTALL_KILL_AT=REGEX, QEMU is killed (a power loss) as soon as the
# serial log matches REGEX; with INSTALL_STOP_AT=REGEX, it is stopped 5 s after REGEX shows (the live system stays
# up when there is nothing to do). Leaves LOGDIR/NAME.serial.log, NAME.qemu.log, NAME.seconds, NAME.rc.
install_live() {
    local fw=$1 logdir=$2 name=$3 stick=$4 answers=$5 start seen=0 rc=0
    shift 5
    mkdir -p "$logdir"
    rm -f "$logdir/$name".{serial.log,qemu.log,seconds,rc}
    qemu_new "$logdir/$name.serial.log" --smp "${INSTALL_SMP:-2}" --no-reboot
    qemu_firmware "$fw" "$logdir/$name-vars.fd" || return 1
    if [ "$stick" = overlay ]; then
        qemu_overlay "$logdir/$name-stick.qcow2" 8G || return 1
        qemu_disk stick qcow2 "$logdir/$name-stick.qcow2" --serial cbstick --boot
    else
        qemu_disk stick raw "$stick" --serial cbstick --boot
    fi
    _install_disks "$@"
    qemu_nic --mac "$INSTALL_CAMPUS_MAC"
    qemu_nic --mac "$INSTALL_PRIVATE_MAC"
    qemu_credential_file cloudbox.answers "$answers"
    start=$SECONDS
    qemu_start "$logdir/$name.qemu.log"
    wait_for --alive "$QEMU_PID" "${INSTALL_TIMEOUT_S:-900}" 2 _install_event "$logdir/$name.serial.log" 2>/dev/null ||
        seen=$?
    if [ "$seen" = 0 ] && console_dead "$logdir/$name.serial.log"; then
        kill -KILL "$QEMU_PID"; echo "dead after $WAITED_S s: $(console_dead "$logdir/$name.serial.log")" >> "$logdir/$name.qemu.log"
        echo "$name: the machine stopped for good after $WAITED_S s; its console's last lines:" >&2
        install_console_tail "$logdir/$name.serial.log" >&2
    elif [ "$seen" = 0 ] && [ -n "${INSTALL_KILL_AT:-}" ] &&
        grep -aqE "$INSTALL_KILL_AT" "$logdir/$name.serial.log"; then
        kill -KILL "$QEMU_PID"; echo "killed (power loss) at: $INSTALL_KILL_AT" >> "$logdir/$name.qemu.log"
    elif [ "$seen" = 0 ]; then
        sleep 5; kill -TERM "$QEMU_PID"; echo "stopped at: $INSTALL_STOP_AT" >> "$logdir/$name.qemu.log"
    elif [ "$seen" = 1 ]; then
        kill -KILL "$QEMU_PID"; echo "timeout after $WAITED_S s" >> "$logdir/$name.qemu.log"
        echo "$name: no reboot after $WAITED_S s; its console's last lines:" >&2
        install_console_tail "$logdir/$name.serial.log" >&2
    fi
    wait "$QEMU_PID" 2>/dev/null || rc=$?
    echo "$rc" > "$logdir/$name.rc"
    echo $((SECONDS - start)) > "$logdir/$name.seconds"
    rm -f "$logdir/$name-stick.qcow2" "$logdir/$name-vars.fd"
}

# install_console_tail SERIAL_LOG [N]: the last N (default 15) lines of a serial console log that say where the
# machine was (kernel and service messages; audit records and terminal escapes left out).
install_console_tail() {
    grep -av 'audit' "$1" 2>/dev/null | sed 's/\x1b\[[0-9;]*[A-Za-z]//g' | tr -d '\r' | grep -av '^\s*$' |
        tail -n "${2:-15}" | cut -c1-200 | sed 's/^/  | /'
}

# install_boot_installed FIRMWARE LOGDIR NAME DISK: boots DISK alone (no stick) with the self-test, until it powers off
# (or INSTALL_BOOT_TIMEOUT_S, default 600); leaves LOGDIR/NAME.status (the self-test's status), NAME.serial.log,
# NAME.seconds.
install_boot_installed() {
    local fw=$1 logdir=$2 name=$3 disk=$4 start rc=0
    rm -f "$logdir/$name".{serial.log,qemu.log,seconds,status,journal.txt}
    qemu_new "$logdir/$name.serial.log" --no-reboot
    qemu_firmware "$fw" "$logdir/$name-vars.fd" || return 1
    qemu_disk disk raw "$disk" --serial cbtarget --boot
    qemu_nic --mac "$INSTALL_CAMPUS_MAC"
    qemu_selftest "$logdir/$name.status" "$logdir/$name.journal.txt"
    start=$SECONDS
    qemu_run "${INSTALL_BOOT_TIMEOUT_S:-600}" "$logdir/$name.qemu.log" || rc=$?
    echo "qemu exit $rc" >> "$logdir/$name.qemu.log"
    echo $((SECONDS - start)) > "$logdir/$name.seconds"
    rm -f "$logdir/$name-vars.fd"
}

# install_status LOGDIR NAME: the self-test status of an installed boot (virtio-serial port, else serial log).
install_status() {
    selftest_status "$1/$2.status" "$1/$2.serial.log"
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

# install_finished DISK: whether DISK holds a finished install (its install journal has the "complete" event).
install_finished() {
    local journal
    [ -f "$1" ] || return 1
    journal=$(install_cat "$1" /var/lib/cloudbox/install/journal.jsonl) || return 1
    grep -q '"event": "complete"' <<<"$journal"
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
    printf '%s\n' "$2" | "$REPO/tui/.venv/bin/python" -c 'import sys
from pathlib import Path
from cloudbox.bench import update_section
update_section(Path(sys.argv[1]), sys.argv[2], sys.stdin.read())' "$REPO/docs/benchmarks.md" "$1"
}
