"""Real ZooKeeper and Redis processes on loopback ports, for development and tests.

:class:`DevCluster` runs both; :class:`ZooKeeperEnsemble`, :class:`ZooKeeperServer` and
:class:`RedisServer` run them separately; :func:`expire_session` makes ZooKeeper expire a
live session. Every server is our child process: ``stop()`` always reaps it, and a failed
start stops whatever had started. Failures raise :class:`discovery.errors.DevClusterError`
with the tail of the server's log.
"""

from discovery.devcluster.cluster import DevCluster
from discovery.devcluster.faults import expire_session
from discovery.devcluster.ports import free_port, free_ports
from discovery.devcluster.redis import RedisServer
from discovery.devcluster.zookeeper import QuorumPeer, ZooKeeperEnsemble, ZooKeeperServer

__all__ = [
    "DevCluster",
    "QuorumPeer",
    "RedisServer",
    "ZooKeeperEnsemble",
    "ZooKeeperServer",
    "expire_session",
    "free_port",
    "free_ports",
]
