"""Redis authentication, ACL users and TLS, against real redis-server processes.

Each integration test starts a Redis of its own (password for the ``default`` user, the
reader and publisher ACL users of :mod:`discovery.livelist.redis.conn` for this test's prefix, or
TLS with a throwaway CA) and real search servers in this test's ZooKeeper chroot.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
import redis.exceptions as redis_errors
from redis.asyncio.sentinel import MasterNotFoundError

from discovery.config import ClusterConfig, RedisConfig, ZkConfig
from discovery.errors import ConfigError, RedisAuthError, RedisPermissionError, StatusError
from discovery.livelist.redis.conn import (
    RedisRole,
    acl_user_line,
    credentials_for,
    make_redis,
    publisher_acl_rules,
    reader_acl_rules,
)
from discovery.livelist.redis.layout import RedisKeys
from discovery.livelist.redis.publisher import LivePublisher
from discovery.testing import RedisSentinel, RedisServer
from discovery.tools.main import main as discovery_main
from discovery.tools.status import fetch_status
from search_server.config import SearchServerConfig, build_parser
from search_server.server import SearchServer
from tests.support import (
    DataServerFactory,
    SearchServerFactory,
    cluster_of,
    eventually,
    live_ids,
    sample,
)

ADMIN_PW = "admin-secret"
READER_PW = "reader secret/with:odd@chars"
PUBLISHER_PW = "publisher-secret"

READER = RedisConfig(username="reader", password=READER_PW)
PUBLISHER = RedisConfig(
    username="reader",
    password=READER_PW,
    publish_username="publisher",
    publish_password=PUBLISHER_PW,
)


@pytest.fixture
def acl_redis(tmp_path: Path, redis_prefix: str) -> Iterator[RedisServer]:
    """A Redis of this test's own: ``default`` needs ADMIN_PW; reader and publisher users."""
    server = RedisServer(
        tmp_path / "acl-redis",
        password=ADMIN_PW,
        users=[
            acl_user_line("reader", READER_PW, reader_acl_rules(redis_prefix)),
            acl_user_line("publisher", PUBLISHER_PW, publisher_acl_rules(redis_prefix)),
        ],
    )
    server.start()
    yield server
    server.stop()


@pytest.fixture
async def admin(acl_redis: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(acl_redis.client_url(password=ADMIN_PW))
    yield client
    await client.aclose()


async def _get(url: str) -> int:
    async with aiohttp.ClientSession() as client, client.get(url) as response:
        return response.status


def _load_errors(server: SearchServer) -> float:
    return sample(server.registry, "discovery_livelist_redis_errors_total", operation="load")


# -- settings -------------------------------------------------------------------------


def _parse(argv: list[str]) -> SearchServerConfig:
    return SearchServerConfig.from_args(build_parser().parse_args(argv))


def test_flags_environment_and_password_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = tmp_path / "publish.pw"
    secret.write_text("from-a-file\n")
    ca = tmp_path / "ca.pem"
    ca.write_text("not checked here")
    monkeypatch.setenv("DISCOVERY_REDIS_PASSWORD", "from-the-env")
    monkeypatch.setenv("DISCOVERY_LEADER_ELIGIBLE", "false")
    config = _parse(
        [
            *("--redis", "rediss://redis.example:6380/2"),
            *("--redis-username", "reader"),
            *("--redis-publish-username", "publisher"),
            *("--redis-publish-password-file", str(secret)),
            *("--redis-tls-ca", str(ca)),
            "--no-redis-tls-verify-hostname",
        ]
    )
    redis = config.cluster.redis
    assert (redis.username, redis.password) == ("reader", "from-the-env")
    assert (redis.publish_username, redis.publish_password) == ("publisher", "from-a-file")
    assert redis.tls_ca == str(ca)
    assert not redis.tls_verify_hostname
    assert redis.uses_tls(config.cluster.redis_url)
    assert not config.leader_eligible
    assert _parse(["--leader-eligible"]).leader_eligible  # the flag wins over the variable
    assert credentials_for(config.cluster, RedisRole.READ) == ("reader", "from-the-env")
    assert credentials_for(config.cluster, RedisRole.PUBLISH) == ("publisher", "from-a-file")
    # Secrets appear neither in the repr nor in --help.
    assert "from-the-env" not in repr(config)
    assert "from-a-file" not in repr(config)
    assert "from-the-env" not in build_parser().format_help()


def test_url_credentials_serve_both_roles_unless_publishing_ones_are_given() -> None:
    cluster = ClusterConfig(redis_url="redis://reader:p%40ss@127.0.0.1:6379/0")
    assert credentials_for(cluster, RedisRole.READ) == ("reader", "p@ss")
    assert credentials_for(cluster, RedisRole.PUBLISH) == ("reader", "p@ss")
    assert "p%40ss" not in repr(cluster)
    assert "p@ss" not in repr(cluster)
    split = ClusterConfig(
        redis_url="redis://reader:p%40ss@127.0.0.1:6379/0",
        redis=RedisConfig(publish_username="publisher", publish_password="q"),
    )
    assert credentials_for(split, RedisRole.PUBLISH) == ("publisher", "q")


@pytest.mark.parametrize(
    ("url", "redis", "needle"),
    [
        ("redis://u:p@h:1/0", RedisConfig(password="x"), "in one place"),
        ("redis://h:1/0", RedisConfig(tls_ca="/etc/hostname"), "need TLS"),
        ("unix:///tmp/r.sock", RedisConfig(tls=True), "unix"),
        ("http://h:1/0", RedisConfig(), "must start with"),
    ],
)
def test_inconsistent_settings_name_the_flag(url: str, redis: RedisConfig, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        ClusterConfig(redis_url=url, redis=redis)


def test_bad_password_settings_are_argparse_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "empty.pw"
    empty.write_text("\n")
    for argv, needle in (
        (["--redis-password", "a", "--redis-password-file", str(empty)], "give only one"),
        (["--redis-password-file", str(empty)], "is empty"),
        (["--redis-password-file", str(tmp_path / "missing")], "no such file"),
    ):
        with pytest.raises((SystemExit, ConfigError)) as failed:
            _parse(argv)
        message = str(failed.value) + capsys.readouterr().err
        assert needle in message, message
        assert "--redis-password" in message, message
    monkeypatch.setenv("DISCOVERY_REDIS_TLS", "maybe")
    with pytest.raises(SystemExit):
        build_parser()
    assert "DISCOVERY_REDIS_TLS" in capsys.readouterr().err


# -- authentication and ACL users -------------------------------------------------------


async def test_refused_credentials_are_reported_and_retried_until_fixed(
    acl_redis: RedisServer,
    admin: aioredis.Redis,
    redis_prefix: str,
    make_search_server: SearchServerFactory,
    make_data_server: DataServerFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="discovery.livelist.redis.follower")
    await make_data_server(shard=0, instance_id="ds-a0")
    leader = await make_search_server(server_id="ss-pub", redis_url=acl_redis.url, redis=PUBLISHER)
    await eventually(lambda: live_ids(leader) == {"ds-a0"}, message="the leader publishes")

    wrong = await make_search_server(
        server_id="ss-wrong",
        redis_url=acl_redis.url,
        redis=RedisConfig(username="reader", password="not-the-password"),
        leader_eligible=False,
    )
    missing = await make_search_server(
        server_id="ss-missing", redis_url=acl_redis.url, leader_eligible=False
    )
    for server in (wrong, missing):
        # Up and answering, without a list.
        assert await _get(f"{server.url}/healthz") == 200
        assert await _get(f"{server.url}/readyz") == 503
        assert server.cluster_view()["redis_connected"] is False
    await eventually(
        lambda: _load_errors(wrong) >= 2 and _load_errors(missing) >= 2,
        message="both keep trying",
    )
    follower = "discovery.livelist.redis.follower"
    refusals = [r.getMessage() for r in caplog.records if r.name == follower]
    assert any(
        "refused our credentials" in m and "invalid username-password" in m for m in refusals
    )
    # Without credentials Redis answers NOAUTH ("... must be called with the client
    # already authenticated ..."): the same clear refusal.
    assert any("refused our credentials" in m and "already authenticated" in m for m in refusals), (
        refusals
    )
    assert READER_PW not in caplog.text
    assert ADMIN_PW not in caplog.text

    # The operator fixes the server side: both recover without a restart.
    await admin.acl_setuser("reader", enabled=True, passwords=["+not-the-password"])
    await admin.acl_setuser("default", enabled=True, nopass=True)
    await eventually(
        lambda: live_ids(wrong) == {"ds-a0"} and live_ids(missing) == {"ds-a0"},
        timeout=20,
        message="both read the list once allowed",
    )
    assert leader.is_leader
    assert not wrong.is_leader
    assert not missing.is_leader


async def test_reader_only_user_follows_the_list_and_cannot_write(
    acl_redis: RedisServer,
    admin: aioredis.Redis,
    redis_prefix: str,
    zk_hosts: str,
    make_search_server: SearchServerFactory,
    make_data_server: DataServerFactory,
) -> None:
    for shard in range(2):
        await make_data_server(shard=shard, instance_id=f"ds-b{shard}")
    leader = await make_search_server(
        server_id="ss-leader", redis_url=acl_redis.url, redis=PUBLISHER
    )
    follower = await make_search_server(
        server_id="ss-follower", redis_url=acl_redis.url, redis=READER, leader_eligible=False
    )
    await eventually(
        lambda: live_ids(leader) == live_ids(follower) == {"ds-b0", "ds-b1"},
        message="both see the list",
    )
    assert leader.is_leader
    assert follower.election is None
    assert not follower.is_leader
    assert leader.election is not None
    assert await leader.election.contenders() == ["ss-leader"]

    keys = RedisKeys(redis_prefix)
    snapshot = await admin.hgetall(keys.servers)
    raw = aioredis.Redis.from_url(acl_redis.url, username="reader", password=READER_PW)
    try:
        assert await raw.hgetall(keys.servers) == snapshot
        writes: list[Any] = [
            raw.hset(keys.servers, "ds-x", b"{}"),
            raw.delete(keys.servers),
            raw.hset(keys.meta, "epoch", "999999999"),
            raw.xadd(keys.changes, {"kind": "full"}),
            raw.eval("return redis.call('DEL', KEYS[1])", 1, keys.servers),
            raw.set(f"{redis_prefix}:other", b"x"),
        ]
        for write in writes:
            with pytest.raises(redis_errors.NoPermissionError):
                await write
        # The leader's own code path, run with the reader's credentials, is refused too
        # and reported as a permission problem (not an outage to wait out).
        with pytest.raises(RedisPermissionError, match="no permissions"):
            await LivePublisher(raw, redis_prefix, leader_id="intruder", epoch=2**62).publish_full(
                {}
            )
    finally:
        await raw.aclose()
    assert await admin.hgetall(keys.servers) == snapshot

    # The publisher user can do exactly the fence script's work: nothing outside the prefix.
    publisher = aioredis.Redis.from_url(acl_redis.url, username="publisher", password=PUBLISHER_PW)
    try:
        with pytest.raises(redis_errors.NoPermissionError):
            await publisher.get("some-other-key")
        with pytest.raises(redis_errors.NoPermissionError):
            await publisher.ping()
    finally:
        await publisher.aclose()

    # `discovery status` reads with the reader's credentials as well.
    status = await fetch_status(
        ZkConfig(hosts=zk_hosts, connect_timeout=20),
        ClusterConfig(cluster=cluster_of(redis_prefix), redis_url=acl_redis.url, redis=READER),
    )
    assert status.published.live is not None
    assert set(status.published.live.servers) == {"ds-b0", "ds-b1"}
    # A wrong password is a refusal, not an outage: exit 4, which retrying cannot fix.
    wrong = RedisConfig(username="reader", password="not-it")
    with pytest.raises(StatusError, match="cannot reach Redis") as refused:
        await fetch_status(
            ZkConfig(hosts=zk_hosts, connect_timeout=20),
            ClusterConfig(cluster=cluster_of(redis_prefix), redis_url=acl_redis.url, redis=wrong),
        )
    assert refused.value.refused
    argv = ["status", "--zk", zk_hosts, "--cluster", cluster_of(redis_prefix)]
    argv += ["--redis", acl_redis.client_url("reader", "not-it")]
    assert await asyncio.to_thread(discovery_main, argv) == 4


async def test_a_leader_without_publishing_rights_resigns_and_pauses(
    acl_redis: RedisServer,
    admin: aioredis.Redis,
    redis_prefix: str,
    make_search_server: SearchServerFactory,
    make_data_server: DataServerFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger="search_server.leadership")
    pause = 1.0
    await make_data_server(shard=0, instance_id="ds-c0")
    # Leader-eligible, but holding only the reader's credentials: a configuration mistake.
    bad = await make_search_server(
        server_id="ss-bad", redis_url=acl_redis.url, redis=READER, leader_retry_pause=pause
    )
    await eventually(lambda: bad.leader_refusals >= 1, message="the first refusal")
    first = time.monotonic()
    await eventually(lambda: not bad.is_leader, message="resigned")
    await eventually(lambda: bad.leader_refusals >= 3, timeout=30, message="contends again")
    elapsed = time.monotonic() - first
    # Two pauses lie between the first and the third term: no hot loop.
    assert elapsed >= 1.5 * pause, elapsed
    assert bad.leader_refusals <= elapsed / pause + 2
    assert await admin.exists(RedisKeys(redis_prefix).meta) == 0, "nothing was published"
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert any("refused to let it publish" in r.getMessage() for r in errors)

    # A server whose credentials can publish takes over; the bad one reads its list.
    good = await make_search_server(
        server_id="ss-good", redis_url=acl_redis.url, redis=PUBLISHER, leader_retry_pause=pause
    )
    await eventually(
        lambda: live_ids(good) == live_ids(bad) == {"ds-c0"}, timeout=20, message="good publishes"
    )
    assert good.is_leader
    assert good.leader_refusals == 0


async def test_refusals_inside_the_fence_script_and_bad_passwords_are_translated(
    tmp_path: Path, redis_prefix: str
) -> None:
    # A user allowed to run the script but not the writes in it: Redis 7.0 answers with
    # an ERR about the script, not NOPERM; it is still a permission problem.
    keys = RedisKeys(redis_prefix)
    half_rules = " ".join(
        [
            "resetkeys",
            "resetchannels",
            "-@all",
            " ".join(f"~{key}" for key in keys.all),
            "+evalsha +script|load +hmget",
        ]
    )
    server = RedisServer(tmp_path / "r", users=[acl_user_line("half", "pw", half_rules)])
    await asyncio.to_thread(server.start)
    try:
        half = aioredis.Redis.from_url(server.url, username="half", password="pw")
        wrong = aioredis.Redis.from_url(server.url, username="half", password="nope")
        try:
            with pytest.raises(RedisPermissionError):
                await LivePublisher(half, redis_prefix, leader_id="x", epoch=1).publish_full({})
            with pytest.raises(RedisAuthError, match="refused our credentials"):
                await LivePublisher(wrong, redis_prefix, leader_id="x", epoch=1).publish_full({})
        finally:
            await half.aclose()
            await wrong.aclose()
    finally:
        await asyncio.to_thread(server.stop)


# -- TLS ----------------------------------------------------------------------------------


@pytest.fixture
def tls_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A TLS-only Redis that also requires a client certificate from its CA."""
    server = RedisServer(tmp_path / "tls-redis", tls=True, tls_auth_clients="yes")
    server.start()
    yield server
    server.stop()


@pytest.mark.smoke
async def test_search_servers_read_and_publish_over_tls(
    tls_redis: RedisServer,
    make_search_server: SearchServerFactory,
    make_data_server: DataServerFactory,
) -> None:
    pki = tls_redis.pki
    tls = RedisConfig(
        tls_ca=str(pki.ca_cert), tls_cert=str(pki.client_cert), tls_key=str(pki.client_key)
    )
    await make_data_server(shard=0, instance_id="ds-t0")
    assert tls_redis.url.startswith("rediss://")
    leader = await make_search_server(server_id="ss-tls", redis_url=tls_redis.url, redis=tls)
    # The other spelling: a redis:// URL with --redis-tls.
    plain_url = tls_redis.url.replace("rediss://", "redis://")
    follower = await make_search_server(
        server_id="ss-tls-flag",
        redis_url=plain_url,
        redis=RedisConfig(
            tls=True,
            tls_ca=str(pki.ca_cert),
            tls_cert=str(pki.client_cert),
            tls_key=str(pki.client_key),
        ),
        leader_eligible=False,
    )
    await eventually(
        lambda: live_ids(leader) == live_ids(follower) == {"ds-t0"}, message="the list over TLS"
    )
    assert leader.is_leader

    refused: list[aioredis.Redis] = [
        # Plain text on the TLS port.
        aioredis.Redis.from_url(plain_url, socket_timeout=5, socket_connect_timeout=5),
        # TLS, but without the client certificate the server requires.
        make_redis(
            ClusterConfig(redis_url=tls_redis.url, redis=RedisConfig(tls_ca=str(pki.ca_cert))),
            socket_timeout=5,
            socket_connect_timeout=5,
        ),
        # TLS with the system's CAs, which do not know our throwaway CA.
        make_redis(ClusterConfig(redis_url=tls_redis.url), socket_timeout=5),
    ]
    for client in refused:
        try:
            with pytest.raises((redis_errors.ConnectionError, redis_errors.TimeoutError)):
                await client.ping()
        finally:
            await client.aclose()


# -- sentinels with a password of their own ---------------------------------------------

SENTINEL_PW = "sentinel-secret-3141"


async def test_sentinels_with_a_password_of_their_own(
    acl_redis: RedisServer,
    redis_prefix: str,
    tmp_path: Path,
    make_search_server: SearchServerFactory,
    make_data_server: DataServerFactory,
) -> None:
    """Sentinels that require a password (``requirepass``): a search server given it by
    ``--redis-sentinel-password-file`` finds the primary and publishes there with its own
    Redis users; without it, or with a wrong one, the sentinels name no primary."""
    sentinel = RedisSentinel(
        tmp_path / "sentinel",
        (acl_redis.host, acl_redis.port),
        quorum=1,
        password=ADMIN_PW,  # the sentinel's own link to the primary: the default user
        sentinel_password=SENTINEL_PW,
    )
    await asyncio.to_thread(sentinel.start)
    try:
        url = f"redis+sentinel://{sentinel.address}/mymaster"
        secret = tmp_path / "sentinel.pw"
        secret.write_text(f"{SENTINEL_PW}\n")
        config = _parse(
            [
                *("--redis", url),
                *("--redis-username", "reader", "--redis-password", READER_PW),
                *("--redis-publish-username", "publisher"),
                *("--redis-publish-password", PUBLISHER_PW),
                *("--redis-sentinel-password-file", str(secret)),
            ]
        )
        settings = config.cluster.redis
        assert settings.sentinel_password == SENTINEL_PW
        assert SENTINEL_PW not in repr(config)

        await make_data_server(shard=0, instance_id="ds-s0")
        leader = await make_search_server(server_id="ss-sentinel", redis_url=url, redis=settings)
        await eventually(lambda: live_ids(leader) == {"ds-s0"}, message="published and read")
        assert leader.is_leader
        primary = aioredis.Redis.from_url(acl_redis.client_url(password=ADMIN_PW))
        try:
            assert await primary.hexists(RedisKeys(redis_prefix).servers, "ds-s0")
        finally:
            await primary.aclose()

        reader = RedisConfig(username="reader", password=READER_PW)
        wrong = RedisConfig(username="reader", password=READER_PW, sentinel_password="wrong")
        for redis in (reader, wrong):
            client = make_redis(ClusterConfig(redis_url=url, redis=redis))
            try:
                with pytest.raises(MasterNotFoundError):
                    await client.ping()
            finally:
                await client.aclose()
    finally:
        await asyncio.to_thread(sentinel.stop)


def test_sentinel_credentials_need_a_sentinel_url() -> None:
    with pytest.raises(ConfigError, match="--redis-sentinel-password"):
        ClusterConfig(redis_url="redis://h:1/0", redis=RedisConfig(sentinel_password="x"))
    with pytest.raises(ConfigError, match="--redis-sentinel-username: must not be empty"):
        RedisConfig(sentinel_username="")
    assert "x" not in repr(RedisConfig(sentinel_password="x")).replace("RedisConfig", "")
