"""The leader's fenced writes of the live list to Redis (layout 2): :class:`LivePublisher`.

Every write is one Lua script (:data:`PUBLISH_SCRIPT`); a change writes only what changed.
Errors: :class:`~discovery.errors.FencedError` once a newer leader has published (then on
every call, without asking Redis); :class:`~discovery.errors.RedisUnavailableError` for an
outage, a timeout, a read-only replica or a Sentinel without a primary (publish in full
later); :class:`~discovery.errors.RedisAccessError` when publishing is refused (retrying
cannot help).

Contract: docs/contracts.md, "Redis".
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import Any, Final

import redis.asyncio as aioredis
import redis.exceptions as redis_errors
from prometheus_client import CollectorRegistry

from discovery.errors import FencedError, MalformedLiveListError, RedisOperationError
from discovery.instance import ServiceInstance
from discovery.livelist.redis.layout import (
    MAX_NUMBER,
    RedisKeys,
    encode_json,
    parse_number,
    reply_text,
    translate_redis_error,
)
from discovery.metrics import PublisherMetrics

__all__ = ["DEFAULT_STREAM_LENGTH", "PUBLISH_SCRIPT", "HeartbeatStatus", "LivePublisher"]

log = logging.getLogger(__name__)

# Epochs (ZooKeeper zxids) and versions are Java longs. The script compares them as
# decimal strings, so every such value compares exactly, beyond Lua's 2**53.
_MAX_NUMBER: Final = MAX_NUMBER

DEFAULT_STREAM_LENGTH: Final = 10_000
"""``MAXLEN ~`` of ``P:changes``: a follower more than this many publishes behind
loads the whole list again (it sees the gap), so it bounds Redis's memory, not safety."""

# Lua's unpack() is limited by the C stack (LUAI_MAXCSTACK, 8000): fields are written
# in slices of this many.
_SLICE: Final = 2000

PUBLISH_SCRIPT: Final = """
-- Fenced write of the live list, layout 2 (see discovery/livelist/redis/publisher.py).
-- KEYS: 1 servers, 2 meta, 3 changes, 4 leader
-- ARGV: 1 mode ('full' | 'delta' | 'heartbeat'), 2 epoch, 3 version, 4 prev
--       (decimal strings), 5 writer token, 6 leader id, 7 published_at (ms),
--       8 heartbeat document, 9 heartbeat TTL (ms), 10 stream MAXLEN,
--       11 upserts JSON, 12 removes JSON, 13 number of upserted fields U,
--       14 .. 13+2U id/instance pairs, then the removed ids
-- Returns {status, detail, stored_epoch, stored_version}:
--   {'published', 'ok' | 'duplicate', E, V}            (written / already ours)
--   {'fenced', 'epoch' | 'version', stored E, stored V} (nothing written)
--   {'diverged', 'meta', stored E, stored V}           (delta refused; publish full)
--   {'current' | 'stale', ..., stored E, stored V}     (heartbeat written)
--   {'missing', 'meta', nil, nil}                       (no P:meta: nothing written)

-- Decimal strings without leading zeros compare exactly, beyond Lua's 2^53.
local function cmp(a, b)
  if #a ~= #b then
    if #a < #b then return -1 end
    return 1
  end
  for i = 1, #a do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then
      if x < y then return -1 end
      return 1
    end
  end
  return 0
end

-- A number of the layout: canonical decimal digits, 0 .. 2^63-1 (a Java long, as
-- ZooKeeper's zxids). Readers refuse anything else (discovery/livelist/redis/layout.py), and so
-- does the fence: a stored value that is no such number fences nobody.
local function number(s)
  if type(s) ~= 'string' then return false end
  if s == '0' then return true end
  return string.match(s, '^[1-9]%d*$') ~= nil and cmp(s, 'MAX_NUMBER') <= 0
end

-- Absent, or a number (published_at, count, fence may be absent).
local function optional(s)
  return s == false or number(s)
end

local mode, epoch, version, prev, writer = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
if (mode ~= 'full' and mode ~= 'delta' and mode ~= 'heartbeat')
    or not number(epoch) or not number(version) or not number(prev) then
  return redis.error_reply('ERR live-list fence: bad arguments')
end

local m = redis.call('HMGET', KEYS[2], 'epoch', 'version', 'writer', 'published_at',
                     'count', 'fence')
local stored_epoch, stored_version, stored_writer = false, false, false
if number(m[1]) and number(m[2]) then
  stored_epoch, stored_version, stored_writer = m[1], m[2], m[3]
end
local ours = stored_writer == writer
-- Readers refuse a meta record with any malformed number: it is not our last write,
-- whoever wrote it, and the next full publish rewrites every field.
local sound = optional(m[4]) and optional(m[5]) and optional(m[6])
-- The fence generation is changed only by `discovery fence repair`; every write keeps
-- it (a malformed one becomes 0) and stamps it on its stream entry.
local fence = '0'
if number(m[6]) then fence = m[6] end

if stored_epoch then
  local ce = cmp(epoch, stored_epoch)
  if ce < 0 then return {'fenced', 'epoch', stored_epoch, stored_version} end
  if ce == 0 then
    local cv = cmp(version, stored_version)
    if mode ~= 'heartbeat' then
      if cv == 0 and ours then
        return {'published', 'duplicate', stored_epoch, stored_version}
      end
      if cv <= 0 then return {'fenced', 'version', stored_epoch, stored_version} end
    elseif cv < 0 or (cv == 0 and stored_writer and not ours) then
      return {'fenced', 'version', stored_epoch, stored_version}
    end
  end
end

if mode == 'heartbeat' then
  if not stored_epoch then
    -- The store lost its data (FLUSHALL, an empty restart, a fresh primary): nothing
    -- fences this write. A heartbeat then writes nothing: the leader in office
    -- publishes in full (which writes P:leader too), and a deposed leader's heartbeat
    -- delivered late (a TCP retransmission after a partition heals) leaves no trace.
    return {'missing', 'meta', false, false}
  end
  redis.call('SET', KEYS[4], ARGV[8], 'PX', ARGV[9])
  if ours and sound and cmp(epoch, stored_epoch) == 0
      and cmp(version, stored_version) == 0 then
    return {'current', 'ok', stored_epoch, stored_version}
  end
  return {'stale', 'meta', stored_epoch, stored_version}
end

if mode == 'delta' then
  -- Only on top of exactly what this publisher wrote last; else P:servers is not
  -- what we think (lost writes after a failover, a restart, a hand edit).
  if not (stored_epoch and ours and cmp(epoch, stored_epoch) == 0
          and cmp(prev, stored_version) == 0) then
    return {'diverged', 'meta', stored_epoch, stored_version}
  end
else
  redis.call('DEL', KEYS[1])
end

local upserted = tonumber(ARGV[13])
local first, last = 14, 13 + 2 * upserted
local i = first
while i <= last do
  local j = math.min(i + SLICE - 1, last)
  redis.call('HSET', KEYS[1], unpack(ARGV, i, j))
  i = j + 1
end
i = last + 1
while i <= #ARGV do
  local j = math.min(i + SLICE - 1, #ARGV)
  redis.call('HDEL', KEYS[1], unpack(ARGV, i, j))
  i = j + 1
end

local count = redis.call('HLEN', KEYS[1])
redis.call('HSET', KEYS[2], 'epoch', epoch, 'version', version, 'leader', ARGV[6],
           'published_at', ARGV[7], 'count', count, 'writer', writer, 'fence', fence)
redis.call('SET', KEYS[4], ARGV[8], 'PX', ARGV[9])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[10], '*',
           'epoch', epoch, 'version', version, 'prev', prev, 'kind', mode,
           'leader', ARGV[6], 'published_at', ARGV[7],
           'upserts', ARGV[11], 'removes', ARGV[12], 'fence', fence)
return {'published', 'ok', epoch, version}
""".replace("SLICE", str(_SLICE)).replace("MAX_NUMBER", str(MAX_NUMBER))
"""The Lua script behind every write; its rules are in docs/contracts.md, "Redis"."""


class HeartbeatStatus(StrEnum):
    """What a heartbeat found in ``P:meta`` (:attr:`LivePublisher.last_heartbeat`)."""

    CURRENT = "current"
    """``P:meta`` is this publisher's last write."""
    MISSING = "missing"
    """``P:meta`` does not exist (Redis restarted empty, FLUSHALL, a fresh primary)."""
    STALE = "stale"
    """``P:meta`` is not this publisher's last write (nothing published yet in this
    epoch, a write whose outcome was unknown, a replica that missed our writes)."""


class _Diverged(Exception):
    """The script refused a delta: ``P:meta`` is not the version it follows."""


def _number(value: object) -> int:
    # Stored values come back as bytes or str (decode_responses), or nil (False); the
    # script returns only numbers of the layout, but a reply is checked all the same.
    if value is None or value is False:
        return 0
    try:
        return parse_number(value, "stored number")
    except MalformedLiveListError:
        return 0


def _check_number(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= _MAX_NUMBER:
        raise ValueError(f"{name} must be an integer in {low}..{_MAX_NUMBER}, got {value!r}")
    return value


class LivePublisher:
    """Fenced writer of one cluster's live list, for the leader of one epoch.

    ``epoch`` is the leader's ZooKeeper-issued monotonic number (the czxid of its
    election node); ``leader_id`` names it in every record. ``heartbeat_ttl`` is the
    TTL of ``P:leader`` in seconds: call :meth:`heartbeat` well within it.
    ``stream_length`` is the ``MAXLEN ~`` of ``P:changes``. ``clock`` gives wall-clock
    seconds for the ``published_at`` and ``at`` stamps. Metrics go to ``metrics`` if
    given (shared across terms), else to a new
    :class:`~discovery.metrics.PublisherMetrics` on ``registry``.

    Calls are serialised (a lock), so concurrent callers cannot interleave versions.
    Errors: see the module docstring.
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        prefix: str,
        *,
        leader_id: str,
        epoch: int,
        heartbeat_ttl: float = 5.0,
        stream_length: int = DEFAULT_STREAM_LENGTH,
        registry: CollectorRegistry | None = None,
        metrics: PublisherMetrics | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not isinstance(leader_id, str) or not leader_id:
            raise ValueError(f"leader_id must be a non-empty string, got {leader_id!r}")
        if not heartbeat_ttl > 0:
            raise ValueError(f"heartbeat_ttl must be positive, got {heartbeat_ttl!r}")
        self._stream_length = _check_number("stream_length", stream_length, 1)
        self._redis = redis
        self.keys = RedisKeys(prefix)
        self._leader_id = leader_id
        self._epoch = _check_number("epoch", epoch, 0)
        self._ttl_ms = max(1, round(heartbeat_ttl * 1000))
        self._clock = clock
        # ``metrics`` lets an owner that creates a publisher per term keep one set of
        # metrics on its registry (a registry refuses a second registration).
        self._metrics = metrics or PublisherMetrics(
            registry if registry is not None else CollectorRegistry()
        )
        self._metrics.epoch.set(self._epoch)
        # register_script runs EVALSHA and loads the script on NOSCRIPT, so a Redis
        # restart or a failover (which forget loaded scripts) costs one round trip.
        self._script = redis.register_script(PUBLISH_SCRIPT)
        # Distinguishes our own retried write from another publisher of the same epoch.
        self._writer = uuid.uuid4().hex
        self._attempted = 0  # the highest version tried; never reused
        self._version = 0  # the last version known to be written
        # False when a delta cannot be trusted to follow what Redis holds (nothing
        # published yet, or the outcome of the last write is unknown).
        self._trusted = False
        self._count = 0
        self._fenced: FencedError | None = None
        self._last_heartbeat: HeartbeatStatus | None = None
        self._lock = asyncio.Lock()

    # -- state -----------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def version(self) -> int:
        """The last version this publisher wrote (0 before its first publish)."""
        return self._version

    @property
    def leader_id(self) -> str:
        return self._leader_id

    @property
    def fenced(self) -> bool:
        """True once a write was refused; every further call raises :class:`FencedError`."""
        return self._fenced is not None

    @property
    def last_heartbeat(self) -> HeartbeatStatus | None:
        """What the last heartbeat found, None before the first."""
        return self._last_heartbeat

    # -- writes ------------------------------------------------------------------

    async def publish_full(self, servers: Mapping[str, ServiceInstance]) -> int:
        """Rewrite ``P:servers`` with ``servers`` as the next version; return it.

        Raises:
            FencedError: a newer epoch or version is stored; nothing was written.
            RedisUnavailableError: Redis unreachable; the write may or may not be applied.
            ValueError: a key of ``servers`` is not its instance's id.
        """
        async with self._lock:
            return await self._publish_full(servers)

    async def publish_change(
        self,
        servers: Mapping[str, ServiceInstance],
        *,
        added: Mapping[str, ServiceInstance],
        changed: Mapping[str, ServiceInstance],
        removed: Mapping[str, str],
    ) -> int:
        """Write the next version as a delta: only ``added``, ``changed`` and ``removed``.

        ``servers`` is the whole view after the change; it is written only if a delta
        cannot be (the first publish of this publisher, the last write's outcome is
        unknown, or ``P:meta`` shows Redis does not hold our last write). The caller
        computes the delta (the leader has it from ZooKeeper's events); it is trusted,
        not recomputed, which is what makes a change cost O(changed). ``removed``
        maps each removed id to its reason. Returns the version; raises like
        :meth:`publish_full`.
        """
        async with self._lock:
            if not self._trusted:
                return await self._publish_full(servers)
            upserts = {**added, **changed}
            _check_index(upserts)
            try:
                return await self._write(
                    "delta",
                    [(k, upserts[k]) for k in sorted(upserts)],
                    {k: str(removed[k]) for k in sorted(removed)},
                    count=len(servers),
                )
            except _Diverged:
                return await self._publish_full(servers)

    async def heartbeat(self) -> bool:
        """Refresh ``P:leader`` (fenced by our epoch); say whether ``P:meta`` is ours.

        Returns True if ``P:meta`` is this publisher's last write, False if it is
        missing (Redis restarted empty, FLUSHALL, a fresh primary: then nothing is
        written, since nothing in the store could fence us) or something else
        (nothing published yet in this epoch, a write whose outcome was unknown, a
        replica promoted without our last writes): the caller then calls
        :meth:`publish_full`. :attr:`last_heartbeat` tells which.

        Raises:
            FencedError: a newer epoch (or a newer version of our epoch) is stored.
            RedisUnavailableError: Redis unreachable.
        """
        async with self._lock:
            self._check_not_fenced("heartbeat", self._attempted)
            reply = await self._run(
                "heartbeat",
                self._attempted,
                self._arguments("heartbeat", self._attempted, 0, self._now_ms(), [], {}),
            )
            try:
                status = HeartbeatStatus(reply_text(reply[0]))
            except ValueError:
                self._metrics.publishes.labels(kind="heartbeat", result="error").inc()
                raise RedisOperationError(
                    f"unexpected reply from the publish script: {reply!r}"
                ) from None
            self._metrics.publishes.labels(kind="heartbeat", result="ok").inc()
            if status != HeartbeatStatus.CURRENT:
                self._trusted = False
                if status != self._last_heartbeat:
                    log.warning(
                        "%s is %s (epoch %d, our version %d): a full publish is needed",
                        self.keys.meta,
                        status.value,
                        self._epoch,
                        self._version,
                    )
            self._last_heartbeat = status
            return status == HeartbeatStatus.CURRENT

    # -- internals ---------------------------------------------------------------

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def _check_not_fenced(self, kind: str, version: int) -> None:
        # Refused locally, without a round trip: we know we were deposed.
        if self._fenced is not None:
            self._metrics.publishes.labels(kind=kind, result="fenced").inc()
            raise FencedError(
                epoch=self._epoch,
                version=version,
                stored_epoch=self._fenced.stored_epoch,
                stored_version=self._fenced.stored_version,
                reason=self._fenced.reason,
            )

    async def _publish_full(self, servers: Mapping[str, ServiceInstance]) -> int:
        _check_index(servers)
        try:
            return await self._write("full", sorted(servers.items()), {}, count=len(servers))
        except _Diverged:  # pragma: no cover - the script never answers so to a full
            raise RedisOperationError("the publish script refused a full publish") from None

    def _arguments(
        self,
        mode: str,
        version: int,
        prev: int,
        now_ms: int,
        upserts: list[tuple[str, bytes]],
        removes: Mapping[str, str],
    ) -> list[str | bytes]:
        heartbeat = encode_json(
            {"leader": self._leader_id, "epoch": self._epoch, "version": version, "at": now_ms}
        )
        if mode == "delta":
            # The instances' JSON is already encoded: the array is spliced, not re-encoded.
            upserts_json = b"[" + b",".join(raw for _, raw in upserts) + b"]"
            removes_json = encode_json([{"id": k, "reason": v} for k, v in removes.items()])
        else:
            upserts_json = removes_json = b"[]"
        args: list[str | bytes] = [
            mode,
            str(self._epoch),
            str(version),
            str(prev),
            self._writer,
            self._leader_id,
            str(now_ms),
            heartbeat,
            str(self._ttl_ms),
            str(self._stream_length),
            upserts_json,
            removes_json,
            str(len(upserts)),
        ]
        for instance_id, raw in upserts:
            args += (instance_id, raw)
        args.extend(removes)
        return args

    async def _write(
        self,
        mode: str,
        upserts: list[tuple[str, ServiceInstance]],
        removes: Mapping[str, str],
        *,
        count: int,
    ) -> int:
        self._check_not_fenced(mode, self._attempted + 1)
        version = self._attempted + 1
        self._attempted = version
        prev = self._version if mode == "delta" else 0
        encoded = [(k, instance.to_json()) for k, instance in upserts]
        args = self._arguments(mode, version, prev, self._now_ms(), encoded, removes)
        # Until the reply says otherwise, Redis may hold the previous version or this
        # one, so no delta may follow: a failure or cancellation leaves it that way.
        self._trusted = False
        reply = await self._run(mode, version, args)
        status = reply_text(reply[0])
        if status == "diverged":
            self._metrics.publishes.labels(kind=mode, result="diverged").inc()
            log.warning(
                "%s holds epoch %d version %d, not our version %d of epoch %d: Redis lost "
                "our writes (a failover, a restart); publishing the whole list",
                self.keys.meta,
                _number(reply[2]),
                _number(reply[3]),
                self._version,
                self._epoch,
            )
            raise _Diverged
        if status != "published":
            self._metrics.publishes.labels(kind=mode, result="error").inc()
            raise RedisOperationError(f"unexpected reply from the publish script: {reply!r}")
        self._version = version
        self._trusted = True
        self._count = count
        self._metrics.publishes.labels(kind=mode, result="ok").inc()
        self._metrics.version.set(version)
        written = sum(len(a) for a in args)
        self._metrics.snapshot_bytes.set(written)
        self._metrics.servers.set(count)
        log.debug(
            "published %s epoch %d version %d: %d servers, %d instances, %d bytes%s",
            mode,
            self._epoch,
            version,
            count,
            len(encoded),
            written,
            " (retried write)" if reply_text(reply[1]) == "duplicate" else "",
        )
        return version

    async def _run(self, kind: str, version: int, args: list[str | bytes]) -> list[Any]:
        """Run the publish script; raise FencedError or a translated Redis error."""
        started = time.perf_counter()
        try:
            reply = await self._script(keys=list(self.keys.all), args=args)
        except (redis_errors.RedisError, OSError) as exc:
            self._metrics.publishes.labels(kind=kind, result="error").inc()
            error = translate_redis_error(exc)
            # DEBUG: the caller decides what is news (the leader logs the first failure
            # of an outage, not each of its probes every 0.2 s).
            log.debug("%s write of epoch %d failed: %s", kind, self._epoch, error)
            raise error from exc
        finally:
            self._metrics.publish_seconds.labels(kind=kind).observe(time.perf_counter() - started)
        if not isinstance(reply, list) or len(reply) < 2:
            self._metrics.publishes.labels(kind=kind, result="error").inc()
            raise RedisOperationError(f"unexpected reply from the publish script: {reply!r}")
        if reply_text(reply[0]) == "fenced":
            fenced = FencedError(
                epoch=self._epoch,
                version=version,
                stored_epoch=_number(reply[2]),
                stored_version=_number(reply[3]),
                reason=reply_text(reply[1]),
            )
            self._fenced = fenced
            self._metrics.publishes.labels(kind=kind, result="fenced").inc()
            log.error("%s: %s", self.keys.meta, fenced)
            raise fenced
        return reply


def _check_index(servers: Mapping[str, ServiceInstance]) -> None:
    for key, instance in servers.items():
        if not isinstance(instance, ServiceInstance):
            raise TypeError(f"servers[{key!r}] is not a ServiceInstance: {instance!r}")
        if key != instance.id:
            raise ValueError(f"servers[{key!r}] holds the instance {instance.id!r}")
