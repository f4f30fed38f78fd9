"""Whose lateness a fan-out saw: its replicas', or its own (or everyone's).

:class:`OwnLoad` tells when this search server is behind; :class:`TimeoutBlame` what a
query's requests still out at its deadline are charged with. Times are the fan-out's
``clock`` unless named otherwise; not thread-safe (the fan-out's event loop).

Design: docs/design/overload.md, "Only outliers are blamed".
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterable

from discovery.looplag import LoopLagMonitor

from .metrics import FanOutMetrics
from .picking import Replica

__all__ = ["OUTLIERS", "SHED_HEDGE_PAUSE", "Blame", "OwnLoad", "TimeoutBlame"]

#: Late shards a query may have for their timeouts to still be blamed on their replicas
#: (or a tenth of its shards, if more): more are a slow machine's, not outliers.
OUTLIERS = 2
#: Seconds after a query was refused for the in-flight limit during which no hedge is
#: sent, and a late shard is the load's.
SHED_HEDGE_PAUSE = 1.0
# Seconds over which the data servers that timed out (in any query) are counted: more of
# them than outliers make is a busy machine, not slow replicas (TimeoutBlame.judge).
_TIMEOUT_WINDOW = 1.0


class Blame(enum.Enum):
    """What a timeout at a query's deadline is charged with (TimeoutBlame.judge)."""

    NONE = "none"  # nothing: the lateness may be ours or everyone's
    LATENCY = "latency"  # its replica's latency only: slow, but no step towards ejection
    FULL = "full"  # its latency and a failure: a step towards ejection


class OwnLoad:
    """Signs that this search server is itself the bottleneck: a query refused for its
    in-flight limit (:meth:`shed`), its loop lagging (``loop_lag``, if watched)."""

    def __init__(self, clock: Callable[[], float], loop_lag: LoopLagMonitor | None) -> None:
        self._clock = clock
        self._loop_lag = loop_lag
        # When a query was last refused for the limit: hedges stop for a while, since a
        # hedge is load a shedding server cannot spare.
        self._shed_at = -math.inf

    def shed(self) -> None:
        """A query was refused for the in-flight limit now."""
        self._shed_at = self._clock()

    def since_shed(self) -> float:
        """Seconds since a query was last refused for the limit (inf: never)."""
        return self._clock() - self._shed_at

    def lagged_since(self, started: float) -> bool:
        """The loop fell behind since ``started`` (the loop's time)."""
        return self._loop_lag is not None and self._loop_lag.lagged_since(started)

    @property
    def lag(self) -> float:
        """How far behind the loop was at its last check (seconds; 0 if not watched)."""
        return self._loop_lag.last_lag if self._loop_lag is not None else 0.0


class TimeoutBlame:
    """What the requests still out at a query's deadline are charged with.

    ``stall_grace``: how late past its deadline a query may wake and still charge
    anyone. ``routable`` says how many data servers are routable now.
    """

    def __init__(
        self,
        own: OwnLoad,
        *,
        clock: Callable[[], float],
        metrics: FanOutMetrics,
        routable: Callable[[], int],
        stall_grace: float,
    ) -> None:
        self._own = own
        self._clock = clock
        self._metrics = metrics
        self._routable = routable
        self._stall_grace = stall_grace
        # The replicas that timed out within the last _TIMEOUT_WINDOW, in any query, and
        # when, oldest first: how widespread lateness is now. Pruned at each query's
        # deadline that finds shards late, so a few may linger while none is late (a
        # replica that left the list among them, until then).
        self._timed_out: dict[Replica, float] = {}

    def judge(
        self,
        late: Iterable[Replica],
        *,
        started: float,
        deadline: float,
        now: float,
        open_calls: int,
        total: int,
    ) -> Blame:
        """Whether the ``late`` replicas (still out at the deadline of a query of
        ``total`` shards, ``open_calls`` of them unanswered; loop times) may be charged
        with timeouts (their latency, their run of failures towards ejection).

        Not when the lateness may be ours or everyone's: woken more than
        ``stall_grace`` past the deadline (this search server was not running at it); its
        loop lagged while the query was out (an answer may have sat in a socket unread);
        it refused queries for its in-flight limit meanwhile or within a second before
        (it was at its capacity); more of the query's shards were late than outliers
        make (more than two, and more than a tenth of them: a busy machine or a stalled
        process of many data servers, not a slow replica); or, over all queries, more
        data servers than that (a tenth of the routable ones) timed out within the last
        second. The last is the same rule across queries: on a machine short of CPU
        each query has a shard or two late, a different one each time, so every query
        looked like one outlier, and a replica that happened to be late in three
        queries running was ejected (bench_overload, two CPU hogs: 25 timeouts charged
        to 21 data servers in 0.66 s). Widespread timeouts still count in their
        replicas' latency (:attr:`Blame.LATENCY`): each was late among shards that
        answered, and the pickers may route around it (a fleet still warming up after a
        start), but none is a step towards ejection. A timeout is charged in full only
        when it is an outlier of a query that otherwise went on time, at a moment when
        the other replicas answer on time.
        """
        widespread = self._note_timeouts(late)
        if now - deadline > self._stall_grace:
            why = "stall"
        elif self._own.lagged_since(started):
            why = "lag"
        elif self._own.since_shed() <= now - started + SHED_HEDGE_PAUSE:
            # Refusing queries for its limit while this one ran (or just before): the
            # search server was at its capacity, and a late shard is the load's.
            why = "shedding"
        elif open_calls > max(OUTLIERS, total // 10):
            why = "systemic"
        elif widespread > max(OUTLIERS, self._routable() // 10):
            why = "widespread"
        else:
            return Blame.FULL
        self._metrics.unblamed.labels(why=why).inc(open_calls)
        return Blame.LATENCY if why == "widespread" else Blame.NONE

    def _note_timeouts(self, late: Iterable[Replica]) -> int:
        """Remember the ``late`` replicas; how many replicas timed out within the last
        ``_TIMEOUT_WINDOW`` (these included).

        Amortised O(1) per timeout: the dict is in the order of the last timeout of
        each replica, so the expired ones are at its front."""
        now = self._clock()
        timed_out = self._timed_out
        for replica in late:
            # Moved to the end: the order stays that of the last timeout.
            timed_out.pop(replica, None)
            timed_out[replica] = now
        horizon = now - _TIMEOUT_WINDOW
        while timed_out:
            oldest = next(iter(timed_out))
            if timed_out[oldest] > horizon:
                break
            del timed_out[oldest]
        return len(timed_out)
