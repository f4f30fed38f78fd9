"""Everything the framework does in ZooKeeper, over one kazoo client per process.

* :mod:`~discovery.zk.session`: :class:`ZkSession`, one kazoo client bridged into
  asyncio (SUSPENDED and LOST told apart, kazoo errors translated to
  :class:`~discovery.errors.ZkError`).
* :mod:`~discovery.zk.watch` and :mod:`~discovery.zk.multiread`: ZooKeeper 3.6+
  protocol work kazoo lacks (persistent recursive watches, ``multiRead``).
* :mod:`~discovery.zk.registration`, :mod:`~discovery.zk.membership`,
  :mod:`~discovery.zk.election`, :mod:`~discovery.zk.maintenance`,
  :mod:`~discovery.zk.epochs` and :mod:`~discovery.zk.acl`: the recipes built on them.
* :mod:`~discovery.zk.paths`: the contract's paths.
"""

from discovery.zk.election import LeaderElection, Leadership
from discovery.zk.membership import MembershipChange, MembershipWatcher
from discovery.zk.paths import (
    DATA_SERVERS_PATH,
    MAINTENANCE_PATH,
    SEARCH_ELECTION_PATH,
    SEARCH_MEMBERS_PATH,
)
from discovery.zk.registration import Registration, Removal
from discovery.zk.session import SessionEvent, SessionState, ZkSession

__all__ = [
    "DATA_SERVERS_PATH",
    "MAINTENANCE_PATH",
    "SEARCH_ELECTION_PATH",
    "SEARCH_MEMBERS_PATH",
    "LeaderElection",
    "Leadership",
    "MembershipChange",
    "MembershipWatcher",
    "Registration",
    "Removal",
    "SessionEvent",
    "SessionState",
    "ZkSession",
]
