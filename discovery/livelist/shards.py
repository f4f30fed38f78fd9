"""Routing semantics of the live list: who gets queries, shard by shard.

:func:`route_of` is the one rule (serving and enabled: routable; draining: in its
shard's reserve, a last resort; anything else: neither), :func:`unroutable_kind` says
why a listed server is not routable. :func:`shard_out_of_range` is the cluster's shard
range (``--shards``): a server of a shard outside it gets no queries, and the leader does
not publish it (:func:`within_shards` adds the rule to an admission). :class:`ShardIndex`
applies the routing rule to a list and then follows its changes at the cost of the
shards they touch; per-shard sequences are replaced, never edited. Order within a shard
is the consumer's. Not thread-safe.

Design: docs/design/search-server.md, "The routing table".
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Mapping
from enum import StrEnum
from typing import Any, Final, Generic, Literal, TypeVar

from discovery.instance import InstanceState, ServiceInstance
from discovery.livelist.model import LiveListChange

__all__ = [
    "SHARD_OUT_OF_RANGE",
    "Admit",
    "Route",
    "ShardIndex",
    "route_of",
    "shard_out_of_range",
    "unroutable_kind",
    "within_shards",
]

T = TypeVar("T")

#: A deployment's rule on a valid registration: why it is refused (a reason starting
#: with its metric label and a colon), or None to admit it.
Admit = Callable[[ServiceInstance], str | None]

#: The reason prefix (and metric label) of a registration of a shard outside the
#: cluster's ``--shards``.
SHARD_OUT_OF_RANGE: Final = "shard_out_of_range"

#: What :meth:`ShardIndex.load` takes: instances, or ids to instances.
Servers = Iterable[ServiceInstance] | Mapping[str, ServiceInstance]


class Route(StrEnum):
    """How a listed server is routed to (see :func:`route_of`)."""

    ROUTABLE = "routable"
    """Serving and enabled: queries go here."""
    RESERVE = "reserve"
    """Draining: nothing new, unless every routable replica of its shard has failed."""


# The members as plain names: an enum's attribute costs 70 ns on Python 3.11, and a
# whole list asks for them once or twice per server.
_ROUTABLE: Final = Route.ROUTABLE
_RESERVE: Final = Route.RESERVE
_SERVING: Final = InstanceState.SERVING
_DRAINING: Final = InstanceState.DRAINING


def route_of(instance: ServiceInstance) -> Route | None:
    """``instance``'s route: routable (:attr:`~discovery.instance.ServiceInstance.routable`:
    serving and enabled), in reserve (draining), or None (disabled, in maintenance)."""
    # ServiceInstance.routable spelled out: this runs for every server of a list.
    state = instance.payload.state
    if state is _SERVING:
        return _ROUTABLE if instance.enabled else None
    return _RESERVE if state is _DRAINING else None


def unroutable_kind(instance: ServiceInstance) -> str | None:
    """Why ``instance`` is not routable: ``"disabled"`` (serving, but its enabled flag is
    off) or its state (``"draining"``, ``"maintenance"``); None when it is routable."""
    state = instance.payload.state
    if state is _SERVING:
        return None if instance.enabled else "disabled"
    return state.value


def shard_out_of_range(instance: ServiceInstance, shards: int) -> str | None:
    """Why ``instance`` is refused by a cluster of ``shards`` shards (0 to ``shards -
    1``; 0: any shard), or None. A server of another shard number is no replica of the
    cluster's: routed to, or published, its shard would be expected in every answer
    and reported missing in each once it left (a node registered for a moment with
    shard 999 made every later answer partial)."""
    shard = instance.payload.shard
    if shards <= 0 or shard < shards:
        return None
    return (
        f"{SHARD_OUT_OF_RANGE}: shard {shard} is outside the cluster's shards "
        f"0..{shards - 1} (--shards {shards}): refused"
    )


def within_shards(shards: int, admit: Admit | None = None) -> Admit | None:
    """``admit`` with :func:`shard_out_of_range` checked first: the admission of a
    cluster of ``shards`` shards. ``admit`` itself when ``shards`` is 0 (no range)."""
    if shards <= 0:
        return admit

    def admit_in_range(instance: ServiceInstance) -> str | None:
        refused = shard_out_of_range(instance, shards)
        if refused is not None or admit is None:
            return refused
        return admit(instance)

    return admit_in_range


# A shard with no entries: shared, never modified.
_EMPTY: list[Any] = []


class ShardIndex(Generic[T]):
    """The routable entries and the reserve of every shard of one live list.

    ``entry(instance, previous)`` makes what is stored for an instance (a routable or
    draining one): ``previous`` is the entry held for its id, if any, which it may
    return (updated) to keep it. It returns None to leave the instance out (e.g.
    refused by an admission policy); it must not raise. ``on_leave`` hears of each
    entry the index stops holding (its server removed, no longer routable nor
    draining, or given a new entry). :meth:`ShardIndex.instances` stores the instances
    themselves.
    """

    def __init__(
        self,
        entry: Callable[[ServiceInstance, T | None], T | None],
        *,
        on_leave: Callable[[T], None] | None = None,
    ) -> None:
        self._entry = entry
        self._on_leave = on_leave
        self.source: object = None
        """The list (by identity) loaded or followed last; None before."""
        # (shard, routable entries) in shard order, and the same lists by shard.
        self._table: list[tuple[int, list[T]]] = []
        self._routable: dict[int, list[T]] = {}
        self._reserve: dict[int, list[T]] = {}
        # Each indexed id: its entry, its shard and (for the few) that it is in reserve.
        # Not one tuple per id: at 50,000 servers those were 50,000 more objects for
        # the garbage collector, and made a load three times as long.
        self._entries: dict[str, T] = {}
        self._shards: dict[str, int] = {}
        self._reserved: set[str] = set()

    @staticmethod
    def instances() -> ShardIndex[ServiceInstance]:
        """An index that stores the instances themselves."""
        return ShardIndex[ServiceInstance](_the_instance)

    # -- reading ------------------------------------------------------------------

    @property
    def table(self) -> list[tuple[int, list[T]]]:
        """``(shard, routable entries)`` for each shard with one, in shard order.
        Updated in place by :meth:`follow` (its per-shard lists are not): do not
        modify it, nor hold it across a change."""
        return self._table

    @property
    def routable_count(self) -> int:
        """Routable entries in all shards."""
        return len(self._entries) - len(self._reserved)

    @property
    def reserve_count(self) -> int:
        """Draining entries in all shards."""
        return len(self._reserved)

    def routable(self, shard: int) -> list[T]:
        """``shard``'s routable entries (a snapshot: never edited; do not modify it)."""
        return self._routable.get(shard, _EMPTY)

    def reserve(self, shard: int) -> list[T]:
        """``shard``'s draining entries, the last resort (a snapshot, as
        :meth:`routable`). Empty for most shards."""
        return self._reserve.get(shard, _EMPTY)

    def preference(self, shard: int) -> list[T]:
        """``shard``'s entries in preference order: routable first, draining last (a
        new list when there is a reserve, else :meth:`routable`'s)."""
        reserve = self._reserve.get(shard)
        routable = self._routable.get(shard, _EMPTY)
        return [*routable, *reserve] if reserve else routable

    def get(self, instance_id: str) -> T | None:
        """The entry held for ``instance_id`` (routable or in reserve), if any."""
        return self._entries.get(instance_id)

    # -- moving ---------------------------------------------------------------------

    def load(self, servers: Servers) -> None:
        """Index ``servers`` (instances, or ids to instances; one per id) in full,
        O(servers), offering each one's previous entry to ``entry``; ``servers``
        becomes :attr:`source`."""
        instances = servers.values() if isinstance(servers, Mapping) else servers
        before = self._entries
        entries: dict[str, T] = {}
        shards: dict[str, int] = {}
        reserved: set[str] = set()
        routable: dict[int, list[T]] = {}
        reserve: dict[int, list[T]] = {}
        make = self._entry
        replaced: list[T] = []  # entries let go for a new one of the same id
        for instance in instances:
            route = route_of(instance)
            if route is None:
                continue
            instance_id = instance.id
            previous = before.get(instance_id)
            entry = make(instance, previous)
            if entry is None:
                continue
            if previous is not None and entry is not previous:
                replaced.append(previous)
            shard = instance.payload.shard
            entries[instance_id] = entry
            shards[instance_id] = shard
            if route is _ROUTABLE:
                routable.setdefault(shard, []).append(entry)
            else:
                reserved.add(instance_id)
                reserve.setdefault(shard, []).append(entry)
        self._entries, self._shards, self._reserved = entries, shards, reserved
        self._routable, self._reserve = routable, reserve
        self._table = sorted(routable.items())
        self.source = servers
        if self._on_leave is not None:
            for instance_id in before.keys() - entries.keys():
                self._on_leave(before[instance_id])
            for entry in replaced:
                self._on_leave(entry)

    def follow(self, change: LiveListChange) -> Literal["change", "full", "none"]:
        """Move to ``change.current``: by its delta if the index holds
        ``change.previous`` (a reload's delta included), else by a full :meth:`load`.
        Returns which it did (``"none"``: it holds ``change.current`` already)."""
        if change.current.servers is self.source:
            return "none"
        if change.previous.servers is not self.source:
            self.load(change.current.servers)
            return "full"
        for instance_id in change.removed:
            self._remove(instance_id)
        # An add of an id already indexed is taken as a change, not a second entry.
        for instance in (*change.changed.values(), *change.added.values()):
            self._upsert(instance)
        self.source = change.current.servers
        return "change"

    def _remove(self, instance_id: str) -> None:
        entry = self._take(instance_id)
        if entry is not None and self._on_leave is not None:
            self._on_leave(entry)

    def _upsert(self, instance: ServiceInstance) -> None:
        instance_id = instance.id
        previous = self._entries.get(instance_id)
        route = route_of(instance)
        entry = None if route is None else self._entry(instance, previous)
        shard = instance.payload.shard
        if previous is not None:
            if (
                entry is previous
                and self._shards[instance_id] == shard
                and (instance_id in self._reserved) is (route is _RESERVE)
            ):
                return  # the same entry where it was (a payload change): nothing moves
            self._take(instance_id)
        if entry is not None and route is not None:
            self._put(instance_id, entry, shard, route)
        if previous is not None and previous is not entry and self._on_leave is not None:
            self._on_leave(previous)

    def _put(self, instance_id: str, entry: T, shard: int, route: Route) -> None:
        self._entries[instance_id] = entry
        self._shards[instance_id] = shard
        if route is _ROUTABLE:
            self._replace_routable(shard, [*self._routable.get(shard, ()), entry])
        else:
            self._reserved.add(instance_id)
            self._reserve[shard] = [*self._reserve.get(shard, ()), entry]

    def _take(self, instance_id: str) -> T | None:
        """Take ``instance_id``'s entry out of its shard; the entry, if it had one."""
        entry = self._entries.pop(instance_id, None)
        if entry is None:
            return None
        shard = self._shards.pop(instance_id)
        if instance_id not in self._reserved:
            self._replace_routable(shard, [e for e in self._routable[shard] if e is not entry])
            return entry
        self._reserved.discard(instance_id)
        rest = [e for e in self._reserve[shard] if e is not entry]
        if rest:
            self._reserve[shard] = rest
        else:
            del self._reserve[shard]
        return entry

    def _replace_routable(self, shard: int, group: list[T]) -> None:
        """Put ``group`` in place of ``shard``'s list, in the table too (an insertion
        for a new shard, a deletion for an emptied one)."""
        table = self._table
        i = bisect.bisect_left(table, shard, key=_shard_of)
        present = i < len(table) and table[i][0] == shard
        if group:
            self._routable[shard] = group
            if present:
                table[i] = (shard, group)
            else:
                table.insert(i, (shard, group))
        else:
            self._routable.pop(shard, None)
            if present:
                del table[i]


def _the_instance(instance: ServiceInstance, previous: ServiceInstance | None) -> ServiceInstance:
    return instance


def _shard_of(row: tuple[int, list[Any]]) -> int:
    return row[0]
