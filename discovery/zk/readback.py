"""When a :class:`~discovery.zk.registration.Registration` reads its node back.

Each wait is jittered, so that a fleet reconnected at once does not read back in one
burst. Times are the running loop's; no I/O, never fails.

Design: docs/design/zookeeper.md, "Registration".
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence

__all__ = ["ReadBackSchedule"]


class ReadBackSchedule:
    """Read-backs ``after_connect`` seconds after each connection and every
    ``interval`` seconds after the last read-back, jittered with ``rng``; none at all
    when ``interval`` is None."""

    def __init__(
        self, interval: float | None, after_connect: Sequence[float], rng: random.Random
    ) -> None:
        self._interval = interval
        self._after_connect = tuple(after_connect)
        self._rng = rng
        self._checks: list[float] = []
        self._next_sweep: float | None = None

    def _jittered(self, seconds: float) -> float:
        return seconds * self._rng.uniform(0.5, 1.5)

    def connected(self) -> None:
        """A connection was made: the checks after it replace those of the last one."""
        if self._interval is None:
            return
        now = asyncio.get_running_loop().time()
        self._checks = sorted(now + self._jittered(delay) for delay in self._after_connect)

    def due_in(self) -> float | None:
        """Seconds until the next read-back is due (None: never)."""
        if self._interval is None:
            return None
        now = asyncio.get_running_loop().time()
        if self._next_sweep is None:
            self._next_sweep = now + self._jittered(self._interval)
        due = min(self._next_sweep, self._checks[0]) if self._checks else self._next_sweep
        return max(0.0, due - now)

    def done(self) -> None:
        """A read-back done: the checks it satisfied are over; the sweep starts again
        when it was the one due."""
        now = asyncio.get_running_loop().time()
        while self._checks and self._checks[0] <= now:
            self._checks.pop(0)
        if self._next_sweep is not None and self._next_sweep <= now:
            assert self._interval is not None
            self._next_sweep = now + self._jittered(self._interval)
