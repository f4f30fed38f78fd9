"""The live list: what the leader publishes and every search server routes with.

The model and the store protocols, :func:`open_store`, the in-memory and Redis stores,
the follower's feed, the mass-loss brake and the shard index; each module is listed in
docs/design/modules.md.
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
