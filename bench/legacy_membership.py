"""The invalid-children bookkeeping of ``MembershipWatcher`` before issue 21, as a baseline.

``bench_invalid_children.py`` runs it beside the current one. Until commit 17279ab the
watcher kept the skipped children in a plain dict and made a new dict for every child
that entered or left it (``{**invalid, child: reason}``, ``{k: v ... if k != child}``),
then copied it once more for each change set (``MappingProxyType(dict(invalid))``), and
logged one WARNING per skipped child: a full read of N malformed children copied
N * (N - 1) / 2 entries. :meth:`LegacyMembershipWatcher._refresh` and ``_publish`` below
are that code, verbatim but for the names it imports; everything else (reading,
decoding, watches) is the current watcher's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import immutables

from discovery.instance import ServiceInstance
from discovery.zk.membership import _BULK_READ_MIN, MembershipChange, MembershipWatcher, _Read

# The current watcher's logger: the bench counts the records of both the same way.
log = logging.getLogger("discovery.zk.membership")


class LegacyMembershipWatcher(MembershipWatcher):
    """``MembershipWatcher`` with its bookkeeping of invalid children as of 17279ab."""

    _invalid: dict[str, str]  # type: ignore[assignment]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._invalid = {}

    @property
    def invalid(self) -> Mapping[str, str]:
        return MappingProxyType(dict(self._invalid))

    def seed_invalid(self, invalid: Mapping[str, str], counted: dict[str, int]) -> None:
        """Start from ``invalid`` (as if a full read had found it), without the full read."""
        self._invalid = dict(invalid)
        self._counted_invalid = dict(counted)

    async def _refresh(self, full: bool, relist: bool, dirty: set[str]) -> None:
        started = self._clock()
        if relist:
            children = set(await self._list_children())
            new = children - self._children
            gone = self._children - children
        else:
            # Updated in place below (a copy would cost O(members) per change). The
            # persistent watch names new children; the child watch relists for them.
            children, gone = self._children, set()
            new = dirty - children if self._persistent else set()
        to_read = sorted(children if full else new | (dirty & children))
        reads: list[_Read | None]
        if self._persistent and len(to_read) > _BULK_READ_MIN:
            reads = await self._read_bulk(to_read)
        else:
            reads = await asyncio.gather(*(self._read(child) for child in to_read))

        # Only what was listed away or read is looked at: O(changed), not O(members),
        # and the next view shares everything else with this one.
        old = self._members
        added: dict[str, ServiceInstance] = {}
        removed: dict[str, ServiceInstance] = {}
        changed: dict[str, ServiceInstance] = {}
        invalid = self._invalid
        invalid_changed = False
        with old.mutate() as members:
            if full:
                gone = set(old) - children
                gone |= {child for child in invalid if child not in children}
            for child in gone:
                instance = members.pop(child, None)
                if instance is not None:
                    removed[child] = instance
                if child in invalid:
                    invalid = {k: v for k, v in invalid.items() if k != child}
                    invalid_changed = True
                self._counted_invalid.pop(child, None)
            for child, result in zip(to_read, reads, strict=True):
                before = old.get(child)
                if result is None:
                    # Deleted (since listed): a watch has fired or will fire for it.
                    children.discard(child)
                    if before is not None:
                        members.pop(child, None)
                        removed[child] = before
                    if child in invalid:
                        invalid = {k: v for k, v in invalid.items() if k != child}
                        invalid_changed = True
                    continue
                instance, reason, stat = result
                children.add(child)
                if instance is not None:
                    members[child] = instance
                    if before is None:
                        added[child] = instance
                    elif before != instance:
                        changed[child] = instance
                    if child in invalid:
                        invalid = {k: v for k, v in invalid.items() if k != child}
                        invalid_changed = True
                        self._counted_invalid.pop(child, None)
                    continue
                if before is not None:
                    members.pop(child, None)
                    removed[child] = before
                if reason is not None:
                    if invalid.get(child) != reason:
                        invalid = {**invalid, child: reason}
                        invalid_changed = True
                    if self._counted_invalid.get(child) != stat.mzxid:
                        self._counted_invalid[child] = stat.mzxid
                        self._metrics.skipped_total.labels(reason=reason.split(":", 1)[0]).inc()
                        log.warning("skipping %s/%s: %s", self.path, child, reason)
            view = members.finish()
        self._children = children
        if full:
            self._metrics.resyncs.inc()
        self._metrics.refresh_seconds.observe(self._clock() - started)
        if added or removed or changed or invalid_changed or self._generation == 0:
            await self._publish(view, added, removed, changed, invalid, resync=full)

    async def _publish(
        self,
        members: immutables.Map[str, ServiceInstance],
        added: dict[str, ServiceInstance],
        removed: dict[str, ServiceInstance],
        changed: dict[str, ServiceInstance],
        invalid: dict[str, str],
        *,
        resync: bool,
    ) -> None:
        self._generation += 1
        self._members = members
        self._invalid = invalid
        change = MembershipChange(
            generation=self._generation,
            members=self._members,
            added=MappingProxyType(added),
            removed=MappingProxyType(removed),
            changed=MappingProxyType(changed),
            invalid=MappingProxyType(dict(invalid)),
            resync=resync,
        )
        self._metrics.members.set(len(members))
        self._metrics.invalid.set(len(invalid))
        self._metrics.updates.inc()
        if added or removed or changed:
            log.info(
                "%s: %d members (+%d -%d ~%d, %d invalid)",
                self.path,
                len(members),
                len(added),
                len(removed),
                len(changed),
                len(invalid),
            )
        for subscription in list(self._subscribers):
            subscription._queue.put_nowait(change)
        async with self._changed:
            self._changed.notify_all()
