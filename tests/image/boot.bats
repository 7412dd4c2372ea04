#!/usr/bin/env bats
# Boots the appliance image under QEMU TCG (UEFI, UEFI with Secure Boot on, and legacy BIOS) and checks its self-test
# exits 123; under Secure Boot also that what is not signed is refused and that the Xen entry says why it is not offered.
# Slow: builds the image when missing (scripts/build-image), then each boot takes minutes. Select with --filter-tags.

load ../helpers/load

setup_file() {
    suite_begin
    export BOOT_LOGS=$SUITE_LOGS
}

teardown() {
    if [ "${BATS_TEST_COMPLETED:-}" != 1 ] && [ -n "${logdir:-}" ]; then
        echo "# guest logs kept in $logdir (serial.log, journal.txt, qemu.log)" >&3
    fi
}

# Boots with FIRMWARE, asserts status 123, the credentials applied and the boot time budget (IMAGE_BOOT_BUDGET_S,
# default 480 s: twice the slowest boot seen under TCG on 2 shared cores, so it catches hangs and several-fold
# slowdowns; the figures are in docs/benchmarks.md). One announced retry, only when the boot failed with the
# appliance's kernel crashed under TCG (docs/image.md, "Known flake"); attempt 1's logs are kept.
boot_and_check() {
    local firmware=$1 oops
    logdir=$BOOT_LOGS/$firmware
    image_boot "$firmware" "$logdir" "${IMAGE_BOOT_TIMEOUT_S:-600}"
    oops=$(image_tcg_oops "$logdir")
    if [ -n "$oops" ] && [ "$(image_selftest_status "$logdir")" != 123 ]; then
        rm -rf "$logdir-attempt1" && mv "$logdir" "$logdir-attempt1"
        echo "# RETRY: $firmware boot: the appliance's kernel oopsed under TCG ($oops); attempt 1 in $logdir-attempt1" >&3
        image_boot "$firmware" "$logdir" "${IMAGE_BOOT_TIMEOUT_S:-600}"
    fi
    echo "# $firmware boot to self-test verdict: $(cat "$logdir/boot-seconds") s" >&3
    run -0 image_selftest_status "$logdir"
    assert_output 123
    run -0 grep -a 'cloudbox-selftest: PASS no failed units' "$logdir/serial.log"
    run -0 grep -a 'cloudbox-selftest: .*kvm: ' "$logdir/serial.log"
    # No default password: the first boot applied the root password and SSH key given as credentials.
    run -0 grep -a -c -e 'PASS root credentials: password hash' -e 'PASS root credentials: SSH key' \
        -e 'PASS sshd is running' "$logdir/serial.log"
    assert_output 3
    assert [ "$(cat "$logdir/boot-seconds")" -le "${IMAGE_BOOT_BUDGET_S:-480}" ]
}

# Both boot-full: cluster.bats boots the stick and the installed disks under UEFI and runs this self-test there.
# bats test_tags=slow,image,boot-full
@test "UEFI (OVMF) boot reaches the self-test verdict 123 with the root credentials applied" {
    boot_and_check uefi
    run -0 grep -a 'cloudbox-selftest: secure boot: disabled; kernel lockdown: none' "$logdir/serial.log"
}

# bats test_tags=slow,image,boot-full
@test "legacy BIOS (SeaBIOS) boot reaches the self-test verdict 123 with the root credentials applied" {
    boot_and_check bios
    run -0 grep -a 'cloudbox-selftest: secure boot: off (legacy BIOS boot); kernel lockdown: none' "$logdir/serial.log"
}

# Secure Boot (docs/image.md, "Secure Boot"): OVMF that enforces it, with Microsoft's keys enrolled (qemu_firmware
# uefi-sb; its db has Microsoft's 2011 CAs only, like firmware that never got the 2023 ones).

# efi_signers FILE: the issuer of each signature's signing certificate (tests/helpers/efi_sig.py), one a line.
efi_signers() {
    python3 "$REPO/tests/helpers/efi_sig.py" signers "$1"
}

# esp_get PATH FILE: PATH from the image's ESP to FILE.
esp_get() {
    MTOOLS_SKIP_CHECK=1 mcopy -n -o -i "$(image_esp "$IMAGE")" "::$1" "$2"
}

# bats test_tags=slow,image
@test "Secure Boot chain on the ESP: shim signed by Microsoft's UEFI CA 2011 and 2023, the rest by Debian; Xen unsigned" {
    needs openssl
    local d=$BATS_TEST_TMPDIR kernel f
    kernel=$(image_esp_cat "$IMAGE" "$(image_linux_entry "$IMAGE")" | awk '$1 == "linux" {print $2}')
    [ -n "$kernel" ] || fail "the Linux entry on the ESP of $IMAGE has no linux line"
    # The firmware starts shim from the removable-media path; both of Microsoft's CAs signed it.
    esp_get /EFI/BOOT/BOOTX64.EFI "$d/shim.efi"
    run -0 grep -ac 'UEFI shim' "$d/shim.efi"
    run -0 efi_signers "$d/shim.efi"
    assert_line 'Microsoft Corporation UEFI CA 2011'
    assert_line 'Microsoft UEFI CA 2023'
    # shim starts its second stage, systemd-boot, and MokManager; systemd-boot has shim check the kernel and the
    # Xen entry's grub. Debian signed all four.
    esp_get /EFI/BOOT/grubx64.efi "$d/second.efi"
    run -0 grep -ac '#### LoaderInfo: systemd-boot ' "$d/second.efi"
    for f in /EFI/BOOT/grubx64.efi /EFI/BOOT/mmx64.efi /EFI/debian/grubx64.efi "$kernel"; do
        esp_get "$f" "$d/pe.efi"
        run -0 efi_signers "$d/pe.efi"
        assert_output 'Debian Secure Boot CA'
    done
    # Debian's Xen is signed by no one: the Xen entry starts the signed grub, which tells Secure Boot apart.
    esp_get /xen/xen.efi "$d/xen.efi"
    run -0 efi_signers "$d/xen.efi"
    assert_output ''
    run -0 image_esp_cat "$IMAGE" /loader/entries/cloudbox-xen.conf
    assert_line 'efi /EFI/debian/grubx64.efi'
    run -0 image_esp_cat "$IMAGE" /EFI/debian/grub.cfg
    assert_line 'if [ "$lockdown" = y ]; then'
    assert_line 'chainloader /xen/xen.efi'
}

# bats test_tags=slow,image,boot-full
@test "Secure Boot on: the stick boots to the self-test verdict 123, the kernel locked down, cloudbox's modules load" {
    boot_and_check uefi-sb
    run -0 grep -a 'EFI stub: UEFI Secure Boot is enabled' "$logdir/serial.log"
    run -0 grep -a 'secureboot: Secure boot enabled' "$logdir/serial.log"
    run -0 grep -a 'Kernel is locked down from EFI Secure Boot' "$logdir/serial.log"
    run -0 grep -a 'cloudbox-selftest: secure boot: enabled; kernel lockdown: integrity' "$logdir/serial.log"
    run -0 grep -a 'cloudbox-selftest: PASS lockdown: the modules cloudbox loads on demand load' "$logdir/serial.log"
    run -0 grep -a 'cloudbox-selftest: kvm: usable' "$logdir/serial.log"
}

# Firmware and loaders refuse in text on the console (OVMF mirrors it to the serial port): wait for that, then stop.
SB_REFUSED='Security [Vv]iolation|Access [Dd]enied'

# bats test_tags=slow,image
@test "Secure Boot on: an unsigned kernel in the Linux entry's place is refused before it runs" {
    local dir=$BOOT_LOGS/uefi-sb-unsigned kernel
    logdir=$dir
    mkdir -p "$dir"
    cp --sparse=always "$IMAGE" "$dir/disk.raw"
    kernel=$(image_esp_cat "$dir/disk.raw" "$(image_linux_entry "$dir/disk.raw")" | awk '$1 == "linux" {print $2}')
    esp_get "$kernel" "$dir/vmlinuz.signed"
    python3 "$REPO/tests/helpers/efi_sig.py" strip "$dir/vmlinuz.signed" "$dir/vmlinuz.unsigned"
    run -0 efi_signers "$dir/vmlinuz.unsigned"
    assert_output ''
    image_esp_put "$dir/disk.raw" "$dir/vmlinuz.unsigned" "$kernel"
    IMAGE=$dir/disk.raw run image_boot_until uefi-sb "$dir" "$SB_REFUSED" "${IMAGE_SB_REFUSE_TIMEOUT_S:-300}"
    rm -f "$dir/disk.raw"
    echo "# unsigned kernel refused after $(cat "$dir/boot-seconds") s" >&3
    assert_success
    run -0 grep -aE "Error loading .*vmlinuz.*: ($SB_REFUSED)" "$dir/serial.log"
    run -1 grep -a -e 'EFI stub:' -e 'Linux version' "$dir/serial.log"
}

# xen_refused SERIAL_LOG: the Xen entry's explanation is in the log, and systemd-boot's menu (the Linux entry's title)
# came back after it.
xen_refused() {
    local at
    at=$(grep -abo 'cloudbox on Xen is not offered under Secure Boot' "$1" | head -1 | cut -d: -f1)
    [ -n "$at" ] && tail -c "+$((at + 1))" "$1" | grep -aqE 'cloudbox [0-9]+\.[0-9]+'
}

# xen_explained SERIAL_LOG: the Xen entry's explanation is in the log.
xen_explained() {
    grep -aq 'cloudbox on Xen is not offered under Secure Boot' "$1"
}

# sb_root_mounted SERIAL_LOG: the kernel has mounted the appliance's root (partition 3).
sb_root_mounted() {
    grep -aqE 'EXT4-fs \(vd[a-z]3\): mounted filesystem' "$1"
}

# sb_monitor DIR KEY...: each KEY pressed in the machine started with QEMU's monitor on the pipe DIR/monitor.
sb_monitor() {
    local dir=$1 k
    shift
    for k in "$@"; do
        echo "sendkey $k" > "$dir/monitor.in"
        sleep 1
    done
}

# A copy of the image whose menu defaults to Xen, booted under Secure Boot, keys pressed through QEMU's monitor (a
# pipe): Esc cuts the explanation's 30 s short, as it says; then Down and Enter start the Linux entry from the menu.
# bats test_tags=slow,image
@test "Secure Boot on: the Xen entry says why Xen is not offered; Linux then boots from the same menu, locked down" {
    local dir=$BOOT_LOGS/uefi-sb-xen rc=0 explained back
    logdir=$dir
    mkdir -p "$dir"
    rm -f "$dir"/{serial.log,qemu.log,monitor.in,monitor.out}
    image_xen_default "$IMAGE" "$dir/disk.raw"
    IMAGE=$dir/disk.raw image_machine uefi-sb "$dir" 8G
    mkfifo "$dir/monitor.in" "$dir/monitor.out"
    QEMU_ARGS+=(-chardev "pipe,id=monitor,path=$dir/monitor" -mon chardev=monitor)
    qemu_start "$dir/qemu.log"
    cat "$dir/monitor.out" > /dev/null 3>&- &
    local drain=$!
    wait_for --alive "$QEMU_PID" "${IMAGE_SB_REFUSE_TIMEOUT_S:-300}" 1 xen_explained "$dir/serial.log" || rc=$?
    explained=$WAITED_S
    if [ "$rc" = 0 ]; then
        sleep 2
        sb_monitor "$dir" esc
        wait_for --alive "$QEMU_PID" 60 1 xen_refused "$dir/serial.log" || rc=$?
        back=$WAITED_S
    fi
    if [ "$rc" = 0 ]; then
        sb_monitor "$dir" down ret
        wait_for --alive "$QEMU_PID" "${IMAGE_SB_REFUSE_TIMEOUT_S:-300}" 1 sb_root_mounted "$dir/serial.log" || rc=$?
    fi
    kill "$QEMU_PID" 2>/dev/null || :
    wait "$QEMU_PID" 2>/dev/null || :
    kill "$drain" 2>/dev/null || :
    rm -f "$dir/disk.raw" "$dir/disk.qcow2" "$dir/monitor.in" "$dir/monitor.out"
    echo "# Xen entry under Secure Boot: explained after $explained s, the menu back ${back:-?} s after Esc," \
        "Linux's root mounted ${WAITED_S} s after Enter" >&3
    [ "$rc" = 0 ] || fail "explanation, menu and Linux's boot not all in $dir/serial.log (see it)"
    assert [ "$back" -lt 25 ]  # Esc, not the 30 s
    run -0 grep -a "Debian's Xen hypervisor" "$dir/serial.log"
    run -1 grep -a -e '(XEN)' -e 'Verification failed' "$dir/serial.log"
    run -0 grep -a 'EFI stub: UEFI Secure Boot is enabled' "$dir/serial.log"
    run -0 grep -a 'Kernel is locked down from EFI Secure Boot' "$dir/serial.log"
    run -0 grep -a 'secureboot: Secure boot enabled' "$dir/serial.log"
}

# sb_vars_db DIR NAME CERT...: DIR/NAME.fd, Debian's OVMF_VARS_4M.ms.fd (its PK, Microsoft's KEK) with a db holding
# only the CERTs (PEM).
sb_vars_db() {
    local dir=$1 name=$2 code vars args=() c
    shift 2
    read -r code vars < <(image_ovmf_secboot) && [ -n "$vars" ] || return 1
    for c in "$@"; do args+=(--add-db 77fa9abd-0359-4d32-bd60-28f4e78f784b "$c"); done
    virt-fw-vars -l warning -i "$vars" -d db "${args[@]}" -o "$dir/$name.fd"
}

# Microsoft's UEFI CA 2011 expired on 27 June 2026 (docs/image.md, "Secure Boot"). The tests above boot firmware that
# holds it and not the 2023 CA. Here: firmware that holds the 2023 CA only (its certificate taken from shim's own
# signature), and firmware that trusts neither, only Microsoft's Windows CA, as some machines do by default.
# bats test_tags=slow,image
@test "Secure Boot: firmware trusting only Microsoft's UEFI CA 2023 boots the stick; trusting neither CA, it refuses shim" {
    needs virt-fw-vars openssl
    local dir=$BOOT_LOGS/uefi-sb-ca
    logdir=$dir
    mkdir -p "$dir/certs"
    esp_get /EFI/BOOT/BOOTX64.EFI "$dir/shim.efi"
    python3 "$REPO/tests/helpers/efi_sig.py" cert "$dir/shim.efi" 'Microsoft UEFI CA 2023' > "$dir/certs/uefi-ca-2023.pem"
    (cd "$dir/certs" && virt-fw-vars -l warning -i "$(image_ovmf_secboot | cut -d' ' -f2)" --extract-certs)
    sb_vars_db "$dir" ca2023 "$dir/certs/uefi-ca-2023.pem"
    sb_vars_db "$dir" windows "$dir"/certs/db-*-MicrosoftWindowsProductionPCA2011.pem
    QEMU_SB_VARS=$dir/ca2023.fd run image_boot_until uefi-sb "$dir/ca2023" 'secureboot: Secure boot enabled' \
        "${IMAGE_SB_REFUSE_TIMEOUT_S:-300}"
    echo "# db with the UEFI CA 2023 only: the kernel up under Secure Boot after $(cat "$dir/ca2023/boot-seconds") s" >&3
    assert_success
    QEMU_SB_VARS=$dir/windows.fd run image_boot_until uefi-sb "$dir/windows" 'No bootable option or device was found' \
        "${IMAGE_SB_REFUSE_TIMEOUT_S:-300}"
    echo "# db with neither UEFI CA: the firmware gave up after $(cat "$dir/windows/boot-seconds") s" >&3
    assert_success
    run -0 grep -aE 'failed to load Boot[0-9A-F]{4} "UEFI Misc Device" .*: Access Denied' "$dir/windows/serial.log"
    run -1 grep -a -e 'EFI stub:' -e 'Linux version' "$dir/windows/serial.log"
}

# bats test_tags=slow,image
@test "the kernel-modules initrd holds the drivers that find the root (disks, HBAs, USB, NVMe, virtio), not every module" {
    local esp kver list
    esp=$(image_esp "$IMAGE")
    kver=$(MTOOLS_SKIP_CHECK=1 mdir -b -i "$esp" ::/cloudbox | sed -n 's|^::/cloudbox/\([0-9][^/]*\)/$|\1|p' | head -1)
    [ -n "$kver" ] || fail "no kernel directory under /cloudbox on the ESP of $IMAGE"
    list=$BATS_TEST_TMPDIR/modules.txt
    MTOOLS_SKIP_CHECK=1 mcopy -n -i "$esp" "::/cloudbox/$kver/kernel-modules.initrd" "$BATS_TEST_TMPDIR/kmods"
    echo "# kernel-modules.initrd: $(( $(stat -c %s "$BATS_TEST_TMPDIR/kmods") / 1048576 )) MiB" >&3
    zstd -dcq "$BATS_TEST_TMPDIR/kmods" | cpio -it --quiet | sed -n 's|.*/\([^/]*\)\.ko\(\.[a-z]*\)\?$|\1|p' > "$list"
    local m
    for m in virtio_blk virtio_scsi ahci ata_piix nvme vmd sd_mod usb-storage uas xhci-pci ehci-pci \
             sdhci-pci mmc_block megaraid_sas mpt3sas hpsa smartpqi xen-blkfront dm-mod raid0 ext4 vfat efivarfs \
             nls_cp437 usbhid hid-generic; do
        grep -qx -- "$m" "$list" || fail "the kernel-modules initrd lacks $m (mkosi.conf KernelModulesInitrdInclude=)"
    done
    for m in cfg80211 kvm-amd snd-hda-intel i915 iwlwifi; do
        ! grep -qx -- "$m" "$list" || fail "the kernel-modules initrd holds $m, which loads from the root"
    done
    assert [ "$(stat -c %s "$BATS_TEST_TMPDIR/kmods")" -le $((32 * 1048576)) ]
}

# bats test_tags=slow,image,boot-full
@test "make release: the compressed image, its bmap and manifest check against SHA256SUMS and write the same bytes" {
    local rel=$BATS_TEST_TMPDIR/release target=$BATS_TEST_TMPDIR/stick.raw zst
    run -0 env IMAGE_DIR="$IMAGE_DIR" RELEASE_DIR="$rel" "$REPO/scripts/make-release"
    echo "# $output" >&3
    run -0 bash -c "cd '$rel' && sha256sum -c SHA256SUMS"
    assert_output --regexp 'raw\.zst: OK'
    zst=$(ls "$rel"/*.raw.zst)
    # A stick as bmaptool writes one: only the mapped blocks, its bmap found beside the compressed image.
    truncate -s "$(stat -c %s "$IMAGE")" "$target"
    run -0 bmaptool copy "$zst" "$target"
    [ "$(sha256sum < "$target")" = "$(sha256sum < "$IMAGE")" ] || fail "bmaptool copy of $zst differs from $IMAGE"
}
