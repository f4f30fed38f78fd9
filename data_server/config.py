"""Settings of a data server (and of a fleet of simulated ones), built once at start-up."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from discovery import __version__
from discovery.agent.probes import PROBE_HEADER, PROBE_HEADER_VALUE
from discovery.cli.options import (
    AGENT_OPTIONS,
    COMMON_OPTIONS,
    GROUP_RULE,
    HTTP_EDGE_OPTIONS,
    RUNTIME_OPTIONS,
    ZK_OPTIONS,
    ZONE_RULE,
    Option,
    add_options,
    advertised_address,
    agent_config,
    checked_address,
    checked_id,
    checked_setting,
    cluster_config,
    group_name,
    http_edge_config,
    int_range,
    listen_options,
    non_negative_float,
    non_negative_int,
    port_number,
    positive_float,
    positive_int,
    zk_config,
    zone_name,
)
from discovery.config import AgentConfig, ClusterConfig, HttpEdgeConfig, ZkConfig
from discovery.errors import ConfigError
from discovery.instance import (
    DEFAULT_WEIGHT,
    MAX_WEIGHT,
    MIN_WEIGHT,
    validate_group,
    validate_weight,
    validate_zone,
)

__all__ = [
    "DEFAULT_MAX_CONCURRENT_SEARCHES",
    "DEFAULT_MAX_TIMEOUT_MS",
    "DEFAULT_SEARCH_TIMEOUT_MS",
    "MAX_TIMEOUT_MS",
    "DataServerConfig",
    "FleetConfig",
    "build_fleet_parser",
    "build_parser",
    "group_list",
    "zone_list",
]


#: Largest ``timeout_ms`` a search request may give without a 400 (and the bound of
#: ``--search-timeout-ms`` and ``--max-timeout-ms``): ten minutes, the bound of the search
#: servers' own ``--max-timeout-ms``, so that whatever a search server may send is
#: accepted here; a larger one is a client's mistake. What the data server works is
#: further clamped to ``--max-timeout-ms``.
MAX_TIMEOUT_MS = 600_000
#: Default of ``--max-timeout-ms``: the search servers' own default maximum (their
#: ``--max-timeout-ms``), so no search here works longer than any query could wait for it.
DEFAULT_MAX_TIMEOUT_MS = 10_000
#: Budget of a search request without ``timeout_ms``.
DEFAULT_SEARCH_TIMEOUT_MS = 1000
#: Default of ``--max-concurrent-searches``. Searches in progress share the event loop
#: slice by slice (about 0.5 ms each); ordinary ones end within their first slice and
#: never overlap, so only expensive ones count. At 8, each still gets an eighth of the
#: loop: about 56 ms of work within the search servers' default budget (500 ms, less
#: the 10 % margin), enough for the worst-case query of a 10,000-document shard (about
#: 54 ms pruned, bench/results/worst_case.json); a ninth would slow all eight past it.
#: And a probe or an ordinary search waits at most about 8 slices (4 ms) for its turn.
DEFAULT_MAX_CONCURRENT_SEARCHES = 8


def zone_list(text: str) -> tuple[str, ...]:
    """argparse type: comma-separated, distinct zone names (``a,b,c``)."""
    zones = tuple(zone_name(part) for part in text.split(","))
    for i, zone in enumerate(zones):
        if zone in zones[:i]:
            # A repeated zone would silently give it twice the servers; say so instead.
            raise argparse.ArgumentTypeError(f"zone {zone!r} is listed twice in {text!r}")
    return zones


def group_list(text: str) -> tuple[str, ...]:
    """argparse type: comma-separated, distinct replica group names (``g1,g2``)."""
    groups = tuple(group_name(part) for part in text.split(","))
    for i, group in enumerate(groups):
        if group in groups[:i]:
            # A repeated group would silently hold two replicas of each shard; say so.
            raise argparse.ArgumentTypeError(f"group {group!r} is listed twice in {text!r}")
    return groups


SERVER_OPTIONS = (
    *listen_options(9001, "ds"),
    Option("--shard", "DISCOVERY_SHARD", "shard number", type=non_negative_int, default=0),
    Option("--replica", "DISCOVERY_REPLICA", "replica number", type=non_negative_int, default=0),
    Option(
        "--docs",
        "DISCOVERY_DOCS",
        "number of documents to generate for the shard (ignored with --docs-file)",
        type=non_negative_int,
        default=2000,
    ),
    Option(
        "--docs-file",
        "DISCOVERY_DOCS_FILE",
        'JSONL file of documents ({"id","text","title"} per line) instead of generated ones',
        metavar="PATH",
    ),
    Option(
        "--index-snapshot-dir",
        "DISCOVERY_INDEX_SNAPSHOT_DIR",
        "directory of index snapshots: a restart loads the shard's index from its snapshot "
        "(about 100 times less CPU than building it, which a restart would otherwise take "
        "from the servers still answering) and a build writes one; it must be this user's "
        "own and writable by no one else (unset: always build)",
        metavar="DIR",
    ),
    Option(
        "--zone",
        "DISCOVERY_ZONE",
        f"zone (data centre, availability zone) published in the registration; search "
        f"servers prefer replicas in their own zone ({ZONE_RULE}; unset: no zone)",
        type=zone_name,
        metavar="ZONE",
    ),
    Option(
        "--group",
        "DISCOVERY_GROUP",
        "replica group published in the registration: a group is one whole copy of the "
        "corpus (one replica of every shard); search servers send each query to one group "
        f"and take a group short of coverage out of rotation ({GROUP_RULE}; unset: no "
        "group, the replica only fills in for groups)",
        type=group_name,
        metavar="GROUP",
    ),
    Option(
        "--weight",
        "DISCOVERY_WEIGHT",
        "relative share of its shard's queries this replica asks for, published in the "
        f"registration ({MIN_WEIGHT}..{MAX_WEIGHT}; a replica of weight 200 gets twice the "
        "queries of one of weight 100)",
        type=int_range(MIN_WEIGHT, MAX_WEIGHT),
        default=DEFAULT_WEIGHT,
    ),
    Option(
        "--seed",
        "DISCOVERY_SEED",
        "seed of the generated vocabulary and documents",
        type=non_negative_int,
        default=0,
    ),
    Option(
        "--search-timeout-ms",
        "DISCOVERY_SEARCH_TIMEOUT_MS",
        "budget of a search request that gives no timeout_ms (the agent's probes, direct "
        "clients; the search servers send each request's remaining budget): a search "
        "still running when it is spent, less a safety margin, stops and answers with "
        f"the best hits so far, marked cut (1..{MAX_TIMEOUT_MS})",
        type=int_range(1, MAX_TIMEOUT_MS),
        default=DEFAULT_SEARCH_TIMEOUT_MS,
        metavar="MS",
    ),
    Option(
        "--max-timeout-ms",
        "DISCOVERY_MAX_TIMEOUT_MS",
        "longest budget a search works: a request's larger timeout_ms (up to "
        f"{MAX_TIMEOUT_MS}; more is refused with 400) is clamped to it, not refused; the "
        "default is the search servers' own maximum, past which no query waits for the "
        f"answer; at least --search-timeout-ms (1..{MAX_TIMEOUT_MS})",
        type=int_range(1, MAX_TIMEOUT_MS),
        default=DEFAULT_MAX_TIMEOUT_MS,
        metavar="MS",
    ),
    Option(
        "--max-concurrent-searches",
        "DISCOVERY_MAX_CONCURRENT_SEARCHES",
        "searches in progress at once (they share the event loop; ordinary ones end "
        "within one slice of about 0.5 ms, so only expensive or held ones count): one "
        "more is answered at once with HTTP 429 and Retry-After: 1, before any search "
        f"work; the agent's probes (header {PROBE_HEADER}: {PROBE_HEADER_VALUE}) are "
        "never refused nor counted",
        type=positive_int,
        default=DEFAULT_MAX_CONCURRENT_SEARCHES,
        metavar="N",
    ),
    Option(
        "--shutdown-timeout",
        "DISCOVERY_SHUTDOWN_TIMEOUT",
        "seconds to let in-flight requests finish after the drain",
        type=positive_float,
        default=10.0,
        metavar="SECONDS",
    ),
)

FLEET_OPTIONS = (
    Option(
        "--count", "DISCOVERY_FLEET_COUNT", "simulated data servers", type=positive_int, default=100
    ),
    Option(
        "--procs",
        "DISCOVERY_FLEET_PROCS",
        "processes to spread them over",
        type=positive_int,
        default=2,
    ),
    Option(
        "--base-port",
        "DISCOVERY_FLEET_BASE_PORT",
        "port of server 0; server i listens on base-port + i",
        type=port_number,
        default=9100,
    ),
    Option(
        "--first-index",
        "DISCOVERY_FLEET_FIRST_INDEX",
        "number of this fleet's first server, so that several fleets (one per host or "
        "container) get distinct ids ds-<number>, shards and replicas",
        type=non_negative_int,
        default=0,
    ),
    Option(
        "--shards",
        "DISCOVERY_FLEET_SHARDS",
        "distinct shards; server i holds shard i %% shards, replica i // shards",
        type=positive_int,
    ),
    Option(
        "--zones",
        "DISCOVERY_FLEET_ZONES",
        "comma-separated zones dealt out round-robin: the server of shard s, replica r "
        "gets zone (s + r) %% count, so a shard's replicas land in different zones "
        "(unset: every server gets --zone)",
        type=zone_list,
        metavar="A,B,...",
    ),
    Option(
        "--groups",
        "DISCOVERY_FLEET_GROUPS",
        "comma-separated replica groups: replica r of every shard gets group r %% count, so "
        "with as many replicas per shard as groups each group is one whole copy of the "
        "corpus (unset: every server gets --group)",
        type=group_list,
        metavar="A,B,...",
    ),
    Option(
        "--start-spread",
        "DISCOVERY_FLEET_START_SPREAD",
        "seconds over which each worker's servers start (connect, probe, register), "
        "evenly spaced, as the machines a fleet stands for would each on their own CPU: "
        "started in one burst, a restarted fleet starves the servers still answering on "
        "a shared machine (0: as fast as they can)",
        type=non_negative_float,
        default=0.0,
        metavar="SECONDS",
    ),
)


def _add_server_options(parser: argparse.ArgumentParser, fleet: bool) -> None:
    add_options(parser, (*ZK_OPTIONS, *COMMON_OPTIONS, *RUNTIME_OPTIONS))
    server = [
        o
        for o in SERVER_OPTIONS
        if not (fleet and o.flag in ("--port", "--id", "--shard", "--replica"))
    ]
    add_options(parser, server)
    add_options(parser, HTTP_EDGE_OPTIONS)
    add_options(parser, AGENT_OPTIONS)


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``data-server`` (one server)."""
    parser = argparse.ArgumentParser(
        prog="data-server",
        description="Run one data server: a shard behind an HTTP search API, registered in "
        "ZooKeeper while its health probes pass. `data-server fleet --help` for a fleet.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    _add_server_options(parser, fleet=False)
    return parser


def build_fleet_parser() -> argparse.ArgumentParser:
    """The parser of ``data-server fleet`` (N simulated servers in P processes)."""
    parser = argparse.ArgumentParser(
        prog="data-server fleet",
        description="Run N simulated data servers in P processes, each with its own port, "
        "shard, ZooKeeper session and agent.",
    )
    add_options(parser, FLEET_OPTIONS)
    _add_server_options(parser, fleet=True)
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    return parser


@dataclass(frozen=True)
class DataServerConfig:
    """One data server. ``instance_id`` None means ``ds-<advertise>-<port>``.

    ``zone`` (None: no zone), ``weight`` and ``group`` (None: no replica group) go into
    the registered payload; ``http``
    bounds slow clients at the HTTP edge; ``search_timeout_ms`` is the budget of a search
    request that gives no ``timeout_ms``, ``max_timeout_ms`` the longest budget any search
    works (a larger ``timeout_ms`` is clamped to it); ``max_concurrent_searches`` caps the
    searches in progress (probes aside); ``index_snapshot_dir`` holds index snapshots
    (:mod:`data_server.snapshot`; None: always build). The constructor raises :class:`ConfigError`
    naming the flag of a bad value. The repr shows no secret (those of ``zk`` and
    ``cluster`` are hidden).
    """

    zk: ZkConfig
    cluster: ClusterConfig
    agent: AgentConfig
    host: str = "127.0.0.1"
    port: int = 9001
    advertise: str = "127.0.0.1"
    instance_id: str | None = None
    shard: int = 0
    replica: int = 0
    docs: int = 2000
    docs_file: Path | None = None
    seed: int = 0
    shutdown_timeout: float = 10.0
    zone: str | None = None
    weight: int = DEFAULT_WEIGHT
    group: str | None = None
    http: HttpEdgeConfig = field(default_factory=HttpEdgeConfig)
    search_timeout_ms: int = DEFAULT_SEARCH_TIMEOUT_MS
    max_timeout_ms: int = DEFAULT_MAX_TIMEOUT_MS
    max_concurrent_searches: int = DEFAULT_MAX_CONCURRENT_SEARCHES
    index_snapshot_dir: Path | None = None

    def __post_init__(self) -> None:
        checked_id(self.instance_id)
        # Refused here, at start, naming the flag, rather than by every search server.
        checked_address(self.advertise, "--advertise / DISCOVERY_ADVERTISE")
        if not 1 <= self.search_timeout_ms <= MAX_TIMEOUT_MS:
            raise ConfigError(
                f"--search-timeout-ms / DISCOVERY_SEARCH_TIMEOUT_MS must be in "
                f"1..{MAX_TIMEOUT_MS}, got {self.search_timeout_ms}"
            )
        if not 1 <= self.max_timeout_ms <= MAX_TIMEOUT_MS:
            raise ConfigError(
                f"--max-timeout-ms / DISCOVERY_MAX_TIMEOUT_MS must be in "
                f"1..{MAX_TIMEOUT_MS}, got {self.max_timeout_ms}"
            )
        if self.search_timeout_ms > self.max_timeout_ms:
            # The default budget would be clamped on every request: say so at start.
            raise ConfigError(
                f"--search-timeout-ms / DISCOVERY_SEARCH_TIMEOUT_MS ({self.search_timeout_ms}) "
                f"must not exceed --max-timeout-ms / DISCOVERY_MAX_TIMEOUT_MS "
                f"({self.max_timeout_ms})"
            )
        if self.max_concurrent_searches < 1:
            raise ConfigError(
                f"--max-concurrent-searches / DISCOVERY_MAX_CONCURRENT_SEARCHES must be at "
                f"least 1, got {self.max_concurrent_searches}"
            )
        # The parser checked flags and variables already; this catches programmatic
        # configs, before the registration would fail with a payload error.
        if self.zone is not None:
            checked_setting(validate_zone, self.zone, "--zone / DISCOVERY_ZONE")
        checked_setting(validate_weight, self.weight, "--weight / DISCOVERY_WEIGHT")
        if self.group is not None:
            checked_setting(validate_group, self.group, "--group / DISCOVERY_GROUP")
        if self.docs_file is not None and not self.docs_file.is_file():
            raise ConfigError(f"--docs-file / DISCOVERY_DOCS_FILE: no such file {self.docs_file}")

    @property
    def probe_host(self) -> str:
        """Where the agent sends its probes: ourselves, over loopback if we listen widely."""
        return "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host

    def with_slot(
        self, *, port: int, shard: int, replica: int, instance_id: str
    ) -> DataServerConfig:
        return dataclasses.replace(
            self, port=port, shard=shard, replica=replica, instance_id=instance_id
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> DataServerConfig:
        return cls(
            zk=zk_config(args),
            cluster=cluster_config(args),
            agent=agent_config(args),
            host=args.host,
            port=getattr(args, "port", 0),
            advertise=advertised_address(args.host, args.advertise),
            instance_id=getattr(args, "id", None),
            shard=getattr(args, "shard", 0),
            replica=getattr(args, "replica", 0),
            docs=args.docs,
            docs_file=Path(args.docs_file) if args.docs_file else None,
            seed=args.seed,
            shutdown_timeout=args.shutdown_timeout,
            zone=args.zone,
            weight=args.weight,
            group=args.group,
            http=http_edge_config(args),
            search_timeout_ms=args.search_timeout_ms,
            max_timeout_ms=args.max_timeout_ms,
            max_concurrent_searches=args.max_concurrent_searches,
            index_snapshot_dir=(
                None if args.index_snapshot_dir is None else Path(args.index_snapshot_dir)
            ),
        )


@dataclass(frozen=True)
class FleetConfig:
    """N simulated data servers in P processes, from one server template."""

    template: DataServerConfig
    count: int
    procs: int
    base_port: int
    shards: int
    first_index: int = 0
    zones: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    start_spread: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.start_spread < float("inf"):
            raise ConfigError(
                f"--start-spread must be a finite number of seconds >= 0, got {self.start_spread}"
            )
        if self.zones and self.template.zone is not None:
            # Which would win is not obvious; make the operator choose.
            raise ConfigError(
                "--zones (DISCOVERY_FLEET_ZONES) and --zone (DISCOVERY_ZONE): give only one"
            )
        for zone in self.zones:
            checked_setting(validate_zone, zone, "--zones / DISCOVERY_FLEET_ZONES")
        if self.groups and self.template.group is not None:
            raise ConfigError(
                "--groups (DISCOVERY_FLEET_GROUPS) and --group (DISCOVERY_GROUP): give only one"
            )
        for group in self.groups:
            checked_setting(validate_group, group, "--groups / DISCOVERY_FLEET_GROUPS")
        if self.procs > self.count:
            raise ConfigError(f"--procs ({self.procs}) must not exceed --count ({self.count})")
        if self.base_port and self.base_port + self.count - 1 > 65535:
            raise ConfigError(f"--base-port {self.base_port} + --count {self.count} exceeds 65535")

    def slot(self, index: int) -> DataServerConfig:
        """The configuration of this fleet's server ``index`` (0-based within the fleet).

        Ids, shards and replicas count from ``first_index`` (cluster-wide), ports from
        ``base_port`` (this host's). With ``zones``, the server of shard ``s``, replica
        ``r`` gets ``zones[(s + r) % len(zones)]``: plain round-robin with one replica
        per shard, and a shard's replicas in different zones when there are several
        (round-robin over the server number would put them all in one zone whenever
        the shard count is a multiple of the zone count). With ``groups``, replica ``r``
        of every shard gets ``groups[r % len(groups)]``: each group one replica of every
        shard, a whole copy of the corpus, while there are as many replicas as groups.
        """
        number = self.first_index + index
        shard, replica = number % self.shards, number // self.shards
        config = self.template.with_slot(
            port=self.base_port + index if self.base_port else 0,
            shard=shard,
            replica=replica,
            instance_id=f"ds-{number:04d}",
        )
        if self.zones:
            config = dataclasses.replace(
                config, zone=self.zones[(shard + replica) % len(self.zones)]
            )
        if self.groups:
            config = dataclasses.replace(config, group=self.groups[replica % len(self.groups)])
        return config

    def worker_slice(self, worker: int) -> range:
        """Contiguous indices run by process ``worker`` of ``procs``."""
        return range(worker * self.count // self.procs, (worker + 1) * self.count // self.procs)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> FleetConfig:
        return cls(
            template=DataServerConfig.from_args(args),
            count=args.count,
            procs=args.procs,
            base_port=args.base_port,
            shards=args.shards or args.count,
            first_index=args.first_index,
            zones=args.zones or (),
            groups=args.groups or (),
            start_spread=args.start_spread,
        )
