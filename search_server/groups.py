"""Replica groups: which whole copy of the corpus a query's first requests go to.

A group is the data servers registered with one ``payload.group``; in a grouped
cluster each is one replica of every shard (Vespa's grouped distribution). The
:class:`GroupTable` keeps each group's replicas by shard, its coverage (the share of
the documents held by shards with a usable replica in it) and whether it is in
rotation, moved along as shards' routes are made and as replicas are ejected or come
back, never by a scan of every replica per query; :meth:`GroupTable.choose` gives a
query the in-rotation group with the fewest of this search server's sub-requests in
flight per usable replica, in ``O(groups)``. :class:`RouteGroups` is one shard's
replicas by group, each group with its own subset. Pure bookkeeping on the fan-out's
clock (no I/O); not thread-safe (the fan-out's event loop).

Design: docs/design/search-server.md, "Replica groups".
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from prometheus_client import Counter, Gauge

from .metrics import FanOutMetrics
from .picking import Replica
from .subsetting import Position, Subset, Subsetter

__all__ = [
    "MAX_LABELLED_GROUPS",
    "MIN_GROUP_COVERAGE",
    "OTHER_GROUPS",
    "Group",
    "GroupTable",
    "RouteGroups",
]

log = logging.getLogger(__name__)

#: The share of the corpus a group must cover to stay in rotation (``--min-group-coverage``,
#: Vespa's ``min-active-docs-coverage`` default).
MIN_GROUP_COVERAGE: Final = 0.97
#: Groups with series of their own in the per-group metrics; the queries of any further
#: group count under :data:`OTHER_GROUPS`, and it has no coverage or rotation gauge (a
#: label per group name would let a flood of registrations grow the exposition without
#: bound). ``/cluster`` shows every group whatever the cap.
MAX_LABELLED_GROUPS: Final = 64
#: The ``group`` label of the queries of the groups past :data:`MAX_LABELLED_GROUPS`
#: (no group name can be it: parentheses are outside the names' rule).
OTHER_GROUPS: Final = "(other)"


class Group:
    """One replica group as this search server routes to it.

    ``replicas`` counts its routable replicas, ``usable`` those not ejected;
    ``outstanding`` the sub-requests this search server has in flight to them (first
    requests, fills, retries and hedges alike); ``covered_docs`` and
    ``covered_shards`` what its shards with a usable replica hold (each shard's
    documents as an answer's coverage counts them); ``coverage`` the share of the
    corpus that is, as of the last refresh; ``queries`` the queries sent to it.
    """

    __slots__ = (
        "capacity",
        "counter",
        "coverage",
        "covered_docs",
        "covered_shards",
        "gauges",
        "in_rotation",
        "label",
        "name",
        "outstanding",
        "queries",
        "replicas",
        "usable",
    )

    def __init__(
        self, name: str, label: str | None, counter: Counter, gauges: tuple[Gauge, Gauge] | None
    ) -> None:
        self.name = name
        # Its metrics' label: its name, OTHER_GROUPS past the cap (no gauges then: None).
        self.label = label
        # Its series of the queries' counter, of the coverage and rotation gauges (looked
        # up once, not per query or per judgement).
        self.counter = counter
        self.gauges = gauges
        # ``usable``, at least 1, as of the last judgement (what the choice divides by).
        self.capacity = 1
        self.replicas = 0
        self.usable = 0
        self.outstanding = 0
        self.covered_docs = 0
        self.covered_shards = 0
        self.coverage = 0.0
        self.in_rotation = False
        self.queries = 0

    def __repr__(self) -> str:
        return (
            f"Group({self.name!r}, replicas={self.replicas}, usable={self.usable}, "
            f"coverage={self.coverage:.4f}, in_rotation={self.in_rotation})"
        )


class RouteGroups:
    """One shard's replicas by group, and each group's subset for this search server
    at ``position`` (made by ``subsetter``).

    Made with the shard's route (when the shard's list or the search server's position
    changes), shared by the queries until then; its lists are never modified. A
    group's subset is made the first time a query asks for it (:meth:`members`): a
    change of a shard of 100 replicas in 100 groups then costs one pass over them, not
    100 subsets, most of which the next queries would not ask for. ``table`` is the
    group table whose groups the shard's sub-requests are charged to.
    """

    __slots__ = ("_position", "_subsets", "_subsetter", "replicas", "table")

    def __init__(
        self,
        replicas: Mapping[str, Sequence[Replica]],
        position: Position,
        subsetter: Subsetter,
        table: GroupTable,
    ) -> None:
        self.replicas = replicas
        self.table = table
        self._position = position
        self._subsetter = subsetter
        self._subsets: dict[str, Subset] = {}

    @classmethod
    def of(
        cls,
        replicas: Sequence[Replica],
        position: Position,
        subsetter: Subsetter,
        table: GroupTable,
    ) -> RouteGroups | None:
        """The groups of a shard of ``replicas``, each subset for ``position`` on its
        own (so every group has members in every search server's subset); None when no
        replica has a group (the cost of a cluster without groups: this one pass, when
        a shard's route is made)."""
        by_group: dict[str, list[Replica]] = {}
        for replica in replicas:
            if replica.group is not None:
                by_group.setdefault(replica.group, []).append(replica)
        if not by_group:
            return None
        return cls(by_group, position, subsetter, table)

    def members(self, group: str) -> Subset | None:
        """The subset of ``group``'s replicas of this shard (None: it has none here),
        made at the first call."""
        subset = self._subsets.get(group)
        if subset is None:
            replicas = self.replicas.get(group)
            if replicas is None:
                return None
            subset = self._subsets[group] = self._subsetter.subset(replicas, self._position)
        return subset


class _ShardState:
    """One shard as the group table counts it: its documents (as registered, and as
    counted under the cap), its groups, and how many usable replicas each has in it."""

    __slots__ = ("counted", "docs", "groups", "usable")

    def __init__(self, docs: int, counted: int, groups: RouteGroups | None) -> None:
        self.docs = docs
        self.counted = counted
        self.groups = groups
        self.usable: dict[str, int] = {}


class GroupTable:
    """The replica groups of one fan-out: their replicas by shard, coverage, rotation
    and load, and each query's choice of one (:meth:`choose`).

    ``min_coverage`` (0..1) is the share of the corpus's documents a group must cover
    to stay in rotation; when no group does, the ones that cover the most stay in (a
    query always has a group while there is one). ``clock`` is the one ejections are
    timed with (the fan-out's). Metrics go to ``metrics``.

    What moves it: :meth:`routed` and :meth:`forget` as the shards' routes are made
    and dropped (a change of the live list, ``O(replicas of the shard)``),
    :meth:`ejection_changed` as a replica is ejected or its ejection ends early
    (``O(its group's replicas in its shard)``), and the ends of ejections, kept in a
    heap and checked at each :meth:`choose` (``O(1)`` while none ends). Coverage and
    rotation are recomputed at the next :meth:`choose` after any of these, in
    ``O(groups)``; a change of the documents cap (the median shard's count moved)
    recounts every shard's part, ``O(shards x groups)``, once.

    Raises ``ValueError`` for ``min_coverage`` outside 0..1.
    """

    def __init__(
        self,
        *,
        min_coverage: float = MIN_GROUP_COVERAGE,
        clock: Callable[[], float],
        metrics: FanOutMetrics,
    ) -> None:
        if not 0 <= min_coverage <= 1:
            raise ValueError(f"min_coverage must be in 0..1, got {min_coverage}")
        self.min_coverage = min_coverage
        self._clock = clock
        self._metrics = metrics
        self._groups: dict[str, Group] = {}
        self._shards: dict[int, _ShardState] = {}
        # The documents of the shards in the table, each as counted (under the cap).
        self._docs = 0
        self._cap: int | None = None
        # The corpus as last judged: documents and shards, the missing ones included.
        self._judged: tuple[int, int] = (-1, -1)
        # Coverage and rotation to be judged again at the next choice.
        self._dirty = False
        # The groups in rotation, by name; whose turn a tie is (rotation of ties).
        self._rotation: list[Group] = []
        self._turn = 0
        # No group covered min_coverage at the last judgement (the best kept in rotation).
        self._short = False
        # When counted ejections end: (until, order, replica).
        self._ejections: list[tuple[float, int, Replica]] = []
        self._order = itertools.count()
        # Group names given a metrics label of their own (at most MAX_LABELLED_GROUPS).
        self._labelled: set[str] = set()
        self._past_cap_logged = False

    # -- what the table holds ---------------------------------------------------------

    @property
    def groups(self) -> Mapping[str, Group]:
        """The groups with a routable replica, by name (do not modify)."""
        return self._groups

    @property
    def rotation(self) -> Sequence[Group]:
        """The groups in rotation as last judged, by name (do not modify)."""
        return self._rotation

    # -- moved along by the routing ---------------------------------------------------

    def routed(self, shard: int, groups: RouteGroups | None, docs: int) -> None:
        """``shard``'s route was made (again) with ``groups`` (None: none of its
        replicas has a group) and ``docs`` documents: count it anew."""
        old = self._shards.get(shard)
        if old is not None:
            self._withdraw(old)
        state = _ShardState(docs, _counted(docs, self._cap), groups)
        if groups is not None:
            now = self._clock()
            for name, members in groups.replicas.items():
                state.usable[name] = self._usable(members, now)
        self._shards[shard] = state
        self._deposit(state)

    def forget(self, shard: int) -> None:
        """``shard`` left the routing table: it no longer counts for any group (an
        expected shard without a replica is counted, uncovered, by :meth:`choose`)."""
        state = self._shards.pop(shard, None)
        if state is not None:
            self._withdraw(state)

    def ejection_changed(self, replica: Replica) -> None:
        """``replica`` was ejected, or its ejection ended before its time (an answer):
        its group's usable replicas in its shard are counted again."""
        state = self._shards.get(replica.shard)
        name = replica.group
        if state is None or state.groups is None or name is None:
            return
        members = state.groups.replicas.get(name)
        if members is None or replica not in members:
            return  # a replica of a route made since, or of another group before
        self._set_usable(state, name, self._usable(members, self._clock()))

    # -- load -------------------------------------------------------------------------

    def sent(self, replica: Replica) -> Group | None:
        """A sub-request to ``replica`` is out: its group (if any) has one more in
        flight. Returns the group charged, for :meth:`Group.outstanding` to be given
        back to when the request ends (None: the replica has no group here)."""
        name = replica.group
        group = self._groups.get(name) if name is not None else None
        if group is not None:
            group.outstanding += 1
        return group

    # -- the choice -------------------------------------------------------------------

    def choose(self, missing: Sequence[tuple[int, int]], docs_cap: int | None) -> Group | None:
        """The group a query's first requests go to, or None when the routing table has
        no group. ``missing`` are the expected shards without a replica, with the
        documents each counts for; ``docs_cap`` the most one shard counts for.

        Of the groups in rotation, the one with the fewest sub-requests in flight per
        usable replica (a slow group holds its requests longer, and so gets fewer
        queries: Little's law); ties go round in turn. ``O(groups)``; ``O(1)`` without
        groups.
        """
        if not self._groups:
            return None
        self.refresh(missing, docs_cap)
        rotation = self._rotation
        count = len(rotation)
        if count == 0:
            return None
        start = self._turn % count
        self._turn += 1
        best = rotation[start]
        best_load, best_usable = best.outstanding, best.capacity
        # From the one whose turn it is, round: the first of the least loaded wins.
        for index in itertools.chain(range(start + 1, count), range(start)):
            group = rotation[index]
            # outstanding / usable, compared without dividing.
            if group.outstanding * best_usable < best_load * group.capacity:
                best, best_load, best_usable = group, group.outstanding, group.capacity
        best.queries += 1
        best.counter.inc()
        return best

    def filled(self) -> None:
        """A shard's first request went outside the query's group: it had no usable
        replica there."""
        self._metrics.group_fills.inc()

    def refresh(self, missing: Sequence[tuple[int, int]], docs_cap: int | None) -> None:
        """Bring coverage and rotation up to date: the ejections ended by now, the
        documents cap, the missing shards. ``O(1)`` when nothing changed, else
        ``O(groups)`` (and ``O(shards x groups)`` when the cap moved)."""
        ejections = self._ejections
        if ejections:
            now = self._clock()
            while ejections and ejections[0][0] <= now:
                _, _, replica = heapq.heappop(ejections)
                self.ejection_changed(replica)
        if docs_cap != self._cap:
            self._recount(docs_cap)
        judged = (self._docs + sum(docs for _, docs in missing), len(self._shards) + len(missing))
        if self._dirty or judged != self._judged:
            self._judge(*judged)

    # -- views ------------------------------------------------------------------------

    def summary(self, limit: int) -> list[dict[str, Any]]:
        """The first ``limit`` groups by name: ``name``, ``replicas``, ``usable``,
        ``coverage_percent``, ``in_rotation``, ``queries`` (sent to it by this search
        server) and ``in_flight`` (its sub-requests out now), as of the last
        :meth:`refresh`."""
        return [
            {
                "name": group.name,
                "replicas": group.replicas,
                "usable": group.usable,
                "coverage_percent": round(100 * group.coverage, 2),
                "in_rotation": group.in_rotation,
                "queries": group.queries,
                "in_flight": group.outstanding,
            }
            for group in sorted(self._groups.values(), key=_name)[:limit]
        ]

    # -- internals --------------------------------------------------------------------

    def _usable(self, members: Sequence[Replica], now: float) -> int:
        """How many of ``members`` are not ejected at ``now``; the end of each ejection
        is remembered, to count them again then."""
        usable = 0
        for replica in members:
            until = replica.ejected_until
            if until is not None and now < until:
                heapq.heappush(self._ejections, (until, next(self._order), replica))
            else:
                usable += 1
        return usable

    def _group(self, name: str) -> Group:
        group = self._groups.get(name)
        if group is None:
            label = self._label(name)
            metrics = self._metrics
            counter = metrics.group_queries.labels(group=label or OTHER_GROUPS)
            gauges = (
                None
                if label is None
                else (
                    metrics.group_coverage.labels(group=label),
                    metrics.group_in_rotation.labels(group=label),
                )
            )
            group = self._groups[name] = Group(name, label, counter, gauges)
        return group

    def _label(self, name: str) -> str | None:
        """``name``'s metrics label (None past the cap: counted under OTHER_GROUPS)."""
        if name in self._labelled:
            return name
        if len(self._labelled) < MAX_LABELLED_GROUPS:
            self._labelled.add(name)
            return name
        if not self._past_cap_logged:
            self._past_cap_logged = True
            log.warning(
                "more than %d replica groups: group %r and later ones have no metrics "
                "series of their own (their queries count under group=%r; /cluster "
                "shows them all)",
                MAX_LABELLED_GROUPS,
                name,
                OTHER_GROUPS,
            )
        return None

    def _deposit(self, state: _ShardState) -> None:
        self._docs += state.counted
        groups = state.groups
        if groups is not None:
            for name, members in groups.replicas.items():
                group = self._group(name)
                usable = state.usable[name]
                group.replicas += len(members)
                group.usable += usable
                if usable:
                    group.covered_docs += state.counted
                    group.covered_shards += 1
        self._dirty = True

    def _withdraw(self, state: _ShardState) -> None:
        self._docs -= state.counted
        groups = state.groups
        if groups is not None:
            for name, members in groups.replicas.items():
                group = self._groups[name]
                usable = state.usable[name]
                group.replicas -= len(members)
                group.usable -= usable
                if usable:
                    group.covered_docs -= state.counted
                    group.covered_shards -= 1
        # A group left without replicas is dropped when judged (it may come straight
        # back, with its requests in flight, as the shard's route is made again).
        self._dirty = True

    def _set_usable(self, state: _ShardState, name: str, usable: int) -> None:
        before = state.usable[name]
        if usable == before:
            return
        state.usable[name] = usable
        group = self._groups[name]
        group.usable += usable - before
        if bool(usable) != bool(before):
            sign = 1 if usable else -1
            group.covered_docs += sign * state.counted
            group.covered_shards += sign
        self._dirty = True

    def _recount(self, docs_cap: int | None) -> None:
        """The documents cap moved: every shard counts for what it now caps to."""
        self._cap = docs_cap
        for state in self._shards.values():
            counted = _counted(state.docs, docs_cap)
            if counted == state.counted:
                continue
            change = counted - state.counted
            state.counted = counted
            self._docs += change
            for name, usable in state.usable.items():
                if usable:
                    self._groups[name].covered_docs += change
        self._dirty = True

    def _judge(self, docs_total: int, shards_total: int) -> None:
        """Each group's coverage of a corpus of ``docs_total`` documents in
        ``shards_total`` shards, and the rotation: ``O(groups)``."""
        self._judged = (docs_total, shards_total)
        self._dirty = False
        for name in [n for n, g in self._groups.items() if g.replicas <= 0]:
            self._drop(self._groups.pop(name))
        groups = list(self._groups.values())
        for group in groups:
            group.capacity = max(group.usable, 1)
            if docs_total > 0:
                group.coverage = group.covered_docs / docs_total
            else:  # no shard holds a document: by shards, as an answer's coverage
                group.coverage = group.covered_shards / shards_total if shards_total else 0.0
        # Rounded, so that exactly 97 of 100 equal shards is 97 %, whatever the floats.
        passing = [g for g in groups if round(g.coverage, 9) >= self.min_coverage]
        short = bool(groups) and not passing
        if short:
            # Never no group: the best ones stay (every query would fill otherwise).
            most = max(g.coverage for g in groups)
            passing = [g for g in groups if g.coverage == most]
        if short != self._short:
            self._short = short
            self._log_short(short, passing)
        chosen = set(map(id, passing))
        for group in groups:
            rotating = id(group) in chosen
            if rotating != group.in_rotation:
                self._log_rotation(group, rotating)
            group.in_rotation = rotating
            if group.gauges is not None:
                coverage, in_rotation = group.gauges
                coverage.set(group.coverage)
                in_rotation.set(1 if rotating else 0)
        self._rotation = sorted(passing, key=_name)

    def _log_short(self, short: bool, kept: Sequence[Group]) -> None:
        if short:
            log.warning(
                "no replica group covers %.2f%% of the corpus (--min-group-coverage): the "
                "best, %s at %.2f%%, stay in rotation",
                100 * self.min_coverage,
                ", ".join(g.name for g in sorted(kept, key=_name)[:10]),
                100 * kept[0].coverage,
            )
        else:
            log.info("a replica group covers %.2f%% of the corpus again", 100 * self.min_coverage)

    def _log_rotation(self, group: Group, rotating: bool) -> None:
        percent = 100 * self.min_coverage
        if rotating:
            log.info(
                "replica group %s in rotation: it covers %.2f%% of the corpus",
                group.name,
                100 * group.coverage,
            )
        elif group.replicas:
            log.warning(
                "replica group %s out of rotation: it covers %.2f%% of the corpus, below "
                "%.2f%% (--min-group-coverage); its replicas only fill in for other groups",
                group.name,
                100 * group.coverage,
                percent,
            )

    def _drop(self, group: Group) -> None:
        """``group`` has no routable replica left: its gauges go (its queries' counter
        stays, as counters do)."""
        if group.label is not None:
            metrics = self._metrics
            for gauge in (metrics.group_coverage, metrics.group_in_rotation):
                # Older prometheus_clients raise for a series never set.
                with contextlib.suppress(KeyError):
                    gauge.remove(group.label)


def _counted(docs: int, cap: int | None) -> int:
    return docs if cap is None else min(docs, cap)


def _name(group: Group) -> str:
    return group.name
