"""Overload is not failure: the fan-out's guards against turning load into ejections.

The data servers here are scripted at the sub-request client (:class:`_Scripted`): each
port answers at once, answers "overloaded" or never answers, as the test says, so that
each rule is seen alone and deterministically. Real data servers refusing for real are
in ``test_data_server_overload.py`` and the end-to-end figures in
``bench/bench_overload.py``.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import orjson
import pytest
from prometheus_client import CollectorRegistry

from discovery.errors import OverloadedError
from discovery.instance import ServiceInstance
from discovery.looplag import LoopLagMonitor
from search_server.admission import FixedLimit, GradientLimit
from search_server.fanout import FanOut, FanOutConfig
from search_server.httpclient import Endpoint, Response
from search_server.picking import EWMA_ALPHA
from tests.support import FakeClock, ManualTimer, eventually, make_instance, sample, shard_counts

OK = "ok"
FULL = "full"  # 429 at once
HANG = "hang"  # no answer until the request is abandoned
FAIL = "fail"  # 500 at once (a data server broken, or an address where none answers)


class _Scripted:
    """A sub-request client whose answers each test scripts by port: ``OK`` (a valid
    answer for the port's shard, at once), ``FULL`` (429), ``FAIL`` (500) or ``HANG``.
    Counts the requests per port."""

    def __init__(self, shard_of: dict[int, int]) -> None:
        self.shard_of = shard_of
        self.behaviour: dict[int, str] = dict.fromkeys(shard_of, OK)
        self.sent: Counter[int] = Counter()
        # Seconds an OK answer takes (0: at once), and the search time it reports.
        self.delay = 0.0
        self.took_ms = 0.1
        # Given one, an OK answer's delay passes on it (at once, in no real time).
        self.timer: ManualTimer | None = None

    def get(
        self, endpoint: Endpoint, target: bytes, max_body: int | None = None
    ) -> asyncio.Future[Response]:
        port = endpoint.port
        self.sent[port] += 1
        future: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        behaviour = self.behaviour[port]
        if behaviour == OK:
            hits = [{"id": f"d{port}", "score": 1.0}]
            body = {"hits": hits, "shard": self.shard_of[port], "took_ms": self.took_ms}
            answer = (200, orjson.dumps(body))
            if self.delay and self.timer is not None:
                self.timer.advance(self.delay)
                future.set_result(answer)
            elif self.delay:
                asyncio.get_running_loop().call_later(
                    self.delay, lambda: future.done() or future.set_result(answer)
                )
            else:
                future.set_result(answer)
        elif behaviour == FULL:
            future.set_result((429, b'{"error":"overloaded"}'))
        elif behaviour == FAIL:
            future.set_result((500, b'{"error":"broken"}'))
        return future  # HANG: never resolved; the fan-out cancels it at the deadline

    async def aclose(self) -> None:
        pass


def _cluster(shards: int, replicas: int) -> tuple[list[ServiceInstance], _Scripted]:
    servers = [
        make_instance(f"ds-{s}-{r}", 20_000 + 10 * s + r, shard=s, replica=r)
        for s in range(shards)
        for r in range(replicas)
    ]
    return servers, _Scripted({i.port: i.payload.shard for i in servers})


def _ejecting_at_once(client: _Scripted, registry: CollectorRegistry, clock: FakeClock) -> FanOut:
    """A fan-out that ejects a replica at its first failure, with no hedges: each rule
    about what counts as a failure is seen alone. Its stall grace is a minute, so
    that a test loop woken late on a loaded machine is not read as a stall."""
    return FanOut(
        client,
        config=FanOutConfig(eject_after=1, hedge_ratio=0, stall_grace=60.0),
        registry=registry,
        clock=clock,
    )


def _sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return sample(registry, f"search_server_fanout_{name}", **labels)


async def test_overload_refusals_never_eject_and_the_shard_is_answered_by_another_replica(
    registry: CollectorRegistry,
) -> None:
    servers, client = _cluster(shards=1, replicas=2)
    full, other = servers[0].port, servers[1].port
    client.behaviour[full] = FULL
    clock = FakeClock()
    # One failure would eject: only the refusals' being no failure keeps it in.
    fanout = _ejecting_at_once(client, registry, clock)

    for _ in range(20):
        result = await fanout.search(servers, "a", 10, 500)
        assert result.shards == shard_counts(1, 1)
        clock.advance(0.05)

    assert fanout.ejected() == set()
    replica = fanout.replica(servers[0])
    assert replica is not None
    assert replica.failures == 0
    assert _sample(registry, "ejections_total") == 0
    refusals = _sample(registry, "shard_requests_total", result="overload")
    assert refusals == client.sent[full] >= 1
    assert _sample(registry, "shard_requests_total", result="error") == 0
    # After a refusal it gets no first request for the backoff (0.5 s = 10 queries here):
    # 20 queries over 1 s asked it at most about twice, the other replica took the rest.
    assert client.sent[full] <= 3
    assert client.sent[other] == 20


async def test_a_shard_whose_replicas_all_refuse_is_not_retried_round_them(
    registry: CollectorRegistry,
) -> None:
    servers, client = _cluster(shards=1, replicas=3)
    for instance in servers:
        client.behaviour[instance.port] = FULL
    fanout = _ejecting_at_once(client, registry, FakeClock())

    first = await fanout.search(servers, "a", 10, 500)
    # The first query tries each replica once (each refusal sends the retry elsewhere).
    assert first.shards == shard_counts(1, 0, failed=1)
    assert first.coverage is not None
    assert first.coverage.degraded == ("overload",)
    assert sum(client.sent.values()) == 3

    # Then, every replica refused within the backoff: one request a query, no retry
    # (a retry would only add to the overload), and still no ejection.
    for _ in range(5):
        result = await fanout.search(servers, "a", 10, 500)
        assert result.shards == shard_counts(1, 0, failed=1)
    assert sum(client.sent.values()) == 3 + 5
    assert fanout.ejected() == set()


async def test_a_late_replica_is_blamed_only_when_the_rest_of_the_query_was_on_time(
    registry: CollectorRegistry,
) -> None:
    servers, client = _cluster(shards=4, replicas=1)
    clock = FakeClock()
    fanout = _ejecting_at_once(client, registry, clock)

    # Three of four shards late: the whole query was late (a busy machine), no one's
    # fault. Reported timed out, charged to no replica.
    for instance in servers[:3]:
        client.behaviour[instance.port] = HANG
    result = await fanout.search(servers, "a", 10, 100)
    assert result.shards == shard_counts(4, 1, timed_out=3)
    assert fanout.ejected() == set()
    assert _sample(registry, "unblamed_timeouts_total", why="systemic") == 3

    # One of four late while the others answered: an outlier, charged and ejected (a
    # second later: within it, three late replicas were widespread lateness, see below).
    for instance in servers[1:3]:
        client.behaviour[instance.port] = OK
    clock.advance(1.01)
    result = await fanout.search(servers, "a", 10, 100)
    assert result.shards == shard_counts(4, 3, timed_out=1)
    assert fanout.ejected() == {servers[0].id}
    assert _sample(registry, "shard_requests_total", result="timeout") == 4


async def test_late_replicas_spread_over_many_queries_are_not_blamed_within_a_second(
    registry: CollectorRegistry,
) -> None:
    # A machine short of CPU: each query has one shard late, a different one each
    # time. Every query alone looks like one outlier; together they are not.
    servers, client = _cluster(shards=20, replicas=2)
    clock = FakeClock()
    fanout = _ejecting_at_once(client, registry, clock)
    # More than a tenth of the 40 routable replicas timed out within 1 s: widespread.
    threshold = 4

    def late(shard: int) -> None:
        for instance in servers:
            client.behaviour[instance.port] = HANG if instance.payload.shard == shard else OK

    for shard in range(8):
        late(shard)
        result = await fanout.search(servers, "a", 10, 50)
        assert result.shards == shard_counts(20, 19, timed_out=1)
        clock.advance(0.1)
    # The first four were outliers (charged, ejected at their first timeout); from the
    # fifth replica late within the second on, none is a step towards ejection...
    assert _sample(registry, "ejections_total") == threshold
    assert _sample(registry, "unblamed_timeouts_total", why="widespread") == 8 - threshold

    # ... but each still counts in its replica's latency, for the pickers to route
    # around (a slow replica among shards that answered is slow, whatever the cause).
    def slowest(shard: int) -> float:
        replicas = [fanout.replica(i) for i in servers if i.payload.shard == shard]
        return max(r.seconds for r in replicas if r is not None)

    # Counted, a timeout at the 50 ms deadline moves the replica's EWMA a weight's
    # share of the way there (half of it allowed for the attempt starting after the
    # query): a bound no slower loop can miss, where "ten times an on-time replica's"
    # missed once on a loaded machine (an on-time answer took 2 ms).
    on_time = slowest(15)
    for shard in range(threshold, 8):
        assert slowest(shard) >= EWMA_ALPHA * 0.050 / 2
        assert slowest(shard) > on_time

    # A second on, one replica late alone is an outlier again.
    clock.advance(1.0)
    late(10)
    await fanout.search(servers, "a", 10, 50)
    assert _sample(registry, "ejections_total") == threshold + 1
    assert _sample(registry, "unblamed_timeouts_total", why="widespread") == 8 - threshold


async def test_a_timeout_while_the_search_servers_own_loop_lagged_blames_no_replica(
    registry: CollectorRegistry,
) -> None:
    servers, client = _cluster(shards=4, replicas=1)
    client.behaviour[servers[0].port] = HANG
    async with LoopLagMonitor(interval=0.01, threshold=0.05) as lag:
        fanout = FanOut(
            client,
            config=FanOutConfig(
                eject_after=1,
                hedge_ratio=0,
                stall_grace=60.0,  # the lag rule alone, whenever this loop wakes
            ),
            registry=registry,
            loop_lag=lag,
        )
        # The loop blocked for 0.2 s during the query, well inside its 0.5 s deadline
        # (so the stall rule, a wake-up late past the deadline, does not apply).
        asyncio.get_running_loop().call_later(0.05, time.sleep, 0.2)  # ok-sleep: the fault
        result = await fanout.search(servers, "a", 10, 500)
        assert result.shards == shard_counts(4, 3, timed_out=1)
        assert _sample(registry, "unblamed_timeouts_total", why="lag") == 1
        assert fanout.ejected() == set()

        # The same outlier with the loop on time is charged.
        # On a loaded machine this loop may lag again during the query; then it is
        # not charged either, for that reason only, and the query is tried again.
        for _ in range(10):
            await eventually(
                lambda: not lag.lagged_since(asyncio.get_running_loop().time() - 0.01),
                message="the loop on time again",
            )
            lagged = _sample(registry, "unblamed_timeouts_total", why="lag")
            await fanout.search(servers, "a", 10, 300)
            if fanout.ejected():
                break
            assert _sample(registry, "unblamed_timeouts_total", why="lag") == lagged + 1
        assert fanout.ejected() == {servers[0].id}


async def test_a_shard_with_most_replicas_ejected_routes_to_all_of_them_in_panic(
    registry: CollectorRegistry,
) -> None:
    servers, client = _cluster(shards=2, replicas=2)
    shard0 = [i for i in servers if i.payload.shard == 0]
    for instance in shard0:
        client.behaviour[instance.port] = HANG
    clock = FakeClock()
    fanout = FanOut(
        client,
        config=FanOutConfig(
            eject_after=1,
            max_ejected_share=1.0,
            eject_cooldown=600,
            probe_interval=600,
            hedge_ratio=0,
            stall_grace=60.0,  # a test loop woken late is no stall here
        ),
        registry=registry,
        clock=clock,
    )
    # Shard 0's two replicas time out in turn (the other shard on time: blamed) and are
    # both ejected.
    for _ in range(2):
        await fanout.search(servers, "a", 10, 100)
    assert fanout.ejected() == {i.id for i in shard0}

    # Now they answer again. No probe is due for ten minutes; in panic (0 of 2 left
    # un-ejected, below half) the shard is routed to them all the same, and an answer
    # ends an ejection.
    for instance in shard0:
        client.behaviour[instance.port] = OK
    result = await fanout.search(servers, "a", 10, 500)
    assert result.shards == shard_counts(2, 2)
    assert _sample(registry, "panic_total", scope="shard") == 1
    assert len(fanout.ejected()) == 1


async def test_without_a_panic_threshold_an_ejected_shard_waits_for_its_probe(
    registry: CollectorRegistry,
) -> None:
    """The previous test's contrast: with the threshold at 0 the shard fails at once
    until a half-open probe is due."""
    servers, client = _cluster(shards=2, replicas=2)
    shard0 = [i for i in servers if i.payload.shard == 0]
    for instance in shard0:
        client.behaviour[instance.port] = HANG
    fanout = FanOut(
        client,
        config=FanOutConfig(
            eject_after=1,
            max_ejected_share=1.0,
            eject_cooldown=600,
            probe_interval=600,
            hedge_ratio=0,
            panic_threshold=0,
            stall_grace=60.0,
        ),
        registry=registry,
        clock=FakeClock(),
    )
    for _ in range(2):
        await fanout.search(servers, "a", 10, 100)
    for instance in shard0:
        client.behaviour[instance.port] = OK
    result = await fanout.search(servers, "a", 10, 500)
    assert result.shards == shard_counts(2, 1, failed=1)
    assert _sample(registry, "panic_total", scope="shard") == 0


async def test_the_ejection_cap_counts_as_the_clusters_panic(
    registry: CollectorRegistry,
) -> None:
    servers, client = _cluster(shards=4, replicas=1)
    clock = FakeClock()
    fanout = FanOut(
        client,
        config=FanOutConfig(
            eject_after=1,
            max_ejected_share=0.5,
            probe_interval=60,  # no half-open probe ends an ejection meanwhile
            stall_grace=60.0,
        ),
        registry=registry,
        clock=clock,
    )
    # One outlier per query, a different one each time: two are ejected, then the cap.
    # A second apart (within their 10 s ejections): closer, three late replicas among
    # four would be widespread lateness, charged to none.
    for instance in servers:
        client.behaviour = dict.fromkeys(client.shard_of, OK)
        client.behaviour[instance.port] = HANG
        await fanout.search(servers, "a", 10, 100)
        clock.advance(1.01)
    assert len(fanout.ejected()) == 2
    assert _sample(registry, "panic_total", scope="cluster") == 2


async def test_fake_registrations_that_never_answer_leave_the_cap_to_real_replicas(
    registry: CollectorRegistry,
) -> None:
    # Twenty registrations at addresses where nothing answers, beside four real data
    # servers. They fail and are ejected, but the cap's base is the four replicas that
    # have answered, and the fakes take no place under it: a real replica that breaks
    # is still ejected, and the cap still holds for the real ones.
    real, client = _cluster(shards=4, replicas=1)
    fakes = [make_instance(f"fake-{i}", 30_000 + i, shard=4 + i) for i in range(20)]
    for instance in fakes:
        client.shard_of[instance.port] = instance.payload.shard
        client.behaviour[instance.port] = FAIL
    servers = real + fakes
    clock = FakeClock()
    fanout = FanOut(
        client,
        config=FanOutConfig(
            eject_after=1,
            max_ejected_share=0.5,
            hedge_ratio=0,
            probe_interval=60,  # no half-open probe ends an ejection meanwhile
            stall_grace=60.0,
        ),
        registry=registry,
        clock=clock,
    )
    result = await fanout.search(servers, "a", 10, 500)
    assert result.shards == shard_counts(24, 4, failed=20)
    assert fanout.ejected() == {f.id for f in fakes}

    broken = real[0]
    client.behaviour[broken.port] = FAIL
    clock.advance(1.01)
    await fanout.search(servers, "a", 10, 500)
    assert broken.id in fanout.ejected()

    # Half of the four that have answered may go, no more.
    for instance in real[1:]:
        client.behaviour[instance.port] = FAIL
    clock.advance(1.01)
    await fanout.search(servers, "a", 10, 500)
    assert len(fanout.ejected() & {i.id for i in real}) == 2
    assert _sample(registry, "ejections_total") == 22
    assert _sample(registry, "panic_total", scope="cluster") == 2


@pytest.mark.parametrize("lagging", [False, True])
async def test_no_hedge_while_the_search_servers_own_loop_lags(
    registry: CollectorRegistry, lagging: bool
) -> None:
    servers, client = _cluster(shards=1, replicas=2)
    slow = servers[0]
    lag = LoopLagMonitor(threshold=0.05)  # fed by hand below, not started
    fanout = FanOut(
        client,
        config=FanOutConfig(hedge_ratio=1.0, hedge_burst=10),
        registry=registry,
        loop_lag=lag,
        picker=_Only(slow.id),
    )
    # Enough answers for a latency window (the p95 the hedge waits for).
    for _ in range(40):
        await fanout.search(servers, "a", 10, 500)
    client.behaviour[slow.port] = HANG
    if lagging:
        # The loop fell behind while the request was out: its answer may be in the
        # socket, unread; a hedge would only add load.
        # Runs once the query has sent its request, before its hedge timer is due.
        loop = asyncio.get_running_loop()
        loop.call_soon(lambda: lag.observe(due=0.0, now=loop.time()))
    sent = client.sent[servers[1].port]
    result = await fanout.search(servers, "a", 10, 300)
    hedged = client.sent[servers[1].port] - sent
    if lagging:
        assert hedged == 0
        assert result.shards == shard_counts(1, 0, timed_out=1)
        assert _sample(registry, "hedges_total", result="own_lag") == 1
    else:
        assert hedged == 1
        assert result.shards == shard_counts(1, 1)


class _First:
    """Picks each shard's replica 0 whenever it is a candidate."""

    def pick(self, candidates: list) -> object:  # type: ignore[type-arg]
        return next((r for r in candidates if r.instance.payload.replica == 0), candidates[0])


@pytest.mark.parametrize("late", [1, 2, 6])
async def test_no_hedge_when_more_shards_are_late_than_outliers_make(
    registry: CollectorRegistry, late: int
) -> None:
    """One or two shards late of twenty are stragglers, worth a hedge each; six late at
    once (more than two and a tenth) are everyone's slowness, which hedges would add
    to: the rule that blames no replica for such timeouts keeps the hedges home too."""
    servers, client = _cluster(shards=20, replicas=2)
    fanout = FanOut(
        client,
        config=FanOutConfig(hedge_ratio=1.0, hedge_burst=100),
        registry=registry,
        picker=_First(),
    )
    for _ in range(40):  # latency windows: hedges are due soon after a send
        await fanout.search(servers, "a", 10, 500)
    primaries = [i for i in servers if i.payload.replica == 0]
    for instance in primaries[:late]:
        client.behaviour[instance.port] = HANG
    others = [i.port for i in servers if i.payload.replica == 1]
    sent = sum(client.sent[port] for port in others)
    result = await fanout.search(servers, "a", 10, 300)
    hedged = sum(client.sent[port] for port in others) - sent
    if late <= 2:
        assert hedged == late
        assert result.shards == shard_counts(20, 20)
        assert _sample(registry, "hedges_total", result="systemic") == 0
    else:
        assert hedged == 0
        assert result.shards == shard_counts(20, 20 - late, timed_out=late)
        assert _sample(registry, "hedges_total", result="systemic") == late


class _Only:
    """Picks the replica of the given instance id whenever it is a candidate."""

    def __init__(self, instance_id: str) -> None:
        self._id = instance_id

    def pick(self, candidates: list) -> object:  # type: ignore[type-arg]
        return next((r for r in candidates if r.instance.id == self._id), candidates[0])


async def test_queries_late_for_their_deadline_lower_the_admission_limit(
    registry: CollectorRegistry,
) -> None:
    servers, client = _cluster(shards=4, replicas=1)
    # A limit that binds with one query in flight (2 x 1 >= 2).
    limit = GradientLimit(initial=2, min_limit=1, backoff=0.5, backoff_interval=0)
    fanout = FanOut(
        client, config=FanOutConfig(hedge_ratio=0, shards=5), registry=registry, admission=limit
    )
    assert sample(registry, "search_server_admission_limit") == 2
    # Shard 4 has no replica at all: partial, but not for want of capacity.
    result = await fanout.search(servers, "a", 10, 200)
    assert result.coverage is not None
    assert result.coverage.degraded == ("no_replica",)
    # One shard late of four: one bad server's, which no limit would cure.
    client.behaviour[servers[0].port] = HANG
    result = await fanout.search(servers, "a", 10, 50)
    assert result.shards["timed_out"] == 1
    assert limit.limit == 2
    # Two of four late: the system was too slow for the limit, which halves.
    client.behaviour[servers[1].port] = HANG
    result = await fanout.search(servers, "a", 10, 50)
    assert result.shards["timed_out"] == 2
    assert limit.limit == 1
    assert sample(registry, "search_server_admission_limit") == 1


async def test_no_hedge_while_the_search_server_is_shedding(registry: CollectorRegistry) -> None:
    servers, client = _cluster(shards=1, replicas=2)
    slow = servers[0]
    client.delay = 0.02
    fanout = FanOut(
        client,
        config=FanOutConfig(hedge_ratio=1.0, hedge_burst=10),
        registry=registry,
        admission=FixedLimit(1),
        picker=_Only(slow.id),
    )
    for _ in range(40):  # a latency window: hedges are due about 20 ms after a send
        await fanout.search(servers, "a", 10, 500)
    client.behaviour[slow.port] = HANG
    hedged = client.sent[servers[1].port]  # the priming's own hedges, if any
    shedding = sample(registry, "search_server_fanout_hedges_total", result="shedding")
    first = asyncio.create_task(fanout.search(servers, "a", 10, 300))
    await asyncio.sleep(0)  # ok-sleep: one turn; the first query in flight, no hedge due
    with pytest.raises(OverloadedError):
        await fanout.search(servers, "a", 10, 300)
    result = await first
    assert result.shards == shard_counts(1, 0, timed_out=1)
    assert client.sent[servers[1].port] == hedged
    assert _sample(registry, "hedges_total", result="shedding") == shedding + 1


@pytest.mark.parametrize("searching", [True, False])
async def test_an_expensive_querys_own_search_time_does_not_lower_the_limit(
    registry: CollectorRegistry, searching: bool
) -> None:
    """A query slow by its own cost (the data servers report they searched that long) is
    not queueing: a storm of them must not refuse everyone's ordinary queries. The same
    latency spent waiting (a data server reporting a short search) lowers the limit."""
    servers, client = _cluster(shards=1, replicas=1)
    # Each answer takes exactly 50 ms of the fan-out's time, whatever the machine's load.
    client.timer = ManualTimer()
    client.delay = 0.05
    client.took_ms = 50.0 if searching else 0.1
    # One update per query; 10 ms of queueing is the most the limit accepts.
    limit = GradientLimit(initial=2, min_limit=1, ceiling=0.01, window=1e-9, min_window_samples=1)
    fanout = FanOut(
        client,
        config=FanOutConfig(hedge_ratio=0),
        registry=registry,
        admission=limit,
        timer=client.timer,
    )
    for _ in range(5):
        await fanout.search(servers, "a", 10, 500)
    assert (limit.limit >= 2) is searching


async def test_a_few_late_shards_are_not_a_sample_of_the_load(
    registry: CollectorRegistry,
) -> None:
    """A query that waited for its deadline because one shard of four was late says
    nothing of the queue (no limit cures one slow server); two of four late do."""
    servers, client = _cluster(shards=4, replicas=1)
    # An update per query after the first; any latency over 10 ms would lower the
    # limit. No backoff.
    limit = GradientLimit(
        initial=4, min_limit=1, ceiling=0.01, window=1e-9, min_window_samples=1, backoff=1.0
    )
    fanout = FanOut(client, config=FanOutConfig(hedge_ratio=0), registry=registry, admission=limit)
    client.behaviour[servers[0].port] = HANG
    for _ in range(3):
        result = await fanout.search(servers, "a", 10, 50)
        assert result.shards["timed_out"] == 1
    assert limit.limit == 4
    # (The first server, late three times while the rest was on time, is ejected by
    # now: its shard is failed at once.)
    client.behaviour[servers[1].port] = HANG
    client.behaviour[servers[2].port] = HANG
    result = await fanout.search(servers, "a", 10, 50)
    assert result.shards["timed_out"] == 2
    await fanout.search(servers, "a", 10, 50)  # a window is two samples
    assert limit.limit < 4
