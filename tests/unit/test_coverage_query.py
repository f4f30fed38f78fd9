"""The coverage policy in a query: when the fan-out stops waiting, and what it charges.

The timer (:class:`ManualTimer`) moves only when the test says, and the client
(:class:`_Held`) answers only when the test says: 20 shards of 1,000 documents each,
one of them slow, and every time (answers, early ends, the deadline) exact.
"""

from __future__ import annotations

import asyncio

import orjson
import pytest
from prometheus_client import CollectorRegistry

from discovery.instance import ServiceInstance
from search_server.coverage import CoveragePolicy
from search_server.fanout import FanOut, FanOutConfig, FanOutResult
from search_server.httpclient import Endpoint, Response
from tests.support import FakeClock, ManualTimer, make_instance, sample, shard_counts

SHARDS = 20
DEADLINE_MS = 1000
# Times in binary fractions of a second, so that sums of them are exact on the timer.
ANSWERED = 1 / 8  # when the quick shards answer
TICK = 1 / 1024


class _Held:
    """A sub-request client whose requests wait until the test answers them."""

    def __init__(self, servers: list[ServiceInstance]) -> None:
        self.shard_of = {i.port: i.payload.shard for i in servers}
        self.pending: dict[int, list[asyncio.Future[Response]]] = {}
        self.sent = 0

    def get(
        self, endpoint: Endpoint, target: bytes, max_body: int | None = None
    ) -> asyncio.Future[Response]:
        future: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        self.pending.setdefault(endpoint.port, []).append(future)
        self.sent += 1
        return future

    def answer(self, port: int) -> None:
        body = {"hits": [{"id": f"d{port}", "score": 1.0}], "shard": self.shard_of[port]}
        for future in self.pending.pop(port, []):
            if not future.done():
                future.set_result((200, orjson.dumps(body)))

    def out(self, port: int) -> list[asyncio.Future[Response]]:
        return self.pending.get(port, [])

    async def aclose(self) -> None:
        pass


class _Samples:
    """An admission limit that keeps what it is told (never limiting)."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, bool]] = []

    @property
    def limit(self) -> int:
        return 1000

    def on_sample(self, now: float, latency: float, in_flight: int, dropped: bool) -> None:
        self.samples.append((latency, dropped))


async def _turns() -> None:
    """Let the loop run the callbacks due (answers arrive in callbacks); no time passes."""
    for _ in range(5):
        await asyncio.sleep(0)  # ok-sleep: loop turns, on a manual timer (no time passes)


class Cluster:
    """20 shards, one replica each, the last one slow, behind a fan-out on a manual timer.

    Ejection after a single failure: one timeout charged as a failure ejects the replica,
    so a replica that is still in after many let-go requests was never charged one.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        coverage: CoveragePolicy | None = None,
        *,
        shards: int = 0,
    ) -> None:
        self.servers = [make_instance(f"ds-{s:02d}", 21_000 + s, shard=s) for s in range(SHARDS)]
        self.slow = self.servers[-1]
        self.client = _Held(self.servers)
        self.timer = ManualTimer()
        self.admission = _Samples()
        self.registry = registry
        self.fanout = FanOut(
            self.client,
            config=FanOutConfig(
                eject_after=1,
                hedge_ratio=0,
                coverage=coverage if coverage is not None else CoveragePolicy(),
                shards=shards,
            ),
            registry=registry,
            clock=FakeClock(),
            timer=self.timer,
            admission=self.admission,
        )

    async def start(self, coverage: CoveragePolicy | None = None) -> asyncio.Task[FanOutResult]:
        """A query sent to every shard, its quick shards answered at :data:`ANSWERED`
        (the slow one still out)."""
        sent = self.client.sent
        search = asyncio.create_task(
            self.fanout.search(self.servers, "a", 10, DEADLINE_MS, coverage=coverage)
        )
        await _turns()
        assert self.client.sent == sent + SHARDS
        self.timer.advance(ANSWERED)
        for server in self.servers[:-1]:
            self.client.answer(server.port)
        await _turns()
        return search

    async def after(self, search: asyncio.Task[FanOutResult], seconds: float) -> bool:
        """Move the timer ``seconds`` on; whether the query has ended by then."""
        self.timer.advance(seconds)
        await _turns()
        return search.done()

    def ended_early(self, rule: str) -> float:
        return sample(self.registry, "search_server_fanout_queries_ended_early_total", rule=rule)


async def test_at_100_percent_the_query_waits_for_its_deadline_as_before(
    registry: CollectorRegistry,
) -> None:
    cluster = Cluster(registry)
    search = await cluster.start()
    assert not await cluster.after(search, 1 - ANSWERED - TICK)
    assert await cluster.after(search, TICK)
    result = search.result()
    assert result.shards == shard_counts(SHARDS, SHARDS - 1, timed_out=1)
    assert result.coverage is not None
    assert result.coverage.degraded == ("deadline",)
    assert result.took_ms == DEADLINE_MS
    # An outlier at the deadline: a failure, and with eject_after=1 its ejection.
    assert cluster.fanout.ejected() == {cluster.slow.id}
    assert cluster.ended_early("adaptive_wait") == cluster.ended_early("soft_timeout") == 0
    # A query that waited for its deadline for one slow server tells nothing of the load.
    assert cluster.admission.samples == []


async def test_the_adaptive_wait_lets_a_slow_shard_go_without_ever_ejecting_it(
    registry: CollectorRegistry,
) -> None:
    cluster = Cluster(registry, CoveragePolicy(0.95, adaptive_wait=1.0))
    for run in range(1, 6):
        search = await cluster.start()
        # 95 % answered 1/8 s in: the slow shard may take 1/8 s more, and no longer.
        assert not await cluster.after(search, ANSWERED - TICK), run
        assert await cluster.after(search, TICK), run
        result = search.result()
        assert result.shards == shard_counts(SHARDS, SHARDS - 1, timed_out=1)
        assert result.partial
        assert result.coverage is not None
        assert result.coverage.degraded == ("adaptive_wait",)
        assert result.coverage.ratio == pytest.approx(0.95)
        assert result.took_ms == 2 * ANSWERED * 1000
        # Its request was cancelled, and counted in no failure: never ejected.
        assert all(future.cancelled() for future in cluster.client.out(cluster.slow.port))
        assert cluster.fanout.ejected() == set(), run
        slow = cluster.fanout.replica(cluster.slow)
        assert slow is not None
        assert (slow.failures, slow.outstanding) == (0, 0)
        assert cluster.ended_early("adaptive_wait") == run
        assert (
            sample(registry, "search_server_fanout_degraded_total", reason="adaptive_wait") == run
        )
    assert sample(registry, "search_server_fanout_shard_requests_total", result="timeout") == 0
    assert sample(registry, "search_server_fanout_degraded_total", reason="deadline") == 0
    # Charged the time it had, as the loser of a hedge is: the picker learns it is slow.
    assert slow is not None
    assert slow.seconds > 0
    # Not an overload (no drop), and a sample of the load up to the coverage, not of
    # the wait the policy chose after it.
    assert cluster.admission.samples == [(ANSWERED, False)] * 5


async def test_the_soft_timeout_fires_at_its_share_once_the_coverage_is_reached(
    registry: CollectorRegistry,
) -> None:
    cluster = Cluster(registry, CoveragePolicy(0.95, soft_timeout=0.5, adaptive_wait=0))
    search = await cluster.start()
    # The coverage reached 1/8 s in; the soft timeout is half the 1 s budget.
    assert not await cluster.after(search, 0.5 - ANSWERED - TICK)
    assert await cluster.after(search, TICK)
    result = search.result()
    assert result.coverage is not None
    assert result.coverage.degraded == ("soft_timeout",)
    assert result.took_ms == 500
    assert cluster.ended_early("soft_timeout") == 1
    assert cluster.fanout.ejected() == set()


async def test_the_soft_timeout_waits_for_the_coverage_then_ends_at_once(
    registry: CollectorRegistry,
) -> None:
    cluster = Cluster(registry, CoveragePolicy(0.95, soft_timeout=0.5, adaptive_wait=0))
    servers, client = cluster.servers, cluster.client
    search = asyncio.create_task(cluster.fanout.search(servers, "a", 10, DEADLINE_MS))
    await _turns()
    cluster.timer.advance(ANSWERED)
    for server in servers[:-2]:  # 18 of 20: 90 %
        client.answer(server.port)
    await _turns()
    # Past the soft timeout, but short of the coverage: still waiting.
    assert not await cluster.after(search, 0.75 - ANSWERED)
    client.answer(servers[-2].port)  # the 19th, 3/4 s in: 95 %
    await _turns()
    assert search.done()
    result = search.result()
    assert result.coverage is not None
    assert result.coverage.degraded == ("soft_timeout",)
    assert result.took_ms == 750


async def test_below_the_minimum_coverage_the_query_waits_for_its_deadline(
    registry: CollectorRegistry,
) -> None:
    # 21 shards expected, shard 20 with no replica: 19 of 21 answering is 90 %.
    cluster = Cluster(registry, CoveragePolicy(0.95, soft_timeout=0.1), shards=SHARDS + 1)
    search = await cluster.start()
    assert not await cluster.after(search, 1 - ANSWERED - TICK)
    assert await cluster.after(search, TICK)
    result = search.result()
    assert result.shards == shard_counts(SHARDS + 1, SHARDS - 1, timed_out=1, missing=1)
    assert result.coverage is not None
    assert result.coverage.degraded == ("no_replica", "deadline")
    assert result.took_ms == DEADLINE_MS
    assert cluster.ended_early("soft_timeout") == cluster.ended_early("adaptive_wait") == 0


async def test_a_query_whose_shards_all_answer_is_complete_whatever_the_policy(
    registry: CollectorRegistry,
) -> None:
    cluster = Cluster(registry, CoveragePolicy(0.95, adaptive_wait=1.0))
    search = await cluster.start()
    # The slow one answers within the wait: nothing is let go.
    cluster.timer.advance(ANSWERED / 2)
    cluster.client.answer(cluster.slow.port)
    await _turns()
    assert search.done()
    result = search.result()
    assert result.shards == shard_counts(SHARDS, SHARDS)
    assert not result.partial
    assert cluster.ended_early("adaptive_wait") == 0
    # Past when the wait would have ended: nothing more happens to the query.
    cluster.timer.advance(1.0)
    await _turns()
    assert cluster.ended_early("adaptive_wait") == 0


async def test_a_querys_own_policy_overrides_the_configured_one(
    registry: CollectorRegistry,
) -> None:
    cluster = Cluster(registry, CoveragePolicy(0.95, adaptive_wait=1.0))
    # This query wants every shard: it waits for its deadline.
    search = await cluster.start(CoveragePolicy())
    assert not await cluster.after(search, 1 - ANSWERED - TICK)
    assert await cluster.after(search, TICK)
    waited = search.result()
    assert waited.coverage is not None
    assert waited.coverage.degraded == ("deadline",)

    off = Cluster(CollectorRegistry())
    # The configuration waits for every shard; this query takes 95 % and a wait of 2 t.
    search = await off.start(CoveragePolicy(0.95, adaptive_wait=2.0))
    assert not await off.after(search, 2 * ANSWERED - TICK)
    assert await off.after(search, TICK)
    result = search.result()
    assert result.coverage is not None
    assert result.coverage.degraded == ("adaptive_wait",)
    assert result.took_ms == 3 * ANSWERED * 1000
