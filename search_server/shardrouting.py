"""Which replicas a fan-out routes each shard to, kept across its queries.

A server left out of the routing table is counted and logged once, never fails it. Not
thread-safe; runs on the fan-out's event loop.

Design: docs/design/search-server.md, "The routing table".
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Mapping

from discovery.address import NetworkPolicy
from discovery.instance import ServiceInstance
from discovery.livelist.model import LiveListChange

from .metrics import FanOutMetrics
from .picking import Replica, target_key
from .routing import RoutingTable
from .slowstart import Ramps
from .subsetting import Position, Subset, Subsetter

__all__ = ["ShardRoute", "ShardRouting", "Table"]

log = logging.getLogger(__name__)

#: The routing table a query iterates: (shard, its routable replicas), by shard.
Table = list[tuple[int, list[Replica]]]

# Distinct unroutable targets whose exclusion is remembered as logged.
_MAX_LOGGED_SKIPS = 1024


class ShardRoute:
    """How this search server routes one shard, made when the shard's replica list (by
    identity) or the search server's position changes, and shared by the queries until
    then: its subset, its members, and the documents it holds."""

    __slots__ = ("docs", "members", "position", "replicas", "shard", "subset")

    def __init__(
        self, shard: int, replicas: list[Replica], position: Position, subsetter: Subsetter
    ) -> None:
        self.shard = shard
        self.replicas = replicas
        self.position = position
        made = subsetter.subset(replicas, position)
        # None: no subset (the shard is small, or this search server covers it all).
        self.subset: Subset | None = None if made.whole else made
        # The replicas the shard's first requests go to (never modified).
        self.members: list[Replica] = replicas if made.whole else list(made.members)
        # The most any replica holds: the shard's documents, for coverage.
        self.docs = max((r.instance.payload.docs for r in replicas), default=0)


class ShardRouting:
    """The routing of one fan-out: its table, each shard's route, the expected shards.

    ``clock`` times ejections and slow start (the fan-out's); ``networks`` leaves data
    servers outside it out of the table; ``subsetter`` makes each shard's subset for
    :attr:`position`; ``ramps`` holds the replicas in slow start; ``shards`` is how many
    shards the cluster has (0 to ``shards - 1``) beside those routed to.
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float],
        networks: NetworkPolicy,
        subsetter: Subsetter,
        ramps: Ramps,
        metrics: FanOutMetrics,
        shards: int = 0,
    ) -> None:
        self._clock = clock
        self._networks = networks
        self._subsetter = subsetter
        self._ramps = ramps
        self._metrics = metrics
        self._position = Position()
        # Each shard's route, for the replica list (by identity) and position it was
        # made for: made again only when either changes, never per query.
        self._shard_routes: dict[int, ShardRoute] = {}
        # Every shard the cluster has, as far as this search server knows: ``shards``
        # and every shard it has routed to since it started; with the last count of
        # documents seen of each (for the coverage of a shard gone missing).
        self._expected_shards: dict[int, int | None] = dict.fromkeys(range(shards))
        # Replicas by shard for the last list fanned out to or followed.
        self._routes = RoutingTable(
            clock,
            admit=self._admit if networks.narrows else None,
            on_skip=self._skipped,
            on_new=self._new_replica,
        )
        # Targets whose exclusion was logged (bounded): one line each, not one per list.
        self._logged_skips: OrderedDict[str, None] = OrderedDict()

    # -- the table --------------------------------------------------------------------

    def table_for(
        self, servers: Iterable[ServiceInstance] | Mapping[str, ServiceInstance]
    ) -> Table:
        """The table to route a query of ``servers`` with: the one followed when it
        holds ``servers`` (by identity), else built for it, O(servers). Brings the slow
        start's weights up to date (at most every 0.1 s, while any replica ramps)."""
        if servers is not self._routes.source:
            self._routes.load(servers)  # O(servers): a list not followed change by change
            self._metrics.routing_updates.labels(kind="full").inc()
        if self._ramps.refresh(self._clock()):
            self._metrics.slow_start.set(len(self._ramps))
        return self._routes.table

    def follow(self, change: LiveListChange) -> None:
        """Move the table along ``change`` (see :meth:`RoutingTable.follow`)."""
        kind = self._routes.follow(change)
        if kind != "none":
            self._metrics.routing_updates.labels(kind=kind).inc()

    def replica(self, instance: ServiceInstance) -> Replica | None:
        """The replica routed to for ``instance`` (``None`` before it was routed to)."""
        return self._routes.replica(target_key(instance))

    @property
    def routable(self) -> int:
        """How many data servers are routable."""
        return self._routes.routable

    @property
    def answered(self) -> int:
        """How many routable data servers have answered at least once (the base of the
        ejection cap): O(routable)."""
        return self._routes.answered

    def reserve(self, shard: int) -> list[Replica]:
        """The shard's draining replicas: requests of last resort (usually none)."""
        return self._routes.reserve(shard)

    # -- routes and expected shards ---------------------------------------------------

    def routes(self, table: Table) -> list[ShardRoute]:
        """Each shard's route for a query of ``table``: the one made before, unless the
        shard's list or the position has changed since."""
        if len(self._shard_routes) > len(table):
            # Shards have left the table: forget their routes (and their replicas).
            present = {shard for shard, _ in table}
            self._shard_routes = {s: r for s, r in self._shard_routes.items() if s in present}
        routes = self._shard_routes
        position = self._position
        made: list[ShardRoute] = []
        for shard, replicas in table:
            route = routes.get(shard)
            if route is None or route.replicas is not replicas or route.position is not position:
                route = ShardRoute(shard, replicas, position, self._subsetter)
                routes[shard] = route
                self._expected_shards[shard] = route.docs
            made.append(route)
        return made

    def missing(self, table: Table) -> list[tuple[int, int]]:
        """The shards expected but not in ``table`` (no replica to send to), with their
        last known documents, or an average shard's for one never seen. O(1) while
        every expected shard is in the table."""
        expected = self._expected_shards
        if len(expected) == len(table):
            return []  # the table's shards are all expected: the same set
        present = {shard for shard, _ in table}
        known = [docs for docs in expected.values() if docs is not None]
        average = sum(known) // len(known) if known else 0
        return [
            (shard, average if docs is None else docs)
            for shard, docs in expected.items()
            if shard not in present
        ]

    @property
    def expected_shards(self) -> Collection[int]:
        """The shards ``shards`` named and every shard routed to since."""
        return self._expected_shards.keys()

    @property
    def position(self) -> Position:
        """This search server's place among the search servers."""
        return self._position

    def set_position(self, position: Position) -> None:
        """Make each shard's subset for ``position`` at its next query."""
        if position != self._position:
            self._position = position

    # -- the table's callbacks --------------------------------------------------------

    def _admit(self, instance: ServiceInstance) -> str | None:
        problem = self._networks.problem(instance.address)
        return None if problem is None else f"not_allowed: {problem}"

    def _new_replica(self, replica: Replica) -> None:
        """A target new to this fan-out: its weight ramps (slow start)."""
        self._ramps.add(replica, self._clock())
        self._metrics.slow_start.set(len(self._ramps))

    def _skipped(self, instance: ServiceInstance, problem: str) -> None:
        """A listed server left out of the routing table: counted, logged once."""
        why = "not_allowed" if problem.startswith("not_allowed:") else "error"
        self._metrics.unroutable.labels(why=why).inc()
        key = target_key(instance)
        if key in self._logged_skips:
            return
        self._logged_skips[key] = None
        if len(self._logged_skips) > _MAX_LOGGED_SKIPS:
            self._logged_skips.popitem(last=False)
        log.warning(
            "not routing to data server %s (%s:%d, shard %d): %s",
            instance.id,
            instance.address,
            instance.port,
            instance.payload.shard,
            problem,
        )
