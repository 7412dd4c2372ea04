#!/usr/bin/env bats
# Benchmark guest image: reproducible build, and boots under QEMU TCG with a working agent.

load helpers/load

BUILDER=$GUEST_BUILDER

setup() {
    GUEST_RUN=$(mktemp -d /tmp/cbguest.XXXXXX)       # short: holds unix sockets
    GUEST_DIR=${CLOUDBOX_CACHE_DIR:-/var/cache/cloudbox}/guest  # make's guest-image target builds it
    export GUEST_RUN GUEST_DIR
}

teardown() {
    guest_kill_all
    if [ -z "${BATS_TEST_COMPLETED:-}" ]; then
        guest_dump_logs
        [ -f "$GUEST_RUN/build.log" ] && tail -n 40 "$GUEST_RUN/build.log"
    fi
    rm -rf "$GUEST_RUN"
}

# The image every boot test uses: the builder's own output, rebuilt only when its inputs changed.
ensure_image() {
    "$BUILDER" --quiet > "$GUEST_RUN/build.log" 2>&1
}

# Run a program in the guest through guest-exec (120 s limit): its output and exit code.
guest_exec() {
    local sock=$1; shift
    qga "$sock" exec 120 "$@"
}

@test "build-guest-image: usage and header" {
    run sed -n 2p "$BUILDER"
    assert_output --regexp '^# [A-Z].+'
    run "$BUILDER" --help
    assert_success
    assert_output --partial '--output DIR'
    run "$BUILDER" --bogus
    assert_failure
    assert_output --partial "unknown argument '--bogus'"
}

# bats test_tags=slow
@test "two builds give identical images; manifest lists the packages; rerun is a no-op" {
    ensure_image
    local b=$BATS_FILE_TMPDIR/b
    run "$BUILDER" --output "$b" --quiet
    assert_success
    for f in vmlinuz vmlinux initrd.img initrd.cpio mpi.cpio mpi.img manifest.json; do
        assert_file_exists "$b/$f"
    done
    for f in vmlinuz vmlinux initrd.img initrd.cpio mpi.cpio; do
        [ "$(sha256sum < "$GUEST_DIR/$f")" = "$(sha256sum < "$b/$f")" ]
    done
    # QEMU boots the uncompressed pair: the same root, the same kernel
    zstd -q -d -c "$b/initrd.img" | cmp - "$b/initrd.cpio"
    [ "$(head -c 4 "$b/vmlinux" | od -An -c | tr -d ' ')" = '177ELF' ]
    cmp "$GUEST_DIR/manifest.json" "$b/manifest.json"

    run /usr/bin/python3 - "$b" <<'PY'
import hashlib, json, sys
d = sys.argv[1]
m = json.load(open(f"{d}/manifest.json"))
pk = m["packages"]
for p in ("fio", "netperf", "iperf3", "qemu-guest-agent", "busybox-static", "iputils-ping", "mdadm", "libc6",
          "bonnie++", "e2fsprogs"):
    assert p in pk and pk[p], p
assert m["kernel_package"] in pk and m["kernel_package"] == "linux-image-" + m["kernel_version"]
for f in ("vmlinuz", "vmlinux", "initrd.img", "initrd.cpio", "mpi.cpio", "mpi.img"):
    assert m["sha256"][f] == hashlib.sha256(open(f"{d}/{f}", "rb").read()).hexdigest(), f
for p in ("openmpi-bin", "libopenmpi3", "dropbear-bin", "libhdf5-openmpi-103-1", "libopenmpi-dev",
          "libhdf5-openmpi-dev"):  # the -dev ones: cloudbox-mpiio's headers
    assert m["mpi_packages"].get(p), p
assert isinstance(m["source_date_epoch"], int) and m["source_date_epoch"] > 1600000000
assert len(m["builder_hash"]) == 64
for mod in ("virtio_blk", "virtio_net", "virtio_console", "virtio_scsi", "sd_mod", "sym53c8xx",
            "ahci", "ata_piix", "e1000", "8139cp", "8139too", "xen_blkfront", "xen_netfront", "md_mod", "raid0",
            "ext4", "jbd2", "crc32c_generic"):
    assert mod in m["modules"], mod
# fio is built from Debian's source of the same version, without the engines that pull ~60 MB of libraries
fb = m["built_from_source"]["fio"]
assert fb["version"] == pk["fio"], fb
assert {"--disable-rbd", "--disable-rados", "--disable-gfapi", "--disable-rdma", "--disable-pmem"} <= set(fb["configure"])
assert "--enable-libnbd" not in fb["configure"]
def cpio_names(path):
    data, names, i = open(path, "rb").read(), set(), 0
    while True:
        h = data[i:i + 110]
        nsz, fsz = int(h[94:102], 16), int(h[54:62], 16)
        name = data[i + 110:i + 110 + nsz - 1].decode()
        if name == "TRAILER!!!":
            return names
        names.add(name.rsplit("/", 1)[-1])
        i = (i + 110 + nsz + 3) & ~3
        i = (i + fsz + 3) & ~3
names = cpio_names(f"{d}/initrd.cpio")
assert "fio" in names and "libaio.so.1" in names
bad = [n for n in names if n.startswith(("libicudata", "librbd", "librados", "libgfapi", "libnbd", "libpmem",
                                         "libibverbs", "librdmacm"))]
assert not bad, bad
mpi = cpio_names(f"{d}/mpi.cpio")  # the MPI layer: TCP between guests, no fabric libraries, nothing of the image's
assert {"orterun", "orted", "cloudbox-mpiio", "dbclient", "dropbear", "libmpi.so.40", "mca_btl_tcp.so",
        "libhdf5_openmpi.so.103"} <= mpi, mpi
bad = [n for n in mpi if n.startswith(("libucp", "libfabric", "libibverbs", "libpsm", "mca_pml_ucx", "mca_btl_openib"))]
assert not bad, bad
assert not {"fio", "libc.so.6", "busybox"} & mpi
print(m["kernel_version"], m["bytes"]["initrd.img"])
PY
    assert_success
    local size=${output##* }
    [ "$size" -lt $((16 * 1024 * 1024)) ]
    echo "# initrd.img $((size / 1024 / 1024)) MiB (zstd), kernel ${output% *}" >&3

    # Nothing changed: a cheap no-op that leaves the files alone.
    local before
    before=$(stat -c %Y "$b/initrd.img")
    local t0=$EPOCHREALTIME
    run "$BUILDER" --output "$b"
    assert_success
    assert_output --partial 'up to date'
    awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN {exit !(b - a < 1.0)}'
    # Without the stamp it asks apt once (apt-cache policy) and still does not rebuild.
    rm "$b/.stamp"
    t0=$EPOCHREALTIME
    run "$BUILDER" --output "$b" --quiet
    assert_success
    assert_output ''
    awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN {exit !(b - a < 3.0)}'
    [ "$(stat -c %Y "$b/initrd.img")" = "$before" ]
    # A corrupted output is rebuilt.
    echo garbage > "$b/initrd.img"
    run "$BUILDER" --output "$b" --quiet
    assert_success
    [ "$(sha256sum < "$GUEST_DIR/initrd.img")" = "$(sha256sum < "$b/initrd.img")" ]
}

# bats test_tags=slow
@test "boots with virtio disk and NIC; agent runs fio, netperf, iperf3; guest-shutdown powers off" {
    ensure_image
    truncate -s 64M "$GUEST_RUN/disk.img"
    local t0=$EPOCHREALTIME
    guest_boot v \
        -drive "file=$GUEST_RUN/disk.img,format=raw,if=none,id=d0,cache=none,aio=threads" \
        -device virtio-blk-pci,drive=d0 \
        -netdev socket,id=n0,listen=127.0.0.1:0 -device virtio-net-pci,netdev=n0
    run guest_wait_ready v 90
    assert_success
    echo "# virtio: launch to agent ready ${output}s (TCG)" >&3
    assert_file_contains "$GUEST_RUN/v.log" '^cloudbox-guest: versions .*fio=fio-'
    assert_file_contains "$GUEST_RUN/v.log" '^cloudbox-guest: devices disks=vda nics=eth0.\?$'

    local s=$GUEST_RUN/v.qga
    run guest_exec "$s" /usr/bin/fio --version
    assert_success
    assert_output --regexp '^fio-[0-9]'
    run guest_exec "$s" /usr/bin/netperf -V
    assert_success
    assert_output --partial 'Netperf version'
    run guest_exec "$s" /usr/bin/netserver -V
    assert_success
    run guest_exec "$s" /usr/bin/iperf3 --version
    assert_success
    assert_output --regexp '^iperf 3\.'
    run guest_exec "$s" /usr/bin/ping -c 1 -M do -s 1400 127.0.0.1
    assert_success
    run guest_exec "$s" /usr/sbin/mdadm --version
    assert_success
    run guest_exec "$s" /usr/bin/fio --name=w --filename=/dev/vda --rw=write --bs=1M --size=4M \
        --direct=1 --ioengine=libaio --output-format=terse
    assert_success
    # fio's random buffers reached the host file
    run cmp -s -n 4194304 "$GUEST_RUN/disk.img" /dev/zero
    assert_failure 1

    qga "$s" send '{"execute": "guest-shutdown"}'
    run guest_wait_exit v 30
    assert_success
    assert_file_contains "$GUEST_RUN/v.log" '^cloudbox-guest: poweroff'
}

# bats test_tags=slow
@test "boots with the disk on lsi53c895a and an e1000 NIC; busybox poweroff powers off" {
    ensure_image
    truncate -s 32M "$GUEST_RUN/disk.img"
    guest_boot l \
        -drive "file=$GUEST_RUN/disk.img,format=raw,if=none,id=d0" \
        -device lsi53c895a,id=lsi -device scsi-hd,bus=lsi.0,drive=d0 \
        -netdev socket,id=n0,listen=127.0.0.1:0 -device e1000,netdev=n0
    run guest_wait_ready l 90
    assert_success
    echo "# lsi53c895a+e1000: launch to agent ready ${output}s (TCG)" >&3
    local s=$GUEST_RUN/l.qga
    run guest_exec "$s" /bin/sh -c 'ls -d /sys/block/sd*; readlink /sys/class/net/eth0/device/driver'
    assert_success
    assert_line '/sys/block/sda'
    assert_output --regexp 'drivers/e1000$'
    run guest_exec "$s" /usr/bin/fio --name=r --filename=/dev/sda --rw=read --bs=64k --size=1M \
        --direct=1 --output-format=terse
    assert_success

    # poweroff only signals PID 1, which then stops everything: the exec may or may not report back.
    run qga "$s" exec 10 /sbin/poweroff
    run guest_wait_exit l 30
    assert_success
    assert_file_contains "$GUEST_RUN/l.log" '^cloudbox-guest: poweroff'
}
