"""A health probe of your own: the server is healthy only while it answers AND its index
is in place AND the index's disk has room.

What it shows: a :class:`discovery.Probe` is any object with ``async def check()`` that
returns when healthy and raises (best :class:`discovery.ProbeFailed`, with the reason)
when not. The agent runs it on its own thread with a timeout, takes the server offline
after ``fall`` failed checks in a row (the reason is logged) and registers it again
after ``rise`` good ones. Here it wraps the usual :class:`discovery.SearchProbe` and
adds two checks of the server's own: the index file (``--index``) exists and is not
empty, and its disk has at least ``--min-free-mb`` free. Remove the file and the server
goes offline within about three seconds; put it back and it returns.

Run it against ``discovery devcluster`` (paste the ``export`` lines it prints first)::

    echo docs > /tmp/shard-0.idx
    python examples/custom_probe.py --port 9003 --id ds-3 --index /tmp/shard-0.idx
    rm /tmp/shard-0.idx   # offline; `echo docs > /tmp/shard-0.idx` brings it back

It listens and registers on 127.0.0.1 to stay short: aiohttp_data_server.py has the
flags a deployment needs.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import signal
from pathlib import Path

from aiohttp import web

from discovery import (
    Agent,
    InstancePayload,
    InstanceState,
    Probe,
    ProbeFailed,
    SearchProbe,
    ServiceInstance,
    ZkConfig,
)


class IndexProbe:
    """``server``'s probe, then: ``index`` is a non-empty file on a disk with at least
    ``min_free_mb`` megabytes free."""

    def __init__(self, server: Probe, index: Path, min_free_mb: int) -> None:
        self.server, self.index, self.min_free_mb = server, index, min_free_mb

    async def check(self) -> None:
        await self.server.check()  # raises ProbeFailed if the server does not answer
        # File system calls can block (a hung NFS mount): not on the agent's event loop.
        await asyncio.to_thread(self._check_index)

    def _check_index(self) -> None:
        try:
            size = self.index.stat().st_size
        except OSError as exc:
            raise ProbeFailed(f"index {self.index}: {exc.strerror}") from None
        if size == 0:
            raise ProbeFailed(f"index {self.index} is empty")
        free_mb = shutil.disk_usage(self.index.parent).free // 2**20
        if free_mb < self.min_free_mb:
            raise ProbeFailed(f"{free_mb} MB free on the index's disk (< {self.min_free_mb})")


async def search(request: web.Request) -> web.Response:
    return web.json_response({"hits": []})  # your index here


async def serve(args: argparse.Namespace) -> None:
    app = web.Application()
    app.router.add_get("/search", search)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", args.port).start()
    payload = InstancePayload(
        shard=args.shard, replica=0, docs=250_000, version="1.4.2", state=InstanceState.SERVING
    )
    instance = ServiceInstance.create("data_servers", args.id, "127.0.0.1", args.port, payload)
    probe = IndexProbe(
        SearchProbe(f"http://127.0.0.1:{args.port}", ["probe query"]), args.index, args.min_free_mb
    )
    async with Agent(instance, probe, zk=ZkConfig(hosts=args.zk)) as agent:
        agent.set_ready()  # registers after the first good probe
        stopping = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(signum, stopping.set)
        await stopping.wait()
        await agent.adrain()  # draining for the grace period, still answering; then removed
    await runner.cleanup()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="A data server with a custom health probe.")
    env = os.environ.get
    zk = env("DISCOVERY_ZK_HOSTS", "127.0.0.1:2181")
    parser.add_argument("--zk", default=zk, help="ZooKeeper hosts[/chroot] ($DISCOVERY_ZK_HOSTS)")
    parser.add_argument("--port", type=int, default=9003, help="port on 127.0.0.1")
    parser.add_argument("--id", default="ds-3", help="instance id")
    parser.add_argument("--shard", type=int, default=0, help="the shard this server holds")
    parser.add_argument("--index", type=Path, required=True, help="the index file to check")
    parser.add_argument("--min-free-mb", type=int, default=100, help="least free disk (MB)")
    return parser.parse_args()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    asyncio.run(serve(parse_args()))
