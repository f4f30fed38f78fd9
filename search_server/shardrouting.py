"""Which replicas a fan-out routes each shard to, kept across its queries.

A server left out of the routing table (outside ``--allowed-networks``, of a shard
outside ``--shards``, or one whose replica cannot be made) is counted and logged once,
never fails it. Which shards every answer expects is :mod:`.expectedshards`'s. Not
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
from discovery.livelist.shards import SHARD_OUT_OF_RANGE, within_shards

from .expectedshards import FORGET_MISSING_SHARD_AFTER, ExpectedShards
from .groups import MIN_GROUP_COVERAGE, GroupTable, RouteGroups
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
    then: its subset, its members, its replica groups (each with its own subset, when
    ``group_table`` is given and a replica has a group), and the documents it holds."""

    __slots__ = ("docs", "groups", "members", "position", "replicas", "shard", "subset")

    def __init__(
        self,
        shard: int,
        replicas: list[Replica],
        position: Position,
        subsetter: Subsetter,
        group_table: GroupTable | None = None,
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
        # The replicas by group, each group subset on its own (None: no group here).
        self.groups = (
            RouteGroups.of(replicas, position, subsetter, group_table)
            if group_table is not None
            else None
        )


class ShardRouting:
    """The routing of one fan-out: its table, each shard's route, the expected shards.

    ``clock`` times ejections and slow start (the fan-out's); ``networks`` leaves data
    servers outside it out of the table; ``subsetter`` makes each shard's subset for
    :attr:`position`; ``ramps`` holds the replicas in slow start; ``shards`` is how many
    shards the cluster has (0 to ``shards - 1``; 0: any number): expected in every
    answer beside those routed to, and a data server of another shard is never routed
    to. A shard above them is expected until it has had no replica for
    ``forget_missing_shard_after`` seconds (0: for ever). A replica group must cover
    ``min_group_coverage`` of the corpus to stay in rotation (:attr:`groups`).
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
        forget_missing_shard_after: float = FORGET_MISSING_SHARD_AFTER,
        min_group_coverage: float = MIN_GROUP_COVERAGE,
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
        # and every shard it has routed to and not forgotten since; with the last count
        # of documents seen of each (for the coverage of a shard gone missing).
        self._expected = ExpectedShards(
            shards, forget_after=forget_missing_shard_after, on_forget=self._forgot
        )
        # Replicas by shard for the last list fanned out to or followed.
        self._routes = RoutingTable(
            clock,
            # A shard outside --shards is refused first, whatever its address.
            admit=within_shards(shards, self._admit if networks.narrows else None),
            on_skip=self._skipped,
            on_new=self._new_replica,
        )
        # Targets whose exclusion was logged (bounded): one line each, not one per list.
        self._logged_skips: OrderedDict[str, None] = OrderedDict()
        # The replica groups, moved along as the shards' routes are made and dropped.
        self._groups = GroupTable(min_coverage=min_group_coverage, clock=clock, metrics=metrics)

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
            # A shard's last replica may have left: its time to be forgotten runs now.
            self._expected.observe(self._routes.table, self._clock())

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
        groups = self._groups
        if len(self._shard_routes) > len(table):
            # Shards have left the table: forget their routes (and their replicas).
            present = {shard for shard, _ in table}
            for shard in [s for s in self._shard_routes if s not in present]:
                del self._shard_routes[shard]
                groups.forget(shard)
        routes = self._shard_routes
        position = self._position
        made: list[ShardRoute] = []
        for shard, replicas in table:
            route = routes.get(shard)
            if route is None or route.replicas is not replicas or route.position is not position:
                route = ShardRoute(shard, replicas, position, self._subsetter, groups)
                routes[shard] = route
                self._expected.routed(shard, route.docs)
                groups.routed(shard, route.groups, route.docs)
            made.append(route)
        return made

    @property
    def groups(self) -> GroupTable:
        """The replica groups of the routes made so far (none in a cluster without)."""
        return self._groups

    def refresh_groups(self) -> GroupTable:
        """The replica groups brought up to the routing table as it is now (the routes
        of shards changed since the last query made, coverage and rotation judged):
        for a view, ``O(shards)``."""
        table = self._routes.table
        self.routes(table)
        self._groups.refresh(self.missing(table), self.docs_cap)
        return self._groups

    def missing(self, table: Table) -> list[tuple[int, int]]:
        """The shards expected but not in ``table`` (no replica to send to), with the
        documents each counts for (see :meth:`ExpectedShards.missing`); forgets those
        absent too long first. O(1) while every expected shard is in the table."""
        return self._expected.missing(table, self._clock())

    @property
    def docs_cap(self) -> int | None:
        """The most one shard's documents count for in an answer's coverage (None:
        no cap yet); see :data:`~search_server.expectedshards.DOCS_CAP_MULTIPLE`."""
        return self._expected.docs_cap()

    @property
    def expected_shards(self) -> Collection[int]:
        """The shards ``shards`` named and every shard routed to since, but those
        forgotten (no replica for ``forget_missing_shard_after``)."""
        return self._expected.shards

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

    def _forgot(self, shard: int, absent_for: float) -> None:
        """A shard absent too long is no longer expected: counted and logged."""
        self._metrics.shards_forgotten.inc()
        log.warning(
            "shard %d has had no replica for %.0f s: no longer expected in answers "
            "(--forget-missing-shard-after; --shards N names the shards always expected)",
            shard,
            absent_for,
        )

    def _skipped(self, instance: ServiceInstance, problem: str) -> None:
        """A listed server left out of the routing table: counted, logged once."""
        why = "not_allowed" if problem.startswith("not_allowed:") else "error"
        if problem.startswith(SHARD_OUT_OF_RANGE + ":"):
            why = SHARD_OUT_OF_RANGE
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
