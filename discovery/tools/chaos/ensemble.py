"""Faults of the ZooKeeper ensemble itself, beyond a killed server or a lost quorum.

* ``zk_leader_pause``: the ensemble's own leader stops (SIGSTOP: a long GC pause, a
  frozen VM) for longer than the session timeout, then goes on (SIGCONT). Its followers
  give it up after their ``syncLimit`` and elect one of themselves; clients connected to
  the paused server find their reads timing out and move; the new leader takes every
  session over with a fresh timeout, so no session expires and nothing may be lost. A
  client whose own watchdog declared its session lost meanwhile starts a new one and
  closes the old one (:mod:`discovery.zk.session`), so its old nodes do not linger.
  Outcome and bounds: the list right and a leader of the search servers publishing
  again within :func:`reelection_bound` of the pause; once resumed, the old ZooKeeper
  leader serves again (as a follower) within :data:`REJOIN_TIMEOUT`, and the list is
  right within the session timeout plus the probe budget.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time

from discovery.testing.zookeeper import ZooKeeperServer

from .config import ChaosConfig
from .context import FaultContext

__all__ = ["REJOIN_TIMEOUT", "reelection_bound", "zk_leader_pause"]

log = logging.getLogger(__name__)

#: A resumed or reconnected ZooKeeper server rejoining its ensemble: it notices it lost
#: its peers (``syncLimit``), looks for the leader and syncs from it (``initLimit``, 20 s
#: at most here; a small data set syncs in well under a second).
REJOIN_TIMEOUT = 30.0


def reelection_bound(config: ChaosConfig, sync_limit: float) -> float:
    """Seconds from the ZooKeeper leader's pause to the search servers' list right and
    their leader publishing again: the followers give the leader up after
    ``sync_limit`` and drop their clients, elect and sync (1 s); a client that then
    tries the paused server first (its kernel still accepts the connection) waits up to
    a session timeout before it moves on; then a ZooKeeper tick, the leader's
    propagation (1 s) and a heartbeat (the crash bound's terms,
    :attr:`~.config.ChaosConfig.crash_bound`). Measured: 6.8-10.3 s, 8 pauses."""
    return sync_limit + 1.0 + config.crash_bound + config.heartbeat_interval


def _modes(servers: list[ZooKeeperServer]) -> list[str | None]:
    return [server.mode() for server in servers]


async def _wait_serving(server: ZooKeeperServer, timeout: float) -> bool:
    """Poll ``srvr`` until ``server`` serves again (no event comes from outside)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await asyncio.to_thread(server.mode) is not None:
            return True
        await asyncio.sleep(0.2)
    return False


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
        await ctx.converge(
            kind,
            "re-elected without it",
            reelection_bound(ctx.config, server.sync_limit),
            # A heartbeat stamped after the followers gave the old leader up: the
            # cluster can publish through the new ZooKeeper leader.
            lambda s: s.leading_since(paused_ms + server.sync_limit * 1000),
        )
        # Past the session timeout: a session kept alive by the paused server alone
        # would have expired by now.
        held = ctx.config.session_timeout + ctx.rng.uniform(1.0, 3.0)
        await asyncio.sleep(max(0.0, held - (time.monotonic() - paused)))
    finally:
        os.kill(pid, signal.SIGCONT)
    resumed_after = time.monotonic() - paused
    log.info("SIGCONT ZooKeeper server %d after %.1f s", server.server_id, resumed_after)
    if not await _wait_serving(server, REJOIN_TIMEOUT):
        ctx.observer.violate(
            "fault healed",
            f"{kind}: ZooKeeper server {server.server_id} not serving {REJOIN_TIMEOUT:g} s "
            "after SIGCONT",
        )
    await ctx.converge(kind, "resumed", ctx.config.session_timeout + ctx.config.probe_budget)
