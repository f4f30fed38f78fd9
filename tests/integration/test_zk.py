"""The asyncio ZooKeeper session against a real server."""

from __future__ import annotations

import asyncio
import threading

import pytest
from prometheus_client import CollectorRegistry

from discovery.config import ZkConfig
from discovery.errors import (
    ConfigError,
    ZkAuthError,
    ZkBadVersionError,
    ZkConnectionError,
    ZkNodeExistsError,
    ZkNoNodeError,
)
from discovery.testing import free_port
from discovery.zk.expiry import expire_session
from discovery.zk.session import SessionState, WatchEvent, ZkSession
from tests.support import SessionFactory, waited, within


async def test_operations_round_trip_and_errors_are_translated(zk_session: ZkSession) -> None:
    path = await zk_session.create("/a/b", b"one", makepath=True)
    assert path == "/a/b"
    data, stat = await zk_session.get("/a/b")
    assert (data, stat.version, stat.ephemeral_owner) == (b"one", 0, 0)
    assert await zk_session.get_children("/a") == ["b"]
    stat = await zk_session.set("/a/b", b"two", version=0)
    assert stat.version == 1

    with pytest.raises(ZkNodeExistsError):
        await zk_session.create("/a/b")
    with pytest.raises(ZkBadVersionError):
        await zk_session.set("/a/b", b"three", version=0)
    with pytest.raises(ZkNoNodeError):
        await zk_session.get("/missing")
    assert await zk_session.exists("/missing") is None
    await zk_session.delete("/a/b", version=1)
    assert await zk_session.exists("/a/b") is None


async def test_watch_callbacks_run_on_the_event_loop(make_session: SessionFactory) -> None:
    session, other = await make_session(), await make_session()
    await session.create("/w", b"")
    fired: asyncio.Future[tuple[WatchEvent, int]] = asyncio.get_running_loop().create_future()

    def on_change(event: WatchEvent) -> None:
        fired.set_result((event, threading.get_ident()))

    await session.get("/w", watch=on_change)
    await other.set("/w", b"changed")

    event, thread = await waited(fired, "the watch callback on /w", timeout=10)
    assert (event.kind, event.path) == ("changed", "/w")
    assert thread == threading.get_ident()


async def test_start_fails_clearly_when_no_server_answers() -> None:
    config = ZkConfig(hosts=f"127.0.0.1:{free_port()}", session_timeout=2, connect_timeout=1)
    session = ZkSession.from_config(config)
    with pytest.raises(ZkConnectionError, match="answered within 1s"):
        await session.start()
    await session.aclose()


async def test_expiry_is_reported_as_lost_then_a_new_session(make_session: SessionFactory) -> None:
    registry = CollectorRegistry()
    session = await make_session(registry=registry)
    events = session.subscribe()
    old = session.session_id

    new = await expire_session(session)

    states = []
    async with within(30, "the session events up to CONNECTED after the expiry"):
        async for event in events:
            states.append((event.state, event.new_session))
            if event.state is SessionState.CONNECTED:
                break
    assert states[-2:] == [(SessionState.LOST, False), (SessionState.CONNECTED, True)]
    assert new != old
    assert session.session_id == new
    assert registry.get_sample_value("discovery_zk_sessions_total") == 2
    assert registry.get_sample_value("discovery_zk_connected") == 1
    events.close()


async def test_close_ends_subscriptions_and_deletes_ephemeral_nodes(
    make_session: SessionFactory,
) -> None:
    session, observer = await make_session(), await make_session()
    await session.create("/eph", ephemeral=True)
    events = session.subscribe()

    await session.aclose()

    async with within(10, "the subscription to end after close"):
        assert [event.state async for event in events] == [SessionState.CLOSED]
    assert await observer.exists("/eph") is None
    with pytest.raises(ZkConnectionError):
        await session.get("/")


async def test_digest_auth_protects_our_nodes_but_lets_everyone_read(
    make_session: SessionFactory,
) -> None:
    owner = await make_session(auth="agent:secret")
    stranger = await make_session()
    # Deleting a child needs DELETE on its parent: the directory must be ours too.
    await owner.ensure_path("/dir")
    await owner.create("/dir/protected", b"mine", ephemeral=True)

    data, _ = await stranger.get("/dir/protected")
    assert data == b"mine"
    assert await stranger.get_children("/dir") == ["protected"]
    with pytest.raises(ZkAuthError):
        await stranger.set("/dir/protected", b"theirs")
    with pytest.raises(ZkAuthError):
        await stranger.delete("/dir/protected")
    with pytest.raises(ZkAuthError):
        await stranger.create("/dir/squatter", b"")
    await owner.set("/dir/protected", b"still mine")


def test_config_rejects_bad_values() -> None:
    with pytest.raises(ConfigError, match="DISCOVERY_ZK_HOSTS"):
        ZkConfig(hosts=" ")
    with pytest.raises(ConfigError, match="user:password"):
        ZkConfig(hosts="127.0.0.1:2181", auth="nocolon")
    with pytest.raises(ConfigError, match="session_timeout"):
        ZkConfig(hosts="127.0.0.1:2181", session_timeout=0)
