"""What the installer needs to know about the machine it runs on: disks (see `disks`), NICs, credentials.

`Machine.probe()` takes one read-only snapshot; validation and planning work on that snapshot, and `apply`
probes again right before writing (a disk may have been plugged in or mounted meanwhile).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from cloudbox.core.install.disks import BY_ID_DIR, MIN_DISK_BYTES, Disk, probe_disks

# Where systemd puts the credentials a service or the system received (ImportCredential=, SMBIOS, cmdline).
SYSTEM_CREDENTIALS = Path("/run/credentials/@system")


@dataclass(frozen=True)
class Nic:
    name: str
    mac: str
    driver: str = ""
    carrier: bool | None = None

    def describe(self) -> str:
        link = {True: "link up", False: "no link", None: "link unknown"}[self.carrier]
        return f"{self.name} ({self.mac}{', ' + self.driver if self.driver else ''}, {link})"


def probe_nics(sys_class_net: str = "/sys/class/net") -> list[Nic]:
    """The machine's physical NICs (those backed by a device: no loopback, bridge, veth, tun)."""
    out = []
    base = Path(sys_class_net)
    for d in sorted(base.iterdir()) if base.is_dir() else []:
        if not (d / "device").exists() or d.name == "lo":
            continue
        try:
            mac = (d / "address").read_text().strip().lower()
        except OSError:
            continue
        driver = ""
        try:
            driver = os.path.basename(os.readlink(d / "device" / "driver"))
        except OSError:
            pass
        carrier: bool | None
        try:
            carrier = (d / "carrier").read_text().strip() == "1"
        except OSError:
            carrier = None
        out.append(Nic(d.name, mac, driver, carrier))
    return out


def credential_dirs() -> list[Path]:
    """Where a credential named in an answer file is looked up: this service's, then the system's."""
    dirs = []
    env = os.environ.get("CREDENTIALS_DIRECTORY")
    if env:
        dirs.append(Path(env))
    dirs.append(SYSTEM_CREDENTIALS)
    return dirs


@dataclass
class Machine:
    disks: list[Disk]
    nics: list[Nic]
    cred_dirs: list[Path] = field(default_factory=credential_dirs)
    by_id_dir: str = BY_ID_DIR
    min_bytes: int = MIN_DISK_BYTES
    include_loop: bool = False

    @classmethod
    def probe(
        cls, *, include_loop: bool = False, by_id_dir: str = BY_ID_DIR, min_bytes: int = MIN_DISK_BYTES
    ) -> Machine:
        disks = probe_disks(include_loop=include_loop, by_id_dir=by_id_dir, min_bytes=min_bytes)
        return cls(disks=disks, nics=probe_nics(), by_id_dir=by_id_dir, min_bytes=min_bytes,
                   include_loop=include_loop)

    def reprobe(self) -> Machine:
        """A fresh snapshot taken the same way (what apply checks again right before writing)."""
        return Machine.probe(include_loop=self.include_loop, by_id_dir=self.by_id_dir, min_bytes=self.min_bytes)

    def nic(self, ident: str) -> Nic | None:
        """A NIC by name or MAC address."""
        low = ident.lower()
        return next((n for n in self.nics if n.name == ident or n.mac == low), None)

    def credential(self, name: str) -> Path | None:
        for d in self.cred_dirs:
            p = d / name
            if p.is_file():
                return p
        return None
