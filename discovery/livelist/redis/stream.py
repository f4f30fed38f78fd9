"""Following ``P:changes`` for a :class:`~discovery.livelist.redis.LiveListReader`.

:class:`StreamFollower` applies each delta that follows the list held, loads again when an
entry does not, and reconciles with ``P:meta`` when the stream is quiet. It raises every
Redis failure to its caller, which keeps the list and retries.

Design: docs/design/live-list.md, "Following the list".
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import redis.asyncio as aioredis

from discovery.errors import MalformedLiveListError
from discovery.livelist.held import HeldList
from discovery.livelist.redis.layout import (
    FIRST_STREAM_ID,
    ChangeEntry,
    RedisKeys,
    parse_change,
    reply_text,
)
from discovery.livelist.redis.snapshot import SnapshotLoader, skip_malformed
from discovery.metrics import LiveListMetrics

__all__ = ["FollowSettings", "StreamFollower"]

log = logging.getLogger(__name__)

# Beyond the blocking read's own time: for a client without a socket timeout, the
# bound on a read from a connection that died silently.
_READ_GRACE: Final = 5.0


@dataclass(frozen=True)
class FollowSettings:
    """How the stream is read: ``block`` seconds per ``XREAD`` (kept to whole
    milliseconds), at most ``batch`` entries at once, and a reconcile after
    ``reconcile_interval`` seconds without a confirmation. Raises ValueError when one
    is out of range."""

    reconcile_interval: float = 5.0
    block: float = 1.0
    batch: int = 500

    def __post_init__(self) -> None:
        if not self.reconcile_interval > 0:
            raise ValueError(
                f"reconcile_interval must be positive, got {self.reconcile_interval!r}"
            )
        if not self.block > 0:
            raise ValueError(f"block must be positive, got {self.block!r}")
        if self.batch < 1:
            raise ValueError(f"batch must be >= 1, got {self.batch!r}")

    @property
    def block_ms(self) -> int:
        """``block`` in whole milliseconds (at least 1), as ``XREAD`` takes it."""
        return max(1, round(self.block * 1000))


def _stream_key(stream_id: str) -> tuple[int, int]:
    milliseconds, _, sequence = stream_id.partition("-")
    try:
        return (int(milliseconds), int(sequence or 0))
    except ValueError:
        return (0, 0)


def _entries(reply: object) -> list[tuple[object, Mapping[Any, Any]]]:
    """The entries of an XREAD reply for one stream (RESP2 list or RESP3 dict)."""
    if not reply:
        return []
    if isinstance(reply, dict):
        streams = list(reply.values())
        return list(streams[0][0]) if streams and streams[0] else []
    assert isinstance(reply, list)
    return list(reply[0][1])


class StreamFollower:
    """Keep ``held`` current from ``P:changes``, loading through ``loader`` when needed.

    :meth:`load`, :meth:`reconcile` and each batch :meth:`follow` reads are serialised
    by one lock, so a load is never judged against a list that changed while it was in
    flight. ``monotonic`` times the reconciles; ``clock`` (wall seconds) measures each
    delta's propagation delay.
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        keys: RedisKeys,
        held: HeldList,
        loader: SnapshotLoader,
        metrics: LiveListMetrics,
        settings: FollowSettings,
        *,
        clock: Callable[[], float],
        monotonic: Callable[[], float],
    ) -> None:
        self._redis = redis
        self._keys = keys
        self._held = held
        self._loader = loader
        self._metrics = metrics
        self._settings = settings
        self._block_ms = settings.block_ms
        self._clock = clock
        self._monotonic = monotonic
        self._stream_id = FIRST_STREAM_ID
        self._behind_logged = False
        self._lock = asyncio.Lock()

    @property
    def read_timeout(self) -> float:
        """Seconds one read may take before its connection is taken for dead."""
        return self._block_ms / 1000 + _READ_GRACE

    async def load(self, cause: str) -> None:
        """Load the list (counted under ``cause``) and follow from there.

        Raises the redis-py error if Redis fails.
        """
        async with self._lock:
            await self._load(cause)

    async def reconcile(self, *, after_failure: bool = False) -> None:
        """Compare ``P:meta`` with the list held: confirm, catch up, or load.

        Raises the redis-py error if Redis fails.
        """
        async with self._lock:
            await self._reconcile(after_failure=after_failure)

    async def follow(self) -> None:
        """Read the stream until Redis fails (raises; never returns)."""
        settings = self._settings
        while True:
            async with asyncio.timeout(self.read_timeout):
                reply = await self._redis.xread(
                    {self._keys.changes: self._stream_id},
                    count=settings.batch,
                    block=self._block_ms,
                )
            entries = _entries(reply)
            async with self._lock:
                for stream_id, fields in entries:
                    await self._on_entry(reply_text(stream_id), fields)
                now = self._monotonic()
                if (
                    now - self._held.confirmed_at >= settings.reconcile_interval
                    and now >= self._loader.meta_retry_at
                ):
                    await self._reconcile()

    async def _load(self, cause: str) -> None:
        self._stream_id, loaded = await self._loader.fetch(cause)
        if loaded is not None:
            await self._loader.take(loaded)

    async def _on_entry(self, stream_id: str, fields: Mapping[Any, Any]) -> None:
        """Apply one stream entry, or load again. Call with the lock held."""
        if _stream_key(stream_id) > _stream_key(self._stream_id):
            self._stream_id = stream_id
        current = self._held.current
        try:
            entry = parse_change(stream_id, fields)
        except MalformedLiveListError as exc:
            skip_malformed(self._metrics, self._keys.prefix, "entry", str(exc))
            # Something newer was published that we could not read: load it.
            if exc.position is not None and exc.position > current.position:
                await self._load("gap")
            return
        if entry.fence is not None and self._loader.fence_moved(entry.fence):
            await self._load("fence")
            return
        if entry.position <= current.position:
            if entry.epoch < current.epoch:
                self._metrics.stale.labels(kind="entry").inc()
                log.warning(
                    "live list %s: ignoring a change of epoch %d version %d from %r: we "
                    "hold epoch %d (a deposed leader?)",
                    self._keys.prefix,
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
                self._keys.prefix,
                entry.version,
                entry.prev,
                current.version,
            )
            await self._load("gap")
        else:
            await self._apply(entry)

    async def _apply(self, entry: ChangeEntry) -> None:
        previous = self._held.current
        removes = dict(entry.removes)
        new = previous.apply(
            epoch=entry.epoch,
            version=entry.version,
            leader=entry.leader,
            published_at=entry.published_at,
            upserts=entry.upserts,
            removes=removes,
        )
        self._metrics.diffs_applied.inc()
        self._metrics.propagation_seconds.observe(
            max(0.0, self._clock() - entry.published_at / 1000)
        )
        await self._held.take_delta(new, entry.upserts, removes)
        log.debug(
            "live list %s: epoch %d version %d: +%d -%d, %d servers",
            self._keys.prefix,
            new.epoch,
            new.version,
            len(entry.upserts),
            len(removes),
            len(new.servers),
        )

    async def _reconcile(self, *, after_failure: bool = False) -> None:
        """Compare ``P:meta`` with our version: confirm, catch up, or load. Lock held."""
        if not self._loader.loaded:
            await self._load("start")
            return
        numbers = await self._loader.read_meta()
        if numbers is None:
            return  # malformed or missing: the list held is kept
        position, fence = numbers
        if self._loader.fence_moved(fence):
            await self._load("fence")
            return
        current = self._held.current.position
        if position == current:
            self._behind_logged = False
            self._held.confirm()
            return
        if position > current:
            # Entries may be on their way (published since our last read): apply what
            # the stream has before deciding that only a load will do.
            await self._catch_up()
            if self._held.current.position == position:
                return
            await self._load("reconnect" if after_failure else "reconcile")
            return
        if not self._behind_logged:
            self._behind_logged = True
            log.warning(
                "live list %s: Redis holds epoch %d version %d, older than our epoch %d "
                "version %d (it lost writes: a failover or a restore); keeping ours until "
                "the leader publishes again",
                self._keys.prefix,
                *position,
                *current,
            )
        self._metrics.stale.labels(kind="meta").inc()

    async def _catch_up(self) -> None:
        reply = await self._redis.xrange(
            self._keys.changes, min="(" + self._stream_id, max="+", count=self._settings.batch
        )
        for stream_id, fields in reply or []:
            await self._on_entry(reply_text(stream_id), fields or {})
