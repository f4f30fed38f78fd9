"""The ``discovery devcluster`` subcommand: a local ZooKeeper and Redis until Ctrl+C.

On SIGINT or SIGTERM it stops them and removes the scratch directory; a failed start exits
with status 1, after stopping whatever had started.

Development: docs/development.md, "The development cluster".
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import signal
import sys
import threading
from types import FrameType
from typing import Any

from discovery.cli.options import Option, add_options, int_range
from discovery.errors import DevClusterError
from discovery.testing.cluster import DevCluster
from discovery.testing.zookeeper import DEFAULT_TICK_TIME_MS

__all__ = [
    "ENV_DIR",
    "ENV_REDIS_REPLICAS",
    "ENV_SENTINELS",
    "ENV_TICK_MS",
    "ENV_ZK_NODES",
    "add_parser",
    "run",
]

logger = logging.getLogger(__name__)

ENV_ZK_NODES = "DISCOVERY_DEV_ZK_NODES"
ENV_TICK_MS = "DISCOVERY_DEV_TICK_MS"
ENV_DIR = "DISCOVERY_DEV_DIR"
ENV_REDIS_REPLICAS = "DISCOVERY_DEV_REDIS_REPLICAS"
ENV_SENTINELS = "DISCOVERY_DEV_SENTINELS"

# A dev machine's worth: each one is a process.
_MAX_REDIS_REPLICAS = 8
_MAX_SENTINELS = 9

# 2 * tick is the minimum session timeout and must not exceed the 60 s maximum.
_TICK_RANGE_MS = (10, 30_000)


def add_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    """Register ``devcluster`` on the ``discovery`` command's subparsers; returns its parser.

    Defaults come from the environment when set; a bad value there is reported by argparse
    like a bad flag, naming both.
    """
    parser = subparsers.add_parser(
        "devcluster",
        help="run a local ZooKeeper and Redis for development until Ctrl+C",
        description=(
            "Start a real ZooKeeper (standalone or a quorum) and a Redis server on free "
            "loopback ports, print how to reach them, and keep them running until SIGINT or "
            "SIGTERM. With --sentinels, Redis is a primary with --redis-replicas replicas "
            "watched by that many Redis Sentinels, and the URL printed is the "
            "redis+sentinel://host:port,.../mymaster/0 form that --redis accepts. Needs Java "
            "and the Debian packages zookeeper and redis-server (`make setup`)."
        ),
    )
    add_options(parser, DEVCLUSTER_OPTIONS)
    parser.add_argument(
        "--json",
        action="store_true",
        help="print one JSON line with the connection details (for scripts) instead of text",
    )
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Start the cluster, print its details, block until SIGINT/SIGTERM, stop it.

    Returns 0 after a clean stop, 1 if the cluster could not start (the reason goes to
    stderr). Must run in the main thread, where signal handlers can be installed.
    """
    stop_requested = threading.Event()

    def acknowledge(signum: int) -> None:
        logger.info("received %s, stopping", signal.Signals(signum).name)
        stop_requested.set()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        if not stop_requested.is_set():
            # Event.set() takes the event's non-reentrant lock, and logging writes to a
            # buffered stream; the interrupted main thread may be inside either right now.
            # Doing both from another thread cannot deadlock or re-enter them.
            threading.Thread(target=acknowledge, args=(signum,), name="devcluster-stop").start()

    # Handlers go in before anything starts, so a signal during start-up still leads to a
    # clean stop instead of killing us and orphaning the servers.
    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            cluster = DevCluster(
                args.dir,
                zk_nodes=args.zk_nodes,
                tick_time_ms=args.tick_time,
                redis_replicas=args.redis_replicas,
                sentinels=args.sentinels,
            )
        except ValueError as exc:
            # Options that are fine alone but not together, e.g. replicas without sentinels.
            print(f"discovery devcluster: error: {exc}", file=sys.stderr, flush=True)
            return 2
        try:
            cluster.start()
        except (DevClusterError, OSError) as exc:
            print(f"discovery devcluster: error: {exc}", file=sys.stderr, flush=True)
            return 1
        try:
            _print_info(cluster.info(), as_json=args.json, scratch=args.dir is None)
            stop_requested.wait()
        finally:
            cluster.stop()
        logger.info("dev cluster stopped")
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _print_info(info: dict[str, Any], *, as_json: bool, scratch: bool) -> None:
    if as_json:
        print(json.dumps(info, sort_keys=True), flush=True)
        return
    servers = "server" if info["zk_nodes"] == 1 else "servers"
    kept = "removed at exit" if scratch else "kept"
    redis = [f"Redis      {info['redis']}"]
    if "sentinels" in info:
        replicas = [a for a in info["redis_servers"] if a != info["redis_primary"]]
        redis = [
            f"Redis      {info['redis']}  ({len(info['sentinels'])} sentinels)",
            f"  primary  {info['redis_primary']}",
            f"  replicas {', '.join(replicas) or '(none)'}",
        ]
    lines = [
        f"ZooKeeper  {info['zk']}  ({info['zk_nodes']} {servers}, tick {info['tick_time_ms']} ms)",
        *redis,
        f"Work dir   {info['workdir']}  ({kept})",
        "",
        f"export DISCOVERY_ZK_HOSTS={shlex.quote(info['zk'])}",
        f"export DISCOVERY_REDIS_URL={shlex.quote(info['redis'])}",
        "",
        "Press Ctrl+C to stop.",
    ]
    print("\n".join(lines), flush=True)


def _zk_nodes(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if value != 1 and (value < 3 or value % 2 == 0):
        raise argparse.ArgumentTypeError(f"must be 1 or an odd number >= 3, got {value}")
    return value


DEVCLUSTER_OPTIONS = (
    Option(
        "--zk-nodes",
        ENV_ZK_NODES,
        "ZooKeeper servers: 1 (standalone) or an odd number >= 3",
        type=_zk_nodes,
        default=1,
        metavar="N",
    ),
    Option(
        "--tick-time",
        ENV_TICK_MS,
        "ZooKeeper tickTime in ms; the minimum session timeout is twice this",
        type=int_range(*_TICK_RANGE_MS),
        default=DEFAULT_TICK_TIME_MS,
        metavar="MS",
    ),
    Option(
        "--redis-replicas",
        ENV_REDIS_REPLICAS,
        "Redis replicas of the primary; needs --sentinels",
        type=int_range(0, _MAX_REDIS_REPLICAS),
        default=0,
        metavar="N",
    ),
    Option(
        "--sentinels",
        ENV_SENTINELS,
        "Redis Sentinels watching the primary (0: one plain Redis server; use an odd "
        "number >= 3 for a quorum that survives losing one); the URL printed is then "
        "redis+sentinel://...",
        type=int_range(0, _MAX_SENTINELS),
        default=0,
        metavar="M",
    ),
    Option(
        "--dir",
        ENV_DIR,
        "work directory for configuration, data and logs, kept at exit "
        "(unset: a temporary directory removed at exit)",
        metavar="PATH",
    ),
)
