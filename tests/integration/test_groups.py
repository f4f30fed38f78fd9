"""Replica groups: the settings that put a group into a registration, and queries routed
by group through real data servers, ZooKeeper and Redis.

Parser and config tests (``--group``, the fleet's ``--groups``, ``--min-group-coverage``)
and one end-to-end test: six data servers in two groups of three shards; each query
goes to one group and is complete; with one group's replica of a shard stopped, that
group's queries are still complete (the shard filled from the other group); with two
of its three stopped it is out of rotation and gets no query; ``GET /cluster`` shows
the groups. The choice itself is tested on a fake clock in ``tests/unit/test_groups.py``;
the payload codec in ``tests/unit/test_instance.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

from data_server import cli as data_server_cli
from data_server.config import DataServerConfig
from data_server.corpus import sample_queries
from data_server.server import DataServer
from discovery.config import AgentConfig, ClusterConfig, ZkConfig
from discovery.errors import ConfigError
from discovery.instance import ServiceInstance
from discovery.tools.status.format import format_text
from discovery.tools.status.model import ClusterStatus, Published
from search_server import cli as search_server_cli
from search_server.config import SearchServerConfig
from search_server.server import SearchServer
from tests.configs import data_config, exit_message, fleet_config, search_config
from tests.support import (
    DataServerFactory,
    SearchServerFactory,
    all_see,
    eventually,
    get_json,
    make_instance,
    sample,
    schema_errors,
)

ENV = (
    "DISCOVERY_GROUP",
    "DISCOVERY_FLEET_GROUPS",
    "DISCOVERY_FLEET_SHARDS",
    "DISCOVERY_MIN_GROUP_COVERAGE",
)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # Parsers read the environment when built; a developer's shell must not leak in.
    for name in ENV:
        monkeypatch.delenv(name, raising=False)


# -- settings ---------------------------------------------------------------------------


def test_data_server_group_from_flag_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert data_config().group is None
    assert data_config("--group", "g1").group == "g1"
    monkeypatch.setenv("DISCOVERY_GROUP", " copy-b ")
    assert data_config().group == "copy-b"
    assert data_config("--group", "g3").group == "g3"  # a flag wins over its variable


@pytest.mark.parametrize("value", ["a b", "", "a/b", "g" * 65, "gé"])
def test_a_bad_group_is_a_cli_error_naming_the_flag(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert "argument --group: not a group name" in exit_message(
        data_server_cli.main, ["--group", value], capsys
    )


def test_a_bad_group_variable_is_named(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DISCOVERY_GROUP", "x y")
    assert "DISCOVERY_GROUP='x y'" in exit_message(data_server_cli.main, [], capsys)


def test_a_programmatic_data_server_group_is_checked() -> None:
    with pytest.raises(ConfigError, match=r"^--group / DISCOVERY_GROUP: must be 1\.\.64"):
        DataServerConfig(
            zk=ZkConfig(hosts="127.0.0.1:1"), cluster=ClusterConfig(), agent=AgentConfig(), group=""
        )


async def test_the_group_goes_into_the_registered_payload_only_when_set() -> None:
    def server(**fields: Any) -> DataServer:
        return DataServer(
            DataServerConfig(
                zk=ZkConfig(hosts="127.0.0.1:1"),
                cluster=ClusterConfig(),
                agent=AgentConfig(),
                docs=5,
                **fields,
            )
        )

    grouped, plain = server(group="g2"), server()
    for each in (grouped, plain):
        await each.load()
        each.port = 9001  # as if listening; _instance() is what the agent registers
    assert grouped._instance().group == "g2"
    assert grouped._instance().to_dict()["payload"]["group"] == "g2"
    assert "group" not in plain._instance().to_dict()["payload"]


def test_fleet_groups_give_replica_r_of_every_shard_group_r() -> None:
    fleet = fleet_config("--count", "6", "--procs", "1", "--shards", "3", "--groups", "a,b")
    slots = [fleet.slot(i) for i in range(6)]
    assert [(s.shard, s.replica, s.group) for s in slots] == [
        (0, 0, "a"),
        (1, 0, "a"),
        (2, 0, "a"),
        (0, 1, "b"),
        (1, 1, "b"),
        (2, 1, "b"),
    ]
    assert {
        s.group for s in (fleet_config("--count", "2", "--procs", "1").slot(i) for i in (0, 1))
    } == {None}


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--groups", "a,,b"], "argument --groups: not a group name"),
        (["--groups", "a,a"], "argument --groups: group 'a' is listed twice"),
        (["--groups", "a,b", "--group", "c"], "--groups (DISCOVERY_FLEET_GROUPS) and --group"),
    ],
)
def test_bad_fleet_groups_are_named(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert expected in exit_message(data_server_cli.main, ["fleet", "--count", "3", *argv], capsys)


def test_min_group_coverage(monkeypatch: pytest.MonkeyPatch) -> None:
    assert search_config().min_group_coverage_percent == 97.0
    assert search_config("--min-group-coverage", "90.5").min_group_coverage_percent == 90.5
    monkeypatch.setenv("DISCOVERY_MIN_GROUP_COVERAGE", "50")
    assert search_config().min_group_coverage_percent == 50.0


@pytest.mark.parametrize("value", ["101", "-1", "many", "nan", "inf"])
def test_a_bad_min_group_coverage_is_a_cli_error_naming_the_flag(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert "argument --min-group-coverage:" in exit_message(
        search_server_cli.main, ["--min-group-coverage", value], capsys
    )


def test_a_programmatic_min_group_coverage_is_checked() -> None:
    with pytest.raises(ConfigError, match=r"^--min-group-coverage must be in 0\.\.100"):
        SearchServerConfig(
            zk=ZkConfig(hosts="127.0.0.1:1"),
            cluster=ClusterConfig(),
            min_group_coverage_percent=120.0,
        )


def test_help_documents_the_group_settings(capsys: pytest.CaptureFixture[str]) -> None:
    for main, argv, pairs in [
        (data_server_cli.main, ["--help"], [("--group", "DISCOVERY_GROUP")]),
        (data_server_cli.main, ["fleet", "--help"], [("--groups", "DISCOVERY_FLEET_GROUPS")]),
        (
            search_server_cli.main,
            ["--help"],
            [("--min-group-coverage", "DISCOVERY_MIN_GROUP_COVERAGE")],
        ),
    ]:
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == 0
        out = " ".join(capsys.readouterr().out.split())
        for flag, env in pairs:
            assert f"{flag} " in out
            assert f"env {env}" in out


# -- end to end -------------------------------------------------------------------------


def _sent(search: SearchServer) -> dict[str, int]:
    """Requests this search server has sent to each data server it lists."""
    return {s["id"]: s.get("sent", 0) for s in search.cluster_view()["servers"]}


def _groups(search: SearchServer) -> dict[str, dict[str, Any]]:
    return {g["name"]: g for g in search.cluster_view()["groups"]["listed"]}


async def _query(search: SearchServer, query: str) -> set[str]:
    """Run ``query``: complete, its servers' ids (those whose requests grew)."""
    before = _sent(search)
    status, body = await get_json(f"{search.url}/search", q=query)
    assert status == 200, body
    assert body["partial"] is False, body
    assert body["coverage"]["percent"] == 100.0, body
    after = _sent(search)
    return {name for name, count in after.items() if count > before.get(name, 0)}


async def test_queries_go_to_one_group_fill_a_missing_shard_and_skip_a_group_short_of_coverage(
    make_data_server: DataServerFactory, make_search_server: SearchServerFactory
) -> None:
    data = {
        f"ds-{group}{shard}": await make_data_server(
            shard=shard, replica=replica, group=group, instance_id=f"ds-{group}{shard}"
        )
        for replica, group in enumerate("ab")
        for shard in range(3)
    }
    # 60 %: a group that lost one shard of three (67 %) stays in rotation, two (33 %) not.
    search = await make_search_server(
        server_id="ss-groups", hedge_percent=0.0, min_group_coverage_percent=60.0
    )
    await all_see([search], set(data))
    queries = sample_queries(12, variant=43)
    group_a, group_b = {"ds-a0", "ds-a1", "ds-a2"}, {"ds-b0", "ds-b1", "ds-b2"}

    # Each query to one whole group; one at a time, the groups take turns.
    served = [await _query(search, q) for q in queries[:4]]
    assert served == [group_a, group_b, group_a, group_b]
    view = search.cluster_view()
    assert {s["id"]: s["group"] for s in view["servers"]} == {name: name[3] for name in data}
    groups = _groups(search)
    assert view["groups"]["total"] == view["groups"]["in_rotation"] == 2
    assert view["groups"]["min_coverage_percent"] == 60.0
    for name in "ab":
        assert groups[name]["replicas"] == groups[name]["usable"] == 3
        assert groups[name]["coverage_percent"] == 100.0
        assert groups[name]["in_rotation"] is True
        assert groups[name]["queries"] == 2
    _, body = await get_json(f"{search.url}/cluster")
    assert {g["name"] for g in body["groups"]["listed"]} == {"a", "b"}
    assert {s["id"]: s["group"] for s in body["servers"]} == {name: name[3] for name in data}

    # a's replica of shard 0 stopped: a covers two shards of three, still in rotation;
    # its queries are complete, shard 0 filled from b.
    await data["ds-a0"].shutdown(grace=0)
    await all_see([search], set(data) - {"ds-a0"})
    await eventually(
        lambda: _groups(search)["a"]["replicas"] == 2, message="group a down to 2 replicas"
    )
    assert _groups(search)["a"]["coverage_percent"] == pytest.approx(66.67, abs=0.01)
    assert _groups(search)["a"]["in_rotation"] is True
    fills = sample(search.registry, "search_server_fanout_group_fills_total")
    served = [await _query(search, q) for q in queries[4:8]]
    assert sorted(served, key=sorted) == sorted(
        [{"ds-b0", "ds-a1", "ds-a2"}, group_b] * 2, key=sorted
    )
    assert sample(search.registry, "search_server_fanout_group_fills_total") == fills + 2

    # Two of a's three stopped: 33 %, below 60 %; b alone gets the queries.
    await data["ds-a1"].shutdown(grace=0)
    await all_see([search], set(data) - {"ds-a0", "ds-a1"})
    await eventually(
        lambda: _groups(search)["a"]["in_rotation"] is False, message="group a out of rotation"
    )
    assert _groups(search)["a"]["coverage_percent"] == pytest.approx(33.33, abs=0.01)
    assert search.cluster_view()["groups"]["in_rotation"] == 1
    served = [await _query(search, q) for q in queries[8:12]]
    assert served == [group_b] * 4
    assert (
        sample(search.registry, "search_server_fanout_group_in_rotation", group="a"),
        sample(search.registry, "search_server_fanout_group_in_rotation", group="b"),
    ) == (0, 1)


def test_status_shows_the_group_of_a_server_that_has_one() -> None:
    def instance(instance_id: str, **payload: Any) -> ServiceInstance:
        return make_instance(instance_id, address="10.0.0.1", **payload)

    servers = {
        "ds-a": instance("ds-a", group="g1", zone="eu-1"),
        "ds-b": instance("ds-b"),
    }
    status = ClusterStatus(
        zookeeper="127.0.0.1:2181",
        redis="redis://127.0.0.1:6379/0",
        prefix="discovery:{default}",
        now_ms=0,
        contenders=(),
        search_servers={},
        search_servers_invalid={},
        data_servers=servers,
        data_servers_invalid={},
        heartbeat=None,
        published=Published(None, "absent"),
    )
    document = status.to_dict()
    assert schema_errors(document, "status") == []
    listed = {
        s["id"]: s["group"]
        for shard in document["data_servers"]["shards"]
        for s in shard["servers"]
    }
    assert listed == {"ds-a": "g1", "ds-b": None}
    lines = {line.split()[0]: line for line in format_text(status).splitlines() if "ds-" in line}
    assert "zone eu-1  group g1  serving" in lines["ds-a"]
    assert "group" not in lines["ds-b"]
