"""A search server's copy of an in-memory list: :class:`MemoryFollower`.

It keeps the rules of :class:`~discovery.livelist.redis.LiveListReader`: deltas in order,
a reload on a gap or a new epoch, reconciles, never backwards but on a new fence
generation; in an outage it keeps the list and retries with a jittered backoff.

Design: docs/design/live-list.md, "Following the list".
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Final

from discovery.aio import cancel_and_wait, log_crash
from discovery.errors import StoreUnavailableError
from discovery.instance import ServiceInstance
from discovery.livelist.admin import Meta
from discovery.livelist.held import HeldList
from discovery.livelist.memory.state import Entry, MemoryList
from discovery.livelist.model import LiveList, LiveListChange
from discovery.metrics import LiveListMetrics

__all__ = ["MemoryFollower"]

log = logging.getLogger(__name__)

_BACKOFF_MIN: Final = 0.05
_BACKOFF_MAX: Final = 0.5


class MemoryFollower:
    """Keep ``memory``'s list current in a background task (``async with``, or
    :meth:`start` and :meth:`aclose`). ``block`` is the longest wait for a change
    between checks; ``clock`` (wall seconds) stamps :attr:`applied_at`, ``monotonic``
    measures :meth:`age`."""

    def __init__(
        self,
        memory: MemoryList,
        *,
        metrics: LiveListMetrics,
        reconcile_interval: float = 5.0,
        block: float = 1.0,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if not reconcile_interval > 0:
            raise ValueError(f"reconcile_interval must be positive, got {reconcile_interval!r}")
        self._memory = memory
        self._metrics = metrics
        self._reconcile_interval = reconcile_interval
        self._block = block
        self._monotonic = monotonic
        self._held = HeldList(metrics, clock=clock, monotonic=monotonic)
        metrics.track_age(self.age)
        self._seq = 0  # the last change seen
        self._fence: int | None = None  # the generation of the list held (once loaded)
        self._loaded = False
        self._behind_logged = False
        self._connected = False
        self._task: asyncio.Task[None] | None = None
        self._started = False

    # -- the list (LiveListFollower) -------------------------------------------------------

    @property
    def current(self) -> LiveList:
        return self._held.current

    @property
    def connected(self) -> bool:
        return self._connected

    @property
    def applied_at(self) -> float | None:
        return self._held.applied_at

    def age(self) -> float:
        return self._held.age()

    async def wait_until(self, predicate: Callable[[LiveList], bool], timeout: float) -> LiveList:
        return await self._held.wait_until(predicate, timeout)

    def changes(self) -> AsyncIterator[LiveListChange]:
        return self._held.subscribe()

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Load the list and follow it; never fails because the store is unavailable."""
        if self._started:
            raise RuntimeError("MemoryFollower already started")
        self._started = True
        synced = False
        try:
            await self._load("start")
            synced = True
            self._set_connected(True)
        except StoreUnavailableError as exc:
            log.warning("live list %s: %s at start; starting with no servers", self._name, exc)
        self._task = asyncio.create_task(self._run(synced), name=f"livelist:{self._name}")
        self._task.add_done_callback(log_crash)

    async def aclose(self) -> None:
        """Stop following; the last list stays readable; change iterators end."""
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait([task])
        self._set_connected(False)
        self._held.close()

    async def __aenter__(self) -> MemoryFollower:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    @property
    def _name(self) -> str:
        return self._memory.name

    def _set_connected(self, connected: bool) -> None:
        self._connected = connected
        self._metrics.connected.set(1 if connected else 0)

    # -- following -------------------------------------------------------------------------

    async def _run(self, synced: bool) -> None:
        failures = 0
        while True:
            try:
                if not synced:
                    await self._reconcile(after_failure=True)
                    synced = True
                    self._set_connected(True)
                    if failures:
                        log.info(
                            "live list %s: following again after %d tries", self._name, failures
                        )
                    failures = 0
                await self._follow()
            except StoreUnavailableError as exc:
                self._metrics.redis_errors.labels(operation="follow").inc()
                failures += 1
                synced = False
                self._set_connected(False)
                if failures == 1:
                    log.warning(
                        "live list %s: %s; keeping epoch %d version %d",
                        self._name,
                        exc,
                        *self.current.position,
                    )
                delay = min(_BACKOFF_MAX, _BACKOFF_MIN * 2.0 ** min(failures - 1, 16))
                # Jitter spreads the returns of many followers after an outage.
                await asyncio.sleep(delay * random.uniform(0.5, 1.0))

    async def _follow(self) -> None:
        """Apply changes as they come; raises StoreUnavailableError in an outage."""
        while True:
            entries = self._memory.entries_after(self._seq)
            for entry in entries:
                await self._on_entry(entry)
            if self._monotonic() - self._held.confirmed_at >= self._reconcile_interval:
                await self._reconcile()
            if not entries:
                await self._memory.wait(self._seq, self._block)

    async def _on_entry(self, entry: Entry) -> None:
        current = self._held.current
        self._seq = max(self._seq, entry.seq)
        if self._fence is not None and entry.fence != self._fence:
            await self._load("fence")
        elif entry.position <= current.position:
            if entry.epoch < current.epoch:
                self._metrics.stale.labels(kind="entry").inc()
                log.warning(
                    "live list %s: ignoring a change of epoch %d version %d from %r: we hold "
                    "epoch %d (a deposed leader?)",
                    self._name,
                    entry.epoch,
                    entry.version,
                    entry.leader,
                    current.epoch,
                )
        elif entry.kind == "full":
            await self._load("full")
        elif entry.epoch != current.epoch:
            await self._load("epoch")
        elif entry.prev != current.version:
            log.info(
                "live list %s: change %d follows %d but we hold %d; loading",
                self._name,
                entry.version,
                entry.prev,
                current.version,
            )
            await self._load("gap")
        else:
            await self._apply(entry)

    async def _apply(self, entry: Entry) -> None:
        removes: Mapping[str, str] = dict(entry.removes)
        upserts: tuple[ServiceInstance, ...] = entry.upserts
        new = self._held.current.apply(
            epoch=entry.epoch,
            version=entry.version,
            leader=entry.leader,
            published_at=entry.published_at,
            upserts=upserts,
            removes=removes,
        )
        self._metrics.diffs_applied.inc()
        await self._held.take_delta(new, upserts, removes)

    async def _reconcile(self, *, after_failure: bool = False) -> None:
        """Compare the meta record with the list held: confirm, catch up, or load."""
        if not self._loaded:
            await self._load("start")
            return
        meta = self._memory.meta()
        if meta is None:
            self._on_missing()
            return
        if self._fence is not None and meta.fence != self._fence:
            await self._load("fence")
            return
        current = self._held.current.position
        if meta.position == current:
            self._behind_logged = False
            self._held.confirm()
        elif meta.position > current:
            for entry in self._memory.entries_after(self._seq):
                await self._on_entry(entry)
            if self._held.current.position != meta.position:
                await self._load("reconnect" if after_failure else "reconcile")
        else:
            self._metrics.stale.labels(kind="meta").inc()
            if not self._behind_logged:
                self._behind_logged = True
                log.warning(
                    "live list %s: the store holds epoch %d version %d, older than ours "
                    "(epoch %d version %d); keeping ours until the leader publishes again",
                    self._name,
                    *meta.position,
                    *current,
                )

    async def _load(self, cause: str) -> None:
        self._metrics.refetches.labels(cause=cause).inc()
        meta, servers, seq = self._memory.snapshot()
        self._seq = seq
        self._loaded = True
        if meta is None:
            self._on_missing()
            return
        await self._take(
            meta, LiveList(meta.epoch, meta.version, meta.leader, meta.published_at, servers)
        )

    async def _take(self, meta: Meta, new: LiveList) -> None:
        current = self._held.current
        repaired = self._fence is not None and meta.fence != self._fence
        if repaired:
            log.warning(
                "live list %s: the fence generation changed from %d to %d (`discovery fence "
                "repair`): taking epoch %d version %d whatever we held (epoch %d version %d)",
                self._name,
                self._fence,
                meta.fence,
                *new.position,
                *current.position,
            )
        self._fence = meta.fence
        if new.position < current.position and not repaired:
            self._metrics.stale.labels(kind="load").inc()
            log.warning(
                "live list %s: refusing a list of epoch %d version %d: we hold epoch %d version %d",
                self._name,
                *new.position,
                *current.position,
            )
        elif new.position == current.position and new.servers == current.servers:
            self._held.confirm()
        else:
            await self._held.take_reload(new)

    def _on_missing(self) -> None:
        # Nothing published: current if we hold nothing either; else keep what we hold.
        if self._held.current.position == LiveList.EMPTY.position:
            self._held.confirm()
