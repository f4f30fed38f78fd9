"""Registration of ephemeral instance nodes against a real ZooKeeper."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry

from discovery.errors import RegistrationConflictError, ZkConnectionError
from discovery.instance import InstanceState, ServiceInstance
from discovery.testing import ZooKeeperEnsemble
from discovery.testing.zookeeper import four_letter_word
from discovery.zk.expiry import expire_session
from discovery.zk.membership import MembershipWatcher
from discovery.zk.paths import DATA_SERVERS_PATH
from discovery.zk.registration import Registration
from discovery.zk.session import SessionState
from tests.support import (
    FakeClock,
    SessionFactory,
    absent,
    eventually,
    make_instance,
    next_change,
    repeat_host,
    waited,
)


@pytest.mark.smoke
async def test_register_is_seen_with_payload_and_deregister_removes_it(
    make_session: SessionFactory,
) -> None:
    agent, observer = await make_session(), await make_session()
    instance = make_instance("ds-1", 9101, shard=3, docs=12345)
    async with MembershipWatcher(observer, coalesce_window=0.01) as watcher:
        registration = Registration(agent, instance)
        await registration.register()
        members = await waited(
            watcher.wait_until(lambda m: "ds-1" in m, timeout=10), "ds-1 in the membership"
        )
        seen = members["ds-1"]
        assert seen == instance
        assert (seen.address, seen.port, seen.payload.shard, seen.payload.docs) == (
            "127.0.0.1",
            9101,
            3,
            12345,
        )
        data, stat = await observer.get(f"{DATA_SERVERS_PATH}/ds-1")
        assert ServiceInstance.from_json(data) == instance
        assert stat.ephemeral_owner == agent.session_id

        await registration.deregister()
        await waited(watcher.wait_until(lambda m: "ds-1" not in m, timeout=10), "ds-1 deregistered")
        assert await observer.exists(f"{DATA_SERVERS_PATH}/ds-1") is None
        await registration.aclose()


@pytest.mark.smoke
async def test_expired_session_loses_node_and_registration_recreates_it(
    make_session: SessionFactory,
) -> None:
    agent, observer = await make_session(), await make_session()
    registry = CollectorRegistry()
    async with (
        MembershipWatcher(observer, coalesce_window=0) as watcher,
        Registration(agent, make_instance("ds-exp", 9102), registry=registry) as registration,
    ):
        await waited(
            watcher.wait_until(lambda m: "ds-exp" in m, timeout=10), "ds-exp in the membership"
        )
        changes = watcher.subscribe()
        old_session = agent.session_id

        new_session = await expire_session(agent)

        assert new_session != old_session
        # The observer sees the node go (the server deleted it with the session)...
        await next_change(changes, lambda c: "ds-exp" in c.removed, "ds-exp seen removed")
        # ...and come back, owned by the new session, without anyone asking.
        await next_change(changes, lambda c: "ds-exp" in c.added, "ds-exp seen added again")
        _, stat = await observer.get(f"{DATA_SERVERS_PATH}/ds-exp")
        assert stat.ephemeral_owner == new_session
        await eventually(lambda: registration.registered, message="registered again")
        assert registry.get_sample_value("discovery_registration_recreates_total") == 1.0
        changes.close()


async def test_id_conflict_with_another_live_session_is_refused(
    make_session: SessionFactory,
) -> None:
    first, second = await make_session(), await make_session()
    registry = CollectorRegistry()
    owner = Registration(first, make_instance("ds-dup", 9103))
    await owner.register()
    intruder = Registration(second, make_instance("ds-dup", 9999), registry=registry)

    with pytest.raises(RegistrationConflictError) as caught:
        await intruder.register()

    assert caught.value.owner_session == first.session_id
    assert registry.get_sample_value("discovery_registration_conflicts_total") == 1.0
    data, stat = await second.get(f"{DATA_SERVERS_PATH}/ds-dup")
    assert stat.ephemeral_owner == first.session_id
    assert ServiceInstance.from_json(data).port == 9103
    assert not intruder.registered

    # Once the rightful owner leaves, the waiting registration takes over by itself.
    await owner.aclose()
    await eventually(lambda: intruder.registered, message="intruder registered after owner left")
    _, stat = await second.get(f"{DATA_SERVERS_PATH}/ds-dup")
    assert stat.ephemeral_owner == second.session_id
    await intruder.aclose()


async def test_a_conflict_is_reported_again_while_it_lasts_never_waited_out_in_silence(
    make_session: SessionFactory, caplog: pytest.LogCaptureFixture
) -> None:
    squatter, ours = await make_session(), await make_session()
    # Someone else's node under our id (a duplicate --id, or squatting), there first.
    await squatter.create(
        f"{DATA_SERVERS_PATH}/ds-squat",
        make_instance("ds-squat", 9999, address="10.9.9.9").to_json(),
        ephemeral=True,
        makepath=True,
    )
    registry, clock = CollectorRegistry(), FakeClock()
    registration = Registration(
        ours,
        make_instance("ds-squat", 9105),
        registry=registry,
        conflict_recheck=0.1,
        clock=clock,
    )
    caplog.set_level(logging.ERROR, logger="discovery.zk.conflict")
    with pytest.raises(RegistrationConflictError, match="squatting"):
        await registration.register()
    assert registry.get_sample_value("discovery_registration_conflicted") == 1.0
    assert registration.conflict is not None
    assert registration.conflict.owner_session == squatter.session_id

    def errors() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]

    assert len(errors()) == 1
    # No event comes (the squatter's node stays): we look again on our own, and once
    # a minute has passed, say so again.
    clock.advance(61)
    await eventually(lambda: len(errors()) == 2, message="the conflict reported again")
    assert errors()[1].startswith("still not registered after 61 s")
    assert registry.get_sample_value("discovery_registration_conflicts_total") == 1.0

    await squatter.delete(f"{DATA_SERVERS_PATH}/ds-squat")
    await eventually(lambda: registration.registered, message="registered once it is gone")
    assert registry.get_sample_value("discovery_registration_conflicted") == 0.0
    assert registration.conflict is None
    await registration.aclose()


async def test_node_of_our_own_earlier_incarnation_is_replaced(
    make_session: SessionFactory,
) -> None:
    # A server restarted before its old session timed out: same id, address and port.
    old_process, new_process = await make_session(session_timeout=30), await make_session()
    # What a killed process leaves behind: its node, owned by its still-live session.
    await old_process.create(
        f"{DATA_SERVERS_PATH}/ds-restart",
        make_instance("ds-restart", 9104).to_json(),
        ephemeral=True,
        makepath=True,
    )
    registry = CollectorRegistry()

    async with Registration(new_process, make_instance("ds-restart", 9104), registry=registry):
        _, stat = await new_process.get(f"{DATA_SERVERS_PATH}/ds-restart")
        assert stat.ephemeral_owner == new_process.session_id
        assert registry.get_sample_value("discovery_registration_replaced_stale_total") == 1.0


async def test_update_rewrites_in_place(make_session: SessionFactory) -> None:
    agent, observer = await make_session(), await make_session()
    instance = make_instance("ds-drain", 9105)
    async with (
        MembershipWatcher(observer, coalesce_window=0) as watcher,
        Registration(agent, instance) as registration,
    ):
        _, before = await observer.get(f"{DATA_SERVERS_PATH}/ds-drain")

        await registration.update(instance.with_state(InstanceState.DRAINING))

        members = await waited(
            watcher.wait_until(
                lambda m: "ds-drain" in m and m["ds-drain"].payload.state is InstanceState.DRAINING,
                timeout=10,
            ),
            "ds-drain seen draining",
        )
        assert members["ds-drain"].enabled is False
        _, after = await observer.get(f"{DATA_SERVERS_PATH}/ds-drain")
        assert after.czxid == before.czxid  # the same node, not a delete and re-create
        assert after.version == before.version + 1


def _last_zxid(ensemble: ZooKeeperEnsemble) -> int:
    """The last transaction id the (standalone) server applied, from ``srvr``."""
    answer = four_letter_word(ensemble.servers[0].client_port, "srvr")
    line = next(line for line in answer.splitlines() if line.startswith("Zxid:"))
    return int(line.split()[1], 16)


async def test_an_update_costs_the_ensemble_one_transaction(
    own_zk_server: ZooKeeperEnsemble,
    make_session: SessionFactory,
    chroot: Callable[[str], str],
) -> None:
    """Every write is a transaction for the quorum, a create that fails as well (an
    error transaction, logged by every member). Updating our own node is the set
    alone: no create first, and none when our own set fires our watch."""
    agent = await make_session(chroot(own_zk_server.hosts))
    instance = make_instance("ds-cost", 9108)
    registration = Registration(agent, instance)
    await registration.register()
    before = await asyncio.to_thread(_last_zxid, own_zk_server)

    await registration.update(instance.with_state(InstanceState.DRAINING, reason="draining"))
    await registration.update(instance.with_state(InstanceState.DRAINING, reason="leaving"))
    await registration.deregister()

    after = await asyncio.to_thread(_last_zxid, own_zk_server)
    assert after - before == 3  # two sets and the delete
    await registration.aclose()


async def test_deleted_node_is_recreated(make_session: SessionFactory) -> None:
    agent, operator = await make_session(), await make_session()
    async with Registration(agent, make_instance("ds-del", 9106)) as registration:
        path = f"{DATA_SERVERS_PATH}/ds-del"
        _, first = await operator.get(path)

        await operator.delete(path)

        async def recreated() -> bool:
            stat = await operator.exists(path)
            return stat is not None and stat.czxid != first.czxid

        await eventually(recreated, message="node re-created")
        # The operator may see the new node before the agent has read its create's
        # answer (another connection): `registered` alone can still be False then.
        assert await registration.settled()


async def test_deregister_while_disconnected_completes_at_reconnect(
    own_zk_server: ZooKeeperEnsemble,
    make_session: SessionFactory,
    chroot: Callable[[str], str],
) -> None:
    hosts = chroot(repeat_host(own_zk_server.hosts))
    # The session outlives the outage, so the node would outlive it too if forgotten.
    agent = await make_session(hosts, session_timeout=20, operation_timeout=1)
    registration = Registration(agent, make_instance("ds-offline", 9107))
    await registration.register()
    events = agent.subscribe()

    await asyncio.to_thread(own_zk_server.stop_server, 0)
    suspended = await waited(anext(events), "a session event as ZooKeeper stops", timeout=30)
    assert suspended.state is SessionState.SUSPENDED
    with pytest.raises(ZkConnectionError):
        await registration.deregister()
    await asyncio.to_thread(own_zk_server.start_server, 0)

    event = await waited(anext(events), "reconnection after the restart", timeout=30)
    assert event.state is SessionState.CONNECTED
    assert not event.new_session
    await eventually(
        lambda: absent(agent, f"{DATA_SERVERS_PATH}/ds-offline"), message="node deleted"
    )
    assert not registration.registered
    events.close()
    await registration.aclose()
