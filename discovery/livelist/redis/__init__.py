"""The default live-list store: Redis (one server, Sentinel or Redis Cluster).

Design: docs/design/live-list.md, "The live-list store"; keys: docs/contracts.md, "Redis".
"""

from discovery.livelist.redis.conn import make_redis
from discovery.livelist.redis.follower import LiveListReader
from discovery.livelist.redis.layout import RedisKeys
from discovery.livelist.redis.publisher import LivePublisher
from discovery.livelist.redis.store import RedisLiveStore

__all__ = ["LiveListReader", "LivePublisher", "RedisKeys", "RedisLiveStore", "make_redis"]
