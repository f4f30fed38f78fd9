"""``search-server``: run one search server until SIGINT/SIGTERM."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from discovery.cli.entrypoint import configure_logging, run_event_loop, stop_on_signals
from discovery.errors import ConfigError, DiscoveryError

from .config import SearchServerConfig, build_parser
from .server import SearchServer

__all__ = ["main"]

log = logging.getLogger(__name__)


async def serve(config: SearchServerConfig) -> None:
    server = SearchServer(config)
    stop = stop_on_signals()
    try:
        await server.start()
        await stop.wait()
    finally:
        # A stop signal drains (readiness fails first, in-flight queries finish); a
        # failed start-up has nothing to drain.
        await server.shutdown(grace=config.drain_grace if stop.is_set() else 0.0)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    try:
        config = SearchServerConfig.from_args(args)
    except ConfigError as exc:
        parser.error(str(exc))
    try:
        run_event_loop(serve(config), args.event_loop)
    except (DiscoveryError, OSError) as exc:
        log.error("%s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
