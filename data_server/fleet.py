"""``data-server fleet``: N simulated data servers in P processes.

Each is a full :class:`~data_server.server.DataServer` (own port, shard, session and
agent); a process's servers share its event loop, so a ``block_loop`` hang blocks them
all. The parent forwards SIGINT/SIGTERM to its workers and fails if any of them failed.

Design: docs/design/data-server.md, "The data server".
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import NoReturn

from discovery.agent.loopthread import LoopThread
from discovery.cli.entrypoint import stop_on_signals
from discovery.looplag import LoopLagMonitor

from .config import FleetConfig
from .server import DataServer

__all__ = ["exit_worker", "run_fleet", "run_worker"]

log = logging.getLogger(__name__)

# Servers started at once per worker: enough to overlap ZooKeeper round trips, few
# enough that index building does not starve the probes of servers already up.
_START_CONCURRENCY = 8

# Seconds over which a worker's servers begin their drains on SIGTERM, evenly spaced.
# Fifty machines do not mark themselves draining in the same millisecond, nor end
# their sessions in the next; fifty servers in one process did, and on a small machine
# that burst (the process, and ZooKeeper taking each write) starved the servers still
# answering for the shards (make compose-check's drain: a fleet's shards timed out at
# the grace's end).
_STOP_SPREAD = 2.0


def run_fleet(config: FleetConfig, argv: Sequence[str]) -> int:
    """Start ``config.procs`` worker processes with ``argv`` and wait for them."""
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "data_server.cli", "fleet", *argv, "--worker", str(i)]
        )
        for i in range(config.procs)
    ]

    def forward(signum: int, frame: object) -> None:
        for worker in workers:
            if worker.poll() is None:
                worker.send_signal(signum)

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, forward)
    codes = [worker.wait() for worker in workers]
    failed = [i for i, code in enumerate(codes) if code != 0]
    if failed:
        log.error("fleet workers %s exited with %s", failed, [codes[i] for i in failed])
        return 1
    return 0


async def run_worker(config: FleetConfig, worker: int) -> None:
    """Run this worker's slice of the fleet until SIGINT/SIGTERM, then drain them all."""
    indices = config.worker_slice(worker)
    loop_thread = LoopThread(f"fleet-{worker}-agents")
    loop_thread.start()
    # One lag monitor for the loop the servers share (a timer each would be 40 wake-ups
    # a second per server).
    loop_lag = LoopLagMonitor()
    loop_lag.start()
    servers = [
        DataServer(config.slot(i), loop_thread=loop_thread, loop_lag=loop_lag) for i in indices
    ]
    stop = stop_on_signals()
    slots = asyncio.Semaphore(_START_CONCURRENCY)
    started_at = time.monotonic()

    async def start(delay: float, server: DataServer) -> None:
        if delay > 0:
            await asyncio.sleep(delay)
        async with slots:
            await server.start()

    try:
        # Index every shard before any server goes live: indexing holds the GIL, and
        # doing it while earlier servers are being probed would starve their probes
        # and make them flap during start-up.
        for server in servers:
            await server.load()
        spread = config.start_spread
        await asyncio.gather(*(start(i * spread / len(servers), s) for i, s in enumerate(servers)))
        log.info(
            "fleet worker %d: %d servers started in %.1fs",
            worker,
            len(servers),
            time.monotonic() - started_at,
        )
        drains = [asyncio.create_task(s.drain_requested.wait()) for s in servers]
        stopper = asyncio.create_task(stop.wait())
        # A server asked to drain by the admin API leaves alone; a signal stops all.
        pending = set(drains)
        while not stop.is_set():
            done, pending = await asyncio.wait(
                pending | {stopper}, return_when=asyncio.FIRST_COMPLETED
            )
            for task in done - {stopper}:
                await servers[drains.index(task)].shutdown()
            if not pending:
                break
        stopper.cancel()
        for task in pending:
            task.cancel()
    finally:
        await asyncio.gather(
            *(_shutdown_after(i * _STOP_SPREAD / len(servers), s) for i, s in enumerate(servers)),
            return_exceptions=True,
        )
        loop_thread.stop()
        await loop_lag.aclose()


async def _shutdown_after(delay: float, server: DataServer) -> None:
    """Drain and stop ``server`` ``delay`` seconds from now (pacing, see _STOP_SPREAD)."""
    if delay > 0:
        await asyncio.sleep(delay)
    await server.shutdown()


def exit_worker() -> NoReturn:
    """End a worker whose servers have all drained and stopped, skipping the
    interpreter's teardown (as :mod:`multiprocessing` ends its children).

    A worker's heap is its servers' indexes, millions of small objects that the
    teardown frees one by one: measured in the compose image, both workers of a fleet
    container took both cores for 0.2 s at their exit, and the other fleet, then the
    only one answering for every shard, got none (make compose-check's drain: 63 shards
    timed out just before the container exited). Nothing is left to tear down: the
    sessions are closed and the sockets released; the logs are flushed here.
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
