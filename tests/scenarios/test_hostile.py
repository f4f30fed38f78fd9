"""Hostile input against a real cluster: ZooKeeper, Redis, search and data servers.

Registrations written straight into ``/data_servers`` by a raw session (bad JSON,
wrong types, a 1 MB payload, deep nesting, an impersonating id, binary garbage)
must never crash the leader, never reach the published list, and be counted; and a
hostile query must never make a search server count its data servers as failing.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis

from data_server.corpus import sample_queries
from discovery.address import NetworkPolicy, parse_networks
from discovery.errors import ZkConnectionError
from discovery.http import MAX_QUERY_BYTES
from discovery.instance import MAX_INSTANCE_BYTES
from discovery.livelist.redis.layout import RedisKeys, load
from discovery.zk.paths import DATA_SERVERS_PATH
from tests.support import (
    DataServerFactory,
    SearchServerFactory,
    SessionFactory,
    all_see,
    eventually,
    frequent_terms,
    get_json,
    live_ids,
    shard_counts,
)

# ZooKeeper's default jute.maxbuffer is 0xfffff bytes (1 MiB - 1) for a whole packet:
# a node of 1,000,000 bytes is accepted, one of 1 MiB is refused.
BIG_BUT_ACCEPTED = 1_000_000
ONE_MIB = 1024 * 1024


def _doc(instance_id: str, **changes: Any) -> dict[str, Any]:
    """A well-formed registration document (Curator's layout) with ``changes``."""
    doc: dict[str, Any] = {
        "name": "data_servers",
        "id": instance_id,
        "address": "127.0.0.1",
        "port": 9,
        "sslPort": None,
        "payload": {"shard": 0, "replica": 0, "docs": 1, "version": "x", "state": "serving"},
        "registrationTimeUTC": 1,
        "serviceType": "DYNAMIC",
        "uriSpec": None,
        "enabled": True,
    }
    payload = changes.pop("payload", {})
    doc.update(changes)
    doc["payload"] = {**doc["payload"], **payload}
    return doc


def _bytes(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def _hostile_nodes() -> dict[str, tuple[bytes, str]]:
    """Node name -> (data, the reason the leader must skip it with)."""
    deep = _bytes(_doc("hostile-deep", payload={"x": "DEEP"}))
    levels = (MAX_INSTANCE_BYTES - len(deep)) // 2 - 10  # as deep as the size bound allows
    big = _bytes(_doc("hostile-1mb", payload={"pad": ""}))
    return {
        "hostile-bad-json": (b'{"name":"data_servers","id":"hostile-bad-json",', "malformed"),
        "hostile-shard-string": (
            _bytes(_doc("hostile-shard-string", payload={"shard": "3"})),
            "malformed",
        ),
        "hostile-1mb": (
            big.replace(b'"pad":""', b'"pad":"' + b"x" * (BIG_BUT_ACCEPTED - len(big)) + b'"'),
            "too_large",
        ),
        "hostile-deep": (
            deep.replace(b'"DEEP"', b"[" * levels + b"]" * levels),
            "malformed",
        ),
        "hostile-nested-70": (
            _bytes(_doc("hostile-nested-70", payload={"x": json.loads("[" * 70 + "]" * 70)})),
            "malformed",
        ),
        # A valid document claiming to be the real data server, with another address.
        "hostile-impersonator": (_bytes(_doc("ds-good-0", port=1)), "id_mismatch"),
        "hostile-binary": (bytes(range(256)) * 8, "malformed"),
        "hostile-nan": (
            _bytes(_doc("hostile-nan")).replace(b'"port":9', b'"port":NaN'),
            "malformed",
        ),
        "hostile-huge-int": (
            _bytes(_doc("hostile-huge-int")).replace(b'"port":9', b'"port":' + b"9" * 5000),
            "malformed",
        ),
        "hostile-empty": (b"", "malformed"),
        # Addresses no search server can encode, or must never be sent to: one such
        # registration made every /search of every search server answer 500.
        "hostile-unicode-name": (
            _bytes(_doc("hostile-unicode-name", address="dätä.example")),
            "malformed",
        ),
        "hostile-long-label": (
            _bytes(_doc("hostile-long-label", address="a" * 70 + ".example")),
            "malformed",
        ),
        "hostile-metadata": (
            _bytes(_doc("hostile-metadata", address="169.254.169.254")),
            "malformed",
        ),
        "hostile-multicast": (_bytes(_doc("hostile-multicast", address="ff02::1")), "malformed"),
        "hostile-octal": (_bytes(_doc("hostile-octal", address="0251.0376.1.1")), "malformed"),
    }


async def test_hostile_registrations_never_crash_the_leader_nor_reach_the_list(
    make_search_server: SearchServerFactory,
    make_data_server: DataServerFactory,
    make_session: SessionFactory,
    client: aioredis.Redis,
    redis_prefix: str,
) -> None:
    good = await make_data_server(shard=0, instance_id="ds-good-0")
    search = [await make_search_server(server_id=f"ss-{i}") for i in range(2)]
    await all_see(search, {"ds-good-0"})
    leader = await eventually(
        lambda: next((s for s in search if s.is_leader), None), message="a leader"
    )
    epoch = leader.cluster_view()["epoch"]

    raw = await make_session()
    await raw.ensure_path(DATA_SERVERS_PATH)
    hostile = _hostile_nodes()
    for name, (data, _) in hostile.items():
        await raw.create(f"{DATA_SERVERS_PATH}/{name}", data, ephemeral=True)

    # 1 MiB does not fit ZooKeeper's packet limit: the server drops that connection,
    # the writer gets a clean error and nothing is created. Everyone else is unaffected.
    refused = await make_session()
    with pytest.raises(ZkConnectionError):
        await refused.create(f"{DATA_SERVERS_PATH}/hostile-1mib", b"x" * ONE_MIB, ephemeral=True)
    assert await raw.exists(f"{DATA_SERVERS_PATH}/hostile-1mib") is None

    def skipped(reason: str) -> float:
        value = leader.registry.get_sample_value(
            "discovery_membership_skipped_total", {"reason": reason}
        )
        return value or 0.0

    expected = {
        reason: sum(1 for _, why in hostile.values() if why == reason)
        for reason in ("malformed", "too_large", "id_mismatch")
    }
    await eventually(
        lambda: {reason: skipped(reason) for reason in expected} == expected,
        message=f"skipped counts {expected}",
    )
    assert leader.registry.get_sample_value("discovery_membership_invalid") == len(hostile)

    # The leader keeps leading, in the same term, and keeps publishing.
    assert leader.is_leader
    assert [s.is_leader for s in search].count(True) == 1
    later = await make_data_server(shard=1, instance_id="ds-good-1")
    await all_see(search, {"ds-good-0", "ds-good-1"})
    assert leader.cluster_view()["epoch"] == epoch
    assert leader.is_leader

    # Redis holds only the real servers, with their real addresses: the impersonator
    # did not replace ds-good-0.
    loaded = await load(client, RedisKeys(redis_prefix))
    published = {k: instance.to_dict() for k, instance in loaded.servers.items()}
    assert set(published) == {"ds-good-0", "ds-good-1"}
    assert published["ds-good-0"]["port"] == good.port
    assert published["ds-good-1"]["port"] == later.port

    # Queries over both shards still succeed on every search server.
    for server in search:
        status, body = await get_json(f"{server.url}/search", q=sample_queries(1, variant=3)[0])
        assert status == 200
        assert body["shards"] == shard_counts(2, 2)

    # A hostile node is still watched: fixed, it joins (as a replica of shard 1).
    await raw.set(
        f"{DATA_SERVERS_PATH}/hostile-shard-string",
        _bytes(
            _doc(
                "hostile-shard-string",
                port=later.port,
                payload={"shard": 1, "replica": 1, "docs": 300},
            )
        ),
    )
    await all_see(search, {"ds-good-0", "ds-good-1", "hostile-shard-string"})
    # Counted once per version: re-reading the other bad nodes counted nothing more.
    assert {reason: skipped(reason) for reason in expected} == expected
    assert leader.registry.get_sample_value("discovery_membership_invalid") == len(hostile) - 1
    assert leader.cluster_view()["epoch"] == epoch


async def test_a_query_no_data_server_could_take_is_refused_by_the_search_server(
    make_search_server: SearchServerFactory, make_data_server: DataServerFactory
) -> None:
    """The search server forwards q with "&k=..." appended; a q that just fits its own
    request-line limit (8190) did not fit the data servers', which answered 400 - and
    every such query counted as a failure of every data server, ejecting them."""
    await make_data_server(shard=0, instance_id="ds-0")
    await make_data_server(shard=1, instance_id="ds-1")
    search = await make_search_server(server_id="ss-0")
    await all_see([search], {"ds-0", "ds-1"})

    # 4-byte UTF-8 characters, percent-encoded to 12 URL characters each.
    at_the_old_edge = "\U0001d11e" * 680 + "a" * 18
    for _ in range(search.config.eject_after + 1):
        status, body = await get_json(f"{search.url}/search", q=at_the_old_edge)
        assert status == 400
        assert body["parameter"] == "q"
        assert "bytes" in body["error"]
    assert (
        search.registry.get_sample_value(
            "discovery_http_rejected_total",
            {"endpoint": "/search", "parameter": "q", "reason": "too_long"},
        )
        == search.config.eject_after + 1
    )
    assert search.fanout is not None
    assert not search.fanout.ejected()

    # The longest query accepted reaches every data server and is answered by all.
    longest = "\U0001d11e" * (MAX_QUERY_BYTES // 4)
    status, body = await get_json(f"{search.url}/search", q=longest)
    assert status == 200
    assert body["shards"] == shard_counts(2, 2)
    assert not (
        search.registry.get_sample_value(
            "search_server_fanout_shard_requests_total", {"result": "error"}
        )
    )


async def test_allowed_networks_keep_other_addresses_out_of_the_published_list(
    make_search_server: SearchServerFactory,
    make_data_server: DataServerFactory,
    make_session: SessionFactory,
    client: aioredis.Redis,
    redis_prefix: str,
) -> None:
    await make_data_server(shard=0, instance_id="ds-inside")
    search = await make_search_server(
        server_id="ss-0", allowed_networks=NetworkPolicy.of(parse_networks("127.0.0.0/8"))
    )
    await all_see([search], {"ds-inside"})
    raw = await make_session()
    # A valid registration, but at an address this deployment does not admit.
    await raw.create(
        f"{DATA_SERVERS_PATH}/ds-elsewhere",
        _bytes(_doc("ds-elsewhere", address="192.0.2.10", port=9001)),
        ephemeral=True,
    )
    await eventually(
        lambda: (
            search.registry.get_sample_value(
                "discovery_membership_skipped_total", {"reason": "not_allowed"}
            )
            == 1
        ),
        message="ds-elsewhere skipped as not_allowed",
    )
    loaded = await load(client, RedisKeys(redis_prefix))
    assert set(loaded.servers) == {"ds-inside"}


async def test_a_storm_of_worst_case_queries_leaves_normal_queries_complete(
    make_search_server: SearchServerFactory, make_data_server: DataServerFactory
) -> None:
    """Issue 21: four clients sending a shard's most frequent terms made 40 of 40 normal
    queries partial. Now the data servers cut such a search at its budget in slices,
    and the search server refuses the query once it has failed on many shards while
    other queries did not (422); normal queries through the same search server stay
    at least 90 % complete, and no data server's agent takes it offline."""
    data = [
        await make_data_server(shard=shard, docs=20_000, instance_id=f"ds-{shard}")
        for shard in range(2)
    ]
    search = await make_search_server(server_id="ss-0")
    await all_see([search], {"ds-0", "ds-1"})
    assert data[0].index is not None
    worst = frequent_terms(data[0].index, 150)
    stop = asyncio.Event()
    storm: list[int] = []

    async def worst_case_client() -> None:
        async with aiohttp.ClientSession() as client:
            while not stop.is_set():
                params = {"q": worst, "k": "10", "timeout_ms": "500"}
                async with client.get(f"{search.url}/search", params=params) as response:
                    await response.read()
                    storm.append(response.status)

    normal: list[bool] = []
    clients = [asyncio.create_task(worst_case_client()) for _ in range(4)]
    try:
        async with aiohttp.ClientSession() as client:
            for query in sample_queries(60, variant=5):
                params = {"q": query, "k": "10", "timeout_ms": "500"}
                async with client.get(f"{search.url}/search", params=params) as response:
                    assert response.status == 200
                    normal.append(not (await response.json())["partial"])
    finally:
        stop.set()
        await asyncio.gather(*clients)

    complete = sum(normal) / len(normal)
    assert complete >= 0.9, f"{sum(normal)} of {len(normal)} normal queries complete"
    # The storm was refused after its strikes, without asking the data servers.
    assert 422 in storm
    assert search.registry.get_sample_value("search_server_query_of_death_quarantines_total")
    assert all(server.agent is not None and server.agent.status().registered for server in data)
    assert live_ids(search) == {"ds-0", "ds-1"}
