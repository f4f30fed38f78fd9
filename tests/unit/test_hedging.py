"""The hedge budget and the hedge delays as pure policy: latencies in, delays out."""

from __future__ import annotations

import pytest

from search_server.hedging import HedgeBudget, HedgePolicy, hedge_window
from search_server.picking import LatencyWindow, Replica
from tests.support import make_instance

#: 16 answers (a window's least for a percentile) of 1..16 ms: p50 9 ms, p95 16 ms.
MS = [i / 1000 for i in range(1, 17)]


def window_of(samples: list[float]) -> LatencyWindow:
    window = LatencyWindow()
    for seconds in samples:
        window.add(seconds)
    return window


def replica(name: str, samples: list[float] | None = None) -> Replica:
    r = Replica.of(make_instance(name))
    if samples is not None:
        r.window = window_of(samples)
    return r


def test_the_budget_starts_empty_and_is_earned_by_sub_requests() -> None:
    budget = HedgeBudget(ratio=0.05, burst=100.0)
    assert not budget.withdraw()
    budget.deposit(19)
    assert not budget.withdraw()  # 0.95 of a hedge
    budget.deposit(1)
    assert budget.withdraw()
    assert not budget.withdraw()


def test_the_budget_holds_no_more_than_its_burst() -> None:
    budget = HedgeBudget(ratio=0.5, burst=3.0)
    budget.deposit(1000)
    assert [budget.withdraw() for _ in range(4)] == [True, True, True, False]


def test_hedges_stay_within_the_ratio_of_sub_requests() -> None:
    budget = HedgeBudget(ratio=0.1, burst=5.0)
    sent = 0
    for _ in range(100):
        budget.deposit(10)  # a 10-shard query
        sent += sum(budget.withdraw() for _ in range(3))
    assert sent == 100  # 10% of 1,000 sub-requests, though 300 were asked for


@pytest.mark.parametrize("ratio", [-0.1, 1.5])
def test_a_ratio_out_of_range_is_refused(ratio: float) -> None:
    with pytest.raises(ValueError, match="hedge ratio"):
        HedgeBudget(ratio)


def test_the_window_is_the_fastest_other_replicas() -> None:
    primary = replica("ds-primary", [10 * s for s in MS])
    slow = replica("ds-slow", [5 * s for s in MS])
    fast = replica("ds-fast", MS)
    for replicas in ([primary, slow, fast], [fast, slow, primary]):
        window = hedge_window(replicas, primary)
        assert window is fast.window
    assert fast.window is not None
    assert fast.window.p95 == pytest.approx(0.016)


def test_without_another_window_the_primarys_own_then_everyones() -> None:
    primary = replica("ds-primary", MS)
    unknown = replica("ds-new")
    assert hedge_window([primary, unknown], primary) is primary.window

    everyone = window_of([2 * s for s in MS])
    new_primary = replica("ds-new-primary")
    assert hedge_window([new_primary, unknown], new_primary, everyone) is everyone
    assert hedge_window([new_primary, unknown], new_primary) is None


def test_a_window_with_too_few_answers_tells_nothing() -> None:
    primary = replica("ds-primary")
    few = replica("ds-few", MS[:15])
    assert hedge_window([primary, few], primary) is None


def test_the_delays_come_from_the_window() -> None:
    policy = HedgePolicy(ratio=0.05)
    primary, other = replica("ds-primary"), replica("ds-other", MS)
    replicas = [primary, other]

    assert policy.delay(replicas, primary) == pytest.approx(0.016)
    # A hedge refused for the budget: offered again a p95 later, then twice as long...
    first = policy.backoff(replicas, primary, 0.0)
    assert first == pytest.approx(0.016)
    assert first is not None
    assert policy.backoff(replicas, primary, first) == pytest.approx(0.032)
    # A deferred one: the usual spread after the query's median answer.
    assert policy.spread(replicas, primary) == pytest.approx(0.016 - 0.009)


def test_no_delay_without_a_window_until_answers_are_observed() -> None:
    policy = HedgePolicy(ratio=0.05)
    primary, other = replica("ds-primary"), replica("ds-other")
    replicas = [primary, other]
    assert policy.delay(replicas, primary) is None
    assert policy.backoff(replicas, primary, 0.0) is None
    assert policy.spread(replicas, primary) is None

    for seconds in MS:
        policy.observe(3 * seconds)
    assert policy.delay(replicas, primary) == pytest.approx(0.048)
    assert policy.spread(replicas, primary) == pytest.approx(0.048 - 0.027)


def test_a_ratio_of_zero_turns_hedging_off() -> None:
    assert not HedgePolicy(ratio=0.0).enabled
    assert HedgePolicy(ratio=0.05).enabled
