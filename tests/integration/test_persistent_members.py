"""Persistent member nodes as a search server reads them: its leader's published list
and its ZooKeeper fallback, with and without ``--allow-persistent-members``."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from discovery.testing import RedisServer
from discovery.zk.paths import DATA_SERVERS_PATH
from tests.support import (
    SearchServerFactory,
    SessionFactory,
    all_see,
    eventually,
    make_instance,
    sample,
)


@pytest.mark.parametrize("allowed", [False, True], ids=["default", "allowed"])
async def test_a_persistent_static_node_is_routed_only_with_persistent_members_allowed(
    allowed: bool,
    tmp_path: Path,
    make_search_server: SearchServerFactory,
    make_session: SessionFactory,
) -> None:
    # A STATIC registration in a persistent node outlives whatever wrote it, and no data
    # server can delete it: by default neither the leader nor the ZooKeeper fallback
    # routes to it; a deployment that registers such members on purpose allows them.
    raw, agent = await make_session(), await make_session()
    await raw.ensure_path(DATA_SERVERS_PATH)
    live = make_instance("ds-live", 9001, shard=0)
    await agent.create(f"{DATA_SERVERS_PATH}/ds-live", live.to_json(), ephemeral=True)
    static = dataclasses.replace(make_instance("ds-static", 9002, shard=1), service_type="STATIC")
    await raw.create(f"{DATA_SERVERS_PATH}/ds-static", static.to_json())
    expected = {"ds-live", "ds-static"} if allowed else {"ds-live"}

    redis = RedisServer(tmp_path / "redis")
    redis.start()
    try:
        search = await make_search_server(
            server_id="ss-0",
            redis_url=redis.url,
            zk_fallback_after=0.5,
            allow_persistent_members=allowed,
        )
        # Both nodes were there before the leader's first read: its first list says.
        await all_see([search], expected)
        skipped = sample(search.registry, "discovery_membership_skipped_total", reason="persistent")
        assert skipped == (0 if allowed else 1)

        # Routing from a direct read of ZooKeeper while Redis is away: the same rule.
        await asyncio.to_thread(redis.stop)
        await eventually(
            lambda: search.cluster_view()["source"] == "zookeeper", message="fallback on"
        )
        await eventually(
            lambda: {s["id"] for s in search.cluster_view()["servers"]} == expected,
            message=f"the fallback routes to {sorted(expected)}",
        )
    finally:
        redis.stop()
