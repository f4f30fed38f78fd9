"""Ownership conflicts of a :class:`~discovery.zk.registration.Registration`, reported loudly.

:class:`ConflictTracker` never talks to ZooKeeper and never fails.

Design: docs/design/zookeeper.md, "Registration".
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

from discovery.errors import RegistrationConflictError
from discovery.metrics import RegistrationMetrics

__all__ = ["ConflictTracker"]

log = logging.getLogger(__name__)

# How often the error is repeated while a conflict lasts. A conflict is never waited
# out in silence: it is a duplicate --id or someone squatting ours, and either way an
# operator must act.
_CONFLICT_REMINDER: Final = 60.0


class ConflictTracker:
    """The conflicts of the registration of ``path``.

    A look-alike node that we cannot delete is taken for a stale one of ours for
    ``stale_grace`` seconds of ``clock``, and for a squatter's after that.
    ``on_blocked`` is called whenever a conflict or an undeletable look-alike is seen,
    so that the registration looks again soon.
    """

    def __init__(
        self,
        path: str,
        metrics: RegistrationMetrics,
        *,
        stale_grace: float,
        clock: Callable[[], float],
        on_blocked: Callable[[], None],
    ) -> None:
        self._path = path
        self._metrics = metrics
        self._stale_grace = stale_grace
        self._clock = clock
        self._on_blocked = on_blocked
        self._conflict: RegistrationConflictError | None = None
        self._conflict_since = 0.0
        self._last_reminder = 0.0
        # Look-alike nodes (our address and port) we could not delete: owner -> first seen.
        self._stale_since: dict[int, float] = {}

    @property
    def conflict(self) -> RegistrationConflictError | None:
        """The last ownership conflict, while it lasts."""
        return self._conflict

    @property
    def blocked(self) -> bool:
        """True while another session's node keeps ours from being created."""
        return self._conflict is not None or bool(self._stale_since)

    def report(self, conflict: RegistrationConflictError) -> None:
        """Log (at once, then every minute while it lasts), count and expose a conflict."""
        now = self._clock()
        previous = self._conflict
        if previous is None or previous.owner_session != conflict.owner_session:
            log.error("not registered: %s", conflict)
            self._metrics.conflicts.inc()
            self._conflict_since = self._last_reminder = now
        elif now - self._last_reminder >= _CONFLICT_REMINDER:
            log.error("still not registered after %.0f s: %s", now - self._conflict_since, conflict)
            self._last_reminder = now
        self._conflict = conflict
        self._metrics.conflicted.set(1)
        self._on_blocked()

    def undeletable(self, owner: int, *, past_session: bool) -> bool:
        """A look-alike node of session ``owner`` that we may not delete.

        Reported as a squatter's once it outlives ``stale_grace``, unless ``owner`` is
        a session of ours (``past_session``). Returns True the first time ``owner``
        is seen, when the caller says that it waits for the node to expire.
        """
        seen_before = owner in self._stale_since
        first = self._stale_since.setdefault(owner, self._clock())
        self._on_blocked()
        if not past_session and self._clock() - first > self._stale_grace:
            # No earlier incarnation's session lives this long: a squatter that copied
            # our address and port.
            self.report(RegistrationConflictError(self._path, owner, impersonated=True))
            return False
        return not seen_before

    def clear(self) -> None:
        """Our node is ours now: the conflict, if any, is over (and said so)."""
        if self._conflict is not None:
            log.info("%s: the conflicting node is gone", self._path)
        self.forget()

    def forget(self) -> None:
        """Drop every conflict without a word (the node is no longer wanted)."""
        self._conflict = None
        self._stale_since.clear()
        self._metrics.conflicted.set(0)
