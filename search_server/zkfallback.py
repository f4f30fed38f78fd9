"""Routing from a direct read of ``/data_servers`` while Redis is down for long.

:class:`ZkFallback` is off by default and stops as soon as the live list is current.

Design: docs/design/live-list.md, "Following the list".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Mapping

from discovery.errors import ZkError
from discovery.instance import ServiceInstance
from discovery.livelist.model import LiveListFollower
from discovery.zk.maintenance import MaintenanceWatcher, overlay
from discovery.zk.membership import MembershipWatcher
from discovery.zk.session import ZkSession

__all__ = ["ZkFallback"]

log = logging.getLogger(__name__)


class ZkFallback:
    """Route with a direct read of ``/data_servers`` while Redis is down for long.

    Off by default: every search server watching ZooKeeper is the herd the leader
    exists to avoid. When enabled, it starts only after Redis has been unreachable
    for ``after`` seconds plus a random jitter of up to half that (so that a fleet of
    search servers does not hit ZooKeeper at the same instant), and stops as soon as
    the live list is current again. It reads the members as the leader does:
    ``allow_persistent_members`` is the search server's ``--allow-persistent-members``.
    """

    def __init__(
        self,
        session: ZkSession,
        reader: LiveListFollower,
        after: float,
        *,
        allow_persistent_members: bool = False,
    ) -> None:
        self._session = session
        self._reader = reader
        self._after = after
        self._allow_persistent = allow_persistent_members
        self._watcher: MembershipWatcher | None = None
        # Operators' maintenance markers, laid over the members as the leader does:
        # a server in maintenance gets no queries while we route from ZooKeeper either.
        self._maintenance: MaintenanceWatcher | None = None
        self._task: asyncio.Task[None] | None = None
        # The last overlay and what it was made of: the same object while neither
        # changes, so the fan-out keeps its routing table.
        self._view: tuple[object, object, Mapping[str, ServiceInstance]] | None = None

    @property
    def active(self) -> bool:
        return self._watcher is not None

    @property
    def members(self) -> Mapping[str, ServiceInstance]:
        if self._watcher is None:
            return {}
        members = self._watcher.members
        markers = self._maintenance.markers if self._maintenance is not None else {}
        view = self._view
        if view is None or view[0] is not members or view[1] is not markers:
            view = self._view = (members, markers, overlay(members, markers))
        return view[2]

    async def __aenter__(self) -> ZkFallback:
        self._task = asyncio.create_task(self._run(), name="zk-fallback")
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._stop()

    async def _run(self) -> None:
        threshold = self._after * (1 + random.random() / 2)
        while True:
            outage = not self._reader.connected and self._reader.age() > threshold
            if outage and self._watcher is None:
                log.warning(
                    "Redis unreachable for %.1fs: routing with a direct ZooKeeper read",
                    self._reader.age(),
                )
                watcher = MembershipWatcher(self._session, allow_persistent=self._allow_persistent)
                maintenance = MaintenanceWatcher(self._session)
                try:
                    await maintenance.start()
                    await watcher.start()
                except ZkError as exc:
                    log.warning("ZooKeeper fallback failed to start: %s", exc)
                    await maintenance.aclose()
                    await watcher.aclose()
                else:
                    self._maintenance = maintenance
                    self._watcher = watcher
            elif self._reader.connected and self._watcher is not None:
                log.info("Redis is back: routing with the published live list again")
                await self._stop()
                threshold = self._after * (1 + random.random() / 2)
            # A check per second is plenty against an outage threshold of seconds.
            await asyncio.sleep(min(1.0, self._after / 2))

    async def _stop(self) -> None:
        watcher, self._watcher = self._watcher, None
        maintenance, self._maintenance = self._maintenance, None
        self._view = None
        if watcher is not None:
            await watcher.aclose()
        if maintenance is not None:
            await maintenance.aclose()
