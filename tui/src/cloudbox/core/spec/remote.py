"""A block volume the front-end serves to a back-end's run, as the run's spec names it (`volume_uri`, set by the
front-end, never typed): iscsi://HOST:PORT/IQN/LUN, nbds://HOST:PORT/NAME, nvme+tcp://HOST:PORT/NQN or
aoe:eSHELF.SLOT@HOST. `parse` checks every part, so a request from elsewhere cannot smuggle options into an
initiator's command line."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from ..errors import UsageError

_NAME = r"[a-z0-9][a-z0-9.:_-]{0,222}"  # IQNs, NQNs and volume names: no spaces, commas, slashes or quotes
_FORMS = {
    "iscsi": re.compile(rf"iscsi://(?P<host>[0-9.]+):(?P<port>[0-9]{{1,5}})/(?P<target>{_NAME})/(?P<lun>[0-9]{{1,3}})"),
    "nbd": re.compile(rf"nbds://(?P<host>[0-9.]+):(?P<port>[0-9]{{1,5}})/(?P<target>{_NAME})"),
    "nvme-tcp": re.compile(rf"nvme\+tcp://(?P<host>[0-9.]+):(?P<port>[0-9]{{1,5}})/(?P<target>{_NAME})"),
    "aoe": re.compile(r"aoe:(?P<target>e(?P<shelf>[0-9]{1,5})\.(?P<slot>[0-9]{1,3}))@(?P<host>[0-9.]+)"),
}
ALLOWED = ("iscsi://HOST:PORT/IQN/LUN, nbds://HOST:PORT/NAME, nvme+tcp://HOST:PORT/NQN or aoe:eS.N@HOST (HOST an IPv4 "
           "address)")


@dataclass(frozen=True)
class RemoteVolume:
    """Where the front-end serves the run's volume."""

    scheme: str
    host: str
    port: int
    target: str  # the iSCSI target's IQN, the NBD export's name, the NVMe subsystem's NQN, AoE's eS.N
    lun: int = 0
    uri: str = ""

    @property
    def shelf_slot(self) -> tuple[int, int]:
        shelf, _, slot = self.target[1:].partition(".")
        return int(shelf), int(slot)


def parse(uri: str) -> RemoteVolume:
    """The volume `uri` names; a UsageError naming the value and the allowed forms for anything else."""
    for scheme, form in _FORMS.items():
        m = form.fullmatch(uri)
        if m is None:
            continue
        try:
            ipaddress.IPv4Address(m["host"])
        except ValueError:
            break
        port = int(m.groupdict().get("port") or 0)
        if scheme != "aoe" and not 1 <= port <= 65535:
            break
        if scheme == "aoe" and (int(m["shelf"]) > 65534 or int(m["slot"]) > 254):
            break
        return RemoteVolume(scheme, m["host"], port, m["target"], int(m.groupdict().get("lun") or 0), uri)
    raise UsageError(f"the front-end's volume {uri[:300]!r} is not allowed; allowed: {ALLOWED}")
