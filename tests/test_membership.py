"""The membership watch against a real ZooKeeper, including server faults."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from discovery.layout import DATA_SERVERS_PATH
from discovery.membership import MembershipWatcher
from discovery.registration import Registration
from discovery.testing import ZooKeeperEnsemble
from discovery.zk import SessionState
from tests.support import SessionFactory, make_instance, repeat_host, waited, within

# Every test runs with the persistent recursive watch (ZooKeeper 3.6+) and with the
# child-watch fallback (older servers).
pytestmark = pytest.mark.parametrize("persistent", [True, False], ids=["addwatch", "relist"])


async def test_malformed_and_oversized_children_are_skipped_and_counted(
    persistent: bool,
    make_session: SessionFactory,
) -> None:
    session = await make_session()
    registry = CollectorRegistry()
    await session.ensure_path(DATA_SERVERS_PATH)
    good = make_instance("ds-good", 9201)
    await session.create(f"{DATA_SERVERS_PATH}/ds-good", good.to_json())
    await session.create(f"{DATA_SERVERS_PATH}/ds-garbage", b"{not json")
    await session.create(f"{DATA_SERVERS_PATH}/ds-wrongid", make_instance("other", 9202).to_json())
    oversized = good.to_dict()
    oversized["id"] = "ds-huge"
    oversized["payload"]["blob"] = "x" * (70 * 1024)
    await session.create(f"{DATA_SERVERS_PATH}/ds-huge", json.dumps(oversized).encode())

    async with MembershipWatcher(
        session, coalesce_window=0, registry=registry, persistent_watch=persistent
    ) as watcher:
        assert dict(watcher.members) == {"ds-good": good}
        assert set(watcher.invalid) == {"ds-garbage", "ds-wrongid", "ds-huge"}
        assert watcher.invalid["ds-huge"].startswith("too_large")

        def skipped(reason: str) -> float | None:
            return registry.get_sample_value(
                "discovery_membership_skipped_total", {"reason": reason}
            )

        assert (skipped("malformed"), skipped("too_large"), skipped("id_mismatch")) == (1, 1, 1)
        assert registry.get_sample_value("discovery_membership_invalid") == 3

        # The watcher keeps going: a later good registration is seen, and fixing a
        # malformed child makes it a member.
        await session.create(f"{DATA_SERVERS_PATH}/ds-late", make_instance("ds-late").to_json())
        await session.set(f"{DATA_SERVERS_PATH}/ds-garbage", make_instance("ds-garbage").to_json())
        members = await waited(
            watcher.wait_until(lambda m: {"ds-late", "ds-garbage"} <= set(m), timeout=10),
            "ds-late and the fixed ds-garbage in the membership",
        )
        assert set(members) == {"ds-good", "ds-late", "ds-garbage"}
        assert set(watcher.invalid) == {"ds-wrongid", "ds-huge"}
        # Re-reading the same bad versions does not count them again.
        assert skipped("too_large") == 1


async def test_burst_of_registrations_is_coalesced(
    persistent: bool, make_session: SessionFactory
) -> None:
    session, agent = await make_session(), await make_session()
    async with MembershipWatcher(
        session, coalesce_window=0.5, persistent_watch=persistent
    ) as watcher:
        changes = watcher.subscribe()
        first = await waited(anext(changes), "the initial change set", timeout=10)
        assert first.empty
        assert first.resync
        await asyncio.gather(
            *(
                agent.create(
                    f"{DATA_SERVERS_PATH}/ds-{i}",
                    make_instance(f"ds-{i}", 9300 + i).to_json(),
                    ephemeral=True,
                )
                for i in range(50)
            )
        )
        seen: set[str] = set()
        batches = 0
        async with within(30, "all 50 registrations in the change sets"):
            async for change in changes:
                batches += 1
                seen |= set(change.added)
                if len(seen) == 50:
                    break
        assert len(watcher.members) == 50
        # 50 watch events arrived within one window: far fewer change sets than events.
        assert batches <= 3, batches
        changes.close()


async def test_subscription_diffs_added_changed_removed(
    persistent: bool, make_session: SessionFactory
) -> None:
    session, agent = await make_session(), await make_session()
    async with MembershipWatcher(
        session, coalesce_window=0, persistent_watch=persistent
    ) as watcher:
        changes = watcher.subscribe()
        await waited(anext(changes), "the initial change set", timeout=10)
        instance = make_instance("ds-d", 9400)
        registration = Registration(agent, instance)
        await registration.register()
        change = await waited(anext(changes), "the change set adding ds-d", timeout=10)
        assert dict(change.added) == {"ds-d": instance}
        await registration.update(instance.with_state("draining", reason="test"))
        change = await waited(anext(changes), "the change set changing ds-d", timeout=10)
        assert change.changed["ds-d"].payload.reason == "test"
        await registration.deregister()
        change = await waited(anext(changes), "the change set removing ds-d", timeout=10)
        assert set(change.removed) == {"ds-d"}
        assert dict(change.members) == {}
        changes.close()


async def test_session_and_watch_survive_a_zookeeper_restart(
    persistent: bool,
    own_zk_server: ZooKeeperEnsemble,
    make_session: SessionFactory,
    chroot: Callable[[str], str],
) -> None:
    hosts = chroot(repeat_host(own_zk_server.hosts))
    # The session timeout must outlast the restart for the session to survive it.
    watcher_session = await make_session(hosts, session_timeout=20)
    agent = await make_session(hosts, session_timeout=20)
    async with (
        MembershipWatcher(
            watcher_session, coalesce_window=0, persistent_watch=persistent
        ) as watcher,
        Registration(agent, make_instance("ds-before", 9501)),
    ):
        await waited(
            watcher.wait_until(lambda m: "ds-before" in m, timeout=10),
            "ds-before in the membership",
        )
        events = watcher_session.subscribe()
        session_id = watcher_session.session_id

        await asyncio.to_thread(own_zk_server.stop_server, 0)
        suspended = await waited(anext(events), "a session event as ZooKeeper stops", timeout=30)
        assert suspended.state is SessionState.SUSPENDED
        await asyncio.to_thread(own_zk_server.start_server, 0)
        event = await waited(anext(events), "reconnection after the restart", timeout=30)

        assert event.state is SessionState.CONNECTED
        assert not event.new_session
        assert watcher_session.session_id == session_id
        assert "ds-before" in watcher.members  # the agent's session survived too
        # The watch survived: a change after the restart is seen.
        async with Registration(agent, make_instance("ds-after", 9502)):
            await waited(
                watcher.wait_until(lambda m: "ds-after" in m, timeout=10),
                "ds-after in the membership",
            )
        events.close()


async def test_ensemble_losing_a_server_carries_on_and_changes_meanwhile_are_seen(
    persistent: bool,
    zk_ensemble: ZooKeeperEnsemble,
    make_session: SessionFactory,
    chroot: Callable[[str], str],
) -> None:
    # The watcher talks to server 0 only; the agent to servers 1 and 2.
    first, *others = zk_ensemble.servers
    watcher_session = await make_session(chroot(repeat_host(first.address)), session_timeout=20)
    suffix = watcher_session.hosts[watcher_session.hosts.index("/") :]
    agent = await make_session(",".join(s.address for s in others) + suffix, session_timeout=20)
    async with MembershipWatcher(
        watcher_session, coalesce_window=0, persistent_watch=persistent
    ) as watcher:
        leaving = Registration(agent, make_instance("ds-leaving", 9601))
        await leaving.register()
        await waited(
            watcher.wait_until(lambda m: "ds-leaving" in m, timeout=10),
            "ds-leaving in the membership",
        )
        events = watcher_session.subscribe()

        await asyncio.to_thread(zk_ensemble.stop_server, 0)
        suspended = await waited(anext(events), "a session event as server 0 stops", timeout=30)
        assert suspended.state is SessionState.SUSPENDED
        # The remaining quorum of two carries on: changes are accepted meanwhile.
        joining = Registration(agent, make_instance("ds-joining", 9602))
        await joining.register()
        await leaving.deregister()
        await asyncio.to_thread(zk_ensemble.start_server, 0)

        event = await waited(anext(events), "reconnection to server 0", timeout=30)
        assert event.state is SessionState.CONNECTED
        assert not event.new_session
        members = await waited(
            watcher.wait_until(lambda m: "ds-joining" in m and "ds-leaving" not in m, timeout=15),
            "ds-joining in and ds-leaving out of the membership",
        )
        assert set(members) == {"ds-joining"}
        events.close()
        await joining.aclose()


async def test_hundreds_of_children_read_in_bulk_give_the_same_view(
    persistent: bool, make_session: SessionFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With the persistent watch a full read goes by multiRead (no get per child); the
    # child-watch fallback reads each child with a get (and its data watch).
    session, agent = await make_session(), await make_session()
    await session.ensure_path(DATA_SERVERS_PATH)
    instances = {f"ds-{i:03d}": make_instance(f"ds-{i:03d}", 10_000 + i) for i in range(300)}
    await asyncio.gather(
        *(
            agent.create(f"{DATA_SERVERS_PATH}/{child}", instance.to_json())
            for child, instance in instances.items()
        )
    )
    await agent.create(f"{DATA_SERVERS_PATH}/ds-garbage", b"{not json")
    await agent.create(f"{DATA_SERVERS_PATH}/ds-wrongid", make_instance("other").to_json())
    gets = 0
    get = session.get

    async def counting_get(*args: Any, **kwargs: Any) -> Any:
        nonlocal gets
        gets += 1
        return await get(*args, **kwargs)

    monkeypatch.setattr(session, "get", counting_get)
    registry = CollectorRegistry()
    async with MembershipWatcher(
        session, coalesce_window=0.3, registry=registry, persistent_watch=persistent
    ) as watcher:
        assert dict(watcher.members) == instances
        assert set(watcher.invalid) == {"ds-garbage", "ds-wrongid"}
        assert gets == (0 if persistent else 302)
        for reason in ("malformed", "id_mismatch"):
            assert (
                registry.get_sample_value("discovery_membership_skipped_total", {"reason": reason})
                == 1
            )

        # A burst of changes (more than a bulk read's minimum) within one window.
        changed = {
            child: instances[child].with_state("draining", reason="bulk")
            for child in list(instances)[:40]
        }
        deleted = list(instances)[40:45]
        await asyncio.gather(
            *(agent.set(f"{DATA_SERVERS_PATH}/{c}", i.to_json()) for c, i in changed.items()),
            *(agent.delete(f"{DATA_SERVERS_PATH}/{child}") for child in deleted),
        )
        expected = {
            child: changed.get(child, instance)
            for child, instance in instances.items()
            if child not in deleted
        }
        await waited(
            watcher.wait_until(lambda members: dict(members) == expected, timeout=15),
            "the burst of changes in the membership",
        )
        assert set(watcher.invalid) == {"ds-garbage", "ds-wrongid"}
