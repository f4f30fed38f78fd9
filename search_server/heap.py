"""Keeps a search server's long-lived heap out of the garbage collector's full collections.

:class:`HeapFreezer` freezes the old generation (:func:`gc.freeze`) once it has grown,
and settles it hourly; a frozen object is still freed by its reference count.

Design: docs/design/search-server.md, "The heap".
"""

from __future__ import annotations

import asyncio
import gc
import logging
import random
import time
from collections.abc import Callable
from typing import Literal, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge

from discovery.aio import cancel_and_wait, log_crash

__all__ = ["Collector", "HeapFreezer"]

log = logging.getLogger(__name__)

#: Oldest of CPython's collector generations: the one a full collection walks.
OLDEST = 2


class Collector(Protocol):
    """The part of :mod:`gc` the freezer uses."""

    def get_objects(self, generation: int | None = None) -> list[object]: ...

    def freeze(self) -> None: ...

    def unfreeze(self) -> None: ...

    def collect(self, generation: int = 2) -> int: ...

    def get_freeze_count(self) -> int: ...


class HeapFreezer:
    """Freezes the old generation once it has grown by ``above`` objects, checked every
    ``interval`` seconds (give or take a tenth), and settles the heap every
    ``settle_every`` seconds while anything is frozen (docs/design/search-server.md,
    "The heap").
    ``above`` 0 turns it off. ``async with`` it to run the checks in a task.

    Metrics (on ``registry``): ``search_server_heap_frozen_objects`` (gauge) and
    ``search_server_heap_freezes_total{kind="freeze"|"settle"}``.

    Raises ``ValueError`` for a negative ``above`` or an interval that is not positive.
    """

    def __init__(
        self,
        *,
        above: int = 50_000,
        interval: float = 10.0,
        settle_every: float = 3600.0,
        registry: CollectorRegistry | None = None,
        collector: Collector | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if above < 0:
            raise ValueError(f"above must be >= 0, got {above}")
        if not interval > 0 or not settle_every > 0:
            raise ValueError("interval and settle_every must be > 0 seconds")
        self.above = above
        self._interval = interval
        self._settle_every = settle_every
        self._gc: Collector = collector if collector is not None else gc
        self._clock = clock
        # What the process held before this server: never counted as its growth.
        self._floor = len(self._gc.get_objects(OLDEST)) if above else 0
        self._settled = clock()
        self._task: asyncio.Task[None] | None = None
        registry = registry if registry is not None else CollectorRegistry()
        self._frozen = Gauge(
            "search_server_heap_frozen_objects",
            "Objects in the collector's permanent generation (frozen: full collections skip them).",
            registry=registry,
        )
        self._frozen.set_function(self._gc.get_freeze_count)
        self._freezes = Counter(
            "search_server_heap_freezes",
            "Freezes of the old generation (freeze) and full collections of the whole "
            "heap before freezing it again (settle).",
            ["kind"],
            registry=registry,
        )
        for kind in ("freeze", "settle"):
            self._freezes.labels(kind=kind)

    async def __aenter__(self) -> HeapFreezer:
        if self.above:
            self._task = asyncio.create_task(self._run(), name="search-heap-freezer")
            self._task.add_done_callback(log_crash)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval * random.uniform(0.9, 1.1))
            self.check()

    def check(self) -> Literal["freeze", "settle"] | None:
        """Settle if it is time and anything is frozen, else freeze if the old
        generation has grown by more than :attr:`above`: what was done, if anything.
        Runs on the event loop: a freeze is a list splice, a settle one full
        collection."""
        if not self.above:
            return None
        collector = self._gc
        now = self._clock()
        if now - self._settled >= self._settle_every and collector.get_freeze_count():
            started = time.perf_counter()
            collector.unfreeze()
            collector.collect()
            collector.freeze()
            self._settled, self._floor = now, 0
            self._freezes.labels(kind="settle").inc()
            log.info(
                "heap settled: one full collection in %.0f ms, %d objects frozen again",
                (time.perf_counter() - started) * 1000,
                collector.get_freeze_count(),
            )
            return "settle"
        grown = len(collector.get_objects(OLDEST)) - self._floor
        if grown <= self.above:
            return None
        if not collector.get_freeze_count():
            self._settled = now  # the hour runs from the first freeze
        collector.freeze()
        self._floor = 0
        self._freezes.labels(kind="freeze").inc()
        log.info(
            "heap frozen: the old generation grew by %d objects; %d frozen in all",
            grown,
            collector.get_freeze_count(),
        )
        return "freeze"
