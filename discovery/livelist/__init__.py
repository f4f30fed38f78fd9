"""The live list: what the leader publishes and every search server routes with.

* :mod:`~discovery.livelist.model`: :class:`LiveList` and the store protocols
  (:class:`LiveListStore`, :class:`LiveListPublisher`, :class:`LiveListFollower`), the
  seam a second backend implements.
* :mod:`~discovery.livelist.feed`: a follower's changes fanned out to many iterators.
* :mod:`~discovery.livelist.brake`: the leader's mass-loss brake (pure, clock injected).
* :mod:`~discovery.livelist.shards`: who gets queries, shard by shard (:class:`ShardIndex`,
  :func:`route_of`), following the list's changes.
* :mod:`discovery.livelist.redis`: the default store, in Redis.
"""

from discovery.livelist.brake import MassLossBrake, MassLossBrakeConfig
from discovery.livelist.feed import ChangeFeed
from discovery.livelist.model import (
    LiveList,
    LiveListChange,
    LiveListFollower,
    LiveListPublisher,
    LiveListStore,
)
from discovery.livelist.shards import Route, ShardIndex, route_of, unroutable_kind

__all__ = [
    "ChangeFeed",
    "LiveList",
    "LiveListChange",
    "LiveListFollower",
    "LiveListPublisher",
    "LiveListStore",
    "MassLossBrake",
    "MassLossBrakeConfig",
    "Route",
    "ShardIndex",
    "route_of",
    "unroutable_kind",
]
