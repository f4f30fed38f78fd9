"""The search servers' live-list follower in layout 2, against a real redis-server."""

from __future__ import annotations

import asyncio
import json

import immutables
import pytest
import redis.asyncio as aioredis
import redis.exceptions as redis_errors
from prometheus_client import CollectorRegistry

from discovery.errors import StoreError
from discovery.instance import ServiceInstance
from discovery.livelist.model import LiveList, LiveListChange
from discovery.livelist.redis.follower import LiveListReader
from discovery.livelist.redis.layout import RedisKeys
from discovery.livelist.redis.publisher import LivePublisher
from discovery.testing import RedisServer
from tests.support import eventually, make_instance, sample, view, waited


def loads(registry: CollectorRegistry, cause: str) -> float:
    return sample(registry, "discovery_livelist_refetches_total", cause=cause)


async def next_change(changes: object) -> LiveListChange:
    assert hasattr(changes, "__anext__")
    return await waited(changes.__anext__(), "the next change")  # type: ignore[no-any-return]


async def add_entry(
    client: aioredis.Redis, keys: RedisKeys, stream_id: str = "*", **fields: object
) -> None:
    entry = {
        "epoch": 1,
        "version": 1,
        "prev": 0,
        "kind": "delta",
        "leader": "manual",
        "published_at": 0,
        "upserts": "[]",
        "removes": "[]",
    }
    entry.update(fields)
    await client.xadd(keys.changes, {k: str(v) for k, v in entry.items()}, id=stream_id)


@pytest.mark.smoke
async def test_loads_then_applies_changes_sharing_what_did_not_change(
    client: aioredis.Redis, redis_prefix: str, registry: CollectorRegistry
) -> None:
    publisher = LivePublisher(client, redis_prefix, leader_id="ss-1", epoch=12)
    a, b = make_instance("ds-a", 9001, shard=0), make_instance("ds-b", 9002, shard=1)
    c = make_instance("ds-c", 9003, shard=2).with_state("draining")
    await publisher.publish_full(view(a, b, c))

    async with LiveListReader(client, redis_prefix, registry=registry) as reader:
        first = reader.current
        assert (first.epoch, first.version, first.leader) == (12, 1, "ss-1")
        assert dict(first.servers) == view(a, b, c)
        assert isinstance(first.servers, immutables.Map)
        assert [s.id for s in first.routable] == ["ds-a", "ds-b"]
        assert reader.connected
        assert reader.age() < 5
        with pytest.raises(TypeError):
            first.servers["ds-9"] = make_instance("ds-9")  # type: ignore[index]

        # Back to back, without waiting: applied in order.
        d = make_instance("ds-d", 9004, shard=3)
        await publisher.publish_change(view(a, b, c, d), added=view(d), changed={}, removed={})
        b2 = b.with_state("draining", reason="admin")
        await publisher.publish_change(view(a, b2, c, d), added={}, changed=view(b2), removed={})
        await publisher.publish_change(view(a, b2, d), added={}, changed={}, removed={"ds-c": "x"})
        current = await waited(
            reader.wait_until(lambda lst: lst.version == 4, timeout=10), "version 4"
        )
        assert dict(current.servers) == view(a, b2, d)
        # Unchanged servers are the very objects loaded first: nothing re-decoded or copied.
        assert current.servers["ds-a"] is first.servers["ds-a"]
        # The routable count is kept per change, not recounted: it must still agree.
        assert sample(registry, "discovery_livelist_routable") == 2 == len(current.routable)
        assert loads(registry, "start") == 1
        assert sum(loads(registry, cause) for cause in ("gap", "full", "epoch")) == 0
        assert sample(registry, "discovery_livelist_diffs_applied_total") == 3
        assert sample(registry, "discovery_livelist_routable") == 2


async def test_changes_say_what_was_added_changed_and_removed_and_why(
    client: aioredis.Redis, redis_prefix: str
) -> None:
    publisher = LivePublisher(client, redis_prefix, leader_id="ss-1", epoch=3)
    a, b = make_instance("ds-a", 9001), make_instance("ds-b", 9002)
    await publisher.publish_full(view(a, b))
    async with LiveListReader(client, redis_prefix) as reader:
        changes = reader.changes()
        first = await next_change(changes)
        assert first.reload
        assert set(first.added) == {"ds-a", "ds-b"}
        assert first.previous == LiveList.EMPTY

        c = make_instance("ds-c", 9003)
        a2 = a.with_state("draining", reason="deploy")
        await publisher.publish_change(
            view(a2, c), added=view(c), changed=view(a2), removed={"ds-b": "session expired"}
        )
        step = await next_change(changes)
        assert not step.reload
        assert dict(step.added) == view(c)
        assert dict(step.changed) == view(a2)
        assert dict(step.removed) == {"ds-b": "session expired"}
        assert step.previous.version == 1
        assert step.current.version == 2

        # A new term: a full publish, seen as a reload with its computed difference.
        successor = LivePublisher(client, redis_prefix, leader_id="ss-2", epoch=9)
        await successor.publish_full(view(a2))
        step = await next_change(changes)
        assert step.reload
        assert step.current.epoch == 9
        assert set(step.removed) == {"ds-c"}
        assert not step.added
    # Closing the follower ends the iterator.
    with pytest.raises(StopAsyncIteration):
        await waited(changes.__anext__(), "the end")


async def test_an_entry_that_does_not_follow_means_a_load(
    client: aioredis.Redis, redis_prefix: str, registry: CollectorRegistry
) -> None:
    keys = RedisKeys(redis_prefix)
    publisher = LivePublisher(client, redis_prefix, leader_id="ss-1", epoch=1)
    await publisher.publish_full(view(make_instance("ds-a")))
    async with LiveListReader(client, redis_prefix, registry=registry) as reader:
        # Version 3 follows version 2, which this reader never saw (trimmed, or lost).
        await client.hset(keys.servers, "ds-z", make_instance("ds-z").to_json())
        await client.hset(keys.meta, mapping={"version": 3})
        await add_entry(client, keys, version=3, prev=2)
        current = await waited(reader.wait_until(lambda lst: lst.version == 3, 10), "v3")
        assert set(current.servers) == {"ds-a", "ds-z"}
        assert loads(registry, "gap") == 1


async def test_stale_entries_and_older_lists_are_refused(
    client: aioredis.Redis, redis_prefix: str, registry: CollectorRegistry
) -> None:
    keys = RedisKeys(redis_prefix)
    publisher = LivePublisher(client, redis_prefix, leader_id="ss-2", epoch=10)
    await publisher.publish_full(view(make_instance("ds-a")))
    async with LiveListReader(
        client, redis_prefix, registry=registry, reconcile_interval=0.2
    ) as reader:
        # A deposed leader's entry (written around the fence) is ignored.
        bad = make_instance("ds-bad")
        await add_entry(
            client, keys, epoch=9, version=50, prev=49, upserts=json.dumps([bad.to_dict()])
        )
        # Redis loses our version (a replica promoted without it): the list is kept.
        await client.hset(keys.meta, mapping={"epoch": 9, "version": 1})
        await eventually(
            lambda: (
                sample(registry, "discovery_livelist_stale_rejected_total", kind="entry") >= 1
                and sample(registry, "discovery_livelist_stale_rejected_total", kind="meta") >= 1
            ),
            message="stale entry and meta counted",
        )
        assert reader.current.position == (10, 1)
        assert "ds-bad" not in reader.current.servers


async def test_malformed_entries_and_servers_are_skipped_and_counted(
    client: aioredis.Redis, redis_prefix: str, registry: CollectorRegistry
) -> None:
    keys = RedisKeys(redis_prefix)
    publisher = LivePublisher(client, redis_prefix, leader_id="ss-1", epoch=1)
    await publisher.publish_full(view(make_instance("ds-a"), make_instance("ds-b")))
    await client.hset(keys.servers, "ds-b", b"{not json")
    await client.hset(keys.servers, "ds-c", make_instance("ds-other").to_json())
    async with LiveListReader(client, redis_prefix, registry=registry) as reader:
        assert set(reader.current.servers) == {"ds-a"}  # the rest still routes
        assert sample(registry, "discovery_livelist_malformed_total", kind="server") == 2
        await add_entry(client, keys, epoch=1, version=2, prev=1, upserts="[{]")
        await add_entry(client, keys, epoch="x", version=3, prev=2)
        await eventually(
            lambda: sample(registry, "discovery_livelist_malformed_total", kind="entry") == 2,
            message="both entries skipped",
        )
        # The unreadable entry names a newer version: the reader loaded the list.
        assert loads(registry, "gap") == 1
        assert reader.connected


async def test_a_stream_that_went_backwards_is_caught_by_reconciling(
    client: aioredis.Redis, redis_prefix: str, registry: CollectorRegistry
) -> None:
    """After a failover to a replica whose clock is behind, new stream ids can be lower
    than the last one a reader saw; XREAD would never return them. P:meta catches it."""
    keys = RedisKeys(redis_prefix)
    publisher = LivePublisher(client, redis_prefix, leader_id="ss-1", epoch=1)
    await publisher.publish_full(view(make_instance("ds-a")))
    async with LiveListReader(
        client, redis_prefix, registry=registry, reconcile_interval=0.3
    ) as reader:
        await client.delete(keys.changes)
        await client.hset(keys.servers, "ds-b", make_instance("ds-b").to_json())
        await client.hset(keys.meta, mapping={"version": 2})
        await add_entry(client, keys, "1-1", version=2, prev=1, kind="full")
        current = await waited(reader.wait_until(lambda lst: lst.version == 2, 10), "v2")
        assert set(current.servers) == {"ds-a", "ds-b"}
        assert loads(registry, "reconcile") == 1


@pytest.mark.smoke
async def test_redis_outage_keeps_the_list_then_follows_again(
    own_redis: RedisServer, own_client: aioredis.Redis, registry: CollectorRegistry
) -> None:
    prefix = "discovery:{outage}"
    publisher = LivePublisher(own_client, prefix, leader_id="ss-1", epoch=3)
    servers = view(make_instance("ds-1"), make_instance("ds-2"))
    await publisher.publish_full(servers)
    async with LiveListReader(own_client, prefix, registry=registry) as reader:
        await asyncio.to_thread(own_redis.stop)
        await eventually(lambda: not reader.connected, message="reader disconnected")
        before = reader.age()
        await eventually(lambda: reader.age() > before + 0.5, message="age grows")
        assert dict(reader.current.servers) == servers
        assert sample(registry, "discovery_livelist_redis_errors_total", operation="follow") >= 1

        # Redis comes back empty; the leader notices and republishes.
        await asyncio.to_thread(own_redis.start)
        assert not await publisher.heartbeat()
        newer = {**servers, **view(make_instance("ds-3"))}
        await publisher.publish_change(
            newer, added=view(make_instance("ds-3")), changed={}, removed={}
        )
        current = await waited(reader.wait_until(lambda lst: lst.version == 2, 15), "v2")
        assert dict(current.servers) == newer
        await eventually(lambda: reader.connected, message="following again")
        await eventually(lambda: reader.age() < 1, message="age reset")


async def test_a_redis_refusing_writes_for_lack_of_memory_is_still_read(
    own_client: aioredis.Redis, registry: CollectorRegistry
) -> None:
    # Over maxmemory with noeviction, Redis refuses every command queued in MULTI, reads
    # too (before 7.4, as Debian bookworm's 7.0 does; since 7.4, trixie's 8.0 among them,
    # a MULTI of reads goes through: Redis pull request 12961); a reader must still load
    # the list (a new reader, or one that lost its place).
    prefix = "discovery:{oom}"
    publisher = LivePublisher(own_client, prefix, leader_id="ss-1", epoch=5)
    servers = view(make_instance("ds-1"), make_instance("ds-2", 9002, shard=1))
    await publisher.publish_full(servers)
    keys = RedisKeys(prefix)
    await own_client.config_set("maxmemory-policy", "noeviction")
    await own_client.config_set("maxmemory", "1")
    version = str((await own_client.info("server"))["redis_version"])
    try:
        if tuple(int(part) for part in version.split(".")[:2]) < (7, 4):
            with pytest.raises(redis_errors.OutOfMemoryError):
                async with own_client.pipeline(transaction=True) as pipe:
                    await pipe.hgetall(keys.meta).execute()
        with pytest.raises(StoreError):  # no write gets through
            await publisher.heartbeat()
        async with LiveListReader(own_client, prefix, registry=registry) as reader:
            assert (reader.current.epoch, reader.current.version) == (5, 1)
            assert dict(reader.current.servers) == servers
            assert reader.connected
    finally:
        await own_client.config_set("maxmemory", "0")


async def test_starts_while_redis_is_down(
    own_redis: RedisServer, own_client: aioredis.Redis
) -> None:
    prefix = "discovery:{late}"
    await asyncio.to_thread(own_redis.stop)
    async with LiveListReader(own_client, prefix) as reader:
        assert reader.current == LiveList.EMPTY
        assert not reader.connected
        await asyncio.to_thread(own_redis.start)
        publisher = LivePublisher(own_client, prefix, leader_id="ss-1", epoch=1)
        await publisher.publish_full(view(make_instance("ds-1")))
        current = await waited(reader.wait_until(lambda lst: lst.version == 1, 15), "v1")
        assert set(current.servers) == {"ds-1"}


def test_apply_is_a_new_list_sharing_the_rest() -> None:
    base = LiveList(1, 1, "l", 0, {f"ds-{i}": make_instance(f"ds-{i}") for i in range(100)})
    extra: ServiceInstance = make_instance("ds-new")
    after = base.apply(
        epoch=1, version=2, leader="l", published_at=1, upserts=[extra], removes=["ds-5"]
    )
    assert len(base.servers) == 100
    assert "ds-new" not in base.servers
    assert len(after.servers) == 100
    assert "ds-5" not in after.servers
    assert after.servers["ds-7"] is base.servers["ds-7"]


async def test_a_silent_connection_is_detected(
    own_redis: RedisServer, registry: CollectorRegistry
) -> None:
    prefix = "discovery:{silent}"
    # The reader's client as the store makes it: a socket timeout above the blocking read.
    client = aioredis.Redis.from_url(own_redis.url, socket_timeout=2, socket_connect_timeout=2)
    admin = aioredis.Redis.from_url(own_redis.url)
    try:
        publisher = LivePublisher(admin, prefix, leader_id="ss-1", epoch=1)
        await publisher.publish_full(view(make_instance("ds-1")))
        async with LiveListReader(client, prefix, registry=registry, block=0.5) as reader:
            assert reader.connected
            # The server stops answering every client but keeps the connections open,
            # like a hung host: no error reaches the reader, only silence.
            await admin.execute_command("CLIENT", "PAUSE", "4000", "ALL")
            await eventually(lambda: not reader.connected, timeout=10, message="silence noticed")
            await eventually(lambda: reader.connected, timeout=15, message="following again")
            await publisher.publish_full(view(make_instance("ds-2")))
            current = await waited(reader.wait_until(lambda lst: lst.version == 2, 10), "v2")
            assert set(current.servers) == {"ds-2"}
    finally:
        await client.aclose()
        await admin.aclose()
