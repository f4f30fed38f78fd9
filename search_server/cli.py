"""``search-server``: run one search server."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import AsyncIterator, Sequence

from aiohttp import web
from prometheus_client import CollectorRegistry

from discovery.config import COMMON_OPTIONS, ZK_OPTIONS, Option, ZkConfig, add_options, port_number
from discovery.errors import DiscoveryError
from discovery.membership import MembershipWatcher
from discovery.zk import ZkSession

__all__ = ["main"]

log = logging.getLogger(__name__)

SERVER_OPTIONS = (
    Option("--host", "DISCOVERY_HOST", "address to listen on", default="127.0.0.1"),
    Option("--port", "DISCOVERY_PORT", "port to listen on", type=port_number, default=8080),
    Option("--id", "DISCOVERY_ID", "search server id (default ss-<host>-<port>)"),
)

ZK = web.AppKey("zk", ZkConfig)
WATCHER = web.AppKey("watcher", MembershipWatcher)
SELF_ID = web.AppKey("self_id", str)


async def cluster(request: web.Request) -> web.Response:
    watcher = request.app[WATCHER]
    servers = [
        {
            "id": inst.id,
            "address": inst.address,
            "port": inst.port,
            "shard": inst.payload.shard,
            "state": inst.payload.state.value,
        }
        for inst in sorted(watcher.members.values(), key=lambda i: i.id)
    ]
    return web.json_response(
        {"self": request.app[SELF_ID], "generation": watcher.generation, "servers": servers}
    )


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _membership(app: web.Application) -> AsyncIterator[None]:
    registry = CollectorRegistry()
    async with (
        ZkSession.from_config(app[ZK], registry=registry) as session,
        MembershipWatcher(session, registry=registry) as watcher,
    ):
        app[WATCHER] = watcher
        yield


async def _serve(args: argparse.Namespace) -> None:
    app = web.Application()
    app[ZK] = ZkConfig.from_args(args)
    app[SELF_ID] = args.id or f"ss-{args.host}-{args.port}"
    app.cleanup_ctx.append(_membership)
    app.router.add_get("/cluster", cluster)
    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await web.TCPSite(runner, args.host, args.port).start()
        log.info("search server %s on %s:%d", app[SELF_ID], args.host, args.port)
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="search-server", description="Run one search server.")
    add_options(parser, (*ZK_OPTIONS, *COMMON_OPTIONS, *SERVER_OPTIONS))
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        asyncio.run(_serve(args))
    except DiscoveryError as exc:
        log.error("%s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
