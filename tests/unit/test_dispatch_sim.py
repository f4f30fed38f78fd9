"""bench/dispatchsim.py: the simulated data servers the dispatch benchmark sends the real
fan-out's sub-requests to, on virtual time: their network, their one worker taking
searches in turn slice by slice, their admission cap and budgets, a kill and a restart,
and the answers' fields."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import orjson
import pytest

from bench.dispatchsim import ClusterShape, SimCluster, Trace, arrivals, best_of
from bench.simloop import run
from search_server.httpclient import Endpoint, Response, SubrequestError
from search_server.merging import ranked_hits

T = TypeVar("T")

NET = 0.001
#: Search times (seconds) on the one shard, by query.
COSTS = {"short": 0.0005, "long": 0.001, "huge": 0.020}


def _trace() -> Trace:
    queries = list(COSTS)
    return Trace(
        queries=queries,
        arrival_s=[0.1 * (i + 1) for i in range(len(queries))],
        costs=[[COSTS[q]] for q in queries],
        rate=10.0,
    )


def _in_cluster(
    test: Callable[[SimCluster], Awaitable[T]], *, replicas: int = 1, **shape: Any
) -> T:
    """Run ``test`` against one shard of ``replicas`` with no jitter and no overhead."""

    async def main() -> T:
        loop = asyncio.get_running_loop()
        cluster = SimCluster(
            loop,
            _trace(),
            ClusterShape(
                shards=1,
                replicas=replicas,
                docs=100,
                overhead_s=0.0,
                net_s=NET,
                jitter_s=0.0,
                **shape,
            ),
            rng=random.Random(0),
        )
        return await test(cluster)

    return run(main())


def _get(
    cluster: SimCluster, query: str, *, replica: int = 0, k: int = 3, timeout_ms: int = 100
) -> asyncio.Future[Response]:
    instance = cluster.server(0, replica).instance
    target = f"/search?q={query}&k={k}&timeout_ms={timeout_ms}".encode()
    return cluster.get(Endpoint.of(instance.address, instance.port), target)


async def _answer(future: asyncio.Future[Response]) -> tuple[float, int, dict[str, Any]]:
    status, body = await future
    return asyncio.get_running_loop().time(), status, orjson.loads(body)


def test_an_answer_takes_the_network_both_ways_and_the_search() -> None:
    async def test(cluster: SimCluster) -> tuple[float, int, dict[str, Any]]:
        return await _answer(_get(cluster, "long", k=4))

    at, status, body = _in_cluster(test)
    assert status == 200
    assert at == pytest.approx(NET + COSTS["long"] + NET)
    assert body["took_ms"] == pytest.approx(1.0)
    assert (body["shard"], body["queue"], body["cut"]) == (0, 0, False)
    # A data server's answer as the fan-out validates it, with k hits.
    assert len(ranked_hits(body, 0, 4)) == 4
    assert {"utilization", "qps", "eps"} <= body.keys()


def test_searches_take_turns_slice_by_slice() -> None:
    # Sent first, the long search (two slices) yields after its first: the short one
    # (one slice), queued behind it, ends first.
    async def test(cluster: SimCluster) -> list[tuple[str, float]]:
        loop = asyncio.get_running_loop()
        ends: list[tuple[str, float]] = []
        sent = {"long": _get(cluster, "long"), "short": _get(cluster, "short")}
        for name, future in sent.items():
            future.add_done_callback(lambda _, name=name: ends.append((name, loop.time())))
        await asyncio.gather(*sent.values())
        return ends

    ends = _in_cluster(test, slice_s=0.0005)
    assert [name for name, _ in ends] == ["short", "long"]
    assert ends[0][1] == pytest.approx(NET + 0.0010 + NET)
    assert ends[1][1] == pytest.approx(NET + 0.0015 + NET)


def test_a_slowed_replica_takes_its_multiple_of_the_work() -> None:
    async def test(cluster: SimCluster) -> list[float]:
        fast = await _answer(_get(cluster, "long", replica=1))
        cluster.slow(0, 0, 10.0)
        slow = await _answer(_get(cluster, "long", replica=0))
        return [fast[2]["took_ms"], slow[2]["took_ms"]]

    assert _in_cluster(test, replicas=2) == pytest.approx([1.0, 10.0])


def test_a_full_replica_refuses_at_once_with_429() -> None:
    async def test(cluster: SimCluster) -> list[int]:
        first, second = _get(cluster, "huge"), _get(cluster, "huge")
        return [(await _answer(second))[1], (await _answer(first))[1]]

    assert _in_cluster(test, max_searches=1) == [429, 200]


def test_a_search_stops_at_its_budget_and_answers_cut() -> None:
    # 10 ms asked: the data server keeps 5 ms of it for its answer (work_deadline).
    async def test(cluster: SimCluster) -> tuple[float, int, dict[str, Any]]:
        return await _answer(_get(cluster, "huge", timeout_ms=10))

    at, status, body = _in_cluster(test, slice_s=0.0005)
    assert status == 200
    assert body["cut"] is True
    # It checks its deadline after each slice: it stops within one past it.
    assert 5.0 <= body["took_ms"] <= 5.5
    assert at == pytest.approx(NET + body["took_ms"] / 1000 + NET)


def test_answers_cut_while_slowed_are_counted_apart() -> None:
    async def test(cluster: SimCluster) -> list[tuple[int, int]]:
        server = cluster.server(0, 0)
        await _answer(_get(cluster, "huge", timeout_ms=10))
        counts = [(server.cut, server.faulty_cut)]
        cluster.slow(0, 0, 10.0)
        await _answer(_get(cluster, "huge", timeout_ms=10))
        counts.append((server.cut, server.faulty_cut))
        return counts

    assert _in_cluster(test) == [(1, 0), (2, 1)]


def test_a_killed_replica_fails_what_it_had_and_refuses_until_it_restarts() -> None:
    async def test(cluster: SimCluster) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        old = cluster.server(0, 0).instance
        in_progress = _get(cluster, "huge")
        await asyncio.sleep(NET + 0.002)  # ok-sleep: virtual time (simloop)
        cluster.kill(0, 0)
        with pytest.raises(SubrequestError, match="closed the connection"):
            await in_progress
        sent = loop.time()
        with pytest.raises(SubrequestError, match="refused"):
            await _get(cluster, "short")
        refused_after = loop.time() - sent
        await asyncio.sleep(1.0)  # ok-sleep: virtual time (simloop)
        cluster.restart(0, 0)
        new = cluster.server(0, 0).instance
        _, status, _ = await _answer(_get(cluster, "short"))
        return {
            "refused_after": refused_after,
            "status": status,
            "same_server": (new.id, new.address, new.port) == (old.id, old.address, old.port),
            "registered_later": new.registration_time_utc > old.registration_time_utc,
            "live": cluster.live,
            "new": new,
        }

    seen = _in_cluster(test)
    assert seen["refused_after"] == pytest.approx(2 * NET)  # a connect's round trip
    assert seen["status"] == 200
    assert seen["same_server"]
    assert seen["registered_later"]
    assert seen["live"] == (seen["new"],)


def test_the_reported_load_is_the_replicas_own_history() -> None:
    # Two searches of 20 ms back to back, the second asked once the first answered: at
    # the second's answer its last second held 40 ms of searching, two answers and no
    # error.
    async def test(cluster: SimCluster) -> dict[str, Any]:
        await asyncio.sleep(2.0)  # ok-sleep: virtual time; older than the one-second window
        await _answer(_get(cluster, "huge"))
        return (await _answer(_get(cluster, "huge")))[2]

    body = _in_cluster(test)
    assert body["utilization"] == pytest.approx(0.040, abs=0.001)
    assert (body["qps"], body["eps"]) == (2.0, 0.0)


def test_arrivals_replay_the_trace_then_cycle_with_fresh_ones() -> None:
    trace = _trace()
    first = list(arrivals(trace, 7, rate=20.0, seed=3, replay=True))
    # The trace's own times, at twice its rate, then its queries again in order.
    assert [t for t, _ in first[:3]] == pytest.approx([0.05, 0.10, 0.15])
    assert [i for _, i in first] == [0, 1, 2, 0, 1, 2, 0]
    assert all(a[0] < b[0] for a, b in itertools.pairwise(first))
    assert first == list(arrivals(trace, 7, rate=20.0, seed=3, replay=True))
    assert first[3:] != list(arrivals(trace, 7, rate=20.0, seed=4, replay=True))[3:]


def test_the_best_of_recordings_keeps_each_searchs_least_time() -> None:
    meta = {"docs_per_shard": 100, "queries": 2, "k": 10, "seed": 0, "repeats": 3}
    one = Trace(["a", "b"], [1.0, 2.0], [[1.0, 9.0], [4.0, 2.0]], rate=1.0, meta=meta)
    two = Trace(["a", "b"], [1.0, 2.0], [[3.0, 1.0], [2.0, 5.0]], rate=1.0, meta=meta)
    # Stated at the rate that makes the busiest shard's mean one second's work.
    best = best_of([one, two], rate=lambda means: 1.0 / max(means))
    assert best.costs == [[1.0, 1.0], [2.0, 2.0]]
    assert best.rate == pytest.approx(2 / 3)
    # The same arrivals once replayed at any rate: scaled with the stated rate.
    assert list(arrivals(best, 2, 1.0, 0, replay=True)) == list(
        arrivals(one, 2, 1.0, 0, replay=True)
    )
    assert best.meta["repeats"] == 6
    assert best.meta["recordings_shard_mean_ms"] == [[2500.0, 5500.0], [2500.0, 3000.0]]
    with pytest.raises(ValueError, match="same queries"):
        best_of([one, Trace(["a", "c"], [1.0, 2.0], one.costs, 1.0, meta)], rate=max)
    with pytest.raises(ValueError, match="different k"):
        best_of([one, Trace(["a", "b"], [1.0, 2.0], one.costs, 1.0, {**meta, "k": 5})], rate=max)
