"""Deterministic subsets: which replicas of a shard this search server sends to.

:class:`DeterministicAperture` (the default :class:`Subsetter`) spreads every shard's
load evenly over its replicas, in integers, so every search server computes the same
arcs from the same lists. Pure: no I/O, no clock of its own; not thread-safe.

Design: docs/design/search-server.md, "Subsets".
"""

from __future__ import annotations

import random
from collections.abc import Container, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from .picking import Replica

__all__ = [
    "DeterministicAperture",
    "Position",
    "Subset",
    "Subsetter",
    "aperture",
]


@dataclass(frozen=True, slots=True)
class Position:
    """Where this search server stands among the ``count`` search servers: ``rank`` is
    its place in the members' ids in order (0-based).

    Raises ``ValueError`` for a count below 1 or a rank outside ``0..count-1``.
    """

    rank: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"count must be >= 1, got {self.count}")
        if not 0 <= self.rank < self.count:
            raise ValueError(f"rank must be in 0..{self.count - 1}, got {self.rank}")

    @classmethod
    def among(cls, own: str, members: Sequence[str]) -> Position:
        """The position of the search server ``own`` among ``members``' ids, counting it
        in if it is not listed (registering, or a stale list)."""
        ids = sorted(set(members) | {own})
        return cls(ids.index(own), len(ids))


def aperture(replicas: int, position: Position, size: int) -> list[tuple[int, float]]:
    """The slots of a shard of ``replicas`` replicas in the aperture of ``position``,
    for a subset of at least ``size``: ``(index, share)`` in ring order from the arc's
    start, ``share`` in ``(0, 1]``.

    Every replica with share 1 when ``size`` (rounded up to whole units) covers the
    ring. Raises ``ValueError`` for a negative count or a size below 1.
    """
    if replicas < 0:
        raise ValueError(f"replicas must be >= 0, got {replicas}")
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    n, r = position.count, replicas
    units = -(-size * n // r) if r else n  # ceil(size * N / R)
    if units >= n or r <= size:
        return [(j, 1.0) for j in range(r)]
    # The ring has R*N ticks: slot j is [j*N, (j+1)*N), the arc [rank*R, (rank+units)*R).
    start = position.rank * r
    end = start + units * r
    shares: dict[int, int] = {}
    order: list[int] = []
    j = start // n
    while j * n < end:
        overlap = min(end, (j + 1) * n) - max(start, j * n)
        index = j % r
        if index not in shares:
            order.append(index)
            shares[index] = 0
        shares[index] += overlap
        j += 1
    return [(index, shares[index] / n) for index in order]


@dataclass(frozen=True, slots=True, eq=False)
class Subset:
    """One shard's subset for one search server.

    ``members`` with their ``shares`` (same order), and ``ordered``, the shard's
    replicas in ring order starting just after the aperture's end: the spares come
    from there, in that order, members skipped.
    """

    members: tuple[Replica, ...]
    shares: tuple[float, ...]
    ordered: tuple[Replica, ...]
    # The members as a set, for the spares' lookups, and with their shares (made
    # once, not per request).
    _member_set: frozenset[Replica] = field(init=False, repr=False)
    _pairs: tuple[tuple[Replica, float], ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_member_set", frozenset(self.members))
        object.__setattr__(self, "_pairs", tuple(zip(self.members, self.shares, strict=True)))

    @property
    def whole(self) -> bool:
        """Every replica of the shard is a member: nothing to narrow or replace."""
        return len(self.members) == len(self.ordered)

    def candidates(
        self, tried: Container[Replica], now: float, rng: random.Random
    ) -> list[Replica]:
        """The replicas a request of a query may go to now: the members it has not tried
        that are not ejected, with a member cut by the arc's edge left out with the odds
        of its missing share (while another is left); plus one spare per ejected
        member; or, when every member has been tried or is ejected and no such spare is
        left, the first untried spare that is not ejected. Empty: no replica of the
        shard can take a request (the caller probes or gives up).
        """
        if not tried and self._pairs:
            # A query's first request to the shard, nearly always with no member
            # ejected: the same answer as below, for a fraction of its cost (this runs
            # for every sub-request).
            for replica in self.members:
                until = replica.ejected_until
                if until is not None and now < until:
                    break
            else:
                chosen = [r for r, share in self._pairs if share >= 1.0 or rng.random() < share]
                return chosen if chosen else list(self.members)
        usable: list[Replica] = []
        edges: list[Replica] = []
        ejected = 0
        for replica, share in self._pairs:
            if replica.is_ejected(now):
                ejected += 1
            elif replica not in tried:
                if share >= 1.0 or rng.random() < share:
                    usable.append(replica)
                else:
                    edges.append(replica)
        if not usable:
            usable = edges
        if self.whole or (ejected == 0 and usable):
            return usable
        members = self._member_set
        wanted = ejected if usable else max(ejected, 1)
        for spare in self.ordered:
            if wanted == 0:
                break
            if spare in members or spare.is_ejected(now):
                continue
            wanted -= 1  # its place is taken whether or not this query has tried it
            if spare not in tried:
                usable.append(spare)
        if not usable:
            # Every member and replacement tried: the next untried spare, if any.
            for spare in self.ordered:
                if spare not in members and spare not in tried and not spare.is_ejected(now):
                    usable.append(spare)
                    break
        return usable


@runtime_checkable
class Subsetter(Protocol):
    """Chooses the replicas of a shard this search server routes to."""

    def subset(self, replicas: Sequence[Replica], position: Position) -> Subset:
        """The subset of a shard of ``replicas`` (the routing table's list, in any
        order) for the search server at ``position``. Called when the shard's list or
        the position changes, not per query."""
        ...


class DeterministicAperture:
    """Subsets of at least ``size`` replicas on the ring (docs/design/search-server.md,
    "Subsets");
    ``size`` 0 turns subsetting off (every replica a member).

    Raises ``ValueError`` for a negative size.
    """

    def __init__(self, size: int = 8) -> None:
        if size < 0:
            raise ValueError(f"subset size must be >= 0, got {size}")
        self.size = size

    def subset(self, replicas: Sequence[Replica], position: Position) -> Subset:
        ordered = sorted(replicas, key=_instance_id)
        if self.size == 0 or len(ordered) <= self.size:
            everyone = tuple(ordered)
            return Subset(everyone, (1.0,) * len(everyone), everyone)
        slots = aperture(len(ordered), position, self.size)
        members = tuple(ordered[index] for index, _ in slots)
        after = (slots[-1][0] + 1) % len(ordered)
        return Subset(
            members,
            tuple(share for _, share in slots),
            tuple(ordered[after:] + ordered[:after]),
        )


def _instance_id(replica: Replica) -> str:
    return replica.instance.id
