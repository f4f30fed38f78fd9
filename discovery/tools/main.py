"""The ``discovery`` operator command: one subcommand per tool, each with ``add_parser``.

A subcommand is one entry in ``_SUBCOMMANDS``: its ``add_parser`` sets ``func``, which
returns the exit status. Logging is configured here and nowhere else.

Operating: docs/operating.md, "The ``discovery`` command" (the log level).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from discovery import __version__
from discovery.cli.entrypoint import configure_logging

from . import chaos, demo, devcluster, fence, maint, status, zkdigest, zkexporter, zkinit

__all__ = ["build_parser", "main"]

logger = logging.getLogger(__name__)

ENV_LOG_LEVEL = "DISCOVERY_LOG_LEVEL"
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

if TYPE_CHECKING:  # not subscriptable at run time before Python 3.12
    # argparse names the type of add_subparsers()' result only privately; typeshed uses it.
    _SubParsers = argparse._SubParsersAction[argparse.ArgumentParser]  # noqa: SLF001

_SUBCOMMANDS: tuple[Callable[[_SubParsers], object], ...] = (
    devcluster.add_parser,
    demo.add_parser,
    chaos.add_parser,
    status.add_parser,
    maint.add_parser,
    fence.add_parser,
    zkinit.add_parser,
    zkdigest.add_digest_parser,
    zkexporter.add_parser,
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
        default=None,
        metavar="LEVEL",
        help=(
            f"one of {', '.join(_LOG_LEVELS)} [env {ENV_LOG_LEVEL}; default INFO, and "
            "WARNING for status, maint, fence and zk-init, whose -v raises it]"
        ),
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for register in _SUBCOMMANDS:
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``discovery`` command line and return its exit code.

    Bad arguments (or a bad ``DISCOVERY_LOG_LEVEL``) make argparse exit with status 2 and
    a message naming the flag or variable.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(_chosen_level(parser, args))
    func: Callable[[argparse.Namespace], int] = args.func
    return func(args)


def _chosen_level(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    if args.log_level:
        return str(args.log_level)
    verbose: int | None = getattr(args, "verbose", None)
    if verbose:
        return "INFO" if verbose == 1 else "DEBUG"
    env = os.environ.get(ENV_LOG_LEVEL)
    if env:
        try:
            return _log_level(env)
        except argparse.ArgumentTypeError as exc:
            parser.error(str(exc))
    # Only the one-shot commands have -v; they are quiet unless asked.
    return "WARNING" if verbose is not None else "INFO"


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
