"""Redis clients built from the configuration, and the ACL rules of the two Redis roles.

:func:`make_redis` builds a client for one :class:`RedisRole` on one server, behind
Sentinel or on Redis Cluster, as the URL's scheme says. Clients connect on their first
command, so building one never fails for an unreachable Redis; refused credentials
surface on that command.

Design: docs/design/security.md, "Redis security: passwords, ACL users, TLS".
"""

from __future__ import annotations

import contextlib
import hashlib
import urllib.parse
from collections.abc import Iterable
from enum import StrEnum
from typing import Any, Final, cast

import redis.asyncio as aioredis
import redis.exceptions as redis_errors
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import ExponentialBackoff

from discovery.config import ClusterConfig
from discovery.errors import ConfigError
from discovery.livelist.redis.layout import RedisKeys

__all__ = [
    "PUBLISHER_COMMANDS",
    "READER_COMMANDS",
    "RedisRole",
    "acl_user_line",
    "credentials_for",
    "describe_redis",
    "make_redis",
    "parse_hosts",
    "publisher_acl_rules",
    "reader_acl_rules",
    "role_rules",
]


class RedisRole(StrEnum):
    """What a Redis client is for; it decides which credentials it uses."""

    READ = "read"
    """Read and follow the live list (every search server, ``discovery status``)."""
    PUBLISH = "publish"
    """Write the live list (the leader): the publishing credentials."""


#: Commands of the reading role (who sends which: docs/design/security.md).
READER_COMMANDS: Final = (
    "get",
    "hmget",
    "hgetall",
    "xrevrange",
    "xrange",
    "xread",
    "pttl",
    "multi",
    "exec",
    "ping",
    "select",
)
#: Commands of the publishing role: the fence script and what it runs.
PUBLISHER_COMMANDS: Final = (
    "evalsha",
    "script|load",
    "hmget",
    "hset",
    "hdel",
    "hlen",
    "del",
    "set",
    "xadd",
    "select",
)


def _glob_literal(name: str) -> str:
    # ACL key and channel patterns are globs; a cluster name may hold glob characters.
    return "".join("\\" + c if c in "*?[]\\" else c for c in name)


def reader_acl_rules(prefix: str) -> str:
    """ACL rules of the reading role for the key prefix ``prefix`` (``discovery:<cluster>``).

    Read-only access (``%R~``) to the four keys of the layout and
    :data:`READER_COMMANDS`; nothing that writes.
    """
    return _role_rules(prefix, "%R~", READER_COMMANDS)


def publisher_acl_rules(prefix: str) -> str:
    """ACL rules of the publishing role for ``prefix``: what the fence script needs.

    Read-write access to the four keys of the layout and :data:`PUBLISHER_COMMANDS`.
    It cannot XREAD: a leader reads the list with the reading credentials, like every
    search server.
    """
    return _role_rules(prefix, "~", PUBLISHER_COMMANDS)


def _role_rules(prefix: str, key_access: str, commands: Iterable[str]) -> str:
    # Nothing but our four keys (read-only with "%R~") and ``commands``.
    return role_rules(key_access, RedisKeys(prefix).all, (), commands)


def role_rules(
    key_access: str, keys: Iterable[str], channels: Iterable[str], commands: Iterable[str]
) -> str:
    """ACL rules granting ``commands`` on exactly ``keys`` (with ``key_access``, ``~`` or
    ``%R~``) and ``channels``, and nothing else."""
    return " ".join(
        [
            "resetkeys",
            "resetchannels",
            "-@all",
            *(f"{key_access}{_glob_literal(k)}" for k in keys),
            *(f"&{_glob_literal(c)}" for c in channels),
            *(f"+{command}" for command in commands),
        ]
    )


def acl_user_line(name: str, password: str, rules: str) -> str:
    """One ACL file line: user ``name``, enabled, with ``password`` (stored as its
    SHA-256, so the file does not hold it in clear) and ``rules``.

    Raises:
        ValueError: ``name`` is empty or holds whitespace, or ``password`` is empty.
    """
    if not name or any(c.isspace() for c in name):
        raise ValueError(f"an ACL user name must be non-empty without spaces, got {name!r}")
    if not password:
        raise ValueError("an ACL user needs a non-empty password")
    digest = hashlib.sha256(password.encode("utf-8")).hexdigest()
    return f"user {name} reset on #{digest} {rules}"


def credentials_for(cluster: ClusterConfig, role: RedisRole) -> tuple[str | None, str | None]:
    """``(username, password)`` a client of ``role`` authenticates with (None: not sent).

    Reading: ``--redis-username``/``--redis-password``, else those of the URL.
    Publishing: ``--redis-publish-username``/``--redis-publish-password``, each
    defaulting to its reading counterpart.
    """
    parts = urllib.parse.urlsplit(cluster.redis_url)
    url_user = urllib.parse.unquote(parts.username) if parts.username else None
    url_password = urllib.parse.unquote(parts.password) if parts.password is not None else None
    settings = cluster.redis
    username = settings.username if settings.username is not None else url_user
    password = settings.password if settings.password is not None else url_password
    if role is RedisRole.PUBLISH:
        if settings.publish_username is not None:
            username = settings.publish_username
        if settings.publish_password is not None:
            password = settings.publish_password
    return username, password


def _url_without_credentials(url: str, tls: bool) -> str:
    # redis-py lets the URL's credentials override explicit ones, so they are taken out
    # and passed explicitly: the role then decides which credentials are used.
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc.rpartition("@")[2]
    scheme = "rediss" if tls and parts.scheme == "redis" else parts.scheme
    return urllib.parse.urlunsplit(parts._replace(scheme=scheme, netloc=netloc))


_WHERE: Final = "--redis / DISCOVERY_REDIS_URL"


def parse_hosts(netloc: str) -> list[tuple[str, int]]:
    """``h1:p1,h2:p2`` (credentials already removed) as ``[(h1, p1), (h2, p2)]``.

    Raises:
        ConfigError: an empty list, a missing or bad port.
    """
    hosts: list[tuple[str, int]] = []
    for item in netloc.split(","):
        host, _, port = item.strip().rpartition(":")
        host = host.strip("[]")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"{_WHERE}: {item!r} is not host:port")
        hosts.append((host, int(port)))
    if not hosts:
        raise ConfigError(f"{_WHERE}: no host:port given")
    return hosts


class _SentinelRedis(aioredis.Redis):
    """The primary's client, which also closes the sentinels' clients it was made with."""

    _sentinel: Sentinel | None = None

    def close_with(self, sentinel: Sentinel) -> None:
        """Close ``sentinel`` (the sentinels' client this one was made by) with this client."""
        self._sentinel = sentinel

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        try:
            await super().aclose(close_connection_pool)
        finally:
            sentinel, self._sentinel = self._sentinel, None
            if sentinel is not None:
                with contextlib.suppress(redis_errors.RedisError, OSError):
                    await sentinel.aclose()


def _sentinel_client(
    url: str, kwargs: dict[str, Any], sentinel_auth: dict[str, str]
) -> aioredis.Redis:
    parts = urllib.parse.urlsplit(url)
    hosts = parse_hosts(parts.netloc.rpartition("@")[2])
    path = [p for p in parts.path.split("/") if p]
    if not path or len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
        raise ConfigError(
            f"{_WHERE}: a Sentinel URL names the primary and optionally a database: "
            "redis+sentinel://host:port[,host:port...]/<primary name>[/db]"
        )
    name, db = path[0], int(path[1]) if len(path) == 2 else 0
    # The sentinels: the same TLS and socket settings, not the data servers' password
    # but their own (--redis-sentinel-password), if any.
    sentinel_kwargs = {
        k: v for k, v in kwargs.items() if k.startswith(("socket_", "ssl")) or k == "retry"
    }
    sentinel_kwargs.update(sentinel_auth)
    sentinel = Sentinel(hosts, sentinel_kwargs=sentinel_kwargs)  # type: ignore[no-untyped-call]
    client = sentinel.master_for(name, redis_class=_SentinelRedis, db=db, **kwargs)
    assert isinstance(client, _SentinelRedis)
    client.close_with(sentinel)
    return client


def _cluster_client(url: str, kwargs: dict[str, Any]) -> aioredis.Redis:
    parts = urllib.parse.urlsplit(url)
    hosts = parse_hosts(parts.netloc.rpartition("@")[2])
    if parts.path.strip("/") not in ("", "0"):
        raise ConfigError(f"{_WHERE}: Redis Cluster has only database 0")
    kwargs.pop("db", None)
    client = RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in hosts], **kwargs)
    # RedisCluster is no Redis subclass but offers every command the live list uses
    # (hashes, streams, EVALSHA, single-slot MULTI/EXEC) with the same signatures.
    return cast(aioredis.Redis, client)


def make_redis(
    cluster: ClusterConfig, *, role: RedisRole = RedisRole.READ, **options: Any
) -> aioredis.Redis:
    """An asyncio Redis client for ``role`` with the cluster's URL, credentials and TLS.

    The URL's scheme picks one server, Sentinel or Redis Cluster (module docstring).
    ``options`` are passed to redis-py (timeouts, retry policy, ``decode_responses``)
    and win over what the configuration gives. No I/O happens here: the client connects
    (and authenticates) on its first command, so a Redis that is down or refuses us is
    reported there, not at construction. The caller owns the client (``aclose()``).

    Raises:
        ConfigError: a Sentinel or Cluster URL without usable hosts or primary name.
    """
    settings = cluster.redis
    tls = settings.uses_tls(cluster.redis_url)
    username, password = credentials_for(cluster, role)
    kwargs: dict[str, Any] = {}
    if username is not None:
        kwargs["username"] = username
    if password is not None:
        kwargs["password"] = password
    if tls:
        kwargs.update(
            ssl_cert_reqs="required",
            ssl_ca_certs=settings.tls_ca,
            ssl_certfile=settings.tls_cert,
            ssl_keyfile=settings.tls_key,
            ssl_check_hostname=settings.tls_verify_hostname,
        )
    # One quick retry on a fresh connection (after a Redis restart the pooled one is
    # dead), then fail: our callers have retry loops of their own (the reader's
    # back-off, the leader's heartbeat), and redis-py's default (ten retries, up to a
    # second apart) would hold a heartbeat or a reconnect for seconds in an outage,
    # and keep them from noticing that Redis is back.
    kwargs["retry"] = Retry(ExponentialBackoff(cap=0.1, base=0.02), 1)
    kwargs.update(options)
    scheme = urllib.parse.urlsplit(cluster.redis_url).scheme
    if tls and "+" in scheme:
        kwargs["ssl"] = True  # from_url infers it from rediss://; these are built directly
    if scheme.endswith("+sentinel"):
        sentinel_auth = {
            key: value
            for key, value in (
                ("username", settings.sentinel_username),
                ("password", settings.sentinel_password),
            )
            if value is not None
        }
        return _sentinel_client(cluster.redis_url, kwargs, sentinel_auth)
    if scheme.endswith("+cluster"):
        return _cluster_client(cluster.redis_url, kwargs)
    return aioredis.Redis.from_url(_url_without_credentials(cluster.redis_url, tls), **kwargs)


def describe_redis(redis: aioredis.Redis) -> str:
    """Where a client connects, without credentials (``host:port/db``, the socket path,
    ``sentinel:<primary name>/db`` or ``cluster:<host:port,...>``)."""
    pool = getattr(redis, "connection_pool", None)
    if pool is None:  # Redis Cluster: no single pool
        nodes = getattr(redis, "startup_nodes", None) or {}
        names = sorted(f"{n.host}:{n.port}" for n in getattr(nodes, "values", lambda: nodes)())
        return "cluster:" + ",".join(names)
    service = getattr(pool, "service_name", None)
    if service is not None:  # behind Sentinel
        return f"sentinel:{service}/{pool.connection_kwargs.get('db', 0)}"
    kwargs = pool.connection_kwargs
    db = kwargs.get("db", 0)
    if "path" in kwargs:
        return f"unix:{kwargs['path']}/{db}"
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{db}"
