"""The `cloudbox` command line: argparse subcommands over cloudbox.core (no Textual here)."""

from __future__ import annotations

import argparse
import sys

from cloudbox import __version__
from cloudbox.cli import install, profile, results, run


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cloudbox", description="Evaluate what virtualization costs I/O.")
    parser.add_argument("--version", action="version", version=f"cloudbox {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    profile.add_parser(subparsers)
    run.add_parser(subparsers)
    results.add_parser(subparsers)
    install.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    return int(func(args))


if __name__ == "__main__":
    sys.exit(main())
