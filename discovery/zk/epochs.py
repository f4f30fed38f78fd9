"""Which fencing epochs a leader can hold: the bound ZooKeeper sets on them.

Every epoch a leader has held or holds (its election node's czxid) is at most the
election directory's pzxid, read after a ``sync``: a stored epoch above it was written
by no leader. Reading the bound needs no right beyond reading the election directory.

Design: docs/design/live-list.md, "Election and publishing" (a poisoned fence).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from discovery.zk.paths import SEARCH_ELECTION_PATH
from discovery.zk.session import ZkSession

__all__ = ["EpochVerdict", "FenceCheck", "check_epoch", "highest_possible_epoch"]


class EpochVerdict(StrEnum):
    """What a stored epoch is, against a leader's own and ZooKeeper's bound."""

    OURS_OR_OLDER = "ok"
    """At most the given leader's epoch: the fence lets that leader write."""
    POSSIBLE = "possible"
    """Above the leader's epoch but within ZooKeeper's bound: a newer leader may hold
    it (the given one was deposed), or the epoch is garbage that the next leaders'
    epochs, each a fresh zxid, overtake as they rotate."""
    IMPOSSIBLE = "impossible"
    """Above every epoch ZooKeeper can have issued: no leader wrote it."""


@dataclass(frozen=True)
class FenceCheck:
    """A stored epoch judged against ``leader_epoch`` (0: no leader) and ``highest``,
    the highest epoch a leader can hold now (:func:`highest_possible_epoch`)."""

    stored: int
    leader_epoch: int
    highest: int

    @property
    def verdict(self) -> EpochVerdict:
        if self.stored <= self.leader_epoch:
            return EpochVerdict.OURS_OR_OLDER
        if self.stored <= self.highest:
            return EpochVerdict.POSSIBLE
        return EpochVerdict.IMPOSSIBLE


async def highest_possible_epoch(
    session: ZkSession, election_path: str = SEARCH_ELECTION_PATH
) -> int:
    """The highest epoch any leader can hold now: the election directory's pzxid after
    a ``sync`` (0 if the directory does not exist: no leader was ever elected there).

    Raises:
        ZkError: ZooKeeper could not be asked (then nothing can be concluded).
    """
    await session.sync(election_path)
    stat = await session.exists(election_path)
    return 0 if stat is None else stat.pzxid


async def check_epoch(
    session: ZkSession,
    stored: int,
    leader_epoch: int,
    election_path: str = SEARCH_ELECTION_PATH,
) -> FenceCheck:
    """Judge ``stored`` against ``leader_epoch`` and ZooKeeper's bound, read now.

    Raises:
        ZkError: ZooKeeper could not be asked.
    """
    return FenceCheck(stored, leader_epoch, await highest_possible_epoch(session, election_path))
