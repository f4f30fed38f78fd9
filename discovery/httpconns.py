"""The HTTP servers' cap on open connections, and their shorter keep-alive as it nears.

:class:`ConnectionCap` counts a server's open connections and knows which of them are
idle: kept alive after a complete request, with no request in progress and no byte of
the next one. A connection that arrives at the cap closes the one idle longest; with
none idle it is not admitted (the caller may make room otherwise, or refuse it). While
more than :data:`PRESSURE_FILL` of the cap is open, a connection idle longer than
``pressure_keepalive`` is closed, longest idle first, until the fill is back down. A
connection with a request in progress is never closed here. On the server's loop; not
thread-safe.

Design: docs/design/security.md, "HTTP edge".
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections.abc import Callable
from typing import Final, Protocol

from discovery.metrics import HttpEdgeMetrics

__all__ = [
    "PRESSURE_FILL",
    "ConnectionCap",
    "IdleConnection",
    "Timer",
    "default_max_connections",
    "file_limit",
]

log = logging.getLogger(__name__)

#: Above this share of the cap open, idle connections get the short keep-alive.
PRESSURE_FILL: Final = 0.75

#: Descriptors left to everything but accepted connections: at least this many ...
_RESERVE_MIN: Final = 64
#: ... or this share of the limit if more, but never more than half of it.
_RESERVE_SHARE: Final = 0.25
#: Linux's highest open-file limit by default (``fs.nr_open``), for an unlimited process.
_UNLIMITED: Final = 1 << 20


def file_limit() -> int:
    """This process's soft open-file limit (RLIMIT_NOFILE); :data:`_UNLIMITED` if none."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return _UNLIMITED if soft == resource.RLIM_INFINITY else int(soft)


def default_max_connections(soft_limit: int) -> int:
    """The cap on open connections for a process allowed ``soft_limit`` open files.

    The limit less a reserve for the descriptors that are not accepted connections: the
    process's own (standard streams, the event loop's, the listening socket, logs, index
    snapshots), ZooKeeper's and Redis's few, the agent's probe, and the search server's
    pooled connections to data servers, which grow with the cluster as the limit an
    operator sets for it does. So a quarter of the limit, at least 64, at most half:
    768 of 1,024, 64 of 128, 49,152 of 65,536.
    """
    reserve = min(max(_RESERVE_MIN, int(soft_limit * _RESERVE_SHARE)), soft_limit // 2)
    return max(1, soft_limit - reserve)


class IdleConnection(Protocol):
    """A connection the cap may close while it is idle."""

    def close_idle(self, reason: str) -> None:
        """Close now; ``reason`` is ``cap`` or ``pressure``. The cap has forgotten it."""


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class Timer(Protocol):
    """A clock and its alarms: an event loop's ``time`` and ``call_at``."""

    def time(self) -> float: ...

    def call_at(self, when: float, callback: Callable[[], object]) -> Cancellable: ...


class ConnectionCap:
    """At most ``limit`` connections open; idle ones make room, and go sooner near it.

    Use: :meth:`admit` each new connection (False: at the cap and none idle), then tell
    :meth:`idle` and :meth:`active` as it idles and gets a request's first byte, and
    :meth:`lost` when it closes (whoever closed it). Metrics go to ``metrics``; ``timer``
    defaults to the running loop.
    """

    def __init__(
        self,
        limit: int,
        pressure_keepalive: float,
        metrics: HttpEdgeMetrics,
        timer: Timer | None = None,
    ) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        self.limit = limit
        self.pressure_keepalive = pressure_keepalive
        #: Open connections beyond this many put idle ones on the short keep-alive.
        self.pressure_threshold = int(limit * PRESSURE_FILL)
        self._metrics = metrics
        self._timer = timer
        self._open: set[IdleConnection] = set()
        # Idle ones, each with when it became idle. Entries are added as they idle, so
        # the insertion order (a dict's) is the idle times' order: the first entry is
        # the longest idle, and the next whose short keep-alive ends (one timer for all).
        self._idle: dict[IdleConnection, float] = {}
        self._sweeper: Cancellable | None = None
        self.refused = 0
        metrics.max_connections.set(limit)
        metrics.connections.set_function(lambda: len(self._open))

    @property
    def open(self) -> int:
        """Connections admitted and not yet closed."""
        return len(self._open)

    @property
    def idle_count(self) -> int:
        """Open connections idle now."""
        return len(self._idle)

    def _clock(self) -> Timer:
        return self._timer if self._timer is not None else asyncio.get_running_loop()

    def admit(self, connection: IdleConnection) -> bool:
        """Count ``connection`` open, closing the longest idle one at the cap.

        False, and nothing counted, when at the cap with none idle: a connection with a
        request in progress is never closed to make room.
        """
        if len(self._open) >= self.limit:
            if not self._idle:
                return False
            oldest = next(iter(self._idle))
            log.debug("closing the longest idle connection to make room for a new one")
            self._evict(oldest, "cap")
        self._open.add(connection)
        self._schedule()
        return True

    def refuse(self) -> None:
        """Count a connection that was turned away (at the cap, no room made)."""
        self.refused += 1
        self._metrics.refused.inc()

    def idle(self, connection: IdleConnection) -> None:
        """``connection`` is idle from now: its request is answered, no other begun."""
        if connection in self._open and connection not in self._idle:
            self._idle[connection] = self._clock().time()
            self._schedule()

    def active(self, connection: IdleConnection) -> None:
        """``connection`` is no longer idle (a request's first byte arrived)."""
        self._idle.pop(connection, None)

    def lost(self, connection: IdleConnection) -> None:
        """``connection`` is closed (idempotent)."""
        self._idle.pop(connection, None)
        self._open.discard(connection)

    def _evict(self, connection: IdleConnection, reason: str) -> None:
        self.lost(connection)
        self._metrics.idle_closed.labels(reason=reason).inc()
        connection.close_idle(reason)

    # -- the short keep-alive under pressure -------------------------------------------

    def _schedule(self) -> None:
        """Set the timer for the longest idle connection's short keep-alive, if due."""
        if self._sweeper is not None or not self._idle:
            return
        if len(self._open) <= self.pressure_threshold:
            return
        since = next(iter(self._idle.values()))
        self._sweeper = self._clock().call_at(since + self.pressure_keepalive, self._sweep)

    def _sweep(self) -> None:
        """Close connections idle past the short keep-alive while over the threshold."""
        self._sweeper = None
        now = self._clock().time()
        while self._idle and len(self._open) > self.pressure_threshold:
            connection, since = next(iter(self._idle.items()))
            if since + self.pressure_keepalive > now:
                break
            self._evict(connection, "pressure")
        self._schedule()

    def close(self) -> None:
        """Stop the timer (a shutdown); the connections are their server's to close."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
