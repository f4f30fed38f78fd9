"""``discovery status``: what is registered, who leads, what is published, and how they differ.

One read-only look at a cluster, for operators and scripts:

* **ZooKeeper** (through :class:`~discovery.zk.ZkSession`'s asynchronous reads, never a
  blocking kazoo call on the loop): the election's contenders under
  ``/search_servers/election`` (the leader holds the lowest sequence node, and that
  node's czxid is its epoch, exactly as :mod:`discovery.election` computes it), the
  search servers under ``/search_servers/members`` and the data servers under
  ``/data_servers``. A child that is not a valid ServiceInstance is listed as invalid
  with the reason, as :class:`~discovery.membership.MembershipWatcher` would skip it.
* **Redis** (one MULTI/EXEC, so the three keys are read at one instant): the published
  list ``P:live`` (parsed as :class:`~discovery.livelist.LiveListReader` parses it), the
  leader's heartbeat ``P:leader`` and its remaining TTL.
* **Differences** between the two: ids registered but not published, published but
  not registered, ids whose address, port, shard, state or ``enabled`` differ; no
  leader, no heartbeat (nobody is publishing), no published list, and a published
  list or heartbeat from another leader or epoch than the election's.

The ZooKeeper and Redis reads are not one atomic snapshot: while the cluster changes
(a server registers, a leader takes over) a difference may show for the moment the
leader needs to publish it. Run the command again before acting on one.

Exit status: 0 when both were read (whatever the differences), 1 with one line per
failure on stderr (``discovery status: cannot reach ZooKeeper at HOSTS: ...``) when
ZooKeeper or Redis cannot be reached or read, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import re
import sys
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

import redis.asyncio as aioredis
import redis.exceptions as redis_errors
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from .config import COMMON_OPTIONS, ZK_OPTIONS, ClusterConfig, Option, ZkConfig, add_options
from .errors import (
    DiscoveryError,
    InvalidInstanceError,
    PayloadTooLargeError,
    RedisAccessError,
    RedisOperationError,
    ZkError,
    ZkNoNodeError,
)
from .instance import ServiceInstance
from .layout import DATA_SERVERS_PATH, SEARCH_ELECTION_PATH, SEARCH_MEMBERS_PATH
from .livelist import LiveList, MalformedLiveListError, parse_snapshot
from .publisher import RedisKeys, translate_redis_error
from .redisconn import RedisRole, make_redis
from .zk import NodeStat, ZkSession

__all__ = [
    "ClusterStatus",
    "Contender",
    "Differences",
    "Heartbeat",
    "Mismatch",
    "Published",
    "StatusError",
    "add_parser",
    "collect_status",
    "compare",
    "describe_redis",
    "fetch_status",
    "format_text",
    "read_contenders",
    "read_directory",
    "read_redis",
    "redact_url",
    "run",
]

log = logging.getLogger(__name__)

PROG: Final = "discovery status"

#: ``--zk-connect-timeout`` default of this command: an operator waiting at a prompt
#: wants an answer in seconds, not the 30 s a server grants itself at start-up.
CONNECT_TIMEOUT: Final = 5.0
#: Socket connect and read timeout for Redis; no retries.
REDIS_TIMEOUT: Final = 2.0
# Concurrent znode reads, so that 10,000 children neither take long nor flood the server.
_READ_CONCURRENCY: Final = 32
# kazoo's lock recipe names contenders ``<uuid>__lock__<10-digit sequence>`` and orders
# them by the sequence text (see kazoo.recipe.lock.Lock.contenders).
_CONTENDER_RE: Final = re.compile(r"__lock__(-?\d{10})$")
# The fields compared between a registration and its published entry.
_COMPARED: Final = ("address", "port", "shard", "state", "enabled")


class StatusError(DiscoveryError):
    """ZooKeeper or Redis could not be reached or read; one line per failure."""


# -- the status document -------------------------------------------------------------


@dataclass(frozen=True)
class Contender:
    """One node of the election: its contender's id (the node's data), name and czxid."""

    id: str
    node: str
    czxid: int

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "node": self.node, "czxid": self.czxid}


@dataclass(frozen=True)
class Heartbeat:
    """The leader's heartbeat ``P:leader``; ``error`` if it could not be decoded."""

    leader: str | None
    epoch: int | None
    version: int | None
    at: int | None
    ttl_ms: int | None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "leader": self.leader,
            "epoch": self.epoch,
            "version": self.version,
            "at": self.at,
            "ttl_ms": self.ttl_ms,
            "error": self.error,
        }


@dataclass(frozen=True)
class Published:
    """The published live list ``P:live``: ``live`` is None when it is absent or unreadable
    (``error`` says which); ``skipped`` lists server entries a reader would skip."""

    live: LiveList | None
    error: str | None = None
    skipped: tuple[str, ...] = ()


@dataclass(frozen=True)
class Mismatch:
    """An id registered and published with different fields: ``{field: (registered,
    published)}``."""

    id: str
    fields: Mapping[str, tuple[Any, Any]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "fields": {
                name: {"registered": registered, "published": published}
                for name, (registered, published) in sorted(self.fields.items())
            },
        }


@dataclass(frozen=True)
class Differences:
    """Where the registrations and the published list (or its leader) disagree."""

    registered_not_published: tuple[str, ...] = ()
    published_not_registered: tuple[str, ...] = ()
    mismatched: tuple[Mismatch, ...] = ()
    no_leader: bool = False
    heartbeat_missing: bool = False
    published_missing: bool = False
    leader_mismatch: tuple[str, ...] = ()

    @property
    def in_sync(self) -> bool:
        return not (
            self.registered_not_published
            or self.published_not_registered
            or self.mismatched
            or self.no_leader
            or self.heartbeat_missing
            or self.published_missing
            or self.leader_mismatch
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "in_sync": self.in_sync,
            "registered_not_published": list(self.registered_not_published),
            "published_not_registered": list(self.published_not_registered),
            "mismatched": [m.to_dict() for m in self.mismatched],
            "no_leader": self.no_leader,
            "heartbeat_missing": self.heartbeat_missing,
            "published_missing": self.published_missing,
            "leader_mismatch": list(self.leader_mismatch),
        }


@dataclass(frozen=True)
class ClusterStatus:
    """Everything ``discovery status`` reports; :meth:`to_dict` is the ``--json`` document.

    ``contenders`` are in election order, the leader first. ``data_servers`` and
    ``search_servers`` map ids to decoded registrations; ``*_invalid`` map the ids of
    children that are not valid ServiceInstances to the reason. ``now_ms`` is the wall
    clock when the reads finished.
    """

    zookeeper: str
    redis: str
    prefix: str
    now_ms: int
    contenders: tuple[Contender, ...]
    search_servers: Mapping[str, ServiceInstance]
    search_servers_invalid: Mapping[str, str]
    data_servers: Mapping[str, ServiceInstance]
    data_servers_invalid: Mapping[str, str]
    heartbeat: Heartbeat | None
    published: Published
    differences: Differences = field(default_factory=Differences)

    @property
    def leader(self) -> Contender | None:
        """The election's leader: the contender with the lowest sequence node."""
        return self.contenders[0] if self.contenders else None

    @property
    def published_age_ms(self) -> int | None:
        live = self.published.live
        return None if live is None else self.now_ms - live.published_at

    def shards(self) -> dict[int, list[ServiceInstance]]:
        """Registered data servers by shard (shards ascending, servers by replica and id)."""
        by_shard: dict[int, list[ServiceInstance]] = {}
        for instance in self.data_servers.values():
            by_shard.setdefault(instance.payload.shard, []).append(instance)
        return {
            shard: sorted(by_shard[shard], key=lambda i: (i.payload.replica, i.id))
            for shard in sorted(by_shard)
        }

    def to_dict(self) -> dict[str, Any]:
        leader = self.leader
        live = self.published.live
        return {
            "zookeeper": self.zookeeper,
            "redis": self.redis,
            "prefix": self.prefix,
            "now_ms": self.now_ms,
            "leader": {
                "id": leader.id if leader else None,
                "epoch": leader.czxid if leader else None,
                "node": leader.node if leader else None,
            },
            "contenders": [c.to_dict() for c in self.contenders],
            "heartbeat": None if self.heartbeat is None else self.heartbeat.to_dict(),
            "search_servers": {
                "count": len(self.search_servers),
                "servers": [
                    {"id": i.id, "address": i.address, "port": i.port}
                    for i in _by_id(self.search_servers)
                ],
                "invalid": _invalid_list(self.search_servers_invalid),
            },
            "data_servers": {
                "count": len(self.data_servers),
                "shards": [
                    {"shard": shard, "servers": [_server_dict(i) for i in servers]}
                    for shard, servers in self.shards().items()
                ],
                "invalid": _invalid_list(self.data_servers_invalid),
            },
            "published": {
                "present": live is not None,
                "error": self.published.error,
                "epoch": live.epoch if live else None,
                "version": live.version if live else None,
                "leader": live.leader if live else None,
                "published_at": live.published_at if live else None,
                "age_ms": self.published_age_ms,
                "count": len(live.servers) if live else 0,
                "servers": [_server_dict(i) for i in _by_id(live.servers)] if live else [],
                "skipped": list(self.published.skipped),
            },
            "differences": self.differences.to_dict(),
        }


def _by_id(servers: Mapping[str, ServiceInstance]) -> list[ServiceInstance]:
    return [servers[k] for k in sorted(servers)]


def _invalid_list(invalid: Mapping[str, str]) -> list[dict[str, str]]:
    return [{"id": k, "reason": invalid[k]} for k in sorted(invalid)]


def _server_dict(instance: ServiceInstance) -> dict[str, Any]:
    payload = instance.payload
    return {
        "id": instance.id,
        "address": instance.address,
        "port": instance.port,
        "shard": payload.shard,
        "replica": payload.replica,
        "state": payload.state.value,
        "enabled": instance.enabled,
        "reason": payload.reason,
        "docs": payload.docs,
    }


def _fields(instance: ServiceInstance) -> dict[str, Any]:
    return {
        "address": instance.address,
        "port": instance.port,
        "shard": instance.payload.shard,
        "state": instance.payload.state.value,
        "enabled": instance.enabled,
    }


def compare(
    registered: Mapping[str, ServiceInstance],
    contenders: tuple[Contender, ...],
    heartbeat: Heartbeat | None,
    published: Published,
) -> Differences:
    """The differences between what is registered (and elected) and what is published."""
    live = published.live
    listed: Mapping[str, ServiceInstance] = live.servers if live is not None else {}
    mismatched: list[Mismatch] = []
    for key in sorted(registered.keys() & listed.keys()):
        mine, theirs = _fields(registered[key]), _fields(listed[key])
        diff = {f: (mine[f], theirs[f]) for f in _COMPARED if mine[f] != theirs[f]}
        if diff:
            mismatched.append(Mismatch(key, diff))
    leader = contenders[0] if contenders else None
    leader_mismatch: list[str] = []
    if leader is not None:
        for what, other_leader, other_epoch in (
            ("published", live.leader if live else None, live.epoch if live else None),
            (
                "heartbeat",
                heartbeat.leader if heartbeat else None,
                heartbeat.epoch if heartbeat else None,
            ),
        ):
            if other_epoch is None:
                continue  # missing: reported on its own
            if (other_leader, other_epoch) != (leader.id, leader.czxid):
                leader_mismatch.append(
                    f"{what} by {other_leader!r} epoch {other_epoch}, "
                    f"elected {leader.id!r} epoch {leader.czxid}"
                )
    return Differences(
        registered_not_published=tuple(sorted(registered.keys() - listed.keys())),
        published_not_registered=tuple(sorted(listed.keys() - registered.keys())),
        mismatched=tuple(mismatched),
        no_leader=leader is None,
        heartbeat_missing=heartbeat is None,
        published_missing=live is None,
        leader_mismatch=tuple(leader_mismatch),
    )


# -- reading ------------------------------------------------------------------------


async def _children(session: ZkSession, path: str) -> list[str]:
    try:
        return await session.get_children(path)
    except ZkNoNodeError:
        return []  # nothing ever registered there


async def _read_all(
    session: ZkSession, path: str, children: Iterable[str]
) -> dict[str, tuple[bytes, NodeStat]]:
    """Data and stat of each child; children deleted meanwhile are left out."""
    slots = asyncio.Semaphore(_READ_CONCURRENCY)

    async def read(child: str) -> tuple[str, tuple[bytes, NodeStat] | None]:
        async with slots:
            try:
                return child, await session.get(f"{path}/{child}")
            except ZkNoNodeError:
                return child, None

    results = await asyncio.gather(*(read(child) for child in children))
    return {child: value for child, value in results if value is not None}


async def read_directory(
    session: ZkSession, path: str
) -> tuple[dict[str, ServiceInstance], dict[str, str]]:
    """Decode the ServiceInstances under ``path``: ``(valid by id, invalid id -> reason)``.

    A child is invalid, as for the membership watcher, when it is too large, not a
    valid ServiceInstance, or holds an ``id`` other than its znode name.
    """
    nodes = await _read_all(session, path, await _children(session, path))
    valid: dict[str, ServiceInstance] = {}
    invalid: dict[str, str] = {}
    for child, (data, _stat) in nodes.items():
        try:
            instance = ServiceInstance.from_json(data)
        except PayloadTooLargeError as exc:
            invalid[child] = f"too_large: {exc}"
            continue
        except InvalidInstanceError as exc:
            invalid[child] = f"malformed: {exc}"
            continue
        if instance.id != child:
            invalid[child] = f"id_mismatch: znode {child!r} holds id {instance.id!r}"
            continue
        valid[child] = instance
    return valid, invalid


async def read_contenders(session: ZkSession, path: str = SEARCH_ELECTION_PATH) -> list[Contender]:
    """The election's contenders in kazoo's order (lowest sequence, the leader, first)."""
    matches = {
        c: m.group(1) for c in await _children(session, path) if (m := _CONTENDER_RE.search(c))
    }
    ordered = sorted(matches, key=lambda c: matches[c])
    nodes = await _read_all(session, path, ordered)
    return [
        Contender(nodes[c][0].decode("utf-8", errors="replace"), c, nodes[c][1].czxid)
        for c in ordered
        if c in nodes
    ]


def _optional_int(document: Mapping[str, Any], key: str) -> int | None:
    value = document.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _parse_heartbeat(raw: bytes | str, ttl_ms: int) -> Heartbeat:
    ttl = ttl_ms if ttl_ms >= 0 else None  # -1: no expiry set
    try:
        document = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        return Heartbeat(None, None, None, None, ttl, error=f"not valid JSON: {exc}")
    if not isinstance(document, dict):
        return Heartbeat(None, None, None, None, ttl, error="not a JSON object")
    leader = document.get("leader")
    return Heartbeat(
        leader=leader if isinstance(leader, str) else None,
        epoch=_optional_int(document, "epoch"),
        version=_optional_int(document, "version"),
        at=_optional_int(document, "at"),
        ttl_ms=ttl,
    )


def _parse_published(raw: bytes | str | None) -> Published:
    if raw is None:
        return Published(None, error="missing")
    try:
        live, problems = parse_snapshot(raw)
    except MalformedLiveListError as exc:
        return Published(None, error=f"invalid: {exc}")
    return Published(live, skipped=tuple(problems))


async def read_redis(redis: aioredis.Redis, prefix: str) -> tuple[Heartbeat | None, Published]:
    """Read ``P:live``, ``P:leader`` and its TTL in one MULTI/EXEC.

    Raises:
        RedisOperationError: Redis failed (:class:`RedisUnavailableError` if unreachable).
    """
    keys = RedisKeys(prefix)
    try:
        async with redis.pipeline(transaction=True) as pipe:
            pipe.get(keys.live)
            pipe.get(keys.leader)
            pipe.pttl(keys.leader)
            raw_live, raw_leader, ttl_ms = await pipe.execute()
    except (redis_errors.RedisError, OSError) as exc:
        raise translate_redis_error(exc) from exc
    heartbeat = None if raw_leader is None else _parse_heartbeat(raw_leader, int(ttl_ms))
    return heartbeat, _parse_published(raw_live)


def describe_redis(redis: aioredis.Redis) -> str:
    """Where a client connects, without credentials (``host:port/db`` or the socket path)."""
    kwargs = redis.connection_pool.connection_kwargs
    db = kwargs.get("db", 0)
    if "path" in kwargs:
        return f"unix:{kwargs['path']}/{db}"
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{db}"


async def collect_status(
    session: ZkSession,
    redis: aioredis.Redis,
    prefix: str,
    *,
    clock: Callable[[], float] = time.time,
) -> ClusterStatus:
    """Read the cluster's registrations, election and published list, and compare them.

    ``session`` must be started; ``prefix`` is the Redis key prefix
    (``discovery:<cluster>``). The ZooKeeper and Redis reads run concurrently.

    Raises:
        ZkError: a ZooKeeper read failed (ZkConnectionError if unreachable).
        RedisOperationError: a Redis read failed (RedisUnavailableError if unreachable).
    """
    (
        contenders,
        (search_servers, search_invalid),
        (data_servers, data_invalid),
        (heartbeat, published),
    ) = await _gather_first_error(
        read_contenders(session),
        read_directory(session, SEARCH_MEMBERS_PATH),
        read_directory(session, DATA_SERVERS_PATH),
        read_redis(redis, prefix),
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
    )
    differences = compare(data_servers, elected, heartbeat, published)
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


# -- connecting ---------------------------------------------------------------------


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***``, for messages."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


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
    except BaseException:
        await client.aclose()
        raise
    return client


async def fetch_status(zk: ZkConfig, cluster: ClusterConfig) -> ClusterStatus:
    """Connect to ZooKeeper and Redis (concurrently), collect the status, disconnect.

    Raises:
        StatusError: one line per system that could not be reached or read, naming it
            and where (Redis passwords are not shown).
    """
    redis_where = redact_url(cluster.redis_url)
    zk_result, redis_result = await asyncio.gather(
        _open_zk(zk), _open_redis(cluster), return_exceptions=True
    )
    try:
        failures: list[str] = []
        for what, where, result in (
            ("ZooKeeper", zk.hosts, zk_result),
            ("Redis", redis_where, redis_result),
        ):
            if isinstance(result, BaseException):
                if not isinstance(result, Exception):
                    raise result  # KeyboardInterrupt, CancelledError
                failures.append(f"cannot reach {what} at {where}: {_one_line(result)}")
        if failures:
            raise StatusError("\n".join(failures))
        assert isinstance(zk_result, ZkSession)
        assert isinstance(redis_result, aioredis.Redis)
        try:
            return await collect_status(zk_result, redis_result, cluster.redis_prefix)
        except ZkError as exc:
            raise StatusError(f"cannot read ZooKeeper at {zk.hosts}: {_one_line(exc)}") from exc
        except (RedisOperationError, RedisAccessError) as exc:
            raise StatusError(f"cannot read Redis at {redis_where}: {_one_line(exc)}") from exc
    finally:
        if isinstance(zk_result, ZkSession):
            await zk_result.aclose()
        if isinstance(redis_result, aioredis.Redis):
            await redis_result.aclose()


# -- text output --------------------------------------------------------------------


def _when(ms: int) -> str:
    stamp = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.") + f"{stamp.microsecond // 1000:03d}Z"


def _seconds(ms: int) -> str:
    return f"{ms / 1000:.1f}s"


def _plain(value: object) -> str:
    return json.dumps(value) if isinstance(value, bool) or value is None else str(value)


def _state(instance: ServiceInstance) -> str:
    state = instance.payload.state.value
    if not instance.enabled and state == "serving":
        state += " (disabled)"
    if instance.payload.reason:
        state += f" ({instance.payload.reason})"
    return state


def format_text(status: ClusterStatus) -> str:
    """The compact, human-readable report (the command's output without ``--json``)."""
    lines: list[str] = [
        f"cluster {status.prefix}  zookeeper {status.zookeeper}  redis {status.redis}"
    ]
    leader = status.leader
    if leader is None:
        lines.append("leader     none (no search server in the election)")
    else:
        count = len(status.contenders)
        contenders = f"{count} contender" + ("" if count == 1 else "s")
        lines.append(f"leader     {leader.id}  epoch {leader.czxid}  ({contenders})")
    heartbeat = status.heartbeat
    if heartbeat is None:
        lines.append("heartbeat  missing: no leader is publishing")
    elif heartbeat.error is not None:
        lines.append(f"heartbeat  unreadable: {heartbeat.error}")
    else:
        ttl = (
            "no expiry" if heartbeat.ttl_ms is None else f"expires in {_seconds(heartbeat.ttl_ms)}"
        )
        lines.append(
            f"heartbeat  {heartbeat.leader}  epoch {heartbeat.epoch}  version {heartbeat.version}"
            f"  {ttl}"
        )
    live = status.published.live
    if live is None:
        lines.append(f"published  {status.published.error}")
    else:
        age = status.published_age_ms or 0
        lines.append(
            f"published  version {live.version}  epoch {live.epoch}  by {live.leader}  "
            f"at {_when(live.published_at)}  age {_seconds(age)}  {len(live.servers)} servers"
        )
        lines.extend(f"           skipped {problem}" for problem in status.published.skipped)
    members = ", ".join(f"{i.id} ({i.address}:{i.port})" for i in _by_id(status.search_servers))
    lines.append(f"search servers ({len(status.search_servers)}): {members or '-'}")
    lines.extend(f"  invalid {k}: {v}" for k, v in sorted(status.search_servers_invalid.items()))

    shards = status.shards()
    diff = status.differences
    unpublished = set(diff.registered_not_published)
    mismatched = {m.id for m in diff.mismatched}
    lines.append(f"data servers ({len(status.data_servers)} in {len(shards)} shards):")
    width = max((len(i) for i in status.data_servers), default=0)
    for shard, servers in shards.items():
        lines.append(f"  shard {shard}")
        for instance in servers:
            note = ""
            if instance.id in unpublished:
                note = "  [not published]"
            elif instance.id in mismatched:
                note = "  [differs from published]"
            address = f"{instance.address}:{instance.port}"
            lines.append(
                f"    {instance.id:<{width}}  {address:<21}  r{instance.payload.replica}"
                f"  {_state(instance)}{note}"
            )
    if status.data_servers_invalid:
        lines.append("  invalid")
        lines.extend(f"    {k}: {v}" for k, v in sorted(status.data_servers_invalid.items()))

    if diff.in_sync:
        lines.append("differences: none")
        return "\n".join(lines)
    lines.append("differences:")
    if diff.no_leader:
        lines.append("  no leader elected")
    if diff.heartbeat_missing:
        lines.append("  heartbeat missing: no leader is publishing")
    if diff.published_missing:
        lines.append(f"  published list {status.published.error}")
    lines.extend(f"  leader mismatch: {m}" for m in diff.leader_mismatch)
    if diff.registered_not_published:
        lines.append(f"  registered, not published: {', '.join(diff.registered_not_published)}")
    if diff.published_not_registered:
        lines.append(f"  published, not registered: {', '.join(diff.published_not_registered)}")
    for mismatch in diff.mismatched:
        changes = ", ".join(
            f"{name} {_plain(registered)} -> {_plain(published)}"
            for name, (registered, published) in sorted(mismatch.fields.items())
        )
        lines.append(f"  differs {mismatch.id} (registered -> published): {changes}")
    return "\n".join(lines)


# -- the subcommand -----------------------------------------------------------------


def _status_options() -> tuple[Option, ...]:
    zk = tuple(
        dataclasses.replace(o, default=CONNECT_TIMEOUT) if o.flag == "--zk-connect-timeout" else o
        for o in ZK_OPTIONS
    )
    # --log-level is the ``discovery`` command's own (see below).
    common = tuple(o for o in COMMON_OPTIONS if o.flag != "--log-level")
    return (*zk, *common)


def add_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    """Register ``status`` on the ``discovery`` command's subparsers; returns its parser."""
    parser = subparsers.add_parser(
        "status",
        help="show registered servers, the leader, the published live list and differences",
        description=(
            "Read the cluster once from ZooKeeper and Redis: the elected leader and its "
            "epoch, the registered search and data servers (by shard), the published live "
            "list and its age, and every difference between what is registered and what "
            "is published. Exit status 0 when both could be read, 1 when ZooKeeper or Redis "
            "cannot be reached or read."
        ),
    )
    add_options(parser, _status_options())
    level = next(o for o in COMMON_OPTIONS if o.flag == "--log-level")
    parser.add_argument(
        level.flag,
        dest=level.dest,
        type=level.type,
        # SUPPRESS: not given here, the value parsed by ``discovery --log-level`` (or
        # its environment default) stands instead of being overwritten by ours.
        default=argparse.SUPPRESS,
        help=f"{level.help} (as `discovery --log-level`) [env {level.env}; default INFO]",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print one JSON document (stable keys) instead of text",
    )
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Print the status; 0 if ZooKeeper and Redis were read, 1 if not, 2 on bad settings."""
    try:
        zk = ZkConfig(
            hosts=args.zk,
            session_timeout=args.session_timeout,
            connect_timeout=args.zk_connect_timeout,
            # Each read, too, gets an answer within the connect timeout or fails.
            operation_timeout=args.zk_connect_timeout,
            auth=args.zk_auth,
        )
        cluster = ClusterConfig.from_args(args)
    except DiscoveryError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr, flush=True)
        return 2
    try:
        status = asyncio.run(fetch_status(zk, cluster))
    except StatusError as exc:
        for line in str(exc).splitlines():
            print(f"{PROG}: {line}", file=sys.stderr, flush=True)
        return 1
    if args.json:
        print(json.dumps(status.to_dict(), sort_keys=True, indent=2), flush=True)
    else:
        print(format_text(status), flush=True)
    return 0
