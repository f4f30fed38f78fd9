"""The leader's fenced writes of the live list in layout 2, against a real redis-server."""

from __future__ import annotations

import json

import pytest
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry

from discovery.errors import FencedError
from discovery.instance import ServiceInstance
from discovery.livelist.redis.layout import RedisKeys, load, parse_change
from discovery.livelist.redis.publisher import PUBLISH_SCRIPT, HeartbeatStatus, LivePublisher
from tests.support import make_instance, sample, view


def fleet(count: int) -> dict[str, ServiceInstance]:
    return view(
        *(make_instance(f"ds-{i:05d}", 9000 + i % 1000, shard=i % 50) for i in range(count))
    )


async def entries(client: aioredis.Redis, keys: RedisKeys) -> list[dict[str, str]]:
    return [
        {k.decode(): v.decode() for k, v in fields.items()}
        for _id, fields in await client.xrange(keys.changes)
    ]


async def test_a_change_writes_only_the_changed_fields(
    client: aioredis.Redis, redis_prefix: str, registry: CollectorRegistry
) -> None:
    keys = RedisKeys(redis_prefix)
    publisher = LivePublisher(client, redis_prefix, leader_id="ss-1", epoch=7, registry=registry)
    a, b, c = make_instance("ds-a", 9001), make_instance("ds-b", 9002), make_instance("ds-c", 9003)
    assert await publisher.publish_full(view(a, b)) == 1
    b2 = b.with_state("draining", reason="admin drain")
    version = await publisher.publish_change(
        view(a, b2, c), added=view(c), changed=view(b2), removed={}
    )
    assert version == 2
    version = await publisher.publish_change(
        view(b2, c), added={}, changed={}, removed={"ds-a": "session expired"}
    )
    assert version == 3

    stored = await client.hgetall(keys.servers)
    assert {k.decode(): ServiceInstance.from_json(v) for k, v in stored.items()} == view(b2, c)
    meta = {k.decode(): v.decode() for k, v in (await client.hgetall(keys.meta)).items()}
    assert (meta["epoch"], meta["version"], meta["leader"], meta["count"]) == (
        "7",
        "3",
        "ss-1",
        "2",
    )
    assert int(meta["published_at"]) > 0

    log = await entries(client, keys)
    assert [(e["kind"], e["version"], e["prev"]) for e in log] == [
        ("full", "1", "0"),
        ("delta", "2", "1"),
        ("delta", "3", "2"),
    ]
    assert log[0]["upserts"] == "[]"
    assert sorted(i["id"] for i in json.loads(log[1]["upserts"])) == ["ds-b", "ds-c"]
    assert json.loads(log[2]["removes"]) == [{"id": "ds-a", "reason": "session expired"}]
    assert json.loads(log[2]["upserts"]) == []
    assert sample(registry, "discovery_publisher_publishes_total", kind="delta", result="ok") == 2


async def test_what_redis_receives_per_change_does_not_grow_with_the_list(
    client: aioredis.Redis, redis_prefix: str, registry: CollectorRegistry
) -> None:
    sizes = {}
    for count in (20, 5000):
        prefix = f"{redis_prefix}-{count}"
        reg = CollectorRegistry()
        publisher = LivePublisher(client, prefix, leader_id="ss-1", epoch=1, registry=reg)
        servers = fleet(count)
        await publisher.publish_full(servers)
        assert await client.hlen(RedisKeys(prefix).servers) == count
        gone = next(iter(servers))
        rest = {k: v for k, v in servers.items() if k != gone}
        await publisher.publish_change(rest, added={}, changed={}, removed={gone: "deleted"})
        sizes[count] = sample(reg, "discovery_publisher_snapshot_bytes")
        await client.delete(*RedisKeys(prefix).all)
    assert sizes[5000] < 2048
    assert sizes[5000] <= sizes[20] * 1.1


async def test_a_lower_epoch_or_a_second_writer_is_fenced(
    client: aioredis.Redis, redis_prefix: str
) -> None:
    new = LivePublisher(client, redis_prefix, leader_id="ss-2", epoch=20)
    await new.publish_full(view(make_instance("ds-1")))
    old = LivePublisher(client, redis_prefix, leader_id="ss-1", epoch=10)
    with pytest.raises(FencedError) as refused:
        await old.publish_full(view(make_instance("ds-2")))
    assert (refused.value.stored_epoch, refused.value.reason) == (20, "epoch")
    assert old.fenced
    with pytest.raises(FencedError):
        await old.heartbeat()  # refused locally now
    # Another publisher object of the same epoch starts at version 1: refused.
    twin = LivePublisher(client, redis_prefix, leader_id="ss-2", epoch=20)
    with pytest.raises(FencedError) as refused:
        await twin.publish_full({})
    assert refused.value.reason == "version"
    loaded = await load(client, RedisKeys(redis_prefix))
    assert loaded.meta is not None
    assert loaded.meta.leader == "ss-2"
    assert set(loaded.servers) == {"ds-1"}


async def test_a_retried_write_is_recognised_as_our_own(
    client: aioredis.Redis, redis_prefix: str
) -> None:
    keys = RedisKeys(redis_prefix)
    publisher = LivePublisher(client, redis_prefix, leader_id="ss-1", epoch=3)
    await publisher.publish_full(view(make_instance("ds-1")))
    # The same arguments twice, as redis-py sends them again after a lost reply.
    args = publisher._arguments("full", 2, 0, 1000, [], {})
    script = client.register_script(PUBLISH_SCRIPT)
    first = await script(keys=list(keys.all), args=args)
    again = await script(keys=list(keys.all), args=args)
    assert [x.decode() for x in first[:2]] == ["published", "ok"]
    assert [x.decode() for x in again[:2]] == ["published", "duplicate"]
    assert await client.xlen(keys.changes) == 2  # the retry appended nothing


async def test_a_delta_on_top_of_lost_writes_becomes_a_full_publish(
    client: aioredis.Redis, redis_prefix: str, registry: CollectorRegistry
) -> None:
    keys = RedisKeys(redis_prefix)
    publisher = LivePublisher(client, redis_prefix, leader_id="ss-1", epoch=5, registry=registry)
    a, b, c = make_instance("ds-a"), make_instance("ds-b"), make_instance("ds-c")
    await publisher.publish_full(view(a, b))
    # A replica promoted without our last write: P:meta holds an older version.
    await client.hset(keys.meta, "version", "0")
    await client.hdel(keys.servers, "ds-b")
    version = await publisher.publish_change(view(a, b, c), added=view(c), changed={}, removed={})
    assert version == 3  # version 2 was the refused delta; numbers are never reused
    loaded = await load(client, keys)
    assert loaded.meta is not None
    assert loaded.meta.version == 3
    assert set(loaded.servers) == {"ds-a", "ds-b", "ds-c"}
    assert (await entries(client, keys))[-1]["kind"] == "full"
    assert (
        sample(registry, "discovery_publisher_publishes_total", kind="delta", result="diverged")
        == 1
    )


async def test_heartbeat_says_whether_redis_holds_our_last_write(
    client: aioredis.Redis, redis_prefix: str
) -> None:
    keys = RedisKeys(redis_prefix)
    publisher = LivePublisher(client, redis_prefix, leader_id="ss-1", epoch=2, heartbeat_ttl=5)
    assert not await publisher.heartbeat()
    assert publisher.last_heartbeat is HeartbeatStatus.MISSING
    await publisher.publish_full(view(make_instance("ds-1")))
    assert await publisher.heartbeat()
    assert 0 < await client.pttl(keys.leader) <= 5000
    beat = json.loads(await client.get(keys.leader))
    assert (beat["leader"], beat["epoch"], beat["version"]) == ("ss-1", 2, 1)
    await client.delete(keys.meta)  # Redis lost its data
    assert not await publisher.heartbeat()
    assert publisher.last_heartbeat is HeartbeatStatus.MISSING
    # The next change is then written in full.
    await publisher.publish_change(view(make_instance("ds-1")), added={}, changed={}, removed={})
    assert (await entries(client, keys))[-1]["kind"] == "full"
    assert await publisher.heartbeat()


async def test_a_deposed_leaders_late_heartbeat_leaves_no_trace_in_an_emptied_store(
    client: aioredis.Redis, redis_prefix: str
) -> None:
    """Found by the two-hour soak: a leader cut from Redis resigned; its last heartbeat,
    sent just before the cut, sat in TCP's retransmissions and reached Redis after the
    partition healed and the store was flushed, where nothing fenced it: ``P:leader``
    went back to the deposed leader's epoch. A heartbeat into an empty store now
    writes nothing; the leader in office publishes in full."""
    keys = RedisKeys(redis_prefix)
    deposed = LivePublisher(client, redis_prefix, leader_id="ss-old", epoch=5)
    await deposed.publish_full(view(make_instance("ds-1")))
    successor = LivePublisher(client, redis_prefix, leader_id="ss-new", epoch=9)
    await successor.publish_full(view(make_instance("ds-1")))
    await client.delete(keys.servers, keys.meta, keys.changes, keys.leader)  # FLUSHALL

    assert not await deposed.heartbeat()  # the late one
    assert deposed.last_heartbeat is HeartbeatStatus.MISSING
    assert await client.get(keys.leader) is None
    assert not await successor.heartbeat()
    assert await client.get(keys.leader) is None
    await successor.publish_full(view(make_instance("ds-1")))
    beat = json.loads(await client.get(keys.leader))
    assert (beat["leader"], beat["epoch"]) == ("ss-new", 9)
    with pytest.raises(FencedError):
        await deposed.heartbeat()


async def test_the_stream_is_trimmed(client: aioredis.Redis, redis_prefix: str) -> None:
    keys = RedisKeys(redis_prefix)
    publisher = LivePublisher(client, redis_prefix, leader_id="ss-1", epoch=1, stream_length=10)
    a = make_instance("ds-a")
    await publisher.publish_full(view(a))
    for round_ in range(300):
        b = make_instance("ds-b", 9000 + round_)
        await publisher.publish_change(view(a, b), added={}, changed=view(b), removed={})
    # MAXLEN ~ trims whole radix-tree nodes (100 entries by default).
    assert await client.xlen(keys.changes) <= 10 + 100
    last = await client.xrevrange(keys.changes, count=1)
    assert parse_change(last[0][0], last[0][1]).version == 301


async def test_a_full_publish_of_many_servers_in_one_call(
    client: aioredis.Redis, redis_prefix: str
) -> None:
    keys = RedisKeys(redis_prefix)
    publisher = LivePublisher(client, redis_prefix, leader_id="ss-1", epoch=1)
    servers = fleet(12_000)  # more fields than one Lua unpack() can take
    await publisher.publish_full(servers)
    loaded = await load(client, keys)
    assert loaded.meta is not None
    assert loaded.meta.count == 12_000
    assert loaded.servers == servers
    smaller = dict(list(servers.items())[:10])
    await publisher.publish_full(smaller)
    assert await client.hlen(keys.servers) == 10  # rewritten, not merged


async def test_a_key_that_is_not_its_instance_id_is_refused(
    client: aioredis.Redis, redis_prefix: str
) -> None:
    publisher = LivePublisher(client, redis_prefix, leader_id="ss-1", epoch=1)
    with pytest.raises(ValueError, match="holds the instance"):
        await publisher.publish_full({"ds-x": make_instance("ds-y")})
    with pytest.raises(ValueError, match="stream_length"):
        LivePublisher(client, redis_prefix, leader_id="ss-1", epoch=1, stream_length=0)
