"""``data-server``: run one data server."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Sequence

from discovery.errors import DiscoveryError

from .app import serve
from .config import DataServerConfig, build_parser

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        config = DataServerConfig.from_args(args)
    except DiscoveryError as exc:
        parser.error(str(exc))
    try:
        asyncio.run(serve(config))
    except DiscoveryError as exc:
        logging.getLogger("data_server").error("%s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
