"""Operators' access to the live list in Redis: :class:`RedisAdmin`, the Redis store's admin.

It reads the published list with the heartbeat in one MULTI/EXEC, the fence and the
change stream, through the contract module :mod:`discovery.livelist.redis.layout`.

Contract: docs/contracts.md, "Redis".
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Final

import redis.asyncio as aioredis
import redis.exceptions as redis_errors

from discovery.errors import ConfigError, MalformedLiveListError
from discovery.livelist.admin import (
    ChangeNotice,
    Heartbeat,
    Published,
    RecordNames,
    Repaired,
    StoredFence,
)
from discovery.livelist.model import LiveList
from discovery.livelist.redis.conn import describe_redis
from discovery.livelist.redis.fence import read_fence, repair_fence
from discovery.livelist.redis.layout import (
    RedisKeys,
    parse_change,
    parse_heartbeat,
    parse_meta,
    parse_servers,
    reply_text,
    translate_redis_error,
)
from discovery.livelist.redis.publisher import DEFAULT_STREAM_LENGTH

__all__ = ["RedisAdmin"]

log = logging.getLogger(__name__)

# What a read of the stream may fail with while Redis is down or failing over.
_FOLLOW_FAILURES: Final = (redis_errors.RedisError, OSError, TimeoutError)


class RedisAdmin:
    """Read the live list of ``keys`` with ``redis`` (the reading role); repair its fence
    with ``publish_redis`` (the publishing role; None: the store is read-only).
    ``stream_length`` and ``clock`` (wall seconds) are the repair's, as the publisher's.
    The clients are the store's; this never closes them."""

    def __init__(
        self,
        redis: aioredis.Redis,
        keys: RedisKeys,
        *,
        publish_redis: aioredis.Redis | None,
        stream_length: int = DEFAULT_STREAM_LENGTH,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._redis = redis
        self._publish_redis = publish_redis
        self._keys = keys
        self._stream_length = stream_length
        self._clock = clock

    @property
    def backend(self) -> str:
        return "Redis"

    @property
    def prefix(self) -> str:
        return self._keys.prefix

    @property
    def names(self) -> RecordNames:
        keys = self._keys
        return RecordNames(keys.meta, keys.servers, keys.changes, keys.leader)

    def where(self) -> str:
        return describe_redis(self._redis)

    async def ping(self) -> None:
        """PING with the reading credentials.

        Raises:
            RedisOperationError: Redis failed (:class:`~discovery.errors.RedisUnavailableError`
                if unreachable); :class:`~discovery.errors.RedisAccessError` if refused.
        """
        try:
            await self._redis.ping()
        except Exception as exc:
            # Whatever failed is reported as Redis's: refused credentials must say so
            # (an operator's exit status 4), not pass for an outage.
            raise translate_redis_error(exc) from exc

    async def read_published(self) -> tuple[Heartbeat | None, Published]:
        """``P:meta``, ``P:servers``, ``P:leader`` and its TTL in one MULTI/EXEC.

        Raises:
            RedisOperationError: Redis failed (:class:`~discovery.errors.RedisUnavailableError`
                if unreachable); :class:`~discovery.errors.RedisAccessError` if refused.
        """
        keys = self._keys
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.hgetall(keys.meta)
                pipe.hgetall(keys.servers)
                pipe.get(keys.leader)
                pipe.pttl(keys.leader)
                meta_fields, server_fields, raw_leader, ttl_ms = await pipe.execute()
        except (redis_errors.RedisError, OSError) as exc:
            raise translate_redis_error(exc) from exc
        heartbeat = None if raw_leader is None else parse_heartbeat(raw_leader, int(ttl_ms))
        return heartbeat, _published(meta_fields, server_fields)

    async def read_fence(self) -> StoredFence:
        """``P:meta`` decoded (:func:`~discovery.livelist.redis.fence.read_fence`)."""
        return await read_fence(self._redis, self._keys)

    async def repair_fence(self, stored: StoredFence, *, epoch: int, by: str) -> Repaired | None:
        """The repair script (:func:`~discovery.livelist.redis.fence.repair_fence`), with
        the publishing client.

        Raises:
            ConfigError: the store is read-only (no publishing client).
        """
        if self._publish_redis is None:
            raise ConfigError(f"the live-list store {self.prefix} is read-only: cannot repair")
        return await repair_fence(
            self._publish_redis,
            self._keys,
            stored,
            epoch=epoch,
            by=by,
            stream_length=self._stream_length,
            clock=self._clock,
        )

    async def publishes(
        self, *, retry_after: float = 0.2
    ) -> AsyncIterator[ChangeNotice | MalformedLiveListError]:
        """Each entry of ``P:changes`` appended from now on (``XREAD BLOCK``), in order."""
        stream = self._keys.changes
        last = "$"  # from now on; then from the last entry seen
        while True:
            try:
                while True:
                    reply: Any = await self._redis.xread({stream: last}, count=100, block=1000)
                    for _name, entries in reply or []:
                        for stream_id, fields in entries:
                            last = reply_text(stream_id)
                            try:
                                entry = parse_change(stream_id, fields)
                            except MalformedLiveListError as exc:
                                yield exc
                                continue
                            yield ChangeNotice(entry.epoch, entry.version, entry.leader, entry.kind)
            except _FOLLOW_FAILURES as exc:
                log.debug("following %s failed: %s", stream, exc)
            # Redis is down or failing over: try again shortly, from the last entry seen.
            await asyncio.sleep(retry_after)


def _published(meta_fields: Any, server_fields: Any) -> Published:
    try:
        meta = parse_meta(meta_fields)
    except MalformedLiveListError as exc:
        return Published(None, error=f"invalid: {exc}")
    if meta is None:
        return Published(None, error="missing")
    servers, problems = parse_servers(server_fields)
    live = LiveList(meta.epoch, meta.version, meta.leader, meta.published_at, servers)
    return Published(live, skipped=tuple(problems))
