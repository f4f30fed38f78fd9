"""One budget for every extra sub-request: retries after a failure and hedges.

Over any ``t`` seconds with ``n`` first requests, extra requests are at most
``ratio · n + per_second · t + burst``, whatever fails. Pure (the ``clock`` is passed
in); not thread-safe (one per fan-out, on its event loop).

Design: docs/design/search-server.md, "One retry budget".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal

__all__ = ["ExtraRequest", "RetryBudget"]

#: What an extra request is for.
ExtraRequest = Literal["retry", "hedge"]


class RetryBudget:
    """The extra requests of one fan-out (docs/design/search-server.md, "One retry budget").

    Raises ``ValueError`` for a ratio out of 0..1, a negative rate, or a burst below
    one token more than a second of the rate.
    """

    __slots__ = ("_balance", "_burst", "_clock", "_floor", "_last", "_per_second", "_ratio")

    def __init__(
        self,
        ratio: float = 0.1,
        per_second: float = 10.0,
        burst: float = 100.0,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 <= ratio <= 1:
            raise ValueError(f"retry budget ratio must be in 0..1, got {ratio}")
        if not per_second >= 0:
            raise ValueError(f"retry budget rate must be >= 0 per second, got {per_second}")
        if not burst >= 1.0 + per_second:
            # Hedges need more than a second's steady tokens left: a smaller burst
            # would never allow one.
            raise ValueError(
                f"retry budget burst must be >= 1 + the rate ({per_second}), got {burst}"
            )
        self._ratio = ratio
        self._per_second = per_second
        self._burst = burst
        self._clock = clock
        self._floor = per_second
        self._balance = per_second
        self._last = clock()

    @property
    def balance(self) -> float:
        """The tokens there are now."""
        self._refill()
        return self._balance

    def deposit(self, requests: int) -> None:
        """Earn the extra requests of ``requests`` first requests."""
        self._refill()
        self._balance = min(self._burst, self._balance + self._ratio * requests)

    def withdraw(self, kind: ExtraRequest) -> bool:
        """Spend a token on a ``retry`` or a ``hedge``: False (nothing spent) if the
        budget does not allow it."""
        self._refill()
        need = 1.0 if kind == "retry" else 1.0 + self._floor
        if self._balance >= need:
            self._balance -= 1.0
            return True
        return False

    def _refill(self) -> None:
        now = self._clock()
        elapsed = now - self._last
        self._last = now
        if elapsed > 0 and self._per_second:
            self._balance = min(self._burst, self._balance + elapsed * self._per_second)
