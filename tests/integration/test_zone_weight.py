"""Zones and weights: the settings that put them into a registration, and what shows them.

Pure parser and config tests (flags, environment variables, the fleet's round-robin
``--zones``), the ``discovery status`` report, and one end-to-end test against a real
ZooKeeper and Redis: a data server registered with a zone and a weight appears with
both in a search server's ``GET /cluster`` (registration, leader, Redis, reader). The
payload codec itself is tested in ``tests/unit/test_instance.py`` and
``tests/unit/test_properties.py``.
"""

from __future__ import annotations

from collections import Counter

import pytest

from data_server import cli as data_server_cli
from data_server.config import (
    DataServerConfig,
)
from data_server.server import DataServer
from discovery.config import AgentConfig, ClusterConfig, ZkConfig
from discovery.errors import ConfigError
from discovery.instance import InstancePayload, InstanceState, ServiceInstance
from discovery.tools.status.format import format_text
from discovery.tools.status.model import ClusterStatus, Published
from search_server import cli as search_server_cli
from search_server.config import SearchServerConfig
from tests.configs import data_config, exit_message, fleet_config, search_config
from tests.support import DataServerFactory, SearchServerFactory, eventually, get_json

ENV = ("DISCOVERY_ZONE", "DISCOVERY_WEIGHT", "DISCOVERY_FLEET_ZONES", "DISCOVERY_FLEET_SHARDS")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # Parsers read the environment when built; a developer's shell must not leak in.
    for name in ENV:
        monkeypatch.delenv(name, raising=False)


# -- data-server ------------------------------------------------------------------


def test_data_server_has_no_zone_and_weight_100_by_default() -> None:
    config = data_config()
    assert (config.zone, config.weight) == (None, 100)


def test_data_server_zone_and_weight_from_flags_and_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = data_config("--zone", "eu-west-1b", "--weight", "250")
    assert (config.zone, config.weight) == ("eu-west-1b", 250)
    monkeypatch.setenv("DISCOVERY_ZONE", "dc2")
    monkeypatch.setenv("DISCOVERY_WEIGHT", "1000")
    assert (data_config().zone, data_config().weight) == ("dc2", 1000)
    # A flag wins over its variable.
    config = data_config("--zone", "dc3", "--weight", "1")
    assert (config.zone, config.weight) == ("dc3", 1)


def test_surrounding_blanks_of_a_zone_are_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISCOVERY_ZONE", " eu-1 ")
    assert data_config().zone == "eu-1"
    assert search_config().zone == "eu-1"


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--zone", "eu west"], "--zone"),
        (["--zone", ""], "--zone"),
        (["--zone", "a/b"], "--zone"),
        (["--zone", "z" * 65], "--zone"),
        (["--weight", "0"], "--weight"),
        (["--weight", "1001"], "--weight"),
        (["--weight", "-3"], "--weight"),
        (["--weight", "heavy"], "--weight"),
        (["--weight", "1.5"], "--weight"),
    ],
)
def test_bad_data_server_flag_is_named(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    message = exit_message(data_server_cli.main, argv, capsys)
    assert f"argument {named}:" in message


@pytest.mark.parametrize(
    ("name", "value"),
    [("DISCOVERY_ZONE", "a b"), ("DISCOVERY_ZONE", "é"), ("DISCOVERY_WEIGHT", "0")],
)
def test_bad_data_server_variable_is_named(
    name: str, value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(name, value)
    assert f"{name}={value!r}" in exit_message(data_server_cli.main, [], capsys)


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"zone": "a b"}, "--zone / DISCOVERY_ZONE: must be 1..64 characters"),
        ({"zone": ""}, "--zone / DISCOVERY_ZONE"),
        ({"weight": 0}, "--weight / DISCOVERY_WEIGHT: must be between 1 and 1000"),
        ({"weight": True}, "--weight / DISCOVERY_WEIGHT: must be an integer"),
    ],
)
def test_programmatic_data_server_config_is_checked(changes: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigError, match=f"^{named}"):
        DataServerConfig(
            zk=ZkConfig(hosts="127.0.0.1:1"),
            cluster=ClusterConfig(),
            agent=AgentConfig(),
            **changes,  # type: ignore[arg-type]
        )


async def test_zone_and_weight_go_into_the_registered_payload() -> None:
    server = DataServer(
        DataServerConfig(
            zk=ZkConfig(hosts="127.0.0.1:1"),
            cluster=ClusterConfig(),
            agent=AgentConfig(),
            docs=5,
            zone="z1",
            weight=7,
        )
    )
    await server.load()
    server.port = 9001  # as if listening; _instance() is what the agent registers
    instance = server._instance()
    assert (instance.zone, instance.weight) == ("z1", 7)
    assert ServiceInstance.from_json(instance.to_json()).payload.zone == "z1"

    plain = DataServer(
        DataServerConfig(
            zk=ZkConfig(hosts="127.0.0.1:1"), cluster=ClusterConfig(), agent=AgentConfig(), docs=5
        )
    )
    await plain.load()
    plain.port = 9001
    payload = plain._instance().to_dict()["payload"]
    assert "zone" not in payload
    assert "weight" not in payload


def test_help_documents_the_zone_and_weight_settings(capsys: pytest.CaptureFixture[str]) -> None:
    for main, argv, pairs in [
        (
            data_server_cli.main,
            ["--help"],
            [("--zone", "DISCOVERY_ZONE"), ("--weight", "DISCOVERY_WEIGHT")],
        ),
        (
            data_server_cli.main,
            ["fleet", "--help"],
            [("--zones", "DISCOVERY_FLEET_ZONES"), ("--zone", "DISCOVERY_ZONE")],
        ),
        (search_server_cli.main, ["--help"], [("--zone", "DISCOVERY_ZONE")]),
    ]:
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == 0
        out = " ".join(capsys.readouterr().out.split())
        for flag, env in pairs:
            assert f"{flag} " in out
            assert f"env {env}" in out


# -- data-server fleet ----------------------------------------------------------------


def test_fleet_zones_are_dealt_round_robin() -> None:
    fleet = fleet_config("--count", "6", "--procs", "1", "--zones", "a,b,c")
    assert [fleet.slot(i).zone for i in range(6)] == ["a", "b", "c", "a", "b", "c"]


def test_fleet_zones_put_a_shards_replicas_in_different_zones() -> None:
    # 3 shards x 3 replicas over 3 zones: with plain round-robin by server number,
    # every replica of a shard would share one zone.
    fleet = fleet_config("--count", "9", "--procs", "1", "--shards", "3", "--zones", "a,b,c")
    by_shard: dict[int, set[str | None]] = {}
    for i in range(9):
        slot = fleet.slot(i)
        by_shard.setdefault(slot.shard, set()).add(slot.zone)
    assert by_shard == {0: {"a", "b", "c"}, 1: {"a", "b", "c"}, 2: {"a", "b", "c"}}
    # Every zone gets as many servers.
    zones = Counter(fleet.slot(i).zone for i in range(9))
    assert zones == {"a": 3, "b": 3, "c": 3}


def test_fleet_zones_count_from_the_first_index(monkeypatch: pytest.MonkeyPatch) -> None:
    # Two fleets (two hosts) of one cluster deal the zones as one fleet would; a
    # shard's two replicas are in different zones.
    monkeypatch.setenv("DISCOVERY_FLEET_ZONES", "a,b")
    monkeypatch.setenv("DISCOVERY_FLEET_SHARDS", "2")
    whole = fleet_config("--count", "4", "--procs", "1")
    first = fleet_config("--count", "2", "--procs", "1")
    second = fleet_config("--count", "2", "--procs", "1", "--first-index", "2")
    assert [whole.slot(i).zone for i in range(4)] == ["a", "b", "b", "a"]
    assert [whole.slot(i).zone for i in range(4)] == [
        *(first.slot(i).zone for i in range(2)),
        *(second.slot(i).zone for i in range(2)),
    ]


def test_fleet_zone_and_weight_apply_to_every_server() -> None:
    fleet = fleet_config("--count", "3", "--procs", "1", "--zone", "eu-1", "--weight", "50")
    assert {(fleet.slot(i).zone, fleet.slot(i).weight) for i in range(3)} == {("eu-1", 50)}
    plain = fleet_config("--count", "2", "--procs", "1")
    assert {(plain.slot(i).zone, plain.slot(i).weight) for i in range(2)} == {(None, 100)}


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--zones", "a,,b"], "argument --zones: not a zone name"),
        (["--zones", "a,b c"], "argument --zones: not a zone name"),
        (["--zones", "a,b,a"], "argument --zones: zone 'a' is listed twice"),
        (["--zones", "a,b", "--zone", "c"], "--zones (DISCOVERY_FLEET_ZONES) and --zone"),
        (["--start-spread", "-1"], "argument --start-spread: must be a finite number >= 0"),
        (["--start-spread", "inf"], "argument --start-spread: must be a finite number >= 0"),
    ],
)
def test_bad_fleet_zones_are_named(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    message = exit_message(data_server_cli.main, ["fleet", "--count", "3", *argv], capsys)
    assert expected in message


def test_fleet_start_spread(monkeypatch: pytest.MonkeyPatch) -> None:
    assert fleet_config("--count", "1", "--procs", "1").start_spread == 0
    monkeypatch.setenv("DISCOVERY_FLEET_START_SPREAD", "5")
    assert fleet_config("--count", "1", "--procs", "1").start_spread == 5


def test_fleet_zones_with_blanks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISCOVERY_FLEET_ZONES", "a, b ,c")
    assert fleet_config("--count", "1", "--procs", "1").zones == ("a", "b", "c")


# -- search-server ---------------------------------------------------------------------


def test_search_server_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    assert search_config().zone is None
    assert search_config("--zone", "us-east-1a").zone == "us-east-1a"
    monkeypatch.setenv("DISCOVERY_ZONE", "dc1")
    assert search_config().zone == "dc1"
    assert search_config("--zone", "dc2").zone == "dc2"


def test_bad_search_server_zone_is_named(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert "argument --zone: not a zone name" in exit_message(
        search_server_cli.main, ["--zone", "a b"], capsys
    )
    monkeypatch.setenv("DISCOVERY_ZONE", "x/y")
    assert "DISCOVERY_ZONE='x/y'" in exit_message(search_server_cli.main, [], capsys)
    with pytest.raises(ConfigError, match=r"^--zone / DISCOVERY_ZONE: must be 1\.\.64"):
        SearchServerConfig(zk=ZkConfig(hosts="127.0.0.1:1"), cluster=ClusterConfig(), zone="")


# -- end to end -------------------------------------------------------------------------


async def test_zone_and_weight_reach_the_search_servers_cluster_view(
    make_data_server: DataServerFactory,
    make_search_server: SearchServerFactory,
) -> None:
    await make_data_server(shard=0, instance_id="ds-zoned", zone="eu-1", weight=300)
    await make_data_server(shard=0, instance_id="ds-plain")
    search = await make_search_server(server_id="ss-0", zone="eu-1")
    assert search.config.zone == "eu-1"

    def servers() -> dict[str, dict[str, object]] | None:
        view = search.cluster_view()
        found = {s["id"]: s for s in view["servers"]}
        return found if set(found) == {"ds-zoned", "ds-plain"} else None

    found = await eventually(servers, message="both data servers listed")
    assert found is not None
    assert (found["ds-zoned"]["zone"], found["ds-zoned"]["weight"]) == ("eu-1", 300)
    assert (found["ds-plain"]["zone"], found["ds-plain"]["weight"]) == (None, 100)
    status, body = await get_json(f"{search.url}/cluster")
    assert status == 200
    assert {s["id"]: (s["zone"], s["weight"]) for s in body["servers"]} == {
        "ds-zoned": ("eu-1", 300),
        "ds-plain": (None, 100),
    }


def _instance(instance_id: str, **payload: object) -> ServiceInstance:
    return ServiceInstance(
        name="data_servers",
        id=instance_id,
        address="10.0.0.1",
        port=9001,
        ssl_port=None,
        payload=InstancePayload(
            shard=0,
            replica=0,
            docs=1,
            version="1",
            state=InstanceState.SERVING,
            **payload,  # type: ignore[arg-type]
        ),
        registration_time_utc=0,
    )


def test_status_shows_zone_and_a_weight_other_than_100() -> None:
    servers = {
        "ds-a": _instance("ds-a", zone="eu-1", weight=300),
        "ds-b": _instance("ds-b", zone="eu-2"),
        "ds-c": _instance("ds-c"),
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
    listed = {
        s["id"]: (s["zone"], s["weight"])
        for shard in status.to_dict()["data_servers"]["shards"]
        for s in shard["servers"]
    }
    assert listed == {"ds-a": ("eu-1", 300), "ds-b": ("eu-2", 100), "ds-c": (None, 100)}
    lines = {line.split()[0]: line for line in format_text(status).splitlines() if "ds-" in line}
    assert "  r0  zone eu-1  weight 300  serving" in lines["ds-a"]
    assert "  r0  zone eu-2  serving" in lines["ds-b"]
    # Without a zone or weight, the line is as it always was.
    assert lines["ds-c"] == "    ds-c  10.0.0.1:9001          r0  serving"
