"""The leader's fenced writes of the live list, against a real redis-server."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from typing import Any

import pytest
import redis.asyncio as aioredis
import redis.exceptions
from prometheus_client import CollectorRegistry
from redis.asyncio.client import PubSub

from discovery.errors import DiscoveryError, FencedError, RedisUnavailableError
from discovery.instance import ServiceInstance
from discovery.redis_v1.layout import V1Keys as RedisKeys
from discovery.redis_v1.publisher import FENCE_SCRIPT, HeartbeatStatus
from discovery.redis_v1.publisher import LivePublisherV1 as LivePublisher
from discovery.testing import RedisServer
from tests.support import eventually, make_instance, view

NOW = 1_700_000_000.25  # a fixed wall clock: published_at is 1700000000250


async def subscribe(client: aioredis.Redis, channel: str) -> PubSub:
    pubsub = client.pubsub()
    await pubsub.subscribe(channel)
    await eventually(lambda: next_message(pubsub, "subscribe"), message="subscribed")
    return pubsub


async def next_message(pubsub: PubSub, kind: str = "message") -> Any:
    message = await pubsub.get_message(timeout=0.1)
    if message is not None and message["type"] == kind:
        return message
    return None


async def next_event(pubsub: PubSub) -> dict[str, Any]:
    message = await eventually(lambda: next_message(pubsub), message="an event")
    event = json.loads(message["data"])
    assert isinstance(event, dict)
    return event


async def stored(client: aioredis.Redis, keys: RedisKeys) -> dict[str, Any]:
    raw = await client.get(keys.live)
    assert raw is not None
    document = json.loads(raw)
    assert isinstance(document, dict)
    return document


def decoded(document: Mapping[str, Any]) -> dict[str, ServiceInstance]:
    return {d["id"]: ServiceInstance.from_dict(d) for d in document["servers"]}


async def test_full_publish_writes_snapshot_event_and_heartbeat(
    client: aioredis.Redis, redis_prefix: str
) -> None:
    registry = CollectorRegistry()
    keys = RedisKeys(redis_prefix)
    events = await subscribe(client, keys.events)
    servers = view(
        make_instance("ds-2", 9002, shard=1),
        make_instance("ds-1", 9001, shard=0),
        make_instance("ds-3", 9003, shard=2).with_state("draining", reason="admin drain"),
    )
    publisher = LivePublisher(
        client, redis_prefix, leader_id="ss-1", epoch=7, registry=registry, clock=lambda: NOW
    )

    assert await publisher.publish_full(servers) == 1

    raw = await client.get(keys.live)
    assert raw is not None
    document = json.loads(raw)
    assert list(document) == ["epoch", "version", "leader", "published_at", "servers"]
    assert (document["epoch"], document["version"], document["leader"]) == (7, 1, "ss-1")
    assert document["published_at"] == 1_700_000_000_250
    assert [s["id"] for s in document["servers"]] == ["ds-1", "ds-2", "ds-3"]
    assert decoded(document) == servers
    draining = document["servers"][2]
    assert (draining["payload"]["state"], draining["enabled"]) == ("draining", False)
    # Curator's layout, as in ZooKeeper.
    assert document["servers"][0] == servers["ds-1"].to_dict()

    leader = json.loads(await client.get(keys.leader) or b"null")
    assert leader == {"leader": "ss-1", "epoch": 7, "version": 1, "at": 1_700_000_000_250}
    assert 0 < await client.pttl(keys.leader) <= 5000

    assert await next_event(events) == {
        "epoch": 7,
        "version": 1,
        "prev_version": None,
        "leader": "ss-1",
        "published_at": 1_700_000_000_250,
        "full": True,
        "added": [],
        "changed": [],
        "removed": [],
    }
    assert await client.hmget(keys.fence, ["epoch", "version"]) == [b"7", b"1"]

    def sample(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert sample("discovery_publisher_publishes_total", kind="full", result="ok") == 1
    assert sample("discovery_publisher_epoch") == 7
    assert sample("discovery_publisher_version") == 1
    assert sample("discovery_publisher_snapshot_bytes") == len(raw)
    assert sample("discovery_publisher_publish_seconds_count", kind="full") == 1
    await events.aclose()


async def test_diffs_carry_prev_version_and_the_exact_change(
    client: aioredis.Redis, redis_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    keys = RedisKeys(redis_prefix)
    events = await subscribe(client, keys.events)
    publisher = LivePublisher(client, redis_prefix, leader_id="ss-1", epoch=3)
    a, b = make_instance("ds-a", 9001), make_instance("ds-b", 9002)

    # The first publish of a publisher is full even when asked for a diff.
    assert await publisher.publish_change(view(a, b), added=view(a, b), changed={}, removed={}) == 1
    first = await next_event(events)
    assert (first["full"], first["prev_version"], first["added"]) == (True, None, [])

    a2, c = a.with_state("draining"), make_instance("ds-c", 9003)
    version = await publisher.publish_change(
        view(a2, c), added=view(c), changed=view(a2), removed={"ds-b": "session expired"}
    )
    assert version == 2
    event = await next_event(events)
    assert event["full"] is False
    assert (event["epoch"], event["version"], event["prev_version"]) == (3, 2, 1)
    assert [ServiceInstance.from_dict(d) for d in event["added"]] == [c]
    assert [ServiceInstance.from_dict(d) for d in event["changed"]] == [a2]
    assert event["removed"] == [{"id": "ds-b", "reason": "session expired"}]
    assert decoded(await stored(client, keys)) == view(a2, c)

    # A caller whose diff disagrees with the snapshots gets the real diff published.
    d = make_instance("ds-d", 9004)
    with caplog.at_level(logging.WARNING, logger="discovery.publisher"):
        assert await publisher.publish_change(view(a2, d), added={}, changed={}, removed={}) == 3
    assert "disagrees" in caplog.text
    event = await next_event(events)
    assert (event["version"], event["prev_version"]) == (3, 2)
    assert [x["id"] for x in event["added"]] == ["ds-d"]
    assert event["removed"] == [{"id": "ds-c", "reason": "unknown"}]
    assert publisher.version == 3
    await events.aclose()


async def test_lower_epoch_is_fenced_and_the_snapshot_is_unchanged(
    client: aioredis.Redis, redis_prefix: str
) -> None:
    keys = RedisKeys(redis_prefix)
    registry = CollectorRegistry()
    old = LivePublisher(client, redis_prefix, leader_id="ss-old", epoch=9, registry=registry)
    new = LivePublisher(client, redis_prefix, leader_id="ss-new", epoch=10)
    servers = view(make_instance("ds-1"))

    # The deposed leader published first; its successor takes over.
    assert await old.publish_full(servers) == 1
    assert await old.publish_full(servers) == 2
    assert await new.publish_full(view(make_instance("ds-2"))) == 1
    snapshot, leader = await client.get(keys.live), await client.get(keys.leader)
    events = await subscribe(client, keys.events)

    # The stale leader runs after the new one: refused, nothing written or announced.
    with pytest.raises(FencedError) as refused:
        await old.publish_change(view(), added={}, changed={}, removed={"ds-1": "gone"})
    assert isinstance(refused.value, DiscoveryError)
    assert (refused.value.stored_epoch, refused.value.stored_version) == (10, 1)
    assert refused.value.reason == "epoch"
    with pytest.raises(FencedError):
        await old.heartbeat()
    assert old.fenced
    assert await client.get(keys.live) == snapshot
    assert await client.get(keys.leader) == leader

    def fenced(kind: str) -> float | None:
        labels = {"kind": kind, "result": "fenced"}
        return registry.get_sample_value("discovery_publisher_publishes_total", labels)

    assert (fenced("diff"), fenced("heartbeat")) == (1, 1)

    # The next event on the channel is the new leader's: the refused write sent none.
    assert await new.publish_full(view(make_instance("ds-3"))) == 2
    event = await next_event(events)
    assert (event["epoch"], event["version"], event["leader"]) == (10, 2, "ss-new")
    await events.aclose()


async def test_same_epoch_non_increasing_version_is_fenced(
    client: aioredis.Redis, redis_prefix: str
) -> None:
    keys = RedisKeys(redis_prefix)
    first = LivePublisher(client, redis_prefix, leader_id="ss-1", epoch=5)
    for expected in (1, 2, 3):
        assert await first.publish_full(view(make_instance(f"ds-{expected}"))) == expected
    snapshot = await client.get(keys.live)

    # A second publisher object of the same epoch starts at version 1 again.
    second = LivePublisher(client, redis_prefix, leader_id="ss-1", epoch=5)
    with pytest.raises(FencedError) as refused:
        await second.publish_full(view(make_instance("ds-x")))
    assert refused.value.reason == "version"
    assert (refused.value.stored_epoch, refused.value.stored_version) == (5, 3)
    third = LivePublisher(client, redis_prefix, leader_id="ss-1", epoch=5)
    with pytest.raises(FencedError):
        await third.heartbeat()
    assert await client.get(keys.live) == snapshot
    # The original publisher is unaffected.
    assert await first.heartbeat()
    assert await first.publish_full(view()) == 4


async def test_heartbeat_from_a_stale_epoch_is_refused(
    client: aioredis.Redis, redis_prefix: str
) -> None:
    keys = RedisKeys(redis_prefix)
    stale = LivePublisher(client, redis_prefix, leader_id="ss-old", epoch=2)
    current = LivePublisher(client, redis_prefix, leader_id="ss-new", epoch=3)
    # Before its first publish a publisher's heartbeat reports the list as not its own.
    assert not await stale.heartbeat()
    assert stale.last_heartbeat is HeartbeatStatus.MISSING
    await current.publish_full(view(make_instance("ds-1")))
    with pytest.raises(FencedError) as refused:
        await stale.heartbeat()
    assert (refused.value.stored_epoch, refused.value.stored_version) == (3, 1)
    assert json.loads(await client.get(keys.leader) or b"null")["leader"] == "ss-new"
    assert await current.heartbeat()
    assert current.last_heartbeat is HeartbeatStatus.CURRENT

    # A newer leader before its first publish: not fenced, but told to publish in full.
    newer = LivePublisher(client, redis_prefix, leader_id="ss-newer", epoch=4)
    assert not await newer.heartbeat()
    assert newer.last_heartbeat is HeartbeatStatus.STALE


async def test_heartbeat_reports_missing_after_flushall(
    own_client: aioredis.Redis,
) -> None:
    prefix = "discovery:flush"
    keys = RedisKeys(prefix)
    clock = [NOW]
    publisher = LivePublisher(
        own_client,
        prefix,
        leader_id="ss-1",
        epoch=4,
        heartbeat_ttl=2.0,
        clock=lambda: clock[0],
    )
    servers = view(make_instance("ds-1"), make_instance("ds-2"))
    await publisher.publish_full(servers)
    await own_client.pexpire(keys.leader, 100_000)  # the heartbeat must set the TTL again
    clock[0] += 1
    assert await publisher.heartbeat()
    assert 0 < await own_client.pttl(keys.leader) <= 2000
    leader = json.loads(await own_client.get(keys.leader) or b"null")
    assert leader == {"leader": "ss-1", "epoch": 4, "version": 1, "at": 1_700_000_001_250}

    await own_client.flushall()
    assert not await publisher.heartbeat()
    assert publisher.last_heartbeat is HeartbeatStatus.MISSING
    assert await own_client.exists(keys.leader)  # the heartbeat itself was written

    # The leader republishes in full; the version keeps counting up.
    assert await publisher.publish_full(servers) == 2
    assert decoded(await stored(own_client, keys)) == servers
    assert await publisher.heartbeat()


async def test_script_is_reloaded_after_a_redis_restart(
    own_redis: RedisServer, own_client: aioredis.Redis
) -> None:
    prefix = "discovery:restart"
    keys = RedisKeys(prefix)
    publisher = LivePublisher(own_client, prefix, leader_id="ss-1", epoch=8)
    servers = view(make_instance("ds-1"))
    await publisher.publish_full(servers)
    sha = own_client.register_script(FENCE_SCRIPT).sha
    assert await own_client.script_exists(sha) == [True]

    await asyncio.to_thread(own_redis.restart)
    # The restarted server has neither our data nor our script.
    assert await own_client.script_exists(sha) == [False]
    assert not await publisher.heartbeat()  # NOSCRIPT, loaded again, then run
    assert publisher.last_heartbeat is HeartbeatStatus.MISSING
    assert await own_client.script_exists(sha) == [True]
    assert await publisher.publish_full(servers) == 2
    assert (await stored(own_client, keys))["version"] == 2


async def test_redis_down_raises_unavailable_and_the_next_publish_is_full(
    own_redis: RedisServer, own_client: aioredis.Redis
) -> None:
    prefix = "discovery:down"
    keys = RedisKeys(prefix)
    registry = CollectorRegistry()
    publisher = LivePublisher(own_client, prefix, leader_id="ss-1", epoch=6, registry=registry)
    a, b = make_instance("ds-a", 9001), make_instance("ds-b", 9002)
    await publisher.publish_full(view(a))

    await asyncio.to_thread(own_redis.stop)
    with pytest.raises(RedisUnavailableError) as failed:
        await publisher.publish_change(view(a, b), added=view(b), changed={}, removed={})
    assert isinstance(failed.value.__cause__, redis.exceptions.ConnectionError)
    with pytest.raises(RedisUnavailableError):
        await publisher.heartbeat()
    assert not publisher.fenced
    assert (
        registry.get_sample_value(
            "discovery_publisher_publishes_total", {"kind": "diff", "result": "error"}
        )
        == 1
    )

    await asyncio.to_thread(own_redis.start)
    events = await subscribe(own_client, keys.events)
    # The failed write may or may not have been applied, so no diff may follow it: the
    # next change is published in full, under a version never used before.
    assert await publisher.publish_change(view(b), added={}, changed={}, removed={}) == 3
    event = await next_event(events)
    assert (event["version"], event["full"], event["prev_version"]) == (3, True, None)
    assert decoded(await stored(own_client, keys)) == view(b)
    await events.aclose()


async def test_fence_falls_back_to_the_snapshot_and_compares_64_bit_epochs(
    client: aioredis.Redis, redis_prefix: str
) -> None:
    keys = RedisKeys(redis_prefix)
    # A snapshot written by something else, without the fence hash.
    await client.set(
        keys.live,
        json.dumps(
            {"epoch": 20, "version": 4, "leader": "other", "published_at": 0, "servers": []}
        ),
    )
    with pytest.raises(FencedError) as refused:
        await LivePublisher(client, redis_prefix, leader_id="a", epoch=19).publish_full({})
    assert (refused.value.stored_epoch, refused.value.stored_version) == (20, 4)
    with pytest.raises(FencedError) as refused:
        await LivePublisher(client, redis_prefix, leader_id="b", epoch=20).publish_full({})
    assert refused.value.reason == "version"
    assert await LivePublisher(client, redis_prefix, leader_id="c", epoch=21).publish_full({}) == 1

    # zxids beyond 2**53 differ in their last digit; the fence must still tell them apart.
    big = 2**60 + 1
    assert await LivePublisher(client, redis_prefix, leader_id="d", epoch=big).publish_full({})
    with pytest.raises(FencedError) as refused:
        await LivePublisher(client, redis_prefix, leader_id="e", epoch=big - 1).publish_full({})
    assert refused.value.stored_epoch == big


async def test_a_retried_write_of_our_own_is_not_fenced(
    client: aioredis.Redis, redis_prefix: str
) -> None:
    keys = RedisKeys(redis_prefix)
    script = client.register_script(FENCE_SCRIPT)
    heartbeat = json.dumps({"leader": "x", "epoch": 1, "version": 1, "at": 0})
    snapshot = json.dumps({"epoch": 1, "version": 1, "leader": "x", "published_at": 0})

    def args(writer: str) -> list[str]:
        return ["publish", "1", "1", writer, "x", heartbeat, "5000", keys.events, snapshot, "{}"]

    call_keys = [keys.live, keys.fence, keys.leader]
    first = await script(keys=call_keys, args=args("writer-1"))
    assert first[:4] == [b"published", b"ok", b"1", b"1"]
    # The same write again (redis-py retrying after a lost reply): recognised, not fenced.
    again = await script(keys=call_keys, args=args("writer-1"))
    assert again[:2] == [b"published", b"duplicate"]
    # The same epoch and version from another writer is refused.
    other = await script(keys=call_keys, args=args("writer-2"))
    assert other == [b"fenced", b"version", b"1", b"1"]
