"""The search server's fan-out, against real in-process data servers over real HTTP.

The server lists are passed to the fan-out directly (what the live list would hold), so
the data servers' agents taking a sick server offline in ZooKeeper does not matter here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import random
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any
from urllib.parse import parse_qs, urlsplit

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from data_server.corpus import sample_queries
from data_server.server import DataServer
from discovery.adminauth import admin_headers
from discovery.errors import DiscoveryError, OverloadedError
from discovery.instance import ServiceInstance
from discovery.testing.ports import free_port
from search_server.fanout import FanOut, FanOutConfig
from search_server.httpclient import Endpoint, HttpClient, Response
from search_server.picking import PowerOfTwoChoices, Replica
from search_server.retrybudget import RetryBudget
from search_server.subsetting import DeterministicAperture, Position
from tests.support import (
    DataServerFactory,
    FakeClock,
    eventually,
    frequent_terms,
    instance_of,
    loop_settled,
    make_instance,
    sample,
    shard_counts,
)

QUERIES = sample_queries(12, variant=7)


@pytest.fixture
async def client() -> AsyncIterator[HttpClient]:
    """The fan-out's sub-request client, closed after the test."""
    async with HttpClient() as sub_client:
        yield sub_client


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """A pooled keep-alive session, as the search server's app creates it."""
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=64)
    async with aiohttp.ClientSession(connector=connector) as session:
        yield session


# How late a query's deadline may fire before its timeouts are charged to no one
# (stall_grace): room no load on this shared test loop reaches, so that every timeout
# counts toward an ejection. The rule itself has its own test (woken late, below).
SLACK = 30.0


async def _set_fault(http: aiohttp.ClientSession, server: DataServer, **fault: Any) -> None:
    async with http.post(
        f"{server.url}/admin/fault", json=fault, headers=admin_headers()
    ) as response:
        assert response.status == 200, await response.text()


async def _direct(
    http: aiohttp.ClientSession, server: DataServer, query: str, k: int
) -> dict[str, Any]:
    async with http.get(f"{server.url}/search", params={"q": query, "k": str(k)}) as response:
        assert response.status == 200
        body: dict[str, Any] = await response.json()
        return body


def _sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return sample(registry, f"search_server_fanout_{name}", **labels)


def _stopped(instance_id: str, shard: int, replica: int = 0) -> ServiceInstance:
    """A registration whose port nobody listens on: connections are refused."""
    return make_instance(instance_id, free_port(), shard=shard, replica=replica)


async def test_merges_the_top_k_of_one_replica_per_shard(
    make_data_server: DataServerFactory,
    http: aiohttp.ClientSession,
    client: HttpClient,
    registry: CollectorRegistry,
) -> None:
    s0, s1a, s1b, s2 = await asyncio.gather(
        make_data_server(shard=0, instance_id="ds-s0"),
        make_data_server(shard=1, replica=0, instance_id="ds-s1a"),
        make_data_server(shard=1, replica=1, instance_id="ds-s1b"),
        make_data_server(shard=2, instance_id="ds-s2"),
    )
    servers = [instance_of(s) for s in (s0, s1a, s1b, s2)]
    fanout = FanOut(client, registry=registry)
    k = 7
    trimmed = 0
    for query in QUERIES:
        answers = [await _direct(http, s, query, k) for s in (s0, s1a, s2)]
        # Replicas hold the same documents, so either one is the shard's answer.
        assert (await _direct(http, s1b, query, k))["hits"] == answers[1]["hits"]
        union = [
            (hit["id"], hit["score"], answer["shard"])
            for answer in answers
            for hit in answer["hits"]
        ]
        trimmed += len(union) > k
        expected = sorted(union, key=lambda hit: (-hit[1], hit[0]))[:k]

        result = await fanout.search(servers, query, k, 5000)

        assert [(hit["id"], hit["score"], hit["shard"]) for hit in result.hits] == expected
        assert all(hit["id"].startswith(f"s{hit['shard']}-") for hit in result.hits)
        assert all("title" in hit for hit in result.hits)  # the data server's fields are kept
        assert result.shards == shard_counts(3, 3)
        assert result.partial is False
    assert trimmed > 0  # the merge really had to choose among more than k hits

    body = json.loads(json.dumps(result.to_dict()))
    assert set(body) == {"hits", "shards", "partial", "took_ms", "coverage"}
    assert all(type(n) is int for n in body["shards"].values())
    assert body["coverage"]["full"] is True
    assert body["coverage"]["percent"] == 100.0
    assert isinstance(body["took_ms"], float)
    assert _sample(registry, "queries_total", outcome="complete") == len(QUERIES)
    assert _sample(registry, "shard_requests_total", result="ok") == 3 * len(QUERIES)
    assert _sample(registry, "shard_requests_total", result="error") == 0
    assert _sample(registry, "in_flight") == 0


async def test_draining_instances_get_no_first_request_and_disabled_ones_none(
    make_data_server: DataServerFactory,
    http: aiohttp.ClientSession,
    client: HttpClient,
    registry: CollectorRegistry,
) -> None:
    server = await make_data_server(shard=0, instance_id="ds-live")
    live = instance_of(server)
    servers = [
        live,
        # Same shard, draining, on a port that refuses: a request to it fails. Only a
        # hedge of last resort may go there (if the live one is ever slower than usual).
        dataclasses.replace(live, id="ds-draining", port=free_port()).with_state("draining"),
        # Shards that only non-routable servers hold are not part of the query at all.
        _stopped("ds-drain-5", shard=5).with_state("draining"),
        dataclasses.replace(_stopped("ds-disabled-6", shard=6), enabled=False),
    ]
    fanout = FanOut(client, registry=registry)

    for query in QUERIES:
        result = await fanout.search(servers, query, 10, 5000)
        assert result.shards == shard_counts(1, 1)
        assert not result.partial

    assert _sample(registry, "shard_requests_total", result="error") == _sample(
        registry, "last_resort_total"
    )
    last_resort = _sample(registry, "last_resort_total")
    assert last_resort <= _sample(registry, "hedges_total", result="sent")
    assert _sample(registry, "retries_total") == 0


async def test_a_draining_replica_takes_a_retry_of_last_resort(
    make_data_server: DataServerFactory,
    http: aiohttp.ClientSession,
    client: HttpClient,
    registry: CollectorRegistry,
) -> None:
    """While one replica of a pair drains, the other failing must not cost the shard:
    the draining one still answers during its grace (compose check's drain: a shard
    timed out on the replica left while its partner drained)."""
    sick_server, leaving = await asyncio.gather(
        make_data_server(shard=0, replica=0, instance_id="ds-sick"),
        make_data_server(shard=0, replica=1, instance_id="ds-leaving"),
    )
    await _set_fault(http, sick_server, mode="error", rate=1.0)
    servers = [instance_of(sick_server), instance_of(leaving).with_state("draining")]
    # Every query needs its retry: a budget for all of them (the shared budget's own
    # limit is tested on its own).
    fanout = FanOut(
        client,
        config=FanOutConfig(eject_after=1000),
        registry=registry,
        retry_budget=RetryBudget(1.0, 10.0),
    )

    for query in QUERIES:
        result = await fanout.search(servers, query, 10, 5000)
        assert result.shards == shard_counts(1, 1)

    # Every query asked the routable replica first, and only then the draining one.
    assert _sample(registry, "shard_requests_total", result="error") == len(QUERIES)
    assert _sample(registry, "retries_total") == len(QUERIES)
    assert _sample(registry, "last_resort_total") == len(QUERIES)


async def test_a_draining_replica_takes_the_first_request_while_the_routable_ones_are_ejected(
    make_data_server: DataServerFactory,
    http: aiohttp.ClientSession,
    client: HttpClient,
    registry: CollectorRegistry,
) -> None:
    """While a shard's partner drains, its one routable replica ejected must not fail
    the shard at once between probes: the draining replica still answers during its
    grace (compose check's drain: shards failed at once for seconds after the replica
    left was ejected in a CPU stall)."""
    sick_server, leaving = await asyncio.gather(
        make_data_server(shard=0, replica=0, instance_id="ds-sick"),
        make_data_server(shard=0, replica=1, instance_id="ds-leaving"),
    )
    await _set_fault(http, sick_server, mode="error", rate=1.0)
    servers = [instance_of(sick_server), instance_of(leaving).with_state("draining")]
    # Ejected after one failure, for longer than the test; no half-open probe meanwhile.
    fanout = FanOut(
        client,
        config=FanOutConfig(
            eject_after=1, eject_cooldown=600, max_ejected_share=1.0, probe_interval=600
        ),
        registry=registry,
    )

    for query in QUERIES:
        result = await fanout.search(servers, query, 10, 5000)
        assert result.shards == shard_counts(1, 1)

    # The first query found the routable replica failing and retried on the draining
    # one; every later one went to the draining one first, the ejected one untouched.
    assert fanout.ejected() == {"ds-sick"}
    assert _sample(registry, "shard_requests_total", result="error") == 1
    assert _sample(registry, "last_resort_total") == len(QUERIES)
    await _set_fault(http, sick_server, mode="none")


async def test_a_draining_replica_is_never_ejected(
    make_data_server: DataServerFactory,
    http: aiohttp.ClientSession,
    client: HttpClient,
    registry: CollectorRegistry,
) -> None:
    """A draining replica that fails a request of last resort (it has exited at the
    end of its grace) is on its way out: ejecting it would only take a place under the
    ejection cap that a routable server may need."""
    sick_server, *others = await asyncio.gather(
        make_data_server(shard=0, replica=0, instance_id="ds-sick"),
        *(make_data_server(shard=shard, instance_id=f"ds-{shard}") for shard in (1, 2)),
    )
    await _set_fault(http, sick_server, mode="error", rate=1.0)
    gone = _stopped("ds-gone", shard=0, replica=1).with_state("draining")
    servers = [instance_of(sick_server), gone, *(instance_of(s) for s in others)]
    # No cap to speak of: only the rule keeps the draining one from being ejected.
    fanout = FanOut(
        client, config=FanOutConfig(eject_after=1, max_ejected_share=1.0), registry=registry
    )

    result = await fanout.search(servers, QUERIES[0], 10, 2000)

    assert result.shards == shard_counts(3, 2, failed=1)
    assert _sample(registry, "last_resort_total") == 1
    assert fanout.ejected() == {"ds-sick"}
    await _set_fault(http, sick_server, mode="none")


async def test_a_draining_replica_takes_a_hedge_of_last_resort(
    make_data_server: DataServerFactory,
    http: aiohttp.ClientSession,
    client: HttpClient,
    registry: CollectorRegistry,
) -> None:
    """The shard's one routable replica turns slow while its partner drains: the hedge
    goes to the draining one, which answers, instead of the shard timing out."""
    staying, leaving = await asyncio.gather(
        make_data_server(shard=0, replica=0, instance_id="ds-staying"),
        make_data_server(shard=0, replica=1, instance_id="ds-leaving"),
    )
    servers = [instance_of(staying), instance_of(leaving).with_state("draining")]
    fanout = FanOut(client, config=FanOutConfig(hedge_ratio=0.5), registry=registry)
    for query in QUERIES * 2:  # 24 answers: the staying one's window knows its p95
        assert not (await fanout.search(servers, query, 10, 2000)).partial
    assert _sample(registry, "shard_requests_total", result="ok") >= len(QUERIES) * 2

    await _set_fault(http, staying, mode="slow", delay_ms=3000)
    # A deadline no load will reach before the hedge's answer, below the 3 s delay.
    result = await fanout.search(servers, QUERIES[0], 10, 2500)

    assert result.shards == shard_counts(1, 1)
    # Complete: answered by the hedge (the slowed replica answers after the deadline).
    assert _sample(registry, "hedges_total", result="won") >= 1
    hedges = _sample(registry, "hedges_total", result="sent")
    assert _sample(registry, "last_resort_total") == hedges
    await _set_fault(http, staying, mode="none")


@pytest.mark.parametrize("failure", ["error", "stopped"])
async def test_a_failing_replica_is_retried_on_a_healthy_one(
    make_data_server: DataServerFactory,
    http: aiohttp.ClientSession,
    client: HttpClient,
    registry: CollectorRegistry,
    failure: str,
) -> None:
    healthy = await make_data_server(shard=0, replica=0, instance_id="ds-healthy")
    if failure == "error":
        sick_server = await make_data_server(shard=0, replica=1, instance_id="ds-sick")
        await _set_fault(http, sick_server, mode="error", rate=1.0)
        sick = instance_of(sick_server)
    else:
        sick = _stopped("ds-sick", shard=0, replica=1)
    servers = [instance_of(healthy), sick]
    # A high ejection threshold keeps the sick replica in play for every query.
    fanout = FanOut(client, config=FanOutConfig(eject_after=1000), registry=registry)

    for query in QUERIES:
        result = await fanout.search(servers, query, 10, 5000)
        assert result.shards == shard_counts(1, 1)
        assert not result.partial
        assert all(hit["shard"] == 0 for hit in result.hits)

    errors = _sample(registry, "shard_requests_total", result="error")
    assert errors >= 1  # the sick replica was chosen first at least once...
    assert _sample(registry, "retries_total") == errors  # ...and each time the other one answered
    assert _sample(registry, "shard_requests_total", result="ok") == len(QUERIES)
    assert _sample(registry, "queries_total", outcome="complete") == len(QUERIES)


async def test_consecutive_failures_eject_until_the_cooldown_ends(
    make_data_server: DataServerFactory,
    http: aiohttp.ClientSession,
    client: HttpClient,
    registry: CollectorRegistry,
) -> None:
    healthy = await make_data_server(shard=0, instance_id="ds-healthy")
    stopped = _stopped("ds-stopped", shard=0, replica=1)
    servers = [instance_of(healthy), stopped]
    clock = FakeClock()
    fanout = FanOut(
        client,
        config=FanOutConfig(eject_after=3, eject_cooldown=10),
        registry=registry,
        clock=clock,
    )

    def errors() -> float:
        return _sample(registry, "shard_requests_total", result="error")

    async def query_until(condition: str, done: Any) -> None:
        for query in QUERIES * 10:
            result = await fanout.search(servers, query, 10, 5000)
            assert not result.partial
            if done():
                return
        raise AssertionError(f"{condition} not reached")

    await query_until("ejection", lambda: fanout.ejected() == {"ds-stopped"})
    assert errors() == 3
    assert _sample(registry, "ejections_total") == 1

    for query in QUERIES:
        await fanout.search(servers, query, 10, 5000)
    assert errors() == 3  # skipped while ejected
    assert fanout.ejected() == {"ds-stopped"}

    clock.advance(10)
    assert fanout.ejected() == set()
    # Tried again after the cool-down; a single failure ejects it again.
    await query_until("a new attempt", lambda: errors() == 4)
    assert fanout.ejected() == {"ds-stopped"}
    assert _sample(registry, "ejections_total") == 2


async def test_a_hung_server_costs_at_most_the_deadline_then_is_ejected(
    make_data_server: DataServerFactory,
    http: aiohttp.ClientSession,
    client: HttpClient,
    registry: CollectorRegistry,
) -> None:
    hung, healthy = await asyncio.gather(
        make_data_server(shard=0, instance_id="ds-hung"),
        make_data_server(shard=1, instance_id="ds-ok"),
    )
    servers = [instance_of(hung), instance_of(healthy)]
    clock = FakeClock()
    fanout = FanOut(
        client,
        config=FanOutConfig(eject_after=3, eject_cooldown=30, stall_grace=SLACK),
        registry=registry,
        clock=clock,
    )
    timeout_ms = 400
    await _set_fault(http, hung, mode="hang")
    try:
        for _ in range(3):
            # The hung replica never answers: the deadline ended each of these.
            result = await fanout.search(servers, QUERIES[0], 10, timeout_ms)
            assert result.partial
            assert result.shards == shard_counts(2, 1, timed_out=1)
            assert all(hit["shard"] == 1 for hit in result.hits)
        assert fanout.ejected() == {"ds-hung"}
        assert _sample(registry, "shard_requests_total", result="timeout") == 3

        # Ejected: its shard has no other replica, so it fails at once, without waiting
        # ("failed", not "timed_out": nothing was sent to it).
        result = await fanout.search(servers, QUERIES[0], 10, timeout_ms)
        assert result.partial
        assert result.shards == shard_counts(2, 1, failed=1)
        assert _sample(registry, "shard_requests_total", result="timeout") == 3

        # After the cool-down it is tried again, and one more timeout re-ejects it.
        clock.advance(30)
        result = await fanout.search(servers, QUERIES[0], 10, timeout_ms)
        assert result.shards == shard_counts(2, 1, timed_out=1)
        assert fanout.ejected() == {"ds-hung"}
        assert _sample(registry, "ejections_total") == 2
        assert _sample(registry, "queries_total", outcome="partial") == 5
        assert _sample(registry, "in_flight") == 0

        # A query cancelled from outside (its client went away) charges the data server
        # nothing: after another cool-down, one charged timeout would re-eject it.
        clock.advance(30)
        healthy_replica = fanout.replica(servers[1])
        assert healthy_replica is not None
        answered = healthy_replica.samples
        query = asyncio.create_task(fanout.search(servers, QUERIES[1], 10, 60_000))
        await eventually(
            lambda: healthy_replica.samples > answered,
            message="the healthy shard answered, the hung one is outstanding",
        )
        query.cancel()
        with pytest.raises(asyncio.CancelledError):
            await query
        assert fanout.ejected() == set()
        assert _sample(registry, "shard_requests_total", result="timeout") == 4
        assert fanout.in_flight == 0
    finally:
        await _set_fault(http, hung, mode="none")


async def _slow_one(
    make_data_server: DataServerFactory,
    http: aiohttp.ClientSession,
    client: HttpClient,
    registry: CollectorRegistry,
    max_in_flight: int,
) -> tuple[DataServer, list[ServiceInstance], FanOut]:
    """One data server answering after a second, and a fan-out over it admitting at most
    ``max_in_flight`` queries: queries stay in flight long enough to be counted."""
    server = await make_data_server(shard=0, instance_id="ds-slow")
    fanout = FanOut(client, config=FanOutConfig(max_in_flight=max_in_flight), registry=registry)
    await _set_fault(http, server, mode="slow", delay_ms=1000)
    return server, [instance_of(server)], fanout


async def test_admission_control_refuses_beyond_max_in_flight(
    make_data_server: DataServerFactory,
    http: aiohttp.ClientSession,
    client: HttpClient,
    registry: CollectorRegistry,
) -> None:
    server, servers, fanout = await _slow_one(make_data_server, http, client, registry, 2)
    running = [
        asyncio.create_task(fanout.search(servers, query, 10, 10_000)) for query in QUERIES[:2]
    ]
    await eventually(lambda: fanout.in_flight == 2, message="two queries in flight")

    refused = fanout.search(servers, QUERIES[2], 10, 10_000)
    with pytest.raises(OverloadedError) as info:
        # Raised on the coroutine's very first step: nothing sent, nothing queued.
        refused.send(None)
    assert isinstance(info.value, DiscoveryError)
    assert not any(task.done() for task in running)
    assert _sample(registry, "queries_total", outcome="overloaded") == 1

    results = await asyncio.gather(*running)
    assert all(not result.partial for result in results)
    assert fanout.in_flight == 0
    await _set_fault(http, server, mode="none")
    assert not (await fanout.search(servers, QUERIES[2], 10, 5000)).partial  # admitted again
    assert _sample(registry, "queries_total", outcome="complete") == 3


async def test_one_query_holds_at_most_its_share_of_the_limit_while_others_ask(
    make_data_server: DataServerFactory,
    http: aiohttp.ClientSession,
    client: HttpClient,
    registry: CollectorRegistry,
) -> None:
    _, servers, fanout = await _slow_one(make_data_server, http, client, registry, 4)
    storm, other = QUERIES[0], QUERIES[1]
    running = [
        asyncio.create_task(fanout.search(servers, storm, 10, 10_000, key=storm)) for _ in range(2)
    ]
    running.append(asyncio.create_task(fanout.search(servers, other, 10, 10_000, key=other)))
    await eventually(lambda: fanout.in_flight == 3, message="three queries in flight")

    # A third of the storm's would fit under the limit, but half of it is its share.
    refused = fanout.search(servers, storm, 10, 10_000, key=storm)
    with pytest.raises(OverloadedError, match="share"):
        refused.send(None)
    assert sample(registry, "search_server_admission_share_refused_total") == 1
    assert _sample(registry, "queries_total", outcome="overloaded") == 1
    # The place it left is another query's.
    running.append(asyncio.create_task(fanout.search(servers, QUERIES[2], 10, 10_000, key="x")))
    await eventually(lambda: fanout.in_flight == 4, message="the free place taken")

    results = await asyncio.gather(*running)
    assert not any(result.partial for result in results)
    assert fanout.in_flight == 0


async def test_an_answer_for_another_shard_is_a_failure(
    make_data_server: DataServerFactory,
    http: aiohttp.ClientSession,
    client: HttpClient,
    registry: CollectorRegistry,
) -> None:
    server = await make_data_server(shard=3, instance_id="ds-shard3")
    real = instance_of(server)
    # A stale registration: shard 0 claimed, but the port now serves shard 3.
    stale = dataclasses.replace(real, payload=dataclasses.replace(real.payload, shard=0))
    fanout = FanOut(client, registry=registry)

    result = await fanout.search([stale], QUERIES[0], 10, 5000)

    assert result.shards == shard_counts(1, 0, failed=1)
    assert result.hits == []
    assert result.partial


async def test_no_servers_and_bad_arguments(
    client: HttpClient, registry: CollectorRegistry
) -> None:
    fanout = FanOut(client, registry=registry)
    result = await fanout.search([], "anything", 10, 100)
    assert result.to_dict()["shards"] == shard_counts(0, 0)
    assert not result.partial
    with pytest.raises(ValueError, match="k must be"):
        await fanout.search([], "anything", 0, 100)
    with pytest.raises(ValueError, match="timeout_ms must be"):
        await fanout.search([], "anything", 10, 0)
    with pytest.raises(ValueError, match="max_in_flight"):
        FanOut(client, config=FanOutConfig(max_in_flight=0))
    with pytest.raises(ValueError, match="eject_after"):
        FanOut(client, config=FanOutConfig(eject_after=0))


async def test_a_shards_last_replica_is_probed_while_ejected(
    make_data_server: DataServerFactory,
    http: aiohttp.ClientSession,
    client: HttpClient,
    registry: CollectorRegistry,
) -> None:
    """A stall of the only usable replica of a shard (its other replica draining, say)
    ejects it; without a probe every query would miss that shard for the whole
    cool-down. One request per probe interval still goes to it: a hung one costs that
    one query its deadline, and the first answer ends the ejection at once."""
    stalled, healthy = await asyncio.gather(
        make_data_server(shard=0, instance_id="ds-stalled"),
        make_data_server(shard=1, instance_id="ds-ok"),
    )
    servers = [
        instance_of(stalled),
        _stopped("ds-draining", shard=0, replica=1).with_state("draining"),
        instance_of(healthy),
    ]
    clock = FakeClock()
    fanout = FanOut(
        client,
        config=FanOutConfig(eject_after=3, eject_cooldown=30, probe_interval=1, stall_grace=SLACK),
        registry=registry,
        clock=clock,
    )
    timeout_ms = 300
    await _set_fault(http, stalled, mode="hang")
    for _ in range(3):
        result = await fanout.search(servers, QUERIES[0], 10, timeout_ms)
        assert result.shards == shard_counts(2, 1, timed_out=1)
    assert fanout.ejected() == {"ds-stalled"}

    # Within the probe interval: the shard fails at once, as before ("failed": not sent).
    result = await fanout.search(servers, QUERIES[0], 10, timeout_ms)
    assert result.shards == shard_counts(2, 1, failed=1)

    # A probe to a replica still hung costs that query its deadline, and only that one.
    clock.advance(1)
    result = await fanout.search(servers, QUERIES[0], 10, timeout_ms)
    assert result.shards == shard_counts(2, 1, timed_out=1)
    result = await fanout.search(servers, QUERIES[0], 10, timeout_ms)
    assert result.shards == shard_counts(2, 1, failed=1)
    assert fanout.ejected() == {"ds-stalled"}

    # The stall is over: the next probe is answered and ends the ejection 28 s early,
    # even when an answer to a request sent before the ejection has already reset the
    # replica's failure count (which alone never ends an ejection).
    await _set_fault(http, stalled, mode="none")
    replica = fanout.replica(servers[0])
    assert replica is not None
    replica.failures = 0
    clock.advance(1)
    # A budget no load exhausts: the released server answers its held requests at once,
    # and a short budget could run out in its queue (a 504, an overload refusal).
    result = await fanout.search(servers, QUERIES[0], 10, 5000)
    assert not result.partial
    assert result.shards == shard_counts(2, 2)
    assert fanout.ejected() == set()
    result = await fanout.search(servers, QUERIES[0], 10, 5000)
    assert not result.partial
    assert _sample(registry, "ejections_total") == 1


async def test_a_query_woken_late_charges_no_replica_with_its_timeouts(
    make_data_server: DataServerFactory,
    http: aiohttp.ClientSession,
    client: HttpClient,
    registry: CollectorRegistry,
) -> None:
    """A search server stalled past a query's deadline cannot tell a late replica from
    its own lateness: the shards still out are reported timed out, and no replica is
    charged (the compose check's drain: the container runtime starved every container
    for 0.1-0.3 s, and a whole fleet's replicas were ejected for it)."""
    hung = await make_data_server(shard=0, instance_id="ds-hung")
    servers = [instance_of(hung)]
    fanout = FanOut(client, config=FanOutConfig(eject_after=1, stall_grace=0.1), registry=registry)
    await _set_fault(http, hung, mode="hang")
    try:
        # The stall itself: this loop blocked from before the deadline to well after it.
        asyncio.get_running_loop().call_later(0.2, time.sleep, 0.5)  # ok-sleep: the stall
        result = await fanout.search(servers, QUERIES[0], 10, 300)

        assert result.shards == shard_counts(1, 0, timed_out=1)
        assert fanout.ejected() == set()
        replica = fanout.replica(servers[0])
        assert replica is not None
        assert replica.failures == 0
        assert _sample(registry, "shard_requests_total", result="timeout") == 1
    finally:
        await _set_fault(http, hung, mode="none")


async def test_no_more_than_the_cap_is_ejected_at_once(
    make_data_server: DataServerFactory,
    http: aiohttp.ClientSession,
    client: HttpClient,
    registry: CollectorRegistry,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Four servers that answered, then fail together, look like trouble on our side:
    # half at most go.
    data = await asyncio.gather(
        *(make_data_server(shard=i, instance_id=f"ds-sick-{i}") for i in range(4))
    )
    servers = [instance_of(s) for s in data]
    fanout = FanOut(
        client, config=FanOutConfig(eject_after=1, max_ejected_share=0.5), registry=registry
    )
    result = await fanout.search(servers, QUERIES[0], 10, 2000)
    assert result.shards == shard_counts(4, 4)
    for server in data:
        await _set_fault(http, server, mode="error", rate=1.0)
    with caplog.at_level(logging.WARNING, logger="search_server.ejection"):
        for _ in range(5):
            result = await fanout.search(servers, QUERIES[0], 10, 2000)
            assert result.shards["total"] == 4
    assert len(fanout.ejected()) == 2
    assert _sample(registry, "ejections_total") == 2
    # Every query refused ejections at the cap; one line says so, not one per refusal.
    refusals = [r for r in caplog.records if "not ejecting more" in r.getMessage()]
    assert len(refusals) == 1
    for server in data:
        await _set_fault(http, server, mode="none")


async def test_servers_that_never_answered_are_ejected_beside_the_cap(
    client: HttpClient, registry: CollectorRegistry
) -> None:
    # Registrations where nothing listens: no capacity the cap could protect. All go,
    # and none takes a place under the cap.
    servers = [_stopped(f"ds-down-{i}", shard=i) for i in range(4)]
    fanout = FanOut(
        client, config=FanOutConfig(eject_after=1, max_ejected_share=0.5), registry=registry
    )
    await fanout.search(servers, QUERIES[0], 10, 2000)
    assert fanout.ejected() == {s.id for s in servers}
    assert _sample(registry, "panic_total", scope="cluster") == 0


async def test_one_server_can_always_be_ejected(
    client: HttpClient, registry: CollectorRegistry
) -> None:
    fanout = FanOut(
        client, config=FanOutConfig(eject_after=1, max_ejected_share=0.1), registry=registry
    )
    await fanout.search([_stopped("ds-alone", shard=0)], QUERIES[0], 10, 2000)
    assert fanout.ejected() == {"ds-alone"}


class _Recording:
    """The fan-out's sub-request client, recording each request it sends: the port,
    the query's parameters and when (the loop's clock)."""

    def __init__(self, client: HttpClient) -> None:
        self._client = client
        self.sent: list[tuple[int, dict[str, list[str]], float]] = []

    def get(
        self, endpoint: Endpoint, target: bytes, max_body: int | None = None
    ) -> asyncio.Future[Response]:
        sent = asyncio.get_running_loop().time()  # first: the nearest to the budget's
        query = parse_qs(urlsplit(target.decode("ascii")).query)
        self.sent.append((endpoint.port, query, sent))
        return self._client.get(endpoint, target, max_body)

    async def aclose(self) -> None:
        await self._client.aclose()


class _Prefer:
    """Picks the replica of the given instance id whenever it is a candidate."""

    def __init__(self, instance_id: str) -> None:
        self._id = instance_id

    def pick(self, candidates: Sequence[Replica]) -> Replica:
        return next((r for r in candidates if r.instance.id == self._id), candidates[0])


async def test_each_attempt_carries_the_budget_left_when_it_is_sent(
    make_data_server: DataServerFactory,
    http: aiohttp.ClientSession,
    client: HttpClient,
    registry: CollectorRegistry,
) -> None:
    late, healthy = await asyncio.gather(
        make_data_server(shard=0, replica=0, instance_id="ds-late"),
        make_data_server(shard=0, replica=1, instance_id="ds-healthy"),
    )
    # Held 1.85 s before it searches: past its budget of 2 s less the 10 % margin, so
    # it answers 504, and the fan-out retries on the other replica with what is left.
    await _set_fault(http, late, mode="slow", delay_ms=1850)
    recording = _Recording(client)
    fanout = FanOut(
        recording,
        config=FanOutConfig(eject_after=1000),
        registry=registry,
        picker=_Prefer("ds-late"),
    )

    result = await fanout.search([instance_of(late), instance_of(healthy)], QUERIES[0], 10, 2000)

    assert result.shards == shard_counts(1, 1)
    assert _sample(registry, "retries_total") == 1
    (first_port, first, first_sent), (retry_port, retry, retry_sent) = recording.sent
    assert (first_port, retry_port) == (late.port, healthy.port)
    assert first["q"] == retry["q"] == [QUERIES[0]]
    assert first["k"] == retry["k"] == ["10"]
    first_budget, retry_budget = int(first["timeout_ms"][0]), int(retry["timeout_ms"][0])
    assert 1990 <= first_budget <= 2000
    # What was left when the retry was sent, rounded down. The recorder stamps a send a
    # little after the fan-out computed its budget, and that lag differs between two
    # sends: by a millisecond or two on a machine loaded by parallel test workers, by 13
    # ms once with the process descheduled between the two (benchmarks running beside
    # the suite). 25 ms of slack, against 1850 ms of waiting, still tells "what was
    # left" from the whole budget or the first request's.
    waited_ms = (retry_sent - first_sent) * 1000
    assert waited_ms >= 1850
    assert first_budget - waited_ms - 25 <= retry_budget <= first_budget - waited_ms + 25
    assert retry_budget < 150


async def test_a_cut_answer_counts_as_answered_but_makes_the_result_partial(
    make_data_server: DataServerFactory,
    http: aiohttp.ClientSession,
    client: HttpClient,
    registry: CollectorRegistry,
) -> None:
    big, small = await asyncio.gather(
        make_data_server(shard=0, instance_id="ds-big", docs=20_000),
        make_data_server(shard=1, instance_id="ds-small"),
    )
    assert big.index is not None
    worst = frequent_terms(big.index, 150)  # about 100 ms of work on the big shard
    await loop_settled(big)  # 20 ms of budget left: this test's own loop work is not a queue
    servers = [instance_of(big), instance_of(small)]
    fanout = FanOut(client, registry=registry)
    # Held 1.78 s of its 2 s budget (1.8 s less the margin): 20 ms are left to search,
    # and the answer, cut, still has 200 ms to arrive.
    await _set_fault(http, big, mode="slow", delay_ms=1780)

    result = await fanout.search(servers, worst, 10, 2000)

    assert result.shards == shard_counts(2, 2, cut=1)
    assert result.partial
    assert len(result.hits) == 10
    assert _sample(registry, "queries_total", outcome="partial") == 1
    # Both shards answered (ok), the cut one too; the small shard, asked for fewer than
    # k, may have filled the top 10 beside the cut answer and been asked again for k (a
    # second round: another answer, ok as well).
    asked_again = _sample(registry, "topk_second_round_shards_total")
    assert _sample(registry, "shard_requests_total", result="ok") == 2 + asked_again
    assert sample(big.registry, "data_server_search_cut_total", answer="hits") == 1

    await _set_fault(http, big, mode="none")
    result = await fanout.search(servers, worst, 10, 5000)
    assert result.shards == shard_counts(2, 2)
    assert not result.partial


async def test_a_replica_turned_slow_is_hedged_even_when_its_partner_has_few_answers(
    make_data_server: DataServerFactory,
    http: aiohttp.ClientSession,
    client: HttpClient,
    registry: CollectorRegistry,
) -> None:
    """Adaptive selection sends most of a shard's requests to its faster replica; the
    other can have too few answers for a latency window. The hedge of a request to the
    busy one then goes by that replica's own p95 (the demo's slow-down phase: no hedge
    at all, a timed-out shard per query until the slowed replica was ejected)."""
    favourite, partner = await asyncio.gather(
        make_data_server(shard=0, replica=0, instance_id="ds-favourite"),
        make_data_server(shard=0, replica=1, instance_id="ds-partner"),
    )
    servers = [instance_of(favourite), instance_of(partner)]
    fanout = FanOut(
        client,
        config=FanOutConfig(hedge_ratio=0.5),
        registry=registry,
        picker=_Prefer("ds-favourite"),
    )
    for query in QUERIES * 2:  # 24 answers: the favourite's window knows its p95
        result = await fanout.search(servers, query, 10, 2000)
        assert not result.partial
    partner_replica = fanout.replica(instance_of(partner))
    assert partner_replica is None or partner_replica.window is None  # never asked

    await _set_fault(http, favourite, mode="slow", delay_ms=3000)
    # A deadline no load will reach before the hedge's answer, below the 3 s delay.
    result = await fanout.search(servers, QUERIES[0], 10, 2500)

    assert result.shards == shard_counts(1, 1)
    # Complete: answered by the hedge (the slowed replica answers after the deadline).
    assert _sample(registry, "hedges_total", result="won") == 1


async def test_a_search_server_that_has_just_started_hedges_by_what_every_answer_took(
    make_data_server: DataServerFactory,
    http: aiohttp.ClientSession,
    client: HttpClient,
    registry: CollectorRegistry,
) -> None:
    """Right after a search server starts, no replica has the 16 answers of a latency
    window, and a data-server process stalling then cost every query its shards (the
    compose check's first queries after "up"). The answers of all shards together tell
    what a sub-request usually takes, and a request out much longer is hedged."""
    favourite, partner, *others = await asyncio.gather(
        make_data_server(shard=0, replica=0, instance_id="ds-favourite"),
        make_data_server(shard=0, replica=1, instance_id="ds-partner"),
        *(make_data_server(shard=shard, instance_id=f"ds-{shard}") for shard in (1, 2, 3)),
    )
    servers = [instance_of(s) for s in (favourite, partner, *others)]
    fanout = FanOut(client, registry=registry, picker=_Prefer("ds-favourite"))
    for query in QUERIES[:8]:  # 8 answers each: no replica has a window yet
        assert not (await fanout.search(servers, query, 10, 2000)).partial
    favourite_replica = fanout.replica(instance_of(favourite))
    assert favourite_replica is not None
    assert favourite_replica.window is not None
    assert favourite_replica.window.p95 is None

    await _set_fault(http, favourite, mode="slow", delay_ms=3000)
    # A deadline no load will reach before the hedge's answer, below the 3 s delay.
    result = await fanout.search(servers, QUERIES[0], 10, 2500)

    assert result.shards == shard_counts(4, 4)
    # Complete: answered by the hedge (the slowed replica answers after the deadline).
    assert _sample(registry, "hedges_total", result="won") == 1


async def test_a_shard_whose_replicas_all_fail_gets_about_one_request_per_query(
    make_data_server: DataServerFactory, client: HttpClient, registry: CollectorRegistry
) -> None:
    """Retries draw on the retry budget: without it every query would try each of the
    failing shard's four replicas in turn (400 requests for 100 queries)."""
    healthy = await make_data_server(shard=0, instance_id="ds-ok")
    failing = [_stopped(f"ds-bad-{j}", shard=1, replica=j) for j in range(4)]
    recording = _Recording(client)
    # The budget's clock stands still: no steady refill, only its start (10) and the
    # share of first requests (10 % of 2 per query).
    budget = RetryBudget(0.1, 10.0, burst=20.0, clock=FakeClock())
    fanout = FanOut(
        recording,
        config=FanOutConfig(eject_after=1000, hedge_ratio=0),
        registry=registry,
        retry_budget=budget,
    )
    servers = [instance_of(healthy), *failing]
    queries = 100
    for n in range(queries):
        result = await fanout.search(servers, QUERIES[n % len(QUERIES)], 10, 2000)
        assert (result.shards["ok"], result.shards["failed"]) == (1, 1)
        assert result.partial
    bad_ports = {server.port for server in failing}
    to_failing = sum(1 for port, _, _ in recording.sent if port in bad_ports)
    assert queries <= to_failing <= queries + 10 + 0.1 * 2 * queries
    assert _sample(registry, "retry_budget_refused_total", kind="retry") >= queries - 30
    assert _sample(registry, "retries_total") == to_failing - queries


async def test_a_shard_is_routed_to_its_subset_and_an_ejected_member_to_the_next_replica(
    make_data_server: DataServerFactory,
    http: aiohttp.ClientSession,
    client: HttpClient,
    registry: CollectorRegistry,
) -> None:
    """Six replicas, subsets of two, search server 2 of 3: its arc is the third of the
    ring holding ds-2 and ds-3 (ids in order). Once ds-2 is ejected, ds-4, the first
    replica after the arc, stands in for it; nothing ever goes to the others."""
    real = await asyncio.gather(
        *(make_data_server(shard=0, replica=j, instance_id=f"ds-{j}") for j in (2, 3, 4))
    )
    others = [_stopped(f"ds-{j}", shard=0, replica=j) for j in (0, 1, 5)]
    servers = [*(instance_of(server) for server in real), *others]
    recording = _Recording(client)
    fanout = FanOut(
        recording,
        config=FanOutConfig(hedge_ratio=0, eject_after=1, warmup_samples=0),
        registry=registry,
        subsetter=DeterministicAperture(2),
        # Even, reproducible picks between the two members.
        picker=PowerOfTwoChoices(random.Random(3)),
    )
    fanout.set_position(Position(1, 3))
    for query in QUERIES:
        assert (await fanout.search(servers, query, 10, 2000)).shards["ok"] == 1
    assert {port for port, _, _ in recording.sent} == {real[0].port, real[1].port}

    await _set_fault(http, real[0], mode="error", rate=1.0)  # one 500 ejects it
    recording.sent.clear()
    for query in QUERIES * 2:
        assert (await fanout.search(servers, query, 10, 2000)).shards["ok"] == 1
    assert fanout.ejected() == {"ds-2"}
    sent = [port for port, _, _ in recording.sent]
    assert set(sent) == {real[0].port, real[1].port, real[2].port}
    assert sent.count(real[0].port) == 1  # the one failed request that ejected it
    assert all(server.port not in sent for server in others)
