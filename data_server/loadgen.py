"""``data-server loadgen``: send real queries through search servers at a steady rate.

Open loop: a query is started every ``1/rate`` seconds whether or not earlier ones
have answered (a closed loop would slow down with the system and hide its stalls).
Queries are drawn from the same vocabulary as the generated shards, so they hit a
realistic share of documents. Targets are used round-robin; a target that refuses
the connection (a search server that died) or answers 503 (not ready, or shedding
load) is skipped for that query and the next one is tried, as a load balancer would.

Each outcome is ``ok`` (complete), ``partial``, ``overloaded`` (503) or ``error``.
With ``--json`` every query is one JSON line on stdout (``{"t","outcome","ms"}``), for
programs such as ``discovery demo``; otherwise a summary line per ``--report-interval``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import aiohttp

from discovery.cli.entrypoint import configure_logging, stop_on_signals
from discovery.cli.options import Option, add_options, int_range, non_negative_int, positive_float

from .corpus import sample_queries

__all__ = ["LoadConfig", "build_loadgen_parser", "run_loadgen"]

log = logging.getLogger(__name__)

LOADGEN_OPTIONS = (
    Option(
        "--rate", "DISCOVERY_LOAD_RATE", "queries per second", type=positive_float, default=20.0
    ),
    Option(
        "--duration",
        "DISCOVERY_LOAD_DURATION",
        "stop after this many seconds (unset: run until SIGINT/SIGTERM)",
        type=positive_float,
        metavar="SECONDS",
    ),
    Option(
        "--timeout-ms",
        "DISCOVERY_LOAD_TIMEOUT_MS",
        "timeout_ms sent with each query",
        type=int_range(1, 60_000),
        default=500,
    ),
    Option(
        "--seed",
        "DISCOVERY_SEED",
        "seed of the query vocabulary (as the data servers')",
        type=non_negative_int,
        default=0,
    ),
    Option(
        "--report-interval",
        "DISCOVERY_LOAD_REPORT_INTERVAL",
        "seconds between summary lines (without --json)",
        type=positive_float,
        default=5.0,
    ),
)


def build_loadgen_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="data-server loadgen",
        description="Send real search queries through search servers at a steady rate.",
    )
    add_options(parser, LOADGEN_OPTIONS)
    parser.add_argument(
        "--target",
        dest="targets",
        action="append",
        metavar="URL",
        help="search server URL, repeatable [env DISCOVERY_LOAD_TARGETS, comma-separated]",
    )
    parser.add_argument("--json", action="store_true", help="one JSON line per query")
    parser.add_argument("--log-level", default="WARNING", help="logging level")
    return parser


@dataclass(frozen=True)
class LoadConfig:
    targets: tuple[str, ...]
    rate: float = 20.0
    duration: float | None = None
    timeout_ms: int = 500
    seed: int = 0
    report_interval: float = 5.0
    json_lines: bool = False


@dataclass
class _Window:
    outcomes: dict[str, int] = field(
        default_factory=lambda: {"ok": 0, "partial": 0, "overloaded": 0, "error": 0}
    )
    latencies: list[float] = field(default_factory=list)

    def line(self) -> str:
        lat = sorted(self.latencies)

        def pct(p: float) -> float:
            return lat[min(len(lat) - 1, int(p * len(lat)))] if lat else 0.0

        counts = " ".join(f"{k}={v}" for k, v in self.outcomes.items())
        return f"{counts} p50={pct(0.5):.1f}ms p99={pct(0.99):.1f}ms"


async def run_loadgen(config: LoadConfig, stop: asyncio.Event) -> dict[str, int]:
    """Send queries until ``stop`` is set or the duration is over; return the totals."""
    queries = itertools.cycle(sample_queries(500, seed=config.seed, variant=11))
    targets = itertools.cycle(config.targets)
    totals = _Window()
    window = _Window()
    loop = asyncio.get_running_loop()
    started = loop.time()
    pending: set[asyncio.Task[None]] = set()
    # Far above any sane per-query budget: only a wedged client would reach it.
    client_timeout = aiohttp.ClientTimeout(total=config.timeout_ms / 1000 + 5)

    async def one(session: aiohttp.ClientSession, query: str) -> None:
        t0 = loop.time()
        outcome = "error"
        for _ in range(len(config.targets)):
            target = next(targets)
            try:
                async with session.get(
                    f"{target}/search",
                    params={"q": query, "timeout_ms": str(config.timeout_ms)},
                ) as response:
                    if response.status == 200:
                        body = await response.json()
                        outcome = "partial" if body.get("partial") else "ok"
                    elif response.status == 503:
                        # Not ready (no live list yet) or shedding load: another search
                        # server may take it, as behind a load balancer.
                        outcome = "overloaded"
                        continue
                    break
            except aiohttp.ClientConnectionError:
                continue  # that search server is gone: try the next one
            except (aiohttp.ClientError, TimeoutError, ValueError):
                break
        ms = (loop.time() - t0) * 1000
        for w in (totals, window):
            w.outcomes[outcome] += 1
            w.latencies.append(ms)
        if config.json_lines:
            print(
                json.dumps({"t": round(time.time(), 3), "outcome": outcome, "ms": round(ms, 2)}),
                flush=True,
            )

    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60), timeout=client_timeout
    ) as session:
        next_at = loop.time()
        next_report = loop.time() + config.report_interval
        while not stop.is_set():
            now = loop.time()
            if config.duration is not None and now - started >= config.duration:
                break
            task = asyncio.create_task(one(session, next(queries)))
            pending.add(task)
            task.add_done_callback(pending.discard)
            if not config.json_lines and now >= next_report:
                print(window.line(), flush=True)
                window = _Window()
                next_report = now + config.report_interval
            next_at += 1 / config.rate
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, next_at - loop.time())):
                    await stop.wait()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
    if not config.json_lines:
        print("total " + totals.line(), flush=True)
    return totals.outcomes


def main(argv: Sequence[str]) -> int:
    parser = build_loadgen_parser()
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    targets = args.targets or [
        t for t in os.environ.get("DISCOVERY_LOAD_TARGETS", "").split(",") if t
    ]
    if not targets:
        parser.error("--target: at least one search server URL is required")
    config = LoadConfig(
        targets=tuple(t.rstrip("/") for t in targets),
        rate=args.rate,
        duration=args.duration,
        timeout_ms=args.timeout_ms,
        seed=args.seed,
        report_interval=args.report_interval,
        json_lines=args.json,
    )

    async def serve() -> None:
        stop = stop_on_signals()
        await run_loadgen(config, stop)

    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
