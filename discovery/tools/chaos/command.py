"""``discovery chaos``: a seeded chaos run against a local cluster, judged continuously."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import shutil
import sys
import tempfile
from pathlib import Path

from discovery.cli.entrypoint import stop_on_signals
from discovery.cli.options import int_range, positive_float
from discovery.errors import ConfigError, DevClusterError

from .config import SENTINEL_DOWN_AFTER_MS, ChaosConfig
from .report import render, write_json
from .runner import ChaosResult, resolve_kinds, run_chaos

__all__ = ["add_parser", "run"]

log = logging.getLogger(__name__)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "chaos",
        help="inject seeded faults into a local cluster under load and check the invariants",
        description=(
            "Start a 3-server ZooKeeper ensemble, Redis (one server, or a primary with "
            "replicas behind sentinels), search servers and data servers (each its own "
            "process), send a steady query load, inject faults from a seeded schedule and "
            "check the invariants all along. Exit 0 if none was violated, 1 if one was, 2 "
            "if the cluster could not be started."
        ),
    )
    parser.add_argument(
        "--duration",
        type=positive_float,
        default=600.0,
        metavar="SECONDS",
        help="seconds of fault injection [default 600]",
    )
    parser.add_argument("--seed", type=int, default=1, help="schedule seed [default 1]")
    parser.add_argument("--data-servers", type=int_range(4, 200), default=30, help="[default 30]")
    parser.add_argument("--search-servers", type=int_range(2, 9), default=3, help="[default 3]")
    parser.add_argument(
        "--shards",
        type=int_range(1, 200),
        default=None,
        help="shards the data servers are spread over [default: data servers / 2]",
    )
    parser.add_argument(
        "--rate", type=positive_float, default=10.0, help="queries per second [default 10]"
    )
    parser.add_argument(
        "--deadline-ms",
        type=int_range(50, 10_000),
        default=500,
        help="timeout_ms of every query [default 500]",
    )
    parser.add_argument(
        "--session-timeout",
        type=positive_float,
        default=5.0,
        metavar="SECONDS",
        help="ZooKeeper session timeout of every process [default 5]",
    )
    parser.add_argument(
        "--partitions",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run each server in a network namespace of its own and cut links with "
        "iptables (needs root, ip and iptables) [default: on]",
    )
    parser.add_argument(
        "--redis-sentinels",
        type=int,
        default=0,
        metavar="N",
        help="0: one Redis server; N >= 1: a Redis primary with 2 replicas and N "
        f"sentinels (down-after {SENTINEL_DOWN_AFTER_MS} ms), reached through the sentinel "
        "URL, and the "
        "schedule fails the primary over (redis_failover) instead of restarting Redis "
        "empty [default 0]",
    )
    parser.add_argument(
        "--kinds",
        type=_names,
        default=[],
        metavar="KIND,...",
        help="run only these fault kinds or categories (comma-separated), in the order "
        "the seed gives them; categories: process, partition, overlap, hostile (a "
        "malformed registration, data servers answering with an endless body, garbage "
        "or a trickle, a query-of-death storm, malformed Redis entries), deploy "
        "(deploy_day: every server restarted gracefully under load, no query may fail); "
        "e.g. --kinds hostile or --kinds hostile_trickle,leader_kill [default: every kind]",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="keep process logs here [default: a scratch directory, removed on success]",
    )
    parser.add_argument(
        "--report", type=Path, default=None, help="also write the report as JSON here"
    )
    parser.set_defaults(func=run)


def _names(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise argparse.ArgumentTypeError("expected one or more names, comma-separated")
    return names


def run(args: argparse.Namespace) -> int:
    try:
        config = ChaosConfig.from_args(args)
        resolve_kinds(config.kinds, partitions=config.partitions, sentinels=config.sentinel_mode)
    except ConfigError as exc:
        print(f"discovery chaos: {exc}", file=sys.stderr)
        return 2
    scratch = config.workdir is None
    workdir = config.workdir or Path(tempfile.mkdtemp(prefix="discovery-chaos-"))
    try:
        result = asyncio.run(_run_until_stopped(config, workdir))
    except DevClusterError as exc:
        print(f"discovery chaos: cannot start the cluster: {exc}", file=sys.stderr)
        return 2
    if result is None:
        print(f"discovery chaos: interrupted; process logs in {workdir}", file=sys.stderr)
        return 130
    print(render(result), flush=True)
    if config.report is not None:
        write_json(result, config.report)
    if scratch and result.ok:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        print(f"process logs in {workdir}", file=sys.stderr)
    if not result.started:
        return 2
    return 0 if result.ok else 1


async def _run_until_stopped(config: ChaosConfig, workdir: Path) -> ChaosResult | None:
    """Run; on SIGINT or SIGTERM cancel the run, whose clean-up stops every process it
    started (they run in process groups of their own and would outlive us). None if
    interrupted."""
    stop = stop_on_signals()
    run_task = asyncio.create_task(run_chaos(config, workdir), name="chaos:run")
    stop_task = asyncio.create_task(stop.wait(), name="chaos:stop-signal")
    await asyncio.wait({run_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
    stop_task.cancel()
    if run_task.done():
        return run_task.result()
    run_task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await run_task
    return None
