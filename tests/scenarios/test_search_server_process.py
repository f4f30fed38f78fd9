"""Search servers as real processes: the leader is killed with SIGKILL."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from discovery.testing import RedisServer, free_port
from tests.support import cluster_of, eventually, reap, waited


@contextlib.asynccontextmanager
async def search_server_process(
    zk_hosts: str, redis_url: str, cluster: str, server_id: str, port: int
) -> AsyncIterator[asyncio.subprocess.Process]:
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "search_server.cli", "--zk", zk_hosts, "--redis", redis_url),
        *("--cluster", cluster, "--id", server_id, "--port", str(port)),
        *("--session-timeout", "2", "--heartbeat-interval", "0.2", "--heartbeat-ttl", "2"),
        *("--reconcile-interval", "1", "--log-level", "WARNING"),
    )
    try:
        yield process
    finally:
        await reap(process)


async def _cluster(port: int) -> dict[str, Any] | None:
    try:
        async with (
            aiohttp.ClientSession() as client,
            client.get(f"http://127.0.0.1:{port}/cluster") as response,
        ):
            body: dict[str, Any] = await response.json()
            return body
    except aiohttp.ClientError:
        return None


@pytest.mark.smoke
async def test_killed_leader_is_replaced_by_a_higher_epoch(
    zk_hosts: str, redis_server: RedisServer, redis_prefix: str
) -> None:
    cluster = cluster_of(redis_prefix)
    ports = {"ss-a": free_port(), "ss-b": free_port()}
    async with (
        search_server_process(zk_hosts, redis_server.url, cluster, "ss-a", ports["ss-a"]) as a,
        search_server_process(zk_hosts, redis_server.url, cluster, "ss-b", ports["ss-b"]) as b,
    ):
        processes = {"ss-a": a, "ss-b": b}

        async def agreed_leader() -> dict[str, Any] | None:
            views = [await _cluster(port) for port in ports.values()]
            if any(v is None or v["version"] == 0 for v in views):
                return None
            leaders = {v["leader"] for v in views if v}
            is_leader = [v["self"] for v in views if v and v["is_leader"]]
            if len(leaders) == 1 and is_leader == list(leaders):
                return views[0]
            return None

        before = await eventually(agreed_leader, timeout=30, message="one agreed leader")
        old_leader, old_epoch = before["leader"], before["epoch"]
        survivor = next(name for name in ports if name != old_leader)

        processes[old_leader].send_signal(signal.SIGKILL)
        await waited(processes[old_leader].wait(), f"{old_leader} to exit on SIGKILL", timeout=10)

        async def taken_over() -> dict[str, Any] | None:
            view = await _cluster(ports[survivor])
            if view and view["is_leader"] and view["leader"] == survivor:
                return view
            return None

        after = await eventually(taken_over, timeout=30, message="the survivor leads")
        assert after["epoch"] > old_epoch
        assert after["version"] >= 1
        processes[survivor].send_signal(signal.SIGTERM)
        exited = processes[survivor].wait()
        assert await waited(exited, f"{survivor} to exit after SIGTERM", timeout=20) == 0
