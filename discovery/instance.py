"""The ``ServiceInstance`` document of ``/data_servers/<id>``, in Apache Curator's JSON layout.

Decoding and the constructors validate every field and raise
:class:`~discovery.errors.InvalidInstanceError` naming it (``payload.shard``), or
:class:`~discovery.errors.PayloadTooLargeError` past :data:`MAX_INSTANCE_BYTES`; an
instance that exists is always encodable. Nothing here logs or does I/O.

Contract: docs/contracts.md, "The registration document".
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import re
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final, NoReturn

from discovery.address import validate_address
from discovery.errors import InvalidInstanceError, PayloadTooLargeError

__all__ = [
    "DEFAULT_SERVICE_TYPE",
    "DEFAULT_WEIGHT",
    "MAX_ADDRESS_LENGTH",
    "MAX_GROUP_LENGTH",
    "MAX_ID_LENGTH",
    "MAX_INSTANCE_BYTES",
    "MAX_WEIGHT",
    "MAX_ZONE_LENGTH",
    "MIN_WEIGHT",
    "SERVICE_TYPES",
    "InstancePayload",
    "InstanceState",
    "ServiceInstance",
    "validate_group",
    "validate_instance_id",
    "validate_weight",
    "validate_zone",
]

MAX_INSTANCE_BYTES: Final = 64 * 1024
"""Upper bound, in bytes of UTF-8 JSON, of one ServiceInstance document."""

MAX_ID_LENGTH: Final = 128
MAX_ADDRESS_LENGTH: Final = 253
"""Longest ``address`` (a DNS name; IP literals are shorter): see :mod:`discovery.address`."""

MAX_ZONE_LENGTH: Final = 64
"""Longest ``payload.zone``; zones are short names like ``eu-west-1b``."""
MAX_GROUP_LENGTH: Final = MAX_ZONE_LENGTH
"""Longest ``payload.group``; groups are short names like ``g1`` or ``copy-a``, under the
same rule as zones."""
MIN_WEIGHT: Final = 1
MAX_WEIGHT: Final = 1000
DEFAULT_WEIGHT: Final = 100
"""``payload.weight`` when absent: a replica's share of its shard's traffic is its
weight over the sum of the weights of the shard's replicas."""

DEFAULT_SERVICE_TYPE: Final = "DYNAMIC"
SERVICE_TYPES: Final = frozenset({"DYNAMIC", "STATIC", "PERMANENT", "DYNAMIC_SEQUENTIAL"})
"""The values of Curator's ``ServiceType`` enum."""

# Java readers deserialize these fields into int/long; a value they cannot hold
# would make the node unreadable for them, so we refuse to write or accept it.
_JAVA_INT_MAX: Final = 2**31 - 1
_JAVA_LONG_MAX: Final = 2**63 - 1

# Bounds the recursion of our own validator; json.loads has its own limit, which
# is far higher than any sane payload needs.
_MAX_NESTING: Final = 64

# Messages end up in logs and metrics' neighbours; a field path is cut beyond this.
_MAX_PATH_IN_MESSAGE: Final = 120

_ID_PATTERN: Final = re.compile(rf"[A-Za-z0-9._:@-]{{1,{MAX_ID_LENGTH}}}")
# Zones and groups end up in metric labels, log lines and the dashboard: keep them plain.
_NAME_PATTERN: Final = re.compile(rf"[A-Za-z0-9._:-]{{1,{MAX_ZONE_LENGTH}}}")
_CLASS_KEY: Final = "@class"
_PAYLOAD_KEYS: Final = (
    "shard",
    "replica",
    "docs",
    "version",
    "state",
    "reason",
    "zone",
    "weight",
    "group",
)
_REQUIRED_PAYLOAD_KEYS: Final = ("shard", "replica", "docs", "version", "state")
_REQUIRED_KEYS: Final = ("name", "id", "address", "port", "payload", "registrationTimeUTC")


class InstanceState(StrEnum):
    """What the data server asks of the search servers.

    ``DRAINING`` means "finish what you sent me, send nothing new": the node stays
    registered so operators can see it, but it is not routable. (The project's search
    servers may still send it a request of last resort, when every routable replica
    of its shard has been tried or is ejected: it answers until its grace ends.)
    ``MAINTENANCE`` is set by the leader, not by the data server: an operator's
    persistent marker (``/maintenance/<id>``, :mod:`discovery.zk.maintenance`) keeps the
    server listed but unroutable, whatever its own node says, until the marker is
    cleared.
    """

    SERVING = "serving"
    DRAINING = "draining"
    MAINTENANCE = "maintenance"


# By value, for decoding: a dict look-up, not the enum's own (which raises to say no).
_STATES: Final = {state.value: state for state in InstanceState}


class _FrozenJSONObject(Mapping[str, Any]):
    """Read-only view of a validated, privately owned JSON object.

    Used instead of ``types.MappingProxyType`` because instances must stay
    picklable and deep-copyable. Nested containers are private copies too; they
    are not frozen, so callers must treat them as read-only.
    """

    __slots__ = ("_data",)

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return repr(self._data)


# The empty ``extra`` of nearly every payload, shared: it is read-only.
_NO_EXTRA: Final = _FrozenJSONObject({})


def _fail(field_name: str, problem: str) -> NoReturn:
    if len(field_name) > _MAX_PATH_IN_MESSAGE:
        # A path 64 levels deep with long keys; its start names the field.
        field_name = f"{field_name[: _MAX_PATH_IN_MESSAGE - 30]}...{field_name[-27:]}"
    raise InvalidInstanceError(f"invalid ServiceInstance: {field_name}: {problem}")


def _short(value: object, limit: int = 60) -> str:
    # Messages end up in logs; a 60 KiB string must not.
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, list | tuple):
        return "array"
    return f"Python {type(value).__name__}"


def _describe(value: object) -> str:
    return f"{_json_type(value)} {_short(value)}"


def _require_int(field_name: str, value: object, low: int, high: int) -> int:
    # The common case first: a leader decodes every registration on a full read, and
    # these checks run six times for each.
    if type(value) is int and low <= value <= high:
        return value
    # bool is an int subclass in Python but a distinct type in JSON and Java.
    if isinstance(value, bool) or not isinstance(value, int):
        _fail(field_name, f"must be an integer, got {_describe(value)}")
    if not low <= value <= high:
        _fail(field_name, f"must be between {low} and {high}, got {value}")
    return int(value)


def _check_unicode(field_name: str, value: str) -> None:
    # A lone surrogate (possible via a "\ud800" JSON escape) cannot be written
    # back as UTF-8; catching it here keeps to_json() infallible.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        _fail(field_name, "contains a lone surrogate, which is not valid Unicode text")


def _require_str(
    field_name: str, value: object, *, non_empty: bool = False, max_length: int | None = None
) -> str:
    if (
        type(value) is str
        and value.isascii()  # no lone surrogate in ASCII: no encoding needed to know
        and (value or not non_empty)
        and (max_length is None or len(value) <= max_length)
    ):
        return value
    if not isinstance(value, str):
        _fail(field_name, f"must be a string, got {_describe(value)}")
    if non_empty and not value:
        _fail(field_name, "must not be empty")
    if max_length is not None and len(value) > max_length:
        _fail(field_name, f"must be at most {max_length} characters, got {len(value)}")
    _check_unicode(field_name, value)
    return str(value)


def _plain_json(path: str, value: object, depth: int = 0) -> Any:
    """Return a private deep copy of ``value`` made of plain JSON types, or fail."""
    if depth > _MAX_NESTING:
        _fail(path, f"is nested deeper than {_MAX_NESTING} levels")
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            _fail(path, f"must be a finite number, got {value!r}")
        return float(value)
    if isinstance(value, str):
        _check_unicode(path, value)
        return str(value)
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                _fail(path, f"object keys must be strings, got {_describe(key)}")
            _check_unicode(path, key)
            out[key] = _plain_json(f"{path}.{_short(key, 40)[1:-1]}", item, depth + 1)
        return out
    if isinstance(value, list | tuple):
        return [_plain_json(f"{path}[{i}]", item, depth + 1) for i, item in enumerate(value)]
    _fail(path, f"must be a JSON value, got {_describe(value)}")


def _coerce_state(field_name: str, value: object) -> InstanceState:
    if isinstance(value, InstanceState):
        return value
    if isinstance(value, str):
        state = _STATES.get(value)
        if state is not None:
            return state
    allowed = ", ".join(repr(s.value) for s in InstanceState)
    _fail(field_name, f"must be one of {allowed}, got {_describe(value)}")


def _freeze_extra(value: object) -> _FrozenJSONObject:
    if not value and type(value) is dict:
        return _NO_EXTRA  # what nearly every payload has: nothing beyond our fields
    if not isinstance(value, Mapping):
        _fail("payload", f"extra must be a mapping, got {_describe(value)}")
    for key in value:
        if key in _PAYLOAD_KEYS:
            # Two sources for one field would make the written document depend
            # on dict order; make the caller choose.
            _fail(f"payload.{key}", "is a named payload field and must not appear in extra")
    plain: dict[str, Any] = _plain_json("payload", value)
    if _CLASS_KEY in plain and not isinstance(plain[_CLASS_KEY], str):
        _fail(f"payload.{_CLASS_KEY}", f"must be a string, got {_describe(plain[_CLASS_KEY])}")
    return _FrozenJSONObject(plain)


def _freeze_uri_spec(value: object) -> _FrozenJSONObject | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        _fail("uriSpec", f"must be an object or null, got {_describe(value)}")
    plain: dict[str, Any] = _plain_json("uriSpec", value)
    if "parts" not in plain:
        _fail("uriSpec.parts", "required field is missing")
    parts = plain["parts"]
    if not isinstance(parts, list):
        _fail("uriSpec.parts", f"must be an array, got {_describe(parts)}")
    for index, part in enumerate(parts):
        where = f"uriSpec.parts[{index}]"
        if not isinstance(part, dict):
            _fail(where, f"must be an object, got {_describe(part)}")
        if not isinstance(part.get("value"), str):
            _fail(f"{where}.value", f"must be a string, got {_describe(part.get('value'))}")
        if not isinstance(part.get("variable"), bool):
            _fail(f"{where}.variable", f"must be a boolean, got {_describe(part.get('variable'))}")
    return _FrozenJSONObject(plain)


def validate_instance_id(value: object) -> str:
    """Return ``value`` if it is usable as an instance id, else raise.

    An id is the znode name under ``/data_servers``: 1..128 characters of
    ``[A-Za-z0-9._:@-]``, and not ``.`` or ``..`` (which ZooKeeper rejects).
    Raises :class:`InvalidInstanceError` naming the field ``id``.
    """
    if not isinstance(value, str):
        _fail("id", f"must be a string, got {_describe(value)}")
    if _ID_PATTERN.fullmatch(value) is None or value in (".", ".."):
        _fail(
            "id",
            f"must be 1..{MAX_ID_LENGTH} characters of [A-Za-z0-9._:@-], not '.' or '..' "
            f"(it is a ZooKeeper node name), got {_short(value)}",
        )
    return value


def validate_zone(value: object, field_name: str = "payload.zone") -> str:
    """Return ``value`` if it is a usable zone name, else raise.

    A zone is 1..64 characters of ``[A-Za-z0-9._:-]`` (``eu-west-1b``,
    ``dc1:rack-7``). Raises :class:`InvalidInstanceError` naming ``field_name``;
    configuration parsers pass their flag's name instead.
    """
    return _validate_name(value, field_name)


def validate_group(value: object, field_name: str = "payload.group") -> str:
    """Return ``value`` if it is a usable replica group name, else raise.

    A group follows the zone's rule: 1..64 characters of ``[A-Za-z0-9._:-]`` (``g1``,
    ``copy-a``). Raises :class:`InvalidInstanceError` naming ``field_name``;
    configuration parsers pass their flag's name instead.
    """
    return _validate_name(value, field_name)


def _validate_name(value: object, field_name: str) -> str:
    """The rule of zones and groups: a short plain name (they end up in metric labels,
    log lines and the dashboard)."""
    if not isinstance(value, str):
        _fail(field_name, f"must be a string, got {_describe(value)}")
    if _NAME_PATTERN.fullmatch(value) is None:
        _fail(
            field_name,
            f"must be 1..{MAX_ZONE_LENGTH} characters of [A-Za-z0-9._:-], got {_short(value)}",
        )
    return value


def validate_weight(value: object, field_name: str = "payload.weight") -> int:
    """Return ``value`` if it is a usable weight (an integer 1..1000, not a bool), else raise.

    Raises :class:`InvalidInstanceError` naming ``field_name``.
    """
    return _require_int(field_name, value, MIN_WEIGHT, MAX_WEIGHT)


@dataclass(frozen=True, slots=True)
class InstancePayload:
    """Our fields inside the Curator ``payload`` object.

    ``shard`` and ``replica`` are Java ints (0..2**31-1), ``docs`` a Java long
    (>= 0). ``reason`` is written only when not ``None``. ``zone`` (``None``: no
    zone; else see :func:`validate_zone`) is written only when set, and
    ``weight`` (an integer 1..1000, the replica's relative share of its shard's
    traffic) only when it is not :data:`DEFAULT_WEIGHT`. ``group`` (``None``: no
    group; else see :func:`validate_group`), the replica group the server belongs to
    (one copy of the whole corpus, one replica of each shard), is written only when
    set, after ``weight``. ``extra`` holds every
    other payload key (including Jackson's ``"@class"``) and is written back
    unchanged; it must not repeat a named field. The constructor validates
    everything and raises :class:`InvalidInstanceError` naming the field.
    """

    shard: int
    replica: int
    docs: int
    version: str
    state: InstanceState
    reason: str | None = None
    zone: str | None = None
    weight: int = DEFAULT_WEIGHT
    group: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        # object.__setattr__ because the dataclass is frozen; normalising here
        # (int subclasses to int, "serving" to InstanceState.SERVING, extra to a
        # private read-only copy) keeps equality and encoding canonical.
        set_ = object.__setattr__
        set_(self, "shard", _require_int("payload.shard", self.shard, 0, _JAVA_INT_MAX))
        set_(self, "replica", _require_int("payload.replica", self.replica, 0, _JAVA_INT_MAX))
        set_(self, "docs", _require_int("payload.docs", self.docs, 0, _JAVA_LONG_MAX))
        # Interned: the same few versions, reasons, zones and groups across a fleet are one
        # string each, not one per registration (some 150 bytes a server at 50,000).
        set_(self, "version", sys.intern(_require_str("payload.version", self.version)))
        set_(self, "state", _coerce_state("payload.state", self.state))
        if self.reason is not None:
            set_(self, "reason", sys.intern(_require_str("payload.reason", self.reason)))
        if self.zone is not None:
            set_(self, "zone", sys.intern(str(validate_zone(self.zone))))
        set_(self, "weight", validate_weight(self.weight))
        if self.group is not None:
            set_(self, "group", sys.intern(str(validate_group(self.group))))
        set_(self, "extra", _freeze_extra(self.extra))

    def to_dict(self) -> dict[str, Any]:
        """Return the payload as a fresh JSON-ready dict in the order we write it."""
        out: dict[str, Any] = {}
        if _CLASS_KEY in self.extra:
            # Jackson writes the type id before the properties; so do we, so a
            # payload that came from Java re-encodes byte for byte.
            out[_CLASS_KEY] = self.extra[_CLASS_KEY]
        out["shard"] = self.shard
        out["replica"] = self.replica
        out["docs"] = self.docs
        out["version"] = self.version
        out["state"] = self.state.value
        if self.reason is not None:
            out["reason"] = self.reason
        if self.zone is not None:
            out["zone"] = self.zone
        if self.weight != DEFAULT_WEIGHT:
            # The default is left out so that a document without a weight (a Curator
            # writer's, or our first release's) re-encodes byte for byte.
            out["weight"] = self.weight
        if self.group is not None:
            # Last of ours: where a Java payload class that adds the field after the
            # others writes it, so that its documents re-encode byte for byte.
            out["group"] = self.group
        for key, value in self.extra.items():
            if key != _CLASS_KEY:
                out[key] = copy.deepcopy(value)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> InstancePayload:
        """Build a payload from a decoded JSON object.

        Raises :class:`InvalidInstanceError` if ``data`` is not an object, a
        required field is missing, or a field is invalid. ``"reason": null``
        is read as no reason, ``"zone": null`` and ``"group": null`` (or none) as no
        zone and no group, and
        ``"weight": null`` (or none) as :data:`DEFAULT_WEIGHT`: Jackson writes
        an unset ``String`` or ``Integer`` field of a Java payload as ``null``.
        """
        if type(data) is not dict and not isinstance(data, Mapping):
            _fail("payload", f"must be an object, got {_describe(data)}")
        for key in _REQUIRED_PAYLOAD_KEYS:
            if key not in data:
                _fail(f"payload.{key}", "required field is missing")
        return cls(
            shard=data["shard"],
            replica=data["replica"],
            docs=data["docs"],
            version=data["version"],
            state=data["state"],
            reason=data.get("reason"),
            zone=data.get("zone"),
            weight=DEFAULT_WEIGHT if data.get("weight") is None else data["weight"],
            group=data.get("group"),
            extra={k: v for k, v in data.items() if k not in _PAYLOAD_KEYS},
        )


@dataclass(frozen=True, slots=True)
class ServiceInstance:
    """One registered data server, as Curator's ``ServiceInstance<T>``.

    ``registration_time_utc`` is in milliseconds since the epoch. ``uri_spec``
    is Curator's ``UriSpec`` as JSON (``{"parts":[{"value":..,"variable":..}]}``)
    or ``None``. ``enabled=False`` tells Curator clients (and us) not to route to
    the instance. The constructor validates every field and raises
    :class:`InvalidInstanceError` naming it by its JSON name (``sslPort``,
    ``registrationTimeUTC``, ...).
    """

    name: str
    id: str
    address: str
    port: int
    ssl_port: int | None
    payload: InstancePayload
    registration_time_utc: int
    service_type: str = DEFAULT_SERVICE_TYPE
    uri_spec: Mapping[str, Any] | None = field(default=None, hash=False)
    enabled: bool = True

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "name", sys.intern(_require_str("name", self.name, non_empty=True)))
        set_(self, "id", validate_instance_id(self.id))
        # Where every search server connects: an IP literal or an ASCII DNS name, never
        # link-local, multicast or unspecified (discovery.address).
        set_(self, "address", validate_address(self.address))
        set_(self, "port", _require_int("port", self.port, 1, 65535))
        if self.ssl_port is not None:
            set_(self, "ssl_port", _require_int("sslPort", self.ssl_port, 1, 65535))
        if not isinstance(self.payload, InstancePayload):
            _fail(
                "payload",
                f"must be an InstancePayload, got {_describe(self.payload)} "
                "(use InstancePayload.from_dict for a decoded object)",
            )
        set_(
            self,
            "registration_time_utc",
            _require_int("registrationTimeUTC", self.registration_time_utc, 0, _JAVA_LONG_MAX),
        )
        if not isinstance(self.service_type, str) or self.service_type not in SERVICE_TYPES:
            allowed = ", ".join(sorted(SERVICE_TYPES))
            _fail("serviceType", f"must be one of {allowed}, got {_describe(self.service_type)}")
        set_(self, "service_type", sys.intern(str(self.service_type)))
        set_(self, "uri_spec", _freeze_uri_spec(self.uri_spec))
        if not isinstance(self.enabled, bool):
            _fail("enabled", f"must be a boolean, got {_describe(self.enabled)}")

    @classmethod
    def create(
        cls,
        name: str,
        id: str,
        address: str,
        port: int,
        payload: InstancePayload,
        *,
        ssl_port: int | None = None,
        service_type: str = DEFAULT_SERVICE_TYPE,
        uri_spec: Mapping[str, Any] | None = None,
        enabled: bool | None = None,
        clock: Callable[[], float] = time.time,
    ) -> ServiceInstance:
        """Build a new registration stamped with ``clock()`` (seconds) as milliseconds.

        ``enabled`` defaults to whether ``payload.state`` is serving, keeping the
        drain contract. Raises :class:`InvalidInstanceError` for invalid fields or
        a clock that returns something other than a finite, non-negative number.
        """
        now = clock()
        if (
            isinstance(now, bool)
            or not isinstance(now, int | float)
            or not math.isfinite(now)
            or now < 0
        ):
            _fail("registrationTimeUTC", f"clock() returned {_describe(now)}")
        if enabled is None and isinstance(payload, InstancePayload):
            enabled = payload.state is InstanceState.SERVING
        return cls(
            name=name,
            id=id,
            address=address,
            port=port,
            ssl_port=ssl_port,
            payload=payload,
            registration_time_utc=int(now * 1000),
            service_type=service_type,
            uri_spec=uri_spec,
            enabled=True if enabled is None else enabled,
        )

    @property
    def zone(self) -> str | None:
        """The data server's zone (``payload.zone``); ``None`` when it has none."""
        return self.payload.zone

    @property
    def group(self) -> str | None:
        """The data server's replica group (``payload.group``); ``None`` when it has none."""
        return self.payload.group

    @property
    def weight(self) -> int:
        """The data server's weight (``payload.weight``), 1..1000, 100 when unset."""
        return self.payload.weight

    @property
    def routable(self) -> bool:
        """Whether a search server may send queries here: enabled and serving."""
        return self.enabled and self.payload.state is InstanceState.SERVING

    def with_state(self, state: InstanceState | str, reason: str | None = None) -> ServiceInstance:
        """Return a copy in ``state`` with ``reason`` (``None`` clears it).

        Draining also sets ``enabled=False`` and serving sets ``enabled=True``,
        so Curator clients, which only look at ``enabled``, stop and resume
        routing with us. Raises :class:`InvalidInstanceError` for an unknown
        state or a non-string reason.
        """
        new_state = _coerce_state("payload.state", state)
        payload = dataclasses.replace(self.payload, state=new_state, reason=reason)
        return dataclasses.replace(
            self, payload=payload, enabled=new_state is InstanceState.SERVING
        )

    def to_dict(self) -> dict[str, Any]:
        """Return a fresh JSON-ready dict with Curator's field names and order."""
        return {
            "name": self.name,
            "id": self.id,
            "address": self.address,
            "port": self.port,
            "sslPort": self.ssl_port,
            "payload": self.payload.to_dict(),
            "registrationTimeUTC": self.registration_time_utc,
            "serviceType": self.service_type,
            "uriSpec": None if self.uri_spec is None else copy.deepcopy(dict(self.uri_spec)),
            "enabled": self.enabled,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ServiceInstance:
        """Build an instance from a decoded JSON object (no size bound applies).

        Unknown top-level keys are ignored; unknown payload keys are kept.
        Raises :class:`InvalidInstanceError` naming the first bad field.
        """
        if type(data) is not dict and not isinstance(data, Mapping):
            _fail("document", f"top level must be an object, got {_json_type(data)}")
        for key in _REQUIRED_KEYS:
            if key not in data:
                _fail(key, "required field is missing")
        return cls(
            name=data["name"],
            id=data["id"],
            address=data["address"],
            port=data["port"],
            ssl_port=data.get("sslPort"),
            payload=InstancePayload.from_dict(data["payload"]),
            registration_time_utc=data["registrationTimeUTC"],
            # Present-but-null is an error (Curator never writes it); absent is
            # an older or compatibility-mode writer.
            service_type=data.get("serviceType", DEFAULT_SERVICE_TYPE),
            uri_spec=data.get("uriSpec"),
            enabled=data.get("enabled", True),
        )

    def to_json(self, *, max_bytes: int = MAX_INSTANCE_BYTES) -> bytes:
        """Encode as compact UTF-8 JSON in Curator's field order.

        Raises :class:`PayloadTooLargeError` if the result exceeds ``max_bytes``.
        """
        text = json.dumps(
            self.to_dict(), separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
        raw = text.encode("utf-8")
        if len(raw) > max_bytes:
            raise PayloadTooLargeError(
                f"ServiceInstance {self.id!r} encodes to {len(raw)} bytes, "
                f"more than the bound of {max_bytes} bytes (reduce payload.extra or reason)"
            )
        return raw

    @classmethod
    def from_json(
        cls, data: bytes | str, *, max_bytes: int = MAX_INSTANCE_BYTES
    ) -> ServiceInstance:
        """Decode a znode's data.

        Raises :class:`PayloadTooLargeError` before parsing if ``data`` is larger
        than ``max_bytes``, and :class:`InvalidInstanceError` if it is not UTF-8,
        not JSON (including ``NaN``/``Infinity`` and duplicate keys), not an
        object at the top level, or has an invalid field.
        """
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
            raise ValueError(f"max_bytes must be a positive integer, got {max_bytes!r}")
        raw = _document_bytes(data, max_bytes)
        if len(raw) > max_bytes:
            raise PayloadTooLargeError(
                f"ServiceInstance document is {len(raw)} bytes, "
                f"more than the bound of {max_bytes} bytes"
            )
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidInstanceError(
                f"invalid ServiceInstance: document is not valid UTF-8 ({exc.reason} "
                f"at byte {exc.start})"
            ) from exc
        if not text.strip():
            _fail("document", "is empty")
        try:
            # The common case, in C but for one hook per object: a leader decodes every
            # registration on a full read (50,000 at a time), so this path counts.
            decoded = _FAST_DECODER.decode(text)
        except InvalidInstanceError:
            raise
        except (_SlowPath, ValueError, RecursionError):
            # NaN, an over-long integer, bad JSON, deep nesting: the slow path below
            # finds it again and names where.
            decoded = cls._decode_slowly(text)
        return cls.from_dict(decoded)

    @staticmethod
    def _decode_slowly(text: str) -> Any:
        """``text`` as JSON, with every token we refuse reported by the field it is in.

        Raises:
            InvalidInstanceError: naming the field of the first unusable token, or the
                place of a syntax error.
        """
        unusable: list[_Unusable] = []
        try:
            decoded = json.loads(
                text,
                object_pairs_hook=_object_without_duplicates,
                parse_constant=lambda token: _unusable(
                    unusable, f"{token} is not valid JSON (non-finite numbers are not allowed)"
                ),
                parse_int=lambda digits: _bounded_int(unusable, digits),
            )
        except InvalidInstanceError:
            raise
        except json.JSONDecodeError as exc:
            raise InvalidInstanceError(
                f"invalid ServiceInstance: document is not valid JSON: {exc.msg} "
                f"(line {exc.lineno}, column {exc.colno})"
            ) from exc
        except RecursionError as exc:
            raise InvalidInstanceError(
                "invalid ServiceInstance: document is nested too deeply"
            ) from exc
        except ValueError as exc:
            # e.g. an integer literal longer than Python's int digit limit
            raise InvalidInstanceError(
                f"invalid ServiceInstance: document is not usable JSON: {exc}"
            ) from exc
        if unusable:
            # Found while parsing, reported with the place it was found.
            _fail(*_locate_unusable(decoded, unusable[0]))
        return decoded


class _SlowPath(Exception):
    """A token the fast decoder does not take (``NaN``, ``Infinity``): decode again the
    slow way, which names its field."""


def _refuse_constant(token: str) -> NoReturn:
    raise _SlowPath(token)


def _document_bytes(data: object, max_bytes: int) -> bytes:
    if isinstance(data, bytes):
        return data
    if isinstance(data, bytearray | memoryview):
        return bytes(data)
    if isinstance(data, str):
        # Each character is at least one UTF-8 byte, so this check cannot
        # reject a document that fits, and it avoids encoding a huge string.
        if len(data) > max_bytes:
            raise PayloadTooLargeError(
                f"ServiceInstance document is at least {len(data)} bytes, "
                f"more than the bound of {max_bytes} bytes"
            )
        try:
            return data.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidInstanceError(
                "invalid ServiceInstance: document contains a lone surrogate, "
                "which is not valid Unicode text"
            ) from exc
    if data is None:
        _fail("document", "is empty (the znode has no data)")
    _fail("document", f"must be bytes or str, got Python {type(data).__name__}")


def _object_without_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                # Readers disagree on which duplicate wins; refuse to guess.
                _fail(_key_name(key), "appears more than once in one JSON object")
            seen.add(key)
    return out


def _key_name(key: str) -> str:
    # A key as it appears in a field path: bounded, and with any lone surrogate
    # escaped (repr does that), so the message itself is always valid text.
    return _short(key, 40)[1:-1]


class _Unusable:
    """Stands in for a JSON token we refuse (``NaN``, an over-long integer) until the
    whole document is parsed and the token's path can be named."""

    __slots__ = ("problem",)

    def __init__(self, problem: str) -> None:
        self.problem = problem


def _unusable(found: list[_Unusable], problem: str) -> _Unusable:
    marker = _Unusable(problem)
    found.append(marker)
    return marker


def _bounded_int(found: list[_Unusable], digits: str) -> int | _Unusable:
    # int() refuses literals over the digit limit with a ValueError that cannot say
    # where; check first and let the caller name the field.
    limit = sys.get_int_max_str_digits()
    if limit and len(digits.lstrip("-")) > limit:
        return _unusable(
            found,
            f"is not usable JSON: an integer of {len(digits.lstrip('-'))} digits "
            f"(more than {limit})",
        )
    return int(digits)


def _locate_unusable(decoded: object, first: _Unusable) -> tuple[str, str]:
    """The path and problem of the first :class:`_Unusable` in ``decoded``, in
    document order. Iterative: the parsed document may be nested hundreds deep."""
    stack: list[tuple[str, object]] = [("", decoded)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, _Unusable):
            return path or "document", value.problem
        if isinstance(value, dict):
            children = [
                (f"{path}.{_key_name(key)}" if path else _key_name(key), item)
                for key, item in value.items()
            ]
        elif isinstance(value, list):
            children = [(f"{path}[{index}]", item) for index, item in enumerate(value)]
        else:
            continue
        stack.extend(reversed(children))
    return "document", first.problem


# Integers are parsed by the C scanner here: one over Python's digit limit raises
# ValueError, which sends the document down the slow path.
_FAST_DECODER: Final = json.JSONDecoder(
    object_pairs_hook=_object_without_duplicates, parse_constant=_refuse_constant
)
