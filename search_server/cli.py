"""``search-server``: run one search server until SIGINT/SIGTERM.

:func:`main` is also how a program runs a search server with a replica picker of its
own, with every flag and environment variable of ``search-server``:
``sys.exit(main(picker=MyPicker()))`` (``examples/custom_picker.py``).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from discovery.cli.entrypoint import configure_logging, run_event_loop, stop_on_signals
from discovery.errors import ConfigError, DiscoveryError

from .config import SearchServerConfig, build_parser
from .picking import ReplicaPicker
from .server import SearchServer

__all__ = ["main"]

log = logging.getLogger(__name__)


async def serve(config: SearchServerConfig, picker: ReplicaPicker | None = None) -> None:
    server = SearchServer(config, picker=picker)
    stop = stop_on_signals()
    try:
        await server.start()
        await stop.wait()
    finally:
        # A stop signal drains (readiness fails first, in-flight queries finish); a
        # failed start-up has nothing to drain.
        await server.shutdown(grace=config.drain_grace if stop.is_set() else 0.0)


def main(argv: Sequence[str] | None = None, *, picker: ReplicaPicker | None = None) -> int:
    """Entry point; returns the exit code.

    ``argv`` defaults to the command line. ``picker`` (a
    :class:`~search_server.picking.ReplicaPicker`) replaces the one ``--picker`` names
    for the fan-out of this search server; the rest is as ``search-server`` runs.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    try:
        config = SearchServerConfig.from_args(args)
    except ConfigError as exc:
        parser.error(str(exc))
    try:
        run_event_loop(serve(config, picker), args.event_loop)
    except (DiscoveryError, OSError) as exc:
        log.error("%s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
