"""The decoded view of a membership directory (:class:`MembershipView`) and its change
sets (:class:`MembershipChange`).

The view holds immutable maps (:class:`immutables.Map`): applying what one refresh read
makes the next view from the last in time proportional to the change, sharing the rest.
It reads nothing itself; the watcher hands it the reads.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

import immutables

from discovery.instance import ServiceInstance
from discovery.zk.memberread import ChildRead

__all__ = ["MembershipChange", "MembershipView", "ReadPlan"]

# Children applied to the view between two yields to the loop (~5 ms): applying 50,000
# at once held the loop (which may be serving queries beside the leader) for 200 ms.
_APPLY_SLICE: Final = 2000

_EMPTY: Mapping[str, ServiceInstance] = MappingProxyType({})
_NO_INVALID: immutables.Map[str, str] = immutables.Map()


@dataclass(frozen=True)
class MembershipChange:
    """One change set. ``members`` is the whole view after the change.

    ``added``, ``removed`` and ``changed`` map instance ids to instances (for
    ``removed``, the last version we saw); ``invalid`` maps the ids of children
    currently skipped to the reason. ``members`` and ``invalid`` are immutable maps
    shared with the watcher: the next change set's share all but what changed (a
    change set whose invalid children did not change holds the very same ``invalid``).
    ``resync`` is true when the change came from a full re-read (start, reconnect,
    session expiry) or is a new subscriber's first.
    """

    generation: int
    members: Mapping[str, ServiceInstance]
    added: Mapping[str, ServiceInstance] = field(default_factory=lambda: _EMPTY)
    removed: Mapping[str, ServiceInstance] = field(default_factory=lambda: _EMPTY)
    changed: Mapping[str, ServiceInstance] = field(default_factory=lambda: _EMPTY)
    invalid: Mapping[str, str] = field(default_factory=lambda: _NO_INVALID)
    resync: bool = False

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.changed)


@dataclass(slots=True)
class ReadPlan:
    """What one refresh reads (``to_read``, sorted) and what it knows without reading:
    the children present (``children``) and those listed away (``gone``)."""

    full: bool
    children: set[str]
    gone: set[str]
    to_read: list[str]


class MembershipView:
    """The valid members and the skipped children of one directory, with a generation.

    :meth:`plan` says what a refresh must read; :meth:`apply` takes the reads and makes
    the next view, returning its change set (None when nothing changed). Looks only at
    what was listed away or read: O(changed), not O(members). A skipped child is
    reported to ``on_skip`` once per version of its node (its ``mzxid``).
    """

    def __init__(self) -> None:
        # An immutable map (HAMT): each view shares all but what changed with the last.
        self._members: immutables.Map[str, ServiceInstance] = immutables.Map()
        # Immutable too, for the same reason: a writer can make tens of thousands of
        # children invalid, and a copy per change (or per skipped child) is quadratic.
        self._invalid: immutables.Map[str, str] = _NO_INVALID
        self._counted_invalid: dict[str, int] = {}  # child -> mzxid already reported
        self._children: set[str] = set()
        self._generation = 0

    @property
    def members(self) -> Mapping[str, ServiceInstance]:
        """The current valid members by id (read-only)."""
        return self._members

    @property
    def invalid(self) -> Mapping[str, str]:
        """Children currently skipped, with the reason (read-only)."""
        return self._invalid

    @property
    def generation(self) -> int:
        """Increases by one with every change set (0: none yet)."""
        return self._generation

    @property
    def children(self) -> AbstractSet[str]:
        """Every child as last listed or read, valid or not."""
        return self._children

    def current(self) -> MembershipChange:
        """The whole view as one change set: every member ``added``, ``resync`` true."""
        return MembershipChange(
            self._generation,
            self._members,
            added=self._members,
            invalid=self._invalid,
            resync=True,
        )

    def plan(
        self, listed: AbstractSet[str] | None, dirty: set[str], *, full: bool, names_new: bool
    ) -> ReadPlan:
        """What to read: every child if ``full``, else the new and the ``dirty`` ones.

        ``listed`` is the directory's names if it was just listed, else None. With
        ``names_new`` a dirty child not yet known is new (a persistent watch names
        children created); without, only listing finds new ones.
        """
        if listed is not None:
            children = set(listed)
            new = children - self._children
            gone = self._children - children
        else:
            # Updated in place by apply (a copy would cost O(members) per change).
            children, gone = self._children, set()
            new = dirty - children if names_new else set()
        to_read = sorted(children if full else new | (dirty & children))
        return ReadPlan(full, children, gone, to_read)

    async def apply(
        self,
        plan: ReadPlan,
        reads: list[ChildRead | None],
        on_skip: Callable[[str, str], None],
    ) -> MembershipChange | None:
        """Make the next view from ``reads`` (one per ``plan.to_read``; None: gone).

        Yields to the loop every few thousand children. Interrupted, it leaves the
        members and the invalid children as they were (a full read repairs the rest).
        """
        children = plan.children
        gone = plan.gone
        old = self._members
        old_invalid = self._invalid
        counted = self._counted_invalid
        added: dict[str, ServiceInstance] = {}
        removed: dict[str, ServiceInstance] = {}
        changed: dict[str, ServiceInstance] = {}
        invalid_changed = False
        with old.mutate() as members, old_invalid.mutate() as invalid:
            if plan.full:
                gone = set(old) - children
                gone |= {child for child in old_invalid if child not in children}
            for index, child in enumerate(gone):
                if index and index % _APPLY_SLICE == 0:
                    await asyncio.sleep(0)  # see _APPLY_SLICE
                instance = members.pop(child, None)
                if instance is not None:
                    removed[child] = instance
                if invalid.pop(child, None) is not None:
                    invalid_changed = True
                counted.pop(child, None)
            for index, (child, result) in enumerate(zip(plan.to_read, reads, strict=True)):
                if index and index % _APPLY_SLICE == 0:
                    await asyncio.sleep(0)
                before = old.get(child)
                if result is None:
                    # Deleted (since listed): a watch has fired or will fire for it.
                    children.discard(child)
                    if before is not None:
                        members.pop(child, None)
                        removed[child] = before
                    if invalid.pop(child, None) is not None:
                        invalid_changed = True
                    counted.pop(child, None)
                    continue
                instance, reason, stat = result
                children.add(child)
                if instance is not None:
                    members[child] = instance
                    if before is None:
                        added[child] = instance
                    elif before != instance:
                        changed[child] = instance
                    if invalid.pop(child, None) is not None:
                        invalid_changed = True
                        counted.pop(child, None)
                    continue
                if before is not None:
                    members.pop(child, None)
                    removed[child] = before
                if reason is not None:
                    if invalid.get(child) != reason:
                        invalid[child] = reason
                        invalid_changed = True
                    if counted.get(child) != stat.mzxid:
                        counted[child] = stat.mzxid
                        on_skip(child, reason)
            view = members.finish()
            # An unchanged invalid set stays the same object: change sets share it.
            invalid_view = invalid.finish() if invalid_changed else old_invalid
        self._children = children
        if not (added or removed or changed or invalid_changed or self._generation == 0):
            return None
        self._generation += 1
        self._members = view
        self._invalid = invalid_view
        return MembershipChange(
            generation=self._generation,
            members=view,
            added=MappingProxyType(added),
            removed=MappingProxyType(removed),
            changed=MappingProxyType(changed),
            invalid=invalid_view,
            resync=plan.full,
        )
