"""One data server's bad answer or unusable registration costs that sub-request, never
the query, the other replicas or the routing table.

The hostile "data servers" here are real HTTP peers on loopback (``asyncio`` servers
answering crafted bodies); the good ones are real in-process data servers.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Sequence

import pytest
from prometheus_client import CollectorRegistry

from data_server.corpus import sample_queries
from discovery.address import NetworkPolicy, parse_networks
from discovery.instance import ServiceInstance
from search_server import picking
from search_server.fanout import FanOut, FanOutConfig
from search_server.httpclient import DEFAULT_MAX_BODY, HttpClient
from search_server.merging import MAX_HIT_FIELDS, MAX_HIT_TEXT, answer_bytes
from search_server.picking import Replica
from search_server.routing import RoutingTable
from tests.support import (
    DataServerFactory,
    FakeClock,
    instance_of,
    make_instance,
    sample,
    shard_counts,
)

QUERY = sample_queries(1, variant=3)[0]


@pytest.fixture
async def answering() -> AsyncIterator[Callable[[bytes], asyncio.Future[int]]]:
    """Start loopback servers that answer every request with the given JSON body."""
    servers: list[asyncio.Server] = []

    async def start(body: bytes) -> int:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while await reader.readuntil(b"\r\n\r\n"):
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                        + f"Content-Length: {len(body)}\r\n\r\n".encode()
                        + body
                    )
                    await writer.drain()
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        servers.append(server)
        return int(server.sockets[0].getsockname()[1])

    def launch(body: bytes) -> asyncio.Future[int]:
        return asyncio.ensure_future(start(body))

    yield launch
    for server in servers:
        server.close()
        await server.wait_closed()


def _answer(*hits: object) -> bytes:
    # "shard" last, so that the test can answer for another shard by replacing it.
    return json.dumps({"hits": list(hits), "took_ms": 1.0, "shard": 0}).encode()


NESTED = {"id": "d1", "score": 1.0, "title": "t"}
for _ in range(900):  # deep enough that json.dumps of the merged answer recursed out
    NESTED = {"id": "d1", "score": 1.0, "x": NESTED}

HOSTILE_ANSWERS = {
    "nested-hit": _answer(NESTED),
    "list-field": _answer({"id": "d1", "score": 1.0, "tags": [1, 2, 3]}),
    "huge-field": _answer({"id": "d1", "score": 1.0, "title": "x" * (MAX_HIT_TEXT + 1)}),
    "many-fields": _answer(
        {"id": "d1", "score": 1.0, **{f"f{i}": i for i in range(MAX_HIT_FIELDS + 1)}}
    ),
    "huge-id": _answer({"id": "d" * 5000, "score": 1.0}),
    "long-field-name": _answer({"id": "d1", "score": 1.0, "n" * 100: 1}),
    "hit-not-object": _answer("d1"),
    # Asked for 10 at most (a shard's k' <= k): an eleventh hit is no answer to the request.
    "too-many-hits": _answer(*({"id": f"d{i}", "score": 1.0} for i in range(11))),
    "score-1e308": _answer({"id": "d1", "score": 1e308}),
    # One document twice, same score, other fields: the merge compared the hit objects
    # (TypeError) and the whole query failed.
    "duplicate-id": _answer(
        {"id": "d1", "score": 1.0, "title": "a"}, {"id": "d1", "score": 1.0, "title": "b"}
    ),
}


@pytest.mark.parametrize("body", HOSTILE_ANSWERS.values(), ids=HOSTILE_ANSWERS.keys())
async def test_a_hostile_answer_fails_its_sub_request_and_the_query_still_encodes(
    body: bytes,
    answering: Callable[[bytes], asyncio.Future[int]],
    make_data_server: DataServerFactory,
    registry: CollectorRegistry,
) -> None:
    hostile_port = await answering(body)
    good = await make_data_server(shard=0, replica=1, instance_id="ds-good")
    lone = await answering(body.replace(b'"shard": 0', b'"shard": 1'))
    servers = [
        make_instance("ds-hostile", hostile_port, shard=0),
        instance_of(good),
        # A shard whose only replica is hostile: it fails, the answer stays encodable.
        make_instance("ds-lone", lone, shard=1),
    ]
    async with HttpClient() as client:
        fanout = FanOut(client, config=FanOutConfig(hedge_ratio=0), registry=registry)
        for _ in range(4):
            result = await fanout.search(servers, QUERY, 10, 5000)
            # Shard 0 answered by its good replica (after a retry if the hostile one
            # was asked first); shard 1 failed.
            assert result.shards == shard_counts(2, 1, failed=1)
            assert all(hit["shard"] == 0 for hit in result.hits)
            # None of the hostile replica's hits: only the good data server's documents.
            assert all(hit["id"].startswith("s0-") for hit in result.hits)
            json.dumps(result.to_dict())  # what the search server answers with
    assert sample(registry, "search_server_fanout_shard_requests_total", result="error") >= 4


def test_one_replica_that_cannot_be_made_leaves_the_routing_table_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = picking.Endpoint.of

    def endpoint(host: str, port: int) -> picking.Endpoint:
        if port == 6666:
            raise UnicodeError("label too long")  # any failure, not only OSError
        return real(host, port)

    monkeypatch.setattr(picking.Endpoint, "of", staticmethod(endpoint))
    skipped: list[tuple[str, str]] = []
    table = RoutingTable(FakeClock(), on_skip=lambda i, why: skipped.append((i.id, why)))
    servers = {
        "ds-a": make_instance("ds-a", 9001, shard=0),
        "ds-bad": make_instance("ds-bad", 6666, shard=0),
        "ds-b": make_instance("ds-b", 9002, shard=1),
    }
    table.load(servers)
    assert [(shard, [r.instance.id for r in group]) for shard, group in table.table] == [
        (0, ["ds-a"]),
        (1, ["ds-b"]),
    ]
    assert skipped == [("ds-bad", "cannot route to it: UnicodeError: label too long")]


async def test_allowed_networks_keep_other_addresses_out_of_the_fan_out(
    make_data_server: DataServerFactory, registry: CollectorRegistry
) -> None:
    inside = await make_data_server(shard=0, instance_id="ds-inside")
    outside: ServiceInstance = make_instance("ds-outside", 9, shard=1, address="192.0.2.1")
    async with HttpClient() as client:
        fanout = FanOut(
            client,
            config=FanOutConfig(networks=NetworkPolicy.of(parse_networks("127.0.0.0/8"))),
            registry=registry,
        )
        result = await fanout.search([instance_of(inside), outside], QUERY, 10, 2000)
    # Never sent to 192.0.2.1: its shard is not in the table at all.
    assert result.shards == shard_counts(1, 1)
    assert sample(registry, "search_server_fanout_unroutable_total", why="not_allowed") == 1


class _Prefer:
    """Picks the replica of the given instance id whenever it is a candidate."""

    def __init__(self, instance_id: str) -> None:
        self._id = instance_id

    def pick(self, candidates: Sequence[Replica]) -> Replica:
        return next((r for r in candidates if r.instance.id == self._id), candidates[0])


async def test_a_huge_valid_answer_is_refused_unparsed_and_its_replica_ejected(
    answering: Callable[[bytes], asyncio.Future[int]],
    make_data_server: DataServerFactory,
    registry: CollectorRegistry,
) -> None:
    # What a hostile replica measured: hundreds of thousands of well-formed hits, just
    # under the 8 MiB any body may have, to every sub-request.
    hits = ",".join(f'{{"id":"d{i}","score":1.0}}' for i in range(250_000))
    body = f'{{"hits":[{hits}],"shard":0}}'.encode()
    assert answer_bytes(10) * 50 < len(body) < DEFAULT_MAX_BODY
    hostile_port = await answering(body)
    good = await make_data_server(shard=0, replica=1, instance_id="ds-good")
    servers = [make_instance("ds-hostile", hostile_port, shard=0), instance_of(good)]
    async with HttpClient() as client:
        fanout = FanOut(
            client,
            config=FanOutConfig(hedge_ratio=0),
            registry=registry,
            picker=_Prefer("ds-hostile"),
        )
        for _ in range(6):
            result = await fanout.search(servers, QUERY, 10, 5000)
            assert result.shards == shard_counts(1, 1)
            assert all(hit["id"].startswith("s0-") for hit in result.hits)
            if fanout.ejected():
                break
    # Refused as too large (read up to the cap of 10 hits, never decoded), each time it
    # was asked, until it was ejected for it (3 failures in a row).
    assert fanout.ejected() == {"ds-hostile"}
    refused = sample(registry, "search_server_fanout_bad_answers_total", why="too_large")
    assert refused == 3
    assert sample(registry, "search_server_fanout_shard_requests_total", result="error") == 3
