"""The replica-picker seam: power of two choices on its own, and the fan-out telling a
picker of another kind about every request it sends (real data servers, real HTTP)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Sequence

import aiohttp
import pytest

from discovery.instance import ServiceInstance
from search_server.fanout import FanOut
from search_server.picking import Outcome, PowerOfTwoChoices, ReplicaPicker, target_key
from tests.support import (
    DataServerFactory,
    SearchServerFactory,
    all_see,
    get_json,
    instance_of,
    make_instance,
)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def test_the_default_picker_implements_the_protocol() -> None:
    assert isinstance(PowerOfTwoChoices(), ReplicaPicker)


def test_power_of_two_choices_prefers_the_replica_with_fewer_requests_in_flight() -> None:
    busy, idle = make_instance("ds-busy", 9001), make_instance("ds-idle", 9002)
    picker = PowerOfTwoChoices(random.Random(3))
    for _ in range(3):
        picker.started(busy)
    assert picker.outstanding(busy) == 3
    # Of two candidates both are sampled, so the idle one always wins.
    assert {picker.pick([busy, idle]).id for _ in range(50)} == {"ds-idle"}
    for outcome in ("ok", "failed", "timed_out"):
        picker.finished(busy, outcome, 0.01)
    assert picker.outstanding(busy) == 0
    assert picker.pick([busy]) is busy  # a lone candidate needs no draw
    # Equal load: both get picked (a tie goes to the first of the random pair).
    assert {picker.pick([busy, idle]).id for _ in range(200)} == {"ds-busy", "ds-idle"}


def test_a_restarted_server_is_a_new_target() -> None:
    before = make_instance("ds-1", 9001)
    moved = make_instance("ds-1", 9002)
    assert target_key(before) != target_key(moved)
    picker = PowerOfTwoChoices()
    picker.started(before)
    assert picker.outstanding(moved) == 0


class RecordingPicker:
    """A picker of another kind: always the first candidate, every request recorded."""

    def __init__(self) -> None:
        self.picks: list[str] = []
        self.started_ids: list[str] = []
        self.finished_ids: list[tuple[str, Outcome]] = []

    def pick(self, candidates: Sequence[ServiceInstance]) -> ServiceInstance:
        choice = min(candidates, key=lambda instance: instance.id)
        self.picks.append(choice.id)
        return choice

    def started(self, instance: ServiceInstance) -> None:
        self.started_ids.append(instance.id)

    def finished(self, instance: ServiceInstance, outcome: Outcome, seconds: float) -> None:
        assert seconds >= 0
        self.finished_ids.append((instance.id, outcome))


async def test_the_fan_out_routes_with_the_picker_it_is_given(
    make_data_server: DataServerFactory, http: aiohttp.ClientSession
) -> None:
    a0, a1, b0 = await asyncio.gather(
        make_data_server(shard=0, replica=0, instance_id="ds-a0"),
        make_data_server(shard=0, replica=1, instance_id="ds-a1"),
        make_data_server(shard=1, replica=0, instance_id="ds-b0"),
    )
    picker = RecordingPicker()
    assert isinstance(picker, ReplicaPicker)
    fanout = FanOut(http, picker=picker)
    assert fanout.picker is picker
    servers = [instance_of(s) for s in (a0, a1, b0)]
    for _ in range(3):
        result = await fanout.search(servers, "probe", 5, 2000)
        assert not result.partial
    # The picker decided every time (ds-a1 never), and heard of every request once.
    assert sorted(picker.picks) == ["ds-a0"] * 3 + ["ds-b0"] * 3
    assert sorted(picker.started_ids) == sorted(picker.picks)
    assert sorted(picker.finished_ids) == [("ds-a0", "ok")] * 3 + [("ds-b0", "ok")] * 3


async def test_the_picker_hears_of_a_timeout_and_of_the_retry(
    make_data_server: DataServerFactory, http: aiohttp.ClientSession
) -> None:
    first, second = await asyncio.gather(
        make_data_server(shard=0, replica=0, instance_id="ds-0-first"),
        make_data_server(shard=0, replica=1, instance_id="ds-0-second"),
    )
    async with http.post(f"{first.url}/admin/fault", json={"mode": "error", "rate": 1.0}) as r:
        assert r.status == 200
    picker = RecordingPicker()
    fanout = FanOut(http, picker=picker)
    result = await fanout.search([instance_of(first), instance_of(second)], "probe", 5, 2000)
    assert not result.partial  # the retry on the other replica answered
    assert picker.picks == ["ds-0-first", "ds-0-second"]
    assert picker.finished_ids == [("ds-0-first", "failed"), ("ds-0-second", "ok")]

    async with http.post(f"{first.url}/admin/fault", json={"mode": "hang"}) as r:
        assert r.status == 200
    picker = RecordingPicker()
    fanout = FanOut(http, picker=picker)
    result = await fanout.search([instance_of(first)], "probe", 5, 300)
    assert result.shards["timed_out"] == 1
    assert picker.finished_ids == [("ds-0-first", "timed_out")]
    async with http.post(f"{first.url}/admin/fault", json={"mode": "none"}) as r:
        assert r.status == 200


async def test_a_search_server_routes_with_the_picker_it_is_given(
    make_search_server: SearchServerFactory, make_data_server: DataServerFactory
) -> None:
    await asyncio.gather(
        make_data_server(shard=0, instance_id="ds-p0"),
        make_data_server(shard=1, instance_id="ds-p1"),
    )
    picker = RecordingPicker()
    server = await make_search_server(picker=picker)
    await all_see([server], {"ds-p0", "ds-p1"})
    status, body = await get_json(f"{server.url}/search", q="probe", k="3")
    assert status == 200
    assert body["shards"] == {"total": 2, "ok": 2, "failed": 0, "timed_out": 0}
    assert sorted(picker.picks) == ["ds-p0", "ds-p1"]
    assert sorted(picker.finished_ids) == [("ds-p0", "ok"), ("ds-p1", "ok")]
