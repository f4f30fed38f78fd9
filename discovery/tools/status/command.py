"""The ``discovery status`` subcommand: flags, exit status, output.

Exit status as :mod:`discovery.tools.exitcodes`: 0 (:data:`EXIT_HEALTHY`) no problem,
1 (:data:`EXIT_DEGRADED`) some (look again before acting), 2 usage, 3 unreachable, 4 refused.

Operating: docs/operating.md, "``discovery status``".
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
from typing import Final

from discovery.cli.entrypoint import add_verbose_flag
from discovery.cli.options import (
    COMMON_OPTIONS,
    MEMBER_OPTIONS,
    ZK_OPTIONS,
    Option,
    add_log_level_override,
    add_options,
    cluster_config,
    zk_config,
)
from discovery.errors import DiscoveryError, StatusError
from discovery.safetext import escape_controls

from ..exitcodes import (
    EPILOG,
    EXIT_ATTENTION,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
)
from .format import LIST_AT_MOST, format_text
from .model import PROBLEMS
from .reader import CONNECT_TIMEOUT, fetch_status

__all__ = [
    "EXIT_DEGRADED",
    "EXIT_HEALTHY",
    "EXIT_REFUSED",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "add_parser",
    "run",
]

EXIT_HEALTHY: Final = EXIT_OK
EXIT_DEGRADED: Final = EXIT_ATTENTION

_EPILOG: Final = (
    "exit status: 0 healthy; 1 degraded (the report's health line, the JSON document's "
    "health.problems: " + ", ".join(PROBLEMS) + "); " + EPILOG
)

PROG: Final = "discovery status"
# As the search servers' --shards allows.
_MAX_SHARDS: Final = 100_000


def _status_options() -> tuple[Option, ...]:
    zk = tuple(
        dataclasses.replace(o, default=CONNECT_TIMEOUT) if o.flag == "--zk-connect-timeout" else o
        for o in ZK_OPTIONS
    )
    # --log-level is the ``discovery`` command's own (see below).
    common = tuple(o for o in COMMON_OPTIONS if o.flag != "--log-level")
    # Registrations are judged as the leader judges them: give the search servers'.
    return (*zk, *common, *MEMBER_OPTIONS)


def _shard_count(text: str) -> int:
    # argparse names the flag in its message: "argument --shards: ...".
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not 0 <= value <= _MAX_SHARDS:
        raise argparse.ArgumentTypeError(f"must be in 0..{_MAX_SHARDS}, got {value}")
    return value


def add_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    """Register ``status`` on the ``discovery`` command's subparsers; returns its parser."""
    parser = subparsers.add_parser(
        "status",
        help="show registered servers, the leader, the published live list and differences",
        description=(
            "Read the cluster once from ZooKeeper and Redis: the elected leader and its "
            "epoch, the registered search and data servers (by shard), the published live "
            "list and its age, and every difference between what is registered and what "
            "is published, and a verdict: healthy, or degraded with the problems named."
        ),
        epilog=_EPILOG,
    )
    add_options(parser, _status_options())
    add_log_level_override(parser)
    add_verbose_flag(parser)
    parser.add_argument(
        "--json",
        action="store_true",
        help="print one JSON document (stable keys, every server) instead of text",
    )
    parser.add_argument(
        "--all",
        action="store_true",
        help=f"list every data server, one per line (by default only when there are at "
        f"most {LIST_AT_MOST}; a larger cluster is summarised by state and shard, with the "
        "servers that need a look)",
    )
    parser.add_argument(
        "--shards",
        type=_shard_count,
        default=0,
        metavar="N",
        help="how many shards the cluster has (0 to N-1), so that a shard whose last "
        "server left is named among those with no live replica, and a data server "
        "registered with another shard number is reported as refused "
        "(shard_out_of_range, among the invalid registrations), as the leader and the "
        "search servers of that --shards refuse it (default 0: the shards seen)",
    )
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Print the status; the exit status is in the module's docstring."""
    try:
        # Each read, too, gets an answer within the connect timeout or fails.
        zk = dataclasses.replace(zk_config(args), operation_timeout=args.zk_connect_timeout)
        cluster = cluster_config(args)
    except DiscoveryError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    try:
        status = asyncio.run(
            fetch_status(
                zk,
                cluster,
                expected_shards=args.shards,
                allow_persistent_members=args.allow_persistent_members,
            )
        )
    except StatusError as exc:
        # One line per system (joined by "\n"); each may quote what a server or the
        # store answered, so it is escaped as the report is (a newline in it included).
        for line in str(exc).split("\n"):
            print(f"{PROG}: {escape_controls(line)}", file=sys.stderr, flush=True)
        return EXIT_REFUSED if exc.refused else EXIT_UNREACHABLE
    if args.json:
        print(json.dumps(status.to_dict(), sort_keys=True, indent=2), flush=True)
    else:
        print(format_text(status, every_server=True if args.all else None), flush=True)
    return EXIT_HEALTHY if status.health.healthy else EXIT_DEGRADED
