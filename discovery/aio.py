"""Cancelling tasks that may swallow a cancellation, and logging a background task's crash.

Design: docs/design/live-list.md, "Redis clients".
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

__all__ = ["cancel_and_wait", "log_crash"]

log = logging.getLogger(__name__)


async def cancel_and_wait(tasks: Iterable[asyncio.Future[Any]], *, nudge: float = 1.0) -> None:
    """Cancel ``tasks`` and wait until every one has ended, cancelling again every
    ``nudge`` seconds those that are still running. Their results and errors are
    left to their done callbacks. If the caller itself is cancelled meanwhile, the
    tasks have all been asked to stop, and the caller's cancellation propagates.
    """
    pending = {task for task in tasks if not task.done()}
    for task in pending:
        task.cancel()
    while pending:
        _done, pending = await asyncio.wait(pending, timeout=nudge)
        for task in pending:
            name = task.get_name() if isinstance(task, asyncio.Task) else repr(task)
            log.warning("task %s ignored its cancellation; cancelling it again", name)
            task.cancel()


def log_crash(task: asyncio.Task[Any]) -> None:
    """A done callback for a background task: log its exception, if it ended with one,
    with the traceback (a task nobody awaits would otherwise fail in silence until
    the loop's garbage collection, if ever)."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("background task %s crashed", task.get_name(), exc_info=exc)
