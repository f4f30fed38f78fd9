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
from collections.abc import AsyncIterator, Callable
from typing import Final

import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry

from discovery.aio import cancel_and_wait
from discovery.livelist.held import HeldList
from discovery.livelist.model import LiveList, LiveListChange
from discovery.livelist.redis.layout import RedisKeys, translate_redis_error
from discovery.livelist.redis.snapshot import REDIS_FAILURES, SnapshotLoader
from discovery.livelist.redis.stream import FollowSettings, StreamFollower
from discovery.metrics import LiveListMetrics

__all__ = ["RECONNECT_BACKOFF_MAX", "LiveListReader"]

log = logging.getLogger(__name__)

_BACKOFF_MIN: Final = 0.1
#: The longest pause between attempts to reach Redis again while it is unreachable,
#: hence how long after Redis is back a reader may still go without changes. Short,
#: because those seconds are stale routing; jitter spreads a fleet's reconnects.
RECONNECT_BACKOFF_MAX: Final = 0.5


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
        settings = FollowSettings(reconcile_interval=reconcile_interval, block=block, batch=batch)
        self.keys = RedisKeys(prefix)
        self._metrics = metrics or LiveListMetrics(
            registry if registry is not None else CollectorRegistry()
        )
        # The list held, whole loads into it, and the stream that keeps it current; this
        # class starts them and carries the stream through Redis outages.
        self._held = HeldList(self._metrics, clock=clock, monotonic=monotonic)
        self._metrics.track_age(self.age)
        loader = SnapshotLoader(
            redis,
            self.keys,
            self._held,
            self._metrics,
            meta_retry_min=settings.block_ms / 1000,
            monotonic=monotonic,
        )
        self._stream = StreamFollower(
            redis,
            self.keys,
            self._held,
            loader,
            self._metrics,
            settings,
            clock=clock,
            monotonic=monotonic,
        )
        self._connected = False
        self._synced = False  # the stream position is trusted (cleared by any failure)
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
            await self._stream.load("start")
            self._synced = True
            self._set_connected(True)
        except REDIS_FAILURES as exc:
            self._metrics.redis_errors.labels(operation="load").inc()
            log.warning(
                "live list %s: Redis unavailable at start (%s); starting with %d servers "
                "and retrying",
                self.keys.prefix,
                translate_redis_error(exc),
                len(self.current.servers),
            )
        except Exception:
            # Whatever Redis holds must not stop a search server from starting: the
            # background task retries (and logs) as it does for any failure.
            log.exception(
                "live list %s: the first load failed unexpectedly; starting with %d servers "
                "and retrying",
                self.keys.prefix,
                len(self.current.servers),
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
        self._held.close()

    async def __aenter__(self) -> LiveListReader:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- the list ------------------------------------------------------------------

    @property
    def current(self) -> LiveList:
        """The list to route with: the newest version seen (``LiveList.EMPTY`` at first)."""
        return self._held.current

    @property
    def applied_at(self) -> float | None:
        """When (``clock``, wall seconds) the current list was installed here; None before.

        With the list's ``published_at`` this gives the propagation delay of one
        version to this reader; benchmarks compare it across processes.
        """
        return self._held.applied_at

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
        return self._held.age()

    def changes(self) -> AsyncIterator[LiveListChange]:
        """Every step of the list from now on (:meth:`LiveListFollower.changes`).

        A delta's step is built from the entry (O(changed)); a reload's by comparing
        the two lists.
        """
        return self._held.subscribe()

    async def wait_until(self, predicate: Callable[[LiveList], bool], timeout: float) -> LiveList:
        """Wait until ``predicate(current)`` holds; returns that list.

        Raises:
            TimeoutError: it did not hold within ``timeout`` seconds.
        """
        return await self._held.wait_until(predicate, timeout)

    # -- following through outages ---------------------------------------------------

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
                    await self._stream.reconcile(after_failure=True)
                    self._synced = True
                    self._set_connected(True)
                    if failures:
                        log.info(
                            "live list %s: following again after %d attempts; epoch %d version %d",
                            self.keys.prefix,
                            failures,
                            self.current.epoch,
                            self.current.version,
                        )
                    failures = 0
                await self._stream.follow()
            except REDIS_FAILURES as exc:
                self._metrics.redis_errors.labels(operation="follow").inc()
                reason: object = translate_redis_error(exc)
            except TimeoutError:
                self._metrics.redis_errors.labels(operation="follow").inc()
                reason = f"no answer within {self._stream.read_timeout:g}s"
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
                self.current.epoch,
                self.current.version,
                failures,
                delay,
            )
            await asyncio.sleep(delay)


def _backoff(failures: int) -> float:
    delay = min(RECONNECT_BACKOFF_MAX, _BACKOFF_MIN * 2.0 ** min(failures - 1, 16))
    # Jitter spreads the reconnects of many search servers after a Redis restart.
    return delay * random.uniform(0.5, 1.0)
