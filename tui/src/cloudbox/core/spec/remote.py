"""A block volume the front-end serves to a back-end's run, as the run's spec names it (`volume_uri`, set by the
front-end, never typed): iscsi://HOST:PORT/IQN/LUN, nbds://HOST:PORT/NAME, nvme+tcp://HOST:PORT/NQN or
aoe:eSHELF.SLOT@HOST. `parse` checks every part, so a request from elsewhere cannot smuggle options into an
initiator's command line."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from ..errors import UsageError
from .schemes import AOE, ISCSI, NBD, NVME_TCP

# Every scheme with a URI form (the block schemes a front-end serves a back-end's run), in the order the refusal
# names them.
FORMS = (ISCSI, NBD, NVME_TCP, AOE)
ALLOWED = ", ".join(s.uri_form for s in FORMS[:-1]) + f" or {FORMS[-1].uri_form} (HOST an IPv4 address)"


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
    for s in FORMS:
        m = s.uri.fullmatch(uri) if s.uri is not None else None
        if m is None:
            continue
        try:
            ipaddress.IPv4Address(m["host"])
        except ValueError:
            break
        port = int(m.groupdict().get("port") or 0)
        if not s.layer2 and not 1 <= port <= 65535:
            break
        if s.layer2 and (int(m["shelf"]) > 65534 or int(m["slot"]) > 254):  # AoE's shelf and slot
            break
        return RemoteVolume(s.name, m["host"], port, m["target"], int(m.groupdict().get("lun") or 0), uri)
    raise UsageError(f"the front-end's volume {uri[:300]!r} is not allowed; allowed: {ALLOWED}")
