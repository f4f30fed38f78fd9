"""The faults of a chaos run: each injects, holds, heals, and is judged against its bound.

A step that does not converge within its bound is a violation; its fault then waits for the
cluster to settle (:data:`~.context.RECOVERY_TIMEOUT`), so that one failure does not spill over.

Development: docs/development.md, "The chaos run" (the faults; the bounds: invariant 2).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable

from discovery.errors import DevClusterError
from discovery.testing.redis import RedisServer

from . import deploy, hostile
from .cluster import ChaosCluster, Member
from .context import RECOVERY_TIMEOUT, START_BOUND, FaultContext, StepResult, redis_bound
from .ensemble import zk_disk_full, zk_leader_pause, zk_peer_partition
from .refusals import redis_refuses_writes

__all__ = [
    "CATEGORIES",
    "FAULTS",
    "RECOVERY_TIMEOUT",
    "SENTINEL_KINDS",
    "START_BOUND",
    "FaultContext",
    "StepResult",
    "kinds",
]

log = logging.getLogger(__name__)

# -- data servers ---------------------------------------------------------------------


async def data_server_kill(ctx: FaultContext) -> None:
    """``kill -9`` one to three data servers; restart them later."""
    victims = ctx.pick_data(ctx.rng.randint(1, 3))
    log.info("kill -9 %s", [m.name for m in victims])
    await asyncio.gather(*(ctx.cluster.kill(m) for m in victims))
    ctx.remove(victims)
    await ctx.converge("data_server_kill", "removed", ctx.config.crash_bound)
    await ctx.hold(0.5, 2.0)
    await asyncio.gather(*(ctx.cluster.restart(m) for m in victims))
    ctx.add(victims)
    await ctx.converge("data_server_kill", "restarted", START_BOUND)


def _probe_fault(kind: str, body: dict[str, object]) -> Callable[[FaultContext], Awaitable[None]]:
    async def run(ctx: FaultContext) -> None:
        victims = ctx.pick_data(ctx.rng.randint(1, 2))
        log.info("fault %s on %s", body, [m.name for m in victims])
        async with ctx.probes_failing(victims, body):
            await ctx.converge(kind, "taken offline", ctx.config.probe_budget + 1.5)
            await ctx.hold(1.0, 3.0)
        await ctx.converge(kind, "back", ctx.config.rise_budget + 1.5)

    run.__name__ = kind
    run.__doc__ = f"Data server fault {body} on one or two servers; cleared later."
    return run


async def agent_session_expiry(ctx: FaultContext) -> None:
    """Expire a data server agent's ZooKeeper session on the server: it must re-register."""
    (victim,) = ctx.pick_data(1)
    log.info("expire the session of %s", victim.name)
    # The endpoint answers once the victim is connected in a new session. That can take
    # an operation timeout longer than the expiry itself: when the victim's reconnection
    # races the close, a server may take it back into the closing session (a zombie,
    # see discovery.zk.session), and only a write that goes unanswered reveals it (seen: 6 s).
    expired = await ctx.cluster.admin(
        victim, "expire-session", timeout=3 * ctx.config.session_timeout + 5.0
    )
    if not expired:
        ctx.observer.violate("fault injected", f"expire-session refused by {victim.name}")
        return
    await ctx.converge("agent_session_expiry", "re-registered", ctx.config.session_timeout)


# -- search servers -------------------------------------------------------------------


async def _leader_or_skip(ctx: FaultContext, kind: str, action: str) -> tuple[Member, int] | None:
    """The single leader and the highest epoch seen so far, or None (counted as skipped)."""
    leader = await ctx.cluster.leader()
    if leader is None:
        ctx.skipped[kind] = ctx.skipped.get(kind, 0) + 1
        log.warning("%s skipped: no single leader right now", kind)
        return None
    epoch = ctx.observer.max_epoch
    log.info("%s leader %s (epoch %d)", action, leader.name, epoch)
    return leader, epoch


async def _successor_publishes(ctx: FaultContext, kind: str, epoch: int) -> None:
    await ctx.converge(
        kind,
        "new leader",
        ctx.config.crash_bound + 1.0,
        lambda s: ctx.observer.max_epoch > epoch and bool(s.leaders),
    )


async def leader_kill(ctx: FaultContext) -> None:
    """``kill -9`` the leading search server: a successor publishes with a higher epoch."""
    found = await _leader_or_skip(ctx, "leader_kill", "kill -9")
    if found is None:
        return
    leader, epoch = found
    await ctx.cluster.kill(leader)
    await _successor_publishes(ctx, "leader_kill", epoch)
    await ctx.cluster.restart(leader)
    await ctx.converge("leader_kill", "restarted", START_BOUND, lambda s: leader.name in s.search)


async def leader_pause(ctx: FaultContext) -> None:
    """SIGSTOP the leader past its session timeout, then SIGCONT: the deposed leader."""
    await _pause_leader(ctx, "leader_pause", "SIGSTOP")


async def _pause_leader(
    ctx: FaultContext,
    kind: str,
    action: str,
    *,
    while_paused: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """SIGSTOP the leader until a successor publishes and its session is surely gone,
    doing ``while_paused`` meanwhile; SIGCONT; the deposed leader must then follow (and
    the store hold a list again)."""
    found = await _leader_or_skip(ctx, kind, action)
    if found is None:
        return
    leader, epoch = found
    loop = asyncio.get_running_loop()
    paused_at = loop.time()
    ctx.cluster.signal(leader, signal.SIGSTOP)
    await _successor_publishes(ctx, kind, epoch)
    if while_paused is not None:
        await while_paused()
    # Stay paused well past the session timeout, so the session is surely gone.
    remaining = ctx.config.session_timeout + 1.0 - (loop.time() - paused_at)
    await asyncio.sleep(max(0.0, remaining))
    ctx.cluster.signal(leader, signal.SIGCONT)
    log.info("SIGCONT %s", leader.name)
    await ctx.converge(
        kind,
        "deposed leader follows",
        START_BOUND,
        lambda s: s.redis is not None and leader.name in s.search and leader.name not in s.leaders,
    )


# -- Redis ------------------------------------------------------------------------------


def _redis_bound(ctx: FaultContext) -> float:
    return redis_bound(ctx.config)


async def redis_restart(ctx: FaultContext) -> None:
    """Stop Redis for a few seconds and start it again, empty."""
    redis = ctx.cluster.backend.redis
    await asyncio.to_thread(redis.stop)
    await ctx.hold(1.0, 4.0)
    await asyncio.to_thread(redis.start)
    # Recovered means republished *and* every reader subscribed again: until then a
    # reader would miss the next change.
    await ctx.converge(
        "redis_restart", "republished", _redis_bound(ctx), lambda s: s.subscribed >= set(s.search)
    )


async def redis_flushall(ctx: FaultContext) -> None:
    """FLUSHALL (with sentinels, on the primary; it replicates): the live list, fence
    and heartbeat vanish at once."""
    await asyncio.to_thread(_flushall, ctx.cluster)
    await ctx.converge(
        "redis_flushall",
        "republished",
        _redis_bound(ctx),
        lambda s: s.redis is not None and s.subscribed >= set(s.search),
    )


def _flushall(cluster: ChaosCluster) -> None:
    # The primary's own URL: a plain client cannot take the sentinel URL, and asking
    # the sentinels for the primary is blocking I/O too (this runs in a thread).
    with cluster.primary_client() as client:
        client.flushall()


async def _kill_redis_primary(
    ctx: FaultContext, kind: str
) -> tuple[RedisServer, asyncio.Task[None]] | None:
    """SIGKILL the primary; return it and a task that logs when the sentinels have
    promoted another (for the report's timings; the verdict is the converge's). None
    (a violation) if no sentinel names a running primary to kill."""
    group = ctx.cluster.backend.redis_group
    loop = asyncio.get_running_loop()
    try:
        old = await asyncio.to_thread(group.primary_address)
        killed_at = loop.time()
        killed = await asyncio.to_thread(group.kill_primary)
    except DevClusterError as exc:
        ctx.observer.violate("fault injected", f"{kind}: cannot kill the Redis primary: {exc}")
        return None
    log.info("%s: killed the Redis primary %s (%s:%d)", kind, killed.name, *old)

    async def promoted() -> None:
        try:
            new = await asyncio.to_thread(group.wait_for_new_primary, old, RECOVERY_TIMEOUT)
        except DevClusterError as exc:
            log.error("%s: no new Redis primary: %s", kind, exc)
            return
        log.info(
            "%s: the sentinels promoted %s:%d %.2f s after the kill",
            kind,
            *new,
            loop.time() - killed_at,
        )

    return killed, asyncio.create_task(promoted(), name=f"{kind}:promotion")


async def _rejoin_redis(ctx: FaultContext, kind: str, killed: RedisServer) -> None:
    """Bring a killed data server back as a replica of the new primary and wait until
    every replica replicates from it, so the next fault starts from a healthy group."""
    group = ctx.cluster.backend.redis_group
    try:
        await asyncio.to_thread(group.restart, killed, RECOVERY_TIMEOUT)
        await asyncio.to_thread(group.wait_replicated, RECOVERY_TIMEOUT)
    except DevClusterError as exc:
        ctx.observer.violate("fault healed", f"{kind}: {killed.name} did not rejoin: {exc}")
        return
    log.info("%s: %s replicates from the new primary again", kind, killed.name)


async def redis_failover(ctx: FaultContext) -> None:
    """``kill -9`` the Redis primary (with sentinels): they promote a replica, the
    list is readable from it and every search server follows it again within the
    failover bound; the killed server then rejoins as a replica, and nothing moves."""
    kind = "redis_failover"
    found = await _kill_redis_primary(ctx, kind)
    if found is None:
        return
    killed, promotion = found
    # Readable (the snapshot's Redis view equals the model, so not None), every reader
    # holding what the new primary holds (the leader's epoch, or its successor's if it
    # gave up during the failover) and following the stream again: until then a reader
    # would miss a change.
    await ctx.converge(
        kind,
        "failed over",
        ctx.config.redis_failover_bound,
        lambda s: s.redis is not None and s.search_follows_redis and s.subscribed >= set(s.search),
    )
    await promotion
    await _rejoin_redis(ctx, kind, killed)
    await ctx.converge(
        kind, "old primary rejoined", _redis_bound(ctx), lambda s: s.subscribed >= set(s.search)
    )


# -- ZooKeeper ---------------------------------------------------------------------------


def _kill_zk(ctx: FaultContext, index: int) -> None:
    server = ctx.cluster.backend.zk.servers[index]
    if server.pid is not None:
        os.kill(server.pid, signal.SIGKILL)
    server.stop()  # reaps it


async def zk_server_kill(ctx: FaultContext) -> None:
    """``kill -9`` one ZooKeeper server (quorum kept); restart it later."""
    ensemble = ctx.cluster.backend.zk
    index = ctx.rng.randrange(ensemble.size)
    log.info("kill -9 ZooKeeper server %d", index + 1)
    await asyncio.to_thread(_kill_zk, ctx, index)
    # Clients move to the other servers within their session: nothing may change.
    await ctx.converge("zk_server_kill", "quorum kept", ctx.config.session_timeout)
    await ctx.hold(1.0, 4.0)
    await asyncio.to_thread(ctx.cluster.start_zookeeper, index)
    await ctx.converge("zk_server_kill", "restarted", ctx.config.session_timeout)


async def zk_quorum_loss(ctx: FaultContext) -> None:
    """Kill two of three ZooKeeper servers for a few seconds: no quorum, then recovery.

    Sessions do not expire without a quorum (the new ZooKeeper leader renews them), so
    every registration must still be there afterwards and nothing may be lost.
    """
    ensemble = ctx.cluster.backend.zk
    indexes = ctx.rng.sample(range(ensemble.size), 2)
    log.info("kill -9 ZooKeeper servers %s: quorum lost", [i + 1 for i in indexes])
    await asyncio.gather(*(asyncio.to_thread(_kill_zk, ctx, i) for i in indexes))
    await ctx.hold(1.0, 3.0)
    await asyncio.gather(*(asyncio.to_thread(ctx.cluster.start_zookeeper, i) for i in indexes))
    await ctx.converge(
        "zk_quorum_loss", "quorum back", ctx.config.session_timeout + ctx.config.probe_budget
    )


# -- network partitions (runs with --partitions) -------------------------------------


def _rejoin_bound(ctx: FaultContext) -> float:
    # After a heal: kazoo's reconnect back-off (2 s at most), a new session (the old one
    # expired meanwhile), the create, the leader's propagation.
    return 2.0 + ctx.config.session_timeout / 2 + 1.5


async def partition_data_zookeeper(ctx: FaultContext) -> None:
    """Cut one data server from ZooKeeper only (it still serves): its session expires,
    it leaves every list within the crash bound; healed, it registers again."""
    (victim,) = ctx.pick_data(1)
    log.info("cut %s from ZooKeeper", victim.name)
    ctx.remove([victim])
    try:
        async with ctx.cluster.cut_off(victim, "zookeeper"):
            await ctx.converge("partition_data_zookeeper", "removed", ctx.config.crash_bound)
            await ctx.hold(0.5, 2.0)
    finally:
        ctx.add([victim])
    await ctx.converge("partition_data_zookeeper", "registered again", _rejoin_bound(ctx))


async def partition_data_unreachable(ctx: FaultContext) -> None:
    """Cut one data server from every search server (ZooKeeper fine): it stays listed,
    local ejection keeps every query within its deadline (invariant 1), and nothing
    in the lists changes."""
    (victim,) = ctx.pick_data(1)
    log.info("cut the search servers from %s", victim.name)
    async with ctx.cluster.cut_off(victim, "search"):
        await ctx.hold(2.0, 4.0)
        await ctx.converge("partition_data_unreachable", "still listed", 1.0)


async def partition_leader_zookeeper(ctx: FaultContext) -> None:
    """Cut the leader from ZooKeeper: it stops publishing before its session can have
    expired, a successor publishes with a higher epoch; healed, the old leader follows."""
    kind = "partition_leader_zookeeper"
    found = await _leader_or_skip(ctx, kind, "cut from ZooKeeper")
    if found is None:
        return
    leader, epoch = found
    cut_ms = time.time() * 1000
    async with ctx.cluster.cut_off(leader, "zookeeper"):
        await _successor_publishes(ctx, kind, epoch)
        last = ctx.observer.last_write_ms.get(epoch, 0.0)
        if last - cut_ms > ctx.config.session_timeout * 1000:
            ctx.observer.violate(
                "a cut-off leader is silent before its session can expire",
                f"{leader.name} (epoch {epoch}) wrote {last - cut_ms:.0f} ms after it was cut "
                f"from ZooKeeper (session timeout {ctx.config.session_timeout:g} s)",
            )
        await ctx.hold(0.5, 2.0)
    await ctx.converge(
        kind,
        "old leader follows",
        _rejoin_bound(ctx),
        lambda s: leader.name in s.search and leader.name not in s.leaders,
    )


async def partition_leader_redis(ctx: FaultContext) -> None:
    """Cut the leader from Redis only: it hands over within its heartbeat TTL (plus one
    write's timeout) to a search server that reaches Redis."""
    kind = "partition_leader_redis"
    found = await _leader_or_skip(ctx, kind, "cut from Redis")
    if found is None:
        return
    leader, epoch = found
    async with ctx.cluster.cut_off(leader, "redis"):
        await ctx.converge(
            kind,
            "handed over",
            2 * ctx.config.heartbeat_ttl + 1.5,
            lambda s: (
                ctx.observer.max_epoch > epoch and bool(s.leaders) and leader.name not in s.leaders
            ),
        )
        await ctx.hold(0.5, 2.0)
    await ctx.converge(
        kind, "old leader caught up", _redis_bound(ctx), lambda s: leader.name in s.subscribed
    )


async def partition_search_redis(ctx: FaultContext) -> None:
    """Cut a search server that does not lead from Redis while a data server goes
    offline: it answers from its last list meanwhile; healed, it catches up."""
    kind = "partition_search_redis"
    leader = await ctx.cluster.leader()
    followers = sorted(n for n, m in ctx.cluster.search.items() if m.running and m is not leader)
    if not followers:
        ctx.skipped[kind] = ctx.skipped.get(kind, 0) + 1
        return
    member = ctx.cluster.search[ctx.rng.choice(followers)]
    (victim,) = ctx.pick_data(1)
    log.info("cut %s from Redis; %s fails its probes meanwhile", member.name, victim.name)
    async with ctx.probes_failing([victim]):
        async with ctx.cluster.cut_off(member, "redis"):
            await ctx.hold(2.0, 4.0)
        await ctx.converge(
            kind,
            "caught up",
            ctx.config.probe_budget + _redis_bound(ctx),
            lambda s: member.name in s.subscribed,
        )
    await ctx.converge(kind, "data server back", ctx.config.rise_budget + 1.5)


# -- two faults at once ---------------------------------------------------------------


async def overlap_flushall_while_leader_paused(ctx: FaultContext) -> None:
    """SIGSTOP the leader; once a successor publishes, FLUSHALL (the fence goes too);
    then SIGCONT. The deposed leader must not bring its older epoch back into the
    emptied store: the epoch in Redis never goes back (the observer checks every
    write), and the successor's list returns within a heartbeat."""

    async def flushall() -> None:
        await asyncio.to_thread(_flushall, ctx.cluster)

    kind = "overlap_flushall_while_leader_paused"
    await _pause_leader(ctx, kind, "SIGSTOP, then FLUSHALL,", while_paused=flushall)


async def overlap_zk_kill_during_leader_kill(ctx: FaultContext) -> None:
    """``kill -9`` the leader and one ZooKeeper server at once."""
    kind = "overlap_zk_kill_during_leader_kill"
    found = await _leader_or_skip(ctx, kind, "kill -9 (with a ZooKeeper server)")
    if found is None:
        return
    leader, epoch = found
    index = ctx.rng.randrange(ctx.cluster.backend.zk.size)
    await asyncio.gather(ctx.cluster.kill(leader), asyncio.to_thread(_kill_zk, ctx, index))
    # The successor's session may have to move to another ZooKeeper server first.
    await ctx.converge(
        kind,
        "new leader",
        ctx.config.crash_bound + 3.0,
        lambda s: ctx.observer.max_epoch > epoch and bool(s.leaders),
    )
    await asyncio.gather(
        ctx.cluster.restart(leader), asyncio.to_thread(ctx.cluster.start_zookeeper, index)
    )
    await ctx.converge(kind, "restarted", START_BOUND, lambda s: leader.name in s.search)


async def overlap_data_kill_during_quorum_loss(ctx: FaultContext) -> None:
    """Lose the ZooKeeper quorum and ``kill -9`` a data server meanwhile: once the
    quorum is back its session expires (and only its)."""
    kind = "overlap_data_kill_during_quorum_loss"
    ensemble = ctx.cluster.backend.zk
    indexes = ctx.rng.sample(range(ensemble.size), 2)
    victims = ctx.pick_data(1)
    await asyncio.gather(*(asyncio.to_thread(_kill_zk, ctx, i) for i in indexes))
    await ctx.hold(0.5, 1.5)
    await asyncio.gather(*(ctx.cluster.kill(m) for m in victims))
    ctx.remove(victims)
    await ctx.hold(0.5, 1.5)
    await asyncio.gather(*(asyncio.to_thread(ctx.cluster.start_zookeeper, i) for i in indexes))
    await ctx.converge(
        kind, "quorum back, victim gone", ctx.config.crash_bound + ctx.config.probe_budget
    )
    await asyncio.gather(*(ctx.cluster.restart(m) for m in victims))
    ctx.add(victims)
    await ctx.converge(kind, "restarted", START_BOUND)


async def overlap_redis_restart_during_leader_change(ctx: FaultContext) -> None:
    """Stop Redis and ``kill -9`` the leader together; start Redis again: the successor
    publishes into the empty store with a higher epoch and every reader follows."""
    kind = "overlap_redis_restart_during_leader_change"
    found = await _leader_or_skip(ctx, kind, "kill -9 (with Redis stopped)")
    if found is None:
        return
    leader, epoch = found
    redis = ctx.cluster.backend.redis
    await asyncio.gather(ctx.cluster.kill(leader), asyncio.to_thread(redis.stop))
    await ctx.hold(1.0, 3.0)
    await asyncio.to_thread(redis.start)
    await ctx.converge(
        kind,
        "new leader, readers back",
        ctx.config.crash_bound + _redis_bound(ctx),
        lambda s: (
            ctx.observer.max_epoch > epoch and bool(s.leaders) and s.subscribed >= set(s.search)
        ),
    )
    await ctx.cluster.restart(leader)
    await ctx.converge(kind, "restarted", START_BOUND, lambda s: leader.name in s.search)


async def overlap_redis_failover_during_leader_change(ctx: FaultContext) -> None:
    """``kill -9`` the leader and the Redis primary together (with sentinels): the
    successor publishes with a higher epoch to the promoted replica and every reader
    follows; then both come back (the old primary as a replica)."""
    kind = "overlap_redis_failover_during_leader_change"
    found = await _leader_or_skip(ctx, kind, "kill -9 (with the Redis primary)")
    if found is None:
        return
    leader, epoch = found
    primary, _ = await asyncio.gather(_kill_redis_primary(ctx, kind), ctx.cluster.kill(leader))
    if primary is None:
        await ctx.cluster.restart(leader)
        return
    killed, promotion = primary
    await ctx.converge(
        kind,
        "new leader, readers back",
        ctx.config.crash_bound + ctx.config.redis_failover_bound,
        lambda s: (
            ctx.observer.max_epoch > epoch
            and bool(s.leaders)
            and s.redis is not None
            and s.search_follows_redis
            and s.subscribed >= set(s.search)
        ),
    )
    await promotion
    await asyncio.gather(ctx.cluster.restart(leader), _rejoin_redis(ctx, kind, killed))
    await ctx.converge(
        kind,
        "restarted",
        START_BOUND,
        lambda s: leader.name in s.search and s.subscribed >= set(s.search),
    )


#: Each fault kind's category; a round of the schedule takes the categories in turn.
#: A kind of :data:`SENTINEL_KINDS` (either side) runs in one Redis mode only.
CATEGORIES: dict[str, tuple[str, ...]] = {
    "process": (
        "zk_server_kill",
        "zk_quorum_loss",
        "redis_restart",
        "redis_flushall",
        "leader_kill",
        "leader_pause",
        "data_server_kill",
        "data_server_slow",
        "data_server_error",
        "data_server_hang",
        "agent_session_expiry",
        "redis_failover",
    ),
    "partition": (
        "partition_data_zookeeper",
        "partition_data_unreachable",
        "partition_leader_zookeeper",
        "partition_leader_redis",
        "partition_search_redis",
        "zk_peer_partition",
    ),
    "overlap": (
        "overlap_flushall_while_leader_paused",
        "overlap_zk_kill_during_leader_kill",
        "overlap_data_kill_during_quorum_loss",
        "overlap_redis_restart_during_leader_change",
        "overlap_redis_failover_during_leader_change",
    ),
    # ZooKeeper and Redis failing short of a crash: paused, out of disk, refusing writes.
    "backend": (
        "zk_leader_pause",
        "redis_refuses_writes",
        "zk_disk_full",
    ),
    "hostile": hostile.HOSTILE_KINDS,
    # A whole rolling restart (a minute or two): once per round, at its end (see
    # runner.schedule), so a short run still meets the other categories first.
    "deploy": (deploy.KIND,),
}

#: With sentinels, each kind on the left is replaced by the one on the right, in its
#: place: restarting the one Redis server empty has no Sentinel counterpart but the
#: primary's crash and a replica's promotion. Kinds on the right run only then.
SENTINEL_KINDS: dict[str, str] = {
    "redis_restart": "redis_failover",
    "overlap_redis_restart_during_leader_change": "overlap_redis_failover_during_leader_change",
}


def kinds(category: str, *, sentinels: bool = False) -> list[str]:
    """The kinds of ``category`` that a run in this Redis mode schedules, in the order
    of :data:`CATEGORIES` (single Redis: exactly as before sentinels existed, so a seed
    replays the same run; with sentinels: the same order, the swapped kinds in place)."""
    replaced = set(SENTINEL_KINDS.values())
    chosen = [kind for kind in CATEGORIES[category] if kind not in replaced]
    if sentinels:
        chosen = [SENTINEL_KINDS.get(kind, kind) for kind in chosen]
    return chosen


FAULTS: dict[str, Callable[[FaultContext], Awaitable[None]]] = {
    "zk_server_kill": zk_server_kill,
    "zk_quorum_loss": zk_quorum_loss,
    "redis_restart": redis_restart,
    "redis_flushall": redis_flushall,
    "leader_kill": leader_kill,
    "leader_pause": leader_pause,
    "data_server_kill": data_server_kill,
    "data_server_slow": _probe_fault("data_server_slow", {"mode": "slow", "delay_ms": 800}),
    "data_server_error": _probe_fault("data_server_error", {"mode": "error", "rate": 1.0}),
    "data_server_hang": _probe_fault("data_server_hang", {"mode": "hang"}),
    "agent_session_expiry": agent_session_expiry,
    "partition_data_zookeeper": partition_data_zookeeper,
    "partition_data_unreachable": partition_data_unreachable,
    "partition_leader_zookeeper": partition_leader_zookeeper,
    "partition_leader_redis": partition_leader_redis,
    "partition_search_redis": partition_search_redis,
    "overlap_flushall_while_leader_paused": overlap_flushall_while_leader_paused,
    "overlap_zk_kill_during_leader_kill": overlap_zk_kill_during_leader_kill,
    "overlap_data_kill_during_quorum_loss": overlap_data_kill_during_quorum_loss,
    "overlap_redis_restart_during_leader_change": overlap_redis_restart_during_leader_change,
    "redis_failover": redis_failover,
    "overlap_redis_failover_during_leader_change": overlap_redis_failover_during_leader_change,
    "zk_leader_pause": zk_leader_pause,
    "redis_refuses_writes": redis_refuses_writes,
    "zk_disk_full": zk_disk_full,
    "zk_peer_partition": zk_peer_partition,
    **hostile.HOSTILE_FAULTS,
    deploy.KIND: deploy.deploy_day,
}
