"""A ZooKeeper session's states as the event loop sees them, and their fan-out.

Loop-side only: kazoo's threads never touch it.

Design: docs/design/zookeeper.md, "The session: kazoo's threads and the loop".
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

__all__ = ["SessionEvent", "SessionEvents", "SessionState", "SessionSubscription"]

log = logging.getLogger(__name__)


class SessionState(enum.Enum):
    """Connection state of a :class:`~discovery.zk.session.ZkSession` as seen on the
    event loop."""

    CONNECTING = "connecting"
    CONNECTED = "connected"
    SUSPENDED = "suspended"
    LOST = "lost"
    CLOSED = "closed"


@dataclass(frozen=True)
class SessionEvent:
    """A state change. ``new_session`` is true on the first CONNECTED of each session."""

    state: SessionState
    session_id: int | None
    new_session: bool = False


class SessionSubscription:
    """An async iterator of :class:`SessionEvent`; ends after the CLOSED event.

    Events are queued, never dropped, so a recipe sees every LOST even if it was busy.
    """

    def __init__(self, unsubscribe: Callable[[SessionSubscription], None]) -> None:
        self._unsubscribe = unsubscribe
        self._queue: asyncio.Queue[SessionEvent | None] = asyncio.Queue()
        self._done = False

    def put(self, event: SessionEvent) -> None:
        """Queue ``event`` for the consumer (the fan-out's side; never blocks)."""
        self._queue.put_nowait(event)

    def __aiter__(self) -> AsyncIterator[SessionEvent]:
        return self

    async def __anext__(self) -> SessionEvent:
        if self._done:
            raise StopAsyncIteration
        event = await self._queue.get()
        if event is None:
            raise StopAsyncIteration
        if event.state is SessionState.CLOSED:
            self._done = True
        return event

    def close(self) -> None:
        """Stop receiving events; a consumer waiting in ``async for`` ends."""
        self._unsubscribe(self)
        self._done = True
        self._queue.put_nowait(None)


class SessionEvents:
    """The fan-out of one session's state changes.

    A failing listener is logged and the others still run. After CLOSED nobody is
    subscribed any more, and a late subscriber receives CLOSED at once.
    """

    def __init__(self) -> None:
        self._subscribers: set[SessionSubscription] = set()
        self._listeners: list[Callable[[SessionEvent], None]] = []
        self._closed: SessionEvent | None = None

    def subscribe(self) -> SessionSubscription:
        """Receive every state change from now on (see :class:`SessionSubscription`)."""
        subscription = SessionSubscription(self._subscribers.discard)
        if self._closed is not None:
            subscription.put(self._closed)
        else:
            self._subscribers.add(subscription)
        return subscription

    def add_listener(self, listener: Callable[[SessionEvent], None]) -> None:
        """Call ``listener(event)`` synchronously at every state change."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[SessionEvent], None]) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(listener)

    def publish(self, event: SessionEvent) -> None:
        """Queue ``event`` for every subscriber, then call every listener."""
        if event.state is SessionState.CLOSED:
            self._closed = event
        for subscriber in list(self._subscribers):
            subscriber.put(event)
        for listener in list(self._listeners):
            try:
                listener(event)
            except Exception:
                log.exception("session listener %r failed", listener)
        if event.state is SessionState.CLOSED:
            self._subscribers.clear()
