"""Service discovery for search clusters.

The framework: a ZooKeeper session bridged into asyncio (:class:`ZkSession`), the
Curator-compatible :class:`ServiceInstance`, ephemeral :class:`Registration` of an
instance, and a :class:`MembershipWatcher` that keeps a decoded view of
``/data_servers``. The applications ``data_server`` and ``search_server`` are built on
it; ``discovery.devcluster`` runs a real local ZooKeeper and Redis for development
and tests. See docs/ARCHITECTURE.md.
"""

from .config import ClusterConfig, ZkConfig
from .errors import (
    ConfigError,
    DevClusterError,
    DiscoveryError,
    InvalidInstanceError,
    PayloadTooLargeError,
    RegistrationConflictError,
    ZkAuthError,
    ZkBadVersionError,
    ZkConnectionError,
    ZkError,
    ZkNodeExistsError,
    ZkNoNodeError,
    ZkSessionExpiredError,
)
from .instance import MAX_INSTANCE_BYTES, InstancePayload, InstanceState, ServiceInstance
from .layout import DATA_SERVERS_PATH, SEARCH_ELECTION_PATH, SEARCH_MEMBERS_PATH
from .membership import MembershipChange, MembershipWatcher
from .registration import Registration
from .zk import SessionEvent, SessionState, ZkSession

__all__ = [
    "DATA_SERVERS_PATH",
    "MAX_INSTANCE_BYTES",
    "SEARCH_ELECTION_PATH",
    "SEARCH_MEMBERS_PATH",
    "ClusterConfig",
    "ConfigError",
    "DevClusterError",
    "DiscoveryError",
    "InstancePayload",
    "InstanceState",
    "InvalidInstanceError",
    "MembershipChange",
    "MembershipWatcher",
    "PayloadTooLargeError",
    "Registration",
    "RegistrationConflictError",
    "ServiceInstance",
    "SessionEvent",
    "SessionState",
    "ZkAuthError",
    "ZkBadVersionError",
    "ZkConfig",
    "ZkConnectionError",
    "ZkError",
    "ZkNoNodeError",
    "ZkNodeExistsError",
    "ZkSession",
    "ZkSessionExpiredError",
]
