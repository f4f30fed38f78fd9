"""The default live-list store: Redis (one server, Sentinel or Redis Cluster).

* :mod:`~discovery.livelist.redis.layout`: the Redis contract (key names, records,
  decoders, error translation).
* :mod:`~discovery.livelist.redis.conn`: clients from the configuration, and the ACL
  rules of the two roles.
* :mod:`~discovery.livelist.redis.publisher`: the leader's fenced writes.
* :mod:`~discovery.livelist.redis.follower`: every search server's reader.
* :mod:`~discovery.livelist.redis.fence`: reading and repairing the fence.
* :mod:`~discovery.livelist.redis.store`: :class:`RedisLiveStore`, the three together.
"""

from discovery.livelist.redis.conn import make_redis
from discovery.livelist.redis.follower import LiveListReader
from discovery.livelist.redis.layout import RedisKeys
from discovery.livelist.redis.publisher import LivePublisher
from discovery.livelist.redis.store import RedisLiveStore

__all__ = ["LiveListReader", "LivePublisher", "RedisKeys", "RedisLiveStore", "make_redis"]
