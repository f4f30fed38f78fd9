"""Reading and repairing the live list's fence in Redis (layout 2).

:func:`repair_fence` (``discovery fence repair``) resets a fence poisoned by an epoch no
leader can hold, in one compare-and-set Lua script (:data:`REPAIR_SCRIPT`), and moves the
fence generation on, which releases every pinned reader; ``P:servers`` is left as it is.

Design: docs/design/live-list.md, "Election and publishing" (a poisoned fence).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final

import redis.asyncio as aioredis
import redis.exceptions as redis_errors

from discovery.errors import MalformedLiveListError, RedisOperationError
from discovery.livelist.admin import Repaired, StoredFence
from discovery.livelist.redis.layout import (
    MAX_NUMBER,
    RedisKeys,
    parse_meta,
    parse_number,
    reply_text,
    translate_redis_error,
)
from discovery.livelist.redis.publisher import DEFAULT_STREAM_LENGTH

__all__ = [
    "REPAIR_SCRIPT",
    "Repaired",
    "StoredFence",
    "next_generation",
    "read_fence",
    "repair_fence",
]

REPAIR_SCRIPT: Final = """
-- Repair of the live list's fence (discovery/livelist/redis/fence.py).
-- KEYS: 1 servers, 2 meta, 3 changes
-- ARGV: 1..3 the epoch, version and fence read by the check ('' for absent),
--       4 new epoch, 5 new fence generation, 6 leader text, 7 published_at (ms),
--       8 stream MAXLEN
-- Returns {'repaired', count} or {'changed', epoch, version, fence} (nothing written).
local m = redis.call('HMGET', KEYS[2], 'epoch', 'version', 'fence')
local found = {m[1] or '', m[2] or '', m[3] or ''}
if found[1] ~= ARGV[1] or found[2] ~= ARGV[2] or found[3] ~= ARGV[3] then
  return {'changed', found[1], found[2], found[3]}
end
local count = redis.call('HLEN', KEYS[1])
redis.call('HDEL', KEYS[2], 'writer')
redis.call('HSET', KEYS[2], 'epoch', ARGV[4], 'version', '1', 'leader', ARGV[6],
           'published_at', ARGV[7], 'count', count, 'fence', ARGV[5])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[8], '*',
           'epoch', ARGV[4], 'version', '1', 'prev', '0', 'kind', 'full',
           'leader', ARGV[6], 'published_at', ARGV[7],
           'upserts', '[]', 'removes', '[]', 'fence', ARGV[5])
return {'repaired', count}
"""
"""The Lua script of :func:`repair_fence` (see the module docstring)."""


def _raw(value: object) -> bytes | None:
    if value is None:
        return None
    return value if isinstance(value, bytes) else str(value).encode()


async def read_fence(redis: aioredis.Redis, keys: RedisKeys) -> StoredFence:
    """Read and decode ``P:meta`` (read-only: the reading role may do it).

    Raises:
        RedisOperationError, RedisAccessError: Redis failed or refused.
    """
    try:
        fields = await redis.hgetall(keys.meta)
    except (redis_errors.RedisError, OSError) as exc:
        raise translate_redis_error(exc) from exc

    def field(name: str) -> bytes | None:
        value = fields.get(name.encode(), fields.get(name))
        return _raw(value)

    raw = (field("epoch"), field("version"), field("fence"))
    try:
        return StoredFence(raw, parse_meta(fields))
    except MalformedLiveListError as exc:
        return StoredFence(raw, None, str(exc), _generation(raw[2]))


def _generation(raw: bytes | None) -> int:
    # The generation beside a malformed record, if it is readable itself (else 0).
    try:
        return 0 if raw is None else parse_number(raw, "fence")
    except MalformedLiveListError:
        return 0


def next_generation(stored: StoredFence) -> int:
    """The generation a repair writes: one above the stored one (1 from an absent or
    unreadable one; readers compare generations for difference, so wrapping at the
    bound is harmless)."""
    generation = stored.generation + 1
    return generation if generation <= MAX_NUMBER else 1


async def repair_fence(
    redis: aioredis.Redis,
    keys: RedisKeys,
    stored: StoredFence,
    *,
    epoch: int,
    by: str,
    stream_length: int = DEFAULT_STREAM_LENGTH,
    clock: Callable[[], float] = time.time,
) -> Repaired | None:
    """Reset the fence to ``epoch`` (version 1) with a new generation, atomically, if
    ``P:meta`` still holds what ``stored`` read; None if it changed meanwhile (nothing
    was written: check again). ``by`` names who repaired, in ``P:meta``'s ``leader``.

    ``redis`` must have the publishing role's permissions (EVALSHA, and HMGET, HLEN,
    HDEL, HSET, XADD in the script).

    Raises:
        ValueError: ``epoch`` is not a number of the layout.
        RedisOperationError, RedisAccessError: Redis failed or refused.
    """
    if isinstance(epoch, bool) or not 0 <= epoch <= MAX_NUMBER:
        raise ValueError(f"epoch must be in 0..{MAX_NUMBER}, got {epoch!r}")
    generation = next_generation(stored)
    args: list[Any] = [
        *(value or b"" for value in stored.raw),
        str(epoch),
        str(generation),
        f"discovery fence repair ({by})",
        str(int(clock() * 1000)),
        str(stream_length),
    ]
    script = redis.register_script(REPAIR_SCRIPT)
    try:
        reply = await script(keys=[keys.servers, keys.meta, keys.changes], args=args)
    except (redis_errors.RedisError, OSError) as exc:
        raise translate_redis_error(exc) from exc
    if not isinstance(reply, list) or not reply:
        raise RedisOperationError(f"unexpected reply from the repair script: {reply!r}")
    status = reply_text(reply[0])
    if status == "changed":
        return None
    if status != "repaired" or len(reply) < 2 or not isinstance(reply[1], int):
        raise RedisOperationError(f"unexpected reply from the repair script: {reply!r}")
    return Repaired(epoch, generation, reply[1])
