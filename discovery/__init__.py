"""Service discovery for search clusters: the library data servers embed and search servers use.

Data servers embed the :class:`Agent`. Search servers elect a leader
(:class:`LeaderElection`), whose :class:`LeaderDuty` publishes the live list through a
:class:`LiveListStore` (:func:`open_store`), and route with the store's
:class:`LiveListFollower`. Every error is a :class:`DiscoveryError`.

Design: docs/ARCHITECTURE.md, "Processes and data flow".
"""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version

from discovery.agent.agent import Agent, AgentState, AgentStatus
from discovery.agent.pressure import CpuPressure, PressureReading, PsiCpuPressure, ThreadRunDelay
from discovery.agent.probes import CallableProbe, HttpProbe, Probe, SearchProbe
from discovery.config import AgentConfig, ClusterConfig, RedisConfig, ZkConfig
from discovery.errors import (
    BadRequestError,
    ConfigError,
    DiscoveryError,
    FencedError,
    InvalidInstanceError,
    MalformedLiveListError,
    OverloadedError,
    PayloadTooLargeError,
    ProbeFailed,
    RedisAccessError,
    RedisAuthError,
    RedisOperationError,
    RedisPermissionError,
    RedisUnavailableError,
    RegistrationConflictError,
    StoreAccessError,
    StoreError,
    StoreUnavailableError,
    ZkAuthError,
    ZkBadVersionError,
    ZkConnectionError,
    ZkError,
    ZkNodeExistsError,
    ZkNoNodeError,
    ZkSessionExpiredError,
    ZkUnsupportedError,
)
from discovery.instance import MAX_INSTANCE_BYTES, InstancePayload, InstanceState, ServiceInstance
from discovery.leader import LeaderDuty
from discovery.livelist.admin import LiveListAdmin, OpenedStore
from discovery.livelist.brake import MassLossBrake, MassLossBrakeConfig
from discovery.livelist.memory import MemoryLiveStore
from discovery.livelist.model import (
    LiveList,
    LiveListChange,
    LiveListFollower,
    LiveListPublisher,
    LiveListStore,
)
from discovery.livelist.open import open_store
from discovery.livelist.redis.follower import LiveListReader
from discovery.livelist.redis.publisher import LivePublisher
from discovery.livelist.redis.store import RedisLiveStore
from discovery.zk.election import LeaderElection, Leadership
from discovery.zk.membership import MembershipChange, MembershipWatcher
from discovery.zk.paths import DATA_SERVERS_PATH, SEARCH_ELECTION_PATH, SEARCH_MEMBERS_PATH
from discovery.zk.registration import Registration, Removal
from discovery.zk.session import SessionEvent, SessionState, ZkSession

try:
    # The version is written once, in pyproject.toml; the installed metadata carries it.
    __version__ = _version("search-discovery")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "DATA_SERVERS_PATH",
    "MAX_INSTANCE_BYTES",
    "SEARCH_ELECTION_PATH",
    "SEARCH_MEMBERS_PATH",
    "Agent",
    "AgentConfig",
    "AgentState",
    "AgentStatus",
    "BadRequestError",
    "CallableProbe",
    "ClusterConfig",
    "ConfigError",
    "CpuPressure",
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
    "LiveListAdmin",
    "LiveListChange",
    "LiveListFollower",
    "LiveListPublisher",
    "LiveListReader",
    "LiveListStore",
    "LivePublisher",
    "MalformedLiveListError",
    "MassLossBrake",
    "MassLossBrakeConfig",
    "MembershipChange",
    "MembershipWatcher",
    "MemoryLiveStore",
    "OpenedStore",
    "OverloadedError",
    "PayloadTooLargeError",
    "PressureReading",
    "Probe",
    "ProbeFailed",
    "PsiCpuPressure",
    "RedisAccessError",
    "RedisAuthError",
    "RedisConfig",
    "RedisLiveStore",
    "RedisOperationError",
    "RedisPermissionError",
    "RedisUnavailableError",
    "Registration",
    "RegistrationConflictError",
    "Removal",
    "SearchProbe",
    "ServiceInstance",
    "SessionEvent",
    "SessionState",
    "StoreAccessError",
    "StoreError",
    "StoreUnavailableError",
    "ThreadRunDelay",
    "ZkAuthError",
    "ZkBadVersionError",
    "ZkConfig",
    "ZkConnectionError",
    "ZkError",
    "ZkNoNodeError",
    "ZkNodeExistsError",
    "ZkSession",
    "ZkSessionExpiredError",
    "ZkUnsupportedError",
    "__version__",
    "open_store",
]
