"""Outlier ejection and half-open probing as a pure policy: failures and answers in,
ejections and probe targets out, at times the test chooses (no sockets, no loop)."""

from __future__ import annotations

import logging

import pytest

from search_server.ejection import OutlierEjection
from search_server.picking import Replica
from tests.support import make_instance

NOW = 1000.0


def replica(name: str, shard: int = 0, **payload: object) -> Replica:
    """A replica that has answered once (as real data servers have, before they break)."""
    r = fake(name, shard, **payload)
    r.observe(0.01, None, None)
    return r


def fake(name: str, shard: int = 0, **payload: object) -> Replica:
    """A replica that has never answered (a registration at an address where nothing
    answers)."""
    return Replica.of(make_instance(name, shard=shard, **payload))


def fail(ejection: OutlierEjection, r: Replica, now: float = NOW, answered: int = 10) -> bool:
    return ejection.record_failure(r, now, answered=lambda: answered, detail="HTTP 500")


def test_a_run_of_failures_ejects_for_the_cool_down() -> None:
    ejection = OutlierEjection(eject_after=3, eject_cooldown=10.0)
    r = replica("ds-1")

    assert not fail(ejection, r)
    assert not fail(ejection, r)
    assert not r.is_ejected(NOW)
    assert fail(ejection, r)

    assert r.is_ejected(NOW)
    assert r.ejected_until == NOW + 10.0
    assert ejection.ejected(NOW) == {r}
    # Its cool-down over, it is routed to again and forgotten by the ejected set.
    assert not r.is_ejected(NOW + 10.0)
    assert ejection.ejected(NOW + 10.0) == set()


def test_an_answer_between_failures_ends_the_run() -> None:
    ejection = OutlierEjection(eject_after=3)
    r = replica("ds-1")
    fail(ejection, r)
    fail(ejection, r)
    ejection.record_success(r, NOW)
    assert r.failures == 0
    assert not fail(ejection, r)
    assert not fail(ejection, r)
    assert ejection.ejected(NOW) == set()


def test_failures_while_ejected_do_not_extend_the_ejection() -> None:
    ejection = OutlierEjection(eject_after=1, eject_cooldown=10.0)
    r = replica("ds-1")
    assert fail(ejection, r, NOW)
    # Late failures of requests sent before the ejection.
    assert not fail(ejection, r, NOW + 5)
    assert r.ejected_until == NOW + 10.0


def test_after_its_cool_down_one_more_failure_ejects_again() -> None:
    ejection = OutlierEjection(eject_after=3, eject_cooldown=10.0)
    r = replica("ds-1")
    for _ in range(3):
        fail(ejection, r)
    assert fail(ejection, r, NOW + 10.0)
    assert r.ejected_until == NOW + 20.0


def test_a_draining_replica_is_never_ejected() -> None:
    ejection = OutlierEjection(eject_after=1)
    draining = replica("ds-1", state="draining")
    for _ in range(5):
        assert not fail(ejection, draining)
    assert not draining.is_ejected(NOW)
    assert ejection.ejected(NOW) == set()


def test_no_more_than_the_share_is_ejected_at_once(caplog: pytest.LogCaptureFixture) -> None:
    ejection = OutlierEjection(eject_after=1, max_ejected_share=0.5)
    replicas = [replica(f"ds-{i}", shard=i) for i in range(4)]
    with caplog.at_level(logging.WARNING, logger="search_server.ejection"):
        ejected = [fail(ejection, r, answered=4) for r in replicas]
        # Refusals at the cap, for a while: one line says so, with their count.
        for r in replicas[2:]:
            fail(ejection, r, NOW + 1, answered=4)

    assert ejected == [True, True, False, False]
    assert ejection.ejected(NOW + 1) == set(replicas[:2])
    refusals = [r.getMessage() for r in caplog.records if "not ejecting more" in r.getMessage()]
    assert len(refusals) == 1
    assert "2 of the 4 that have answered already ejected (cap 50%)" in refusals[0]


def test_the_cap_line_comes_again_after_its_interval_with_the_refusals_since(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ejection = OutlierEjection(eject_after=1, eject_cooldown=60.0, max_ejected_share=0.5)
    first, second = replica("ds-0", shard=0), replica("ds-1", shard=1)
    with caplog.at_level(logging.WARNING, logger="search_server.ejection"):
        fail(ejection, first, answered=2)
        for seconds in (0.0, 1.0, 2.0, 9.0):
            fail(ejection, second, NOW + seconds, answered=2)
        fail(ejection, second, NOW + 10.0, answered=2)
    refusals = [r.getMessage() for r in caplog.records if "not ejecting more" in r.getMessage()]
    assert len(refusals) == 2
    # The first refusal's line, then the four since it, by the one ten seconds later.
    assert "1 ejection(s) refused" in refusals[0]
    assert "4 ejection(s) refused" in refusals[1]


def test_replicas_that_never_answered_neither_widen_nor_fill_the_cap(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Twenty registrations that never answered, beside four real replicas: the cap's
    # base is the four (two may go), and the fakes, ejected all the same, take no place
    # under it: a real replica that breaks is ejected.
    ejection = OutlierEjection(eject_after=1, max_ejected_share=0.5)
    fakes = [fake(f"fake-{i}", shard=4 + i) for i in range(20)]
    real = [replica(f"ds-{i}", shard=i) for i in range(4)]
    with caplog.at_level(logging.WARNING, logger="search_server.ejection"):
        assert all(fail(ejection, f, answered=4) for f in fakes)
    assert all("never answered: outside the ejection cap" in r.getMessage() for r in caplog.records)
    assert [fail(ejection, r, answered=4) for r in real] == [True, True, False, False]
    assert ejection.ejected(NOW) == {*fakes, *real[:2]}
    # Their base is asked only when the cap is consulted: not for a fake.
    asked: list[int] = []

    def answered() -> int:
        asked.append(4)
        return 4

    late = fake("fake-late", shard=30)
    assert ejection.record_failure(late, NOW, answered=answered, detail="refused")
    assert asked == []


def test_one_server_can_always_be_ejected() -> None:
    ejection = OutlierEjection(eject_after=1, max_ejected_share=0.1)
    assert fail(ejection, replica("ds-alone"), answered=1)


def test_an_expired_ejection_frees_its_place_under_the_cap() -> None:
    ejection = OutlierEjection(eject_after=1, eject_cooldown=10.0, max_ejected_share=0.5)
    first, second = replica("ds-0", shard=0), replica("ds-1", shard=1)
    assert fail(ejection, first, answered=2)
    assert not fail(ejection, second, NOW + 5, answered=2)
    assert fail(ejection, second, NOW + 10.0, answered=2)


def test_an_ejected_replica_gets_one_probe_per_interval() -> None:
    ejection = OutlierEjection(eject_after=1, eject_cooldown=10.0, probe_interval=1.0)
    r = replica("ds-1")
    fail(ejection, r)

    # The failures were just seen: no probe before an interval.
    assert ejection.probe([r], (), NOW + 0.5) is None
    assert ejection.probe([r], (), NOW + 1.0) is r
    # One probe at a time: not again within the interval, nor while one is in flight.
    assert ejection.probe([r], (), NOW + 1.5) is None
    r.outstanding = 1
    assert ejection.probe([r], (), NOW + 2.0) is None
    r.outstanding = 0
    assert ejection.probe([r], (), NOW + 2.0) is r
    # Nor to a replica this query has tried already.
    assert ejection.probe([r], [r], NOW + 5.0) is None


def test_the_probe_goes_to_the_replica_whose_cool_down_ends_first() -> None:
    ejection = OutlierEjection(eject_after=1, eject_cooldown=10.0, probe_interval=1.0)
    later, sooner = replica("ds-later"), replica("ds-sooner")
    fail(ejection, sooner, NOW)
    fail(ejection, later, NOW + 3)
    assert ejection.probe([later, sooner], (), NOW + 5) is sooner


def test_an_answered_probe_ends_the_ejection() -> None:
    ejection = OutlierEjection(eject_after=2, eject_cooldown=10.0)
    r = replica("ds-1")
    fail(ejection, r)
    fail(ejection, r)
    probed = ejection.probe([r], (), NOW + 1.0)
    assert probed is r

    ejection.record_success(r, NOW + 1.2, probe=True)
    assert not r.is_ejected(NOW + 1.2)
    assert r.failures == 0
    assert r.ejected_until is None
    assert ejection.ejected(NOW + 1.2) == set()


def test_an_answer_sent_before_the_ejection_lets_it_run_its_course() -> None:
    ejection = OutlierEjection(eject_after=1, eject_cooldown=10.0)
    r = replica("ds-1")
    fail(ejection, r)
    ejection.record_success(r, NOW + 1, probe=False)
    assert r.failures == 0
    assert r.is_ejected(NOW + 1)
    assert ejection.ejected(NOW + 1) == {r}


def test_an_answer_after_the_cool_down_clears_the_record() -> None:
    ejection = OutlierEjection(eject_after=1, eject_cooldown=10.0)
    r = replica("ds-1")
    fail(ejection, r)
    ejection.record_success(r, NOW + 11)
    assert r.failures == 0
    assert r.ejected_until is None


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"eject_after": 0}, "eject_after"),
        ({"eject_cooldown": -1.0}, "eject_cooldown"),
        ({"max_ejected_share": 1.5}, "max_ejected_share"),
        ({"probe_interval": 0.0}, "probe_interval"),
    ],
)
def test_settings_out_of_range_are_refused(settings: dict[str, float], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        OutlierEjection(**settings)  # type: ignore[arg-type]
