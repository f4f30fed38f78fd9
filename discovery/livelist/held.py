"""The live list a follower holds, and what it implies (every backend's followers).

:class:`HeldList` never talks to a store and never fails: what to install is decided by
its callers.

Design: docs/design/live-list.md, "Following the list".
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping

from discovery.instance import ServiceInstance
from discovery.livelist.feed import ChangeFeed
from discovery.livelist.model import LiveList, LiveListChange
from discovery.metrics import LiveListMetrics

__all__ = ["HeldList"]


class HeldList:
    """The list to route with, starting from ``LiveList.EMPTY``.

    ``clock`` (wall seconds) stamps :attr:`applied_at`; ``monotonic`` measures
    :meth:`age`. Installing a list sets the list gauges of ``metrics``, wakes
    :meth:`wait_until` and feeds :meth:`subscribe`'s iterators; :meth:`close` ends those.
    """

    def __init__(
        self,
        metrics: LiveListMetrics,
        *,
        clock: Callable[[], float],
        monotonic: Callable[[], float],
    ) -> None:
        self._metrics = metrics
        self._clock = clock
        self._monotonic = monotonic
        self._current = LiveList.EMPTY
        self._routable = 0
        self._applied_at: float | None = None
        self._created_at = monotonic()
        self._confirmed_at: float | None = None
        self._changed = asyncio.Condition()
        self._feed = ChangeFeed()

    @property
    def current(self) -> LiveList:
        """The newest list installed (``LiveList.EMPTY`` at first)."""
        return self._current

    @property
    def routable(self) -> int:
        """How many servers of :attr:`current` are routable."""
        return self._routable

    @property
    def applied_at(self) -> float | None:
        """When (``clock``) the current list was installed; None before."""
        return self._applied_at

    @property
    def confirmed_at(self) -> float:
        """When (``monotonic``) the list was last confirmed, or else this was created."""
        return self._confirmed_at or self._created_at

    def age(self) -> float:
        """Seconds since :attr:`confirmed_at` (never negative)."""
        since = self._created_at if self._confirmed_at is None else self._confirmed_at
        return max(0.0, self._monotonic() - since)

    def confirm(self) -> None:
        """The list held was found current against the store."""
        self._confirmed_at = self._monotonic()

    async def take_delta(
        self,
        new: LiveList,
        upserts: tuple[ServiceInstance, ...],
        removes: Mapping[str, str],
    ) -> None:
        """Install ``new``, made from :attr:`current` by ``upserts`` and ``removes``.

        The routable count is adjusted by what changed (O(changed)).
        """
        previous = self._current
        old = previous.servers
        for instance_id in removes:
            gone = old.get(instance_id)
            if gone is not None and gone.routable:
                self._routable -= 1
        for instance in upserts:
            before = old.get(instance.id)
            if before is not None and before.routable and instance.id not in removes:
                self._routable -= 1
            if instance.routable:
                self._routable += 1
        await self._install(new)
        self._feed.delta(previous, new, upserts, removes)

    async def take_reload(self, new: LiveList) -> None:
        """Install ``new``, loaded whole; subscribers get the two lists' difference."""
        previous = self._current
        self._routable = sum(1 for instance in new.servers.values() if instance.routable)
        await self._install(new)
        self._feed.reload(previous, new)

    async def _install(self, new: LiveList) -> None:
        self._current = new
        self._applied_at = self._clock()
        self.confirm()
        self._metrics.epoch.set(new.epoch)
        self._metrics.version.set(new.version)
        self._metrics.servers.set(len(new.servers))
        self._metrics.routable.set(self._routable)
        async with self._changed:
            self._changed.notify_all()

    def subscribe(self) -> AsyncIterator[LiveListChange]:
        """Every step of the list from now on (see :class:`~discovery.livelist.feed.ChangeFeed`)."""
        return self._feed.subscribe(self._current)

    async def wait_until(self, predicate: Callable[[LiveList], bool], timeout: float) -> LiveList:
        """Wait until ``predicate(current)`` holds; returns that list.

        Raises:
            TimeoutError: it did not hold within ``timeout`` seconds.
        """
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: predicate(self._current))
            return self._current

    def close(self) -> None:
        """End the iterators of :meth:`subscribe`; the list stays readable."""
        self._feed.close()
