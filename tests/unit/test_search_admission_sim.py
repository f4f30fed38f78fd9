"""The search server's in-flight limit (``search_server/admission.py``) against a simulated
cluster that shares its capacity (processor sharing), on a fake clock.

The model is the 2-core machine's: search servers and data servers share the CPU, so
every query admitted past the knee slows every other one down, including the queries
admitted *before* it (a model that fixes a query's latency when it is admitted would
miss that, and the overshoot it causes). A cluster has a capacity of ``capacity``
queries a second and a query alone takes ``service`` seconds; with ``n`` queries in
flight each progresses at ``min(1, knee / n)`` of its speed, ``knee = capacity x
service``, so at a steady ``n`` a query takes ``max(service, n / capacity)``. A query
not finished at its deadline (0.5 s) stops (its data servers stop at the deadline they
were sent) and comes back partial: a *dropped* sample. Arrivals are open-loop Poisson
(seeded); a query is refused (503) when the limit's worth is in flight, as
``FanOut.search`` does. Each ended query is one ``on_sample(end, latency, in flight at
its admission including itself, dropped)``. Everything is deterministic; a test runs in
a few tens of milliseconds.

Goodput (complete answers a second), not throughput, is the figure: a fixed limit of
256 keeps the throughput and loses every answer.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from dataclasses import dataclass, field

import pytest

from search_server.admission import ConcurrencyLimit, FixedLimit, GradientLimit

#: The default per-query deadline of the search server (``--timeout-ms 500``).
DEADLINE = 0.5


@dataclass(frozen=True)
class Cluster:
    """``capacity`` queries a second, each taking ``service`` seconds alone."""

    capacity: float
    service: float

    @property
    def knee(self) -> float:
        """Queries in flight past which each one slows down (Little's law at capacity)."""
        return self.capacity * self.service


@dataclass
class Phase:
    """What one stretch of a simulation saw."""

    seconds: float
    offered: int = 0
    shed: int = 0
    complete: int = 0
    dropped: int = 0
    #: (end time, latency, dropped) of every admitted query that ended in the phase.
    samples: list[tuple[float, float, bool]] = field(default_factory=list)
    #: The limit after each sample, in order (to count samples until it moved).
    limits_after_sample: list[int] = field(default_factory=list)
    #: The limit at each arrival.
    limits_at_arrival: list[int] = field(default_factory=list)
    #: Queries in flight at each admission, itself included.
    in_flight: list[int] = field(default_factory=list)

    def goodput(self) -> float:
        return self.complete / self.seconds

    def every_limit(self) -> list[int]:
        return self.limits_at_arrival + self.limits_after_sample


class Simulation:
    """Open-loop traffic into a processor-sharing cluster behind ``limit``.

    Work is counted in a virtual time that advances at the rate each query in flight
    gets (1, or ``knee / n`` past the knee); a query finishes when the virtual time has
    advanced by its ``service`` since it was admitted. The cluster can change between
    phases (``run(cluster=...)``); queries in flight carry on at the new speed.
    """

    def __init__(self, limit: ConcurrencyLimit, cluster: Cluster, *, seed: int = 1) -> None:
        self.limit = limit
        self.cluster = cluster
        self.now = 1000.0  # the fan-out's clock need not start at 0
        self._virtual = 0.0
        self._rng = random.Random(seed)
        self._seq = itertools.count()
        # Admitted queries: seq -> (admitted at, in flight at admission).
        self._live: dict[int, tuple[float, int]] = {}
        self._finishes: list[tuple[float, int]] = []  # (virtual finish, seq)
        self._deadlines: list[tuple[float, int]] = []  # (deadline, seq)
        self._phase = Phase(0.0)

    def run(self, rate: float, seconds: float, *, cluster: Cluster | None = None) -> Phase:
        """Offer ``rate`` queries a second for ``seconds``."""
        if cluster is not None:
            self._advance(self.now)
            self.cluster = cluster
        phase = self._phase = Phase(seconds)
        end = self.now + seconds
        arrival = self.now
        while True:
            arrival += self._rng.expovariate(rate)
            if arrival > end:
                break
            self._advance(arrival)
            phase.offered += 1
            limit = self.limit.limit
            phase.limits_at_arrival.append(limit)
            if len(self._live) >= limit:
                phase.shed += 1
                continue
            seq = next(self._seq)
            self._live[seq] = (self.now, len(self._live) + 1)
            phase.in_flight.append(len(self._live))
            heapq.heappush(self._finishes, (self._virtual + self.cluster.service, seq))
            heapq.heappush(self._deadlines, (self.now + DEADLINE, seq))
        self._advance(end)
        return phase

    def _speed(self) -> float:
        n = len(self._live)
        return 1.0 if n <= self.cluster.knee else self.cluster.knee / n

    def _advance(self, until: float) -> None:
        while True:
            for heap in (self._finishes, self._deadlines):
                while heap and heap[0][1] not in self._live:
                    heapq.heappop(heap)  # ended the other way
            speed = self._speed()
            finish = (
                self.now + (self._finishes[0][0] - self._virtual) / speed
                if self._finishes
                else math.inf
            )
            deadline = self._deadlines[0][0] if self._deadlines else math.inf
            event = min(finish, deadline)
            if event > until:
                self._virtual += (until - self.now) * speed
                self.now = until
                return
            self._virtual += (event - self.now) * speed
            self.now = event
            heap = self._finishes if finish <= deadline else self._deadlines
            self._end(heapq.heappop(heap)[1], dropped=heap is self._deadlines)

    def _end(self, seq: int, *, dropped: bool) -> None:
        admitted, in_flight = self._live.pop(seq)
        latency = self.now - admitted
        phase = self._phase
        phase.samples.append((self.now, latency, dropped))
        if dropped:
            phase.dropped += 1
        else:
            phase.complete += 1
        self.limit.on_sample(self.now, latency, in_flight, dropped)
        phase.limits_after_sample.append(self.limit.limit)


def second_half(values: list[int]) -> list[int]:
    return values[len(values) // 2 :]


def test_past_the_knee_it_sheds_the_excess_and_the_admitted_complete() -> None:
    # 3x the knee, the load of bench/bench_overload.py's worst step. Catches: a limit
    # that does not come down (answers partial, the original outage), one that comes
    # down too far (goodput lost to shedding), and the fixed limit's collapse.
    cluster = Cluster(capacity=100, service=0.05)  # knee: 5 in flight
    sim = Simulation(GradientLimit(), cluster)
    sim.run(300, 30)  # settle
    settled = sim.run(300, 30)
    assert settled.dropped == 0  # every admitted query completes
    assert max(latency for _, latency, _ in settled.samples) <= 0.6 * DEADLINE
    assert settled.goodput() >= 0.95 * cluster.capacity
    assert settled.shed >= 0.6 * settled.offered  # the excess, refused at once
    assert min(settled.in_flight[len(settled.in_flight) // 10 :]) >= cluster.knee  # busy

    # The fixed limit of old: nothing is shed, the queries share the machine until
    # nearly every one misses its deadline (the metastable collapse).
    fixed = Simulation(FixedLimit(256), cluster)
    fixed.run(300, 30)
    collapsed = fixed.run(300, 30)
    assert collapsed.shed == 0
    assert collapsed.goodput() <= 0.1 * cluster.capacity


@pytest.mark.xfail(
    strict=True,
    reason="the baseline (an EWMA of every latency) drifts up with the overload it "
    "measures, so the limit settles where the latency meets the ceiling (capacity x "
    "ceiling in flight, ~12x the knee here) rather than near tolerance x the knee",
)
def test_under_a_sustained_overload_it_settles_near_the_knee() -> None:
    # Stated factor: the mean in flight within [1, 3] x the knee (tolerance 2 puts the
    # latency at about twice the unloaded one; the additive probe, sqrt(limit), adds a
    # little). Catches a limit that keeps its goodput only by holding queries at a large
    # share of their deadline, which leaves no margin for a capacity drop or a tail.
    cluster = Cluster(capacity=250, service=0.02)  # knee: 5 in flight
    sim = Simulation(GradientLimit(), cluster)
    sim.run(750, 30)
    settled = sim.run(750, 30)
    mean_in_flight = sum(settled.in_flight) / len(settled.in_flight)
    assert cluster.knee <= mean_in_flight <= 3 * cluster.knee


def test_when_capacity_halves_the_limit_follows_within_a_bounded_number_of_samples() -> None:
    # Catches a limit that reacts to a loss of capacity (a busy neighbour on the
    # machine) too slowly or not at all: the admitted queries would go partial.
    cluster = Cluster(capacity=100, service=0.05)
    sim = Simulation(GradientLimit(), cluster)
    sim.run(300, 30)
    before = sim.limit.limit
    halved = sim.run(300, 20, cluster=Cluster(capacity=50, service=0.05))
    # Little's law: the same latency at half the capacity is half the queries. The
    # limit has come down by a quarter within 250 samples (5 s at the halved capacity,
    # about ten limits' worth of answers; 165 in this run), and settles near half.
    followed = next(
        (i for i, limit in enumerate(halved.limits_after_sample) if limit <= 0.75 * before),
        None,
    )
    assert followed is not None, "the limit did not come down"
    assert followed <= 250
    assert sim.limit.limit <= 0.6 * before
    # Meanwhile the admitted queries, slowed by half at once, still complete.
    assert halved.dropped <= 2
    assert halved.goodput() >= 0.95 * 50


def test_when_capacity_comes_back_the_limit_recovers() -> None:
    # Catches a limit that stays low after an overload (the baseline or the limit kept
    # down by what the overload did): goodput would stay at the halved capacity.
    cluster = Cluster(capacity=100, service=0.05)
    sim = Simulation(GradientLimit(), cluster)
    sim.run(300, 30)
    before = sim.limit.limit
    sim.run(300, 20, cluster=Cluster(capacity=50, service=0.05))
    assert sim.limit.limit <= 0.6 * before
    back = sim.run(300, 30, cluster=cluster)
    recovered = next(
        (i for i, limit in enumerate(back.limits_after_sample) if limit >= 0.8 * before),
        None,
    )
    assert recovered is not None, "the limit did not come back"
    assert recovered <= 600  # samples: about 6 s at the capacity (370 to 450 measured)
    tail = [end for end, _, dropped in back.samples if not dropped and end > sim.now - 10]
    assert len(tail) / 10 >= 0.9 * cluster.capacity


def test_the_limit_stays_between_its_minimum_and_its_maximum() -> None:
    # Catches a limit driven to 0 (nothing admitted ever again: no sample could raise
    # it) or past the old fixed limit.
    limit = GradientLimit(initial=8, min_limit=3, max_limit=32)
    sim = Simulation(limit, Cluster(capacity=2, service=1.0))  # every query too slow
    starved = sim.run(50, 20)
    assert starved.dropped > 0
    assert min(starved.every_limit()) == 3
    assert starved.complete + starved.dropped > 0  # it still admits (and measures)
    # Then a cluster with room for 100 (the starved one's inflated baseline still
    # remembered): the limit climbs to its maximum and no further.
    fast = sim.run(1000, 40, cluster=Cluster(capacity=2000, service=0.05))
    assert max(fast.every_limit()) == 32
    assert fast.limits_after_sample[-1] == 32
    assert min(fast.every_limit()) >= 3


def test_it_does_not_grow_while_app_limited() -> None:
    # A third of the capacity: about one query in flight, far below the limit, so the
    # latency says nothing of a higher one. Catches a limit that climbs to the maximum
    # while idle and then admits the first burst whole.
    limit = GradientLimit(initial=20)
    sim = Simulation(limit, Cluster(capacity=100, service=0.02))
    quiet = sim.run(33, 120)
    assert quiet.shed == 0
    assert max(quiet.every_limit()) <= 20


@pytest.mark.parametrize("spread", [0.0, 0.2])
def test_a_burst_of_drops_does_not_collapse_the_limit(spread: float) -> None:
    # One stall of the search server: every query in flight wakes past its deadline
    # at once (or within ``spread`` seconds). Catches a decrease per dropped sample
    # (0.7 ** 100 of the limit would be the minimum): at most one backoff (x0.7) and one
    # step of the gradient (at least x0.5) for the window the burst ends.
    cluster = Cluster(capacity=1000, service=0.02)  # knee: 20 in flight
    limit = GradientLimit(min_limit=4, max_limit=256)
    sim = Simulation(limit, cluster)
    sim.run(800, 20)
    before = limit.limit
    assert before >= 20
    for i in range(100):
        limit.on_sample(sim.now + spread * i / 100, DEADLINE, before, dropped=True)
    assert limit.limit >= int(0.35 * before)
    assert limit.limit > limit.min_limit


def _after_a_light_spell(memory: float, seed: int) -> tuple[GradientLimit, Phase]:
    """Three times the capacity for 20 s, a third of it for 60 s, then a step to one
    and a half times it: the first 3 s of the step."""
    cluster = Cluster(capacity=15, service=0.05)  # at the ceiling: 3 in flight
    limit = GradientLimit(memory=memory)
    sim = Simulation(limit, cluster, seed=seed)
    sim.run(45, 20)
    sim.run(5, 60)
    return limit, sim.run(22.5, 3)


def test_a_step_past_the_knee_after_a_light_spell_is_admitted_at_what_the_cluster_took() -> None:
    # The flash crowd of bench_overload r13/r14: the limit had found the cluster's
    # capacity (3 to 4 in flight here), climbed back to its initial 10 while the load
    # was light, and the next step past the knee was admitted whole: queries sharing
    # a machine that answers 3 in time, partial at their deadline before the first
    # of them could lower the limit. Catches a limit that forgets where it held.
    steps = [_after_a_light_spell(300.0, seed) for seed in range(1, 8)]
    for limit, step in steps:
        assert limit.rest < 7  # what it learned, not the initial 10
        assert max(step.in_flight) <= 7
    assert sum(step.dropped for _, step in steps) == 0
    # Forgetting at once (the resting point fixed at the initial limit, as before):
    # the same seeds lose answers at the step.
    forgetful = [_after_a_light_spell(1e-9, seed) for seed in range(1, 8)]
    assert max(max(step.in_flight) for _, step in forgetful) >= 9
    assert sum(step.dropped for _, step in forgetful) >= 10


def test_a_burst_is_no_measure_and_what_was_learned_is_forgotten_in_minutes() -> None:
    cluster = Cluster(capacity=15, service=0.05)
    limit = GradientLimit()
    sim = Simulation(limit, cluster)
    # Five seconds at three times the capacity (a stall while a fleet restarts), and
    # the limit's climb back after it: fewer binding windows in a row than
    # ``sustain``. Learned from 2 s, such a stall refused queries of the compose
    # check's deploy day for minutes.
    sim.run(45, 5)
    assert limit.rest == 10
    sim.run(5, 30)
    assert limit.limit == 10
    # A sustained overload teaches a resting point; a light load afterwards returns to
    # it, then, as minutes pass without the limit binding, to the initial limit.
    sim.run(45, 20)
    learned = limit.rest
    assert learned < 7
    sim.run(5, 60)
    # Near it (a burst that binds still grows it a little), not at the initial 10.
    assert limit.limit <= learned + 3 < 10
    sim.run(5, 1200)
    assert limit.limit == 10
    # From above too: a limit that grew on a fast cluster and is then unused.
    fast = GradientLimit()
    sim = Simulation(fast, Cluster(capacity=1000, service=0.02))
    sim.run(800, 30)
    assert fast.limit >= 20
    sim.run(20, 1200)
    assert fast.limit == 10


def test_a_fixed_limit_is_the_old_behaviour() -> None:
    # Catches a FixedLimit that moves (benchmarks compare against it) or accepts 0.
    limit = FixedLimit(256)
    sim = Simulation(limit, Cluster(capacity=100, service=0.05))
    phase = sim.run(300, 10)
    assert set(phase.every_limit()) == {256}
    assert isinstance(limit, ConcurrencyLimit)
    assert isinstance(GradientLimit(), ConcurrencyLimit)
    with pytest.raises(ValueError, match="limit"):
        FixedLimit(0)
