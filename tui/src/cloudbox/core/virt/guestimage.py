"""Locates the benchmark guest image (kernel, initramfs, manifest) built by appliance/guest/build-guest-image."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from .. import paths
from ..errors import GuestError

# rootfstype=ramfs: the initramfs root is not capped at half of RAM, so 256 MiB guests boot too. The rest skips
# boot work the benchmark guest never uses (times under TCG): the crypto self-tests (cryptomgr.notests; the KDF's
# own test runs at init, hence its blacklisting), ~0.4 s; write-protecting the kernel's data and checking its
# mappings (rodata=off), ~0.3 s; IPv6 (its tests use IPv4), ~0.15 s; the encrypted-keys type and kprobe events
# (init_encrypted, init_kprobe_trace), ~0.2 s. None of it is on a benchmark's I/O path.
CMDLINE = ("console=ttyS0 quiet panic=-1 rootfstype=ramfs cryptomgr.notests rodata=off ipv6.disable=1 "
           "initcall_blacklist=crypto_kdf108_init,init_encrypted,init_kprobe_trace")
MIB = 1024 * 1024
# Beside the initramfs and its unpacked root: a 256 MiB guest ran out of memory with a 92 MiB cpio, 384 booted.
CPIO_HEADROOM_MIB = 192


@dataclass
class GuestImage:
    directory: Path
    kernel: Path
    initrd: Path
    manifest: dict

    def boot_kernel(self, domain_type: str) -> Path:
        """The kernel to boot a domain of `domain_type` with: under QEMU/KVM the uncompressed vmlinux (QEMU enters
        it through PVH, skipping the bzImage's decompressor: seconds under TCG) when the image has one; Xen's
        loaders get vmlinuz."""
        vmlinux = self.directory / "vmlinux"
        if domain_type in ("kvm", "qemu") and vmlinux.exists():
            return vmlinux
        return self.kernel

    def boot_initrd(self, domain_type: str, memory_mib: int) -> Path:
        """The initramfs for a domain of `domain_type` with `memory_mib` of RAM: under QEMU/KVM the uncompressed
        initrd.cpio when the image has one and the guest holds it twice over plus CPIO_HEADROOM_MIB (the kernel
        then only copies it: seconds less under TCG than unpacking zstd); else the compressed initrd.img."""
        cpio = self.directory / "initrd.cpio"
        if domain_type in ("kvm", "qemu") and cpio.exists():
            if memory_mib * MIB >= 2 * cpio.stat().st_size + CPIO_HEADROOM_MIB * MIB:
                return cpio
        return self.initrd

    def mpi_layer(self, compressed: bool = False) -> Path:
        """The MPI layer (Open MPI, dropbear, cloudbox-mpiio), appended to the initramfs for runs with MPI tests:
        mpi.cpio, or its zstd-compressed mpi.img (`compressed`, or the only one there: the appliance and the nodes
        carry that one)."""
        cpio, img = self.directory / "mpi.cpio", self.directory / "mpi.img"
        for layer in ((img, cpio) if compressed else (cpio, img)):
            if layer.exists():
                return layer
        raise GuestError(f"the benchmark guest image in {self.directory} has no MPI layer (mpi.cpio or mpi.img): it "
                         "is older than the MPI tests; rebuild it with 'make guest-image' "
                         "(appliance/guest/build-guest-image)")

    def write_mpi_initrd(self, domain_type: str, memory_mib: int, dest: Path) -> Path:
        """`dest`: the initramfs boot_initrd picks with the MPI layer appended (the kernel unpacks both), compressed
        after a compressed initramfs."""
        base = self.boot_initrd(domain_type, memory_mib)
        layer = self.mpi_layer(compressed=base.name != "initrd.cpio")
        with dest.open("wb") as out:
            with base.open("rb") as f:
                shutil.copyfileobj(f, out, 1 << 20)
            out.write(b"\0" * (-out.tell() % 4))  # the kernel takes an uncompressed archive at a 4-byte boundary
            with layer.open("rb") as f:
                shutil.copyfileobj(f, out, 1 << 20)
        dest.chmod(0o644)  # QEMU runs as libvirt-qemu
        return dest

    @property
    def kernel_version(self) -> str:
        return str(self.manifest.get("kernel_version", "unknown"))

    @property
    def packages(self) -> dict[str, str]:
        return dict(self.manifest.get("packages", {}))

    @classmethod
    def locate(cls, directory: Path | None = None) -> GuestImage:
        d = directory or paths.guest_image_dir()
        kernel, initrd, manifest = d / "vmlinuz", d / "initrd.img", d / "manifest.json"
        missing = [p.name for p in (kernel, initrd, manifest) if not p.exists()]
        if missing:
            raise GuestError(
                f"benchmark guest image not found in {d} (missing: {', '.join(missing)}); "
                "build it with 'make guest-image' (appliance/guest/build-guest-image)"
            )
        try:
            data = json.loads(manifest.read_text())
        except ValueError as e:
            raise GuestError(f"{manifest}: not valid JSON ({e}); rebuild with 'make guest-image'") from e
        return cls(d, kernel, initrd, data)
