"""Redis clients built from the configuration, and the ACL rules of the two Redis roles.

Every Redis client of the project is made by :func:`make_redis` from a
:class:`~discovery.config.ClusterConfig` (the URL) and its
:class:`~discovery.config.RedisConfig` (credentials, TLS), for one of two roles:

* :attr:`RedisRole.READ` — every search server's
  :class:`~discovery.livelist.LiveListReader` and ``discovery status``: GET of the
  snapshot and the heartbeat, HMGET of the fence, PTTL of the heartbeat (status, in a
  MULTI/EXEC), SUBSCRIBE to the events channel and PING on it. No writes.
* :attr:`RedisRole.PUBLISH` — the leader's :class:`~discovery.publisher.LivePublisher`:
  EVALSHA of the fence script (SCRIPT LOAD when Redis does not know it yet, e.g. after
  a restart), and, inside the script, GET/HMGET/EXISTS to check the fence, SET/HSET to
  write, and PUBLISH of the event. Redis checks the commands a script runs against
  the caller's ACL, key by key and channel by channel, so all of these are listed.

:func:`reader_acl_rules` and :func:`publisher_acl_rules` give exactly those
permissions for one key prefix, in Redis 7 ACL syntax; :func:`acl_user_line` makes an
ACL file line of them (the dev cluster's ``RedisServer(users=...)`` takes such lines,
and ``ACL SETUSER <name> <rules>`` takes the same rules). ``+select`` is in both so
that the URL may name a database other than 0.

Clients connect lazily (on their first command), so building one never fails for an
unreachable Redis; refused credentials then surface on the first command as
``redis.exceptions.AuthenticationError``, which
:func:`~discovery.redislayout.translate_redis_error` turns into
:class:`~discovery.errors.RedisAuthError`, and an ACL refusal into
:class:`~discovery.errors.RedisPermissionError`.
"""

from __future__ import annotations

import hashlib
import urllib.parse
from collections.abc import Iterable
from enum import StrEnum
from typing import Any, Final

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from .config import ClusterConfig
from .redislayout import RedisKeys

__all__ = [
    "PUBLISHER_COMMANDS",
    "READER_COMMANDS",
    "RedisRole",
    "acl_user_line",
    "credentials_for",
    "make_redis",
    "publisher_acl_rules",
    "reader_acl_rules",
]


class RedisRole(StrEnum):
    """What a Redis client is for; it decides which credentials it uses."""

    READ = "read"
    """Read and follow the live list (every search server, ``discovery status``)."""
    PUBLISH = "publish"
    """Write the live list (the leader): the publishing credentials."""


#: Commands of the reading role (see the module docstring for who sends which).
READER_COMMANDS: Final = (
    "get",
    "hmget",
    "pttl",
    "multi",
    "exec",
    "subscribe",
    "unsubscribe",
    "ping",
    "select",
)
#: Commands of the publishing role: the fence script and what it runs.
PUBLISHER_COMMANDS: Final = (
    "evalsha",
    "script|load",
    "get",
    "hmget",
    "exists",
    "set",
    "hset",
    "publish",
    "select",
)


def _glob_literal(name: str) -> str:
    # ACL key and channel patterns are globs; a cluster name may hold glob characters.
    return "".join("\\" + c if c in "*?[]\\" else c for c in name)


def reader_acl_rules(prefix: str) -> str:
    """ACL rules of the reading role for the key prefix ``prefix`` (``discovery:<cluster>``).

    Read-only access (``%R~``) to the snapshot, fence and heartbeat keys, the events
    channel, and :data:`READER_COMMANDS`; nothing that writes.
    """
    return _role_rules(prefix, "%R~", READER_COMMANDS)


def publisher_acl_rules(prefix: str) -> str:
    """ACL rules of the publishing role for ``prefix``: what the fence script needs.

    Read-write access to the snapshot, fence and heartbeat keys, PUBLISH on the events
    channel only, and :data:`PUBLISHER_COMMANDS`. It cannot SUBSCRIBE: a leader reads
    the list with the reading credentials, like every search server.
    """
    return _role_rules(prefix, "~", PUBLISHER_COMMANDS)


def _role_rules(prefix: str, key_access: str, commands: Iterable[str]) -> str:
    # Nothing but our three keys (read-only with "%R~"), our channel and ``commands``.
    keys = RedisKeys(prefix)
    return " ".join(
        [
            "resetkeys",
            "resetchannels",
            "-@all",
            *(f"{key_access}{_glob_literal(k)}" for k in (keys.live, keys.fence, keys.leader)),
            f"&{_glob_literal(keys.events)}",
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


def make_redis(
    cluster: ClusterConfig, *, role: RedisRole = RedisRole.READ, **options: Any
) -> aioredis.Redis:
    """An asyncio Redis client for ``role`` with the cluster's URL, credentials and TLS.

    ``options`` are passed to redis-py (timeouts, retry policy, ``decode_responses``)
    and win over what the configuration gives. No I/O happens here: the client connects
    (and authenticates) on its first command, so a Redis that is down or refuses us is
    reported there, not at construction. The caller owns the client (``aclose()``).
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
    return aioredis.Redis.from_url(_url_without_credentials(cluster.redis_url, tls), **kwargs)
