"""Settings of a search server, built once from flags and the environment."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from discovery import __version__
from discovery.address import NetworkPolicy, is_loopback_host
from discovery.cli.options import (
    COMMON_OPTIONS,
    HTTP_EDGE_OPTIONS,
    MEMBER_OPTIONS,
    RUNTIME_OPTIONS,
    ZK_OPTIONS,
    ZONE_RULE,
    Option,
    add_options,
    advertised_address,
    checked_address,
    checked_id,
    checked_setting,
    cluster_config,
    env_flag,
    http_edge_config,
    int_range,
    listen_options,
    network_list,
    non_negative_int,
    positive_float,
    positive_int,
    zk_config,
    zone_name,
)
from discovery.config import ClusterConfig, HttpEdgeConfig, ZkConfig
from discovery.errors import ConfigError
from discovery.instance import validate_zone
from discovery.livelist.brake import MassLossBrakeConfig

from .admission import ConcurrencyLimit, FixedLimit, GradientLimit
from .coverage import MAX_ADAPTIVE_WAIT, CoveragePolicy
from .demotion import DEMOTE_FLOOR, DEMOTE_PROBE_INTERVAL, DEMOTE_RATIO
from .expectedshards import FORGET_MISSING_SHARD_AFTER
from .httpclient import DEFAULT_MAX_BODY
from .querydeath import QueryOfDeathConfig
from .queryshare import QueryShare
from .slowstart import SlowStart
from .topk import TOPK_PROBABILITY
from .wrr import WrrConfig

# Most shards --shards may name: every one is a sub-request of every query.
_MAX_SHARDS = 100_000
# Most extra sub-requests a second the retry budget's steady part may allow: its burst
# holds at least ten seconds of it, and more than this would be no budget at all.
_MAX_RETRY_RATE = 10_000.0

__all__ = ["SearchServerConfig", "build_parser"]


def _fraction(text: str) -> float:
    value = _non_negative_float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be > 0 and <= 1, got {text!r}")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}")
    return value


def _demote_ratio(text: str) -> float:
    value = _non_negative_float(text)
    if not (value == 0 or value > 1):
        raise argparse.ArgumentTypeError(f"must be 0 (off) or above 1, got {text!r}")
    return value


def _picker(text: str) -> str:
    value = text.strip().lower()
    if value not in PICKERS:
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(PICKERS)}, got {text!r}")
    return value


def _admission(text: str) -> str:
    value = text.strip().lower()
    if value not in ADMISSIONS:
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(ADMISSIONS)}, got {text!r}")
    return value


def _coverage_percent(text: str) -> float:
    value = _percent(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 and <= 100, got {text!r}")
    return value


def _share(text: str) -> float:
    value = _non_negative_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be in 0..1, got {text!r}")
    return value


def _wait_factor(text: str) -> float:
    value = _non_negative_float(text)
    if value > MAX_ADAPTIVE_WAIT:
        raise argparse.ArgumentTypeError(f"must be in 0..{MAX_ADAPTIVE_WAIT:g}, got {text!r}")
    return value


def _percent(text: str) -> float:
    value = _non_negative_float(text)
    if value > 100:
        raise argparse.ArgumentTypeError(f"must be in 0..100, got {text!r}")
    return value


#: The replica pickers ``--picker`` names.
PICKERS = ("ars", "p2c", "wrr")
#: Values of ``--admission``.
ADMISSIONS = ("gradient", "fixed")

SEARCH_OPTIONS = (
    *listen_options(8080, "ss"),
    Option(
        "--zone",
        "DISCOVERY_ZONE",
        "this search server's zone: it prefers data servers registered with the same "
        f"zone and spills over to other zones when a shard has no healthy replica in it "
        f"({ZONE_RULE}; unset: no preference)",
        type=zone_name,
        metavar="ZONE",
    ),
    Option(
        "--allowed-networks",
        "DISCOVERY_ALLOWED_NETWORKS",
        "CIDR,... : the only networks data servers may be at; the leader skips (and "
        "counts) registrations with an IP address outside them, and this server sends no "
        "query to one, nor to a name that resolves outside them (unset: any address "
        "except link-local, multicast and unspecified ones, which are always refused, "
        "and loopback ones unless --host is a loopback address; a loopback network "
        "listed here admits those whatever --host)",
        type=network_list,
        metavar="CIDRS",
    ),
    Option(
        "--timeout-ms",
        "DISCOVERY_QUERY_TIMEOUT_MS",
        "default per-query deadline when a query gives no timeout_ms",
        type=int_range(1, 60_000),
        default=500,
        metavar="MS",
    ),
    Option(
        "--max-timeout-ms",
        "DISCOVERY_MAX_QUERY_TIMEOUT_MS",
        "largest timeout_ms a query may ask for",
        type=int_range(1, 600_000),
        default=10_000,
        metavar="MS",
    ),
    # The coverage policy (search_server/coverage.py).
    Option(
        "--min-coverage",
        "DISCOVERY_MIN_COVERAGE",
        "percent of the corpus's documents a query accepts: once that much has answered, "
        "it stops waiting for the rest by --soft-timeout or --adaptive-wait, whichever "
        "comes first (100: every shard is waited for until the deadline; a query may "
        "ask for its own with min_coverage)",
        type=_coverage_percent,
        default=100.0,
        metavar="PERCENT",
    ),
    Option(
        "--soft-timeout",
        "DISCOVERY_SOFT_TIMEOUT",
        "share of a query's deadline (0..1) after which, its --min-coverage reached, it "
        "stops waiting for the rest (0: off)",
        type=_share,
        default=0.0,
        metavar="SHARE",
    ),
    Option(
        "--adaptive-wait",
        "DISCOVERY_ADAPTIVE_WAIT",
        "once --min-coverage is reached t after a query started, how many times t it "
        f"waits for the rest (0..{MAX_ADAPTIVE_WAIT:g}; 0: off)",
        type=_wait_factor,
        default=1.0,
        metavar="FACTOR",
    ),
    Option(
        "--max-in-flight",
        "DISCOVERY_MAX_IN_FLIGHT",
        "most queries fanned out at once (the adaptive limit's ceiling, or the limit "
        "itself with --admission fixed); more are refused with 503 instead of queued",
        type=positive_int,
        default=256,
    ),
    Option(
        "--admission",
        "DISCOVERY_ADMISSION",
        "how many queries are admitted at once: gradient (a limit that follows latency: "
        "past the knee the excess is refused at once with 503 and the admitted queries "
        "keep inside their deadline) or fixed (--max-in-flight)",
        type=_admission,
        default="gradient",
    ),
    Option(
        "--admission-min-limit",
        "DISCOVERY_ADMISSION_MIN_LIMIT",
        "the least the gradient limit falls to (queries in flight always admitted)",
        type=positive_int,
        default=1,
    ),
    Option(
        "--admission-initial-limit",
        "DISCOVERY_ADMISSION_INITIAL_LIMIT",
        "the gradient limit at start, and where it returns to once the load is light "
        "(at least --admission-min-limit; --max-in-flight caps both)",
        type=positive_int,
        default=10,
    ),
    Option(
        "--admission-tolerance",
        "DISCOVERY_ADMISSION_TOLERANCE",
        "how many times its usual latency a query may take before the gradient limit "
        "comes down (nor, whatever the usual, above two fifths of --timeout-ms)",
        type=positive_float,
        default=2.0,
    ),
    Option(
        "--admission-query-share",
        "DISCOVERY_ADMISSION_QUERY_SHARE",
        "percent of the in-flight limit one query (by its normalised terms) may hold while "
        "other queries are asking; its excess is refused with 503 (100 disables: a storm "
        "of one query may then take the whole limit)",
        type=int_range(1, 100),
        default=50,
        metavar="PERCENT",
    ),
    Option(
        "--eject-after",
        "DISCOVERY_EJECT_AFTER",
        "consecutive failures or timeouts after which a data server is skipped locally",
        type=positive_int,
        default=3,
    ),
    Option(
        "--eject-cooldown",
        "DISCOVERY_EJECT_COOLDOWN",
        "seconds a locally ejected data server is skipped",
        type=positive_float,
        default=10.0,
        metavar="SECONDS",
    ),
    Option(
        "--max-ejected-percent",
        "DISCOVERY_MAX_EJECTED_PERCENT",
        "most data servers (in percent, at least one) ejected locally at once",
        type=int_range(0, 100),
        default=50,
    ),
    Option(
        "--panic-threshold",
        "DISCOVERY_PANIC_THRESHOLD",
        "percent of a shard's replicas (of two or more) that must be left un-ejected for "
        "its routing to heed ejections; below it the shard routes to all of them (panic: "
        "many ejected at once is more likely load than broken servers; 0 disables)",
        type=int_range(0, 100),
        default=50,
        metavar="PERCENT",
    ),
    Option(
        "--demote-ratio",
        "DISCOVERY_DEMOTE_RATIO",
        "latency outlier demotion: a data server whose response times, each over that of "
        "the same query's other shards, average more than this many times its shard's "
        "typical replica's gets no request while its peers serve, but a probe now and "
        "then; no failure, no ejection (0: off)",
        type=_demote_ratio,
        default=DEMOTE_RATIO,
        metavar="RATIO",
    ),
    Option(
        "--demote-floor-ms",
        "DISCOVERY_DEMOTE_FLOOR_MS",
        "latency outlier demotion: a data server is demoted only when its response-time "
        "average is also this much above its shard's typical replica's",
        type=_non_negative_float,
        default=DEMOTE_FLOOR * 1000,
        metavar="MS",
    ),
    Option(
        "--demote-probe-interval",
        "DISCOVERY_DEMOTE_PROBE_INTERVAL",
        "latency outlier demotion: seconds between two probes of a demoted data server "
        "(a copy of one query's first request, raced against the request to a peer), "
        "whose answer says whether it is fast again",
        type=positive_float,
        default=DEMOTE_PROBE_INTERVAL,
        metavar="SECONDS",
    ),
    Option(
        "--min-group-coverage",
        "DISCOVERY_MIN_GROUP_COVERAGE",
        "replica groups (data servers' --group): the least percent of the corpus's "
        "documents a group must hold in shards with a usable replica in it to get queries; "
        "below it the group only fills in for others (if every group is below, those that "
        "cover the most stay in rotation)",
        type=_percent,
        default=97.0,
        metavar="PERCENT",
    ),
    Option(
        "--picker",
        "DISCOVERY_PICKER",
        "how a shard's replica is chosen: ars (adaptive replica selection: response "
        "time, service time and queue, with C3's concurrency compensation), p2c "
        "(power of two choices on requests in flight) or wrr (weighted round robin by "
        "the load the data servers report: see --wrr-*)",
        type=_picker,
        default="ars",
    ),
    # Weighted round robin's settings (search_server/wrr.py), used with --picker wrr.
    Option(
        "--wrr-blackout",
        "DISCOVERY_WRR_BLACKOUT",
        "with --picker wrr: seconds a data server's load reports must have been arriving "
        "before its weight is used (until then it gets the mean weight; 0: at once)",
        type=_non_negative_float,
        default=10.0,
        metavar="SECONDS",
    ),
    Option(
        "--wrr-expiry",
        "DISCOVERY_WRR_EXPIRY",
        "with --picker wrr: a data server whose last load report is older than this gets "
        "the mean weight, and its next report starts a new blackout",
        type=positive_float,
        default=180.0,
        metavar="SECONDS",
    ),
    Option(
        "--wrr-error-penalty",
        "DISCOVERY_WRR_ERROR_PENALTY",
        "with --picker wrr: how much a data server's errors count against its weight, "
        "qps / (utilization + eps / qps x P) (0: not at all)",
        type=_non_negative_float,
        default=1.0,
        metavar="P",
    ),
    Option(
        "--hedge-percent",
        "DISCOVERY_HEDGE_PERCENT",
        "hedged requests: a shard's answer later than its recent p95 gets one more "
        "request to another replica, capped at this percent of sub-requests (0: off)",
        type=_percent,
        default=5.0,
        metavar="PERCENT",
    ),
    Option(
        "--retry-budget-percent",
        "DISCOVERY_RETRY_BUDGET_PERCENT",
        "retries after a failed sub-request and hedges together: at most this percent "
        "of first sub-requests, plus --retry-budget-per-second (so a failing shard gets "
        "about one request per query, not one per replica)",
        type=_percent,
        default=10.0,
        metavar="PERCENT",
    ),
    Option(
        "--retry-budget-per-second",
        "DISCOVERY_RETRY_BUDGET_PER_SECOND",
        "the steady part of the retry budget: extra sub-requests a second allowed "
        "whatever the traffic (hedges never spend the last second's worth)",
        type=_non_negative_float,
        default=10.0,
        metavar="RATE",
    ),
    Option(
        "--shards",
        "DISCOVERY_SHARDS",
        "how many shards the cluster has (0 to N-1): a shard with no live replica is "
        "then reported missing in every answer's coverage even by a search server that "
        "never saw it, and a data server registered with another shard number is "
        "refused: never published by the leader, never routed to (counted as "
        "shard_out_of_range). 0: any shard, the shards this search server has seen",
        type=non_negative_int,
        default=0,
    ),
    Option(
        "--forget-missing-shard-after",
        "DISCOVERY_FORGET_MISSING_SHARD_AFTER",
        "seconds a shard not named by --shards stays expected in answers (reported "
        "missing, the answer partial) after its last replica left; then it is forgotten "
        "until a replica comes back (0: never forgotten)",
        type=_non_negative_float,
        default=FORGET_MISSING_SHARD_AFTER,
        metavar="SECONDS",
    ),
    Option(
        "--subset-size",
        "DISCOVERY_SUBSET_SIZE",
        "route each shard to a stable subset of at least this many of its replicas, "
        "spread evenly over the search servers (more when there are too few search "
        "servers to cover every replica); 0: every replica",
        type=non_negative_int,
        default=8,
    ),
    Option(
        "--heap-freeze-above",
        "DISCOVERY_HEAP_FREEZE_ABOVE",
        "freeze the garbage collector's old generation once it has grown by this many "
        "objects, so that full collections (event-loop pauses) do not grow with the "
        "fleet; 0: never",
        type=non_negative_int,
        default=50_000,
        metavar="OBJECTS",
    ),
    Option(
        "--max-event-streams",
        "DISCOVERY_MAX_EVENT_STREAMS",
        "dashboard event streams (GET /events) open at once; more are refused with 503",
        type=positive_int,
        default=64,
    ),
    Option(
        "--heartbeat-interval",
        "DISCOVERY_HEARTBEAT_INTERVAL",
        "seconds between the leader's heartbeats (and Redis data-loss checks)",
        type=positive_float,
        default=1.0,
        metavar="SECONDS",
    ),
    Option(
        "--heartbeat-ttl",
        "DISCOVERY_HEARTBEAT_TTL",
        "seconds the leader's heartbeat key lives without a refresh",
        type=positive_float,
        default=5.0,
        metavar="SECONDS",
    ),
    Option(
        "--zk-fallback-after",
        "DISCOVERY_ZK_FALLBACK_AFTER",
        "if Redis is unreachable this many seconds (plus up to 50%% jitter), route with a "
        "direct read of /data_servers until it is back (unset: never)",
        type=positive_float,
        metavar="SECONDS",
    ),
    Option(
        "--reconcile-interval",
        "DISCOVERY_RECONCILE_INTERVAL",
        "seconds without news after which the local live list is checked against Redis "
        "(P:meta); it bounds how stale a list can be without anyone noticing",
        type=positive_float,
        default=5.0,
        metavar="SECONDS",
    ),
    Option(
        "--leader-eligible",
        "DISCOVERY_LEADER_ELIGIBLE",
        "take part in the leader election; --no-leader-eligible for a server whose Redis "
        "credentials cannot publish (it only reads the live list)",
        type=env_flag,
        default=True,
        boolean=True,
    ),
    Option(
        "--leader-retry-pause",
        "DISCOVERY_LEADER_RETRY_PAUSE",
        "seconds a leader that Redis refused to let publish (credentials, ACL) stays out "
        "of the election before contending again",
        type=positive_float,
        default=10.0,
        metavar="SECONDS",
    ),
    Option(
        "--max-answer-bytes",
        "DISCOVERY_MAX_ANSWER_BYTES",
        "largest answer body read from a data server; a longer one fails that "
        "sub-request (and closes its connection)",
        type=positive_int,
        default=DEFAULT_MAX_BODY,
        metavar="BYTES",
    ),
    Option(
        "--topk-probability",
        "DISCOVERY_TOPK_PROBABILITY",
        "ask each shard for fewer hits than k, as few as keep the merged top k exact "
        "with this probability when documents are spread over the shards at random "
        "(0 < P <= 1; 1: every shard asked for k, always exact); a query's "
        "topk_probability overrides it",
        type=_fraction,
        default=TOPK_PROBABILITY,
        metavar="P",
    ),
    Option(
        "--topk-second-round",
        "DISCOVERY_TOPK_SECOND_ROUND",
        "when a shard asked for fewer hits than k may have left one out of the merged "
        "top k, ask it again for k while the query's deadline allows, so that the top k "
        "is exact; --no-topk-second-round only counts such queries "
        "(search_server_fanout_topk_maybe_inexact_total)",
        type=env_flag,
        default=True,
        boolean=True,
    ),
    # Slow start (search_server/slowstart.py).
    Option(
        "--slow-start-window",
        "DISCOVERY_SLOW_START_WINDOW",
        "seconds over which a data server new to this search server (joined, restarted, "
        "back from offline) ramps up to its full share of its shard's requests (0: off)",
        type=_non_negative_float,
        default=30.0,
        metavar="SECONDS",
    ),
    Option(
        "--slow-start-aggression",
        "DISCOVERY_SLOW_START_AGGRESSION",
        "shape of the ramp: the weight is weight x (elapsed / window) ^ (1 / A); 1 is "
        "linear, more ramps faster early on",
        type=positive_float,
        default=1.0,
        metavar="A",
    ),
    Option(
        "--slow-start-min-weight",
        "DISCOVERY_SLOW_START_MIN_WEIGHT",
        "least share of its weight a ramping data server has, from its first second (0 < F <= 1)",
        type=_fraction,
        default=0.1,
        metavar="F",
    ),
    # The query-of-death guard (search_server/querydeath.py).
    Option(
        "--qod-strikes",
        "DISCOVERY_QOD_STRIKES",
        "a query (its normalised text) whose fan-out failed, timed out or was cut on "
        "--qod-shard-fraction of the shards this many times within --qod-window, while "
        "most other queries did not, is refused at once with 422 for --qod-cooldown "
        "(0: never refuse a query)",
        type=non_negative_int,
        default=3,
    ),
    Option(
        "--qod-shard-fraction",
        "DISCOVERY_QOD_SHARD_FRACTION",
        "share of a fan-out's shards that must fail, time out or be cut for it to count "
        "as a strike (0 < F <= 1)",
        type=_fraction,
        default=0.5,
        metavar="F",
    ),
    Option(
        "--qod-window",
        "DISCOVERY_QOD_WINDOW",
        "seconds within which a query's strikes count together",
        type=positive_float,
        default=60.0,
        metavar="SECONDS",
    ),
    Option(
        "--qod-cooldown",
        "DISCOVERY_QOD_COOLDOWN",
        "seconds a query of death is refused; a repeat offence after it doubles it, up "
        "to ten times this",
        type=positive_float,
        default=60.0,
        metavar="SECONDS",
    ),
    Option(
        "--fence-recheck-max",
        "DISCOVERY_FENCE_RECHECK_MAX",
        "longest pause between a leader's tries of a fence that holds an epoch no leader "
        "can hold (it publishes nothing meanwhile; the first try is after "
        "--heartbeat-interval, doubling): how long after `discovery fence repair` the "
        "leader may take to publish again",
        type=positive_float,
        default=30.0,
        metavar="SECONDS",
    ),
    # The leader's mass-loss brake (discovery/livelist/brake.py).
    Option(
        "--mass-loss-fraction",
        "DISCOVERY_MASS_LOSS_FRACTION",
        "the leader holds removals when more than this share of the data servers vanish "
        "unannounced within --mass-loss-window (0 < F <= 1; 1 disables the brake)",
        type=_fraction,
        default=0.3,
        metavar="F",
    ),
    Option(
        "--mass-loss-window",
        "DISCOVERY_MASS_LOSS_WINDOW",
        "seconds within which vanishing data servers count together for the brake",
        type=positive_float,
        default=10.0,
        metavar="SECONDS",
    ),
    Option(
        "--mass-loss-hold",
        "DISCOVERY_MASS_LOSS_HOLD",
        "longest time the leader holds removals once the brake engages (0 disables it)",
        type=_non_negative_float,
        default=30.0,
        metavar="SECONDS",
    ),
    Option(
        "--drain-grace",
        "DISCOVERY_DRAIN_GRACE",
        "seconds a stopping search server (SIGTERM) keeps answering queries after its "
        "/readyz turns 503, for a load balancer to take it out; then it stops accepting "
        "and finishes the queries in flight",
        type=_non_negative_float,
        default=2.0,
        metavar="SECONDS",
    ),
    Option(
        "--mass-loss-min",
        "DISCOVERY_MASS_LOSS_MIN",
        "fewest vanished data servers that can engage the brake",
        type=positive_int,
        default=3,
    ),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="search-server",
        description="Run one search server: takes part in the leader election (the leader "
        "publishes the live data servers to Redis), keeps the live list, and fans queries out.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    add_options(
        parser,
        (
            *ZK_OPTIONS,
            *COMMON_OPTIONS,
            *RUNTIME_OPTIONS,
            *SEARCH_OPTIONS,
            *MEMBER_OPTIONS,
            *HTTP_EDGE_OPTIONS,
        ),
    )
    return parser


@dataclass(frozen=True)
class SearchServerConfig:
    """One search server's settings; the constructor raises :class:`ConfigError`
    naming the flag of an inconsistent or invalid value.

    ``zone`` is the server's own zone (``--zone``), ``None`` for no preference.
    ``min_group_coverage_percent`` is the least coverage of a replica group in
    rotation (``--min-group-coverage``). ``demote_ratio``, ``demote_floor_ms`` and
    ``demote_probe_interval`` are latency outlier demotion's (``--demote-*``; a ratio
    of 0 turns it off).
    ``picker`` names the replica picker (``--picker``: ``ars``, ``p2c`` or ``wrr``,
    whose settings are ``wrr``: ``--wrr-*``) and
    ``hedge_percent`` caps hedged requests (``--hedge-percent``, 0 turns them off);
    ``retry_budget_percent`` and ``retry_budget_per_second`` bound retries and hedges
    together; ``subset_size`` is the least subset of a shard's replicas routed to (0:
    all); ``shards`` the cluster's shard count, for coverage and to refuse other shard
    numbers (0: the shards seen); a shard above it is forgotten after
    ``forget_missing_shard_after`` seconds without a replica (0: never).
    ``heap_freeze_above`` is the growth of the collector's old generation that makes
    the server freeze it (:mod:`search_server.heap`; 0: never).
    ``allowed_networks`` narrows where data servers may be (``--allowed-networks``);
    :attr:`data_networks` is what the fan-out sends to. ``allow_persistent_members``
    routes persistent ``PERMANENT``/``STATIC`` registrations
    (``--allow-persistent-members``; the leader's and the ZooKeeper fallback's reads).
    ``query_of_death`` holds the thresholds of the query-of-death guard (``--qod-*``).
    ``max_answer_bytes`` caps a data server's answer (``--max-answer-bytes``).
    ``coverage`` is the queries' coverage policy (``--min-coverage``, ``--soft-timeout``,
    ``--adaptive-wait``), unless a query brings its own.
    ``topk_probability`` is how sure a query's merged top k is of being exact when
    shards are asked for fewer hits (``--topk-probability``; 1: every shard asked for k),
    and ``topk_second_round`` whether the shards that may have left a hit out are asked
    again for k (``--topk-second-round``).
    ``http`` bounds slow clients at the HTTP edge and ``max_event_streams`` the open
    dashboard streams. ``drain_grace`` is how long a stopping server still answers
    once its readiness fails (``--drain-grace``). The repr shows no secret (those of
    ``zk`` and ``cluster`` are hidden).
    """

    zk: ZkConfig
    cluster: ClusterConfig
    host: str = "127.0.0.1"
    port: int = 8080
    advertise: str = "127.0.0.1"
    server_id: str | None = None
    default_timeout_ms: int = 500
    max_timeout_ms: int = 10_000
    max_in_flight: int = 256
    admission: str = "gradient"
    admission_min_limit: int = 1
    admission_initial_limit: int = 10
    admission_tolerance: float = 2.0
    admission_query_share_percent: int = 50
    eject_after: int = 3
    eject_cooldown: float = 10.0
    max_ejected_percent: int = 50
    panic_percent: int = 50
    min_group_coverage_percent: float = 97.0
    demote_ratio: float = DEMOTE_RATIO
    demote_floor_ms: float = DEMOTE_FLOOR * 1000
    demote_probe_interval: float = DEMOTE_PROBE_INTERVAL
    heartbeat_interval: float = 1.0
    heartbeat_ttl: float = 5.0
    reconcile_interval: float = 5.0
    zk_fallback_after: float | None = None
    leader_eligible: bool = True
    leader_retry_pause: float = 10.0
    fence_recheck_max: float = 30.0
    mass_loss: MassLossBrakeConfig = field(default_factory=MassLossBrakeConfig)
    zone: str | None = None
    picker: str = "ars"
    wrr: WrrConfig = field(default_factory=WrrConfig)
    hedge_percent: float = 5.0
    retry_budget_percent: float = 10.0
    retry_budget_per_second: float = 10.0
    subset_size: int = 8
    shards: int = 0
    forget_missing_shard_after: float = FORGET_MISSING_SHARD_AFTER
    heap_freeze_above: int = 50_000
    allowed_networks: NetworkPolicy = field(default_factory=NetworkPolicy)
    allow_persistent_members: bool = False
    query_of_death: QueryOfDeathConfig = field(default_factory=QueryOfDeathConfig)
    max_answer_bytes: int = DEFAULT_MAX_BODY
    topk_probability: float = TOPK_PROBABILITY
    topk_second_round: bool = True
    http: HttpEdgeConfig = field(default_factory=HttpEdgeConfig)
    max_event_streams: int = 64
    drain_grace: float = 2.0
    slow_start: SlowStart = field(default_factory=SlowStart)
    coverage: CoveragePolicy = field(default_factory=CoveragePolicy)

    def __post_init__(self) -> None:
        if self.max_answer_bytes < 1:
            raise ConfigError(f"--max-answer-bytes must be at least 1, got {self.max_answer_bytes}")
        if not 0 < self.topk_probability <= 1:
            raise ConfigError(
                f"--topk-probability must be > 0 and <= 1, got {self.topk_probability}"
            )
        if self.max_event_streams < 1:
            raise ConfigError(
                f"--max-event-streams must be at least 1, got {self.max_event_streams}"
            )
        if self.admission not in ADMISSIONS:
            raise ConfigError(
                f"--admission must be one of {', '.join(ADMISSIONS)}, got {self.admission!r}"
            )
        if not 1 <= self.admission_min_limit <= self.admission_initial_limit:
            raise ConfigError(
                "--admission-min-limit must be at least 1 and at most "
                f"--admission-initial-limit, got {self.admission_min_limit} and "
                f"{self.admission_initial_limit}"
            )
        if not self.admission_tolerance >= 1:
            raise ConfigError(
                f"--admission-tolerance must be at least 1, got {self.admission_tolerance}"
            )
        if not 1 <= self.admission_query_share_percent <= 100:
            raise ConfigError(
                "--admission-query-share must be in 1..100, got "
                f"{self.admission_query_share_percent}"
            )
        if not 0 <= self.min_group_coverage_percent <= 100:
            raise ConfigError(
                f"--min-group-coverage must be in 0..100, got {self.min_group_coverage_percent}"
            )
        if not (self.demote_ratio == 0 or self.demote_ratio > 1):
            raise ConfigError(f"--demote-ratio must be 0 (off) or above 1, got {self.demote_ratio}")
        if not 0 <= self.demote_floor_ms < float("inf"):
            raise ConfigError(f"--demote-floor-ms must be at least 0, got {self.demote_floor_ms}")
        if not 0 < self.demote_probe_interval < float("inf"):
            raise ConfigError(
                f"--demote-probe-interval must be positive, got {self.demote_probe_interval}"
            )
        if self.picker not in PICKERS:
            raise ConfigError(f"--picker must be one of {', '.join(PICKERS)}, got {self.picker!r}")
        if not 0 <= self.hedge_percent <= 100:
            raise ConfigError(f"--hedge-percent must be in 0..100, got {self.hedge_percent}")
        if not 0 <= self.retry_budget_percent <= 100:
            raise ConfigError(
                f"--retry-budget-percent must be in 0..100, got {self.retry_budget_percent}"
            )
        if not 0 <= self.retry_budget_per_second <= _MAX_RETRY_RATE:
            raise ConfigError(
                f"--retry-budget-per-second must be in 0..{_MAX_RETRY_RATE}, "
                f"got {self.retry_budget_per_second}"
            )
        if not 0 <= self.shards <= _MAX_SHARDS:
            raise ConfigError(f"--shards must be in 0..{_MAX_SHARDS}, got {self.shards}")
        if not self.forget_missing_shard_after >= 0:
            raise ConfigError(
                "--forget-missing-shard-after must be at least 0, got "
                f"{self.forget_missing_shard_after}"
            )
        if self.subset_size < 0:
            raise ConfigError(f"--subset-size must be at least 0, got {self.subset_size}")
        if self.heap_freeze_above < 0:
            raise ConfigError(
                f"--heap-freeze-above must be at least 0, got {self.heap_freeze_above}"
            )
        checked_id(self.server_id)
        checked_address(self.advertise, "--advertise / DISCOVERY_ADVERTISE")
        if self.zone is not None:
            checked_setting(validate_zone, self.zone, "--zone / DISCOVERY_ZONE")
        if self.default_timeout_ms > self.max_timeout_ms:
            raise ConfigError("--timeout-ms must not exceed --max-timeout-ms")
        if self.heartbeat_ttl <= self.heartbeat_interval:
            raise ConfigError("--heartbeat-ttl must be longer than --heartbeat-interval")
        if not self.leader_retry_pause > 0:
            raise ConfigError("--leader-retry-pause must be positive")
        if not self.fence_recheck_max > 0:
            raise ConfigError("--fence-recheck-max must be positive")

    @property
    def data_networks(self) -> NetworkPolicy:
        """Where the fan-out sends queries: ``allowed_networks``, and loopback addresses
        only while this server listens on loopback itself (``host``).

        A server listening on another interface serves other machines: a data server
        registered at 127.0.0.1 or ``localhost`` aims its queries at whatever listens on
        this machine's own loopback. The leader does not apply this (it publishes for
        every search server, and cannot know where they listen); each search server
        judges for itself, here.
        """
        loopback = self.allowed_networks.loopback and is_loopback_host(self.host)
        return self.allowed_networks.with_loopback(loopback)

    def concurrency_limit(self) -> ConcurrencyLimit:
        """The admission's limit these settings describe (a new one per call)."""
        if self.admission == "fixed":
            return FixedLimit(self.max_in_flight)
        # --max-in-flight caps the others (a small one is a fixed limit in effect).
        initial = min(self.admission_initial_limit, self.max_in_flight)
        return GradientLimit(
            initial=initial,
            min_limit=min(self.admission_min_limit, initial),
            max_limit=self.max_in_flight,
            tolerance=self.admission_tolerance,
            # Two fifths of the default deadline: a fan-out's p99 is about twice its
            # mean, and the admitted queries' must stay inside the deadline.
            ceiling=0.4 * self.default_timeout_ms / 1000,
        )

    def query_share(self) -> QueryShare:
        """How much of the in-flight limit one query may hold (a new one per call)."""
        return QueryShare(self.admission_query_share_percent / 100)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> SearchServerConfig:
        return cls(
            zk=zk_config(args),
            cluster=cluster_config(args),
            host=args.host,
            port=args.port,
            advertise=advertised_address(args.host, args.advertise),
            server_id=args.id,
            default_timeout_ms=args.timeout_ms,
            max_timeout_ms=args.max_timeout_ms,
            max_in_flight=args.max_in_flight,
            admission=args.admission,
            admission_min_limit=args.admission_min_limit,
            admission_initial_limit=args.admission_initial_limit,
            admission_tolerance=args.admission_tolerance,
            admission_query_share_percent=args.admission_query_share,
            eject_after=args.eject_after,
            eject_cooldown=args.eject_cooldown,
            max_ejected_percent=args.max_ejected_percent,
            panic_percent=args.panic_threshold,
            min_group_coverage_percent=args.min_group_coverage,
            demote_ratio=args.demote_ratio,
            demote_floor_ms=args.demote_floor_ms,
            demote_probe_interval=args.demote_probe_interval,
            heartbeat_interval=args.heartbeat_interval,
            heartbeat_ttl=args.heartbeat_ttl,
            reconcile_interval=args.reconcile_interval,
            zk_fallback_after=args.zk_fallback_after,
            leader_eligible=args.leader_eligible,
            leader_retry_pause=args.leader_retry_pause,
            fence_recheck_max=args.fence_recheck_max,
            zone=args.zone,
            picker=args.picker,
            wrr=WrrConfig(
                blackout=args.wrr_blackout,
                expiry=args.wrr_expiry,
                error_penalty=args.wrr_error_penalty,
            ),
            hedge_percent=args.hedge_percent,
            retry_budget_percent=args.retry_budget_percent,
            retry_budget_per_second=args.retry_budget_per_second,
            subset_size=args.subset_size,
            shards=args.shards,
            forget_missing_shard_after=args.forget_missing_shard_after,
            heap_freeze_above=args.heap_freeze_above,
            allowed_networks=args.allowed_networks or NetworkPolicy(),
            allow_persistent_members=args.allow_persistent_members,
            max_answer_bytes=args.max_answer_bytes,
            topk_probability=args.topk_probability,
            topk_second_round=args.topk_second_round,
            query_of_death=QueryOfDeathConfig(
                shard_fraction=args.qod_shard_fraction,
                strikes=args.qod_strikes,
                window=args.qod_window,
                cooldown=args.qod_cooldown,
                max_cooldown=10 * args.qod_cooldown,
            ),
            http=http_edge_config(args),
            max_event_streams=args.max_event_streams,
            drain_grace=args.drain_grace,
            slow_start=SlowStart(
                window=args.slow_start_window,
                aggression=args.slow_start_aggression,
                min_weight=args.slow_start_min_weight,
            ),
            mass_loss=MassLossBrakeConfig(
                fraction=args.mass_loss_fraction,
                window=args.mass_loss_window,
                hold=args.mass_loss_hold,
                min_count=args.mass_loss_min,
            ),
            coverage=CoveragePolicy(
                min_coverage=args.min_coverage / 100,
                soft_timeout=args.soft_timeout,
                adaptive_wait=args.adaptive_wait,
            ),
        )
