"""Settings of a data server (and of a fleet of simulated ones), built once at start-up."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from pathlib import Path

from discovery.cli.options import (
    AGENT_OPTIONS,
    COMMON_OPTIONS,
    ZK_OPTIONS,
    Option,
    add_options,
    advertised_address,
    agent_config,
    checked_id,
    cluster_config,
    listen_options,
    non_negative_int,
    port_number,
    positive_float,
    positive_int,
    zk_config,
)
from discovery.config import AgentConfig, ClusterConfig, ZkConfig
from discovery.errors import ConfigError

__all__ = [
    "DataServerConfig",
    "FleetConfig",
    "build_fleet_parser",
    "build_parser",
]


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
        "--seed",
        "DISCOVERY_SEED",
        "seed of the generated vocabulary and documents",
        type=non_negative_int,
        default=0,
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
)


def _add_server_options(parser: argparse.ArgumentParser, fleet: bool) -> None:
    add_options(parser, (*ZK_OPTIONS, *COMMON_OPTIONS))
    server = [
        o
        for o in SERVER_OPTIONS
        if not (fleet and o.flag in ("--port", "--id", "--shard", "--replica"))
    ]
    add_options(parser, server)
    add_options(parser, AGENT_OPTIONS)


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``data-server`` (one server)."""
    parser = argparse.ArgumentParser(
        prog="data-server",
        description="Run one data server: a shard behind an HTTP search API, registered in "
        "ZooKeeper while its health probes pass. `data-server fleet --help` for a fleet.",
    )
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
    """One data server. ``instance_id`` None means ``ds-<advertise>-<port>``."""

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

    def __post_init__(self) -> None:
        checked_id(self.instance_id)
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

    def __post_init__(self) -> None:
        if self.procs > self.count:
            raise ConfigError(f"--procs ({self.procs}) must not exceed --count ({self.count})")
        if self.base_port and self.base_port + self.count - 1 > 65535:
            raise ConfigError(f"--base-port {self.base_port} + --count {self.count} exceeds 65535")

    def slot(self, index: int) -> DataServerConfig:
        """The configuration of this fleet's server ``index`` (0-based within the fleet).

        Ids, shards and replicas count from ``first_index`` (cluster-wide), ports from
        ``base_port`` (this host's).
        """
        number = self.first_index + index
        return self.template.with_slot(
            port=self.base_port + index if self.base_port else 0,
            shard=number % self.shards,
            replica=number // self.shards,
            instance_id=f"ds-{number:04d}",
        )

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
        )
