"""Slow start: a replica that is new to the fan-out gets a share of its shard's traffic
that ramps up over a window, as Envoy's ``slow_start_config`` does.

A data server that has just registered (started, restarted, or re-admitted by its
agent after being offline) has cold connections from every search server, and may
have a cold process; sent its full share at once, it is the slowest replica of its
shard for a while, and under adaptive selection, which knew nothing of it, it used
to be sent every request until it answered (elastic/elasticsearch#147579). While it
ramps, its :attr:`~search_server.picking.Replica.weight` (what both pickers scale its
share by) is

    ``base_weight * max(min_weight, (elapsed / window) ** (1 / aggression))``

with ``elapsed`` the seconds since the fan-out first made its
:class:`~search_server.picking.Replica` (keyed by
:func:`~search_server.picking.target_key`: id, address, port and registration time,
so a restarted or re-admitted server is new again). ``aggression`` 1 ramps linearly,
more ramps faster early on; ``min_weight`` (Envoy's ``min_weight_percent``, 10 % by
default) keeps a share from the start, so that the replica gets the requests that
show its speed. Once ``window`` has passed, its weight is ``base_weight`` again. A
search server that has just started sees every replica as new at once: they ramp
together, their weights stay in proportion, and the shares are what they would be
without slow start (as in Envoy; the fan-out may as well not ramp its first table).

What a weight buys differs by picker: power of two choices compares requests in
flight per unit of weight, so a ramping replica's share follows its weight under
load; adaptive selection divides a rank that grows with the cube of the queue, so
under load a tenth of the weight costs about what twice the queue does, and the ramp
is shallower than the weights say, while at light load the replica is tried once its
lost picks' discount has made up for its weight (about every 110 picks at a tenth).

Cheap where it matters: the pickers run for every sub-request and read ``weight``
only. :class:`SlowStart` is the policy (pure, the clock's values passed in);
:class:`Ramps` keeps one fan-out's ramping replicas and rewrites their weights at most
every :data:`REFRESH_INTERVAL` seconds, O(replicas ramping), nothing once none is
(about 7 ms for 50,000 ramping replicas on a loaded 2-core machine).
A bad setting raises :class:`~discovery.errors.ConfigError` naming its flag. Not
thread-safe (one per fan-out, on its event loop).
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
    """How a new replica's weight ramps (see the module's docstring).

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
    """One fan-out's replicas in slow start (see the module's docstring).

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
