"""Operator maintenance (``/maintenance/<id>``, ``discovery maint``) against a real
ZooKeeper and Redis: the leader's overlay through restarts, re-registrations and a new
leader, malformed markers, the command line, ``discovery status``, ACLs and the page.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis

from data_server.corpus import sample_queries
from discovery.errors import InvalidMarkerError, ZkAuthError
from discovery.instance import InstanceState, ServiceInstance
from discovery.livelist.redis.store import RedisLiveStore
from discovery.testing import RedisServer
from discovery.tools import main as cli
from discovery.tools.status import collect_status, format_text
from discovery.zk.expiry import expire_session
from discovery.zk.maintenance import (
    MAX_MARKER_BYTES,
    MaintenanceMarker,
    MaintenanceView,
    MaintenanceWatcher,
    apply_marker,
    overlay,
)
from discovery.zk.paths import DATA_SERVERS_PATH, MAINTENANCE_PATH
from discovery.zk.session import ZkSession
from search_server.server import SearchServer
from tests.browser import CHROMIUM, CHROMIUM_ARGS, UI_TIMEOUT_MS, playwright_api
from tests.integration.test_acl import ADMIN, DATA, SEARCH, acl_tree  # noqa: F401  (a fixture)
from tests.support import (
    DataServerFactory,
    SearchServerFactory,
    SessionFactory,
    conforming,
    eventually,
    get_json,
    make_instance,
    published_term,
    sample,
    waited,
)

REASON = "disk replacement, ticket OPS-123"


# -- helpers ---------------------------------------------------------------------------------


async def maint(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``discovery maint ARGS`` in-process (in a thread: it runs its own event loop);
    (exit status, stdout, stderr). Argument errors exit 2 through argparse."""
    capsys.readouterr()
    try:
        code = await asyncio.to_thread(cli.main, ["--log-level", "ERROR", "maint", *args])
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def state_of(search: SearchServer, instance_id: str) -> tuple[str, str | None, bool] | None:
    """(state, reason, enabled) of ``instance_id`` in a search server's live list."""
    assert search.reader is not None
    instance = search.reader.current.servers.get(instance_id)
    if instance is None:
        return None
    return instance.payload.state.value, instance.payload.reason, instance.enabled


def in_maintenance(
    search: SearchServer, instance_id: str, reason: str = REASON
) -> Callable[[], bool]:
    return lambda: state_of(search, instance_id) == ("maintenance", reason, False)


def serving(search: SearchServer, instance_id: str) -> Callable[[], bool]:
    return lambda: state_of(search, instance_id) == ("serving", None, True)


class StateLog:
    """Every state of one id in a search server's list, step by step (``absent`` when
    it is not listed), as its follower applies them: a step cannot be missed by polling."""

    def __init__(self, search: SearchServer, instance_id: str) -> None:
        assert search.reader is not None
        self.states: list[tuple[int, str]] = []  # (epoch, state)
        self._changes = search.reader.changes()
        self._id = instance_id
        self._task = asyncio.create_task(self._follow())

    async def _follow(self) -> None:
        async for change in self._changes:
            instance = change.current.servers.get(self._id)
            state = instance.payload.state.value if instance is not None else "absent"
            self.states.append((change.current.epoch, state))

    def mark(self) -> int:
        return len(self.states)

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


async def search_shards(search: SearchServer, queries: list[str]) -> list[dict[str, Any]]:
    """The answers of ``/search`` for ``queries``."""
    answers = []
    async with aiohttp.ClientSession() as client:
        for query in queries:
            async with client.get(f"{search.url}/search", params={"q": query, "k": "5"}) as r:
                assert r.status == 200, await r.text()
                answers.append(await r.json())
    return answers


async def register(session: ZkSession, instance: ServiceInstance) -> None:
    await session.create(
        f"{DATA_SERVERS_PATH}/{instance.id}", instance.to_json(), ephemeral=True, makepath=True
    )


# -- the document and the overlay (no I/O) -------------------------------------------------


def test_marker_document_round_trip_and_validation() -> None:
    marker = MaintenanceMarker.create("ds-7", REASON, by="ann@ops-1", set_at=1_763_700_000_000)
    assert json.loads(marker.to_json()) == {
        "reason": REASON,
        "set_at": 1_763_700_000_000,
        "by": "ann@ops-1",
    }
    assert MaintenanceMarker.parse("ds-7", marker.to_json()) == marker
    # Unknown keys of a newer writer are ignored; set_at and by are optional.
    assert MaintenanceMarker.parse("ds-7", b'{"reason":"r","ticket":"X-1"}') == MaintenanceMarker(
        "ds-7", "r"
    )
    for bad_id in ("", "a/b", "..", "x" * 129):
        with pytest.raises(InvalidMarkerError, match=r"must be 1\.\.128 characters"):
            MaintenanceMarker.create(bad_id, REASON)
    for bad_reason, message in (
        ("", "must not be blank"),
        ("   ", "must not be blank"),
        ("x" * 501, "more than 500"),
        ("two\nlines", "one line"),
    ):
        with pytest.raises(InvalidMarkerError, match=message):
            MaintenanceMarker.create("ds-7", bad_reason)


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"{not json", "malformed: not a JSON document"),
        (b"", "malformed: not a JSON document"),
        (b"\xff\xfe", "malformed: not a JSON document"),
        (b'{"reason": NaN}', "malformed: not a JSON document"),
        (b"[]", "malformed: not a JSON object"),
        (b'{"by":"ann"}', "malformed: reason must be a string"),
        (b'{"reason":""}', "malformed: reason must not be blank"),
        (b'{"reason":"r","set_at":"yesterday"}', "malformed: set_at"),
        (b'{"reason":"r","set_at":true}', "malformed: set_at"),
        (b'{"reason":"r","by":7}', "malformed: by"),
        (b'{"reason":"\\ud800"}', "malformed: reason is not valid Unicode"),
        (b'{"reason":"' + b"x" * MAX_MARKER_BYTES + b'"}', "too_large"),
    ],
)
def test_an_unreadable_marker_is_still_maintenance(data: bytes, problem: str) -> None:
    marker = MaintenanceMarker.parse("ds-7", data)
    assert not marker.readable
    assert marker.problem is not None
    assert marker.problem.startswith(problem), marker.problem
    assert marker.reason.startswith("maintenance marker unreadable: ")
    assert len(marker.reason) < 250  # a 64 KiB document is not quoted into the list
    published = apply_marker(make_instance("ds-7"), marker)
    assert (published.payload.state, published.enabled) == (InstanceState.MAINTENANCE, False)
    assert not published.routable


def test_overlay_changes_only_marked_members() -> None:
    import immutables

    members = immutables.Map({i: make_instance(i, 9000 + n) for n, i in enumerate("abc")})
    markers = {"b": MaintenanceMarker("b", "swap"), "zz": MaintenanceMarker("zz", "later")}
    laid = overlay(members, markers)
    assert isinstance(laid, immutables.Map)
    assert laid["a"] is members["a"]
    assert laid["c"] is members["c"]
    assert laid["b"].payload.state is InstanceState.MAINTENANCE
    assert laid["b"].payload.reason == "swap"
    assert laid["b"].registration_time_utc == members["b"].registration_time_utc
    assert set(laid) == {"a", "b", "c"}  # a marker of an unregistered id adds nothing
    assert overlay(members, {}) is members
    view = MaintenanceView(members, markers)
    assert len(view) == 3
    assert "zz" not in view
    assert dict(view) == dict(laid)


# -- the leader's overlay ------------------------------------------------------------------


async def test_maintenance_routes_around_a_server_through_restarts_until_cleared(
    zk_hosts: str,
    redis_server: RedisServer,
    redis_prefix: str,
    client: aioredis.Redis,
    capsys: pytest.CaptureFixture[str],
    make_session: SessionFactory,
    make_data_server: DataServerFactory,
    make_search_server: SearchServerFactory,
) -> None:
    data = {i: await make_data_server(shard=i, instance_id=f"ds-{i}") for i in range(2)}
    search = await make_search_server(server_id="ss-0")
    await eventually(lambda: search.is_leader, message="ss-0 leads")
    await eventually(serving(search, "ds-0"), message="ds-0 listed as serving")
    await eventually(serving(search, "ds-1"), message="ds-1 listed as serving")
    log = StateLog(search, "ds-0")
    queries = sample_queries(8, variant=2)

    code, out, err = await maint(capsys, "set", "ds-0", "--reason", REASON, "--zk", zk_hosts)
    assert code == 0, err
    assert f"ds-0: maintenance set (reason: {REASON})" in out
    assert "ds-0 is registered (127.0.0.1:" in out
    await eventually(in_maintenance(search, "ds-0"), message="ds-0 published as maintenance")

    # Listed (visible), but no query reaches it: shard 0 has no routable replica left.
    for answer in await search_shards(search, queries):
        assert answer["shards"]["total"] == 1, answer
        assert {hit["shard"] for hit in answer["hits"]} <= {1}
    _, view = await get_json(f"{search.url}/cluster")
    entry = next(s for s in view["servers"] if s["id"] == "ds-0")
    assert (entry["state"], entry["reason"], entry["enabled"]) == ("maintenance", REASON, False)
    assert "reason" not in next(s for s in view["servers"] if s["id"] == "ds-1")

    # The agent re-admits its server (a fresh registration saying "serving"): still
    # maintenance, since the marker is not in the server's node.
    agent = data[0].agent
    assert agent is not None
    before = search.reader.current.servers["ds-0"].registration_time_utc  # type: ignore[union-attr]
    await agent.atake_offline("test")
    await agent.abring_online()
    await eventually(
        lambda: (
            search.reader is not None
            and (i := search.reader.current.servers.get("ds-0")) is not None
            and i.registration_time_utc != before
        ),
        message="ds-0 registered again",
    )
    assert state_of(search, "ds-0") == ("maintenance", REASON, False)

    # The process restarts: its node goes, a new process registers a new one.
    await data[0].shutdown(grace=0)
    await eventually(lambda: state_of(search, "ds-0") is None, message="ds-0 gone")
    data[0] = await make_data_server(shard=0, instance_id="ds-0")
    await eventually(in_maintenance(search, "ds-0"), message="restarted ds-0 in maintenance")
    for answer in await search_shards(search, queries):
        assert answer["shards"]["total"] == 1, answer

    # discovery status shows it, with its reason, and a marker set ahead of registration.
    code, out, err = await maint(capsys, "set", "ds-9", "--reason", "new rack", "--zk", zk_hosts)
    assert code == 0, err
    assert "ds-9 is not registered now: the marker applies as soon as it registers" in out
    status = await collect_status(await make_session(), RedisLiveStore(client, redis_prefix).admin)
    document = conforming(status.to_dict(), "status")
    assert document["differences"]["in_sync"] is True, document["differences"]
    markers = {m["id"]: m for m in document["maintenance"]["markers"]}
    assert (markers["ds-0"]["reason"], markers["ds-0"]["registered"]) == (REASON, True)
    assert (markers["ds-9"]["reason"], markers["ds-9"]["registered"]) == ("new rack", False)
    assert markers["ds-0"]["by"]
    listed = {s["id"]: s for shard in document["data_servers"]["shards"] for s in shard["servers"]}
    assert listed["ds-0"]["maintenance"] == REASON
    assert listed["ds-1"]["maintenance"] is None
    text = format_text(status)
    (line,) = [line for line in text.splitlines() if line.startswith("    ds-0 ")]
    assert line.endswith(f"maintenance ({REASON})")
    assert "maintenance (2):" in text
    assert any(line.startswith("  ds-9") and "not registered" in line for line in text.splitlines())

    # Cleared: serving again, and queried.
    cleared_at = log.mark()
    code, out, err = await maint(capsys, "clear", "ds-0", "--zk", zk_hosts)
    assert code == 0, err
    assert f"ds-0: maintenance cleared (was: {REASON})" in out
    await eventually(serving(search, "ds-0"), message="ds-0 serving again")
    answers = await search_shards(search, queries)
    assert all(answer["shards"]["total"] == 2 for answer in answers), answers
    await log.close()

    states = [state for _, state in log.states]
    first = states.index("maintenance")
    assert "serving" not in states[first:cleared_at], states
    assert states[-1] == "serving"
    # Nothing here was a loss for the mass-loss brake.
    assert sample(search.registry, "discovery_leader_mass_loss_engagements_total") == 0
    assert sample(search.registry, "discovery_maintenance_markers") == 1  # ds-9's


async def test_a_marker_set_before_registration_holds_through_a_change_of_leader(
    zk_hosts: str,
    capsys: pytest.CaptureFixture[str],
    make_session: SessionFactory,
    make_search_server: SearchServerFactory,
) -> None:
    session = await make_session()
    code, out, err = await maint(capsys, "set", "ds-new", "--reason", REASON, "--zk", zk_hosts)
    assert code == 0, err
    assert "not registered now" in out
    search = [await make_search_server(server_id=f"ss-{i}") for i in range(2)]
    await eventually(lambda: any(s.is_leader for s in search), message="a leader")
    old = next(s for s in search if s.is_leader)
    other = next(s for s in search if s is not old)
    term = await published_term(old)
    log = StateLog(other, "ds-new")

    await register(session, make_instance("ds-new", 9101))
    await register(session, make_instance("ds-ok", 9102, shard=1))
    await eventually(in_maintenance(other, "ds-new"), message="ds-new published as maintenance")
    await eventually(serving(other, "ds-ok"), message="ds-ok serving")

    # The leader stops; its successor reads the markers before its first publish.
    await old.shutdown()
    await eventually(lambda: other.is_leader, message="ss-1 leads")
    assert other.reader is not None
    await eventually(
        lambda: other.reader is not None and other.reader.current.epoch > term.epoch,
        message="a list of the new epoch",
    )
    await eventually(in_maintenance(other, "ds-new"), message="still maintenance")
    await log.close()
    assert "serving" not in [state for _, state in log.states], log.states
    new_epoch = [state for epoch, state in log.states if epoch > term.epoch]
    assert new_epoch, log.states
    assert set(new_epoch) == {"maintenance"}, log.states

    # Clearing reaches the new leader too.
    code, _, err = await maint(capsys, "clear", "ds-new", "--zk", zk_hosts)
    assert code == 0, err
    await eventually(serving(other, "ds-new"), message="ds-new serving")


async def test_malformed_markers_are_maintenance_counted_and_never_stop_the_watcher(
    make_session: SessionFactory, make_search_server: SearchServerFactory
) -> None:
    session = await make_session()
    for n, instance_id in enumerate(("ds-json", "ds-big", "ds-type", "ds-good")):
        await register(session, make_instance(instance_id, 9200 + n, shard=n))
    search = await make_search_server(server_id="ss-0")
    await eventually(lambda: search.is_leader, message="leads")
    await eventually(serving(search, "ds-good"), message="ds-good listed")

    await session.create(f"{MAINTENANCE_PATH}/ds-json", b"{not json", makepath=True)
    await session.create(f"{MAINTENANCE_PATH}/ds-big", b"x" * (MAX_MARKER_BYTES + 1))
    await session.create(f"{MAINTENANCE_PATH}/ds-type", b'{"reason": 42}')
    await session.create(f"{MAINTENANCE_PATH}/not an id", b'{"reason": "x"}')
    good = MaintenanceMarker.create("ds-good", REASON, by="test")
    await session.create(f"{MAINTENANCE_PATH}/ds-good", good.to_json())

    await eventually(in_maintenance(search, "ds-good"), message="ds-good in maintenance")
    for instance_id, problem in (
        ("ds-json", "malformed: not a JSON document"),
        ("ds-big", "too_large"),
        ("ds-type", "malformed: reason must be a string"),
    ):
        await eventually(
            lambda i=instance_id: (
                (state := state_of(search, i)) is not None and state[0] == "maintenance"
            ),
            message=f"{instance_id} in maintenance",
        )
        state = state_of(search, instance_id)
        assert state is not None
        assert state[1] is not None
        assert state[1].startswith(f"maintenance marker unreadable: {problem}"), state
    registry = search.registry
    assert sample(registry, "discovery_maintenance_unreadable") == 4
    counted = sum(
        sample(registry, "discovery_maintenance_unreadable_versions_total", reason=r)
        for r in ("malformed", "too_large", "bad_name")
    )
    assert counted == 4

    # Fixed by setting it again: the watcher still follows.
    fixed = MaintenanceMarker.create("ds-json", "fixed marker")
    await session.set(f"{MAINTENANCE_PATH}/ds-json", fixed.to_json())
    await eventually(
        in_maintenance(search, "ds-json", "fixed marker"), message="ds-json's reason fixed"
    )
    await session.delete(f"{MAINTENANCE_PATH}/ds-type")
    await eventually(serving(search, "ds-type"), message="ds-type serving again")
    assert sample(registry, "discovery_maintenance_unreadable") == 2
    assert search.is_leader


async def test_servers_in_maintenance_are_no_loss_for_the_mass_loss_brake(
    capsys: pytest.CaptureFixture[str],
    zk_hosts: str,
    make_session: SessionFactory,
    make_search_server: SearchServerFactory,
) -> None:
    sessions = [await make_session() for _ in range(6)]
    for n, session in enumerate(sessions):
        await register(session, make_instance(f"ds-{n}", 9300 + n, shard=n))
    search = await make_search_server(server_id="ss-0")
    await eventually(
        lambda: all(serving(search, f"ds-{n}")() for n in range(6)), message="all serving"
    )
    # Four of six (67 %, above the 30 % threshold) go into maintenance: they stay listed.
    for n in range(4):
        code, _, err = await maint(capsys, "set", f"ds-{n}", "--reason", "rack", "--zk", zk_hosts)
        assert code == 0, err
    await eventually(
        lambda: all(in_maintenance(search, f"ds-{n}", "rack")() for n in range(4)),
        message="four in maintenance",
    )
    # Then the operator powers them off: their removals were announced, none is held.
    for session in sessions[:4]:
        await session.aclose()
    await eventually(
        lambda: (
            search.reader is not None and set(search.reader.current.servers) == {"ds-4", "ds-5"}
        ),
        message="the four removed at once",
    )
    assert sample(search.registry, "discovery_leader_mass_loss_engagements_total") == 0
    assert sample(search.registry, "discovery_leader_mass_loss_held") == 0


async def test_the_watcher_follows_a_missing_directory_and_a_session_expiry(
    make_session: SessionFactory,
) -> None:
    session, admin = await make_session(), await make_session()
    seen: list[frozenset[str]] = []
    async with MaintenanceWatcher(session, on_change=seen.append) as watcher:
        assert dict(watcher.markers) == {}  # no /maintenance yet: nothing, and no error
        assert await session.exists(MAINTENANCE_PATH) is None  # the leader never creates it

        path = f"{MAINTENANCE_PATH}/ds-1"
        await admin.create(path, MaintenanceMarker.create("ds-1", "one").to_json(), makepath=True)
        await waited(watcher.wait_until(lambda m: "ds-1" in m, 10), "ds-1's marker")
        await admin.set(path, MaintenanceMarker.create("ds-1", "two").to_json())
        await waited(
            watcher.wait_until(lambda m: "ds-1" in m and m["ds-1"].reason == "two", 10),
            "ds-1's new reason",
        )

        # A new session: the watches are gone with the old one; everything is read again.
        await expire_session(session)
        await admin.create(f"{MAINTENANCE_PATH}/ds-2", MaintenanceMarker("ds-2", "r").to_json())
        await waited(watcher.wait_until(lambda m: "ds-2" in m, 10), "ds-2 after the expiry")
        await admin.delete(path)
        await waited(watcher.wait_until(lambda m: "ds-1" not in m, 10), "ds-1 cleared")

        # The directory deleted and made again.
        await admin.delete(f"{MAINTENANCE_PATH}/ds-2")
        await admin.delete(MAINTENANCE_PATH)
        await waited(watcher.wait_until(lambda m: not m, 10), "no markers")
        await admin.create(f"{MAINTENANCE_PATH}/ds-3", b"{bad", makepath=True)
        await waited(watcher.wait_until(lambda m: "ds-3" in m, 10), "ds-3 after re-creation")
        assert not watcher.markers["ds-3"].readable
    assert {"ds-1"} in [set(ids) for ids in seen]
    assert frozenset({"ds-3"}) in seen


# -- the command line --------------------------------------------------------------------


async def test_maint_command_set_clear_list_and_its_errors(
    zk_hosts: str, capsys: pytest.CaptureFixture[str], make_session: SessionFactory
) -> None:
    zk = ("--zk", zk_hosts)
    code, out, _ = await maint(capsys, "list", *zk)
    assert (code, out.strip()) == (0, "no data server is in maintenance")

    code, out, err = await maint(capsys, "set", "ds-1", "--reason", "first", "--by", "ann", *zk)
    assert code == 0, err
    code, out, err = await maint(capsys, "set", "ds-1", "--reason", "second", *zk, "--json")
    assert code == 0, err
    document = json.loads(out)
    assert document["previous"]["reason"] == "first"
    assert document["marker"]["reason"] == "second"
    assert document["registered"] is False
    assert "@" in document["marker"]["by"]  # user@host by default

    session = await make_session()
    await register(session, make_instance("ds-1", 9401))
    await session.create(f"{MAINTENANCE_PATH}/ds-bad", b"{")
    code, out, err = await maint(capsys, "list", *zk)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "maintenance markers (2):"
    (ds1_line,) = [line for line in lines if line.startswith("  ds-1 ")]
    assert "  registered  " in ds1_line
    assert ds1_line.endswith(": second")
    assert any("ds-bad" in line and "UNREADABLE" in line for line in lines)
    code, out, _ = await maint(capsys, "list", *zk, "--json")
    listed = {m["id"]: m for m in conforming(json.loads(out), "maint-list")["markers"]}
    assert listed["ds-1"]["registered"] is True
    assert listed["ds-1"]["reason"] == "second"
    assert listed["ds-bad"]["readable"] is False

    code, out, err = await maint(capsys, "clear", "ds-1", *zk)
    assert (code, out.strip()) == (
        0,
        "ds-1: maintenance cleared (was: second); the leader publishes it as registered again",
    )
    # Clearing what is not set changes nothing, says so, and is no error (idempotent).
    code, out, err = await maint(capsys, "clear", "ds-1", *zk)
    assert (code, out.strip(), err) == (
        0,
        "ds-1: not in maintenance (no marker); nothing to clear",
        "",
    )
    code, out, _ = await maint(capsys, "clear", "ds-1", *zk, "--json")
    assert json.loads(out) == {"action": "clear", "id": "ds-1", "cleared": False, "marker": None}

    # Bad input: exit 2, the argument named, nothing written.
    for args, message in (
        (("set", "ds/1", "--reason", "r"), "argument ID: must be 1..128 characters"),
        (("set", "ds-1"), "the following arguments are required: --reason"),
        (("set", "ds-1", "--reason", " "), "argument --reason: must not be blank"),
        (("set", "ds-1", "--reason", "x" * 501), "argument --reason: is 501 characters"),
        (("clear",), "the following arguments are required: ID"),
        (("frobnicate",), "invalid choice: 'frobnicate'"),
    ):
        code, out, err = await maint(capsys, *args, *zk)
        assert code == 2, (args, out, err)
        assert message in err, (args, err)
    assert await session.get_children(MAINTENANCE_PATH) == ["ds-bad"]

    # ZooKeeper unreachable: exit 3, naming where.
    code, out, err = await maint(
        capsys, "set", "ds-1", "--reason", "r", "--zk", "127.0.0.1:1", "--zk-connect-timeout", "1"
    )
    assert code == 3
    assert "discovery maint: cannot use ZooKeeper at 127.0.0.1:1" in err


async def test_maint_says_when_the_leader_skips_the_node_of_an_id(
    zk_hosts: str, capsys: pytest.CaptureFixture[str], make_session: SessionFactory
) -> None:
    # A persistent node whose document says DYNAMIC is no registration (the leader
    # skips it): the command says so and why, rather than "registered".
    session = await make_session()
    squatter = make_instance("ds-squat", 9401)
    await session.create(f"{DATA_SERVERS_PATH}/ds-squat", squatter.to_json(), makepath=True)
    code, out, err = await maint(capsys, "set", "ds-squat", "--reason", REASON, "--zk", zk_hosts)
    assert code == 0, err
    assert "ds-squat is registered, but the leader skips its node (persistent_dynamic: " in out


async def test_acls_only_the_admin_sets_markers_and_the_leader_reads_them(
    acl_tree: str,  # noqa: F811  (the fixture imported above)
    zk_hosts: str,
    capsys: pytest.CaptureFixture[str],
    make_session: SessionFactory,
    make_search_server: SearchServerFactory,
) -> None:
    data = await make_session(auth=DATA)
    await register(data, make_instance("ds-acl", 9501))
    search = await make_search_server(server_id="ss-acl", zk_auth=SEARCH)
    await eventually(serving(search, "ds-acl"), message="ds-acl serving")

    # Neither servers' role may write a marker: a data server cannot lift its own.
    for session in (data, await make_session(auth=SEARCH)):
        with pytest.raises(ZkAuthError, match="create of /maintenance/ds-acl"):
            await session.create(f"{MAINTENANCE_PATH}/ds-acl", b'{"reason":"x"}')
    code, _, err = await maint(capsys, "set", "ds-acl", "--reason", REASON, "--zk", zk_hosts)
    assert code == 4  # refused: retrying without the admin identity cannot help
    assert "admin identity" in err
    assert "--zk-auth" in err

    admin = ("--zk", zk_hosts, "--zk-auth", ADMIN)
    code, _, err = await maint(capsys, "set", "ds-acl", "--reason", REASON, *admin)
    assert code == 0, err
    await eventually(in_maintenance(search, "ds-acl"), message="applied by the leader")
    with pytest.raises(ZkAuthError):
        await data.delete(f"{MAINTENANCE_PATH}/ds-acl")
    code, _, err = await maint(capsys, "clear", "ds-acl", *admin)
    assert code == 0, err
    await eventually(serving(search, "ds-acl"), message="serving again")


# -- the dashboard ------------------------------------------------------------------------


async def test_dashboard_shows_maintenance_with_its_reason(
    zk_hosts: str,
    capsys: pytest.CaptureFixture[str],
    make_search_server: SearchServerFactory,
    make_data_server: DataServerFactory,
) -> None:
    async_playwright = playwright_api()
    from playwright.async_api import expect

    for i in range(2):
        await make_data_server(shard=i, docs=100, instance_id=f"ds-{i}")
    search = await make_search_server(server_id="ss-dash")
    await eventually(serving(search, "ds-1"), message="ds-1 listed")

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            await page.goto(f"{search.url}/", wait_until="load")
            await expect(page.locator('.tile[data-state="serving"]')).to_have_count(
                2, timeout=UI_TIMEOUT_MS
            )
            code, _, err = await maint(capsys, "set", "ds-1", "--reason", REASON, "--zk", zk_hosts)
            assert code == 0, err
            tile = page.locator('[data-id="ds-1"][data-state="maintenance"]')
            await expect(tile).to_have_count(1, timeout=UI_TIMEOUT_MS)
            await expect(tile.locator(".reason")).to_have_text(REASON)
            await expect(page.locator("#n-maintenance")).to_have_text("1")
            await expect(page.locator("#n-serving")).to_have_text("1")

            code, _, err = await maint(capsys, "clear", "ds-1", "--zk", zk_hosts)
            assert code == 0, err
            await expect(page.locator('[data-id="ds-1"][data-state="serving"]')).to_have_count(
                1, timeout=UI_TIMEOUT_MS
            )
            await expect(page.locator("#n-maintenance")).to_have_text("0")
            assert errors == [], errors
        finally:
            await browser.close()
