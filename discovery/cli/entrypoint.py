"""What every console entry point does the same way: logging and stop signals.

Only entry points call these: library code never configures logging or installs
signal handlers.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = [
    "LOG_FORMAT",
    "add_verbose_flag",
    "configure_logging",
    "run_event_loop",
    "stop_on_signals",
]

T = TypeVar("T")

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging(level: str) -> None:
    """Log to stderr at ``level`` (a name such as ``INFO``) in the common format."""
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT, stream=sys.stderr)


def stop_on_signals(event: asyncio.Event | None = None) -> asyncio.Event:
    """Return ``event`` (or a new one), set on SIGINT or SIGTERM by the running loop."""
    stop = event if event is not None else asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    return stop


def add_verbose_flag(parser: argparse.ArgumentParser) -> None:
    """``-v``/``--verbose`` for a one-shot subcommand, which then logs at WARNING by
    default: ``-v`` logs INFO (kazoo's connection attempts), ``-vv`` DEBUG."""
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="log more: -v INFO (connection attempts), -vv DEBUG [default: warnings only]",
    )


def run_event_loop(main: Coroutine[Any, Any, T], event_loop: str = "uvloop") -> T:
    """Run ``main`` to completion on a new loop of the kind ``event_loop`` names.

    ``uvloop`` (the default of the servers' ``--event-loop``) roughly halves the CPU a
    request costs on the loop; ``asyncio`` is the standard library's loop, for
    debugging or where uvloop is missing. Everything of ours runs on either: kazoo's
    threads hand work to the loop only with ``call_soon_threadsafe``.
    """
    if event_loop == "uvloop":
        import uvloop

        factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    elif event_loop == "asyncio":
        factory = asyncio.new_event_loop
    else:
        raise ValueError(f"unknown event loop {event_loop!r}: uvloop or asyncio")
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
