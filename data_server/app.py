"""The data server's aiohttp application and its ZooKeeper registration.

Resources live in ``cleanup_ctx`` (the ZooKeeper session) and the registration is
made only after the site is listening, so a search server never routes to a port
that is not open yet.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import AsyncIterator

from aiohttp import web
from prometheus_client import CollectorRegistry

from discovery.instance import InstancePayload, InstanceState, ServiceInstance
from discovery.registration import Registration
from discovery.zk import ZkSession

from .config import DataServerConfig

__all__ = ["make_app", "serve"]

log = logging.getLogger(__name__)

CONFIG = web.AppKey("config", DataServerConfig)
REGISTRY = web.AppKey("registry", CollectorRegistry)
SESSION = web.AppKey("session", ZkSession)
READY = web.AppKey("ready", asyncio.Event)


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    if request.app[READY].is_set():
        return web.json_response({"status": "ready"})
    return web.json_response({"status": "starting"}, status=503)


async def _zk_session(app: web.Application) -> AsyncIterator[None]:
    session = ZkSession.from_config(app[CONFIG].zk, registry=app[REGISTRY])
    await session.start()
    app[SESSION] = session
    yield
    await session.aclose()


def make_app(config: DataServerConfig, registry: CollectorRegistry) -> web.Application:
    app = web.Application()
    app[CONFIG] = config
    app[REGISTRY] = registry
    app[READY] = asyncio.Event()
    app.cleanup_ctx.append(_zk_session)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


async def serve(config: DataServerConfig) -> None:
    """Listen, register, and run until SIGINT/SIGTERM; then deregister and stop."""
    registry = CollectorRegistry()
    app = make_app(config, registry)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        site = web.TCPSite(runner, config.host, config.port)
        await site.start()
        port = runner.addresses[0][1]
        instance = ServiceInstance.create(
            "data_servers",
            config.instance_id or f"ds-{config.advertise}-{port}",
            config.advertise,
            port,
            InstancePayload(
                shard=config.shard,
                replica=config.replica,
                docs=config.docs,
                version="0.1.0",
                state=InstanceState.SERVING,
            ),
        )
        async with Registration(app[SESSION], instance, registry=registry):
            app[READY].set()
            log.info("data server %s serving on %s:%d", instance.id, config.host, port)
            await stop.wait()
            log.info("stopping data server %s", instance.id)
    finally:
        await runner.cleanup()
