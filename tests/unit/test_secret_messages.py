"""No password in an error message, a log line or a repr: bad Redis URL forms (a
password a URL parser cuts in two, no scheme, unparsable), a password in the query,
and kazoo's DEBUG log of the packets it sends. Nothing here connects anywhere."""

from __future__ import annotations

import logging

import pytest
from kazoo.protocol.serialization import Auth, Connect

from discovery.config import ClusterConfig, RedisConfig, ZkConfig, redact_url
from discovery.errors import ConfigError
from discovery.livelist.open import open_store
from discovery.safetext import redact_url as redact_url_itself
from discovery.tools.main import main as discovery_main
from discovery.zk.clients import client_factory
from discovery.zk.identity import AclIdentity
from discovery.zk.kazoolog import KAZOO_LOGGER
from search_server.config import SearchServerConfig, build_parser

# Two halves: a parser that stops at the character between them quotes the first.
LEFT = "left-half-91"
RIGHT = "right-half-28"
PASSWORD = "whole-pw-55"


def _secrets_in(text: str) -> list[str]:
    return [s for s in (LEFT, RIGHT, PASSWORD) if s in text]


# URLs refused at start-up: the message must name the flag and show no secret.
REFUSED = {
    "slash in the password": f"redis://:{LEFT}/{RIGHT}@127.0.0.1:6379/0",
    "question mark": f"redis://u:{LEFT}?{RIGHT}@127.0.0.1:6379/0",
    "hash": f"rediss://:{LEFT}#{RIGHT}@127.0.0.1:6379/0",
    "sentinel, slash": f"redis+sentinel://:{LEFT}/{RIGHT}@127.0.0.1:26379/mymaster",
    "cluster, slash": f"redis+cluster://:{LEFT}/{RIGHT}@127.0.0.1:7000",
    "unix, slash": f"unix://:{LEFT}/{RIGHT}@/run/redis.sock",
    "no scheme": f":{PASSWORD}@127.0.0.1:6379",
    "unknown scheme": f"ftp://:{PASSWORD}@127.0.0.1:6379",
    "unparsable host": f"redis://:{PASSWORD}@[::1:6379/0",
}

# URLs taken: the credentials work, and are masked wherever the URL is shown.
TAKEN = {
    "plain": (f"redis://reader:{PASSWORD}@127.0.0.1:6379/0", "redis://reader:***@127.0.0.1:6379/0"),
    "at sign in the password": (
        f"redis://reader:{LEFT}@{RIGHT}@127.0.0.1:6379/0",
        "redis://reader:***@127.0.0.1:6379/0",
    ),
    "password in the query": (
        f"redis://127.0.0.1:6379/0?db=0&password={PASSWORD}",
        "redis://127.0.0.1:6379/0?db=0&password=***",
    ),
    "sentinel": (
        f"redis+sentinel://:{PASSWORD}@127.0.0.1:26379,127.0.0.2:26379/mymaster",
        "redis+sentinel://:***@127.0.0.1:26379,127.0.0.2:26379/mymaster",
    ),
}


def test_config_redact_url_is_the_one_masking_function() -> None:
    assert redact_url is redact_url_itself


@pytest.mark.parametrize("url", list(REFUSED.values()), ids=list(REFUSED))
def test_a_refused_url_is_named_masked(url: str) -> None:
    with pytest.raises(ConfigError) as refused:
        ClusterConfig(redis_url=url)
    message = str(refused.value)
    assert "--redis / DISCOVERY_REDIS_URL" in message
    assert not _secrets_in(message), message
    assert not _secrets_in(redact_url(url))
    # A server's settings refuse it the same way.
    with pytest.raises(ConfigError) as server:
        SearchServerConfig.from_args(build_parser().parse_args(["--redis", url]))
    assert not _secrets_in(str(server.value))


def test_a_password_cut_by_the_parser_is_refused_with_how_to_write_it() -> None:
    with pytest.raises(ConfigError, match="percent-encoded") as refused:
        ClusterConfig(redis_url=REFUSED["slash in the password"])
    assert "redis://:***@127.0.0.1:6379/0" in str(refused.value)


@pytest.mark.parametrize(("url", "shown"), list(TAKEN.values()), ids=list(TAKEN))
def test_a_taken_url_shows_masked(url: str, shown: str) -> None:
    cluster = ClusterConfig(redis_url=url)
    assert redact_url(url) == shown
    assert shown in repr(cluster)
    assert not _secrets_in(repr(cluster))


def test_store_errors_about_the_url_are_masked() -> None:
    # Refused after the settings took the URL: by the store that opens it.
    for url in (
        f"memory://:{PASSWORD}@name/more",
        f"redis+sentinel://:{PASSWORD}@127.0.0.1:26379,127.0.0.2:x/mymaster",
    ):
        with pytest.raises(ConfigError) as refused:
            open_store(ClusterConfig(redis_url=url))
        assert not _secrets_in(str(refused.value)), refused.value


def test_credentials_in_the_url_and_in_flags_are_refused_unechoed() -> None:
    with pytest.raises(ConfigError, match="in one place") as refused:
        ClusterConfig(
            redis_url=f"redis://:{LEFT}@127.0.0.1:6379/0", redis=RedisConfig(password=RIGHT)
        )
    assert not _secrets_in(str(refused.value))


@pytest.mark.parametrize("url", list(REFUSED.values()), ids=list(REFUSED))
def test_discovery_status_names_a_refused_url_masked_on_stderr(
    url: str, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    argv = ["status", "--zk", "127.0.0.1:1", "--zk-connect-timeout", "1", "--redis", url]
    assert discovery_main(argv) == 2
    captured = capsys.readouterr()
    assert "--redis / DISCOVERY_REDIS_URL" in captured.err
    for text in (captured.out, captured.err, caplog.text):
        assert not _secrets_in(text), text


# -- kazoo's debug log ----------------------------------------------------------------------


def test_kazoos_debug_log_of_auth_and_connect_packets_is_masked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # What kazoo logs when it connects and authenticates, once a client of ours exists.
    identity = AclIdentity.from_auth(f"zkuser:{PASSWORD}")
    client = client_factory(ZkConfig(hosts="127.0.0.1:1", auth=f"zkuser:{PASSWORD}"), identity)()
    try:
        kazoo = logging.getLogger(KAZOO_LOGGER)
        session_password = b"session-pw-bytes"
        session_hex = session_password.hex()
        # Level 1: kazoo's BLATHER (5) lines as well.
        with caplog.at_level(1, logger=KAZOO_LOGGER):
            for scheme, auth in identity.auth_data:
                kazoo.debug("Sending request(xid=%s): %s", -4, Auth(0, scheme, auth))
            kazoo.debug(
                "Sending request(xid=%s): %s",
                None,
                Connect(0, 5, 10000, 77, session_password, None),
            )
            kazoo.log(
                5, "Session created, session_id: %r session_passwd: %s\n ...", 77, session_hex
            )
            kazoo.debug("Received response(xid=%s): %r", 3, "untouched")
        assert len(caplog.records) == 5  # two Auth packets: ours and the owner identity
        text = caplog.text
        owner_password = identity.auth_data[1][1].partition(":")[2]
        for secret in (PASSWORD, owner_password, repr(session_password), session_hex):
            assert secret not in text, text
        assert "auth='zkuser:***'" in text
        assert "passwd='***'" in text
        assert "session_id: 77 session_passwd: ***" in text
        assert "untouched" in text
    finally:
        client.close()  # never started: nothing to stop
