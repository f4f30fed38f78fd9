"""The live list behind Redis Sentinel and on Redis Cluster, with real servers.

Sentinel: a primary, two replicas and three sentinels; the store's clients are made from
a ``redis+sentinel://`` URL exactly as the search server makes them. Cluster: three
primaries formed with ``redis-cli --cluster create``, reached by ``redis+cluster://``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from discovery.config import ClusterConfig
from discovery.errors import ConfigError, RedisUnavailableError
from discovery.livelist.model import LiveList, LiveListChange, LiveListPublisher
from discovery.livelist.redis.conn import describe_redis, make_redis
from discovery.livelist.redis.store import RedisLiveStore
from discovery.testing.redis import redis_command
from discovery.testing.rediscluster import RedisClusterServers
from discovery.testing.sentinel import DEFAULT_DOWN_AFTER_MS, RedisSentinelGroup
from tests.support import make_instance, view, waited

log = logging.getLogger(__name__)

DOWN_AFTER_MS = DEFAULT_DOWN_AFTER_MS


@pytest.fixture
def sentinel_group(tmp_path: Path) -> Iterator[RedisSentinelGroup]:
    group = RedisSentinelGroup(
        tmp_path / "ha", replicas=2, sentinels=3, down_after_ms=DOWN_AFTER_MS
    )
    group.start()
    yield group
    group.stop()


@pytest.fixture
async def ha_store(sentinel_group: RedisSentinelGroup) -> AsyncIterator[RedisLiveStore]:
    cluster = ClusterConfig(cluster="ha", redis_url=sentinel_group.sentinel_url())
    store = RedisLiveStore.from_config(cluster, registry=CollectorRegistry())
    yield store
    await store.aclose()


async def _until_written(publisher: LiveListPublisher, write: object, timeout: float) -> int:
    """Retry a write through a failover: Redis is unavailable until a replica is promoted."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if await publisher.heartbeat():
                pass  # Redis kept our last write: a delta may follow it
            assert callable(write)
            return int(await write())
        except RedisUnavailableError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)  # ok-sleep: the retry period of a leader's heartbeat


async def test_readers_follow_a_sentinel_failover_and_never_move_backwards(
    sentinel_group: RedisSentinelGroup, ha_store: RedisLiveStore
) -> None:
    publisher = ha_store.publisher(leader_id="ss-1", epoch=11)
    a, b, c = make_instance("ds-a"), make_instance("ds-b"), make_instance("ds-c")
    await publisher.publish_full(view(a, b))
    seen: list[tuple[int, int]] = []
    async with ha_store.follower() as follower:
        changes = follower.changes()

        async def record() -> None:
            change: LiveListChange
            async for change in changes:
                seen.append(change.current.position)

        recorder = asyncio.create_task(record())
        try:
            await waited(follower.wait_until(lambda lst: lst.version == 1, 10), "v1")
            for round_ in range(2):
                old = sentinel_group.primary_address()
                killed_at = time.monotonic()
                killed = await asyncio.to_thread(sentinel_group.kill_primary)
                await asyncio.to_thread(sentinel_group.wait_for_new_primary, old, 30)
                servers = view(a, b, c) if round_ == 0 else view(a, c)
                version = await _until_written(
                    publisher,
                    lambda s=servers, first=round_ == 0: publisher.publish_change(
                        s,
                        added=view(c) if first else {},
                        changed={},
                        removed={} if first else {"ds-b": "gone"},
                    ),
                    30,
                )
                current = await waited(
                    follower.wait_until(lambda lst, v=version: lst.version == v, 30),
                    f"version {version} after failover {round_ + 1}",
                )
                assert dict(current.servers) == servers
                # How long after the kill: bench/bench_redis_failover.py's figure.
                log.info("failover %d followed in %.1f s", round_ + 1, time.monotonic() - killed_at)
                await asyncio.to_thread(sentinel_group.restart, killed)
            assert follower.connected
        finally:
            recorder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await recorder
    assert seen == sorted(seen), seen  # never backwards in (epoch, version)
    assert seen[-1] == (11, publisher.version)


async def test_writes_a_promoted_replica_never_got_are_republished(
    sentinel_group: RedisSentinelGroup, ha_store: RedisLiveStore
) -> None:
    """Replication is asynchronous: the primary acknowledges a write, dies before any
    replica has it, and a replica without it is promoted. The leader must find out from
    P:meta (never trust what it wrote) and publish in full; followers never go back."""
    publisher = ha_store.publisher(leader_id="ss-1", epoch=4)
    a, b, c = make_instance("ds-a"), make_instance("ds-b"), make_instance("ds-c")
    await publisher.publish_full(view(a))
    await asyncio.to_thread(sentinel_group.wait_replicated)
    async with ha_store.follower() as follower:
        seen: list[tuple[int, int]] = []
        changes = follower.changes()

        async def record() -> None:
            async for change in changes:
                seen.append(change.current.position)

        recorder = asyncio.create_task(record())
        try:
            # Cut the replicas off: new connections to the primary need a password they
            # lack, and the replicas' links are killed. Our clients stay connected.
            host, port = sentinel_group.primary_address()
            await asyncio.to_thread(
                redis_command, host, port, "ACL", "SETUSER", "default", "resetpass", ">cut-off"
            )
            await asyncio.to_thread(
                redis_command, host, port, "CLIENT", "KILL", "TYPE", "replica", password="cut-off"
            )
            lost = await publisher.publish_change(view(a, b), added=view(b), changed={}, removed={})
            await waited(follower.wait_until(lambda lst: lst.version == lost, 10), "seen")
            killed = await asyncio.to_thread(sentinel_group.kill_primary)
            await asyncio.to_thread(sentinel_group.wait_for_new_primary, (host, port), 30)
            stored = await ha_store.read()
            assert stored is not None
            assert stored.version < lost, "the promoted replica must lack the last write"
            # The next change is a delta on a version Redis does not hold: refused by
            # the script, and the whole list is written instead.
            version = await _until_written(
                publisher,
                lambda: publisher.publish_change(
                    view(a, b, c), added=view(c), changed={}, removed={}
                ),
                30,
            )
            current = await waited(
                follower.wait_until(lambda lst: lst.version == version, 30), "the full list"
            )
            assert dict(current.servers) == view(a, b, c)
            stored = await ha_store.read()
            assert stored is not None
            assert dict(stored.servers) == view(a, b, c)
        finally:
            recorder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await recorder
    assert seen == sorted(seen), seen
    await asyncio.to_thread(sentinel_group.restart, killed)


@pytest.mark.integration
async def test_publishing_and_reading_on_redis_cluster(tmp_path: Path) -> None:
    servers = RedisClusterServers(tmp_path / "cluster", primaries=3)
    await asyncio.to_thread(servers.start)
    try:
        cluster = ClusterConfig(cluster="on-cluster", redis_url=servers.url)
        async with RedisLiveStore.from_config(cluster, registry=CollectorRegistry()) as store:
            publisher = store.publisher(leader_id="ss-1", epoch=5)
            a, b, c = make_instance("ds-a"), make_instance("ds-b"), make_instance("ds-c")
            await publisher.publish_full(view(a, b))
            async with store.follower() as follower:
                assert dict(follower.current.servers) == view(a, b)
                await publisher.publish_change(
                    view(a, c), added=view(c), changed={}, removed={"ds-b": "gone"}
                )
                current = await waited(follower.wait_until(lambda lst: lst.version == 2, 10), "v2")
                assert dict(current.servers) == view(a, c)
                assert await publisher.heartbeat()
            stored = await store.read()
            assert stored is not None
            assert stored.position == (5, 2)
            assert stored != LiveList.EMPTY
    finally:
        await asyncio.to_thread(servers.stop)


def test_bad_sentinel_and_cluster_urls_name_the_flag() -> None:
    for url, message in (
        ("redis+sentinel://h1:26379", "primary name"),
        ("redis+sentinel://h1/mymaster", "host:port"),
        ("redis+cluster://h1:7000/3", "only database 0"),
    ):
        with pytest.raises(ConfigError, match=message) as error:
            make_redis(ClusterConfig(redis_url=url))
        assert "--redis" in str(error.value)


def test_status_names_where_a_sentinel_or_cluster_client_connects() -> None:
    for url, shown in (
        ("redis+sentinel://h1:26379,h2:26379/mymaster/2", "sentinel:mymaster/2"),
        ("redis+cluster://b:7001,a:7000", "cluster:a:7000,b:7001"),
    ):
        assert describe_redis(make_redis(ClusterConfig(redis_url=url))) == shown
