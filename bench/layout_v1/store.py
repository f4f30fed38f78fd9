"""The live-list store in Redis layout 1 (the benchmarks' baseline).

:class:`RedisLiveStore` implements :class:`~discovery.livelist.LiveListStore` with the
pieces that already speak that layout: each term's publisher is a
:class:`~discovery.livelist.redis.LivePublisher` (one Lua script fences every write), each
follower a :class:`~discovery.livelist.redis.LiveListReader` (pub/sub events, snapshot
refetches, reconciliation). The store holds what those share for the life of a
process: the clients, the key prefix, the heartbeat TTL and reconcile interval, and one
set of metrics on the registry given (a registry refuses a second registration, and a
search server leads many terms).

Two clients, two roles (:mod:`discovery.livelist.redis.conn`): followers read with ``redis``,
publishers write with ``publish_redis`` (default: the same client), so a cluster can
give the search servers that never lead a Redis user that cannot write. A store built
with ``read_only=True`` has no publisher at all.

Clients passed in stay the caller's; :meth:`RedisLiveStore.from_config` opens its own,
which :meth:`RedisLiveStore.aclose` closes.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import redis.asyncio as aioredis
import redis.exceptions as redis_errors
from prometheus_client import CollectorRegistry

from discovery.config import ClusterConfig
from discovery.errors import ConfigError
from discovery.livelist.model import LiveList
from discovery.livelist.redis.conn import RedisRole, make_redis
from discovery.livelist.redis.layout import translate_redis_error
from discovery.metrics import LiveListMetrics, PublisherMetrics
from layout_v1.layout import V1Keys, parse_snapshot
from layout_v1.publisher import LivePublisherV1
from layout_v1.reader import LiveListReaderV1

__all__ = ["RedisLiveStoreV1"]


class RedisLiveStoreV1:
    """One cluster's live list in Redis (layout version 1).

    Args:
        redis: the reading client (followers, :meth:`read`).
        prefix: the key prefix, ``discovery:<cluster>``.
        publish_redis: the client publishers write with; default ``redis``.
        read_only: refuse :meth:`publisher` (a search server that never leads).
        heartbeat_ttl: TTL of ``P:leader`` in seconds; a leader beats well within it.
        reconcile_interval: how often a follower checks its version against the fence.
        registry: where the publisher's and followers' metrics go (a fresh one if None).
        clock: wall-clock seconds for ``published_at`` and the heartbeat's ``at``.
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        prefix: str,
        *,
        publish_redis: aioredis.Redis | None = None,
        read_only: bool = False,
        heartbeat_ttl: float = 5.0,
        reconcile_interval: float = 30.0,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.keys = V1Keys(prefix)
        if not heartbeat_ttl > 0:
            raise ValueError(f"heartbeat_ttl must be positive, got {heartbeat_ttl!r}")
        if not reconcile_interval > 0:
            raise ValueError(f"reconcile_interval must be positive, got {reconcile_interval!r}")
        self._redis = redis
        self._publish_redis = (
            None if read_only else (publish_redis if publish_redis is not None else redis)
        )
        self._heartbeat_ttl = heartbeat_ttl
        self._reconcile_interval = reconcile_interval
        self._clock = clock
        registry = registry if registry is not None else CollectorRegistry()
        self._follower_metrics = LiveListMetrics(registry)
        self._publisher_metrics = None if read_only else PublisherMetrics(registry)
        self._owned: list[aioredis.Redis] = []

    @classmethod
    def from_config(
        cls,
        cluster: ClusterConfig,
        *,
        read_only: bool = False,
        heartbeat_ttl: float = 5.0,
        reconcile_interval: float = 30.0,
        registry: CollectorRegistry | None = None,
        socket_timeout: float = 2.0,
    ) -> RedisLiveStoreV1:
        """A store on clients of its own for ``cluster`` (closed by :meth:`aclose`).

        Followers read with the reading credentials; publishers write with the
        publishing ones (:class:`~discovery.config.RedisConfig`). Nothing connects yet:
        a Redis that is down now is no error here (followers keep trying).
        """

        def client(role: RedisRole) -> aioredis.Redis:
            return make_redis(
                cluster,
                role=role,
                socket_timeout=socket_timeout,
                socket_connect_timeout=socket_timeout,
            )

        redis = client(RedisRole.READ)
        publish_redis = None if read_only else client(RedisRole.PUBLISH)
        store = cls(
            redis,
            f"discovery:{cluster.cluster}",
            publish_redis=publish_redis,
            read_only=read_only,
            heartbeat_ttl=heartbeat_ttl,
            reconcile_interval=reconcile_interval,
            registry=registry,
        )
        store._owned = [redis] if publish_redis is None else [redis, publish_redis]
        return store

    @property
    def prefix(self) -> str:
        return self.keys.prefix

    def publisher(self, *, leader_id: str, epoch: int) -> LivePublisherV1:
        """A fenced :class:`~discovery.livelist.redis.LivePublisher` for one term.

        Raises:
            ConfigError: the store is read-only.
        """
        if self._publish_redis is None or self._publisher_metrics is None:
            raise ConfigError(
                f"the live-list store {self.keys.prefix} is read-only: this server may not "
                "publish (it was started with --no-leader-eligible)"
            )
        return LivePublisherV1(
            self._publish_redis,
            self.keys.prefix,
            leader_id=leader_id,
            epoch=epoch,
            heartbeat_ttl=self._heartbeat_ttl,
            metrics=self._publisher_metrics,
            clock=self._clock,
        )

    async def read(self) -> LiveList | None:
        """``P:live`` now, decoded; None if absent. Skipped server entries are left out.

        Raises:
            RedisOperationError: Redis failed (:class:`RedisUnavailableError` if
                unreachable); :class:`~discovery.errors.RedisAccessError` if refused.
            MalformedLiveListError: ``P:live`` is not a snapshot of the layout.
        """
        try:
            raw = await self._redis.get(self.keys.live)
        except (redis_errors.RedisError, OSError) as exc:
            raise translate_redis_error(exc) from exc
        if raw is None:
            return None
        live, _skipped = parse_snapshot(raw)
        return live

    def follower(self) -> LiveListReaderV1:
        """A new :class:`~discovery.livelist.redis.LiveListReader` (start it, or ``async with``)."""
        return LiveListReaderV1(
            self._redis,
            self.keys.prefix,
            reconcile_interval=self._reconcile_interval,
            metrics=self._follower_metrics,
        )

    async def aclose(self) -> None:
        """Close the clients this store opened (:meth:`from_config`); idempotent."""
        owned, self._owned = self._owned, []
        for client in owned:
            with contextlib.suppress(redis_errors.RedisError, OSError):
                await client.aclose()

    async def __aenter__(self) -> RedisLiveStoreV1:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
