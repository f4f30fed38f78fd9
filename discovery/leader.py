"""What the elected leader does: watch ``/data_servers`` and publish the live list.

Only the leader watches ZooKeeper's membership (one watcher for the cluster, not one
per search server) and writes the live list, through the fenced
:class:`~discovery.livelist.LiveListPublisher` its :class:`~discovery.livelist.LiveListStore`
gives it for the term (by default :class:`~discovery.livelist.redis.RedisLiveStore`: Redis).
A term of leadership is one call of :class:`LeaderDuty`; it runs as a task of
:class:`~discovery.zk.election.LeaderElection` until cancelled.

Within a term:

* the first write is the full snapshot (a new epoch starts at version 1);
* every membership change is published as a diff against what was last published
  (added, changed, removed with a reason), computed over the ids the watcher's change
  sets touched (plus the brake's held and released ones): O(changed), whatever the
  cluster's size;
* a heartbeat tells readers the leader is alive every ``heartbeat_interval``; if it
  finds the stored list missing or not ours (Redis restarted empty, FLUSHALL), the full
  snapshot is republished, so the list is back within one heartbeat interval;
* while the ZooKeeper connection is SUSPENDED nothing is written at all: we may
  already have been replaced. On reconnection in the same session the full snapshot
  is republished; on LOST the election cancels the term;
* a write refused by the fence (:class:`~discovery.errors.FencedError`) means a newer
  leader exists: the term ends and the election contends again. Unless the stored
  epoch is one no leader can hold: above the election directory's pzxid, read after
  a ``sync`` (:mod:`discovery.zk.epochs`). Resigning for such an epoch would hand it from
  search server to search server for ever, so the leader keeps its term, publishes
  nothing (search servers route with the list they hold), sets
  ``discovery_leader_fence_poisoned`` and logs an error naming ``discovery fence
  repair``; it tries the fence again with a heartbeat after the heartbeat interval,
  doubling to ``fence_recheck_max``, and publishes in full once the fence lets it.
  Never an automatic override: only an operator resets the fence. If ZooKeeper cannot
  be asked, it holds the same way and asks again later;
* we write only under a **lease**: within half a session timeout of the last answer
  that showed our election node ours (read back three times per lease; winning the
  term counts as the first). A leader cut from ZooKeeper so stops publishing well
  before the server can expire its session, whatever kazoo believes of the connection;
* if that read finds our election node gone or not ours, the term ends. No event
  may ever say so: a client can stay connected to a session the ensemble has closed
  (see :class:`~discovery.zk.session.ZkSession`), and a leader in that state would otherwise
  publish until a successor's epoch fences it;
* store errors (a Redis outage, a Sentinel failover, error replies) are logged; the
  store is then probed with a heartbeat every 0.2 s, and the first that succeeds
  brings a full snapshot (a write whose outcome is unknown leaves readers unsure of
  what they hold); once every write has failed for ``store_grace``
  (the search server uses its heartbeat TTL) the term ends, and the election's next
  contender leads: a leader cut from Redis alone must not hold the cluster's list
  stale while another search server could publish it (if nobody reaches Redis,
  leadership rotates, harmlessly). A store that refuses our credentials
  (:class:`~discovery.errors.RedisAccessError`) ends the term, for the caller to handle;
* every publish decision goes through the term's
  :class:`~discovery.livelist.brake.MassLossBrake`: when many data servers vanish at once
  without announcing it, their removals are held (they stay in what we publish,
  full snapshots included) for at most ``mass_loss.hold`` seconds. The loop wakes at
  the end of a hold to publish the release even if nothing else happens;
* operators' maintenance markers (``/maintenance/<id>``, followed by a
  :class:`~discovery.zk.maintenance.MaintenanceWatcher` for the term, read before the
  first publish) are laid over what is published: a marked server that is registered
  (or held by the brake) is published with state ``maintenance``, the marker's reason
  and ``enabled: false``, through its re-registrations and restarts, until the marker
  is cleared. A marker change marks only its id dirty, so it costs a delta of that id;
  a full snapshot applies the markers in O(markers). The brake sees the real members,
  so a server put in maintenance is no loss, and a server in maintenance whose node
  then goes is a deliberate removal (announced), never held.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import posixpath
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass

import immutables
from prometheus_client import CollectorRegistry

from discovery.errors import FencedError, StoreError, ZkError
from discovery.instance import InstanceState, ServiceInstance
from discovery.livelist.brake import BrakeStatus, MassLossBrake, MassLossBrakeConfig
from discovery.livelist.model import LiveListPublisher, LiveListStore
from discovery.metrics import (
    FenceMetrics,
    MaintenanceMetrics,
    MassLossBrakeMetrics,
    MembershipMetrics,
)
from discovery.zk.election import Leadership
from discovery.zk.epochs import EpochVerdict, FenceCheck, check_epoch
from discovery.zk.maintenance import (
    MaintenanceMarker,
    MaintenanceView,
    MaintenanceWatcher,
    apply_marker,
    overlay,
)
from discovery.zk.membership import MembershipSubscription, MembershipWatcher
from discovery.zk.paths import DATA_SERVERS_PATH, MAINTENANCE_PATH
from discovery.zk.session import SessionEvent, SessionState, ZkSession

__all__ = ["LeaderDuty"]

log = logging.getLogger(__name__)

# How soon a leader whose last write failed tries again (between heartbeats).
_STORE_RETRY = 0.2
#: The default of ``fence_recheck_max``: the longest a leader holding its term over an
#: impossible epoch waits between tries of the fence, hence how long after a repair it
#: may take to publish again.
FENCE_RECHECK_MAX = 30.0
# What an operator runs, named in the leader's error.
_REPAIR_COMMAND = (
    "`discovery fence check`, then `discovery fence repair` (with this server's --zk, "
    "--redis and --cluster)"
)
_NO_MARKERS: Mapping[str, MaintenanceMarker] = immutables.Map()


def _removal_reason(instance: ServiceInstance, held: float | None = None) -> str:
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


def _applied(
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


class LeaderDuty:
    """``await duty(leadership)`` runs one term of leadership until cancelled or fenced.

    ``store`` is where the list is published (a new publisher per term); ``leader_id``
    names this leader in what it publishes. ``mass_loss`` configures each term's
    mass-loss brake
    (:class:`~discovery.livelist.brake.MassLossBrake`; default ``MassLossBrakeConfig()``,
    which is on); ``clock`` (monotonic seconds) is the brake's. ``store_grace``: a term
    whose writes have all failed for that many seconds ends (None: never), so that a
    leader cut from the store alone hands over to one that may reach it.
    ``maintenance_path``: where operators' maintenance markers live (None: no
    maintenance overlay, for tests of other things). ``admit``: the deployment's own
    rule on registrations (``--allowed-networks``), see
    :class:`~discovery.zk.membership.MembershipWatcher`. ``fence_recheck_max``: the
    longest pause between tries of a fence holding an impossible epoch (the first is
    ``heartbeat_interval``, doubling).
    """

    def __init__(
        self,
        session: ZkSession,
        store: LiveListStore,
        leader_id: str,
        *,
        watch_path: str = DATA_SERVERS_PATH,
        coalesce_window: float = 0.05,
        heartbeat_interval: float = 1.0,
        registry: CollectorRegistry | None = None,
        mass_loss: MassLossBrakeConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        store_grace: float | None = None,
        maintenance_path: str | None = MAINTENANCE_PATH,
        admit: Callable[[ServiceInstance], str | None] | None = None,
        fence_recheck_max: float = FENCE_RECHECK_MAX,
    ) -> None:
        if not fence_recheck_max > 0:
            raise ValueError(f"fence_recheck_max must be positive, got {fence_recheck_max!r}")
        self._session = session
        self._admit = admit
        self._fence_recheck_max = fence_recheck_max
        self._maintenance_path = maintenance_path
        self._store_grace = store_grace
        self._store = store
        self._leader_id = leader_id
        self._watch_path = watch_path
        self._window = coalesce_window
        self._heartbeat_interval = heartbeat_interval
        registry = registry if registry is not None else CollectorRegistry()
        # Created once: every term reuses them (a registry refuses duplicates).
        self._membership_metrics = MembershipMetrics(registry)
        self._brake_metrics = MassLossBrakeMetrics(registry)
        self._maintenance_metrics = MaintenanceMetrics(registry)
        self._fence_metrics = FenceMetrics(registry)
        self._mass_loss = mass_loss if mass_loss is not None else MassLossBrakeConfig()
        self._clock = clock
        self._term: _Term | None = None

    @property
    def fence_poisoned(self) -> bool:
        """True while the term in progress holds over an epoch no leader can hold."""
        term = self._term
        return term is not None and term.poisoned

    def brake_status(self) -> BrakeStatus | None:
        """The mass-loss brake of the term in progress; None while not leading."""
        term = self._term
        return term.brake.status() if term is not None else None

    async def __call__(self, leadership: Leadership) -> None:
        publisher = self._store.publisher(leader_id=self._leader_id, epoch=leadership.epoch)
        brake = MassLossBrake(self._mass_loss, clock=self._clock, metrics=self._brake_metrics)
        term = _Term(self, publisher, leadership, brake)
        self._term = term
        self._session.add_listener(term.on_session_event)
        try:
            async with contextlib.AsyncExitStack() as stack:
                if self._maintenance_path is not None:
                    # Read before the first publish: a new leader must never publish a
                    # server in maintenance as serving, not even for one version.
                    term.maintenance = await stack.enter_async_context(
                        MaintenanceWatcher(
                            self._session,
                            self._maintenance_path,
                            on_change=term.on_maintenance_change,
                            metrics=self._maintenance_metrics,
                        )
                    )
                watcher = await stack.enter_async_context(
                    MembershipWatcher(
                        self._session,
                        self._watch_path,
                        coalesce_window=self._window,
                        metrics=self._membership_metrics,
                        admit=self._admit,
                    )
                )
                await term.run(watcher)
        finally:
            self._session.remove_listener(term.on_session_event)
            brake.close()
            # Whoever leads next says for itself whether the fence is poisoned.
            self._fence_metrics.poisoned.set(0)
            if self._term is term:
                self._term = None


@dataclass
class _FenceHold:
    """A term held without writing: the fence refused us with an epoch that no leader
    can hold (or ZooKeeper could not be asked whether one can)."""

    check: FenceCheck | None  # None: ZooKeeper could not be asked
    delay: float  # until the next try of the fence, doubling
    next_at: float  # the duty's clock


class _Term:
    """The state of one term: what was last published and whether we may write."""

    def __init__(
        self,
        duty: LeaderDuty,
        publisher: LiveListPublisher,
        leadership: Leadership,
        brake: MassLossBrake,
    ) -> None:
        self._duty = duty
        self._publisher = publisher
        self._leadership = leadership
        self.brake = brake
        self.maintenance: MaintenanceWatcher | None = None  # set before run()
        self._published: Mapping[str, ServiceInstance] | None = None  # None: full next
        # What the watcher's change sets touched since the last publish, and what they
        # removed since the brake last looked: a change costs O(changed), not O(members).
        self._dirty: set[str] = set()
        self._removed: dict[str, ServiceInstance] = {}
        self._wake = asyncio.Event()
        # The lease: we write only within half a session timeout of the last answer
        # that showed our election node still ours (winning counts as one).
        self._lease = duty._session.session_timeout / 2
        self._confirmed_at = duty._clock()
        self._deposed = False  # our election node was found gone
        # Since when every write has failed (None: the last one succeeded). Time spent
        # not writing at all (suspended) does not end a streak, but it does not start one.
        self._failing_since: float | None = None
        # Set while the fence holds an epoch no leader can hold: we keep the term and
        # write nothing until a try of the fence succeeds.
        self._hold: _FenceHold | None = None

    @property
    def poisoned(self) -> bool:
        hold = self._hold
        return (
            hold is not None
            and hold.check is not None
            and hold.check.verdict is EpochVerdict.IMPOSSIBLE
        )

    def on_session_event(self, event: SessionEvent) -> None:
        if event.state is SessionState.CONNECTED and not event.new_session:
            # Back in the same session after SUSPENDED: we are still the leader, but
            # changes may have been skipped while we could not write.
            self._published = None
            self._wake.set()
        elif event.state is SessionState.SUSPENDED:
            log.warning(
                "leader %s (epoch %d): ZooKeeper suspended, publishing paused",
                self._duty._leader_id,
                self._leadership.epoch,
            )

    def on_maintenance_change(self, ids: frozenset[str]) -> None:
        # On the loop, called by the maintenance watcher: only these ids are diffed.
        self._dirty.update(ids)
        self._wake.set()

    async def run(self, watcher: MembershipWatcher) -> None:
        changes = watcher.subscribe()
        follower = asyncio.create_task(self._follow(changes), name="leader:follow-changes")
        keeper = asyncio.create_task(self._keep_lease(), name="leader:keep-lease")
        loop = asyncio.get_running_loop()
        interval = self._duty._heartbeat_interval
        next_beat = loop.time() + interval
        try:
            while not (self._deposed or self._store_lost()):
                await self._publish_if_due(watcher.members)
                delay = next_beat - loop.time()
                # While the store fails (a Redis failover in progress), probe it with a
                # heartbeat soon rather than at the next beat: the first one that
                # succeeds brings the full publish, so readers are current again within
                # a retry of the new primary's arrival. (A heartbeat, not the publish
                # itself: a full publish of 50,000 servers is megabytes to encode.)
                retrying = self._failing_since is not None and delay > _STORE_RETRY
                if retrying:
                    delay = _STORE_RETRY
                if delay > 0:
                    # A hold that ends before the next heartbeat is published on time.
                    release = self.brake.seconds_until_release()
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

    async def _follow(self, changes: MembershipSubscription) -> None:
        # What to publish is computed from the watcher's current view; the change sets
        # say which ids to look at. A change set consumed after the view was read only
        # makes the next round look at ids again, never skip one.
        async for change in changes:
            self._dirty.update(change.added, change.removed, change.changed)
            self._removed.update(change.removed)
            self._wake.set()

    def _store_lost(self) -> bool:
        """True once every write has failed for ``store_grace``: time to hand over."""
        grace, since = self._duty._store_grace, self._failing_since
        if grace is None or since is None or self._duty._clock() - since <= grace:
            return False
        log.error(
            "leader %s (epoch %d): the store has refused every write for %.1fs; resigning, "
            "so that a search server that can reach it leads",
            self._duty._leader_id,
            self._leadership.epoch,
            self._duty._clock() - since,
        )
        return True

    def _store_failed(self, started: float) -> None:
        # From when the failed write was started: it may have hung for a while.
        if self._failing_since is None:
            self._failing_since = started

    def _may_write(self) -> bool:
        return self._hold is None and self._lease_valid()

    def _lease_valid(self) -> bool:
        session = self._duty._session
        # Never write unless connected in the session that won this term, and recently
        # confirmed by ZooKeeper: kazoo notices a dead link only after up to 2/3 of the
        # session timeout (plus a ping's jitter), too close to the server's own expiry
        # to rely on; the lease stops us at half of it, whatever kazoo believes.
        return (
            session.connected
            and session.session_id == self._leadership.session_id
            and self._duty._clock() - self._confirmed_at < self._lease
        )

    async def _publish_if_due(self, members: Mapping[str, ServiceInstance]) -> None:
        self._wake.clear()
        markers = self.maintenance.markers if self.maintenance is not None else _NO_MARKERS
        # Fed even while we may not write, so that a hold's clock runs and ends on time.
        removed, self._removed = self._removed, {}
        if markers:
            # A server in maintenance was out of the fan-out already: its node going
            # is no unexplained loss (O(removed)).
            removed = {
                k: apply_marker(v, markers[k]) if k in markers else v for k, v in removed.items()
            }
        decision = self.brake.apply(members, removed)
        if not self._may_write() or self._failing_since is not None:
            # A failing store is probed by heartbeats (see run()); one that succeeds
            # clears the failure, and the full publish follows at once.
            return
        members = decision.members
        held_for = self.brake.config.hold
        published = self._published
        started = self._duty._clock()
        try:
            async with self._write_deadline():
                written = await self._publish(
                    members, markers, published, decision.released, held_for
                )
        except StoreError as exc:
            log.warning("leader: publishing failed, retrying with a full snapshot: %s", exc)
            self._published = None
            self._store_failed(started)
            return
        except FencedError as exc:
            await self._fenced(exc)
            return
        self._failing_since = None
        self._published = written

    async def _publish(
        self,
        members: Mapping[str, ServiceInstance],
        markers: Mapping[str, MaintenanceMarker],
        published: Mapping[str, ServiceInstance] | None,
        released: frozenset[str],
        held_for: float,
    ) -> Mapping[str, ServiceInstance]:
        """The full snapshot if nothing is published yet in this term, else the diff;
        returns what readers now hold.

        The diff looks only at the ids the watcher's change sets touched, the brake's
        held ones and those it released: O(changed) at any cluster size. What readers
        hold is the last publish with this diff applied, not ``members``: a change set
        the follower task has not consumed yet is already in ``members`` but not in the
        diff, and must still count as unpublished when its ids come in.

        ``members`` are the real ones (and the brake's held ones); ``markers`` are laid
        over them: over all of them for a full snapshot (O(markers)), over the ids
        looked at for a diff. A marker's appearing, changing or going makes its id
        dirty (:meth:`on_maintenance_change`), so it is looked at.
        """
        ids, self._dirty = self._dirty, set()
        if published is None:
            servers = overlay(members, markers)
            await self._publisher.publish_full(servers)
            return servers
        ids |= released
        ids.update(self.brake.held)
        added: dict[str, ServiceInstance] = {}
        changed: dict[str, ServiceInstance] = {}
        removed: dict[str, str] = {}
        for k in ids:
            new, old = members.get(k), published.get(k)
            if new is not None and k in markers:
                new = apply_marker(new, markers[k])
            if new is None:
                if old is not None:
                    removed[k] = _removal_reason(old, held_for if k in released else None)
            elif old is None:
                added[k] = new
            elif old != new:
                changed[k] = new
        if not (added or changed or removed):
            return published
        # The whole view is only counted, or iterated for a full fallback: lazily overlaid.
        await self._publisher.publish_change(
            MaintenanceView(members, markers), added=added, changed=changed, removed=removed
        )
        return _applied(published, {**added, **changed}, removed)

    @contextlib.asynccontextmanager
    async def _write_deadline(self) -> AsyncIterator[None]:
        """Bound one write by the store grace: a write that takes longer is as good as
        failed (readers have given us up), and it must not hold the resignation up.
        The outcome of a write cut short is unknown, as for any failed write."""
        grace = self._duty._store_grace
        try:
            async with asyncio.timeout(grace):
                yield
        except TimeoutError:
            raise StoreError(f"no answer from the store within {grace:g}s") from None

    async def _keep_lease(self) -> None:
        """Read our election node back three times per lease, for as long as the term
        lasts; the first answer that shows it gone deposes us."""
        period = self._lease / 3
        while True:
            if not await self._still_elected(period):
                self._deposed = True
                self._wake.set()
                return
            # The period of a renewal, not a wait for an event: the term cancels us.
            await asyncio.sleep(period)

    async def _still_elected(self, timeout: float) -> bool:
        """False once our election node is gone or owned by another session.

        A read that fails or takes longer than ``timeout`` (a dropped connection, a
        loaded ensemble) proves nothing: the session events decide then, and the lease
        is not renewed.
        """
        session = self._duty._session
        if not (session.connected and session.session_id == self._leadership.session_id):
            return True
        asked = self._duty._clock()
        try:
            async with asyncio.timeout(timeout):
                stat = await session.exists(self._leadership.node)
        except (ZkError, TimeoutError) as exc:
            log.debug("leader: checking the election node deferred: %r", exc)
            return True
        if stat is not None and stat.ephemeral_owner == self._leadership.session_id:
            if self._duty._clock() - self._confirmed_at >= self._lease:
                log.warning(
                    "leader %s (epoch %d): ZooKeeper answers again; publishing resumes",
                    self._duty._leader_id,
                    self._leadership.epoch,
                )
                self._published = None  # what was skipped meanwhile: a full snapshot
                self._wake.set()
            # The answer proves the node was ours when we asked, not when it came.
            self._confirmed_at = asked
            return True
        log.error(
            "leader %s (epoch %d): election node %s is gone although our session 0x%x "
            "looks connected; resigning",
            self._duty._leader_id,
            self._leadership.epoch,
            self._leadership.node,
            self._leadership.session_id,
        )
        return False

    async def _fenced(self, exc: FencedError) -> None:
        """A write was refused: resign (raise ``exc``) unless the stored epoch is one no
        leader can hold, or ZooKeeper cannot say; then hold the term without writing."""
        duty, term = self._duty, self._leadership
        metrics = duty._fence_metrics
        check: FenceCheck | None = None
        if exc.reason == "epoch" and exc.stored_epoch > term.epoch:
            try:
                # Bounded by the lease: an answer later than that proves nothing anyway.
                async with asyncio.timeout(self._lease):
                    check = await check_epoch(
                        duty._session, exc.stored_epoch, term.epoch, posixpath.dirname(term.node)
                    )
            except (ZkError, TimeoutError) as error:
                log.warning(
                    "leader %s (epoch %d): fenced off by epoch %d, and ZooKeeper could not "
                    "say whether a leader can hold it (%s); holding the term without "
                    "writing, asking again later",
                    duty._leader_id,
                    term.epoch,
                    exc.stored_epoch,
                    error,
                )
                metrics.checks.labels(verdict="unknown").inc()
                self._hold_term(None)
                return
            if check.verdict is EpochVerdict.IMPOSSIBLE:
                metrics.checks.labels(verdict="impossible").inc()
                self._hold_term(check)
                return
            metrics.checks.labels(verdict="possible").inc()
        log.error(
            "leader %s (epoch %d) was fenced off: a newer leader has published (%s); resigning",
            duty._leader_id,
            term.epoch,
            exc,
        )
        raise exc

    def _hold_term(self, check: FenceCheck | None) -> None:
        """Stop writing and try the fence again later (doubling the pause)."""
        duty, hold = self._duty, self._hold
        now = duty._clock()
        delay = (
            duty._heartbeat_interval
            if hold is None
            else min(duty._fence_recheck_max, hold.delay * 2)
        )
        first = hold is None or hold.check is None
        if check is None and hold is not None:
            check = hold.check  # ZooKeeper did not answer: the last verdict stands
        self._hold = _FenceHold(check, delay, now + delay)
        # Not a store outage: a term that holds must not resign for "failing" writes.
        self._failing_since = None
        if check is None or check.verdict is not EpochVerdict.IMPOSSIBLE:
            return
        duty._fence_metrics.poisoned.set(1)
        if first:
            log.error(
                "leader %s (epoch %d): the live list's fence holds epoch %d, which no leader "
                "can hold (ZooKeeper's election directory has issued epochs up to %d): it "
                "was written by hand, or Redis holds another cluster's list or one from "
                "before ZooKeeper was rebuilt. Keeping the term without publishing (search "
                "servers route with the list they hold), trying the fence again in %.1f s. "
                "To repair: %s",
                duty._leader_id,
                self._leadership.epoch,
                check.stored,
                check.highest,
                delay,
                _REPAIR_COMMAND,
            )
        else:
            log.warning(
                "leader %s (epoch %d): still fenced off by epoch %d, which no leader can hold "
                "(up to %d); trying again in %.1f s. To repair: %s",
                duty._leader_id,
                self._leadership.epoch,
                check.stored,
                check.highest,
                delay,
                _REPAIR_COMMAND,
            )

    async def _try_fence(self) -> None:
        """While holding: when due, try the fence with a fresh publisher's heartbeat
        (the refused one refuses every call); publish in full once it passes."""
        hold, duty = self._hold, self._duty
        assert hold is not None
        if duty._clock() < hold.next_at or not self._lease_valid():
            return
        publisher = duty._store.publisher(leader_id=duty._leader_id, epoch=self._leadership.epoch)
        try:
            async with self._write_deadline():
                await publisher.heartbeat()
        except FencedError as exc:
            await self._fenced(exc)  # resigns if a leader may hold the epoch by now
            return
        except StoreError as exc:
            log.debug("leader: trying the fence failed: %s", exc)
            self._hold_term(None)
            return
        duty._fence_metrics.checks.labels(verdict="repaired").inc()
        duty._fence_metrics.poisoned.set(0)
        log.warning(
            "leader %s (epoch %d): the fence lets us write again (repaired); publishing the "
            "whole list",
            duty._leader_id,
            self._leadership.epoch,
        )
        self._hold = None
        self._publisher = publisher
        self._published = None
        self._wake.set()

    async def _heartbeat(self) -> None:
        if self._hold is not None:
            await self._try_fence()
            return
        if not self._may_write():
            return
        started = self._duty._clock()
        try:
            async with self._write_deadline():
                present = await self._publisher.heartbeat()
        except FencedError as exc:
            await self._fenced(exc)
            return
        except StoreError as exc:
            # The first failure is news; the probes of an outage that follow are noise.
            log.log(
                logging.WARNING if self._failing_since is None else logging.DEBUG,
                "leader: heartbeat failed: %s",
                exc,
            )
            self._published = None
            self._store_failed(started)
            return
        if self._failing_since is not None:
            log.info("leader: the store answers again; publishing the whole list")
        self._failing_since = None
        if self._published is None:
            self._wake.set()  # a failed write left readers unsure: the full list follows
        if not present:
            log.warning("leader: the stored live list is missing or not ours; republishing it")
            self._published = None
            self._wake.set()
