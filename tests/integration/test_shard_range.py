"""``--shards N`` for real (issue 42, "phantom shards"): a data server registered with a
shard number outside ``0..N-1`` is skipped and counted by the leader, never published,
and never routed to by a search server of that ``--shards`` even when a leader without
it publishes it. Real ZooKeeper, Redis, data servers and search servers."""

from __future__ import annotations

import redis.asyncio as aioredis

from data_server.corpus import sample_queries
from discovery.livelist.redis.layout import RedisKeys, load
from discovery.zk.paths import DATA_SERVERS_PATH
from tests.support import (
    DataServerFactory,
    SearchServerFactory,
    SessionFactory,
    all_see,
    eventually,
    get_json,
    make_instance,
    sample,
    shard_counts,
)

# Nothing listens on port 9 (discard): a request routed there fails its shard.
PHANTOM = make_instance("ds-999", 9, shard=999, docs=10**12)


async def test_a_leader_with_shards_never_publishes_a_server_of_another_shard(
    make_search_server: SearchServerFactory,
    make_data_server: DataServerFactory,
    make_session: SessionFactory,
    client: aioredis.Redis,
    redis_prefix: str,
) -> None:
    await make_data_server(shard=0, instance_id="ds-r0")
    search = await make_search_server(server_id="ss-range", shards=2)
    await all_see([search], {"ds-r0"})
    raw = await make_session()
    await raw.create(f"{DATA_SERVERS_PATH}/ds-999", PHANTOM.to_json(), ephemeral=True)
    await eventually(
        lambda: (
            sample(
                search.registry, "discovery_membership_skipped_total", reason="shard_out_of_range"
            )
            == 1
        ),
        message="ds-999 skipped as shard_out_of_range",
    )
    assert sample(search.registry, "discovery_membership_invalid") == 1
    # A registration after it is published: the refresh that read ds-999 is long done.
    await make_data_server(shard=1, instance_id="ds-r1")
    await all_see([search], {"ds-r0", "ds-r1"})
    loaded = await load(client, RedisKeys(redis_prefix))
    assert set(loaded.servers) == {"ds-r0", "ds-r1"}
    _, body = await get_json(f"{search.url}/search", q=sample_queries(1, variant=8)[0], k="5")
    assert body["partial"] is False
    assert body["shards"] == shard_counts(2, 2)
    assert body["coverage"]["percent"] == 100.0


async def test_a_search_server_with_shards_never_routes_to_another_shard_a_leader_published(
    make_search_server: SearchServerFactory,
    make_data_server: DataServerFactory,
    make_session: SessionFactory,
) -> None:
    """A leader without ``--shards`` (an older one, or one misconfigured) publishes the
    phantom; a search server told ``--shards 2`` leaves it out of its routing table."""
    leader = await make_search_server(server_id="ss-lead")
    reader = await make_search_server(server_id="ss-read", shards=2, leader_eligible=False)
    for shard in range(2):
        await make_data_server(shard=shard, instance_id=f"ds-r{shard}")
    raw = await make_session()
    await raw.create(f"{DATA_SERVERS_PATH}/ds-999", PHANTOM.to_json(), ephemeral=True)
    await all_see([leader, reader], {"ds-r0", "ds-r1", "ds-999"})
    query = sample_queries(1, variant=8)[0]
    for _ in range(2):
        _, body = await get_json(f"{reader.url}/search", q=query, k="5")
        assert body["partial"] is False, body
        assert body["shards"] == shard_counts(2, 2)
        assert body["coverage"]["missing"] == []
    assert (
        sample(reader.registry, "search_server_fanout_unroutable_total", why="shard_out_of_range")
        >= 1
    )
    assert reader.fanout is not None
    assert set(reader.fanout.expected_shards) == {0, 1}
