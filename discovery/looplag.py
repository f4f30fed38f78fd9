"""How far behind a server's own event loop is, so its lateness is blamed on no one else.

:class:`LoopLagMonitor` keeps a timer on the loop it measures (a ``call_at`` chain, not a
task: a few microseconds a wake-up) and remembers each stretch in which it fired more than
``threshold`` late, for :meth:`~LoopLagMonitor.lagged_since`. An async context manager on
that loop; not thread-safe. A monitor never started reports no lag.

Design: docs/design/overload.md, "Only outliers are blamed".
"""

from __future__ import annotations

import asyncio
import math
from types import TracebackType

from prometheus_client import CollectorRegistry, Histogram

__all__ = ["LAG_THRESHOLD", "LoopLagMonitor"]

#: Lateness of the monitor's timer above which the loop counts as lagging, in seconds.
#: A query's deadline is hundreds of milliseconds; a loop 50 ms behind can turn an
#: answer that came in time into a timeout, while a loop a few milliseconds late (the
#: usual scheduling noise of a busy machine) cannot.
LAG_THRESHOLD = 0.05


class LoopLagMonitor:
    """Measures the lateness of a timer on the running loop (see the module doc).

    ``registry`` gets the histogram ``metric`` (default
    ``search_server_event_loop_lag_seconds``: the lateness of each wake-up) when given.
    Raises ``ValueError`` for a non-positive interval or a negative threshold.
    """

    def __init__(
        self,
        *,
        interval: float = 0.025,
        threshold: float = LAG_THRESHOLD,
        registry: CollectorRegistry | None = None,
        metric: str = "search_server_event_loop_lag_seconds",
    ) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval}")
        if not threshold >= 0:
            raise ValueError(f"threshold must be >= 0 seconds, got {threshold}")
        self.interval = interval
        self.threshold = threshold
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0
        # The end of the last lag (the loop's clock): when the late timer finally ran.
        self._last_lag_end = -math.inf
        self.last_lag = 0.0
        self._histogram = (
            None
            if registry is None
            else Histogram(
                metric,
                "How late this server's event loop ran a timer: its own lag (a search "
                "server blames no replica for a timeout meanwhile; a data server counts "
                "it against a request's budget).",
                buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
                registry=registry,
            )
        )

    def start(self) -> None:
        """Start measuring on the running loop (idempotent)."""
        if self._loop is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._schedule(self._loop.time())

    async def aclose(self) -> None:
        """Stop measuring."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._loop = None

    async def __aenter__(self) -> LoopLagMonitor:
        self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def lagged_since(self, since: float) -> bool:
        """The loop lagged (a lateness above the threshold) at some time at or after
        ``since`` (the loop's clock), or lags right now."""
        if self._last_lag_end >= since:
            return True
        # The current wake-up is overdue: the loop is behind at this very moment (the
        # caller runs late too, but before our timer had its turn).
        loop = self._loop
        return loop is not None and loop.time() - self._due > self.threshold

    def observe(self, due: float, now: float) -> None:
        """Record one wake-up that was ``due`` and ran at ``now`` (the timer's callback;
        public so that tests can feed it)."""
        late = max(0.0, now - due)
        self.last_lag = late
        if self._histogram is not None:
            self._histogram.observe(late)
        if late > self.threshold:
            self._last_lag_end = now

    def _schedule(self, due: float) -> None:
        assert self._loop is not None
        self._due = due
        self._handle = self._loop.call_at(due, self._tick)

    def _tick(self) -> None:
        loop = self._loop
        if loop is None:
            return
        now = loop.time()
        self.observe(self._due, now)
        self._schedule(now + self.interval)
