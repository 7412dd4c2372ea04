"""`cloudbox volume list | create | delete`: the block volumes this box serves to runs (docs/volumes.md).

Exit codes: 0 success; 1 not found, attached by a live run, or no space; 2 a bad name or size (the error names the
option, the value and what is allowed).
"""

from __future__ import annotations

import argparse
import json
import time

from cloudbox.cli.common import guard, usage
from cloudbox.core.disks.backing import human_size
from cloudbox.core.disks.volumes.attach import exports_here
from cloudbox.core.disks.volumes.store import VolumeStore, parse_size
from cloudbox.core.errors import UsageError
from cloudbox.core.inputs import printable
from cloudbox.core.spec.schemes import SCHEMES


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `volume` and its subcommands on an argparse subparsers object."""
    p = subparsers.add_parser("volume", help="list, create and delete the network block volumes this box serves",
                              description="Network block volumes: pre-allocated files (or logical volumes in a "
                                          "volume group you name) this box exports to runs. A profile names one as "
                                          "disk.volume = " + ", ".join(f'"{s.name}:NAME"' for s in SCHEMES.values()
                                                                       if s.block)
                                          + "; an NFS export (\"nfs:NAME\") is a fresh directory of the run's and "
                                          "needs no volume here.")
    sub = p.add_subparsers(dest="volume_command", metavar="SUBCOMMAND")
    p.set_defaults(func=usage(p))

    ls = sub.add_parser("list", help="every volume: name, size, backing, file or LV, the run it is attached to")
    ls.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    ls.set_defaults(func=guard(cmd_list))

    cr = sub.add_parser("create", help="a new volume of --size, its file pre-allocated (or an LV with --vg)")
    cr.add_argument("name", metavar="NAME", help="lowercase letters, digits and '-', at most 63 characters")
    cr.add_argument("--size", required=True, help="e.g. 512M, 4G (powers of 1024), 4M..64T")
    cr.add_argument("--vg", metavar="VG", help="make it a logical volume cloudbox-NAME in this existing volume group "
                                               "(lvm2) instead of a file under the state directory")
    cr.set_defaults(func=guard(cmd_create, invalid=(UsageError,)))

    rm = sub.add_parser("delete", help="remove a volume and its file or LV (refused while a run has it attached)")
    rm.add_argument("name", metavar="NAME")
    rm.set_defaults(func=guard(cmd_delete, invalid=(UsageError,)))
    return p


def cmd_list(args: argparse.Namespace) -> int:
    with VolumeStore() as vs:
        vols = vs.list()
    if args.json:
        print(json.dumps([v.as_dict() for v in vols], indent=2))
        return 0
    if not vols:
        print("no volumes; make one with: cloudbox volume create NAME --size 1G")
        print(_exports())
        return 0
    rows = [(v.name, human_size(v.size_bytes), v.backing, v.attached_run or "-",
             time.strftime("%Y-%m-%d %H:%M", time.localtime(v.created)), v.path) for v in vols]
    head = ("NAME", "SIZE", "BACKING", "ATTACHED TO RUN", "CREATED", "PATH")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head) - 1)]
    for r in [head, *rows]:
        print(printable("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1]))
    print(_exports())
    return 0


def _exports() -> str:
    """The schemes this host can export a volume over, each with its server and the disk.attach modes it allows."""
    parts = [f"{e.scheme} ({e.server}; disk.attach = {' or '.join(e.attach)})" if e.usable
             else f"{e.scheme} (not here: {e.problem or 'no attach mode works on this host'})" for e in exports_here()]
    return "exports here: " + "; ".join(parts)


def cmd_create(args: argparse.Namespace) -> int:
    size = parse_size(args.size)
    with VolumeStore() as vs:
        v = vs.create(args.name, size, vg=args.vg)
    what = f"a logical volume in {v.vg}" if v.vg else "pre-allocated"
    print(f"volume {v.name}: {human_size(v.size_bytes)} {what} at {printable(v.path)}")
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    with VolumeStore() as vs:
        v = vs.delete(args.name)
    print(f"volume {v.name} deleted ({human_size(v.size_bytes)}, {printable(v.path)} removed)")
    return 0

