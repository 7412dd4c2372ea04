"""This node as installed: the node-name rule, the node settings file the installer writes (role, private NIC),
the private link and its address, and whether full-size frames cross the private network to another node.

Below both the executor (a back-end's run checks its private network) and core.cluster (enrolment, the join-code
server's address): nothing here knows the cluster's registry.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Any

NODE_NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
NODE_NAME_ALLOWED = "lowercase letters, digits and '-', 1..63 characters, not starting or ending with '-'"
ROLES = ("front-end", "back-end", "all-in-one")
SYS_NET = Path("/sys/class/net")


def is_node_name(value: object) -> bool:
    """Whether `value` is a node name as a whole (fullmatch: '$' alone would let a trailing newline through)."""
    return isinstance(value, str) and re.fullmatch(NODE_NAME_PATTERN, value) is not None


def node_settings_file() -> Path:
    """The installed node's settings (written by the installer); absent on a live or development host."""
    return Path(os.environ.get("CLOUDBOX_NODE_CONFIG", "/etc/cloudbox/node.toml"))


def settings() -> dict[str, Any]:
    """The installed node settings (empty on a live or development host)."""
    try:
        return tomllib.loads(node_settings_file().read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return {}


def role() -> tuple[str, str]:
    """(role, where it came from). Without node settings the box is an all-in-one."""
    f = node_settings_file()
    try:
        data = tomllib.loads(f.read_text())
    except FileNotFoundError:
        return "all-in-one", "default (not installed: no node settings file)"
    except (OSError, tomllib.TOMLDecodeError) as e:
        return "all-in-one", f"default ({f} unreadable: {e})"
    r = data.get("role")
    if r not in ROLES:
        return "all-in-one", f"default ({f}: role {r!r} is not one of {', '.join(ROLES)})"
    return str(r), str(f)


def nic_by_mac(mac: str, sys_net: Path = SYS_NET) -> str | None:
    for d in sorted(sys_net.iterdir()) if sys_net.is_dir() else []:
        if (d / "bridge").is_dir():  # a bridge may carry its port's MAC; the NIC is the port
            continue
        try:
            if (d / "address").read_text().strip().lower() == mac.lower():
                return d.name
        except OSError:
            continue
    return None


def private_nic(settings: dict[str, Any], sys_net: Path = SYS_NET) -> str | None:
    """This node's private NIC by the MAC the installer recorded (names follow PCI slots, which can differ between
    the live system that wrote the settings and the installed one), else by the recorded name."""
    net = settings.get("network", {}) if isinstance(settings, dict) else {}
    mac, name = net.get("private_mac"), net.get("private_nic")
    return (nic_by_mac(str(mac), sys_net) if mac else None) or (str(name) if name else None)


def private_link(settings: dict[str, Any], sys_net: Path = SYS_NET) -> str | None:
    """Where this node's private address lives: the bridge its private NIC is a port of (a back-end's cbpriv0,
    which its guests join), else the NIC itself."""
    nic = private_nic(settings, sys_net)
    if nic is None:
        return None
    master = sys_net / nic / "master"
    if master.is_symlink() and (sys_net / master.resolve().name / "bridge").is_dir():
        return master.resolve().name
    return nic


