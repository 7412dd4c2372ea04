"""`cloudbox profile list | show | diff | validate | use`: inspect, check and choose tuning profiles.

Exit codes: 0 success; 1 a profile or file not found (diff: 1 when the profiles differ,
as diff(1) does); 2 an invalid profile (the ProfileError text, naming file, key, value
and what is allowed, goes to stderr), a usage error, or for validate any file that is
missing or invalid.
"""

from __future__ import annotations

import argparse
import json
import sys

from cloudbox.cli.common import guard, usage
from cloudbox.core.errors import CloudboxError, ProfileError
from cloudbox.core.inputs import printable
from cloudbox.core.spec import profiles

EXIT_OK = 0
EXIT_NOT_FOUND = 1
EXIT_DIFFERENT = 1
EXIT_INVALID = 2



def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `profile` and its subcommands on an argparse subparsers object."""
    p = subparsers.add_parser(
        "profile",
        help="list, show, compare and validate tuning profiles",
        description="Tuning profiles: presets (profiles/*.toml) and your own.",
    )
    sub = p.add_subparsers(dest="profile_command", metavar="SUBCOMMAND")
    p.set_defaults(func=usage(p))

    ls = sub.add_parser("list", help="every profile on the profile path: name, kind, description")
    ls.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    ls.set_defaults(func=guard(cmd_list, invalid=(ProfileError,)))

    show = sub.add_parser("show", help="one profile, by name or .toml file")
    show.add_argument("profile", metavar="NAME|FILE")
    fmt = show.add_mutually_exclusive_group()
    fmt.add_argument("--toml", action="store_true", help="canonical TOML (every key, schema order)")
    fmt.add_argument("--json", action="store_true", help="JSON of the validated profile plus its hash")
    show.set_defaults(func=guard(cmd_show, invalid=(ProfileError,)))

    diff = sub.add_parser("diff", help="the tuning knobs that differ between two profiles (exit 1 if any)")
    diff.add_argument("a", metavar="A")
    diff.add_argument("b", metavar="B")
    diff.set_defaults(func=guard(cmd_diff, invalid=(ProfileError,)))

    use = sub.add_parser("use", help="make a profile the active one (what the TUI's runs and guests start with)")
    use.add_argument("profile", metavar="NAME")
    use.set_defaults(func=guard(cmd_use, invalid=(ProfileError,)))

    val = sub.add_parser("validate", help="check profile files; exit 2 if any is invalid")
    val.add_argument("files", metavar="FILE", nargs="+")
    val.set_defaults(func=cmd_validate)
    return p


def _fmt(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value == "":
        return '""'
    return str(value)


def cmd_use(args: argparse.Namespace) -> int:
    prof = profiles.set_active_profile(args.profile)
    print(f"active profile: {prof.name} ({prof.describe()})")
    return EXIT_OK


def cmd_list(args: argparse.Namespace) -> int:
    entries = profiles.list_profiles()
    active = profiles.active_profile_name()
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "name": e.name,
                        "kind": e.kind,
                        "path": str(e.path),
                        "description": e.description,
                        "problem": e.problem,
                        "active": e.name == active,
                    }
                    for e in entries
                ],
                indent=2,
            )
        )
        return EXIT_OK
    if not entries:
        print(
            "no profiles found (searched: profiles/, CLOUDBOX_PROFILE_PATH, the user profile directory)",
            file=sys.stderr,
        )
        return EXIT_OK
    width = max(len(e.name) for e in entries)
    for e in entries:
        text = (
            e.description if e.problem is None else "INVALID (cloudbox profile validate " + str(e.path) + ")"
        )
        line = f"{e.name:<{width}}  {e.kind:<6}  {text}" + ("  [active]" if e.name == active else "")
        print(printable(line))
    return EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    prof = profiles.resolve_profile(args.profile)
    if args.toml:
        sys.stdout.write(prof.to_toml())
    elif args.json:
        print(json.dumps({**prof.model_dump(mode="json"), "hash": prof.hash}, indent=2))
    else:
        print(printable(f"{prof.name}: {prof.description}"))
        if prof.reproduces:
            print(printable(f"reproduces: {prof.reproduces}"))
        print(printable(prof.describe()))
        print(f"hash: {prof.hash}")
        knobs = prof.knobs()
        width = max(len(k) for k in knobs)
        for key, value in knobs.items():
            print(printable(f"  {key:<{width}}  {_fmt(value)}"))
    return EXIT_OK


def cmd_diff(args: argparse.Namespace) -> int:
    a = profiles.resolve_profile(args.a)
    b = profiles.resolve_profile(args.b)
    rows = profiles.diff_profiles(a, b)
    if not rows:
        print(f"{a.name} and {b.name} have the same tuning knobs")
        return EXIT_OK
    table = [("key", a.name, b.name)] + [(k, _fmt(x), _fmt(y)) for k, x, y in rows]
    w0 = max(len(r[0]) for r in table)
    w1 = max(len(r[1]) for r in table)
    for k, x, y in table:
        print(printable(f"{k:<{w0}}  {x:<{w1}}  {y}"))
    return EXIT_DIFFERENT


def cmd_validate(args: argparse.Namespace) -> int:
    worst = EXIT_OK
    for f in args.files:
        try:
            prof = profiles.load_profile(f)
        except ProfileError as e:
            print(f"cloudbox: {e}", file=sys.stderr)
            worst = EXIT_INVALID
        except CloudboxError as e:
            print(f"cloudbox: {e}", file=sys.stderr)
            worst = EXIT_INVALID
        else:
            print(printable(f"{f}: ok ({prof.name}, {prof.hash[:12]})"))
    return worst
