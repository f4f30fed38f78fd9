"""The default live-list store: :class:`RedisLiveStore`, Redis in layout 2.

It holds what its publishers and followers share for the life of a process (clients, key
prefix, settings, metrics). Clients passed in stay the caller's;
:meth:`RedisLiveStore.from_config` opens its own, which :meth:`RedisLiveStore.aclose` closes.

Design: docs/design/live-list.md, "The live-list store".
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import redis.asyncio as aioredis
import redis.exceptions as redis_errors
from prometheus_client import CollectorRegistry
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from discovery.config import ClusterConfig
from discovery.errors import ConfigError
from discovery.livelist.model import LiveList
from discovery.livelist.redis.admin import RedisAdmin
from discovery.livelist.redis.conn import RedisRole, make_redis
from discovery.livelist.redis.follower import LiveListReader
from discovery.livelist.redis.layout import RedisKeys, load, translate_redis_error
from discovery.livelist.redis.publisher import DEFAULT_STREAM_LENGTH, LivePublisher
from discovery.metrics import LiveListMetrics, PublisherMetrics

__all__ = ["RedisLiveStore"]


class RedisLiveStore:
    """One cluster's live list in Redis (layout 2).

    Args:
        redis: the reading client (followers, :meth:`read`).
        prefix: the key prefix, ``discovery:{<cluster>}``.
        publish_redis: the client publishers write with; default ``redis``.
        read_only: refuse :meth:`publisher` (a search server that never leads).
        heartbeat_ttl: TTL of ``P:leader`` in seconds; a leader beats well within it.
        reconcile_interval: how long a follower that heard nothing waits before it
            checks its version against ``P:meta``.
        stream_length: ``MAXLEN ~`` of the change stream.
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
        reconcile_interval: float = 5.0,
        stream_length: int = DEFAULT_STREAM_LENGTH,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.keys = RedisKeys(prefix)
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
        self._stream_length = stream_length
        self._clock = clock
        registry = registry if registry is not None else CollectorRegistry()
        self._follower_metrics = LiveListMetrics(registry)
        self._publisher_metrics = None if read_only else PublisherMetrics(registry)
        self._owned: list[aioredis.Redis] = []
        self._admin = RedisAdmin(
            redis,
            self.keys,
            publish_redis=self._publish_redis,
            stream_length=stream_length,
            clock=clock,
        )

    @classmethod
    def from_config(
        cls,
        cluster: ClusterConfig,
        *,
        read_only: bool = False,
        heartbeat_ttl: float = 5.0,
        reconcile_interval: float = 5.0,
        stream_length: int = DEFAULT_STREAM_LENGTH,
        registry: CollectorRegistry | None = None,
        socket_timeout: float = 2.0,
        retry: bool = True,
    ) -> RedisLiveStore:
        """A store on clients of its own for ``cluster`` (closed by :meth:`aclose`).

        Followers read with the reading credentials; publishers write with the
        publishing ones (:class:`~discovery.config.RedisConfig`). Nothing connects yet:
        a Redis that is down now is no error here (followers keep trying).
        ``socket_timeout`` bounds connecting and each reply; ``retry=False`` makes a
        failed command fail at once, without the clients' one quick retry (an
        operator's command answers now or says it cannot).
        """
        options: dict[str, object] = {} if retry else {"retry": Retry(NoBackoff(), 0)}

        def client(role: RedisRole) -> aioredis.Redis:
            return make_redis(
                cluster,
                role=role,
                socket_timeout=socket_timeout,
                socket_connect_timeout=socket_timeout,
                **options,
            )

        redis = client(RedisRole.READ)
        publish_redis = None if read_only else client(RedisRole.PUBLISH)
        store = cls(
            redis,
            cluster.redis_prefix,
            publish_redis=publish_redis,
            read_only=read_only,
            heartbeat_ttl=heartbeat_ttl,
            reconcile_interval=reconcile_interval,
            stream_length=stream_length,
            registry=registry,
        )
        store._owned = [redis] if publish_redis is None else [redis, publish_redis]
        return store

    @property
    def prefix(self) -> str:
        return self.keys.prefix

    @property
    def admin(self) -> RedisAdmin:
        """Operators' reads and the fence's repair (with the publishing client)."""
        return self._admin

    def publisher(self, *, leader_id: str, epoch: int) -> LivePublisher:
        """A fenced :class:`~discovery.livelist.redis.LivePublisher` for one term.

        Raises:
            ConfigError: the store is read-only.
        """
        if self._publish_redis is None or self._publisher_metrics is None:
            raise ConfigError(
                f"the live-list store {self.keys.prefix} is read-only: this server may not "
                "publish (it was started with --no-leader-eligible)"
            )
        return LivePublisher(
            self._publish_redis,
            self.keys.prefix,
            leader_id=leader_id,
            epoch=epoch,
            heartbeat_ttl=self._heartbeat_ttl,
            stream_length=self._stream_length,
            metrics=self._publisher_metrics,
            clock=self._clock,
        )

    async def read(self) -> LiveList | None:
        """The stored list now, loaded consistently; None if nothing is published.
        Server entries that cannot be decoded are left out.

        Raises:
            RedisOperationError: Redis failed (:class:`RedisUnavailableError` if
                unreachable); :class:`~discovery.errors.RedisAccessError` if refused.
            MalformedLiveListError: ``P:meta`` is not a meta record of the layout.
        """
        try:
            loaded = await load(self._redis, self.keys)
        except (redis_errors.RedisError, OSError) as exc:
            raise translate_redis_error(exc) from exc
        meta = loaded.meta
        if meta is None:
            return None
        return LiveList(meta.epoch, meta.version, meta.leader, meta.published_at, loaded.servers)

    def follower(self) -> LiveListReader:
        """A new :class:`~discovery.livelist.redis.LiveListReader` (start it, or ``async with``)."""
        return LiveListReader(
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

    async def __aenter__(self) -> RedisLiveStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
