"""This search server's place among its peers (:class:`Peers`), from ``/search_servers/members``.

The subset position and adaptive selection's count of clients; a failed read keeps the last.

Design: docs/design/search-server.md, "Subsets".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random

from discovery.aio import cancel_and_wait, log_crash
from discovery.errors import DiscoveryError
from discovery.zk.paths import SEARCH_MEMBERS_PATH
from discovery.zk.session import WatchEvent, ZkSession

from .fanout import FanOut
from .picking import AdaptiveReplicaSelection
from .subsetting import Position

__all__ = ["Peers"]

log = logging.getLogger(__name__)


class Peers:
    """Keeps the fan-out's place among the search servers: its :attr:`~search_server.
    fanout.FanOut.position` (which its subsets follow) and adaptive replica selection's
    ``clients`` (C3's concurrency compensation multiplies this server's requests in
    flight to a replica by the number of search servers sending to it).

    Lists the names under ``/search_servers/members`` (one ``get_children``, not the
    members' data) with a child watch, and again whenever it fires, so subsets follow
    a search server joining or leaving within a round trip; and every ``interval``
    seconds (give or take a tenth, so a fleet does not read at one instant) in case a
    watch was lost with a connection. A failed read keeps the last position: subsets a
    little off only spread load a little unevenly until the next read.
    """

    def __init__(
        self, session: ZkSession, own: str, fanout: FanOut, interval: float = 10.0
    ) -> None:
        self._session = session
        self._own = own
        self._fanout = fanout
        self._interval = interval
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Peers:
        self._task = asyncio.create_task(self._run(), name="search-peers")
        self._task.add_done_callback(log_crash)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])

    def _on_change(self, event: WatchEvent) -> None:
        # One bound method for every read: the session's watchers are equal when their
        # callbacks are, so a watch armed again before it fired is not armed twice.
        self._changed.set()

    async def _run(self) -> None:
        while True:
            self._changed.clear()
            try:
                members = await self._session.get_children(
                    SEARCH_MEMBERS_PATH, watch=self._on_change
                )
            except DiscoveryError as exc:
                log.debug("cannot list the search servers (keeping the last count): %s", exc)
            else:
                self._follow(members)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._changed.wait(), self._interval * random.uniform(0.9, 1.1)
                )

    def _follow(self, members: list[str]) -> None:
        position = Position.among(self._own, members)
        if position != self._fanout.position:
            log.info(
                "search server %s is %d of %d search servers: its subsets follow",
                self._own,
                position.rank + 1,
                position.count,
            )
            self._fanout.set_position(position)
        picker = self._fanout.picker
        if isinstance(picker, AdaptiveReplicaSelection):
            picker.clients = position.count
