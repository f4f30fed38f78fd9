"""What ``GET /cluster`` and the dashboard show of the list a search server routes with,
bounded at any fleet size.

A view is a summary, the problems (at most :data:`MAX_PROBLEMS`, with their total), a
shard grid (at most :data:`MAX_GRID` shards) and one page of servers (at most
:data:`MAX_PAGE`); it costs O(page + shards) once the list is indexed
(:class:`ListIndex`, moved along change by change). Not thread-safe: the server's
event loop only.

Design: docs/design/search-server.md, "`/cluster`, bounded at any size".
"""

from __future__ import annotations

import bisect
import logging
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Final

from discovery.instance import InstanceState, ServiceInstance
from discovery.livelist.model import LiveListChange
from discovery.livelist.shards import unroutable_kind

__all__ = [
    "DEFAULT_PAGE",
    "MAX_GRID",
    "MAX_PAGE",
    "MAX_PROBLEMS",
    "ClusterViews",
    "ListIndex",
    "PageRequest",
    "ViewQueryError",
]

log = logging.getLogger(__name__)

#: Servers on a page unless ``limit`` says fewer: a cluster this size or smaller gets
#: them all at once, as before paging.
DEFAULT_PAGE: Final = 1000
#: Most servers on a page (about 230 bytes each in JSON).
MAX_PAGE: Final = 1000
#: Most problems listed; ``problems_total`` counts them all.
MAX_PROBLEMS: Final = 100
#: Most shards in the dashboard's grid (three numbers each); beyond, it is cut and says so.
MAX_GRID: Final = 10_000

# The ``state`` filters besides the registration states.
_DERIVED_STATES: Final = ("live", "ejected", "disabled")
_STATES: Final = frozenset(s.value for s in InstanceState) | frozenset(_DERIVED_STATES)
# The longest id a cursor may carry (ids are znode names, far shorter in practice).
_MAX_CURSOR: Final = 1024


class ViewQueryError(ValueError):
    """A ``/cluster`` query parameter that is not valid: ``parameter`` names it, and so
    does the message."""

    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(message)
        self.parameter = parameter


@dataclass(frozen=True, slots=True)
class PageRequest:
    """Which servers a view lists: after ``after`` (an id, exclusive) by id, at most
    ``limit``, only ``shard``'s and only in ``state`` when they are set."""

    limit: int = DEFAULT_PAGE
    after: str | None = None
    shard: int | None = None
    state: str | None = None

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> PageRequest:
        """From a request's query string.

        Raises:
            ViewQueryError: a parameter out of range or unknown (the message names it).
        """
        unknown = sorted(set(query) - {"limit", "after", "shard", "state"})
        if unknown:
            raise ViewQueryError(
                unknown[0],
                f"unknown parameter {unknown[0]!r} (expected limit, after, shard, state)",
            )
        limit = _integer(query, "limit", DEFAULT_PAGE)
        if not 0 <= limit <= MAX_PAGE:
            raise ViewQueryError("limit", f"limit must be in 0..{MAX_PAGE}, got {limit}")
        shard = _integer(query, "shard", None)
        if shard is not None and shard < 0:
            raise ViewQueryError("shard", f"shard must be a natural number, got {shard}")
        state = query.get("state")
        if state is not None and state not in _STATES:
            raise ViewQueryError(
                "state", f"state must be one of {', '.join(sorted(_STATES))}, got {state[:40]!r}"
            )
        after = query.get("after")
        if after is not None and not 0 < len(after) <= _MAX_CURSOR:
            raise ViewQueryError(
                "after", f"after must be a server id of 1 to {_MAX_CURSOR} characters"
            )
        return cls(limit=limit, after=after, shard=shard, state=state)


def _integer(query: Mapping[str, str], name: str, default: int | None) -> Any:
    text = query.get(name)
    if text is None:
        return default
    # ASCII digits only: int() would also take " 7", "+7", "1_000" and other scripts' digits.
    if not (text.isascii() and text.isdigit()) or len(text) > 9:
        raise ViewQueryError(name, f"{name} must be a whole number, got {text[:40]!r}")
    return int(text)


@dataclass(slots=True)
class _Shard:
    """One shard of a list: its replicas (by replica, then id) and how many are
    routable (serving and enabled)."""

    servers: list[ServiceInstance]
    routable: int = 0


def _in_shard(instance: ServiceInstance) -> tuple[int, str]:
    return instance.payload.replica, instance.id


def _by_shard(instance: ServiceInstance) -> tuple[int, str]:
    return instance.payload.shard, instance.id


class ListIndex:
    """One list, sorted by id and grouped by shard, with its counts by state.

    Made in full once (``O(servers · log servers)``: 30 to 80 ms at 50,000), then moved
    along the list change by change (:meth:`add`, :meth:`remove`: a bisection and a
    list insertion each, microseconds), so that a view after a change does not pay
    for the whole list again. ``source`` is the list it indexes.
    """

    def __init__(self, servers: Mapping[str, ServiceInstance]) -> None:
        self.source = servers
        self.ids = sorted(servers)
        self.states: Counter[str] = Counter()
        self.disabled = 0
        #: Shards (in no order) to their replicas and routable count.
        self.shards: dict[int, _Shard] = {}
        #: Servers not routable (:func:`~discovery.livelist.shards.unroutable_kind`),
        #: by shard and id: the problems of the list itself, before ejections.
        self.unroutable: list[ServiceInstance] = []
        # What add() does for one server, inlined: this loop is the whole cost of an
        # index at 50,000 (and it runs on the event loop).
        shards, unroutable = self.shards, self.unroutable
        by_state: Counter[InstanceState] = Counter()
        disabled = 0
        for instance in servers.values():
            payload = instance.payload
            by_state[payload.state] += 1
            entry = shards.get(payload.shard)
            if entry is None:
                entry = shards[payload.shard] = _Shard([])
            entry.servers.append(instance)
            kind = unroutable_kind(instance)
            if kind is None:
                entry.routable += 1
            else:
                unroutable.append(instance)
                if kind == "disabled":
                    disabled += 1
        self.disabled = disabled
        for state, count in by_state.items():
            self.states[state.value] = count
        for entry in shards.values():
            entry.servers.sort(key=_in_shard)
        unroutable.sort(key=_by_shard)

    def __len__(self) -> int:
        return len(self.ids)

    def _count(self, instance: ServiceInstance, sign: int) -> None:
        payload = instance.payload
        self.states[payload.state.value] += sign
        kind = unroutable_kind(instance)
        if kind is None:
            entry = self.shards.get(payload.shard)
            if entry is not None:
                entry.routable += sign
        elif kind == "disabled":
            self.disabled += sign

    def add(self, instance: ServiceInstance) -> None:
        """Index ``instance`` (an id not in the index)."""
        bisect.insort(self.ids, instance.id)
        shard = instance.payload.shard
        entry = self.shards.get(shard)
        if entry is None:
            entry = self.shards[shard] = _Shard([])
        bisect.insort(entry.servers, instance, key=_in_shard)
        self._count(instance, 1)
        if unroutable_kind(instance) is not None:
            bisect.insort(self.unroutable, instance, key=_by_shard)

    def remove(self, instance: ServiceInstance) -> None:
        """Forget ``instance``, exactly as it was indexed.

        Raises:
            ValueError: it is not in the index.
        """
        _delete(self.ids, instance.id, instance.id, None)
        shard = instance.payload.shard
        entry = self.shards[shard]
        self._count(instance, -1)
        _delete(entry.servers, _in_shard(instance), instance.id, _in_shard)
        if not entry.servers:
            del self.shards[shard]
        if unroutable_kind(instance) is not None:
            _delete(self.unroutable, _by_shard(instance), instance.id, _by_shard)


def _delete(
    ordered: list[Any],
    key: Any,
    instance_id: str,
    key_of: Callable[[ServiceInstance], Any] | None,
) -> None:
    """Delete the entry of ``instance_id`` at ``key`` from the sorted list ``ordered``."""
    position = bisect.bisect_left(ordered, key, key=key_of)
    if position < len(ordered):
        found = ordered[position]
        if (found if key_of is None else found.id) == instance_id:
            del ordered[position]
            return
    raise ValueError(f"{instance_id} is not in the index")


def _problem(kind: str, instance: ServiceInstance) -> dict[str, Any]:
    entry: dict[str, Any] = {"kind": kind, "id": instance.id, "shard": instance.payload.shard}
    if instance.payload.reason:
        entry["reason"] = instance.payload.reason
    return entry


class ClusterViews:
    """The summary, problems, grid and pages of the list a search server routes with.

    ``describe`` gives a server's entry on a page (the server adds what its fan-out
    knows of it). Keeps the :class:`ListIndex` of the live list (:meth:`follow`), or
    of the last list it was asked about.
    """

    def __init__(self, describe: Callable[[ServiceInstance, bool], dict[str, Any]]) -> None:
        self._describe = describe
        self._index: ListIndex | None = None

    def index(self, servers: Mapping[str, ServiceInstance]) -> ListIndex:
        """The index of ``servers``: the one kept while it is the same mapping (moved
        along by :meth:`follow`), else a new one."""
        index = self._index
        if index is None or index.source is not servers:
            index = self._index = ListIndex(servers)
        return index

    def follow(self, change: LiveListChange) -> None:
        """Move the kept index along one change of the live list, if it indexes the
        list before it; otherwise (none kept, a reload, another list) make it afresh
        from the new list here, so that no view waits for a whole list to be indexed
        (about 80 ms at 50,000 in a search server's heap, once per reload, beside the
        routing table's own rebuild; a list that grows change by change from empty, as
        a fleet registers, is followed change by change)."""
        index = self._index
        if index is None or change.reload or index.source is not change.previous.servers:
            self._index = ListIndex(change.current.servers)
            return
        before = change.previous.servers
        try:
            for key in change.removed:
                index.remove(before[key])
            for key, instance in change.changed.items():
                index.remove(before[key])
                index.add(instance)
            for instance in change.added.values():
                index.add(instance)
        except Exception:
            # A change that does not fit the list it says it follows (or a defect of
            # ours): the index is made afresh for the next view, never left half-moved.
            log.exception("the /cluster index did not follow version %d", change.current.version)
            self._index = None
            return
        index.source = change.current.servers

    def view(
        self,
        servers: Mapping[str, ServiceInstance],
        ejected: Collection[str],
        expected_shards: Collection[int],
        page: PageRequest,
        *,
        grid: bool = False,
    ) -> dict[str, Any]:
        """``summary``, ``problems``, ``problems_total``, ``servers`` (one page),
        ``page`` and, when ``grid``, ``shard_grid`` (``[shard, replicas listed,
        replicas live]`` per shard, at most :data:`MAX_GRID`) and
        ``shard_grid_truncated``.

        ``ejected`` are ids this search server skips; ``expected_shards`` the shards
        the cluster has (configured or seen), so that a shard whose last replica left
        is counted, and listed, as having no live replica.
        """
        index = self.index(servers)
        # Ejected servers that are still routable in the list: each takes one live
        # replica from its shard. (An ejected id that left the list is no problem.)
        ejected_routable = sorted(
            (servers[i] for i in ejected if i in servers and servers[i].routable),
            key=lambda i: (i.payload.shard, i.id),
        )
        taken: Counter[int] = Counter(i.payload.shard for i in ejected_routable)
        live_by_shard = {s: e.routable - taken[s] for s, e in index.shards.items()}
        absent = sorted(s for s in expected_shards if s not in index.shards)
        no_live = sorted([s for s, n in live_by_shard.items() if n <= 0] + absent)
        all_live = sum(1 for s, e in index.shards.items() if live_by_shard[s] == len(e.servers))
        shards_total = len(index.shards) + len(absent)
        live = sum(live_by_shard.values())

        problems: list[dict[str, Any]] = []
        problems_total = len(no_live) + len(ejected_routable) + len(index.unroutable)
        for shard in no_live[:MAX_PROBLEMS]:
            count = len(index.shards[shard].servers) if shard in index.shards else 0
            problems.append({"kind": "no_live_replica", "shard": shard, "listed": count})
        for instance in ejected_routable[: MAX_PROBLEMS - len(problems)]:
            problems.append(_problem("ejected", instance))
        for instance in index.unroutable[: max(0, MAX_PROBLEMS - len(problems))]:
            kind = unroutable_kind(instance)
            assert kind is not None  # what index.unroutable holds
            problems.append(_problem(kind, instance))

        listed, next_after, matching = self._page(index, servers, ejected, page)
        ejected_set = ejected if isinstance(ejected, set | frozenset) else set(ejected)
        view: dict[str, Any] = {
            "summary": {
                "servers": len(index),
                "states": {s.value: index.states.get(s.value, 0) for s in InstanceState},
                "disabled": index.disabled,
                "ejected": sum(1 for i in ejected if i in servers),
                "live": live,
                "shards": {
                    "total": shards_total,
                    "all_live": all_live,
                    "some_not_live": shards_total - all_live - len(no_live),
                    "no_live_replica": len(no_live),
                },
            },
            "problems": problems,
            "problems_total": problems_total,
            "servers": [self._describe(i, i.id in ejected_set) for i in listed],
            "page": {
                "limit": page.limit,
                "after": page.after,
                "shard": page.shard,
                "state": page.state,
                "matching": matching,
                "next": next_after,
            },
        }
        if grid:
            rows = [[s, len(e.servers), live_by_shard[s]] for s, e in index.shards.items()]
            rows.extend([s, 0, 0] for s in absent)
            rows.sort()
            view["shard_grid"] = rows[:MAX_GRID]
            view["shard_grid_truncated"] = len(rows) > MAX_GRID
        return view

    def _page(
        self,
        index: ListIndex,
        servers: Mapping[str, ServiceInstance],
        ejected: Collection[str],
        page: PageRequest,
    ) -> tuple[list[ServiceInstance], str | None, int]:
        """The page's servers, the cursor for the next page (None at the end, and for
        ``limit`` 0, which asks for the summary alone) and how many servers match the
        filters."""
        if page.shard is not None:
            entry = index.shards.get(page.shard)
            candidates = sorted(entry.servers, key=lambda i: i.id) if entry else []
            ids = [i.id for i in candidates]
        else:
            candidates = None
            ids = index.ids
        start = 0 if page.after is None else bisect.bisect_right(ids, page.after)
        wanted = _state_filter(page.state, ejected)
        if wanted is None:
            matching = len(ids)
            chosen_ids = ids[start : start + page.limit]
            more = start + page.limit < len(ids)
            chosen = (
                candidates[start : start + page.limit]
                if candidates is not None
                else [servers[i] for i in chosen_ids]
            )
        else:
            chosen = []
            matching = 0
            more = False
            for position in range(len(ids)):
                instance = (
                    candidates[position] if candidates is not None else servers[ids[position]]
                )
                if not wanted(instance):
                    continue
                matching += 1
                if position < start:
                    continue
                if len(chosen) < page.limit:
                    chosen.append(instance)
                else:
                    more = True
        next_after = chosen[-1].id if more and chosen else None
        return chosen, next_after, matching


def _state_filter(
    state: str | None, ejected: Collection[str]
) -> Callable[[ServiceInstance], bool] | None:
    if state is None:
        return None
    if state == "ejected":
        return lambda i: i.id in ejected
    if state == "disabled":
        return lambda i: unroutable_kind(i) == "disabled"
    if state == "live":
        return lambda i: i.routable and i.id not in ejected
    return lambda i: i.payload.state.value == state
