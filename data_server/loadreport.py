"""The load a data server reports in every ``/search`` answer, for search servers that
weight its replicas by it (``search_server.wrr``).

:class:`LoadMeter` counts the searches admitted (:meth:`~LoadMeter.enter`,
:meth:`~LoadMeter.leave`) over a window of a few seconds and :meth:`~LoadMeter.report`
gives a :class:`Load`: ``utilization`` (the searches in progress, averaged over the
window), ``qps`` and ``eps`` (searches answered, and answered with a 5xx, per second).
O(1) per request, a few dozen bytes in all, clock injected; no I/O, not thread-safe
(the server's loop only); an unpaired ``leave`` raises :class:`RuntimeError`.

Design: docs/design/data-server.md, "The load report".
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import NamedTuple

__all__ = ["BUCKETS", "BUCKET_SECONDS", "Load", "LoadMeter"]

#: Width of one bucket of the window, in seconds.
BUCKET_SECONDS = 1.0
#: Buckets in the window: the figures cover the current bucket so far and the two before
#: it (2 to 3 s), so they move smoothly when a bucket is dropped, never to zero.
BUCKETS = 3


class Load(NamedTuple):
    """One report: ``utilization`` (to 3 significant digits), ``qps`` and ``eps`` (to 2
    decimals: one answer in a window is a third a second or more)."""

    utilization: float
    qps: float
    eps: float


class LoadMeter:
    """The searches in progress and answered over the last ``buckets`` buckets of
    ``bucket`` seconds each, on ``clock``.

    ``utilization`` is Little's L: the integral of the searches in progress over the
    window, divided by its length. It counts every wait inside the admission (an
    injected ``slow`` fault's sleep, the slices a search yields to the others, the loop's
    lag), which is what makes a replica slow for the search servers, where CPU time
    would miss the sleeps. By Little's law it is ``qps`` times the mean time a search
    spends here, so ``qps / utilization`` is one over that time: a replica slowed ten
    times reports ten times the utilization at the same ``qps``.

    The window is the current bucket so far and the ``buckets - 1`` before it (never
    before the meter was made, never shorter than one bucket): a rotation drops the
    oldest bucket, so the figures shrink by a bucket's share rather than jump to zero.

    Raises ``ValueError`` for ``bucket`` not a positive finite number or ``buckets``
    below 2.
    """

    __slots__ = (
        "_answers",
        "_area",
        "_bucket",
        "_clock",
        "_count",
        "_epoch",
        "_errors",
        "_in_flight",
        "_last",
        "_started",
    )

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        bucket: float = BUCKET_SECONDS,
        buckets: int = BUCKETS,
    ) -> None:
        if not 0 < bucket < math.inf:
            raise ValueError(f"bucket must be a positive number of seconds, got {bucket}")
        if buckets < 2:
            raise ValueError(f"buckets must be at least 2, got {buckets}")
        self._clock = clock
        self._bucket = bucket
        self._count = buckets
        now = clock()
        self._started = now
        self._last = now
        # The bucket ``now`` falls in (buckets are numbered from the clock's zero); the
        # ring holds it and the ``buckets - 1`` before it, at their number mod ``buckets``.
        self._epoch = int(now // bucket)
        self._area = [0.0] * buckets  # searches in progress x seconds
        self._answers = [0] * buckets
        self._errors = [0] * buckets
        self._in_flight = 0

    @property
    def in_flight(self) -> int:
        """Searches entered and not yet left."""
        return self._in_flight

    def enter(self) -> None:
        """A search was admitted."""
        self._advance(self._clock())
        self._in_flight += 1

    def leave(self, *, error: bool = False) -> None:
        """A search admitted has ended (answered, or abandoned by its client); ``error``:
        it was answered with a 5xx (an injected error, a budget spent before it began).

        Raises:
            RuntimeError: no search is in progress (an unpaired ``leave``).
        """
        if self._in_flight == 0:
            raise RuntimeError("leave() without a search in progress")
        self._advance(self._clock())
        self._in_flight -= 1
        slot = self._epoch % self._count
        self._answers[slot] += 1
        if error:
            self._errors[slot] += 1

    def report(self) -> Load:
        """The load over the window up to now."""
        now = self._clock()
        self._advance(now)
        bucket = self._bucket
        span = (self._count - 1) * bucket + (now - self._epoch * bucket)
        # Not before the meter began (a young server's window is its life so far), and
        # never less than a bucket: one answer in a microsecond is not a million a second.
        span = max(min(span, now - self._started), bucket)
        return Load(
            # Significant digits, not decimals: a fast server at a low rate is busy a
            # ten-thousandth of the time, which 3 decimals would report as 0, no weight.
            float(f"{sum(self._area) / span:.3g}"),
            round(sum(self._answers) / span, 2),
            round(sum(self._errors) / span, 2),
        )

    def _advance(self, now: float) -> None:
        """Add the searches in progress since the last event, up to ``now``, to the
        buckets they fell in; clear the buckets entered since (at most ``buckets``)."""
        last = self._last
        if now <= last:
            return  # the same instant (or a clock that went back): nothing elapsed
        self._last = now
        bucket, count, area = self._bucket, self._count, self._area
        in_flight = self._in_flight
        current = self._epoch
        epoch = int(now // bucket)
        if epoch == current:
            area[current % count] += in_flight * (now - last)
            return
        # The rest of the bucket ``last`` fell in, then the ones entered since: whole
        # ones with ``in_flight`` throughout, the last one up to ``now``. Only the newest
        # ``count`` matter: older ones would be overwritten in the ring anyway.
        area[current % count] += in_flight * ((current + 1) * bucket - last)
        for entered in range(max(current + 1, epoch - count + 1), epoch + 1):
            slot = entered % count
            end = now if entered == epoch else (entered + 1) * bucket
            area[slot] = in_flight * (end - entered * bucket)
            self._answers[slot] = 0
            self._errors[slot] = 0
        self._epoch = epoch
