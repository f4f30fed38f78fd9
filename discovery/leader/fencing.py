"""What a term does when the fence refuses a write: resign, or hold the term.

Design: docs/design/live-list.md, "Election and publishing" (a poisoned fence).
"""

from __future__ import annotations

import asyncio
import logging
import posixpath
from collections.abc import Callable
from dataclasses import dataclass

from discovery.errors import FencedError, StoreError, ZkError
from discovery.leader.lease import Lease
from discovery.leader.outage import StoreOutage
from discovery.livelist.model import LiveListPublisher, LiveListStore
from discovery.metrics import FenceMetrics
from discovery.zk.election import Leadership
from discovery.zk.epochs import EpochVerdict, FenceCheck, check_epoch
from discovery.zk.session import ZkSession

__all__ = ["FenceGuard", "FenceHold"]

log = logging.getLogger(__name__)

# What an operator runs, named in the leader's error.
_REPAIR_COMMAND = (
    "`discovery fence check`, then `discovery fence repair` (with this server's --zk, "
    "--redis and --cluster)"
)


@dataclass(frozen=True)
class FenceHold:
    """A term held without writing: the fence refused us with an epoch that no leader
    can hold (or ZooKeeper could not be asked whether one can)."""

    check: FenceCheck | None  # None: ZooKeeper could not be asked
    delay: float  # until the next try of the fence, doubling
    next_at: float  # the term's clock


class FenceGuard:
    """One term's answer to a refusal of the fence (:meth:`refused`).

    A newer leader may hold the stored epoch: resign (the refusal is raised). No
    leader can hold it (above the election directory's pzxid, read after a ``sync``),
    or ZooKeeper cannot say: hold the term without writing, and try the fence again
    (:meth:`retry`) after ``heartbeat_interval``, doubling up to ``recheck_max``.
    Never an automatic override: only an operator resets the fence.
    """

    def __init__(
        self,
        session: ZkSession,
        store: LiveListStore,
        leadership: Leadership,
        *,
        leader_id: str,
        heartbeat_interval: float,
        recheck_max: float,
        lease: Lease,
        outage: StoreOutage,
        metrics: FenceMetrics,
        clock: Callable[[], float],
    ) -> None:
        self._session = session
        self._store = store
        self._leadership = leadership
        self._leader_id = leader_id
        self._heartbeat_interval = heartbeat_interval
        self._recheck_max = recheck_max
        self._lease = lease
        self._outage = outage
        self._metrics = metrics
        self._clock = clock
        self._hold: FenceHold | None = None  # set while we hold the term

    @property
    def holding(self) -> bool:
        """True while the term is held: it writes nothing until :meth:`retry` passes."""
        return self._hold is not None

    @property
    def poisoned(self) -> bool:
        """True while held over an epoch no leader can hold."""
        hold = self._hold
        return (
            hold is not None
            and hold.check is not None
            and hold.check.verdict is EpochVerdict.IMPOSSIBLE
        )

    async def refused(self, exc: FencedError) -> None:
        """A write was refused: resign (raise ``exc``) unless the stored epoch is one no
        leader can hold, or ZooKeeper cannot say; then hold the term without writing."""
        term, metrics = self._leadership, self._metrics
        check: FenceCheck | None = None
        if exc.reason == "epoch" and exc.stored_epoch > term.epoch:
            try:
                # Bounded by the lease: an answer later than that proves nothing anyway.
                async with asyncio.timeout(self._lease.duration):
                    check = await check_epoch(
                        self._session, exc.stored_epoch, term.epoch, posixpath.dirname(term.node)
                    )
            except (ZkError, TimeoutError) as error:
                log.warning(
                    "leader %s (epoch %d): fenced off by epoch %d, and ZooKeeper could not "
                    "say whether a leader can hold it (%s); holding the term without "
                    "writing, asking again later",
                    self._leader_id,
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
            self._leader_id,
            term.epoch,
            exc,
        )
        raise exc

    def _hold_term(self, check: FenceCheck | None) -> None:
        """Stop writing and try the fence again later (doubling the pause)."""
        hold = self._hold
        now = self._clock()
        delay = self._heartbeat_interval if hold is None else min(self._recheck_max, hold.delay * 2)
        first = hold is None or hold.check is None
        if check is None and hold is not None:
            check = hold.check  # ZooKeeper did not answer: the last verdict stands
        self._hold = FenceHold(check, delay, now + delay)
        # Not a store outage: a term that holds must not resign for "failing" writes.
        self._outage.clear()
        if check is None or check.verdict is not EpochVerdict.IMPOSSIBLE:
            return
        self._metrics.poisoned.set(1)
        if first:
            log.error(
                "leader %s (epoch %d): the live list's fence holds epoch %d, which no leader "
                "can hold (ZooKeeper's election directory has issued epochs up to %d): it "
                "was written by hand, or Redis holds another cluster's list or one from "
                "before ZooKeeper was rebuilt. Keeping the term without publishing (search "
                "servers route with the list they hold), trying the fence again in %.1f s. "
                "To repair: %s",
                self._leader_id,
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
                self._leader_id,
                self._leadership.epoch,
                check.stored,
                check.highest,
                delay,
                _REPAIR_COMMAND,
            )

    async def retry(self) -> LiveListPublisher | None:
        """While holding: when due, try the fence with a fresh publisher's heartbeat
        (the refused one refuses every call). Returns that publisher once the fence
        lets it write (the hold is over: publish in full through it), else None."""
        hold = self._hold
        assert hold is not None
        if self._clock() < hold.next_at or not self._lease.valid():
            return None
        publisher = self._store.publisher(leader_id=self._leader_id, epoch=self._leadership.epoch)
        try:
            async with self._outage.deadline():
                await publisher.heartbeat()
        except FencedError as exc:
            await self.refused(exc)  # resigns if a leader may hold the epoch by now
            return None
        except StoreError as exc:
            log.debug("leader: trying the fence failed: %s", exc)
            self._hold_term(None)
            return None
        self._metrics.checks.labels(verdict="repaired").inc()
        self._metrics.poisoned.set(0)
        log.warning(
            "leader %s (epoch %d): the fence lets us write again (repaired); publishing the "
            "whole list",
            self._leader_id,
            self._leadership.epoch,
        )
        self._hold = None
        return publisher
