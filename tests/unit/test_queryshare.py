"""One query's share of the in-flight limit (``search_server/queryshare.py``): pure
bookkeeping on a fake clock."""

from __future__ import annotations

import pytest

from search_server.queryshare import QueryShare

STORM = "alpha beta gamma"
OTHER = "delta"


def _admit(share: QueryShare, key: str, limit: int, now: float) -> bool:
    """As the fan-out does: ask, and hold the query if admitted."""
    admitted = share.admits(key, limit, now)
    if admitted:
        share.acquire(key)
    return admitted


def test_alone_a_query_may_use_the_whole_limit() -> None:
    share = QueryShare(0.5)
    assert all(_admit(share, STORM, 8, now=0.0) for _ in range(8))
    assert share.held(STORM) == 8


def test_while_another_query_is_in_flight_one_query_holds_at_most_its_share() -> None:
    share = QueryShare(0.5)
    assert _admit(share, OTHER, 8, now=0.0)
    admitted = [_admit(share, STORM, 8, now=10.0) for _ in range(6)]
    assert admitted == [True] * 4 + [False] * 2
    # The others still get in: the rest of the limit is theirs.
    assert _admit(share, OTHER, 8, now=10.0)
    assert _admit(share, "epsilon", 8, now=10.0)
    # One of the storm's ends: its next one takes the free place, no more.
    share.release(STORM)
    assert _admit(share, STORM, 8, now=10.0)
    assert not _admit(share, STORM, 8, now=10.0)


def test_a_query_that_arrived_within_the_window_counts_as_asking_even_if_refused() -> None:
    share = QueryShare(0.5, window=1.0)
    assert _admit(share, STORM, 4, now=0.0)
    assert _admit(share, STORM, 4, now=0.0)
    # Another query arrives and is refused (say, by the limit): it has asked all the same.
    assert share.admits(OTHER, 4, now=0.5)
    assert not _admit(share, STORM, 4, now=1.0)
    # A second later nobody else has asked: the storm may use the whole limit again.
    assert _admit(share, STORM, 4, now=1.6)
    assert _admit(share, STORM, 4, now=1.6)
    assert share.held(STORM) == 4


def test_a_long_run_of_one_query_does_not_hide_the_last_other_one() -> None:
    share = QueryShare(0.5, window=1.0)
    share.admits(OTHER, 4, now=0.0)
    for i in range(100):  # the storm's refused retries, all within the window
        share.admits(STORM, 4, now=0.5 + i / 1000)
    share.acquire(STORM)
    share.acquire(STORM)
    assert not share.admits(STORM, 4, now=0.9)


def test_the_share_is_at_least_one_query() -> None:
    share = QueryShare(0.5)
    assert share.cap(1) == 1
    assert share.cap(3) == 1
    assert share.cap(4) == 2
    assert _admit(share, OTHER, 1, now=0.0)
    assert _admit(share, STORM, 1, now=0.0)  # the limit is the caller's to enforce
    assert not _admit(share, STORM, 1, now=0.0)


def test_a_share_of_one_turns_the_rule_off() -> None:
    share = QueryShare(1.0)
    assert _admit(share, OTHER, 4, now=0.0)
    assert all(_admit(share, STORM, 4, now=0.0) for _ in range(6))


def test_bookkeeping_is_bounded_by_the_queries_in_flight() -> None:
    share = QueryShare(0.5)
    keys = [f"query {i}" for i in range(1000)]
    for key in keys:
        _admit(share, key, 10_000, now=0.0)
    for key in keys:
        share.release(key)
    assert share.tracked == 0  # no key left behind
    assert all(share.held(key) == 0 for key in keys)


@pytest.mark.parametrize(
    ("share", "window", "match"),
    [(0.0, 1.0, "share"), (1.5, 1.0, "share"), (0.5, 0.0, "window")],
)
def test_bad_parameters_are_refused(share: float, window: float, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        QueryShare(share, window=window)
