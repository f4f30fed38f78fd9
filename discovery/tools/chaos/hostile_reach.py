"""Hostile kinds that try to reach past their own shard: a phantom shard, a registration
aimed at loopback, and a flood of idle kept-alive connections.

Each runs under :func:`~.hostile_common.watched` (every answer complete, memory bounded,
no crash) and adds checks of its own, read from the servers' metrics.

Development: docs/development.md, "The chaos run" (hostile participants; invariants 6 to 10).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from discovery.config import ZkConfig
from discovery.errors import DiscoveryError
from discovery.instance import InstancePayload, InstanceState, ServiceInstance
from discovery.zk.paths import DATA_SERVERS_PATH
from discovery.zk.session import ZkSession

from .cluster import ChaosCluster, Member
from .commandlines import SEARCH_MAX_CONNECTIONS
from .context import FaultContext
from .hostile_common import healthy_shards, ready_search_server, watched
from .watch import FRESH, SKIPPED

__all__ = [
    "FLOOD_BEYOND_CAP",
    "PROBE_TIMEOUT",
    "IdleFlood",
    "hostile_idle_flood",
    "hostile_loopback_target",
    "hostile_phantom_shard",
]

log = logging.getLogger(__name__)

#: Idle kept-alive connections a flood opens beyond the cap.
FLOOD_BEYOND_CAP = 64
#: Seconds a fresh client may wait for ``/healthz`` while the flood holds the server.
PROBE_TIMEOUT = 2.0
#: How far past the cluster's shards a phantom shard's number is drawn.
PHANTOM_SPREAD = 1000

#: Child versions the leader skipped, by reason (``shard_out_of_range``: ``--shards``).
_SKIPPED_METRIC = "discovery_membership_skipped_total"
#: Data servers a search server left out of its routing table, by why (``not_allowed``:
#: outside ``--allowed-networks``, or loopback while it listens elsewhere).
_UNROUTABLE_METRIC = "search_server_fanout_unroutable_total"
#: Idle kept-alive connections a server closed, by reason (``cap``, ``pressure``).
_IDLE_EVICTED_METRIC = "discovery_http_idle_connections_closed_total"

_HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: chaos\r\nConnection: keep-alive\r\n\r\n"


def _counter(samples: dict[str, float] | None, name: str, **labels: str) -> float | None:
    """The sum of ``name``'s samples whose labels include ``labels`` (None: unreadable)."""
    if samples is None:
        return None
    # Keys are ``name{label=value,...}`` (see ServerClient.metrics).
    wanted = {f"{key}={value}" for key, value in labels.items()}
    total = 0.0
    for key, value in samples.items():
        metric, _, rest = key.partition("{")
        if metric == name and wanted <= set(rest.rstrip("}").split(",")):
            total += value
    return total


async def _counters(
    cluster: ChaosCluster, members: list[Member], name: str, **labels: str
) -> dict[str, float | None]:
    return {m.name: _counter(await cluster.metrics(m), name, **labels) for m in members}


def _instance(child: str, address: str, port: int, shard: int) -> bytes:
    payload = InstancePayload(
        shard=shard, replica=98, docs=1, version="hostile", state=InstanceState.SERVING
    )
    instance = ServiceInstance.create("data_servers", child, address, port, payload)
    return instance.to_json()


@contextlib.asynccontextmanager
async def _registered(ctx: FaultContext, child: str, data: bytes) -> AsyncIterator[None]:
    """An ephemeral ``/data_servers/child`` of a raw session for the body's time."""
    session = ZkSession.from_config(
        ZkConfig(ctx.cluster.zk_hosts, session_timeout=ctx.config.session_timeout)
    )
    await session.start()
    try:
        await session.create(f"{DATA_SERVERS_PATH}/{child}", data, ephemeral=True)
        yield
    finally:
        with contextlib.suppress(DiscoveryError):
            await session.delete(f"{DATA_SERVERS_PATH}/{child}")
        await session.aclose()


async def hostile_phantom_shard(ctx: FaultContext) -> None:
    """A valid registration of a shard number past the cluster's (``--shards``), for
    about one query's time: the leader refuses it, no answer ever misses it."""
    kind = "hostile_phantom_shard"
    cluster, observer = ctx.cluster, ctx.observer
    shard = ctx.config.shards + ctx.rng.randrange(PHANTOM_SPREAD)
    child = f"hostile-phantom-{ctx.rng.randrange(16**6):06x}"
    leader = await cluster.leader()
    before = (
        _counter(await cluster.metrics(leader), _SKIPPED_METRIC, reason="shard_out_of_range")
        if leader
        else None
    )
    async with watched(ctx, kind, allowed_missing=0, lists_equal_model=True) as watch:
        phantom = _instance(child, _phantom_address(cluster), 9, shard)
        try:
            async with _registered(ctx, child, phantom):
                await ctx.hold(0.5, 1.5)
        except DiscoveryError as exc:
            observer.violate("fault injected", f"{kind}: {exc}")
            return
        # Answers after it left must not remember the phantom either.
        await ctx.hold(2.0, 4.0)
        after = (
            _counter(await cluster.metrics(leader), _SKIPPED_METRIC, reason="shard_out_of_range")
            if leader
            else None
        )
        watch.notes.update(shard=shard)
        if before is None or after is None:
            key = kind + " (refusal count)"
            ctx.skipped[key] = ctx.skipped.get(key, 0) + 1
        else:
            watch.notes["leader_refused"] = after - before
            if after - before < 1:
                observer.violate(
                    SKIPPED,
                    f"{kind}: the leader {leader.name if leader else '?'} did not count "
                    f"shard {shard} (of {ctx.config.shards}) as refused",
                )


def _phantom_address(cluster: ChaosCluster) -> str:
    """Where a phantom claims to listen: an address no rule but the shard's refuses
    (the lab's gateway, or documentation's TEST-NET when the run has no lab)."""
    return cluster.lab.gateway if cluster.lab is not None else "192.0.2.1"


async def hostile_loopback_target(ctx: FaultContext) -> None:
    """A valid registration of a healthy shard whose address is ``127.0.0.1``: search
    servers that listen elsewhere refuse to route to it (counted), and every answer
    stays complete."""
    kind = "hostile_loopback_target"
    cluster, observer = ctx.cluster, ctx.observer
    shards = healthy_shards(ctx)
    if cluster.lab is None or not shards:
        # Search servers on loopback may route to loopback: nothing to refuse.
        ctx.skipped[kind] = ctx.skipped.get(kind, 0) + 1
        return
    shard = ctx.rng.choice(shards)
    child = f"hostile-loopback-{ctx.rng.randrange(16**6):06x}"
    searchers = [m for m in cluster.search.values() if m.running and not m.paused]
    before = await _counters(cluster, searchers, _UNROUTABLE_METRIC, why="not_allowed")
    async with watched(ctx, kind, allowed_missing=0) as watch:
        try:
            async with _registered(ctx, child, _instance(child, "127.0.0.1", 9, shard)):
                await ctx.hold(3.0, 5.0)
                after = await _counters(cluster, searchers, _UNROUTABLE_METRIC, why="not_allowed")
        except DiscoveryError as exc:
            observer.violate("fault injected", f"{kind}: {exc}")
            return
        refused = {
            name: (after[name] or 0) - (before[name] or 0)
            for name in after
            if after[name] is not None and before[name] is not None
        }
        watch.notes.update(shard=shard, refused=refused)
        silent = sorted(name for name, count in refused.items() if count < 1)
        if silent:
            observer.violate(
                SKIPPED,
                f"{kind}: {silent} did not count {child} (shard {shard} at 127.0.0.1) "
                "as unroutable",
            )


@dataclass
class IdleFlood:
    """Idle kept-alive connections to one server, each after one ``GET /healthz``."""

    host: str
    port: int
    opened: int = 0
    _held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = field(default_factory=list)

    async def open(self, count: int) -> None:
        """Open ``count`` connections, one request each; one that fails is left out."""
        for _ in range(count):
            try:
                async with asyncio.timeout(PROBE_TIMEOUT):
                    reader, writer = await asyncio.open_connection(self.host, self.port)
                    writer.write(_HEALTHZ)
                    await _read_answer(reader)
            except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
                log.info("idle flood: connection %d not opened: %s", self.opened + 1, exc)
                continue
            self._held.append((reader, writer))
            self.opened += 1

    @property
    def closed_by_server(self) -> int:
        """How many of ours the server has closed (their readers saw its FIN)."""
        return sum(1 for reader, _ in self._held if reader.at_eof())

    async def aclose(self) -> None:
        for _, writer in self._held:
            writer.close()
        for _, writer in self._held:
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        self._held.clear()


async def _read_answer(reader: asyncio.StreamReader) -> int:
    """Read one HTTP answer with a ``Content-Length`` body; its status."""
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    await reader.readexactly(length)
    return status


async def _fresh_client(host: str, port: int) -> str | None:
    """One new connection's ``GET /healthz``: None if answered, else what went wrong."""
    started = time.monotonic()
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(PROBE_TIMEOUT):
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(_HEALTHZ)
            status = await _read_answer(reader)
    except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
        return f"{type(exc).__name__} after {time.monotonic() - started:.1f} s"
    finally:
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
    return None if status == 200 else f"status {status}"


async def hostile_idle_flood(ctx: FaultContext) -> None:
    """Idle kept-alive connections past one search server's connection cap: a new
    client is still answered, and the normal load through it stays complete."""
    kind = "hostile_idle_flood"
    cluster, observer = ctx.cluster, ctx.observer
    target = ready_search_server(ctx, kind)
    if target is None:
        return
    flood = IdleFlood(target.address, target.port)
    evicted_before = _counter(await cluster.metrics(target), _IDLE_EVICTED_METRIC)
    async with watched(ctx, kind, allowed_missing=0) as watch:
        try:
            await flood.open(SEARCH_MAX_CONNECTIONS + FLOOD_BEYOND_CAP)
            answered, refused = 0, []
            deadline = time.monotonic() + ctx.rng.uniform(3.0, 6.0)
            while time.monotonic() < deadline:
                problem = await _fresh_client(target.address, target.port)
                if problem is None:
                    answered += 1
                else:
                    refused.append(problem)
                await asyncio.sleep(0.25)  # paced probes, not synchronisation
            closed = flood.closed_by_server
        finally:
            await flood.aclose()
        evicted_after = _counter(await cluster.metrics(target), _IDLE_EVICTED_METRIC)
        watch.notes.update(
            target=target.name,
            opened=flood.opened,
            closed_by_server=closed,
            fresh_answered=answered,
            fresh_failed=len(refused),
        )
        if evicted_before is not None and evicted_after is not None:
            watch.notes["evicted"] = evicted_after - evicted_before
        if refused:
            observer.violate(
                FRESH,
                f"{kind}: {len(refused)} of {answered + len(refused)} fresh clients of "
                f"{target.name} were not answered with {flood.opened} idle connections "
                f"open: {refused[:3]}",
            )
