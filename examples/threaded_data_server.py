"""A plain threaded HTTP data server (no asyncio) that registers itself through the agent.

What it shows: the :class:`discovery.Agent`'s blocking API in a
``http.server.ThreadingHTTPServer`` program. The agent runs on a thread of its own: it
registers the server once its health probe (a GET of the server's own ``/healthz``)
passes, takes it offline while probes fail, re-registers after a session expiry, and on
SIGTERM (or Ctrl+C) drains: the node is marked draining (search servers stop routing
here), the server keeps answering for ``--drain-grace`` seconds, then the node is
removed and the server stops.

Run it against ``discovery devcluster`` (paste the ``export`` lines it prints first)::

    python examples/threaded_data_server.py --port 9002 --id ds-2 --shard 0

Every flag has an environment variable, named in ``--help``. ``--port 0`` takes any free
port (the agent registers the one bound).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import threading
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from discovery import (
    Agent,
    AgentConfig,
    HttpProbe,
    InstancePayload,
    InstanceState,
    ServiceInstance,
    ZkConfig,
)


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if path == "/healthz":
            self.answer(200, {"status": "ok"})  # check what your server needs to answer
        elif path == "/search":
            self.answer(200, {"hits": []})  # your index here
        else:
            self.answer(404, {"error": "not found"})

    def answer(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass  # no line per request (the probe's included)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, name="http").start()
    payload = InstancePayload(
        shard=args.shard, replica=0, docs=250_000, version="1.4.2", state=InstanceState.SERVING
    )
    instance = ServiceInstance.create(
        "data_servers", args.id or f"ds-{port}", args.advertise, port, payload
    )
    local = "127.0.0.1" if args.host in ("", "0.0.0.0") else args.host
    probe = HttpProbe(f"http://{local}:{port}/healthz")
    config = AgentConfig(drain_grace=args.drain_grace)  # probe schedule, thresholds
    try:
        with Agent(instance, probe, zk=ZkConfig(hosts=args.zk), config=config) as agent:
            agent.set_ready()  # registers after the first good probe
            stop.wait()  # the server answers on its threads meanwhile
            agent.drain()  # draining for the grace period, still answering; then removed
    finally:
        server.shutdown()  # stops listening
        server.server_close()


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="A threaded data server with the discovery agent.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    options: list[tuple[str, str, Callable[[str], object], str | None, str]] = [
        ("--zk", "DISCOVERY_ZK_HOSTS", str, "127.0.0.1:2181", "ZooKeeper hosts[/chroot]"),
        ("--host", "DISCOVERY_HOST", str, "127.0.0.1", "address to listen on"),
        ("--port", "DISCOVERY_PORT", int, "9002", "port to listen on (0: any free port)"),
        ("--advertise", "DISCOVERY_ADVERTISE", str, "127.0.0.1", "address to be reached at"),
        ("--id", "DISCOVERY_ID", str, None, "instance id (unset: ds-<port>)"),
        ("--shard", "DISCOVERY_SHARD", int, "0", "the shard this server holds"),
        ("--drain-grace", "DISCOVERY_DRAIN_GRACE", float, "5", "seconds to answer while draining"),
    ]
    for flag, variable, kind, default, text in options:
        value = os.environ.get(variable, default)  # a string: argparse converts it with `type`
        parser.add_argument(flag, type=kind, default=value, help=f"{text}; ${variable}")
    return parser.parse_args(argv)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    main()
