"""Deterministic subsets (``search_server.subsetting``): the aperture's arithmetic, its
even spread, its churn, and the spares that stand in for ejected or tried members."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from search_server.picking import Replica
from search_server.subsetting import DeterministicAperture, Position, Subset, aperture
from tests.support import make_instance


def replicas(count: int, prefix: str = "ds") -> list[Replica]:
    return [Replica.of(make_instance(f"{prefix}-{j:04d}", 9000 + j)) for j in range(count)]


def ids(group: tuple[Replica, ...] | list[Replica]) -> set[str]:
    return {r.instance.id for r in group}


def units(size: int, count: int, replicas: int) -> int:
    return min(count, -(-size * count // replicas))


# -- the arithmetic ---------------------------------------------------------------------


@settings(max_examples=150, derandomize=True, database=None, deadline=None)
@given(r=st.integers(1, 200), n=st.integers(1, 120), size=st.integers(1, 40))
def test_every_replica_is_covered_by_the_same_number_of_apertures(
    r: int, n: int, size: int
) -> None:
    """The sum of a replica's shares over every search server is the same for all
    replicas: with equal traffic per search server, equal load per replica."""
    total: Counter[int] = Counter()
    for rank in range(n):
        slots = aperture(r, Position(rank, n), size)
        assert len({index for index, _ in slots}) == len(slots)
        for index, share in slots:
            assert 0 < share <= 1
            total[index] += share
    assert sorted(total) == list(range(r))
    depth = n if r <= size else units(size, n, r)
    for index in range(r):
        assert total[index] == pytest.approx(depth, rel=1e-9)


@settings(max_examples=150, derandomize=True, database=None, deadline=None)
@given(r=st.integers(1, 300), n=st.integers(1, 200), size=st.integers(1, 40))
def test_an_aperture_holds_at_least_size_replicas_and_at_most_its_arc_plus_two(
    r: int, n: int, size: int
) -> None:
    for rank in {0, n // 2, n - 1}:
        slots = aperture(r, Position(rank, n), size)
        assert len(slots) >= min(r, size)
        assert sum(share for _, share in slots) >= min(r, size) - 1e-9
        c = units(size, n, r)
        if c < n and r > size:
            assert len(slots) <= -(-c * r // n) + 1


def test_one_search_server_routes_to_every_replica() -> None:
    assert aperture(100, Position(0, 1), 8) == [(j, 1.0) for j in range(100)]


def test_a_hundred_search_servers_over_a_hundred_replicas_take_eight_whole_ones_each() -> None:
    for rank in range(100):
        slots = aperture(100, Position(rank, 100), 8)
        assert slots == [((rank + t) % 100, 1.0) for t in range(8)]


def test_three_search_servers_over_a_hundred_replicas_split_the_edges() -> None:
    """The case a whole-replica subset cannot spread evenly: 100 is not a multiple of 3."""
    first, second, third = (aperture(100, Position(rank, 3), 8) for rank in range(3))
    assert [j for j, _ in first] == list(range(34))
    assert first[-1][1] == pytest.approx(1 / 3)
    assert second[0] == (33, pytest.approx(2 / 3))
    assert second[-1] == (66, pytest.approx(2 / 3))
    assert third[0] == (66, pytest.approx(1 / 3))
    assert third[-1] == (99, 1.0)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="rank"):
        Position(3, 3)
    with pytest.raises(ValueError, match="count"):
        Position(0, 0)
    with pytest.raises(ValueError, match="size"):
        aperture(10, Position(), 0)
    with pytest.raises(ValueError, match="subset size"):
        DeterministicAperture(-1)


def test_a_position_counts_in_a_search_server_missing_from_the_members() -> None:
    assert Position.among("ss-b", ["ss-a", "ss-b", "ss-c"]) == Position(1, 3)
    assert Position.among("ss-b", ["ss-a", "ss-c"]) == Position(1, 3)
    assert Position.among("ss-a", []) == Position(0, 1)


# -- churn ------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [3, 10, 100, 150])
def test_a_replica_that_joins_or_leaves_moves_each_subset_by_at_most_two_per_edge(n: int) -> None:
    """Against the whole subset's size: a replica coming or going costs each search
    server at most two members at each edge of its arc, plus the arc's growth by one
    unit (about R/N replicas) when the rounding of the arc to whole units changes."""
    subsetter = DeterministicAperture(8)
    shard = replicas(100)
    newcomer = Replica.of(make_instance("ds-0042x", 8999))
    for rank in range(n):
        position = Position(rank, n)
        before = ids(subsetter.subset(shard, position).members)
        for changed in (
            [*shard, newcomer],
            [r for r in shard if r.instance.id != "ds-0042"],
            [r for r in shard if r.instance.id != f"ds-{(rank * 100 // n):04d}"],
        ):
            after = ids(subsetter.subset(changed, position).members)
            grown = units(8, n, len(changed)) != units(8, n, 100)
            allowed = 4 + (-(-100 // n) + 1 if grown else 0)
            # The replica that came or went aside: who else got in or out.
            moved = (before ^ after) & ids(shard) & ids(changed)
            assert len(moved) <= allowed, (rank, sorted(moved))


def test_a_subset_does_not_depend_on_the_order_of_the_list() -> None:
    shard = replicas(50)
    shuffled = shard[:]
    random.Random(7).shuffle(shuffled)
    subsetter = DeterministicAperture(8)
    position = Position(4, 9)
    assert subsetter.subset(shard, position).members == subsetter.subset(shuffled, position).members


def test_size_zero_or_a_small_shard_keeps_every_replica() -> None:
    shard = replicas(6)
    for subsetter in (DeterministicAperture(0), DeterministicAperture(8)):
        subset = subsetter.subset(shard, Position(1, 40))
        assert subset.whole
        assert ids(subset.members) == ids(shard)


# -- candidates and spares ---------------------------------------------------------------


def whole_members(n: int = 100) -> Subset:
    """Rank 10 of 100 search servers over 100 replicas: members ds-0010..ds-0017."""
    return DeterministicAperture(8).subset(replicas(100), Position(10, n))


def test_candidates_are_the_members_while_all_can_take_a_request() -> None:
    subset = whole_members()
    got = subset.candidates((), now=0.0, rng=random.Random(1))
    assert [r.instance.id for r in got] == [f"ds-{j:04d}" for j in range(10, 18)]


def test_an_ejected_member_is_replaced_by_the_first_spare_after_the_arc() -> None:
    subset = whole_members()
    subset.members[2].ejected_until = 50.0
    subset.members[5].ejected_until = 50.0
    got = ids(subset.candidates((), now=10.0, rng=random.Random(1)))
    assert got == ids(subset.members) - ids([subset.members[2], subset.members[5]]) | {
        "ds-0018",
        "ds-0019",
    }
    # Its ejection over, the member is back and the spares are not needed.
    assert ids(subset.candidates((), now=60.0, rng=random.Random(1))) == ids(subset.members)


def test_an_ejected_spare_is_skipped_for_the_next() -> None:
    subset = whole_members()
    subset.members[0].ejected_until = 50.0
    subset.ordered[0].ejected_until = 50.0  # ds-0018
    assert "ds-0019" in ids(subset.candidates((), now=10.0, rng=random.Random(1)))
    assert "ds-0018" not in ids(subset.candidates((), now=10.0, rng=random.Random(1)))


def test_a_retry_after_every_member_was_tried_goes_to_the_next_spare() -> None:
    subset = whole_members()
    tried = set(subset.members)
    assert ids(subset.candidates(tried, now=0.0, rng=random.Random(1))) == {"ds-0018"}
    tried.add(subset.ordered[0])
    assert ids(subset.candidates(tried, now=0.0, rng=random.Random(1))) == {"ds-0019"}


def test_a_shard_with_every_replica_ejected_has_no_candidate() -> None:
    subset = whole_members()
    for replica in subset.ordered:
        replica.ejected_until = 50.0
    assert subset.candidates((), now=0.0, rng=random.Random(1)) == []


def test_picking_evenly_among_candidates_spreads_load_within_a_few_percent_of_fair() -> None:
    """Three search servers over 100 replicas of subset 8 (each takes a third of the
    ring, cutting two replicas in two): each sends 300,000 requests, each to a
    candidate chosen evenly at random; every replica's load is close to the fair
    share, including the two the arcs' edges cut."""
    shard = replicas(100)
    rng = random.Random(11)
    load: Counter[str] = Counter()
    per_server = 300_000
    for rank in range(3):
        subset = DeterministicAperture(8).subset(shard, Position(rank, 3))
        for _ in range(per_server):
            load[rng.choice(subset.candidates((), 0.0, rng)).instance.id] += 1
    fair = 3 * per_server / 100
    assert len(load) == 100
    worst = max(load.values()) / fair
    least = min(load.values()) / fair
    assert worst < 1.1, worst
    assert least > 0.85, least
