"""Everything the framework does in ZooKeeper, over one kazoo client per process.

The recipes (registration, membership, election, maintenance, epochs, acl) are built on
one :class:`~discovery.zk.session.ZkSession`, which bridges kazoo's threads to asyncio.

Design: docs/design/zookeeper.md.
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
