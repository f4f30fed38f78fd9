"""Which shards every answer expects (issue 42, "phantom shards").

A node registered for one query's time under an unused shard number made every later
answer partial, 0 % covered, until the search server restarted. Now a shard outside
``--shards`` is never routed to nor expected, one above them is forgotten once it has
had no replica for ``--forget-missing-shard-after`` (on the fan-out's clock: a
:class:`~tests.support.FakeClock` here, no waiting), an answer lists at most
:data:`~search_server.expectedshards.MISSING_LISTED` missing shards, and one replica's
count of documents cannot swing every answer's coverage. The data servers are scripted
at the sub-request client.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry

from discovery.config import ClusterConfig, ZkConfig
from discovery.errors import ConfigError
from discovery.instance import ServiceInstance
from discovery.livelist.feed import diff_lists
from discovery.livelist.model import LiveList
from discovery.livelist.shards import shard_out_of_range, within_shards
from search_server import cli as search_server_cli
from search_server.config import SearchServerConfig, build_parser
from search_server.dashboard import QueryStats
from search_server.expectedshards import (
    DOCS_CAP_MULTIPLE,
    MISSING_LISTED,
    ExpectedShards,
)
from search_server.fanout import FanOut, FanOutConfig
from search_server.httpclient import Endpoint, Response
from tests.support import FakeClock, make_instance, sample, shard_counts

FORGET = 600.0
QUERY = "a"


class _Scripted:
    """Answers at once: a hit for the port's shard, or a 500 for the ports in
    ``failing``. Counts the requests per port."""

    def __init__(self) -> None:
        self.failing: set[int] = set()
        self.sent: Counter[int] = Counter()

    def get(
        self, endpoint: Endpoint, target: bytes, max_body: int | None = None
    ) -> asyncio.Future[Response]:
        self.sent[endpoint.port] += 1
        future: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        if endpoint.port in self.failing:
            future.set_result((500, b'{"error":"broken"}'))
        else:
            body = {"hits": [{"id": f"d{endpoint.port}", "score": 1.0}], "took_ms": 0.1}
            future.set_result((200, orjson.dumps(body)))
        return future

    async def aclose(self) -> None:
        pass


def _servers(shards: int, docs: int = 1000) -> dict[str, ServiceInstance]:
    return {
        f"ds-{s}": make_instance(f"ds-{s}", 20_000 + s, shard=s, docs=docs) for s in range(shards)
    }


def _phantom(docs: int = 1000) -> ServiceInstance:
    return make_instance("ds-999", 29_999, shard=999, docs=docs)


def _fanout(
    registry: CollectorRegistry, clock: FakeClock, client: _Scripted, **config: Any
) -> FanOut:
    return FanOut(
        client,
        config=FanOutConfig(hedge_ratio=0, **config),
        registry=registry,
        clock=clock,
    )


def _fanout_sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return sample(registry, f"search_server_fanout_{name}", **labels)


# -- forgetting a shard without a replica ---------------------------------------------


async def test_a_shard_registered_for_a_moment_is_forgotten_and_answers_are_complete_again(
    registry: CollectorRegistry,
) -> None:
    clock, client = FakeClock(), _Scripted()
    fanout = _fanout(registry, clock, client, forget_missing_shard_after=FORGET)
    servers = _servers(2)
    with_phantom = {**servers, "ds-999": _phantom()}
    result = await fanout.search(with_phantom, QUERY, 10, 1000)
    assert result.shards == shard_counts(3, 3)
    # Its server gone: missing from every answer, for the time set.
    result = await fanout.search(servers, QUERY, 10, 1000)
    assert result.partial
    assert result.shards == shard_counts(3, 2, missing=1)
    assert result.coverage is not None
    assert result.coverage.missing == (999,)
    clock.advance(FORGET - 1)
    result = await fanout.search(servers, QUERY, 10, 1000)
    assert result.shards["missing"] == 1
    assert _fanout_sample(registry, "shards_forgotten_total") == 0
    clock.advance(1)
    result = await fanout.search(servers, QUERY, 10, 1000)
    assert not result.partial
    assert result.shards == shard_counts(2, 2)
    assert result.coverage is not None
    assert result.coverage.ratio == 1.0
    assert set(fanout.expected_shards) == {0, 1}
    assert _fanout_sample(registry, "shards_forgotten_total") == 1
    # A replica back: expected again, and missing again once it leaves.
    await fanout.search(with_phantom, QUERY, 10, 1000)
    result = await fanout.search(servers, QUERY, 10, 1000)
    assert result.shards["missing"] == 1


async def test_the_time_runs_from_when_the_last_replica_left_not_from_the_next_query(
    registry: CollectorRegistry,
) -> None:
    """Followed change by change (as a search server does), the departure is seen when
    it happens: a first query long after finds the shard forgotten already."""
    clock, client = FakeClock(), _Scripted()
    fanout = _fanout(registry, clock, client, forget_missing_shard_after=FORGET)
    first = LiveList(1, 1, "ss-1", 0, {**_servers(2), "ds-999": _phantom()})
    fanout.follow(diff_lists(LiveList.EMPTY, first))
    assert (await fanout.search(first.servers, QUERY, 10, 1000)).shards["total"] == 3
    second = LiveList(1, 2, "ss-1", 0, _servers(2))
    fanout.follow(diff_lists(first, second))
    clock.advance(FORGET)
    result = await fanout.search(second.servers, QUERY, 10, 1000)
    assert result.shards == shard_counts(2, 2)


async def test_a_shard_that_returns_in_time_starts_its_count_again(
    registry: CollectorRegistry,
) -> None:
    clock, client = FakeClock(), _Scripted()
    fanout = _fanout(registry, clock, client, forget_missing_shard_after=FORGET)
    servers = _servers(1)
    with_phantom = {**servers, "ds-999": _phantom()}
    await fanout.search(with_phantom, QUERY, 10, 1000)
    await fanout.search(servers, QUERY, 10, 1000)
    clock.advance(FORGET - 1)
    await fanout.search(with_phantom, QUERY, 10, 1000)  # back, for a moment
    await fanout.search(servers, QUERY, 10, 1000)
    clock.advance(FORGET - 1)
    result = await fanout.search(servers, QUERY, 10, 1000)
    assert result.shards["missing"] == 1  # 2 x (FORGET - 1) since it first left


def test_shards_named_by_shards_are_never_forgotten_nor_any_with_zero() -> None:
    clock = FakeClock()
    named = ExpectedShards(3, forget_after=FORGET)
    named.routed(5, 100)
    assert named.missing([(0, ()), (1, ()), (2, ()), (5, ())], clock()) == []
    assert [s for s, _ in named.missing([], clock())] == [0, 1, 2, 5]
    clock.advance(10 * FORGET)
    assert [s for s, _ in named.missing([], clock())] == [0, 1, 2]
    assert set(named.shards) == {0, 1, 2}

    never = ExpectedShards(0, forget_after=0)
    never.routed(5, 100)
    assert never.missing([], clock()) == [(5, 100)]
    clock.advance(10 * FORGET)
    assert never.missing([], clock()) == [(5, 100)]


# -- --shards N: another shard number is never routed to nor expected -------------------


async def test_with_shards_a_server_of_another_shard_is_never_routed_to_nor_expected(
    registry: CollectorRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    clock, client = FakeClock(), _Scripted()
    fanout = _fanout(registry, clock, client, shards=2)
    # A list from a leader without --shards (or the ZooKeeper fallback's view).
    servers = {**_servers(2), "ds-999": _phantom()}
    with caplog.at_level(logging.WARNING, logger="search_server.shardrouting"):
        for _ in range(3):
            result = await fanout.search(servers, QUERY, 10, 1000)
            assert not result.partial
            assert result.shards == shard_counts(2, 2)
    assert client.sent[29_999] == 0
    assert set(fanout.expected_shards) == {0, 1}
    assert _fanout_sample(registry, "unroutable_total", why="shard_out_of_range") >= 1
    # Logged once for the server, not once per list.
    lines = [r.getMessage() for r in caplog.records if "ds-999" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "shard_out_of_range: shard 999" in lines[0]
    # Changes of the list never route to it either.
    first = LiveList(1, 1, "ss-1", 0, _servers(2))
    fanout.follow(diff_lists(LiveList.EMPTY, first))
    second = LiveList(1, 2, "ss-1", 0, servers)
    fanout.follow(diff_lists(first, second))
    assert (await fanout.search(second.servers, QUERY, 10, 1000)).shards == shard_counts(2, 2)
    assert client.sent[29_999] == 0


def test_the_shard_rule_names_the_range_and_comes_before_the_deployments_own() -> None:
    phantom = _phantom()
    assert shard_out_of_range(phantom, 0) is None
    assert shard_out_of_range(make_instance("ds-1", shard=1), 2) is None
    reason = shard_out_of_range(phantom, 2)
    assert reason is not None
    assert reason.startswith("shard_out_of_range: shard 999 ")
    assert "0..1" in reason
    assert "--shards 2" in reason

    def refuse_all(instance: ServiceInstance) -> str:
        return "not_allowed: nowhere"

    assert within_shards(0, None) is None
    assert within_shards(0, refuse_all) is refuse_all
    admit = within_shards(2, refuse_all)
    assert admit is not None
    assert (admit(phantom) or "").startswith("shard_out_of_range:")
    assert admit(make_instance("ds-0", shard=0)) == "not_allowed: nowhere"
    only_range = within_shards(2)
    assert only_range is not None
    assert only_range(make_instance("ds-0", shard=0)) is None


# -- the answer's missing list ---------------------------------------------------------


async def test_an_answer_lists_at_most_a_hundred_missing_shards_and_counts_them_all(
    registry: CollectorRegistry,
) -> None:
    clock, client = FakeClock(), _Scripted()
    fanout = _fanout(registry, clock, client, shards=250)
    result = await fanout.search(_servers(1), QUERY, 10, 1000)
    assert result.shards == shard_counts(250, 1, missing=249)
    coverage = result.coverage
    assert coverage is not None
    assert coverage.missing == tuple(range(1, 1 + MISSING_LISTED))
    assert coverage.shards_total == 250
    body = result.to_dict()
    assert len(body["coverage"]["missing"]) == MISSING_LISTED
    assert body["shards"]["missing"] == 249


def test_the_dashboard_counts_every_missing_shard_of_an_answer_that_lists_a_hundred() -> None:
    stats = QueryStats(clock=FakeClock())
    stats.record(10.0, True, 0.5, tuple(range(1, 101)), 249)
    snapshot = stats.snapshot()
    assert snapshot["missing_count"] == 249
    assert snapshot["missing_shards"] == list(range(1, 101))


# -- coverage: one replica's claim of documents ----------------------------------------


async def test_one_replicas_claim_of_documents_cannot_swing_every_answers_coverage(
    registry: CollectorRegistry,
) -> None:
    clock, client = FakeClock(), _Scripted()
    fanout = _fanout(registry, clock, client, eject_after=1000)
    servers = _servers(4)
    liar = make_instance("ds-3-liar", 20_103, shard=3, docs=10**12)
    servers["ds-3-liar"] = liar
    client.failing = {20_003, 20_103}  # shard 3 fails; shards 0-2 answer
    result = await fanout.search(servers, QUERY, 10, 1000)
    assert result.coverage is not None
    # Shard 3 counts as at most 4 median shards: 3 of 7, not 3 of 10**12.
    cap = DOCS_CAP_MULTIPLE * 1000
    assert result.coverage.docs_total == 3000 + cap
    assert result.coverage.ratio > 0.4
    # The liar alone in shard 3 and answering while shard 0 fails: 6 of 7, not 100 %.
    del servers["ds-3"]
    client.failing = {20_000}
    result = await fanout.search(servers, QUERY, 10, 1000)
    assert result.coverage is not None
    assert result.shards == shard_counts(4, 3, failed=1)
    assert result.coverage.docs == 2000 + cap
    assert result.coverage.ratio < 0.9


async def test_a_gone_shards_last_claim_is_capped_too(registry: CollectorRegistry) -> None:
    clock, client = FakeClock(), _Scripted()
    fanout = _fanout(registry, clock, client, forget_missing_shard_after=FORGET)
    servers = _servers(3)
    await fanout.search({**servers, "ds-999": _phantom(docs=10**12)}, QUERY, 10, 1000)
    result = await fanout.search(servers, QUERY, 10, 1000)
    assert result.coverage is not None
    assert result.coverage.missing == (999,)
    assert result.coverage.docs_total == 3000 + DOCS_CAP_MULTIPLE * 1000
    assert result.coverage.ratio > 0.4


def test_a_shard_never_seen_counts_as_the_median_shard_not_the_mean() -> None:
    expected = ExpectedShards(4, forget_after=FORGET)
    for shard, docs in ((0, 1000), (1, 1200), (2, 10**12)):
        expected.routed(shard, docs)
    table = [(0, ()), (1, ()), (2, ())]
    assert expected.missing(table, 0.0) == [(3, 1200)]
    assert expected.docs_cap() == DOCS_CAP_MULTIPLE * 1200


def test_the_forgetting_time_is_a_flag_and_a_variable_and_bad_values_are_named(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("DISCOVERY_FORGET_MISSING_SHARD_AFTER", raising=False)

    def config(*argv: str) -> SearchServerConfig:
        return SearchServerConfig.from_args(build_parser().parse_args(list(argv)))

    assert config().forget_missing_shard_after == FORGET
    assert config("--forget-missing-shard-after", "0").forget_missing_shard_after == 0
    monkeypatch.setenv("DISCOVERY_FORGET_MISSING_SHARD_AFTER", "30")
    assert config().forget_missing_shard_after == 30
    with pytest.raises(SystemExit):
        search_server_cli.main(["--forget-missing-shard-after", "-1"])
    assert "--forget-missing-shard-after" in capsys.readouterr().err
    base: dict[str, Any] = {"zk": ZkConfig(hosts="127.0.0.1:2181"), "cluster": ClusterConfig()}
    with pytest.raises(ConfigError, match="--forget-missing-shard-after"):
        SearchServerConfig(**base, forget_missing_shard_after=-1)
    with pytest.raises(ValueError, match="forget_missing_shard_after"):
        FanOutConfig(forget_missing_shard_after=-1)
    with pytest.raises(ValueError, match="forget_after"):
        ExpectedShards(0, forget_after=-1)
