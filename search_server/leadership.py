"""This search server's part in the leader election (:class:`LeaderRole`): it contends,
runs the leader's duty for each term it wins, and resigns for a while when the store
refuses to let it publish."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from discovery.address import NetworkPolicy
from discovery.errors import StoreAccessError
from discovery.instance import ServiceInstance
from discovery.leader import LeaderDuty
from discovery.livelist.model import LiveListStore
from discovery.zk.election import LeaderElection, Leadership
from discovery.zk.paths import SEARCH_ELECTION_PATH
from discovery.zk.session import ZkSession

from .config import SearchServerConfig

__all__ = ["LeaderRole"]

log = logging.getLogger(__name__)


class LeaderRole:
    """Contends for leadership under ``/search_servers/election`` as ``server_id`` and
    runs ``duty`` (watch ``/data_servers``, publish the live list) for each term won.

    ``async with`` joins the election; :meth:`leave` (also on exit) leaves it for good,
    so that a successor takes over while this server still answers queries. A term
    that the store refuses ends at once and the role contends again ``retry_pause``
    seconds later (:meth:`_lead`); a failed re-join is logged, never raised: the
    server keeps reading and serving.
    """

    def __init__(
        self, session: ZkSession, duty: LeaderDuty, server_id: str, *, retry_pause: float
    ) -> None:
        self._session = session
        self._duty = duty
        self._server_id = server_id
        self._retry_pause = retry_pause
        #: The election this server takes part in now (a new one after each resignation).
        self.election: LeaderElection | None = None
        # Re-joins the election after a leader resigned because the store refused it.
        self._rejoin: asyncio.Task[None] | None = None
        #: Terms given up because the store refused the publishing credentials or ACL.
        self.refusals = 0
        self._left = False

    @classmethod
    def from_config(
        cls,
        config: SearchServerConfig,
        session: ZkSession,
        store: LiveListStore,
        server_id: str,
        *,
        registry: CollectorRegistry,
    ) -> LeaderRole:
        """The role with the leader's duty ``config`` asks for, publishing to ``store``."""
        duty = LeaderDuty(
            session,
            store,
            server_id,
            heartbeat_interval=config.heartbeat_interval,
            registry=registry,
            mass_loss=config.mass_loss,
            # Readers see the heartbeat run out after its TTL: by then a leader that
            # cannot write hands over, to a search server that perhaps can.
            store_grace=config.heartbeat_ttl,
            # Not config.data_networks: where this server listens says nothing of
            # where the others that route with the list do (each judges loopback).
            admit=_admission(config.allowed_networks),
            allow_persistent_members=config.allow_persistent_members,
            fence_recheck_max=config.fence_recheck_max,
            # A registration of a shard outside --shards is never published.
            shards=config.shards,
        )
        return cls(session, duty, server_id, retry_pause=config.leader_retry_pause)

    @property
    def is_leader(self) -> bool:
        return self.election is not None and self.election.is_leader

    @property
    def duty(self) -> LeaderDuty:
        return self._duty

    async def __aenter__(self) -> LeaderRole:
        election = self._new_election()
        await election.start()
        self.election = election
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.leave()

    async def leave(self) -> None:
        """Leave the election and never join it again. Idempotent."""
        self._left = True
        if self._rejoin is not None:
            self._rejoin.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._rejoin
        if self.election is not None:
            await self.election.aclose()

    def _new_election(self) -> LeaderElection:
        return LeaderElection(self._session, SEARCH_ELECTION_PATH, self._server_id, self._lead)

    async def _lead(self, leadership: Leadership) -> None:
        """One term of leadership; if the store refuses to let us publish, resign for a while.

        Refused credentials or a missing ACL permission do not pass by retrying, and a
        leader that kept its term would hold the election while publishing nothing. So
        the term ends at once (a search server whose credentials work can take over),
        we stay out of the election for ``leader_retry_pause`` seconds (time for an
        operator to fix the ACL, and no hot loop of winning and failing) and then
        contend again.
        """
        try:
            await self._duty(leadership)
        except StoreAccessError as exc:
            self.refusals += 1
            log.error(
                "leader %s (epoch %d): Redis refused to let it publish the live list: %s. "
                "Resigning; contending again in %g s (fix the publishing credentials, "
                "--redis-publish-username/--redis-publish-password, or the Redis ACL; "
                "a server that must not publish should run with --no-leader-eligible)",
                self._server_id,
                leadership.epoch,
                exc,
                self._retry_pause,
            )
            if self._rejoin is None or self._rejoin.done():
                self._rejoin = asyncio.create_task(
                    self._rejoin_election_later(), name=f"rejoin-election:{self._server_id}"
                )

    async def _rejoin_election_later(self) -> None:
        """Leave the election now and join it again after ``leader_retry_pause``."""
        try:
            election = self.election
            if election is not None:
                # Deletes our election node at once, so another contender leads meanwhile.
                await election.aclose()
            # A back-off between attempts, not a synchronisation: nothing signals that
            # the operator has fixed the credentials.
            await asyncio.sleep(self._retry_pause)
            if self._left:
                return
            election = self._new_election()
            await election.start()
            self.election = election
            log.info("search server %s contends for leadership again", self._server_id)
        except Exception:
            # Not fatal for the server: it keeps reading and serving, only never leads.
            log.exception("search server %s could not re-join the election", self._server_id)


def _admission(networks: NetworkPolicy) -> Callable[[ServiceInstance], str | None] | None:
    """The leader's rule for ``--allowed-networks``: an IP address outside them is skipped
    and counted as ``not_allowed`` (a name is judged where it is resolved: the fan-out)."""
    if not networks.narrows:
        return None

    def admit(instance: ServiceInstance) -> str | None:
        problem = networks.problem(instance.address)
        return None if problem is None else f"not_allowed: {problem}"

    return admit
