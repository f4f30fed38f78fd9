"""The fan-out's routing table: the replicas of every shard, kept in step with the live
list one change at a time.

A change costs the size of the shards it touches. Draining servers are kept in their
shard's reserve, for requests of last resort; a shard's replica list is replaced, never
edited, so a query in flight keeps the list it started with. The same
:class:`~search_server.picking.Replica` serves a target while it stays listed, and one
that leaves while ejected is remembered until its ejection ends. Not thread-safe: the
search server's event loop only.

Design: docs/design/search-server.md, "The routing table".
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Literal

from discovery.instance import ServiceInstance
from discovery.livelist.model import LiveListChange
from discovery.livelist.shards import Servers, ShardIndex

from .picking import Replica, target_key

__all__ = ["RoutingTable"]


class RoutingTable:
    """Routable replicas by shard, for the list in :attr:`source`.

    ``clock`` is the one ejections are timed with (the fan-out's). ``admit`` says why
    an instance must not be routed to (None: it may), ``on_skip`` hears of each one
    left out that way or because its replica could not be made. :meth:`load` builds
    the table for a whole list (O(servers)); :meth:`follow` moves it along a change of
    the list it holds (O(servers of the shards touched)).
    """

    def __init__(
        self,
        clock: Callable[[], float],
        *,
        admit: Callable[[ServiceInstance], str | None] | None = None,
        on_skip: Callable[[ServiceInstance, str], None] | None = None,
        on_new: Callable[[Replica], None] | None = None,
    ) -> None:
        self._clock = clock
        self._on_new = on_new
        self._admit = admit
        self._on_skip = on_skip
        # The replicas in the list, routable and in reserve, by shard.
        self._index = ShardIndex[Replica](self._replica_of, on_leave=self._forget)
        # Every replica known by target: those in the list and those that left while
        # ejected (all of these in _departed, with the time their ejection ends).
        self._replicas: dict[str, Replica] = {}
        self._departed: list[tuple[float, str]] = []

    @property
    def source(self) -> object:
        """The list (by identity) the table was built for or moved to last."""
        return self._index.source

    @property
    def table(self) -> list[tuple[int, list[Replica]]]:
        """``(shard, replicas)`` in shard order; do not modify it."""
        return self._index.table

    @property
    def routable(self) -> int:
        """Routable data servers in the list."""
        return self._index.routable_count

    @property
    def answered(self) -> int:
        """Routable data servers in the list that have answered at least once (the base
        of the fan-out's ejection cap): O(routable)."""
        return sum(1 for _, group in self._index.table for replica in group if replica.samples)

    def reserve(self, shard: int) -> list[Replica]:
        """The draining replicas of ``shard``: for requests of last resort, once every
        routable one has been tried or is ejected. Empty for most shards; do not modify
        it."""
        return self._index.reserve(shard)

    def replica(self, key: str) -> Replica | None:
        """The replica of target ``key``, in the list (routable or in reserve) or departed
        while ejected."""
        return self._replicas.get(key)

    def load(self, servers: Servers) -> None:
        """Build the table for ``servers`` (instances, or ids to instances), reusing the
        replicas of targets already known; remember ``servers`` as the source."""
        self._index.load(servers)
        self._settle_departed()

    def follow(self, change: LiveListChange) -> Literal["change", "full", "none"]:
        """Move to ``change.current``: by its delta if the table holds ``change.previous``
        (a reload's delta included), else by a full :meth:`load`. Returns which it did
        (``"none"``: the table holds ``change.current`` already)."""
        source = self._index.source
        if change.previous.servers is source and change.current.servers is not source:
            # A delta: first sweep the ejections that ended (a replica whose ejection
            # ended while it was away comes back new).
            self._expire_departed()
        kind = self._index.follow(change)
        if kind == "full":
            self._settle_departed()
        return kind

    # -- one replica at a time ------------------------------------------------------

    def _replica_of(self, instance: ServiceInstance, previous: Replica | None) -> Replica | None:
        """The replica to route ``instance`` with (the known one of its target, updated,
        or a new one), or None if it is not to be routed to: refused by ``admit``, or
        any failure in making its replica. One registration's problem stays with it,
        never fails the table (an address nobody could encode once made every query
        fail). The index's ``previous`` (by id) is not needed: replicas are kept by
        target, and beyond the list."""
        problem = self._admit(instance) if self._admit is not None else None
        if problem is None:
            try:
                old = self._replicas.get(target_key(instance))
                replica = _updated(old, instance)
                # A target new to the table (slow start); not in the first table, whose
                # replicas are all new at once (ramping them together would change no
                # share, and cost a refresh of every one for the window).
                if old is None and self._on_new is not None and self.source is not None:
                    self._on_new(replica)
                self._replicas[replica.key] = replica
                return replica
            except Exception as exc:
                problem = f"cannot route to it: {type(exc).__name__}: {exc}"[:300]
        if self._on_skip is not None:
            self._on_skip(instance, problem)
        return None

    def _forget(self, replica: Replica) -> None:
        """Drop a replica that left the list, unless it is ejected: that one is kept
        until its ejection ends."""
        if self._replicas.get(replica.key) is not replica:
            return
        until = _ejected_until(replica, self._clock())
        if until is not None:
            heapq.heappush(self._departed, (until, replica.key))
        else:
            del self._replicas[replica.key]

    def _settle_departed(self) -> None:
        """After a whole load: keep, of the replicas known and not listed (all in
        ``_departed``), those ejected now, and only those (O(departed))."""
        now = self._clock()
        kept: dict[str, float] = {}
        for _, key in self._departed:
            replica = self._replicas.get(key)
            if replica is None or key in kept or self._listed(replica):
                continue
            until = _ejected_until(replica, now)
            if until is None:
                del self._replicas[key]
            else:
                kept[key] = until
        departed = [(until, key) for key, until in kept.items()]
        heapq.heapify(departed)
        self._departed = departed

    def _expire_departed(self) -> None:
        now = self._clock()
        while self._departed and self._departed[0][0] <= now:
            _, key = heapq.heappop(self._departed)
            replica = self._replicas.get(key)
            if replica is None or self._listed(replica):
                continue  # back in the list since, or already gone
            until = _ejected_until(replica, now)
            if until is not None:
                # Ejected again since it left (a failed request that was in flight).
                heapq.heappush(self._departed, (until, key))
            else:
                del self._replicas[key]

    def _listed(self, replica: Replica) -> bool:
        return self._index.get(replica.instance.id) is replica


def _updated(replica: Replica | None, instance: ServiceInstance) -> Replica:
    """``replica`` brought up to ``instance``'s payload (weight, zone, group, shard), or
    a new replica of it if there is none."""
    if replica is None:
        return Replica.of(instance)
    payload = instance.payload
    replica.instance = instance
    replica.shard, replica.zone, replica.group = payload.shard, payload.zone, payload.group
    replica.reweigh(payload.weight)
    return replica


def _ejected_until(replica: Replica, now: float) -> float | None:
    """When ``replica``'s ejection ends, if it is ejected at ``now``."""
    until = replica.ejected_until
    return until if until is not None and now < until else None
