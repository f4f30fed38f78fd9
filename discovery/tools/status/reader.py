"""Reading a cluster's status: ZooKeeper and Redis, read once, never written.

* **ZooKeeper** (through :class:`~discovery.zk.session.ZkSession`'s asynchronous reads, never a
  blocking kazoo call on the loop; contenders and registrations with ``multiRead``,
  :func:`~discovery.zk.multiread.read_many`): the election's contenders under
  ``/search_servers/election`` (the leader holds the lowest sequence node, and that
  node's czxid is its epoch, exactly as :mod:`discovery.zk.election` computes it), the
  search servers under ``/search_servers/members`` and the data servers under
  ``/data_servers``. A child that :class:`~discovery.zk.membership.MembershipWatcher`
  skips (not a valid ServiceInstance, an id other than its name, a persistent node
  claiming to be an ephemeral registration) is listed as invalid with the same reason.
  And the operators' maintenance markers under ``/maintenance``
  (:func:`~discovery.zk.maintenance.read_markers`; an unreadable one is listed as such).
* **Redis** (one MULTI/EXEC, so the keys are read at one instant): the published
  list (``P:meta`` and ``P:servers``) and the leader's heartbeat ``P:leader`` with its
  remaining TTL, decoded by the contract module :mod:`discovery.livelist.redis.layout`.

The ZooKeeper and Redis reads are not one atomic snapshot: while the cluster changes
(a server registers, a leader takes over) a difference may show for the moment the
leader needs to publish it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

import redis.asyncio as aioredis
import redis.exceptions as redis_errors
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from discovery.config import ClusterConfig, ZkConfig, redact_url
from discovery.errors import (
    MalformedLiveListError,
    RedisAccessError,
    RedisOperationError,
    StatusError,
    ZkAuthError,
    ZkError,
    ZkNoNodeError,
)
from discovery.instance import ServiceInstance
from discovery.livelist.model import LiveList
from discovery.livelist.redis.conn import RedisRole, make_redis
from discovery.livelist.redis.layout import (
    Heartbeat,
    RedisKeys,
    parse_heartbeat,
    parse_meta,
    parse_servers,
    translate_redis_error,
)
from discovery.zk.maintenance import read_markers
from discovery.zk.membership import decode_child
from discovery.zk.multiread import read_many
from discovery.zk.paths import DATA_SERVERS_PATH, SEARCH_ELECTION_PATH, SEARCH_MEMBERS_PATH
from discovery.zk.session import ZkSession

from .model import ClusterStatus, Contender, Published, compare

__all__ = [
    "CONNECT_TIMEOUT",
    "REDIS_TIMEOUT",
    "collect_status",
    "describe_redis",
    "fetch_status",
    "read_contenders",
    "read_directory",
    "read_redis",
]

log = logging.getLogger(__name__)

#: ``--zk-connect-timeout`` default of this command: an operator waiting at a prompt
#: wants an answer in seconds, not the 30 s a server grants itself at start-up.
CONNECT_TIMEOUT: Final = 5.0
#: Socket connect and read timeout for Redis; no retries.
REDIS_TIMEOUT: Final = 2.0
# kazoo's lock recipe names contenders ``<uuid>__lock__<10-digit sequence>`` and orders
# them by the sequence text (see kazoo.recipe.lock.Lock.contenders).
_CONTENDER_RE: Final = re.compile(r"__lock__(-?\d{10})$")


async def _children(session: ZkSession, path: str) -> list[str]:
    try:
        return await session.get_children(path)
    except ZkNoNodeError:
        return []  # nothing ever registered there


async def read_directory(
    session: ZkSession, path: str
) -> tuple[dict[str, ServiceInstance], dict[str, str]]:
    """Decode the ServiceInstances under ``path``: ``(valid by id, invalid id -> reason)``.

    A child is invalid exactly when the membership watcher skips it (the same
    :func:`~discovery.zk.membership.decode_child`): too large, not a valid
    ServiceInstance, an ``id`` other than its znode name, or a persistent node whose
    document says it is an ephemeral (``DYNAMIC``) registration.
    """
    children = await _children(session, path)
    # multiRead: hundreds of nodes per request (50,000 in about half a second, where a
    # get each took some 15 s); node by node where the server lacks it.
    read = await read_many(session, [f"{path}/{child}" for child in children])
    nodes = {child: entry for child, entry in zip(children, read, strict=True) if entry}
    valid: dict[str, ServiceInstance] = {}
    invalid: dict[str, str] = {}
    for child, (data, stat) in nodes.items():
        decoded = decode_child(child, data, stat)
        if isinstance(decoded, str):
            invalid[child] = decoded
        else:
            valid[child] = decoded
    return valid, invalid


async def read_contenders(session: ZkSession, path: str = SEARCH_ELECTION_PATH) -> list[Contender]:
    """The election's contenders in kazoo's order (lowest sequence, the leader, first)."""
    matches = {
        c: m.group(1) for c in await _children(session, path) if (m := _CONTENDER_RE.search(c))
    }
    ordered = sorted(matches, key=lambda c: matches[c])
    read = await read_many(session, [f"{path}/{child}" for child in ordered])
    return [
        Contender(entry[0].decode("utf-8", errors="replace"), child, entry[1].czxid)
        for child, entry in zip(ordered, read, strict=True)
        if entry is not None
    ]


def _parse_published(meta_fields: Any, server_fields: Any) -> Published:
    try:
        meta = parse_meta(meta_fields)
    except MalformedLiveListError as exc:
        return Published(None, error=f"invalid: {exc}")
    if meta is None:
        return Published(None, error="missing")
    servers, problems = parse_servers(server_fields)
    live = LiveList(meta.epoch, meta.version, meta.leader, meta.published_at, servers)
    return Published(live, skipped=tuple(problems))


async def read_redis(redis: aioredis.Redis, prefix: str) -> tuple[Heartbeat | None, Published]:
    """Read the published list (``P:meta``, ``P:servers``), ``P:leader`` and its TTL in
    one MULTI/EXEC.

    Raises:
        RedisOperationError: Redis failed (:class:`RedisUnavailableError` if unreachable).
    """
    try:
        async with redis.pipeline(transaction=True) as pipe:
            keys = RedisKeys(prefix)
            pipe.hgetall(keys.meta)
            pipe.hgetall(keys.servers)
            pipe.get(keys.leader)
            pipe.pttl(keys.leader)
            meta_fields, server_fields, raw_leader, ttl_ms = await pipe.execute()
    except (redis_errors.RedisError, OSError) as exc:
        raise translate_redis_error(exc) from exc
    heartbeat = None if raw_leader is None else parse_heartbeat(raw_leader, int(ttl_ms))
    return heartbeat, _parse_published(meta_fields, server_fields)


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


async def collect_status(
    session: ZkSession,
    redis: aioredis.Redis,
    prefix: str,
    *,
    expected_shards: int = 0,
    clock: Callable[[], float] = time.time,
) -> ClusterStatus:
    """Read the cluster's registrations, election and published list, and compare them.

    ``session`` must be started; ``prefix`` is the Redis key prefix
    (``discovery:{<cluster>}``); ``expected_shards`` the cluster's shard count (0:
    only the shards seen). The ZooKeeper and Redis reads run concurrently.

    Raises:
        ZkError: a ZooKeeper read failed (ZkConnectionError if unreachable).
        RedisOperationError: a Redis read failed (RedisUnavailableError if unreachable).
    """
    (
        contenders,
        (search_servers, search_invalid),
        (data_servers, data_invalid),
        (heartbeat, published),
        maintenance,
    ) = await _gather_first_error(
        read_contenders(session),
        read_directory(session, SEARCH_MEMBERS_PATH),
        read_directory(session, DATA_SERVERS_PATH),
        read_redis(redis, prefix),
        read_markers(session),
    )
    elected = tuple(contenders)
    status = ClusterStatus(
        zookeeper=session.hosts,
        redis=describe_redis(redis),
        prefix=prefix,
        now_ms=int(clock() * 1000),
        contenders=elected,
        search_servers=search_servers,
        search_servers_invalid=search_invalid,
        data_servers=data_servers,
        data_servers_invalid=data_invalid,
        heartbeat=heartbeat,
        published=published,
        maintenance=maintenance,
        expected_shards=expected_shards,
    )
    differences = compare(data_servers, elected, heartbeat, published, maintenance)
    log.debug(
        "%s: %d data servers registered, %d contenders, in sync: %s",
        prefix,
        len(data_servers),
        len(elected),
        differences.in_sync,
    )
    return dataclasses.replace(status, differences=differences)


async def _gather_first_error(*aws: Awaitable[Any]) -> list[Any]:
    """Like ``asyncio.gather`` but cancels the other reads when one fails."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# Answers that retrying with the same credentials cannot change.
_REFUSALS: Final = (ZkAuthError, RedisAccessError)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


async def _open_zk(config: ZkConfig) -> ZkSession:
    session = ZkSession.from_config(config)
    try:
        await session.start()
    except BaseException:
        with contextlib.suppress(Exception):
            await session.aclose()
        raise
    return session


async def _open_redis(cluster: ClusterConfig) -> aioredis.Redis:
    # The reading role's credentials suffice: status only reads (GET, PTTL, MULTI/EXEC).
    client = make_redis(
        cluster,
        role=RedisRole.READ,
        socket_timeout=REDIS_TIMEOUT,
        socket_connect_timeout=REDIS_TIMEOUT,
        # A status command answers now or says it cannot: no backoff between retries.
        retry=Retry(NoBackoff(), 0),
    )
    try:
        await client.ping()
    except BaseException as exc:
        await client.aclose()
        if isinstance(exc, Exception):
            # Refused credentials must say so (exit 4), not pass for an outage.
            raise translate_redis_error(exc) from exc
        raise
    return client


async def fetch_status(
    zk: ZkConfig, cluster: ClusterConfig, *, expected_shards: int = 0
) -> ClusterStatus:
    """Connect to ZooKeeper and Redis (concurrently), collect the status, disconnect.

    Raises:
        StatusError: one line per system that could not be reached or read, naming it
            and where (Redis passwords are not shown); ``refused`` when one refused our
            credentials or lacked a right.
    """
    redis_where = redact_url(cluster.redis_url)
    zk_result, redis_result = await asyncio.gather(
        _open_zk(zk), _open_redis(cluster), return_exceptions=True
    )
    try:
        failures: list[str] = []
        refused = False
        for what, where, result in (
            ("ZooKeeper", zk.hosts, zk_result),
            ("Redis", redis_where, redis_result),
        ):
            if isinstance(result, BaseException):
                if not isinstance(result, Exception):
                    raise result  # KeyboardInterrupt, CancelledError
                failures.append(f"cannot reach {what} at {where}: {_one_line(result)}")
                refused = refused or isinstance(result, _REFUSALS)
        if failures:
            raise StatusError("\n".join(failures), refused=refused)
        assert isinstance(zk_result, ZkSession)
        assert isinstance(redis_result, aioredis.Redis)
        try:
            return await collect_status(
                zk_result, redis_result, cluster.redis_prefix, expected_shards=expected_shards
            )
        except ZkError as exc:
            raise StatusError(
                f"cannot read ZooKeeper at {zk.hosts}: {_one_line(exc)}",
                refused=isinstance(exc, _REFUSALS),
            ) from exc
        except (RedisOperationError, RedisAccessError) as exc:
            raise StatusError(
                f"cannot read Redis at {redis_where}: {_one_line(exc)}",
                refused=isinstance(exc, _REFUSALS),
            ) from exc
    finally:
        if isinstance(zk_result, ZkSession):
            await zk_result.aclose()
        if isinstance(redis_result, aioredis.Redis):
            await redis_result.aclose()
