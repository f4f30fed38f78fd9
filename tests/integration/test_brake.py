"""The leader's mass-loss brake: the policy with a fake clock, then a real leader.

The unit tests drive :class:`MassLossBrake` with member views and a clock of our own.
The integration tests run a real search server (the leader) against the test's
ZooKeeper and Redis, register data servers as raw ephemeral znodes, and close the
sessions that own them, as a ZooKeeper-side partition would.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from discovery.errors import ConfigError
from discovery.instance import InstanceState, ServiceInstance
from discovery.livelist.brake import MassLossBrake, MassLossBrakeConfig
from discovery.livelist.redis.layout import ChangeEntry, RedisKeys, load, parse_change
from discovery.metrics import MassLossBrakeMetrics
from discovery.zk.paths import DATA_SERVERS_PATH
from discovery.zk.session import ZkSession
from search_server.config import SearchServerConfig, build_parser
from search_server.server import SearchServer
from tests.support import (
    FakeClock,
    SearchServerFactory,
    SessionFactory,
    eventually,
    live_ids,
    make_instance,
    view,
)


def _fleet(n: int) -> list[ServiceInstance]:
    return [make_instance(f"ds-{i:02d}", 9000 + i, shard=i) for i in range(n)]


def _without(view: Mapping[str, ServiceInstance], *ids: str) -> dict[str, ServiceInstance]:
    return {k: v for k, v in view.items() if k not in ids}


def _brake(
    clock: FakeClock, registry: CollectorRegistry | None = None, **config: Any
) -> MassLossBrake:
    settings_ = {"fraction": 0.3, "window": 10.0, "hold": 30.0, "min_count": 3, **config}
    metrics = MassLossBrakeMetrics(registry) if registry is not None else None
    return MassLossBrake(MassLossBrakeConfig(**settings_), clock=clock, metrics=metrics)


# -- the policy -------------------------------------------------------------------


def test_losses_up_to_the_threshold_pass_and_one_more_engages() -> None:
    clock = FakeClock()
    full = view(*_fleet(10))
    # 3 of 10 is exactly 30 %: not more than the fraction, so they pass at once.
    below = _brake(clock)
    below.apply(full)
    decision = below.apply(_without(full, "ds-00", "ds-01", "ds-02"))
    assert set(decision.members) == set(full) - {"ds-00", "ds-01", "ds-02"}
    assert not below.engaged

    # 4 of 10 is 40 %: all four stay published, unchanged.
    registry = CollectorRegistry()
    above = _brake(clock, registry)
    above.apply(full)
    decision = above.apply(_without(full, "ds-00", "ds-01", "ds-02", "ds-03"))
    assert decision.members == full
    assert above.engaged
    assert set(above.held) == {"ds-00", "ds-01", "ds-02", "ds-03"}
    assert registry.get_sample_value("discovery_leader_mass_loss_brake_engaged") == 1
    assert registry.get_sample_value("discovery_leader_mass_loss_held") == 4
    assert registry.get_sample_value("discovery_leader_mass_loss_engagements_total") == 1
    status = above.status().to_dict()
    assert status["engaged"] is True
    assert status["held"] == ["ds-00", "ds-01", "ds-02", "ds-03"]
    assert status["release_in_ms"] == 30_000


def test_min_count_keeps_small_clusters_from_engaging() -> None:
    clock = FakeClock()
    pair = view(*_fleet(2))
    brake = _brake(clock)
    brake.apply(pair)
    # One of two is 50 %, far above the fraction, but fewer than min_count servers.
    assert set(brake.apply(_without(pair, "ds-00")).members) == {"ds-01"}
    assert not brake.engaged

    five = view(*_fleet(5))
    brake = _brake(clock, min_count=3)
    brake.apply(five)
    assert len(brake.apply(_without(five, "ds-00", "ds-01")).members) == 3
    assert not brake.engaged
    # A third loss within the window reaches min_count (3 of 5 > 30 %): all three
    # are held, the two already published as removed are published again.
    clock.now += 1
    decision = brake.apply(_without(five, "ds-00", "ds-01", "ds-02"))
    assert brake.engaged
    assert set(brake.held) == {"ds-00", "ds-01", "ds-02"}
    assert decision.members == five
    # Each for ``hold`` seconds from its own vanishing.
    assert brake.seconds_until_release() == pytest.approx(29.0)
    clock.now += 29
    decision = brake.apply(_without(five, "ds-00", "ds-01", "ds-02"))
    assert decision.released == {"ds-00", "ds-01"}
    assert set(decision.members) == {"ds-02", "ds-03", "ds-04"}
    clock.now += 1
    assert brake.apply(_without(five, "ds-00", "ds-01", "ds-02")).released == {"ds-02"}
    assert not brake.engaged


def test_losses_spread_wider_than_the_window_do_not_add_up() -> None:
    clock = FakeClock()
    full = view(*_fleet(10))
    brake = _brake(clock, window=10.0)
    brake.apply(full)
    brake.apply(_without(full, "ds-00", "ds-01"))
    clock.now += 10.5
    decision = brake.apply(_without(full, "ds-00", "ds-01", "ds-02", "ds-03"))
    assert not brake.engaged
    assert len(decision.members) == 6

    # The same losses inside one window engage it.
    brake = _brake(clock, window=10.0)
    brake.apply(full)
    brake.apply(_without(full, "ds-00", "ds-01"))
    clock.now += 5
    decision = brake.apply(_without(full, "ds-00", "ds-01", "ds-02", "ds-03"))
    assert brake.engaged
    assert set(brake.held) == {"ds-00", "ds-01", "ds-02", "ds-03"}
    assert decision.members == full


def test_held_removals_are_released_at_the_end_of_the_hold_and_no_later() -> None:
    clock = FakeClock()
    registry = CollectorRegistry()
    full = view(*_fleet(10))
    brake = _brake(clock, registry, hold=30.0)
    brake.apply(full)
    gone = ("ds-00", "ds-01", "ds-02", "ds-03", "ds-04")
    rest = _without(full, *gone)
    brake.apply(rest)
    assert brake.seconds_until_release() == 30.0

    clock.now += 29.9
    assert brake.apply(rest).members == full
    assert brake.seconds_until_release() == pytest.approx(0.1)

    clock.now += 0.1
    decision = brake.apply(rest)
    assert set(decision.members) == set(rest)
    assert decision.released == frozenset(gone)
    assert not brake.engaged
    assert brake.seconds_until_release() is None
    assert registry.get_sample_value("discovery_leader_mass_loss_brake_engaged") == 0
    assert registry.get_sample_value("discovery_leader_mass_loss_held") == 0
    assert (
        registry.get_sample_value(
            "discovery_leader_mass_loss_released_total", {"outcome": "expired"}
        )
        == 5
    )
    # The released losses do not count again: the brake starts afresh.
    assert set(brake.apply(rest).members) == set(rest)
    assert not brake.engaged


def test_servers_that_come_back_during_the_hold_stay_and_the_rest_are_released() -> None:
    clock = FakeClock()
    registry = CollectorRegistry()
    fleet = _fleet(10)
    full = view(*fleet)
    brake = _brake(clock, registry)
    brake.apply(full)
    gone = ("ds-00", "ds-01", "ds-02", "ds-03")
    brake.apply(_without(full, *gone))

    clock.now += 5
    # ds-00 re-registers (a new registration time: a changed entry, not a held one).
    back = make_instance("ds-00", 9000, shard=0, docs=2000)
    current = {**_without(full, *gone), "ds-00": back}
    decision = brake.apply(current)
    assert decision.members["ds-00"] == back
    assert set(brake.held) == {"ds-01", "ds-02", "ds-03"}

    clock.now += 25
    decision = brake.apply(current)
    assert set(decision.members) == set(current)
    assert decision.released == {"ds-01", "ds-02", "ds-03"}
    released = "discovery_leader_mass_loss_released_total"
    assert registry.get_sample_value(released, {"outcome": "returned"}) == 1
    assert registry.get_sample_value(released, {"outcome": "expired"}) == 3


def test_brake_disengages_early_when_everything_held_came_back() -> None:
    clock = FakeClock()
    full = view(*_fleet(10))
    brake = _brake(clock)
    brake.apply(full)
    brake.apply(_without(full, "ds-00", "ds-01", "ds-02", "ds-03"))
    clock.now += 3
    decision = brake.apply(full)
    assert decision.members == full
    assert not brake.engaged
    assert decision.released == frozenset()


def test_announced_departures_are_never_held() -> None:
    clock = FakeClock()
    fleet = _fleet(10)
    full = view(*fleet)
    brake = _brake(clock)
    brake.apply(full)
    # Five servers drain (announce it), then their nodes go: a deliberate removal.
    draining = {i.id: i.with_state(InstanceState.DRAINING, reason="draining") for i in fleet[:5]}
    brake.apply({**full, **draining})
    decision = brake.apply(_without(full, *draining))
    assert set(decision.members) == {i.id for i in fleet[5:]}
    assert not brake.engaged

    # While engaged, a draining server that leaves still goes at once.
    brake = _brake(clock)
    brake.apply(full)
    leaving = fleet[9].with_state(InstanceState.DRAINING, reason="draining")
    marked = {**full, "ds-09": leaving}
    brake.apply(marked)
    brake.apply(_without(marked, "ds-00", "ds-01", "ds-02", "ds-03"))
    assert brake.engaged
    decision = brake.apply(_without(marked, "ds-00", "ds-01", "ds-02", "ds-03", "ds-09"))
    assert "ds-09" not in decision.members
    assert set(brake.held) == {"ds-00", "ds-01", "ds-02", "ds-03"}


def test_additions_and_changes_pass_while_engaged_and_later_losses_join_the_hold() -> None:
    clock = FakeClock()
    full = view(*_fleet(10))
    brake = _brake(clock, hold=30.0)
    brake.apply(full)
    brake.apply(_without(full, "ds-00", "ds-01", "ds-02", "ds-03"))
    clock.now += 10
    new = make_instance("ds-new", 9999)
    changed = full["ds-05"].with_state(InstanceState.DRAINING, reason="draining")
    current = {**_without(full, "ds-00", "ds-01", "ds-02", "ds-03", "ds-04"), "ds-new": new}
    current["ds-05"] = changed
    decision = brake.apply(current)
    assert decision.members["ds-new"] == new
    assert decision.members["ds-05"] == changed
    # ds-04 vanished during the partition: held too, for hold seconds of its own.
    assert set(brake.held) == {"ds-00", "ds-01", "ds-02", "ds-03", "ds-04"}
    clock.now += 20
    decision = brake.apply(current)
    assert decision.released == {"ds-00", "ds-01", "ds-02", "ds-03"}
    assert set(decision.members) == set(current) | {"ds-04"}
    assert brake.engaged
    clock.now += 10
    decision = brake.apply(current)
    assert decision.released == {"ds-04"}
    assert set(decision.members) == set(current)
    assert not brake.engaged


@pytest.mark.parametrize("config", [{"fraction": 1.0}, {"hold": 0.0}])
def test_fraction_one_or_hold_zero_disables_the_brake(config: dict[str, float]) -> None:
    clock = FakeClock()
    full = view(*_fleet(10))
    brake = _brake(clock, None, **config)
    brake.apply(full)
    assert brake.apply({}).members == {}
    assert not brake.engaged
    assert brake.status().enabled is False


@settings(max_examples=150, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.floats(min_value=0.0, max_value=8.0),
            st.sets(st.integers(min_value=0, max_value=11), max_size=12),
        ),
        min_size=1,
        max_size=40,
    ),
    hold=st.floats(min_value=0.5, max_value=20.0),
    window=st.floats(min_value=0.5, max_value=20.0),
)
def test_no_removal_is_ever_held_longer_than_hold(
    steps: list[tuple[float, set[int]]], hold: float, window: float
) -> None:
    """Whatever the sequence, a server absent from the real view is absent from what
    is published within ``hold`` seconds of vanishing, and present ones always are."""
    clock = FakeClock()
    fleet = _fleet(12)
    brake = _brake(clock, hold=hold, window=window, fraction=0.2, min_count=2)
    brake.apply(view(*fleet))
    gone_since: dict[str, float] = {}
    for advance, absent in steps:
        clock.now += advance
        current = view(*(i for n, i in enumerate(fleet) if n not in absent))
        for instance in fleet:
            if instance.id in current:
                gone_since.pop(instance.id, None)
            else:
                gone_since.setdefault(instance.id, clock.now)
        published = brake.apply(current).members
        assert set(current) <= set(published)
        for instance_id in set(published) - set(current):
            assert clock.now - gone_since[instance_id] < hold + 1e-9
        release = brake.seconds_until_release()
        assert release is None or release <= hold + 1e-9


# -- configuration ----------------------------------------------------------------


def test_bad_settings_are_refused_naming_the_flag() -> None:
    for field, value, flag in [
        ("fraction", 0.0, "--mass-loss-fraction"),
        ("fraction", 1.5, "--mass-loss-fraction"),
        ("window", 0.0, "--mass-loss-window"),
        ("hold", -1.0, "--mass-loss-hold"),
        ("min_count", 0, "--mass-loss-min"),
    ]:
        with pytest.raises(ConfigError, match=flag):
            MassLossBrakeConfig(**{field: value})  # type: ignore[arg-type]


def _parse(argv: list[str]) -> SearchServerConfig:
    return SearchServerConfig.from_args(build_parser().parse_args(argv))


def test_flags_and_environment_build_the_brake_config(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _parse([]).mass_loss == MassLossBrakeConfig(0.3, 10.0, 30.0, 3)
    config = _parse(
        [
            "--mass-loss-fraction",
            "0.5",
            "--mass-loss-window",
            "4",
            "--mass-loss-hold",
            "12",
            "--mass-loss-min",
            "5",
        ]
    )
    assert config.mass_loss == MassLossBrakeConfig(0.5, 4.0, 12.0, 5)
    monkeypatch.setenv("DISCOVERY_MASS_LOSS_HOLD", "0")
    assert not _parse([]).mass_loss.enabled

    with pytest.raises(SystemExit):
        build_parser().parse_args(["--mass-loss-fraction", "1.5"])
    assert "--mass-loss-fraction" in capsys.readouterr().err
    monkeypatch.setenv("DISCOVERY_MASS_LOSS_FRACTION", "lots")
    with pytest.raises(SystemExit):
        build_parser()
    assert "DISCOVERY_MASS_LOSS_FRACTION" in capsys.readouterr().err


# -- a real leader ----------------------------------------------------------------

_METRIC = "discovery_leader_mass_loss_brake_engaged"


async def _register(session: ZkSession, instances: list[ServiceInstance]) -> None:
    await session.ensure_path(DATA_SERVERS_PATH)
    for instance in instances:
        await session.create(
            f"{DATA_SERVERS_PATH}/{instance.id}", instance.to_json(), ephemeral=True
        )


async def _published(client: aioredis.Redis, prefix: str) -> tuple[int, set[str]]:
    loaded = await load(client, RedisKeys(prefix))
    if loaded.meta is None:
        return 0, set()
    return loaded.meta.version, set(loaded.servers)


async def _leader(
    make_search_server: SearchServerFactory, *, fields: Mapping[str, Any] = {}, **brake: Any
) -> SearchServer:
    server = await make_search_server(
        server_id="ss-brake", mass_loss=MassLossBrakeConfig(**brake), **fields
    )
    await eventually(lambda: server.is_leader, message="leader")
    return server


class EventLog:
    """The leader's entries of ``<prefix>:changes`` from now on, collected in the
    background."""

    def __init__(self, client: aioredis.Redis, prefix: str) -> None:
        self.events: list[ChangeEntry] = []
        self._client = client
        self._stream = RedisKeys(prefix).changes
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> EventLog:
        last = await self._client.xrevrange(self._stream, count=1)
        self._task = asyncio.create_task(self._collect(last[0][0] if last else "0-0"))
        return self

    async def _collect(self, last: str | bytes) -> None:
        while True:
            reply = await self._client.xread({self._stream: last}, block=500)
            for _name, entries in reply or []:
                for stream_id, fields in entries:
                    last = stream_id
                    self.events.append(parse_change(stream_id, fields))

    def removal_reasons(self) -> dict[str, str]:
        return {rid: why for e in self.events for rid, why in e.removes}

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


async def test_losses_below_the_threshold_are_removed_at_once(
    make_search_server: SearchServerFactory,
    make_session: SessionFactory,
    client: aioredis.Redis,
    redis_prefix: str,
) -> None:
    fleet = _fleet(10)
    staying, leaving = await make_session(), await make_session()
    await _register(staying, fleet[:8])
    await _register(leaving, fleet[8:])
    # A hold far longer than the wait below: a removal seen within it was not held.
    leader = await _leader(make_search_server, fraction=0.3, window=10, hold=120, min_count=3)
    await eventually(lambda: len(live_ids(leader)) == 10, message="all ten routed")

    await leaving.aclose()  # 2 of 10: under min_count and under 30 %

    expected = {i.id for i in fleet[:8]}
    await eventually(lambda: live_ids(leader) == expected, timeout=20, message="removed")
    assert (await _published(client, redis_prefix))[1] == expected
    assert leader.registry.get_sample_value(_METRIC) == 0
    assert leader.registry.get_sample_value("discovery_leader_mass_loss_engagements_total") == 0
    assert leader.cluster_view()["mass_loss_brake"]["engaged"] is False
    # Only the leader runs the brake; another search server says it does not know.
    other = await make_search_server(server_id="ss-other")
    await eventually(lambda: live_ids(other) == expected, message="follower routed")
    assert other.cluster_view()["mass_loss_brake"] is None


async def test_mass_loss_is_held_for_the_hold_then_published(
    make_search_server: SearchServerFactory,
    make_session: SessionFactory,
    client: aioredis.Redis,
    redis_prefix: str,
) -> None:
    hold = 5.0
    fleet = _fleet(10)
    staying, rack = await make_session(), await make_session()
    await _register(staying, fleet[:4])
    # One session for the six that vanish together: its close deletes all six nodes in
    # one ZooKeeper transaction. The leader may still read the first deletion alone (its
    # watcher reads a change after a quiet spell at once), publish it, and put it back
    # when the rest cross the threshold: the brake holds every loss of the window.
    await _register(rack, fleet[4:])
    leader = await _leader(make_search_server, fraction=0.3, window=10, hold=hold, min_count=3)
    everyone = {i.id for i in fleet}
    await eventually(lambda: live_ids(leader) == everyone, message="all ten routed")

    async with EventLog(client, redis_prefix) as events:
        started = time.monotonic()
        await rack.aclose()
        await eventually(lambda: leader.registry.get_sample_value(_METRIC) == 1, message="engaged")

        # Held: still published and routed, unchanged; the metrics and /cluster say so.
        await eventually(
            lambda: _published_ids(client, redis_prefix, everyone), message="held published"
        )
        version, published = await _published(client, redis_prefix)
        assert published == everyone
        await eventually(lambda: live_ids(leader) == everyone, message="held routed")
        # All six held, the last ones perhaps read a refresh after the brake engaged.
        await eventually(
            lambda: leader.registry.get_sample_value("discovery_leader_mass_loss_held") == 6,
            message="six held",
        )
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"{leader.url}/cluster") as response,
        ):
            view = (await response.json())["mass_loss_brake"]
        assert view["engaged"] is True
        assert view["held"] == sorted(i.id for i in fleet[4:])
        assert 0 < view["release_in_ms"] <= hold * 1000

        # A full republish meanwhile (here: the snapshot lost from Redis) keeps them.
        await client.delete(*RedisKeys(redis_prefix).all)
        await eventually(
            lambda: _republished(client, redis_prefix, version), message="full republish"
        )
        assert (await _published(client, redis_prefix))[1] == everyone
        # Read before this check, so the snapshot above was written while held.
        assert leader.registry.get_sample_value(_METRIC) == 1

        # Released at the end of the hold, not before and not long after.
        remaining = {i.id for i in fleet[:4]}
        await eventually(
            lambda: live_ids(leader) == remaining, timeout=hold + 15, message="released"
        )
        assert time.monotonic() - started >= hold - 0.05
        assert (await _published(client, redis_prefix))[1] == remaining
        assert leader.registry.get_sample_value(_METRIC) == 0
        assert leader.registry.get_sample_value("discovery_leader_mass_loss_held") == 0
        assert (
            leader.registry.get_sample_value(
                "discovery_leader_mass_loss_released_total", {"outcome": "expired"}
            )
            == 6
        )
        await eventually(lambda: len(events.removal_reasons()) == 6, message="removal event")
        assert all("mass-loss brake" in r for r in events.removal_reasons().values())
    assert leader.cluster_view()["mass_loss_brake"]["engaged"] is False


async def _published_ids(client: aioredis.Redis, prefix: str, ids: set[str]) -> bool:
    return (await _published(client, prefix))[1] == ids


async def _republished(client: aioredis.Redis, prefix: str, version: int) -> bool:
    return (await _published(client, prefix))[0] > version


async def test_separate_sessions_lost_together_are_held_and_returners_stay(
    make_search_server: SearchServerFactory,
    make_session: SessionFactory,
    client: aioredis.Redis,
    redis_prefix: str,
) -> None:
    hold = 4.0
    fleet = _fleet(10)
    sessions = [await make_session() for _ in fleet]
    for session, instance in zip(sessions, fleet, strict=True):
        await _register(session, [instance])
    # Heartbeats far apart: the release below must come from the leader waking at the
    # end of the hold, not from a heartbeat that happens to re-run the decision.
    leader = await _leader(
        make_search_server,
        fields={"heartbeat_interval": 60.0, "heartbeat_ttl": 120.0},
        fraction=0.3,
        window=10,
        hold=hold,
        min_count=3,
    )
    everyone = {i.id for i in fleet}
    await eventually(lambda: live_ids(leader) == everyone, message="all ten routed")

    # Six data servers' sessions end at once, each its own.
    await asyncio.gather(*(s.aclose() for s in sessions[4:]))
    six = {i.id for i in fleet[4:]}
    # The first to go may have been published as removed before the threshold was
    # crossed; engaging brings them back, so in the end all six are held and routed.
    await eventually(
        lambda: set(leader.cluster_view()["mass_loss_brake"]["held"]) == six,
        message="all six held",
    )
    await eventually(lambda: live_ids(leader) == everyone, message="all six still routed")
    assert leader.registry.get_sample_value(_METRIC) == 1
    held = six
    # Two of the held servers come back during the hold: they simply stay.
    back = sorted(held)[:2]
    returning = await make_session()
    await _register(returning, [i for i in fleet if i.id in back])
    await eventually(
        lambda: (
            leader.registry.get_sample_value(
                "discovery_leader_mass_loss_released_total", {"outcome": "returned"}
            )
            == 2
        ),
        message="returners seen",
    )

    expected = {i.id for i in fleet[:4]} | set(back)
    await eventually(lambda: live_ids(leader) == expected, timeout=hold + 10, message="released")
    assert (await _published(client, redis_prefix))[1] == expected
    assert leader.registry.get_sample_value(_METRIC) == 0
