"""The replica-picker seam: the pickers on their own, and the fan-out's choices around
them (warm-up, zones, retries, hedges, weights by reported load) with real data servers
over real HTTP."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from itertools import pairwise

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from data_server.server import DataServer
from discovery.adminauth import admin_headers
from discovery.instance import ServiceInstance
from search_server.fanout import FanOut, FanOutConfig
from search_server.httpclient import HttpClient
from search_server.picking import (
    AdaptiveReplicaSelection,
    PowerOfTwoChoices,
    Replica,
    ReplicaPicker,
    target_key,
)
from search_server.server import SearchServer
from search_server.slowstart import Ramps, SlowStart
from search_server.wrr import WeightedRoundRobin, WrrConfig
from tests.support import (
    DataServerFactory,
    FakeClock,
    SearchServerFactory,
    all_see,
    get_json,
    instance_of,
    make_instance,
    sample,
    shard_counts,
)


@pytest.fixture
async def client() -> AsyncIterator[HttpClient]:
    """The fan-out's sub-request client, closed after the test."""
    async with HttpClient() as sub_client:
        yield sub_client


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def _replica(instance_id: str, port: int = 9001, *, weight: int = 100) -> Replica:
    return Replica.of(make_instance(instance_id, port, weight=weight))


def test_the_pickers_implement_the_protocol() -> None:
    assert isinstance(PowerOfTwoChoices(), ReplicaPicker)
    assert isinstance(AdaptiveReplicaSelection(), ReplicaPicker)
    assert isinstance(WeightedRoundRobin(), ReplicaPicker)


def test_power_of_two_choices_prefers_the_replica_with_fewer_requests_in_flight() -> None:
    busy, idle = _replica("ds-busy", 9001), _replica("ds-idle", 9002)
    picker = PowerOfTwoChoices(random.Random(3))
    busy.outstanding = 3
    # Of two candidates both are sampled, so the idle one always wins.
    assert {picker.pick([busy, idle]).key for _ in range(50)} == {idle.key}
    busy.outstanding = 0
    assert picker.pick([busy]) is busy  # a lone candidate needs no draw
    # Equal load: both get picked (a tie goes to the first of the random pair).
    assert {picker.pick([busy, idle]).key for _ in range(200)} == {busy.key, idle.key}


def test_power_of_two_choices_scales_load_by_weight() -> None:
    heavy, light = _replica("ds-heavy", 9001, weight=300), _replica("ds-light", 9002)
    picker = PowerOfTwoChoices(random.Random(4))
    # (2 + 1) / 300 < (0 + 1) / 100: the heavy replica still wins with two in flight.
    heavy.outstanding = 2
    assert picker.pick([heavy, light]) is heavy
    heavy.outstanding = 3  # (3 + 1) / 300 > 1 / 100
    assert picker.pick([heavy, light]) is light


def test_a_restarted_server_is_a_new_target() -> None:
    before = make_instance("ds-1", 9001)
    moved = make_instance("ds-1", 9002)
    assert target_key(before) != target_key(moved)


def test_ars_ranks_by_response_time_service_time_and_queue() -> None:
    fast, slow = _replica("ds-fast", 9001), _replica("ds-slow", 9002)
    picker = AdaptiveReplicaSelection(decay=0)
    for _ in range(5):
        fast.observe(0.002, 0.001, 0)
        slow.observe(0.010, 0.008, 0)
    assert picker.rank(fast) < picker.rank(slow)
    assert picker.pick([slow, fast]) is fast
    # Requests in flight raise the estimated queue cubically: four outstanding on the
    # fast one make it rank worse than the idle slow one.
    fast.outstanding = 4
    assert picker.pick([slow, fast]) is slow
    # ...and C3's concurrency compensation counts them once per search server.
    fast.outstanding = 1
    assert picker.pick([slow, fast]) is fast
    picker.clients = 5
    assert picker.pick([slow, fast]) is slow


def test_ars_weights_divide_the_rank_and_a_replica_without_samples_ranks_as_a_typical_one() -> None:
    a, b = _replica("ds-a", 9001), _replica("ds-b", 9002, weight=400)
    for _ in range(3):
        a.observe(0.004, 0.002, 0)
        b.observe(0.008, 0.004, 0)
    picker = AdaptiveReplicaSelection(decay=0)
    assert picker.rank(b) < picker.rank(a)  # twice as slow, four times the weight
    # A new replica is no longer first: it ranks with the median statistics of the
    # others (R 6 ms, S 3 ms; idle, so q = 1 and its rank is R), by its own weight.
    fresh = _replica("ds-new", 9003)
    assert picker.prior([a, b, fresh]) == pytest.approx((0.006, 0.003))
    assert picker.rank(fresh, picker.prior([a, b, fresh])) == pytest.approx(0.006 / 100)
    assert picker.pick([a, b, fresh]) is b
    assert picker.pick([fresh, a, b]) is b
    # Four times the weight, a quarter of the rank: it beats b's 8 ms / 400.
    heavy = _replica("ds-new-heavy", 9004, weight=400)
    assert picker.pick([a, b, heavy]) is heavy


def test_ars_ranks_a_replica_that_only_ever_failed_by_what_it_cost_not_first() -> None:
    # A peer that never answers (it trickles, or hangs) has no sample, only penalties:
    # ranking it first again after each ejection cost the shard a hedge or a timeout.
    known = _replica("ds-known", 9001)
    known.observe(0.004, 0.002, 0)
    silent = _replica("ds-silent", 9002)
    silent.penalize(0.5)  # no answer by the query's deadline
    picker = AdaptiveReplicaSelection(decay=0.02)
    assert picker.pick([silent, known]) is known
    fresh = _replica("ds-fresh", 9003)
    # Never tried: ranked like the known one (the prior, from candidates with
    # samples only; the silent one has none), ahead of the silent one, not first.
    prior = picker.prior([silent, known, fresh])
    assert prior == (known.seconds, known.service)
    assert picker.rank(fresh, prior) == pytest.approx(picker.rank(known) / known.discount)
    assert picker.rank(fresh, prior) < picker.rank(silent)
    assert picker.pick([silent, known, fresh]) in (known, fresh)
    # With nothing known of anyone but penalties, the untried one is still first.
    assert picker.pick([silent, fresh]) is fresh
    # Decayed as a loser, the silent one is still tried again after a while.
    assert silent in [picker.pick([silent, known]) for _ in range(400)]


def test_ars_ranks_a_new_replica_with_the_median_of_the_others_statistics() -> None:
    fast, middle, sick = (_replica(f"ds-{i}", 9001 + i) for i in range(3))
    fast.observe(0.001, 0.001, 0)
    middle.observe(0.002, 0.0015, 0)
    sick.observe(0.030, 0.020, 0)  # one sick peer: ten times the others
    fresh = _replica("ds-fresh", 9009)
    picker = AdaptiveReplicaSelection(decay=0)
    candidates = [fast, middle, sick, fresh]
    # The median, not the mean (11 ms): the sick peer does not make a newcomer look
    # slow. It ranks exactly as the middle one does, both idle at the same weight.
    assert picker.prior(candidates) == (0.002, 0.0015)
    assert picker.rank(fresh, picker.prior(candidates)) == picker.rank(middle)
    # Of an even count, the mean of the middle two.
    assert picker.prior([fast, middle, fresh]) == pytest.approx((0.0015, 0.00125))
    # Its own requests in flight count in its queue as anyone's do: two outstanding
    # rank it far behind the idle middle one, where rank 0 ignored them.
    fresh.outstanding = 2
    assert picker.rank(fresh, picker.prior(candidates)) > 20 * picker.rank(middle)
    assert picker.pick(candidates) is fast


def test_ars_ranks_a_replica_without_samples_first_only_when_no_candidate_has_any() -> None:
    first, second = _replica("ds-1", 9001), _replica("ds-2", 9002)
    picker = AdaptiveReplicaSelection(decay=0, rng=random.Random(5))
    assert picker.prior([first, second]) is None
    assert picker.rank(first) == 0.0
    first.outstanding = 3  # nothing known of anyone: as before, outstanding or not
    assert picker.pick([first, second]) is first
    # Among many candidates (two drawn), the same: nothing known, the first drawn wins.
    many = [_replica(f"ds-m{i:02d}", 9100 + i) for i in range(10)]
    assert all(picker.pick(many) in many for _ in range(20))


def _burst(picker: AdaptiveReplicaSelection, replicas: list[Replica], picks: int) -> int:
    """Picks sent at once (no answer in between): how many the last replica got."""
    newcomer = replicas[-1]
    got = 0
    for _ in range(picks):
        chosen = picker.pick(replicas)
        chosen.outstanding += 1
        got += chosen is newcomer
    return got


def test_ars_no_longer_floods_a_new_replica_of_a_small_shard() -> None:
    # Three known replicas and a new one, forty requests before any answer (a burst,
    # or one request from each of forty search servers). With the new one ranked
    # first for lack of samples, all forty went to it; ranked as a typical replica
    # with its own requests in flight, it takes about its share (10), and some.
    for clients in (1, 3):
        known = [_replica(f"ds-known-{i}", 9001 + i) for i in range(3)]
        for replica in known:
            for _ in range(5):
                replica.observe(0.002, 0.0015, 0)
        newcomer = _replica("ds-new", 9009)
        picker = AdaptiveReplicaSelection(clients=clients, rng=random.Random(1))
        got = _burst(picker, [*known, newcomer], 40)
        assert 5 <= got <= 15, (clients, got)
        assert newcomer.samples == 0  # still unknown: only the prior decided


def test_ars_no_longer_favours_a_new_replica_among_many_candidates() -> None:
    # 34 members of a subset, one of them new: two are drawn per pick, and the new
    # one, ranked first, won every draw it was in, whatever it had in flight (about
    # twice its share of a burst: 11 to 28 of 340 over these seeds, fair being 10).
    # Ranked as the other drawn one, with its own requests in flight, it takes its
    # share.
    total = 0
    for seed in range(8):
        rng = random.Random(seed)
        replicas = [_replica(f"ds-{i:02d}", 9000 + i) for i in range(34)]
        for replica in replicas[:-1]:
            for _ in range(5):
                replica.observe(rng.uniform(0.0015, 0.0025), None, 0)
        picker = AdaptiveReplicaSelection(rng=random.Random(seed))
        total += _burst(picker, replicas, 340)
    assert 8 * 10 * 0.6 <= total <= 8 * 10 * 1.4, total


def _ramp_shares(picker: ReplicaPicker, *, in_flight: int, seed: int) -> list[float]:
    """The share of a shard's picks that a replica new at 0 s gets in each quarter of a
    30 s slow start (``Ramps`` refreshed as the fan-out would, on a fake clock that
    advances 0.1 s every ten picks) and in the 10 s after it. Its two peers are known
    (five answers each); all three answer alike, each request ``in_flight - 1`` picks
    after it was sent (1: one at a time)."""
    rng = random.Random(seed)
    peers = [_replica(f"ds-peer-{i}", 9001 + i) for i in range(2)]
    for replica in peers:
        for _ in range(5):
            replica.observe(rng.uniform(0.0015, 0.0025), 0.0015, 0)
    newcomer = _replica("ds-new", 9009)
    ramps = Ramps(SlowStart(window=30.0, aggression=1.0, min_weight=0.1))
    ramps.add(newcomer, 0.0)
    candidates = [*peers, newcomer]
    out: deque[Replica] = deque()
    got, picks = [0] * 5, [0] * 5
    for tick in range(400):
        now = tick * 0.1
        ramps.refresh(now)
        period = min(4, tick // 75)  # 7.5 s each, then the 10 s after the window
        for _ in range(10):
            chosen = picker.pick(candidates)
            chosen.outstanding += 1
            out.append(chosen)
            got[period] += chosen is newcomer
            picks[period] += 1
            if len(out) >= in_flight:
                done = out.popleft()
                done.outstanding -= 1
                done.observe(rng.uniform(0.0015, 0.0025), 0.0015, 0)
    assert len(ramps) == 0
    assert newcomer.weight == newcomer.base_weight
    return [g / n for g, n in zip(got, picks, strict=True)]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_slow_start_ramps_a_new_replicas_share_under_ars(seed: int) -> None:
    # One request at a time: a new replica at a tenth of its weight ranks ten times
    # worse than an equal peer and is tried only once the losers' decay has made up
    # for it (about every 110 picks), then more often as its weight grows. Without
    # slow start it takes its third of the picks from the start.
    shares = _ramp_shares(AdaptiveReplicaSelection(rng=random.Random(seed)), in_flight=1, seed=seed)
    first, *_, fourth, after = shares
    assert 0 < first < 0.06, shares
    assert all(b >= a - 0.01 for a, b in pairwise(shares[:4])), shares  # it grows
    assert fourth > 2 * first, shares
    assert 0.25 < after < 0.42, shares  # its fair third once the window is over


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_slow_start_ramps_a_new_replicas_share_under_power_of_two_choices(seed: int) -> None:
    # Six requests in flight over the shard: the least loaded per unit of weight wins,
    # so the newcomer's share follows its weight up.
    shares = _ramp_shares(PowerOfTwoChoices(random.Random(seed)), in_flight=6, seed=seed)
    first, *_, fourth, after = shares
    assert first < 0.1, shares
    assert all(b >= a - 0.02 for a, b in pairwise(shares[:4])), shares  # it grows
    assert fourth > first + 0.1, shares
    assert 0.25 < after < 0.42, shares


def test_ars_decays_the_losers_so_a_slow_replica_is_tried_again() -> None:
    fast, slow = _replica("ds-fast", 9001), _replica("ds-slow", 9002)
    fast.observe(0.002, 0.002, 0)
    slow.observe(0.050, 0.002, 0)
    picker = AdaptiveReplicaSelection(decay=0.05)
    picks = [picker.pick([fast, slow]) for _ in range(200)]
    assert picks[0] is fast
    assert slow in picks  # its old sample decayed below the fast one's rank


def _spread(rank_all: int) -> list[int]:
    """Picks per place of 100 shards of 34 equally fast replicas, 170 picks each (five
    a replica: a search server's few requests per replica at fleet scale), every
    replica's first answer on a cold connection three times slower. Summed over the
    shards, as ``bench_fleet_scale.py`` sums a place's requests."""
    totals = [0] * 34
    for shard in range(100):
        rng = random.Random(shard)
        replicas = [_replica(f"ds-{i:02d}", 9000 + i) for i in range(34)]
        picker = AdaptiveReplicaSelection(rank_all=rank_all, rng=random.Random(shard))
        for _ in range(170):
            chosen = picker.pick(replicas)
            totals[replicas.index(chosen)] += 1
            cold = 3.0 if chosen.samples == 0 else 1.0
            chosen.observe(rng.uniform(0.0015, 0.0025) * cold, None, 0)
    return totals


def test_ars_spreads_many_equal_candidates_evenly() -> None:
    # A subset's tens of members: the lowest of all their ranks is the luckiest sample
    # (one that missed the cold connection), and kept winning while the others' stale
    # samples decayed (one place of each subset got 9 to 23 times its fair share in
    # bench_fleet_scale.py). Of two drawn at random, no place gets 1.2x its share.
    totals = _spread(rank_all=4)
    fair = sum(totals) / len(totals)
    assert max(totals) / fair < 1.2
    assert min(totals) / fair > 0.8
    # Ranking them all (as with at most ``rank_all`` candidates) does herd.
    herded = _spread(rank_all=34)
    assert max(herded) / fair > 1.4


def test_ars_of_many_candidates_still_keeps_a_slow_one_below_its_share() -> None:
    rng = random.Random(3)
    replicas = [_replica(f"ds-{i:02d}", 9000 + i) for i in range(34)]
    slow = replicas[17]
    picker = AdaptiveReplicaSelection(rng=random.Random(3))
    picks = 0
    for _ in range(3400):
        chosen = picker.pick(replicas)
        picks += chosen is slow
        chosen.observe(rng.uniform(0.0015, 0.0025) * (5 if chosen is slow else 1), None, 0)
    # Its fair share is 100 of 3400; five times slower, it loses every draw against
    # a fast one and is tried only once the decay has made its rank look good.
    assert 0 < picks < 50


def test_ars_ranks_every_one_of_a_few_candidates() -> None:
    fast = [_replica(f"ds-fast-{i}", 9001 + i) for i in range(3)]
    slow = _replica("ds-slow", 9009)
    for replica in fast:
        replica.observe(0.002, 0.002, 0)
    slow.observe(0.010, 0.010, 0)
    # Four candidates (``rank_all``): the slow one is never picked while its rank is
    # the worst, whatever a random draw would have paired it with.
    picker = AdaptiveReplicaSelection(decay=0, rng=random.Random(1))
    assert all(picker.pick([slow, *fast]) is not slow for _ in range(200))


def test_ars_refuses_bad_settings() -> None:
    with pytest.raises(ValueError, match="clients"):
        AdaptiveReplicaSelection(clients=0)
    with pytest.raises(ValueError, match="decay"):
        AdaptiveReplicaSelection(decay=1.0)
    with pytest.raises(ValueError, match="rank_all"):
        AdaptiveReplicaSelection(rank_all=1)


def test_replica_statistics_are_ewmas() -> None:
    replica = _replica("ds-1")
    replica.observe(0.010, None, None)
    assert (replica.seconds, replica.service, replica.samples) == (0.010, 0.010, 1)
    replica.observe(0.020, 0.005, 3)
    assert replica.seconds == pytest.approx(0.013)
    assert replica.service == pytest.approx(0.010 + 0.3 * (0.005 - 0.010))
    assert replica.queue == pytest.approx(0.9)
    replica.penalize(0.001)  # faster than the average: no news
    assert replica.seconds == pytest.approx(0.013)
    replica.penalize(0.300)
    assert replica.seconds == pytest.approx(0.013 + 0.3 * 0.287)


class RecordingPicker:
    """A picker of another kind: always the candidate with the lowest id, recorded."""

    def __init__(self) -> None:
        self.picks: list[str] = []
        self.offered: list[list[str]] = []

    def pick(self, candidates: Sequence[Replica]) -> Replica:
        choice = min(candidates, key=lambda replica: replica.instance.id)
        self.offered.append(sorted(r.instance.id for r in candidates))
        self.picks.append(choice.instance.id)
        return choice


async def _fault(http: aiohttp.ClientSession, server: DataServer, **fault: object) -> None:
    async with http.post(
        f"{server.url}/admin/fault", json=fault, headers=admin_headers()
    ) as response:
        assert response.status == 200, await response.text()


async def test_the_fan_out_routes_with_the_picker_it_is_given(
    make_data_server: DataServerFactory, client: HttpClient
) -> None:
    a0, a1, b0 = await asyncio.gather(
        make_data_server(shard=0, replica=0, instance_id="ds-a0"),
        make_data_server(shard=0, replica=1, instance_id="ds-a1"),
        make_data_server(shard=1, replica=0, instance_id="ds-b0"),
    )
    picker = RecordingPicker()
    assert isinstance(picker, ReplicaPicker)
    fanout = FanOut(client, config=FanOutConfig(hedge_ratio=0), picker=picker)
    assert fanout.picker is picker
    servers = [instance_of(s) for s in (a0, a1, b0)]
    for _ in range(3):
        result = await fanout.search(servers, "probe", 5, 2000)
        assert not result.partial
    # The picker decided every time (ds-a1 never), and the fan-out kept the statistics.
    assert sorted(picker.picks) == ["ds-a0"] * 3 + ["ds-b0"] * 3
    stats = {s.id: fanout.replica(s) for s in servers}
    assert {i: (r.samples, r.outstanding) for i, r in stats.items() if r} == {
        "ds-a0": (3, 0),
        "ds-a1": (0, 0),
        "ds-b0": (3, 0),
    }
    a0_stats = stats["ds-a0"]
    assert a0_stats is not None
    assert a0_stats.seconds > 0
    assert a0_stats.service > 0  # the data server's took_ms


async def test_a_failure_is_retried_and_a_timeout_penalized(
    make_data_server: DataServerFactory, http: aiohttp.ClientSession, client: HttpClient
) -> None:
    first, second = await asyncio.gather(
        make_data_server(shard=0, replica=0, instance_id="ds-0-first"),
        make_data_server(shard=0, replica=1, instance_id="ds-0-second"),
    )
    await _fault(http, first, mode="error", rate=1.0)
    picker = RecordingPicker()
    fanout = FanOut(client, config=FanOutConfig(hedge_ratio=0), picker=picker)
    result = await fanout.search([instance_of(first), instance_of(second)], "probe", 5, 2000)
    assert not result.partial  # the retry on the other replica answered
    assert picker.picks == ["ds-0-first", "ds-0-second"]
    assert picker.offered == [["ds-0-first", "ds-0-second"], ["ds-0-second"]]
    failed = fanout.replica(instance_of(first))
    assert failed is not None
    assert (failed.failures, failed.samples, failed.outstanding) == (1, 0, 0)

    await _fault(http, first, mode="hang")
    fanout = FanOut(client, config=FanOutConfig(hedge_ratio=0), picker=picker)
    result = await fanout.search([instance_of(first)], "probe", 5, 2000)
    assert result.shards["timed_out"] == 1
    hung = fanout.replica(instance_of(first))
    assert hung is not None
    assert (hung.failures, hung.outstanding) == (1, 0)
    # One EWMA step (0.3) towards the time it waited: the query's 2 s less the moment its
    # attempt started after the query did (at 300 ms, 0.0888 was seen on a loaded
    # machine; half the deadline is room no load takes).
    assert hung.seconds >= 0.3 * 2.0 / 2
    await _fault(http, first, mode="none")


async def test_a_new_replica_gets_one_request_at_a_time_until_warmed_up(
    make_data_server: DataServerFactory, http: aiohttp.ClientSession, client: HttpClient
) -> None:
    old, new = await asyncio.gather(
        make_data_server(shard=0, replica=0, instance_id="ds-old"),
        make_data_server(shard=0, replica=1, instance_id="ds-new"),
    )
    for warmup, expected in ((5, (1, 1)), (0, (2, 6))):
        fanout = FanOut(client, config=FanOutConfig(warmup_samples=warmup, hedge_ratio=0))
        for _ in range(5):  # the old one is warmed up
            await fanout.search([instance_of(old)], "probe", 5, 2000)
        await _fault(http, old, mode="slow", delay_ms=200)
        await _fault(http, new, mode="slow", delay_ms=200)
        # Eight queries at once, all sent before any answer. Adaptive selection ranks
        # the sample-less newcomer as a typical replica (the old one's statistics) with
        # its own requests in flight: without the warm-up it takes about half (it used
        # to rank first and take all eight); with it, one.
        servers = [instance_of(old), instance_of(new)]
        results = await asyncio.gather(
            *(fanout.search(servers, "probe", 5, 5000) for _ in range(8))
        )
        assert not any(r.partial for r in results)
        newcomer = fanout.replica(instance_of(new))
        assert newcomer is not None
        assert expected[0] <= newcomer.samples <= expected[1], warmup
        await _fault(http, old, mode="none")
        await _fault(http, new, mode="none")


async def test_replicas_in_the_own_zone_are_preferred_until_none_is_usable(
    make_data_server: DataServerFactory, http: aiohttp.ClientSession, client: HttpClient
) -> None:
    here, there = await asyncio.gather(
        make_data_server(shard=0, replica=0, instance_id="ds-here", zone="z1"),
        make_data_server(shard=0, replica=1, instance_id="ds-there", zone="z2"),
    )
    servers = [instance_of(here), instance_of(there)]
    assert servers[0].zone == "z1"
    fanout = FanOut(client, config=FanOutConfig(zone="z1", hedge_ratio=0))
    for query in ("alpha", "beta", "gamma", "delta", "epsilon", "zeta"):
        assert not (await fanout.search(servers, query, 5, 2000)).partial
    local, remote = (fanout.replica(s) for s in servers)
    assert local is not None
    assert local.samples == 6
    assert remote is None or remote.samples == 0
    # The own zone's replica fails: the other zone's takes over (spill-over).
    await _fault(http, here, mode="error", rate=1.0)
    result = await fanout.search(servers, "eta", 5, 2000)
    assert not result.partial
    remote = fanout.replica(servers[1])
    assert remote is not None
    assert remote.samples == 1
    await _fault(http, here, mode="none")


async def test_a_late_shard_is_hedged_to_another_replica_within_the_budget(
    make_data_server: DataServerFactory,
    http: aiohttp.ClientSession,
    client: HttpClient,
    registry: CollectorRegistry,
) -> None:
    slow, fast = await asyncio.gather(
        make_data_server(shard=0, replica=0, instance_id="ds-a-slow"),
        make_data_server(shard=0, replica=1, instance_id="ds-b-fast"),
    )
    servers = [instance_of(slow), instance_of(fast)]
    fanout = FanOut(
        client, config=FanOutConfig(hedge_ratio=0.05, hedge_burst=10), registry=registry
    )
    await _warm_up(fanout, servers, 40)  # 40 x 0.05 = 2 hedges of budget
    # On a loaded machine an answer of the warm-up may have been late enough to be
    # hedged already: what the budget holds is 2 less those.
    warm = _sample(registry, "hedges_total", result="sent")
    assert warm <= 2
    # From now on ds-a-slow is always tried first: only a hedge reaches ds-b-fast.
    picker = fanout.picker = RecordingPicker()

    await _fault(http, slow, mode="slow", delay_ms=1500)
    result = await fanout.search(servers, "probe", 5, 3000)
    assert not result.partial
    if warm < 2:  # a token is left for it
        assert picker.offered[-1] == ["ds-b-fast"]
        assert _sample(registry, "hedges_total", result="sent") == warm + 1
        # Won: the hedge's answer came first, not the slowed replica's.
        assert _sample(registry, "hedges_total", result="won") >= 1
        slow_stats = fanout.replica(servers[0])
        assert slow_stats is not None
        assert slow_stats.outstanding == 0  # the loser was abandoned

    # More late answers want hedges; the budget (2 + 0.05 a query, 46 queries in all)
    # allows exactly 2 in the whole test, so the rest are waited for.
    await _fault(http, slow, mode="slow", delay_ms=100)
    for _ in range(5):
        result = await fanout.search(servers, "probe", 5, 3000)
        assert not result.partial
    assert _sample(registry, "hedges_total", result="sent") == 2
    # Refused at the p95 and again at doubling intervals while the shard was out: at
    # least once for each late query after the last token went.
    refused = _sample(registry, "hedges_total", result="over_budget")
    assert 4 <= refused <= 6 * 20
    await _fault(http, slow, mode="none")


async def test_a_search_server_routes_with_the_picker_it_is_given(
    make_search_server: SearchServerFactory, make_data_server: DataServerFactory
) -> None:
    await asyncio.gather(
        make_data_server(shard=0, instance_id="ds-p0"),
        make_data_server(shard=1, instance_id="ds-p1"),
    )
    picker = RecordingPicker()
    server = await make_search_server(picker=picker)
    await all_see([server], {"ds-p0", "ds-p1"})
    status, body = await get_json(f"{server.url}/search", q="probe", k="3")
    assert status == 200
    assert body["shards"] == shard_counts(2, 2)
    assert sorted(picker.picks) == ["ds-p0", "ds-p1"]


async def test_a_search_server_with_picker_wrr_weights_by_the_reports(
    make_search_server: SearchServerFactory, make_data_server: DataServerFactory
) -> None:
    data_servers = await asyncio.gather(
        make_data_server(shard=0, replica=0, instance_id="ds-w0"),
        make_data_server(shard=0, replica=1, instance_id="ds-w1"),
    )
    # The fixture's settings (its chroot, its Redis prefix), with --picker wrr.
    first = await make_search_server()
    config = dataclasses.replace(first.config, picker="wrr", wrr=WrrConfig(blackout=0.0))
    server = SearchServer(config)
    await server.start()
    try:
        await all_see([server], {"ds-w0", "ds-w1"})
        assert server.fanout is not None
        picker = server.fanout.picker
        assert isinstance(picker, WeightedRoundRobin)
        assert picker.config is config.wrr
        for _ in range(10):
            status, body = await get_json(f"{server.url}/search", q="probe", k="3")
            assert status == 200
            assert body["shards"] == shard_counts(1, 1)
        for data_server in data_servers:
            replica = server.fanout.replica(instance_of(data_server))
            assert replica is not None
            # Each was sent to (the first two picks alternate, as neither has a weight
            # yet), and its report kept, timed on the fan-out's clock (the picker's too).
            assert replica.sent > 0
            assert replica.load_at is not None
            assert 0 <= time.monotonic() - replica.load_at < 60
            assert replica.load_qps > 0
    finally:
        await server.shutdown()


def _sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return sample(registry, f"search_server_fanout_{name}", **labels)


async def test_no_hedge_to_a_replica_slower_than_the_time_waited(
    make_data_server: DataServerFactory,
    http: aiohttp.ClientSession,
    client: HttpClient,
    registry: CollectorRegistry,
) -> None:
    first, slow, gone = await asyncio.gather(
        make_data_server(shard=0, replica=0, instance_id="ds-a-first"),
        make_data_server(shard=0, replica=1, instance_id="ds-b-slow"),
        make_data_server(shard=0, replica=2, instance_id="ds-c-ejected"),
    )
    servers = [instance_of(first), instance_of(slow), instance_of(gone)]
    fanout = FanOut(client, config=FanOutConfig(hedge_ratio=0.05), registry=registry)
    await _warm_up(fanout, servers, 60)
    fanout.picker = RecordingPicker()
    sent = _sample(registry, "hedges_total", result="sent")
    refused = _sample(registry, "hedges_total", result="over_budget")
    # The fast third replica times the hedge (its p95) but is ejected; the one left
    # usually takes half a second, longer than the request out has waited.
    ejected = fanout.replica(servers[2])
    known_slow = fanout.replica(servers[1])
    assert ejected is not None
    assert known_slow is not None
    assert known_slow.window is not None
    ejected.ejected_until = time.monotonic() + 600
    for _ in range(64):
        known_slow.window.add(0.5)
    await _fault(http, first, mode="slow", delay_ms=300)
    result = await fanout.search(servers, "probe", 5, 3000)
    assert not result.partial
    # It would not beat the request already out: no hedge, and no budget spent.
    assert _sample(registry, "hedges_total", result="sent") == sent
    assert _sample(registry, "hedges_total", result="over_budget") == refused
    await _fault(http, first, mode="none")


async def test_hedges_wait_while_the_whole_query_is_late(
    make_data_server: DataServerFactory,
    http: aiohttp.ClientSession,
    client: HttpClient,
    registry: CollectorRegistry,
) -> None:
    primaries = await asyncio.gather(
        *(make_data_server(shard=s, replica=0, instance_id=f"ds-a-{s}") for s in range(4))
    )
    spares = await asyncio.gather(
        *(make_data_server(shard=s, replica=1, instance_id=f"ds-b-{s}") for s in range(4))
    )
    servers = [instance_of(s) for s in (*primaries, *spares)]
    fanout = FanOut(client, config=FanOutConfig(hedge_ratio=0.05), registry=registry)
    await _warm_up(fanout, servers, 40)  # 40 x 4 x 0.05 = 8 hedges of budget
    fanout.picker = RecordingPicker()  # the ds-a-* replicas first, ds-b-* only as hedges
    before = _sample(registry, "hedges_total", result="sent")

    # Every shard late at once: the query is late, not a shard; hedges would not help.
    # Without the deferral all four would be hedged at their p95 (the budget has eight);
    # with it, none before two have answered, and the others only if they straggle.
    await asyncio.gather(*(_fault(http, p, mode="slow", delay_ms=300) for p in primaries))
    result = await fanout.search(servers, "probe", 5, 3000)
    assert not result.partial
    sent = _sample(registry, "hedges_total", result="sent")
    won = _sample(registry, "hedges_total", result="won")
    assert sent - before <= 2
    assert _sample(registry, "hedges_total", result="over_budget") == 0

    # One straggler among answered shards: hedged. (Slower now, so that no load on the
    # test machine lets it answer before its hedge.)
    await asyncio.gather(
        _fault(http, primaries[0], mode="slow", delay_ms=2000),
        *(_fault(http, p, mode="none") for p in primaries[1:]),
    )
    result = await fanout.search(servers, "probe", 5, 3000)
    assert not result.partial
    # Hedged, and the hedge answered before the straggler.
    assert _sample(registry, "hedges_total", result="sent") == sent + 1
    assert _sample(registry, "hedges_total", result="won") == won + 1
    await _fault(http, primaries[0], mode="none")


class EvenPicker:
    """The candidate sent the fewest requests so far (ties to the lowest id): every
    replica of a shard gets its share of a warm-up, whatever the machine's load.
    (The power of two choices, used before, left one replica of a pair without a
    single answer in 40 queries on a loaded machine.)"""

    def pick(self, candidates: Sequence[Replica]) -> Replica:
        return min(candidates, key=lambda replica: (replica.sent, replica.instance.id))


async def _warm_up(fanout: FanOut, servers: list[ServiceInstance], queries: int) -> None:
    """Queries spread evenly over every replica, until each has the answers behind a
    p95 (16) and the budget has ``queries x shards x 5 %`` tokens."""
    fanout.picker = EvenPicker()
    for _ in range(queries):
        assert not (await fanout.search(servers, "probe", 5, 2000)).partial
    for instance in servers:
        replica = fanout.replica(instance)
        assert replica is not None
        assert replica.window is not None
        assert replica.window.p95 is not None, instance.id


async def test_weighted_round_robin_sends_a_slowed_replica_fewer_requests_after_the_blackout(
    make_data_server: DataServerFactory, http: aiohttp.ClientSession, client: HttpClient
) -> None:
    fast, slowed = await asyncio.gather(
        make_data_server(shard=0, replica=0, instance_id="ds-wrr-fast"),
        make_data_server(shard=0, replica=1, instance_id="ds-wrr-slowed"),
    )
    # The data servers report their load in every answer.
    status, body = await get_json(f"{fast.url}/search", q="probe", k="3")
    assert status == 200
    assert all(type(body[field]) is float for field in ("utilization", "qps", "eps")), body
    servers = [instance_of(fast), instance_of(slowed)]
    clock = FakeClock()  # the fan-out's and the picker's: the blackout passes at will
    picker = WeightedRoundRobin(clock=clock)
    fanout = FanOut(client, config=FanOutConfig(hedge_ratio=0), clock=clock, picker=picker)
    # Slowed 20 times or more (a search here takes a millisecond or less): a sleep
    # inside its admission, which its utilization counts.
    await _fault(http, slowed, mode="slow", delay_ms=20)
    try:
        for _ in range(20):
            result = await fanout.search(servers, "probe", 5, 2000)
            assert not result.partial
        fast_stats, slowed_stats = (fanout.replica(s) for s in servers)
        assert fast_stats is not None
        assert slowed_stats is not None
        # The fan-out kept each one's report, timed on its clock.
        for stats in (fast_stats, slowed_stats):
            assert (stats.load_at, stats.load_since) == (clock.now, clock.now)
            assert stats.load_qps > 0
        assert slowed_stats.load_utilization > fast_stats.load_utilization
        # In the blackout no weight is used: both have the mean, and alternate.
        assert (fast_stats.sent, slowed_stats.sent) == (10, 10)
        clock.advance(11.0)
        before = (fast_stats.sent, slowed_stats.sent)
        for _ in range(200):
            result = await fanout.search(servers, "probe", 5, 2000)
            assert not result.partial
            clock.advance(0.1)  # the weights are computed again every second
        to_fast = fast_stats.sent - before[0]
        to_slowed = slowed_stats.sent - before[1]
        assert to_fast + to_slowed == 200
        # Weighted by one over its time per search, it gets a small share (a twentieth
        # or less); a third of the fast one's is a generous bound.
        assert 3 * to_slowed < to_fast, (to_fast, to_slowed)
    finally:
        await _fault(http, slowed, mode="none")


class RoundRobin:
    """Each shard's candidates in turn: a picker blind to speed and load."""

    def __init__(self) -> None:
        self._turns: dict[int, int] = {}

    def pick(self, candidates: Sequence[Replica]) -> Replica:
        shard = candidates[0].shard
        turn = self._turns[shard] = self._turns.get(shard, -1) + 1
        return candidates[turn % len(candidates)]


async def test_a_replica_much_slower_than_its_peers_is_demoted_from_first_requests(
    make_data_server: DataServerFactory,
    http: aiohttp.ClientSession,
    client: HttpClient,
    registry: CollectorRegistry,
) -> None:
    shard0 = await asyncio.gather(
        *(make_data_server(shard=0, replica=r, instance_id=f"ds-d0-{r}") for r in range(3))
    )
    other = await make_data_server(shard=1, instance_id="ds-d1")
    servers = [instance_of(s) for s in (*shard0, other)]
    # The fan-out's clock stands still: no probe comes due, so every request the slowed
    # replica gets below is a pick, not a probe.
    fanout = FanOut(
        client, config=FanOutConfig(hedge_ratio=0), registry=registry, clock=FakeClock()
    )
    await _warm_up(fanout, servers, 48)  # 16 answers each: its relative slowness known
    # Demotion narrows the candidates before any picker: even one blind to speed, which
    # would send the slowed replica a third of the shard's requests (20 of 60).
    fanout.picker = RoundRobin()
    slowed = fanout.replica(servers[0])
    assert slowed is not None
    sent = slowed.sent
    # Slowed 30 times or more (a search here takes a millisecond or less).
    await _fault(http, shard0[0], mode="slow", delay_ms=30)
    try:
        for _ in range(60):
            assert not (await fanout.search(servers, "probe", 5, 5000)).partial
        # Its turn or two until its first slow answer demoted it, then none.
        assert slowed.sent - sent <= 6, slowed.sent - sent
        assert slowed.demoted_at is not None
        assert _sample(registry, "demotions_total", event="demoted") == 1
        # Demoted, not ejected: no failure counted.
        assert (slowed.failures, slowed.ejected_until) == (0, None)
        assert _sample(registry, "ejections_total") == 0
    finally:
        await _fault(http, shard0[0], mode="none")


async def test_cluster_shows_a_demoted_replica_and_its_relative_slowness(
    make_search_server: SearchServerFactory,
    make_data_server: DataServerFactory,
    http: aiohttp.ClientSession,
) -> None:
    shard0 = await asyncio.gather(
        *(make_data_server(shard=0, replica=r, instance_id=f"ds-c0-{r}") for r in range(2))
    )
    await make_data_server(shard=1, instance_id="ds-c1")
    # A blind round robin: the slowed replica gets every other request until demoted.
    server = await make_search_server(picker=RoundRobin(), hedge_percent=0.0)
    await all_see([server], {"ds-c0-0", "ds-c0-1", "ds-c1"})

    async def search() -> None:
        status, body = await get_json(f"{server.url}/search", q="probe", k="5")
        assert status == 200, body
        assert body["partial"] is False, body

    def entries() -> dict[str, dict[str, object]]:
        return {s["id"]: s for s in server.cluster_view()["servers"]}

    for _ in range(24):  # 12 answers from each of shard 0's replicas
        await search()
    assert {e["demoted"] for e in entries().values()} == {False}
    assert all(isinstance(e["relative_slowness"], float) for e in entries().values())
    await _fault(http, shard0[0], mode="slow", delay_ms=30)
    try:
        for _ in range(20):
            await search()
            if entries()["ds-c0-0"]["demoted"]:
                break
        _, body = await get_json(f"{server.url}/cluster")
        listed = {s["id"]: s for s in body["servers"]}
        assert listed["ds-c0-0"]["demoted"] is True
        assert listed["ds-c0-0"]["relative_slowness"] > 3
        assert listed["ds-c0-0"]["ejected"] is False  # demoted, not ejected
        assert (listed["ds-c0-1"]["demoted"], listed["ds-c1"]["demoted"]) == (False, False)
    finally:
        await _fault(http, shard0[0], mode="none")
