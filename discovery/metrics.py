"""Prometheus metrics of the discovery framework, on the ``CollectorRegistry`` passed in.

Names: docs/contracts.md, "Metrics".
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Enum, Gauge, Histogram

__all__ = [
    "AgentMetrics",
    "FenceMetrics",
    "LiveListMetrics",
    "MassLossBrakeMetrics",
    "MembershipMetrics",
    "PublisherMetrics",
    "RegistrationMetrics",
    "SessionMetrics",
]


class SessionMetrics:
    """ZooKeeper connection state of one :class:`~discovery.zk.session.ZkSession`."""

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
        self.watchdog_expiries = Counter(
            "discovery_zk_watchdog_expiries",
            "Sessions the client declared lost itself: no reconnection within the "
            "watchdog bound after a disconnect (see ZkSession).",
            registry=registry,
        )
        self.client_rebuilds = Counter(
            "discovery_zk_client_rebuilds",
            "kazoo clients replaced by a fresh one, by reason (watchdog, restart).",
            ["reason"],
            registry=registry,
        )
        self.abandoned_closes = Counter(
            "discovery_zk_abandoned_sessions_closed",
            "Sessions the watchdog had declared lost, closed by id once a new session "
            "was connected, by result (closed; failed: expired or unreachable).",
            ["result"],
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
        self.conflicted = Gauge(
            "discovery_registration_conflicted",
            "1 while another live session holds our instance id's znode (a duplicate "
            "--id, or squatting): we are not registered.",
            registry=registry,
        )
        self.replaced_stale = Counter(
            "discovery_registration_replaced_stale",
            "Times a znode of our own earlier session or process was replaced.",
            registry=registry,
        )
        self.vanished = Counter(
            "discovery_registration_vanished",
            "Times a periodic check found our znode gone or not ours although no event "
            "had said so (a client connected to a session the ensemble had closed).",
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
            "Children currently skipped (malformed, oversized, id mismatch, persistent, "
            "refused by --allowed-networks or --shards).",
            registry=registry,
        )
        self.skipped_total = Counter(
            "discovery_membership_skipped",
            "Child versions skipped, by reason: malformed, too_large, id_mismatch, "
            "persistent_dynamic, persistent (without --allow-persistent-members), "
            "not_allowed, shard_out_of_range.",
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
            "Health probes run, by result (ok, error, timeout, slow; busy: slow or timed "
            "out, but excused because the server's thread waiting for a CPU explains it).",
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
        self.busy_guard = Gauge(
            "discovery_agent_busy_guard",
            "1 while slow probes can be excused as busy (CPU pressure readable and "
            "--probe-busy-grace above 0), 0 otherwise.",
            registry=registry,
        )


class PublisherMetrics:
    """The leader's writes of the live list (:class:`~discovery.livelist.redis.LivePublisher`)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.publishes = Counter(
            "discovery_publisher_publishes",
            "Live-list writes, by kind (full, delta, heartbeat; diff in layout 1) and result "
            "(ok, fenced, diverged, error).",
            ["kind", "result"],
            registry=registry,
        )
        self.publish_seconds = Histogram(
            "discovery_publisher_publish_seconds",
            "Time for one fenced write to Redis (the script call, after encoding), by kind.",
            ["kind"],
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
            registry=registry,
        )
        self.epoch = Gauge(
            "discovery_publisher_epoch",
            "The epoch this publisher writes with.",
            registry=registry,
        )
        self.version = Gauge(
            "discovery_publisher_version",
            "The last version this publisher wrote successfully.",
            registry=registry,
        )
        self.snapshot_bytes = Gauge(
            "discovery_publisher_snapshot_bytes",
            "Bytes sent to Redis by the last publish (a whole snapshot in layout 1; "
            "only the changed instances of a delta in layout 2).",
            registry=registry,
        )
        self.servers = Gauge(
            "discovery_publisher_servers",
            "Data servers in the last snapshot written.",
            registry=registry,
        )


class LiveListMetrics:
    """The live list a search server routes with
    (:class:`~discovery.livelist.redis.LiveListReader`)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.age_seconds = Gauge(
            "discovery_livelist_age_seconds",
            "Seconds since the list was last confirmed current against Redis.",
            registry=registry,
        )
        self.epoch = Gauge(
            "discovery_livelist_epoch",
            "Epoch of the list in use.",
            registry=registry,
        )
        self.version = Gauge(
            "discovery_livelist_version",
            "Version of the list in use.",
            registry=registry,
        )
        self.servers = Gauge(
            "discovery_livelist_servers",
            "Data servers in the list in use (routable or not).",
            registry=registry,
        )
        self.routable = Gauge(
            "discovery_livelist_routable",
            "Routable data servers in the list in use.",
            registry=registry,
        )
        self.connected = Gauge(
            "discovery_livelist_connected",
            "1 while subscribed to the events channel, else 0.",
            registry=registry,
        )
        self.diffs_applied = Counter(
            "discovery_livelist_diffs_applied",
            "Diff events applied to the list.",
            registry=registry,
        )
        self.refetches = Counter(
            "discovery_livelist_refetches",
            "Snapshot fetches, by cause (start, gap, epoch, full, reconcile, reconnect, "
            "fence: the fence generation changed, after `discovery fence repair`).",
            ["cause"],
            registry=registry,
        )
        self.malformed = Counter(
            "discovery_livelist_malformed",
            "Malformed items skipped, by kind (meta: P:meta unreadable, the list kept; "
            "entry: a change-stream entry; server: one server of a load).",
            ["kind"],
            registry=registry,
        )
        self.stale = Counter(
            "discovery_livelist_stale_rejected",
            "Snapshots or events refused because they would move the list backwards, by kind.",
            ["kind"],
            registry=registry,
        )
        self.redis_errors = Counter(
            "discovery_livelist_redis_errors",
            "Failed Redis operations, by operation (subscribe, listen, fetch, reconcile).",
            ["operation"],
            registry=registry,
        )
        self.propagation_seconds = Histogram(
            "discovery_livelist_propagation_seconds",
            "Delay from the leader's published_at to the list being applied here "
            "(includes clock skew between the hosts).",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=registry,
        )

    def track_age(self, age: Callable[[], float]) -> None:
        """Compute the age gauge with ``age()`` on every scrape.

        On scrape, not on a timer, so the gauge keeps growing while Redis is unreachable
        and nothing in the reader runs.
        """
        self.age_seconds.set_function(age)


class HttpMetrics:
    """Requests an HTTP server of ours refused as bad input (:mod:`discovery.http`)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.rejected = Counter(
            "discovery_http_rejected",
            "Requests answered with a 4xx status, by route (the route's pattern, or "
            "'unmatched' when no route matched path and method), offending parameter "
            "('-' if none) and reason.",
            ["endpoint", "parameter", "reason"],
            registry=registry,
        )


class HttpEdgeMetrics:
    """Connections an HTTP server of ours holds, and those it closed or refused to bound
    them (:mod:`discovery.httpedge`, :mod:`discovery.httpconns`)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.closed = Counter(
            "discovery_http_slow_connections_closed",
            "Connections closed before their request's headers had arrived in full, by "
            "reason: header_timeout (slower than --header-timeout) or evicted (the longest "
            "waiting, closed for a new connection beyond --max-pending-headers).",
            ["reason"],
            registry=registry,
        )
        self.pending = Gauge(
            "discovery_http_pending_headers",
            "Connections waiting for a request's headers now (new connections included).",
            registry=registry,
        )
        self.connections = Gauge(
            "discovery_http_connections", "Connections open now.", registry=registry
        )
        self.max_connections = Gauge(
            "discovery_http_max_connections",
            "The cap on open connections (--max-connections, or derived from ulimit -n).",
            registry=registry,
        )
        self.idle_closed = Counter(
            "discovery_http_idle_connections_closed",
            "Idle kept-alive connections closed early, by reason: cap (the longest idle, "
            "for a new connection at --max-connections) or pressure (idle longer than "
            "--pressure-keepalive while over 75 % of the cap is open).",
            ["reason"],
            registry=registry,
        )
        self.refused = Counter(
            "discovery_http_connections_refused",
            "New connections answered 503 and closed at --max-connections: every other one "
            "had a request in progress.",
            registry=registry,
        )


class MassLossBrakeMetrics:
    """The leader's mass-loss brake (:class:`~discovery.livelist.brake.MassLossBrake`)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.engaged = Gauge(
            "discovery_leader_mass_loss_brake_engaged",
            "1 while the leader holds removals because many data servers vanished at once.",
            registry=registry,
        )
        self.held = Gauge(
            "discovery_leader_mass_loss_held",
            "Removals the leader holds now (vanished data servers still published).",
            registry=registry,
        )
        self.engagements = Counter(
            "discovery_leader_mass_loss_engagements",
            "Times the mass-loss brake engaged.",
            registry=registry,
        )
        self.released = Counter(
            "discovery_leader_mass_loss_released",
            "Held removals that ended, by outcome: expired (published as removed at the "
            "end of the hold) or returned (the data server came back).",
            ["outcome"],
            registry=registry,
        )


class FenceMetrics:
    """The leader's checks of a fence it was refused by (:class:`~discovery.leader.LeaderDuty`)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.poisoned = Gauge(
            "discovery_leader_fence_poisoned",
            "1 while this leader holds its term without publishing because the stored "
            "epoch is one no leader can hold (above ZooKeeper's election pzxid); "
            "`discovery fence repair` clears it.",
            registry=registry,
        )
        self.checks = Counter(
            "discovery_leader_fence_checks",
            "Checks of a stored epoch above the leader's own, by verdict: possible (a "
            "newer leader may hold it: resign), impossible (hold the term, check again "
            "later), unknown (ZooKeeper could not be asked: check again later), repaired "
            "(the fence lets us write again).",
            ["verdict"],
            registry=registry,
        )


class MaintenanceMetrics:
    """The leader's view of the operators' maintenance markers (``/maintenance``)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.markers = Gauge(
            "discovery_maintenance_markers",
            "Maintenance markers read by the leader (unreadable ones included).",
            registry=registry,
        )
        self.unreadable = Gauge(
            "discovery_maintenance_unreadable",
            "Maintenance markers that could not be decoded (applied with a reason saying so).",
            registry=registry,
        )
        self.unreadable_total = Counter(
            "discovery_maintenance_unreadable_versions",
            "Unreadable maintenance marker versions seen, by reason (each version once).",
            ["reason"],
            registry=registry,
        )
        self.resyncs = Counter(
            "discovery_maintenance_resyncs",
            "Full re-reads of /maintenance (start, reconnect, session expiry).",
            registry=registry,
        )
