"""Settings of one data server, built once from flags and the environment."""

from __future__ import annotations

import argparse
import socket
from dataclasses import dataclass

from discovery.config import (
    COMMON_OPTIONS,
    ZK_OPTIONS,
    ClusterConfig,
    Option,
    ZkConfig,
    add_options,
    port_number,
)
from discovery.errors import ConfigError
from discovery.instance import validate_instance_id

__all__ = ["DataServerConfig", "build_parser"]


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
    return value


SERVER_OPTIONS = (
    Option("--host", "DISCOVERY_HOST", "address to listen on", default="127.0.0.1"),
    Option("--port", "DISCOVERY_PORT", "port to listen on", type=port_number, default=9001),
    Option(
        "--advertise",
        "DISCOVERY_ADVERTISE",
        "address to publish in ZooKeeper (default: --host, or this host's name if 0.0.0.0)",
    ),
    Option("--id", "DISCOVERY_ID", "instance id (default ds-<advertised address>-<port>)"),
    Option("--shard", "DISCOVERY_SHARD", "shard number", type=_non_negative_int, default=0),
    Option("--replica", "DISCOVERY_REPLICA", "replica number", type=_non_negative_int, default=0),
    Option(
        "--docs", "DISCOVERY_DOCS", "generated document count", type=_non_negative_int, default=0
    ),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="data-server", description="Run one data server that registers itself in ZooKeeper."
    )
    add_options(parser, (*ZK_OPTIONS, *COMMON_OPTIONS, *SERVER_OPTIONS))
    return parser


@dataclass(frozen=True)
class DataServerConfig:
    zk: ZkConfig
    cluster: ClusterConfig
    host: str
    port: int
    advertise: str
    instance_id: str | None
    shard: int
    replica: int
    docs: int

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> DataServerConfig:
        advertise = args.advertise or (
            socket.gethostname() if args.host in ("0.0.0.0", "::") else args.host
        )
        instance_id = args.id
        if instance_id is not None:
            try:
                validate_instance_id(instance_id)
            except ValueError as exc:
                raise ConfigError(f"--id / DISCOVERY_ID: {exc}") from None
        return cls(
            zk=ZkConfig.from_args(args),
            cluster=ClusterConfig.from_args(args),
            host=args.host,
            port=args.port,
            advertise=advertise,
            instance_id=instance_id,
            shard=args.shard,
            replica=args.replica,
            docs=args.docs,
        )
