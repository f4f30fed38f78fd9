"""Latency outlier demotion (``search_server.demotion``): a replica much slower than its
shard's peers gets no request while a peer is not demoted, but a probe now and then (a
copy of a first request, raced against it).

Replicas learn their relative slowness as the fan-out teaches it, from the times of
whole queries' shards (:meth:`LatencyDemotion.observe`); the candidates are asked as a
query's requests ask them. Everything runs on a :class:`FakeClock` and, for whole
queries, a :class:`ManualTimer` with a client whose answers come when the test moves
it: no wall-clock wait anywhere.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Sequence

import orjson
import pytest
from prometheus_client import CollectorRegistry

from discovery.address import NetworkPolicy
from discovery.config import ClusterConfig, ZkConfig
from discovery.errors import ConfigError
from discovery.instance import ServiceInstance
from search_server import cli as search_server_cli
from search_server.candidates import Candidates
from search_server.config import SearchServerConfig, build_parser
from search_server.demotion import LatencyDemotion
from search_server.ejection import OutlierEjection
from search_server.fanout import FanOut, FanOutConfig
from search_server.httpclient import Endpoint, Response
from search_server.metrics import FanOutMetrics
from search_server.picking import Replica
from search_server.replicahealth import ReplicaHealth
from search_server.shardcall import ShardCall
from search_server.shardrouting import ShardRoute, ShardRouting
from search_server.slowstart import Ramps, SlowStart
from search_server.subsetting import DeterministicAperture
from tests.support import FakeClock, ManualTimer, make_instance, sample

DEMOTIONS = "search_server_fanout_demotions_total"
FILLS = "search_server_fanout_group_fills_total"
# A healthy answer's time, and the time of the other shards' answers in every query the
# tests teach (the reference a replica's relative slowness is measured against).
FAST = 0.001


class Rig:
    """A fan-out's routing, health, demotion and candidates, without the fan-out."""

    def __init__(
        self, *, ratio: float = 3.0, floor: float = 0.002, zone: str | None = None
    ) -> None:
        self.clock = FakeClock()
        self.registry = CollectorRegistry()
        self.metrics = FanOutMetrics(self.registry)
        self.routing = ShardRouting(
            clock=self.clock,
            networks=NetworkPolicy(),
            subsetter=DeterministicAperture(8),
            ramps=Ramps(SlowStart(window=0)),
            metrics=self.metrics,
            min_group_coverage=0.5,
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
        self.demotion = LatencyDemotion(
            ratio=ratio, floor=floor, probe_interval=1.0, min_samples=5, metrics=self.metrics
        )
        self.candidates = Candidates(
            self.routing,
            self.health,
            zone=zone,
            warmup=5,
            rng=random.Random(7),
            demotion=self.demotion,
        )
        self.servers: list[ServiceInstance] = []
        # Replicas of two other shards: the rest of every query taught.
        self.others = [
            Replica.of(make_instance(f"ds-other-{s}", 29_000 + s, shard=s)) for s in (8, 9)
        ]

    def route(self, servers: list[ServiceInstance]) -> None:
        self.servers = servers
        self.routing.routes(self.routing.table_for(servers))

    def _route(self, shard: int) -> ShardRoute:
        routes = self.routing.routes(self.routing.table_for(self.servers))
        return next(r for r in routes if r.shard == shard)

    def replica(self, instance_id: str) -> Replica:
        instance = next(i for i in self.servers if i.id == instance_id)
        replica = self.routing.replica(instance)
        assert replica is not None
        return replica

    def answer(
        self, instance_id: str, seconds: float, times: int = 1, *, sent_demoted: bool | None = None
    ) -> None:
        """``times`` queries in which ``instance_id`` answered in ``seconds`` and the
        other shards in :data:`FAST`, as the fan-out learns them; the request was sent
        while the replica was demoted (``sent_demoted``, by default: if it is now)."""
        replica = self.replica(instance_id)
        if sent_demoted is None:
            sent_demoted = replica.demoted_at is not None
        for _ in range(times):
            replica.observe(seconds, None, None)
            for other in self.others:
                other.observe(FAST, None, None)
            self.demotion.observe(
                [
                    (replica, seconds, False, sent_demoted),
                    *((other, FAST, False, False) for other in self.others),
                ]
            )

    def call(self, shard: int = 0, *, group: str | None = None) -> ShardCall:
        table = self.routing.groups
        return ShardCall(self._route(shard), None, table.groups[group] if group else None)

    def first(self, shard: int = 0, *, group: str | None = None) -> list[str]:
        """The ids a query's first request to ``shard`` may go to now."""
        return self.first_and_probe(shard, group=group)[0]

    def first_and_probe(
        self, shard: int = 0, *, group: str | None = None
    ) -> tuple[list[str], str | None]:
        """:meth:`first`, and the id of the demoted replica to be sent a copy of that
        request as its probe (None: no probe was due)."""
        call = self.call(shard, group=group)
        ids = sorted(r.instance.id for r in self.candidates.of(call, self.clock()))
        probe = call.probe_copy
        return ids, None if probe is None else probe.instance.id

    def demoted(self) -> list[str]:
        return sorted(i.id for i in self.servers if self.replica(i.id).demoted_at is not None)

    def events(self, event: str) -> float:
        return sample(self.registry, DEMOTIONS, event=event)


def shard(*replicas: str, start: int = 20_000, **payload: object) -> list[ServiceInstance]:
    return [
        make_instance(name, start + i, shard=0, replica=i, **payload)
        for i, name in enumerate(replicas)
    ]


def warm(rig: Rig, *replicas: str, seconds: float = FAST) -> None:
    for name in replicas:
        rig.answer(name, seconds, times=5)


def slowed_shard(rig: Rig, seconds: float) -> None:
    """Shard 0 of ds-a and ds-b answering in :data:`FAST` and ds-slow in ``seconds``,
    each warmed up (5 answers)."""
    rig.route(shard("ds-a", "ds-b", "ds-slow"))
    warm(rig, "ds-a", "ds-b")
    warm(rig, "ds-slow", seconds=seconds)


# -- the statistic ----------------------------------------------------------------------


def test_relative_slowness_is_each_answer_over_the_median_of_the_other_shards() -> None:
    rig = Rig()
    rig.route(shard("ds-a", "ds-b", "ds-c"))
    a, b, c = (rig.replica(n) for n in ("ds-a", "ds-b", "ds-c"))
    rig.demotion.observe(
        [(a, 0.001, False, False), (b, 0.002, False, False), (c, 0.010, False, False)]
    )
    # Each against the others (of two, the lower): a 1/2, b 2/1, c 10/1.
    assert (a.relative, b.relative, c.relative) == pytest.approx((0.5, 2.0, 10.0))
    assert (a.relative_samples, b.relative_samples, c.relative_samples) == (1, 1, 1)
    # The next answers are folded in as an EWMA (weight 0.3).
    rig.demotion.observe(
        [(a, 0.001, False, False), (b, 0.001, False, False), (c, 0.001, False, False)]
    )
    assert c.relative == pytest.approx(10.0 + 0.3 * (1.0 - 10.0))


def test_a_query_of_one_answer_teaches_nothing() -> None:
    rig = Rig()
    rig.route(shard("ds-a", "ds-b"))
    a, b = rig.replica("ds-a"), rig.replica("ds-b")
    rig.demotion.observe([(a, 0.050, False, False)])  # nothing to compare with
    rig.demotion.observe(
        [(a, 0.050, False, False), (b, 0.5, True, False)]
    )  # a lower bound is no answer
    assert (a.relative_samples, b.relative_samples) == (0, 0)


def test_a_lower_bound_only_raises_what_is_known() -> None:
    rig = Rig()
    rig.route(shard("ds-a", "ds-b", "ds-c"))
    a, b, c = (rig.replica(n) for n in ("ds-a", "ds-b", "ds-c"))
    rig.demotion.observe(
        [(a, 0.001, False, False), (b, 0.001, False, False), (c, 0.001, False, False)]
    )
    # c was abandoned at 30 ms (against the answers' median, 1 ms): a step towards 30.
    rig.demotion.observe(
        [(a, 0.001, False, False), (b, 0.001, False, False), (c, 0.030, True, False)]
    )
    assert c.relative == pytest.approx(1.0 + 0.3 * 29.0)
    assert c.relative_samples == 1  # not an answer
    # One below what it has says nothing.
    rig.demotion.observe(
        [(a, 0.001, False, False), (b, 0.001, False, False), (c, 0.002, True, False)]
    )
    assert c.relative == pytest.approx(1.0 + 0.3 * 29.0)


# -- demoted, probed, taken back --------------------------------------------------------


def test_a_replica_ten_times_slower_gets_no_first_request_while_its_peers_are_fast() -> None:
    rig = Rig()
    slowed_shard(rig, 10 * FAST + 0.005)
    assert rig.first() == ["ds-a", "ds-b"]
    assert rig.demoted() == ["ds-slow"]
    assert rig.events("demoted") == 1
    # Nor a retry or a hedge while another is left.
    call = rig.call()
    call.tried.append(rig.replica("ds-a"))
    assert [r.instance.id for r in rig.candidates.of(call, rig.clock())] == ["ds-b"]
    assert [r.instance.id for r in rig.candidates.for_hedge(call, 1.0, rig.clock())] == ["ds-b"]
    # Judged once: asking again counts nothing more.
    assert rig.first() == ["ds-a", "ds-b"]
    assert rig.events("demoted") == 1


def test_a_demoted_replica_gets_one_probe_per_interval() -> None:
    rig = Rig()
    slowed_shard(rig, 0.020)
    assert rig.first() == ["ds-a", "ds-b"]
    rig.clock.advance(0.99)
    assert rig.first_and_probe() == (["ds-a", "ds-b"], None)
    # A second since it was demoted: one probe, a copy of a first request to its peers.
    rig.clock.advance(0.01)
    assert rig.first_and_probe() == (["ds-a", "ds-b"], "ds-slow")
    assert rig.first_and_probe() == (["ds-a", "ds-b"], None)
    assert rig.events("probe") == 1
    # A hedge or a retry is never a probe.
    rig.clock.advance(1.0)
    call = rig.call()
    call.tried.append(rig.replica("ds-a"))
    assert [r.instance.id for r in rig.candidates.of(call, rig.clock())] == ["ds-b"]
    assert call.probe_copy is None
    assert rig.first_and_probe() == (["ds-a", "ds-b"], "ds-slow")
    assert rig.events("probe") == 2


def test_a_probe_answered_as_slow_as_before_keeps_it_out() -> None:
    rig = Rig()
    slowed_shard(rig, 0.020)
    rig.first()
    rig.clock.advance(1.0)
    assert rig.first_and_probe()[1] == "ds-slow"
    rig.answer("ds-slow", 0.018)
    assert rig.first() == ["ds-a", "ds-b"]
    assert rig.events("restored") == 0


def test_a_probe_answered_as_fast_as_its_peers_takes_it_back() -> None:
    rig = Rig()
    slowed_shard(rig, 0.020)
    rig.first()
    rig.clock.advance(1.0)
    assert rig.first_and_probe()[1] == "ds-slow"
    # Its answer replaces what it had (stale while it was out), not one EWMA step of it.
    rig.answer("ds-slow", FAST)
    assert rig.replica("ds-slow").relative == pytest.approx(1.0)
    assert rig.first() == ["ds-a", "ds-b", "ds-slow"]
    assert rig.demoted() == []
    assert rig.events("restored") == 1


def test_answers_to_requests_sent_before_the_demotion_are_folded_in() -> None:
    rig = Rig()
    slowed_shard(rig, 0.020)
    rig.first()
    slow = rig.replica("ds-slow")
    before = slow.relative
    # One of its requests sent before it was demoted comes back fast: an EWMA step,
    # not its new figure (a probe's answer is, below).
    rig.answer("ds-slow", FAST, sent_demoted=False)
    assert slow.relative == pytest.approx(before + 0.3 * (1.0 - before))
    assert rig.first() == ["ds-a", "ds-b"]


def test_a_busy_cluster_demotes_nobody() -> None:
    # Every replica of the shard as slow as the other (and ten times the other shards):
    # relative to its peers, none is an outlier.
    rig = Rig()
    rig.route(shard("ds-a", "ds-b"))
    warm(rig, "ds-a", "ds-b", seconds=0.020)
    assert rig.first() == ["ds-a", "ds-b"]
    assert rig.events("demoted") == 0


def test_differences_under_the_floor_demote_nobody() -> None:
    rig = Rig()
    rig.route(shard("ds-a", "ds-b", "ds-c"))
    warm(rig, "ds-a", "ds-b", seconds=0.0002)
    warm(rig, "ds-c", seconds=0.0012)  # six times its peers, 1 ms more
    assert rig.first() == ["ds-a", "ds-b", "ds-c"]
    # With no floor, the same is an outlier.
    bare = Rig(floor=0.0)
    bare.route(shard("ds-a", "ds-b", "ds-c"))
    warm(bare, "ds-a", "ds-b", seconds=0.0002)
    warm(bare, "ds-c", seconds=0.0012)
    assert bare.first() == ["ds-a", "ds-b"]


def test_an_idle_replica_does_not_make_its_busy_peers_outliers() -> None:
    # Compared with the typical replica (the median), not the fastest: one answering
    # four times faster than the others (idle, just started) demotes nobody.
    rig = Rig()
    rig.route(shard("ds-idle", "ds-b", "ds-c"))
    warm(rig, "ds-idle", seconds=0.001)
    warm(rig, "ds-b", "ds-c", seconds=0.004)
    assert rig.first() == ["ds-b", "ds-c", "ds-idle"]


def test_demotion_is_off_with_a_ratio_of_zero() -> None:
    rig = Rig(ratio=0)
    slowed_shard(rig, 0.050)
    assert rig.first() == ["ds-a", "ds-b", "ds-slow"]
    assert rig.events("demoted") == 0


# -- never at the cost of the shard -----------------------------------------------------


def test_demotion_never_leaves_a_shard_without_a_candidate() -> None:
    rig = Rig()
    rig.route(shard("ds-a", "ds-slow"))
    warm(rig, "ds-a")
    warm(rig, "ds-slow", seconds=0.020)
    assert rig.first() == ["ds-a"]
    # A retry after ds-a failed: the demoted one is all that is left, and it is offered.
    call = rig.call()
    call.tried.append(rig.replica("ds-a"))
    assert [r.instance.id for r in rig.candidates.of(call, rig.clock())] == ["ds-slow"]
    # ds-a ejected: its shard keeps the demoted one for first requests too.
    rig.health.record_failure(rig.replica("ds-a"), "error", "test")
    assert rig.first() == ["ds-slow"]


def test_at_least_half_of_a_shard_stays_in_rotation() -> None:
    rig = Rig()
    slowed_shard(rig, 0.020)
    rig.health.record_failure(rig.replica("ds-b"), "error", "test")  # ejected
    # Of three, one ejected: demoting the slow one would leave one replica for all.
    assert rig.first() == ["ds-a", "ds-slow"]
    assert rig.demoted() == []


def test_demotion_records_no_failure_and_no_ejection() -> None:
    rig = Rig()
    slowed_shard(rig, 0.050)
    rig.first()
    slow = rig.replica("ds-slow")
    assert slow.demoted_at is not None
    assert (slow.failures, slow.ejected_until) == (0, None)
    assert rig.health.ejected() == set()
    assert sample(rig.registry, "search_server_fanout_ejections_total") == 0
    assert sample(rig.registry, "search_server_fanout_shard_requests_total", result="error") == 0
    assert not rig.health.panicking(0, 3, rig.clock())


def test_with_groups_a_demoted_replica_is_filled_for_by_another_group() -> None:
    rig = Rig()
    rig.route(
        [
            make_instance(f"ds-{g}-{s}", 20_000 + 10 * r + s, shard=s, replica=r, group=g)
            for r, g in enumerate("abc")
            for s in range(2)
        ]
    )
    rig.routing.groups.choose([], None)
    for name in ("ds-b-0", "ds-c-0", "ds-a-1", "ds-b-1", "ds-c-1"):
        rig.answer(name, FAST, times=5)
    rig.answer("ds-a-0", 0.020, times=5)
    assert rig.first(0, group="a") == ["ds-b-0", "ds-c-0"]
    assert sample(rig.registry, FILLS) == 1
    assert rig.first(1, group="a") == ["ds-a-1"]  # its other shards stay in the group
    assert rig.first(0, group="b") == ["ds-b-0"]
    rig.clock.advance(1.0)  # its probe: a copy of its group's first request, filled
    assert rig.first_and_probe(0, group="a") == (["ds-b-0", "ds-c-0"], "ds-a-0")
    assert sample(rig.registry, FILLS) == 2


def test_with_a_zone_peers_are_judged_within_it() -> None:
    rig = Rig(zone="z1")
    rig.route(
        [
            *shard("ds-here-a", "ds-here-slow", zone="z1"),
            *shard("ds-there", start=21_000, zone="z2"),
        ]
    )
    warm(rig, "ds-here-a", "ds-there")
    warm(rig, "ds-here-slow", seconds=0.020)
    # The zone's slow replica is demoted against the zone's other: no spill-over.
    assert rig.first() == ["ds-here-a"]


def test_settings_out_of_range_are_refused() -> None:
    metrics = FanOutMetrics(CollectorRegistry())
    for bad in ({"ratio": 0.5}, {"ratio": 1.0}, {"floor": -0.001}, {"probe_interval": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            LatencyDemotion(metrics=metrics, **bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="min_samples"):
        LatencyDemotion(metrics=metrics, min_samples=0)
    for field in ({"demote_ratio": 1.0}, {"demote_floor": -1}, {"demote_probe_interval": 0}):
        with pytest.raises(ValueError, match=next(iter(field))):
            FanOutConfig(**field)  # type: ignore[arg-type]


# -- whole queries ----------------------------------------------------------------------


class _Timed:
    """A sub-request client whose answers come ``delay`` seconds of the manual timer
    after each request (per data server), or never (``None``: it hangs)."""

    def __init__(self, servers: list[ServiceInstance], timer: ManualTimer) -> None:
        self.by_port = {i.port: i for i in servers}
        self.timer = timer
        self.delay: dict[str, float | None] = {i.id: FAST for i in servers}
        self.sent: Counter[str] = Counter()

    def get(
        self, endpoint: Endpoint, target: bytes, max_body: int | None = None
    ) -> asyncio.Future[Response]:
        instance = self.by_port[endpoint.port]
        future: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        self.sent[instance.id] += 1
        body = orjson.dumps(
            {"hits": [{"id": f"d{instance.port}", "score": 1.0}], "shard": instance.payload.shard}
        )
        delay = self.delay[instance.id]
        if delay is not None:
            self.timer.call_at(self.timer.now + delay, _settle, future, (200, body))
        return future

    async def aclose(self) -> None:
        pass


def _settle(future: asyncio.Future[Response], response: Response) -> None:
    if not future.done():
        future.set_result(response)


async def _queries(
    fanout: FanOut, servers: list[ServiceInstance], timer: ManualTimer, n: int
) -> None:
    """``n`` queries, four at a time, the timer moved a millisecond a turn until all end."""
    for _ in range(0, n, 4):
        tasks = [asyncio.create_task(fanout.search(servers, "q", 10, 100)) for _ in range(4)]
        while not all(task.done() for task in tasks):
            await asyncio.sleep(0)  # ok-sleep: one loop turn, on a manual timer
            timer.advance(0.001)
        for task in tasks:
            task.result()


def _grid() -> list[ServiceInstance]:
    """Shard 0 of three replicas, shards 1 and 2 of one."""
    return [
        *shard("ds-0a", "ds-0b", "ds-0slow"),
        make_instance("ds-1", 21_000, shard=1),
        make_instance("ds-2", 21_001, shard=2),
    ]


async def test_a_slow_replica_gets_few_first_requests_in_whole_queries() -> None:
    servers = _grid()
    timer, clock = ManualTimer(), FakeClock()
    client = _Timed(servers, timer)
    registry = CollectorRegistry()
    fanout = FanOut(
        client, config=FanOutConfig(hedge_ratio=0), registry=registry, clock=clock, timer=timer
    )
    await _queries(fanout, servers, timer, 40)  # everyone warmed up
    client.delay["ds-0slow"] = 0.010  # ten times its peers
    client.sent.clear()
    await _queries(fanout, servers, timer, 200)
    # Until demoted (an answer or two), then nothing: the fan-out's clock stood still,
    # so no probe was due. Adaptive selection alone, four queries at a time, sends it
    # a request whenever its peers have two or three in flight (17 here).
    assert client.sent["ds-0slow"] <= 4, client.sent
    assert sample(registry, DEMOTIONS, event="demoted") == 1
    clock.advance(1.0)
    await _queries(fanout, servers, timer, 40)
    assert sample(registry, DEMOTIONS, event="probe") == 1
    assert client.sent["ds-0slow"] <= 5, client.sent
    # Fast again: its next probe takes it back, and it gets its share.
    client.delay["ds-0slow"] = FAST
    clock.advance(1.0)
    await _queries(fanout, servers, timer, 40)
    assert sample(registry, DEMOTIONS, event="restored") == 1
    client.sent.clear()
    await _queries(fanout, servers, timer, 80)
    assert client.sent["ds-0slow"] >= 1, client.sent


async def test_a_probes_copy_that_loses_the_race_still_takes_a_recovered_replica_back() -> None:
    servers = _grid()
    timer, clock = ManualTimer(), FakeClock()
    client = _Timed(servers, timer)
    registry = CollectorRegistry()
    fanout = FanOut(
        client, config=FanOutConfig(hedge_ratio=0), registry=registry, clock=clock, timer=timer
    )
    await _queries(fanout, servers, timer, 40)
    client.delay["ds-0slow"] = 0.010
    await _queries(fanout, servers, timer, 200)
    slow = fanout.replica(servers[2])
    assert slow is not None
    assert slow.demoted_at is not None
    # Recovered, but answering a tick after its peer: its copy loses the race and comes
    # back while the other shards (3 ms) are still out. That answer is the probe's news.
    client.delay["ds-0slow"] = 0.0015
    client.delay["ds-1"] = client.delay["ds-2"] = 0.003
    clock.advance(1.0)
    sent = client.sent["ds-0slow"]
    await _one(fanout, servers, timer)
    assert client.sent["ds-0slow"] == sent + 1
    assert sample(registry, DEMOTIONS, event="probe") == 1
    assert slow.outstanding == 0
    assert slow.relative < 1.0  # 2 ms against the others' 3
    await _one(fanout, servers, timer)  # judged at the next request to its shard
    assert sample(registry, DEMOTIONS, event="restored") == 1
    assert slow.demoted_at is None


class _Favouring:
    """Round robin over the candidates, but ``favourite`` whenever it is one (a picker
    that walks into the slow replica, so that the test knows where requests go)."""

    def __init__(self) -> None:
        self.favourite: str | None = None
        self._turns: Counter[int] = Counter()

    def pick(self, candidates: Sequence[Replica]) -> Replica:
        for replica in candidates:
            if replica.instance.id == self.favourite:
                return replica
        shard = candidates[0].shard
        self._turns[shard] += 1
        return candidates[self._turns[shard] % len(candidates)]


async def _one(fanout: FanOut, servers: list[ServiceInstance], timer: ManualTimer) -> None:
    task = asyncio.create_task(fanout.search(servers, "q", 10, 100))
    while not task.done():
        await asyncio.sleep(0)  # ok-sleep: one loop turn, on a manual timer
        timer.advance(0.001)
    task.result()


async def test_a_request_out_when_its_replica_is_demoted_is_no_step_towards_ejection() -> None:
    servers = _grid()
    timer, clock = ManualTimer(), FakeClock()
    client = _Timed(servers, timer)
    registry = CollectorRegistry()
    picker = _Favouring()
    fanout = FanOut(
        client,
        config=FanOutConfig(hedge_ratio=0, eject_after=1),
        registry=registry,
        clock=clock,
        timer=timer,
        picker=picker,
    )
    for _ in range(30):
        await _one(fanout, servers, timer)  # all warmed up, in turn
    slow = fanout.replica(servers[2])
    assert slow is not None
    assert slow.relative_samples >= 5
    sent = client.sent["ds-0slow"]
    picker.favourite = "ds-0slow"
    # A query's request to it hangs; the next ones' answer ten times slower than its
    # peers', and demote it while the first is still out.
    client.delay["ds-0slow"] = None
    hung = asyncio.create_task(fanout.search(servers, "q", 10, 100))
    for _ in range(3):
        await asyncio.sleep(0)  # ok-sleep: one loop turn, on a manual timer
    assert client.sent["ds-0slow"] == sent + 1
    client.delay["ds-0slow"] = 0.010
    while slow.demoted_at is None:  # judged at each query's request to its shard
        await _one(fanout, servers, timer)
    assert client.sent["ds-0slow"] <= sent + 4
    # The hung request times out at its deadline: its lateness demoted the replica
    # already; a failure would have ejected it (eject_after=1).
    while not hung.done():
        await asyncio.sleep(0)  # ok-sleep: one loop turn, on a manual timer
        timer.advance(0.001)
    assert hung.result().shards["timed_out"] == 1
    assert (slow.failures, slow.ejected_until) == (0, None)
    # Its probe hangs too: a copy of a query's first request, which its peer answers;
    # the query does not wait for it, and the copy, cancelled when the query ends, is
    # a lower bound, no failure: it stays demoted, not ejected.
    client.delay["ds-0slow"] = None
    sent = client.sent["ds-0slow"]
    clock.advance(1.0)
    started = timer.now
    await _one(fanout, servers, timer)
    assert timer.now - started < 0.010
    assert sample(registry, DEMOTIONS, event="probe") == 1
    assert client.sent["ds-0slow"] == sent + 1
    assert (slow.failures, slow.ejected_until) == (0, None)
    assert slow.demoted_at is not None
    assert slow.outstanding == 0


# -- the search server's flags ------------------------------------------------------------

_FLAGS_ENV = (
    "DISCOVERY_DEMOTE_RATIO",
    "DISCOVERY_DEMOTE_FLOOR_MS",
    "DISCOVERY_DEMOTE_PROBE_INTERVAL",
)


def _search_config(*argv: str) -> SearchServerConfig:
    return SearchServerConfig.from_args(build_parser().parse_args(list(argv)))


def test_the_flags_set_the_search_servers_demotion(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _FLAGS_ENV:  # a developer's shell must not leak in
        monkeypatch.delenv(name, raising=False)
    config = _search_config()
    assert (config.demote_ratio, config.demote_floor_ms, config.demote_probe_interval) == (
        3.0,
        2.0,
        1.0,
    )
    config = _search_config(
        "--demote-ratio", "4", "--demote-floor-ms", "0.5", "--demote-probe-interval", "2"
    )
    assert (config.demote_ratio, config.demote_floor_ms, config.demote_probe_interval) == (
        4.0,
        0.5,
        2.0,
    )
    monkeypatch.setenv("DISCOVERY_DEMOTE_RATIO", "0")
    assert _search_config().demote_ratio == 0.0  # off


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--demote-ratio", "1"),
        ("--demote-ratio", "0.5"),
        ("--demote-ratio", "-3"),
        ("--demote-ratio", "nan"),
        ("--demote-floor-ms", "-1"),
        ("--demote-floor-ms", "inf"),
        ("--demote-probe-interval", "0"),
        ("--demote-probe-interval", "soon"),
    ],
)
def test_a_bad_demotion_flag_is_a_cli_error_naming_it(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        search_server_cli.main([flag, value])
    assert exited.value.code == 2
    assert f"argument {flag}:" in " ".join(capsys.readouterr().err.split())


def test_programmatic_demotion_settings_are_checked() -> None:
    for field, value, flag in (
        ("demote_ratio", 0.9, "--demote-ratio"),
        ("demote_floor_ms", -1.0, "--demote-floor-ms"),
        ("demote_probe_interval", 0.0, "--demote-probe-interval"),
    ):
        with pytest.raises(ConfigError, match=f"^{flag} must be"):
            SearchServerConfig(
                zk=ZkConfig(hosts="127.0.0.1:1"), cluster=ClusterConfig(), **{field: value}
            )
