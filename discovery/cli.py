"""The ``discovery`` operator command: one subcommand per module, each with ``add_parser``.

Adding a subcommand is one entry in ``_SUBCOMMANDS``: a function that registers its parser
on the subparsers and sets ``func`` (``Callable[[argparse.Namespace], int]``) as a default.
Logging is configured here and nowhere else.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from discovery import acl, chaos, demo, status
from discovery.devcluster import command as devcluster_command
from discovery.entrypoint import configure_logging

__all__ = ["build_parser", "main"]

logger = logging.getLogger(__name__)

ENV_LOG_LEVEL = "DISCOVERY_LOG_LEVEL"
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

if TYPE_CHECKING:  # not subscriptable at run time before Python 3.12
    _SubParsers = argparse._SubParsersAction[argparse.ArgumentParser]

_SUBCOMMANDS: tuple[Callable[[_SubParsers], object], ...] = (
    devcluster_command.add_parser,
    demo.add_parser,
    chaos.add_parser,
    status.add_parser,
    acl.add_parser,
    acl.add_digest_parser,
)


def build_parser() -> argparse.ArgumentParser:
    """Return the ``discovery`` argument parser with every subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="discovery",
        description="Operator tool for search-cluster service discovery.",
    )
    parser.add_argument(
        "--log-level",
        type=_log_level,
        default=os.environ.get(ENV_LOG_LEVEL) or "INFO",
        metavar="LEVEL",
        help=f"one of {', '.join(_LOG_LEVELS)} [env {ENV_LOG_LEVEL}; default INFO]",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for register in _SUBCOMMANDS:
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``discovery`` command line and return its exit code.

    Bad arguments make argparse exit with status 2 and a message naming the flag.
    """
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level)
    func: Callable[[argparse.Namespace], int] = args.func
    return func(args)


def _log_level(text: str) -> str:
    level = text.strip().upper()
    if level not in _LOG_LEVELS:
        raise argparse.ArgumentTypeError(
            f"must be one of {', '.join(_LOG_LEVELS)}, got {text!r} "
            f"(from --log-level or {ENV_LOG_LEVEL})"
        )
    return level


if __name__ == "__main__":
    sys.exit(main())
