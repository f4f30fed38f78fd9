"""Replica groups (``search_server.groups``): the choice of a query's group, the fill
of a shard its group cannot serve, coverage, rotation and the metrics' cap.

Everything runs on a :class:`FakeClock` (ejections end when the test moves it) and,
for whole queries, on a :class:`ManualTimer` with a client that answers only when the
test says: no wall-clock wait anywhere.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import orjson
import pytest
from prometheus_client import CollectorRegistry

from discovery.address import NetworkPolicy
from discovery.instance import ServiceInstance
from search_server.candidates import Candidates
from search_server.ejection import OutlierEjection
from search_server.fanout import FanOut, FanOutConfig
from search_server.groups import MAX_LABELLED_GROUPS, OTHER_GROUPS, Group, GroupTable
from search_server.httpclient import Endpoint, Response
from search_server.metrics import FanOutMetrics
from search_server.picking import Replica
from search_server.replicahealth import ReplicaHealth
from search_server.shardcall import ShardCall
from search_server.shardrouting import ShardRoute, ShardRouting
from search_server.slowstart import Ramps, SlowStart
from search_server.subsetting import DeterministicAperture, Position
from tests.support import FakeClock, ManualTimer, make_instance, sample

QUERIES = "search_server_fanout_group_queries_total"
FILLS = "search_server_fanout_group_fills_total"
COVERAGE = "search_server_fanout_group_coverage_ratio"
IN_ROTATION = "search_server_fanout_group_in_rotation"


def cluster(
    shards: int = 4,
    groups: tuple[str, ...] = ("a", "b"),
    *,
    docs: int = 1000,
    without: tuple[tuple[str, int], ...] = (),
) -> list[ServiceInstance]:
    """One replica of every shard in each group (``ds-<group>-<shard>``), less the
    ``(group, shard)`` pairs ``without`` names."""
    port = iter(range(20_000, 30_000))
    return [
        make_instance(f"ds-{g}-{s}", next(port), shard=s, replica=r, group=g, docs=docs)
        for r, g in enumerate(groups)
        for s in range(shards)
        if (g, s) not in without
    ]


class Rig:
    """A fan-out's routing, health and candidates, without the fan-out: what a query
    asks of them, step by step."""

    def __init__(self, *, min_coverage: float = 0.97, subset_size: int = 8) -> None:
        self.clock = FakeClock()
        self.registry = CollectorRegistry()
        self.metrics = FanOutMetrics(self.registry)
        self.routing = ShardRouting(
            clock=self.clock,
            networks=NetworkPolicy(),
            subsetter=DeterministicAperture(subset_size),
            ramps=Ramps(SlowStart(window=0)),
            metrics=self.metrics,
            min_group_coverage=min_coverage,
        )
        self.health = ReplicaHealth(
            OutlierEjection(eject_after=1, eject_cooldown=10.0),
            clock=self.clock,
            metrics=self.metrics,
            answered=lambda: self.routing.answered,
            panic_threshold=0.0,
            overload_backoff=0.5,
            on_ejection=self.routing.groups.ejection_changed,
        )
        self.candidates = Candidates(
            self.routing, self.health, zone=None, warmup=0, rng=random.Random(7)
        )
        self.servers: list[ServiceInstance] = []

    @property
    def table(self) -> GroupTable:
        return self.routing.groups

    def route(self, servers: list[ServiceInstance]) -> list[ShardRoute]:
        """Route with ``servers`` (a new list each time, as the live list is)."""
        self.servers = servers
        return self.routing.routes(self.routing.table_for(servers))

    def choose(self) -> Group | None:
        """A query's group, as FanOut asks for it."""
        table = self.routing.table_for(self.servers)
        self.routing.routes(table)
        return self.table.choose(self.routing.missing(table), self.routing.docs_cap)

    def first(self, shard: int, group: Group | None) -> list[str]:
        """The ids a query of ``group``'s first request to ``shard`` may go to."""
        route = next(r for r in self.route(self.servers) if r.shard == shard)
        call = ShardCall(route, None, group)
        return sorted(r.instance.id for r in self.candidates.of(call, self.clock()))

    def replica(self, instance_id: str) -> Replica:
        instance = next(i for i in self.servers if i.id == instance_id)
        replica = self.routing.replica(instance)
        assert replica is not None
        return replica

    def eject(self, instance_id: str) -> None:
        self.health.record_failure(self.replica(instance_id), "error", "test")
        assert self.replica(instance_id).is_ejected(self.clock())


def rotation(rig: Rig) -> list[str]:
    rig.choose()
    return [g.name for g in rig.table.rotation]


# -- the choice -------------------------------------------------------------------------


def test_a_list_without_groups_routes_and_counts_as_before() -> None:
    rig = Rig()
    routes = rig.route([make_instance(f"ds-{s}", 20_000 + s, shard=s) for s in range(3)])
    assert all(route.groups is None for route in routes)
    assert rig.choose() is None
    assert rig.table.groups == {}
    # The first request's candidates are the shard's replicas, as before groups.
    assert rig.first(0, None) == ["ds-0"]
    assert sample(rig.registry, FILLS) == 0
    assert rig.registry.get_sample_value(QUERIES, {"group": "a"}) is None


def test_ties_go_round_in_turn() -> None:
    rig = Rig()
    rig.route(cluster(groups=("a", "b", "c")))
    chosen = [group.name for _ in range(6) if (group := rig.choose()) is not None]
    assert chosen == ["a", "b", "c", "a", "b", "c"]
    assert sample(rig.registry, QUERIES, group="b") == 2


def test_the_group_with_fewest_requests_in_flight_per_usable_replica_is_chosen() -> None:
    rig = Rig()
    rig.route(cluster(groups=("a", "b", "c")))
    groups = rig.table.groups
    groups["a"].outstanding = 3
    groups["b"].outstanding = 1
    groups["c"].outstanding = 2
    assert [rig.choose().name for _ in range(3)] == ["b", "b", "b"]  # type: ignore[union-attr]
    groups["b"].outstanding = 4
    assert rig.choose().name == "c"  # type: ignore[union-attr]


def test_a_group_with_more_replicas_takes_more_in_flight_before_it_loses() -> None:
    rig = Rig()
    # Group b has two replicas of every shard: twice the usable replicas of a.
    extra = [
        make_instance(f"ds-b2-{s}", 21_000 + s, shard=s, replica=2, group="b") for s in range(4)
    ]
    rig.route(cluster() + extra)
    groups = rig.table.groups
    assert (groups["a"].usable, groups["b"].usable) == (4, 8)
    groups["a"].outstanding, groups["b"].outstanding = 3, 5  # 0.75 against 0.625 a replica
    assert rig.choose().name == "b"  # type: ignore[union-attr]
    groups["b"].outstanding = 7  # 0.875 a replica
    assert rig.choose().name == "a"  # type: ignore[union-attr]


def test_only_groups_in_rotation_are_chosen() -> None:
    rig = Rig()
    # Group c lacks shard 3: 75 % of the corpus, below 97 %, however idle it is.
    rig.route(cluster(groups=("a", "b", "c"), without=(("c", 3),)))
    rig.table.groups["a"].outstanding = 50
    rig.table.groups["b"].outstanding = 50
    chosen = Counter(g.name for _ in range(10) if (g := rig.choose()) is not None)
    assert chosen == {"a": 5, "b": 5}
    c = rig.table.groups["c"]
    assert (c.in_rotation, c.coverage) == (False, 0.75)
    assert sample(rig.registry, IN_ROTATION, group="c") == 0
    assert sample(rig.registry, COVERAGE, group="c") == 0.75
    assert sample(rig.registry, IN_ROTATION, group="a") == 1


# -- coverage and rotation --------------------------------------------------------------


def test_an_ejection_takes_a_group_out_and_its_end_brings_it_back() -> None:
    rig = Rig()
    rig.route(cluster())
    assert rotation(rig) == ["a", "b"]
    rig.eject("ds-a-2")
    assert rotation(rig) == ["b"]
    assert rig.table.groups["a"].coverage == 0.75
    assert {rig.choose().name for _ in range(4)} == {"b"}  # type: ignore[union-attr]
    rig.clock.advance(5)
    assert rotation(rig) == ["b"]
    rig.clock.advance(5)  # the cool-down is over: counted usable again, unasked
    assert rotation(rig) == ["a", "b"]
    assert rig.table.groups["a"].coverage == 1.0


def test_an_answer_that_ends_an_ejection_early_brings_the_group_back() -> None:
    rig = Rig()
    rig.route(cluster())
    rig.eject("ds-a-0")
    assert rotation(rig) == ["b"]
    rig.health.record_success(rig.replica("ds-a-0"), probe=True)
    assert rotation(rig) == ["a", "b"]


def test_the_live_list_takes_a_group_out_and_back() -> None:
    rig = Rig()
    rig.route(cluster(without=(("b", 1),)))
    assert rotation(rig) == ["a"]
    rig.route(cluster())
    assert rotation(rig) == ["a", "b"]


def test_the_threshold_is_the_share_of_documents_missing_shards_included() -> None:
    # Shards of 100 documents but shard 0 of 300 (under the cap of four medians: 400).
    servers = [
        make_instance(f"ds-{g}-{s}", 20_000 + 10 * r + s, shard=s, replica=r, group=g, docs=d)
        for r, g in enumerate("ab")
        for s, d in enumerate([300, 100, 100, 100, 100, 100, 100])
        if (g, s) != ("b", 0)
    ]
    rig = Rig(min_coverage=0.8)
    rig.route(servers)
    rig.choose()
    # b lacks shard 0: 300 of 900 documents.
    assert rig.table.groups["b"].coverage == pytest.approx(600 / 900)
    assert rotation(rig) == ["a"]
    # Every replica of shard 6 leaves: still expected, so still in the total (its last
    # count), and neither group holds it now.
    rig.route([i for i in servers if i.payload.shard != 6])
    rig.choose()
    assert rig.table.groups["a"].coverage == pytest.approx(800 / 900)
    assert rotation(rig) == ["a"]


def test_exactly_the_threshold_is_in_rotation() -> None:
    rig = Rig(min_coverage=0.97)
    rig.route(cluster(shards=100, without=(("b", 0), ("b", 1), ("b", 2))))
    assert rotation(rig) == ["a", "b"]  # 97 of 100 equal shards
    rig.route(cluster(shards=100, without=(("b", 0), ("b", 1), ("b", 2), ("b", 3))))
    assert rotation(rig) == ["a"]


def test_never_zero_groups_the_best_stay() -> None:
    rig = Rig()
    rig.route(cluster(without=(("a", 0), ("b", 1))))
    # Both at 75 %: both stay in rotation rather than none.
    assert rotation(rig) == ["a", "b"]
    assert sample(rig.registry, IN_ROTATION, group="b") == 1
    rig.route(cluster(without=(("a", 0), ("a", 2), ("b", 1))))
    # a at 50 %, b at 75 %: the best alone.
    assert rotation(rig) == ["b"]
    rig.eject("ds-b-0")
    # Both at 50 % now.
    assert rotation(rig) == ["a", "b"]


def test_a_group_whose_replicas_all_left_is_dropped_and_its_gauges_with_it() -> None:
    rig = Rig()
    rig.route(cluster(groups=("a", "b")))
    rig.choose()
    assert sample(rig.registry, IN_ROTATION, group="b") == 1
    rig.route(cluster(groups=("a",)))
    rig.choose()
    assert set(rig.table.groups) == {"a"}
    assert rig.registry.get_sample_value(IN_ROTATION, {"group": "b"}) is None
    assert rig.registry.get_sample_value(COVERAGE, {"group": "b"}) is None


# -- the first request and the fill -----------------------------------------------------


def test_the_first_request_goes_to_the_querys_group_and_others_only_fill() -> None:
    rig = Rig(min_coverage=0.5)
    plain = make_instance("ds-x-0", 22_000, shard=0)  # no group: it only fills in
    rig.route([*cluster(), plain])
    group = rig.table.groups["a"]
    assert rig.first(0, group) == ["ds-a-0"]
    assert rig.first(0, rig.table.groups["b"]) == ["ds-b-0"]
    assert sample(rig.registry, FILLS) == 0
    # a's replica of shard 0 is ejected: the others fill in, counted.
    rig.eject("ds-a-0")
    assert rig.first(0, group) == ["ds-b-0", "ds-x-0"]
    assert rig.first(1, group) == ["ds-a-1"]
    assert sample(rig.registry, FILLS) == 1


def test_a_shard_the_group_has_no_replica_of_fills_from_the_others() -> None:
    rig = Rig(min_coverage=0.5)
    rig.route(cluster(without=(("a", 3),)))
    assert rig.first(3, rig.table.groups["a"]) == ["ds-b-3"]
    assert sample(rig.registry, FILLS) == 1


def test_no_fill_is_counted_when_the_shard_has_no_usable_replica_at_all() -> None:
    rig = Rig(min_coverage=0.5)
    rig.route(cluster())
    rig.eject("ds-a-0")
    rig.eject("ds-b-0")
    assert rig.first(0, rig.table.groups["a"]) == []  # the query probes or gives up
    assert sample(rig.registry, FILLS) == 0


def test_a_group_replica_that_refused_for_overload_is_filled_for() -> None:
    rig = Rig()
    rig.route(cluster())
    rig.health.record_refusal(rig.replica("ds-a-1"))
    assert rig.first(1, rig.table.groups["a"]) == ["ds-b-1"]
    assert sample(rig.registry, FILLS) == 1
    rig.clock.advance(0.5)  # its backoff is over
    assert rig.first(1, rig.table.groups["a"]) == ["ds-a-1"]


def test_retries_and_hedges_may_go_to_any_group() -> None:
    rig = Rig()
    rig.route(cluster())
    route = next(r for r in rig.route(rig.servers) if r.shard == 0)
    call = ShardCall(route, None, rig.table.groups["a"])
    call.tried.append(rig.replica("ds-a-0"))
    assert [r.instance.id for r in rig.candidates.of(call, rig.clock())] == ["ds-b-0"]
    call.tried.clear()
    call.tried.append(rig.replica("ds-b-0"))
    # A hedge after the first went to b: a is a candidate (the group does not narrow).
    assert [r.instance.id for r in rig.candidates.for_hedge(call, 1.0, rig.clock())] == ["ds-a-0"]
    assert sample(rig.registry, FILLS) == 0


# -- subsets ----------------------------------------------------------------------------


def test_each_group_is_subset_on_its_own() -> None:
    rig = Rig(subset_size=2)
    # 2 groups of 10 replicas of shard 0; this search server is one of five.
    servers = [
        make_instance(f"ds-{g}-{j:02d}", 20_000 + 100 * r + j, shard=0, replica=j, group=g)
        for r, g in enumerate("ab")
        for j in range(10)
    ]
    rig.routing.set_position(Position(2, 5))
    (route,) = rig.route(servers)
    assert route.groups is not None
    for name in "ab":
        subset = route.groups.members(name)
        assert subset is not None
        members = {r.instance.id for r in subset.members}
        # Its own replicas only, at least the subset size of them.
        assert len(members) >= 2
        assert all(m.startswith(f"ds-{name}-") for m in members)
        assert set(rig.first(0, rig.table.groups[name])) <= members
    # The shard's own subset (for fills, retries and hedges) is made as before.
    assert route.subset is not None


# -- whole queries ----------------------------------------------------------------------


class _Held:
    """A sub-request client whose requests wait until the test answers them."""

    def __init__(self, servers: list[ServiceInstance]) -> None:
        self.by_port = {i.port: i for i in servers}
        self.sent: list[str] = []
        self.pending: dict[int, list[asyncio.Future[Response]]] = {}

    def get(
        self, endpoint: Endpoint, target: bytes, max_body: int | None = None
    ) -> asyncio.Future[Response]:
        future: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        self.sent.append(self.by_port[endpoint.port].id)
        self.pending.setdefault(endpoint.port, []).append(future)
        return future

    def answer(self, instance_id: str) -> None:
        instance = next(i for i in self.by_port.values() if i.id == instance_id)
        body = {
            "hits": [{"id": f"d{instance.port}", "score": 1.0}],
            "shard": instance.payload.shard,
        }
        for future in self.pending.pop(instance.port, []):
            if not future.done():
                future.set_result((200, orjson.dumps(body)))

    async def aclose(self) -> None:
        pass


async def _sent(client: _Held, count: int) -> list[str]:
    """Let the loop run until ``count`` requests are out in all; the new ones."""
    before = len(client.sent)
    for _ in range(100):
        if len(client.sent) >= count:
            return client.sent[before:]
        await asyncio.sleep(0)  # ok-sleep: one loop turn, on a manual timer (no time passes)
    raise AssertionError(f"{len(client.sent)} requests sent, expected {count}")


async def test_queries_go_to_the_group_with_fewer_requests_in_flight() -> None:
    servers = cluster(shards=3)
    client = _Held(servers)
    registry = CollectorRegistry()
    fanout = FanOut(
        client,
        config=FanOutConfig(hedge_ratio=0),
        registry=registry,
        clock=FakeClock(),
        timer=ManualTimer(),
    )
    first = asyncio.create_task(fanout.search(servers, "q", 10, 1000))
    assert sorted(await _sent(client, 3)) == ["ds-a-0", "ds-a-1", "ds-a-2"]
    # a has three requests in flight: the next query goes to b, every shard of it.
    second = asyncio.create_task(fanout.search(servers, "q", 10, 1000))
    assert sorted(await _sent(client, 6)) == ["ds-b-0", "ds-b-1", "ds-b-2"]
    groups = fanout.groups().groups
    assert (groups["a"].outstanding, groups["b"].outstanding) == (3, 3)
    for shard in range(3):
        client.answer(f"ds-b-{shard}")
    assert not (await asyncio.wait_for(second, 5)).partial
    assert groups["b"].outstanding == 0
    # a is still busy, b idle again: b, though a tie would have been a's turn.
    third = asyncio.create_task(fanout.search(servers, "q", 10, 1000))
    assert sorted(await _sent(client, 9)) == ["ds-b-0", "ds-b-1", "ds-b-2"]
    for shard in range(3):
        client.answer(f"ds-a-{shard}")
        client.answer(f"ds-b-{shard}")
    for task in (first, third):
        assert not (await asyncio.wait_for(task, 5)).partial
    assert (groups["a"].outstanding, groups["b"].outstanding) == (0, 0)
    assert sample(registry, QUERIES, group="a") == 1
    assert sample(registry, QUERIES, group="b") == 2
    assert [g["queries"] for g in fanout.groups().summary(10)] == [1, 2]


async def test_requests_abandoned_at_the_deadline_leave_their_groups_load() -> None:
    servers = cluster(shards=2)
    client = _Held(servers)
    timer = ManualTimer()
    fanout = FanOut(
        client,
        config=FanOutConfig(hedge_ratio=0),
        registry=CollectorRegistry(),
        clock=FakeClock(),
        timer=timer,
    )
    search = asyncio.create_task(fanout.search(servers, "q", 10, 1000))
    assert sorted(await _sent(client, 2)) == ["ds-a-0", "ds-a-1"]
    group = fanout.groups().groups["a"]
    assert group.outstanding == 2
    client.answer("ds-a-0")
    timer.advance(1.0)
    result = await asyncio.wait_for(search, 5)
    assert result.partial
    assert group.outstanding == 0


# -- metrics' cap -----------------------------------------------------------------------


def test_past_the_cap_groups_share_one_label_and_have_no_gauges() -> None:
    rig = Rig()
    names = tuple(f"g{i:02d}" for i in range(MAX_LABELLED_GROUPS + 1))
    rig.route(cluster(shards=1, groups=names))
    for _ in names:
        rig.choose()  # ties: each group once
    labelled = [
        name for name in names if rig.registry.get_sample_value(IN_ROTATION, {"group": name})
    ]
    assert len(labelled) == MAX_LABELLED_GROUPS
    (unlabelled,) = set(names) - set(labelled)
    assert rig.registry.get_sample_value(QUERIES, {"group": unlabelled}) is None
    assert sample(rig.registry, QUERIES, group=OTHER_GROUPS) == 1
    assert sum(sample(rig.registry, QUERIES, group=name) for name in labelled) == 64
    # /cluster lists every group whatever the cap.
    assert len(rig.table.summary(100)) == MAX_LABELLED_GROUPS + 1


def test_min_coverage_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="min_group_coverage"):
        FanOutConfig(min_group_coverage=1.5)
    with pytest.raises(ValueError, match="min_coverage"):
        GroupTable(min_coverage=-0.1, clock=FakeClock(), metrics=FanOutMetrics(CollectorRegistry()))
