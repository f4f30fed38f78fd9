"""The search servers' live-list reader, against a real redis-server and the real publisher."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry

from discovery.instance import ServiceInstance
from discovery.redis_v1.layout import V1Keys as RedisKeys
from discovery.redis_v1.publisher import LivePublisherV1 as LivePublisher
from discovery.redis_v1.reader import LiveListReaderV1 as LiveListReader
from discovery.store import LiveList
from discovery.testing import RedisServer
from tests.support import eventually, make_instance, sample, view, waited


def refetches(registry: CollectorRegistry, cause: str) -> float:
    return sample(registry, "discovery_livelist_refetches_total", cause=cause)


def snapshot(epoch: int, version: int, servers: dict[str, ServiceInstance]) -> str:
    return json.dumps(
        {
            "epoch": epoch,
            "version": version,
            "leader": "manual",
            "published_at": 0,
            "servers": [servers[k].to_dict() for k in sorted(servers)],
        }
    )


def event(epoch: int, version: int, prev: int | None, **fields: Any) -> str:
    document: dict[str, Any] = {
        "epoch": epoch,
        "version": version,
        "prev_version": prev,
        "leader": "manual",
        "published_at": 0,
        "full": prev is None,
        "added": [],
        "changed": [],
        "removed": [],
    }
    document.update(fields)
    return json.dumps(document)


async def test_reader_loads_an_existing_snapshot(
    client: aioredis.Redis, redis_prefix: str, registry: CollectorRegistry
) -> None:
    servers = view(
        make_instance("ds-1", 9001, shard=0),
        make_instance("ds-2", 9002, shard=1),
        make_instance("ds-3", 9003, shard=2).with_state("draining"),
    )
    publisher = LivePublisher(client, redis_prefix, leader_id="ss-1", epoch=12)
    await publisher.publish_full(servers)

    async with LiveListReader(client, redis_prefix, registry=registry) as reader:
        current = reader.current
        assert (current.epoch, current.version, current.leader) == (12, 1, "ss-1")
        assert current.published_at > 0
        assert dict(current.servers) == servers
        assert [s.id for s in current.routable] == ["ds-1", "ds-2"]
        assert reader.connected
        assert reader.age() < 5
        with pytest.raises(TypeError):
            current.servers["ds-9"] = make_instance("ds-9")  # type: ignore[index]
        assert refetches(registry, "start") == 1
        assert sample(registry, "discovery_livelist_version") == 1
        assert sample(registry, "discovery_livelist_routable") == 2
        assert sample(registry, "discovery_livelist_connected") == 1
    assert not reader.connected


async def test_a_missing_snapshot_is_an_empty_list(
    client: aioredis.Redis, redis_prefix: str
) -> None:
    async with LiveListReader(client, redis_prefix) as reader:
        assert reader.current == LiveList.EMPTY
        assert (LiveList.EMPTY.epoch, LiveList.EMPTY.version, LiveList.EMPTY.routable) == (0, 0, [])
        assert reader.connected
        # Later publishes arrive.
        publisher = LivePublisher(client, redis_prefix, leader_id="ss-1", epoch=1)
        await publisher.publish_full(view(make_instance("ds-1")))
        current = await waited(
            reader.wait_until(lambda lst: lst.version == 1, timeout=10), "live list version 1"
        )
        assert set(current.servers) == {"ds-1"}


async def test_reader_follows_diffs_in_order(
    client: aioredis.Redis, redis_prefix: str, registry: CollectorRegistry
) -> None:
    publisher = LivePublisher(client, redis_prefix, leader_id="ss-1", epoch=4)
    a, b, c = make_instance("ds-a", 9001), make_instance("ds-b", 9002), make_instance("ds-c", 9003)
    await publisher.publish_full(view(a, b))

    async with LiveListReader(client, redis_prefix, registry=registry) as reader:
        # Published back to back, without waiting: the reader must apply them in order.
        steps: list[dict[str, ServiceInstance]] = []
        steps.append(view(a, b, c))
        await publisher.publish_change(steps[-1], added=view(c), changed={}, removed={})
        a2 = a.with_state("draining", reason="admin")
        steps.append(view(a2, b, c))
        await publisher.publish_change(steps[-1], added={}, changed=view(a2), removed={})
        steps.append(view(a2, c))
        await publisher.publish_change(steps[-1], added={}, changed={}, removed={"ds-b": "expired"})
        current = await waited(
            reader.wait_until(lambda lst: lst.version == 4, timeout=10), "live list version 4"
        )
        assert dict(current.servers) == steps[-1]
        assert [s.id for s in current.routable] == ["ds-c"]
        assert current.servers["ds-a"].payload.reason == "admin"
        assert sample(registry, "discovery_livelist_diffs_applied_total") == 3
        # No refetch beyond the first load: every diff followed its predecessor.
        assert refetches(registry, "gap") == refetches(registry, "epoch") == 0


async def test_a_gap_triggers_a_refetch_that_ends_at_the_snapshot(
    client: aioredis.Redis, redis_prefix: str, registry: CollectorRegistry
) -> None:
    keys = RedisKeys(redis_prefix)
    publisher = LivePublisher(client, redis_prefix, leader_id="ss-1", epoch=7)
    await publisher.publish_full(view(make_instance("ds-1")))

    async with LiveListReader(client, redis_prefix, registry=registry) as reader:
        assert reader.current.version == 1
        # Version 2's message was lost: the snapshot is at 3 and the reader sees only 3's
        # diff, which follows 2 (and whose content, deliberately, is not the snapshot's).
        truth = view(make_instance("ds-7", 9007), make_instance("ds-8", 9008))
        await client.set(keys.live, snapshot(7, 3, truth))
        await client.publish(
            keys.events, event(7, 3, 2, added=[make_instance("ds-wrong").to_dict()])
        )
        current = await waited(
            reader.wait_until(lambda lst: lst.version == 3, timeout=10), "live list version 3"
        )
        assert dict(current.servers) == truth
        assert refetches(registry, "gap") == 1
        assert sample(registry, "discovery_livelist_diffs_applied_total") == 0


async def test_full_events_and_new_epochs_trigger_refetches(
    client: aioredis.Redis, redis_prefix: str, registry: CollectorRegistry
) -> None:
    keys = RedisKeys(redis_prefix)
    old = LivePublisher(client, redis_prefix, leader_id="ss-old", epoch=20)
    await old.publish_full(view(make_instance("ds-1")))

    async with LiveListReader(client, redis_prefix, registry=registry) as reader:
        # A new leader's first publish is a full event.
        new = LivePublisher(client, redis_prefix, leader_id="ss-new", epoch=21)
        servers = view(make_instance("ds-1"), make_instance("ds-2"))
        await new.publish_full(servers)
        current = await waited(
            reader.wait_until(lambda lst: lst.epoch == 21, timeout=10), "live list epoch 21"
        )
        assert (current.version, current.leader) == (1, "ss-new")
        assert dict(current.servers) == servers
        assert refetches(registry, "full") == 1

        # A diff of a newer epoch cannot follow our list either.
        later = view(make_instance("ds-3"))
        await client.set(keys.live, snapshot(22, 5, later))
        await client.publish(keys.events, event(22, 5, 4))
        current = await waited(
            reader.wait_until(lambda lst: lst.epoch == 22, timeout=10), "live list epoch 22"
        )
        assert dict(current.servers) == later
        assert refetches(registry, "epoch") == 1


async def test_a_stale_epoch_snapshot_never_wins(
    client: aioredis.Redis, redis_prefix: str, registry: CollectorRegistry
) -> None:
    keys = RedisKeys(redis_prefix)
    leader = LivePublisher(client, redis_prefix, leader_id="ss-new", epoch=10)
    servers = view(make_instance("ds-1"), make_instance("ds-2"))
    await leader.publish_full(servers)

    async with LiveListReader(
        client, redis_prefix, registry=registry, reconcile_interval=0.1
    ) as reader:
        assert reader.current.position == (10, 1)
        # A deposed leader's leftovers, written around the fence: an older epoch with a
        # much higher version, and its full event.
        stale = view(make_instance("ds-stale"))
        await client.set(keys.live, snapshot(9, 50, stale))
        await client.publish(keys.events, event(9, 50, None))
        await eventually(
            lambda: sample(registry, "discovery_livelist_stale_rejected_total", kind="event"),
            message="the stale event refused",
        )
        # Even an event that claims to be newer only makes the reader look at the
        # snapshot, which it refuses.
        await client.publish(keys.events, event(10, 2, None))
        await eventually(
            lambda: sample(registry, "discovery_livelist_stale_rejected_total", kind="snapshot"),
            message="the stale snapshot refused",
        )
        assert reader.current.position == (10, 1)
        assert dict(reader.current.servers) == servers

        # The real leader's next publish goes on from where it was.
        more = {**servers, **view(make_instance("ds-3"))}
        await leader.publish_change(more, added=view(make_instance("ds-3")), changed={}, removed={})
        current = await waited(
            reader.wait_until(lambda lst: lst.version == 2, timeout=10), "live list version 2"
        )
        assert (current.epoch, dict(current.servers)) == (10, more)


async def test_redis_outage_keeps_the_list_then_reconnects(
    own_redis: RedisServer, own_client: aioredis.Redis, registry: CollectorRegistry
) -> None:
    prefix = "discovery:outage"
    publisher = LivePublisher(own_client, prefix, leader_id="ss-1", epoch=3)
    servers = view(make_instance("ds-1"), make_instance("ds-2"))
    await publisher.publish_full(servers)

    async with LiveListReader(
        own_client, prefix, registry=registry, reconcile_interval=0.1
    ) as reader:
        assert reader.current.version == 1
        await asyncio.to_thread(own_redis.stop)
        await eventually(lambda: not reader.connected, message="reader disconnected")
        before = reader.age()
        await eventually(lambda: reader.age() > before + 0.5, message="age grows")
        assert sample(registry, "discovery_livelist_age_seconds") > before + 0.5
        assert sample(registry, "discovery_livelist_connected") == 0
        # The last known list is still served.
        assert reader.current.version == 1
        assert dict(reader.current.servers) == servers
        assert sample(registry, "discovery_livelist_redis_errors_total", operation="listen") >= 1

        # Redis comes back empty; the leader notices and republishes.
        await asyncio.to_thread(own_redis.start)
        assert not await publisher.heartbeat()
        newer = {**servers, **view(make_instance("ds-3"))}
        assert await publisher.publish_full(newer) == 2
        current = await waited(
            reader.wait_until(lambda lst: lst.version == 2, timeout=15), "live list version 2"
        )
        assert dict(current.servers) == newer
        await eventually(lambda: reader.connected, message="reader subscribed again")
        assert refetches(registry, "reconnect") >= 1
        await eventually(lambda: reader.age() < 1, message="age reset")


async def test_reader_starts_while_redis_is_down(
    own_redis: RedisServer, own_client: aioredis.Redis
) -> None:
    prefix = "discovery:late"
    await asyncio.to_thread(own_redis.stop)
    async with LiveListReader(own_client, prefix) as reader:
        assert reader.current == LiveList.EMPTY
        assert not reader.connected
        await asyncio.to_thread(own_redis.start)
        publisher = LivePublisher(own_client, prefix, leader_id="ss-1", epoch=1)
        await publisher.publish_full(view(make_instance("ds-1")))
        current = await waited(
            reader.wait_until(lambda lst: lst.version == 1, timeout=15), "live list version 1"
        )
        assert set(current.servers) == {"ds-1"}
        await eventually(lambda: reader.connected, message="reader subscribed")


async def test_malformed_messages_are_skipped_and_counted(
    client: aioredis.Redis, redis_prefix: str, registry: CollectorRegistry
) -> None:
    keys = RedisKeys(redis_prefix)
    publisher = LivePublisher(client, redis_prefix, leader_id="ss-1", epoch=2)
    a = make_instance("ds-a")
    await publisher.publish_full(view(a))

    async with LiveListReader(client, redis_prefix, registry=registry) as reader:
        bad_instance = {**a.to_dict(), "port": "not a port"}
        for junk in (
            b"{not json",
            b"\xff\xfe",
            b"[1, 2, 3]",
            b'{"epoch": "2", "version": 2}',
            b'{"epoch": 2, "version": NaN}',
            # These two name a newer version but cannot be applied: each is counted and
            # makes the reader check the snapshot.
            event(2, 2, 1, full="yes").encode(),
            event(2, 2, 1, added=[bad_instance]).encode(),
        ):
            await client.publish(keys.events, junk)
        await eventually(
            lambda: sample(registry, "discovery_livelist_malformed_total", kind="event") == 7,
            message="7 malformed events counted",
        )
        assert refetches(registry, "gap") == 2
        assert reader.connected
        assert reader.current.version == 1

        b = make_instance("ds-b")
        await publisher.publish_change(view(a, b), added=view(b), changed={}, removed={})
        current = await waited(
            reader.wait_until(lambda lst: lst.version == 2, timeout=10), "live list version 2"
        )
        assert dict(current.servers) == view(a, b)


async def test_malformed_snapshots_and_entries_are_skipped(
    client: aioredis.Redis, redis_prefix: str, registry: CollectorRegistry
) -> None:
    keys = RedisKeys(redis_prefix)
    await client.set(keys.live, b"garbage")
    async with LiveListReader(client, redis_prefix, registry=registry) as reader:
        assert reader.current == LiveList.EMPTY
        assert sample(registry, "discovery_livelist_malformed_total", kind="snapshot") == 1

        # One undecodable entry is skipped alone; the rest of the list is used.
        good = view(make_instance("ds-1"), make_instance("ds-2"))
        document = json.loads(snapshot(5, 1, good))
        document["servers"].append({"id": "ds-bad", "port": 1})
        document["servers"].append(good["ds-1"].to_dict())  # a duplicate id
        await client.set(keys.live, json.dumps(document))
        await client.publish(keys.events, event(5, 1, None))
        current = await waited(
            reader.wait_until(lambda lst: lst.version == 1, timeout=10), "live list version 1"
        )
        assert dict(current.servers) == good
        assert sample(registry, "discovery_livelist_malformed_total", kind="server") == 2


async def test_wait_until(client: aioredis.Redis, redis_prefix: str) -> None:
    publisher = LivePublisher(client, redis_prefix, leader_id="ss-1", epoch=1)
    async with LiveListReader(client, redis_prefix) as reader:
        waiter = asyncio.create_task(
            reader.wait_until(lambda lst: "ds-9" in lst.servers, timeout=10)
        )
        await publisher.publish_full(view(make_instance("ds-1")))
        await publisher.publish_full(view(make_instance("ds-1"), make_instance("ds-9")))
        current = await waited(waiter, "ds-9 in the live list")
        assert current.version == 2
        # Already true: returns at once.
        already = reader.wait_until(lambda lst: lst.version >= 1, timeout=1)
        assert (await waited(already, "version >= 1, already true")) is current
        with pytest.raises(TimeoutError):
            await reader.wait_until(lambda lst: lst.version > 100, timeout=0.2)


async def test_clients_that_decode_responses_work_too(
    redis_server: RedisServer, redis_prefix: str
) -> None:
    client = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
    try:
        publisher = LivePublisher(client, redis_prefix, leader_id="ss-1", epoch=5)
        await publisher.publish_full(view(make_instance("ds-1")))
        now = [1000.0]  # a monotonic clock of our own: age() moves only when we say
        async with LiveListReader(
            client, redis_prefix, reconcile_interval=0.05, monotonic=lambda: now[0]
        ) as reader:
            assert reader.current.position == (5, 1)
            b = make_instance("ds-2")
            await publisher.publish_change(
                view(make_instance("ds-1"), b), added=view(b), changed={}, removed={}
            )
            current = await waited(
                reader.wait_until(lambda lst: lst.version == 2, timeout=10), "live list version 2"
            )
            assert set(current.servers) == {"ds-1", "ds-2"}
            assert await publisher.heartbeat()
            now[0] += 100
            assert reader.age() >= 100
            # The reconciler reads the fence (strings here) and confirms the list.
            await eventually(lambda: reader.age() == 0, message="reconciled")
    finally:
        await client.aclose()


async def test_a_silent_connection_is_detected_by_ping(
    own_redis: RedisServer,
    own_client: aioredis.Redis,
    registry: CollectorRegistry,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import discovery.redis_v1.reader as livelist

    # Shorter than in production (5 s each) so that the test is quick.
    monkeypatch.setattr(livelist, "_POLL_INTERVAL", 0.05)
    monkeypatch.setattr(livelist, "_KEEPALIVE_INTERVAL", 0.2)
    monkeypatch.setattr(livelist, "_KEEPALIVE_TIMEOUT", 0.3)
    prefix = "discovery:silent"
    publisher = LivePublisher(own_client, prefix, leader_id="ss-1", epoch=1)
    await publisher.publish_full(view(make_instance("ds-1")))
    admin = aioredis.Redis.from_url(own_redis.url)
    try:
        async with LiveListReader(own_client, prefix, registry=registry) as reader:
            assert reader.connected
            # The server stops answering every client but keeps the connections open,
            # like a hung host: no error reaches the reader, only silence.
            await admin.execute_command("CLIENT", "PAUSE", "2000", "ALL")
            await eventually(lambda: not reader.connected, message="silence detected")
            await eventually(lambda: reader.connected, message="subscribed again")
            await publisher.publish_full(view(make_instance("ds-2")))
            current = await waited(
                reader.wait_until(lambda lst: lst.version == 2, timeout=10), "live list version 2"
            )
            assert set(current.servers) == {"ds-2"}
    finally:
        await admin.aclose()
