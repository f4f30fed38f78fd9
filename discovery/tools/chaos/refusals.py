"""Redis that answers but refuses to write: the store fault between "up" and "down".

``redis_refuses_writes``: ``oom``, ``pause``, or with one Redis server only ``readonly``.
Readers route with the list they hold; allowed again, the change is followed within
:func:`refusal_bound`.

Development: docs/development.md, "The chaos run" (the faults).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

import redis as sync_redis

from .cluster import ChaosCluster
from .config import ChaosConfig
from .context import FaultContext, redis_bound

__all__ = ["REFUSAL_MODES", "SENTINEL_REFUSAL_MODES", "redis_refuses_writes", "refusal_bound"]

log = logging.getLogger(__name__)

REFUSAL_MODES = ("oom", "pause", "readonly")
#: With sentinels: see the module's docstring.
SENTINEL_REFUSAL_MODES = ("oom", "pause")
#: What the ``readonly`` refusal makes the primary a replica of: nothing listens on the
#: loopback's port 1, so it never syncs (a replica that synced would drop its data).
_NOWHERE = ("127.0.0.1", 1)


def refusal_bound(config: ChaosConfig) -> float:
    """Seconds from writes allowed again to the change published and followed.

    A leader that kept failing may have resigned just before: an election (its node
    is deleted at once, so the next in line leads within a ZooKeeper round trip or
    two, 1 s) and the new term's first full publish, then what any Redis recovery
    takes (:func:`~.context.redis_bound`).
    """
    return 1.0 + redis_bound(config)


def _refuse(cluster: ChaosCluster, mode: str, pause_ms: int) -> dict[str, str]:
    """Make the primary refuse writes; return what :func:`_allow` restores."""
    with cluster.primary_client() as client:
        if mode == "oom":
            saved = {
                key: str(value)
                for key, value in client.config_get("maxmemory*").items()
                if key in ("maxmemory", "maxmemory-policy")
            }
            client.config_set("maxmemory-policy", "noeviction")
            # One byte: below anything Redis holds, so every write is refused.
            client.config_set("maxmemory", "1")
            return saved
        if mode == "readonly":
            client.replicaof(*_NOWHERE)
            return {}
        client.client_pause(pause_ms, all=False)  # CLIENT PAUSE <ms> WRITE
        return {}


def _allow(cluster: ChaosCluster, mode: str, saved: dict[str, str]) -> None:
    with cluster.primary_client() as client:
        if mode == "oom":
            for key, value in saved.items():
                client.config_set(key, value)
        elif mode == "readonly":
            client.replicaof("NO", "ONE")
        else:
            client.client_unpause()


@contextlib.asynccontextmanager
async def _writes_refused(cluster: ChaosCluster, mode: str, pause_ms: int) -> AsyncIterator[None]:
    """The primary refuses writes for the block, and writes again however it ends."""
    saved = await asyncio.to_thread(_refuse, cluster, mode, pause_ms)
    try:
        yield
    finally:
        # Shielded: a cancelled run must still leave Redis writable for its teardown.
        with contextlib.suppress(sync_redis.RedisError):
            await asyncio.shield(asyncio.to_thread(_allow, cluster, mode, saved))


async def redis_refuses_writes(ctx: FaultContext) -> None:
    """The Redis primary refuses writes (OOM, ``CLIENT PAUSE WRITE`` or READONLY) while a
    data server goes offline; allowed again, the change is published within the bound."""
    kind = "redis_refuses_writes"
    mode = ctx.rng.choice(SENTINEL_REFUSAL_MODES if ctx.cluster.sentinel_mode else REFUSAL_MODES)
    # Long enough for the victim to leave ZooKeeper while refused (the probe budget)
    # and, often, for the leader to give up on the store (heartbeat_ttl).
    hold = ctx.config.probe_budget + ctx.rng.uniform(0.5, 3.0)
    (victim,) = ctx.pick_data(1)
    cluster = ctx.cluster
    log.info("%s (%s) for %.1f s; %s fails its probes meanwhile", kind, mode, hold, victim.name)
    async with ctx.probes_failing([victim]):
        # The pause also ends by itself, should this harness die before it unpauses.
        async with _writes_refused(cluster, mode, round((hold + 30.0) * 1000)):
            refused_at = time.monotonic()
            await asyncio.sleep(hold)
        log.info("%s: writes allowed again after %.1f s", kind, time.monotonic() - refused_at)
        await ctx.converge(
            kind,
            "published again",
            refusal_bound(ctx.config),
            lambda s: s.redis is not None and s.subscribed >= set(s.search),
        )
    await ctx.converge(kind, "data server back", ctx.config.rise_budget + 1.5)
