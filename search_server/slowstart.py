"""Slow start: a replica new to the fan-out has its weight ramped up over a window.

:class:`SlowStart` is the policy (pure); :class:`Ramps` rewrites the ramping replicas'
weights at most every :data:`REFRESH_INTERVAL` seconds. A bad setting raises
:class:`~discovery.errors.ConfigError` naming its flag. Not thread-safe.

Design: docs/design/overload.md, "Slow start".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from discovery.errors import ConfigError

from .picking import Replica

__all__ = ["REFRESH_INTERVAL", "Ramps", "SlowStart"]

#: Seconds between two refreshes of the ramping weights: a weight at most this stale
#: is a step of 0.3 % of a 30 s linear ramp; refreshing per query would cost a loop
#: over every ramping replica per query (all of them, after a search server starts).
REFRESH_INTERVAL = 0.1


@dataclass(frozen=True, slots=True)
class SlowStart:
    """How a new replica's weight ramps (docs/design/overload.md, "Slow start").

    ``window`` seconds (0 disables slow start), ``aggression`` (> 0; 1 is linear),
    ``min_weight`` the least share of the registered weight (0 < share <= 1). Raises
    :class:`ConfigError` naming the flag (``--slow-start-*``) of a value out of range.
    """

    window: float = 30.0
    aggression: float = 1.0
    min_weight: float = 0.1

    def __post_init__(self) -> None:
        if not 0 <= self.window < math.inf:
            raise ConfigError(f"--slow-start-window must be >= 0 seconds, got {self.window}")
        if not 0 < self.aggression < math.inf:
            raise ConfigError(f"--slow-start-aggression must be > 0, got {self.aggression}")
        if not 0 < self.min_weight <= 1:
            raise ConfigError(f"--slow-start-min-weight must be in (0, 1], got {self.min_weight}")

    @property
    def enabled(self) -> bool:
        return self.window > 0

    def factor(self, elapsed: float) -> float:
        """The share of its registered weight a replica has ``elapsed`` seconds into its
        ramp: from ``min_weight`` up to 1 at the end of the window (1 when disabled)."""
        if elapsed >= self.window or not self.enabled:
            return 1.0
        if elapsed <= 0:
            return self.min_weight
        return max(self.min_weight, math.pow(elapsed / self.window, 1.0 / self.aggression))

    def begin(self, replica: Replica, now: float) -> bool:
        """Start ``replica``'s ramp at ``now`` (its weight drops to ``min_weight`` of its
        registered weight). False, and the replica untouched, when slow start is
        disabled."""
        if not self.enabled:
            return False
        replica.ramp_start = now
        replica.weight = replica.base_weight * self.min_weight
        return True

    def refresh(self, ramping: set[Replica], now: float) -> None:
        """Set the weight of every replica in ``ramping`` for ``now``; a replica whose
        window is over (or that is not ramping) gets its registered weight back and
        leaves the set."""
        window = self.window
        floor = self.min_weight
        exponent = 1.0 / self.aggression
        done: list[Replica] = []
        for replica in ramping:
            start = replica.ramp_start
            elapsed = 0.0 if start is None else now - start
            if start is None or elapsed >= window or not window:
                replica.weight = float(replica.base_weight)
                replica.ramp_start = None
                done.append(replica)
                continue
            share = math.pow(elapsed / window, exponent) if elapsed > 0 else 0.0
            replica.weight = replica.base_weight * (share if share > floor else floor)
        if done:
            ramping.difference_update(done)


class Ramps:
    """One fan-out's replicas in slow start (docs/design/overload.md, "Slow start").

    :meth:`add` each replica the fan-out makes, :meth:`refresh` before routing a
    query: the weights are rewritten at most every ``interval`` seconds of the clock
    whose values are passed in. ``len()`` is the number still ramping (a gauge).
    A replica that leaves the routing table while ramping stays here until its window
    ends (a reference held at most ``window`` seconds).
    """

    __slots__ = ("_next", "_policy", "_ramping", "interval")

    def __init__(self, policy: SlowStart, *, interval: float = REFRESH_INTERVAL) -> None:
        if not interval >= 0:
            raise ValueError(f"interval must be >= 0 seconds, got {interval}")
        self._policy = policy
        self._ramping: set[Replica] = set()
        self._next = -math.inf
        self.interval = interval

    @property
    def policy(self) -> SlowStart:
        return self._policy

    def __len__(self) -> int:
        return len(self._ramping)

    def __contains__(self, replica: object) -> bool:
        return replica in self._ramping

    def add(self, replica: Replica, now: float) -> None:
        """``replica`` is new to the fan-out at ``now``: it starts its ramp (nothing
        happens when slow start is disabled)."""
        if self._policy.begin(replica, now):
            self._ramping.add(replica)

    def refresh(self, now: float) -> bool:
        """Bring the ramping weights up to ``now`` if ``interval`` has passed since the
        last refresh; whether it did. O(1) when nothing ramps or it is not due."""
        if not self._ramping or now < self._next:
            return False
        self._next = now + self.interval
        self._policy.refresh(self._ramping, now)
        return True
