"""The HTTP servers' connections waiting for a request head: how many, and for how long.

:class:`HeadWaits` holds the connections waiting for a request head (a new connection,
or a kept-alive one from the first byte of its next request). Starting a wait with
``max_pending_headers`` already waiting closes the one that has waited longest; one
timer closes each whose ``header_timeout`` is over. On the server's loop; not
thread-safe.

Design: docs/design/security.md, "HTTP edge".
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from discovery.config import HttpEdgeConfig
from discovery.metrics import HttpEdgeMetrics

__all__ = ["HeadWaits", "WaitingConnection"]

log = logging.getLogger(__name__)


class WaitingConnection(Protocol):
    """A connection waiting for a request head."""

    def expire(self, reason: str) -> None:
        """Close now (``evicted``, ``header_timeout``, ``shutdown``), which ends its wait
        (:meth:`HeadWaits.stop_waiting`) and reports it (:meth:`HeadWaits.closed`)."""


class HeadWaits:
    """The connections waiting for a request head, and their deadlines.

    Closes are counted on ``metrics`` (not those of a shutdown).
    """

    def __init__(self, config: HttpEdgeConfig, metrics: HttpEdgeMetrics) -> None:
        self._config = config
        self._metrics = metrics
        # Those waiting for a request head, by deadline. Every wait is as long, so the
        # insertion order (a dict's) is the deadlines' order: the first entry is both the
        # longest waiting and the next to expire, and one timer for it serves them all
        # (no timer per request to arm and cancel).
        self._waiting: dict[WaitingConnection, float] = {}
        self._sweeper: asyncio.TimerHandle | None = None
        self.closed_slow = 0
        self.evicted = 0

    @property
    def waiting(self) -> int:
        """Connections waiting for a request head now."""
        return len(self._waiting)

    def start_waiting(self, connection: WaitingConnection) -> None:
        config = self._config
        while len(self._waiting) >= config.max_pending_headers:
            log.debug("closing a connection waiting for its request headers to make room")
            self.evict_oldest()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + config.header_timeout
        self._waiting[connection] = deadline
        if self._sweeper is None:
            self._sweeper = loop.call_at(deadline, self._sweep)

    def stop_waiting(self, connection: WaitingConnection) -> None:
        self._waiting.pop(connection, None)

    def evict_oldest(self) -> bool:
        """Close the connection that has waited longest; False if none waits."""
        if not self._waiting:
            return False
        next(iter(self._waiting)).expire("evicted")  # which removes it from _waiting
        return True

    def _sweep(self) -> None:
        """Close the connections whose wait is over; come back for the next one."""
        self._sweeper = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        while self._waiting:
            connection, deadline = next(iter(self._waiting.items()))
            if deadline > now:
                self._sweeper = loop.call_at(deadline, self._sweep)
                return
            connection.expire("header_timeout")  # which removes it from _waiting

    def closed(self, reason: str) -> None:
        """Count a connection closed for ``reason`` (``evicted``, ``header_timeout``)."""
        if reason == "shutdown":
            return
        self._metrics.closed.labels(reason=reason).inc()
        if reason == "evicted":
            self.evicted += 1
        else:
            self.closed_slow += 1

    def close(self) -> None:
        """Close every connection waiting for a head (a shutdown), and stop the timer."""
        for connection in list(self._waiting):
            connection.expire("shutdown")
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
