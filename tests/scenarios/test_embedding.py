"""The agent embedded in a plain threaded server, as examples/threaded_data_server.py
embeds it, in this process: offline while its health check fails, back once it passes,
and departures announced even while a registration is in flight. (The example itself
runs as a process in tests/scenarios/test_examples.py.)"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from discovery import (
    Agent,
    AgentState,
    HttpProbe,
    InstancePayload,
    InstanceState,
    ServiceInstance,
    ZkConfig,
)
from discovery.zk.membership import MembershipWatcher
from discovery.zk.paths import DATA_SERVERS_PATH
from tests.support import FAST_AGENT, SessionFactory, eventually, waited


class Handler(BaseHTTPRequestHandler):
    healthy = True

    def do_GET(self) -> None:
        self.send_response(200 if self.healthy else 503)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: object) -> None:
        pass  # keep test output quiet


@pytest.fixture
def threaded_server() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    thread.join()
    server.server_close()


def _agent(instance_id: str, server: ThreadingHTTPServer, zk_hosts: str) -> Agent:
    """An agent for ``server``, as the example embeds it: its /healthz is the probe."""
    port = server.server_address[1]
    instance = ServiceInstance.create(
        "data_servers",
        instance_id,
        "127.0.0.1",
        port,
        InstancePayload(shard=1, replica=0, docs=10, version="1", state="serving"),
    )
    return Agent(
        instance,
        HttpProbe(f"http://127.0.0.1:{port}/healthz"),
        zk=ZkConfig(hosts=zk_hosts, session_timeout=2),
        config=FAST_AGENT,
    )


@pytest.mark.smoke
async def test_threaded_server_registers_goes_offline_and_drains(
    zk_hosts: str, make_session: SessionFactory, threaded_server: ThreadingHTTPServer
) -> None:
    agent = _agent("ds-threaded", threaded_server, zk_hosts)
    observer = await make_session()
    async with MembershipWatcher(observer, coalesce_window=0) as watcher:
        # The threaded server's side uses the blocking API, as its own code would.
        await asyncio.to_thread(agent.start)
        try:
            agent.set_ready()
            await waited(
                watcher.wait_until(lambda m: "ds-threaded" in m, timeout=10),
                "ds-threaded registered once ready",
            )

            Handler.healthy = False
            await waited(
                watcher.wait_until(lambda m: "ds-threaded" not in m, timeout=10),
                "ds-threaded taken offline by failing probes",
            )
            # The status is published once the deregistration has returned, a moment
            # after the watcher may have seen the node go.
            await eventually(lambda: agent.status().state is AgentState.OFFLINE, message="offline")
            Handler.healthy = True
            await waited(
                watcher.wait_until(lambda m: "ds-threaded" in m, timeout=10),
                "ds-threaded re-registered once healthy",
            )

            drain = asyncio.create_task(asyncio.to_thread(agent.drain, 1.0))
            members = await waited(
                watcher.wait_until(
                    lambda m: m["ds-threaded"].payload.state is InstanceState.DRAINING, timeout=10
                ),
                "ds-threaded marked draining",
            )
            assert not members["ds-threaded"].routable
            await waited(drain, "agent.drain() to return", timeout=30)
            # drain() returns once the node is deleted: it is gone from ZooKeeper at once,
            # and the agent stays draining (healthy probes no longer bring it back)...
            assert await observer.exists(f"{DATA_SERVERS_PATH}/ds-threaded") is None
            assert not agent.status().registered
            assert agent.status().state is AgentState.DRAINING
            # ...and the membership watch sees it leave.
            await waited(
                watcher.wait_until(lambda m: "ds-threaded" not in m, timeout=10),
                "ds-threaded gone from the membership after the drain",
            )
        finally:
            Handler.healthy = True
            await asyncio.to_thread(agent.stop)


@pytest.mark.parametrize("departure", ["drain", "take_offline"])
async def test_a_departure_during_a_registration_in_flight_is_announced(
    zk_hosts: str,
    make_session: SessionFactory,
    threaded_server: ThreadingHTTPServer,
    departure: str,
) -> None:
    # The window CI once hit: the node is created, the agent has not had the reply yet
    # (so it does not count itself registered) and drain() is called. The node must
    # still be marked draining before it goes (and a drain keep its grace), not be
    # deleted unannounced; the same for an operator's take_offline().
    agent = _agent("ds-inflight", threaded_server, zk_hosts)
    test_loop = asyncio.get_running_loop()
    reply = threading.Event()  # holds back the create's reply until the departure began
    released_in_time: list[bool] = []
    observer = await make_session()
    async with MembershipWatcher(observer, coalesce_window=0) as watcher:
        await agent.astart()
        try:
            session = agent.session
            assert session is not None
            create = session.create

            async def create_then_hold(*args: Any, **kwargs: Any) -> str:
                path = await create(*args, **kwargs)
                released_in_time.append(await asyncio.to_thread(reply.wait, 10))
                return path

            session.create = create_then_hold  # type: ignore[method-assign]

            def marked(members: Mapping[str, ServiceInstance]) -> bool:
                node = members.get("ds-inflight")
                return node is not None and node.payload.state is InstanceState.DRAINING

            delete = session.delete

            async def delete_once_seen(*args: Any, **kwargs: Any) -> None:
                # take_offline deletes right after its mark: without this the observer
                # (a watch, then a read) can find the node gone before it reads the
                # mark, and could not tell that from a node deleted unannounced. A
                # node deleted unmarked waits here in vain and fails the test below.
                # This runs on the agent's loop thread; the watcher belongs to the
                # test's loop (its condition is bound to the loop that first waits on
                # it), so the wait runs there.
                seen = asyncio.run_coroutine_threadsafe(
                    watcher.wait_until(marked, timeout=10), test_loop
                )
                await waited(asyncio.wrap_future(seen), "the mark, seen")
                await delete(*args, **kwargs)

            session.delete = delete_once_seen  # type: ignore[method-assign]
            agent.set_ready()
            await waited(
                watcher.wait_until(lambda m: "ds-inflight" in m, timeout=10),
                "ds-inflight created",
            )
            assert not agent.status().registered  # the reply is held back

            if departure == "drain":
                leaving = asyncio.ensure_future(agent.adrain(grace=1.0))
                state, reason = AgentState.DRAINING, "draining"
            else:
                leaving = asyncio.ensure_future(agent.atake_offline("test"))
                state, reason = AgentState.ADMIN_OFFLINE, "offline: test"
            await eventually(lambda: agent.status().state is state, message=f"{departure} begun")
            released = time.monotonic()
            reply.set()
            members = await waited(
                watcher.wait_until(
                    lambda m: (
                        "ds-inflight" not in m
                        or m["ds-inflight"].payload.state is InstanceState.DRAINING
                    ),
                    timeout=10,
                ),
                "ds-inflight marked draining or gone",
            )
            assert "ds-inflight" in members, "the node went without being marked draining"
            assert members["ds-inflight"].payload.reason == reason
            assert not members["ds-inflight"].routable
            await waited(leaving, f"{departure} to return", timeout=30)
            if departure == "drain":
                # The grace is kept: counted from the reply, which precedes the mark.
                assert time.monotonic() - released >= 1.0
            assert await observer.exists(f"{DATA_SERVERS_PATH}/ds-inflight") is None
            assert agent.status().state is state
            assert released_in_time == [True]  # the test released it, not the timeout
        finally:
            reply.set()
            await agent.astop()
