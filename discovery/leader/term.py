"""One term of leadership: the loop that publishes, heartbeats and decides when to stop.

Design: docs/design/live-list.md, "Election and publishing".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping

from discovery.errors import FencedError, StoreError
from discovery.instance import ServiceInstance
from discovery.leader.fencing import FenceGuard
from discovery.leader.lease import Lease
from discovery.leader.outage import StoreOutage
from discovery.leader.publication import NO_MARKERS, Publication
from discovery.leader.settings import LeaderSettings
from discovery.livelist.brake import MassLossBrake
from discovery.livelist.model import LiveListPublisher, LiveListStore
from discovery.metrics import FenceMetrics
from discovery.zk.election import Leadership
from discovery.zk.maintenance import MaintenanceWatcher
from discovery.zk.membership import MembershipSubscription, MembershipWatcher
from discovery.zk.session import SessionEvent, SessionState, ZkSession

__all__ = ["Term"]

log = logging.getLogger(__name__)

# How soon a leader whose last write failed tries again (between heartbeats).
_STORE_RETRY = 0.2


class Term:
    """Run one term (:meth:`run`) until deposed, fenced off or cut from the store.

    It writes only while its :class:`~discovery.leader.lease.Lease` is valid, no fence
    hold is on (:class:`~discovery.leader.fencing.FenceGuard`) and the store is not
    failing (then heartbeats probe it every 0.2 s; the first that succeeds brings the
    full snapshot). Nothing is written while the session is SUSPENDED; back in the same
    session, the full snapshot follows. It returns once deposed or once the store has
    failed for ``store_grace`` (:class:`~discovery.leader.outage.StoreOutage`), and
    raises a refusal of the fence that a newer leader may explain. The caller cancels
    it on LOST.
    """

    def __init__(
        self,
        settings: LeaderSettings,
        *,
        session: ZkSession,
        store: LiveListStore,
        publisher: LiveListPublisher,
        leadership: Leadership,
        brake: MassLossBrake,
        fence_metrics: FenceMetrics,
        clock: Callable[[], float],
    ) -> None:
        self._leader_id = settings.leader_id
        self._heartbeat_interval = settings.heartbeat_interval
        self._leadership = leadership
        self._brake = brake
        self._clock = clock
        self._wake = asyncio.Event()
        self._publication = Publication(publisher, brake)
        self._lease = Lease(
            session,
            leadership,
            leader_id=settings.leader_id,
            clock=clock,
            on_resumed=self._republish,
            on_deposed=self._wake.set,
        )
        self._outage = StoreOutage(
            settings.store_grace, leader_id=settings.leader_id, epoch=leadership.epoch, clock=clock
        )
        self._fence = FenceGuard(
            session,
            store,
            leadership,
            leader_id=settings.leader_id,
            heartbeat_interval=settings.heartbeat_interval,
            recheck_max=settings.fence_recheck_max,
            lease=self._lease,
            outage=self._outage,
            metrics=fence_metrics,
            clock=clock,
        )

    @property
    def brake(self) -> MassLossBrake:
        """The term's mass-loss brake."""
        return self._brake

    @property
    def poisoned(self) -> bool:
        """True while the term holds over an epoch no leader can hold."""
        return self._fence.poisoned

    def on_session_event(self, event: SessionEvent) -> None:
        """The session's listener (on the loop): log a suspension, republish after it."""
        if event.state is SessionState.CONNECTED and not event.new_session:
            # Back in the same session after SUSPENDED: we are still the leader, but
            # changes may have been skipped while we could not write.
            self._republish()
        elif event.state is SessionState.SUSPENDED:
            log.warning(
                "leader %s (epoch %d): ZooKeeper suspended, publishing paused",
                self._leader_id,
                self._leadership.epoch,
            )

    def on_maintenance_change(self, ids: frozenset[str]) -> None:
        """The maintenance watcher's callback (on the loop): only these ids are diffed."""
        self._publication.note_ids(ids)
        self._wake.set()

    async def run(self, watcher: MembershipWatcher, maintenance: MaintenanceWatcher | None) -> None:
        """Publish ``watcher``'s members (``maintenance``'s markers laid over them)."""
        changes = watcher.subscribe()
        follower = asyncio.create_task(self._follow(changes), name="leader:follow-changes")
        keeper = asyncio.create_task(self._lease.keep(), name="leader:keep-lease")
        loop = asyncio.get_running_loop()
        interval = self._heartbeat_interval
        next_beat = loop.time() + interval
        try:
            while not (self._lease.deposed or self._outage.lost()):
                await self._publish_if_due(watcher.members, maintenance)
                delay = next_beat - loop.time()
                # While the store fails (a Redis failover in progress), probe it with a
                # heartbeat soon rather than at the next beat: the first one that
                # succeeds brings the full publish, so readers are current again within
                # a retry of the new primary's arrival. (A heartbeat, not the publish
                # itself: a full publish of 50,000 servers is megabytes to encode.)
                retrying = self._outage.failing and delay > _STORE_RETRY
                if retrying:
                    delay = _STORE_RETRY
                if delay > 0:
                    # A hold that ends before the next heartbeat is published on time.
                    release = self._brake.seconds_until_release()
                    releasing = release is not None and release < delay
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(release if releasing else delay):
                            await self._wake.wait()
                    if self._wake.is_set() or releasing:
                        continue
                await self._heartbeat()
                next_beat = loop.time() + interval
        finally:
            changes.close()
            for task in (follower, keeper):
                task.cancel()
            for task in (follower, keeper):
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def _republish(self) -> None:
        """What readers hold is unsure or skipped: publish the full snapshot next."""
        self._publication.invalidate()
        self._wake.set()

    async def _follow(self, changes: MembershipSubscription) -> None:
        # What to publish is computed from the watcher's current view; the change sets
        # say which ids to look at. A change set consumed after the view was read only
        # makes the next round look at ids again, never skip one.
        async for change in changes:
            self._publication.note_change(change)
            self._wake.set()

    def _may_write(self) -> bool:
        return not self._fence.holding and self._lease.valid()

    async def _publish_if_due(
        self, members: Mapping[str, ServiceInstance], maintenance: MaintenanceWatcher | None
    ) -> None:
        self._wake.clear()
        markers = maintenance.markers if maintenance is not None else NO_MARKERS
        # Fed even while we may not write, so that a hold's clock runs and ends on time.
        decision = self._brake.apply(members, self._publication.take_removed(markers))
        if not self._may_write() or self._outage.failing:
            # A failing store is probed by heartbeats (see run()); one that succeeds
            # clears the failure, and the full publish follows at once.
            return
        started = self._clock()
        try:
            async with self._outage.deadline():
                await self._publication.publish(
                    decision.members, markers, decision.released, self._brake.config.hold
                )
        except StoreError as exc:
            log.warning("leader: publishing failed, retrying with a full snapshot: %s", exc)
            self._publication.invalidate()
            self._outage.failed(started)
            return
        except FencedError as exc:
            await self._fence.refused(exc)
            return
        self._outage.clear()

    async def _heartbeat(self) -> None:
        if self._fence.holding:
            publisher = await self._fence.retry()
            if publisher is not None:  # the fence lets us write again: all of it
                self._publication.use(publisher)
                self._republish()
            return
        if not self._may_write():
            return
        started = self._clock()
        try:
            async with self._outage.deadline():
                present = await self._publication.heartbeat()
        except FencedError as exc:
            await self._fence.refused(exc)
            return
        except StoreError as exc:
            # The first failure is news; the probes of an outage that follow are noise.
            log.log(
                logging.WARNING if not self._outage.failing else logging.DEBUG,
                "leader: heartbeat failed: %s",
                exc,
            )
            self._publication.invalidate()
            self._outage.failed(started)
            return
        if self._outage.failing:
            log.info("leader: the store answers again; publishing the whole list")
        self._outage.clear()
        if self._publication.stale:
            self._wake.set()  # a failed write left readers unsure: the full list follows
        if not present:
            log.warning("leader: the stored live list is missing or not ours; republishing it")
            self._republish()
