"""Service discovery for search clusters.

The framework: the data-server :class:`Agent` (registration while healthy, health
probes, drain), a ZooKeeper session bridged into asyncio (:class:`ZkSession`), the
Curator-compatible :class:`ServiceInstance`, ephemeral :class:`Registration` of an
instance, and a :class:`MembershipWatcher` that keeps a decoded view of
``/data_servers``. Search servers use :class:`LeaderElection`, :class:`LeaderDuty`,
:class:`LivePublisher` and :class:`LiveListReader`. The applications ``data_server``
and ``search_server`` are built on it; ``discovery.devcluster`` runs a real local
ZooKeeper and Redis for development and tests. See docs/ARCHITECTURE.md.
"""

from .agent import Agent, AgentState, AgentStatus
from .brake import MassLossBrake, MassLossBrakeConfig
from .config import AgentConfig, ClusterConfig, ZkConfig
from .election import LeaderElection, Leadership
from .errors import (
    ConfigError,
    DevClusterError,
    DiscoveryError,
    FencedError,
    InvalidInstanceError,
    PayloadTooLargeError,
    RedisOperationError,
    RedisUnavailableError,
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
from .leader import LeaderDuty
from .livelist import LiveList, LiveListReader
from .membership import MembershipChange, MembershipWatcher
from .probes import CallableProbe, HttpProbe, Probe, ProbeFailed, SearchProbe
from .publisher import LivePublisher
from .registration import Registration
from .zk import SessionEvent, SessionState, ZkSession

__all__ = [
    "DATA_SERVERS_PATH",
    "MAX_INSTANCE_BYTES",
    "SEARCH_ELECTION_PATH",
    "SEARCH_MEMBERS_PATH",
    "Agent",
    "AgentConfig",
    "AgentState",
    "AgentStatus",
    "CallableProbe",
    "ClusterConfig",
    "ConfigError",
    "DevClusterError",
    "DiscoveryError",
    "FencedError",
    "HttpProbe",
    "InstancePayload",
    "InstanceState",
    "InvalidInstanceError",
    "LeaderDuty",
    "LeaderElection",
    "Leadership",
    "LiveList",
    "LiveListReader",
    "LivePublisher",
    "MassLossBrake",
    "MassLossBrakeConfig",
    "MembershipChange",
    "MembershipWatcher",
    "PayloadTooLargeError",
    "Probe",
    "ProbeFailed",
    "RedisOperationError",
    "RedisUnavailableError",
    "Registration",
    "RegistrationConflictError",
    "SearchProbe",
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
