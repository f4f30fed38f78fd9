"""The bounded views of a routing list (``GET /cluster``, the dashboard): summary,
problems, shard grid, pages, filters and bad parameters. Pure: no I/O."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import immutables
import pytest

from discovery.instance import ServiceInstance
from discovery.livelist.model import LiveList, LiveListChange
from search_server.clusterview import (
    MAX_PAGE,
    MAX_PROBLEMS,
    ClusterViews,
    ListIndex,
    PageRequest,
    ViewQueryError,
)
from tests.support import make_instance


def _describe(instance: ServiceInstance, ejected: bool) -> dict[str, Any]:
    return {"id": instance.id, "shard": instance.payload.shard, "ejected": ejected}


def _fleet(shards: int, replicas: int) -> dict[str, ServiceInstance]:
    servers = {}
    for shard in range(shards):
        for replica in range(replicas):
            key = f"ds-{shard:04d}-{replica:03d}"
            servers[key] = make_instance(key, 9000 + replica, shard=shard, replica=replica)
    return servers


def test_summary_counts_servers_by_state_and_shards_by_live_replicas() -> None:
    servers = _fleet(4, 3)
    # Shard 1: one draining; shard 2: every replica out (maintenance, disabled, ejected).
    servers["ds-0001-000"] = servers["ds-0001-000"].with_state("draining", "deploy")
    servers["ds-0002-000"] = servers["ds-0002-000"].with_state("maintenance", "disk")
    servers["ds-0002-001"] = dataclasses.replace(servers["ds-0002-001"], enabled=False)
    ejected = {"ds-0002-002", "ds-0003-001", "gone"}  # "gone" left the list: no problem
    views = ClusterViews(_describe)

    view = views.view(servers, ejected, expected_shards={0, 1, 2, 3, 4}, page=PageRequest())

    summary = view["summary"]
    assert summary["servers"] == 12
    assert summary["states"] == {"serving": 10, "draining": 1, "maintenance": 1}
    assert summary["disabled"] == 1  # serving, enabled false (draining is its own state)
    assert summary["ejected"] == 2
    assert summary["live"] == 12 - 1 - 2 - 2
    # Shard 4 is expected but has no server listed: no live replica, never dropped.
    assert summary["shards"] == {
        "total": 5,
        "all_live": 1,
        "some_not_live": 2,
        "no_live_replica": 2,
    }
    kinds = [(p["kind"], p.get("shard"), p.get("id")) for p in view["problems"]]
    assert kinds == [
        ("no_live_replica", 2, None),
        ("no_live_replica", 4, None),
        ("ejected", 2, "ds-0002-002"),
        ("ejected", 3, "ds-0003-001"),
        ("draining", 1, "ds-0001-000"),
        ("maintenance", 2, "ds-0002-000"),
        ("disabled", 2, "ds-0002-001"),
    ]
    assert view["problems"][4]["reason"] == "deploy"
    assert view["problems_total"] == 7
    # A small cluster gets every server on its one page, as /cluster always answered.
    assert [s["id"] for s in view["servers"]] == sorted(servers)
    assert view["page"]["next"] is None
    assert view["page"]["matching"] == 12
    assert {s["id"] for s in view["servers"] if s["ejected"]} == {"ds-0002-002", "ds-0003-001"}


def test_the_grid_has_one_row_per_shard_with_listed_and_live_replicas() -> None:
    servers = _fleet(3, 2)
    view = ClusterViews(_describe).view(
        servers, {"ds-0001-000"}, expected_shards=range(5), page=PageRequest(limit=0), grid=True
    )
    assert view["shard_grid"] == [[0, 2, 2], [1, 2, 1], [2, 2, 2], [3, 0, 0], [4, 0, 0]]
    assert view["shard_grid_truncated"] is False
    assert view["servers"] == []  # limit 0: the summary alone


def test_pages_cover_every_server_once_by_id_and_stay_bounded() -> None:
    servers = _fleet(30, 100)  # 3,000 servers: three pages of MAX_PAGE
    views = ClusterViews(_describe)
    seen: list[str] = []
    after = None
    pages = 0
    while True:
        view = views.view(servers, set(), (), PageRequest(limit=MAX_PAGE, after=after))
        pages += 1
        assert len(view["servers"]) <= MAX_PAGE
        seen.extend(s["id"] for s in view["servers"])
        after = view["page"]["next"]
        if after is None:
            break
    assert pages == 3
    assert seen == sorted(servers)
    # A cursor stays valid when its server leaves: the page starts after where it was.
    del servers["ds-0009-099"]
    views = ClusterViews(_describe)
    view = views.view(servers, set(), (), PageRequest(limit=2, after="ds-0009-099"))
    assert [s["id"] for s in view["servers"]] == ["ds-0010-000", "ds-0010-001"]


def test_many_problems_are_listed_up_to_the_cap_and_counted_in_full() -> None:
    servers = {
        key: instance.with_state("draining") if instance.payload.replica == 0 else instance
        for key, instance in _fleet(300, 2).items()
    }
    view = ClusterViews(_describe).view(servers, set(), (), PageRequest(limit=10))
    assert len(view["problems"]) == MAX_PROBLEMS
    assert view["problems_total"] == 300
    assert len(view["servers"]) == 10
    assert view["page"]["next"] == view["servers"][-1]["id"]


def test_filters_by_shard_and_by_state() -> None:
    servers = _fleet(5, 4)
    servers["ds-0003-002"] = servers["ds-0003-002"].with_state("draining")
    ejected = {"ds-0001-001"}
    views = ClusterViews(_describe)

    by_shard = views.view(servers, ejected, (), PageRequest(shard=3))
    assert [s["id"] for s in by_shard["servers"]] == [f"ds-0003-{r:03d}" for r in range(4)]
    assert by_shard["page"]["matching"] == 4
    assert views.view(servers, ejected, (), PageRequest(shard=9))["servers"] == []

    def ids(state: str, **kw: Any) -> list[str]:
        page = PageRequest(state=state, **kw)
        return [s["id"] for s in views.view(servers, ejected, (), page)["servers"]]

    assert ids("draining") == ["ds-0003-002"]
    assert ids("ejected") == ["ds-0001-001"]
    assert ids("disabled") == []  # draining is not "disabled": that is serving, turned off
    assert len(ids("live")) == 20 - 2
    assert ids("serving", shard=3, limit=2) == ["ds-0003-000", "ds-0003-001"]
    view = views.view(servers, ejected, (), PageRequest(state="serving", limit=5))
    assert view["page"]["matching"] == 19
    assert view["page"]["next"] == view["servers"][-1]["id"]
    following = views.view(
        servers, ejected, (), PageRequest(state="serving", limit=50, after=view["page"]["next"])
    )
    assert len(view["servers"]) + len(following["servers"]) == 19
    assert following["page"]["next"] is None


def test_the_index_is_made_once_per_list() -> None:
    views = ClusterViews(_describe)
    servers = _fleet(2, 2)
    first = views.index(servers)
    assert views.index(servers) is first
    assert views.index(dict(servers)) is not first  # another list (by identity)


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ({"limit": "abc"}, "limit"),
        ({"limit": "-1"}, "limit"),
        ({"limit": str(MAX_PAGE + 1)}, "limit"),
        ({"limit": "1_0"}, "limit"),
        ({"shard": "x"}, "shard"),
        ({"shard": "9999999999"}, "shard"),
        ({"state": "asleep"}, "state"),
        ({"after": ""}, "after"),
        ({"after": "x" * 2000}, "after"),
        ({"offset": "3"}, "offset"),
    ],
)
def test_bad_parameters_are_refused_naming_them(query: dict[str, str], named: str) -> None:
    with pytest.raises(ViewQueryError, match=named):
        PageRequest.from_query(query)


def test_good_parameters_are_read() -> None:
    page = PageRequest.from_query({"limit": "5", "after": "ds-7", "shard": "3", "state": "live"})
    assert page == PageRequest(limit=5, after="ds-7", shard=3, state="live")
    assert PageRequest.from_query({}) == PageRequest()


def _state_of(index: ListIndex) -> tuple[Any, ...]:
    return (
        index.ids,
        {s: (c.routable, [i.id for i in c.servers]) for s, c in sorted(index.shards.items())},
        +index.states,
        index.disabled,
        [i.id for i in index.unroutable],
    )


def test_the_index_follows_the_list_change_by_change_as_if_made_afresh() -> None:
    rng = random.Random(24)
    views = ClusterViews(_describe)
    current = LiveList(1, 1, "ss-0", 0, immutables.Map(_fleet(6, 5)))
    views.view(current.servers, set(), (), PageRequest(limit=0))  # an index is kept
    for step in range(300):
        before = current
        present = sorted(before.servers)
        removed = set(rng.sample(present, rng.randint(0, 2)))
        upserts = []
        for key in rng.sample(present, rng.randint(0, 2)):
            if key not in removed:  # a change: another state, or another shard
                old = before.servers[key]
                upserts.append(
                    old.with_state(rng.choice(["serving", "draining", "maintenance"]))
                    if rng.random() < 0.7
                    else make_instance(key, old.port, shard=rng.randrange(8), replica=step)
                )
        for n in range(rng.randint(0, 2)):
            key = f"ds-new-{step}-{n}"
            upserts.append(make_instance(key, 9100, shard=rng.randrange(8), replica=n))
        current = before.apply(
            epoch=1, version=before.version + 1, leader="ss-0", published_at=0,
            upserts=upserts, removes=removed,
        )  # fmt: skip
        added = {i.id: i for i in upserts if i.id not in before.servers}
        changed = {i.id: i for i in upserts if i.id in before.servers}
        views.follow(LiveListChange(before, current, added, changed, {k: "gone" for k in removed}))
        kept = views.index(current.servers)
        assert kept.source is current.servers  # followed, not made again
        assert _state_of(kept) == _state_of(ListIndex(current.servers)), f"step {step}"


def test_a_reload_or_an_unknown_previous_list_drops_the_kept_index() -> None:
    views = ClusterViews(_describe)
    first = LiveList(1, 1, "ss-0", 0, immutables.Map(_fleet(2, 2)))
    kept = views.index(first.servers)
    second = first.apply(epoch=2, version=1, leader="ss-1", published_at=0)
    views.follow(LiveListChange(first, second, reload=True))
    assert views.index(second.servers) is not kept
    other = LiveList(1, 1, "ss-0", 0, immutables.Map(_fleet(2, 2)))
    third = other.apply(epoch=1, version=2, leader="ss-0", published_at=0, removes=["ds-0000-000"])
    kept = views.index(second.servers)
    views.follow(LiveListChange(other, third, removed={"ds-0000-000": "gone"}))
    assert views.index(third.servers) is not kept
    assert views.index(third.servers).ids == sorted(third.servers)
