"""The retry budget (``search_server.retrybudget``): one balance for retries and hedges."""

from __future__ import annotations

import pytest

from search_server.retrybudget import RetryBudget
from tests.support import FakeClock


def test_it_starts_with_a_second_of_retries_and_no_hedge() -> None:
    clock = FakeClock()
    budget = RetryBudget(0.1, 5.0, burst=50.0, clock=clock)
    assert budget.balance == 5.0
    assert not budget.withdraw("hedge")
    assert [budget.withdraw("retry") for _ in range(6)] == [True] * 5 + [False]


def test_first_requests_earn_their_share_and_time_its_rate() -> None:
    clock = FakeClock()
    budget = RetryBudget(0.1, 2.0, burst=50.0, clock=clock)
    budget.deposit(30)  # 3 tokens
    assert budget.balance == pytest.approx(5.0)
    clock.advance(1.5)  # 3 more
    assert budget.balance == pytest.approx(8.0)


def test_hedges_leave_a_second_of_retries() -> None:
    clock = FakeClock()
    budget = RetryBudget(0.5, 4.0, burst=50.0, clock=clock)
    budget.deposit(4)  # 4 + 2 = 6 tokens
    assert budget.withdraw("hedge")  # 6 >= 1 + 4: 5 left
    assert budget.withdraw("hedge")  # 5 >= 5: 4 left
    assert not budget.withdraw("hedge")
    assert sum(budget.withdraw("retry") for _ in range(10)) == 4


def test_the_balance_never_exceeds_the_burst() -> None:
    clock = FakeClock()
    budget = RetryBudget(1.0, 10.0, burst=12.0, clock=clock)
    budget.deposit(1000)
    clock.advance(60)
    assert budget.balance == 12.0


def test_extra_requests_are_bounded_whatever_fails() -> None:
    """Over any stretch: extra <= ratio x first requests + rate x seconds + burst."""
    clock = FakeClock()
    budget = RetryBudget(0.1, 3.0, burst=20.0, clock=clock)
    spent = 0
    for _ in range(500):  # 500 queries of 4 shards, 10 ms apart, every retry wanted
        budget.deposit(4)
        clock.advance(0.01)
        spent += sum(budget.withdraw("retry") for _ in range(4))
    assert spent <= 0.1 * 2000 + 3.0 * 5.0 + 20.0
    assert spent >= 0.1 * 2000 + 3.0 * 5.0  # and what it allows is spent


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((1.5, 10.0, 100.0), "ratio"),
        ((-0.1, 10.0, 100.0), "ratio"),
        ((0.1, -1.0, 100.0), "rate"),
        ((0.1, 10.0, 10.0), "burst"),
        ((0.1, 0.0, 0.5), "burst"),
    ],
)
def test_bad_settings_are_refused(args: tuple[float, float, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        RetryBudget(*args)
