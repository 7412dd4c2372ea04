"""`cloudbox node`: the cluster's nodes, join codes and enrolment (docs/cluster.md).

On the front-end:
    cloudbox node code [--minutes M] [--wait | --no-listen] [--bind ADDR] [--port N] [--replace NAME]
                                                      a one-time join code
    cloudbox node code --list | --revoke ID|all
    cloudbox node list [--json]                       enrolled nodes with state
    cloudbox node check [--watch] [--json]            probe every node's libvirt (and, without --watch, jumbo
                                                      frames end to end); fail the runs of nodes down
    cloudbox node remove NAME [--authorized-keys PATH]   take the front-end's key off the node, forget it
    cloudbox node push-image NAME [--force] [--json]  copy the guest image to a node, timed (MB/s recorded)
    cloudbox node propagations [NAME] [--json]        the recorded copies
    cloudbox node images NAME [--clear [--keep N]] [--json]   the node's image cache; clear it
    cloudbox node enrol-server [--bind ADDR] [--port N]   (started by `node code`; listens while a code is open)
On a back-end:
    cloudbox node join --front-end ADDR[:PORT]|discover [--code CODE|- | --code-file FILE] [--name NAME]
                       [--ssh-port N]         (no --code on a terminal: the code is asked for, not echoed)
On a node, run by the front-end over SSH (core/cluster/client.py; the node's side is agent/agent.py, which reads
its requests with agent/requests.py):
    cloudbox node local has-image ID | receive-image ID | images [--clear --keep N] | start-run | volume-creds |
                        follow RUN [--after SEQ] | coord

Exit codes: 0 ok, 1 on a CloudboxError (message on stderr), 2 on usage errors and malformed `local` requests.
Everything printed that came from a node, a peer or the registry goes through inputs.printable().
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from cloudbox.agent import agent, requests
from cloudbox.agent.agent import KEEP_IMAGES
from cloudbox.cli.common import guard, usage
from cloudbox.core import inputs
from cloudbox.core.cluster import client, enrol, frontend, health, protocol, registry
from cloudbox.core.errors import CloudboxError
from cloudbox.core.spec import nodeconf
from cloudbox.core.virt import network

MAX_CODE_FILE_BYTES = 1024


def say(*parts: object, **kw: Any) -> None:
    """print() through the one escaping function: the text may hold names, reasons or messages from elsewhere."""
    print(*(inputs.printable(p) for p in parts), **kw)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("node", help="cluster nodes: join codes, enrolment, list, health",
                              description="The front-end's node registry and the enrolment of back-ends.")
    p.add_argument("--db", type=Path, default=None, help="node registry (default: the state dir's nodes.db)")
    p.set_defaults(func=usage(p))
    sub = p.add_subparsers(dest="node_command", metavar="COMMAND")

    c = sub.add_parser("code", help="make a one-time join code (front-end); the enrolment server listens while "
                       "a code is open")
    c.add_argument("--minutes", type=float, default=registry.DEFAULT_CODE_MINUTES,
                   help=f"validity (default {registry.DEFAULT_CODE_MINUTES}, at most {registry.MAX_CODE_MINUTES})")
    c.add_argument("--list", action="store_true", help="list kept codes (never the codes themselves)")
    c.add_argument("--revoke", metavar="ID|all", help="revoke an open code (or all open codes)")
    c.add_argument("--replace", metavar="NAME", default=None,
                   help="the code may re-enrol the enrolled node NAME without proof of its host key (a reinstalled "
                   "node, whose key changed)")
    mode = c.add_mutually_exclusive_group()
    mode.add_argument("--wait", action="store_true", help="serve enrolments in the foreground until no code is open")
    mode.add_argument("--no-listen", action="store_true", help="only make the code; do not start the server")
    _server_args(c)
    c.set_defaults(func=guard(cmd_code))

    # internal (started by `node code`): no help line, so `node --help` does not offer it
    s = sub.add_parser("enrol-server", description="accept enrolments while a join code is open (started by "
                       "`node code`)")
    _server_args(s)
    s.set_defaults(func=guard(cmd_enrol_server))

    j = sub.add_parser("join", help="enrol this back-end with the front-end using a join code")
    j.add_argument("--front-end", dest="front_end", default=None,
                   help="ADDR[:PORT] or discover (default: network.frontend of the node settings)")
    code = j.add_mutually_exclusive_group()
    code.add_argument("--code", default=None, help="the join code the front-end shows, or - to read it from standard "
                      "input (a code on the command line shows in ps and the shell's history; without --code on a "
                      "terminal it is asked for)")
    code.add_argument("--code-file", type=Path, default=None, metavar="FILE", help="read the join code from FILE")
    j.add_argument("--name", default=None, help="this node's name (default: the node settings' hostname, else the "
                   "host name)")
    j.add_argument("--ssh-port", type=int, default=22, help="this node's sshd port (default 22)")
    j.add_argument("--no-from", action="store_true",
                   help="do not limit the front-end's key to the front-end's address (from=)")
    j.set_defaults(func=guard(cmd_join))

    ls = sub.add_parser("list", help="enrolled nodes with state")
    ls.add_argument("--json", action="store_true", help="print the nodes as JSON")
    ls.set_defaults(func=guard(cmd_list))

    ck = sub.add_parser("check", help="probe every node's libvirt now; nodes down fail their runs")
    ck.add_argument("--watch", action="store_true", help=f"repeat every {health.CHECK_INTERVAL_S:g} s (what "
                    "cloudbox-node-check.service runs); a node gets a line when its state or reason changes")
    ck.add_argument("--timeout", type=float, default=health.CHECK_TIMEOUT_S, help="seconds per node")
    ck.add_argument("--json", action="store_true")
    ck.set_defaults(func=guard(cmd_check))

    rm = sub.add_parser("remove", help="take the front-end's key off a node and forget it (its pinned key goes; "
                        "enrol it again with a new code)",
                        description="Deletes the front-end's line from the node's authorized_keys over the pinned "
                        "ssh, then forgets the node. A node that cannot be reached is forgotten all the same, with "
                        "a warning saying how to delete the line there by hand.")
    rm.add_argument("name", metavar="NAME")
    rm.add_argument("--authorized-keys", default=frontend.NODE_AUTHORIZED_KEYS, metavar="PATH",
                    help=f"root's authorized_keys on the node (default {frontend.NODE_AUTHORIZED_KEYS})")
    rm.set_defaults(func=guard(cmd_remove))

    pi = sub.add_parser("push-image", help="copy the benchmark guest image to a node now, timed (study B's image "
                        "propagation); runs on a node do this themselves when the node lacks the image")
    pi.add_argument("name", metavar="NAME")
    pi.add_argument("--force", action="store_true", help="copy even when the node has this image already")
    pi.add_argument("--json", action="store_true")
    pi.set_defaults(func=guard(cmd_push_image))

    pr = sub.add_parser("propagations", help="recorded guest image copies to nodes (time, MB/s)")
    pr.add_argument("name", metavar="NAME", nargs="?")
    pr.add_argument("--json", action="store_true")
    pr.set_defaults(func=guard(cmd_propagations))

    im = sub.add_parser("images", help="the guest images cached on a node (runs and push-image put them there); "
                        f"--clear removes them (a copy keeps the newest {KEEP_IMAGES} by itself)")
    im.add_argument("name", metavar="NAME")
    im.add_argument("--clear", action="store_true", help="remove cached images (refused while a run goes there)")
    im.add_argument("--keep", type=int, default=0, metavar="N", help="with --clear: keep the newest N (default 0)")
    im.add_argument("--json", action="store_true")
    im.set_defaults(func=guard(cmd_images))

    # internal (run by the front-end over SSH): no help line, so `node --help` does not offer it
    lo = sub.add_parser("local", description="(run by the front-end over SSH) this node's side of image copies and "
                        "runs")
    lsub = lo.add_subparsers(dest="local_op", metavar="OP", required=True)
    x = lsub.add_parser("has-image")
    x.add_argument("image_id")
    x = lsub.add_parser("receive-image")
    x.add_argument("image_id")
    lsub.add_parser("start-run")
    x = lsub.add_parser("images")
    x.add_argument("--clear", action="store_true")
    x.add_argument("--keep", type=int, default=0)
    lsub.add_parser("volume-creds")
    x = lsub.add_parser("follow")
    x.add_argument("run")
    x.add_argument("--after", type=int, default=0)
    lsub.add_parser("coord")
    lo.set_defaults(func=guard(cmd_local, invalid=(requests.BadRequest,)))
    return p


def _server_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bind", default=None,
                   help="address to listen on (default: the private NIC's address from the node settings, else all)")
    p.add_argument("--port", type=int, default=protocol.PORT, help=f"TCP port (default {protocol.PORT})")


def _registry(args: argparse.Namespace) -> registry.Registry:
    return registry.Registry(getattr(args, "db", None))


_when = frontend.when


# -- code and the server ------------------------------------------------------------------------------


def cmd_code(args: argparse.Namespace) -> int:
    """Make (or list, or revoke) join codes."""
    frontend.require_role("making join codes")
    with _registry(args) as reg:
        if args.list:
            codes = reg.codes()
            if not codes:
                print("no join codes")
            for c in codes:
                extra = {"used": f"by {c.used_by} at {_when(c.used_at)}", "revoked": f"{c.revoked_reason}",
                         "open": f"until {_when(c.expires_at)}", "expired": f"at {_when(c.expires_at)}"}
                replaces = f"  (replaces {c.replaces})" if c.replaces else ""
                say(f"{c.id:>4}  {c.status():8}  made {_when(c.created_at)}  {extra[c.status()]}{replaces}")
            return 0
        if args.revoke:
            if args.revoke == "all":
                ids = frontend.revoke_codes(reg)
            else:
                try:
                    code_id = int(args.revoke)
                except ValueError:
                    raise CloudboxError(f"--revoke: {args.revoke!r} is not a code id; allowed: a number from "
                                        "`cloudbox node code --list`, or all") from None
                ids = frontend.revoke_codes(reg, code_id)
                if not ids:
                    raise CloudboxError(f"--revoke: join code {code_id} is not open ({reg.code(code_id).status()})")
            print(f"revoked: {', '.join(map(str, ids)) or 'no open code'}")
            return 0
        if args.wait and not args.bind:
            args.bind = frontend.enrol_bind()
        offer = frontend.make_code(reg, args.minutes, bind=args.bind, port=args.port,
                                   listen=not (args.no_listen or args.wait), db=args.db, replaces=args.replace)
    print(f"join code {offer.record.id}:  {offer.code}")
    print(f"valid until {_when(offer.record.expires_at)} ({args.minutes:g} min), for one node only")
    print(f"on the back-end:  {offer.join_command}")
    if args.wait:
        offer.server = "serving"
        print(offer.listening, flush=True)
        return _serve(args, offer.bind)
    print(offer.listening)
    return 0


def cmd_enrol_server(args: argparse.Namespace) -> int:
    """Serve enrolments while a code is open."""
    frontend.require_role("the enrolment server")
    return _serve(args, args.bind or frontend.enrol_bind())


def _serve(args: argparse.Namespace, bind: str) -> int:
    with _registry(args) as reg:
        frontend.serve(reg, bind, args.port, log=lambda m: say(f"{_when(time.time())} {m}", flush=True))
    return 0


# -- join ------------------------------------------------------------------------------------------


def cmd_join(args: argparse.Namespace) -> int:
    """Enrol this back-end."""
    frontend.require_role("`cloudbox node join`", ("back-end",))
    fe = args.front_end or nodeconf.settings().get("network", {}).get("frontend")
    if not fe:
        raise CloudboxError("--front-end: missing; allowed: the front-end's ADDR[:PORT], or discover "
                            "(the node settings have no network.frontend either)")
    if not 1 <= args.ssh_port <= 65535:
        raise CloudboxError(f"--ssh-port: {args.ssh_port} is out of range; allowed: 1..65535")
    if fe.strip() == "discover":
        from cloudbox.core.cluster import discover

        nic = nodeconf.private_link(nodeconf.settings())
        fe = discover.discover_frontend(nic)
        print(f"discovered the front-end at {fe} (the DHCP server of {nic or 'this node'}'s lease)")
    code = _join_code(args)
    ident = enrol.local_identity(args.name or nodeconf.settings().get("hostname"), ssh_port=args.ssh_port)
    res = enrol.join(fe, code, identity=ident, restrict_from=not args.no_from, log=say)
    say(f"front-end {res.frontend_name} at {res.frontend_address}, host key {res.frontend_host_key.fingerprint} "
        f"(pinned in {res.pin_file.parent})")
    say(f"its management key is in {res.authorized_keys}; it manages this node as {res.libvirt_uri.split('?')[0]}")
    found = network.check_private_path(res.frontend_address, res.frontend_name)
    if found is not None and found[1].ok:
        say(found[1].message)
    elif found is not None:  # enrolled all the same: runs work, but not at the private network's MTU
        say(f"cloudbox: warning: {found[1].message}", file=sys.stderr)
    try:
        print(f"libvirt on this node answers ({health.local_libvirt_ready():.1f} s): the front-end can manage it")
    except CloudboxError as e:  # enrolled all the same: the front-end shows the node down until libvirt answers
        print(f"cloudbox: warning: libvirt on this node does not answer, so the front-end cannot manage it yet: {e}",
              file=sys.stderr)
    return 0


def _join_code(args: argparse.Namespace) -> str:
    """The join code from --code-file, --code - (standard input), --code, or asked for on a terminal."""
    if args.code_file is not None:
        try:
            return inputs.read_text_file(args.code_file, limit=MAX_CODE_FILE_BYTES).strip()
        except FileNotFoundError:
            raise CloudboxError(f"--code-file: {inputs.shown(str(args.code_file))}: no such file") from None
        except inputs.InputProblem as e:
            raise CloudboxError(f"--code-file {inputs.shown(str(args.code_file))}: {e}") from None
    if args.code == "-":
        return inputs.decode(sys.stdin.buffer.readline(MAX_CODE_FILE_BYTES)).strip()
    if args.code is not None:
        return str(args.code)
    if sys.stdin.isatty():
        return getpass.getpass("join code (as the front-end shows it): ")
    raise CloudboxError("--code: missing; allowed: --code CODE, --code - (read from standard input) or "
                        "--code-file FILE")


# -- list, check, remove -----------------------------------------------------------------------------


def cmd_list(args: argparse.Namespace) -> int:
    """Enrolled nodes."""
    with _registry(args) as reg:
        nodes = reg.nodes()
    rows = []
    for n in nodes:
        state, reason = health.shown_state(n)
        d = n.as_dict()
        d["shown_state"], d["shown_reason"] = state, reason
        rows.append(d)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no nodes enrolled (make a join code with `cloudbox node code`)")
        return 0
    header = ["NAME", "STATE", "ADDRESS", "LAST SEEN", "HOST KEY", "REASON"]
    table = [[r["name"], r["shown_state"], f"{r['address']}:{r['ssh_port']}", _when(r["last_seen"]),
              r["host_key_fingerprint"][:20] + "…", r["shown_reason"]] for r in rows]
    table = [[inputs.printable(c) for c in row] for row in table]  # a node's reason cannot forge a row
    widths = [max(len(x[i]) for x in [header, *table]) for i in range(len(header) - 1)]
    for line in [header, *table]:
        print(" ".join(c.ljust(w) for c, w in zip(line, widths, strict=False)) + " " + line[-1])
    return 0


def changed(last: dict[str, tuple[str, str]], healths: list[health.Health]) -> list[health.Health]:
    """The checks worth a line in --watch: a node seen for the first time, whose state or reason changed, or
    whose runs were just failed. Updates `last` (a journal line every 10 s per node said nothing new)."""
    out = [h for h in healths if last.get(h.name) != (h.state, h.reason) or h.failed_runs]
    last.clear()
    last.update({h.name: (h.state, h.reason) for h in healths})
    return out


def cmd_check(args: argparse.Namespace) -> int:
    """Probe every node."""
    from cloudbox.core.record.results import ResultStore

    last: dict[str, tuple[str, str]] | None = {} if args.watch else None
    was_empty = False

    def show(healths: list[health.Health]) -> None:
        nonlocal was_empty
        if args.json:
            print(json.dumps([h.__dict__ for h in healths]), flush=True)
            return
        for h in healths if last is None else changed(last, healths):
            runs = f"; runs marked failed: {', '.join(map(str, h.failed_runs))}" if h.failed_runs else ""
            say(f"{_when(time.time())} {h.name}: {h.state} ({h.reason}, {h.seconds:.1f} s){runs}", flush=True)
        if not healths and not was_empty:
            print("no nodes enrolled", flush=True)
        was_empty = not healths and last is not None

    with _registry(args) as reg, ResultStore() as store:
        if not args.watch:
            healths = health.check_all(reg, store, timeout=args.timeout)
            paths_ok = _check_paths(reg, healths)  # jumbo frames end to end, after the libvirt probes
            show(healths)
            if not args.json:
                for h in healths:
                    if "path" in h.detail:
                        say(f"{h.name}: {h.detail['path']}", flush=True)
            return 0 if all(h.state == "up" for h in healths) and paths_ok else 1
        health.monitor(reg, store, timeout=args.timeout, stop=threading.Event(), on_check=show)
    return 0


def _check_paths(reg: registry.Registry, healths: list[health.Health]) -> bool:
    """Each node that is up: do the private network's full-size frames reach it? The outcome goes into the
    node's detail ("path"); False when one does not (a switch that drops jumbo frames is named as such)."""
    ok = True
    for h in healths:
        if h.state != "up":
            continue
        found = network.check_private_path(reg.node(h.name).address, h.name)
        if found is not None:
            h.detail["path"] = found[1].message
            ok = ok and found[1].ok
    return ok


def cmd_remove(args: argparse.Namespace) -> int:
    """Take the front-end's key off a node, then forget the node (even when it cannot be reached)."""
    frontend.require_role("removing nodes")  # before a registry is made
    with _registry(args) as reg:
        removal = frontend.remove_node(reg, args.name, authorized_keys=args.authorized_keys)
    say(removal.forgotten)
    if removal.cleaned:
        say(removal.on_node)
    else:
        say(f"cloudbox: warning: {removal.on_node}", file=sys.stderr)
    return 0


# -- guest image propagation and the node's side of remote work -------------------------------------------


def _shell(reg: registry.Registry, name: str) -> client.NodeShell:
    return client.NodeShell.for_node(reg, reg.node(name))


def cmd_push_image(args: argparse.Namespace) -> int:
    from cloudbox.core.virt.guestimage import GuestImage

    image = GuestImage.locate()
    with _registry(args) as reg:
        shell = _shell(reg, args.name)
        tty = sys.stderr.isatty()

        def progress(done: int, total: int) -> None:
            if tty:
                print(f"\rcopying to {args.name}: {done / 1e6:.1f} of {total / 1e6:.1f} MB", end="", file=sys.stderr,
                      flush=True)

        p = client.propagate_image(shell, image, force=args.force, progress=progress)
        if tty:
            print(file=sys.stderr)
        reg.add_propagation(asdict(p))
    if args.json:
        print(json.dumps(asdict(p), indent=2))
    else:
        print(p.describe())
    return 0


def cmd_propagations(args: argparse.Namespace) -> int:
    with _registry(args) as reg:
        rows = reg.propagations(args.name)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no guest image copies recorded" + (f" for {args.name}" if args.name else ""))
        return 0
    print(f"{'when':19}  {'node':12}  {'image':16}  {'MB':>8}  {'seconds':>8}  {'MB/s':>8}  verify s")
    for r in rows:
        mb = "cached" if r["cached"] else f"{r['bytes'] / 1e6:.1f}"
        rate = "-" if r["cached"] else f"{r['mbps']:.1f}"
        print(f"{_when(r['at'])}  {r['node']:12}  {r['image_id']:16}  {mb:>8}  {r['seconds']:8.2f}  {rate:>8}  "
              f"{r['verify_seconds']:.2f}")
    return 0


def cmd_images(args: argparse.Namespace) -> int:
    if args.keep < 0:
        raise CloudboxError(f"--keep {args.keep}: allowed: 0 or more")
    with _registry(args) as reg:
        data = client.node_images(_shell(reg, args.name), clear=args.clear, keep=args.keep)
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    for iid in data["removed"]:
        print(f"removed {iid} from {args.name}")
    if not data["images"]:
        print(f"no guest images cached on {args.name} ({data['dir']})")
    for im in data["images"]:
        state = "" if im["complete"] else "  (incomplete copy)"
        print(f"{_when(im['at'])}  {im['id']}  {im['bytes'] / 1e6:8.1f} MB{state}")
    return 0


def cmd_local(args: argparse.Namespace) -> int:
    op = args.local_op
    if op == "has-image":
        print(json.dumps(agent.local_has_image(args.image_id)))
    elif op == "receive-image":
        agent.local_receive_image(args.image_id, sys.stdin.buffer, lambda m: print(m, flush=True))
    elif op == "images":
        print(json.dumps(agent.local_images(args.clear, args.keep)))
    elif op == "start-run":
        print(json.dumps(agent.local_start_run(requests.read_request(sys.stdin.buffer))))
    elif op == "follow":
        return agent.local_follow(args.run, args.after, sys.stdout)
    elif op == "coord":
        return agent.local_coord(sys.stdin, sys.stdout)
    elif op == "volume-creds":
        print(json.dumps(agent.local_volume_creds(requests.read_volume_creds(sys.stdin.buffer))))
    return 0


