"""One query's share of the in-flight limit: a storm of one query cannot take it all.

The admission (:mod:`.admission`) decides how many queries a search server fans out at
once, not which. With a limit that follows latency that matters: a client that sends
the same expensive query back to back from a few connections holds a few slots all the
time, its cost makes every query slower, the limit comes down to about what it holds,
and everyone else's queries are refused with 503. Measured in the chaos run's query
storm (4 clients, a shard's 150 most frequent terms) on a 2-core machine with two busy
processes beside it: in 4 storms of 14 more than a tenth of the normal queries through
that search server were refused (up to 22 of 58), while the storm was served.

So one query, by its normalised terms (the key of
:func:`~search_server.querydeath.normalise`: a client cannot dodge it by reordering or
repeating words), may hold at most ``share`` of the limit (at least one query) while
other queries are asking: another one is in flight, or arrived (admitted or not) within
the last ``window`` seconds. Its excess is refused at once like any excess, and the
rest of the limit stays for the others. Alone, a query may use the whole limit: a load
test that repeats one URL, or a quiet minute's only client, is not a storm of anything.
A popular query, a few percent of the traffic, never comes near half of the limit.

Pure bookkeeping, no I/O: the clock is passed in; not thread-safe (the fan-out's loop
owns it). Memory is bounded by the queries in flight.
"""

from __future__ import annotations

import math

__all__ = ["QueryShare"]


class QueryShare:
    """How much of the in-flight limit one query may hold (see the module docstring).

    ``share`` 1 turns the rule off. Raises ``ValueError`` for a share outside (0, 1] or
    a window that is not positive.
    """

    def __init__(self, share: float = 0.5, *, window: float = 1.0) -> None:
        if not 0 < share <= 1:
            raise ValueError(f"share must be in (0, 1], got {share}")
        if not window > 0:
            raise ValueError(f"window must be > 0 seconds, got {window}")
        self._share = share
        self._window = window
        self._in_flight: dict[str, int] = {}
        self._total = 0
        # The two most recent arrivals of distinct keys, newest first: (key, when).
        # Enough to know when any key other than a given one last arrived.
        self._last: tuple[str, float] | None = None
        self._other: tuple[str, float] | None = None

    @property
    def share(self) -> float:
        return self._share

    def cap(self, limit: int) -> int:
        """Most queries of one key in flight while others ask, under ``limit``."""
        return max(1, math.floor(self._share * limit))

    def admits(self, key: str, limit: int, now: float) -> bool:
        """Whether one more query of ``key`` may be admitted under ``limit`` at ``now``
        (as far as its share goes: the limit itself is the caller's). Records the
        arrival either way."""
        others = self._others_asking(key, now)
        self._arrived(key, now)
        if self._share >= 1:
            return True
        return not (others and self._in_flight.get(key, 0) >= self.cap(limit))

    def held(self, key: str) -> int:
        """Queries of ``key`` in flight."""
        return self._in_flight.get(key, 0)

    @property
    def tracked(self) -> int:
        """Keys with a query in flight (what the bookkeeping holds)."""
        return len(self._in_flight)

    def acquire(self, key: str) -> None:
        """A query of ``key`` was admitted."""
        self._in_flight[key] = self._in_flight.get(key, 0) + 1
        self._total += 1

    def release(self, key: str) -> None:
        """A query of ``key`` ended (every :meth:`acquire` has exactly one)."""
        left = self._in_flight[key] - 1
        if left:
            self._in_flight[key] = left
        else:
            del self._in_flight[key]
        self._total -= 1

    def _others_asking(self, key: str, now: float) -> bool:
        if self._total > self._in_flight.get(key, 0):
            return True
        # The latest arrival of a key other than ``key``: the newest one, or else the one
        # before the newest key's run began.
        latest = self._last if self._last is not None and self._last[0] != key else self._other
        return latest is not None and now - latest[1] <= self._window

    def _arrived(self, key: str, now: float) -> None:
        if self._last is not None and self._last[0] != key:
            self._other = self._last
        self._last = (key, now)
