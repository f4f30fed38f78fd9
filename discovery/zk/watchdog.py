"""When to give up on a ZooKeeper connection that does not come back, and rebuild it.

Design: docs/design/zookeeper.md, "The session watchdog: a session can never hang".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any

__all__ = ["Watchdog"]

log = logging.getLogger(__name__)

# The watchdog backs off to this while ZooKeeper stays unreachable.
_MAX_DELAY = 60.0


class Watchdog:
    """Calls ``on_fire`` ``lost_after`` seconds after :meth:`arm`, unless disarmed, and
    runs ``rebuild`` in a task when told (:meth:`start_rebuild`), one at a time.

    Each rebuild without a :meth:`reset` (a connection) in between doubles the next
    delay, up to a minute, so clients are not churned every few seconds while
    ZooKeeper is unreachable. A rebuild that fails is logged; after any rebuild the
    timer is armed again while ``still_down()``. Loop-side only.
    """

    def __init__(
        self,
        lost_after: float,
        *,
        on_fire: Callable[[], None],
        rebuild: Callable[[], Coroutine[Any, Any, None]],
        still_down: Callable[[], bool],
    ) -> None:
        self._lost_after = lost_after
        self._on_fire = on_fire
        self._rebuild = rebuild
        self._still_down = still_down
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None
        self._rebuilds_in_a_row = 0

    @property
    def rebuilding(self) -> bool:
        """A rebuild is under way."""
        return self._task is not None and not self._task.done()

    def arm(self) -> None:
        """Start the timer, unless it is running already."""
        if self._timer is not None:
            return
        delay = min(self._lost_after * 2**self._rebuilds_in_a_row, _MAX_DELAY)
        delay = max(delay, self._lost_after)
        self._timer = asyncio.get_running_loop().call_later(delay, self._fire)

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def reset(self) -> None:
        """Connected: disarm, and the next rebuild waits ``lost_after`` again."""
        self.disarm()
        self._rebuilds_in_a_row = 0

    def start_rebuild(self, name: str) -> None:
        """Run ``rebuild()`` in a task named ``name`` (the caller checks :attr:`rebuilding`)."""
        self._rebuilds_in_a_row += 1
        self._task = asyncio.create_task(self._rebuild(), name=name)
        self._task.add_done_callback(self._on_rebuild_done)

    async def aclose(self) -> None:
        """Disarm and cancel a rebuild under way (waiting for it to end)."""
        self.disarm()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def _fire(self) -> None:
        self._timer = None
        self._on_fire()

    def _on_rebuild_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("replacing the ZooKeeper client failed", exc_info=task.exception())
        # Still not connected (or the rebuild failed): try again later, backed off.
        if self._still_down():
            self.arm()
