"""What tests, the chaos run, the demo and the benchmarks build on, as ``kazoo.testing``
sits beside ``kazoo.client``: nothing here is imported by the library.

* :class:`DevCluster` runs a real ZooKeeper (standalone or an ensemble) and a real
  ``redis-server`` on free loopback ports in a scratch directory;
  :class:`ZooKeeperEnsemble`, :class:`ZooKeeperServer` and :class:`RedisServer` run them
  separately. Every server is our child process: ``stop()`` always reaps it, and a
  failed start stops whatever had started. Failures raise
  :class:`~discovery.errors.DevClusterError` with the tail of the server's log.
* :class:`RedisSentinelGroup` runs a Redis primary, replicas and Sentinels (one
  :class:`RedisSentinel` each), and forces failovers (``failover``, ``kill_primary``);
  clients use its ``redis+sentinel://`` URL. ``DevCluster(sentinels=3, redis_replicas=2)``
  uses one instead of the single Redis server.
* :class:`RedisClusterServers` forms a real Redis Cluster (``redis+cluster://`` URL).
* Expiring a ZooKeeper session on demand is in the core,
  :func:`discovery.zk.expiry.expire_session`, since the data server's loopback admin
  endpoint uses it too.
* :class:`TcpProxy` forwards one TCP link and can drop everything on it
  (``blackhole``), the way a partition does, until ``heal``.
* :mod:`discovery.testing.netns` (imported by name: it needs root) runs processes in
  network namespaces of a :class:`~discovery.testing.netns.NetworkLab` and cuts links
  between them with iptables.
* :func:`free_port` / :func:`free_ports` pick unused loopback ports.
* :mod:`discovery.testing.storecontract` (imported by name): the checks every
  live-list store must pass, with harnesses for the in-memory store and Redis.
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
