"""The invalid-children bookkeeping of ``MembershipWatcher`` before issue 21, as a baseline.

``bench_invalid_children.py`` runs it beside the current one. Until commit 17279ab the
watcher kept the skipped children in a plain dict and made a new dict for every child
that entered or left it (``{**invalid, child: reason}``, ``{k: v ... if k != child}``),
then copied it once more for each change set (``MappingProxyType(dict(invalid))``), and
logged one WARNING per skipped child: a full read of N malformed children copied
N * (N - 1) / 2 entries. :meth:`LegacyMembershipView.apply` below is that code (then
the watcher's ``_refresh`` and ``_publish``), verbatim but for the names it imports and
for the view it now belongs to; everything else (reading, decoding, watches, metrics of
the refresh) is the current watcher's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from discovery.instance import ServiceInstance
from discovery.metrics import MembershipMetrics
from discovery.zk.memberread import ChildRead
from discovery.zk.membership import MembershipChange, MembershipWatcher
from discovery.zk.memberview import MembershipView, ReadPlan

# The current watcher's logger: the bench counts the records of both the same way.
log = logging.getLogger("discovery.zk.membership")


class LegacyMembershipView(MembershipView):
    """``MembershipView`` with its bookkeeping of invalid children as of 17279ab."""

    _invalid: dict[str, str]  # type: ignore[assignment]

    def __init__(self, path: str, metrics: MembershipMetrics) -> None:
        super().__init__()
        self._path = path
        self._metrics = metrics
        self._invalid = {}

    @property
    def invalid(self) -> Mapping[str, str]:
        return MappingProxyType(dict(self._invalid))

    def seed(self, view: MembershipView) -> None:
        """Start from ``view`` (as if a full read had found it), without the full read."""
        self._members = view._members
        self._children = set(view.children)
        self._generation = 1
        self._invalid = dict(view.invalid)
        self._counted_invalid = dict(view._counted_invalid)

    async def apply(
        self,
        plan: ReadPlan,
        reads: list[ChildRead | None],
        on_skip: Callable[[str, str], None],
    ) -> MembershipChange | None:
        # 17279ab counted and logged each skipped child here: ``on_skip`` is not used.
        children, gone, full, to_read = plan.children, plan.gone, plan.full, plan.to_read
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
                        log.warning("skipping %s/%s: %s", self._path, child, reason)
            view = members.finish()
        self._children = children
        if not (added or removed or changed or invalid_changed or self._generation == 0):
            return None
        # What 17279ab's _publish did with the view.
        self._generation += 1
        self._members = view
        self._invalid = invalid
        return MembershipChange(
            generation=self._generation,
            members=self._members,
            added=MappingProxyType(added),
            removed=MappingProxyType(removed),
            changed=MappingProxyType(changed),
            invalid=MappingProxyType(dict(invalid)),
            resync=full,
        )


class LegacyMembershipWatcher(MembershipWatcher):
    """``MembershipWatcher`` with its bookkeeping of invalid children as of 17279ab."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._view = self.legacy_view = LegacyMembershipView(self.path, self._metrics)
