"""When a shard's request is worth a hedge, and how many hedges the fan-out may send.

:class:`HedgePolicy` gives the delays and keeps the :class:`HedgeBudget`; the fan-out
sends the hedges. No clock, no I/O: a policy reads only the latencies it was given.

Design: docs/design/search-server.md, "Hedged requests".
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .picking import LatencyWindow, Replica

__all__ = ["SIBLING_RATIO", "HedgeBudget", "HedgePolicy", "hedge_window"]

#: How many times the median time of the query's shards that answered a shard's request
#: must have been out before it is hedged (see :meth:`Query._hedge
#: <search_server.query.Query._hedge>`). An expensive query (a shard's frequent terms) is
#: expensive on every shard and every replica: a hedge of its slowest shard, out past
#: the replicas' p95 only because the query is expensive, duplicated an expensive search
#: on a replica no less busy and rarely won (2-5 % in the dispatch benchmark), and made
#: the queries behind it slower: p99.9 8.4 ms with hedges at the p95 against 7.8 without
#: hedging, nothing slowed; 13.7 against 10.4 with a replica slowed. At 3 times, ours
#: hedges a few dozen times a window and its p99.9 is the oracle's (BENCHMARKS,
#: "Dispatch policies"); at 2, hedges were still ten times as many and cost 2 ms of
#: p99.9. A straggler on a slowed or stalled replica is many times its siblings' time.
SIBLING_RATIO = 3.0


class HedgeBudget:
    """Allows hedges up to ``ratio`` of the sub-requests, plus a burst of ``burst``.

    Each sub-request deposits ``ratio`` of a token (up to ``burst`` tokens); a hedge
    takes one; it starts empty. Over any stretch, hedges ≤ ratio x sub-requests + burst.

    Raises ``ValueError`` for a ratio out of 0..1.
    """

    __slots__ = ("_burst", "_ratio", "_tokens")

    def __init__(self, ratio: float = 0.05, burst: float = 100.0) -> None:
        if not 0 <= ratio <= 1:
            raise ValueError(f"hedge ratio must be in 0..1, got {ratio}")
        self._ratio = ratio
        self._burst = burst
        # Empty at start, earned by traffic: a search server that has just started pays
        # for new connections everywhere, and a full budget then (tried) hedged that
        # cold start into a storm that saturated a 2-core machine (the demo's recovery).
        self._tokens = 0.0

    def deposit(self, requests: int) -> None:
        """Earn the hedges of ``requests`` sub-requests (never past the burst)."""
        self._tokens = min(self._burst, self._tokens + self._ratio * requests)

    @property
    def available(self) -> bool:
        """A hedge could be spent now."""
        return self._tokens >= 1.0

    def withdraw(self) -> bool:
        """Spend a hedge: False (and nothing spent) if less than one is left."""
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False


def hedge_window(
    replicas: Sequence[Replica], primary: Replica, everyone: LatencyWindow | None = None
) -> LatencyWindow | None:
    """The latency window a request to ``primary`` is judged by: a shard's request out
    longer than its p95 is worth a hedge.

    The window of lowest p95 among ``replicas`` other than ``primary``; when none of
    them has one yet, ``primary``'s own; when it has none either, ``everyone``'s (every
    answer this fan-out got, whichever replica); None if that has none. A window
    returned always has a p95 (and a p50).

    The fallbacks matter because adaptive selection sends most of a shard's requests to
    its faster replica: the other may have too few answers for a window, and without
    one a replica that turned slow was never hedged, costing a timed-out shard per
    query until it was ejected (the demo's slow-down phase, 6 to 10 partial answers of
    73). Its own p95 is what it answered in before it turned slow. And right after a
    search server starts no replica has a window: a data-server process stalling then
    cost every query its shards (the compose check's first queries after "up"), while
    one query's answers already tell what a sub-request usually takes.
    """
    best: LatencyWindow | None = None
    best_p95 = math.inf
    for replica in replicas:
        window = replica.window
        if replica is primary or window is None:
            continue
        p95 = window.p95
        if p95 is not None and p95 < best_p95:
            best, best_p95 = window, p95
    if best is not None:
        return best
    own = primary.window
    if own is not None and own.p95 is not None:
        return own
    if everyone is not None and everyone.p95 is not None:
        return everyone
    return None


class HedgePolicy:
    """The hedging of one fan-out: its budget, and how long a shard's request may be out
    before a hedge is due.

    ``ratio`` (0 turns hedging off, see :attr:`enabled`) and ``burst`` make the
    :attr:`budget`. :meth:`observe` each answer's response time, whichever replica:
    the delay of last resort while a shard's own replicas have too few answers to tell
    (a search server that has just started, a shard whose replicas are new). The delays
    are ``None`` while no window tells one: then no hedge is scheduled.

    Raises ``ValueError`` for a ratio out of 0..1.
    """

    __slots__ = ("_everyone", "budget", "enabled")

    def __init__(self, ratio: float = 0.05, burst: float = 100.0) -> None:
        self.budget = HedgeBudget(ratio, burst)
        self.enabled = ratio > 0
        self._everyone = LatencyWindow(size=256)

    def observe(self, seconds: float) -> None:
        """One answer's response time, from any replica."""
        self._everyone.add(seconds)

    def window(self, replicas: Sequence[Replica], primary: Replica) -> LatencyWindow | None:
        """:func:`hedge_window` of a request to ``primary``, with this fan-out's answers as
        the last resort."""
        return hedge_window(replicas, primary, self._everyone)

    def delay(self, replicas: Sequence[Replica], primary: Replica) -> float | None:
        """How long after a request to ``primary`` a hedge is due: the window's p95."""
        window = self.window(replicas, primary)
        return None if window is None else window.p95

    def backoff(
        self, replicas: Sequence[Replica], primary: Replica, previous: float
    ) -> float | None:
        """How long to wait before offering again a hedge the budget refused, after
        waiting ``previous`` (0 at the first refusal): double that, at least a p95.

        Doubling bounds the offers to a few per deadline, and gives the budget to the
        requests out longest: the likelier stragglers rather than the usual tail.
        """
        window = self.window(replicas, primary)
        if window is None or window.p95 is None:
            return None
        return max(2 * previous, window.p95)

    def spread(self, replicas: Sequence[Replica], primary: Replica) -> float | None:
        """The usual spread (p95 - p50) of a request to ``primary``: how long after its
        query's median answer a deferred request is a straggler."""
        window = self.window(replicas, primary)
        if window is None or window.p50 is None or window.p95 is None:
            return None
        return window.p95 - window.p50
