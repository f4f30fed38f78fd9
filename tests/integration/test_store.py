"""The live-list store seam: the Redis store against a real redis-server, the leader
publishing through a store of another kind under a real election, and search servers
sharing a ``memory://`` store. What every store must keep is checked for each by
tests/integration/test_store_conformance.py (:mod:`discovery.testing.storecontract`)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping

import pytest
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry

from discovery.config import ClusterConfig
from discovery.errors import (
    ConfigError,
    MalformedLiveListError,
    RedisUnavailableError,
    StoreError,
)
from discovery.instance import ServiceInstance
from discovery.leader import LeaderDuty
from discovery.livelist.model import LiveList, LiveListFollower, LiveListStore
from discovery.livelist.open import open_store
from discovery.livelist.redis.layout import RedisKeys
from discovery.livelist.redis.store import RedisLiveStore
from discovery.testing import RedisServer
from discovery.zk.election import LeaderElection
from discovery.zk.membership import MembershipChange, MembershipSubscription
from discovery.zk.paths import DATA_SERVERS_PATH, SEARCH_ELECTION_PATH
from discovery.zk.registration import Registration
from discovery.zk.session import ZkSession
from tests.conftest import fast_redis_client
from tests.support import (
    DataServerFactory,
    SearchServerFactory,
    SessionFactory,
    cluster_of,
    eventually,
    make_instance,
    view,
    waited,
)

A = make_instance("ds-a", 9001, shard=0)
B = make_instance("ds-b", 9002, shard=1)


async def test_publish_read_and_follow_through_the_store(
    client: aioredis.Redis, redis_prefix: str, registry: CollectorRegistry
) -> None:
    store = RedisLiveStore(client, redis_prefix, registry=registry)
    assert await store.read() is None  # nothing published yet
    async with store.follower() as follower:
        publisher = store.publisher(leader_id="ss-1", epoch=5)
        assert await publisher.publish_full(view(A, B)) == 1
        live = await waited(
            follower.wait_until(lambda live: live.position == (5, 1), timeout=10), "list (5, 1)"
        )
        assert dict(live.servers) == view(A, B)
        assert live.leader == "ss-1"
        stored = await store.read()
        assert stored is not None
        assert stored.position == (5, 1)
        assert dict(stored.servers) == view(A, B)

        version = await publisher.publish_change(
            view(A), added={}, changed={}, removed={"ds-b": "gone"}
        )
        assert version == 2
        live = await waited(
            follower.wait_until(lambda live: live.position == (5, 2), timeout=10), "list (5, 2)"
        )
        assert dict(live.servers) == view(A)
        assert await publisher.heartbeat() is True
        assert follower.connected
    # One set of metrics for every term and follower, on the registry given.
    assert registry.get_sample_value("discovery_publisher_version") == 2
    assert registry.get_sample_value("discovery_livelist_version") == 2


async def test_a_read_only_store_has_no_publisher_and_no_publisher_metrics(
    redis_server: RedisServer, redis_prefix: str, registry: CollectorRegistry
) -> None:
    cluster = ClusterConfig(cluster=cluster_of(redis_prefix), redis_url=redis_server.url)
    async with RedisLiveStore.from_config(cluster, read_only=True, registry=registry) as store:
        assert store.prefix == redis_prefix
        with pytest.raises(ConfigError, match="read-only"):
            store.publisher(leader_id="ss-1", epoch=1)
        assert await store.read() is None  # it reads with its own client
    assert registry.get_sample_value("discovery_publisher_version") is None


async def test_read_reports_a_malformed_list_and_an_outage_as_errors(
    own_redis: RedisServer, redis_prefix: str
) -> None:
    redis = fast_redis_client(own_redis.url)
    try:
        store = RedisLiveStore(redis, redis_prefix)
        await redis.hset(RedisKeys(redis_prefix).meta, "epoch", "not a number")
        with pytest.raises(MalformedLiveListError):
            await store.read()
        own_redis.stop()
        with pytest.raises(RedisUnavailableError) as info:
            await store.read()
        assert isinstance(info.value, StoreError)  # what a caller retries on
    finally:
        await redis.aclose()


class RecordingStore:
    """A store of another kind: it keeps every write in memory (a second backend needs
    no change to the leader, only a class like this)."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, int, int, dict[str, ServiceInstance]]] = []

    def publisher(self, *, leader_id: str, epoch: int) -> RecordingPublisher:
        return RecordingPublisher(self, leader_id, epoch)

    async def read(self) -> LiveList | None:
        if not self.writes:
            return None
        _kind, epoch, version, servers = self.writes[-1]
        return LiveList(epoch, version, "recorded", 0, servers)

    def follower(self) -> LiveListFollower:
        raise NotImplementedError("the leader never follows")

    async def aclose(self) -> None:
        pass


class RecordingPublisher:
    def __init__(self, store: RecordingStore, leader_id: str, epoch: int) -> None:
        self._store = store
        self.leader_id = leader_id
        self._epoch = epoch
        self._version = 0

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def version(self) -> int:
        return self._version

    @property
    def fenced(self) -> bool:
        return False

    def _write(self, kind: str, servers: Mapping[str, ServiceInstance]) -> int:
        self._version += 1
        self._store.writes.append((kind, self._epoch, self._version, dict(servers)))
        return self._version

    async def publish_full(self, servers: Mapping[str, ServiceInstance]) -> int:
        return self._write("full", servers)

    async def publish_change(
        self,
        servers: Mapping[str, ServiceInstance],
        *,
        added: Mapping[str, ServiceInstance],
        changed: Mapping[str, ServiceInstance],
        removed: Mapping[str, str],
    ) -> int:
        return self._write("change", servers)

    async def heartbeat(self) -> bool:
        return True


async def test_the_leader_publishes_through_any_store(
    make_session: SessionFactory, zk_session: ZkSession, registry: CollectorRegistry
) -> None:
    store = RecordingStore()
    assert isinstance(store, LiveListStore)
    leader_session = await make_session()
    duty = LeaderDuty(leader_session, store, "ss-1", registry=registry)
    await zk_session.ensure_path(DATA_SERVERS_PATH)
    async with (
        Registration(zk_session, A),
        LeaderElection(leader_session, SEARCH_ELECTION_PATH, "ss-1", duty),
    ):
        first = await eventually(lambda: store.writes, message="the leader's first write")
        kind, epoch, version, servers = first[0]
        assert (kind, version, set(servers)) == ("full", 1, {"ds-a"})
        assert epoch > 0  # the czxid of the election node
        async with Registration(zk_session, B):
            await eventually(
                lambda: any(set(w[3]) == {"ds-a", "ds-b"} for w in store.writes),
                message="the registration of ds-b published",
            )
        kinds = [w[0] for w in store.writes]
        assert kinds[0] == "full"
        assert "change" in kinds[1:]
        versions = [w[2] for w in store.writes]
        assert versions == sorted(versions)
        assert len(set(versions)) == len(versions)


async def test_a_search_server_publishes_and_routes_through_the_store_it_is_given(
    make_search_server: SearchServerFactory,
    make_data_server: DataServerFactory,
    client: aioredis.Redis,
    redis_prefix: str,
    registry: CollectorRegistry,
) -> None:
    store = RedisLiveStore(
        client, redis_prefix, heartbeat_ttl=2.0, reconcile_interval=1.0, registry=registry
    )
    await make_data_server(shard=0, instance_id="ds-own-store")
    server = await make_search_server(store=store)
    assert server.reader is not None
    live = await waited(
        server.reader.wait_until(lambda live: "ds-own-store" in live.servers, timeout=15),
        "ds-own-store in the search server's list",
    )
    assert live.leader == server.server_id
    stored = await store.read()
    assert stored is not None
    assert stored.leader == server.server_id
    assert "ds-own-store" in stored.servers
    # The store's metrics: its follower and its publisher report to the store's registry.
    assert (registry.get_sample_value("discovery_livelist_version") or 0) >= 1
    assert (registry.get_sample_value("discovery_publisher_version") or 0) >= 1
    await server.shutdown()
    # A store passed in stays the caller's: still open after the server is gone.
    assert await store.read() is not None


async def test_search_servers_in_one_process_share_a_memory_store(
    make_search_server: SearchServerFactory,
    make_data_server: DataServerFactory,
    redis_prefix: str,
) -> None:
    """``--redis memory://NAME``: the store is chosen by the URL's scheme, and every
    store of that name in the process is one list, so the leader's publishes reach the
    other search server without Redis."""
    url = f"memory://test-{uuid.uuid4().hex[:8]}"
    data = await make_data_server(shard=0, instance_id="ds-in-memory")
    assert data.agent is not None
    leader = await make_search_server(redis_url=url, server_id="ss-mem-1")
    other = await make_search_server(redis_url=url, server_id="ss-mem-2", leader_eligible=False)
    for server in (leader, other):
        assert server.reader is not None
        live = await waited(
            server.reader.wait_until(lambda live: "ds-in-memory" in live.servers, timeout=15),
            f"ds-in-memory in {server.server_id}'s list",
        )
        assert live.leader == "ss-mem-1"
    async with open_store(ClusterConfig(cluster=cluster_of(redis_prefix), redis_url=url)) as store:
        stored = await store.read()
    assert stored is not None
    assert "ds-in-memory" in stored.servers


async def test_a_change_set_the_leader_consumes_late_is_still_published(
    make_session: SessionFactory,
    zk_session: ZkSession,
    redis_server: RedisServer,
    redis_prefix: str,
    registry: CollectorRegistry,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The watcher's view changes before the leader's follower task has consumed the
    change set that says which ids changed; a publish in between must not count those
    ids as published (chaos caught it: 11 registrations of a burst never published)."""
    original = MembershipSubscription.__anext__

    async def late(self: MembershipSubscription) -> MembershipChange:
        change = await original(self)
        await asyncio.sleep(0.3)  # ok-sleep: the fault itself, a change set consumed late
        return change

    monkeypatch.setattr(MembershipSubscription, "__anext__", late)
    redis = aioredis.Redis.from_url(redis_server.url)
    try:
        store = RedisLiveStore(redis, redis_prefix, registry=registry)
        leader_session = await make_session()
        # Heartbeats every 20 ms: the leader's loop looks at the view all the time.
        duty = LeaderDuty(leader_session, store, "ss-1", registry=registry, heartbeat_interval=0.02)
        await zk_session.ensure_path(DATA_SERVERS_PATH)
        async with LeaderElection(leader_session, SEARCH_ELECTION_PATH, "ss-1", duty):
            await eventually(store.read, message="the first publish")
            async with Registration(zk_session, A), Registration(zk_session, B):

                async def published() -> bool:
                    stored = await store.read()
                    return stored is not None and set(stored.servers) == {"ds-a", "ds-b"}

                await eventually(published, timeout=10, message="both registrations published")
    finally:
        await redis.aclose()
