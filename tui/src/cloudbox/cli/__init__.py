"""The `cloudbox` command line: argparse subcommands over cloudbox.core. With no subcommand (or `tui`)
it opens the terminal UI; Textual is imported only then, so the headless commands never load it."""

from __future__ import annotations

import argparse
import sys

from cloudbox import __version__
from cloudbox.cli import install, node, profile, results, run, study, volume


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cloudbox", description="Evaluate what virtualization costs I/O.")
    parser.add_argument("--version", action="version", version=f"cloudbox {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    profile.add_parser(subparsers)
    run.add_parser(subparsers)
    results.add_parser(subparsers)
    study.add_parser(subparsers)
    install.add_parser(subparsers)
    node.add_parser(subparsers)
    volume.add_parser(subparsers)
    t = subparsers.add_parser("tui", help="open the terminal UI (the default when no command is given)")
    t.add_argument("--screen", choices=["overview", "profiles", "guests", "tests", "results", "studies", "volumes"],
                   default=None, help="the screen to open on")
    t.set_defaults(func=cmd_tui)
    return parser


def cmd_tui(args: argparse.Namespace) -> int:
    if not sys.stdout.isatty() or not sys.stdin.isatty():
        print("cloudbox: the terminal UI needs a terminal; for scripts use the subcommands (cloudbox --help)",
              file=sys.stderr)
        return 2
    from cloudbox.tui import create_app

    create_app(mode=getattr(args, "screen", None)).run()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        return cmd_tui(args)
    return int(func(args))


if __name__ == "__main__":
    sys.exit(main())
