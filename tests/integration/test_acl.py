"""ZooKeeper ACLs (digest auth) against the real server: every refusal, and what still works.

Each test bootstraps the access-controlled tree (``discovery zk-init``) inside its own
chroot with three roles: an admin, data servers (two identities, one of them shared by
several sessions) and search servers.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from kazoo import exceptions as kz
from kazoo.recipe.election import Election
from kazoo.security import ACL, OPEN_ACL_UNSAFE, READ_ACL_UNSAFE
from prometheus_client import CollectorRegistry

from data_server.config import DataServerConfig
from data_server.server import DataServer
from discovery.agent.agent import Agent, AgentState
from discovery.agent.probes import CallableProbe
from discovery.config import ClusterConfig, ZkConfig
from discovery.errors import ConfigError, ZkAuthError, ZkNoNodeError
from discovery.instance import InstanceState, ServiceInstance
from discovery.testing import ZooKeeperEnsemble
from discovery.tools import main as cli
from discovery.tools.zkdigest import DigestId
from discovery.tools.zkinit import AclLayout, bootstrap, split_chroot
from discovery.zk.acl import (
    ALL,
    CREATE,
    DATA_SERVER_ACCESS,
    DELETE,
    READ,
    check_access,
    describe_acl,
)
from discovery.zk.expiry import expire_session
from discovery.zk.paths import DATA_SERVERS_PATH, SEARCH_ELECTION_PATH, SEARCH_MEMBERS_PATH
from discovery.zk.registration import Registration, Removal
from discovery.zk.session import SessionState, ZkSession
from tests.support import (
    FAST_AGENT,
    DataServerFactory,
    FakeClock,
    SearchServerFactory,
    SessionFactory,
    absent,
    eventually,
    make_instance,
    more_probes,
    waited,
)

ADMIN = "admin:admin-pw"
DATA = "data:data-pw"  # shared by several data servers
DATA_OTHER = "ds-other:other-pw"  # a data server with an identity of its own
SEARCH = "search:search-pw"
LAYOUT = AclLayout(
    admin=DigestId.parse(ADMIN),
    data=(DigestId.parse(DATA), DigestId.parse(DATA_OTHER)),
    search=(DigestId.parse(SEARCH),),
)


async def _admin_session(servers: str) -> ZkSession:
    session = ZkSession.from_config(ZkConfig(hosts=servers, session_timeout=10, auth=ADMIN))
    await session.start()
    return session


async def _delete_tree(session: ZkSession, path: str) -> None:
    with contextlib.suppress(ZkNoNodeError):
        for child in await session.get_children(path):
            await _delete_tree(session, f"{path.rstrip('/')}/{child}")
        await session.delete(path)


@pytest.fixture
async def acl_tree(zk_hosts: str) -> AsyncIterator[str]:
    """Bootstrap the ACL'd tree in this test's chroot; yields the chroot.

    Request it before the server factories, so that it is torn down after them: its
    teardown empties the chroot as the admin (the fixture's own clean-up has no rights
    on the locked nodes) and opens the chroot node again for that clean-up.
    """
    servers, chroot = split_chroot(zk_hosts)
    admin = await _admin_session(servers)
    try:
        await bootstrap(admin, LAYOUT, chroot)
        yield chroot
        for child in await admin.get_children(chroot):
            await _delete_tree(admin, f"{chroot}/{child}")
        await admin.set_acls(chroot, OPEN_ACL_UNSAFE)
    finally:
        await admin.aclose()


def _entries(acl: list[ACL]) -> set[tuple[int, str, str]]:
    return {(entry.perms, entry.id.scheme, entry.id.id) for entry in acl}


def _owner_users(acl: list[ACL]) -> set[str]:
    """Digest users with ALL rights on a node."""
    return {
        entry.id.id.split(":", 1)[0]
        for entry in acl
        if entry.id.scheme == "digest" and entry.perms == ALL
    }


# -- ZooKeeper's own rules, which the design rests on --------------------------------------


async def test_zookeeper_checks_create_and_delete_against_the_parent(
    acl_tree: str, make_session: SessionFactory
) -> None:
    admin, data = await make_session(auth=ADMIN), await make_session(auth=DATA)
    admin_all, data_id = LAYOUT.admin.acl(ALL), LAYOUT.data[0]
    await admin.create("/no-delete", acl=[admin_all, data_id.acl(CREATE | READ)])
    await data.create("/no-delete/mine", ephemeral=True, acl=[data_id.acl(ALL)])
    await admin.create("/may-delete", acl=[admin_all, data_id.acl(DELETE | READ)])
    await admin.create("/may-delete/theirs", acl=[admin_all])

    # All rights on the node itself do not let its creator delete it...
    with pytest.raises(ZkAuthError, match="delete of /no-delete/mine"):
        await data.delete("/no-delete/mine")
    # ...while DELETE on the parent deletes a node whose own ACL grants nothing.
    await data.delete("/may-delete/theirs")
    assert await admin.exists("/may-delete/theirs") is None
    # Ending the session removes its ephemeral node without any right to delete it.
    await data.aclose()
    assert await admin.exists("/no-delete/mine") is None


# -- zk-init -----------------------------------------------------------------------------


async def test_zk_init_sets_every_acl_is_idempotent_and_repairs(
    acl_tree: str, zk_server: ZooKeeperEnsemble
) -> None:
    admin = await _admin_session(zk_server.hosts)
    try:
        expected = {
            acl_tree: {(ALL, "digest", LAYOUT.admin.id), (READ, "world", "anyone")},
            **{acl_tree + path: _entries(acl) for path, acl in LAYOUT.nodes()},
        }
        for path, entries in expected.items():
            assert _entries(await admin.get_acls(path)) == entries, path
        data_servers = _entries(await admin.get_acls(acl_tree + DATA_SERVERS_PATH))
        assert (CREATE | READ, "digest", LAYOUT.data[1].id) in data_servers
        assert not any(perms & DELETE for perms, _, ident in data_servers if ident.startswith("d"))

        again = await bootstrap(admin, LAYOUT, acl_tree)
        assert {r.action for r in again} == {"unchanged"}

        await admin.set_acls(acl_tree + DATA_SERVERS_PATH, OPEN_ACL_UNSAFE)
        repaired = await bootstrap(admin, LAYOUT, acl_tree)
        assert {r.path: r.action for r in repaired if r.action != "unchanged"} == {
            acl_tree + DATA_SERVERS_PATH: "fixed"
        }
        assert _entries(await admin.get_acls(acl_tree + DATA_SERVERS_PATH)) == data_servers
    finally:
        await admin.aclose()


async def test_zk_init_command_and_its_errors(
    acl_tree: str,
    zk_server: ZooKeeperEnsemble,
    zk_hosts: str,
    chroot: Callable[[str], str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The hashed form of an identity, for granting a role without its password.
    monkeypatch.setattr("sys.stdin", io.StringIO(f"{DATA_OTHER}\n"))
    assert cli.main(["zk-digest"]) == 0
    assert capsys.readouterr().out.strip() == f"digest:{LAYOUT.data[1].id}"

    args = [
        "zk-init",
        "--zk",
        zk_hosts,
        "--admin-auth",
        ADMIN,
        "--data-identities",
        f"{DATA},{LAYOUT.data[1]}",  # one as a password, one already hashed
        "--search-identities",
        SEARCH,
        "--json",
    ]
    assert await asyncio.to_thread(cli.main, args) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["chroot"] == acl_tree
    assert {node["action"] for node in document["nodes"]} == {"unchanged"}
    data_servers = next(n for n in document["nodes"] if n["path"].endswith(DATA_SERVERS_PATH))
    assert "digest:ds-other:READ|CREATE" in data_servers["acl"]

    wrong_admin = [*args[:4], "admin:guess", *args[5:]]
    assert await asyncio.to_thread(cli.main, wrong_admin) == 4  # refused
    assert "wrong password for the admin user 'admin'" in capsys.readouterr().err

    # A directory a data server created before zk-init: the admin may not change it.
    fresh = chroot(zk_server.hosts)
    early = ZkSession.from_config(ZkConfig(hosts=fresh, auth=DATA))
    await early.start()
    try:
        await early.ensure_path(DATA_SERVERS_PATH)
    finally:
        await early.aclose()
    assert await asyncio.to_thread(cli.main, [args[0], "--zk", fresh, *args[3:]]) == 4
    assert "cannot set the ACL of" in capsys.readouterr().err

    overlapping = [*args[:8], DATA, *args[9:]]
    assert await asyncio.to_thread(cli.main, overlapping) == 2
    assert "both the data and the search role" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="required"):
        AclLayout(admin=LAYOUT.admin, data=(), search=LAYOUT.search)


async def test_zk_init_reads_its_secrets_from_files_and_never_echoes_them(
    acl_tree: str,
    zk_hosts: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Files only (as a container's secrets), one through its variable: the same layout
    as the flags'; a wrong admin password read from a file is refused, unrepeated."""
    files = {
        "admin": f"{ADMIN}\n",
        "data": f"{DATA}\n{LAYOUT.data[1]}\n",  # one a line, one already hashed
        "search": f"{SEARCH}\n",
        "wrong": "admin:wrong-Guess-5150\n",
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    monkeypatch.setenv("DISCOVERY_ZK_SEARCH_IDENTITIES_FILE", str(tmp_path / "search"))
    args = ["zk-init", "--zk", zk_hosts, "--data-identities-file", str(tmp_path / "data")]
    args += ["--json"]
    admin = ["--admin-auth-file", str(tmp_path / "admin")]
    assert await asyncio.to_thread(cli.main, [*args, *admin]) == 0
    document = json.loads(capsys.readouterr().out)
    assert {node["action"] for node in document["nodes"]} == {"unchanged"}

    wrong = ["--admin-auth-file", str(tmp_path / "wrong")]
    assert await asyncio.to_thread(cli.main, [*args, *wrong]) == 4  # refused
    out, err = capsys.readouterr()
    assert "wrong password for the admin user 'admin'" in err
    assert "--admin-auth(-file)" in err
    for secret in ("wrong-Guess-5150", ADMIN.partition(":")[2], SEARCH.partition(":")[2]):
        assert secret not in out + err


# -- refusals ------------------------------------------------------------------------------


async def test_an_unauthenticated_client_reads_but_cannot_write_anything_of_ours(
    acl_tree: str, make_session: SessionFactory
) -> None:
    data, search, anonymous = (
        await make_session(auth=DATA),
        await make_session(auth=SEARCH),
        await make_session(),
    )
    await Registration(data, make_instance("ds-a", 9201), removal=Removal.AUTO).register()
    node = f"{DATA_SERVERS_PATH}/ds-a"
    contender = await search.create(
        f"{SEARCH_ELECTION_PATH}/x__lock__", b"ss-1", ephemeral=True, sequence=True
    )

    # Reading is open: Curator readers and `discovery status` need no credentials.
    assert await anonymous.get_children(DATA_SERVERS_PATH) == ["ds-a"]
    assert ServiceInstance.from_json((await anonymous.get(node))[0]).id == "ds-a"
    assert await anonymous.get_children(SEARCH_ELECTION_PATH) == [contender.rsplit("/", 1)[1]]

    refused = {
        "create a data server": anonymous.create(f"{DATA_SERVERS_PATH}/ds-fake", ephemeral=True),
        "rewrite a data server": anonymous.set(node, b"{}"),
        "delete a data server": anonymous.delete(node),
        "join the election": anonymous.create(
            f"{SEARCH_ELECTION_PATH}/y__lock__", ephemeral=True, sequence=True
        ),
        "delete the leader's node": anonymous.delete(contender),
        "register a member": anonymous.create(f"{SEARCH_MEMBERS_PATH}/ss-fake", ephemeral=True),
        "delete an empty directory": anonymous.delete(SEARCH_MEMBERS_PATH),
        "create at the chroot": anonymous.create("/squatter"),
        "write a directory": anonymous.set(DATA_SERVERS_PATH, b"x"),
        "open an ACL": anonymous.set_acls(DATA_SERVERS_PATH, OPEN_ACL_UNSAFE),
    }
    outcomes = {}
    for what, attempt in refused.items():
        try:
            await attempt
        except ZkAuthError as exc:
            outcomes[what] = "for an unauthenticated session" in str(exc)
        else:
            outcomes[what] = False
    assert outcomes == dict.fromkeys(refused, True)
    with pytest.raises(ZkAuthError, match="no --zk-auth may not register data servers"):
        await check_access(anonymous, DATA_SERVER_ACCESS)
    assert await anonymous.exists(node) is not None


async def test_a_data_server_cannot_delete_or_rewrite_another_ones_node(
    acl_tree: str, make_session: SessionFactory
) -> None:
    # A and B share one credential; C has one of its own.
    a, b, c = (
        await make_session(auth=DATA),
        await make_session(auth=DATA),
        await make_session(auth=DATA_OTHER),
    )
    await check_access(a, DATA_SERVER_ACCESS)
    await check_access(c, DATA_SERVER_ACCESS)
    registration_a = Registration(a, make_instance("ds-a", 9201), removal=Removal.AUTO)
    registration_b = Registration(b, make_instance("ds-b", 9202), removal=Removal.AUTO)
    await registration_a.register()
    await registration_b.register()
    node_a, node_b = f"{DATA_SERVERS_PATH}/ds-a", f"{DATA_SERVERS_PATH}/ds-b"

    # Each node belongs to its process's own identity, not to the shared credential.
    owners = _owner_users(await a.get_acls(node_a)), _owner_users(await a.get_acls(node_b))
    assert all(len(o) == 1 and next(iter(o)).startswith("data.") for o in owners)
    assert owners[0] != owners[1]
    assert READ_ACL_UNSAFE[0] in await a.get_acls(node_a)

    for intruder in (a, c):
        with pytest.raises(ZkAuthError, match=f"delete of {node_b} \\(a right on its parent\\)"):
            await intruder.delete(node_b)
        with pytest.raises(ZkAuthError, match=f"set of {node_b}"):
            await intruder.set(node_b, make_instance("ds-b", 9202, state="draining").to_json())
    data_b, _ = await c.get(node_b)
    assert ServiceInstance.from_json(data_b).payload.state is InstanceState.SERVING
    # Not even its own node can a data server delete: it ends its session instead.
    with pytest.raises(ZkAuthError):
        await a.delete(node_a)
    await registration_a.update(make_instance("ds-a", 9201, state="draining"))
    data_a, _ = await b.get(node_a)
    assert ServiceInstance.from_json(data_a).payload.state is InstanceState.DRAINING

    # A registration that may only delete reports the refusal.
    strict = Registration(c, make_instance("ds-c", 9203))
    await strict.register()
    with pytest.raises(ZkAuthError):
        await strict.deregister()
    await registration_a.aclose()
    await registration_b.aclose()


@contextlib.asynccontextmanager
async def _registered_agent(
    zk_hosts: str, observer: ZkSession, instance_id: str, port: int
) -> AsyncIterator[tuple[Agent, str]]:
    """An agent of the data identity, started, ready and seen registered by
    ``observer``, with its node's path; stopped after."""
    # A session timeout far beyond every wait of these tests: a node can only have gone
    # because its session was closed, never because it expired.
    zk = ZkConfig(hosts=zk_hosts, session_timeout=40, connect_timeout=20, auth=DATA)
    agent = Agent(
        make_instance(instance_id, port), CallableProbe(lambda: True), zk=zk, config=FAST_AGENT
    )
    path = f"{DATA_SERVERS_PATH}/{instance_id}"
    await agent.astart()
    try:
        agent.set_ready()
        await eventually(lambda: observer.exists(path), message=f"{instance_id} registered")
        yield agent, path
    finally:
        await agent.astop()


async def test_agent_goes_offline_at_once_and_comes_back_by_ending_its_session(
    acl_tree: str, zk_hosts: str, make_session: SessionFactory
) -> None:
    observer = await make_session()
    async with _registered_agent(zk_hosts, observer, "ds-agent", 9210) as (agent, path):
        first = agent.session.session_id if agent.session else None
        assert (await observer.get(path))[1].ephemeral_owner == first

        await agent.atake_offline("test")
        await eventually(lambda: absent(observer, path), timeout=10, message="gone")
        assert agent.session is not None
        assert agent.session.session_id != first
        # The new session must not bring the node back while we are offline.
        await more_probes(agent, 3)
        assert await observer.exists(path) is None
        assert agent.status().state is AgentState.ADMIN_OFFLINE

        await agent.abring_online()
        await eventually(lambda: observer.exists(path), message="back online")
        second = agent.session.session_id
        assert (await observer.get(path))[1].ephemeral_owner == second

        # Drain: the node is marked draining (a write only we may make), then removed.
        drain = asyncio.ensure_future(agent.adrain(grace=30))
        await eventually(
            lambda: _state_of(observer, path, InstanceState.DRAINING),
            timeout=10,
            message="ds-agent marked draining",
        )
        drain.cancel()  # cuts the grace short; the node still goes with the session
        with contextlib.suppress(asyncio.CancelledError):
            await drain
    await eventually(lambda: absent(observer, path), timeout=10, message="gone after stop")


async def test_a_drain_closes_the_session_for_good_rather_than_opening_another(
    acl_tree: str, zk_hosts: str, make_session: SessionFactory
) -> None:
    # A drain is the agent's last word: its node goes with the session, and a new
    # session (a handshake, a session on ZooKeeper, times a fleet draining at once)
    # would serve nothing but the stop that follows.
    observer = await make_session()
    async with _registered_agent(zk_hosts, observer, "ds-drained", 9211) as (agent, path):
        session = agent.session
        assert session is not None
        first = session.session_id

        await agent.adrain(grace=0.1)

        assert await observer.exists(path) is None  # gone when the drain returns
        assert agent.session is session
        assert session.session_id == first  # no new session opened
        assert session.state is SessionState.CLOSED


async def test_a_stale_node_of_an_earlier_incarnation_is_waited_out(
    acl_tree: str, make_session: SessionFactory
) -> None:
    # A restarted data server cannot delete its old node (no DELETE on the parent):
    # it registers once ZooKeeper has expired the old session.
    old_process, new_process = (
        await make_session(auth=DATA, session_timeout=30),
        await make_session(auth=DATA),
    )
    path = f"{DATA_SERVERS_PATH}/ds-restart"
    await old_process.create(path, make_instance("ds-restart", 9204).to_json(), ephemeral=True)
    registration = Registration(
        new_process, make_instance("ds-restart", 9204), removal=Removal.AUTO
    )
    await registration.register()
    assert not registration.registered
    assert (await new_process.get(path))[1].ephemeral_owner == old_process.session_id

    await expire_session(old_process)
    await eventually(lambda: registration.registered, message="registered after expiry")
    assert (await new_process.get(path))[1].ephemeral_owner == new_process.session_id
    await registration.aclose()


async def test_a_squatter_copying_our_address_is_reported_once_no_session_of_ours_could_last(
    acl_tree: str, make_session: SessionFactory
) -> None:
    # Another identity with the right to create under /data_servers took our id first,
    # with our address and port, so that its node looks like a stale one of ours.
    squatter, ours = (
        await make_session(auth=DATA_OTHER, session_timeout=30),
        await make_session(auth=DATA),
    )
    path = f"{DATA_SERVERS_PATH}/ds-victim"
    await squatter.create(path, make_instance("ds-victim", 9205).to_json(), ephemeral=True)
    registry, clock = CollectorRegistry(), FakeClock()
    registration = Registration(
        ours,
        make_instance("ds-victim", 9205),
        removal=Removal.AUTO,
        registry=registry,
        stale_grace=60,
        conflict_recheck=0.1,
        clock=clock,
    )
    await registration.register()  # taken for our own stale node at first: no error
    assert not registration.registered
    assert registration.conflict is None

    clock.advance(61)  # longer than any earlier session of ours could outlive its process
    await eventually(lambda: registration.conflict is not None, message="a conflict")
    assert registration.conflict is not None
    assert registration.conflict.impersonated
    assert registration.conflict.owner_session == squatter.session_id
    assert "squatting" in str(registration.conflict)
    assert registry.get_sample_value("discovery_registration_conflicted") == 1.0
    assert registry.get_sample_value("discovery_registration_conflicts_total") == 1.0
    await registration.aclose()


# -- the servers -----------------------------------------------------------------------------


async def test_data_and_search_servers_with_their_identities(
    acl_tree: str,
    make_session: SessionFactory,
    make_data_server: DataServerFactory,
    make_search_server: SearchServerFactory,
) -> None:
    observer = await make_session()
    data_server = await make_data_server(instance_id="ds-auth", zk_auth=DATA)
    search = await make_search_server(server_id="ss-auth", zk_auth=SEARCH)

    await eventually(lambda: search.is_leader, message="the search server leads")
    assert search.reader is not None
    await waited(
        search.reader.wait_until(lambda live: "ds-auth" in live.servers, timeout=15),
        "ds-auth in the live list",
    )
    (election_node,) = await observer.get_children(SEARCH_ELECTION_PATH)
    election_acl = await observer.get_acls(f"{SEARCH_ELECTION_PATH}/{election_node}")
    assert sorted(describe_acl(election_acl)) == ["digest:search:ALL", "world:anyone:READ"]
    member_acl = await observer.get_acls(f"{SEARCH_MEMBERS_PATH}/ss-auth")
    assert {user.split(".")[0] for user in _owner_users(member_acl)} == {"search"}

    # The data server's own admin API takes it offline and back, ACLs notwithstanding.
    assert data_server.agent is not None
    await data_server.agent.atake_offline("test")
    await waited(
        search.reader.wait_until(lambda live: "ds-auth" not in live.servers, timeout=15),
        "ds-auth to leave the live list",
    )
    await data_server.agent.abring_online()
    await waited(
        search.reader.wait_until(lambda live: "ds-auth" in live.servers, timeout=15),
        "ds-auth back in the live list",
    )


async def test_a_data_server_identity_cannot_take_part_in_the_election(
    acl_tree: str, make_session: SessionFactory, make_search_server: SearchServerFactory
) -> None:
    data = await make_session(auth=DATA)
    with pytest.raises(ZkAuthError, match="create of /search_servers/election"):
        await data.create(f"{SEARCH_ELECTION_PATH}/x__lock__", ephemeral=True, sequence=True)
    election = Election(data.client, SEARCH_ELECTION_PATH, "ds-intruder")
    with pytest.raises(kz.NoAuthError):
        await asyncio.to_thread(election.run, lambda: None)
    with pytest.raises(ZkAuthError, match="may not take part in the leader election"):
        await make_search_server(server_id="ss-intruder", zk_auth=DATA)
    assert await data.get_children(SEARCH_ELECTION_PATH) == []


async def test_a_wrong_password_is_a_clear_error_at_start_up(
    acl_tree: str, zk_hosts: str, make_search_server: SearchServerFactory
) -> None:
    def data_server(auth: str) -> DataServer:
        zk = ZkConfig(hosts=zk_hosts, session_timeout=2, connect_timeout=20, auth=auth)
        config = DataServerConfig(
            zk=zk, cluster=ClusterConfig(), agent=FAST_AGENT, port=0, docs=50, instance_id="ds-w"
        )
        return DataServer(config)

    with pytest.raises(ZkAuthError, match="wrong password for ZooKeeper digest user 'data'"):
        await data_server("data:guess").start()
    with pytest.raises(ZkAuthError, match="identity 'nobody' may not register"):
        await data_server("nobody:pw").start()
    with pytest.raises(ZkAuthError, match="wrong password for ZooKeeper digest user 'search'"):
        await make_search_server(server_id="ss-wrong", zk_auth="search:guess")


# -- helpers ---------------------------------------------------------------------------------


async def _state_of(session: ZkSession, path: str, state: InstanceState) -> bool:
    try:
        data, _ = await session.get(path)
    except ZkNoNodeError:
        return False
    return ServiceInstance.from_json(data).payload.state is state
