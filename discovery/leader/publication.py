"""What one term has published, and what changed since: membership reconciled to the list.

Design: docs/design/live-list.md, "Election and publishing".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import immutables

from discovery.instance import ServiceInstance
from discovery.leader.diff import applied, diff
from discovery.livelist.brake import MassLossBrake
from discovery.livelist.model import LiveListPublisher
from discovery.zk.maintenance import MaintenanceMarker, MaintenanceView, apply_marker, overlay
from discovery.zk.membership import MembershipChange

__all__ = ["NO_MARKERS", "Publication"]

NO_MARKERS: Mapping[str, MaintenanceMarker] = immutables.Map()


class Publication:
    """The list one term publishes through its ``publisher``: the full snapshot first
    (and after :meth:`invalidate`), then diffs over the ids that changed, O(changed).

    It writes only when told to (:meth:`publish`, :meth:`heartbeat`); whether it may is
    the term's to decide. A write that raises leaves what readers hold as it was before
    it: the term invalidates it when the outcome is unknown.
    """

    def __init__(self, publisher: LiveListPublisher, brake: MassLossBrake) -> None:
        self._publisher = publisher
        self._brake = brake
        self._published: Mapping[str, ServiceInstance] | None = None  # None: full next
        # What the watcher's change sets touched since the last publish, and what they
        # removed since the brake last looked: a change costs O(changed), not O(members).
        self._dirty: set[str] = set()
        self._removed: dict[str, ServiceInstance] = {}

    @property
    def stale(self) -> bool:
        """True while the next publish is the full snapshot (readers' list unsure)."""
        return self._published is None

    def invalidate(self) -> None:
        """Publish the full snapshot next (what readers hold is unknown, or skipped)."""
        self._published = None

    def use(self, publisher: LiveListPublisher) -> None:
        """Write through ``publisher`` from now on (after the fence refused the last)."""
        self._publisher = publisher

    def note_change(self, change: MembershipChange) -> None:
        """A change set of the watcher: its ids are looked at by the next publish."""
        self._dirty.update(change.added, change.removed, change.changed)
        self._removed.update(change.removed)

    def note_ids(self, ids: Iterable[str]) -> None:
        """These ids are looked at by the next publish (a maintenance marker changed)."""
        self._dirty.update(ids)

    def take_removed(
        self, markers: Mapping[str, MaintenanceMarker]
    ) -> Mapping[str, ServiceInstance]:
        """The members removed since the last call, for the brake, with ``markers`` laid
        over them (O(removed))."""
        removed, self._removed = self._removed, {}
        if markers:
            # A server in maintenance was out of the fan-out already: its node going
            # is no unexplained loss.
            return {
                k: apply_marker(v, markers[k]) if k in markers else v for k, v in removed.items()
            }
        return removed

    async def publish(
        self,
        members: Mapping[str, ServiceInstance],
        markers: Mapping[str, MaintenanceMarker],
        released: frozenset[str],
        held_for: float,
    ) -> None:
        """Publish the full snapshot if nothing is published yet in this term, else the
        diff; raises what the publisher raises, leaving what readers hold unchanged.

        The diff looks only at the ids the watcher's change sets touched, the brake's
        held ones and those it released. What readers hold is the last publish with this
        diff applied, not ``members``: a change set the follower task has not consumed
        yet is already in ``members`` but not in the diff, and must still count as
        unpublished when its ids come in.

        ``members`` are the real ones (and the brake's held ones); ``markers`` are laid
        over them: over all of them for a full snapshot (O(markers)), over the ids
        looked at for a diff. A marker's appearing, changing or going makes its id
        dirty (:meth:`note_ids`), so it is looked at.
        """
        published = self._published
        ids, self._dirty = self._dirty, set()
        if published is None:
            servers = overlay(members, markers)
            await self._publisher.publish_full(servers)
            self._published = servers
            return
        ids |= released
        ids.update(self._brake.held)
        change = diff(ids, members, published, markers, released, held_for)
        if change.empty:
            return
        # The whole view is only counted, or iterated for a full fallback: lazily overlaid.
        await self._publisher.publish_change(
            MaintenanceView(members, markers),
            added=change.added,
            changed=change.changed,
            removed=change.removed,
        )
        self._published = applied(published, {**change.added, **change.changed}, change.removed)

    async def heartbeat(self) -> bool:
        """The publisher's heartbeat: False if the stored list is missing or not ours."""
        return await self._publisher.heartbeat()
