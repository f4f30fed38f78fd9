"""Slow start (search_server/slowstart.py): a new replica's weight ramps from a share of
its registered weight to all of it over the window, on a fake clock."""

from __future__ import annotations

import math

import pytest

from discovery.errors import ConfigError
from search_server.picking import AdaptiveReplicaSelection, PowerOfTwoChoices, Replica
from search_server.slowstart import REFRESH_INTERVAL, Ramps, SlowStart
from tests.support import make_instance


def _replica(instance_id: str = "ds-1", *, weight: int = 100) -> Replica:
    return Replica.of(make_instance(instance_id, 9001, weight=weight))


def test_a_new_replicas_weight_ramps_linearly_from_min_weight_to_full_over_the_window() -> None:
    ramps = Ramps(SlowStart(window=30.0, aggression=1.0, min_weight=0.1))
    replica = _replica()
    assert replica.weight == replica.base_weight == 100
    t0 = 1000.0  # the fan-out's clock need not start at 0
    ramps.add(replica, t0)
    assert replica in ramps
    assert len(ramps) == 1
    assert (replica.weight, replica.ramp_start) == (10.0, t0)
    expected = {
        1.5: 10.0,  # 5 % of the window is below the minimum share
        3.0: 10.0,
        7.5: 25.0,
        15.0: 50.0,
        22.5: 75.0,
        29.0: 100 * 29 / 30,
    }
    for elapsed, weight in expected.items():
        assert ramps.refresh(t0 + elapsed)
        assert replica.weight == pytest.approx(weight), elapsed
        assert replica in ramps
    assert replica.base_weight == 100  # the registered weight is left alone
    # The window is over: full weight, and out of the set.
    assert ramps.refresh(t0 + 30.0)
    assert (replica.weight, replica.ramp_start, len(ramps)) == (100.0, None, 0)
    assert replica not in ramps
    assert not ramps.refresh(t0 + 60.0)  # nothing ramps: nothing to do


def test_aggression_shapes_the_curve() -> None:
    linear = SlowStart(window=20.0, aggression=1.0, min_weight=0.01)
    eager = SlowStart(window=20.0, aggression=2.0, min_weight=0.01)
    timid = SlowStart(window=20.0, aggression=0.5, min_weight=0.01)
    # A quarter of the window in: (1/4) ** (1 / aggression).
    assert linear.factor(5.0) == pytest.approx(0.25)
    assert eager.factor(5.0) == pytest.approx(0.5)
    assert timid.factor(5.0) == pytest.approx(0.0625)
    for tenth in range(1, 10):
        elapsed = 2.0 * tenth
        assert timid.factor(elapsed) < linear.factor(elapsed) < eager.factor(elapsed)
    for policy in (linear, eager, timid):
        assert policy.factor(20.0) == policy.factor(25.0) == 1.0
    # The same curve reaches a replica through refresh().
    replica = _replica()
    ramping = {replica}
    assert eager.begin(replica, 0.0)
    eager.refresh(ramping, 5.0)
    assert replica.weight == pytest.approx(50.0)
    eager.refresh(ramping, 11.25)
    assert replica.weight == pytest.approx(75.0)


def test_the_minimum_share_holds_at_the_start_of_the_window() -> None:
    policy = SlowStart(window=10.0, aggression=1.0, min_weight=0.3)
    assert policy.factor(0.0) == policy.factor(-1.0) == 0.3
    assert policy.factor(2.9) == 0.3  # the curve is below the minimum until 3 s
    assert policy.factor(5.0) == pytest.approx(0.5)


def test_window_zero_disables_slow_start() -> None:
    policy = SlowStart(window=0.0)
    assert not policy.enabled
    assert policy.factor(0.0) == policy.factor(-5.0) == 1.0
    ramps = Ramps(policy)
    replica = _replica(weight=250)
    ramps.add(replica, 0.0)
    assert (replica.weight, replica.ramp_start, len(ramps)) == (250.0, None, 0)
    assert not ramps.refresh(1.0)
    assert replica.weight == 250.0
    assert SlowStart().enabled  # the default is on (30 s)


def test_the_weight_stays_between_min_weight_times_base_and_base() -> None:
    for aggression in (0.25, 0.5, 1.0, 1.5, 4.0):
        for min_weight in (0.01, 0.1, 0.5, 1.0):
            policy = SlowStart(window=30.0, aggression=aggression, min_weight=min_weight)
            for base in (1, 3, 100, 1000):
                replica = _replica(weight=base)
                ramping = {replica}
                assert policy.begin(replica, 0.0)
                previous = replica.weight
                assert previous == pytest.approx(base * min_weight)
                for step in range(-2, 70):
                    policy.refresh(ramping, step * 0.5)
                    assert base * min_weight <= replica.weight + 1e-9
                    assert replica.weight <= base
                    assert replica.weight >= previous  # never drops while time runs
                    assert replica.weight > 0  # pickers divide by it
                    previous = replica.weight
                assert (replica.weight, ramping) == (float(base), set())


def test_a_small_weight_ramps_as_a_float_the_pickers_can_use() -> None:
    ramps = Ramps(SlowStart(window=30.0, min_weight=0.1))
    tiny, other = _replica("ds-tiny", weight=1), _replica("ds-other", weight=1)
    ramps.add(tiny, 0.0)
    assert tiny.weight == pytest.approx(0.1)  # not rounded to 0 (or up to 1)
    tiny.observe(0.002, 0.001, 0)
    other.observe(0.002, 0.001, 0)
    ars = AdaptiveReplicaSelection(decay=0)
    # Ten times the rank of an equal replica at full weight, and finite.
    assert ars.rank(tiny) == pytest.approx(10 * ars.rank(other))
    assert ars.pick([tiny, other]) is other
    assert PowerOfTwoChoices().pick([tiny, other]) is other


def test_refreshes_come_at_most_every_interval() -> None:
    ramps = Ramps(SlowStart(window=10.0, min_weight=0.1))
    assert ramps.interval == REFRESH_INTERVAL
    replica = _replica()
    ramps.add(replica, 0.0)
    assert ramps.refresh(5.0)
    assert replica.weight == pytest.approx(50.0)
    # Within the interval the weight is left as it was: the fan-out calls this per
    # query, and rewriting every ramping weight per query would cost O(ramping).
    assert not ramps.refresh(5.0 + REFRESH_INTERVAL / 2)
    assert replica.weight == pytest.approx(50.0)
    assert ramps.refresh(5.0 + REFRESH_INTERVAL)
    assert replica.weight == pytest.approx(100 * (5.0 + REFRESH_INTERVAL) / 10)
    every = Ramps(SlowStart(window=10.0), interval=0.0)
    every.add(_replica("ds-2"), 0.0)
    assert every.refresh(1.0)
    assert every.refresh(1.0)


def test_a_replica_refreshed_long_after_its_window_gets_its_full_weight() -> None:
    # No query for a minute (no refresh): the first one after it ends the ramp.
    ramps = Ramps(SlowStart(window=30.0))
    early, late = _replica("ds-early"), _replica("ds-late", weight=400)
    ramps.add(early, 0.0)
    ramps.add(late, 50.0)
    assert ramps.refresh(60.0)
    assert (early.weight, early.ramp_start) == (100.0, None)
    assert late.weight == pytest.approx(400 * 10 / 30)
    assert (len(ramps), late in ramps, early in ramps) == (1, True, False)


def test_a_replica_in_the_set_but_not_ramping_gets_its_registered_weight() -> None:
    policy = SlowStart(window=30.0)
    replica = _replica(weight=70)
    replica.weight = 7.0  # as if a ramp had begun; ramp_start cleared by someone else
    ramping = {replica}
    policy.refresh(ramping, 1.0)
    assert (replica.weight, ramping) == (70.0, set())


def test_a_new_registered_weight_applies_at_once_at_the_same_share_while_ramping() -> None:
    ramps = Ramps(SlowStart(window=10.0, min_weight=0.1))
    replica = _replica(weight=100)
    ramps.add(replica, 0.0)
    ramps.refresh(5.0)
    assert replica.weight == pytest.approx(50.0)
    replica.reweigh(300)  # the operator raised its weight mid-ramp
    assert replica.base_weight == 300
    assert replica.weight == pytest.approx(150.0)
    ramps.refresh(7.5)
    assert replica.weight == pytest.approx(225.0)
    ramps.refresh(10.0)
    assert replica.weight == 300.0
    replica.reweigh(20)  # not ramping: the new weight as it is
    assert (replica.base_weight, replica.weight) == (20, 20.0)


def test_restarting_a_ramp_starts_it_over() -> None:
    ramps = Ramps(SlowStart(window=10.0, min_weight=0.2))
    replica = _replica()
    ramps.add(replica, 0.0)
    ramps.refresh(8.0)
    assert replica.weight == pytest.approx(80.0)
    ramps.add(replica, 9.0)
    assert (replica.ramp_start, len(ramps)) == (9.0, 1)
    assert replica.weight == pytest.approx(20.0)


@pytest.mark.parametrize(
    ("settings", "flag"),
    [
        ({"window": -1.0}, "--slow-start-window"),
        ({"window": math.inf}, "--slow-start-window"),
        ({"window": math.nan}, "--slow-start-window"),
        ({"aggression": 0.0}, "--slow-start-aggression"),
        ({"aggression": -2.0}, "--slow-start-aggression"),
        ({"aggression": math.inf}, "--slow-start-aggression"),
        ({"aggression": math.nan}, "--slow-start-aggression"),
        ({"min_weight": 0.0}, "--slow-start-min-weight"),
        ({"min_weight": 1.5}, "--slow-start-min-weight"),
        ({"min_weight": math.nan}, "--slow-start-min-weight"),
    ],
)
def test_bad_settings_are_refused_naming_the_flag(settings: dict[str, float], flag: str) -> None:
    with pytest.raises(ConfigError, match=f"^{flag} "):
        SlowStart(**settings)


def test_a_negative_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="interval"):
        Ramps(SlowStart(), interval=-0.1)
