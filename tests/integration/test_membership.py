"""The membership watch against a real ZooKeeper, including server faults."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import sys
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from discovery.testing import ZooKeeperEnsemble
from discovery.zk import memberfeed, memberread, membership, memberview, memberwatch
from discovery.zk.membership import LOGGED_SKIPS, MembershipWatcher
from discovery.zk.paths import DATA_SERVERS_PATH
from discovery.zk.registration import Registration
from discovery.zk.session import SessionState
from tests.support import (
    BULK_OPERATION_TIMEOUT,
    SessionFactory,
    eventually,
    make_instance,
    repeat_host,
    waited,
    within,
)

# The modules of the watcher's code: where the memory it allocates is looked for.
WATCHER_MODULES = (membership, memberfeed, memberread, memberview, memberwatch)

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
    # Ephemeral, as registrations are (a persistent DYNAMIC one is refused).
    create = functools.partial(session.create, ephemeral=True)
    good = make_instance("ds-good", 9201)
    await create(f"{DATA_SERVERS_PATH}/ds-good", good.to_json())
    await create(f"{DATA_SERVERS_PATH}/ds-garbage", b"{not json")
    await create(f"{DATA_SERVERS_PATH}/ds-wrongid", make_instance("other", 9202).to_json())
    oversized = good.to_dict()
    oversized["id"] = "ds-huge"
    oversized["payload"]["blob"] = "x" * (70 * 1024)
    await create(f"{DATA_SERVERS_PATH}/ds-huge", json.dumps(oversized).encode())

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
        await create(f"{DATA_SERVERS_PATH}/ds-late", make_instance("ds-late").to_json())
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


@pytest.mark.smoke
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
            agent.create(f"{DATA_SERVERS_PATH}/{child}", instance.to_json(), ephemeral=True)
            for child, instance in instances.items()
        )
    )
    await agent.create(f"{DATA_SERVERS_PATH}/ds-garbage", b"{not json", ephemeral=True)
    await agent.create(
        f"{DATA_SERVERS_PATH}/ds-wrongid", make_instance("other").to_json(), ephemeral=True
    )
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


def _typed(instance_id: str, service_type: str) -> bytes:
    instance = make_instance(instance_id)
    return dataclasses.replace(instance, service_type=service_type).to_json()


async def test_persistent_nodes_are_refused_counted_and_logged_once_by_default(
    persistent: bool, make_session: SessionFactory, caplog: pytest.LogCaptureFixture
) -> None:
    # A persistent node outlives whatever wrote it, and a data identity cannot delete
    # another's node: whatever its document says (Curator's PERMANENT and STATIC
    # included), it is no member unless the deployment allows persistent members.
    session, agent = await make_session(), await make_session()
    registry = CollectorRegistry()
    caplog.set_level(logging.WARNING, logger="discovery.zk.membership")
    await session.ensure_path(DATA_SERVERS_PATH)
    live = make_instance("ds-live")
    await agent.create(f"{DATA_SERVERS_PATH}/ds-live", live.to_json(), ephemeral=True)
    for child, service_type in [
        ("ds-permanent", "PERMANENT"),
        ("ds-static", "STATIC"),
        ("ds-dynamic", "DYNAMIC"),
    ]:
        await session.create(f"{DATA_SERVERS_PATH}/{child}", _typed(child, service_type))

    def skipped(reason: str) -> float | None:
        return registry.get_sample_value("discovery_membership_skipped_total", {"reason": reason})

    def logged(child: str) -> int:
        return sum(f"/{child}: " in r.getMessage() for r in caplog.records)

    async with MembershipWatcher(
        session, coalesce_window=0, registry=registry, persistent_watch=persistent
    ) as watcher:
        assert set(watcher.members) == {"ds-live"}
        assert set(watcher.invalid) == {"ds-permanent", "ds-static", "ds-dynamic"}
        assert watcher.invalid["ds-static"].startswith("persistent: serviceType STATIC ")
        assert watcher.invalid["ds-dynamic"].startswith("persistent_dynamic: ")
        assert (skipped("persistent"), skipped("persistent_dynamic")) == (2, 1)
        assert logged("ds-static") == 1

        # A full re-read (as after a reconnect) with a change: the refused nodes are
        # read again, but neither counted nor logged again.
        watcher._watches.mark_full()
        await agent.create(
            f"{DATA_SERVERS_PATH}/ds-late", make_instance("ds-late").to_json(), ephemeral=True
        )
        await waited(
            watcher.wait_until(lambda members: "ds-late" in members, timeout=10),
            "ds-late in the membership",
        )
        assert registry.get_sample_value("discovery_membership_resyncs_total") == 2
        assert set(watcher.invalid) == {"ds-permanent", "ds-static", "ds-dynamic"}
        assert (skipped("persistent"), skipped("persistent_dynamic")) == (2, 1)
        assert logged("ds-static") == 1


async def test_with_persistent_members_allowed_permanent_and_static_are_members_not_dynamic(
    persistent: bool, make_session: SessionFactory
) -> None:
    # Curator writes DYNAMIC (and DYNAMIC_SEQUENTIAL) registrations as ephemeral nodes
    # and PERMANENT / STATIC ones as persistent nodes. A deployment that registers the
    # latter on purpose allows them; a persistent node saying DYNAMIC would still
    # outlive whatever wrote it (a server long gone, or anyone allowed to create a
    # node, standing in for a live registration): it is skipped and counted.
    session, agent = await make_session(), await make_session()
    registry = CollectorRegistry()
    await session.ensure_path(DATA_SERVERS_PATH)

    # More children than a bulk read's minimum, so that with the persistent watch the
    # first read goes by multiRead, whose stats must carry the ephemeral owner too.
    ephemeral = {f"ds-eph-{i:02d}": make_instance(f"ds-eph-{i:02d}") for i in range(20)}
    for child, instance in ephemeral.items():
        await agent.create(f"{DATA_SERVERS_PATH}/{child}", instance.to_json(), ephemeral=True)
    for child, service_type in [
        ("ds-permanent", "PERMANENT"),
        ("ds-static", "STATIC"),
        ("ds-dynamic", "DYNAMIC"),
        ("ds-dynamic-seq", "DYNAMIC_SEQUENTIAL"),
    ]:
        await session.create(f"{DATA_SERVERS_PATH}/{child}", _typed(child, service_type))

    def skipped() -> float | None:
        return registry.get_sample_value(
            "discovery_membership_skipped_total", {"reason": "persistent_dynamic"}
        )

    async with MembershipWatcher(
        session,
        coalesce_window=0,
        registry=registry,
        persistent_watch=persistent,
        allow_persistent=True,
    ) as watcher:
        assert set(watcher.members) == {*ephemeral, "ds-permanent", "ds-static"}
        assert set(watcher.invalid) == {"ds-dynamic", "ds-dynamic-seq"}
        assert watcher.invalid["ds-dynamic"].startswith("persistent_dynamic: serviceType DYNAMIC ")
        assert skipped() == 2
        assert (
            registry.get_sample_value(
                "discovery_membership_skipped_total", {"reason": "persistent"}
            )
            is None
        )

        # A registration that goes away cannot be stood in for by a persistent node of
        # the same id and document.
        await agent.delete(f"{DATA_SERVERS_PATH}/ds-eph-00")
        await session.create(f"{DATA_SERVERS_PATH}/ds-eph-00", ephemeral["ds-eph-00"].to_json())
        await eventually(
            lambda: "ds-eph-00" in watcher.invalid and "ds-eph-00" not in watcher.members,
            message="the persistent ds-eph-00 skipped",
        )
        assert skipped() == 3
        # Its owner may say PERMANENT instead: then it is a member again.
        await session.set(f"{DATA_SERVERS_PATH}/ds-eph-00", _typed("ds-eph-00", "PERMANENT"))
        await waited(
            watcher.wait_until(lambda members: "ds-eph-00" in members, timeout=10),
            "the PERMANENT ds-eph-00 in the membership",
        )
        assert set(watcher.invalid) == {"ds-dynamic", "ds-dynamic-seq"}


def _malformed(index: int) -> bytes:
    """A bad registration for ``ds-bad-<index>``, of one of four kinds in turn."""
    child = f"ds-bad-{index:05d}"
    kind = index % 4
    if kind == 0:
        return b"{not json"
    document = make_instance(child).to_dict()
    if kind == 1:
        document["port"] = "9001"  # a string where an integer belongs
    elif kind == 2:
        document["id"] = f"ds-other-{index}"  # impersonating another id
    else:
        document["payload"]["shard"] = -1
    return json.dumps(document).encode()


async def test_thousands_of_invalid_children_cost_only_what_changes(
    persistent: bool,
    make_session: SessionFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Thousands of creates: on a loaded machine one waits behind the others longer than
    # the tests' 2 s default operation timeout, which is not what this test is about.
    session = await make_session(operation_timeout=BULK_OPERATION_TIMEOUT)
    agent = await make_session(operation_timeout=BULK_OPERATION_TIMEOUT)
    registry = CollectorRegistry()
    await session.ensure_path(DATA_SERVERS_PATH)
    count = 5000
    for first in range(0, count, 1000):
        await asyncio.gather(
            *(
                agent.create(f"{DATA_SERVERS_PATH}/ds-bad-{i:05d}", _malformed(i), ephemeral=True)
                for i in range(first, first + 1000)
            )
        )
    caplog.set_level(logging.WARNING, logger="discovery.zk.membership")

    def warnings() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.name == "discovery.zk.membership"]

    async with MembershipWatcher(
        session, coalesce_window=0, registry=registry, persistent_watch=persistent
    ) as watcher:
        assert len(watcher.invalid) == count
        assert dict(watcher.members) == {}
        # Every skip is counted, but the log holds a bounded number of lines, the last
        # one summing up the rest.
        counted = {
            reason: registry.get_sample_value(
                "discovery_membership_skipped_total", {"reason": reason}
            )
            for reason in ("malformed", "id_mismatch")
        }
        assert counted == {"malformed": count * 3 / 4, "id_mismatch": count / 4}
        assert len(warnings()) == LOGGED_SKIPS + 1
        assert f"({count} in all: id_mismatch 1250, malformed 3750)" in warnings()[-1].getMessage()

        changes = watcher.subscribe()
        first = await waited(anext(changes), "the current view", timeout=10)
        assert len(first.invalid) == count

        # A change that leaves the invalid children alone does not touch their map: the
        # change set holds the very same one.
        good = make_instance("ds-good")
        await agent.create(f"{DATA_SERVERS_PATH}/ds-good", good.to_json(), ephemeral=True)
        change = await waited(anext(changes), "the change set adding ds-good", timeout=10)
        assert dict(change.added) == {"ds-good": good}
        assert change.invalid is first.invalid

        # One more invalid child costs what it changes, not a copy of the 5,000 others
        # (a copy of their dict alone is ~100 KiB): measured as the memory that the
        # watcher's code allocated between the write and the change set in hand and that
        # is still held then (by the watcher and the change set). With the child watch
        # the watcher re-lists the names on every change, which holds about five times
        # that whatever the bookkeeping, so this is measured with the persistent watch.
        caplog.clear()
        tracemalloc.start()
        try:
            await agent.create(f"{DATA_SERVERS_PATH}/ds-bad-new", b"[]", ephemeral=True)
            change = await waited(anext(changes), "the change set with ds-bad-new", timeout=10)
            held = tracemalloc.take_snapshot().filter_traces(
                [tracemalloc.Filter(True, module.__file__) for module in WATCHER_MODULES]
            )
        finally:
            tracemalloc.stop()
        assert len(change.invalid) == count + 1
        assert change.invalid["ds-bad-new"].startswith("malformed: ")
        assert "ds-bad-new" not in first.invalid  # earlier change sets are untouched
        assert len(warnings()) == 1
        if persistent:
            held_bytes = sum(trace.size for trace in held.traces)
            copy_of_invalid = sys.getsizeof(dict(first.invalid))
            assert held_bytes < copy_of_invalid / 4, (held_bytes, copy_of_invalid)

        # Fixing one moves it to the members; the others stay as they are.
        fixed = make_instance("ds-bad-00000")
        await agent.set(f"{DATA_SERVERS_PATH}/ds-bad-00000", fixed.to_json())
        change = await waited(anext(changes), "the change set fixing ds-bad-00000", timeout=10)
        assert dict(change.added) == {"ds-bad-00000": fixed}
        assert len(change.invalid) == count
        assert "ds-bad-00000" not in change.invalid
        assert registry.get_sample_value("discovery_membership_invalid") == count
        changes.close()
