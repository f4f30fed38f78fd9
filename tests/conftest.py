"""Fixtures: a real ZooKeeper and a real redis-server for the whole run.

The servers are started once per test session by the same code that backs
``discovery devcluster``, on free loopback ports in a temporary directory, with a
short ZooKeeper tick so that session timeouts of a second or two are allowed. Each
test gets its own ZooKeeper chroot and Redis key prefix, so tests never see each
other's nodes or keys; fault tests that stop a server get a server of their own.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from kazoo.client import KazooClient
from prometheus_client import CollectorRegistry
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from data_server.config import DataServerConfig
from data_server.server import DataServer
from discovery.config import AgentConfig, ClusterConfig, RedisConfig, ZkConfig
from discovery.livelist.model import LiveListStore
from discovery.testing import RedisServer, ZooKeeperEnsemble
from discovery.testing.netns import NetworkLab, netns_available
from discovery.testing.simfleet import SimulatedFleet
from discovery.zk.session import ZkSession
from search_server.config import SearchServerConfig
from search_server.picking import ReplicaPicker
from search_server.server import SearchServer
from tests.support import (
    FAST_AGENT,
    DataServerFactory,
    SearchServerFactory,
    SessionFactory,
    bounded_teardown,
    cluster_of,
    eventually,
)

#: Fixtures that start a real server, network namespaces or a subprocess of one, by the
#: marker a test using any of them (through any chain of fixtures) gets. A new fixture
#: that starts a server belongs here unless it uses one of these already. Names are
#: matched in the test's fixture closure, so a module's own fixture of the same name as
#: one here (``client``) is told apart by what it depends on, not by its name.
TIER_FIXTURES: dict[str, frozenset[str]] = {
    "integration": frozenset(
        {
            # conftest.py: the session servers and the servers of a test's own
            "zk_server",
            "redis_server",
            "own_zk_server",
            "zk_ensemble",
            "own_redis",
            "lab",  # network namespaces (root, iptables); lab_zk and lab_redis use it
            # modules' own servers
            "sentinel_group",  # test_livelist_ha.py, test_store_conformance.py
            "acl_redis",  # test_redis_auth.py
            "tls_redis",  # test_redis_auth.py
            "tls_zk",  # test_zk_tls.py
            "dist",  # test_package.py: `python -m build`, then pip into an empty venv
        }
    ),
    # test_compose.py: `docker-compose config` (the binary, not an engine)
    "docker": frozenset({"compose"}),
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with the tier of the fixtures it uses (see :data:`TIER_FIXTURES`),
    so that no test file has to repeat what its fixtures already say."""
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        for marker, fixtures in TIER_FIXTURES.items():
            if used & fixtures:
                item.add_marker(marker)


# Fast enough to expire a session in ~1 s, slow enough for a loaded 2-core CI box.
TICK_TIME_MS = 100
SESSION_TIMEOUT = 2.0


def start_ensemble(workdir: Path, size: int = 1) -> ZooKeeperEnsemble:
    ensemble = ZooKeeperEnsemble(size, workdir, tick_time_ms=TICK_TIME_MS)
    ensemble.start()
    return ensemble


@pytest.fixture(scope="session")
def zk_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperEnsemble]:
    """One standalone ZooKeeper shared by the run; tests must not stop it."""
    ensemble = start_ensemble(tmp_path_factory.mktemp("zk"))
    yield ensemble
    ensemble.stop()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One redis-server shared by the run; tests must not stop it."""
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def own_zk_server(tmp_path: Path) -> Iterator[ZooKeeperEnsemble]:
    """A standalone ZooKeeper for this test alone, which it may stop and restart."""
    ensemble = start_ensemble(tmp_path / "zk")
    yield ensemble
    ensemble.stop()


@contextlib.contextmanager
def chroot_on(servers: str, label: str) -> Iterator[str]:
    """Create a fresh chroot on ``servers``; yield the hosts string with it; delete it."""
    name = "".join(c if c.isalnum() else "_" for c in label)[:60]
    chroot = f"/test-{name}-{uuid.uuid4().hex[:8]}"
    admin = KazooClient(hosts=servers, timeout=10)
    admin.start(timeout=15)
    try:
        admin.ensure_path(chroot)
        yield servers + chroot
        with contextlib.suppress(Exception):
            admin.delete(chroot, recursive=True)
    finally:
        admin.stop()
        admin.close()


@pytest.fixture
def chroot(request: pytest.FixtureRequest) -> Iterator[Callable[[str], str]]:
    """``chroot(servers)`` gives a hosts string with a fresh chroot, removed afterwards."""
    with contextlib.ExitStack() as stack:
        yield lambda servers: stack.enter_context(chroot_on(servers, request.node.name))


@pytest.fixture
def zk_hosts(zk_server: ZooKeeperEnsemble, chroot: Callable[[str], str]) -> str:
    """A kazoo hosts string for the shared server with a fresh chroot of this test's own."""
    return chroot(zk_server.hosts)


@pytest.fixture
def zk_ensemble(tmp_path: Path) -> Iterator[ZooKeeperEnsemble]:
    """A 3-server ensemble for this test alone, which it may stop servers of."""
    ensemble = start_ensemble(tmp_path / "ensemble", size=3)
    yield ensemble
    ensemble.stop()


@pytest.fixture
def redis_prefix(redis_server: RedisServer, request: pytest.FixtureRequest) -> Iterator[str]:
    """A Redis key prefix of this test's own; its keys are deleted afterwards."""
    import redis

    # Layout 2's prefix: the cluster name in braces (a Redis Cluster hash tag).
    prefix = "discovery:{test-" + uuid.uuid4().hex[:12] + "}"
    yield prefix
    client = redis.Redis.from_url(redis_server.url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}:*"))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


@pytest.fixture
def lab() -> Iterator[NetworkLab]:
    """A network lab (:class:`NetworkLab`) for this test: hosts in namespaces, cuts.

    Skips the test where namespaces cannot be made (not root, no iptables); the
    Makefile installs what it needs and CI runs as root.
    """
    reason = netns_available()
    if reason is not None:
        pytest.skip(reason)
    with NetworkLab() as network:
        yield network


@pytest.fixture
def lab_zk(lab: NetworkLab, tmp_path: Path) -> Iterator[ZooKeeperEnsemble]:
    """A standalone ZooKeeper on the lab's gateway, reachable from every lab host."""
    ensemble = ZooKeeperEnsemble(1, tmp_path / "zk", tick_time_ms=TICK_TIME_MS, host=lab.gateway)
    ensemble.start()
    yield ensemble
    ensemble.stop()


@pytest.fixture
def lab_redis(lab: NetworkLab, tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis on the lab's gateway, reachable from every lab host."""
    redis = RedisServer(tmp_path / "redis", host=lab.gateway)
    redis.start()
    yield redis
    redis.stop()


@pytest.fixture
def registry() -> CollectorRegistry:
    """A fresh metrics registry (never the global one)."""
    return CollectorRegistry()


@pytest.fixture
async def make_session(zk_hosts: str) -> AsyncIterator[SessionFactory]:
    """Start ZooKeeper sessions in this test's chroot; all are closed afterwards."""
    sessions: list[ZkSession] = []

    async def make(
        hosts: str | None = None,
        *,
        session_timeout: float = SESSION_TIMEOUT,
        registry: CollectorRegistry | None = None,
        auth: str | None = None,
        operation_timeout: float | None = None,
    ) -> ZkSession:
        config = ZkConfig(
            hosts=hosts or zk_hosts,
            session_timeout=session_timeout,
            operation_timeout=operation_timeout,
            connect_timeout=20.0,
            auth=auth,
        )
        session = ZkSession.from_config(config, registry=registry)
        sessions.append(session)
        await session.start()
        return session

    yield make
    await bounded_teardown("sessions", *(session.aclose() for session in sessions))


@pytest.fixture
async def zk_session(make_session: SessionFactory) -> ZkSession:
    return await make_session()


@pytest.fixture
async def make_data_server(zk_hosts: str) -> AsyncIterator[DataServerFactory]:
    """Start in-process data servers (own port, agent, session); all shut down afterwards."""
    servers: list[DataServer] = []

    async def make(
        *,
        agent: AgentConfig = FAST_AGENT,
        admin_token: str | None = None,
        zk_auth: str | None = None,
        **fields: object,
    ) -> DataServer:
        fields.setdefault("docs", 300)
        config = DataServerConfig(
            zk=ZkConfig(
                hosts=zk_hosts, session_timeout=SESSION_TIMEOUT, connect_timeout=20, auth=zk_auth
            ),
            cluster=ClusterConfig(admin_token=admin_token),
            agent=agent,
            port=0,
            **fields,  # type: ignore[arg-type]
        )
        server = DataServer(config)
        servers.append(server)
        await server.start()
        agent = server.agent
        assert agent is not None
        await eventually(lambda: agent.status().registered, message="data server registered")
        return server

    yield make
    await bounded_teardown("data servers", *(server.shutdown(grace=0) for server in servers))


@pytest.fixture
async def make_search_server(
    zk_hosts: str, redis_server: RedisServer, redis_prefix: str
) -> AsyncIterator[SearchServerFactory]:
    """Start in-process search servers sharing this test's chroot and Redis prefix."""
    servers: list[SearchServer] = []
    cluster = cluster_of(redis_prefix)

    async def make(
        *,
        redis_url: str | None = None,
        redis: RedisConfig | None = None,
        zk: str | None = None,
        session_timeout: float = SESSION_TIMEOUT,
        zk_auth: str | None = None,
        store: LiveListStore | None = None,
        picker: ReplicaPicker | None = None,
        **fields: object,
    ) -> SearchServer:
        fields.setdefault("heartbeat_interval", 0.2)
        fields.setdefault("heartbeat_ttl", 2.0)
        fields.setdefault("reconcile_interval", 1.0)
        # A budget no load on a test machine exhausts, for a query that gives none: a
        # test that expects a complete answer gets one however slow the machine is, and
        # a test of deadlines says its own (timeout_ms).
        fields.setdefault("default_timeout_ms", 5000)
        config = SearchServerConfig(
            zk=ZkConfig(
                hosts=zk or zk_hosts,
                session_timeout=session_timeout,
                connect_timeout=20,
                auth=zk_auth,
            ),
            cluster=ClusterConfig(
                cluster=cluster,
                redis_url=redis_url or redis_server.url,
                redis=redis or RedisConfig(),
            ),
            port=0,
            **fields,  # type: ignore[arg-type]
        )
        server = SearchServer(config, store=store, picker=picker)
        servers.append(server)
        await server.start()
        return server

    yield make
    await bounded_teardown("search servers", *(server.shutdown() for server in servers))


def fast_redis_client(url: str) -> aioredis.Redis:
    """A client that fails within a fraction of a second when Redis is down, but retries
    a command once on a fresh connection (after a restart the pooled one is dead)."""
    return aioredis.Redis.from_url(
        url,
        retry=Retry(ExponentialBackoff(cap=0.05, base=0.01), 2),
        socket_timeout=5,
        socket_connect_timeout=1,
    )


@pytest.fixture
async def client(redis_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    """A client of the shared Redis (use with ``redis_prefix``; never flush it)."""
    client = aioredis.Redis.from_url(redis_server.url)
    yield client
    await client.aclose()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server for this test alone, which it may flush, stop and restart."""
    server = RedisServer(tmp_path / "own-redis")
    server.start()
    yield server
    server.stop()


@pytest.fixture
async def own_client(own_redis: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = fast_redis_client(own_redis.url)
    yield client
    await client.aclose()


@pytest.fixture
async def fleet_of(zk_hosts: str) -> AsyncIterator[Callable[..., SimulatedFleet]]:
    """Simulated fleets (``discovery.testing.simfleet``) in this test's chroot, closed
    afterwards (the test starts them)."""
    fleets: list[SimulatedFleet] = []

    def make(**fields: object) -> SimulatedFleet:
        fleet = SimulatedFleet(ZkConfig(hosts=zk_hosts, session_timeout=10.0), **fields)  # type: ignore[arg-type]
        fleets.append(fleet)
        return fleet

    yield make
    for fleet in fleets:
        await fleet.aclose()
