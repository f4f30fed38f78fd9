"""What a fan-out remembers of its replicas' failures and refusals across queries.

Ejection with the fan-out's metrics and log, recent refusals for overload, the shards in
panic. Times are the fan-out's ``clock``; not thread-safe (the fan-out's event loop).

Design: docs/design/overload.md, "Panic".
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Container, Iterable

from .ejection import OutlierEjection
from .metrics import FanOutMetrics
from .picking import Replica

__all__ = ["ReplicaHealth"]

log = logging.getLogger(__name__)

# Seconds between two log lines saying that shards route in panic.
_PANIC_LOG_INTERVAL = 10.0
# Seconds a count of the replicas that have answered (the ejection cap's base, O(routable)
# to make) is used before it is made again: in a stall the cap is consulted hundreds of
# times a second.
_ANSWERED_RECOUNT = 1.0


class ReplicaHealth:
    """The fan-out's record of its replicas: ejections, overload refusals, panic.

    ``answered`` counts the routable data servers that have answered at least once (the
    base of the ejection cap; O(routable), so asked only when the cap is consulted and
    at most once per second). ``panic_threshold`` is the share of a shard's replicas
    that must be left un-ejected for its routing to heed ejections (0: always heed them);
    ``overload_backoff`` how long a replica that refused for overload gets no first
    request while its shard has another. ``on_ejection`` hears of each replica ejected,
    and of each whose ejection an answer ended (the replica groups' coverage follows
    them; an ejection that runs its course is not told).
    """

    def __init__(
        self,
        ejection: OutlierEjection,
        *,
        clock: Callable[[], float],
        metrics: FanOutMetrics,
        answered: Callable[[], int],
        panic_threshold: float,
        overload_backoff: float,
        on_ejection: Callable[[Replica], None] | None = None,
    ) -> None:
        self._ejection = ejection
        self._on_ejection = on_ejection
        self._clock = clock
        self._metrics = metrics
        self._answered = answered
        # The last count of answered replicas, and when it was made (the clock's).
        self._answered_count = 0
        self._answered_at = -math.inf
        self._panic_threshold = panic_threshold
        self._overload_backoff = overload_backoff
        # Replicas that answered "overloaded", until when (the fan-out's clock): kept
        # here, not on the Replica, and nearly always empty.
        self._overloaded: dict[Replica, float] = {}
        self._panic_logged_at = -_PANIC_LOG_INTERVAL
        self._panic_shards: set[int] = set()

    # -- answers ----------------------------------------------------------------------

    def record_success(self, replica: Replica, *, probe: bool) -> None:
        """An answer of ``replica`` (to a half-open ``probe``: its ejection ends)."""
        ejected_until = replica.ejected_until
        self._ejection.record_success(replica, self._clock(), probe=probe)
        if (
            ejected_until is not None
            and replica.ejected_until is None
            and self._on_ejection is not None
        ):
            self._on_ejection(replica)

    def record_failure(self, replica: Replica, result: str, detail: str) -> None:
        """A failure (``result`` "error" or "timeout") of ``replica``: counted, a step
        towards its ejection (under the cap), logged at debug level unless it ejects."""
        self._metrics.shard_requests.labels(result=result).inc()
        ejection = self._ejection
        capped = ejection.capped
        if ejection.record_failure(
            replica, self._clock(), answered=self._answered_base, detail=detail
        ):
            self._metrics.ejections.inc()
            if self._on_ejection is not None:
                self._on_ejection(replica)
            return
        if ejection.capped != capped:
            self._metrics.panic.labels(scope="cluster").inc()
        instance = replica.instance
        log.debug(
            "data server %s (%s:%d) %s: %s",
            instance.id,
            instance.address,
            instance.port,
            result,
            detail,
        )

    def _answered_base(self) -> int:
        now = self._clock()
        if now - self._answered_at >= _ANSWERED_RECOUNT:
            self._answered_count = self._answered()
            self._answered_at = now
        return self._answered_count

    def record_refusal(self, replica: Replica) -> None:
        """``replica`` refused for overload: no step towards ejection, no first request
        for ``overload_backoff`` while its shard has another candidate."""
        self._overloaded[replica] = self._clock() + self._overload_backoff
        self._metrics.shard_requests.labels(result="overload").inc()

    # -- choosing ---------------------------------------------------------------------

    @property
    def any_overloaded(self) -> bool:
        """Some replica refused for overload and is not yet known to be over it."""
        return bool(self._overloaded)

    def not_overloaded(self, replicas: list[Replica], now: float) -> list[Replica]:
        """``replicas`` less those that answered "overloaded" less than
        ``overload_backoff`` ago (forgetting those whose backoff is over)."""
        overloaded = self._overloaded
        left = []
        for replica in replicas:
            until = overloaded.get(replica)
            if until is None:
                left.append(replica)
            elif until <= now:
                del overloaded[replica]
                left.append(replica)
        return left

    def probe(
        self, replicas: Iterable[Replica], tried: Container[Replica], now: float
    ) -> Replica | None:
        """The ejected replica to send a half-open probe to now, if any (see
        :meth:`OutlierEjection.probe`)."""
        return self._ejection.probe(replicas, tried, now)

    def ejected(self) -> set[Replica]:
        """The replicas ejected now (the ejection's own set: do not modify it)."""
        return self._ejection.ejected(self._clock())

    def panicking(self, shard: int, routable: int, now: float) -> bool:
        """Whether ``shard`` (of ``routable`` replicas) routes in panic for a query:
        fewer than ``panic_threshold`` of its replicas are left un-ejected. Then its
        ejections are not heeded: the load is spread over all of them, as Envoy does
        below its healthy panic threshold, rather than piled onto the few left (which a
        busy minute would then eject in turn). O(1) while none of the shard's replicas is
        ejected."""
        if not self._panic_threshold > 0 or routable < 2:
            # A shard's only replica has no share to protect: routing to it while it is
            # ejected would make every query wait for it if it hangs, the outage this
            # product exists to end. Its half-open probe ends the ejection within a
            # second of its answering again.
            return False
        ejected = self._ejection.ejected_in(shard, now)
        if ejected == 0:
            return False
        if routable - min(ejected, routable) >= self._panic_threshold * routable:
            return False
        self._metrics.panic.labels(scope="shard").inc()
        self._panic_shards.add(shard)
        if now - self._panic_logged_at >= _PANIC_LOG_INTERVAL:
            shards = sorted(self._panic_shards)
            log.warning(
                "routing %d shard(s) in panic (fewer than %.0f%% of their replicas left "
                "un-ejected): their ejections are not heeded, the load goes to all their "
                "replicas; shards %s%s",
                len(shards),
                self._panic_threshold * 100,
                ", ".join(map(str, shards[:10])),
                "..." if len(shards) > 10 else "",
            )
            self._panic_logged_at = now
            self._panic_shards.clear()
        return True
