"""How many hits each shard is asked for (pure): the binomial tail, the union bound
over the shards, the shares by documents, and which answers may have made a merge
inexact. Checked against exact rational arithmetic on small cases."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest

from discovery.errors import BadRequestError
from search_server.topk import (
    SHARE_GRID,
    TOPK_PROBABILITY,
    hits_asked,
    hits_per_shard,
    inexact_shards,
    parse_topk_probability,
)


def exact_tail(k: int, share: Fraction, above: int) -> Fraction:
    """P(Binomial(k, share) > above), exactly."""
    return sum(
        (math.comb(k, i) * share**i * (1 - share) ** (k - i) for i in range(above + 1, k + 1)),
        Fraction(0),
    )


def brute_force(k: int, share: Fraction, shards: int, probability: Fraction) -> int:
    """The smallest k' in 1..k whose exact tail is within (1 - probability) / shards."""
    allowed = (1 - probability) / shards
    return next(j for j in range(1, k + 1) if exact_tail(k, share, j) <= allowed)


def grid(share: Fraction) -> Fraction:
    """``share`` rounded up to the grid, as hits_per_shard rounds it."""
    return Fraction(math.ceil(share * SHARE_GRID), SHARE_GRID)


# -- hits_per_shard -------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2, 10, 100, 1000])
def test_probability_one_or_a_single_shard_asks_for_k(k: int) -> None:
    assert hits_per_shard(k, 1 / 50, 50, 1.0) == k
    assert hits_per_shard(k, 1.0, 1, 0.5) == k
    assert hits_per_shard(k, 0.3, 0, 0.5) == k
    assert hits_per_shard(k, 1.0, 50, 0.5) == k  # a shard with every document


def test_the_default_is_vespas_and_asks_for_fewer_than_k_at_scale() -> None:
    assert TOPK_PROBABILITY == 0.9999
    for k, shards in [(10, 50), (100, 50), (1000, 50), (1000, 500)]:
        asked = hits_per_shard(k, 1 / shards, shards, TOPK_PROBABILITY)
        assert k / shards < asked < k, (k, shards, asked)


@pytest.mark.parametrize(
    ("k", "share", "shards"),
    [(10, 1 / 50, 50), (100, 1 / 50, 50), (1000, 1 / 500, 500), (1000, 0.3, 4), (50, 0.5, 2)],
)
def test_monotonic_in_probability(k: int, share: float, shards: int) -> None:
    probabilities = [0.1, 0.5, 0.9, 0.99, 0.999, 0.9999, 0.999999, 1 - 1e-12, 1.0]
    asked = [hits_per_shard(k, share, shards, p) for p in probabilities]
    assert asked == sorted(asked)
    assert asked[-1] == k
    assert all(1 <= a <= k for a in asked)


@pytest.mark.parametrize(("k", "share"), [(10, 0.02), (100, 0.01), (1000, 0.002), (30, 0.4)])
def test_monotonic_in_shards_at_a_fixed_share(k: int, share: float) -> None:
    # More shards at the same share: each must fail less often for the union to hold.
    asked = [hits_per_shard(k, share, shards, 0.99) for shards in (2, 5, 20, 100, 1000)]
    assert asked == sorted(asked)


@pytest.mark.parametrize("k", [10, 100, 1000])
def test_more_equal_shards_ask_each_for_fewer(k: int) -> None:
    asked = [hits_per_shard(k, 1 / n, n, 0.9999) for n in (2, 5, 10, 50, 100, 500, 1000)]
    assert asked == sorted(asked, reverse=True)


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8, 12, 20])
def test_matches_the_exact_binomial_tail(k: int) -> None:
    for units, shards, probability in itertools.product(
        (1, 37, 410, 1024, 1366, 2048, 3000, 4095),
        (2, 3, 7, 50),
        (Fraction(1, 2), Fraction(9, 10), Fraction(99, 100), Fraction(9999, 10000)),
    ):
        share = Fraction(units, SHARE_GRID)
        expected = brute_force(k, share, shards, probability)
        got = hits_per_shard(k, float(share), shards, float(probability))
        assert got == expected, (k, units, shards, probability)


def test_a_share_is_rounded_up_to_the_grid() -> None:
    # 1/50 lies between grid points: it is asked for as the next one up.
    share = Fraction(1, 50)
    for k in (10, 40):
        expected = brute_force(k, grid(share), 50, Fraction(9999, 10000))
        assert hits_per_shard(k, 1 / 50, 50, 0.9999) == expected
    assert grid(share) > share


def test_large_k_is_computed_without_overflow_and_matches_exact_arithmetic() -> None:
    share = Fraction(82, SHARE_GRID)  # 1/50 rounded up
    asked = hits_per_shard(1000, float(share), 50, 0.9999)
    allowed = Fraction(1, 10000) / 50
    assert exact_tail(1000, share, asked) <= allowed < exact_tail(1000, share, asked - 1)


@pytest.mark.parametrize(
    ("k", "share", "shards", "probability"),
    [
        (0, 0.5, 2, 0.9),
        (10, -0.1, 2, 0.9),
        (10, 1.5, 2, 0.9),
        (10, math.nan, 2, 0.9),
        (10, 0.5, -1, 0.9),
        (10, 0.5, 2, 0.0),
        (10, 0.5, 2, 1.01),
        (10, 0.5, 2, math.nan),
    ],
)
def test_bad_arguments_are_refused(k: int, share: float, shards: int, probability: float) -> None:
    with pytest.raises(ValueError, match="must be"):
        hits_per_shard(k, share, shards, probability)


# -- hits_asked: shares by documents, and the union bound -----------------------------


def test_equal_shards_get_one_value_looked_up_once_per_query() -> None:
    hits_per_shard.cache_clear()
    asked = hits_asked(100, [2000] * 500, 0.9999)
    info = hits_per_shard.cache_info()
    assert info.maxsize is not None  # bounded
    assert (info.misses, info.hits) == (1, 0)  # once for 500 shards
    assert hits_asked(100, [2000] * 500, 0.9999) == asked
    info = hits_per_shard.cache_info()
    assert (info.misses, info.hits) == (1, 1)  # the next query computes nothing
    assert asked == [hits_per_shard(100, 1 / 500, 500, 0.9999)] * 500


def test_uneven_shards_are_asked_by_their_share_of_the_documents() -> None:
    docs = [1000, 1000, 2000, 4000]
    asked = hits_asked(50, docs, 0.999)
    total = sum(docs)
    assert asked == [hits_per_shard(50, d / total, 4, 0.999) for d in docs]
    assert asked[0] == asked[1] < asked[2] < asked[3] <= 50


def test_shards_that_do_not_say_what_they_hold() -> None:
    # None says: all even.
    assert hits_asked(100, [0] * 50, 0.9999) == [hits_per_shard(100, 1 / 50, 50, 0.9999)] * 50
    # Some say: those that do not are asked for k, the others' shares leave them out.
    asked = hits_asked(100, [0, 1000, 1000, 2000], 0.9999)
    assert asked == [
        100,
        hits_per_shard(100, 0.25, 4, 0.9999),
        hits_per_shard(100, 0.25, 4, 0.9999),
        hits_per_shard(100, 0.5, 4, 0.9999),
    ]


def test_probability_one_or_one_shard_asks_everyone_for_k() -> None:
    assert hits_asked(10, [100] * 50, 1.0) == [10] * 50
    assert hits_asked(10, [100], 0.5) == [10]
    assert hits_asked(10, [], 0.5) == []
    with pytest.raises(ValueError, match="probability"):
        hits_asked(10, [100, 100], 0.0)
    with pytest.raises(ValueError, match=">= 0"):
        hits_asked(10, [100, -1], 0.9)


@pytest.mark.parametrize(
    "docs", [[1, 1, 1], [1, 2, 3], [5, 1, 1, 1], [1, 1], [10, 1], [3, 3, 3, 1]]
)
@pytest.mark.parametrize("probability", [Fraction(1, 2), Fraction(9, 10), Fraction(99, 100)])
def test_the_merged_top_k_is_exact_with_the_promised_probability(
    docs: list[int], probability: Fraction
) -> None:
    """Every way the top k documents can fall over the shards (multinomial, each
    document in shard i with its share of the documents), summed exactly: the chance
    that some shard holds more of them than it was asked for is at most 1 - p."""
    k = 9
    asked = hits_asked(k, docs, float(probability))
    assert any(a < k for a in asked)  # the test asks for fewer somewhere
    total = sum(docs)
    shares = [Fraction(d, total) for d in docs]
    missed = Fraction(0)
    for counts in _compositions(k, len(docs)):
        if any(c > a for c, a in zip(counts, asked, strict=True)):
            ways = math.factorial(k)
            chance = Fraction(1)
            for count, share in zip(counts, shares, strict=True):
                ways //= math.factorial(count)
                chance *= share**count
            missed += ways * chance
    assert missed <= 1 - probability
    # And the per-shard bounds that make it (the union bound), exactly.
    per_shard = sum((exact_tail(k, s, a) for s, a in zip(shares, asked, strict=True)), Fraction(0))
    assert missed <= per_shard <= 1 - probability


def _compositions(total: int, parts: int) -> list[tuple[int, ...]]:
    """Every tuple of ``parts`` non-negative integers summing to ``total``."""
    if parts == 1:
        return [(total,)]
    return [
        (first, *rest)
        for first in range(total + 1)
        for rest in _compositions(total - first, parts - 1)
    ]


# -- inexact_shards -------------------------------------------------------------------


def _merged(*shards: int) -> list[dict[str, object]]:
    return [{"id": f"d{i}", "score": 10.0 - i, "shard": s} for i, s in enumerate(shards)]


def test_a_shard_with_all_it_was_asked_for_in_the_top_k_is_flagged() -> None:
    # k = 4: shard 0 asked for 2, returned 2, both in the top 4.
    merged = _merged(0, 1, 0, 1)
    assert inexact_shards([(0, 2, 2), (1, 3, 3)], 4, merged) == [0]


def test_a_shard_whose_last_hit_fell_below_the_top_k_is_not_flagged() -> None:
    # Shard 0's second hit did not make the top 4: its next would not have either.
    # (Shard 1 returned fewer than it was asked for.)
    merged = _merged(0, 1, 1, 1)
    assert inexact_shards([(0, 2, 2), (1, 3, 4)], 4, merged) == []


def test_a_shard_that_returned_fewer_than_asked_had_no_more() -> None:
    merged = _merged(0, 1, 1, 1)
    assert inexact_shards([(0, 1, 2), (1, 3, 4)], 4, merged) == []


def test_a_shard_asked_for_k_is_never_flagged() -> None:
    merged = _merged(0, 0, 0, 0)
    assert inexact_shards([(0, 4, 4)], 4, merged) == []


def test_a_merge_shorter_than_k_holds_every_hit() -> None:
    # Three hits in all for k = 10: a shard that returned all of its 2 may hold more.
    merged = _merged(0, 1, 0)
    assert inexact_shards([(0, 2, 2), (1, 1, 3)], 10, merged) == [0]


# -- a query's own probability ----------------------------------------------------------


def test_a_querys_probability_is_a_decimal_above_0_and_at_most_1() -> None:
    assert parse_topk_probability(None, 0.9999) == 0.9999
    assert parse_topk_probability("1", 0.9999) == 1.0
    assert parse_topk_probability("0.5", 0.9999) == 0.5
    assert parse_topk_probability(".000001", 0.9999) == 1e-6


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("0", "out_of_range"),
        ("-0", "out_of_range"),
        ("0.0", "out_of_range"),
        ("1.0001", "out_of_range"),
        ("-0.5", "out_of_range"),
        ("nan", "not_number"),
        ("1e-3", "not_number"),
        ("", "not_number"),
        ("often", "not_number"),
    ],
)
def test_a_bad_probability_is_refused_naming_the_parameter(raw: str, reason: str) -> None:
    with pytest.raises(BadRequestError) as refused:
        parse_topk_probability(raw, 0.9999)
    assert (refused.value.parameter, refused.value.reason) == ("topk_probability", reason)
    assert "'topk_probability' must be" in str(refused.value)
