"""What the subcommand modules share: the handler type, `cloudbox X` alone printing X's usage, and the guard
that turns cloudbox's errors into a line on stderr and an exit status."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from cloudbox.core.errors import CloudboxError, NotFound, ProblemsError, UsageError

Handler = Callable[[argparse.Namespace], int]
EXIT_ERROR = 1  # the system failed or refused (a node down, no space, a run that failed)
EXIT_INVALID = 2  # bad usage or input: a usage error, a name that does not exist, an invalid file
# Every command's rule: these are the input's fault, whatever the command.
INVALID: tuple[type[CloudboxError], ...] = (UsageError, NotFound, ProblemsError)
EXIT_INTERRUPTED = 130


def usage(parser: argparse.ArgumentParser) -> Handler:
    def handler(args: argparse.Namespace) -> int:
        parser.print_help(sys.stderr)
        return EXIT_INVALID

    return handler


def guard(fn: Handler, *, invalid: tuple[type[CloudboxError], ...] = ()) -> Handler:
    """Bad usage or input (INVALID, and an error of an `invalid` type) -> its text on stderr, exit 2; any other
    CloudboxError -> exit 1; Ctrl-C -> 130; a closed pipe (`| head`) is not an error."""
    bad = INVALID + invalid

    def handler(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except bad as e:
            print(f"cloudbox: {e}", file=sys.stderr)
            return EXIT_INVALID
        except CloudboxError as e:
            print(f"cloudbox: {e}", file=sys.stderr)
            return EXIT_ERROR
        except KeyboardInterrupt:
            return EXIT_INTERRUPTED
        except BrokenPipeError:
            try:
                sys.stdout = open("/dev/null", "w")  # noqa: SIM115 - silence the flush at exit
            except OSError:
                pass
            return 0

    handler.__name__ = fn.__name__
    handler.__doc__ = fn.__doc__
    return handler
