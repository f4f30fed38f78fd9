"""Which of a shard's replicas a query's next request may go to.

:class:`Candidates` narrows them for the :class:`~search_server.picking.ReplicaPicker`:
a first request to the query's replica group while it has a usable replica of the
shard, latency outliers left out while a peer is not one (a probe's copy aside), draining
replicas only as a last resort. Pure choice: it sends nothing. Not thread-safe.

Design: docs/design/search-server.md, "Replicas: picked, draining as a last resort",
"Replica groups" and "Latency outlier demotion".
"""

from __future__ import annotations

import math
import random

from .demotion import LatencyDemotion
from .picking import Replica
from .replicahealth import ReplicaHealth
from .shardcall import ShardCall
from .shardrouting import ShardRouting

__all__ = ["Candidates"]


class Candidates:
    """The candidates of a fan-out's requests.

    ``zone`` is this search server's zone (None: no preference); a replica with fewer
    than ``warmup`` answers gets one request at a time; ``rng`` flips the coins of
    subsets' edge replicas; ``demotion`` leaves latency outliers out (None: never).
    """

    def __init__(
        self,
        routing: ShardRouting,
        health: ReplicaHealth,
        *,
        zone: str | None,
        warmup: int,
        rng: random.Random,
        demotion: LatencyDemotion | None = None,
    ) -> None:
        self._routing = routing
        self._health = health
        self._zone = zone
        self._warmup = warmup
        self._rng = rng
        self._demotion = demotion if demotion is not None and demotion.enabled else None

    def of(self, call: ShardCall, now: float) -> list[Replica]:
        """The shard's replicas a request may go to now: for the first request of a
        query that has a replica group, the group's usable ones (within the group's
        subset, not ejected, not overloaded, not demoted); else (a retry, a hedge, or
        the group has none: a fill, counted) its routable ones not yet tried nor
        ejected (within its subset, with spares for the ejected and the tried, see
        :meth:`~search_server.subsetting.Subset.candidates`), less the demoted ones
        while one is not (:class:`~search_server.demotion.LatencyDemotion`; for a first
        request, a demoted replica due its probe is set as ``call.probe_copy``, to be
        sent a copy of it), or, when none is left, its draining ones (a last resort)."""
        tried = call.tried
        # In panic the shard's ejections are not heeded: judged at a time past them all.
        seen = math.inf if call.panic else now
        group = call.group
        if group is not None and not tried:
            grouped = self._in_group(call, group.name, seen, now)
            if grouped:
                return grouped
            # No usable replica of the shard in the query's group: another group's (or
            # one without a group) fills in, if the shard has one.
            filled = self._in_shard(call, tried, seen, now)
            if filled:
                self._routing.groups.filled()
            return filled
        return self._in_shard(call, tried, seen, now)

    def _in_shard(
        self, call: ShardCall, tried: list[Replica], seen: float, now: float
    ) -> list[Replica]:
        """Any of the shard's replicas a request may go to now, whatever their group
        (see :meth:`of`)."""
        if call.subset is None:
            usable = [r for r in call.replicas if r not in tried and not r.is_ejected(seen)]
        else:
            usable = call.subset.candidates(tried, seen, self._rng)
        if not usable:
            reserve = self._routing.reserve(call.shard)
            return [r for r in reserve if r not in tried and not r.is_ejected(seen)]
        if len(usable) > 1:
            demotion = self._demotion
            if self._health.any_overloaded:
                fresh = self._health.not_overloaded(usable, now)
                # For a first request, a demoted replica is no other candidate: sent all
                # the first requests while its peers back off, a replica ten times
                # slower queues them up to its own refusals. A retry may go to it.
                if fresh and (demotion is None or tried or _any_undemoted(fresh)):
                    usable = fresh
            usable = self._zoned(usable)
            if demotion is not None and len(usable) > 1:
                # Judged against the shard's members (the zone's, with a zone), the
                # tried ones too. A retry or a hedge whose every candidate left is
                # demoted still has them: demotion never leaves a shard without one.
                peers = call.replicas if self._zone is None else self._zoned(list(call.replicas))
                narrowed, probe = demotion.narrow(usable, peers, now, seen=seen, first=not tried)
                if probe is not None:
                    call.probe_copy = probe
                usable = narrowed or usable
            usable = self._warm(usable)
        return usable

    def _in_group(self, call: ShardCall, group: str, seen: float, now: float) -> list[Replica]:
        """The first request's candidates in ``group``: its subset's usable members
        (spares of the group for the ejected ones), less those that refused for
        overload and those demoted among the shard's usable replicas (one due its probe
        set as ``call.probe_copy``);
        empty when none is left (the caller fills from the whole shard)."""
        groups = call.groups
        subset = groups.members(group) if groups is not None else None
        if subset is None:
            return []
        usable = subset.candidates((), seen, self._rng)
        if usable and self._health.any_overloaded:
            # Strictly: a group whose replicas here all refused fills from another.
            usable = self._health.not_overloaded(usable, now)
        if len(usable) > 1:
            usable = self._zoned(usable)
        demotion = self._demotion
        if usable and demotion is not None:
            # Judged against the whole shard, not the group: a group holds one replica
            # of a shard, usually, and a demoted one is filled for by another group's.
            peers = call.replicas if self._zone is None else self._zoned(list(call.replicas))
            usable, probe = demotion.narrow(usable, peers, now, seen=seen, first=True)
            if probe is not None:
                call.probe_copy = probe
        if len(usable) > 1:
            usable = self._warm(usable)
        return usable

    def _zoned(self, usable: list[Replica]) -> list[Replica]:
        """Those of ``usable`` in this search server's zone if any, else all of them."""
        zone = self._zone
        if zone is not None:
            local = [r for r in usable if r.zone == zone]
            if local:
                return local
        return usable

    def _warm(self, usable: list[Replica]) -> list[Replica]:
        """Of ``usable``, the warmed up or idle ones (see the class)."""
        if self._warmup and len(usable) > 1:
            warm = self._warmup
            ready = [r for r in usable if r.samples >= warm or r.outstanding == 0]
            if not ready:
                # All still warming up and busy: the least busy ones, so that a
                # picker ranking the unknown first cannot pile onto one of them.
                fewest = min(r.outstanding for r in usable)
                ready = [r for r in usable if r.outstanding == fewest]
            usable = ready
        return usable

    def again(self, call: ShardCall, answered_by: Replica | None, now: float) -> list[Replica]:
        """The candidates of a second request to a shard that has answered the query (a
        second round of its top ``k``, ``call`` the new call): the replica that answered
        (``answered_by``) while it is usable, not ejected nor refusing for overload: its
        answer was fresh, and the same index ranks the same way, so its top ``k`` holds
        the top ``k'`` it sent (what makes one round enough); else the shard's candidates
        as for any request without a group (:meth:`of`). Never an ejected replica's
        probe: the shard has an answer already."""
        health = self._health
        if (
            answered_by is not None
            and not answered_by.is_ejected(now)
            and not (health.any_overloaded and not health.not_overloaded([answered_by], now))
        ):
            return [answered_by]
        return self.of(call, now)

    def for_hedge(self, call: ShardCall, waited: float, now: float) -> list[Replica]:
        """The candidates of a hedge after its shard's request was out ``waited``
        seconds. A replica whose p95 is above that would not beat the request out, nor
        would a demoted one (a latency outlier: its p95 may predate its slowness), and
        one that has just refused for overload would only refuse again: when no other
        is left, the slowness is the whole shard's and a hedge cannot help."""
        candidates = [
            r
            for r in self.of(call, now)
            if (r.window is None or r.window.p95 is None or r.window.p95 <= waited)
            # A demoted one would not beat it either, whatever its (stale) p95 says.
            and r.demoted_at is None
        ]
        if candidates and self._health.any_overloaded:
            candidates = self._health.not_overloaded(candidates, now)
        return candidates

    def last_resort(self, call: ShardCall, replica: Replica) -> bool:
        """``replica`` is one of the shard's draining ones (usually none: O(1))."""
        return replica in self._routing.reserve(call.shard)

    def may_hedge(self, call: ShardCall) -> bool:
        """The shard has another replica a hedge could go to (a member or a draining
        one)."""
        return len(call.replicas) > 1 or bool(self._routing.reserve(call.shard))


def _any_undemoted(replicas: list[Replica]) -> bool:
    """Some of ``replicas`` is not demoted (as of its shard's last judgement)."""
    return any(replica.demoted_at is None for replica in replicas)
