"""The diff a leader publishes: membership (with the markers laid over it) against what
readers hold, over the ids that may have changed. Pure functions, no I/O.

Design: docs/design/live-list.md, "Election and publishing".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import immutables

from discovery.instance import InstanceState, ServiceInstance
from discovery.zk.maintenance import MaintenanceMarker, apply_marker

__all__ = ["ListDiff", "applied", "diff", "removal_reason"]


@dataclass(frozen=True)
class ListDiff:
    """Added, changed (id to instance) and removed (id to reason) ids."""

    added: Mapping[str, ServiceInstance]
    changed: Mapping[str, ServiceInstance]
    removed: Mapping[str, str]

    @property
    def empty(self) -> bool:
        return not (self.added or self.changed or self.removed)


def removal_reason(instance: ServiceInstance, held: float | None = None) -> str:
    """Why ``instance`` left, as readers are told (``held``: the brake held it that long)."""
    # ZooKeeper does not say why a node went; what the node last said is our best clue.
    if instance.payload.state is InstanceState.MAINTENANCE:
        reason = f"node deleted while in maintenance ({instance.payload.reason})"
    elif instance.payload.reason:
        reason = instance.payload.reason
    else:
        reason = "node deleted (deregistered, forced offline or session expired)"
    if held is not None:
        reason += f"; removal held up to {held:g}s by the mass-loss brake"
    return reason


def diff(
    ids: Iterable[str],
    members: Mapping[str, ServiceInstance],
    published: Mapping[str, ServiceInstance],
    markers: Mapping[str, MaintenanceMarker],
    released: frozenset[str],
    held_for: float,
) -> ListDiff:
    """``members`` (with ``markers`` laid over them) against ``published``, over ``ids``
    only: O(len(ids)). A removal the brake ``released`` says it was held ``held_for``."""
    added: dict[str, ServiceInstance] = {}
    changed: dict[str, ServiceInstance] = {}
    removed: dict[str, str] = {}
    for k in ids:
        new, old = members.get(k), published.get(k)
        if new is not None and k in markers:
            new = apply_marker(new, markers[k])
        if new is None:
            if old is not None:
                removed[k] = removal_reason(old, held_for if k in released else None)
        elif old is None:
            added[k] = new
        elif old != new:
            changed[k] = new
    return ListDiff(added, changed, removed)


def applied(
    published: Mapping[str, ServiceInstance],
    upserts: Mapping[str, ServiceInstance],
    removed: Iterable[str],
) -> Mapping[str, ServiceInstance]:
    """``published`` with a diff applied: O(changed) on the watcher's immutable views."""
    base = published if isinstance(published, immutables.Map) else immutables.Map(published)
    view = base.mutate()
    for instance_id in removed:
        view.pop(instance_id, None)
    for instance_id, instance in upserts.items():
        view[instance_id] = instance
    return view.finish()
