"""Settings built the way the entry points build them, for tests of flags and errors.

Each builder parses ``argv`` with the entry point's own parser (environment variables
included: clear them in a fixture) into its frozen config.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from data_server.config import DataServerConfig, FleetConfig, build_fleet_parser, build_parser
from search_server.config import SearchServerConfig
from search_server.config import build_parser as build_search_parser


def data_config(*argv: str) -> DataServerConfig:
    return DataServerConfig.from_args(build_parser().parse_args(list(argv)))


def fleet_config(*argv: str) -> FleetConfig:
    return FleetConfig.from_args(build_fleet_parser().parse_args(list(argv)))


def search_config(*argv: str) -> SearchServerConfig:
    return SearchServerConfig.from_args(build_search_parser().parse_args(list(argv)))


def exit_message(
    main: Callable[[list[str]], object], argv: list[str], capsys: pytest.CaptureFixture[str]
) -> str:
    """The usage error an entry point exits with (status 2), as one line."""
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    return " ".join(capsys.readouterr().err.split())
