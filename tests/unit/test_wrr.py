"""Weighted round robin by server-reported load (search_server/wrr.py): the weight
formula, the blackout and expiry of reports, the mean weight of replicas without one,
slow start, and the spread of the picks, on a fake clock."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import pytest

from search_server.picking import Replica, ReplicaPicker
from search_server.wrr import FORGET_AFTER, MIN_COST, WeightedRoundRobin, WrrConfig, load_weight
from tests.support import FakeClock, make_instance


def _replica(instance_id: str, port: int = 9001, *, weight: int = 100) -> Replica:
    return Replica.of(make_instance(instance_id, port, weight=weight))


def _replicas(count: int) -> list[Replica]:
    return [_replica(f"ds-{i}", 9001 + i) for i in range(count)]


def _report(clock: FakeClock, loads: dict[Replica, tuple[float, float, float]]) -> None:
    """Each replica answers with its report (utilization, qps, eps) now."""
    for replica, (utilization, qps, eps) in loads.items():
        replica.report_load(utilization, qps, eps, clock.now)


def _picks(picker: WeightedRoundRobin, candidates: Sequence[Replica], count: int) -> Counter[str]:
    return Counter(picker.pick(candidates).key for _ in range(count))


def _reported_for(
    clock: FakeClock, loads: dict[Replica, tuple[float, float, float]], seconds: float
) -> None:
    """The replicas report the same load once a second for ``seconds``."""
    for _ in range(int(seconds)):
        _report(clock, loads)
        clock.advance(1.0)
    _report(clock, loads)


def test_the_picker_implements_the_protocol() -> None:
    assert isinstance(WeightedRoundRobin(), ReplicaPicker)


def test_the_weight_is_qps_over_utilization_plus_the_penalised_error_rate() -> None:
    assert load_weight(0.5, 100.0, 0.0, 1.0) == pytest.approx(200.0)
    # 10 errors a second of 100 answers: 0.1 more, times the penalty.
    assert load_weight(0.5, 100.0, 10.0, 1.0) == pytest.approx(100 / 0.6)
    assert load_weight(0.5, 100.0, 10.0, 2.0) == pytest.approx(100 / 0.7)
    assert load_weight(0.5, 100.0, 10.0, 0.0) == pytest.approx(200.0)  # errors ignored
    # Little's law: utilization = qps x the mean time a search spends on the server, so
    # the weight is one over that time, whatever the rate.
    assert load_weight(0.02, 10.0, 0.0, 1.0) == pytest.approx(load_weight(0.2, 100.0, 0.0, 1.0))


def test_a_report_that_gives_no_weight_gives_zero() -> None:
    assert load_weight(0.5, 0.0, 0.0, 1.0) == 0.0  # nothing answered of late
    assert load_weight(0.0, 100.0, 0.0, 1.0) == 0.0  # infinite: idle, or rounded to 0
    assert load_weight(0.0, 100.0, 5.0, 1.0) == pytest.approx(2000.0)  # errors are a cost
    assert load_weight(0.0, 100.0, 5.0, 0.0) == 0.0
    # A tiny positive cost counts as MIN_COST: no weight near infinity.
    assert load_weight(1e-300, 1e7, 0.0, 1.0) == pytest.approx(1e7 / MIN_COST)


def test_no_weight_is_used_in_the_blackout_the_mean_meanwhile() -> None:
    clock = FakeClock()
    picker = WeightedRoundRobin(WrrConfig(blackout=10.0), clock=clock)
    light, heavy = _replicas(2)
    loads = {light: (1.0, 10.0, 0.0), heavy: (1.0, 30.0, 0.0)}
    started = clock.now
    _report(clock, loads)
    for _ in range(9):
        clock.advance(1.0)
        _report(clock, loads)
        assert picker.weight(heavy, clock.now) == 0.0
        # Both have the mean weight (none has one): the picks alternate.
        assert _picks(picker, [light, heavy], 10) == {light.key: 5, heavy.key: 5}
    clock.now = started + 9.99
    assert picker.weight(heavy, clock.now) == 0.0
    clock.now = started + 10.0
    _report(clock, loads)
    assert picker.weight(heavy, clock.now) == pytest.approx(30.0)
    assert picker.weight(light, clock.now) == pytest.approx(10.0)
    assert _picks(picker, [light, heavy], 400) == {light.key: 100, heavy.key: 300}


def test_a_zero_blackout_uses_the_first_report() -> None:
    clock = FakeClock()
    picker = WeightedRoundRobin(WrrConfig(blackout=0.0), clock=clock)
    replica = _replica("ds-1")
    assert picker.weight(replica, clock.now) == 0.0  # no report yet
    replica.report_load(0.5, 50.0, 0.0, clock.now)
    assert picker.weight(replica, clock.now) == pytest.approx(100.0)


def test_an_expired_report_gives_the_mean_and_the_next_report_starts_a_new_blackout() -> None:
    clock = FakeClock()
    picker = WeightedRoundRobin(WrrConfig(blackout=10.0, expiry=180.0), clock=clock)
    quiet, peer = _replicas(2)
    _reported_for(clock, {quiet: (1.0, 10.0, 0.0), peer: (1.0, 30.0, 0.0)}, 11)
    assert picker.weight(quiet, clock.now) == pytest.approx(10.0)
    # The quiet one reports no more; its peer does.
    last = clock.now
    _reported_for(clock, {peer: (1.0, 30.0, 0.0)}, 180)
    assert clock.now == last + 180.0
    assert picker.weight(quiet, clock.now) == pytest.approx(10.0)  # 180 s: not older yet
    clock.advance(0.5)
    _report(clock, {peer: (1.0, 30.0, 0.0)})
    assert picker.weight(quiet, clock.now) == 0.0
    assert quiet.load_since is None  # its run is over
    # Expired, it has the mean weight, its peer's: the picks alternate.
    assert _picks(picker, [quiet, peer], 10) == {quiet.key: 5, peer.key: 5}
    # Its next report starts a new run: no weight for another blackout.
    clock.advance(1.0)
    restarted = clock.now
    quiet.report_load(1.0, 10.0, 0.0, restarted)
    assert quiet.load_since == restarted
    for _ in range(9):
        clock.advance(1.0)
        _report(clock, {quiet: (1.0, 10.0, 0.0), peer: (1.0, 30.0, 0.0)})
        assert picker.weight(quiet, clock.now) == 0.0
    clock.now = restarted + 10.0
    _report(clock, {quiet: (1.0, 10.0, 0.0), peer: (1.0, 30.0, 0.0)})
    assert picker.weight(quiet, clock.now) == pytest.approx(10.0)
    assert _picks(picker, [quiet, peer], 400) == {quiet.key: 100, peer.key: 300}


def test_the_error_penalty_weighs_a_failing_replica_down() -> None:
    clock = FakeClock()
    failing, sound = _replicas(2)
    # Same rate and utilization; half of the failing one's answers are errors.
    loads = {failing: (1.0, 100.0, 50.0), sound: (1.0, 100.0, 0.0)}
    _reported_for(clock, loads, 10)
    picker = WeightedRoundRobin(WrrConfig(error_penalty=1.0), clock=clock)
    # 100 / (1 + 0.5) against 100 / 1: 40 % and 60 %.
    assert _picks(picker, [failing, sound], 500) == {failing.key: 200, sound.key: 300}
    harsh = WeightedRoundRobin(WrrConfig(error_penalty=3.0), clock=clock)
    # 100 / 2.5 against 100: 2 picks in 7.
    assert _picks(harsh, [failing, sound], 700) == {failing.key: 200, sound.key: 500}
    lenient = WeightedRoundRobin(WrrConfig(error_penalty=0.0), clock=clock)
    assert _picks(lenient, [failing, sound], 500) == {failing.key: 250, sound.key: 250}


def test_picks_are_spread_in_proportion_to_the_weights() -> None:
    clock = FakeClock()
    a, b, c = _replicas(3)
    _reported_for(clock, {a: (1.0, 10.0, 0.0), b: (1.0, 20.0, 0.0), c: (1.0, 70.0, 0.0)}, 10)
    picker = WeightedRoundRobin(clock=clock)
    picks = [picker.pick([a, b, c]).key for _ in range(1000)]
    counts = Counter(picks)
    for replica, share in ((a, 100), (b, 200), (c, 700)):
        assert abs(counts[replica.key] - share) <= 1, counts
    # Smoothly: every run of 10 picks holds the heavy one 7 times (give or take one),
    # never a burst of one replica's share followed by the others'.
    for start in range(0, 990):
        window = Counter(picks[start : start + 10])
        assert 6 <= window[c.key] <= 8, (start, window)
        assert window[a.key] <= 2, (start, window)
    # Deterministically: a fresh picker picks the same sequence.
    again = WeightedRoundRobin(clock=clock)
    assert [again.pick([a, b, c]).key for _ in range(1000)] == picks


def test_a_replica_slowed_ten_times_gets_a_tenth_of_its_peers_picks() -> None:
    clock = FakeClock()
    slowed, *peers = _replicas(3)
    # The same rate; ten times the searches in progress (ten times as long each).
    loads = {slowed: (0.5, 50.0, 0.0)} | {peer: (0.05, 50.0, 0.0) for peer in peers}
    _reported_for(clock, loads, 10)
    picker = WeightedRoundRobin(clock=clock)
    counts = _picks(picker, [*peers, slowed], 2100)
    assert counts[slowed.key] == pytest.approx(100, abs=1)
    assert all(counts[peer.key] == pytest.approx(1000, abs=1) for peer in peers), counts


def test_a_replica_without_a_report_gets_the_mean_weight_of_those_with_one() -> None:
    clock = FakeClock()
    light, heavy, silent = _replicas(3)
    _reported_for(clock, {light: (1.0, 10.0, 0.0), heavy: (1.0, 30.0, 0.0)}, 10)
    picker = WeightedRoundRobin(clock=clock)
    # 10, 30 and the mean, 20: a sixth, a half and a third.
    counts = _picks(picker, [light, heavy, silent], 600)
    assert counts == {light.key: 100, heavy.key: 300, silent.key: 200}
    # So is one whose report gives no weight (an idle server's utilization of 0).
    idle = _replica("ds-idle", 9009)
    idle.report_load(0.0, 0.0, 0.0, clock.now - 20.0)
    idle.report_load(0.0, 0.0, 0.0, clock.now)
    counts = _picks(picker, [light, heavy, idle], 600)
    assert counts == {light.key: 100, heavy.key: 300, idle.key: 200}


def test_slow_start_still_ramps_a_replica() -> None:
    clock = FakeClock()
    new, old = _replicas(2)
    loads = {new: (0.5, 50.0, 0.0), old: (0.5, 50.0, 0.0)}
    _reported_for(clock, loads, 10)
    picker = WeightedRoundRobin(clock=clock)
    new.weight = new.base_weight * 0.1  # what SlowStart sets early in its window
    assert _picks(picker, [new, old], 1100) == {new.key: 100, old.key: 1000}
    new.weight = new.base_weight * 0.5
    assert _picks(picker, [new, old], 300) == {new.key: 100, old.key: 200}
    # Without reports too: the mean weight, times the share.
    fresh, known = _replicas(2)
    fresh.weight = fresh.base_weight * 0.25
    assert _picks(picker, [fresh, known], 500) == {fresh.key: 100, known.key: 400}


def test_weights_are_recomputed_at_most_every_update_period() -> None:
    clock = FakeClock()
    a, b = _replicas(2)
    _reported_for(clock, {a: (1.0, 50.0, 0.0), b: (1.0, 50.0, 0.0)}, 10)
    picker = WeightedRoundRobin(WrrConfig(update_period=1.0), clock=clock)
    assert _picks(picker, [a, b], 100) == {a.key: 50, b.key: 50}
    # b now reports nine times the rate: the weights picked with hold for a second.
    _report(clock, {b: (1.0, 450.0, 0.0)})
    clock.advance(0.99)
    assert _picks(picker, [a, b], 100) == {a.key: 50, b.key: 50}
    clock.advance(0.01)
    counts = _picks(picker, [a, b], 1000)
    assert counts[a.key] == pytest.approx(100, abs=1)
    assert counts[b.key] == pytest.approx(900, abs=1)


def test_the_candidates_may_vary_per_pick_and_forgotten_state_is_bounded() -> None:
    clock = FakeClock()
    a, b, c = _replicas(3)
    _reported_for(clock, {a: (1.0, 10.0, 0.0), b: (1.0, 20.0, 0.0), c: (1.0, 70.0, 0.0)}, 10)
    picker = WeightedRoundRobin(clock=clock)
    # c is left out of every other pick (tried already, say): each replica gets the sum
    # of its shares of the picks it was offered (a 1/10 and a 1/3 for a, ...).
    counts = Counter[str]()
    for _ in range(300):
        chosen = picker.pick([a, b, c])
        assert chosen in (a, b, c)
        counts[chosen.key] += 1
        chosen = picker.pick([a, b])
        assert chosen in (a, b)
        counts[chosen.key] += 1
    assert counts[a.key] == pytest.approx(300 * (1 / 10 + 1 / 3), abs=1)
    assert counts[b.key] == pytest.approx(300 * (2 / 10 + 2 / 3), abs=1)
    assert counts[c.key] == pytest.approx(300 * 7 / 10, abs=1)
    assert picker.tracked == 3
    # Replicas no longer offered are forgotten within two FORGET_AFTER.
    clock.advance(FORGET_AFTER)
    picker.pick([a, b])
    clock.advance(FORGET_AFTER)
    picker.pick([a, b])
    assert picker.tracked == 2


def test_a_change_of_scale_starves_nobody() -> None:
    clock = FakeClock()
    fast, slow = _replicas(2)
    # A million times apart: the slow one gets next to nothing.
    _reported_for(clock, {fast: (0.001, 1000.0, 0.0), slow: (1000.0, 1.0, 0.0)}, 10)
    picker = WeightedRoundRobin(WrrConfig(expiry=30.0), clock=clock)
    assert _picks(picker, [fast, slow], 1000)[slow.key] <= 1
    # Then every report expires (the data servers were replaced by ones that report
    # nothing): equal weights, and the picks alternate at once.
    clock.advance(31.0)
    assert _picks(picker, [fast, slow], 10) == {fast.key: 5, slow.key: 5}


def test_never_raises_with_one_candidate_or_reports_that_give_no_weight() -> None:
    clock = FakeClock()
    picker = WeightedRoundRobin(clock=clock)
    lone = _replica("ds-lone")
    assert picker.pick([lone]) is lone
    zeros = _replicas(3)
    _reported_for(clock, dict.fromkeys(zeros, (0.0, 0.0, 0.0)), 10)
    counts = _picks(picker, zeros, 300)
    assert counts == {replica.key: 100 for replica in zeros}
