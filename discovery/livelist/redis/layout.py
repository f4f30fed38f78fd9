"""The Redis contract of the live list, layout version 2: key names, records, errors.

Everything that writes or reads the list in Redis spells it through this module. Its
decoders report what they cannot use as :class:`~discovery.errors.MalformedLiveListError`
(or in the value), never another exception; :func:`translate_redis_error` maps redis-py's.

Contract: docs/contracts.md, "Redis".
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, NoReturn

import redis.asyncio as aioredis
import redis.exceptions as redis_errors

from discovery.errors import (
    InvalidInstanceError,
    MalformedLiveListError,
    MalformedMetaError,
    PayloadTooLargeError,
    RedisAccessError,
    RedisAuthError,
    RedisOperationError,
    RedisPermissionError,
    RedisUnavailableError,
)
from discovery.instance import ServiceInstance
from discovery.livelist.admin import Heartbeat, Meta

__all__ = [
    "FIRST_STREAM_ID",
    "MAX_NUMBER",
    "META_NUMBERS",
    "ChangeEntry",
    "Heartbeat",
    "Loaded",
    "Meta",
    "RedisKeys",
    "encode_json",
    "load",
    "parse_change",
    "parse_generation",
    "parse_heartbeat",
    "parse_meta",
    "parse_meta_numbers",
    "parse_number",
    "parse_position",
    "parse_servers",
    "reply_text",
    "short_repr",
    "translate_redis_error",
]

_LOG_LIMIT: Final = 200

MAX_NUMBER: Final = 2**63 - 1
"""The largest number of the layout: epochs are ZooKeeper zxids, Java longs."""
_MAX_DIGITS: Final = len(str(MAX_NUMBER))
# P:leader is a document of about 100 bytes; anything much larger is not ours, and
# json.loads would spend time and memory on it for nothing.
_MAX_HEARTBEAT_BYTES: Final = 4096

FIRST_STREAM_ID: Final = "0-0"
"""The stream id before every entry: follow from here when nothing was loaded."""


@dataclass(frozen=True)
class RedisKeys:
    """The Redis names of one cluster's live list (layout 2), from its key prefix."""

    prefix: str

    def __post_init__(self) -> None:
        if not isinstance(self.prefix, str) or not self.prefix:
            raise ValueError(
                f"the Redis key prefix must be a non-empty string, got {self.prefix!r}"
            )

    @property
    def servers(self) -> str:
        """The hash of instances by id."""
        return f"{self.prefix}:servers"

    @property
    def meta(self) -> str:
        """The hash ``{epoch, version, leader, published_at, count, writer}``."""
        return f"{self.prefix}:meta"

    @property
    def changes(self) -> str:
        """The stream of publishes."""
        return f"{self.prefix}:changes"

    @property
    def leader(self) -> str:
        """The leader's heartbeat (a JSON string with a TTL)."""
        return f"{self.prefix}:leader"

    @property
    def all(self) -> tuple[str, str, str, str]:
        """Every key, in the order the publish script takes them."""
        return (self.servers, self.meta, self.changes, self.leader)


@dataclass(frozen=True)
class ChangeEntry:
    """One entry of ``P:changes``.

    A ``delta`` turns version ``prev`` of ``epoch`` into ``version``: ``upserts`` are
    added or replaced, ``removes`` (id, reason) taken out. A ``full`` entry says the
    whole list was rewritten; it has no instances. ``fence`` is the fence generation
    of ``P:meta`` when the entry was written (None in entries of earlier releases).
    """

    stream_id: str
    epoch: int
    version: int
    prev: int
    kind: str
    leader: str
    published_at: int
    upserts: tuple[ServiceInstance, ...]
    removes: tuple[tuple[str, str], ...]
    fence: int | None = None

    @property
    def position(self) -> tuple[int, int]:
        return (self.epoch, self.version)

    @property
    def full(self) -> bool:
        return self.kind == "full"


_UNAVAILABLE = (
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
    redis_errors.BusyLoadingError,
    redis_errors.ReadOnlyError,
    redis_errors.TryAgainError,
    redis_errors.ClusterDownError,
    redis_errors.MaxConnectionsError,
    OSError,
    TimeoutError,
)
# Wrong credentials are a ConnectionError in redis-py but no outage: waiting will not fix it.
_AUTH_FAILED = (
    redis_errors.AuthenticationError,
    redis_errors.AuthorizationError,
    redis_errors.AuthenticationWrongNumberOfArgsError,
)
# A command refused by the ACL inside a script is no NOPERM reply in Redis 7.0 but an
# ERR naming the script ("The user executing the script can't run this command ...",
# "... can't access at least one of the keys ..."); later versions say "no
# permissions". Matched on the text, as redis-py has no class.
_SCRIPT_ACL_DENIALS = ("the user executing the script can't", "no permissions to")
# A replica promoted while a write was on its way, or a cluster slot on the move: the
# same write succeeds on the new owner, so these are outages, not bugs.
_TRANSIENT_REPLIES = ("readonly ", "moved ", "ask ", "tryagain", "clusterdown", "loading ")


def translate_redis_error(exc: BaseException) -> RedisOperationError | RedisAccessError:
    """Map a redis-py (or socket) error onto our tree; the caller chains the original.

    Connection loss, timeouts, a server still loading its data, a read-only replica
    (a failover in progress) or no known primary become
    :class:`RedisUnavailableError`; refused credentials
    :class:`~discovery.errors.RedisAuthError` and an ACL refusal (NOPERM, also from
    within a script) :class:`~discovery.errors.RedisPermissionError`, both
    :class:`~discovery.errors.RedisAccessError`, which retrying cannot fix; anything
    else (an unexpected error reply) :class:`RedisOperationError`.
    """
    message = f"Redis: {type(exc).__name__}: {exc}".rstrip(": ")
    if isinstance(exc, _AUTH_FAILED):
        return RedisAuthError(
            f"Redis refused our credentials ({exc}); check the Redis user and password"
        )
    text = str(exc).lower()
    if isinstance(exc, redis_errors.NoPermissionError) or (
        isinstance(exc, redis_errors.ResponseError)
        and any(denial in text for denial in _SCRIPT_ACL_DENIALS)
    ):
        return RedisPermissionError(
            f"Redis ACL refused the command ({exc}); the Redis user lacks a permission"
        )
    if isinstance(exc, _UNAVAILABLE) or (
        isinstance(exc, redis_errors.ResponseError)
        and any(reply in text for reply in _TRANSIENT_REPLIES)
    ):
        return RedisUnavailableError(message)
    return RedisOperationError(message)


def encode_json(document: Mapping[str, Any] | Sequence[Any]) -> bytes:
    """Compact UTF-8 JSON, as every document of the Redis layout is written."""
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode(
        "utf-8"
    )


def short_repr(value: object) -> str:
    """``repr(value)``, cut to a length fit for a log line or an error message.

    A long string or bytes value is cut before ``repr`` sees it: what Redis returned
    may be megabytes.
    """
    if isinstance(value, str | bytes) and len(value) > _LOG_LIMIT:
        value = value[:_LOG_LIMIT]
    text = repr(value)
    return text if len(text) <= _LOG_LIMIT else text[: _LOG_LIMIT - 3] + "..."


def reply_text(value: object) -> str:
    """A Redis reply item as text: bytes decoded (undecodable bytes replaced), anything
    else through ``str`` (clients made with ``decode_responses`` give str already)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def parse_number(raw: object, name: str, low: int = 0) -> int:
    """A number of the layout from a Redis reply item (bytes, str, or anything else).

    Canonical decimal digits (no sign, blank or leading zero), ``low`` ..
    :data:`MAX_NUMBER`. The length is checked before ``int()``: a value of 5,000
    digits is refused like one of 20, without reaching Python's digit limit.

    Raises:
        MalformedLiveListError: anything else, naming ``name``.
    """
    text = _text(raw)
    if (
        text is None
        or not 0 < len(text) <= _MAX_DIGITS
        or not text.isascii()
        or not text.isdigit()
        or (len(text) > 1 and text[0] == "0")
    ):
        _malformed(
            f"{name} must be a decimal integer in {low}..{MAX_NUMBER}, got {short_repr(raw)}"
        )
    value = int(text)
    if not low <= value <= MAX_NUMBER:
        _malformed(f"{name} must be in {low}..{MAX_NUMBER}, got {value}")
    return value


def parse_position(stored: Sequence[Any]) -> tuple[int, int] | None:
    """``(epoch, version)`` from ``HMGET <hash> epoch version``.

    Returns None if either is absent (nothing stored).

    Raises:
        MalformedLiveListError: either is present but not a number of the layout.
    """
    if len(stored) != 2:
        _malformed(f"expected an epoch and a version, got {short_repr(stored)}")
    if stored[0] is None or stored[1] is None:
        return None
    return (parse_number(stored[0], "epoch"), parse_number(stored[1], "version"))


META_NUMBERS: Final = ("epoch", "version", "fence", "published_at", "count")
"""The number fields of ``P:meta``, in the order :func:`parse_meta_numbers` reads them."""


def parse_meta_numbers(stored: Sequence[Any]) -> tuple[tuple[int, int], int] | None:
    """``((epoch, version), fence)`` from ``HMGET P:meta`` of :data:`META_NUMBERS`.

    Returns None if ``epoch`` or ``version`` is absent (nothing stored). Every field
    present is checked, so a reader that checks its version this way refuses what a
    load would refuse.

    Raises:
        MalformedLiveListError: a field present is not a number of the layout.
    """
    if len(stored) != len(META_NUMBERS):
        _malformed(f"expected {', '.join(META_NUMBERS)}, got {short_repr(stored)}")
    position = parse_position(stored[:2])
    if position is None:
        return None
    for name, raw in zip(META_NUMBERS[3:], stored[3:], strict=True):
        if raw is not None:
            parse_number(raw, name)
    return position, parse_generation(stored[2])


def parse_generation(raw: object) -> int:
    """The fence generation from ``HGET P:meta fence`` (absent: 0).

    Raises:
        MalformedLiveListError: present but not a number of the layout.
    """
    return 0 if raw is None else parse_number(raw, "fence")


def _malformed(message: str, position: tuple[int, int] | None = None) -> NoReturn:
    raise MalformedLiveListError(message, position)


def _text(value: object) -> str | None:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return value if isinstance(value, str) else None


def _field(fields: Mapping[Any, Any], name: str) -> object:
    # redis-py gives bytes keys unless the client decodes responses.
    value = fields.get(name.encode())
    return fields.get(name) if value is None else value


def _natural(fields: Mapping[Any, Any], name: str, what: str, low: int = 0) -> int:
    return parse_number(_field(fields, name), f"{what}: {name}", low)


def _optional_natural(fields: Mapping[Any, Any], name: str, what: str) -> int | None:
    return None if _field(fields, name) is None else _natural(fields, name, what)


def parse_meta(fields: Mapping[Any, Any]) -> Meta | None:
    """Decode ``HGETALL P:meta``; None when the hash is empty (nothing published).

    ``published_at``, ``count`` and ``fence`` may be absent (0).

    Raises:
        MalformedLiveListError: ``epoch`` or ``version`` is missing, or a number
            field is not a number of the layout (see :func:`parse_number`).
    """
    if not fields:
        return None
    epoch = _natural(fields, "epoch", "meta")
    version = _natural(fields, "version", "meta")
    position = (epoch, version)
    try:
        published_at = _optional_natural(fields, "published_at", "meta") or 0
        count = _optional_natural(fields, "count", "meta") or 0
        fence = _optional_natural(fields, "fence", "meta") or 0
    except MalformedLiveListError as exc:
        raise MalformedLiveListError(str(exc), position) from None
    return Meta(
        epoch,
        version,
        _text(_field(fields, "leader")) or "",
        published_at,
        count,
        _text(_field(fields, "writer")) or "",
        fence,
    )


def parse_servers(fields: Mapping[Any, Any]) -> tuple[dict[str, ServiceInstance], list[str]]:
    """Decode ``HGETALL P:servers``: the instances by id, and the problems of those skipped.

    A malformed entry (bad JSON, not an instance, an id that is not its field) is
    skipped alone: one entry a reader cannot decode must not freeze routing on an old
    list.
    """
    servers: dict[str, ServiceInstance] = {}
    problems: list[str] = []
    for raw_id, raw in fields.items():
        instance_id = _text(raw_id)
        if instance_id is None:
            problems.append(f"field {short_repr(raw_id)}: not UTF-8")
            continue
        try:
            instance = ServiceInstance.from_json(raw)
        except (InvalidInstanceError, PayloadTooLargeError) as exc:
            problems.append(f"{instance_id}: {exc}")
            continue
        if instance.id != instance_id:
            problems.append(f"{instance_id}: holds the instance {instance.id!r}")
            continue
        servers[instance_id] = instance
    return servers, problems


def _json_array(raw: object, name: str) -> list[Any]:
    text = _text(raw)
    if text is None:
        _malformed(f"{name} is missing or not UTF-8")
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        _malformed(f"{name} is not valid JSON: {exc}")
    if not isinstance(value, list):
        _malformed(f"{name} must be a JSON array, got {short_repr(value)}")
    return value


def parse_change(stream_id: object, fields: Mapping[Any, Any]) -> ChangeEntry:
    """Decode one ``P:changes`` entry.

    Raises:
        MalformedLiveListError: not an entry of the layout, or an instance that is not
            valid (applying the rest would give a list no version had); ``position``
            is set when the epoch and version were readable.
    """
    sid = _text(stream_id) or ""
    epoch = _natural(fields, "epoch", "change")
    version = _natural(fields, "version", "change", low=1)
    position = (epoch, version)
    try:
        kind = _text(_field(fields, "kind"))
        if kind not in ("full", "delta"):
            _malformed(f"kind must be full or delta, got {short_repr(kind)}")
        prev = _natural(fields, "prev", "change")
        if kind == "delta" and prev >= version:
            _malformed(f"a delta must follow an earlier version, got prev {prev}")
        published_at = _natural(fields, "published_at", "change")
        fence = _optional_natural(fields, "fence", "change")
        upserts: list[ServiceInstance] = []
        removes: list[tuple[str, str]] = []
        if kind == "delta":
            for entry in _json_array(_field(fields, "upserts"), "upserts"):
                try:
                    upserts.append(ServiceInstance.from_dict(entry))
                except InvalidInstanceError as exc:
                    _malformed(f"upserts: {exc}")
            for entry in _json_array(_field(fields, "removes"), "removes"):
                rid = entry.get("id") if isinstance(entry, dict) else None
                if not isinstance(rid, str):
                    _malformed(
                        f"removes entries must be objects with an id, got {short_repr(entry)}"
                    )
                reason = entry.get("reason")
                removes.append((rid, reason if isinstance(reason, str) else "unknown"))
    except MalformedLiveListError as exc:
        raise MalformedLiveListError(
            f"change {sid} (epoch {epoch} version {version}): {exc}", position
        ) from None
    return ChangeEntry(
        sid,
        epoch,
        version,
        prev,
        kind,
        _text(_field(fields, "leader")) or "",
        published_at,
        tuple(upserts),
        tuple(removes),
        fence,
    )


@dataclass(frozen=True)
class Loaded:
    """What :func:`load` read in one step: ``meta`` (None if nothing is published), the
    decoded ``servers``, the ``problems`` of entries skipped, and ``stream_id``, the
    id of the last entry of ``P:changes`` then (follow from the one after it)."""

    meta: Meta | None
    servers: dict[str, ServiceInstance]
    problems: list[str]
    stream_id: str


#: Tries of the checked read (:func:`load` on a Redis out of memory) before giving up.
_CHECKED_READ_TRIES = 3


async def load(redis: aioredis.Redis, keys: RedisKeys) -> Loaded:
    """Read ``P:meta``, ``P:servers`` and the last stream id consistently (MULTI/EXEC).

    One transaction is atomic on a single Redis, behind Sentinel and, as every key of
    a cluster shares one hash slot, on Redis Cluster. Read-only: a reader needs no
    write permission and it may run on a replica.

    A Redis over ``maxmemory`` with ``noeviction`` refuses every command queued in a
    transaction, reads included (the queue itself would take memory), while it still
    answers plain reads. Then the same reads go without MULTI, with ``P:meta`` read
    before and after: every publish rewrites ``P:meta`` in the same script, so equal
    records mean no publish came between (and none can, while writes are refused).

    Raises:
        redis.exceptions.RedisError, OSError: Redis failed (the caller translates).
        MalformedMetaError: ``P:meta`` is not a meta record of the layout (a
            :class:`~discovery.errors.MalformedLiveListError`); its ``stream_id`` is
            the stream's last id read in the same transaction.
    """
    try:
        async with redis.pipeline(transaction=True) as pipe:
            pipe.hgetall(keys.meta)
            pipe.hgetall(keys.servers)
            pipe.xrevrange(keys.changes, count=1)
            meta_fields, server_fields, last = await pipe.execute()
    except redis_errors.OutOfMemoryError:
        meta_fields, server_fields, last = await _checked_read(redis, keys)
    return _loaded(keys, meta_fields, server_fields, last)


async def _checked_read(redis: aioredis.Redis, keys: RedisKeys) -> tuple[Any, Any, Any]:
    """:func:`load`'s reads without a transaction, ``P:meta`` read on both sides."""
    for _ in range(_CHECKED_READ_TRIES):
        async with redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(keys.meta)
            pipe.hgetall(keys.servers)
            pipe.xrevrange(keys.changes, count=1)
            pipe.hgetall(keys.meta)
            before, server_fields, last, after = await pipe.execute()
        if before == after:
            return before, server_fields, last
    raise redis_errors.ResponseError(
        f"{keys.meta} changed during each of {_CHECKED_READ_TRIES} reads without a "
        "transaction (Redis refuses transactions: out of memory)"
    )


def _loaded(keys: RedisKeys, meta_fields: Any, server_fields: Any, last: Any) -> Loaded:
    stream_id = (_text(last[0][0]) if last else None) or FIRST_STREAM_ID
    try:
        meta = parse_meta(meta_fields)
    except MalformedLiveListError as exc:
        raise MalformedMetaError(f"{keys.meta}: {exc}", exc.position, stream_id) from None
    servers, problems = parse_servers(server_fields)
    return Loaded(meta, servers, problems, stream_id)


def _optional_int(document: Mapping[str, Any], key: str, problems: list[str]) -> int | None:
    value = document.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        problems.append(f"{key} is not an integer: {short_repr(value)}")
        return None
    if not 0 <= value <= MAX_NUMBER:
        problems.append(f"{key} is not in 0..{MAX_NUMBER}: {short_repr(value)}")
        return None
    return value


def parse_heartbeat(raw: bytes | str, ttl_ms: int) -> Heartbeat:
    """Decode ``P:leader`` and its ``PTTL`` (-1: no expiry); a bad document is reported
    in :attr:`Heartbeat.error`, never raised.

    A document over 4 KiB is not parsed at all; a number outside the layout's bounds
    (``0..2**63-1``) is left out (None) and named in the error.
    """
    ttl = ttl_ms if ttl_ms >= 0 else None  # -1: no expiry set
    if len(raw) > _MAX_HEARTBEAT_BYTES:
        return Heartbeat(
            None, None, None, None, ttl, error=f"{len(raw)} bytes, over {_MAX_HEARTBEAT_BYTES}"
        )
    try:
        document = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        return Heartbeat(None, None, None, None, ttl, error=f"not valid JSON: {exc}")
    if not isinstance(document, dict):
        return Heartbeat(None, None, None, None, ttl, error="not a JSON object")
    leader = document.get("leader")
    problems: list[str] = []
    return Heartbeat(
        leader=leader if isinstance(leader, str) else None,
        epoch=_optional_int(document, "epoch", problems),
        version=_optional_int(document, "version", problems),
        at=_optional_int(document, "at", problems),
        ttl_ms=ttl,
        error="; ".join(problems) or None,
    )
