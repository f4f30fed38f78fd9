""":class:`LeaderDuty`: what an elected search server runs for each term of leadership.

Design: docs/design/live-list.md, "Election and publishing".
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from discovery.instance import ServiceInstance
from discovery.leader.settings import FENCE_RECHECK_MAX, LeaderSettings
from discovery.leader.term import Term
from discovery.livelist.brake import BrakeStatus, MassLossBrake, MassLossBrakeConfig
from discovery.livelist.model import LiveListStore
from discovery.livelist.shards import within_shards
from discovery.metrics import (
    FenceMetrics,
    MaintenanceMetrics,
    MassLossBrakeMetrics,
    MembershipMetrics,
)
from discovery.zk.election import Leadership
from discovery.zk.maintenance import MaintenanceWatcher
from discovery.zk.membership import MembershipWatcher
from discovery.zk.paths import DATA_SERVERS_PATH, MAINTENANCE_PATH
from discovery.zk.session import ZkSession

__all__ = ["LeaderDuty"]


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
    :class:`~discovery.zk.membership.MembershipWatcher`. ``allow_persistent_members``
    (``--allow-persistent-members``): route persistent ``PERMANENT``/``STATIC``
    registrations (by default they are skipped and counted as ``persistent``; a
    persistent ``DYNAMIC`` one is refused whatever this says). ``fence_recheck_max``: the
    longest pause between tries of a fence holding an impossible epoch (the first is
    ``heartbeat_interval``, doubling). ``shards``: the cluster's shard count
    (``--shards``; 0: any shard): a registration of a shard outside ``0..shards - 1``
    is skipped, counted as ``shard_out_of_range`` and never published (see
    :func:`~discovery.livelist.shards.shard_out_of_range`).
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
        allow_persistent_members: bool = False,
        fence_recheck_max: float = FENCE_RECHECK_MAX,
        shards: int = 0,
    ) -> None:
        self._settings = LeaderSettings(
            leader_id,
            watch_path=watch_path,
            coalesce_window=coalesce_window,
            heartbeat_interval=heartbeat_interval,
            mass_loss=mass_loss if mass_loss is not None else MassLossBrakeConfig(),
            store_grace=store_grace,
            maintenance_path=maintenance_path,
            admit=admit,
            allow_persistent_members=allow_persistent_members,
            fence_recheck_max=fence_recheck_max,
            shards=shards,
        )
        self._session = session
        self._store = store
        self._clock = clock
        registry = registry if registry is not None else CollectorRegistry()
        # Created once: every term reuses them (a registry refuses duplicates).
        self._membership_metrics = MembershipMetrics(registry)
        self._brake_metrics = MassLossBrakeMetrics(registry)
        self._maintenance_metrics = MaintenanceMetrics(registry)
        self._fence_metrics = FenceMetrics(registry)
        self._term: Term | None = None

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
        settings = self._settings
        publisher = self._store.publisher(leader_id=settings.leader_id, epoch=leadership.epoch)
        brake = MassLossBrake(settings.mass_loss, clock=self._clock, metrics=self._brake_metrics)
        term = Term(
            settings,
            session=self._session,
            store=self._store,
            publisher=publisher,
            leadership=leadership,
            brake=brake,
            fence_metrics=self._fence_metrics,
            clock=self._clock,
        )
        self._term = term
        self._session.add_listener(term.on_session_event)
        try:
            async with contextlib.AsyncExitStack() as stack:
                maintenance: MaintenanceWatcher | None = None
                if settings.maintenance_path is not None:
                    # Read before the first publish: a new leader must never publish a
                    # server in maintenance as serving, not even for one version.
                    maintenance = await stack.enter_async_context(
                        MaintenanceWatcher(
                            self._session,
                            settings.maintenance_path,
                            on_change=term.on_maintenance_change,
                            metrics=self._maintenance_metrics,
                        )
                    )
                watcher = await stack.enter_async_context(
                    MembershipWatcher(
                        self._session,
                        settings.watch_path,
                        coalesce_window=settings.coalesce_window,
                        metrics=self._membership_metrics,
                        # A shard outside --shards first: skipped like a bad node.
                        admit=within_shards(settings.shards, settings.admit),
                        allow_persistent=settings.allow_persistent_members,
                    )
                )
                await term.run(watcher, maintenance)
        finally:
            self._session.remove_listener(term.on_session_event)
            brake.close()
            # Whoever leads next says for itself whether the fence is poisoned.
            self._fence_metrics.poisoned.set(0)
            if self._term is term:
                self._term = None
