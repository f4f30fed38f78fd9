"""Following the live list in Redis layout 1 (the benchmarks' baseline).

The :class:`~discovery.livelist.LiveListFollower` of layout 1, made by
:meth:`layout_v1.store.RedisLiveStoreV1.follower`: the leader writes the list
with :class:`~layout_v1.publisher.LivePublisherV1` in the layout of
:mod:`layout_v1.layout`, and a :class:`LiveListReaderV1`:

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
  (at start, the empty list); :attr:`LiveListReaderV1.connected` is False, the subscriber
  reconnects with exponential backoff (0.1 s doubling to 2 s, with jitter, so a fleet
  of search servers does not reconnect in lock-step), and :meth:`LiveListReaderV1.age`
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
import logging
import random
import time
from collections.abc import AsyncIterator, Callable
from typing import Final

import redis.asyncio as aioredis
import redis.exceptions as redis_errors
from prometheus_client import CollectorRegistry
from redis.asyncio.client import PubSub

from discovery.aio import cancel_and_wait
from discovery.errors import MalformedLiveListError
from discovery.livelist.feed import ChangeFeed
from discovery.livelist.model import LiveList, LiveListChange
from discovery.livelist.redis.layout import short_repr, translate_redis_error
from discovery.metrics import LiveListMetrics
from layout_v1.layout import V1Keys, parse_event, parse_fence, parse_snapshot

__all__ = ["RECONNECT_BACKOFF_MAX", "LiveListReaderV1"]

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

_RedisFailure = (redis_errors.RedisError, OSError)


class LiveListReaderV1:
    """Keep the cluster's live list current from Redis (see the module docstring).

    ``async with LiveListReaderV1(redis, prefix) as reader:`` loads the list and follows
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
        self.keys = V1Keys(prefix)
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
        self._feed = ChangeFeed()

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        """Subscribe, load the snapshot, and start following; never fails for Redis.

        If Redis cannot be reached the reader starts with the list it has (empty) and
        the background task keeps trying. Raises RuntimeError if already started.
        """
        if self._started:
            raise RuntimeError("LiveListReaderV1 already started")
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
        # Both tasks run redis-py commands, which may swallow a cancellation.
        await cancel_and_wait(tasks)
        await self._drop_pubsub()
        self._set_connected(False)
        self._feed.close()

    async def __aenter__(self) -> LiveListReaderV1:
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

    def changes(self) -> AsyncIterator[LiveListChange]:
        """Every step of the list from now on (see :meth:`LiveListFollower.changes`);
        in layout 1 each step is computed by comparing whole lists."""
        return self._feed.subscribe(self._current)

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
            event = parse_event(data)
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
        position = parse_fence(stored)
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
            "live list %s: skipping a malformed %s: %s", self.keys.prefix, kind, short_repr(problem)
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
        self._feed.reload(old, new)
        async with self._changed:
            self._changed.notify_all()


class _SubscriptionLostError(Exception):
    """The subscription stopped delivering (no PING answer, unsubscribed by the server)."""


def _backoff(failures: int) -> float:
    delay = min(RECONNECT_BACKOFF_MAX, _BACKOFF_MIN * 2.0 ** min(failures - 1, 16))
    # Jitter spreads the reconnects of many search servers after a Redis restart.
    return delay * random.uniform(0.5, 1.0)


async def _close_pubsub(pubsub: PubSub) -> None:
    # Closing must not raise into the caller's own error handling: the connection may
    # already be broken, which is usually why it is being closed.
    try:
        await pubsub.aclose()  # type: ignore[no-untyped-call]  # untyped in redis-py
    except _RedisFailure as exc:
        log.debug("closing a live-list subscription: %s", exc)
