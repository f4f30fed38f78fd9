"""The chaos load's judgement of a query: the harness's own pauses are not the system's.

A real HTTP server stands in for the search server (the judgement is about timing and
bookkeeping, not about search), with the chaos run's own ``Member``, ``Observer`` and
``LoadGenerator``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from aiohttp import web

from discovery.testing.ports import free_port
from discovery.tools.chaos.cluster import ChaosCluster, Member
from discovery.tools.chaos.load import LoadGenerator
from discovery.tools.chaos.observer import Observer

DEADLINE_MS = 100


class _Held:
    """A search server whose answers wait until :attr:`release` is set, as a stopped
    process's would."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.arrived = asyncio.Event()

    async def search(self, request: web.Request) -> web.Response:
        self.arrived.set()
        await self.release.wait()
        return web.json_response({"hits": [], "partial": False, "took_ms": 1.0, "shards": {}})


@pytest.fixture
async def held() -> AsyncIterator[tuple[_Held, int]]:
    server = _Held()
    app = web.Application()
    app.router.add_get("/search", server.search)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        yield server, port
    finally:
        server.release.set()
        await runner.cleanup()


def _load_on(port: int, tmp_path: Path) -> tuple[Member, Observer, LoadGenerator]:
    """One search server member at ``port`` and a load (not started) that sends to it."""
    # A process that is running (no return code), as the cluster's members are.
    member = Member("search-1", port, [], tmp_path / "search-1.log", ready=True)
    member.process = cast(Any, SimpleNamespace(returncode=None, pid=0))
    cluster = cast(ChaosCluster, SimpleNamespace(data={}, search={"search-1": member}))
    observer = Observer(cluster)
    # A rate so low that the load sends nothing of its own during the test.
    load = LoadGenerator(cluster, observer, rate=0.001, deadline_ms=DEADLINE_MS, seed=1)
    return member, observer, load


async def test_a_query_chosen_before_a_pause_and_held_by_it_is_counted_as_disturbed(
    held: tuple[_Held, int], tmp_path: Path
) -> None:
    server, port = held
    member, observer, load = _load_on(port, tmp_path)
    await load.start()
    try:
        # The load chooses the member; before its task first runs, a fault's step pauses
        # it (as ChaosCluster.signal does, without a real process to stop).
        load._launch(member, "alpha beta")
        member.disturbances += 1
        member.paused = True
        await asyncio.wait_for(server.arrived.wait(), 5)
        # Held past its deadline by the pause, then resumed: it answers.
        await asyncio.sleep(DEADLINE_MS * 3 / 1000)  # ok-sleep: the pause's length
        member.paused = False
        server.release.set()
    finally:
        await load.aclose()  # waits for the query in flight, which is judged then
    assert load.stats.disturbed == 1
    assert load.stats.complete == 0
    assert observer.violations == []


async def test_a_query_in_flight_across_a_graceful_stop_and_restart_is_judged(
    held: tuple[_Held, int], tmp_path: Path
) -> None:
    server, port = held
    member, observer, load = _load_on(port, tmp_path)
    await load.start()
    try:
        load._launch(member, "alpha beta")
        await asyncio.wait_for(server.arrived.wait(), 5)
        # A deploy stops it gracefully (ChaosCluster.stop_gracefully's bookkeeping) and
        # starts a new process while the query is still held: the system's to finish,
        # so it is judged (here: over its deadline, a violation), not disturbed.
        member.graceful_stops += 1
        member.ready = False
        member.process = cast(Any, SimpleNamespace(returncode=None, pid=1))
        await asyncio.sleep(DEADLINE_MS * 2 / 1000)  # ok-sleep: past the deadline
        server.release.set()
    finally:
        await load.aclose()
    assert load.stats.disturbed == 0
    assert load.stats.complete == 1
    assert [v.invariant for v in observer.violations] == ["query within deadline + 50 ms"]
