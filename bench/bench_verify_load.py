"""The registrations' read-backs: what they cost ZooKeeper while quiet and after a
reconnection, with the schedule of issue 24 against a read every 10 s (the baseline),
in one run, scaled to 50,000 data servers.

A registration reads its node back (one ``exists``) to catch a zombie session (a
client connected to a session the ensemble has closed; see ``discovery.zk.
registration``). Until issue 24 it did so every ``--verify-interval`` (10 s): 50,000
data servers cost the ensemble 5,000 reads a second, quiet or not. Now it reads back
about 2, 10 and 30 s after every connection (zombies come of reconnections) and
otherwise in a slow sweep (120 s), every wait drawn in 0.5x-1.5x.

Runs a real local ZooKeeper (``DevCluster``), reached through a ``TcpProxy`` so that
every connection can be dropped at once (a ZooKeeper server's restart, as its clients
see it). For each schedule, ``--registrations`` registrations over ``--sessions``
sessions (one ``Registration`` per node; the sessions count their ``exists`` calls):

* **quiet**: after 1.5 sweeps (every registration has had its first sweep), the read
  rate over one sweep interval;
* **reconnection**: every connection dropped (``TcpProxy.reset``; the sessions
  reconnect, same session), then the reads of the next 60 s, and their peak second
  (reads include the reconcile each registration makes when its session reconnects).

The baseline is the old schedule: a sweep of 10 s, no reads after connections.
Prints a table and writes ``bench/results/verify_load.json``; the figures per 50,000
data servers are the measured ones times 50,000 / ``--registrations``.

    .venv/bin/python bench/bench_verify_load.py [--registrations 2000] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import write_results

from discovery.config import ZkConfig
from discovery.instance import InstancePayload, ServiceInstance
from discovery.testing import DevCluster, TcpProxy
from discovery.zk.paths import DATA_SERVERS_PATH
from discovery.zk.registration import VERIFY_AFTER_CONNECT, Registration
from discovery.zk.session import ZkSession

log = logging.getLogger("bench_verify_load")
RESULTS = Path(__file__).resolve().parent / "results" / "verify_load.json"
SESSION_TIMEOUT = 30.0
FLEET = 50_000


class CountingSession(ZkSession):
    """A ZkSession that stamps each of its ``exists`` calls."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reads: list[float] = []

    async def call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if method.__name__.startswith("exists"):
            self.reads.append(time.monotonic())
        return await super().call(method, *args, **kwargs)


def _instance(index: int) -> ServiceInstance:
    payload = InstancePayload.from_dict(
        {"shard": index, "replica": 0, "docs": 1000, "version": "bench", "state": "serving"}
    )
    return ServiceInstance.create(
        "data_servers", f"ds-{index:05d}", "127.0.0.1", 20000 + index % 40000, payload
    )


def _reads(sessions: list[CountingSession], start: float, end: float) -> list[float]:
    return [t for s in sessions for t in s.reads if start <= t < end]


async def _schedule(
    hosts: str,
    proxy: TcpProxy,
    name: str,
    interval: float,
    after_connect: tuple[float, ...],
    args: argparse.Namespace,
) -> dict[str, Any]:
    sessions = []
    for _ in range(args.sessions):
        plain = ZkSession.from_config(ZkConfig(hosts=hosts, session_timeout=SESSION_TIMEOUT))
        session = CountingSession(plain.client, operation_timeout=SESSION_TIMEOUT)
        await session.start()
        sessions.append(session)
    await sessions[0].ensure_path(DATA_SERVERS_PATH)
    registrations = [
        Registration(
            sessions[i % len(sessions)],
            _instance(i),
            verify_interval=interval,
            verify_after_connect=after_connect,
        )
        for i in range(args.registrations)
    ]
    try:
        for start in range(0, len(registrations), 200):
            await asyncio.gather(*(r.register() for r in registrations[start : start + 200]))
        await asyncio.sleep(1.5 * interval)
        quiet_start = time.monotonic()
        await asyncio.sleep(interval)
        quiet = _reads(sessions, quiet_start, time.monotonic())
        dropped = time.monotonic()
        proxy.reset()
        await asyncio.sleep(args.after_reconnect)
        after = _reads(sessions, dropped, dropped + args.after_reconnect)
        per_second = Counter(int(t - dropped) for t in after)
        scale = FLEET / args.registrations
        quiet_rate = len(quiet) / interval
        return {
            "schedule": name,
            "sweep_interval_s": interval,
            "quiet_reads_per_s": round(quiet_rate, 1),
            "quiet_reads_per_s_at_50k": round(quiet_rate * scale),
            "after_reconnect_reads": len(after),
            "after_reconnect_reads_at_50k": round(len(after) * scale),
            "after_reconnect_peak_second": max(per_second.values(), default=0),
            "after_reconnect_peak_second_at_50k": round(
                max(per_second.values(), default=0) * scale
            ),
        }
    finally:
        for registration in registrations:
            await registration.aclose()
        for session in sessions:
            await session.aclose()


async def _main_async(
    hosts: str, proxy: TcpProxy, args: argparse.Namespace
) -> list[dict[str, Any]]:
    rows = [await _schedule(hosts, proxy, "a read every 10 s (baseline)", 10.0, (), args)]
    rows.append(
        await _schedule(
            hosts, proxy, "after connections + sweep (ours)", args.sweep, VERIFY_AFTER_CONNECT, args
        )
    )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--registrations", type=int, default=2000)
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--sweep", type=float, default=120.0, help="our sweep interval, seconds")
    parser.add_argument("--after-reconnect", type=float, default=60.0, help="seconds counted")
    parser.add_argument("--quick", action="store_true", help="500 registrations, a 40 s sweep")
    args = parser.parse_args()
    if args.quick:
        args.registrations, args.sweep, args.after_reconnect = 500, 40.0, 40.0
    logging.basicConfig(level=logging.WARNING)
    started = time.monotonic()
    with DevCluster(tick_time_ms=500) as cluster:
        host, port = cluster.info()["zk"].split(",")[0].rsplit(":", 1)
        with TcpProxy(host, int(port)) as proxy:
            rows = asyncio.run(_main_async(proxy.address, proxy, args))
    print(
        f"| schedule | quiet reads/s (at 50,000) | reads in the {args.after_reconnect:g} s after "
        "a reconnection (at 50,000) | peak second (at 50,000) |"
    )
    print("|---|---|---|---|")
    for row in rows:
        quiet = f"{row['quiet_reads_per_s']} ({row['quiet_reads_per_s_at_50k']:,})"
        after = f"{row['after_reconnect_reads']} ({row['after_reconnect_reads_at_50k']:,})"
        peak = (
            f"{row['after_reconnect_peak_second']} ({row['after_reconnect_peak_second_at_50k']:,})"
        )
        print(f"| {row['schedule']} | {quiet} | {after} | {peak} |")
    write_results(
        RESULTS,
        "verify_load",
        {k: v for k, v in vars(args).items()},
        verify_after_connect_s=list(VERIFY_AFTER_CONNECT),
        rows=rows,
        wall_s=round(time.monotonic() - started, 1),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
