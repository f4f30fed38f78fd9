"""Settings of a search server, built once from flags and the environment."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from discovery.config import (
    COMMON_OPTIONS,
    ZK_OPTIONS,
    ClusterConfig,
    Option,
    ZkConfig,
    add_options,
    advertised_address,
    checked_id,
    int_range,
    listen_options,
    positive_float,
    positive_int,
)
from discovery.errors import ConfigError

__all__ = ["SearchServerConfig", "build_parser"]

SEARCH_OPTIONS = (
    *listen_options(8080, "ss"),
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
    Option(
        "--max-in-flight",
        "DISCOVERY_MAX_IN_FLIGHT",
        "queries fanned out at once; more are refused with 503 instead of queued",
        type=positive_int,
        default=256,
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
        "seconds between checks of the local live list against Redis",
        type=positive_float,
        default=30.0,
        metavar="SECONDS",
    ),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="search-server",
        description="Run one search server: takes part in the leader election (the leader "
        "publishes the live data servers to Redis), keeps the live list, and fans queries out.",
    )
    add_options(parser, (*ZK_OPTIONS, *COMMON_OPTIONS, *SEARCH_OPTIONS))
    return parser


@dataclass(frozen=True)
class SearchServerConfig:
    zk: ZkConfig
    cluster: ClusterConfig
    host: str = "127.0.0.1"
    port: int = 8080
    advertise: str = "127.0.0.1"
    server_id: str | None = None
    default_timeout_ms: int = 500
    max_timeout_ms: int = 10_000
    max_in_flight: int = 256
    eject_after: int = 3
    eject_cooldown: float = 10.0
    max_ejected_percent: int = 50
    heartbeat_interval: float = 1.0
    heartbeat_ttl: float = 5.0
    reconcile_interval: float = 30.0
    zk_fallback_after: float | None = None

    def __post_init__(self) -> None:
        checked_id(self.server_id)
        if self.default_timeout_ms > self.max_timeout_ms:
            raise ConfigError("--timeout-ms must not exceed --max-timeout-ms")
        if self.heartbeat_ttl <= self.heartbeat_interval:
            raise ConfigError("--heartbeat-ttl must be longer than --heartbeat-interval")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> SearchServerConfig:
        return cls(
            zk=ZkConfig.from_args(args),
            cluster=ClusterConfig.from_args(args),
            host=args.host,
            port=args.port,
            advertise=advertised_address(args.host, args.advertise),
            server_id=args.id,
            default_timeout_ms=args.timeout_ms,
            max_timeout_ms=args.max_timeout_ms,
            max_in_flight=args.max_in_flight,
            eject_after=args.eject_after,
            eject_cooldown=args.eject_cooldown,
            max_ejected_percent=args.max_ejected_percent,
            heartbeat_interval=args.heartbeat_interval,
            heartbeat_ttl=args.heartbeat_ttl,
            reconcile_interval=args.reconcile_interval,
            zk_fallback_after=args.zk_fallback_after,
        )
