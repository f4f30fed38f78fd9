"""Property-based tests of every input boundary (hypothesis).

* The ServiceInstance codec (``discovery.instance``): valid instances round-trip
  byte for byte; anything else - arbitrary bytes, text, JSON values, a valid document
  with one field replaced - either decodes to a valid instance or raises
  ``InvalidInstanceError`` naming the field; never another exception.
* The ``/search`` parameters (``discovery.http.parse_search_params``) of both servers:
  any q, k, timeout_ms gives a result or a ``BadRequestError`` naming the parameter;
  whatever the search server accepts, every data server accepts when forwarded.
* The same over HTTP, against the real aiohttp applications served in-process on
  loopback (a data server with its index, no ZooKeeper; a search server that has not
  connected, which answers 503 "starting" once the parameters are valid): never a
  500; 400 answers are JSON naming the parameter and are counted on the server's
  own registry.
* ``POST /admin/fault`` and ``Fault.from_json``: any JSON (or non-JSON) body gives
  200 or a 400 naming the field.

Deterministic: every test uses ``derandomize=True`` and no example database, with
bounded example counts (the module runs in a few seconds).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import re
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from yarl import URL

from data_server.config import DEFAULT_SEARCH_TIMEOUT_MS, DataServerConfig
from data_server.config import MAX_TIMEOUT_MS as DATA_MAX_TIMEOUT_MS
from data_server.faults import Fault, FaultSpecError
from data_server.server import MAX_K as DATA_MAX_K
from data_server.server import DataServer
from discovery.address import address_problem
from discovery.adminauth import admin_headers
from discovery.config import AgentConfig, ClusterConfig, ZkConfig
from discovery.errors import (
    BadRequestError,
    DiscoveryError,
    InvalidInstanceError,
    PayloadTooLargeError,
)
from discovery.http import (
    MAX_BODY_BYTES,
    MAX_QUERY_BYTES,
    MAX_QUERY_LENGTH,
    parse_int,
    parse_json_body,
    parse_query_text,
    parse_search_params,
)
from discovery.instance import (
    MAX_INSTANCE_BYTES,
    SERVICE_TYPES,
    InstancePayload,
    InstanceState,
    ServiceInstance,
)
from search_server.config import SearchServerConfig
from search_server.server import MAX_K as SEARCH_MAX_K
from search_server.server import SearchServer
from tests.support import CURATOR_FIELD_ORDER

T = TypeVar("T")
E = TypeVar("E", bound=BaseException)


def outcome(call: Callable[[], T], error: type[E]) -> T | E:
    """``call()``'s result, or the ``error`` it raised (anything else propagates)."""
    try:
        return call()
    except error as exc:
        return exc


PURE = settings(derandomize=True, database=None, deadline=None, max_examples=150)
# Builds whole instances per example: fewer examples.
INSTANCE_PROPERTIES = settings(PURE, max_examples=100)
# Served over loopback: fewer examples, and the app is shared by a test's examples.
OVER_HTTP = settings(
    PURE,
    max_examples=60,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

SEARCH_PARAMETERS = {"q", "k", "timeout_ms"}
FAULT_FIELDS = {"body", "mode", "delay_ms", "rate", "block_loop", "duration_ms"}
REASONS = {
    "missing",
    "blank",
    "too_long",
    "not_unicode",
    "not_integer",
    "out_of_range",
}
# aiohttp's HTTP parser refuses longer request lines before any handler runs.
MAX_REQUEST_LINE = 8190
DEFAULT_TIMEOUT_MS, MAX_TIMEOUT_MS = 500, 10_000

# -- strategies -----------------------------------------------------------------------

# Text that can be encoded (no lone surrogates), and text that may not.
VALID_TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=30)
ANY_TEXT = st.text(max_size=30)
PAYLOAD_KEYS = {
    "shard",
    "replica",
    "docs",
    "version",
    "state",
    "reason",
    "zone",
    "weight",
    "group",
    "@class",
}

JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | VALID_TEXT
)
VALID_JSON = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(VALID_TEXT, inner, max_size=4),
    max_leaves=12,
)
# Everything json.dumps can write, standard or not: NaN, Infinity, lone surrogates.
ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**80), 2**80) | st.floats() | ANY_TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(ANY_TEXT, inner, max_size=4),
    max_leaves=12,
)

ZONES = st.from_regex(r"[A-Za-z0-9._:-]{1,64}", fullmatch=True)
GROUPS = ZONES  # the same rule
WEIGHTS = st.integers(1, 1000)

INSTANCE_IDS = st.from_regex(r"[A-Za-z0-9._:@-]{1,128}", fullmatch=True).filter(
    lambda s: s not in (".", "..")
)


@st.composite
def payloads(draw: st.DrawFn) -> InstancePayload:
    extra = draw(
        st.dictionaries(VALID_TEXT.filter(lambda k: k not in PAYLOAD_KEYS), VALID_JSON, max_size=3)
    )
    if draw(st.booleans()):
        extra["@class"] = draw(VALID_TEXT)
    return InstancePayload(
        shard=draw(st.integers(0, 2**31 - 1)),
        replica=draw(st.integers(0, 2**31 - 1)),
        docs=draw(st.integers(0, 2**63 - 1)),
        version=draw(VALID_TEXT),
        state=draw(st.sampled_from(InstanceState)),
        reason=draw(st.none() | VALID_TEXT),
        zone=draw(st.none() | ZONES),
        # The default is special (not written): draw it often.
        weight=draw(st.just(100) | WEIGHTS),
        group=draw(st.none() | GROUPS),
        extra=extra,
    )


URI_SPECS = st.none() | st.builds(
    lambda parts: {"parts": parts},
    st.lists(st.fixed_dictionaries({"value": VALID_TEXT, "variable": st.booleans()}), max_size=3),
)

# What a registration may name: IP literals the contract admits and ASCII DNS names.
_LABELS = st.from_regex(r"[A-Za-z0-9]([A-Za-z0-9-]{0,20}[A-Za-z0-9])?", fullmatch=True)
ADDRESSES = st.ip_addresses().map(str).filter(
    lambda text: address_problem(text) is None
) | st.lists(_LABELS, min_size=1, max_size=6).map(".".join).filter(
    lambda text: address_problem(text) is None
)

INSTANCES = st.builds(
    ServiceInstance,
    name=st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=20),
    id=INSTANCE_IDS,
    address=ADDRESSES,
    port=st.integers(1, 65535),
    ssl_port=st.none() | st.integers(1, 65535),
    payload=payloads(),
    registration_time_utc=st.integers(0, 2**63 - 1),
    service_type=st.sampled_from(sorted(SERVICE_TYPES)),
    uri_spec=URI_SPECS,
    enabled=st.booleans(),
)

# JSON field paths of a document, and where they live.
TOP_LEVEL_FIELDS = CURATOR_FIELD_ORDER
PAYLOAD_FIELDS = [
    "shard",
    "replica",
    "docs",
    "version",
    "state",
    "reason",
    "zone",
    "weight",
    "group",
]


# -- ServiceInstance ----------------------------------------------------------------


def decode_or_reject(data: bytes | str) -> ServiceInstance | None:
    """``from_json(data)``; None if rejected the documented way (anything else fails)."""
    instance = outcome(lambda: ServiceInstance.from_json(data), InvalidInstanceError)
    if isinstance(instance, InvalidInstanceError):
        message = str(instance)
        assert message.startswith(("invalid ServiceInstance: ", "ServiceInstance "))
        assert len(message) < 400  # values are shortened, never echoed whole
        message.encode("utf-8")  # the message itself is valid text (loggable)
        return None
    # Whatever is accepted is a valid instance that survives a round trip.
    assert (
        ServiceInstance.from_json(
            instance.to_json(max_bytes=4 * MAX_INSTANCE_BYTES), max_bytes=4 * MAX_INSTANCE_BYTES
        )
        == instance
    )
    return instance


@INSTANCE_PROPERTIES
@given(INSTANCES)
def test_any_valid_instance_round_trips_byte_for_byte(instance: ServiceInstance) -> None:
    raw = instance.to_json()
    decoded = ServiceInstance.from_json(raw)
    assert decoded == instance
    assert decoded.to_json() == raw
    assert ServiceInstance.from_json(raw.decode("utf-8")) == instance
    assert ServiceInstance.from_dict(json.loads(raw)) == instance


@INSTANCE_PROPERTIES
@given(INSTANCES)
def test_zone_weight_and_group_are_written_only_when_set(instance: ServiceInstance) -> None:
    payload = json.loads(instance.to_json())["payload"]
    assert payload.get("zone") == instance.zone
    assert ("zone" in payload) == (instance.zone is not None)
    assert payload.get("weight", 100) == instance.weight
    assert ("weight" in payload) == (instance.weight != 100)
    assert payload.get("group") == instance.group
    assert ("group" in payload) == (instance.group is not None)
    # Without the three fields, the same instance with the defaults.
    bare = {k: v for k, v in payload.items() if k not in ("zone", "weight", "group")}
    again = ServiceInstance.from_dict({**instance.to_dict(), "payload": bare})
    assert again.payload == dataclasses.replace(instance.payload, zone=None, weight=100, group=None)


@PURE
@given(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | ANY_TEXT,
    st.sampled_from(["zone", "weight", "group"]),
)
@example(value="", key="zone")
@example(value="", key="group")
@example(value="a b", key="group")
@example(value=7, key="group")
@example(value="a" * 65, key="zone")
@example(value="a\n", key="zone")
@example(value=0, key="weight")
@example(value=1001, key="weight")
@example(value=100.0, key="weight")
@example(value=True, key="weight")
def test_any_zone_weight_or_group_is_valid_or_rejected_naming_it(value: Any, key: str) -> None:
    doc = json.loads(
        _document(payload='{"shard":1,"replica":0,"docs":1,"version":"1","state":"serving"}')
    )
    doc["payload"][key] = value
    result = outcome(
        lambda: ServiceInstance.from_json(json.dumps(doc, allow_nan=True)), InvalidInstanceError
    )
    if isinstance(result, InvalidInstanceError):
        assert re.match(rf"invalid ServiceInstance: payload\.{key}: ", str(result)), result
        return
    if key in ("zone", "group"):
        assert getattr(result, key) == value
        assert value is None or re.fullmatch(r"[A-Za-z0-9._:-]{1,64}", value)
    else:
        assert result.weight == (100 if value is None else value)
        assert value is None or (type(value) is int and 1 <= value <= 1000)


@PURE
@given(st.binary(max_size=300))
@example(b"\xff\xfe{}")
@example(b"\x00")
@example(b"")
def test_arbitrary_bytes_decode_or_are_rejected(data: bytes) -> None:
    decode_or_reject(data)


@PURE
@given(st.text(max_size=300))
@example("\ud800")
@example('{"name":"\udfff"}')
def test_arbitrary_text_decodes_or_is_rejected(data: str) -> None:
    decode_or_reject(data)


@PURE
@given(ANY_JSON, st.booleans())
def test_arbitrary_json_values_decode_or_are_rejected(value: Any, ascii_only: bool) -> None:
    decode_or_reject(json.dumps(value, ensure_ascii=ascii_only, allow_nan=True))


@INSTANCE_PROPERTIES
@given(
    INSTANCES,
    st.sampled_from(
        [(name,) for name in TOP_LEVEL_FIELDS] + [("payload", name) for name in PAYLOAD_FIELDS]
    ),
    st.none() | ANY_JSON,
    st.booleans(),
    st.booleans(),
)
@example(
    instance=ServiceInstance.from_json(
        b'{"name":"data_servers","id":"ds-1","address":"10.0.0.1","port":9001,"sslPort":null,'
        b'"payload":{"shard":1,"replica":0,"docs":1,"version":"1","state":"serving"},'
        b'"registrationTimeUTC":1,"serviceType":"DYNAMIC","uriSpec":null,"enabled":true}'
    ),
    path=("payload", "shard"),
    value="3",
    delete=False,
    ascii_only=True,
)
def test_a_bad_field_is_rejected_naming_that_field(
    instance: ServiceInstance,
    path: tuple[str, ...],
    value: Any,
    delete: bool,
    ascii_only: bool,
) -> None:
    doc = instance.to_dict()
    parent = doc if len(path) == 1 else doc["payload"]
    if delete:
        parent.pop(path[-1], None)
    else:
        parent[path[-1]] = value
    field_name = ".".join(path)
    raw = json.dumps(doc, ensure_ascii=ascii_only, allow_nan=True)
    result = outcome(lambda: ServiceInstance.from_json(raw), InvalidInstanceError)
    if not isinstance(result, InvalidInstanceError):
        return  # the new value happens to be valid
    assert not isinstance(result, PayloadTooLargeError)
    message = str(result)
    # Non-ASCII output can carry a lone surrogate straight into the text, which is
    # refused for the whole document before any field is looked at.
    if not ascii_only and "document contains a lone surrogate" in message:
        return
    assert re.match(rf"invalid ServiceInstance: {re.escape(field_name)}[:.\[]", message), (
        f"{message} does not name {field_name}"
    )


@PURE
@given(st.text(max_size=140).filter(lambda s: re.fullmatch(r"[A-Za-z0-9._:@-]{1,128}", s) is None))
@example("ds-ü")
@example("ds\u0000")
@example("ds-\ud800")
@example("")
@example("x" * 129)
def test_an_id_that_is_no_znode_name_is_rejected(bad_id: str) -> None:
    doc = {
        "name": "data_servers",
        "id": bad_id,
        "address": "10.0.0.1",
        "port": 9001,
        "payload": {"shard": 0, "replica": 0, "docs": 0, "version": "1", "state": "serving"},
        "registrationTimeUTC": 0,
    }
    with pytest.raises(InvalidInstanceError, match=r"^invalid ServiceInstance: id: "):
        ServiceInstance.from_dict(doc)
    with pytest.raises(InvalidInstanceError):
        ServiceInstance.from_json(json.dumps(doc))


def _document(**changes: str) -> bytes:
    """A valid document with raw JSON text substituted for some fields' values."""
    fields = {
        "name": '"data_servers"',
        "id": '"ds-1"',
        "address": '"10.0.0.1"',
        "port": "9001",
        "payload": '{"shard":1,"replica":0,"docs":1,"version":"1","state":"serving"}',
        "registrationTimeUTC": "1",
    }
    fields.update(changes)
    return ("{" + ",".join(f'"{k}":{v}' for k, v in fields.items()) + "}").encode()


_PAYLOAD_WITH_X = '{"shard":1,"replica":0,"docs":1,"version":"1","state":"serving","x":X}'


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (_document(port="NaN"), "port: NaN is not valid JSON"),
        (_document(port="-Infinity"), "port: -Infinity is not valid JSON"),
        (_document(port="1e400"), "port: must be an integer, got number inf"),
        (_document(port="9" * 5000), "port: is not usable JSON: an integer of 5000 digits"),
        (_document(port="9" * 30), "port: must be between 1 and 65535"),
        (_document(port="9001.0"), "port: must be an integer, got number 9001.0"),
        (_document(port="true"), "port: must be an integer, got boolean True"),
        (_document(registrationTimeUTC=str(2**63)), "registrationTimeUTC: must be between"),
        (
            _document(payload='{"shard":"3","replica":0,"docs":1,"version":"1","state":"serving"}'),
            "payload.shard: must be an integer, got string '3'",
        ),
        (
            _document(payload='{"shard":1,"replica":0,"docs":1,"version":"1","state":"up"}'),
            "payload.state: must be one of",
        ),
        (
            _document(
                payload='{"shard":1,"replica":0,"docs":1,"version":"1","state":"serving",'
                '"x":[1,{"y":NaN}]}'
            ),
            "payload.x[1].y: NaN is not valid JSON",
        ),
        (
            _document(
                payload='{"shard":1,"replica":0,"docs":1,"version":"1","state":"serving",'
                '"x":' + "[" * 100 + "]" * 100 + "}"
            ),
            "payload.x[0][0][0][0]",
        ),
        (_document(address='"10.0.0.1\\ud800"'), "address: must be an IP address"),
        (_document(name='"\\udfff"'), "name: contains a lone surrogate"),
        (_document(id='"ds-\\u00fc"'), "id: must be 1..128 characters"),
        (_document(id='"ds-1","id":"ds-2"'), "id: appears more than once"),
        (_document(uriSpec='{"parts":[{"value":1,"variable":true}]}'), "uriSpec.parts[0].value"),
        (_document(enabled='"yes"'), "enabled: must be a boolean"),
        (_document(sslPort="0"), "sslPort: must be between 1 and 65535"),
        (_document(serviceType='"dynamic"'), "serviceType: must be one of"),
    ],
    ids=lambda v: v.decode()[:50] if isinstance(v, bytes) else None,
)
def test_hostile_fields_are_rejected_with_a_message_naming_them(raw: bytes, message: str) -> None:
    with pytest.raises(InvalidInstanceError) as error:
        ServiceInstance.from_json(raw)
    assert f"invalid ServiceInstance: {message}" in str(error.value)
    assert len(str(error.value)) < 400


@pytest.mark.parametrize(
    "raw",
    [
        b"[" * (MAX_INSTANCE_BYTES // 2) + b"]" * (MAX_INSTANCE_BYTES // 2),
        b'{"a":' * 10_000 + b"1" + b"}" * 10_000,
        _document(payload=_PAYLOAD_WITH_X.replace("X", "[" * 5000 + "]" * 5000)),
        _document(
            payload=_PAYLOAD_WITH_X.replace(
                "X", '{"key-of-forty-characters-to-make-it-long":' * 100 + "1" + "}" * 100
            )
        ),
    ],
    ids=["array-32k-deep", "object-10k-deep", "payload-5k-deep", "payload-100-deep"],
)
def test_deep_nesting_is_rejected_not_a_crash(raw: bytes) -> None:
    assert len(raw) <= MAX_INSTANCE_BYTES
    with pytest.raises(
        InvalidInstanceError, match=r"nested too deeply|nested deeper than 64"
    ) as error:
        ServiceInstance.from_json(raw)
    assert len(str(error.value)) < 250  # a deep path is shortened


def test_oversized_documents_are_rejected_before_parsing() -> None:
    big = b'{"name":"' + b"x" * MAX_INSTANCE_BYTES + b'"}'
    with pytest.raises(PayloadTooLargeError, match=f"more than the bound of {MAX_INSTANCE_BYTES}"):
        ServiceInstance.from_json(big)
    # Not even the JSON is looked at: garbage of that size is "too large", not "invalid".
    with pytest.raises(PayloadTooLargeError):
        ServiceInstance.from_json(b"\xff" * (MAX_INSTANCE_BYTES + 1))
    with pytest.raises(PayloadTooLargeError):
        ServiceInstance.from_json("é" * (MAX_INSTANCE_BYTES // 2 + 1))  # 2 bytes each
    # And we never write one.
    instance = ServiceInstance.from_json(_document())
    padded = ServiceInstance.from_dict(
        {**instance.to_dict(), "payload": {**instance.payload.to_dict(), "pad": "x" * 70_000}}
    )
    with pytest.raises(PayloadTooLargeError, match="more than the bound"):
        padded.to_json()


def test_decoder_errors_are_discovery_errors() -> None:
    assert issubclass(InvalidInstanceError, DiscoveryError)
    assert issubclass(PayloadTooLargeError, InvalidInstanceError)


# -- /search parameters (pure) ------------------------------------------------------

INTEGER_TEXT = (
    st.from_regex(r"[+-]?[0-9]{1,25}", fullmatch=True)
    | st.integers(-(10**6), 10**6).map(str)
    | st.sampled_from(
        [
            "",
            " ",
            "0",
            "1",
            "10",
            "1000",
            "1001",
            "-1",
            "+5",
            " 5",
            "5 ",
            "1e3",
            "1_0",
            "٣",
            "0x10",
            "NaN",
            "inf",
            "9" * 19,
            "9" * 5000,
            "1.0",
            "\x00",
            "1\n",
        ]
    )
    | ANY_TEXT
)
QUERY_TEXT = (
    ANY_TEXT
    | st.sampled_from(["", " ", "\t\n", "a", "a" * MAX_QUERY_LENGTH, "a" * (MAX_QUERY_LENGTH + 1)])
    # Long runs of one character: 1- to 4-byte UTF-8 around both bounds.
    | st.builds(
        lambda c, n: c * n,
        st.characters(exclude_categories=("Cs",)),
        st.integers(MAX_QUERY_BYTES // 4 - 5, MAX_QUERY_LENGTH + 5),
    )
)
SEARCH_QUERIES = st.fixed_dictionaries(
    {},
    optional={
        "q": QUERY_TEXT,
        "k": INTEGER_TEXT,
        "timeout_ms": INTEGER_TEXT,
        "unknown": ANY_TEXT,
    },
)


def _search_server_params(params: dict[str, str]) -> Any:
    return parse_search_params(
        params,
        max_k=SEARCH_MAX_K,
        default_timeout_ms=DEFAULT_TIMEOUT_MS,
        max_timeout_ms=MAX_TIMEOUT_MS,
    )


@PURE
@given(SEARCH_QUERIES)
def test_search_parameters_parse_or_are_rejected_naming_the_parameter(
    params: dict[str, str],
) -> None:
    parsed = outcome(lambda: _search_server_params(params), BadRequestError)
    if isinstance(parsed, BadRequestError):
        exc = parsed
        assert exc.parameter in SEARCH_PARAMETERS
        assert exc.reason in REASONS
        assert f"'{exc.parameter}'" in str(exc)
        assert len(str(exc)) < 200
        # Reported in order q, k, timeout_ms: whatever comes before the named one is fine.
        if exc.parameter != "q":
            parse_query_text(params.get("q"))
        if exc.parameter == "timeout_ms":
            parse_int("k", params.get("k"), 10, 1, SEARCH_MAX_K)
        return
    assert parsed.q.strip()
    assert len(parsed.q) <= MAX_QUERY_LENGTH
    assert len(parsed.q.encode("utf-8")) <= MAX_QUERY_BYTES
    assert 1 <= parsed.k <= SEARCH_MAX_K
    assert parsed.timeout_ms is not None
    assert 1 <= parsed.timeout_ms <= MAX_TIMEOUT_MS
    assert parsed.k == (int(params["k"]) if "k" in params else 10)


@PURE
@given(SEARCH_QUERIES)
def test_what_the_search_server_accepts_every_data_server_accepts(params: dict[str, str]) -> None:
    accepted = outcome(lambda: _search_server_params(params), BadRequestError)
    if isinstance(accepted, BadRequestError):
        return
    # What the fan-out sends: a data server refusing it would count as that server
    # failing, and could get it ejected.
    forwarded = {"q": accepted.q, "k": str(accepted.k)}
    again = parse_search_params(forwarded, max_k=DATA_MAX_K)
    assert (again.q, again.k) == (accepted.q, accepted.k)
    url = URL("http://255.255.255.255:65535/search").extend_query(forwarded)
    request_line = f"GET {url.raw_path_qs} HTTP/1.1"
    assert len(request_line) < MAX_REQUEST_LINE


@PURE
@given(INTEGER_TEXT, st.integers(-100, 100), st.integers(0, 10**6))
def test_integers_are_plain_ascii_decimals(raw: str, low: int, span: int) -> None:
    high = low + span
    value = outcome(lambda: parse_int("n", raw, 7, low, high), BadRequestError)
    if isinstance(value, BadRequestError):
        exc = value
        assert exc.parameter == "n"
        if re.fullmatch(r"[+-]?[0-9]+", raw, flags=re.ASCII) and len(raw) < 4000:
            assert exc.reason == "out_of_range"
            assert not low <= int(raw) <= high
        else:
            assert exc.reason in ("not_integer", "out_of_range")
        return
    assert re.fullmatch(r"[+-]?[0-9]+", raw, flags=re.ASCII)
    assert value == int(raw)
    assert low <= value <= high


@PURE
@given(st.binary(max_size=200) | ANY_JSON.map(lambda v: json.dumps(v, allow_nan=True).encode()))
@example(b"[" * 10_000)
@example(b'{"a":' + b"9" * 5000 + b"}")
@example(b"NaN")
@example(b"\xff")
@example(b" " * (MAX_BODY_BYTES + 1))
def test_json_bodies_decode_or_are_rejected_naming_the_body(raw: bytes) -> None:
    value = outcome(lambda: parse_json_body(raw), BadRequestError)
    if isinstance(value, BadRequestError):
        exc = value
        assert exc.parameter == "body"
        assert exc.reason in ("too_large", "not_utf8", "too_deep", "invalid_json")
        assert "body" in str(exc)
        assert len(str(exc)) < 200
        return
    # Accepted means standard JSON: it encodes again without NaN or Infinity.
    json.dumps(value, allow_nan=False)


# -- Fault.from_json ---------------------------------------------------------------

FAULT_BODIES = ANY_JSON | st.fixed_dictionaries(
    {"mode": st.sampled_from(["none", "slow", "error", "hang"]) | ANY_JSON},
    optional={
        "delay_ms": st.integers(-10, 700_000) | ANY_JSON,
        "rate": st.floats() | ANY_JSON,
        "block_loop": st.booleans() | ANY_JSON,
        "duration_ms": st.integers(-10, 700_000) | ANY_JSON,
        "other": ANY_JSON,
    },
)


@PURE
@given(FAULT_BODIES)
@example({"mode": ["slow"]})  # unhashable: once a TypeError, a 500
@example({"mode": {"slow": 1}})
@example({"mode": "slow", "delay_ms": 10**5000})
@example({"mode": "error", "rate": math.nan})
@example({"mode": "hang", "block_loop": True, "duration_ms": 10**30})
def test_fault_specs_parse_or_are_rejected_naming_the_field(body: Any) -> None:
    fault = outcome(lambda: Fault.from_json(body), FaultSpecError)
    if isinstance(fault, FaultSpecError):
        exc = fault
        assert isinstance(exc, BadRequestError)
        assert exc.parameter in FAULT_FIELDS
        assert len(str(exc)) < 300
        return
    assert fault.mode in ("none", "slow", "error", "hang")
    assert isinstance(body, dict)
    assert fault.mode == body["mode"]
    assert Fault.from_json(fault.to_dict()).to_dict() == fault.to_dict()


# -- over HTTP ---------------------------------------------------------------------


def _rejected(registry: CollectorRegistry, endpoint: str, parameter: str, reason: str) -> float:
    labels = {"endpoint": endpoint, "parameter": parameter, "reason": reason}
    return registry.get_sample_value("discovery_http_rejected_total", labels) or 0.0


@contextlib.asynccontextmanager
async def _served_data_app(
    admin_token: str | None = None,
) -> AsyncIterator[tuple[DataServer, TestClient[Any, Any]]]:
    config = DataServerConfig(
        zk=ZkConfig(hosts="127.0.0.1:1"),
        cluster=ClusterConfig(admin_token=admin_token),
        agent=AgentConfig(),
        port=0,
        docs=200,
    )
    server = DataServer(config, registry=CollectorRegistry())
    await server.load()
    # Every request carries the admin header, as an operator's client would.
    client: TestClient[Any, Any] = TestClient(
        TestServer(server._make_app()), headers=admin_headers()
    )
    await client.start_server()
    yield server, client
    server.faults.set(Fault())
    await client.close()


@pytest.fixture
async def data_app() -> AsyncIterator[tuple[DataServer, TestClient[Any, Any]]]:
    """A data server's real application with its index, served on loopback; no agent,
    no ZooKeeper (its search and admin handlers need neither)."""
    async with _served_data_app() as served:
        yield served


@pytest.fixture
async def search_app() -> AsyncIterator[tuple[SearchServer, TestClient[Any, Any]]]:
    """A search server's real application before it connects: valid queries get 503
    "starting", so parameter handling is tested without ZooKeeper or Redis."""
    config = SearchServerConfig(
        zk=ZkConfig(hosts="127.0.0.1:1"),
        cluster=ClusterConfig(),
        port=0,
        default_timeout_ms=DEFAULT_TIMEOUT_MS,
        max_timeout_ms=MAX_TIMEOUT_MS,
    )
    server = SearchServer(config, registry=CollectorRegistry())
    client: TestClient[Any, Any] = TestClient(TestServer(server._make_app()))
    await client.start_server()
    yield server, client
    await client.close()


def _fits_a_request_line(params: dict[str, str]) -> bool:
    url = URL("/search").extend_query(params)
    return len(f"GET {url.raw_path_qs} HTTP/1.1") < MAX_REQUEST_LINE - 100


HTTP_QUERIES = SEARCH_QUERIES.map(
    # Lone surrogates cannot be put in a URL; the pure tests above cover them.
    lambda params: {k: v.encode("utf-8", "replace").decode("utf-8") for k, v in params.items()}
).filter(_fits_a_request_line)


async def _check_search_answer(
    client: TestClient[Any, Any],
    registry: CollectorRegistry,
    params: dict[str, str],
    expected: Any,
    ok_status: int,
) -> Any:
    before = (
        _rejected(registry, "/search", expected.parameter, expected.reason)
        if isinstance(expected, BadRequestError)
        else None
    )
    async with client.get(URL("/search").extend_query(params)) as response:
        assert response.content_type == "application/json"
        body = await response.json()
        status = response.status
    if isinstance(expected, BadRequestError):
        assert status == 400, body
        assert body["parameter"] == expected.parameter
        assert f"'{expected.parameter}'" in body["error"]
        after = _rejected(registry, "/search", expected.parameter, expected.reason)
        assert before is not None
        assert after == before + 1
    else:
        assert status == ok_status, body
    return body


def _expected(params: dict[str, str], **kwargs: Any) -> Any:
    return outcome(lambda: parse_search_params(params, **kwargs), BadRequestError)


@OVER_HTTP
@given(params=HTTP_QUERIES)
async def test_data_server_search_answers_200_or_a_counted_400(
    data_app: tuple[DataServer, TestClient[Any, Any]], params: dict[str, str]
) -> None:
    server, client = data_app
    # The data server takes timeout_ms too: the budget the search server sends along.
    expected = _expected(
        params,
        max_k=DATA_MAX_K,
        default_timeout_ms=DEFAULT_SEARCH_TIMEOUT_MS,
        max_timeout_ms=DATA_MAX_TIMEOUT_MS,
    )
    body = await _check_search_answer(client, server.registry, params, expected, 200)
    if not isinstance(expected, BadRequestError):
        assert len(body["hits"]) <= expected.k


@OVER_HTTP
@given(params=HTTP_QUERIES)
async def test_search_server_search_answers_a_counted_400_or_goes_on(
    search_app: tuple[SearchServer, TestClient[Any, Any]], params: dict[str, str]
) -> None:
    server, client = search_app
    expected = _expected(
        params,
        max_k=SEARCH_MAX_K,
        default_timeout_ms=DEFAULT_TIMEOUT_MS,
        max_timeout_ms=MAX_TIMEOUT_MS,
    )
    body = await _check_search_answer(client, server.registry, params, expected, 503)
    if not isinstance(expected, BadRequestError):
        assert body == {"error": "starting"}


@OVER_HTTP
@given(raw=st.binary(max_size=60), name=st.sampled_from(["q", "k", "timeout_ms"]))
@example(raw=b"\xff", name="q")
@example(raw=b"\xed\xa0\x80", name="q")  # an encoded surrogate
@example(raw=b"\x00", name="k")
async def test_any_percent_encoded_bytes_are_never_a_500(
    data_app: tuple[DataServer, TestClient[Any, Any]],
    search_app: tuple[SearchServer, TestClient[Any, Any]],
    raw: bytes,
    name: str,
) -> None:
    encoded = "".join(f"%{byte:02X}" for byte in raw)
    extra = "" if name == "q" else "&q=a"
    for client, ok in ((data_app[1], 200), (search_app[1], 503)):
        url = URL(f"/search?{name}={encoded}{extra}", encoded=True)
        async with client.get(url) as response:
            body = await response.json()
            assert response.status in (ok, 400), body
            if response.status == 400:
                assert body["parameter"] == name


@OVER_HTTP
@given(body=FAULT_BODIES | st.binary(max_size=100))
@example(body=b"[" * 10_000)
@example(body=b'{"mode":"slow","delay_ms":' + b"9" * 5000 + b"}")
@example(body={"mode": ["hang"]})
async def test_admin_fault_answers_200_or_a_counted_400(
    data_app: tuple[DataServer, TestClient[Any, Any]], body: Any
) -> None:
    server, client = data_app
    raw = body if isinstance(body, bytes) else json.dumps(body, allow_nan=True).encode()
    rejected_before = _rejected_total(server.registry, "/admin/fault")
    async with client.post("/admin/fault", data=raw) as response:
        answer = await response.json()
        status = response.status
    try:
        assert status in (200, 400), answer
        if status == 400:
            assert answer["parameter"] in FAULT_FIELDS
            assert _rejected_total(server.registry, "/admin/fault") == rejected_before + 1
            assert server.faults.fault == Fault()
        else:
            assert answer["fault"] == server.faults.fault.to_dict()
    finally:
        # The next example starts without a fault (a block_loop hang would stall it).
        server.faults.set(Fault())


def _rejected_total(registry: CollectorRegistry, endpoint: str) -> float:
    total = 0.0
    for metric in registry.collect():
        if metric.name == "discovery_http_rejected":
            for sample in metric.samples:
                if sample.name.endswith("_total") and sample.labels["endpoint"] == endpoint:
                    total += sample.value
    return total


# -- rejections are counted ---------------------------------------------------------


async def test_every_kind_of_4xx_is_counted_on_the_servers_registry(
    data_app: tuple[DataServer, TestClient[Any, Any]],
) -> None:
    server, client = data_app
    registry = server.registry

    async def status(method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        async with client.request(method, path, **kwargs) as response:
            return response.status, await response.json()

    assert (await status("GET", "/search", params={"q": "a", "k": "ten"}))[0] == 400
    assert _rejected(registry, "/search", "k", "not_integer") == 1
    assert (await status("GET", "/search"))[0] == 400
    assert _rejected(registry, "/search", "q", "missing") == 1
    assert (await status("GET", "/search", params={"q": "a", "k": "9" * 40}))[0] == 400
    assert _rejected(registry, "/search", "k", "out_of_range") == 1

    code, body = await status("GET", "/no/such/path/" + "x" * 50)
    assert code == 404
    assert "error" in body
    # The route's pattern, never the raw path: scanners cannot grow the registry.
    assert _rejected(registry, "unmatched", "-", "not_found") == 1
    assert (await status("DELETE", "/search"))[0] == 405
    # No route matches a wrong method either (aiohttp does not say which path it was).
    assert _rejected(registry, "unmatched", "-", "method_not_allowed") == 1

    code, body = await status("POST", "/admin/fault", data=b" " * (MAX_BODY_BYTES + 1))
    assert code == 400
    assert body["parameter"] == "body"
    assert _rejected(registry, "/admin/fault", "body", "too_large") == 1
    # Beyond aiohttp's own limit (1 MiB) the framework refuses it: counted too.
    code, _ = await status("POST", "/admin/fault", data=_chunks(b" " * (2 * 1024 * 1024)))
    assert code == 413
    assert _rejected(registry, "/admin/fault", "-", "too_large") == 1
    code, body = await status("POST", "/admin/fault", data=b"not json")
    assert (code, body["parameter"]) == (400, "body")
    assert "body must be JSON" in body["error"]
    assert _rejected(registry, "/admin/fault", "body", "invalid_json") == 1
    code, body = await status("POST", "/admin/fault", json={"mode": "error", "rate": 2})
    assert (code, body["parameter"]) == (400, "rate")
    assert _rejected(registry, "/admin/fault", "rate", "invalid") == 1

    # Good requests are not counted.
    assert (await status("GET", "/search", params={"q": "a"}))[0] == 200
    assert (await status("POST", "/admin/fault", json={"mode": "none"}))[0] == 200
    assert _rejected_total(registry, "/search") == 3
    assert _rejected_total(registry, "/admin/fault") == 4


async def test_admin_refusals_are_counted() -> None:
    async with _served_data_app(admin_token="s3cret") as (server, client):
        async with client.post("/admin/fault", json={"mode": "none"}) as response:
            assert response.status == 401
        async with client.post(
            "/admin/fault", json={"mode": "none"}, headers={"Authorization": "Bearer nope"}
        ) as response:
            assert response.status == 403
        assert _rejected(server.registry, "/admin/fault", "-", "unauthorized") == 1
        assert _rejected(server.registry, "/admin/fault", "-", "forbidden") == 1


async def test_search_server_counts_its_rejections(
    search_app: tuple[SearchServer, TestClient[Any, Any]],
) -> None:
    server, client = search_app
    for params in ({"q": "a", "timeout_ms": "0"}, {"q": "a", "timeout_ms": "x"}, {"q": " "}):
        async with client.get("/search", params=params) as response:
            assert response.status == 400
    registry = server.registry
    assert _rejected(registry, "/search", "timeout_ms", "out_of_range") == 1
    assert _rejected(registry, "/search", "timeout_ms", "not_integer") == 1
    assert _rejected(registry, "/search", "q", "blank") == 1
    # 503 (not ready) is not a rejection of input.
    async with client.get("/search", params={"q": "a"}) as response:
        assert response.status == 503
    assert _rejected_total(registry, "/search") == 3


async def _chunks(data: bytes, size: int = 64 * 1024) -> AsyncIterator[bytes]:
    # A streamed body has no Content-Length: aiohttp finds out its size while reading.
    for start in range(0, len(data), size):
        yield data[start : start + size]
