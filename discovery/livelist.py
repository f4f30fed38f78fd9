"""The live list every search server routes with, read from Redis and kept current.

The leader writes the list with :class:`~discovery.publisher.LivePublisher` (the
layout is described there). A :class:`LiveListReader`:

1. subscribes to ``P:events`` and, once subscribed, fetches the snapshot ``P:live``
   (subscribing first means no event can fall between the fetch and the
   subscription);
2. applies each diff event whose ``prev_version`` is exactly our version in our
   epoch, in the order Redis delivers them (one task, so in version order);
3. fetches the snapshot again when that does not hold: a ``full`` event (new leader,
   resync, recovery after Redis lost its data), an event of a newer epoch, a gap (an
   event that does not follow our version: a message was lost), and after every
   (re)subscription, since events published while we were not subscribed are lost;
4. reconciles every ``reconcile_interval`` seconds: it reads the stored version
   cheaply from the fence hash ``P:fence`` and fetches the snapshot only if it
   differs from ours (a lost message and a quiet leader would otherwise leave us
   behind until the next change).

The list never moves backwards: a snapshot or event with a lower epoch, or the same
epoch and a lower version, than the list we hold is refused and counted, so the
leftovers of a deposed leader (or a snapshot written around the fence) cannot win.
Epochs are ZooKeeper zxids, monotonic for the life of the ZooKeeper ensemble.

Failure behaviour:

* Redis unreachable (at start or later): the last known list is kept and served
  (at start, the empty list); :attr:`LiveListReader.connected` is False, the subscriber
  reconnects with exponential backoff (0.1 s doubling to 5 s, with jitter, so a fleet
  of search servers does not reconnect in lock-step), and :meth:`LiveListReader.age`
  grows, so the caller can decide when a list is too old to trust. A silent dead
  connection is detected by a PING after 5 s without traffic.
* ``P:live`` missing (Redis restarted empty, FLUSHALL): the list we hold is kept;
  the leader's heartbeat notices and publishes in full, which brings a ``full`` event.
* A malformed snapshot or event is skipped, logged and counted
  (``discovery_livelist_malformed_total{kind}``); a malformed event that names a
  newer version causes a refetch. A malformed *server entry* in a snapshot is
  skipped alone (counted as ``server``): one entry a reader cannot decode must not
  freeze routing on an old list. Nothing malformed stops the reader.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, Final, NoReturn

import redis.asyncio as aioredis
import redis.exceptions as redis_errors
from prometheus_client import CollectorRegistry
from redis.asyncio.client import PubSub

from .errors import DiscoveryError, InvalidInstanceError
from .instance import ServiceInstance
from .metrics import LiveListMetrics
from .publisher import RedisKeys, translate_redis_error

__all__ = [
    "RECONNECT_BACKOFF_MAX",
    "LiveList",
    "LiveListReader",
    "MalformedLiveListError",
    "parse_snapshot",
]

log = logging.getLogger(__name__)

_BACKOFF_MIN: Final = 0.1
#: The longest pause between attempts to subscribe again while Redis is unreachable,
#: hence how long after Redis is back a reader may still go without changes. Short,
#: because those seconds are stale routing; jitter spreads a fleet's reconnects.
RECONNECT_BACKOFF_MAX: Final = 2.0
# How long get_message() waits before the listener checks its keepalive.
_POLL_INTERVAL: Final = 1.0
# A subscription silent this long is probed with a PING; no answer within the timeout
# means a dead connection (a crashed host sends no RST) and we reconnect.
_KEEPALIVE_INTERVAL: Final = 5.0
_KEEPALIVE_TIMEOUT: Final = 5.0
_SUBSCRIBE_TIMEOUT: Final = 10.0
_LOG_LIMIT: Final = 200

_RedisFailure = (redis_errors.RedisError, OSError)
_EMPTY_SERVERS: Mapping[str, ServiceInstance] = MappingProxyType({})


@dataclass(frozen=True)
class LiveList:
    """One version of the live list. ``servers`` maps ids to instances (read-only).

    ``published_at`` is the leader's wall clock in milliseconds. Draining and disabled
    servers are listed; :attr:`routable` gives the ones to send queries to.
    """

    epoch: int
    version: int
    leader: str
    published_at: int
    servers: Mapping[str, ServiceInstance] = field(
        default_factory=lambda: _EMPTY_SERVERS, hash=False
    )

    EMPTY: ClassVar[LiveList]
    """Nothing published yet: epoch 0, version 0, no servers."""

    def __post_init__(self) -> None:
        # A private read-only copy: the caller's mapping cannot change the list later.
        object.__setattr__(self, "servers", MappingProxyType(dict(self.servers)))

    @property
    def position(self) -> tuple[int, int]:
        """``(epoch, version)``: lists are ordered by it."""
        return (self.epoch, self.version)

    @property
    def routable(self) -> list[ServiceInstance]:
        """The servers to route to (enabled and serving), sorted by id."""
        return [self.servers[k] for k in sorted(self.servers) if self.servers[k].routable]


LiveList.EMPTY = LiveList(epoch=0, version=0, leader="", published_at=0)


class MalformedLiveListError(DiscoveryError):
    """A snapshot or event we cannot use; ``position`` if its epoch and version were readable."""

    def __init__(self, message: str, position: tuple[int, int] | None = None) -> None:
        super().__init__(message)
        self.position = position


@dataclass(frozen=True)
class _Event:
    epoch: int
    version: int
    prev_version: int | None
    leader: str
    published_at: int
    full: bool
    upserts: tuple[ServiceInstance, ...]
    removed: tuple[str, ...]


def _malformed(message: str, position: tuple[int, int] | None = None) -> NoReturn:
    raise MalformedLiveListError(message, position)


def _reject_constant(token: str) -> NoReturn:
    _malformed(f"{token} is not valid JSON")


def _decode(raw: bytes | str, what: str) -> dict[str, Any]:
    try:
        document = json.loads(raw, parse_constant=_reject_constant)
    except MalformedLiveListError:
        raise
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, bad UTF-8, too deep
        _malformed(f"{what} is not valid JSON: {exc}")
    if not isinstance(document, dict):
        _malformed(f"{what} is not a JSON object")
    return document


def _integer(document: Mapping[str, Any], key: str, what: str, low: int = 0) -> int:
    value = document.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        _malformed(f"{what}: {key} must be an integer >= {low}, got {_short(value)}")
    return value


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _LOG_LIMIT else text[: _LOG_LIMIT - 3] + "..."


def parse_snapshot(raw: bytes | str) -> tuple[LiveList, list[str]]:
    """Decode ``P:live``; returns the list and the problems of skipped server entries."""
    document = _decode(raw, "snapshot")
    epoch = _integer(document, "epoch", "snapshot")
    version = _integer(document, "version", "snapshot")
    position = (epoch, version)
    leader = document.get("leader")
    if not isinstance(leader, str):
        _malformed(f"snapshot: leader must be a string, got {_short(leader)}", position)
    published_at = _integer(document, "published_at", "snapshot")
    entries = document.get("servers")
    if not isinstance(entries, list):
        _malformed(f"snapshot: servers must be an array, got {_short(entries)}", position)
    servers: dict[str, ServiceInstance] = {}
    problems: list[str] = []
    for index, entry in enumerate(entries):
        try:
            instance = ServiceInstance.from_dict(entry)
        except InvalidInstanceError as exc:
            problems.append(f"servers[{index}]: {exc}")
            continue
        if instance.id in servers:
            problems.append(f"servers[{index}]: duplicate id {instance.id!r}")
            continue
        servers[instance.id] = instance
    return LiveList(epoch, version, leader, published_at, servers), problems


def _parse_event(raw: bytes | str) -> _Event:
    document = _decode(raw, "event")
    epoch = _integer(document, "epoch", "event")
    version = _integer(document, "version", "event", low=1)
    position = (epoch, version)
    try:
        full = document.get("full")
        if not isinstance(full, bool):
            _malformed(f"full must be a boolean, got {_short(full)}")
        prev = document.get("prev_version")
        if prev is not None and (isinstance(prev, bool) or not isinstance(prev, int)):
            _malformed(f"prev_version must be an integer or null, got {_short(prev)}")
        if not full and prev is None:
            _malformed("a diff event needs a prev_version")
        leader = document.get("leader")
        if not isinstance(leader, str):
            _malformed(f"leader must be a string, got {_short(leader)}")
        published_at = _integer(document, "published_at", "event")
        upserts: list[ServiceInstance] = []
        for key in ("added", "changed"):
            entries = document.get(key, [])
            if not isinstance(entries, list):
                _malformed(f"{key} must be an array, got {_short(entries)}")
            for entry in entries:
                try:
                    upserts.append(ServiceInstance.from_dict(entry))
                except InvalidInstanceError as exc:
                    # Applying the rest would leave us with a list no version ever had.
                    _malformed(f"{key}: {exc}")
        removed: list[str] = []
        entries = document.get("removed", [])
        if not isinstance(entries, list):
            _malformed(f"removed must be an array, got {_short(entries)}")
        for entry in entries:
            rid = entry.get("id") if isinstance(entry, dict) else None
            if not isinstance(rid, str):
                _malformed(f"removed entries must be objects with an id, got {_short(entry)}")
            removed.append(rid)
    except MalformedLiveListError as exc:
        raise MalformedLiveListError(
            f"event epoch {epoch} version {version}: {exc}", position
        ) from None
    return _Event(epoch, version, prev, leader, published_at, full, tuple(upserts), tuple(removed))


class LiveListReader:
    """Keep the cluster's live list current from Redis (see the module docstring).

    ``async with LiveListReader(redis, prefix) as reader:`` loads the list and follows
    it in background tasks until closed; ``reader.current`` is the list to route with.
    ``start()`` does not fail when Redis is down: it starts with the empty list and
    keeps trying. The redis client is the caller's (not closed here); its timeouts and
    retry policy bound how long one attempt waits. ``clock`` (wall seconds) measures
    propagation delay, ``monotonic`` the list's :meth:`age`.
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        prefix: str,
        *,
        reconcile_interval: float = 30.0,
        registry: CollectorRegistry | None = None,
        metrics: LiveListMetrics | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if not reconcile_interval > 0:
            raise ValueError(f"reconcile_interval must be positive, got {reconcile_interval!r}")
        self._redis = redis
        self.keys = RedisKeys(prefix)
        self._reconcile_interval = reconcile_interval
        self._clock = clock
        self._monotonic = monotonic
        self._metrics = metrics or LiveListMetrics(
            registry if registry is not None else CollectorRegistry()
        )
        self._metrics.track_age(self.age)
        self._current = LiveList.EMPTY
        self._applied_at: float | None = None
        self._created_at = monotonic()
        self._confirmed_at: float | None = None
        self._connected = False
        self._fetched = False  # a snapshot fetch has succeeded (refetch cause "start" until then)
        self._missing_logged = False
        self._pubsub: PubSub | None = None
        # Serialises snapshot fetches and event application between the two tasks, so a
        # fetch is never judged against a list that changed while it was in flight.
        self._lock = asyncio.Lock()
        self._changed = asyncio.Condition()
        self._tasks: list[asyncio.Task[None]] = []
        self._started = False

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        """Subscribe, load the snapshot, and start following; never fails for Redis.

        If Redis cannot be reached the reader starts with the list it has (empty) and
        the background task keeps trying. Raises RuntimeError if already started.
        """
        if self._started:
            raise RuntimeError("LiveListReader already started")
        self._started = True
        try:
            await self._connect()
        except _RedisFailure as exc:
            log.warning(
                "live list %s: Redis unavailable at start (%s); starting with %d servers "
                "and retrying",
                self.keys.prefix,
                translate_redis_error(exc),
                len(self._current.servers),
            )
        self._tasks = [
            asyncio.create_task(self._run_subscriber(), name=f"livelist:{self.keys.prefix}"),
            asyncio.create_task(
                self._run_reconciler(), name=f"livelist-reconcile:{self.keys.prefix}"
            ),
        ]
        for task in self._tasks:
            task.add_done_callback(self._on_task_done)

    async def aclose(self) -> None:
        """Stop following and unsubscribe; the last list stays readable."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._drop_pubsub()
        self._set_connected(False)

    async def __aenter__(self) -> LiveListReader:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- the list ------------------------------------------------------------------

    @property
    def current(self) -> LiveList:
        """The list to route with: the newest version seen (``LiveList.EMPTY`` at first)."""
        return self._current

    @property
    def applied_at(self) -> float | None:
        """When (``clock``, wall seconds) the current list was installed here; None before.

        With the list's ``published_at`` this gives the propagation delay of one
        version to this reader; benchmarks compare it across processes.
        """
        return self._applied_at

    @property
    def connected(self) -> bool:
        """True while subscribed to the events channel (so changes arrive as they happen)."""
        return self._connected

    def age(self) -> float:
        """Seconds since the list was last confirmed current against Redis.

        Confirmed by a snapshot fetch or reconcile that found our version, or an applied
        event. Before the first confirmation, seconds since this reader was created.
        While Redis is unreachable it grows without bound. With a quiet leader it grows
        up to ``reconcile_interval`` between reconciles even when all is well.
        """
        since = self._created_at if self._confirmed_at is None else self._confirmed_at
        return max(0.0, self._monotonic() - since)

    async def wait_until(self, predicate: Callable[[LiveList], bool], timeout: float) -> LiveList:
        """Wait until ``predicate(current)`` holds; returns that list.

        Raises:
            TimeoutError: it did not hold within ``timeout`` seconds.
        """
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: predicate(self._current))
            return self._current

    # -- subscriber ----------------------------------------------------------------

    def _on_task_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("live list task %s crashed", task.get_name(), exc_info=task.exception())

    async def _connect(self) -> None:
        """Subscribe, then fetch the snapshot; on failure nothing is left subscribed."""
        try:
            self._pubsub = await self._subscribe()
            async with self._lock:
                await self._fetch("reconnect" if self._fetched else "start")
        except BaseException:
            await self._drop_pubsub()
            raise
        self._set_connected(True)

    async def _subscribe(self) -> PubSub:
        pubsub = self._redis.pubsub()
        try:
            try:
                await pubsub.subscribe(self.keys.events)
                # Consume our confirmation here, so that the listener sees a "subscribe"
                # message only when redis-py re-subscribed by itself after a reconnect.
                async with asyncio.timeout(_SUBSCRIBE_TIMEOUT):
                    while True:
                        message = await pubsub.get_message(timeout=_SUBSCRIBE_TIMEOUT)
                        if message is not None and message.get("type") == "subscribe":
                            break
            except _RedisFailure:
                self._metrics.redis_errors.labels(operation="subscribe").inc()
                raise
        except BaseException:
            await _close_pubsub(pubsub)
            raise
        return pubsub

    async def _drop_pubsub(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            await _close_pubsub(pubsub)

    def _set_connected(self, connected: bool) -> None:
        self._connected = connected
        self._metrics.connected.set(1 if connected else 0)

    async def _run_subscriber(self) -> None:
        failures = 0
        while True:
            if self._pubsub is None:
                try:
                    await self._connect()
                except Exception as exc:
                    failures += 1
                    delay = _backoff(failures)
                    if not isinstance(exc, _RedisFailure):
                        log.exception(
                            "live list %s: connecting failed unexpectedly", self.keys.prefix
                        )
                    # The first failure is news; the rest of an outage is noise.
                    level = logging.WARNING if failures == 1 else logging.DEBUG
                    log.log(
                        level,
                        "live list %s: cannot subscribe (%s); keeping epoch %d version %d, "
                        "retry %d in %.1f s",
                        self.keys.prefix,
                        translate_redis_error(exc) if isinstance(exc, _RedisFailure) else exc,
                        self._current.epoch,
                        self._current.version,
                        failures,
                        delay,
                    )
                    await asyncio.sleep(delay)
                    continue
                if failures:
                    log.info(
                        "live list %s: subscribed again after %d attempts; epoch %d version %d",
                        self.keys.prefix,
                        failures,
                        self._current.epoch,
                        self._current.version,
                    )
                failures = 0
            pubsub = self._pubsub
            assert pubsub is not None
            try:
                await self._listen(pubsub)
            except _SubscriptionLostError as exc:
                reason: object = exc
            except _RedisFailure as exc:
                self._metrics.redis_errors.labels(operation="listen").inc()
                reason = translate_redis_error(exc)
            except Exception as exc:
                # A bug or an unexpected redis-py state must not end the reader for the
                # life of the process: log it loudly and start over with a new connection.
                log.exception("live list %s: subscriber failed unexpectedly", self.keys.prefix)
                reason = exc
            log.warning(
                "live list %s: subscription lost (%s); keeping epoch %d version %d, reconnecting",
                self.keys.prefix,
                reason,
                self._current.epoch,
                self._current.version,
            )
            self._set_connected(False)
            await self._drop_pubsub()
            failures = 1
            await asyncio.sleep(_backoff(failures))

    async def _listen(self, pubsub: PubSub) -> None:
        """Handle messages until the connection fails (raises; never returns)."""
        loop = asyncio.get_running_loop()
        heard_at = loop.time()
        pinged_at: float | None = None
        while True:
            message = await pubsub.get_message(timeout=_POLL_INTERVAL)
            now = loop.time()
            if message is None:
                if pinged_at is not None:
                    if now - pinged_at > _KEEPALIVE_TIMEOUT:
                        raise _SubscriptionLostError(
                            f"no answer to a PING within {_KEEPALIVE_TIMEOUT:g} s"
                        )
                elif now - heard_at > _KEEPALIVE_INTERVAL:
                    await pubsub.ping()
                    pinged_at = now
                continue
            heard_at, pinged_at = now, None
            kind = message.get("type")
            if kind == "message":
                async with self._lock:
                    await self._on_event(message.get("data"))
            elif kind == "subscribe":
                # redis-py reconnected and re-subscribed by itself: events may have been
                # lost in between.
                self._set_connected(True)
                async with self._lock:
                    await self._fetch("reconnect")
            elif kind == "unsubscribe":
                raise _SubscriptionLostError("unsubscribed by the server")

    async def _on_event(self, data: object) -> None:
        if not isinstance(data, bytes | str):
            self._skip("event", f"message data is {type(data).__name__}, not bytes")
            return
        current = self._current
        try:
            event = _parse_event(data)
        except MalformedLiveListError as exc:
            self._skip("event", str(exc))
            # Something newer was published that we could not read: get the snapshot.
            if exc.position is not None and exc.position > current.position:
                await self._fetch("gap")
            return
        position = (event.epoch, event.version)
        if position <= current.position:
            if event.epoch < current.epoch:
                self._metrics.stale.labels(kind="event").inc()
                log.warning(
                    "live list %s: ignoring an event of epoch %d version %d from %r: we hold "
                    "epoch %d (a deposed leader?)",
                    self.keys.prefix,
                    event.epoch,
                    event.version,
                    event.leader,
                    current.epoch,
                )
            # else: already contained in the snapshot we fetched after subscribing.
            return
        if event.full:
            await self._fetch("full")
        elif event.epoch != current.epoch:
            await self._fetch("epoch")
        elif event.prev_version != current.version:
            log.info(
                "live list %s: event %d follows %s but we hold %d; refetching",
                self.keys.prefix,
                event.version,
                event.prev_version,
                current.version,
            )
            await self._fetch("gap")
        else:
            servers = dict(current.servers)
            for removed in event.removed:
                servers.pop(removed, None)
            for instance in event.upserts:
                servers[instance.id] = instance
            self._metrics.diffs_applied.inc()
            self._metrics.propagation_seconds.observe(
                max(0.0, self._clock() - event.published_at / 1000)
            )
            await self._install(
                LiveList(event.epoch, event.version, event.leader, event.published_at, servers)
            )

    # -- snapshots -------------------------------------------------------------------

    async def _fetch(self, cause: str) -> None:
        """GET the snapshot and take it if it is newer. Call with the lock held.

        Raises the redis-py error if Redis fails.
        """
        self._metrics.refetches.labels(cause=cause).inc()
        try:
            raw = await self._redis.get(self.keys.live)
        except _RedisFailure:
            self._metrics.redis_errors.labels(operation="fetch").inc()
            raise
        self._fetched = True
        current = self._current
        if raw is None:
            if current.position == LiveList.EMPTY.position:
                self._confirm()  # nothing published, and we hold nothing: current
            elif not self._missing_logged:
                self._missing_logged = True
                log.warning(
                    "live list %s: %s is missing (Redis lost its data?); keeping epoch %d "
                    "version %d until the leader publishes again",
                    self.keys.prefix,
                    self.keys.live,
                    current.epoch,
                    current.version,
                )
            return
        self._missing_logged = False
        try:
            snapshot, problems = parse_snapshot(raw)
        except MalformedLiveListError as exc:
            self._skip("snapshot", str(exc))
            return
        if snapshot.position < current.position:
            self._metrics.stale.labels(kind="snapshot").inc()
            log.warning(
                "live list %s: refusing a snapshot of epoch %d version %d (leader %r): we "
                "hold epoch %d version %d",
                self.keys.prefix,
                snapshot.epoch,
                snapshot.version,
                snapshot.leader,
                current.epoch,
                current.version,
            )
            return
        for problem in problems:
            self._skip(
                "server", f"snapshot epoch {snapshot.epoch} version {snapshot.version}, {problem}"
            )
        if snapshot.position == current.position and snapshot.servers == current.servers:
            self._confirm()
            return
        if snapshot.position == current.position:
            # Diffs led us somewhere the snapshot of the same version does not agree
            # with; the snapshot is the authority.
            log.warning(
                "live list %s: epoch %d version %d differs from the snapshot; taking it",
                self.keys.prefix,
                snapshot.epoch,
                snapshot.version,
            )
        await self._install(snapshot)

    async def _run_reconciler(self) -> None:
        while True:
            await asyncio.sleep(self._reconcile_interval)
            try:
                async with self._lock:
                    await self._reconcile()
            except _RedisFailure as exc:
                log.debug("live list %s: reconcile failed: %s", self.keys.prefix, exc)

    async def _reconcile(self) -> None:
        """Compare the stored fence with our version; fetch only if they differ."""
        try:
            stored = await self._redis.hmget(self.keys.fence, ["epoch", "version"])
        except _RedisFailure:
            self._metrics.redis_errors.labels(operation="reconcile").inc()
            raise
        position = _fence_position(stored)
        if position is not None and position == self._current.position:
            self._confirm()
            return
        await self._fetch("reconcile")

    # -- state ---------------------------------------------------------------------

    def _confirm(self) -> None:
        self._confirmed_at = self._monotonic()

    def _skip(self, kind: str, problem: str) -> None:
        self._metrics.malformed.labels(kind=kind).inc()
        log.warning(
            "live list %s: skipping a malformed %s: %s", self.keys.prefix, kind, _short(problem)
        )

    async def _install(self, new: LiveList) -> None:
        old = self._current
        self._current = new
        self._applied_at = self._clock()
        self._confirm()
        self._metrics.epoch.set(new.epoch)
        self._metrics.version.set(new.version)
        self._metrics.servers.set(len(new.servers))
        routable = len(new.routable)
        self._metrics.routable.set(routable)
        if new.epoch != old.epoch or len(new.servers) != len(old.servers):
            log.info(
                "live list %s: epoch %d version %d from %r: %d servers, %d routable",
                self.keys.prefix,
                new.epoch,
                new.version,
                new.leader,
                len(new.servers),
                routable,
            )
        async with self._changed:
            self._changed.notify_all()


class _SubscriptionLostError(Exception):
    """The subscription stopped delivering (no PING answer, unsubscribed by the server)."""


def _backoff(failures: int) -> float:
    delay = min(RECONNECT_BACKOFF_MAX, _BACKOFF_MIN * 2.0 ** min(failures - 1, 16))
    # Jitter spreads the reconnects of many search servers after a Redis restart.
    return delay * random.uniform(0.5, 1.0)


def _fence_position(stored: list[Any]) -> tuple[int, int] | None:
    if len(stored) != 2 or stored[0] is None or stored[1] is None:
        return None
    try:
        epoch, version = (int(v.decode() if isinstance(v, bytes) else v) for v in stored)
    except (ValueError, UnicodeDecodeError):
        return None
    return (epoch, version)


async def _close_pubsub(pubsub: PubSub) -> None:
    # Closing must not raise into the caller's own error handling: the connection may
    # already be broken, which is usually why it is being closed.
    try:
        await pubsub.aclose()  # type: ignore[no-untyped-call]  # untyped in redis-py
    except _RedisFailure as exc:
        log.debug("closing a live-list subscription: %s", exc)
