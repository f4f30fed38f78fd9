"""Faults of the ZooKeeper ensemble itself, beyond a killed server or a lost quorum.

``zk_leader_pause``, ``zk_disk_full``, ``zk_peer_partition``: each judged by its bound
(:func:`reelection_bound`), every affected server serving again within
:data:`REJOIN_TIMEOUT`, and no registration lost.

Development: docs/development.md, "The chaos run" (the faults).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import signal
import time
from pathlib import Path

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError

from discovery.testing.zookeeper import ZooKeeperServer

from .cluster import ChaosCluster
from .config import ChaosConfig
from .context import FaultContext, StepResult

__all__ = [
    "REJOIN_TIMEOUT",
    "WHOLE_STEP",
    "ensemble_whole",
    "reelection_bound",
    "zk_disk_full",
    "zk_leader_pause",
    "zk_peer_partition",
]

log = logging.getLogger(__name__)

#: A resumed or reconnected ZooKeeper server rejoining its ensemble: it notices it lost
#: its peers (``syncLimit``), looks for the leader and syncs from it (``initLimit``, 20 s
#: at most here; a small data set syncs in well under a second).
REJOIN_TIMEOUT = 30.0
#: The step after every fault that waits for every ZooKeeper server to serve.
WHOLE_STEP = "every ZooKeeper server serving"
#: Where the disk fault writes its scratch nodes (ephemeral, outside every cluster).
SCRATCH_PATH = "/chaos-disk-fill"
#: Scratch writes of 1 KiB: far more than the 4 KiB a log grows by at a time.
SCRATCH_WRITES = 64
#: How long a filled server may take to stop serving once writes are refused.
EXIT_TIMEOUT = 20.0
_FILL_FILE = "fill"


def reelection_bound(config: ChaosConfig, sync_limit: float) -> float:
    """Seconds from the ZooKeeper leader's pause to the search servers' list right and
    their leader publishing again: the followers give the leader up after
    ``sync_limit`` and drop their clients, elect and sync (1 s); a client that then
    tries the paused server first (its kernel still accepts the connection) waits a
    session timeout over the number of servers for its handshake, and kazoo may try it
    again at the turn of its shuffled list: up to a session timeout in all; then a
    ZooKeeper tick, the leader's propagation (1 s) and a heartbeat (the crash bound's
    terms, :attr:`~.config.ChaosConfig.crash_bound`). Measured 7.0-7.7 s over 4 pauses,
    5.2-6.4 s over 4 peer partitions."""
    return sync_limit + 1.0 + config.crash_bound + config.heartbeat_interval


def _modes(servers: list[ZooKeeperServer]) -> list[str | None]:
    return [server.mode() for server in servers]


async def _not_serving_after(
    servers: list[ZooKeeperServer], timeout: float
) -> list[ZooKeeperServer]:
    """Poll ``srvr`` until every one of ``servers`` serves (no event comes from outside),
    for ``timeout`` at most; return those that still do not."""
    deadline = time.monotonic() + timeout
    while True:
        modes = await asyncio.to_thread(_modes, servers)
        idle = [server for server, mode in zip(servers, modes, strict=True) if mode is None]
        if not idle or time.monotonic() >= deadline:
            return idle
        await asyncio.sleep(0.2)


async def _wait_serving(server: ZooKeeperServer, timeout: float) -> bool:
    """Poll ``srvr`` until ``server`` serves again."""
    return not await _not_serving_after([server], timeout)


async def ensemble_whole(
    ctx: FaultContext, fault: str, timeout: float = REJOIN_TIMEOUT
) -> float | None:
    """After ``fault``: every ZooKeeper server serving again, within ``timeout``.

    A fault's own steps judge what the clients see, and a majority serves them; the
    next fault takes the whole ensemble for granted (one server killed of three keeps
    the quorum only while the other two serve). ZooKeeper may take a while to heal
    itself: seen in the two-hour soak, after a quorum loss the surviving server was
    elected but its followers' acknowledgements came from the old epoch ("NEWLEADER
    ACK ... from a different epoch"), so it waited its ``initLimit`` (20 s) while the
    two others elected a leader of their own, and the next fault, one server killed,
    took that quorum away. Polled (``srvr``): nothing outside tells of it. A server
    not serving within ``timeout`` is a violation ("fault healed").
    """
    started = time.monotonic()
    idle = await _not_serving_after(ctx.cluster.backend.zk.servers, timeout)
    took = time.monotonic() - started
    if not idle:
        ctx.results.append(StepResult(fault, WHOLE_STEP, timeout, took))
        if took >= 1.0:
            log.info("%s %s: converged in %.2f s (bound %g s)", fault, WHOLE_STEP, took, timeout)
        return took
    ids = [server.server_id for server in idle]
    detail = f"ZooKeeper server(s) {ids} not serving {timeout:g} s after the fault"
    ctx.observer.violate("fault healed", f"{fault}: {detail}")
    ctx.results.append(StepResult(fault, WHOLE_STEP, timeout, None, detail))
    return None


async def _works_without(
    ctx: FaultContext, kind: str, step: str, server: ZooKeeperServer, since_ms: float
) -> None:
    """Converge: the list right and a search-server leader publishing through the rest
    of the ensemble (a heartbeat stamped after the others gave ``server`` up)."""
    await ctx.converge(
        kind,
        step,
        reelection_bound(ctx.config, server.sync_limit),
        lambda s: s.leading_since(since_ms + server.sync_limit * 1000),
    )


async def _serves_again(ctx: FaultContext, kind: str, server: ZooKeeperServer, after: str) -> None:
    """A violation unless ``server`` serves again within :data:`REJOIN_TIMEOUT`."""
    if not await _wait_serving(server, REJOIN_TIMEOUT):
        _not_serving(ctx, kind, server, after)


def _not_serving(ctx: FaultContext, kind: str, server: ZooKeeperServer, after: str) -> None:
    ctx.observer.violate(
        "fault healed",
        f"{kind}: ZooKeeper server {server.server_id} not serving {REJOIN_TIMEOUT:g} s "
        f"after {after}",
    )


async def _supervise(cluster: ChaosCluster, indexes: list[int], timeout: float) -> list[int]:
    """What a supervisor does for these ZooKeeper servers: start again each one that has
    exited, until every one serves or ``timeout`` passes; return those that do not serve.

    Watched, not judged once: a server that decided to exit while its disk was full
    (status 10) may still be running when the disk is freed, the JVM taking a moment to
    end, and exit right after (seen in a soak: judged running, never started again).
    """
    servers = cluster.backend.zk.servers
    deadline = time.monotonic() + timeout
    waiting = list(indexes)
    while True:
        modes = await asyncio.to_thread(_modes, [servers[i] for i in waiting])
        waiting = [i for i, mode in zip(waiting, modes, strict=True) if mode is None]
        exited = [i for i in waiting if not servers[i].running]
        if exited:
            log.info("starting ZooKeeper server(s) %s again", [i + 1 for i in exited])
            for i in exited:
                # Not waiting for it to serve: with every disk filled, a server serves only
                # once a peer is back too, and this loop watches them all. (Starting reaps
                # the exited process.)
                await asyncio.to_thread(cluster.start_zookeeper, i, wait=False)
        if not waiting or time.monotonic() >= deadline:
            return waiting
        await asyncio.sleep(0.2)


async def zk_leader_pause(ctx: FaultContext) -> None:
    """SIGSTOP the ZooKeeper ensemble's leader past the session timeout, then SIGCONT."""
    kind = "zk_leader_pause"
    servers = ctx.cluster.backend.zk.servers
    modes = await asyncio.to_thread(_modes, servers)
    if modes.count("leader") != 1:
        ctx.skipped[kind] = ctx.skipped.get(kind, 0) + 1
        log.warning("%s skipped: no single ZooKeeper leader (%s)", kind, modes)
        return
    server = servers[modes.index("leader")]
    pid = server.pid
    assert pid is not None
    paused = time.monotonic()
    paused_ms = time.time() * 1000
    log.info("SIGSTOP ZooKeeper server %d, the ensemble's leader", server.server_id)
    os.kill(pid, signal.SIGSTOP)
    try:
        await _works_without(ctx, kind, "re-elected without it", server, paused_ms)
        # Past the session timeout: a session kept alive by the paused server alone
        # would have expired by now.
        held = ctx.config.session_timeout + ctx.rng.uniform(1.0, 3.0)
        await asyncio.sleep(max(0.0, held - (time.monotonic() - paused)))
    finally:
        os.kill(pid, signal.SIGCONT)
    resumed_after = time.monotonic() - paused
    log.info("SIGCONT ZooKeeper server %d after %.1f s", server.server_id, resumed_after)
    await _serves_again(ctx, kind, server, "SIGCONT")
    await ctx.converge(kind, "resumed", ctx.config.session_timeout + ctx.config.probe_budget)


def _fill(disk: Path) -> int:
    """Fill ``disk`` to the last page; the bytes written."""
    written = 0
    with (disk / _FILL_FILE).open("wb", buffering=0) as out:
        for size in (1 << 20, 4096):  # megabytes, then the last one page by page
            chunk = bytes(size)
            try:
                while True:
                    written += out.write(chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
    return written


def _free(disk: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        (disk / _FILL_FILE).unlink()


def _write_until_refused(hosts: str, timeout: float) -> int:
    """Write scratch nodes until ZooKeeper refuses one; the writes that went through.
    Blocking: run it in a thread."""
    client = KazooClient(hosts=hosts, timeout=timeout)
    written = 0
    try:
        client.start(timeout=timeout)
        client.ensure_path(SCRATCH_PATH)
        for _ in range(SCRATCH_WRITES):
            client.create_async(
                f"{SCRATCH_PATH}/n-", b"x" * 1024, ephemeral=True, sequence=True
            ).get(timeout=timeout)
            written += 1
    except (KazooException, KazooTimeoutError, TimeoutError) as exc:
        # Refused, or no server would take the connection: the disks have bitten
        # already (the prober's own write can be the one that fills the log).
        log.info("zk_disk_full: scratch write %d refused: %r", written + 1, exc)
    finally:
        with contextlib.suppress(KazooException, KazooTimeoutError, TimeoutError):
            client.stop()
        client.close()
    return written


def _serving(servers: list[ZooKeeperServer]) -> list[bool]:
    return [server.running and server.mode() is not None for server in servers]


async def _wait_out_of_service(servers: list[ZooKeeperServer], timeout: float) -> bool:
    """Poll until each of ``servers`` has exited or been seen not serving."""
    deadline = time.monotonic() + timeout
    pending = list(servers)
    while pending:
        states = await asyncio.to_thread(_serving, pending)
        pending = [server for server, state in zip(pending, states, strict=True) if state]
        if pending and time.monotonic() > deadline:
            return False
        if pending:
            await asyncio.sleep(0.2)  # polling from outside: there is no event
    return True


async def zk_disk_full(ctx: FaultContext) -> None:
    """Fill one or every ZooKeeper server's data disk; free them; start whatever exited."""
    kind = "zk_disk_full"
    cluster = ctx.cluster
    disks, servers = cluster.zk_disks, cluster.backend.zk.servers
    if not disks:
        ctx.skipped[kind] = ctx.skipped.get(kind, 0) + 1
        log.warning("%s skipped: ZooKeeper's data is not on disks of its own", kind)
        return
    scope = ctx.rng.choice(("one", "all"))
    indexes = [ctx.rng.randrange(len(servers))] if scope == "one" else list(range(len(servers)))
    filled = [servers[i] for i in indexes]
    (victim,) = ctx.pick_data(1)
    log.info("%s: filling the disk of ZooKeeper server(s) %s", kind, [i + 1 for i in indexes])
    # A change that needs a write while the disks are full: the victim's probes fail
    # from now on, so it leaves ZooKeeper (a probe budget later) after the disks filled.
    async with ctx.probes_failing([victim]):
        try:
            await asyncio.gather(*(asyncio.to_thread(_fill, disks[i]) for i in indexes))
            written = await asyncio.to_thread(
                _write_until_refused, cluster.zk_hosts, ctx.config.session_timeout
            )
            log.info("%s: %d scratch writes went through", kind, written)
            if not await _wait_out_of_service(filled, EXIT_TIMEOUT):
                # ZooKeeper kept going (the writes fitted in log space it had): still a
                # disk-full test of the clients, but say so.
                log.warning("%s: the filled servers still serve %g s later", kind, EXIT_TIMEOUT)
            await ctx.hold(1.0, 3.0)
        finally:
            # Whatever happened above, the ensemble is healed before the next fault.
            await asyncio.gather(*(asyncio.to_thread(_free, disks[i]) for i in indexes))
            log.info("%s: disks freed", kind)
            not_serving = await _supervise(cluster, indexes, REJOIN_TIMEOUT)
        for i in not_serving:
            _not_serving(ctx, kind, servers[i], "its disk was freed")
        await ctx.converge(
            kind, "disks freed", ctx.config.session_timeout + ctx.config.probe_budget
        )
    await ctx.converge(kind, "data server back", ctx.config.rise_budget + 1.5)


async def zk_peer_partition(ctx: FaultContext) -> None:
    """Cut one ZooKeeper server from its peers (its clients untouched); heal it."""
    kind = "zk_peer_partition"
    cluster = ctx.cluster
    servers = cluster.backend.zk.servers
    if not cluster.zk_lab_hosts:
        ctx.skipped[kind] = ctx.skipped.get(kind, 0) + 1
        return
    modes = await asyncio.to_thread(_modes, servers)
    index = ctx.rng.randrange(len(servers))
    server = servers[index]
    cut_ms = time.time() * 1000
    log.info("cut ZooKeeper server %d (%s) from its peers", server.server_id, modes[index])
    await cluster.cut_zookeeper_peers(index)
    try:
        await _works_without(ctx, kind, "majority serves", server, cut_ms)
        await ctx.hold(0.5, 2.0)
    finally:
        await cluster.heal_zookeeper_peers(index)
    await _serves_again(ctx, kind, server, "the heal")
    await ctx.converge(kind, "healed", ctx.config.session_timeout + ctx.config.probe_budget)
