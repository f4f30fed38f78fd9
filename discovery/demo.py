"""``discovery demo``: a local cluster you can watch, in one command.

It starts the development ZooKeeper and Redis (:class:`~discovery.devcluster.DevCluster`),
then data servers and one search server as separate processes (their own console
entry points, so each has its own ZooKeeper session, as in production), prints where
to look, and stops everything on Ctrl-C / SIGTERM or after ``--duration`` seconds.

This is the interim demo of the foundation; the 100-node demo with a dashboard
replaces it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from types import FrameType

from .config import int_range, positive_float
from .devcluster import DevCluster, free_port
from .errors import DevClusterError

__all__ = ["add_parser", "run"]

log = logging.getLogger(__name__)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="run a local ZooKeeper, Redis, data servers and a search server",
        description="Start a local cluster and keep it running until Ctrl-C.",
    )
    parser.add_argument(
        "--data-servers",
        type=int_range(1, 200),
        default=5,
        metavar="N",
        help="data servers [default 5]",
    )
    parser.add_argument(
        "--duration",
        type=positive_float,
        metavar="SECONDS",
        help="stop by itself after this long [default: run until Ctrl-C]",
    )
    parser.set_defaults(func=run)


def _fetch_json(url: str, timeout: float = 2.0) -> object:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.load(response)


def _stop_all(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        process.terminate()
    for process in processes:
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def run(args: argparse.Namespace) -> int:
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    processes: list[subprocess.Popen[bytes]] = []
    deadline = None if args.duration is None else time.monotonic() + args.duration
    try:
        with contextlib.ExitStack() as stack:
            cluster = stack.enter_context(DevCluster(tick_time_ms=500))
            # Registered after the cluster, so it runs first: servers deregister while
            # ZooKeeper is still up.
            stack.callback(_stop_all, processes)
            info = cluster.info()
            common = ["--zk", str(info["zk"]), "--redis", str(info["redis"])]
            common += ["--session-timeout", "4"]
            search_port = free_port()
            processes.append(
                subprocess.Popen(
                    [sys.executable, "-m", "search_server.cli", *common, "--port", str(search_port)]
                )
            )
            for shard in range(args.data_servers):
                processes.append(
                    subprocess.Popen(
                        [
                            *(sys.executable, "-m", "data_server.cli", *common),
                            *("--port", "0", "--shard", str(shard), "--id", f"ds-{shard}"),
                        ]
                    )
                )
            cluster_url = f"http://127.0.0.1:{search_port}/cluster"
            print(f"ZooKeeper {info['zk']}  Redis {info['redis']}", flush=True)
            print(f"search server view: {cluster_url}", flush=True)
            seen = -1
            while not stop.wait(1.0):
                if any(p.poll() is not None for p in processes):
                    log.error("a demo process exited; stopping")
                    return 1
                with contextlib.suppress(OSError, ValueError):
                    view = _fetch_json(cluster_url)
                    servers = view.get("servers", []) if isinstance(view, dict) else []
                    if len(servers) != seen:
                        seen = len(servers)
                        print(f"search server sees {seen} live data servers", flush=True)
                if deadline is not None and time.monotonic() >= deadline:
                    break
            # Stopped by a signal is a normal end; a timed run must have seen them all.
            return 0 if stop.is_set() or seen == args.data_servers else 1
    except DevClusterError as exc:
        print(f"discovery demo: {exc}", file=sys.stderr)
        return 1
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
