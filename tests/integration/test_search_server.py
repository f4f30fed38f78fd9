"""Search servers for real: election, fenced publishing, the live list, the fan-out."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis

from data_server.corpus import sample_queries
from data_server.server import DataServer
from discovery.adminauth import admin_headers
from discovery.errors import FencedError
from discovery.instance import InstanceState
from discovery.livelist.redis.publisher import LivePublisher
from discovery.testing import RedisServer, ZooKeeperEnsemble
from discovery.zk.expiry import expire_session
from discovery.zk.maintenance import MaintenanceMarker
from discovery.zk.paths import MAINTENANCE_PATH, SEARCH_ELECTION_PATH
from search_server.coverage import CoveragePolicy
from search_server.server import SearchServer
from search_server.topk import hits_asked
from tests.support import (
    DataServerFactory,
    SearchServerFactory,
    SessionFactory,
    all_see,
    eventually,
    get_json,
    instance_of,
    live_ids,
    published_term,
    repeat_host,
    sample,
    shard_counts,
    waited,
)

#: The header every admin request carries.
ADMIN = admin_headers()


def _leaders(servers: list[SearchServer]) -> list[SearchServer]:
    return [s for s in servers if s.is_leader]


async def test_cluster_view_pages_filters_and_refuses_bad_parameters(
    make_search_server: SearchServerFactory, make_data_server: DataServerFactory
) -> None:
    for i in range(3):
        await make_data_server(shard=i % 2, instance_id=f"ds-{i}")
    search = await make_search_server(server_id="ss-pages")
    await all_see([search], {"ds-0", "ds-1", "ds-2"})

    status, first = await get_json(f"{search.url}/cluster", limit="2")
    assert status == 200
    assert [s["id"] for s in first["servers"]] == ["ds-0", "ds-1"]
    assert first["page"]["next"] == "ds-1"
    assert first["summary"]["servers"] == 3
    assert first["summary"]["shards"]["total"] == 2
    # Alone among the search servers, it is 0 of 1: its subsets are whole shards.
    assert first["subsets"] == {"size": 8, "rank": 0, "count": 1}
    _, rest = await get_json(f"{search.url}/cluster", limit="2", after=first["page"]["next"])
    assert [s["id"] for s in rest["servers"]] == ["ds-2"]
    assert rest["page"]["next"] is None
    _, shard = await get_json(f"{search.url}/cluster", shard="0")
    assert [s["id"] for s in shard["servers"]] == ["ds-0", "ds-2"]
    for name, value in (("limit", "lots"), ("shard", "-1"), ("state", "asleep"), ("x", "1")):
        status, body = await get_json(f"{search.url}/cluster", **{name: value})
        assert status == 400, (name, body)
        assert name in body["error"]


@pytest.mark.smoke
async def test_three_search_servers_one_leader_same_list(
    make_search_server: SearchServerFactory, make_data_server: DataServerFactory
) -> None:
    data = [await make_data_server(shard=i, instance_id=f"ds-{i}") for i in range(2)]
    search = [await make_search_server(server_id=f"ss-{i}") for i in range(3)]

    await all_see(search, {"ds-0", "ds-1"})
    await eventually(lambda: len(_leaders(search)) == 1, message="one leader")
    leader = _leaders(search)[0]
    views = [(await get_json(f"{s.url}/cluster"))[1] for s in search]
    assert {v["leader"] for v in views} == {leader.server_id}
    assert len({(v["epoch"], v["version"]) for v in views}) == 1
    assert [v["is_leader"] for v in views].count(True) == 1
    assert all({d["id"] for d in v["servers"]} == {"ds-0", "ds-1"} for v in views)
    assert all(isinstance(v["age_ms"], int) for v in views)
    # Each installed the list at or after the leader published it (one clock: one host).
    assert all(v["applied_at_ms"] >= v["published_at"] for v in views)
    # Only the leader watches /data_servers.
    assert leader.election is not None
    for server in search:
        watching = server.registry.get_sample_value("discovery_membership_resyncs_total")
        assert (watching or 0) > 0 if server is leader else not watching
    # Each of them answers queries over both shards.
    for server in search:
        status, body = await get_json(f"{server.url}/search", q=sample_queries(1, variant=6)[0])
        assert status == 200
        assert body["shards"] == shard_counts(2, 2)
        assert body["partial"] is False
    assert data


async def test_a_stopping_search_server_fails_readiness_first_and_answers_through_its_grace(
    make_search_server: SearchServerFactory, make_data_server: DataServerFactory
) -> None:
    """The graceful stop of a rolling restart: ``/readyz`` turns 503 at once (a load
    balancer takes the server out), leadership moves to another search server, and
    queries sent meanwhile are still answered in full until the grace ends."""
    await make_data_server(shard=0, instance_id="ds-0")
    search = [await make_search_server(server_id=f"ss-{i}") for i in range(2)]
    await all_see(search, {"ds-0"})
    await eventually(lambda: len(_leaders(search)) == 1, message="one leader")
    leader = _leaders(search)[0]
    (other,) = [s for s in search if s is not leader]
    url = leader.url
    query = sample_queries(1, variant=6)[0]

    stopping = asyncio.create_task(leader.shutdown(grace=1.5))
    status, body = await get_json(f"{url}/readyz")
    assert status == 503
    assert body["draining"] is True
    await eventually(lambda: other.is_leader, message="leadership handed over in the grace")
    assert not stopping.done()
    status, body = await get_json(f"{url}/search", q=query)
    assert status == 200, body
    assert body["partial"] is False
    await waited(stopping, "the drained search server to stop", timeout=15)
    with pytest.raises(aiohttp.ClientConnectionError):
        await get_json(f"{url}/readyz")


@pytest.mark.smoke
async def test_leader_expiry_hands_over_to_a_higher_epoch_and_the_old_one_is_fenced(
    make_search_server: SearchServerFactory,
    make_data_server: DataServerFactory,
    redis_server: RedisServer,
    redis_prefix: str,
) -> None:
    await make_data_server(instance_id="ds-a")
    search = [await make_search_server(server_id=f"ss-{i}") for i in range(3)]
    await all_see(search, {"ds-a"})
    await eventually(lambda: len(_leaders(search)) == 1, message="one leader")
    old = _leaders(search)[0]
    assert old.election is not None
    old_term = old.election.leadership
    assert old_term is not None
    assert old.session is not None

    await expire_session(old.session)

    def new_leader() -> SearchServer | None:
        leaders = _leaders(search)
        if len(leaders) != 1:
            return None
        term = leaders[0].election.leadership if leaders[0].election else None
        return leaders[0] if term is not None and term.epoch > old_term.epoch else None

    leader = await eventually(new_leader, message="a leader with a higher epoch")
    assert leader.election is not None
    new_epoch = leader.election.leadership.epoch  # type: ignore[union-attr]
    await eventually(
        lambda: all(s.reader is not None and s.reader.current.epoch == new_epoch for s in search),
        message="everyone follows the new epoch",
    )
    assert all(live_ids(s) == {"ds-a"} for s in search)
    # The deposed leader, were it to come back with its old epoch, cannot overwrite.
    client = aioredis.Redis.from_url(redis_server.url)
    try:
        stale = LivePublisher(client, redis_prefix, leader_id=old.server_id, epoch=old_term.epoch)
        with pytest.raises(FencedError):
            await stale.publish_full({})
    finally:
        await client.aclose()
    assert all(live_ids(s) == {"ds-a"} for s in search)


@pytest.mark.smoke
async def test_data_server_offline_drained_or_gone_leaves_every_list(
    make_search_server: SearchServerFactory, make_data_server: DataServerFactory
) -> None:
    offline, drained, stopped = [
        await make_data_server(shard=i, instance_id=name)
        for i, name in enumerate(["ds-offline", "ds-drained", "ds-stopped"])
    ]
    search = [await make_search_server(server_id=f"ss-{i}") for i in range(3)]
    await all_see(search, {"ds-offline", "ds-drained", "ds-stopped"})

    async with aiohttp.ClientSession() as client:
        await client.post(
            f"{offline.url}/admin/fault", json={"mode": "error", "rate": 1.0}, headers=ADMIN
        )
    await all_see(search, {"ds-drained", "ds-stopped"})

    draining = asyncio.create_task(drained.shutdown(grace=1.0))

    def sees_draining(server: SearchServer) -> bool:
        assert server.reader is not None
        instance = server.reader.current.servers.get("ds-drained")
        return instance is not None and instance.payload.state is InstanceState.DRAINING

    await eventually(lambda: all(sees_draining(s) for s in search), message="draining seen")
    await waited(draining, "ds-drained to finish its drain and shut down", timeout=30)
    await all_see(search, {"ds-stopped"})

    await stopped.shutdown(grace=0)
    await all_see(search, set())


async def test_the_routing_table_follows_each_change_without_a_rebuild(
    make_search_server: SearchServerFactory, make_data_server: DataServerFactory
) -> None:
    first = [await make_data_server(shard=i, instance_id=f"ds-{i}") for i in range(2)]
    search = await make_search_server(server_id="ss-0")
    await all_see([search], {"ds-0", "ds-1"})
    query = sample_queries(1, variant=6)[0]

    async def shards_answered() -> int:
        status, body = await get_json(f"{search.url}/search", q=query)
        assert status == 200, body
        shards = body["shards"]
        assert shards["failed"] + shards["timed_out"] == 0, body
        # A shard whose last replica left is missing, never dropped from the total.
        assert body["partial"] is (shards["missing"] > 0), body
        return int(shards["ok"])

    def updates(kind: str) -> float:
        return sample(search.registry, "search_server_fanout_routing_updates_total", kind=kind)

    assert await shards_answered() == 2
    full, moved = updates("full"), updates("change")
    await make_data_server(shard=2, instance_id="ds-2")
    await all_see([search], {"ds-0", "ds-1", "ds-2"})
    await eventually(lambda: updates("change") > moved, message="the add followed")
    assert await shards_answered() == 3
    await first[0].shutdown(grace=0)
    await all_see([search], {"ds-1", "ds-2"})
    await eventually(lambda: updates("change") >= moved + 2, message="the removal followed")
    assert await shards_answered() == 2  # and shard 0 missing
    # Queries routed with the table the changes moved; none had it built again.
    assert updates("full") == full


async def test_redis_restarted_empty_gets_the_list_back_and_queries_keep_working(
    tmp_path: Path,
    make_search_server: SearchServerFactory,
    make_data_server: DataServerFactory,
) -> None:
    redis = RedisServer(tmp_path / "redis")
    redis.start()
    try:
        await make_data_server(shard=0, instance_id="ds-r0")
        await make_data_server(shard=1, instance_id="ds-r1")
        search = [
            await make_search_server(server_id=f"ss-{i}", redis_url=redis.url) for i in range(2)
        ]
        await all_see(search, {"ds-r0", "ds-r1"})
        query = sample_queries(1, variant=7)[0]

        await asyncio.to_thread(redis.stop)
        # Every search server keeps routing with its last known list.
        for server in search:
            status, body = await get_json(f"{server.url}/search", q=query)
            assert status == 200
            assert body["shards"]["ok"] == 2
        await eventually(
            lambda: all((_cluster_age(s) or 0) > 500 for s in search), message="age grows"
        )

        await asyncio.to_thread(redis.start)  # empty: no persistence
        client = aioredis.Redis.from_url(redis.url)
        try:
            await eventually(
                lambda: client.exists(f"{search[0].config.cluster.redis_prefix}:meta"),
                message="the leader republished",
            )
        finally:
            await client.aclose()
        await all_see(search, {"ds-r0", "ds-r1"})
        await eventually(
            lambda: all((_cluster_age(s) or 0) < 2000 for s in search), message="fresh again"
        )
    finally:
        redis.stop()


def _cluster_age(server: SearchServer) -> int | None:
    return server.cluster_view()["age_ms"]


@pytest.mark.smoke
async def test_search_merges_all_shards_like_direct_queries(
    make_search_server: SearchServerFactory, make_data_server: DataServerFactory
) -> None:
    data = [await make_data_server(shard=i, docs=300, instance_id=f"ds-m{i}") for i in range(3)]
    search = await make_search_server(server_id="ss-merge")
    await all_see([search], {"ds-m0", "ds-m1", "ds-m2"})
    for query in sample_queries(10, variant=8):
        direct: list[tuple[float, str]] = []
        for server in data:
            _, body = await get_json(f"{server.url}/search", q=query, k="5")
            direct += [(hit["score"], hit["id"]) for hit in body["hits"]]
        expected = sorted(direct, key=lambda h: (-h[0], h[1]))[:5]
        status, body = await get_json(f"{search.url}/search", q=query, k="5")
        assert status == 200
        assert [(h["score"], h["id"]) for h in body["hits"]] == expected
        assert all(h["id"].startswith(f"s{h['shard']}-") for h in body["hits"])


async def test_shards_are_asked_for_fewer_hits_unless_the_query_opts_out(
    make_search_server: SearchServerFactory, make_data_server: DataServerFactory
) -> None:
    data = [await make_data_server(shard=i, docs=300, instance_id=f"ds-t{i}") for i in range(3)]
    # --topk-probability 0.9: each of 3 equal shards is asked for fewer than k.
    search = await make_search_server(server_id="ss-topk", topk_probability=0.9)
    await all_see([search], {"ds-t0", "ds-t1", "ds-t2"})
    docs = [instance_of(server).payload.docs for server in data]
    k = 50
    asked = hits_asked(k, docs, 0.9)
    assert max(asked) < k

    def asked_total() -> tuple[float, float]:
        return (
            sample(search.registry, "search_server_fanout_topk_hits_asked_total"),
            sample(search.registry, "search_server_fanout_topk_hits_k_total"),
        )

    query = sample_queries(1, variant=8)[0]
    status, body = await get_json(f"{search.url}/search", q=query, k=str(k))
    assert status == 200
    assert asked_total() == (sum(asked), 3 * k)

    # topk_probability=1: every shard asked for k, the top k exactly as direct queries.
    direct: list[tuple[float, str]] = []
    for server in data:
        _, answer = await get_json(f"{server.url}/search", q=query, k=str(k))
        direct += [(hit["score"], hit["id"]) for hit in answer["hits"]]
    expected = sorted(direct, key=lambda h: (-h[0], h[1]))[:k]
    status, body = await get_json(f"{search.url}/search", q=query, k=str(k), topk_probability="1")
    assert status == 200
    assert [(h["score"], h["id"]) for h in body["hits"]] == expected
    assert asked_total() == (sum(asked) + 3 * k, 6 * k)

    for value, message in [
        ("0", "'topk_probability' must be above 0 and at most 1, got 0"),
        ("1.5", "'topk_probability' must be in 0..1, got 1.5"),
        ("-1", "'topk_probability' must be in 0..1"),
        ("nan", "'topk_probability' must be a number"),
        ("often", "'topk_probability' must be a number"),
    ]:
        status, body = await get_json(f"{search.url}/search", q=query, topk_probability=value)
        assert status == 400, value
        assert body["parameter"] == "topk_probability"
        assert message in body["error"]
    assert asked_total() == (sum(asked) + 3 * k, 6 * k)  # refused before any fan-out


async def test_a_second_round_makes_the_top_k_what_asking_every_shard_for_k_gives(
    make_search_server: SearchServerFactory, make_data_server: DataServerFactory
) -> None:
    for i in range(3):
        await make_data_server(shard=i, docs=300, instance_id=f"ds-r{i}")
    # At 0.5 each of 3 equal shards is asked for 9 of k = 20: a shard whose nine all
    # make the top 20 is common, and is asked again for 20.
    search = await make_search_server(server_id="ss-round", topk_probability=0.5)
    await all_see([search], {"ds-r0", "ds-r1", "ds-r2"})
    k = 20
    assert hits_asked(k, [300] * 3, 0.5) == [9, 9, 9]

    def rounds() -> float:
        return sample(search.registry, "search_server_fanout_topk_second_rounds_total", result="ok")

    for query in sample_queries(30, variant=12):
        status, body = await get_json(f"{search.url}/search", q=query, k=str(k))
        assert status == 200, body
        assert not body["partial"]
        status, exact = await get_json(
            f"{search.url}/search", q=query, k=str(k), topk_probability="1"
        )
        assert status == 200, exact
        assert body["hits"] == exact["hits"], query
    # Second rounds happened, all of them complete: no query left maybe inexact.
    assert rounds() >= 5
    assert (
        sample(search.registry, "search_server_fanout_topk_second_round_shards_total") >= rounds()
    )
    assert (
        sample(
            search.registry, "search_server_fanout_topk_second_rounds_total", result="incomplete"
        )
        == 0
    )
    assert sample(search.registry, "search_server_fanout_topk_maybe_inexact_total") == 0


async def test_hung_data_server_never_stalls_a_query(
    make_search_server: SearchServerFactory, make_data_server: DataServerFactory
) -> None:
    healthy = await make_data_server(shard=0, instance_id="ds-ok")
    hung = await make_data_server(shard=1, instance_id="ds-hung")
    search = await make_search_server(server_id="ss-hang", eject_after=100)
    await all_see([search], {"ds-ok", "ds-hung"})
    query = sample_queries(1, variant=9)[0]

    async with aiohttp.ClientSession() as client:
        await client.post(f"{hung.url}/admin/fault", json={"mode": "hang"}, headers=ADMIN)
    partial_seen = False
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        # The hung server never answers until its fault is cleared (below): any answer
        # at all is one the deadline ended, whatever the machine's speed. How close to
        # the 300 ms it comes is a benchmark's figure (bench/bench_fanout.py).
        status, body = await get_json(f"{search.url}/search", q=query, timeout_ms="300")
        assert status == 200
        partial_seen = True
        assert body["partial"]
        if body["shards"]["missing"] == 0:
            assert body["shards"]["timed_out"] + body["shards"]["failed"] == 1
        else:
            # Not waited for any more once the hung server is out of the list: its
            # shard (its only replica) is missing, never asked.
            assert body["shards"] == shard_counts(2, 1, missing=1)
            break
    else:
        pytest.fail("timed out after 20s waiting for the hung server to leave the live list")
    assert partial_seen
    # The agent announces the departure (draining, which stops routing) before it
    # deletes its node: two publishes, so the query above can be complete while the
    # list still holds the server as draining. It must not be routable by then.
    assert search.reader is not None
    hung_entry = search.reader.current.servers.get("ds-hung")
    assert hung_entry is None or not hung_entry.routable, hung_entry
    await eventually(
        lambda: "ds-hung" not in live_ids(search), message="the hung server leaves the list"
    )
    assert healthy.port is not None
    async with aiohttp.ClientSession() as client:
        await client.post(f"{hung.url}/admin/fault", json={"mode": "none"}, headers=ADMIN)


async def test_overload_is_refused_at_once_and_bad_parameters_get_400(
    make_search_server: SearchServerFactory, make_data_server: DataServerFactory
) -> None:
    slow: DataServer = await make_data_server(
        shard=0, instance_id="ds-slow", agent=_lenient_agent()
    )
    search = await make_search_server(server_id="ss-busy", max_in_flight=2)
    await all_see([search], {"ds-slow"})
    async with aiohttp.ClientSession() as client:
        await client.post(f"{slow.url}/admin/fault", json={"mode": "hang"}, headers=ADMIN)
    busy = [
        asyncio.create_task(get_json(f"{search.url}/search", q="a", timeout_ms="10000"))
        for _ in range(2)
    ]
    await eventually(
        lambda: (search.registry.get_sample_value("search_server_fanout_in_flight") or 0) == 2,
        message="two queries in flight",
    )
    status, body = await get_json(f"{search.url}/search", q="a")
    assert status == 503
    assert "overloaded" in body["error"]
    # Refused at once, not queued behind them: both still wait on the hung server,
    # which answers nothing until its fault is cleared.
    assert not any(task.done() for task in busy)
    async with aiohttp.ClientSession() as client:
        await client.post(f"{slow.url}/admin/fault", json={"mode": "none"}, headers=ADMIN)
    answers = await waited(asyncio.gather(*busy), "the two held queries to finish", timeout=15)
    assert [status for status, _ in answers] == [200, 200]

    for params, message in [
        ({}, "missing query parameter 'q'"),
        ({"q": "a", "k": "0"}, "'k' must be in 1..1000"),
        ({"q": "a", "k": "x"}, "'k' must be an integer"),
        ({"q": "a", "timeout_ms": "0"}, "'timeout_ms' must be in"),
        ({"q": "a", "timeout_ms": "99999999"}, "'timeout_ms' must be in"),
        ({"q": "x" * 2000}, "longer than"),
    ]:
        status, body = await get_json(f"{search.url}/search", **params)
        assert status == 400
        assert message in body["error"]


async def test_the_coverage_policy_lets_a_hung_shard_go_and_bad_parameters_get_400(
    make_search_server: SearchServerFactory, make_data_server: DataServerFactory
) -> None:
    for shard in range(3):
        await make_data_server(shard=shard, docs=300, instance_id=f"ds-cov{shard}")
    hung = await make_data_server(shard=3, docs=300, instance_id="ds-cov3", agent=_lenient_agent())
    # --min-coverage 75 (3 of the 4 equal shards), --adaptive-wait 1.
    search = await make_search_server(
        server_id="ss-coverage", coverage=CoveragePolicy(0.75, adaptive_wait=1.0)
    )
    await all_see([search], {f"ds-cov{shard}" for shard in range(4)})
    query = sample_queries(1, variant=11)[0]
    async with aiohttp.ClientSession() as client:
        await client.post(f"{hung.url}/admin/fault", json={"mode": "hang"}, headers=ADMIN)
    try:
        # More queries than --eject-after (3): a replica charged with each would go.
        for _ in range(4):
            # The hung server answers nothing until its fault is cleared: an answer
            # before the 10 s deadline is one the policy ended.
            status, body = await get_json(f"{search.url}/search", q=query, timeout_ms="10000")
            assert status == 200, body
            assert body["shards"] == shard_counts(4, 3, timed_out=1)
            assert body["coverage"]["degraded"] == ["adaptive_wait"]
            assert body["coverage"]["percent"] == 75.0
            assert body["took_ms"] < 10_000
        assert search.fanout is not None
        assert search.fanout.ejected() == set()
        assert (
            sample(
                search.registry,
                "search_server_fanout_queries_ended_early_total",
                rule="adaptive_wait",
            )
            == 4
        )
        # A query's own parameters override the flags: this one wants every shard.
        status, body = await get_json(
            f"{search.url}/search", q=query, timeout_ms="300", min_coverage="100"
        )
        assert status == 200, body
        assert body["coverage"]["degraded"] == ["deadline"]
    finally:
        async with aiohttp.ClientSession() as client:
            await client.post(f"{hung.url}/admin/fault", json={"mode": "none"}, headers=ADMIN)

    for name, value, message in [
        ("min_coverage", "0", "'min_coverage' must be above 0"),
        ("min_coverage", "101", "'min_coverage' must be in 0..100"),
        ("min_coverage", "most", "'min_coverage' must be a number"),
        ("soft_timeout", "2", "'soft_timeout' must be in 0..1"),
        ("adaptive_wait", "-1", "'adaptive_wait' must be in 0..1000"),
        ("adaptive_wait", "inf", "'adaptive_wait' must be a number"),
    ]:
        status, body = await get_json(f"{search.url}/search", q="a", **{name: value})
        assert status == 400, (name, value, body)
        assert body["parameter"] == name
        assert message in body["error"]


def _lenient_agent() -> Any:
    import dataclasses

    from tests.support import FAST_AGENT

    # Slow on purpose for this test: the agent must not take it offline meanwhile.
    return dataclasses.replace(FAST_AGENT, max_latency=5.0, probe_timeout=5.0)


async def test_suspended_leader_stops_publishing_and_resumes_in_the_same_session(
    zk_ensemble: ZooKeeperEnsemble,
    chroot: Callable[[str], str],
    make_search_server: SearchServerFactory,
    redis_server: RedisServer,
) -> None:
    first = zk_ensemble.servers[0]
    # The leader talks to server 0 only, so stopping it suspends the leader alone.
    leader = await make_search_server(
        server_id="ss-suspend", zk=chroot(repeat_host(first.address)), session_timeout=20
    )
    assert leader.reader is not None
    await eventually(lambda: leader.is_leader, message="leads")
    await waited(
        leader.reader.wait_until(lambda live: live.version > 0, timeout=10), "a published list"
    )
    assert leader.session is not None
    session_id = leader.session.session_id
    prefix = leader.config.cluster.redis_prefix
    client = aioredis.Redis.from_url(redis_server.url)
    try:
        epoch, version = map(int, await client.hmget(f"{prefix}:meta", "epoch", "version"))

        await asyncio.to_thread(zk_ensemble.stop_server, 0)
        # No heartbeat while suspended: the leader key runs out (TTL 2 s)...
        await eventually(
            lambda: _missing(client, f"{prefix}:leader"), timeout=10, message="heartbeat stopped"
        )
        # ...and nothing was published meanwhile.
        assert list(map(int, await client.hmget(f"{prefix}:meta", "epoch", "version"))) == [
            epoch,
            version,
        ]
        assert leader.is_leader  # suspended is not lost

        await asyncio.to_thread(zk_ensemble.start_server, 0)
        # Same session, same term: a full republish in the same epoch, heartbeats again.
        await eventually(
            lambda: _fence_above(client, prefix, epoch, version), message="republished"
        )
        assert leader.session.session_id == session_id
        assert await client.exists(f"{prefix}:leader")
    finally:
        await client.aclose()


async def _missing(client: aioredis.Redis, key: str) -> bool:
    return not await client.exists(key)


async def _fence_above(client: aioredis.Redis, prefix: str, epoch: int, version: int) -> bool:
    stored = await client.hmget(f"{prefix}:meta", "epoch", "version")
    return int(stored[0]) == epoch and int(stored[1]) > version


async def test_fenced_leader_resigns_and_rejoins_with_a_higher_epoch(
    make_search_server: SearchServerFactory,
    make_session: SessionFactory,
    redis_server: RedisServer,
    redis_prefix: str,
) -> None:
    leader = await make_search_server(server_id="ss-fenced")
    term = await published_term(leader)
    assert leader.reader is not None
    assert leader.election is not None
    # An epoch a newer leader could hold: the czxid of a node created in the election
    # directory after ours (a name the recipe ignores, so it does not contend). An
    # epoch no node ever had would not depose the leader (test_redis_contents.py).
    session = await make_session()
    await session.create(f"{SEARCH_ELECTION_PATH}/usurper", ephemeral=True)
    node = await session.exists(f"{SEARCH_ELECTION_PATH}/usurper")
    assert node is not None
    assert node.czxid > term.epoch
    client = aioredis.Redis.from_url(redis_server.url)
    try:
        # Someone with a newer epoch publishes: our leader's next write is refused...
        usurper = LivePublisher(client, redis_prefix, leader_id="usurper", epoch=node.czxid)
        await usurper.publish_full({})
        # ...so it gives the term up and wins a new one, whose node is newer still.
        await eventually(
            lambda: leader.election is not None and leader.election.terms >= 2,
            message="a second term",
        )
        await waited(
            leader.reader.wait_until(
                lambda live: live.leader == "ss-fenced" and live.epoch > node.czxid, timeout=10
            ),
            "a list of ss-fenced's new, higher epoch",
        )
    finally:
        await client.aclose()


async def test_optional_zookeeper_fallback_during_a_long_redis_outage(
    tmp_path: Path,
    make_search_server: SearchServerFactory,
    make_data_server: DataServerFactory,
) -> None:
    redis = RedisServer(tmp_path / "redis")
    redis.start()
    try:
        await make_data_server(shard=0, instance_id="ds-f0")
        search = await make_search_server(
            server_id="ss-fallback", redis_url=redis.url, zk_fallback_after=0.5
        )
        plain = await make_search_server(server_id="ss-plain", redis_url=redis.url)
        await all_see([search, plain], {"ds-f0"})

        await asyncio.to_thread(redis.stop)
        await eventually(
            lambda: search.cluster_view()["source"] == "zookeeper", message="fallback on"
        )
        # A server that joins during the outage is routed to by the fallback only.
        await make_data_server(shard=1, instance_id="ds-f1")
        await eventually(
            lambda: {s["id"] for s in search.cluster_view()["servers"]} == {"ds-f0", "ds-f1"},
            message="fallback sees the newcomer",
        )
        status, body = await get_json(f"{search.url}/search", q=sample_queries(1, variant=10)[0])
        assert status == 200
        assert body["shards"]["total"] == 2
        # An operator's maintenance marker holds while routing from ZooKeeper too.
        assert search.session is not None
        marker = MaintenanceMarker.create("ds-f1", "disk swap")
        await search.session.create(f"{MAINTENANCE_PATH}/ds-f1", marker.to_json(), makepath=True)
        await eventually(
            lambda: (
                {s["id"]: s["state"] for s in search.cluster_view()["servers"]}
                == {"ds-f0": "serving", "ds-f1": "maintenance"}
            ),
            message="the fallback applies the marker",
        )
        status, body = await get_json(f"{search.url}/search", q=sample_queries(1, variant=10)[0])
        # ds-f1 in maintenance: its shard is missing (still counted in the total).
        assert (body["shards"]["total"], body["shards"]["missing"]) == (2, 1)
        await search.session.delete(f"{MAINTENANCE_PATH}/ds-f1")
        await eventually(
            lambda: {s["state"] for s in search.cluster_view()["servers"]} == {"serving"},
            message="cleared",
        )
        assert plain.cluster_view()["source"] == "redis"
        assert {s["id"] for s in plain.cluster_view()["servers"]} == {"ds-f0"}

        await asyncio.to_thread(redis.start)
        await eventually(lambda: search.cluster_view()["source"] == "redis", message="back")
        await all_see([search, plain], {"ds-f0", "ds-f1"})
    finally:
        redis.stop()


async def test_an_answer_says_a_shard_is_missing_once_its_last_replica_is_gone(
    make_search_server: SearchServerFactory, make_data_server: DataServerFactory
) -> None:
    """The first thing a new user tries: shards 0 and 1 on one data server each, shard
    1's stops. The answers must not claim to be complete with half the corpus gone;
    and one search server told the cluster has three shards reports the third, never
    seen, as missing from the start."""
    await make_data_server(shard=0, docs=300, instance_id="ds-c0")
    second = await make_data_server(shard=1, docs=300, instance_id="ds-c1")
    seen = await make_search_server(server_id="ss-seen")
    told = await make_search_server(server_id="ss-told", shards=3)
    await all_see([seen, told], {"ds-c0", "ds-c1"})
    query = sample_queries(1, variant=8)[0]

    _, body = await get_json(f"{seen.url}/search", q=query, k="5")
    assert body["partial"] is False
    assert body["shards"] == shard_counts(2, 2)
    assert body["coverage"] == {
        "percent": 100.0,
        "docs": 600,
        "docs_total": 600,
        "shards": 2,
        "shards_total": 2,
        "full": True,
        "missing": [],
        "degraded": [],
    }
    _, body = await get_json(f"{told.url}/search", q=query, k="5")
    assert body["partial"] is True
    assert (body["shards"]["total"], body["shards"]["missing"]) == (3, 1)
    # Shard 2 was never seen: it counts as an average shard.
    assert body["coverage"]["missing"] == [2]
    assert body["coverage"]["docs_total"] == 900
    assert body["coverage"]["degraded"] == ["no_replica"]

    await second.shutdown(grace=0)
    await all_see([seen, told], {"ds-c0"})
    for server, total in ((seen, 2), (told, 3)):
        _, body = await get_json(f"{server.url}/search", q=query, k="5")
        assert body["partial"] is True
        assert body["shards"]["total"] == total
        assert body["shards"]["ok"] == 1
        assert body["coverage"]["docs"] == 300
        assert body["coverage"]["missing"] == ([1] if total == 2 else [1, 2])
        assert body["coverage"]["degraded"] == ["no_replica"]
        assert body["coverage"]["percent"] == pytest.approx(100 / total, abs=0.01)
        assert all(hit["shard"] == 0 for hit in body["hits"])
