"""The status of a cluster as ``discovery status`` reports it, and how it is compared.

:func:`compare` (no I/O) finds the :class:`Differences` between what is registered, with
maintenance markers applied as the leader applies them, and what is published.

Operating: docs/operating.md, "``discovery status``".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Final

from discovery.instance import InstanceState, ServiceInstance
from discovery.livelist.admin import Heartbeat, Published
from discovery.zk.maintenance import MaintenanceMarker, overlay

__all__ = [
    "ClusterStatus",
    "Contender",
    "Differences",
    "Mismatch",
    "Published",
    "ShardSummary",
    "by_id",
    "compare",
]

# The fields compared between a registration and its published entry.
_COMPARED: Final = ("address", "port", "shard", "state", "enabled")


@dataclass(frozen=True)
class Contender:
    """One node of the election: its contender's id (the node's data), name and czxid."""

    id: str
    node: str
    czxid: int

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "node": self.node, "czxid": self.czxid}


@dataclass(frozen=True)
class Mismatch:
    """An id registered and published with different fields: ``{field: (registered,
    published)}``."""

    id: str
    fields: Mapping[str, tuple[Any, Any]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "fields": {
                name: {"registered": registered, "published": published}
                for name, (registered, published) in sorted(self.fields.items())
            },
        }


@dataclass(frozen=True)
class Differences:
    """Where the registrations and the published list (or its leader) disagree."""

    registered_not_published: tuple[str, ...] = ()
    published_not_registered: tuple[str, ...] = ()
    mismatched: tuple[Mismatch, ...] = ()
    no_leader: bool = False
    heartbeat_missing: bool = False
    published_missing: bool = False
    leader_mismatch: tuple[str, ...] = ()

    @property
    def shown(self) -> frozenset[str]:
        """The fields that show a difference, by name (each is one of :data:`PROBLEMS`)."""
        fields = {
            "registered_not_published": self.registered_not_published,
            "published_not_registered": self.published_not_registered,
            "mismatched": self.mismatched,
            "no_leader": self.no_leader,
            "heartbeat_missing": self.heartbeat_missing,
            "published_missing": self.published_missing,
            "leader_mismatch": self.leader_mismatch,
        }
        return frozenset(name for name, value in fields.items() if value)

    @property
    def in_sync(self) -> bool:
        return not self.shown

    def to_dict(self) -> dict[str, Any]:
        return {
            "in_sync": self.in_sync,
            "registered_not_published": list(self.registered_not_published),
            "published_not_registered": list(self.published_not_registered),
            "mismatched": [m.to_dict() for m in self.mismatched],
            "no_leader": self.no_leader,
            "heartbeat_missing": self.heartbeat_missing,
            "published_missing": self.published_missing,
            "leader_mismatch": list(self.leader_mismatch),
        }


@dataclass(frozen=True)
class ShardSummary:
    """The shards by how many of their replicas are live (listed, serving, enabled).

    ``source`` says which list was counted: ``published`` (what the search servers route
    with) or, when nothing readable is published, ``registered`` (the registrations with
    the operators' markers applied, as the leader would publish them). ``no_live_replica``
    names every shard with none, a shard of ``0..expected-1`` with no server at all
    among them.
    """

    source: str
    total: int
    all_live: int
    some_not_live: int
    no_live_replica: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "total": self.total,
            "all_live": self.all_live,
            "some_not_live": self.some_not_live,
            "no_live_replica": list(self.no_live_replica),
        }


#: The problems a status can show, in the order :attr:`Health.problems` lists them.
#: Stable names: scripts match on them (``discovery status --json``'s ``health``).
PROBLEMS: Final = (
    "no_leader",
    "heartbeat_missing",
    "leader_mismatch",
    "published_missing",
    "registered_not_published",
    "published_not_registered",
    "mismatched",
    "no_live_replica",
    "invalid_registrations",
    "shared_targets",
)


@dataclass(frozen=True)
class Health:
    """The verdict on a status: ``healthy`` when it shows none of :data:`PROBLEMS`.

    Degraded is not necessarily broken: for a moment after any change the published
    list lags the registrations (``registered_not_published`` and the like) until the
    leader publishes. A script that acts on a degraded verdict should look again.
    """

    problems: tuple[str, ...]

    @property
    def healthy(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {"healthy": self.healthy, "problems": list(self.problems)}


@dataclass(frozen=True)
class ClusterStatus:
    """Everything ``discovery status`` reports; :meth:`to_dict` is the ``--json`` document.

    ``contenders`` are in election order, the leader first. ``data_servers`` and
    ``search_servers`` map ids to decoded registrations; ``*_invalid`` map the ids of
    children that are not valid ServiceInstances to the reason. ``now_ms`` is the wall
    clock when the reads finished. ``redis`` says where the store is
    (:meth:`~discovery.livelist.admin.LiveListAdmin.where`; the key keeps its name in the
    JSON document). ``maintenance`` maps ids to the operators' markers
    (registered or not). ``expected_shards`` is the cluster's shard count (``--shards``;
    0: only the shards seen), so that a shard whose last server left is named.
    """

    zookeeper: str
    redis: str
    prefix: str
    now_ms: int
    contenders: tuple[Contender, ...]
    search_servers: Mapping[str, ServiceInstance]
    search_servers_invalid: Mapping[str, str]
    data_servers: Mapping[str, ServiceInstance]
    data_servers_invalid: Mapping[str, str]
    heartbeat: Heartbeat | None
    published: Published
    differences: Differences = field(default_factory=Differences)
    maintenance: Mapping[str, MaintenanceMarker] = field(default_factory=dict)
    expected_shards: int = 0

    @property
    def leader(self) -> Contender | None:
        """The election's leader: the contender with the lowest sequence node."""
        return self.contenders[0] if self.contenders else None

    @property
    def published_age_ms(self) -> int | None:
        live = self.published.live
        return None if live is None else self.now_ms - live.published_at

    def shards(self) -> dict[int, list[ServiceInstance]]:
        """Registered data servers by shard (shards ascending, servers by replica and id)."""
        by_shard: dict[int, list[ServiceInstance]] = {}
        for instance in self.data_servers.values():
            by_shard.setdefault(instance.payload.shard, []).append(instance)
        return {
            shard: sorted(by_shard[shard], key=lambda i: (i.payload.replica, i.id))
            for shard in sorted(by_shard)
        }

    @cached_property
    def as_published(self) -> Mapping[str, ServiceInstance]:
        """The registered data servers with the operators' markers applied, as the
        leader publishes them (made once: the summary's parts all read it)."""
        return overlay(self.data_servers, self.maintenance)

    def states(self) -> dict[str, int]:
        """Registered data servers by state (markers applied), and ``disabled``: those
        serving with ``enabled`` false."""
        counts = dict.fromkeys((s.value for s in InstanceState), 0)
        disabled = 0
        for instance in self.as_published.values():
            state = instance.payload.state
            counts[state.value] += 1
            disabled += state is InstanceState.SERVING and not instance.enabled
        counts["disabled"] = disabled
        return counts

    def shard_summary(self) -> ShardSummary:
        """The shards by live replicas, from the published list (or the registrations
        when nothing readable is published): one pass over the servers."""
        live_list = self.published.live
        if live_list is not None:
            source, servers = "published", live_list.servers
        else:
            source, servers = "registered", self.as_published
        listed: dict[int, int] = {}
        live: dict[int, int] = {}
        for instance in servers.values():
            shard = instance.payload.shard
            listed[shard] = listed.get(shard, 0) + 1
            live[shard] = live.get(shard, 0) + instance.routable
        absent = [s for s in range(self.expected_shards) if s not in listed]
        no_live = sorted([s for s, n in live.items() if n == 0] + absent)
        all_live = sum(1 for s, n in listed.items() if live[s] == n)
        total = len(listed) + len(absent)
        return ShardSummary(
            source=source,
            total=total,
            all_live=all_live,
            some_not_live=total - all_live - len(no_live),
            no_live_replica=tuple(no_live),
        )

    @cached_property
    def summary(self) -> ShardSummary:
        """:meth:`shard_summary`, made once (the verdict and the document both read it)."""
        return self.shard_summary()

    @cached_property
    def health(self) -> Health:
        """Which of :data:`PROBLEMS` this status shows (the exit status of ``discovery
        status``: 0 healthy, 1 degraded)."""
        shown = set(self.differences.shown)
        if self.summary.no_live_replica:
            shown.add("no_live_replica")
        if self.data_servers_invalid or self.search_servers_invalid:
            shown.add("invalid_registrations")
        if self.shared_targets():
            shown.add("shared_targets")
        return Health(tuple(problem for problem in PROBLEMS if problem in shown))

    def shared_targets(self) -> dict[str, list[str]]:
        """``address:port`` claimed by more than one registered data server id, with
        the ids: a sign of squatting (an identity registering a real server's address
        under an id of its own, or the real server's id with a copy of its address) or
        of two servers configured with one address. Found once (the verdict, the
        document and the report all ask; at 50,000 it is a pass over every server)."""
        return self._shared_targets

    @cached_property
    def _shared_targets(self) -> dict[str, list[str]]:
        claims: dict[str, list[str]] = {}
        for instance in self.data_servers.values():
            claims.setdefault(f"{instance.address}:{instance.port}", []).append(instance.id)
        return {target: sorted(ids) for target, ids in sorted(claims.items()) if len(ids) > 1}

    def to_dict(self) -> dict[str, Any]:
        leader = self.leader
        live = self.published.live
        return {
            "health": self.health.to_dict(),
            "zookeeper": self.zookeeper,
            "redis": self.redis,
            "prefix": self.prefix,
            "now_ms": self.now_ms,
            "leader": {
                "id": leader.id if leader else None,
                "epoch": leader.czxid if leader else None,
                "node": leader.node if leader else None,
            },
            "contenders": [c.to_dict() for c in self.contenders],
            "heartbeat": None if self.heartbeat is None else self.heartbeat.to_dict(),
            "search_servers": {
                "count": len(self.search_servers),
                "servers": [
                    {"id": i.id, "address": i.address, "port": i.port}
                    for i in by_id(self.search_servers)
                ],
                "invalid": _invalid_list(self.search_servers_invalid),
            },
            "data_servers": {
                "count": len(self.data_servers),
                "states": self.states(),
                "shard_summary": self.summary.to_dict(),
                "shards": [
                    {
                        "shard": shard,
                        "servers": [
                            {**_server_dict(i), "maintenance": self._maintenance_reason(i.id)}
                            for i in servers
                        ],
                    }
                    for shard, servers in self.shards().items()
                ],
                "invalid": _invalid_list(self.data_servers_invalid),
                "shared_targets": [
                    {"target": target, "ids": ids} for target, ids in self.shared_targets().items()
                ],
            },
            "published": {
                "present": live is not None,
                "error": self.published.error,
                "epoch": live.epoch if live else None,
                "version": live.version if live else None,
                "leader": live.leader if live else None,
                "published_at": live.published_at if live else None,
                "age_ms": self.published_age_ms,
                "count": len(live.servers) if live else 0,
                "servers": [_server_dict(i) for i in by_id(live.servers)] if live else [],
                "skipped": list(self.published.skipped),
            },
            "maintenance": {
                "count": len(self.maintenance),
                "markers": [
                    {**self.maintenance[k].to_dict(), "registered": k in self.data_servers}
                    for k in sorted(self.maintenance)
                ],
            },
            "differences": self.differences.to_dict(),
        }

    def _maintenance_reason(self, instance_id: str) -> str | None:
        marker = self.maintenance.get(instance_id)
        return marker.reason if marker is not None else None


def by_id(servers: Mapping[str, ServiceInstance]) -> list[ServiceInstance]:
    """The instances of ``servers``, ordered by id."""
    return [servers[k] for k in sorted(servers)]


def _invalid_list(invalid: Mapping[str, str]) -> list[dict[str, str]]:
    return [{"id": k, "reason": invalid[k]} for k in sorted(invalid)]


def _server_dict(instance: ServiceInstance) -> dict[str, Any]:
    payload = instance.payload
    return {
        "id": instance.id,
        "address": instance.address,
        "port": instance.port,
        "shard": payload.shard,
        "replica": payload.replica,
        "state": payload.state.value,
        "enabled": instance.enabled,
        "reason": payload.reason,
        "docs": payload.docs,
        "zone": payload.zone,
        "weight": payload.weight,
        "group": payload.group,
    }


def _fields(instance: ServiceInstance) -> dict[str, Any]:
    return {
        "address": instance.address,
        "port": instance.port,
        "shard": instance.payload.shard,
        "state": instance.payload.state.value,
        "enabled": instance.enabled,
    }


def compare(
    registered: Mapping[str, ServiceInstance],
    contenders: tuple[Contender, ...],
    heartbeat: Heartbeat | None,
    published: Published,
    maintenance: Mapping[str, MaintenanceMarker] | None = None,
) -> Differences:
    """The differences between what is registered (and elected) and what is published.

    ``maintenance`` markers are applied to the registrations first, as the leader does:
    a marked server is expected to be published in state ``maintenance``.
    """
    if maintenance:
        registered = overlay(registered, maintenance)
    live = published.live
    listed: Mapping[str, ServiceInstance] = live.servers if live is not None else {}
    mismatched: list[Mismatch] = []
    for key in sorted(registered.keys() & listed.keys()):
        mine, theirs = _fields(registered[key]), _fields(listed[key])
        diff = {f: (mine[f], theirs[f]) for f in _COMPARED if mine[f] != theirs[f]}
        if diff:
            mismatched.append(Mismatch(key, diff))
    leader = contenders[0] if contenders else None
    leader_mismatch: list[str] = []
    if leader is not None:
        for what, other_leader, other_epoch in (
            ("published", live.leader if live else None, live.epoch if live else None),
            (
                "heartbeat",
                heartbeat.leader if heartbeat else None,
                heartbeat.epoch if heartbeat else None,
            ),
        ):
            if other_epoch is None:
                continue  # missing: reported on its own
            if (other_leader, other_epoch) != (leader.id, leader.czxid):
                leader_mismatch.append(
                    f"{what} by {other_leader!r} epoch {other_epoch}, "
                    f"elected {leader.id!r} epoch {leader.czxid}"
                )
    return Differences(
        registered_not_published=tuple(sorted(registered.keys() - listed.keys())),
        published_not_registered=tuple(sorted(listed.keys() - registered.keys())),
        mismatched=tuple(mismatched),
        no_leader=leader is None,
        heartbeat_missing=heartbeat is None,
        published_missing=live is None,
        leader_mismatch=tuple(leader_mismatch),
    )
