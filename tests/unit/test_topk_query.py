"""A query asks each shard for its own number of hits (k' <= k), refuses an answer of
more, still merges the top k, and counts a query whose merge may be inexact when, and
only when, a shard returned all it was asked for and all of it made the top k.

The client here (:class:`_Shards`) answers at once as a data server would: the best
``k`` of its port's documents, ``k`` read from the request; it records each request's
target and body cap.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson
import pytest
from prometheus_client import CollectorRegistry

from discovery.errors import ConfigError
from discovery.instance import ServiceInstance
from search_server.config import SearchServerConfig, build_parser
from search_server.fanout import FanOut, FanOutConfig
from search_server.httpclient import Endpoint, Response, SubrequestError
from search_server.merging import answer_bytes
from search_server.picking import Replica
from search_server.topk import hits_asked
from tests.support import FakeClock, make_instance, sample, shard_counts

PORT = 22_000

#: Each port's documents, (id, score) best first, or the exception its requests fail with.
Documents = dict[int, list[tuple[str, float]] | Exception]


class _Shards:
    """Answers each port with the best ``k`` of ``documents[port]`` ((id, score), best
    first), ``extra`` more hits than asked for the ports in ``extra``, or fails with
    the exception given for a port. ``sent`` keeps (port, k asked, max_body)."""

    def __init__(
        self,
        documents: Documents,
        shard_of: dict[int, int],
        *,
        extra: dict[int, int] | None = None,
    ) -> None:
        self.documents = documents
        self.shard_of = shard_of
        self.extra = extra or {}
        self.sent: list[tuple[int, int, int | None]] = []

    def get(
        self, endpoint: Endpoint, target: bytes, max_body: int | None = None
    ) -> asyncio.Future[Response]:
        port = endpoint.port
        k = int(parse_qs(urlsplit(target.decode()).query)["k"][0])
        self.sent.append((port, k, max_body))
        future: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        documents = self.documents[port]
        if isinstance(documents, Exception):
            future.set_exception(documents)
            return future
        best = documents[: k + self.extra.get(port, 0)]
        body = {
            "hits": [{"id": doc_id, "score": score} for doc_id, score in best],
            "shard": self.shard_of[port],
            "took_ms": 0.1,
        }
        future.set_result((200, orjson.dumps(body)))
        return future

    async def aclose(self) -> None:
        pass


class _First:
    """Picks the replica of the given port whenever it is a candidate."""

    def __init__(self, port: int) -> None:
        self._port = port

    def pick(self, candidates: Sequence[Replica]) -> Replica:
        return next((r for r in candidates if r.instance.port == self._port), candidates[0])


def _fanout(client: _Shards, registry: CollectorRegistry, **config: Any) -> FanOut:
    config.setdefault("hedge_ratio", 0)
    return FanOut(
        client,
        config=FanOutConfig(eject_after=1, **config),
        registry=registry,
        clock=FakeClock(),
        picker=_First(PORT),
    )


def _servers(docs: list[int]) -> list[ServiceInstance]:
    return [
        make_instance(f"ds-{shard}", PORT + shard, shard=shard, docs=count)
        for shard, count in enumerate(docs)
    ]


def _ranked(shard: int, scores: list[float]) -> list[tuple[str, float]]:
    return [(f"s{shard}-{i}", score) for i, score in enumerate(scores)]


def _interleaved(shards: int, per_shard: int) -> Documents:
    """Each shard's documents, their scores interleaved over the shards (shard s holds
    the ranks s, s + shards, ...): the top k is spread evenly."""
    return {
        PORT + s: _ranked(s, [1000.0 - (i * shards + s) for i in range(per_shard)])
        for s in range(shards)
    }


def _inexact(registry: CollectorRegistry) -> float:
    return sample(registry, "search_server_fanout_topk_maybe_inexact_total")


async def test_each_shard_is_asked_for_its_share_and_its_answer_capped_by_it(
    registry: CollectorRegistry,
) -> None:
    docs = [1000, 1000, 2000, 4000]
    k = 10
    asked = hits_asked(k, docs, 0.9999)
    assert min(asked) < k  # fewer than k somewhere, or this test tells nothing
    client = _Shards(_interleaved(4, 20), {PORT + s: s for s in range(4)})
    fanout = _fanout(client, registry)

    result = await fanout.search(_servers(docs), "a", k, 5000)

    assert sorted(client.sent) == [(PORT + s, asked[s], answer_bytes(asked[s])) for s in range(4)]
    # The merge still returns the top k (the documents are interleaved: it is exact).
    assert [hit["id"] for hit in result.hits] == [f"s{i % 4}-{i // 4}" for i in range(k)]
    assert sample(registry, "search_server_fanout_topk_hits_asked_total") == sum(asked)
    assert sample(registry, "search_server_fanout_topk_hits_k_total") == 4 * k

    client.sent.clear()
    await fanout.search(_servers(docs), "a", k, 5000, topk_probability=1.0)
    assert sorted(client.sent) == [(PORT + s, k, answer_bytes(k)) for s in range(4)]
    assert sample(registry, "search_server_fanout_topk_hits_asked_total") == sum(asked) + 4 * k


async def test_a_retry_asks_for_what_its_shard_was_asked_for(registry: CollectorRegistry) -> None:
    servers = [*_servers([1000] * 4), make_instance("ds-0b", PORT + 9, shard=0, replica=1)]
    documents: Documents = {
        **_interleaved(4, 20),
        PORT: SubrequestError("connection refused"),
        PORT + 9: _ranked(0, [1000.0 - 4 * i for i in range(20)]),
    }
    client = _Shards(documents, {PORT + s: s for s in range(4)} | {PORT + 9: 0})
    fanout = _fanout(client, registry)
    result = await fanout.search(servers, "a", 20, 5000)
    assert result.shards == shard_counts(4, 4)
    (expected,) = set(hits_asked(20, [1000] * 4, 0.9999))
    shard_0 = [k for port, k, _ in client.sent if port in (PORT, PORT + 9)]
    assert shard_0 == [expected, expected]
    assert expected < 20


async def test_more_hits_than_the_shard_was_asked_for_is_refused_though_fewer_than_k(
    registry: CollectorRegistry,
) -> None:
    k = 20
    (asked,) = set(hits_asked(k, [1000] * 4, 0.9999))
    assert asked + 1 < k
    hostile, good = PORT, PORT + 9
    servers = [*_servers([1000] * 4), make_instance("ds-0b", good, shard=0, replica=1)]
    documents: Documents = {
        **_interleaved(4, 20),
        hostile: _ranked(0, [5000.0] * 20),
        good: _ranked(0, [1000.0 - 4 * i for i in range(20)]),
    }
    client = _Shards(documents, {PORT + s: s for s in range(4)} | {good: 0}, extra={hostile: 1})
    fanout = _fanout(client, registry)

    result = await fanout.search(servers, "a", k, 5000)

    assert result.shards == shard_counts(4, 4)
    # None of the hostile replica's hits (better scores, one more than asked) is merged.
    assert all(hit["score"] < 5000.0 for hit in result.hits)
    assert len(result.hits) == k
    assert fanout.ejected() == {"ds-0"}
    assert sample(registry, "search_server_fanout_bad_answers_total", why="too_many_hits") == 1


async def test_a_shard_that_fills_the_top_k_with_all_it_was_asked_for_is_counted(
    registry: CollectorRegistry,
) -> None:
    k = 20
    (asked,) = set(hits_asked(k, [1000] * 4, 0.9999))
    documents = _interleaved(4, 30)
    # Shard 0 holds the best 30 documents: asked for fewer than k, it cannot give them all.
    documents[PORT] = _ranked(0, [5000.0 - i for i in range(30)])
    client = _Shards(documents, {PORT + s: s for s in range(4)})
    # Without the second round (tests/unit/test_topk_second_round.py), which would ask
    # shard 0 again for k.
    fanout = _fanout(client, registry, topk_second_round=False)

    result = await fanout.search(_servers([1000] * 4), "a", k, 5000)

    in_top = [hit["id"] for hit in result.hits if hit["shard"] == 0]
    assert in_top == [f"s0-{i}" for i in range(asked)]  # the merge missed s0-{asked}..
    assert _inexact(registry) == 1

    # Asked for k (the query opts out), the same shard fills the top k: exact, not counted.
    result = await fanout.search(_servers([1000] * 4), "a", k, 5000, topk_probability=1.0)
    assert [hit["id"] for hit in result.hits] == [f"s0-{i}" for i in range(k)]
    assert _inexact(registry) == 1


async def test_spread_answers_or_a_shard_that_had_no_more_are_not_counted(
    registry: CollectorRegistry,
) -> None:
    k = 20
    (asked,) = set(hits_asked(k, [1000] * 4, 0.9999))
    client = _Shards(_interleaved(4, 30), {PORT + s: s for s in range(4)})
    fanout = _fanout(client, registry)
    # Spread evenly: each shard's asked-for last hit ranks below the top k.
    result = await fanout.search(_servers([1000] * 4), "a", k, 5000)
    assert len(result.hits) == k
    assert _inexact(registry) == 0

    # Shard 0 holds the best documents but only 3 of them: it returned fewer than it
    # was asked for, so it had no more to give.
    client.documents[PORT] = _ranked(0, [5000.0, 4999.0, 4998.0])
    result = await fanout.search(_servers([1000] * 4), "a", k, 5000)
    assert [hit["id"] for hit in result.hits[:3]] == ["s0-0", "s0-1", "s0-2"]
    assert _inexact(registry) == 0
    assert asked > 3


@pytest.mark.parametrize("probability", [0.0, -0.5, 1.5, float("nan")])
async def test_a_topk_probability_out_of_range_is_refused(
    probability: float, registry: CollectorRegistry
) -> None:
    fanout = _fanout(_Shards({}, {}), registry)
    with pytest.raises(ValueError, match="topk_probability"):
        await fanout.search(_servers([1000]), "a", 10, 5000, topk_probability=probability)
    with pytest.raises(ValueError, match="topk_probability"):
        FanOutConfig(topk_probability=probability)


# -- configuration ----------------------------------------------------------------------


def _parse(argv: list[str]) -> SearchServerConfig:
    return SearchServerConfig.from_args(build_parser().parse_args(argv))


def test_the_flag_its_variable_and_default(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("DISCOVERY_TOPK_PROBABILITY", raising=False)
    assert _parse([]).topk_probability == 0.9999 == FanOutConfig().topk_probability
    assert _parse(["--topk-probability", "0.99"]).topk_probability == 0.99
    assert _parse(["--topk-probability", "1"]).topk_probability == 1.0
    monkeypatch.setenv("DISCOVERY_TOPK_PROBABILITY", "0.9")
    assert _parse([]).topk_probability == 0.9
    monkeypatch.delenv("DISCOVERY_TOPK_PROBABILITY")
    for bad in ("0", "-0.5", "1.01", "nan", "often"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["--topk-probability", bad])
        assert "argument --topk-probability:" in capsys.readouterr().err
    assert "DISCOVERY_TOPK_PROBABILITY" in build_parser().format_help()
    with pytest.raises(ConfigError, match=r"^--topk-probability must be > 0 and <= 1, got 0"):
        dataclasses.replace(_parse([]), topk_probability=0.0)
