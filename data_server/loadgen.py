"""``data-server loadgen``: send real queries through search servers at a steady rate.

Open loop (a query every ``1/rate`` seconds, whatever earlier ones did), or with
``--worst-case`` a hostile client. ``--json`` prints a line per query,
``{"t","outcome","ms"}``, with ``target`` and ``shards`` for a partial answer.

Design: docs/design/data-server.md, "The data server".
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
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import aiohttp

from discovery.cli.entrypoint import configure_logging, stop_on_signals
from discovery.cli.options import (
    Option,
    add_options,
    env_flag,
    int_range,
    non_negative_int,
    positive_float,
)
from discovery.http import MAX_QUERY_LENGTH

from .corpus import generate_documents, sample_queries
from .index import tokenize

__all__ = [
    "LoadConfig",
    "build_loadgen_parser",
    "run_loadgen",
    "run_worst_case",
    "worst_case_query",
]

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
        "seed of the query vocabulary and of the --worst-case documents (as the data servers')",
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
    Option(
        "--worst-case",
        "DISCOVERY_LOAD_WORST_CASE",
        "send a shard's most frequent terms back to back from --clients clients (a "
        "query storm; --rate and --json unused)",
        type=env_flag,
        default=False,
        boolean=True,
    ),
    Option(
        "--clients",
        "DISCOVERY_LOAD_CLIENTS",
        "clients of --worst-case, each one query at a time without pause",
        type=int_range(1, 1000),
        default=4,
    ),
    Option(
        "--terms",
        "DISCOVERY_LOAD_TERMS",
        "most frequent terms in the --worst-case query (cut to the longest query a "
        "search server takes)",
        type=int_range(1, 1000),
        default=150,
    ),
    Option(
        "--shard",
        "DISCOVERY_SHARD",
        "shard whose documents give the --worst-case terms",
        type=non_negative_int,
        default=0,
    ),
    Option(
        "--docs",
        "DISCOVERY_DOCS",
        "documents the data servers generate per shard (as their --docs)",
        type=non_negative_int,
        default=2000,
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
    worst_case: bool = False
    clients: int = 4
    terms: int = 150
    shard: int = 0
    docs: int = 2000


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
        where: dict[str, object] = {}
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
                        if outcome == "partial":
                            where = {"target": target, "shards": body.get("shards")}
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
            line = {"t": round(time.time(), 3), "outcome": outcome, "ms": round(ms, 2)}
            print(json.dumps({**line, **where}), flush=True)

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


def worst_case_query(*, docs: int, shard: int, seed: int = 0, terms: int = 150) -> str:
    """Shard ``shard``'s ``terms`` most frequent terms by document frequency (ties by the
    term), most frequent first: what costs its data server most to search.

    The documents are those a data server generates (``generate_documents``), tokenised
    as its index does (title and text). Terms are dropped from the end until the query
    fits :data:`~discovery.http.MAX_QUERY_LENGTH`, since a longer one is refused (400).
    """
    frequency: Counter[str] = Counter()
    for document in generate_documents(docs, shard=shard, seed=seed):
        frequency.update(set(tokenize(f"{document.title}\n{document.text}")))
    chosen = sorted(frequency, key=lambda term: (-frequency[term], term))[:terms]
    while chosen and len(" ".join(chosen)) > MAX_QUERY_LENGTH:
        chosen.pop()
    return " ".join(chosen)


async def run_worst_case(config: LoadConfig, query: str, stop: asyncio.Event) -> dict[str, int]:
    """``config.clients`` clients send ``query`` back to back until ``stop`` is set or the
    duration is over; return the totals by outcome."""
    targets = itertools.cycle(config.targets)
    totals = _Window(outcomes={"ok": 0, "partial": 0, "refused": 0, "overloaded": 0, "error": 0})
    loop = asyncio.get_running_loop()
    ends_at = None if config.duration is None else loop.time() + config.duration
    params = {"q": query, "timeout_ms": str(config.timeout_ms)}

    def over() -> bool:
        return stop.is_set() or (ends_at is not None and loop.time() >= ends_at)

    async def client(session: aiohttp.ClientSession) -> None:
        while not over():
            started = loop.time()
            outcome = "error"
            try:
                async with session.get(f"{next(targets)}/search", params=params) as response:
                    if response.status == 200:
                        body = await response.json()
                        outcome = "partial" if body.get("partial") else "ok"
                    else:
                        await response.read()
                        outcome = {422: "refused", 503: "overloaded"}.get(response.status, "error")
            except aiohttp.ClientConnectionError:
                await asyncio.sleep(0.01)  # gone: no busy loop of refused connects
            except (aiohttp.ClientError, TimeoutError, ValueError, AttributeError):
                pass
            totals.outcomes[outcome] += 1
            totals.latencies.append((loop.time() - started) * 1000)

    client_timeout = aiohttp.ClientTimeout(total=config.timeout_ms / 1000 + 5)
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=client_timeout
    ) as session:
        await asyncio.gather(*(client(session) for _ in range(config.clients)))
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
        worst_case=args.worst_case,
        clients=args.clients,
        terms=args.terms,
        shard=args.shard,
        docs=args.docs,
    )

    async def serve() -> None:
        stop = stop_on_signals()
        if config.worst_case:
            query = worst_case_query(
                docs=config.docs, shard=config.shard, seed=config.seed, terms=config.terms
            )
            print(
                f"worst case: {len(query.split())} terms of shard {config.shard} "
                f"({len(query)} characters), {config.clients} clients",
                flush=True,
            )
            await run_worst_case(config, query, stop)
            return
        await run_loadgen(config, stop)

    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
