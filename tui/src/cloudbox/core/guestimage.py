"""Locates the benchmark guest image (kernel, initramfs, manifest) built by appliance/guest/build-guest-image."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from . import paths
from .errors import GuestError

# rootfstype=ramfs: the initramfs root is not capped at half of RAM, so 256 MiB guests boot too.
CMDLINE = "console=ttyS0 quiet panic=-1 rootfstype=ramfs"


@dataclass
class GuestImage:
    directory: Path
    kernel: Path
    initrd: Path
    manifest: dict

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
