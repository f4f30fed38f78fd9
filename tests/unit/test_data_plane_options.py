"""The data plane's settings: the replica picker, the hedge budget and the event loop.

Flags and environment variables of ``search-server`` (``--picker``, ``--wrr-*``,
``--hedge-percent``)
and of both servers (``--event-loop``), their errors naming the setting, and
:func:`~discovery.cli.entrypoint.run_event_loop` running on the loop it names.
"""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from data_server import cli as data_server_cli
from data_server.config import build_parser as build_data_parser
from discovery.cli.entrypoint import run_event_loop
from discovery.config import ClusterConfig, ZkConfig
from discovery.errors import ConfigError
from search_server import cli as search_server_cli
from search_server.config import SearchServerConfig
from search_server.config import build_parser as build_search_parser
from search_server.picking import AdaptiveReplicaSelection, PowerOfTwoChoices, make_picker
from search_server.wrr import WeightedRoundRobin, WrrConfig
from tests.support import FakeClock

ENV = (
    "DISCOVERY_PICKER",
    "DISCOVERY_HEDGE_PERCENT",
    "DISCOVERY_EVENT_LOOP",
    "DISCOVERY_WRR_BLACKOUT",
    "DISCOVERY_WRR_EXPIRY",
    "DISCOVERY_WRR_ERROR_PENALTY",
)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)


def search_config(*argv: str) -> SearchServerConfig:
    return SearchServerConfig.from_args(build_search_parser().parse_args(list(argv)))


def usage_error(main: object, argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        main(argv)  # type: ignore[operator]
    assert exited.value.code == 2
    return " ".join(capsys.readouterr().err.split())


def test_defaults_are_adaptive_selection_five_percent_hedges_and_uvloop() -> None:
    config = search_config()
    assert (config.picker, config.hedge_percent) == ("ars", 5.0)
    assert config.wrr == WrrConfig(blackout=10.0, expiry=180.0, error_penalty=1.0)
    assert build_search_parser().parse_args([]).event_loop == "uvloop"
    assert build_data_parser().parse_args([]).event_loop == "uvloop"


def test_flags_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    config = search_config("--picker", "P2C", "--hedge-percent", "0")
    assert (config.picker, config.hedge_percent) == ("p2c", 0.0)
    monkeypatch.setenv("DISCOVERY_PICKER", "p2c")
    monkeypatch.setenv("DISCOVERY_HEDGE_PERCENT", "2.5")
    monkeypatch.setenv("DISCOVERY_EVENT_LOOP", "asyncio")
    config = search_config()
    assert (config.picker, config.hedge_percent) == ("p2c", 2.5)
    assert build_search_parser().parse_args([]).event_loop == "asyncio"
    assert search_config("--picker", "ars").picker == "ars"  # the flag wins


def test_weighted_round_robin_and_its_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    config = search_config(
        "--picker", "wrr", "--wrr-blackout", "0", "--wrr-expiry", "60", "--wrr-error-penalty", "2.5"
    )
    assert config.picker == "wrr"
    assert config.wrr == WrrConfig(blackout=0.0, expiry=60.0, error_penalty=2.5)
    monkeypatch.setenv("DISCOVERY_WRR_BLACKOUT", "30")
    monkeypatch.setenv("DISCOVERY_WRR_EXPIRY", "600")
    monkeypatch.setenv("DISCOVERY_WRR_ERROR_PENALTY", "0")
    assert search_config().wrr == WrrConfig(blackout=30.0, expiry=600.0, error_penalty=0.0)


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--picker", "random"], "--picker"),
        (["--hedge-percent", "101"], "--hedge-percent"),
        (["--hedge-percent", "lots"], "--hedge-percent"),
        (["--event-loop", "trio"], "--event-loop"),
        (["--admission-query-share", "0"], "--admission-query-share"),
        (["--admission-query-share", "101"], "--admission-query-share"),
        (["--wrr-blackout", "-1"], "--wrr-blackout"),
        (["--wrr-blackout", "soon"], "--wrr-blackout"),
        (["--wrr-blackout", "inf"], "--wrr-blackout"),
        (["--wrr-expiry", "0"], "--wrr-expiry"),
        (["--wrr-expiry", "nan"], "--wrr-expiry"),
        (["--wrr-error-penalty", "-0.5"], "--wrr-error-penalty"),
    ],
)
def test_bad_values_are_named(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert named in usage_error(search_server_cli.main, argv, capsys)


def test_bad_event_loop_of_a_data_server_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    assert "--event-loop" in usage_error(data_server_cli.main, ["--event-loop", "gevent"], capsys)


def test_programmatic_config_is_checked() -> None:
    base = {"zk": ZkConfig(hosts="127.0.0.1:2181"), "cluster": ClusterConfig()}
    with pytest.raises(ConfigError, match="--picker"):
        SearchServerConfig(**base, picker="round-robin")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="--hedge-percent"):
        SearchServerConfig(**base, hedge_percent=-1)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="--admission-query-share"):
        SearchServerConfig(**base, admission_query_share_percent=0)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="--wrr-blackout"):
        WrrConfig(blackout=-1.0)
    with pytest.raises(ConfigError, match="--wrr-expiry"):
        WrrConfig(expiry=0.0)
    with pytest.raises(ConfigError, match="--wrr-error-penalty"):
        WrrConfig(error_penalty=float("nan"))
    with pytest.raises(ConfigError, match="update period"):
        WrrConfig(update_period=-1.0)


def test_the_query_share_is_half_the_limit_unless_told() -> None:
    assert search_config().query_share().share == 0.5
    assert search_config("--admission-query-share", "100").query_share().share == 1.0


def test_make_picker() -> None:
    assert isinstance(make_picker("ars"), AdaptiveReplicaSelection)
    assert isinstance(make_picker("p2c"), PowerOfTwoChoices)
    clock = FakeClock()
    settings = WrrConfig(blackout=5.0)
    wrr = make_picker("wrr", clock=clock, wrr=settings)
    assert isinstance(wrr, WeightedRoundRobin)
    assert wrr.config is settings
    assert wrr._clock is clock  # the fan-out's, which times the reports
    assert isinstance(make_picker("wrr"), WeightedRoundRobin)  # default settings and clock
    with pytest.raises(ValueError, match="unknown picker"):
        make_picker("least-loaded")


@pytest.mark.parametrize(("name", "loop_type"), [("uvloop", uvloop.Loop), ("asyncio", None)])
def test_run_event_loop_runs_on_the_loop_it_names(name: str, loop_type: type | None) -> None:
    async def which() -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    loop = run_event_loop(which(), name)
    if loop_type is not None:
        assert isinstance(loop, loop_type)
    else:
        assert not isinstance(loop, uvloop.Loop)
    assert loop.is_closed()


def test_run_event_loop_refuses_an_unknown_loop() -> None:
    async def nothing() -> None:
        return None

    coroutine = nothing()
    with pytest.raises(ValueError, match="unknown event loop"):
        run_event_loop(coroutine, "trio")
    coroutine.close()
