"""The session watchdog and the checks that catch a session ZooKeeper closed silently.

A link that drops every packet (:class:`~discovery.testing.TcpProxy` blackholed) is
the deterministic form of the hang seen in chaos runs: kazoo stays SUSPENDED for as
long as the link is dead, although the server expired the session long ago. The
watchdog declares it LOST one session timeout after the disconnect and starts a new
client, so the agent registers again as soon as the link is back.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from discovery.agent.agent import Agent
from discovery.config import ZkConfig
from discovery.testing import TcpProxy, ZooKeeperEnsemble
from discovery.zk.paths import DATA_SERVERS_PATH
from discovery.zk.registration import VERIFY_AFTER_CONNECT, Registration
from discovery.zk.session import SessionState
from tests.conftest import SESSION_TIMEOUT
from tests.support import (
    FAST_AGENT,
    Healthy,
    SearchServerFactory,
    SessionFactory,
    absent,
    eventually,
    make_instance,
    next_change,
    published_term,
    sample,
    waited,
)


@pytest.fixture
def proxy(zk_server: ZooKeeperEnsemble) -> Iterator[TcpProxy]:
    """A cuttable link to the shared ZooKeeper server."""
    host, port = zk_server.hosts.split(",")[0].rsplit(":", 1)
    with TcpProxy(host, int(port)) as link:
        yield link


@pytest.fixture
def proxied(zk_server: ZooKeeperEnsemble, zk_hosts: str, proxy: TcpProxy) -> str:
    """This test's hosts string (same chroot), through the proxy."""
    return zk_hosts.replace(zk_server.hosts, proxy.address)


async def test_a_dead_link_is_declared_lost_within_the_bound_and_a_new_client_reconnects(
    make_session: SessionFactory, proxy: TcpProxy, proxied: str
) -> None:
    registry = CollectorRegistry()
    session = await make_session(proxied, registry=registry)
    observer = await make_session()
    await session.create("/mine", b"x", ephemeral=True)
    old_id, old_client = session.session_id, session.client
    events = session.subscribe()

    proxy.blackhole()
    await next_change(events, lambda e: e.state is SessionState.SUSPENDED, "SUSPENDED")
    # kazoo by itself stays SUSPENDED while the link is dead; LOST is the watchdog's.
    lost = await next_change(
        events, lambda e: e.state is SessionState.LOST, "LOST", timeout=4 * SESSION_TIMEOUT
    )
    assert proxy.blackholed
    assert lost.session_id == old_id
    assert sample(registry, "discovery_zk_watchdog_expiries_total") == 1
    await eventually(
        lambda: session.client is not old_client, timeout=5, message="the client replaced"
    )
    assert sample(registry, "discovery_zk_client_rebuilds_total", reason="watchdog") == 1
    # The declaration is the truth: the server has expired the session by then.
    await eventually(lambda: absent(observer, "/mine"), timeout=SESSION_TIMEOUT, message="gone")

    proxy.heal()
    connected = await next_change(
        events, lambda e: e.state is SessionState.CONNECTED, "a new session", timeout=20
    )
    assert connected.new_session
    assert connected.session_id not in (None, old_id)
    await session.create("/mine", b"y", ephemeral=True)
    events.close()


async def test_the_watchdog_backs_off_while_zookeeper_stays_unreachable(
    make_session: SessionFactory, proxy: TcpProxy, proxied: str
) -> None:
    registry = CollectorRegistry()
    session = await make_session(proxied, registry=registry)
    events = session.subscribe()
    proxy.blackhole()
    await next_change(
        events, lambda e: e.state is SessionState.LOST, "LOST", timeout=4 * SESSION_TIMEOUT
    )
    # One rebuild per bound would churn clients (and threads); the second waits twice
    # as long, the third four times.
    await eventually(
        lambda: sample(registry, "discovery_zk_client_rebuilds_total", reason="watchdog") >= 2,
        timeout=6 * SESSION_TIMEOUT,
        message="a second rebuild",
    )
    assert session.state is SessionState.LOST
    proxy.heal()
    await next_change(
        events, lambda e: e.state is SessionState.CONNECTED, "reconnected", timeout=30
    )
    events.close()


async def test_an_agent_behind_a_dead_link_registers_again_once_it_heals(
    make_session: SessionFactory, proxy: TcpProxy, proxied: str
) -> None:
    observer = await make_session()
    path = f"{DATA_SERVERS_PATH}/ds-cut"
    agent = Agent(make_instance("ds-cut", 9301), Healthy(), zk=_zk(proxied), config=FAST_AGENT)
    async with agent:
        agent.set_ready()
        await eventually(lambda: agent.status().registered, message="registered")
        first = agent.session.session_id if agent.session else None

        proxy.blackhole()
        # The server expires the session: every reader sees the data server go.
        await eventually(
            lambda: absent(observer, path), timeout=4 * SESSION_TIMEOUT, message="gone"
        )
        await eventually(
            lambda: not agent.status().registered,
            timeout=4 * SESSION_TIMEOUT,
            message="presumed gone",
        )

        proxy.heal()

        async def registered_anew() -> bool:
            stat = await observer.exists(path)
            session = agent.session
            return (
                stat is not None
                and session is not None
                and stat.ephemeral_owner == session.session_id != first
            )

        await eventually(registered_anew, timeout=20, message="registered in a new session")


async def test_a_registration_whose_node_vanished_without_an_event_notices_and_recreates_it(
    make_session: SessionFactory,
) -> None:
    # The symptom of a client connected to a session the ensemble closed: the node is
    # gone and no watch fires. Dropping kazoo's own record of our watch reproduces it.
    session, observer = await make_session(), await make_session()
    registry = CollectorRegistry()
    registration = Registration(
        session, make_instance("ds-quiet", 9302), registry=registry, verify_interval=0.2
    )
    path = registration.path
    await registration.register()
    # kazoo forgets its one-shot watcher of our node (a watch lost, as a bug or a
    # dropped notification would lose it): only kazoo's own table can do that.
    session.client._data_watchers.clear()
    await observer.delete(path)
    stat = await eventually(lambda: observer.exists(path), timeout=10, message="re-created")
    assert stat.ephemeral_owner == session.session_id
    assert sample(registry, "discovery_registration_vanished_total") == 1
    await registration.aclose()


async def test_a_registration_reads_its_node_back_after_a_reconnection_not_only_in_its_sweep(
    make_session: SessionFactory, proxy: TcpProxy, proxied: str
) -> None:
    """A zombie session comes of a reconnection: the node is read back within seconds
    of one, though the slow sweep is an hour away."""
    session, observer = await make_session(proxied), await make_session()
    registry = CollectorRegistry()
    registration = Registration(
        session,
        make_instance("ds-reconnected", 9303),
        registry=registry,
        verify_interval=3600.0,
        rng=random.Random(5),
    )
    path = registration.path
    await registration.register()
    events = session.subscribe()
    proxy.reset()  # the connection drops; the same session reconnects
    await next_change(
        events,
        lambda e: e.state is SessionState.CONNECTED and not e.new_session,
        "reconnected in the same session",
        timeout=20,
    )
    events.close()
    # The reconnection fired the node's watch (kazoo's NONE event): wait until the
    # registration has set it again, then make the node vanish as a zombie session's
    # does, with no event: kazoo forgets the watcher, another session deletes the node.
    # (kazoo keys its watchers by the full path, chroot included.)
    await eventually(
        lambda: any(k.endswith(path) and w for k, w in session.client._data_watchers.items()),
        message="re-armed",
    )
    session.client._data_watchers.clear()
    await observer.delete(path)
    stat = await eventually(
        lambda: observer.exists(path),
        timeout=1.5 * VERIFY_AFTER_CONNECT[1] + 5,
        message="re-created by a check after the reconnection",
    )
    assert stat.ephemeral_owner == session.session_id
    assert sample(registry, "discovery_registration_vanished_total") == 1
    await registration.aclose()


def _zk(hosts: str) -> ZkConfig:
    return ZkConfig(hosts=hosts, session_timeout=SESSION_TIMEOUT, connect_timeout=20)


async def test_a_leader_whose_election_node_vanished_without_an_event_resigns(
    make_search_server: SearchServerFactory, make_session: SessionFactory
) -> None:
    # A leader never watches its own node, so nothing tells it the node is gone (as in
    # a session the ensemble closed under a still-connected client): it reads it back.
    leader = await make_search_server(server_id="ss-quiet")
    observer = await make_session()
    term = await published_term(leader)
    assert leader.reader is not None
    assert leader.election is not None
    await observer.delete(term.node)
    await waited(
        leader.reader.wait_until(
            lambda live: live.leader == "ss-quiet" and live.epoch > term.epoch, timeout=15
        ),
        "a list of a new, higher epoch",
    )
    assert leader.election.terms >= 2
