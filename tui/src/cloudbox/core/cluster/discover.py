"""Finding the front-end from a back-end: the DHCP server that gave the private NIC its address.

The front-end serves the private network with systemd-networkd's own DHCP server (the installer writes it,
docs/cluster.md); a back-end's networkd keeps the lease it got in /run/systemd/netif/leases/<ifindex>, whose
SERVER_ADDRESS is the front-end's address on the private network. That file is networkd's, not an API, so any
surprise in it is reported with the file's name and what to pass instead (`--front-end ADDR`).
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

from ..errors import CloudboxError
from ..spec.nodeconf import SYS_NET

LEASE_DIR = Path(os.environ.get("CLOUDBOX_NETIF_LEASES", "/run/systemd/netif/leases"))


def read_lease(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip()
    return out


def discover_frontend(nic: str | None, *, lease_dir: Path | None = None, sys_net: Path = SYS_NET) -> str:
    """The front-end's private address: SERVER_ADDRESS of the DHCP lease on `nic` (the private link's name: the
    back-end's bridge, or the NIC), or,
    with nic None, of the only lease there is. Raises a CloudboxError naming the NIC/file and the way out."""
    leases = lease_dir or LEASE_DIR
    how = "give the front-end's address instead: cloudbox node join --front-end ADDR --code CODE"
    if nic is not None:
        try:
            ifindex = (sys_net / nic / "ifindex").read_text().strip()
        except OSError:
            raise CloudboxError(f"--front-end discover: the private NIC {nic} (node settings network.private_nic) "
                                f"does not exist here; {how}") from None
        files = [leases / ifindex]
    else:
        files = sorted(leases.glob("*")) if leases.is_dir() else []
        if len(files) > 1:
            raise CloudboxError(f"--front-end discover: {len(files)} NICs have DHCP leases ({leases}) and the node "
                                f"settings name no private NIC; {how}")
    if not files or not files[0].is_file():
        where = f"the private NIC {nic}" if nic else "any NIC"
        raise CloudboxError(f"--front-end discover: {where} has no DHCP lease yet ({files[0] if files else leases}); "
                            "is the private network cabled and the front-end up? (`networkctl status` shows the "
                            f"NIC's state) Or {how}")
    try:
        lease = read_lease(files[0])
    except OSError as e:
        raise CloudboxError(f"--front-end discover: cannot read {files[0]}: {e.strerror or e}; {how}") from None
    server = lease.get("SERVER_ADDRESS", "")
    try:
        addr = ipaddress.IPv4Address(server)
    except ValueError:
        raise CloudboxError(f"--front-end discover: {files[0]} names no DHCP server (SERVER_ADDRESS={server!r}); "
                            f"{how}") from None
    return str(addr)
