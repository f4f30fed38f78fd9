"""An answer is bounded by what was asked: at most ``k`` hits, scores in range, a body
no larger than ``k`` hits may weigh. Anything else is a bad answer of its replica.

The client here (:class:`_Answering`) answers each port with a scripted body at once
and records the body cap each request was sent with.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry

from discovery.instance import ServiceInstance
from search_server.fanout import FanOut, FanOutConfig
from search_server.httpclient import AnswerTooLarge, Endpoint, Response
from search_server.merging import answer_bytes
from search_server.picking import Replica
from tests.support import FakeClock, make_instance, sample, shard_counts

HOSTILE, GOOD = 21_000, 21_001


def _hits(port: int, count: int, score: float = 1.0) -> list[dict[str, Any]]:
    return [{"id": f"d{port}-{i}", "score": score} for i in range(count)]


class _Answering:
    """Answers each port with ``bodies[port]`` (the hits of a shard-0 answer, or an
    exception to fail with), at once; ``caps`` keeps each request's ``max_body``."""

    def __init__(self, bodies: dict[int, list[dict[str, Any]] | Exception]) -> None:
        self.bodies = bodies
        self.caps: list[tuple[int, int | None]] = []

    def get(
        self, endpoint: Endpoint, target: bytes, max_body: int | None = None
    ) -> asyncio.Future[Response]:
        self.caps.append((endpoint.port, max_body))
        future: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        body = self.bodies[endpoint.port]
        if isinstance(body, Exception):
            future.set_exception(body)
        else:
            future.set_result((200, orjson.dumps({"hits": body, "shard": 0, "took_ms": 0.1})))
        return future

    async def aclose(self) -> None:
        pass


class _First:
    """Picks the replica of the given port whenever it is a candidate."""

    def __init__(self, port: int) -> None:
        self._port = port

    def pick(self, candidates: list[Replica]) -> Replica:
        return next((r for r in candidates if r.instance.port == self._port), candidates[0])


def _fanout(client: _Answering, registry: CollectorRegistry) -> FanOut:
    return FanOut(
        client,
        config=FanOutConfig(eject_after=1, hedge_ratio=0),
        registry=registry,
        clock=FakeClock(),
        picker=_First(HOSTILE),
    )


def _pair() -> list[ServiceInstance]:
    return [
        make_instance("ds-hostile", HOSTILE, shard=0, replica=0),
        make_instance("ds-good", GOOD, shard=0, replica=1),
    ]


async def test_k_plus_one_hits_are_charged_to_the_replica_and_not_merged(
    registry: CollectorRegistry,
) -> None:
    k = 3
    client = _Answering({HOSTILE: _hits(HOSTILE, k + 1, score=9.0), GOOD: _hits(GOOD, k)})
    fanout = _fanout(client, registry)
    result = await fanout.search(_pair(), "a", k, 5000)
    # The shard is answered by the good replica, after a retry; none of the hostile
    # replica's hits (better scores, one too many) is merged.
    assert result.shards == shard_counts(1, 1)
    assert [hit["id"] for hit in result.hits] == [f"d{GOOD}-{i}" for i in range(k)]
    assert [port for port, _ in client.caps] == [HOSTILE, GOOD]
    assert fanout.ejected() == {"ds-hostile"}
    assert sample(registry, "search_server_fanout_shard_requests_total", result="error") == 1
    assert sample(registry, "search_server_fanout_bad_answers_total", why="too_many_hits") == 1


async def test_a_shard_whose_only_replica_answers_too_many_hits_fails_with_error(
    registry: CollectorRegistry,
) -> None:
    client = _Answering({HOSTILE: _hits(HOSTILE, 11)})
    fanout = _fanout(client, registry)
    result = await fanout.search([_pair()[0]], "a", 10, 5000)
    assert result.shards == shard_counts(1, 0, failed=1)
    assert result.hits == []
    assert result.coverage is not None
    assert result.coverage.degraded == ("error",)
    assert sample(registry, "search_server_fanout_degraded_total", reason="error") == 1


@pytest.mark.parametrize("score", [1e308, -1e308, 1.5e9])
async def test_a_score_out_of_range_is_a_bad_answer_of_its_replica(
    score: float, registry: CollectorRegistry
) -> None:
    client = _Answering({HOSTILE: _hits(HOSTILE, 1, score=score), GOOD: _hits(GOOD, 1)})
    fanout = _fanout(client, registry)
    result = await fanout.search(_pair(), "a", 10, 5000)
    assert [hit["id"] for hit in result.hits] == [f"d{GOOD}-0"]
    assert fanout.ejected() == {"ds-hostile"}
    assert sample(registry, "search_server_fanout_bad_answers_total", why="score") == 1


async def test_exactly_k_hits_merge(registry: CollectorRegistry) -> None:
    k = 4
    client = _Answering({HOSTILE: _hits(HOSTILE, k), GOOD: _hits(GOOD, k)})
    fanout = _fanout(client, registry)
    result = await fanout.search(_pair(), "a", k, 5000)
    assert result.shards == shard_counts(1, 1)
    assert len(result.hits) == k
    assert [port for port, _ in client.caps] == [HOSTILE]
    assert fanout.ejected() == set()
    assert (
        sum(
            sample(registry, "search_server_fanout_bad_answers_total", why=why)
            for why in ("status", "malformed", "too_many_hits", "score", "too_large")
        )
        == 0
    )


async def test_each_sub_request_is_capped_by_what_k_hits_may_weigh(
    registry: CollectorRegistry,
) -> None:
    client = _Answering({HOSTILE: _hits(HOSTILE, 1), GOOD: _hits(GOOD, 1)})
    fanout = _fanout(client, registry)
    for k in (1, 3, 1000):
        await fanout.search(_pair(), "a", k, 5000)
    # The client clamps the cap to its own (--max-answer-bytes): 1000 hits' allowance
    # is above the default 8 MiB.
    assert [cap for _, cap in client.caps] == [answer_bytes(1), answer_bytes(3), answer_bytes(1000)]


async def test_a_body_over_its_cap_is_a_bad_answer_of_its_replica(
    registry: CollectorRegistry,
) -> None:
    too_large = AnswerTooLarge(f"127.0.0.1:{HOSTILE} sent a body over {answer_bytes(10)} bytes")
    client = _Answering({HOSTILE: too_large, GOOD: _hits(GOOD, 1)})
    fanout = _fanout(client, registry)
    result = await fanout.search(_pair(), "a", 10, 5000)
    assert [hit["id"] for hit in result.hits] == [f"d{GOOD}-0"]
    assert fanout.ejected() == {"ds-hostile"}
    assert sample(registry, "search_server_fanout_bad_answers_total", why="too_large") == 1
