"""The live list every search server routes with, read from Redis (layout 2) and kept current.

:class:`LiveListReader` loads the list consistently, then follows ``P:changes``, loading
again when an entry does not follow and reconciling with ``P:meta`` when quiet. The list
never moves backwards in ``(epoch, version)`` but on a new fence generation; with Redis
unreachable it is kept and served while the reader retries, and nothing malformed stops
the reader.

Design: docs/design/live-list.md, "Following the list".
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
