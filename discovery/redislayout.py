"""The Redis contract of the live list, layout version 1: key names, documents, errors.

Everything that writes or reads the list in Redis spells it through this module: the
writer (:mod:`discovery.publisher`), the reader (:mod:`discovery.livelist`),
``discovery status`` and the chaos run. Under the key prefix ``P``
(``discovery:<cluster>``, :attr:`~discovery.config.ClusterConfig.redis_prefix`):

* ``P:live`` — the whole list, one JSON string:
  ``{"epoch":E,"version":V,"leader":"<id>","published_at":<ms>,"servers":[...]}``
  with ``servers`` sorted by id, each a ServiceInstance in Curator's layout
  (:meth:`~discovery.instance.ServiceInstance.to_dict`). Draining servers are
  included (``payload.state`` ``draining``, ``enabled`` false); readers route only
  to :attr:`~discovery.instance.ServiceInstance.routable` instances.
* ``P:events`` — a pub/sub channel; one message per accepted publish:
  ``{"epoch":E,"version":V,"prev_version":V0|null,"leader":"<id>","published_at":<ms>,
  "full":bool,"added":[...],"changed":[...],"removed":[{"id":..,"reason":..}]}``.
  ``full: true`` (``prev_version`` null, empty lists) says "a whole new snapshot was
  written: refetch ``P:live``"; otherwise the message is a diff that turns exactly
  version ``prev_version`` of the same epoch into version ``V``.
* ``P:leader`` — the heartbeat, ``{"leader":"<id>","epoch":E,"version":V,"at":<ms>}``,
  written with a TTL (``SET PX``), so readers can tell that nobody is publishing.
* ``P:fence`` — **internal**: a hash ``{epoch, version, writer, leader}`` kept in step
  with ``P:live`` by the fence script (:data:`discovery.publisher.FENCE_SCRIPT`), so
  the fence check never decodes a multi-megabyte snapshot.

Documents are compact UTF-8 JSON (:func:`encode_json`); decoders
(:func:`parse_snapshot`, :func:`parse_event`, :func:`parse_heartbeat`,
:func:`parse_fence`) accept any bytes and report what they cannot use as
:class:`~discovery.errors.MalformedLiveListError` (or, for the heartbeat, in the value),
never another exception. redis-py errors become our tree through
:func:`translate_redis_error`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, NoReturn

import redis.exceptions as redis_errors

from .errors import (
    InvalidInstanceError,
    MalformedLiveListError,
    RedisAccessError,
    RedisAuthError,
    RedisOperationError,
    RedisPermissionError,
    RedisUnavailableError,
)
from .instance import ServiceInstance
from .store import LiveList

__all__ = [
    "ChangeEvent",
    "Heartbeat",
    "RedisKeys",
    "encode_json",
    "parse_event",
    "parse_fence",
    "parse_heartbeat",
    "parse_snapshot",
    "short_repr",
    "translate_redis_error",
]

_LOG_LIMIT: Final = 200


@dataclass(frozen=True)
class RedisKeys:
    """The Redis names of one cluster's live list, from its key prefix."""

    prefix: str

    def __post_init__(self) -> None:
        if not isinstance(self.prefix, str) or not self.prefix:
            raise ValueError(
                f"the Redis key prefix must be a non-empty string, got {self.prefix!r}"
            )

    @property
    def live(self) -> str:
        """The snapshot (a JSON string)."""
        return f"{self.prefix}:live"

    @property
    def events(self) -> str:
        """The pub/sub channel of change events."""
        return f"{self.prefix}:events"

    @property
    def leader(self) -> str:
        """The leader's heartbeat (a JSON string with a TTL)."""
        return f"{self.prefix}:leader"

    @property
    def fence(self) -> str:
        """Internal: the hash ``{epoch, version, writer, leader}`` of the stored snapshot."""
        return f"{self.prefix}:fence"


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
class ChangeEvent:
    """One message of ``P:events``: a diff that turns ``prev_version`` of the same epoch
    into ``version`` (``upserts`` added or changed, ``removed`` ids), or, when ``full``,
    the notice that a whole new snapshot was written."""

    epoch: int
    version: int
    prev_version: int | None
    leader: str
    published_at: int
    full: bool
    upserts: tuple[ServiceInstance, ...]
    removed: tuple[str, ...]


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
# "... can't access at least one of the keys ...", "... can't publish to the channel");
# later versions say "no permissions". Matched on the text, as redis-py has no class.
_SCRIPT_ACL_DENIALS = ("the user executing the script can't", "no permissions to")


def translate_redis_error(exc: BaseException) -> RedisOperationError | RedisAccessError:
    """Map a redis-py (or socket) error onto our tree; the caller chains the original.

    Connection loss, timeouts, a server still loading its data or a read-only replica
    become :class:`RedisUnavailableError`; refused credentials
    :class:`~discovery.errors.RedisAuthError` and an ACL refusal (NOPERM, also from
    within the fence script) :class:`~discovery.errors.RedisPermissionError`, both
    :class:`~discovery.errors.RedisAccessError`, which retrying cannot fix; anything
    else (an unexpected error reply) :class:`RedisOperationError`.
    """
    message = f"Redis: {type(exc).__name__}: {exc}".rstrip(": ")
    if isinstance(exc, _AUTH_FAILED):
        return RedisAuthError(
            f"Redis refused our credentials ({exc}); check the Redis user and password"
        )
    if isinstance(exc, redis_errors.NoPermissionError) or (
        isinstance(exc, redis_errors.ResponseError)
        and any(text in str(exc).lower() for text in _SCRIPT_ACL_DENIALS)
    ):
        return RedisPermissionError(
            f"Redis ACL refused the command ({exc}); the Redis user lacks a permission"
        )
    if isinstance(exc, _UNAVAILABLE):
        return RedisUnavailableError(message)
    return RedisOperationError(message)


def encode_json(document: Mapping[str, Any]) -> bytes:
    """Compact UTF-8 JSON, as every document of the Redis layout is written."""
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode(
        "utf-8"
    )


def short_repr(value: object) -> str:
    """``repr(value)``, cut to a length fit for a log line or an error message."""
    text = repr(value)
    return text if len(text) <= _LOG_LIMIT else text[: _LOG_LIMIT - 3] + "..."


def _malformed(message: str, position: tuple[int, int] | None = None) -> NoReturn:
    raise MalformedLiveListError(message, position)


def _reject_constant(token: str) -> NoReturn:
    _malformed(f"{token} is not valid JSON")


def _decode(raw: bytes | str, what: str) -> dict[str, Any]:
    try:
        document = json.loads(raw, parse_constant=_reject_constant)
    except MalformedLiveListError:
        raise
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, bad UTF-8, too deep
        _malformed(f"{what} is not valid JSON: {exc}")
    if not isinstance(document, dict):
        _malformed(f"{what} is not a JSON object")
    return document


def _integer(document: Mapping[str, Any], key: str, what: str, low: int = 0) -> int:
    value = document.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        _malformed(f"{what}: {key} must be an integer >= {low}, got {short_repr(value)}")
    return value


def parse_snapshot(raw: bytes | str) -> tuple[LiveList, list[str]]:
    """Decode ``P:live``; returns the list and the problems of skipped server entries.

    A malformed server entry is skipped alone (one entry a reader cannot decode must not
    freeze routing on an old list).

    Raises:
        MalformedLiveListError: the document itself is not a snapshot of the layout.
    """
    document = _decode(raw, "snapshot")
    epoch = _integer(document, "epoch", "snapshot")
    version = _integer(document, "version", "snapshot")
    position = (epoch, version)
    leader = document.get("leader")
    if not isinstance(leader, str):
        _malformed(f"snapshot: leader must be a string, got {short_repr(leader)}", position)
    published_at = _integer(document, "published_at", "snapshot")
    entries = document.get("servers")
    if not isinstance(entries, list):
        _malformed(f"snapshot: servers must be an array, got {short_repr(entries)}", position)
    servers: dict[str, ServiceInstance] = {}
    problems: list[str] = []
    for index, entry in enumerate(entries):
        try:
            instance = ServiceInstance.from_dict(entry)
        except InvalidInstanceError as exc:
            problems.append(f"servers[{index}]: {exc}")
            continue
        if instance.id in servers:
            problems.append(f"servers[{index}]: duplicate id {instance.id!r}")
            continue
        servers[instance.id] = instance
    return LiveList(epoch, version, leader, published_at, servers), problems


def parse_event(raw: bytes | str) -> ChangeEvent:
    """Decode one ``P:events`` message.

    Raises:
        MalformedLiveListError: not an event of the layout, or an entry that is not a
            valid ServiceInstance (applying the rest would give a list no version had);
            ``position`` is set when the epoch and version were readable.
    """
    document = _decode(raw, "event")
    epoch = _integer(document, "epoch", "event")
    version = _integer(document, "version", "event", low=1)
    position = (epoch, version)
    try:
        full = document.get("full")
        if not isinstance(full, bool):
            _malformed(f"full must be a boolean, got {short_repr(full)}")
        prev = document.get("prev_version")
        if prev is not None and (isinstance(prev, bool) or not isinstance(prev, int)):
            _malformed(f"prev_version must be an integer or null, got {short_repr(prev)}")
        if not full and prev is None:
            _malformed("a diff event needs a prev_version")
        leader = document.get("leader")
        if not isinstance(leader, str):
            _malformed(f"leader must be a string, got {short_repr(leader)}")
        published_at = _integer(document, "published_at", "event")
        upserts: list[ServiceInstance] = []
        for key in ("added", "changed"):
            entries = document.get(key, [])
            if not isinstance(entries, list):
                _malformed(f"{key} must be an array, got {short_repr(entries)}")
            for entry in entries:
                try:
                    upserts.append(ServiceInstance.from_dict(entry))
                except InvalidInstanceError as exc:
                    # Applying the rest would leave us with a list no version ever had.
                    _malformed(f"{key}: {exc}")
        removed: list[str] = []
        entries = document.get("removed", [])
        if not isinstance(entries, list):
            _malformed(f"removed must be an array, got {short_repr(entries)}")
        for entry in entries:
            rid = entry.get("id") if isinstance(entry, dict) else None
            if not isinstance(rid, str):
                _malformed(f"removed entries must be objects with an id, got {short_repr(entry)}")
            removed.append(rid)
    except MalformedLiveListError as exc:
        raise MalformedLiveListError(
            f"event epoch {epoch} version {version}: {exc}", position
        ) from None
    return ChangeEvent(
        epoch, version, prev, leader, published_at, full, tuple(upserts), tuple(removed)
    )


def parse_fence(stored: list[Any]) -> tuple[int, int] | None:
    """``(epoch, version)`` from ``HMGET P:fence epoch version``; None if unusable."""
    if len(stored) != 2 or stored[0] is None or stored[1] is None:
        return None
    try:
        epoch, version = (int(v.decode() if isinstance(v, bytes) else v) for v in stored)
    except (ValueError, UnicodeDecodeError):
        return None
    return (epoch, version)


def _optional_int(document: Mapping[str, Any], key: str) -> int | None:
    value = document.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def parse_heartbeat(raw: bytes | str, ttl_ms: int) -> Heartbeat:
    """Decode ``P:leader`` and its ``PTTL`` (-1: no expiry); a bad document is reported
    in :attr:`Heartbeat.error`, never raised."""
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
