"""An up-to-date, decoded view of a membership directory such as ``/data_servers``.

:class:`MembershipWatcher` hands each change (a new immutable view, with what was added,
removed, changed and skipped) to every subscriber, in order, none dropped. A child that is
not a valid registration is skipped and counted, never fatal; the last view is kept while
SUSPENDED, and the whole directory is re-read after every reconnect and expiry. Runs on
the event loop; kazoo's callbacks only mark what is dirty.

Design: docs/design/zookeeper.md, "Membership watch".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Final

from prometheus_client import CollectorRegistry

from discovery.errors import ZkError
from discovery.instance import MAX_INSTANCE_BYTES, ServiceInstance
from discovery.metrics import MembershipMetrics
from discovery.zk.memberfeed import MembershipFeed, MembershipSubscription
from discovery.zk.memberread import PERSISTENT, PERSISTENT_DYNAMIC, ChildReader, decode_child
from discovery.zk.memberview import MembershipChange, MembershipView
from discovery.zk.memberwatch import MembershipWatches
from discovery.zk.paths import DATA_SERVERS_PATH
from discovery.zk.session import ZkSession

__all__ = [
    "LOGGED_SKIPS",
    "PERSISTENT",
    "PERSISTENT_DYNAMIC",
    "MembershipChange",
    "MembershipSubscription",
    "MembershipWatcher",
    "decode_child",
]

log = logging.getLogger(__name__)

_RETRY_INTERVAL = 1.0

#: Skipped children logged one by one in one refresh; the rest go in one summary line.
LOGGED_SKIPS: Final = 10


class MembershipWatcher:
    """Watch ``path`` and keep its children decoded as :class:`ServiceInstance`.

    ``async with MembershipWatcher(session) as watcher:`` reads the directory once
    (creating it if missing), then follows it in a background task until closed.
    ``admit`` is a deployment's own rule on top of the contract's: it says why a
    valid registration is to be skipped (a reason starting with its metric label,
    ``not_allowed: ...``), or None; such a child is skipped and counted like a
    malformed one. ``allow_persistent`` admits persistent ``PERMANENT`` and ``STATIC``
    nodes as members (``--allow-persistent-members``); by default every persistent
    node is skipped and counted (see :func:`decode_child`).
    """

    def __init__(
        self,
        session: ZkSession,
        path: str = DATA_SERVERS_PATH,
        *,
        coalesce_window: float = 0.05,
        max_bytes: int = MAX_INSTANCE_BYTES,
        read_concurrency: int = 256,
        persistent_watch: bool = True,
        registry: CollectorRegistry | None = None,
        metrics: MembershipMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        admit: Callable[[ServiceInstance], str | None] | None = None,
        allow_persistent: bool = False,
    ) -> None:
        self._session = session
        self.path = path.rstrip("/") or "/"
        self._window = coalesce_window
        self._clock = clock
        # ``metrics`` lets an owner that creates watchers repeatedly (a leader, once per
        # term) keep one set of metrics on its registry.
        self._metrics = metrics or MembershipMetrics(
            registry if registry is not None else CollectorRegistry()
        )
        self._watches = MembershipWatches(session, self.path, persistent=persistent_watch)
        self._reader = ChildReader(
            session,
            self.path,
            max_bytes=max_bytes,
            read_concurrency=read_concurrency,
            admit=admit,
            allow_persistent=allow_persistent,
        )
        self._view = MembershipView()
        self._feed = MembershipFeed()
        self._task: asyncio.Task[None] | None = None

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        """Read the directory once and start following it.

        Raises:
            ZkError: the first read failed (not connected, not allowed).
        """
        self._watches.listen()
        try:
            await self._session.ensure_path(self.path)
            # Added before the first read: a change after that read is then reported.
            await self._watches.start()
            await self._refresh_once()
        except BaseException:
            await self._watches.aclose()
            raise
        self._task = asyncio.create_task(self._run(), name=f"membership:{self.path}")
        self._task.add_done_callback(self._on_task_done)

    @property
    def persistent(self) -> bool:
        """True while following with a persistent recursive watch (else re-listing)."""
        return self._watches.persistent

    async def aclose(self) -> None:
        """Stop following; subscriptions end."""
        await self._watches.aclose()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._feed.close()

    async def __aenter__(self) -> MembershipWatcher:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- the view ----------------------------------------------------------------

    @property
    def members(self) -> Mapping[str, ServiceInstance]:
        """The current valid members by id (read-only)."""
        return self._view.members

    @property
    def invalid(self) -> Mapping[str, str]:
        """Children currently skipped, with the reason (read-only)."""
        return self._view.invalid

    @property
    def generation(self) -> int:
        """Increases by one with every change set."""
        return self._view.generation

    @property
    def stale(self) -> bool:
        """True while the connection is not up, so the view may be out of date."""
        return not self._session.connected

    def subscribe(self) -> MembershipSubscription:
        """Receive the current view, then every change (see :class:`MembershipSubscription`)."""
        return self._feed.subscribe(self._view.current() if self._view.generation else None)

    async def wait_until(
        self, predicate: Callable[[Mapping[str, ServiceInstance]], bool], timeout: float
    ) -> Mapping[str, ServiceInstance]:
        """Wait until ``predicate(members)`` holds; returns the members then.

        Raises:
            TimeoutError: it did not hold within ``timeout`` seconds.
        """
        await self._feed.wait_until(lambda: predicate(self._view.members), timeout)
        return self._view.members

    # -- refreshing -----------------------------------------------------------

    def _on_task_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("membership watcher of %s crashed", self.path, exc_info=task.exception())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        wake = self._watches.wake
        last_refresh = -math.inf
        while True:
            await wake.wait()
            # Coalescing, leading edge: a change after a quiet spell is read at once
            # (a lone removal reaches the leader without added delay); changes that
            # follow within the window wait for its end and are read together, so a
            # burst of 100 registrations still costs one read per window.
            delay = last_refresh + self._window - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            wake.clear()
            if not self._session.connected:
                continue  # the CONNECTED event wakes us with a full re-read
            last_refresh = loop.time()
            try:
                await self._refresh_once()
            except ZkError as exc:
                log.warning("refreshing %s failed, retrying: %s", self.path, exc)
                self._watches.mark_full()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_RETRY_INTERVAL):
                        await wake.wait()
                wake.set()

    async def _refresh_once(self) -> None:
        full, relist, dirty = self._watches.take()
        try:
            await self._refresh(full, relist, dirty)
        except BaseException:
            # Nothing of this round was applied: do it all again next time.
            self._watches.mark_full()
            raise

    async def _refresh(self, full: bool, relist: bool, dirty: set[str]) -> None:
        started = self._clock()
        watches = self._watches
        listed = set(await self._reader.names(watches.children_watch)) if relist else None
        # The persistent watch names new children; the child watch relists for them.
        plan = self._view.plan(listed, dirty, full=full, names_new=watches.persistent)
        reads = await self._reader.read_all(plan.to_read, watches.node_watch)
        skips = _Skips(self.path, self._metrics)
        try:
            change = await self._view.apply(plan, reads, skips.skipped)
        finally:
            # Even when interrupted: what the view has reported is counted.
            skips.close()
        if full:
            self._metrics.resyncs.inc()
        self._metrics.refresh_seconds.observe(self._clock() - started)
        if change is not None:
            await self._publish(change)

    async def _publish(self, change: MembershipChange) -> None:
        members, invalid = change.members, change.invalid
        self._metrics.members.set(len(members))
        self._metrics.invalid.set(len(invalid))
        self._metrics.updates.inc()
        if not change.empty:
            log.info(
                "%s: %d members (+%d -%d ~%d, %d invalid)",
                self.path,
                len(members),
                len(change.added),
                len(change.removed),
                len(change.changed),
                len(invalid),
            )
        await self._feed.publish(change)


class _Skips:
    """The children skipped in one refresh: counted by reason (the metric is increased
    once per reason, at :meth:`close`) and logged, the first :data:`LOGGED_SKIPS` one by
    one, then in one line summing up the rest.

    A writer of the directory can create any number of bad children; a log line (or a
    labelled metric look-up, a third of the bookkeeping's time) for each would cost
    more than the rest of their bookkeeping.
    """

    def __init__(self, path: str, metrics: MembershipMetrics) -> None:
        self._path = path
        self._metrics = metrics
        self._by_reason: Counter[str] = Counter()
        self._logged = 0

    def skipped(self, child: str, reason: str) -> None:
        self._by_reason[reason.split(":", 1)[0]] += 1
        if self._logged < LOGGED_SKIPS:
            self._logged += 1
            log.warning("skipping %s/%s: %s", self._path, child, reason)

    def close(self) -> None:
        for label, count in self._by_reason.items():
            self._metrics.skipped_total.labels(reason=label).inc(count)
        total = sum(self._by_reason.values())
        if total > self._logged:
            log.warning(
                "%s: %d more children skipped in this refresh than logged above "
                "(%d in all: %s); `discovery status` lists every one with its reason",
                self._path,
                total - self._logged,
                total,
                ", ".join(f"{label} {count}" for label, count in sorted(self._by_reason.items())),
            )
