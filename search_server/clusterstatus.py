"""What one search server tells of its cluster: ``GET /cluster`` and each dashboard event.

Read-only; a part not built yet shows as empty (no list, not leader), never as an error.

Design: docs/design/search-server.md, "/cluster, bounded at any size".
"""

from __future__ import annotations

import time
from typing import Any, Final

from discovery.instance import ServiceInstance

from .clusterview import ClusterViews, PageRequest
from .config import SearchServerConfig
from .dashboard import MemberCache, QueryStats
from .fanout import FanOut
from .parts import ServerParts

__all__ = ["MAX_GROUPS_LISTED", "ClusterStatus"]

#: Servers the dashboard shows as tiles; a larger cluster is shown as a grid of shards
#: (each shard's replicas a click away, ``GET /cluster?shard=N``).
_DASHBOARD_SERVERS: Final = 200
#: Replica groups listed in a view (by name); ``groups.total`` counts them all. A grouped
#: cluster has a few (each is a whole copy of the corpus).
MAX_GROUPS_LISTED: Final = 100


class ClusterStatus:
    """The cluster as ``parts`` see it, with the search servers from ``members`` and
    the recent queries from ``query_stats``; :attr:`views` pages its routing list."""

    def __init__(
        self,
        config: SearchServerConfig,
        parts: ServerParts,
        *,
        members: MemberCache,
        query_stats: QueryStats,
    ) -> None:
        self._config = config
        self._parts = parts
        self._members = members
        self._query_stats = query_stats
        #: /cluster and the dashboard: summary, problems and pages of the routing list.
        self.views = ClusterViews(self._describe)

    def _describe(self, instance: ServiceInstance, ejected: bool) -> dict[str, Any]:
        """A server's entry on a ``/cluster`` page: its registration and what this
        search server's fan-out learned of it (nothing before it routed to it)."""
        payload = instance.payload
        entry: dict[str, Any] = {
            "id": instance.id,
            "address": instance.address,
            "port": instance.port,
            "shard": payload.shard,
            "replica": payload.replica,
            "zone": payload.zone,
            "group": payload.group,
            "weight": payload.weight,
            "state": payload.state.value,
            "enabled": instance.enabled,
            "ejected": ejected,
        }
        if payload.reason:  # why it is draining or in maintenance
            entry["reason"] = payload.reason
        fanout = self._parts.fanout
        replica = fanout.replica(instance) if fanout is not None else None
        if replica is not None:
            entry["sent"] = replica.sent  # hedges included
            entry["answers"] = replica.samples
            entry["in_flight"] = replica.outstanding
            entry["latency_ms"] = round(replica.seconds * 1000, 3)
            # Latency outlier demotion (search_server.demotion): out of rotation for
            # this search server but its probes, and how much slower than the same
            # queries' other shards it has been (None: too few answers to say).
            entry["demoted"] = replica.demoted_at is not None
            entry["relative_slowness"] = (
                round(replica.relative, 2) if replica.relative_samples else None
            )
        return entry

    def cluster_view(
        self, page: PageRequest | None = None, *, grid: bool = False
    ) -> dict[str, Any]:
        """What ``GET /cluster`` answers: whose list this server routes with, its
        summary and problems, and one ``page`` of its servers (every server of a
        cluster of up to 1,000; :mod:`search_server.clusterview`)."""
        parts = self._parts
        reader = parts.reader
        live = reader.current if reader is not None else None
        fanout = parts.fanout
        ejected = fanout.ejected() if fanout is not None else set()
        expected = fanout.expected_shards if fanout is not None else ()
        duty = parts.leader.duty if parts.leader is not None else None
        brake = duty.brake_status() if duty is not None else None
        view = {
            "self": parts.server_id,
            "is_leader": parts.is_leader,
            "leader": live.leader if live is not None else None,
            "epoch": live.epoch if live is not None else 0,
            "version": live.version if live is not None else 0,
            "published_at": live.published_at if live is not None else None,
            "applied_at_ms": (
                round(reader.applied_at * 1000, 3)
                if reader is not None and reader.applied_at is not None
                else None
            ),
            "age_ms": round(reader.age() * 1000) if reader is not None else None,
            "redis_connected": reader.connected if reader is not None else False,
            "source": "zookeeper"
            if parts.fallback is not None and parts.fallback.active
            else "redis",
            "now_ms": int(time.time() * 1000),
            # Only the leader runs the brake: null on the other search servers.
            "mass_loss_brake": brake.to_dict() if brake is not None else None,
            # True while this leader holds its term over an epoch no leader can hold.
            "fence_poisoned": duty is not None and duty.fence_poisoned,
            # Which slice of each shard's replicas this server routes to (subsetting).
            "subsets": {
                "size": self._config.subset_size,
                "rank": fanout.position.rank if fanout is not None else 0,
                "count": fanout.position.count if fanout is not None else 1,
            },
        }
        view.update(
            self.views.view(
                parts.routing_list() or {}, ejected, expected, page or PageRequest(), grid=grid
            )
        )
        view["groups"] = self._groups(fanout)
        return view

    def _groups(self, fanout: FanOut | None) -> dict[str, Any]:
        """The replica groups this server routes to: each one's replicas, coverage,
        rotation and the queries it sent there (``listed``: at most
        :data:`MAX_GROUPS_LISTED`, by name; ``total`` counts them all)."""
        table = fanout.groups() if fanout is not None else None
        groups = table.groups if table is not None else {}
        return {
            "min_coverage_percent": self._config.min_group_coverage_percent,
            "total": len(groups),
            "in_rotation": sum(1 for g in groups.values() if g.in_rotation),
            "listed": table.summary(MAX_GROUPS_LISTED) if table is not None else [],
        }

    async def dashboard_snapshot(self) -> dict[str, Any]:
        """One event of ``GET /events``: :meth:`cluster_view` plus ``cluster``,
        ``stale_after_ms``, ``search_servers`` (leader and self marked) and ``stats``."""
        # A summary, the shard grid, the problems and at most a page of servers: the
        # same few hundred KB at 50,000 data servers as at 500.
        view = self.cluster_view(PageRequest(limit=_DASHBOARD_SERVERS), grid=True)
        members = await self._members.get()
        for member in members:
            member["leader"] = member["id"] == view["leader"]
            member["self"] = member["id"] == self._parts.server_id
        view["cluster"] = self._config.cluster.cluster
        # The list's age is reset by events and by the reconciler: with a quiet leader
        # it grows to reconcile_interval while all is well. Beyond that, it is stale.
        view["stale_after_ms"] = round(max(5.0, self._config.reconcile_interval + 5.0) * 1000)
        view["search_servers"] = members
        view["search_servers_stale"] = self._members.stale
        view["stats"] = self._query_stats.snapshot()
        return view
