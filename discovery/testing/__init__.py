"""Real ZooKeeper and Redis servers for tests, the demo, the chaos run and development.

Beside the library as ``kazoo.testing`` is beside ``kazoo.client``: the library never
imports it. Every server is a child process that ``stop()`` always reaps; a failed start
raises :class:`~discovery.errors.DevClusterError` with the tail of the server's log.

Development: docs/development.md, "The development cluster".
"""

from .cluster import DevCluster
from .ports import free_port, free_ports
from .proxy import TcpProxy
from .redis import RedisServer
from .rediscluster import RedisClusterServers
from .sentinel import RedisSentinel, RedisSentinelGroup
from .zookeeper import QuorumPeer, ZooKeeperEnsemble, ZooKeeperServer

__all__ = [
    "DevCluster",
    "QuorumPeer",
    "RedisClusterServers",
    "RedisSentinel",
    "RedisSentinelGroup",
    "RedisServer",
    "TcpProxy",
    "ZooKeeperEnsemble",
    "ZooKeeperServer",
    "free_port",
    "free_ports",
]
