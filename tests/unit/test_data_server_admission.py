"""The data server's admission rule (data_server/admission.py): a plain object, no server."""

from __future__ import annotations

import pytest

from data_server.admission import SearchAdmission


def test_admits_up_to_the_limit_and_refuses_the_next() -> None:
    admission = SearchAdmission(3)
    assert [admission.try_enter() for _ in range(3)] == [True, True, True]
    assert (admission.in_progress, admission.full) == (3, True)

    assert admission.try_enter() is False
    assert admission.try_enter() is False
    # A refusal takes no place.
    assert admission.in_progress == 3

    admission.leave()
    assert (admission.in_progress, admission.full) == (2, False)
    assert admission.try_enter() is True
    assert admission.try_enter() is False


def test_a_limit_of_one_serialises_the_searches() -> None:
    admission = SearchAdmission(1)
    assert admission.try_enter()
    assert not admission.try_enter()
    admission.leave()
    assert admission.try_enter()


def test_priority_searches_are_never_refused_and_take_no_place() -> None:
    admission = SearchAdmission(2)
    assert admission.try_enter()
    assert admission.try_enter()
    assert admission.full

    # Full: a probe is still admitted, as many as come.
    assert all(admission.try_enter(priority=True) for _ in range(5))
    assert (admission.in_progress, admission.priority, admission.total) == (2, 5, 7)
    assert not admission.try_enter()

    # Probes in progress do not hold back ordinary searches: one place frees, one enters.
    admission.leave()
    assert admission.try_enter()
    assert not admission.try_enter()

    for _ in range(5):
        admission.leave(priority=True)
    assert (admission.in_progress, admission.priority, admission.total) == (2, 0, 2)


def test_probes_on_an_idle_server_leave_the_whole_limit_free() -> None:
    admission = SearchAdmission(2)
    assert admission.try_enter(priority=True)
    assert admission.try_enter()
    assert admission.try_enter()
    assert not admission.try_enter()
    assert admission.total == 3


def test_an_unpaired_leave_is_a_bug_and_changes_nothing() -> None:
    admission = SearchAdmission(2)
    with pytest.raises(RuntimeError, match="without a search in progress"):
        admission.leave()
    assert admission.try_enter(priority=True)
    # A probe's place is not an ordinary one, nor the other way round.
    with pytest.raises(RuntimeError, match="without a search in progress"):
        admission.leave()
    admission.leave(priority=True)
    assert admission.try_enter()
    with pytest.raises(RuntimeError, match="without a priority search"):
        admission.leave(priority=True)
    assert (admission.in_progress, admission.priority) == (1, 0)


@pytest.mark.parametrize("limit", [0, -1, True, 1.5, "8"])
def test_the_limit_is_a_positive_integer(limit: object) -> None:
    with pytest.raises(ValueError, match="positive integer"):
        SearchAdmission(limit)  # type: ignore[arg-type]


def test_repr_shows_the_counts() -> None:
    admission = SearchAdmission(4)
    admission.try_enter()
    admission.try_enter(priority=True)
    assert repr(admission) == "SearchAdmission(limit=4, in_progress=1, priority=1)"
    assert admission.limit == 4
