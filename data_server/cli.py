"""``data-server``: one data server; ``data-server fleet``: many; ``data-server loadgen``."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from discovery.cli.entrypoint import configure_logging, run_event_loop, stop_on_signals
from discovery.errors import ConfigError, DiscoveryError

from . import loadgen
from .config import DataServerConfig, FleetConfig, build_fleet_parser, build_parser
from .fleet import exit_worker, run_fleet, run_worker
from .server import DataServer

__all__ = ["main"]

log = logging.getLogger(__name__)


async def serve(config: DataServerConfig) -> None:
    """Run one data server until SIGINT/SIGTERM or ``POST /admin/drain``, then drain."""
    server = DataServer(config)
    stop = stop_on_signals(server.drain_requested)
    try:
        await server.start()
        await stop.wait()
    finally:
        await server.shutdown()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code (0 after a clean drain)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] == "loadgen":
        return loadgen.main(args_list[1:])
    fleet = bool(args_list) and args_list[0] == "fleet"
    parser = build_fleet_parser() if fleet else build_parser()
    args = parser.parse_args(args_list[1:] if fleet else args_list)
    configure_logging(args.log_level)
    try:
        config = FleetConfig.from_args(args) if fleet else DataServerConfig.from_args(args)
    except ConfigError as exc:
        parser.error(str(exc))
    try:
        if isinstance(config, FleetConfig):
            if args.worker is None:
                return run_fleet(config, args_list[1:])
            run_event_loop(run_worker(config, args.worker), args.event_loop)
            exit_worker()
        else:
            run_event_loop(serve(config), args.event_loop)
    except (DiscoveryError, OSError, ValueError) as exc:
        # ZooKeeper unreachable, port taken, a bad --docs-file line: say it, exit 1.
        log.error("%s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
