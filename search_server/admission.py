"""How many queries a search server fans out at once: a limit that follows latency.

Past the limit a query is refused at once with 503, never queued. :class:`GradientLimit`
(the default) and :class:`FixedLimit` (``--admission fixed``) are pure (``now`` is
passed in, no I/O) and not thread-safe: the fan-out calls them on its loop.

Design: docs/design/overload.md, "Adaptive admission".
"""

from __future__ import annotations

import math
from typing import Protocol, runtime_checkable

__all__ = ["ConcurrencyLimit", "FixedLimit", "GradientLimit"]

#: Within half a query, an estimate moving towards its resting point (or a resting
#: point returning to the initial limit) has arrived: both approach exponentially and
#: ``limit`` rounds down, so 9.99 would otherwise be a limit of 9 for minutes.
_ARRIVED = 0.5


@runtime_checkable
class ConcurrencyLimit(Protocol):
    """How many queries may be in flight at once (the admission's seam)."""

    @property
    def limit(self) -> int:
        """The current limit, at least 1."""
        ...

    def on_sample(self, now: float, latency: float, in_flight: int, dropped: bool) -> None:
        """An admitted query ended at ``now`` after ``latency`` seconds; ``in_flight``
        queries were in flight when it was admitted (itself included: what the latency
        was measured under); ``dropped`` if it came back partial for its deadline or an
        overload refusal."""
        ...


class FixedLimit:
    """A constant limit (the behaviour before issue 40). Raises ``ValueError`` below 1."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        self._limit = limit

    @property
    def limit(self) -> int:
        return self._limit

    def on_sample(self, now: float, latency: float, in_flight: int, dropped: bool) -> None:
        pass


class GradientLimit:
    """A limit that follows the gradient of latency (docs/design/overload.md, "Adaptive
    admission").

    Defaults, for queries with a 500 ms deadline whose unloaded latency is tens of
    milliseconds: start at ``initial`` 10 (a search server starting in a busy cluster
    admits a burst's worth, not 256; a fan-out of tens of shards at a few queries in
    flight already keeps a small machine's cores busy); never below ``min_limit`` 1 (a
    query is always admitted, so the latency that would raise the limit again is
    measured; on a machine short of CPU one query at a time may be all that ends
    inside its deadline) nor above ``max_limit`` 256 (the old fixed limit); ``tolerance`` 2 (a
    fan-out waits for the slowest of its shards, and its latency doubles between a
    quiet and a busy second without any overload); ``ceiling`` 0.2 s (two fifths of
    the default 500 ms deadline: a fan-out's p99 is about twice its mean, and the
    admitted queries' p99 must stay inside the deadline); ``smoothing`` 0.2; one update
    per ``window`` (0.5 s, at least ``min_window_samples`` 5 queries) with the window's
    mean latency as the short-term one; a baseline over ``long_window`` 60 windows; a
    resting point learned after ``sustain`` 30 binding windows in a row and forgotten
    with a time constant of ``memory`` 300 s.

    Raises ``ValueError`` for limits out of order or below 1, a tolerance below 1, a
    ceiling that is not a positive number, a smoothing or backoff outside (0, 1],
    windows below 1, or a memory that is not a positive number.
    """

    def __init__(
        self,
        *,
        initial: int = 10,
        min_limit: int = 1,
        max_limit: int = 256,
        tolerance: float = 2.0,
        ceiling: float = 0.2,
        smoothing: float = 0.2,
        long_window: int = 60,
        window: float = 0.5,
        min_window_samples: int = 5,
        backoff: float = 0.7,
        backoff_interval: float = 1.0,
        sustain: int = 30,
        memory: float = 300.0,
    ) -> None:
        if not 1 <= min_limit <= initial <= max_limit:
            raise ValueError(
                f"limits must satisfy 1 <= min ({min_limit}) <= initial ({initial}) "
                f"<= max ({max_limit})"
            )
        if not tolerance >= 1:
            raise ValueError(f"tolerance must be >= 1, got {tolerance}")
        if not (ceiling > 0 and math.isfinite(ceiling)):
            raise ValueError(f"ceiling must be a positive number of seconds, got {ceiling}")
        if not 0 < smoothing <= 1:
            raise ValueError(f"smoothing must be in (0, 1], got {smoothing}")
        if not 0 < backoff <= 1:
            raise ValueError(f"backoff must be in (0, 1], got {backoff}")
        if long_window < 1:
            raise ValueError(f"long_window must be at least 1 window, got {long_window}")
        if not window > 0 or min_window_samples < 1:
            raise ValueError("window must be > 0 seconds and min_window_samples >= 1")
        if not backoff_interval >= 0:
            raise ValueError(f"backoff_interval must be >= 0, got {backoff_interval}")
        if sustain < 1:
            raise ValueError(f"sustain must be at least 1 window, got {sustain}")
        if not (memory > 0 and math.isfinite(memory)):
            raise ValueError(f"memory must be a positive number of seconds, got {memory}")
        self.min_limit = min_limit
        self.max_limit = max_limit
        self.tolerance = tolerance
        self.ceiling = ceiling
        self._smoothing = smoothing
        self._long_alpha = 2 / (long_window + 1)
        self._window = window
        self._min_window_samples = min_window_samples
        # The window being filled: its start, samples, latency sum, most in flight.
        self._window_start: float | None = None
        self._window_count = 0
        self._window_sum = 0.0
        self._window_in_flight = 0
        self._backoff = backoff
        self._backoff_interval = backoff_interval
        self._estimate = float(initial)
        self._initial = initial
        self._sustain = sustain
        self._memory = memory
        #: Where the limit returns to while it does not bind (its resting point).
        self.rest = float(initial)
        self._bound_windows = 0
        self.short: float | None = None
        self.long: float | None = None
        self._backed_off_at = -math.inf
        #: Multiplicative decreases for dropped queries, since start (for metrics).
        self.backoffs = 0

    @property
    def limit(self) -> int:
        return int(self._estimate)

    @property
    def estimate(self) -> float:
        """The limit before rounding down."""
        return self._estimate

    def on_sample(self, now: float, latency: float, in_flight: int, dropped: bool) -> None:
        if not (latency >= 0 and math.isfinite(latency)):
            return  # a clock gone wrong says nothing of the load
        if (
            dropped
            and 2 * in_flight >= self._estimate
            and now - self._backed_off_at >= self._backoff_interval
        ):
            # Late answers while the limit binds: the system was too slow for it. (At a
            # light load they are one bad server's, which no limit would cure.)
            self._backed_off_at = now
            self.backoffs += 1
            self._estimate = max(self.min_limit, self._estimate * self._backoff)
        # One update per window of samples, with their mean: a fan-out's latency is
        # the slowest of its shards and varies a lot from one query to the next, and
        # answers report on the limit of one latency ago, so an update per query
        # overshot (the limit climbed faster than the latency it raised came back).
        if self._window_start is None:
            self._window_start = now
        self._window_count += 1
        self._window_sum += latency
        self._window_in_flight = max(self._window_in_flight, in_flight)
        if now - self._window_start < self._window or self._window_count < self._min_window_samples:
            return
        mean = self._window_sum / self._window_count
        in_flight = self._window_in_flight
        # The resting point fades towards ``initial`` with time, whatever the window
        # shows; only a load that keeps binding the limit sets it again (below).
        self._forget(now - self._window_start)
        self._window_start = now
        self._window_count = 0
        self._window_sum = 0.0
        self._window_in_flight = 0
        short, long = mean, self.long
        if long is None:
            long = mean
        else:
            long += self._long_alpha * (mean - long)
            if long > 2 * short:
                # The overload is over: the baseline it inflated comes down quickly.
                long = 0.95 * long + 0.05 * short
        self.short, self.long = short, long
        # Never below a quarter of the ceiling: the baseline is the queueing of a quiet
        # cluster, a few milliseconds, and twice that is no sign of overload (a burst, an
        # expensive query's neighbours).
        wanted = min(max(self.tolerance * long, self.ceiling / 4), self.ceiling)
        gradient = 1.0 if short <= 0 else max(0.5, min(1.0, wanted / short))
        bound = 2 * in_flight >= self._estimate
        self._bound_windows = self._bound_windows + 1 if bound else 0
        if not bound:
            # App-limited: the limit does not bind, so the latency says nothing of a
            # higher one; it only comes down, when the latency says the cluster is
            # slower than it should be (a machine short of CPU: what is in flight now
            # already takes too long, and the limit must fall below it to shed), or
            # otherwise moves towards its resting point, by at most a step a window
            # (so that bursts over a long run do not ratchet it down for good, and a
            # light load does not keep a limit the cluster has not shown it takes).
            rest, step = self.rest, math.sqrt(self._estimate)
            if gradient < 1.0:
                target = self._estimate * gradient
            elif self._estimate < rest:
                target = min(rest, self._estimate + step)
            elif self._estimate > rest:
                target = max(rest, self._estimate - step)
            else:
                return
        elif gradient < 1.0:
            # Too slow: down at once. A fan-out's latency climbs steeply near the knee
            # (every shard's answer waits in a busier queue), and a smoothed decrease
            # left the limit over the cliff for seconds, every answer partial.
            self._estimate = max(float(self.min_limit), self._estimate * gradient)
            self._learn()
            return
        else:
            # Fast enough: up, gently, by a share of the queue a higher limit allows.
            target = self._estimate + math.sqrt(self._estimate)
        estimate = self._estimate + self._smoothing * (target - self._estimate)
        if not bound and gradient >= 1.0 and abs(estimate - self.rest) < _ARRIVED:
            estimate = self.rest  # a smoothed approach would never get there
        self._estimate = max(float(self.min_limit), min(float(self.max_limit), estimate))
        if bound:
            self._learn()

    def _learn(self) -> None:
        """After a binding window: the limit is the resting point once the load has
        pressed on it for ``sustain`` windows in a row (one burst is no measure of the
        cluster)."""
        if self._bound_windows >= self._sustain:
            self.rest = self._estimate

    def _forget(self, elapsed: float) -> None:
        """The resting point returns towards ``initial`` (exponentially, ``memory``)."""
        rest = self._initial + (self.rest - self._initial) * math.exp(-elapsed / self._memory)
        self.rest = float(self._initial) if abs(rest - self._initial) < _ARRIVED else rest
