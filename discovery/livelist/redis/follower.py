"""The live list every search server routes with, read from Redis (layout 2) and kept current.

The default :class:`~discovery.livelist.LiveListFollower`, made by
:meth:`discovery.livelist.redis.RedisLiveStore.follower`. The leader writes the list
with :class:`~discovery.livelist.redis.LivePublisher` in the layout of
:mod:`discovery.livelist.redis.layout`; a :class:`LiveListReader`:

1. **loads** ``P:meta``, ``P:servers`` and the id of the last ``P:changes`` entry in
   one MULTI/EXEC (:func:`~discovery.livelist.redis.layout.load`), so the list and the point to
   follow from agree;
2. **follows** ``P:changes`` with ``XREAD BLOCK`` from that id, and applies each
   ``delta`` whose ``prev`` is exactly the version it holds in its epoch, in stream
   order. Applying one is O(changed): the next :class:`~discovery.livelist.LiveList`
   shares its map of servers with the last one (:meth:`~discovery.livelist.model.LiveList.apply`);
3. **loads again** when an entry does not follow: a ``full`` entry (a new term, or a
   leader that found Redis without its last write), a new epoch, or a gap (``prev``
   is not our version: entries were trimmed away, or Redis lost some);
4. **reconciles** when nothing arrived for ``reconcile_interval`` seconds and after
   every reconnection: it reads ``(epoch, version)`` from ``P:meta``; equal confirms
   the list, newer is caught up from the stream (or loaded), older is a Redis that
   lost our writes (kept until the leader republishes). This also covers a stream
   whose ids went backwards (a failover to a replica whose clock is behind).

The list never moves backwards: a load or entry with a lower epoch, or the same epoch
and a lower version, than the list held is refused and counted, so the leftovers of a
deposed leader (or a replica that missed writes) cannot win. Epochs are ZooKeeper
zxids, monotonic for the life of the ensemble.

The one exception is the **fence generation** (``P:meta``'s ``fence``, stamped on
every stream entry), which only ``discovery fence repair`` changes: after a write of
an epoch no leader can hold pinned every reader (and fenced the real leader off), the
repair resets the fence and moves the generation on. A reader that sees a generation
other than the one of the list it holds (in ``P:meta`` when it reconciles, or on an
entry) loads the list and takes it whatever its ``(epoch, version)``: its high-water
mark starts again from there. Anyone who can write Redis can damage the list anyway;
the generation makes that damage recoverable rather than permanent.

:meth:`LiveListReader.changes` is the API for other services: after a consistent load,
an async iterator of :class:`~discovery.livelist.LiveListChange` (what was added, changed
and removed, and why).

Failure behaviour:

* Redis unreachable (at start or later), or failing over behind Sentinel: the last
  list is kept and served (at start, the empty list); :attr:`LiveListReader.connected`
  is False, the reader retries with exponential backoff (0.1 s doubling to 0.5 s, with
  jitter, so a fleet of search servers does not reconnect in lock-step; a retry is one
  cheap ``HMGET`` unless the list changed meanwhile) and
  reconciles on its return; :meth:`LiveListReader.age` grows meanwhile. A dead
  connection is noticed by the client's socket timeout on the blocking read (keep it
  above ``block``), or at the latest ``block`` + 5 s.
* ``P:meta`` missing (Redis restarted empty, FLUSHALL): the list is kept; the
  leader's heartbeat notices and publishes in full.
* A malformed entry or meta record is skipped, logged and counted
  (``discovery_livelist_malformed_total{kind}``); a malformed entry that names a newer
  version causes a load. A malformed *server* in a load is skipped alone (counted as
  ``server``). Nothing malformed stops the reader, at start or later.
* A malformed ``P:meta`` (``kind="meta"``: a field missing, a number out of bounds)
  keeps the list held (at start, the empty one). The reader goes on following the
  stream, so the leader's next publish (which rewrites ``P:meta``) is loaded at once,
  and reads ``P:meta`` again itself with a backoff (``block`` doubling to 30 s). The
  first warning is logged at once, repeats at most once a minute.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Final

import redis.asyncio as aioredis
import redis.exceptions as redis_errors
from prometheus_client import CollectorRegistry

from discovery.aio import cancel_and_wait
from discovery.errors import MalformedLiveListError, MalformedMetaError
from discovery.livelist.feed import ChangeFeed
from discovery.livelist.model import LiveList, LiveListChange
from discovery.livelist.redis.layout import (
    FIRST_STREAM_ID,
    META_NUMBERS,
    ChangeEntry,
    Loaded,
    RedisKeys,
    load,
    parse_change,
    parse_meta_numbers,
    reply_text,
    short_repr,
    translate_redis_error,
)
from discovery.metrics import LiveListMetrics

__all__ = ["RECONNECT_BACKOFF_MAX", "LiveListReader"]

log = logging.getLogger(__name__)

_BACKOFF_MIN: Final = 0.1
#: The longest pause between attempts to reach Redis again while it is unreachable,
#: hence how long after Redis is back a reader may still go without changes. Short,
#: because those seconds are stale routing; jitter spreads a fleet's reconnects.
RECONNECT_BACKOFF_MAX: Final = 0.5
# Beyond the blocking read's own time: for a client without a socket timeout, the
# bound on a read from a connection that died silently.
_READ_GRACE: Final = 5.0

# While P:meta is malformed, the reader reads it again after these delays (doubling);
# the leader's next publish is seen on the stream meanwhile.
_META_RETRY_MAX: Final = 30.0
# Repeated warnings about one malformed P:meta, at most this often.
_META_WARN_EVERY: Final = 60.0

_RedisFailure = (redis_errors.RedisError, OSError)


def _stream_key(stream_id: str) -> tuple[int, int]:
    milliseconds, _, sequence = stream_id.partition("-")
    try:
        return (int(milliseconds), int(sequence or 0))
    except ValueError:
        return (0, 0)


class LiveListReader:
    """Keep the cluster's live list current from Redis (see the module docstring).

    ``async with LiveListReader(redis, prefix) as reader:`` loads the list and follows
    it in a background task until closed; ``reader.current`` is the list to route
    with. ``start()`` does not fail when Redis is down: it starts with the empty list
    and keeps trying. The redis client is the caller's (not closed here); its socket
    timeout should exceed ``block`` (seconds one ``XREAD`` waits). ``batch`` bounds the
    entries read at once. ``clock`` (wall seconds) measures propagation delay,
    ``monotonic`` the list's :meth:`age`.
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        prefix: str,
        *,
        reconcile_interval: float = 5.0,
        block: float = 1.0,
        batch: int = 500,
        registry: CollectorRegistry | None = None,
        metrics: LiveListMetrics | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if not reconcile_interval > 0:
            raise ValueError(f"reconcile_interval must be positive, got {reconcile_interval!r}")
        if not block > 0:
            raise ValueError(f"block must be positive, got {block!r}")
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch!r}")
        self._redis = redis
        self.keys = RedisKeys(prefix)
        self._reconcile_interval = reconcile_interval
        self._block_ms = max(1, round(block * 1000))
        self._batch = batch
        self._clock = clock
        self._monotonic = monotonic
        self._metrics = metrics or LiveListMetrics(
            registry if registry is not None else CollectorRegistry()
        )
        self._metrics.track_age(self.age)
        self._current = LiveList.EMPTY
        self._routable = 0
        self._applied_at: float | None = None
        self._created_at = monotonic()
        self._confirmed_at: float | None = None
        self._connected = False
        self._loaded = False  # a load has succeeded (load cause "start" until then)
        self._stream_id = FIRST_STREAM_ID
        self._synced = False  # the stream position is trusted (cleared by any failure)
        self._missing_logged = False
        self._behind_logged = False
        # The fence generation of the list held (None until a load succeeded).
        self._fence: int | None = None
        # A malformed P:meta: consecutive reads that found it so, when to read it
        # again, and when the last warning about it was logged.
        self._meta_failures = 0
        self._meta_retry_at = 0.0
        self._meta_warned_at: float | None = None
        # Serialises loads and entry application, so a load is never judged against a
        # list that changed while it was in flight.
        self._lock = asyncio.Lock()
        self._changed = asyncio.Condition()
        self._feed = ChangeFeed()
        self._task: asyncio.Task[None] | None = None
        self._started = False

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        """Load the list and start following it; never fails for Redis.

        If Redis cannot be reached the reader starts with the list it has (empty) and
        the background task keeps trying. Raises RuntimeError if already started.
        """
        if self._started:
            raise RuntimeError("LiveListReader already started")
        self._started = True
        try:
            async with self._lock:
                await self._load("start")
            self._synced = True
            self._set_connected(True)
        except _RedisFailure as exc:
            self._metrics.redis_errors.labels(operation="load").inc()
            log.warning(
                "live list %s: Redis unavailable at start (%s); starting with %d servers "
                "and retrying",
                self.keys.prefix,
                translate_redis_error(exc),
                len(self._current.servers),
            )
        except Exception:
            # Whatever Redis holds must not stop a search server from starting: the
            # background task retries (and logs) as it does for any failure.
            log.exception(
                "live list %s: the first load failed unexpectedly; starting with %d servers "
                "and retrying",
                self.keys.prefix,
                len(self._current.servers),
            )
        self._task = asyncio.create_task(self._run(), name=f"livelist:{self.keys.prefix}")
        self._task.add_done_callback(self._on_task_done)

    async def aclose(self) -> None:
        """Stop following; the last list stays readable; change iterators end."""
        task, self._task = self._task, None
        if task is not None:
            # The task runs redis-py commands, which may swallow a cancellation.
            await cancel_and_wait([task])
        self._set_connected(False)
        self._feed.close()

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
        """True while following the change stream (so changes arrive as they happen)."""
        return self._connected

    def age(self) -> float:
        """Seconds since the list was last confirmed current against Redis.

        Confirmed by a load or reconcile that found our version, or an applied entry.
        Before the first confirmation, seconds since this reader was created. While
        Redis is unreachable it grows without bound; with a quiet leader it stays
        within about ``reconcile_interval`` + ``block``.
        """
        since = self._created_at if self._confirmed_at is None else self._confirmed_at
        return max(0.0, self._monotonic() - since)

    def changes(self) -> AsyncIterator[LiveListChange]:
        """Every step of the list from now on (:meth:`LiveListFollower.changes`).

        A delta's step is built from the entry (O(changed)); a reload's by comparing
        the two lists.
        """
        return self._feed.subscribe(self._current)

    async def wait_until(self, predicate: Callable[[LiveList], bool], timeout: float) -> LiveList:
        """Wait until ``predicate(current)`` holds; returns that list.

        Raises:
            TimeoutError: it did not hold within ``timeout`` seconds.
        """
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: predicate(self._current))
            return self._current

    # -- following -----------------------------------------------------------------

    def _on_task_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("live list task %s crashed", task.get_name(), exc_info=task.exception())

    def _set_connected(self, connected: bool) -> None:
        self._connected = connected
        self._metrics.connected.set(1 if connected else 0)

    async def _run(self) -> None:
        failures = 0
        while True:
            try:
                if not self._synced:
                    async with self._lock:
                        await self._reconcile(after_failure=True)
                    self._synced = True
                    self._set_connected(True)
                    if failures:
                        log.info(
                            "live list %s: following again after %d attempts; epoch %d version %d",
                            self.keys.prefix,
                            failures,
                            self._current.epoch,
                            self._current.version,
                        )
                    failures = 0
                await self._follow()
            except _RedisFailure as exc:
                self._metrics.redis_errors.labels(operation="follow").inc()
                reason: object = translate_redis_error(exc)
            except TimeoutError:
                self._metrics.redis_errors.labels(operation="follow").inc()
                reason = f"no answer within {self._block_ms / 1000 + _READ_GRACE:g}s"
            except Exception as exc:
                # A bug or an unexpected redis-py state must not end the reader for the
                # life of the process: log it loudly and start over.
                log.exception("live list %s: following failed unexpectedly", self.keys.prefix)
                reason = exc
            failures += 1
            self._synced = False
            self._set_connected(False)
            delay = _backoff(failures)
            # The first failure is news; the rest of an outage is noise.
            log.log(
                logging.WARNING if failures == 1 else logging.DEBUG,
                "live list %s: Redis failed (%s); keeping epoch %d version %d, retry %d in %.1f s",
                self.keys.prefix,
                reason,
                self._current.epoch,
                self._current.version,
                failures,
                delay,
            )
            await asyncio.sleep(delay)

    async def _follow(self) -> None:
        """Read the stream until Redis fails (raises; never returns)."""
        while True:
            async with asyncio.timeout(self._block_ms / 1000 + _READ_GRACE):
                reply = await self._redis.xread(
                    {self.keys.changes: self._stream_id},
                    count=self._batch,
                    block=self._block_ms,
                )
            entries = _entries(reply)
            async with self._lock:
                for stream_id, fields in entries:
                    await self._on_entry(reply_text(stream_id), fields)
                now = self._monotonic()
                if (
                    now - (self._confirmed_at or self._created_at) >= self._reconcile_interval
                    and now >= self._meta_retry_at
                ):
                    await self._reconcile()

    async def _on_entry(self, stream_id: str, fields: Mapping[Any, Any]) -> None:
        """Apply one stream entry, or load again. Call with the lock held."""
        if _stream_key(stream_id) > _stream_key(self._stream_id):
            self._stream_id = stream_id
        current = self._current
        try:
            entry = parse_change(stream_id, fields)
        except MalformedLiveListError as exc:
            self._skip("entry", str(exc))
            # Something newer was published that we could not read: load it.
            if exc.position is not None and exc.position > current.position:
                await self._load("gap")
            return
        if entry.fence is not None and self._fence is not None and entry.fence != self._fence:
            await self._load("fence")
            return
        if entry.position <= current.position:
            if entry.epoch < current.epoch:
                self._metrics.stale.labels(kind="entry").inc()
                log.warning(
                    "live list %s: ignoring a change of epoch %d version %d from %r: we "
                    "hold epoch %d (a deposed leader?)",
                    self.keys.prefix,
                    entry.epoch,
                    entry.version,
                    entry.leader,
                    current.epoch,
                )
            return  # else: already in what we loaded
        if entry.full:
            await self._load("full")
        elif entry.epoch != current.epoch:
            await self._load("epoch")
        elif entry.prev != current.version:
            log.info(
                "live list %s: change %d follows %d but we hold %d; loading",
                self.keys.prefix,
                entry.version,
                entry.prev,
                current.version,
            )
            await self._load("gap")
        else:
            await self._apply(entry)

    async def _apply(self, entry: ChangeEntry) -> None:
        previous = self._current
        removes = dict(entry.removes)
        new = previous.apply(
            epoch=entry.epoch,
            version=entry.version,
            leader=entry.leader,
            published_at=entry.published_at,
            upserts=entry.upserts,
            removes=removes,
        )
        old = previous.servers
        for instance_id in removes:
            gone = old.get(instance_id)
            if gone is not None and gone.routable:
                self._routable -= 1
        for instance in entry.upserts:
            before = old.get(instance.id)
            if before is not None and before.routable and instance.id not in removes:
                self._routable -= 1
            if instance.routable:
                self._routable += 1
        self._metrics.diffs_applied.inc()
        self._metrics.propagation_seconds.observe(
            max(0.0, self._clock() - entry.published_at / 1000)
        )
        await self._install(new)
        self._feed.delta(previous, new, entry.upserts, removes)
        log.debug(
            "live list %s: epoch %d version %d: +%d -%d, %d servers",
            self.keys.prefix,
            new.epoch,
            new.version,
            len(entry.upserts),
            len(removes),
            len(new.servers),
        )

    # -- loads and reconciles ----------------------------------------------------------

    async def _reconcile(self, *, after_failure: bool = False) -> None:
        """Compare ``P:meta`` with our version: confirm, catch up, or load. Lock held."""
        if not self._loaded:
            await self._load("start")
            return
        stored = await self._redis.hmget(self.keys.meta, list(META_NUMBERS))
        try:
            numbers = parse_meta_numbers(stored)
        except MalformedLiveListError as exc:
            self._meta_malformed(f"{self.keys.meta}: {exc}")
            return
        self._meta_readable()
        current = self._current.position
        if numbers is None:
            self._on_missing()
            return
        position, fence = numbers
        self._missing_logged = False
        if self._fence is not None and fence != self._fence:
            await self._load("fence")
            return
        if position == current:
            self._behind_logged = False
            self._confirm()
            return
        if position > current:
            # Entries may be on their way (published since our last read): apply what
            # the stream has before deciding that only a load will do.
            await self._catch_up()
            if self._current.position == position:
                return
            await self._load("reconnect" if after_failure else "reconcile")
            return
        if not self._behind_logged:
            self._behind_logged = True
            log.warning(
                "live list %s: Redis holds epoch %d version %d, older than our epoch %d "
                "version %d (it lost writes: a failover or a restore); keeping ours until "
                "the leader publishes again",
                self.keys.prefix,
                *position,
                *current,
            )
        self._metrics.stale.labels(kind="meta").inc()

    async def _catch_up(self) -> None:
        reply = await self._redis.xrange(
            self.keys.changes, min="(" + self._stream_id, max="+", count=self._batch
        )
        for stream_id, fields in reply or []:
            await self._on_entry(reply_text(stream_id), fields or {})

    def _on_missing(self) -> None:
        if self._current.position == LiveList.EMPTY.position:
            self._confirm()  # nothing published, and we hold nothing: current
        elif not self._missing_logged:
            self._missing_logged = True
            log.warning(
                "live list %s: %s is missing (Redis lost its data?); keeping epoch %d "
                "version %d until the leader publishes again",
                self.keys.prefix,
                self.keys.meta,
                self._current.epoch,
                self._current.version,
            )

    async def _load(self, cause: str) -> None:
        """Load the list and take it if it is not older. Call with the lock held.

        Raises the redis-py error if Redis fails.
        """
        self._metrics.refetches.labels(cause=cause).inc()
        try:
            loaded = await load(self._redis, self.keys)
        except MalformedMetaError as exc:
            # Follow from where the stream was at that instant: only a later publish
            # (which rewrites P:meta) makes us load again, not every older entry.
            self._stream_id = exc.stream_id
            self._meta_malformed(str(exc))
            return
        except _RedisFailure:
            self._metrics.redis_errors.labels(operation="load").inc()
            raise
        self._meta_readable()
        self._loaded = True
        # The stream as of the load: entries after it follow what was loaded. (After
        # Redis lost data this id may be lower than the one we had; it is the right one.)
        self._stream_id = loaded.stream_id
        await self._take(loaded)

    async def _take(self, loaded: Loaded) -> None:
        current = self._current
        meta = loaded.meta
        if meta is None:
            self._on_missing()
            return
        self._missing_logged = False
        repaired = self._fence is not None and meta.fence != self._fence
        if repaired:
            log.warning(
                "live list %s: the fence generation changed from %d to %d (`discovery fence "
                "repair`): taking epoch %d version %d from %r whatever we held (epoch %d "
                "version %d)",
                self.keys.prefix,
                self._fence,
                meta.fence,
                meta.epoch,
                meta.version,
                meta.leader,
                current.epoch,
                current.version,
            )
        self._fence = meta.fence
        if meta.position < current.position and not repaired:
            self._metrics.stale.labels(kind="load").inc()
            log.warning(
                "live list %s: refusing a list of epoch %d version %d (leader %r): we hold "
                "epoch %d version %d",
                self.keys.prefix,
                meta.epoch,
                meta.version,
                meta.leader,
                current.epoch,
                current.version,
            )
            return
        for problem in loaded.problems:
            self._skip("server", f"epoch {meta.epoch} version {meta.version}, {problem}")
        new = LiveList(meta.epoch, meta.version, meta.leader, meta.published_at, loaded.servers)
        if new.position == current.position and new.servers == current.servers:
            self._confirm()
            return
        if new.position == current.position:
            # Deltas led us somewhere the stored list of the same version does not agree
            # with; the stored list is the authority.
            log.warning(
                "live list %s: epoch %d version %d differs from the stored list; taking it",
                self.keys.prefix,
                new.epoch,
                new.version,
            )
        self._routable = sum(1 for instance in new.servers.values() if instance.routable)
        await self._install(new)
        self._feed.reload(current, new)
        if new.epoch != current.epoch or len(new.servers) != len(current.servers):
            log.info(
                "live list %s: loaded epoch %d version %d from %r: %d servers, %d routable",
                self.keys.prefix,
                new.epoch,
                new.version,
                new.leader,
                len(new.servers),
                self._routable,
            )

    # -- state ---------------------------------------------------------------------

    def _confirm(self) -> None:
        self._confirmed_at = self._monotonic()

    def _meta_malformed(self, problem: str) -> None:
        """``P:meta`` could not be decoded: keep the list, count, warn (rate-bounded),
        and read it again after a backoff. Call with the lock held."""
        self._metrics.malformed.labels(kind="meta").inc()
        self._meta_failures += 1
        delay = min(
            _META_RETRY_MAX, self._block_ms / 1000 * 2.0 ** min(self._meta_failures - 1, 16)
        )
        now = self._monotonic()
        self._meta_retry_at = now + delay
        warn = self._meta_warned_at is None or now - self._meta_warned_at >= _META_WARN_EVERY
        if warn:
            self._meta_warned_at = now
        log.log(
            logging.WARNING if warn else logging.DEBUG,
            "live list %s: %s is malformed (%s); keeping epoch %d version %d (%d servers), "
            "reading it again in %.1f s (%d times so far)",
            self.keys.prefix,
            self.keys.meta,
            short_repr(problem),
            self._current.epoch,
            self._current.version,
            len(self._current.servers),
            delay,
            self._meta_failures,
        )

    def _meta_readable(self) -> None:
        if self._meta_failures:
            log.info(
                "live list %s: %s is readable again after %d malformed reads",
                self.keys.prefix,
                self.keys.meta,
                self._meta_failures,
            )
        self._meta_failures = 0
        self._meta_retry_at = 0.0
        self._meta_warned_at = None

    def _skip(self, kind: str, problem: str) -> None:
        self._metrics.malformed.labels(kind=kind).inc()
        log.warning(
            "live list %s: skipping a malformed %s: %s", self.keys.prefix, kind, short_repr(problem)
        )

    async def _install(self, new: LiveList) -> None:
        self._current = new
        self._applied_at = self._clock()
        self._confirm()
        self._metrics.epoch.set(new.epoch)
        self._metrics.version.set(new.version)
        self._metrics.servers.set(len(new.servers))
        self._metrics.routable.set(self._routable)
        async with self._changed:
            self._changed.notify_all()


def _entries(reply: object) -> list[tuple[object, Mapping[Any, Any]]]:
    """The entries of an XREAD reply for one stream (RESP2 list or RESP3 dict)."""
    if not reply:
        return []
    if isinstance(reply, dict):
        streams = list(reply.values())
        return list(streams[0][0]) if streams and streams[0] else []
    assert isinstance(reply, list)
    return list(reply[0][1])


def _backoff(failures: int) -> float:
    delay = min(RECONNECT_BACKOFF_MAX, _BACKOFF_MIN * 2.0 ** min(failures - 1, 16))
    # Jitter spreads the reconnects of many search servers after a Redis restart.
    return delay * random.uniform(0.5, 1.0)
