"""The live list: what the leader publishes and every search server routes with.

* :mod:`~discovery.livelist.model`: :class:`LiveList` and the store protocols
  (:class:`LiveListStore`, :class:`LiveListPublisher`, :class:`LiveListFollower`), the
  seam a second backend implements; :mod:`~discovery.livelist.admin`: operators' access
  to a store (:class:`LiveListAdmin`).
* :mod:`~discovery.livelist.open`: :func:`open_store`, a store from its URL's scheme.
* :mod:`~discovery.livelist.feed` and :mod:`~discovery.livelist.held`: a follower's
  list and its changes, fanned out to many iterators (every backend's).
* :mod:`~discovery.livelist.brake`: the leader's mass-loss brake (pure, clock injected).
* :mod:`~discovery.livelist.shards`: who gets queries, shard by shard (:class:`ShardIndex`,
  :func:`route_of`), following the list's changes.
* :mod:`discovery.livelist.redis`: the default store, in Redis;
  :mod:`discovery.livelist.memory`: one in process memory, for tests and embedding.
"""

from discovery.livelist.admin import LiveListAdmin, OpenedStore
from discovery.livelist.brake import MassLossBrake, MassLossBrakeConfig
from discovery.livelist.feed import ChangeFeed
from discovery.livelist.memory import MemoryLiveStore
from discovery.livelist.model import (
    LiveList,
    LiveListChange,
    LiveListFollower,
    LiveListPublisher,
    LiveListStore,
)
from discovery.livelist.open import StoreSchemes, StoreSettings, default_schemes, open_store
from discovery.livelist.shards import Route, ShardIndex, route_of, unroutable_kind

__all__ = [
    "ChangeFeed",
    "LiveList",
    "LiveListAdmin",
    "LiveListChange",
    "LiveListFollower",
    "LiveListPublisher",
    "LiveListStore",
    "MassLossBrake",
    "MassLossBrakeConfig",
    "MemoryLiveStore",
    "OpenedStore",
    "Route",
    "ShardIndex",
    "StoreSchemes",
    "StoreSettings",
    "default_schemes",
    "open_store",
    "route_of",
    "unroutable_kind",
]
