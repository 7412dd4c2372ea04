#!/usr/bin/env bats
# The Xen boot entry: present in both loaders' menus on the ESP, and under QEMU TCG it starts Xen and a dom0 that
# mounts the appliance's root, from systemd-boot (UEFI: Debian's signed grub chain-loads Xen's EFI loader) and from
# grub (BIOS, multiboot2).
# make test boots the UEFI entry once, to dom0 reached over SSH: its serial log shows Xen's EFI loader and the PV dom0,
# then a Xen PV benchmark guest (xen-xvd-phy) runs one quick storage and one network test there (docs/xen.md). Opt-in
# (--filter-tags xen-full): each loader's boot to the root's mount alone, the full dom0 boot to the self-test verdict
# (~10 min under TCG), a PV guest on a file through qdisk (xen-xvd-file), one disk booted into Xen then Linux, a run
# under each, compared side by side, and Xen on TCG's AMD CPU with nested paging (qemu64,+svm,+npt: Xen has HAP there)
# where a PVH guest (xen-pvh-phy) runs a quick storage test through libvirt (a CPU model added to the appliance's
# libvirt cpu_map by the test) and an HVM guest made by xl itself boots to its /init.
# The bench test (tag bench: make image-bench) runs both whole quick suites for docs/xen.md's figures.

load ../helpers/load

setup_file() {
    suite_begin xen
    export XEN_LOGS=$SUITE_LOGS
    # A copy whose loaders default to the Xen entry, as if a lab picked it in the menu (booted through overlays only;
    # IMAGE_REUSE=1 takes up the copy a run before kept while it is newer than the image).
    export XEN_IMAGE=$XEN_LOGS/cloudbox-xen.raw
    if ! reusing || ! [ "$XEN_IMAGE" -nt "$IMAGE" ]; then
        image_xen_default "$IMAGE" "$XEN_IMAGE"
    fi
}

teardown_file() {
    suite_done "$XEN_IMAGE"
}

teardown() {
    if [ -n "${XEN_PORT:-}" ]; then
        machine_stop "$logdir" "$XEN_PORT" "${QEMU_PID:-}" "$logdir/journal.txt"
        rm -f "$logdir/disk.qcow2"
    fi
    if [ "${BATS_TEST_COMPLETED:-}" != 1 ] && [ -n "${logdir:-}" ]; then
        echo "# logs kept in $logdir (serial.log, qemu.log, run.txt, journal.txt)" >&3
    fi
}

# Xen runs on -cpu qemu64,+svm here: with -cpu max its dom0 crashes at start (docs/image.md).
: "${IMAGE_XEN_CPU:=qemu64,+svm}"
# The guest test's Xen runs on an Intel-branded qemu64: on AMD Xen hides sep from its host features, and TCG has no
# vme, so libvirt's libxl driver finds no CPU model for the host and stops (docs/xen.md); PV guests need no SVM.
: "${IMAGE_XEN_GUEST_CPU:=qemu64,vendor=GenuineIntel}"
# PVH and HVM guests need Xen's HAP: TCG's SVM with nested paging (+npt). Debian's Xen is built without shadow paging,
# so on qemu64,+svm alone libxl refuses them ("neither hap nor shadow paging available"; docs/xen.md).
: "${IMAGE_XEN_HVM_CPU:=qemu64,+svm,+npt}"
DOM0_ROOT_MOUNTED='EXT4-fs \(vd[a-z]3\): mounted filesystem'

# bats test_tags=slow,image,xen
@test "the ESP has a Xen entry for systemd-boot (UEFI) and for grub (BIOS); Linux stays the default" {
    run -0 image_esp_cat "$IMAGE" /loader/entries/cloudbox-xen.conf
    assert_line 'efi /EFI/debian/grubx64.efi'
    assert_line --regexp '^title cloudbox on Xen 4\.[0-9]+ '
    # Debian's signed grub chain-loads Xen's EFI loader unless Secure Boot is on (boot.bats boots that case).
    run -0 image_esp_cat "$IMAGE" /EFI/debian/grub.cfg
    assert_line 'chainloader /xen/xen.efi'
    run -0 image_esp_cat "$IMAGE" /loader/loader.conf
    assert_line 'default cloudbox-[0-9]*'
    assert_line 'timeout 5'
    # Xen's EFI loader reads xen.cfg beside xen.efi: dom0 gets the appliance's root and Xen's console.
    run -0 image_esp_cat "$IMAGE" /xen/xen.cfg
    assert_line 'default=cloudbox'
    assert_line --regexp '^kernel=vmlinuz root=PARTUUID=[0-9a-f-]{36} console=hvc0 '
    assert_line 'ramdisk=initrd'
    assert_line --regexp '^options=console=com1,vga com1=115200,8n1 dom0_mem=50%,max:4096M'
    run -0 image_esp_cat "$IMAGE" /grub/grub.cfg
    assert_line 'set default=0'
    assert_line --regexp '^menuentry "cloudbox on Xen 4\.[0-9]+ .*" --id cloudbox-xen \{$'
    assert_line --regexp '^ +multiboot2 /xen/xen\.gz placeholder console=com1'
    assert_line --regexp '^ +module2 /xen/vmlinuz placeholder root=PARTUUID=[0-9a-f-]{36} console=hvc0 '
    assert_line --regexp '^ +module2 --nounzip /xen/initrd$'
    # The Linux entry comes first in grub (default=0), the Xen entry after it.
    linux_at=$(grep -n '^menuentry "cloudbox-[0-9]' <<<"$output" | cut -d: -f1)
    xen_at=$(grep -n '^menuentry "cloudbox on Xen' <<<"$output" | cut -d: -f1)
    assert [ -n "$linux_at" ] && assert [ "$linux_at" -lt "$xen_at" ]
    # grub loads multiboot2 and gzio from the ESP.
    for m in multiboot2 gzio serial terminal; do
        run -0 image_esp_size "$IMAGE" "/grub/i386-pc/$m.mod"
    done
    # dom0's one initrd is the Linux entry's initrds, concatenated.
    want=0
    while read -r f; do
        n=$(image_esp_size "$IMAGE" "$f") || fail "$f missing"
        want=$((want + n))
    done < <(image_esp_cat "$IMAGE" "/loader/entries/$(MTOOLS_SKIP_CHECK=1 mdir -b -i "$(image_esp "$IMAGE")" \
        ::/loader/entries/ | sed -n 's|^::/loader/entries/\(cloudbox-[0-9].*\.conf\)$|\1|p')" | awk '$1 == "initrd" {print $2}')
    run -0 image_esp_size "$IMAGE" /xen/initrd
    assert_output "$want"
    run -0 image_esp_size "$IMAGE" /xen/xen.efi
    run -0 image_esp_size "$IMAGE" /xen/xen.gz
    run -0 image_esp_size "$IMAGE" /xen/vmlinuz
}

# Boots the Xen entry with FIRMWARE until dom0 has mounted the appliance's root, then checks the serial log. One
# announced retry, only when dom0's kernel oopsed (the TCG text-patching flake of docs/image.md, "Known flake").
xen_starts() {
    local firmware=$1 loader=$2 oops
    logdir=$XEN_LOGS/$firmware
    if ! xen_boot "$logdir"; then
        oops=$(image_tcg_oops "$logdir")
        [ -n "$oops" ] || fail "dom0 did not mount the root within ${IMAGE_XEN_TIMEOUT_S:-600} s: $(tail -n 1 "$logdir/qemu.log")"
        rm -rf "$logdir-attempt1" && mv "$logdir" "$logdir-attempt1"
        echo "# RETRY: $firmware: dom0's kernel oopsed under TCG ($oops); attempt 1 in $logdir-attempt1" >&3
        xen_boot "$logdir" ||
            fail "dom0 did not mount the root within ${IMAGE_XEN_TIMEOUT_S:-600} s (attempt 2): $(tail -n 1 "$logdir/qemu.log")"
    fi
    echo "# $firmware: Xen entry to dom0 mounting the root: $(cat "$logdir/boot-seconds") s (TCG, -cpu $IMAGE_XEN_CPU)" >&3
    xen_started_dom0 "$loader"
}

# xen_started_dom0 LOADER: $logdir/serial.log shows Xen started by LOADER building a PV dom0 on the appliance's root.
xen_started_dom0() {
    local loader=$1
    run -0 grep -a -m1 '(XEN) Xen version 4\.' "$logdir/serial.log"
    run -0 grep -a -m1 "(XEN) Bootloader: $loader" "$logdir/serial.log"
    run -0 grep -a -m1 '(XEN) Command line: .*dom0_mem=50%,max:4096M' "$logdir/serial.log"
    run -0 grep -a -m1 '(XEN) \*\*\* Building a PV Dom0 \*\*\*' "$logdir/serial.log"
    run -0 grep -a -m1 'Hypervisor detected: Xen PV' "$logdir/serial.log"
    run -0 grep -a -m1 'Kernel command line: .*root=PARTUUID=.* console=hvc0' "$logdir/serial.log"
}

xen_boot() {
    IMAGE=$XEN_IMAGE IMAGE_QEMU_CPU=$IMAGE_XEN_CPU \
        image_boot_until "$firmware" "$1" "$DOM0_ROOT_MOUNTED" "${IMAGE_XEN_TIMEOUT_S:-600}"
}

# make test checks the UEFI entry's boot in the PV guest test's own boot (its serial log), one boot fewer.
# bats test_tags=slow,image,xen,xen-full
@test "UEFI: systemd-boot's Xen entry starts Xen (EFI loader) and a dom0 that mounts the appliance's root" {
    xen_starts uefi EFI
}

# bats test_tags=slow,image,xen,xen-full
@test "BIOS: grub's Xen entry starts Xen (multiboot2) and a dom0 that mounts the appliance's root" {
    xen_starts bios GRUB
}

# bats test_tags=slow,xen,xen-full
@test "BIOS: the Xen entry boots dom0 to the self-test verdict 123 (libvirt answers on xen:///system)" {
    logdir=$XEN_LOGS/bios-full
    IMAGE=$XEN_IMAGE IMAGE_QEMU_CPU=$IMAGE_XEN_CPU image_boot bios "$logdir" "${IMAGE_XEN_FULL_TIMEOUT_S:-1500}"
    echo "# Xen dom0 boot to the self-test verdict: $(cat "$logdir/boot-seconds") s (TCG, -cpu $IMAGE_XEN_CPU)" >&3
    run -0 grep -a -m1 'Hypervisor detected: Xen PV' "$logdir/serial.log"
    run -0 image_selftest_status "$logdir"
    assert_output 123
    run -0 grep -a 'cloudbox-selftest: PASS xen dom0: libvirt' "$logdir/serial.log"
}

# xen_dom0_up NAME: the UEFI Xen boot with SSH on XEN_PORT, until dom0 answers over SSH (logdir: $XEN_LOGS/NAME). One
# announced retry, only when dom0's kernel oopsed while booting (docs/image.md, "Known flake").
xen_dom0_up() {
    local oops
    logdir=$XEN_LOGS/$1
    XEN_PORT=${IMAGE_XEN_SSH_PORT:-$(free_port)}
    mkdir -p "$logdir"
    xen_start_ssh && return 0
    oops=$(image_tcg_oops "$logdir")
    [ -n "$oops" ] || fail "dom0 did not answer over SSH within ${IMAGE_XEN_TIMEOUT_S:-900} s: $(tail -n 1 "$logdir/serial.log")"
    machine_stop "$logdir" "$XEN_PORT" "${QEMU_PID:-}" /dev/null
    rm -rf "$logdir-attempt1" && cp -a "$logdir" "$logdir-attempt1"
    echo "# RETRY: dom0's kernel oopsed under TCG ($oops); attempt 1 in $logdir-attempt1" >&3
    xen_start_ssh || fail "dom0 did not answer over SSH within ${IMAGE_XEN_TIMEOUT_S:-900} s (attempt 2)"
}

xen_start_ssh() {
    local start=$SECONDS
    OOPS_SEEN_AT=
    IMAGE=$XEN_IMAGE IMAGE_QEMU_CPU=$IMAGE_XEN_GUEST_CPU image_start uefi "$logdir" "$XEN_PORT" || return 1
    MACHINE_SSH_TIMEOUT_S=20 wait_for --alive "$QEMU_PID" "${IMAGE_XEN_TIMEOUT_S:-900}" 5 _dom0_answers_or_oopsed \
        || return 1
    _machine_answers "$logdir" "$XEN_PORT" || return 1
    machine_ssh_share "$logdir" "$XEN_PORT"
    echo "# Xen entry to dom0 answering over SSH: $((SECONDS - start)) s (TCG, -cpu $IMAGE_XEN_GUEST_CPU)" >&3
}

# Ends the wait a minute after dom0's kernel oopsed under TCG without answering: such a dom0 does not come up, and
# the one retry must fit the suite's budget.
_dom0_answers_or_oopsed() {
    _machine_answers "$logdir" "$XEN_PORT" && return 0
    [ -n "$(image_tcg_oops "$logdir")" ] || return 1
    OOPS_SEEN_AT=${OOPS_SEEN_AT:-$SECONDS}
    [ $((SECONDS - OOPS_SEEN_AT)) -ge 60 ]
}

dom0() { machine_ssh "$logdir" "$XEN_PORT" "$@"; }

# _xen_triple_faults: how many guest triple faults Xen has reported on its console (the serial log) so far.
_xen_triple_faults() { grep -ac '(XEN) d[0-9]*v[0-9]* Triple fault' "$logdir/serial.log" || :; }

# xen_run PROFILE SUITE [RUN_ARGS...]: `cloudbox run --profile PROFILE --suite SUITE --size quick RUN_ARGS...` in
# dom0, its output in $logdir/run-PROFILE-SUITE.txt, then the run's JSON export in $logdir/run-PROFILE-SUITE.json. A
# hard limit on each. One announced retry of a failed run when Xen's console shows a guest's triple fault that was not
# there before: a PVH or HVM guest under nested paging in TCG sometimes dies so (docs/xen.md).
xen_run() {
    local out=$logdir/run-$1-$2 start=$SECONDS faults
    faults=$(_xen_triple_faults)
    export MACHINE_SSH_TIMEOUT_S=${IMAGE_XEN_RUN_TIMEOUT_S:-1500}
    run dom0 cloudbox run --profile "$1" --suite "$2" --size quick "${@:3}"
    echo "$output" > "$out.txt"
    if [ "$status" -ne 0 ] && [ "$(_xen_triple_faults)" -gt "$faults" ]; then
        mv "$out.txt" "$out-attempt1.txt"
        note "RETRY: $1: the guest triple-faulted under Xen ($(grep -a 'Triple fault' "$logdir/serial.log" | tail -n 1 |
            tr -d '\r')); attempt 1 in $out-attempt1.txt"
        run dom0 cloudbox run --profile "$1" --suite "$2" --size quick "${@:3}"
        echo "$output" > "$out.txt"
    fi
    unset MACHINE_SSH_TIMEOUT_S
    echo "# $1, $2 suite (quick) under Xen: $((SECONDS - start)) s, exit $status; output in $out.txt" >&3
    assert_success
    MACHINE_SSH_TIMEOUT_S=120 dom0 cloudbox results export --format json > "$out.json"
}

# bats test_tags=slow,image,xen
@test "UEFI Xen: Xen's EFI loader starts dom0; a PV guest (xen-xvd-phy) runs a quick storage and a network test; KVM refused" {
    xen_dom0_up pv-storage
    xen_started_dom0 EFI
    run -0 dom0 cloudbox host
    assert_output --regexp 'Xen'
    # Root's ext4 fills its partition, which repart grew to the disk: this entry names root by PARTUUID.
    run -0 dom0 'findmnt -bno SIZE /; lsblk -bndo SIZE "$(findmnt -no SOURCE /)"'
    echo "# dom0's root: ext4 of ${lines[0]:-?} bytes on a partition of ${lines[1]:-?}" >&3
    [ "${#lines[@]}" -eq 2 ]
    [ $((lines[0] * 10)) -ge $((lines[1] * 9)) ]
    # A KVM profile on the Xen boot is refused before anything is made, naming the entry that runs it.
    run dom0 cloudbox run --profile virtio-disk --suite storage --size quick
    assert_failure
    assert_output --partial 'booted into Xen (dom0)'
    assert_output --partial 'default Linux entry'
    # One storage and one network scheme, as the tiers ask of make test (docs/benchmarks.md).
    xen_run xen-xvd-phy all --tests seq-write-64k --net-tests tcp-stream
    assert_output --partial 'accelerator: Xen (in a VM, emulated)'
    run -0 python3 "$REPO/tests/helpers/xen_checks.py" run "$logdir/run-xen-xvd-phy-all.json" xen-xvd-phy xen phy
    echo "# $output" >&3
    # The agent's unix socket that libxl's QEMU bound goes with the guest.
    run -0 dom0 find /run/cloudbox -name '*.agent'
    assert_output ''
}

# The figures of docs/xen.md (its section "xen"): written to $XEN_LOGS/bench-out/section.md, which
# scripts/xen-bench-doc (run by scripts/image-bench) puts into docs/xen.md.
# bats test_tags=slow,xen,bench
@test "bench: xen-xvd-phy's whole quick storage and network suites in a PV guest beside dom0" {
    xen_dom0_up bench
    local start=$SECONDS
    xen_run xen-xvd-phy all
    local run_s=$((SECONDS - start))
    run -0 python3 "$REPO/tests/helpers/xen_checks.py" run "$logdir/run-xen-xvd-phy-all.json" xen-xvd-phy xen phy
    local checked=$output
    # the figures as cloudbox itself lays them out (labels, % of dom0, host disk columns), headings a level down
    local id figures
    id=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["runs"][-1]["id"])' \
         "$logdir/run-xen-xvd-phy-all.json")
    run -0 dom0 cloudbox results compare "$id" --format md
    figures=$(sed -E 's/^(#{2,}) /#\1 /' <<<"$output")
    [ -n "$figures" ]
    local dom0_line xen_v free_mib cpu info
    dom0_line=$(dom0 xl list Domain-0 | awk '$1 == "Domain-0" {print $4 " vCPUs, " $3 " MiB"}')
    info=$(dom0 xl info)
    xen_v=$(awk -F': *' '/^xen_version/ {print $2}' <<<"$info")
    free_mib=$(awk -F': *' '/^free_memory/ {print $2}' <<<"$info")
    cpu=$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)
    mkdir -p "$XEN_LOGS/bench-out"
    {
        echo "## Figures (QEMU TCG, not overhead figures)"
        echo
        echo "Written by \`make image-bench\` (alone: \`bats --filter-tags bench --filter 'bench: xen' tests/image/xen.bats\`,"
        echo "then \`scripts/xen-bench-doc\`). Measured $(date +%F) on $(nproc) cores of $cpu, load average"
        echo "$(cut -d' ' -f1 /proc/loadavg) at the end: the appliance booted through its Xen entry under QEMU TCG"
        echo "(\`-cpu $IMAGE_XEN_GUEST_CPU -smp ${IMAGE_QEMU_SMP:-2} -m 4096\`, UEFI), then in dom0:"
        echo
        echo '```sh'
        echo "cloudbox run --profile xen-xvd-phy --suite all --size quick     # $run_s s"
        echo '```'
        echo
        echo "Xen $xen_v; dom0: $dom0_line ($free_mib MiB free for guests after the run). The guest: 1 vCPU, 1024"
        echo "MiB. Disk: a 128 MiB loop device over a file on the appliance's virtio disk (quick size)."
        echo
        echo "\`cloudbox results compare $id --format md\` in dom0 (checked: $checked):"
        echo
        echo "$figures"
        echo
        echo "dom0's network figures come from a network namespace of its own over a veth pair (label veth-netns)."
        echo "Every guest number is labelled emulated and quick-size: these are TCG's costs, not Xen's, and they move a"
        echo "lot from one run to the next on this shared host."
    } > "$XEN_LOGS/bench-out/section.md"
    echo "# figures for docs/xen.md in $XEN_LOGS/bench-out/section.md" >&3
}

# bats test_tags=slow,xen,xen-full
@test "UEFI Xen: a PV guest on a file (qdisk in dom0) runs beside dom0 pinned and resized; dom0 restored after" {
    xen_dom0_up pv-qdisk
    # xen-xvd-file with a [dom0] table: every dom0 vCPU on CPU 0 and 1536 MiB (of about 2020 at boot) for the run.
    before_mem=$(dom0 xl list Domain-0 | awk '$1 == "Domain-0" {print $3}')
    before_aff=$(dom0 xl vcpu-list Domain-0 | awk '$1 == "Domain-0" {print $3, $(NF-2), $(NF-1), $NF}')
    { sed 's/^name = .*/name = "xen-file-dom0"/' "$REPO/profiles/xen-xvd-file.toml"
      printf '\n[dom0]\nvcpu_pin = "0"\nmemory_mib = 1536\n'; } |
        dom0 'mkdir -p /var/lib/cloudbox/profiles && cat > /var/lib/cloudbox/profiles/xen-file-dom0.toml'
    run -0 dom0 cloudbox profile show xen-file-dom0
    assert_output --partial 'dom0: vCPUs pinned to 0, 1536 MiB'
    # 96 MiB: the file and dom0's baseline file share the root, which the first Xen boot does not grow (~280 MiB free)
    xen_run xen-file-dom0 all --tests seq-write-64k --net-tests tcp-stream --size 96M
    assert_output --regexp 'dom0: vCPUs pinned to 0; memory [0-9]+ -> 15[0-9][0-9] MiB'
    assert_output --partial 'dom0 restored: memory'
    run -0 python3 "$REPO/tests/helpers/xen_checks.py" run "$logdir/run-xen-file-dom0-all.json" xen-file-dom0 xen qemu
    echo "# $output" >&3
    run -0 dom0 find /run/cloudbox -name '*.agent'
    assert_output ''
    # dom0 as found: every vCPU's affinity, and its memory once the balloon driver is back (within 8 MiB).
    run -0 dom0 xl vcpu-list Domain-0
    assert_equal "$(awk '$1 == "Domain-0" {print $3, $(NF-2), $(NF-1), $NF}' <<<"$output")" "$before_aff"
    for _ in $(seq 60); do
        mem=$(dom0 xl list Domain-0 | awk '$1 == "Domain-0" {print $3}')
        [ $((mem - before_mem)) -ge -8 ] && break
        sleep 1
    done
    echo "# dom0 memory: $before_mem MiB before, $mem MiB after the run" >&3
    assert [ $((mem - before_mem)) -ge -8 ]
}

# xen_boot_linux NAME: the same disk as the Xen boot in $logdir (its overlay kept), booted again through its
# default Linux entry (-cpu max: the appliance's KVM nested in TCG), until it answers over SSH on XEN_PORT.
xen_boot_linux() {
    local start=$SECONDS
    qemu_new "$logdir/$1.serial.log" --cpu "${IMAGE_QEMU_CPU:-max}" --smp "${IMAGE_QEMU_SMP:-2}" --no-reboot
    qemu_firmware uefi "$logdir/ovmf-vars.fd" || return 1
    qemu_disk disk qcow2 "$logdir/disk.qcow2" --boot --discard
    qemu_credential passwd.hashed-password.root "$(openssl passwd -6 -stdin < "$logdir/root-password")"
    qemu_credential ssh.authorized_keys.root "$(cat "$logdir/id_ed25519.pub")"
    qemu_nic --ssh "$XEN_PORT"
    qemu_start "$logdir/$1.qemu.log"
    machine_wait_ssh "$logdir" "$XEN_PORT" "$QEMU_PID" "${IMAGE_XEN_TIMEOUT_S:-900}" || return 1
    echo "# the same disk's Linux entry answering over SSH: $((SECONDS - start)) s (TCG, -cpu ${IMAGE_QEMU_CPU:-max})" >&3
}

# bats test_tags=slow,xen,xen-full
@test "one box, both hypervisors: a Xen PV run in dom0, then the Linux boot's KVM run, compared side by side" {
    xen_dom0_up same-box
    xen_run xen-xvd-phy all --tests seq-write-64k --net-tests tcp-stream --size 64M
    # The next boot takes the menu's default, Linux: the line making Xen the default goes from the ESP's loader.conf.
    run -0 dom0 'esp=$(lsblk -nrpo PATH,PARTTYPE | awk "tolower(\$2) == \"c12a7328-f81f-11d2-ba4b-00a0c93ec93b\" {print \$1; exit}")
        [ -n "$esp" ] && mkdir -p /run/cbesp && mount -t vfat "$esp" /run/cbesp &&
        sed -i "/^default cloudbox-xen.conf$/d" /run/cbesp/loader/loader.conf && cat /run/cbesp/loader/loader.conf;
        rc=$?; umount /run/cbesp; exit $rc'
    refute_line 'default cloudbox-xen.conf'
    assert_line 'default cloudbox-[0-9]*'
    machine_stop "$logdir" "$XEN_PORT" "$QEMU_PID" "$logdir/journal-xen.txt"
    xen_boot_linux linux || fail "the Linux entry of the same disk did not answer over SSH: $(tail -n 3 "$logdir/linux.serial.log")"
    run -0 dom0 cloudbox host
    refute_output --regexp 'Xen'
    run -0 dom0 cloudbox run --profile virtio-disk --suite all --size 64M --tests seq-write-64k --net-tests tcp-stream
    echo "$output" > "$logdir/run-virtio-disk-all.txt"
    MACHINE_SSH_TIMEOUT_S=120 dom0 cloudbox results export --format json > "$logdir/runs.json"
    run -0 python3 -c 'import json, sys
runs = json.load(open(sys.argv[1]))["runs"]
assert [r["state"] for r in runs] == ["completed", "completed"], [(r["state"], r.get("reason")) for r in runs]
print(" ".join(str(r["id"]) for r in runs))' "$logdir/runs.json"
    ids=$output
    # shellcheck disable=SC2086 # two run ids
    run -0 dom0 cloudbox results compare $ids
    echo "$output" > "$logdir/compare.txt"
    # The storage table: dom0 and the Xen guest, then bare metal and the KVM guest, each against its own baseline.
    assert_output --regexp $'(^|\n)#1 +dom0 '
    assert_output --regexp $'(^|\n)#1 +Xen \\(PV'
    assert_output --regexp $'(^|\n)#2 +(KVM|QEMU) '
    grep -E '^#[12] ' "$logdir/compare.txt" | head -8 | sed 's/^/# /' >&3
}

# xen_tcg_cpu_model: a CPU model for libvirt's cpu_map in this appliance only (never the image), then libvirtd
# restarted. libvirt's libxl driver decodes the host CPU from Xen's hw_caps and stops when no model fits: on TCG's
# AMD qemu64 Xen hides sep and TCG has no vme, and every shipped model needs one of the two. This one lists only
# features that CPU has as Xen reports them (xl info's hw_caps: 178bf3fd:80002001:20100800:00000007).
xen_tcg_cpu_model() {
    local f
    {
        printf '%s\n' '<cpus>' "  <model name='cbtcg64'>" "    <check partial='compat'/>" \
            "    <decode host='on' guest='on'/>"
        for f in apic cmov cx8 fpu fxsr lm mmx msr pae pse sse sse2 tsc; do
            echo "    <feature name='$f'/>"
        done
        printf '%s\n' '  </model>' '</cpus>'
    } | dom0 'cat > /usr/share/libvirt/cpu_map/x86_cbtcg64.xml'
    # listed in the map's index after the first generic model
    dom0 "grep -q x86_cbtcg64.xml /usr/share/libvirt/cpu_map/index.xml ||
        sed -i \"/<include filename='x86_486.xml'\\/>/a\\      <include filename='x86_cbtcg64.xml'/>\" \
            /usr/share/libvirt/cpu_map/index.xml"
    run -0 dom0 grep -c x86_cbtcg64.xml /usr/share/libvirt/cpu_map/index.xml
    assert_output 1
    dom0 systemctl restart libvirtd
    run -0 dom0 virsh -c xen:///system capabilities
    assert_output --partial '<model>cbtcg64</model>'
    assert_output --partial '<machine>xenpvh</machine>'
}

# xen_xl_hvm: an HVM domain made by xl itself from the benchmark guest's kernel and initrd (direct kernel boot through
# hvmloader, SeaBIOS and Xen's QEMU in dom0), until its /init says ready on the emulated serial port (within 420 s).
xen_xl_hvm() {
    local start=$SECONDS
    dom0 'g=/usr/share/cloudbox/guest; rm -f /root/cbhvm-serial.log
        printf "%s\n" "name = \"cbhvm\"" "type = \"hvm\"" "memory = 512" "vcpus = 1" "kernel = \"$g/vmlinuz\"" \
            "ramdisk = \"$g/initrd.img\"" "extra = \"console=ttyS0 panic=-1\"" \
            "serial = \"file:/root/cbhvm-serial.log\"" "vnc = 0" "sdl = 0" "vga = \"none\"" > /root/cbhvm.cfg
        xl create /root/cbhvm.cfg'
    MACHINE_SSH_TIMEOUT_S=20 wait_for --alive "$QEMU_PID" 420 5 dom0 grep -q "cloudbox-guest: ready" \
        /root/cbhvm-serial.log || {
        dom0 'xl list; tail -n 20 /root/cbhvm-serial.log; xl dmesg | tail -n 20' > "$logdir/xl-hvm.txt" 2>&1 || :
        fail "xl's HVM guest did not reach its /init within 420 s: $logdir/xl-hvm.txt"
    }
    echo "# xl's HVM guest: /init ready $((SECONDS - start)) s after xl create" >&3
    run -0 dom0 xl list -l cbhvm
    assert_output --partial '"type": "hvm"'
    dom0 xl destroy cbhvm
}

# bats test_tags=slow,xen,xen-full
@test "UEFI Xen on TCG's AMD CPU with NPT: a PVH guest (xen-pvh-phy) runs a quick storage test; xl's HVM guest boots" {
    local IMAGE_XEN_GUEST_CPU=$IMAGE_XEN_HVM_CPU
    xen_dom0_up hvm
    run -0 dom0 cloudbox host
    assert_output --regexp 'xen_virt_caps +pv hvm hap '
    assert_output --regexp 'xen_guests +pv, pvh, hvm'
    # libvirtd has stopped on this CPU: no model of its cpu_map fits (docs/xen.md)
    run -0 dom0 journalctl -b -u libvirtd --no-pager
    assert_output --partial 'Cannot find suitable CPU model for given data'
    xen_tcg_cpu_model
    xen_run xen-pvh-phy storage --tests seq-write-64k
    assert_output --partial 'Xen (PVH, emulated)'
    run -0 python3 "$REPO/tests/helpers/xen_checks.py" storage "$logdir/run-xen-pvh-phy-storage.json" xen-pvh-phy \
        xenpvh xen
    echo "# PVH: $output" >&3
    # HVM through xl: cloudbox's own HVM run (xen-default) does not reach its agent yet (docs/xen.md)
    xen_xl_hvm
    run -0 dom0 find /run/cloudbox -name '*.agent'
    assert_output ''
}
