"""What a search server admits of the registrations it reads: loopback data servers in
its fan-out (by where it listens, ``--host``) and persistent member nodes
(``--allow-persistent-members``), from its flags to the routing table."""

from __future__ import annotations

import logging

import pytest

from discovery.instance import ServiceInstance
from search_server.config import SearchServerConfig
from search_server.config import build_parser as build_search_parser
from search_server.fanout import FanOut
from search_server.fanoutconfig import FanOutConfig
from tests.support import make_instance

ENV = ("DISCOVERY_HOST", "DISCOVERY_ALLOWED_NETWORKS", "DISCOVERY_ALLOW_PERSISTENT_MEMBERS")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)


def search_config(*argv: str) -> SearchServerConfig:
    return SearchServerConfig.from_args(build_search_parser().parse_args(list(argv)))


def servers() -> dict[str, ServiceInstance]:
    """A data server on this machine's loopback (as a hostile or careless registration
    would name it, three ways) and one on the network."""
    instances = [
        make_instance("ds-v4", 9001, address="127.0.0.1", shard=0),
        make_instance("ds-v6", 9002, address="::1", shard=1),
        make_instance("ds-name", 9003, address="localhost", shard=2),
        make_instance("ds-net", 9004, address="10.0.1.7", shard=3),
    ]
    return {i.id: i for i in instances}


def routed(
    config: SearchServerConfig, listed: dict[str, ServiceInstance]
) -> tuple[FanOut, set[str]]:
    """A fan-out made with ``config``'s networks, and the ids its table routes to."""
    fanout = FanOut(config=FanOutConfig(networks=config.data_networks))
    table = fanout.routing.table_for(listed)
    return fanout, {r.instance.id for _, group in table for r in group}


def unroutable(fanout: FanOut) -> float:
    value = fanout.registry.get_sample_value(
        "search_server_fanout_unroutable_total", {"why": "not_allowed"}
    )
    return value or 0.0


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.1.5"])
def test_listening_beyond_loopback_the_fan_out_refuses_loopback_data_servers(
    host: str, caplog: pytest.LogCaptureFixture
) -> None:
    config = search_config("--host", host)
    listed = servers()
    with caplog.at_level(logging.WARNING, logger="search_server.shardrouting"):
        fanout, ids = routed(config, listed)
        assert ids == {"ds-net"}
        assert unroutable(fanout) == 3
        # The same servers in the next list: counted again, logged once each.
        fanout.routing.table_for(dict(listed))
    assert unroutable(fanout) == 6
    lines = [
        r.getMessage() for r in caplog.records if "not routing to data server" in r.getMessage()
    ]
    assert len(lines) == 3
    assert all("loopback" in line for line in lines)


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost"])
def test_listening_on_loopback_the_fan_out_admits_loopback_data_servers(host: str) -> None:
    # A development cluster on one machine, and every test of this project.
    fanout, ids = routed(search_config("--host", host), servers())
    assert ids == set(servers())
    assert unroutable(fanout) == 0


def test_a_loopback_network_in_allowed_networks_admits_loopback_whatever_the_host() -> None:
    config = search_config("--host", "0.0.0.0", "--allowed-networks", "127.0.0.0/8,10.0.0.0/8")
    fanout, ids = routed(config, servers())
    # ds-name is a name: judged by what it resolves to, when a connection is made.
    assert ids == {"ds-v4", "ds-name", "ds-net"}
    assert unroutable(fanout) == 1  # ::1 is outside the networks listed


def test_the_leader_does_not_judge_loopback_by_its_own_host() -> None:
    # It publishes for every search server; each judges loopback for itself.
    config = search_config("--host", "0.0.0.0")
    assert not config.allowed_networks.narrows
    assert config.data_networks.narrows


def test_persistent_members_are_refused_unless_the_flag_or_its_variable_allows_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert search_config().allow_persistent_members is False
    assert search_config("--allow-persistent-members").allow_persistent_members is True
    monkeypatch.setenv("DISCOVERY_ALLOW_PERSISTENT_MEMBERS", "yes")
    assert search_config().allow_persistent_members is True
    assert search_config("--no-allow-persistent-members").allow_persistent_members is False


def test_a_bad_variable_is_a_usage_error_naming_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DISCOVERY_ALLOW_PERSISTENT_MEMBERS", "maybe")
    with pytest.raises(SystemExit):
        build_search_parser()
    assert "DISCOVERY_ALLOW_PERSISTENT_MEMBERS='maybe'" in capsys.readouterr().err
