"""The data server's load report (data_server/loadreport.py): searches in progress and
answered over a window of rotating buckets, on a fake clock."""

from __future__ import annotations

import pytest

from data_server.loadreport import Load, LoadMeter
from tests.support import FakeClock


def _searches(meter: LoadMeter, clock: FakeClock, count: int, seconds: float) -> None:
    """``count`` searches one after another, each ``seconds`` long, back to back."""
    for _ in range(count):
        meter.enter()
        clock.advance(seconds)
        meter.leave()


def test_utilization_is_the_searches_in_progress_averaged_over_the_window() -> None:
    clock = FakeClock()
    clock.now = 1000.0  # on a bucket's edge: the window's length is plain to see
    meter = LoadMeter(clock=clock, bucket=1.0, buckets=3)
    assert meter.report() == Load(0.0, 0.0, 0.0)
    # Two searches in progress together for 1.5 s, one more alone for 0.5 s.
    meter.enter()
    meter.enter()
    clock.advance(1.5)
    meter.leave()
    meter.leave()
    meter.enter()
    clock.advance(0.5)
    meter.leave()
    # 2 s so far: (2 x 1.5 + 0.5) / 2 in progress on average; three answers in 2 s.
    assert meter.report() == Load(1.75, 1.5, 0.0)
    assert meter.in_flight == 0


def test_a_replica_slowed_ten_times_reports_ten_times_the_utilization_at_the_same_qps() -> None:
    clock_fast, clock_slow = FakeClock(), FakeClock()
    fast = LoadMeter(clock=clock_fast)
    slow = LoadMeter(clock=clock_slow)
    # 20 searches a second on both: 2 ms each on one, 20 ms on the other (the rest of
    # each 50 ms idle).
    for _ in range(100):
        _searches(fast, clock_fast, 1, 0.002)
        clock_fast.advance(0.048)
        _searches(slow, clock_slow, 1, 0.020)
        clock_slow.advance(0.030)
    fast_load, slow_load = fast.report(), slow.report()
    assert fast_load.qps == slow_load.qps == pytest.approx(20.0, abs=0.5)
    assert fast_load.utilization == pytest.approx(0.04, abs=0.002)
    assert slow_load.utilization == pytest.approx(10 * fast_load.utilization, rel=0.05)


def test_errors_are_counted_apart_per_second() -> None:
    clock = FakeClock()
    meter = LoadMeter(clock=clock)
    for i in range(40):
        meter.enter()
        clock.advance(0.05)
        meter.leave(error=i % 4 == 0)  # one in four
    load = meter.report()
    assert load.qps == pytest.approx(20.0, abs=0.5)
    assert load.eps == pytest.approx(5.0, abs=0.5)


def test_the_window_forgets_the_past_gradually_never_all_at_once() -> None:
    clock = FakeClock()
    clock.now = 1000.0
    meter = LoadMeter(clock=clock, bucket=1.0, buckets=3)
    _searches(meter, clock, 24, 0.125)  # 3 s busy: one search in progress throughout
    # The window is the current bucket so far (at its edge) and the two before: two
    # busy seconds, with the 17 answers from 1001.0 to 1003.0 (an answer at a bucket's
    # edge counts in the bucket it opens).
    assert meter.report() == Load(1.0, 8.5, 0.0)
    # Idle from now on: the window grows with the idle bucket, then drops a busy one.
    clock.advance(0.5)
    assert meter.report() == Load(0.8, 6.8, 0.0)  # 2 busy seconds of 2.5
    clock.advance(0.25)
    assert meter.report() == Load(0.727, 6.18, 0.0)  # of 2.75
    clock.advance(0.5)  # past a bucket's edge: one busy second left (9 answers), of 2.25
    assert meter.report() == Load(0.444, 4.0, 0.0)
    clock.advance(1.0)  # no busy second left; the answer at 1003.0 still is
    assert meter.report() == Load(0.0, 0.44, 0.0)
    clock.advance(1.0)
    assert meter.report() == Load(0.0, 0.0, 0.0)


def test_a_search_in_progress_across_buckets_counts_in_each_and_when_long_fills_the_window() -> (
    None
):
    clock = FakeClock()
    clock.now = 1000.0
    meter = LoadMeter(clock=clock, bucket=1.0, buckets=3)
    meter.enter()
    clock.advance(2.5)
    # Still in progress: every instant of the window so far had one search.
    assert meter.report() == Load(1.0, 0.0, 0.0)
    clock.advance(100.0)  # far past the ring's buckets: filled, not summed up
    assert meter.report() == Load(1.0, 0.0, 0.0)
    meter.leave()
    assert meter.report() == Load(1.0, 0.4, 0.0)  # one answer in the 2.5 s window


def test_a_young_meter_measures_over_its_life_and_never_less_than_a_bucket() -> None:
    clock = FakeClock()
    clock.now = 1000.25
    meter = LoadMeter(clock=clock, bucket=1.0, buckets=3)
    # One search answered in 2 ms: one a second, not five hundred.
    _searches(meter, clock, 1, 0.002)
    assert meter.report() == Load(0.002, 1.0, 0.0)
    clock.advance(1.498)  # 1.5 s old: the window is its life so far
    _searches(meter, clock, 2, 0.25)  # (0.002 + 0.5) / 2 s; three answers in 2 s
    assert meter.report() == Load(0.251, 1.5, 0.0)


def test_the_figures_are_rounded_the_utilization_to_significant_digits() -> None:
    clock = FakeClock()
    meter = LoadMeter(clock=clock)
    _searches(meter, clock, 7, 0.0123457)
    clock.advance(1.0)
    load = meter.report()
    assert load.utilization == float(f"{load.utilization:.3g}")
    assert load.qps == round(load.qps, 2)
    assert 0 < load.utilization < 1
    assert 0 < load.qps < 7
    # A fast server at a low rate (two searches of 60 us a second) is busy about a
    # ten-thousandth of the time: reported as such, not as 0.000, so its weight is known.
    clock.now = 2000.0
    for _ in range(6):
        _searches(meter, clock, 1, 0.00006)
        clock.advance(0.5 - 0.00006)
    assert clock.now == pytest.approx(2003.0)
    clock.now = 2003.0  # the window: the two seconds before, four searches
    assert meter.report() == Load(0.00012, 2.0, 0.0)


def test_an_unpaired_leave_and_bad_settings_are_refused() -> None:
    meter = LoadMeter(clock=FakeClock())
    with pytest.raises(RuntimeError, match="without a search in progress"):
        meter.leave()
    with pytest.raises(ValueError, match="bucket"):
        LoadMeter(bucket=0)
    with pytest.raises(ValueError, match="bucket"):
        LoadMeter(bucket=float("inf"))
    with pytest.raises(ValueError, match="buckets"):
        LoadMeter(buckets=1)
