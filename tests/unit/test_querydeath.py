"""The query-of-death guard as a pure policy: a clock, outcomes in, refusals out."""

from __future__ import annotations

import pytest

from discovery.errors import ConfigError
from search_server.querydeath import (
    Quarantine,
    QueryOfDeathConfig,
    QueryOfDeathGuard,
    normalise,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


SHARDS = 10
ALL_BAD = (SHARDS, SHARDS)
FINE = (SHARDS, 0)


def guard(clock: Clock, **settings: float) -> tuple[QueryOfDeathGuard, list[str]]:
    quarantined: list[str] = []
    config = QueryOfDeathConfig(**settings)  # type: ignore[arg-type]
    return (
        QueryOfDeathGuard(config, clock=clock, on_quarantine=lambda k, q: quarantined.append(k)),
        quarantined,
    )


def test_normalised_text_ignores_case_order_repetition_and_punctuation() -> None:
    assert normalise("The quick, quick FOX") == normalise("fox the quick!")
    assert normalise("fox the quick") == "fox quick the"
    assert normalise("fox") != normalise("fox jumps")
    assert len(normalise("word " * 10_000 + " ".join(f"w{i}" for i in range(5000)))) <= 1024


def test_a_query_failing_on_most_shards_is_refused_after_its_strikes() -> None:
    clock = Clock()
    qod, quarantined = guard(clock)
    key = normalise("the of and a to in")
    for _ in range(20):
        qod.record("normal query", *FINE)
    for _ in range(2):
        qod.record(key, *ALL_BAD)
        assert qod.check(key) is None
    qod.record(key, *ALL_BAD)
    refused = qod.check(key)
    assert isinstance(refused, Quarantine)
    assert quarantined == [key]
    assert refused.retry_after(clock.now) == 60
    assert "query of death" in refused.message(clock.now)
    assert qod.check("normal query") is None
    assert qod.quarantined == 1


def others(qod: QueryOfDeathGuard, count: int = 10) -> None:
    """Other queries going well: the baseline a strike is judged against."""
    for number in range(count):
        qod.record(f"other {number}", *FINE)


def test_the_quarantine_ends_after_its_cool_down_and_a_repeat_doubles_it() -> None:
    clock = Clock()
    qod, _ = guard(clock, cooldown=30, max_cooldown=100)
    others(qod)
    for _ in range(3):
        qod.record("q", *ALL_BAD)
    assert qod.check("q") is not None
    clock.now += 30
    assert qod.check("q") is None  # tried again
    qod.record("q", *ALL_BAD)  # on probation: one strike is enough
    refused = qod.check("q")
    assert refused is not None
    assert refused.until == pytest.approx(clock.now + 60)
    clock.now += 60
    others(qod)  # the earlier ones have left the window
    qod.record("q", *ALL_BAD)
    assert qod.check("q").until == pytest.approx(clock.now + 100)  # type: ignore[union-attr]


def test_a_good_fan_out_ends_the_probation() -> None:
    clock = Clock()
    qod, quarantined = guard(clock, cooldown=30)
    others(qod)
    for _ in range(3):
        qod.record("q", *ALL_BAD)
    clock.now += 30
    qod.record("q", *FINE)
    qod.record("q", *ALL_BAD)
    assert qod.check("q") is None
    assert quarantined == ["q"]


def test_strikes_outside_the_window_do_not_add_up() -> None:
    clock = Clock()
    qod, _ = guard(clock, window=10, min_others=1)
    for _ in range(5):
        qod.record("q", *ALL_BAD)
        clock.now += 6
        qod.record("other", *FINE)
    # Each strike had at most one other within 10 s, never three.
    assert qod.check("q") is None


def test_a_few_bad_shards_are_no_strike() -> None:
    clock = Clock()
    qod, _ = guard(clock, shard_fraction=0.5)
    others(qod)
    for _ in range(10):
        qod.record("q", SHARDS, 4)
    assert qod.check("q") is None
    qod.record("q", SHARDS, 5)
    qod.record("q", SHARDS, 5)
    qod.record("q", SHARDS, 5)
    assert qod.check("q") is not None


def test_when_most_queries_fail_the_cluster_is_failing_and_no_query_is_refused() -> None:
    clock = Clock()
    qod, quarantined = guard(clock)
    for _ in range(10):
        for query in ("weather", "news", "maps"):
            qod.record(query, *ALL_BAD)  # half the shards partitioned away, say
    assert quarantined == []
    assert all(qod.check(q) is None for q in ("weather", "news", "maps"))


def test_the_guard_remembers_a_bounded_number_of_queries() -> None:
    clock = Clock()
    qod, _ = guard(clock, max_tracked=100)
    for number in range(10_000):
        qod.record(f"q{number}", *ALL_BAD)
        qod.record("fine", *FINE)
    assert qod.tracked <= 100


def test_queries_that_went_well_are_not_remembered() -> None:
    clock = Clock()
    qod, _ = guard(clock)
    for number in range(1000):
        qod.record(f"q{number}", *FINE)
    assert qod.tracked == 0


def test_one_failing_shard_is_no_sign_of_the_query() -> None:
    clock = Clock()
    qod, quarantined = guard(clock)
    others(qod)
    for _ in range(10):
        qod.record("q", 2, 1)  # two shards, one of them on a sick data server
    assert quarantined == []


def test_without_other_queries_there_is_nothing_to_compare_with() -> None:
    clock = Clock()
    qod, quarantined = guard(clock)
    for _ in range(10):
        qod.record("q", *ALL_BAD)
    assert quarantined == []


def test_strikes_zero_turns_the_guard_off() -> None:
    clock = Clock()
    qod, quarantined = guard(clock, strikes=0)
    for _ in range(10):
        qod.record("q", *ALL_BAD)
    assert qod.check("q") is None
    assert quarantined == []


@pytest.mark.parametrize(
    ("settings", "flag"),
    [
        ({"shard_fraction": 0}, "--qod-shard-fraction"),
        ({"shard_fraction": 1.5}, "--qod-shard-fraction"),
        ({"strikes": -1}, "--qod-strikes"),
        ({"window": 0}, "--qod-window"),
        ({"cooldown": 0}, "--qod-cooldown"),
        ({"cooldown": 10, "max_cooldown": 5}, "--qod-cooldown"),
    ],
)
def test_bad_settings_name_their_flag(settings: dict[str, float], flag: str) -> None:
    with pytest.raises(ConfigError, match=flag):
        QueryOfDeathConfig(**settings)  # type: ignore[arg-type]
