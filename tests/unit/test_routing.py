"""The fan-out's routing table (``search_server.routing``) followed change by change.

The reference is a table built in full for the same list: after any sequence of
changes, following them must give the same shards with the same replicas, reuse the
replica object of every target that stayed, keep a departed replica only while it is
ejected, and never edit a shard's list a query may still hold.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from discovery.instance import ServiceInstance
from discovery.livelist.feed import ChangeFeed, diff_lists
from discovery.livelist.model import LiveList, LiveListChange
from search_server.fanout import FanOut
from search_server.picking import Replica, target_key
from search_server.routing import RoutingTable
from tests.support import FakeClock, eventually, make_instance


def shape(table: RoutingTable) -> list[tuple[int, list[str]]]:
    """The table as shard -> sorted target keys, for comparing with a full build."""
    return [(shard, sorted(r.key for r in group)) for shard, group in table.table]


def reserves(table: RoutingTable) -> list[tuple[int, list[str]]]:
    """The draining replicas by shard (the shards the script uses), as target keys."""
    return [(shard, sorted(r.key for r in table.reserve(shard))) for shard in range(4)]


def step(
    previous: LiveList,
    upserts: tuple[ServiceInstance, ...] = (),
    removes: Mapping[str, str] | None = None,
) -> LiveListChange:
    """The change a follower reports for a delta: built the way the followers build it."""
    removes = removes or {}
    current = previous.apply(
        epoch=1,
        version=previous.version + 1,
        leader="ss-1",
        published_at=0,
        upserts=upserts,
        removes=removes,
    )
    feed = ChangeFeed()
    changes = feed.subscribe(previous)
    feed.delta(previous, current, upserts, removes)
    queue = changes.queue  # type: ignore[attr-defined]
    queue.get_nowait()  # the subscription's first item: the list it started from
    change: LiveListChange = queue.get_nowait()
    return change


def server(
    instance_id: str, port: int, shard: int, *, registered: int = 1, **payload: object
) -> ServiceInstance:
    """A data server's instance with a chosen registration time (the target key's part
    that tells a re-registration from a payload change)."""
    instance = make_instance(instance_id, port, shard=shard, **payload)
    return dataclasses.replace(instance, registration_time_utc=registered)


def ejected(replica: Replica, clock: FakeClock, seconds: float) -> None:
    replica.failures = 3
    replica.ejected_until = clock.now + seconds


def start(*instances: ServiceInstance) -> LiveList:
    return LiveList(1, 1, "ss-1", 0, {i.id: i for i in instances})


# -- equivalence with a full build ---------------------------------------------------

ops = st.lists(
    st.tuples(
        st.sampled_from(
            ["add", "remove", "reshard", "weigh", "drain", "serve", "reregister", "eject", "tick"]
        ),
        st.integers(min_value=0, max_value=11),  # which server
        st.integers(min_value=0, max_value=3),  # which shard
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=200, derandomize=True, database=None, deadline=None)
@given(ops)
def test_following_changes_gives_the_table_a_full_build_gives(
    script: list[tuple[str, int, int]],
) -> None:
    clock = FakeClock()
    followed = RoutingTable(clock)
    listed = start(*(server(f"ds-{i}", 9000 + i, i % 3) for i in range(6)))
    followed.load(listed.servers)
    registered = 1
    ejections: dict[str, Replica] = {}
    for op, n, shard in script:
        instance_id = f"ds-{n}"
        old = listed.servers.get(instance_id)
        if op == "tick":
            clock.now += 3
            continue
        if op == "eject":
            replica = followed.replica(target_key(old)) if old is not None else None
            if replica is not None:
                ejected(replica, clock, 5)
                ejections[replica.key] = replica
            continue
        if op == "remove":
            if old is None:
                continue
            change = step(listed, removes={instance_id: "gone"})
        elif op == "add":
            if old is not None:
                continue
            change = step(listed, upserts=(server(instance_id, 9000 + n, shard),))
        else:
            if old is None:
                continue
            if op == "reregister":
                registered += 1
            instance = server(
                instance_id,
                9000 + n,
                shard if op == "reshard" else old.payload.shard,
                registered=registered if op == "reregister" else old.registration_time_utc,
                state="draining" if op == "drain" else "serving",
                weight=50 + 10 * shard if op == "weigh" else old.payload.weight,
            )
            change = step(listed, upserts=(instance,))
        kept = {r.key: r for _, group in followed.table for r in group}
        kept.update((r.key, r) for shard in range(4) for r in followed.reserve(shard))
        followed.follow(change)
        listed = change.current
        assert followed.source is listed.servers
        reference = RoutingTable(clock)
        reference.load(listed.servers)
        assert shape(followed) == shape(reference)
        # Draining servers are kept apart, as last resorts, never in the table.
        assert reserves(followed) == reserves(reference)
        assert sorted(key for _, keys in reserves(followed) for key in keys) == sorted(
            target_key(i) for i in listed.servers.values() if i.payload.state == "draining"
        )
        assert (
            followed.routable
            == reference.routable
            == len([i for i in listed.servers.values() if i.routable])
        )
        # The same object for every target that stayed (draining or back): its
        # statistics go on.
        for group in [g for _, g in followed.table] + [followed.reserve(n) for n in range(4)]:
            for replica in group:
                if replica.key in kept:
                    assert replica is kept[replica.key]
                assert replica.shard == replica.instance.payload.shard
                assert replica.weight == replica.instance.payload.weight
                assert replica.instance == listed.servers[replica.instance.id]
        # A replica that left is remembered while, and only while, it is ejected.
        in_table = {r.key for _, group in followed.table for r in group}
        in_table.update(r.key for shard in range(4) for r in followed.reserve(shard))
        for key, replica in ejections.items():
            if key in in_table or replica.is_ejected(clock.now):
                assert followed.replica(key) is replica
            else:
                assert followed.replica(key) is None


# -- one property at a time ------------------------------------------------------------


def test_a_replicas_statistics_survive_a_payload_change() -> None:
    table = RoutingTable(FakeClock())
    a = server("ds-a", 9001, 0, weight=1)
    listed = start(a, make_instance("ds-b", 9002, shard=0))
    table.load(listed.servers)
    replica = table.replica(target_key(a))
    assert replica is not None
    replica.observe(0.010, 0.005, 2.0)
    heavier = server("ds-a", 9001, 0, weight=3)
    table.follow(step(listed, upserts=(heavier,)))
    again = table.replica(target_key(heavier))
    assert again is replica
    assert (again.samples, again.weight, again.instance) == (1, 3, heavier)


def test_a_shard_change_moves_the_replica_and_an_emptied_shard_goes() -> None:
    table = RoutingTable(FakeClock())
    listed = start(server("ds-a", 9001, 0), server("ds-b", 9002, 1))
    table.load(listed.servers)
    moved = server("ds-a", 9001, 2)
    table.follow(step(listed, upserts=(moved,)))
    assert [(shard, [r.instance.id for r in group]) for shard, group in table.table] == [
        (1, ["ds-b"]),
        (2, ["ds-a"]),
    ]


def test_a_shard_list_a_query_holds_is_never_edited() -> None:
    table = RoutingTable(FakeClock())
    a, b = make_instance("ds-a", 9001, shard=0), make_instance("ds-b", 9002, shard=0)
    listed = start(a, b)
    table.load(listed.servers)
    held = table.table[0][1]
    before = list(held)
    change = step(listed, removes={"ds-a": "gone"})
    table.follow(change)
    table.follow(step(change.current, upserts=(make_instance("ds-c", 9003, shard=0),)))
    assert held == before
    assert sorted(r.instance.id for r in table.table[0][1]) == ["ds-b", "ds-c"]


def _ejected_and_gone(
    clock: FakeClock,
) -> tuple[RoutingTable, LiveListChange, ServiceInstance, ServiceInstance, Replica]:
    """ds-a and ds-b in shard 0; ds-a ejected for 10 s, then gone from the list."""
    table = RoutingTable(clock)
    a, b = make_instance("ds-a", 9001, shard=0), make_instance("ds-b", 9002, shard=0)
    listed = start(a, b)
    table.load(listed.servers)
    replica = table.replica(target_key(a))
    assert replica is not None
    ejected(replica, clock, 10)
    gone = step(listed, removes={"ds-a": "gone"})
    table.follow(gone)
    return table, gone, a, b, replica


def test_a_server_that_leaves_while_ejected_comes_back_ejected() -> None:
    clock = FakeClock()
    table, gone, a, _, replica = _ejected_and_gone(clock)
    assert table.replica(target_key(a)) is replica  # remembered while ejected
    table.follow(step(gone.current, upserts=(a,)))
    assert table.replica(target_key(a)) is replica
    assert replica.is_ejected(clock.now)


def test_a_departed_replica_is_forgotten_once_its_ejection_ends() -> None:
    clock = FakeClock()
    table, gone, a, b, _ = _ejected_and_gone(clock)
    clock.advance(11)
    # Any later change sweeps the ejections that ended.
    later = step(gone.current, upserts=(make_instance("ds-c", 9003, shard=1),))
    table.follow(later)
    assert table.replica(target_key(a)) is None
    # And one that leaves healthy is forgotten at once.
    table.follow(step(later.current, removes={"ds-b": "gone"}))
    assert table.replica(target_key(b)) is None


def test_a_change_from_another_list_is_loaded_in_full_and_a_reload_followed() -> None:
    table = RoutingTable(FakeClock())
    a, b = make_instance("ds-a", 9001, shard=0), make_instance("ds-b", 9002, shard=1)
    listed = start(a)
    table.load(listed.servers)
    other = start(b)
    # Not the list the table holds: the delta cannot be trusted, the whole list is.
    unrelated = step(other, upserts=(make_instance("ds-c", 9003, shard=2),))
    assert table.follow(unrelated) == "full"
    assert shape(table) == [
        (1, [target_key(b)]),
        (2, [target_key(unrelated.current.servers["ds-c"])]),
    ]
    # A reload (a reconcile, a gap) from the list the table holds: the follower's
    # comparison of the two lists is the delta.
    reloaded = diff_lists(unrelated.current, listed)
    assert reloaded.reload
    assert table.follow(reloaded) == "change"
    assert shape(table) == [(0, [target_key(a)])]
    assert table.source is listed.servers


@pytest.mark.parametrize("servers", [500, 5000])
def test_the_fan_out_routes_with_the_table_it_followed(servers: int) -> None:
    fanout = FanOut()
    listed = start(*(make_instance(f"ds-{i}", 9000 + i, shard=i % 50) for i in range(servers)))
    fanout.follow(LiveListChange(LiveList.EMPTY, listed, added=listed.servers, reload=True))
    table = fanout.routing.table_for(listed.servers)
    change = step(listed, removes={"ds-7": "gone"})
    fanout.follow(change)
    # The same table object, moved along: no rebuild for the list it follows.
    assert fanout.routing.table_for(change.current.servers) is table
    assert sum(len(group) for _, group in table) == servers - 1
    assert fanout.replica(listed.servers["ds-7"]) is None


class _Feed:
    """A follower's ``changes()`` alone, fed by the test."""

    def __init__(self, current: LiveList) -> None:
        self.feed = ChangeFeed()
        self.current = current

    def changes(self) -> object:
        return self.feed.subscribe(self.current)


class _BrokenFanOut(FanOut):
    def follow(self, change: LiveListChange) -> None:
        raise RuntimeError("a defect in following")


async def test_a_change_the_fan_out_fails_to_follow_is_routed_by_a_rebuild() -> None:
    from search_server.clusterview import ClusterViews
    from search_server.followroutes import FollowRoutes

    listed = start(server("ds-a", 9001, 0), server("ds-b", 9002, 1))
    follower = _Feed(listed)
    fanout = _BrokenFanOut()
    views = ClusterViews(lambda instance, ejected: {"id": instance.id})
    async with FollowRoutes(follower, fanout, views) as routes:  # type: ignore[arg-type]
        await eventually(lambda: routes.current is listed, message="the first list taken")
        change = step(listed, removes={"ds-a": "gone"})
        follower.feed.publish(change)
        await eventually(lambda: routes.current is change.current, message="the change taken")
    # The list routed with moved on all the same, and the fan-out builds its table for it.
    table = fanout.routing.table_for(routes.current.servers)
    assert [(shard, [r.instance.id for r in group]) for shard, group in table] == [(1, ["ds-b"])]
    await fanout.aclose()
