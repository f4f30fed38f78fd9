"""A term's record of its store's failures: the streak of failed writes and its bound.

Design: docs/design/live-list.md, "Election and publishing".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

from discovery.errors import StoreError

__all__ = ["StoreOutage"]

log = logging.getLogger(__name__)


class StoreOutage:
    """Since when every write of one term has failed, and whether that is long enough
    to hand the term over.

    ``grace``: a streak that long (seconds) ends the term (None: never), so that a
    leader cut from the store alone hands over to one that may reach it; it also bounds
    each write (:meth:`deadline`). Time spent not writing at all (suspended, holding
    the term) neither ends a streak nor starts one.
    """

    def __init__(
        self,
        grace: float | None,
        *,
        leader_id: str,
        epoch: int,
        clock: Callable[[], float],
    ) -> None:
        self._grace = grace
        self._leader_id = leader_id
        self._epoch = epoch
        self._clock = clock
        self._failing_since: float | None = None  # None: the last write succeeded

    @property
    def failing(self) -> bool:
        """True while the last write failed."""
        return self._failing_since is not None

    def failed(self, started: float) -> None:
        """A write started at ``started`` (the clock's) failed."""
        # From when the failed write was started: it may have hung for a while.
        if self._failing_since is None:
            self._failing_since = started

    def clear(self) -> None:
        """A write succeeded, or the term stopped writing for another reason."""
        self._failing_since = None

    def lost(self) -> bool:
        """True once every write has failed for ``grace``: time to hand over (logged)."""
        grace, since = self._grace, self._failing_since
        if grace is None or since is None or self._clock() - since <= grace:
            return False
        log.error(
            "leader %s (epoch %d): the store has refused every write for %.1fs; resigning, "
            "so that a search server that can reach it leads",
            self._leader_id,
            self._epoch,
            self._clock() - since,
        )
        return True

    @contextlib.asynccontextmanager
    async def deadline(self) -> AsyncIterator[None]:
        """Bound one write by the store grace: a write that takes longer is as good as
        failed (readers have given us up), and it must not hold the resignation up.
        The outcome of a write cut short is unknown, as for any failed write: it
        raises :class:`~discovery.errors.StoreError`."""
        grace = self._grace
        try:
            async with asyncio.timeout(grace):
                yield
        except TimeoutError:
            raise StoreError(f"no answer from the store within {grace:g}s") from None
