"""A query's deadline and hedges run on the timer the fan-out is given.

The timer here (:class:`ManualTimer`) moves only when the test says, and the client
(:class:`_Held`) answers only when the test says: what a query does at its deadline or
when a hedge is due is seen at exact times, with no wall-clock wait.
"""

from __future__ import annotations

import asyncio

import orjson
from prometheus_client import CollectorRegistry

from discovery.instance import ServiceInstance
from search_server.fanout import FanOut, FanOutConfig
from search_server.httpclient import Endpoint, Response
from search_server.retrybudget import RetryBudget
from tests.support import FakeClock, ManualTimer, make_instance, sample, shard_counts


class _Held:
    """A sub-request client whose requests wait until the test answers them
    (:meth:`answer`); every request's port and target are kept in ``sent``."""

    def __init__(self, servers: list[ServiceInstance]) -> None:
        self.shard_of = {i.port: i.payload.shard for i in servers}
        self.sent: list[tuple[int, bytes]] = []
        self.pending: dict[int, list[asyncio.Future[Response]]] = {}

    def get(
        self, endpoint: Endpoint, target: bytes, max_body: int | None = None
    ) -> asyncio.Future[Response]:
        future: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        self.sent.append((endpoint.port, target))
        self.pending.setdefault(endpoint.port, []).append(future)
        return future

    def answer(self, port: int) -> None:
        """Answer the requests out to ``port`` (those not cancelled) with a hit."""
        body = {"hits": [{"id": f"d{port}", "score": 1.0}], "shard": self.shard_of[port]}
        for future in self.pending.pop(port, []):
            if not future.done():
                future.set_result((200, orjson.dumps(body)))

    async def aclose(self) -> None:
        pass


async def _sent(client: _Held, count: int) -> None:
    """Let the loop run until ``count`` requests are out (no timer moves meanwhile)."""
    for _ in range(100):
        if len(client.sent) >= count:
            return
        await asyncio.sleep(0)  # ok-sleep: one loop turn, on a manual timer (no time passes)
    raise AssertionError(f"{len(client.sent)} requests sent, expected {count}")


class _Only:
    """Picks the replica of the given instance id whenever it is a candidate."""

    def __init__(self, instance_id: str) -> None:
        self._id = instance_id

    def pick(self, candidates: list) -> object:  # type: ignore[type-arg]
        return next((r for r in candidates if r.instance.id == self._id), candidates[0])


def _hedging(
    client: _Held, registry: CollectorRegistry, timer: ManualTimer, primary: str
) -> FanOut:
    """A fan-out on ``timer`` that sends each shard's first request to ``primary`` when
    it can, and may hedge every request (budgets of 100 %)."""
    return FanOut(
        client,
        config=FanOutConfig(hedge_ratio=1.0, hedge_burst=10),
        registry=registry,
        clock=FakeClock(),
        timer=timer,
        picker=_Only(primary),
        retry_budget=RetryBudget(1.0, 10.0, clock=FakeClock()),
    )


async def test_a_query_ends_at_its_deadline_on_its_timer(registry: CollectorRegistry) -> None:
    servers = [make_instance(f"ds-{s}", 20_000 + s, shard=s) for s in range(4)]
    client = _Held(servers)
    timer = ManualTimer()
    fanout = FanOut(
        client,
        config=FanOutConfig(eject_after=1, hedge_ratio=0),
        registry=registry,
        clock=FakeClock(),
        timer=timer,
    )
    search = asyncio.create_task(fanout.search(servers, "a", 10, 60_000))
    await _sent(client, 4)
    # Each request carries the whole deadline: no time has passed on the timer.
    assert {target.rsplit(b"=", 1)[1] for _, target in client.sent} == {b"60000"}
    for server in servers[1:]:
        client.answer(server.port)
    timer.advance(59.5)
    await asyncio.sleep(0)  # ok-sleep: one loop turn, on a manual timer (no time passes)
    assert not search.done()  # ds-0 is still out, its deadline not reached
    timer.advance(0.5)
    result = await asyncio.wait_for(search, 5)
    assert result.shards == shard_counts(4, 3, timed_out=1)
    assert result.took_ms == 60_000
    # Woken on time, and an outlier among shards that answered: charged in full.
    assert fanout.ejected() == {"ds-0"}


async def test_a_hedge_goes_out_when_its_timer_says_it_is_due(
    registry: CollectorRegistry,
) -> None:
    servers = [make_instance(f"ds-{r}", 20_000 + r, shard=0, replica=r) for r in range(2)]
    primary, other = servers
    client = _Held(servers)
    timer = ManualTimer()
    fanout = _hedging(client, registry, timer, primary.id)
    # 16 answers of 1/64 s each: the primary's latency window (its p95, when a hedge
    # is due), and no hedge before it exists.
    answer_in = 1 / 64
    for _ in range(16):
        search = asyncio.create_task(fanout.search(servers, "a", 10, 1000))
        await _sent(client, len(client.sent) + 1)
        timer.advance(answer_in)
        client.answer(primary.port)
        assert (await asyncio.wait_for(search, 5)).shards == shard_counts(1, 1)
    assert {port for port, _ in client.sent} == {primary.port}

    before = len(client.sent)
    search = asyncio.create_task(fanout.search(servers, "a", 10, 1000))
    await _sent(client, before + 1)
    timer.advance(answer_in / 2)
    await asyncio.sleep(0)  # ok-sleep: one loop turn, on a manual timer (no time passes)
    assert len(client.sent) == before + 1  # not yet due
    timer.advance(answer_in / 2)
    await _sent(client, before + 2)
    port, target = client.sent[-1]
    assert port == other.port
    # It carries what is left of the deadline when it is sent (1 s less 1/64 s).
    assert target.endswith(b"&timeout_ms=984")
    client.answer(other.port)
    result = await asyncio.wait_for(search, 5)
    assert result.shards == shard_counts(1, 1)
    assert sample(registry, "search_server_fanout_hedges_total", result="won") == 1


async def test_a_shard_is_hedged_only_once_it_is_late_against_the_querys_other_shards(
    registry: CollectorRegistry,
) -> None:
    # Shard 0 of two replicas (requests to ds-0a, hedges to ds-0b), shards 1-3 of one.
    servers = [
        make_instance("ds-0a", 20_000, shard=0, replica=0),
        make_instance("ds-0b", 20_001, shard=0, replica=1),
        *(make_instance(f"ds-{s}", 20_000 + 10 * s, shard=s) for s in (1, 2, 3)),
    ]
    primary, other, *rest = servers
    client = _Held(servers)
    timer = ManualTimer()
    fanout = _hedging(client, registry, timer, primary.id)
    tick = 1 / 64  # every answer's time while warming up: every replica's p95

    async def query(siblings_at: float, shard0_at: float) -> int:
        """One query whose shards 1-3 answer at ``siblings_at`` and shard 0 at
        ``shard0_at`` (ds-0a, or the hedge when one went out); the requests it sent."""
        before = len(client.sent)
        search = asyncio.create_task(fanout.search(servers, "a", 10, 1000))
        await _sent(client, before + 4)
        timer.advance(siblings_at)
        for server in rest:
            client.answer(server.port)
        await asyncio.sleep(0)  # ok-sleep: one loop turn, on a manual timer
        while timer.now < shard0_at:
            timer.advance(min(tick / 4, shard0_at - timer.now))
            for _ in range(3):
                await asyncio.sleep(0)  # ok-sleep: one loop turn, on a manual timer
        client.answer(primary.port)
        client.answer(other.port)
        assert (await asyncio.wait_for(search, 5)).shards == shard_counts(4, 4)
        return len(client.sent) - before

    for _ in range(16):
        assert await query(tick, tick) == 4
    hedges = "search_server_fanout_hedges_total"
    # An expensive query: its other shards took 0.9 ticks, shard 0 two. Past the p95
    # (a tick) but not three times its siblings' median: the query's cost, no hedge.
    start = timer.now
    assert await query(0.9 * tick, start + 2 * tick) == 4
    assert sample(registry, hedges, result="in_step") >= 1
    assert sample(registry, hedges, result="sent") == 0
    # A straggler: its siblings took a quarter of a tick, and at its p95 it is out four
    # times that: hedged.
    start = timer.now
    assert await query(0.25 * tick, start + 2 * tick) == 5
    assert client.sent[-1][0] == other.port
    assert sample(registry, hedges, result="sent") == 1
