"""The search server's adaptive in-flight limit (``search_server/admission.py``), against
a simulated cluster on a fake clock: no server, no loop, deterministic."""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, field

import pytest

from search_server.admission import ConcurrencyLimit, FixedLimit, GradientLimit

DEADLINE = 0.5


@dataclass
class Cluster:
    """A cluster of ``capacity`` queries a second whose queries take ``base`` seconds
    alone: with more than ``capacity x base`` in flight they share it (processor
    sharing), so each takes ``base x in_flight / (capacity x base)``. A query past the
    deadline comes back partial (dropped) at the deadline."""

    capacity: float
    base: float = 0.05

    def latency(self, in_flight: int) -> float:
        return self.base * max(1.0, in_flight / (self.capacity * self.base))


@dataclass
class Run:
    admitted: int = 0
    shed: int = 0
    dropped: int = 0
    latencies: list[float] = field(default_factory=list)
    limits: list[int] = field(default_factory=list)


def drive(
    limit: ConcurrencyLimit,
    cluster: Cluster,
    rate: float,
    seconds: float,
    start: float = 0.0,
) -> Run:
    """Open-loop arrivals at ``rate`` a second for ``seconds``: each admitted while
    fewer than the limit are in flight, else shed (503), as FanOut.search does."""
    run = Run()
    ends: list[tuple[float, int, float, int]] = []  # (end, seq, latency, in_flight at start)
    seq = itertools.count()
    dropped_of: dict[int, bool] = {}
    for i in range(int(rate * seconds)):
        now = start + i / rate
        while ends and ends[0][0] <= now:
            end, n, latency, at_start = heapq.heappop(ends)
            limit.on_sample(end, latency, at_start, dropped_of.pop(n))
        run.limits.append(limit.limit)
        in_flight = len(ends)
        if in_flight >= limit.limit:
            run.shed += 1
            continue
        latency = cluster.latency(in_flight + 1)
        dropped = latency > DEADLINE
        latency = min(latency, DEADLINE)
        n = next(seq)
        dropped_of[n] = dropped
        heapq.heappush(ends, (now + latency, n, latency, in_flight + 1))
        run.admitted += 1
        run.dropped += dropped
        run.latencies.append(latency)
    return run


def tail(run: Run, share: float = 0.5) -> Run:
    """The last ``share`` of a run's admitted queries (after it settled)."""
    cut = int(len(run.latencies) * (1 - share))
    return Run(latencies=run.latencies[cut:], limits=run.limits[int(len(run.limits) / 2) :])


def test_past_the_knee_it_sheds_the_excess_and_keeps_the_admitted_inside_the_deadline() -> None:
    # Knee: 100 q/s; offered three times that. A fixed limit of 256 would admit nearly
    # everything and every query would hit the deadline (checked below: the contrast).
    cluster = Cluster(capacity=100)
    limit = GradientLimit()
    run = drive(limit, cluster, rate=300, seconds=60)
    settled = tail(run)
    assert max(settled.latencies) <= DEADLINE * 0.6
    goodput = len(settled.latencies) / 30
    assert goodput >= 0.9 * cluster.capacity
    # The limit sits near the concurrency that keeps latency at the ceiling (0.2 s at
    # 100 q/s is 20 in flight), within a factor of 2.
    assert 10 <= min(settled.limits) <= max(settled.limits) <= 40

    fixed = drive(FixedLimit(256), cluster, rate=300, seconds=60)
    assert fixed.dropped > 0.9 * fixed.admitted
    assert fixed.shed == 0


def test_when_capacity_halves_the_limit_follows_within_seconds_and_comes_back() -> None:
    limit = GradientLimit()
    drive(limit, Cluster(capacity=100), rate=300, seconds=30)
    before = limit.limit
    # Half the capacity (a machine short of CPU): within 10 s the limit has fallen
    # and the admitted queries are back inside the ceiling.
    halved = drive(limit, Cluster(capacity=50), rate=300, seconds=10, start=30)
    assert limit.limit < 0.75 * before
    settled = halved.latencies[len(halved.latencies) // 2 :]
    assert max(settled) < DEADLINE  # no answer partial any more
    # Capacity back: the limit climbs again.
    drive(limit, Cluster(capacity=100), rate=300, seconds=30, start=40)
    assert limit.limit >= 0.8 * before


def test_an_idle_search_server_does_not_climb_to_the_maximum() -> None:
    # 10 q/s of 50 ms: under one query in flight, far from the limit (app-limited).
    limit = GradientLimit(initial=20)
    run = drive(limit, Cluster(capacity=100), rate=10, seconds=120)
    assert run.shed == 0
    assert limit.limit == 20


def test_a_burst_of_drops_lowers_the_limit_once_not_to_its_minimum() -> None:
    limit = GradientLimit(initial=40, backoff=0.9, backoff_interval=1.0)
    for _ in range(100):  # one stall: a hundred late answers at the same instant
        limit.on_sample(10.0, DEADLINE, 40, dropped=True)
    assert limit.limit == 36
    assert limit.backoffs == 1
    limit.on_sample(11.0, DEADLINE, 40, dropped=True)  # a second later: once more
    assert limit.backoffs == 2
    assert limit.limit <= 32


def test_the_limit_stays_within_its_bounds() -> None:
    limit = GradientLimit(initial=8, min_limit=4, max_limit=16)
    for t in range(1000):
        limit.on_sample(float(t), DEADLINE, 16, dropped=True)
    assert limit.limit == 4
    for t in range(1000, 5000):
        limit.on_sample(float(t), 0.001, 16, dropped=False)
    assert limit.limit == 16


def test_a_latency_that_is_not_a_number_changes_nothing() -> None:
    limit = GradientLimit()
    for bad in (math.nan, math.inf, -1.0):
        limit.on_sample(1.0, bad, 20, dropped=False)
    assert limit.short is None
    assert limit.limit == 10


@pytest.mark.parametrize(
    "kwargs",
    [
        {"min_limit": 0},
        {"initial": 300},
        {"min_limit": 30, "initial": 20},
        {"tolerance": 0.5},
        {"ceiling": 0.0},
        {"smoothing": 0.0},
        {"backoff": 1.5},
        {"long_window": 0},
        {"backoff_interval": -1.0},
        {"sustain": 0},
        {"memory": 0.0},
        {"memory": math.inf},
    ],
)
def test_bad_parameters_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must"):
        GradientLimit(**kwargs)  # type: ignore[arg-type]


def test_a_fixed_limit_is_the_old_behaviour() -> None:
    limit = FixedLimit(256)
    limit.on_sample(1.0, DEADLINE, 256, dropped=True)
    assert limit.limit == 256
    assert isinstance(limit, ConcurrencyLimit)
    assert isinstance(GradientLimit(), ConcurrencyLimit)
    with pytest.raises(ValueError, match="limit must be >= 1"):
        FixedLimit(0)
