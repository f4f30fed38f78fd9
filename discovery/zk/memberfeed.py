"""The fan-out of a membership watcher's change sets (:class:`MembershipFeed`): to every
:class:`MembershipSubscription`, in order, none dropped, and to those waiting for a
condition on the members."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from discovery.zk.memberview import MembershipChange

__all__ = ["MembershipFeed", "MembershipSubscription"]


class MembershipSubscription:
    """An async iterator of :class:`MembershipChange`; ends when the watcher closes.

    The first item is the current view with every member in ``added``; then every
    change set in order (none is dropped: a slow consumer sees them queued).
    """

    def __init__(self, unsubscribe: Callable[[MembershipSubscription], None]) -> None:
        self._unsubscribe = unsubscribe
        self._queue: asyncio.Queue[MembershipChange | None] = asyncio.Queue()

    def put(self, change: MembershipChange) -> None:
        """Queue ``change`` for the consumer (the watcher's side; never blocks)."""
        self._queue.put_nowait(change)

    def __aiter__(self) -> AsyncIterator[MembershipChange]:
        return self

    async def __anext__(self) -> MembershipChange:
        item = await self._queue.get()
        if item is None:
            raise StopAsyncIteration
        return item

    def close(self) -> None:
        self._unsubscribe(self)
        self._queue.put_nowait(None)


class MembershipFeed:
    """The subscriptions of one watcher, and the tasks waiting for a change.

    :meth:`publish` never blocks on a consumer (each subscription queues); :meth:`close`
    ends every subscription.
    """

    def __init__(self) -> None:
        self._subscribers: set[MembershipSubscription] = set()
        self._changed = asyncio.Condition()

    def subscribe(self, current: MembershipChange | None) -> MembershipSubscription:
        """A new subscription, handed ``current`` first unless None."""
        subscription = MembershipSubscription(self._subscribers.discard)
        if current is not None:
            subscription.put(current)
        self._subscribers.add(subscription)
        return subscription

    async def publish(self, change: MembershipChange) -> None:
        """Queue ``change`` for every subscription, then wake the waiters."""
        for subscription in list(self._subscribers):
            subscription.put(change)
        async with self._changed:
            self._changed.notify_all()

    async def wait_until(self, predicate: Callable[[], bool], timeout: float) -> None:
        """Wait until ``predicate()`` holds, checked now and after every change.

        Raises:
            TimeoutError: it did not hold within ``timeout`` seconds.
        """
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(predicate)

    def close(self) -> None:
        """End every subscription."""
        for subscription in list(self._subscribers):
            subscription.close()
