"""The leader's fenced writes of the live list in layout 1 (the benchmarks' baseline).

Only the elected leader runs a :class:`LivePublisher`, obtained for its term from
:meth:`layout_v1.store.RedisLiveStoreV1.publisher`. The keys and documents it writes
(``P:live``, ``P:events``, ``P:leader`` and the internal ``P:fence``) are the contract
in :mod:`layout_v1.layout`; this module is how they are written. ``P:fence``'s
``writer`` is a random token of one publisher object, which makes a retried write
recognisable as our own.

Fencing. Every write (snapshot + fence + heartbeat + event, or a heartbeat alone)
is one Lua script (:data:`FENCE_SCRIPT`, run with EVALSHA through
``register_script``, so it is loaded again after a Redis restart), hence atomic:

* the stored fence is ``P:fence``; if that hash is missing or unusable and ``P:live``
  exists, the script falls back to ``cjson.decode(P:live)``; if neither gives a
  number pair, nothing is stored and any write is accepted;
* a write with an epoch lower than the stored one is refused (``epoch`` fence);
* a publish in the stored epoch with a version not above the stored one is refused
  (``version`` fence) — unless the stored fence is exactly this write (same epoch,
  version and writer token): that is our own write being retried (redis-py retries a
  command whose reply was lost), reported as published without writing again;
* a heartbeat in the stored epoch is refused if the stored version is above ours,
  or equal but written by another publisher object;
* otherwise the write is applied and the event published, all in one step.

A refused write raises :class:`~discovery.errors.FencedError`: a newer leader has
published, so the caller must stop leading; this publisher then refuses every
further call without touching Redis.

Versions start at 1 with the first publish of a publisher (a new epoch) and each
publish *attempt* takes the next number, so a number is never reused: a write whose
outcome is unknown (connection lost, timeout, cancelled) may have been applied, and
reusing its version would fence ourselves. After such a failure the next
:meth:`LivePublisherV1.publish_change` is a full publish, because readers cannot know
which version a diff would follow. Keep one publisher object for the whole
leadership term: a second object in the same epoch starts at version 1 again and is
refused once the first has written.

Redis outages: connection errors and timeouts raise
:class:`~discovery.errors.RedisUnavailableError` (the redis-py error as
``__cause__``); nothing is retried here beyond the client's own retry policy.
Refused credentials or a missing ACL permission raise
:class:`~discovery.errors.RedisAccessError` (not a ``RedisOperationError``: retrying
cannot help; the leader gives up its term, see ``search_server.server``). The
leader keeps its view and publishes in full once :meth:`LivePublisherV1.heartbeat`
reports that ``P:live`` is missing (Redis restarted empty, FLUSHALL) or not ours.
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

from discovery.errors import FencedError, RedisOperationError
from discovery.instance import ServiceInstance
from discovery.livelist.redis.layout import encode_json, reply_text, translate_redis_error
from discovery.metrics import PublisherMetrics
from layout_v1.layout import V1Keys

__all__ = ["FENCE_SCRIPT", "HeartbeatStatus", "LivePublisherV1"]

log = logging.getLogger(__name__)

# Epochs (ZooKeeper zxids) and versions are Java longs. The script compares them as
# decimal strings, so every such value compares exactly, beyond Lua's 2**53.
_MAX_NUMBER: Final = 2**63 - 1

FENCE_SCRIPT: Final = """
-- Fenced write of the live list (see discovery/livelist/redis/publisher.py for the contract).
-- KEYS: 1 live, 2 fence, 3 leader
-- ARGV: 1 mode ('publish' | 'heartbeat'), 2 epoch, 3 version (decimal strings),
--       4 writer token, 5 leader id, 6 heartbeat document, 7 heartbeat TTL (ms);
--       publish only: 8 events channel, 9 snapshot document, 10 event document
-- Returns {status, detail, stored_epoch, stored_version[, receivers]}:
--   {'published', 'ok' | 'duplicate', E, V, receivers}   (publish applied / already ours)
--   {'fenced', 'epoch' | 'version', stored E, stored V}  (nothing written)
--   {'current' | 'missing' | 'stale', ..., stored E, stored V}  (heartbeat written)

-- Epochs and versions are compared as decimal strings (no leading zeros), so
-- 64-bit values compare exactly, beyond the 2^53 that Lua numbers hold.
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

local function digits(s)
  return type(s) == 'string' and string.match(s, '^%d+$') ~= nil
end

local function integral(n)
  if type(n) ~= 'number' or n ~= n or n < 0 or n >= 2^63 or n ~= math.floor(n) then
    return false
  end
  return string.format('%.0f', n)
end

local mode, epoch, version, writer = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
if (mode ~= 'publish' and mode ~= 'heartbeat') or not digits(epoch) or not digits(version) then
  return redis.error_reply('ERR live-list fence: bad arguments')
end

local stored_epoch, stored_version, stored_writer = false, false, false
local f = redis.call('HMGET', KEYS[2], 'epoch', 'version', 'writer')
if digits(f[1]) and digits(f[2]) then
  stored_epoch, stored_version, stored_writer = f[1], f[2], f[3]
else
  -- No fence of ours: P:live was written by something else (or by an older
  -- version of this code). Decoding it is slow for a big list but happens once.
  local raw = redis.call('GET', KEYS[1])
  if raw then
    local ok, doc = pcall(cjson.decode, raw)
    if ok and type(doc) == 'table' then
      local e, v = integral(doc['epoch']), integral(doc['version'])
      if e and v then stored_epoch, stored_version = e, v end
    end
  end
end

if stored_epoch then
  local ce = cmp(epoch, stored_epoch)
  if ce < 0 then return {'fenced', 'epoch', stored_epoch, stored_version} end
  if ce == 0 then
    local cv = cmp(version, stored_version)
    local ours = stored_writer == writer
    if mode == 'publish' then
      if cv == 0 and ours then
        return {'published', 'duplicate', stored_epoch, stored_version, 0}
      end
      if cv <= 0 then return {'fenced', 'version', stored_epoch, stored_version} end
    elseif cv < 0 or (cv == 0 and stored_writer and not ours) then
      return {'fenced', 'version', stored_epoch, stored_version}
    end
  end
end

if mode == 'publish' then
  redis.call('SET', KEYS[1], ARGV[9])
  redis.call('HSET', KEYS[2], 'epoch', epoch, 'version', version, 'writer', writer,
             'leader', ARGV[5])
  redis.call('SET', KEYS[3], ARGV[6], 'PX', ARGV[7])
  local receivers = redis.call('PUBLISH', ARGV[8], ARGV[10])
  return {'published', 'ok', epoch, version, receivers}
end

redis.call('SET', KEYS[3], ARGV[6], 'PX', ARGV[7])
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {'missing', 'live', stored_epoch, stored_version}
end
if stored_epoch and cmp(epoch, stored_epoch) == 0 and cmp(version, stored_version) == 0
    and stored_writer == writer then
  return {'current', 'ok', stored_epoch, stored_version}
end
return {'stale', 'live', stored_epoch, stored_version}
"""
"""The Lua script behind every write; its semantics are in the module docstring."""


class HeartbeatStatus(StrEnum):
    """What a heartbeat found in ``P:live`` (:attr:`LivePublisherV1.last_heartbeat`)."""

    CURRENT = "current"
    """``P:live`` holds this publisher's last snapshot."""
    MISSING = "missing"
    """``P:live`` does not exist (Redis restarted empty, FLUSHALL, key deleted)."""
    STALE = "stale"
    """``P:live`` exists but is not this publisher's last snapshot (an older epoch before
    our first publish, a write whose outcome was unknown, a restore from an old dump)."""


def _number(value: object) -> int:
    # Stored fence values come back as bytes or str (decode_responses), or nil.
    if value is None:
        return 0
    try:
        return int(reply_text(value))
    except ValueError:
        return 0


def _check_number(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= _MAX_NUMBER:
        raise ValueError(f"{name} must be an integer in {low}..{_MAX_NUMBER}, got {value!r}")
    return value


class LivePublisherV1:
    """Fenced writer of one cluster's live list, for the leader of one epoch.

    ``epoch`` is the leader's ZooKeeper-issued monotonic number (the czxid of its
    election node); ``leader_id`` names it in every document. ``heartbeat_ttl`` is
    the TTL of ``P:leader`` in seconds: call :meth:`heartbeat` well within it (every
    ttl/3, say). ``clock`` gives wall-clock seconds for the ``published_at`` and
    ``at`` stamps. Metrics go to ``metrics`` if given (shared across terms), else to a
    new :class:`~discovery.metrics.PublisherMetrics` on ``registry``.

    Calls are serialised (a lock), so concurrent callers cannot interleave versions.
    Errors: :class:`FencedError` (deposed; stop leading), :class:`RedisUnavailableError`
    (Redis unreachable; keep the view and retry later), :class:`RedisOperationError`
    (an unexpected error reply), :class:`~discovery.errors.RedisAccessError` (our
    credentials or ACL do not allow publishing; retrying cannot help).
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        prefix: str,
        *,
        leader_id: str,
        epoch: int,
        heartbeat_ttl: float = 5.0,
        registry: CollectorRegistry | None = None,
        metrics: PublisherMetrics | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not isinstance(leader_id, str) or not leader_id:
            raise ValueError(f"leader_id must be a non-empty string, got {leader_id!r}")
        if not heartbeat_ttl > 0:
            raise ValueError(f"heartbeat_ttl must be positive, got {heartbeat_ttl!r}")
        self._redis = redis
        self.keys = V1Keys(prefix)
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
        # restart (which forgets loaded scripts) costs one extra round trip.
        self._script = redis.register_script(FENCE_SCRIPT)
        # Distinguishes our own retried write from another publisher of the same epoch.
        self._writer = uuid.uuid4().hex
        self._attempted = 0  # the highest version tried; never reused
        self._version = 0  # the last version known to be written
        # The servers of the last snapshot known to be written; None when a diff cannot
        # be trusted to follow what readers hold (nothing published yet, or the outcome
        # of the last write is unknown).
        self._published: dict[str, ServiceInstance] | None = None
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
        """Write ``servers`` as the next version with a ``full`` event; return the version.

        Raises:
            FencedError: a newer epoch or version is stored; nothing was written.
            RedisUnavailableError: Redis unreachable; the write may or may not be applied.
            ValueError: a key of ``servers`` is not its instance's id.
        """
        async with self._lock:
            return await self._publish(_index(servers), None)

    async def publish_change(
        self,
        servers: Mapping[str, ServiceInstance],
        *,
        added: Mapping[str, ServiceInstance],
        changed: Mapping[str, ServiceInstance],
        removed: Mapping[str, str],
    ) -> int:
        """Write ``servers`` (the whole view after the change) with a diff event.

        The event's ``prev_version`` is the last version this publisher wrote. Its
        lists are the exact difference between that snapshot and ``servers``, so a
        reader applying it always ends at the snapshot: ``added`` and ``changed``
        are checked against it (a disagreement, a bug in the caller, is logged and the
        computed diff wins), and ``removed`` gives each removed id its reason (ids
        without one get ``"unknown"``). Without a trusted previous snapshot (first
        publish of this publisher, or the last write's outcome is unknown) this is a
        full publish instead. Returns the version; raises like :meth:`publish_full`.
        """
        async with self._lock:
            new = _index(servers)
            old = self._published
            if old is None:
                return await self._publish(new, None)
            diff_added = {k: v for k, v in new.items() if k not in old}
            diff_changed = {k: v for k, v in new.items() if k in old and old[k] != v}
            diff_removed = sorted(k for k in old if k not in new)
            if (
                set(added) != set(diff_added)
                or not set(diff_changed) <= set(changed)
                or not set(changed) <= set(new)
                or set(removed) != set(diff_removed)
            ):
                log.warning(
                    "diff given for epoch %d after version %d disagrees with the snapshots "
                    "(given +%d ~%d -%d, actual +%d ~%d -%d); publishing the actual diff",
                    self._epoch,
                    self._version,
                    len(added),
                    len(changed),
                    len(removed),
                    len(diff_added),
                    len(diff_changed),
                    len(diff_removed),
                )
            reasons = {k: str(removed.get(k, "unknown")) for k in diff_removed}
            return await self._publish(new, (diff_added, diff_changed, reasons))

    async def heartbeat(self) -> bool:
        """Refresh ``P:leader`` (fenced by our epoch); say whether ``P:live`` is ours.

        Returns True if ``P:live`` holds this publisher's last snapshot, False if it is
        missing (Redis restarted empty, FLUSHALL) or holds something else (nothing
        published yet in this epoch, a write whose outcome was unknown, an old dump
        restored): the caller then calls :meth:`publish_full`. :attr:`last_heartbeat`
        tells which.

        Raises:
            FencedError: a newer epoch (or a newer version of our epoch) is stored.
            RedisUnavailableError: Redis unreachable.
        """
        async with self._lock:
            self._check_not_fenced("heartbeat", self._attempted)
            now_ms = self._now_ms()
            heartbeat = encode_json(
                {
                    "leader": self._leader_id,
                    "epoch": self._epoch,
                    "version": self._version,
                    "at": now_ms,
                }
            )
            reply = await self._run(
                "heartbeat",
                self._attempted,
                [
                    "heartbeat",
                    str(self._epoch),
                    str(self._attempted),
                    self._writer,
                    self._leader_id,
                    heartbeat,
                    str(self._ttl_ms),
                ],
            )
            try:
                status = HeartbeatStatus(reply_text(reply[0]))
            except ValueError:
                self._metrics.publishes.labels(kind="heartbeat", result="error").inc()
                raise RedisOperationError(
                    f"unexpected reply from the fence script: {reply!r}"
                ) from None
            self._metrics.publishes.labels(kind="heartbeat", result="ok").inc()
            if status != self._last_heartbeat and status != HeartbeatStatus.CURRENT:
                log.warning(
                    "%s is %s (epoch %d, our version %d): a full publish is needed",
                    self.keys.live,
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

    async def _publish(
        self,
        servers: dict[str, ServiceInstance],
        diff: tuple[dict[str, ServiceInstance], dict[str, ServiceInstance], dict[str, str]] | None,
    ) -> int:
        kind = "full" if diff is None else "diff"
        self._check_not_fenced(kind, self._attempted + 1)
        version = self._attempted + 1
        self._attempted = version
        now_ms = self._now_ms()
        ordered = [servers[k].to_dict() for k in sorted(servers)]
        snapshot = encode_json(
            {
                "epoch": self._epoch,
                "version": version,
                "leader": self._leader_id,
                "published_at": now_ms,
                "servers": ordered,
            }
        )
        event: dict[str, Any] = {
            "epoch": self._epoch,
            "version": version,
            "prev_version": None if diff is None else self._version,
            "leader": self._leader_id,
            "published_at": now_ms,
            "full": diff is None,
            "added": [],
            "changed": [],
            "removed": [],
        }
        if diff is not None:
            added, changed, removed = diff
            event["added"] = [added[k].to_dict() for k in sorted(added)]
            event["changed"] = [changed[k].to_dict() for k in sorted(changed)]
            event["removed"] = [{"id": k, "reason": removed[k]} for k in sorted(removed)]
        heartbeat = encode_json(
            {"leader": self._leader_id, "epoch": self._epoch, "version": version, "at": now_ms}
        )
        # Until the reply says otherwise, readers may hold either the previous version or
        # this one, so no diff may follow: a failure or cancellation leaves it that way.
        self._published = None
        reply = await self._run(
            kind,
            version,
            [
                "publish",
                str(self._epoch),
                str(version),
                self._writer,
                self._leader_id,
                heartbeat,
                str(self._ttl_ms),
                self.keys.events,
                snapshot,
                encode_json(event),
            ],
        )
        if reply_text(reply[0]) != "published":
            self._metrics.publishes.labels(kind=kind, result="error").inc()
            raise RedisOperationError(f"unexpected reply from the fence script: {reply!r}")
        self._version = version
        self._published = servers
        self._metrics.publishes.labels(kind=kind, result="ok").inc()
        self._metrics.version.set(version)
        self._metrics.snapshot_bytes.set(len(snapshot))
        self._metrics.servers.set(len(servers))
        log.debug(
            "published %s epoch %d version %d: %d servers, %d bytes%s",
            kind,
            self._epoch,
            version,
            len(servers),
            len(snapshot),
            " (retried write)" if reply_text(reply[1]) == "duplicate" else "",
        )
        return version

    async def _run(self, kind: str, version: int, args: list[str | bytes]) -> list[Any]:
        """Run the fence script; raise FencedError or a translated Redis error."""
        started = time.perf_counter()
        try:
            reply = await self._script(
                keys=[self.keys.live, self.keys.fence, self.keys.leader], args=args
            )
        except (redis_errors.RedisError, OSError) as exc:
            self._metrics.publishes.labels(kind=kind, result="error").inc()
            error = translate_redis_error(exc)
            log.warning("%s write of epoch %d failed: %s", kind, self._epoch, error)
            raise error from exc
        finally:
            self._metrics.publish_seconds.labels(kind=kind).observe(time.perf_counter() - started)
        if not isinstance(reply, list) or len(reply) < 4:
            self._metrics.publishes.labels(kind=kind, result="error").inc()
            raise RedisOperationError(f"unexpected reply from the fence script: {reply!r}")
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
            log.error("%s: %s", self.keys.live, fenced)
            raise fenced
        return reply


def _index(servers: Mapping[str, ServiceInstance]) -> dict[str, ServiceInstance]:
    out: dict[str, ServiceInstance] = {}
    for key, instance in servers.items():
        if not isinstance(instance, ServiceInstance):
            raise TypeError(f"servers[{key!r}] is not a ServiceInstance: {instance!r}")
        if key != instance.id:
            raise ValueError(f"servers[{key!r}] holds the instance {instance.id!r}")
        out[key] = instance
    return out
