"""No password reaches an error message, the command line's stderr or a log line, with
real ZooKeeper and Redis: an unreachable Redis named with its password, a Redis that
refuses a wrong password, and ZooKeeper digest credentials at DEBUG (``-vv``)."""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from discovery.config import ClusterConfig, ZkConfig
from discovery.errors import StatusError
from discovery.testing import RedisServer, free_port
from discovery.tools.status import fetch_status
from tests.integration.test_status import run_cli

URL_PASSWORD = "url-pw-a1b2c3"
ZK_PASSWORD = "zk-pw-d4e5f6"
ADMIN_PASSWORD = "admin-pw-g7h8i9"
WRONG_PASSWORD = "wrong-pw-j0k1l2"
SECRETS = (URL_PASSWORD, ZK_PASSWORD, ADMIN_PASSWORD, WRONG_PASSWORD)


def _leaked(*texts: str) -> list[str]:
    return [secret for secret in SECRETS for text in texts if secret in text]


@pytest.fixture
def locked_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis of this test's own whose ``default`` user needs ADMIN_PASSWORD."""
    server = RedisServer(tmp_path / "locked-redis", password=ADMIN_PASSWORD)
    server.start()
    yield server
    server.stop()


@pytest.mark.parametrize(
    "url",
    [
        "redis://reader:{pw}@127.0.0.1:{port}/0",
        "redis://127.0.0.1:{port}/0?password={pw}",
        "redis+sentinel://:{pw}@127.0.0.1:{port}/mymaster",
    ],
    ids=["userinfo", "query", "sentinel"],
)
async def test_an_unreachable_redis_is_named_without_its_password_even_at_debug(
    zk_hosts: str, url: str
) -> None:
    redis_url = url.format(pw=URL_PASSWORD, port=free_port())
    code, out, err = await run_cli(
        *("--zk", zk_hosts, "--zk-auth", f"zkuser:{ZK_PASSWORD}"),
        *("--redis", redis_url, "-vv"),
        log_level=None,
    )
    assert code == 3, err
    assert "cannot reach Redis at " in err
    assert ":***" in err or "password=***" in err
    # -vv: kazoo's packets are logged, its Auth packet with the user only.
    assert "auth='zkuser:***'" in err
    assert not _leaked(out, err), err


async def test_a_wrong_password_is_refused_without_showing_it(
    zk_hosts: str, locked_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    wrong = locked_redis.client_url(password=WRONG_PASSWORD)
    right = locked_redis.client_url(password=ADMIN_PASSWORD)
    # In-process: the exception and every log line, at DEBUG.
    caplog.set_level(logging.DEBUG)
    with pytest.raises(StatusError) as refused:
        await fetch_status(
            ZkConfig(hosts=zk_hosts, connect_timeout=20), ClusterConfig(redis_url=wrong)
        )
    assert refused.value.refused
    assert "cannot reach Redis at redis://:***@" in str(refused.value)
    assert not _leaked(str(refused.value), repr(refused.value), caplog.text)

    # The command line: refused (exit 4), and nothing on stdout or stderr shows either
    # password, at -vv as well; the right password works and shows nowhere either.
    code, out, err = await run_cli("--zk", zk_hosts, "--redis", wrong, "-vv", log_level=None)
    assert code == 4, err
    assert not _leaked(out, err), err
    code, out, err = await run_cli("--zk", zk_hosts, "--redis", right, "-vv", log_level=None)
    assert code in (0, 1), err  # an empty cluster: degraded, but read
    assert urllib.parse.quote(ADMIN_PASSWORD) not in out + err
    assert not _leaked(out, err), err
