"""One query's share of the in-flight limit: a storm of one query cannot take it all.

Pure bookkeeping, no I/O: the clock is passed in; memory bounded by the queries in
flight; not thread-safe (the fan-out's loop owns it).

Design: docs/design/overload.md, "One query's share of the limit".
"""

from __future__ import annotations

import math

__all__ = ["QueryShare"]


class QueryShare:
    """How much of the in-flight limit one query may hold (docs/design/overload.md, "One
    query's share of the limit").

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
