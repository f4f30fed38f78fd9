"""The parts a search server builds once it listens (:class:`ServerParts`).

Set by :class:`~search_server.server.SearchServer` as start-up builds them; the HTTP
handlers and the cluster status answer "starting" while one is missing.

Design: docs/design/search-server.md, "The search server".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from discovery.instance import ServiceInstance
from discovery.livelist.model import LiveList, LiveListFollower

from .fanout import FanOut
from .followroutes import FollowRoutes
from .leadership import LeaderRole
from .zkfallback import ZkFallback

__all__ = ["ServerParts"]


@dataclass(eq=False, slots=True)
class ServerParts:
    """One search server's parts; each None until start-up has built it."""

    #: The id in ZooKeeper and in ``/cluster`` (it defaults to one naming the real port).
    server_id: str
    reader: LiveListFollower | None = None
    fanout: FanOut | None = None
    routes: FollowRoutes | None = None
    fallback: ZkFallback | None = None
    #: None on a server that is not leader-eligible.
    leader: LeaderRole | None = None
    #: Shutting down: ``/readyz`` fails from the first moment.
    draining: bool = False

    @property
    def routed(self) -> LiveList:
        """The live list the fan-out's routing table has followed last (empty before
        the first): a change is routed with once it shows here."""
        return self.routes.current if self.routes is not None else LiveList.EMPTY

    @property
    def is_leader(self) -> bool:
        return self.leader is not None and self.leader.is_leader

    def routing_list(self) -> Mapping[str, ServiceInstance] | None:
        """The servers to route with: the live list, or the ZooKeeper fallback's view.

        The same (immutable) mapping until the list changes, so that the fan-out keeps
        its routing table between queries: the list the table was moved to change by
        change (:class:`~search_server.followroutes.FollowRoutes`), or else (for the
        moment before it has one) the follower's, for which the fan-out builds its
        table in full.
        """
        if self.fallback is not None and self.fallback.active:
            return self.fallback.members
        if self.routes is not None and self.routes.current.version > 0:
            return self.routes.current.servers
        if self.reader is None or self.reader.current.version == 0:
            return None
        return self.reader.current.servers
