"""Secrets in settings: never in a repr (and so never in a logged config), and readable
from files (``--zk-auth-file``, ``--admin-token-file``) as ``--redis-password-file`` is."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from data_server.config import DataServerConfig, FleetConfig
from data_server.config import build_parser as data_server_parser
from discovery.config import AgentConfig, ClusterConfig, RedisConfig, ZkConfig
from discovery.errors import ConfigError
from search_server.config import SearchServerConfig
from search_server.config import build_parser as search_server_parser

ZK_PASSWORD = "zk-pw-a1b2c3"
TOKEN = "admin-tok-d4e5f6"
REDIS_PASSWORD = "redis-pw-g7h8i9"
URL_PASSWORD = "url-pw-j0k1l2"
PUBLISH_PASSWORD = "publish-pw-m3n4o5"
SECRETS = (ZK_PASSWORD, TOKEN, REDIS_PASSWORD, URL_PASSWORD, PUBLISH_PASSWORD)


def _zk() -> ZkConfig:
    return ZkConfig(hosts="127.0.0.1:2181/chroot", auth=f"zkuser:{ZK_PASSWORD}")


def _cluster(*, url_password: bool = False) -> ClusterConfig:
    if url_password:
        return ClusterConfig(
            redis_url=f"redis://reader:{URL_PASSWORD}@127.0.0.1:6379/0",
            admin_token=TOKEN,
            redis=RedisConfig(publish_username="pub", publish_password=PUBLISH_PASSWORD),
        )
    return ClusterConfig(
        admin_token=TOKEN,
        redis=RedisConfig(
            username="reader",
            password=REDIS_PASSWORD,
            publish_username="pub",
            publish_password=PUBLISH_PASSWORD,
        ),
    )


def _data_server(url_password: bool = False) -> DataServerConfig:
    return DataServerConfig(
        zk=_zk(), cluster=_cluster(url_password=url_password), agent=AgentConfig()
    )


CONFIGS: list[tuple[str, Callable[[], object]]] = [
    ("ZkConfig", _zk),
    ("ClusterConfig", _cluster),
    ("ClusterConfig-url", lambda: _cluster(url_password=True)),
    ("DataServerConfig", _data_server),
    ("DataServerConfig-url", lambda: _data_server(url_password=True)),
    ("SearchServerConfig", lambda: SearchServerConfig(zk=_zk(), cluster=_cluster())),
    (
        "FleetConfig",
        lambda: FleetConfig(template=_data_server(), count=4, procs=2, base_port=0, shards=2),
    ),
]


@pytest.mark.parametrize("make", [make for _, make in CONFIGS], ids=[n for n, _ in CONFIGS])
def test_no_config_shows_a_secret_in_its_repr_or_a_log_line(
    make: Callable[[], object], caplog: pytest.LogCaptureFixture
) -> None:
    config = make()
    log = logging.getLogger("tests.secrets")
    with caplog.at_level(logging.INFO, logger="tests.secrets"):
        log.info("starting with %s", config)
        log.info("starting with %r", config)
    for shown in (repr(config), str(config), f"{config}", caplog.text):
        for secret in SECRETS:
            assert secret not in shown, shown
    # What is not secret stays visible: which ZooKeeper identity, which hosts.
    if not isinstance(config, ClusterConfig):
        assert "zkuser:***" in repr(config)
        assert "127.0.0.1:2181/chroot" in repr(config)


# -- secret files -----------------------------------------------------------------------

Parser = Callable[[], argparse.ArgumentParser]
PARSERS: list[tuple[str, Parser, Callable[[argparse.Namespace], Any]]] = [
    ("data-server", data_server_parser, DataServerConfig.from_args),
    ("search-server", search_server_parser, SearchServerConfig.from_args),
]


@pytest.fixture(params=PARSERS, ids=[name for name, _, _ in PARSERS])
def settings(request: pytest.FixtureRequest) -> Callable[[list[str]], Any]:
    """A server's settings from a command line (and the environment)."""
    _, parser, from_args = request.param

    def parse(argv: list[str]) -> Any:
        return from_args(parser().parse_args(argv))

    return parse


def test_secrets_are_read_from_files_once_without_the_trailing_newline(
    settings: Callable[[list[str]], Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    auth = tmp_path / "zk.auth"
    auth.write_text(f"zkuser:{ZK_PASSWORD}\n")
    token = tmp_path / "admin.token"
    token.write_text(f"{TOKEN}\r\n")
    config = settings(["--zk-auth-file", str(auth), "--admin-token-file", str(token)])
    assert config.zk.auth == f"zkuser:{ZK_PASSWORD}"
    assert config.cluster.admin_token == TOKEN
    # Read once, at start-up: a later change of the files changes nothing.
    auth.write_text("other:pw\n")
    assert config.zk.auth == f"zkuser:{ZK_PASSWORD}"
    # The environment's variables work the same way.
    auth.write_text(f"envuser:{ZK_PASSWORD}")
    monkeypatch.setenv("DISCOVERY_ZK_AUTH_FILE", str(auth))
    monkeypatch.setenv("DISCOVERY_ADMIN_TOKEN_FILE", str(token))
    config = settings([])
    assert config.zk.auth == f"envuser:{ZK_PASSWORD}"
    assert config.cluster.admin_token == TOKEN
    for secret in SECRETS:
        assert secret not in repr(config)


@pytest.mark.parametrize("flag", ["--zk-auth", "--admin-token"])
def test_bad_secret_files_are_errors_naming_the_flag(
    settings: Callable[[list[str]], Any],
    flag: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    good = tmp_path / "good"
    good.write_text("user:pw\n")
    empty = tmp_path / "empty"
    empty.write_text("\n")
    binary = tmp_path / "binary"
    binary.write_bytes(b"user:\xff\xfe\n")
    for argv, needle in (
        ([flag, "user:pw", f"{flag}-file", str(good)], "give only one"),
        ([f"{flag}-file", str(empty)], "is empty"),
        ([f"{flag}-file", str(binary)], "cannot read"),
        ([f"{flag}-file", str(tmp_path / "missing")], "no such file"),
        ([f"{flag}-file", str(tmp_path)], "no such file"),  # a directory
    ):
        with pytest.raises((SystemExit, ConfigError)) as failed:
            settings(argv)
        message = str(failed.value) + capsys.readouterr().err
        assert needle in message, (argv, message)
        assert f"{flag}-file" in message, (argv, message)


def test_an_admin_token_that_cannot_travel_in_a_header_is_refused_unechoed(
    settings: Callable[[list[str]], Any], tmp_path: Path
) -> None:
    for token in ("two words", "tab\tinside", "nön-ascii", "\x00"):
        path = tmp_path / "token"
        path.write_text(token + "\n")
        with pytest.raises(ConfigError) as failed:
            settings(["--admin-token-file", str(path)])
        assert "--admin-token" in str(failed.value)
        assert token not in str(failed.value)


@pytest.mark.parametrize(
    ("parser", "flags"),
    [
        (
            data_server_parser,
            [
                "--zk-auth-file",
                "--admin-token-file",
                "--header-timeout",
                "--max-connections",
                "--pressure-keepalive",
            ],
        ),
        (
            search_server_parser,
            [
                "--zk-auth-file",
                "--admin-token-file",
                "--header-timeout",
                "--max-pending-headers",
                "--max-connections",
                "--pressure-keepalive",
                "--max-event-streams",
            ],
        ),
    ],
    ids=["data-server", "search-server"],
)
def test_help_documents_the_new_flags_and_their_variables(parser: Parser, flags: list[str]) -> None:
    text = " ".join(parser().format_help().split())
    for flag in flags:
        variable = "DISCOVERY_" + flag.removeprefix("--").replace("-", "_").upper()
        assert flag in text
        assert f"env {variable}" in text
