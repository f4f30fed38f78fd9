"""Loading the whole live list from Redis for a :class:`~discovery.livelist.redis.LiveListReader`.

:class:`SnapshotLoader` takes the stored list unless it is older than the one held (a new
fence generation takes it anyway). Redis failures are raised; a missing or malformed
``P:meta`` keeps the list held; a malformed server is skipped alone.

Design: docs/design/live-list.md, "Following the list".
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

import redis.asyncio as aioredis
import redis.exceptions as redis_errors

from discovery.errors import MalformedLiveListError, MalformedMetaError
from discovery.livelist.held import HeldList
from discovery.livelist.model import LiveList
from discovery.livelist.redis.layout import (
    META_NUMBERS,
    Loaded,
    RedisKeys,
    load,
    parse_meta_numbers,
    short_repr,
)
from discovery.metrics import LiveListMetrics

__all__ = ["REDIS_FAILURES", "SnapshotLoader", "skip_malformed"]

log = logging.getLogger(__name__)

#: What redis-py raises when Redis cannot be reached or refuses a command.
REDIS_FAILURES: Final = (redis_errors.RedisError, OSError)

# While P:meta is malformed, the reader reads it again after these delays (doubling);
# the leader's next publish is seen on the stream meanwhile.
_META_RETRY_MAX: Final = 30.0
# Repeated warnings about one malformed P:meta, at most this often.
_META_WARN_EVERY: Final = 60.0


def skip_malformed(metrics: LiveListMetrics, prefix: str, kind: str, problem: str) -> None:
    """Count and log a malformed ``kind`` of record that is skipped."""
    metrics.malformed.labels(kind=kind).inc()
    log.warning("live list %s: skipping a malformed %s: %s", prefix, kind, short_repr(problem))


class SnapshotLoader:
    """Load the list into ``held``; say whether ``P:meta`` moved on from it.

    Calls must not overlap each other or a change to ``held`` (the reader's lock):
    a load is judged against the list held when it arrives. While ``P:meta`` is
    malformed it is read again ``meta_retry_min`` seconds (of ``monotonic``) after the
    first failure, doubling to 30 s (:attr:`meta_retry_at`).
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        keys: RedisKeys,
        held: HeldList,
        metrics: LiveListMetrics,
        *,
        meta_retry_min: float,
        monotonic: Callable[[], float],
    ) -> None:
        self._redis = redis
        self._keys = keys
        self._held = held
        self._metrics = metrics
        self._meta_retry_min = meta_retry_min
        self._monotonic = monotonic
        self._loaded = False  # a load has succeeded (load cause "start" until then)
        self._missing_logged = False
        # The fence generation of the list held (None until a load succeeded).
        self._fence: int | None = None
        # A malformed P:meta: consecutive reads that found it so, when to read it
        # again, and when the last warning about it was logged.
        self._meta_failures = 0
        self._meta_retry_at = 0.0
        self._meta_warned_at: float | None = None

    @property
    def loaded(self) -> bool:
        """True once a load has succeeded."""
        return self._loaded

    @property
    def meta_retry_at(self) -> float:
        """When (``monotonic``) a malformed ``P:meta`` may be read again (0: any time)."""
        return self._meta_retry_at

    def fence_moved(self, fence: int) -> bool:
        """True if ``fence`` is not the generation of the list held (one was loaded)."""
        return self._fence is not None and fence != self._fence

    async def fetch(self, cause: str) -> tuple[str, Loaded | None]:
        """Read the list stored (a load counted under ``cause``), without taking it.

        Returns the stream id to follow from, and what was loaded to pass to
        :meth:`take` (None if ``P:meta`` is malformed: only a later publish, which
        rewrites it, is worth loading again). Raises the redis-py error if Redis fails.
        """
        self._metrics.refetches.labels(cause=cause).inc()
        try:
            loaded = await load(self._redis, self._keys)
        except MalformedMetaError as exc:
            self._meta_malformed(str(exc))
            return exc.stream_id, None
        except REDIS_FAILURES:
            self._metrics.redis_errors.labels(operation="load").inc()
            raise
        self._meta_readable()
        self._loaded = True
        # The stream as of the load: entries after it follow what was loaded. (After
        # Redis lost data this id may be lower than the one we had; it is the right one.)
        return loaded.stream_id, loaded

    async def take(self, loaded: Loaded) -> None:
        """Install what :meth:`fetch` loaded, unless it is older than the list held."""
        prefix = self._keys.prefix
        current = self._held.current
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
                prefix,
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
                prefix,
                meta.epoch,
                meta.version,
                meta.leader,
                current.epoch,
                current.version,
            )
            return
        for problem in loaded.problems:
            skip_malformed(
                self._metrics,
                prefix,
                "server",
                f"epoch {meta.epoch} version {meta.version}, {problem}",
            )
        new = LiveList(meta.epoch, meta.version, meta.leader, meta.published_at, loaded.servers)
        if new.position == current.position and new.servers == current.servers:
            self._held.confirm()
            return
        if new.position == current.position:
            # Deltas led us somewhere the stored list of the same version does not agree
            # with; the stored list is the authority.
            log.warning(
                "live list %s: epoch %d version %d differs from the stored list; taking it",
                prefix,
                new.epoch,
                new.version,
            )
        await self._held.take_reload(new)
        if new.epoch != current.epoch or len(new.servers) != len(current.servers):
            log.info(
                "live list %s: loaded epoch %d version %d from %r: %d servers, %d routable",
                prefix,
                new.epoch,
                new.version,
                new.leader,
                len(new.servers),
                self._held.routable,
            )

    async def read_meta(self) -> tuple[tuple[int, int], int] | None:
        """``((epoch, version), fence)`` of ``P:meta``, to compare with the list held.

        None when there is nothing to compare with: ``P:meta`` is missing (the list is
        kept, and confirmed if it is the empty one) or malformed (counted, warned, read
        again after a backoff). Raises the redis-py error if Redis fails.
        """
        stored = await self._redis.hmget(self._keys.meta, list(META_NUMBERS))
        try:
            numbers = parse_meta_numbers(stored)
        except MalformedLiveListError as exc:
            self._meta_malformed(f"{self._keys.meta}: {exc}")
            return None
        self._meta_readable()
        if numbers is None:
            self._on_missing()
            return None
        self._missing_logged = False
        return numbers

    def _on_missing(self) -> None:
        current = self._held.current
        if current.position == LiveList.EMPTY.position:
            self._held.confirm()  # nothing published, and we hold nothing: current
        elif not self._missing_logged:
            self._missing_logged = True
            log.warning(
                "live list %s: %s is missing (Redis lost its data?); keeping epoch %d "
                "version %d until the leader publishes again",
                self._keys.prefix,
                self._keys.meta,
                current.epoch,
                current.version,
            )

    def _meta_malformed(self, problem: str) -> None:
        """``P:meta`` could not be decoded: keep the list, count, warn (rate-bounded),
        and read it again after a backoff."""
        self._metrics.malformed.labels(kind="meta").inc()
        self._meta_failures += 1
        delay = min(_META_RETRY_MAX, self._meta_retry_min * 2.0 ** min(self._meta_failures - 1, 16))
        now = self._monotonic()
        self._meta_retry_at = now + delay
        warn = self._meta_warned_at is None or now - self._meta_warned_at >= _META_WARN_EVERY
        if warn:
            self._meta_warned_at = now
        current = self._held.current
        log.log(
            logging.WARNING if warn else logging.DEBUG,
            "live list %s: %s is malformed (%s); keeping epoch %d version %d (%d servers), "
            "reading it again in %.1f s (%d times so far)",
            self._keys.prefix,
            self._keys.meta,
            short_repr(problem),
            current.epoch,
            current.version,
            len(current.servers),
            delay,
            self._meta_failures,
        )

    def _meta_readable(self) -> None:
        if self._meta_failures:
            log.info(
                "live list %s: %s is readable again after %d malformed reads",
                self._keys.prefix,
                self._keys.meta,
                self._meta_failures,
            )
        self._meta_failures = 0
        self._meta_retry_at = 0.0
        self._meta_warned_at = None
