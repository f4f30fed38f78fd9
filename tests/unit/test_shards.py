"""The shard index of the live list (``discovery.livelist.shards``).

The reference is an index loaded in full from the same list: following any sequence of
changes must give the same shards, routable entries and reserves, and a per-shard list
obtained before a change must be the same after it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from hypothesis import given, settings
from hypothesis import strategies as st

from discovery.instance import ServiceInstance
from discovery.livelist import Route, ShardIndex, route_of, unroutable_kind
from discovery.livelist.feed import diff_lists
from discovery.livelist.model import LiveList, LiveListChange
from tests.support import make_instance


def server(
    instance_id: str, shard: int, *, enabled: bool = True, **payload: object
) -> ServiceInstance:
    instance = make_instance(instance_id, 9000, shard=shard, **payload)
    return instance if enabled else dataclasses.replace(instance, enabled=False)


def listed(*instances: ServiceInstance) -> LiveList:
    return LiveList(1, 1, "ss-1", 0, {i.id: i for i in instances})


def step(
    previous: LiveList, upserts: Iterable[ServiceInstance] = (), removes: Iterable[str] = ()
) -> LiveListChange:
    """The change a follower reports for a delta of ``previous``."""
    upserts, removes = tuple(upserts), tuple(removes)
    current = previous.apply(
        epoch=1,
        version=previous.version + 1,
        leader="ss-1",
        published_at=0,
        upserts=upserts,
        removes=removes,
    )
    before = previous.servers
    return LiveListChange(
        previous,
        current,
        added={i.id: i for i in upserts if i.id not in before},
        changed={i.id: i for i in upserts if i.id in before},
        removed={k: "gone" for k in removes if k in before},
    )


def ids(entries: Iterable[ServiceInstance]) -> list[str]:
    return sorted(i.id for i in entries)


def shape(index: ShardIndex[ServiceInstance]) -> dict[str, object]:
    """What the index answers, order within a shard aside."""
    shards = {i.payload.shard for i in _held(index)}
    return {
        "table": [(shard, ids(group)) for shard, group in index.table],
        "reserve": {s: ids(index.reserve(s)) for s in sorted(shards) if index.reserve(s)},
        "counts": (index.routable_count, index.reserve_count),
    }


def _held(index: ShardIndex[ServiceInstance]) -> list[ServiceInstance]:
    found = [i for _, group in index.table for i in group]
    source = index.source
    assert isinstance(source, Mapping)
    found += [
        i for shard in {i.payload.shard for i in source.values()} for i in index.reserve(shard)
    ]
    return found


# -- the rule ------------------------------------------------------------------------


def test_the_rule_routable_reserve_or_neither() -> None:
    serving = server("a", 0)
    disabled = server("b", 0, enabled=False)
    draining = serving.with_state("draining")
    maintenance = serving.with_state("maintenance")
    assert [route_of(i) for i in (serving, disabled, draining, maintenance)] == [
        Route.ROUTABLE,
        None,
        Route.RESERVE,
        None,
    ]
    assert [unroutable_kind(i) for i in (serving, disabled, draining, maintenance)] == [
        None,
        "disabled",
        "draining",
        "maintenance",
    ]
    # Draining whatever its enabled flag says (a Curator client may leave it on).
    assert route_of(dataclasses.replace(draining, enabled=True)) is Route.RESERVE
    # Routable is the instance's own word for it, in every combination.
    for instance in (serving, draining, maintenance):
        for enabled in (True, False):
            either = dataclasses.replace(instance, enabled=enabled)
            assert (route_of(either) is Route.ROUTABLE) is either.routable
            assert (unroutable_kind(either) is None) is either.routable


# -- load and follow ---------------------------------------------------------------


def test_a_load_groups_by_shard_in_shard_order() -> None:
    index = ShardIndex.instances()
    servers = listed(
        server("a", 2),
        server("b", 0),
        server("c", 0),
        server("d", 0, state="draining"),
        server("e", 1, state="maintenance"),
        server("f", 1, enabled=False),
        server("g", 3, state="draining"),
    )
    index.load(servers.servers)
    assert index.source is servers.servers
    assert [(shard, ids(group)) for shard, group in index.table] == [(0, ["b", "c"]), (2, ["a"])]
    assert ids(index.routable(0)) == ["b", "c"]
    assert ids(index.reserve(0)) == ["d"]
    assert index.routable(1) == []
    assert index.reserve(1) == []
    assert (index.routable_count, index.reserve_count) == (3, 2)
    assert index.get("b") is servers.servers["b"]
    assert index.get("d") is servers.servers["d"]
    assert index.get("e") is None
    assert index.get("f") is None
    assert index.get("zz") is None


def test_draining_is_the_last_resort() -> None:
    index = ShardIndex.instances()
    index.load(listed(server("a", 0), server("b", 0, state="draining"), server("c", 0)).servers)
    preference = index.preference(0)
    assert ids(preference[:2]) == ["a", "c"]
    assert [i.id for i in preference[2:]] == ["b"]
    # Without a reserve it is the routable list itself; a shard of draining servers
    # alone has no routable entry (not in the table) but its last resort.
    assert index.preference(5) == []
    index.load(listed(server("a", 0), server("d", 1, state="draining")).servers)
    assert index.preference(0) is index.routable(0)
    assert [shard for shard, _ in index.table] == [0]
    assert [i.id for i in index.preference(1)] == ["d"]


def test_each_kind_of_change_is_followed() -> None:
    index = ShardIndex.instances()
    first = listed(server("a", 0), server("b", 0), server("c", 1))
    index.load(first.servers)
    added = step(first, [server("d", 1)])
    assert index.follow(added) == "change"
    assert ids(index.routable(1)) == ["c", "d"]
    weighed = step(added.current, [server("a", 0, weight=300)])
    index.follow(weighed)
    assert [i.payload.weight for i in index.routable(0) if i.id == "a"] == [300]
    moved = step(weighed.current, [server("b", 2)])
    index.follow(moved)
    assert [(shard, ids(group)) for shard, group in index.table] == [
        (0, ["a"]),
        (1, ["c", "d"]),
        (2, ["b"]),
    ]
    drained = step(moved.current, [server("b", 2, state="draining")])
    index.follow(drained)
    assert [shard for shard, _ in index.table] == [0, 1]  # an emptied shard goes
    assert ids(index.reserve(2)) == ["b"]
    maintained = step(drained.current, [server("b", 2, state="maintenance")])
    index.follow(maintained)
    assert index.reserve(2) == []
    assert index.get("b") is None
    removed = step(maintained.current, removes=["c", "b"])
    index.follow(removed)
    assert ids(index.routable(1)) == ["d"]
    assert (index.routable_count, index.reserve_count) == (2, 0)
    assert index.source is removed.current.servers
    # An add of an id already indexed is a change, not a second entry.
    again = LiveListChange(removed.current, step(removed.current, [server("d", 0)]).current,
                           added={"d": server("d", 0)})  # fmt: skip
    index.follow(again)
    assert [(shard, ids(group)) for shard, group in index.table] == [(0, ["a", "d"])]


def test_a_reload_is_followed_and_another_list_is_loaded() -> None:
    index = ShardIndex.instances()
    first = listed(server("a", 0))
    index.load(first.servers)
    # Not the list the index holds: its delta cannot be trusted, the whole list is.
    unrelated = step(listed(server("b", 1)), [server("c", 2)])
    assert index.follow(unrelated) == "full"
    assert [(shard, ids(group)) for shard, group in index.table] == [(1, ["b"]), (2, ["c"])]
    assert index.follow(unrelated) == "none"
    # A reload from the list the index holds: its comparison with it is the delta.
    reloaded = diff_lists(unrelated.current, first)
    assert index.follow(reloaded) == "change"
    assert [(shard, ids(group)) for shard, group in index.table] == [(0, ["a"])]
    assert index.source is first.servers


def test_a_list_obtained_before_a_change_is_unchanged_after_it() -> None:
    index = ShardIndex.instances()
    first = listed(server("a", 0), server("b", 0), server("c", 0, state="draining"))
    index.load(first.servers)
    routable, reserve, preference = index.routable(0), index.reserve(0), index.preference(0)
    kept = (list(routable), list(reserve), list(preference))
    change = step(
        first,
        [server("d", 0), server("e", 0, state="draining"), server("a", 0, weight=7)],
        removes=["b", "c"],
    )
    index.follow(change)
    index.follow(step(change.current, removes=["a", "d", "e"]))
    assert (routable, reserve, preference) == kept
    assert index.table == []
    assert index.reserve(0) == []


# -- what is stored ------------------------------------------------------------------


@dataclasses.dataclass(eq=False)
class Box:
    instance: ServiceInstance


def test_entries_are_kept_refused_and_let_go() -> None:
    left: list[str] = []
    made: list[tuple[str, bool]] = []

    def entry(instance: ServiceInstance, previous: Box | None) -> Box | None:
        made.append((instance.id, previous is not None))
        if instance.payload.docs == 0:
            return None  # refused
        if previous is not None and previous.instance.port == instance.port:
            previous.instance = instance
            return previous
        return Box(instance)

    index = ShardIndex[Box](entry, on_leave=lambda box: left.append(box.instance.id))
    first = listed(server("a", 0), server("b", 0), server("m", 0, state="maintenance"))
    index.load(first.servers)
    assert sorted(made) == [("a", False), ("b", False)]  # never offered a maintenance one
    group, a = index.routable(0), index.get("a")
    # A payload change that keeps the entry where it was: the shard's list stays.
    weighed = step(first, [server("a", 0, weight=5)])
    index.follow(weighed)
    assert index.get("a") is a
    assert index.routable(0) is group
    assert left == []
    # A new entry for the same id (another port): the old one leaves.
    moved = step(weighed.current, [dataclasses.replace(server("a", 0), port=9999)])
    index.follow(moved)
    assert index.get("a") is not a
    assert left == ["a"]
    # Refused, gone to maintenance, removed: each leaves.
    refused = step(moved.current, [server("b", 0, docs=0)])
    index.follow(refused)
    assert index.get("b") is None
    assert left == ["a", "b"]
    maintained = dataclasses.replace(server("a", 0, state="maintenance"), port=9999)
    gone = step(refused.current, [maintained])
    index.follow(gone)
    assert left == ["a", "b", "a"]
    added = step(gone.current, [server("c", 1)])
    index.follow(added)
    index.follow(step(added.current, removes=["c"]))
    assert left == ["a", "b", "a", "c"]
    assert index.table == []
    # A load offers each id's previous entry and lets go of those not carried over.
    left.clear()
    second = listed(server("x", 1), server("y", 1))
    index.load(second.servers)
    x, y = index.get("x"), index.get("y")
    made.clear()
    index.load(listed(second.servers["x"], server("y", 1, state="maintenance")).servers)
    assert made == [("x", True)]
    assert index.get("x") is x
    assert left == ["y"]
    assert y is not None


# -- equivalence with a full load ----------------------------------------------------

_SERVERS = [f"ds-{n}" for n in range(10)]

changes = st.lists(
    st.lists(
        st.tuples(
            st.sampled_from(_SERVERS),
            st.one_of(
                st.none(),  # removed
                st.tuples(
                    st.integers(min_value=0, max_value=3),  # shard
                    st.sampled_from(["serving", "draining", "maintenance", "disabled"]),
                    st.integers(min_value=1, max_value=3),  # weight
                ),
            ),
        ),
        max_size=4,
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=200, derandomize=True, database=None, deadline=None)
@given(changes, st.integers(min_value=0, max_value=29))
def test_following_any_changes_gives_what_loading_the_last_list_gives(
    script: list[list[tuple[str, tuple[int, str, int] | None]]], reload_at: int
) -> None:
    current = listed(*(server(i, n % 3) for n, i in enumerate(_SERVERS[:6])))
    followed = ShardIndex.instances()
    followed.load(current.servers)
    for number, batch in enumerate(script):
        upserts: dict[str, ServiceInstance] = {}
        removes: set[str] = set()
        for instance_id, what in batch:
            if what is None:
                removes.add(instance_id)
                upserts.pop(instance_id, None)
                continue
            shard, state, weight = what
            upserts[instance_id] = server(
                instance_id,
                shard,
                enabled=state != "disabled",
                state="serving" if state == "disabled" else state,
                weight=weight,
            )
            removes.discard(instance_id)
        held = {
            (shard, how): getattr(followed, how)(shard)
            for shard in range(4)
            for how in ("routable", "reserve", "preference")
        }
        kept = {shard: list(group) for shard, group in held.items()}
        change = step(current, upserts.values(), removes)
        if number == reload_at:
            change = diff_lists(current, change.current)  # the same step, as a reload
        assert followed.follow(change) == "change"
        current = change.current
        reference = ShardIndex.instances()
        reference.load(current.servers)
        assert shape(followed) == shape(reference), f"change {number}"
        for instance_id, instance in current.servers.items():
            # (A reload's equal instance is no change: the one held stays.)
            assert followed.get(instance_id) == (None if route_of(instance) is None else instance)
        assert held == kept  # what a reader held is as it was
