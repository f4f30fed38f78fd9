"""Fan a follower's list changes out to any number of async iterators.

Each subscriber has its own queue (a slow consumer delays only itself and loses nothing),
starting with the list held; every queue ends when the feed closes.

Design: docs/design/live-list.md, "The live-list store".
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from types import MappingProxyType

from discovery.instance import ServiceInstance
from discovery.livelist.model import LiveList, LiveListChange

__all__ = ["ChangeFeed", "diff_lists"]


def diff_lists(
    previous: LiveList, current: LiveList, reason: str = "not in the reloaded list"
) -> LiveListChange:
    """The change from ``previous`` to ``current`` as a reload; removals get ``reason``."""
    old, new = previous.servers, current.servers
    added = {k: v for k, v in new.items() if k not in old}
    changed = {k: v for k, v in new.items() if k in old and old[k] != v}
    removed = {k: reason for k in old if k not in new}
    return LiveListChange(
        previous,
        current,
        MappingProxyType(added),
        MappingProxyType(changed),
        MappingProxyType(removed),
        reload=True,
    )


class _Subscription:
    """One subscriber's iterator; ``forget(self)`` is called when it is closed early."""

    def __init__(self, forget: Callable[[_Subscription], None]) -> None:
        self._forget = forget
        self.queue: asyncio.Queue[LiveListChange | None] = asyncio.Queue()

    def __aiter__(self) -> AsyncIterator[LiveListChange]:
        return self

    async def __anext__(self) -> LiveListChange:
        item = await self.queue.get()
        if item is None:
            raise StopAsyncIteration
        return item

    async def aclose(self) -> None:
        """Stop receiving (``async for`` left early); the feed forgets this iterator."""
        self._forget(self)


class ChangeFeed:
    """The subscribers of one follower's changes (see the module docstring)."""

    def __init__(self) -> None:
        self._subscribers: set[_Subscription] = set()
        self._closed = False

    def subscribe(self, current: LiveList) -> AsyncIterator[LiveListChange]:
        """A new iterator; its first item is ``current``, all of it added."""
        subscription = _Subscription(self._subscribers.discard)
        if self._closed:
            subscription.queue.put_nowait(None)
            return subscription
        subscription.queue.put_nowait(
            LiveListChange(
                LiveList.EMPTY,
                current,
                added=current.servers,
                reload=True,
            )
        )
        self._subscribers.add(subscription)
        return subscription

    def publish(self, change: LiveListChange) -> None:
        """Queue ``change`` for every subscriber (no-op without subscribers)."""
        for subscription in self._subscribers:
            subscription.queue.put_nowait(change)

    def delta(
        self,
        previous: LiveList,
        current: LiveList,
        upserts: tuple[ServiceInstance, ...],
        removes: Mapping[str, str],
    ) -> None:
        """Queue the change a delta made: O(changed). Does nothing without subscribers."""
        if not self._subscribers:
            return
        old = previous.servers
        added = {i.id: i for i in upserts if i.id not in old}
        changed = {i.id: i for i in upserts if i.id in old and old[i.id] != i}
        removed = {k: why for k, why in removes.items() if k in old}
        self.publish(
            LiveListChange(
                previous,
                current,
                MappingProxyType(added),
                MappingProxyType(changed),
                MappingProxyType(removed),
            )
        )

    def reload(self, previous: LiveList, current: LiveList) -> None:
        """Queue the change a reload made (O(N)). Does nothing without subscribers."""
        if self._subscribers:
            self.publish(diff_lists(previous, current))

    def close(self) -> None:
        """End every iterator; later subscribers end at once."""
        self._closed = True
        for subscription in self._subscribers:
            subscription.queue.put_nowait(None)
        self._subscribers.clear()
