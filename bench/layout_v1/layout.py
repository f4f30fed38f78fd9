"""Layout version 1 of the live list in Redis (the benchmarks' baseline): keys and documents.

The product's layout writes only what changed; this one rewrites the whole list. The
writer is :mod:`layout_v1.publisher`, the reader :mod:`layout_v1.reader`. Under the key
prefix ``P`` (``discovery:<cluster>``, no hash tag):

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
  with ``P:live`` by the fence script (:data:`layout_v1.publisher.FENCE_SCRIPT`), so
  the fence check never decodes a multi-megabyte snapshot (:data:`FENCE_SCRIPT` of
  :mod:`layout_v1.publisher`).

Documents are compact UTF-8 JSON (:func:`encode_json`); decoders
(:func:`parse_snapshot`, :func:`parse_event`, :func:`parse_heartbeat`,
:func:`parse_fence`) accept any bytes and report what they cannot use as
:class:`~discovery.errors.MalformedLiveListError`, never another exception. The
heartbeat's document, error translation and JSON encoding are layout 2's
(:mod:`discovery.livelist.redis.layout`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from discovery.errors import InvalidInstanceError, MalformedLiveListError
from discovery.instance import ServiceInstance
from discovery.livelist.model import LiveList
from discovery.livelist.redis.layout import parse_position, short_repr

__all__ = ["ChangeEvent", "V1Keys", "parse_event", "parse_fence", "parse_snapshot"]


@dataclass(frozen=True)
class V1Keys:
    """The Redis names of one cluster's live list in layout 1, from its key prefix."""

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
    try:
        return parse_position(stored)
    except MalformedLiveListError:
        return None
