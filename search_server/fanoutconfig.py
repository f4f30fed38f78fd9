"""The settings of a :class:`~search_server.fanout.FanOut`, in one frozen value.

Values only (the search server's flags); the fan-out's collaborators (its client,
clock, picker, budgets and limits) are passed to it beside this. A value out of range
raises ``ValueError`` when the config is made.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from discovery.address import NetworkPolicy

from .coverage import CoveragePolicy
from .demotion import DEMOTE_FLOOR, DEMOTE_PROBE_INTERVAL, DEMOTE_RATIO
from .expectedshards import FORGET_MISSING_SHARD_AFTER
from .groups import MIN_GROUP_COVERAGE
from .slowstart import SlowStart
from .topk import TOPK_PROBABILITY

__all__ = ["OVERLOAD_BACKOFF", "PANIC_THRESHOLD", "STALL_GRACE", "FanOutConfig"]

#: Seconds a replica that answered "overloaded" gets no first request while its shard has
#: another candidate (``FanOutConfig.overload_backoff``): its ``Retry-After`` says a
#: second; half of that, since the others may fill up too.
OVERLOAD_BACKOFF = 0.5
#: Share of a shard's routable replicas that must be left un-ejected for its routing to
#: heed ejections (``FanOutConfig.panic_threshold``, Envoy's healthy panic threshold and
#: its default): below it, the shard routes to all of them (see ReplicaHealth.panicking).
PANIC_THRESHOLD = 0.5
#: How late past its deadline a query may wake and still charge the replicas it waited
#: for with a timeout (``FanOutConfig.stall_grace``). Later, the search server's own loop
#: was stalled: on a busy 2-core machine the container runtime starves every container
#: for 0.1-0.3 s when one stops, and the replicas of a whole fleet "timed out" together
#: and were ejected, so their shards failed at once for a while after the stall passed.
STALL_GRACE = 0.1


def _no_slow_start() -> SlowStart:
    return SlowStart(window=0.0)


@dataclass(frozen=True, slots=True)
class FanOutConfig:
    """How a fan-out admits, routes, hedges and ejects (see :mod:`search_server.fanout`).

    ``max_in_flight`` bounds the queries at once. ``eject_after`` failures in a row
    eject a replica for ``eject_cooldown`` seconds, under a cap of ``max_ejected_share``
    of the routable ones; an ejected shard is probed every ``probe_interval`` seconds
    (checked by :class:`~search_server.ejection.OutlierEjection` when the fan-out is
    made). ``stall_grace``: see :data:`STALL_GRACE`. ``hedge_ratio`` caps hedges as a
    share of sub-requests (0 turns hedging off), plus ``hedge_burst`` (checked by
    :class:`~search_server.hedging.HedgePolicy`). A replica with fewer than
    ``warmup_samples`` answers gets one request at a time. ``zone`` is this search
    server's zone: replicas there are preferred while the shard has a usable one.
    ``shards`` is how many shards (0 to ``shards - 1``) the cluster has beside those
    routed to: a shard with no replica is reported missing, never dropped, and a data
    server of a shard outside them is never routed to (0: any shard). A shard above
    them is no longer expected once it has had no replica for
    ``forget_missing_shard_after`` seconds (0: never forgotten).
    ``panic_threshold``: see :data:`PANIC_THRESHOLD`; ``overload_backoff``: see
    :data:`OVERLOAD_BACKOFF`. A replica whose relative slowness (its response times over
    those of the same queries' other shards) is above ``demote_ratio`` times its
    shard's typical replica's, and its response time more than ``demote_floor`` seconds
    above, gets no request while a peer is not demoted, but a probe every
    ``demote_probe_interval`` seconds (:class:`~search_server.demotion.LatencyDemotion`;
    ``demote_ratio`` 0: off). ``min_group_coverage`` (0..1) is the share of the corpus a
    replica group must cover to stay in rotation (see
    :data:`~search_server.groups.MIN_GROUP_COVERAGE`). ``networks``
    (``--allowed-networks``) leaves data servers
    outside it out of the routing table. ``slow_start`` ramps new replicas' weights
    (off by default here). ``coverage`` is the queries' coverage policy, unless a query
    brings its own (off by default: every shard waited for until the deadline).
    ``topk_probability`` is how sure a query's merged top ``k`` must be of being exact
    when each shard is asked for fewer hits than ``k``
    (:func:`~search_server.topk.hits_per_shard`; in (0, 1], 1: every shard asked for
    ``k``); with ``topk_second_round``, the shards whose answers may have left a hit
    out of the merged top ``k`` are asked again for ``k`` while the deadline allows, so
    that it is exact (off: counted only, as maybe inexact).
    """

    max_in_flight: int = 256
    eject_after: int = 3
    eject_cooldown: float = 10.0
    max_ejected_share: float = 0.5
    probe_interval: float = 1.0
    stall_grace: float = STALL_GRACE
    hedge_ratio: float = 0.05
    hedge_burst: float = 100.0
    warmup_samples: int = 5
    zone: str | None = None
    shards: int = 0
    forget_missing_shard_after: float = FORGET_MISSING_SHARD_AFTER
    panic_threshold: float = PANIC_THRESHOLD
    overload_backoff: float = OVERLOAD_BACKOFF
    demote_ratio: float = DEMOTE_RATIO
    demote_floor: float = DEMOTE_FLOOR
    demote_probe_interval: float = DEMOTE_PROBE_INTERVAL
    min_group_coverage: float = MIN_GROUP_COVERAGE
    networks: NetworkPolicy = field(default_factory=NetworkPolicy)
    slow_start: SlowStart = field(default_factory=_no_slow_start)
    coverage: CoveragePolicy = field(default_factory=CoveragePolicy)
    topk_probability: float = TOPK_PROBABILITY
    topk_second_round: bool = True

    def __post_init__(self) -> None:
        if self.max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {self.max_in_flight}")
        if self.shards < 0:
            raise ValueError(f"shards must be >= 0, got {self.shards}")
        if not self.forget_missing_shard_after >= 0:
            raise ValueError(
                "forget_missing_shard_after must be >= 0 seconds, got "
                f"{self.forget_missing_shard_after}"
            )
        if self.warmup_samples < 0:
            raise ValueError(f"warmup_samples must be >= 0, got {self.warmup_samples}")
        if not self.stall_grace > 0:
            raise ValueError(f"stall_grace must be > 0 seconds, got {self.stall_grace}")
        if not 0 <= self.panic_threshold <= 1:
            raise ValueError(f"panic_threshold must be in 0..1, got {self.panic_threshold}")
        if not self.overload_backoff >= 0:
            raise ValueError(f"overload_backoff must be >= 0 seconds, got {self.overload_backoff}")
        if not (self.demote_ratio == 0 or self.demote_ratio > 1):
            raise ValueError(f"demote_ratio must be 0 (off) or above 1, got {self.demote_ratio}")
        if not self.demote_floor >= 0:
            raise ValueError(f"demote_floor must be >= 0 seconds, got {self.demote_floor}")
        if not self.demote_probe_interval > 0:
            raise ValueError(
                f"demote_probe_interval must be > 0 seconds, got {self.demote_probe_interval}"
            )
        if not 0 <= self.min_group_coverage <= 1:
            raise ValueError(f"min_group_coverage must be in 0..1, got {self.min_group_coverage}")
        if not 0 < self.topk_probability <= 1:
            raise ValueError(f"topk_probability must be > 0 and <= 1, got {self.topk_probability}")
