"""Prometheus metrics of the discovery framework.

Each component gets its metrics object from the :class:`~prometheus_client.CollectorRegistry`
passed to it, never the global ``REGISTRY``: an embedding application decides which
registry it exposes, a fleet of simulated servers in one process keeps one registry per
server, and every test gets a fresh one.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Enum, Gauge, Histogram

__all__ = ["AgentMetrics", "MembershipMetrics", "RegistrationMetrics", "SessionMetrics"]


class SessionMetrics:
    """ZooKeeper connection state of one :class:`~discovery.zk.ZkSession`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.connected = Gauge(
            "discovery_zk_connected",
            "1 while the ZooKeeper connection is up, 0 while suspended, lost or closed.",
            registry=registry,
        )
        self.state_changes = Counter(
            "discovery_zk_state_changes",
            "ZooKeeper connection state changes, by the state entered.",
            ["state"],
            registry=registry,
        )
        self.sessions = Counter(
            "discovery_zk_sessions",
            "ZooKeeper sessions established (the first one and each one after an expiry).",
            registry=registry,
        )
        self.operation_errors = Counter(
            "discovery_zk_operation_errors",
            "ZooKeeper operations that failed, by error class.",
            ["error"],
            registry=registry,
        )


class RegistrationMetrics:
    """The ephemeral registration of one instance."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registered = Gauge(
            "discovery_registration_registered",
            "1 while our znode exists and is owned by our session.",
            registry=registry,
        )
        self.creates = Counter(
            "discovery_registration_creates",
            "Times our znode was created (first registration and re-creations).",
            registry=registry,
        )
        self.recreates = Counter(
            "discovery_registration_recreates",
            "Times our znode was created again after the first time (session expiry, deletion).",
            registry=registry,
        )
        self.conflicts = Counter(
            "discovery_registration_conflicts",
            "Times another live session owned our instance id's znode.",
            registry=registry,
        )
        self.replaced_stale = Counter(
            "discovery_registration_replaced_stale",
            "Times a znode of our own earlier session or process was replaced.",
            registry=registry,
        )


class MembershipMetrics:
    """The decoded view of a membership directory such as ``/data_servers``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.members = Gauge(
            "discovery_membership_members",
            "Valid members in the current view.",
            registry=registry,
        )
        self.invalid = Gauge(
            "discovery_membership_invalid",
            "Children currently skipped because they are malformed or oversized.",
            registry=registry,
        )
        self.skipped_total = Counter(
            "discovery_membership_skipped",
            "Malformed or oversized child versions skipped, by reason.",
            ["reason"],
            registry=registry,
        )
        self.updates = Counter(
            "discovery_membership_updates",
            "Change sets delivered to the consumer.",
            registry=registry,
        )
        self.resyncs = Counter(
            "discovery_membership_resyncs",
            "Full re-reads of the directory (start, reconnect, session expiry).",
            registry=registry,
        )
        self.refresh_seconds = Histogram(
            "discovery_membership_refresh_seconds",
            "Time to read changed children and compute one change set.",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
            registry=registry,
        )


class AgentMetrics:
    """Health probes and availability decisions of one data-server agent."""

    def __init__(self, registry: CollectorRegistry, states: list[str]) -> None:
        self.state = Enum(
            "discovery_agent_state",
            "The agent's availability state.",
            states=states,
            registry=registry,
        )
        self.probes = Counter(
            "discovery_agent_probes",
            "Health probes run, by result (ok, error, timeout, slow).",
            ["result"],
            registry=registry,
        )
        self.probe_seconds = Histogram(
            "discovery_agent_probe_seconds",
            "Health probe latency (answered probes).",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
            registry=registry,
        )
        self.forced_offline = Counter(
            "discovery_agent_forced_offline",
            "Times failing probes took the server offline, by the last failure's kind.",
            ["reason"],
            registry=registry,
        )
        self.readmissions = Counter(
            "discovery_agent_readmissions",
            "Times a server taken offline by probes was registered again.",
            registry=registry,
        )
        self.damped = Counter(
            "discovery_agent_flap_damped",
            "Times a flapping server was held offline for a cool-down.",
            registry=registry,
        )
