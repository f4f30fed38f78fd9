"""An aiohttp data server that registers itself in ZooKeeper through the discovery agent.

What it shows: the :class:`discovery.Agent` in an aiohttp application's ``cleanup_ctx``.
The agent registers the server once its health probe (a real search against its own
``/search``) passes, takes it offline while probes fail (on a thread of its own, so a
blocked event loop is caught too), re-registers after a session expiry, and drains.

On SIGTERM (or Ctrl+C) :func:`serve` drains before the server stops listening: the node
is marked draining (search servers stop routing here), the server keeps answering for
``--drain-grace`` seconds, then the node is removed and the server stops. aiohttp closes
its listener before it runs any cleanup, hence the drain in :func:`serve`; the
``cleanup_ctx`` still drains when the app runs another way (``web.run_app``), only no
longer listening by then.

Run it against ``discovery devcluster`` (paste the ``export`` lines it prints first)::

    python examples/aiohttp_data_server.py --port 9001 --id ds-1 --shard 0

Every flag has an environment variable, named in ``--help``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from collections.abc import AsyncIterator, Callable, Sequence

from aiohttp import web

from discovery import (
    Agent,
    AgentConfig,
    InstancePayload,
    InstanceState,
    SearchProbe,
    ServiceInstance,
    ZkConfig,
)

AGENT = web.AppKey("agent", Agent)


async def search(request: web.Request) -> web.Response:
    return web.json_response({"hits": []})  # your index here


def make_app(args: argparse.Namespace) -> web.Application:
    """The application: ``/search`` and the agent, started and drained with the app."""

    async def discovery_agent(app: web.Application) -> AsyncIterator[None]:
        payload = InstancePayload(
            shard=args.shard, replica=0, docs=250_000, version="1.4.2", state=InstanceState.SERVING
        )
        instance = ServiceInstance.create(
            "data_servers", args.id, args.advertise, args.port, payload
        )
        local = "127.0.0.1" if args.host in ("", "0.0.0.0") else args.host
        agent = app[AGENT] = Agent(
            instance,
            SearchProbe(f"http://{local}:{args.port}", ["probe query"]),
            zk=ZkConfig(hosts=args.zk),
            config=AgentConfig(drain_grace=args.drain_grace),  # probe schedule, thresholds
        )
        await agent.astart()
        agent.set_ready()  # registers after the first good probe, i.e. once listening
        yield
        await agent.adrain()  # does nothing if serve() drained (web.run_app would not)
        await agent.astop()

    app = web.Application()
    app.router.add_get("/search", search)
    app.cleanup_ctx.append(discovery_agent)
    return app


async def serve(args: argparse.Namespace) -> None:
    """Serve until SIGTERM or SIGINT; then drain while still answering, and stop."""
    app = make_app(args)
    runner = web.AppRunner(app)
    await runner.setup()  # runs discovery_agent up to its yield
    await web.TCPSite(runner, args.host, args.port).start()
    stopping = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(signum, stopping.set)
    await stopping.wait()
    await app[AGENT].adrain()  # draining for the grace period, still answering; then removed
    await runner.cleanup()  # stops listening, then runs the rest of discovery_agent


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="An aiohttp data server with the discovery agent.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    options: list[tuple[str, str, Callable[[str], object], str | None, str]] = [
        ("--zk", "DISCOVERY_ZK_HOSTS", str, "127.0.0.1:2181", "ZooKeeper hosts[/chroot]"),
        ("--host", "DISCOVERY_HOST", str, "127.0.0.1", "address to listen on"),
        ("--port", "DISCOVERY_PORT", int, "9001", "port to listen on"),
        ("--advertise", "DISCOVERY_ADVERTISE", str, "127.0.0.1", "address to be reached at"),
        ("--id", "DISCOVERY_ID", str, None, "instance id (unset: ds-<port>)"),
        ("--shard", "DISCOVERY_SHARD", int, "0", "the shard this server holds"),
        ("--drain-grace", "DISCOVERY_DRAIN_GRACE", float, "5", "seconds to answer while draining"),
    ]
    for flag, variable, kind, default, text in options:
        value = os.environ.get(variable, default)  # a string: argparse converts it with `type`
        parser.add_argument(flag, type=kind, default=value, help=f"{text}; ${variable}")
    args = parser.parse_args(argv)
    args.id = args.id or f"ds-{args.port}"
    return args


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    asyncio.run(serve(parse_args()))
