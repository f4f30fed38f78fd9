"""A term's lease: it writes only while ZooKeeper recently showed its election node ours.

Design: docs/design/live-list.md, "Election and publishing".
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from discovery.errors import ZkError
from discovery.zk.election import Leadership
from discovery.zk.session import ZkSession

__all__ = ["Lease"]

log = logging.getLogger(__name__)


class Lease:
    """The right of one term to write: connected in the session that won the term, and
    within half a session timeout of the last answer that showed our election node ours
    (winning counts as the first).

    :meth:`keep` reads the node back three times per lease for as long as the term
    lasts. A read that fails or is late proves nothing (the lease then lapses, and
    the session events decide); a node found gone or not ours deposes the term for
    good (``on_deposed``). An answer after a lapse calls ``on_resumed``: what was
    skipped meanwhile must be published in full.
    """

    def __init__(
        self,
        session: ZkSession,
        leadership: Leadership,
        *,
        leader_id: str,
        clock: Callable[[], float],
        on_resumed: Callable[[], None],
        on_deposed: Callable[[], None],
    ) -> None:
        self._session = session
        self._leadership = leadership
        self._leader_id = leader_id
        self._clock = clock
        self._on_resumed = on_resumed
        self._on_deposed = on_deposed
        self._duration = session.session_timeout / 2
        self._confirmed_at = clock()
        self._deposed = False

    @property
    def duration(self) -> float:
        """Seconds a confirmation lasts (half the session timeout)."""
        return self._duration

    @property
    def deposed(self) -> bool:
        """True once our election node was found gone or not ours: never writes again."""
        return self._deposed

    def valid(self) -> bool:
        """Whether the term may write now (never once deposed)."""
        # Never write unless connected in the session that won this term, and recently
        # confirmed by ZooKeeper: kazoo notices a dead link only after up to 2/3 of the
        # session timeout (plus a ping's jitter), too close to the server's own expiry
        # to rely on; the lease stops us at half of it, whatever kazoo believes.
        return (
            not self._deposed
            and self._in_term_session()
            and self._clock() - self._confirmed_at < self._duration
        )

    def _in_term_session(self) -> bool:
        session = self._session
        return session.connected and session.session_id == self._leadership.session_id

    async def keep(self) -> None:
        """Read our election node back three times per lease, for as long as the term
        lasts; the first answer that shows it gone deposes us."""
        period = self._duration / 3
        while True:
            if not await self._still_elected(period):
                self._deposed = True
                self._on_deposed()
                return
            # The period of a renewal, not a wait for an event: the term cancels us.
            await asyncio.sleep(period)

    async def _still_elected(self, timeout: float) -> bool:
        """False once our election node is gone or owned by another session.

        A read that fails or takes longer than ``timeout`` (a dropped connection, a
        loaded ensemble) proves nothing: the session events decide then, and the lease
        is not renewed.
        """
        if not self._in_term_session():
            return True
        term = self._leadership
        asked = self._clock()
        try:
            async with asyncio.timeout(timeout):
                stat = await self._session.exists(term.node)
        except (ZkError, TimeoutError) as exc:
            log.debug("leader: checking the election node deferred: %r", exc)
            return True
        if stat is not None and stat.ephemeral_owner == term.session_id:
            if self._clock() - self._confirmed_at >= self._duration:
                log.warning(
                    "leader %s (epoch %d): ZooKeeper answers again; publishing resumes",
                    self._leader_id,
                    term.epoch,
                )
                self._on_resumed()  # what was skipped meanwhile: a full snapshot
            # The answer proves the node was ours when we asked, not when it came.
            self._confirmed_at = asked
            return True
        log.error(
            "leader %s (epoch %d): election node %s is gone although our session 0x%x "
            "looks connected; resigning",
            self._leader_id,
            term.epoch,
            term.node,
            term.session_id,
        )
        return False
