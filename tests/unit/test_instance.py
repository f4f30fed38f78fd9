"""Unit tests for the Curator-compatible ServiceInstance document (discovery.instance).

Pure tests: no ZooKeeper, no Redis. The golden files under ``tests/golden/`` are
documents in the layout Curator's ``JsonInstanceSerializer`` (Jackson, default
settings: compact, fields in declaration order, type id first in a typed
payload) writes:

* ``curator_service_instance.json`` - typed payload with ``"@class"``, serving.
* ``curator_service_instance_urispec.json`` - sslPort, a ``UriSpec`` for
  ``{scheme}://{address}:{port}/search``, STATIC, draining with a reason and a
  payload field from a newer writer, ``enabled`` false.
* ``curator_service_instance_compat.json`` - Curator's compatibility mode (no
  ``enabled``) from a payload class that writes ``"reason":null``.
* ``curator_service_instance_future.json`` - a newer Curator with extra
  top-level fields (like Curator's own ``NewServiceInstance`` test).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from discovery.errors import InvalidInstanceError, PayloadTooLargeError
from discovery.instance import (
    DEFAULT_WEIGHT,
    MAX_INSTANCE_BYTES,
    SERVICE_TYPES,
    InstancePayload,
    InstanceState,
    ServiceInstance,
    validate_group,
    validate_instance_id,
    validate_weight,
    validate_zone,
)
from discovery.zk.memberread import ChildReader
from discovery.zk.paths import DATA_SERVERS_PATH
from tests.support import CURATOR_FIELD_ORDER, REPO_ROOT

GOLDEN = REPO_ROOT / "tests" / "golden"


def golden_bytes(name: str) -> bytes:
    # Tolerate an editor adding a final newline; Jackson writes none.
    return (GOLDEN / name).read_bytes().rstrip(b"\r\n")


def base_payload(**changes: Any) -> InstancePayload:
    fields: dict[str, Any] = {
        "shard": 3,
        "replica": 1,
        "docs": 125_000,
        "version": "1.4.2",
        "state": InstanceState.SERVING,
    }
    fields.update(changes)
    return InstancePayload(**fields)


def base_instance(**changes: Any) -> ServiceInstance:
    fields: dict[str, Any] = {
        "name": "data_servers",
        "id": "ds-007",
        "address": "10.0.0.7",
        "port": 9001,
        "ssl_port": None,
        "payload": base_payload(),
        "registration_time_utc": 1_718_000_000_123,
    }
    fields.update(changes)
    return ServiceInstance(**fields)


def base_doc() -> dict[str, Any]:
    return json.loads(golden_bytes("curator_service_instance.json"))  # type: ignore[no-any-return]


URI_SPEC = {
    "parts": [
        {"value": "scheme", "variable": True},
        {"value": "://", "variable": False},
        {"value": "address", "variable": True},
    ]
}

ROUND_TRIP_CASES = {
    "minimal": base_instance(),
    "draining-with-reason": base_instance(
        payload=base_payload(state=InstanceState.DRAINING, reason="probe failed"), enabled=False
    ),
    "ssl-and-urispec": base_instance(ssl_port=9443, uri_spec=URI_SPEC, service_type="STATIC"),
    "extras": base_instance(
        payload=base_payload(extra={"@class": "x.Y", "rack": "b", "tags": ["a", {"k": 1.5}]})
    ),
    "zone-and-weight": base_instance(payload=base_payload(zone="eu-west-1b", weight=250)),
    "zone-weight-reason-extras": base_instance(
        payload=base_payload(
            state=InstanceState.DRAINING,
            reason="r",
            zone="dc1:rack-7.a_b",
            weight=1,
            extra={"@class": "x.Y", "rack": 7},
        ),
        enabled=False,
    ),
    "weight-max-zone-max": base_instance(payload=base_payload(zone="z" * 64, weight=1000)),
    "group": base_instance(payload=base_payload(group="g1")),
    "zone-weight-group-extras": base_instance(
        payload=base_payload(zone="eu-1", weight=5, group="copy-a", extra={"@class": "x.Y"})
    ),
    "unicode": base_instance(
        address="xn--hte-u-bsa5d.example",
        payload=base_payload(version="v1 \u2013 ü", reason="ß ✓"),
    ),
    "bounds": base_instance(
        id="a" * 128,
        address=".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 61]),  # 253 characters
        port=65535,
        ssl_port=1,
        registration_time_utc=2**63 - 1,
        payload=base_payload(shard=2**31 - 1, replica=0, docs=2**63 - 1, version=""),
        service_type="DYNAMIC_SEQUENTIAL",
    ),
}


# --- round trip -------------------------------------------------------------------------


@pytest.mark.parametrize("instance", ROUND_TRIP_CASES.values(), ids=ROUND_TRIP_CASES.keys())
def test_encode_decode_round_trip(instance: ServiceInstance) -> None:
    raw = instance.to_json()
    decoded = ServiceInstance.from_json(raw)
    assert decoded == instance
    assert decoded.to_json() == raw
    assert ServiceInstance.from_json(raw.decode("utf-8")) == instance
    assert ServiceInstance.from_dict(instance.to_dict()) == instance


def test_to_json_is_compact_utf8_in_curator_order() -> None:
    instance = base_instance(payload=base_payload(version="ü"))
    assert (
        instance.to_json()
        == (
            '{"name":"data_servers","id":"ds-007","address":"10.0.0.7","port":9001,"sslPort":null,'
            '"payload":{"shard":3,"replica":1,"docs":125000,"version":"ü","state":"serving"},'
            '"registrationTimeUTC":1718000000123,"serviceType":"DYNAMIC","uriSpec":null,'
            '"enabled":true}'
        ).encode()
    )


def test_reason_is_written_only_when_set() -> None:
    assert "reason" not in base_instance().to_dict()["payload"]
    with_reason = base_instance(payload=base_payload(reason=""))
    assert with_reason.to_dict()["payload"]["reason"] == ""


# --- golden documents in Curator's layout ----------------------------------------------


def test_golden_curator_document_decodes_and_reencodes_identically() -> None:
    raw = golden_bytes("curator_service_instance.json")
    instance = ServiceInstance.from_json(raw)
    assert instance.name == "data_servers"
    assert instance.id == "ds-007"
    assert instance.address == "10.0.0.7"
    assert instance.port == 9001
    assert instance.ssl_port is None
    assert instance.registration_time_utc == 1_718_000_000_123
    assert instance.service_type == "DYNAMIC"
    assert instance.uri_spec is None
    assert instance.enabled is True
    assert instance.payload == InstancePayload(
        shard=3,
        replica=1,
        docs=125_000,
        version="1.4.2",
        state=InstanceState.SERVING,
        extra={"@class": "com.example.search.DataServerPayload"},
    )
    assert instance.routable
    assert instance.to_json() == raw


def test_golden_urispec_document_decodes_and_reencodes_identically() -> None:
    raw = golden_bytes("curator_service_instance_urispec.json")
    instance = ServiceInstance.from_json(raw)
    assert instance.ssl_port == 9443
    assert instance.service_type == "STATIC"
    assert instance.enabled is False
    assert instance.payload.state is InstanceState.DRAINING
    assert instance.payload.reason == "health probe: p99 2300 ms > 500 ms"
    # A newer writer's field then, a named field now: read as the zone, and
    # still written back where it was.
    assert instance.payload.zone == "eu-west-1b"
    assert instance.zone == "eu-west-1b"
    assert instance.weight == DEFAULT_WEIGHT
    assert "zone" not in instance.payload.extra
    assert instance.uri_spec is not None
    assert [(p["value"], p["variable"]) for p in instance.uri_spec["parts"]] == [
        ("scheme", True),
        ("://", False),
        ("address", True),
        (":", False),
        ("port", True),
        ("/search", False),
    ]
    assert not instance.routable
    assert instance.to_json() == raw


def test_golden_compat_mode_document_without_enabled() -> None:
    instance = ServiceInstance.from_json(golden_bytes("curator_service_instance_compat.json"))
    assert instance.enabled is True
    assert instance.payload.reason is None
    assert instance.registration_time_utc == 0
    assert list(json.loads(instance.to_json())) == CURATOR_FIELD_ORDER


def test_golden_future_document_tolerates_unknown_top_level_fields() -> None:
    instance = ServiceInstance.from_json(golden_bytes("curator_service_instance_future.json"))
    assert instance.id == "ds-099"
    assert instance.service_type == "DYNAMIC_SEQUENTIAL"
    top_level = json.loads(instance.to_json())
    assert list(top_level) == CURATOR_FIELD_ORDER
    assert not {"new1", "new2", "new3", "new4"} & set(top_level)


@pytest.mark.parametrize("path", sorted(GOLDEN.glob("curator_service_instance*.json")), ids=str)
def test_golden_reencodes_in_curator_field_order(path: Path) -> None:
    instance = ServiceInstance.from_json(path.read_bytes())
    assert list(json.loads(instance.to_json())) == CURATOR_FIELD_ORDER
    payload_keys = list(json.loads(instance.to_json())["payload"])
    named = [k for k in payload_keys if k in ("shard", "replica", "docs", "version", "state")]
    assert named == ["shard", "replica", "docs", "version", "state"]


# --- unknown keys ------------------------------------------------------------------------


def test_unknown_payload_keys_survive_round_trip_in_order() -> None:
    doc = base_doc()
    doc["payload"]["rack"] = "eu-1"
    doc["payload"]["weights"] = {"cpu": 0.5, "tags": [1, "x", None, True]}
    instance = ServiceInstance.from_dict(doc)
    assert instance.payload.extra == {
        "@class": "com.example.search.DataServerPayload",
        "rack": "eu-1",
        "weights": {"cpu": 0.5, "tags": [1, "x", None, True]},
    }
    payload_out = json.loads(instance.to_json())["payload"]
    assert payload_out == doc["payload"]
    assert list(payload_out) == [
        "@class",
        "shard",
        "replica",
        "docs",
        "version",
        "state",
        "rack",
        "weights",
    ]


def test_at_class_is_written_first_even_if_given_last() -> None:
    payload = base_payload(extra={"rack": "a", "@class": "com.example.P"})
    assert list(payload.to_dict())[:2] == ["@class", "shard"]


def test_unknown_top_level_keys_are_tolerated_and_dropped() -> None:
    doc = base_doc()
    doc["weight"] = 10
    doc["metadata"] = {"nested": [1, 2]}
    instance = ServiceInstance.from_dict(doc)
    assert instance == ServiceInstance.from_dict(base_doc())
    assert "weight" not in instance.to_dict()
    assert instance.weight == DEFAULT_WEIGHT  # a top-level "weight" is not ours


def test_optional_fields_default_when_absent() -> None:
    doc = base_doc()
    for key in ("sslPort", "serviceType", "uriSpec", "enabled"):
        del doc[key]
    instance = ServiceInstance.from_dict(doc)
    assert instance.ssl_port is None
    assert instance.service_type == "DYNAMIC"
    assert instance.uri_spec is None
    assert instance.enabled is True


# --- validation --------------------------------------------------------------------------


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(doc: dict[str, Any]) -> None:
        target = doc
        *parents, last = path.split("/")
        for parent in parents:
            target = target[parent]
        target[last] = value

    return mutate


def _del(path: str) -> Callable[[dict[str, Any]], None]:
    def mutate(doc: dict[str, Any]) -> None:
        target = doc
        *parents, last = path.split("/")
        for parent in parents:
            target = target[parent]
        del target[last]

    return mutate


_OVER_INT = 2**31
_OVER_LONG = 2**63
INVALID_DOCS: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    # required fields
    *[(f"missing-{k}", _del(k), k) for k in ("name", "id", "address", "port", "payload")],
    ("missing-registrationTimeUTC", _del("registrationTimeUTC"), "registrationTimeUTC"),
    *[
        (f"missing-payload.{k}", _del(f"payload/{k}"), f"payload.{k}")
        for k in ("shard", "replica", "docs", "version", "state")
    ],
    # name
    ("name-empty", _set("name", ""), "name"),
    ("name-int", _set("name", 5), "name"),
    ("name-null", _set("name", None), "name"),
    # id
    ("id-empty", _set("id", ""), "id"),
    ("id-slash", _set("id", "a/b"), "id"),
    ("id-dot", _set("id", "."), "id"),
    ("id-dotdot", _set("id", ".."), "id"),
    ("id-too-long", _set("id", "a" * 129), "id"),
    ("id-space", _set("id", "a b"), "id"),
    ("id-non-ascii", _set("id", "dé"), "id"),
    ("id-newline", _set("id", "a\n"), "id"),
    ("id-int", _set("id", 7), "id"),
    # address
    ("address-empty", _set("address", ""), "address"),
    ("address-too-long", _set("address", "h" * 256), "address"),
    ("address-int", _set("address", 10), "address"),
    # port
    ("port-zero", _set("port", 0), "port"),
    ("port-too-big", _set("port", 65536), "port"),
    ("port-negative", _set("port", -1), "port"),
    ("port-bool", _set("port", True), "port"),
    ("port-string", _set("port", "9001"), "port"),
    ("port-float", _set("port", 9001.0), "port"),
    ("port-nan", _set("port", math.nan), "port"),
    ("port-inf", _set("port", math.inf), "port"),
    ("port-null", _set("port", None), "port"),
    # sslPort
    ("sslPort-zero", _set("sslPort", 0), "sslPort"),
    ("sslPort-too-big", _set("sslPort", 70000), "sslPort"),
    ("sslPort-bool", _set("sslPort", True), "sslPort"),
    ("sslPort-string", _set("sslPort", "443"), "sslPort"),
    # payload container
    ("payload-null", _set("payload", None), "payload"),
    ("payload-array", _set("payload", []), "payload"),
    ("payload-string", _set("payload", "x"), "payload"),
    # payload fields
    ("shard-negative", _set("payload/shard", -1), "payload.shard"),
    ("shard-bool", _set("payload/shard", True), "payload.shard"),
    ("shard-float", _set("payload/shard", 1.5), "payload.shard"),
    ("shard-string", _set("payload/shard", "3"), "payload.shard"),
    ("shard-over-java-int", _set("payload/shard", _OVER_INT), "payload.shard"),
    ("replica-negative", _set("payload/replica", -1), "payload.replica"),
    ("replica-bool", _set("payload/replica", False), "payload.replica"),
    ("docs-negative", _set("payload/docs", -1), "payload.docs"),
    ("docs-bool", _set("payload/docs", True), "payload.docs"),
    ("docs-inf", _set("payload/docs", math.inf), "payload.docs"),
    ("docs-over-java-long", _set("payload/docs", _OVER_LONG), "payload.docs"),
    ("version-int", _set("payload/version", 1), "payload.version"),
    ("version-null", _set("payload/version", None), "payload.version"),
    ("state-unknown", _set("payload/state", "up"), "payload.state"),
    ("state-upper", _set("payload/state", "SERVING"), "payload.state"),
    ("state-null", _set("payload/state", None), "payload.state"),
    ("state-int", _set("payload/state", 1), "payload.state"),
    ("reason-int", _set("payload/reason", 5), "payload.reason"),
    ("zone-empty", _set("payload/zone", ""), "payload.zone"),
    ("zone-too-long", _set("payload/zone", "z" * 65), "payload.zone"),
    ("zone-space", _set("payload/zone", "eu west"), "payload.zone"),
    ("zone-slash", _set("payload/zone", "eu/west"), "payload.zone"),
    ("zone-newline", _set("payload/zone", "eu-1\n"), "payload.zone"),
    ("zone-non-ascii", _set("payload/zone", "zoné"), "payload.zone"),
    ("zone-int", _set("payload/zone", 1), "payload.zone"),
    ("zone-bool", _set("payload/zone", True), "payload.zone"),
    ("zone-array", _set("payload/zone", ["a"]), "payload.zone"),
    ("weight-zero", _set("payload/weight", 0), "payload.weight"),
    ("weight-negative", _set("payload/weight", -5), "payload.weight"),
    ("weight-too-big", _set("payload/weight", 1001), "payload.weight"),
    ("weight-bool", _set("payload/weight", True), "payload.weight"),
    ("weight-float", _set("payload/weight", 100.0), "payload.weight"),
    ("weight-string", _set("payload/weight", "100"), "payload.weight"),
    ("weight-nan", _set("payload/weight", math.nan), "payload.weight"),
    ("weight-over-java-long", _set("payload/weight", _OVER_LONG), "payload.weight"),
    ("at-class-int", _set("payload/@class", 5), "payload.@class"),
    ("extra-nan", _set("payload/load", math.nan), "payload.load"),
    ("extra-nested-inf", _set("payload/m", {"x": [math.inf]}), "payload.m.x[0]"),
    # registrationTimeUTC
    ("time-negative", _set("registrationTimeUTC", -1), "registrationTimeUTC"),
    ("time-bool", _set("registrationTimeUTC", True), "registrationTimeUTC"),
    ("time-float", _set("registrationTimeUTC", 1.7e12), "registrationTimeUTC"),
    ("time-string", _set("registrationTimeUTC", "now"), "registrationTimeUTC"),
    ("time-null", _set("registrationTimeUTC", None), "registrationTimeUTC"),
    ("time-over-java-long", _set("registrationTimeUTC", _OVER_LONG), "registrationTimeUTC"),
    # serviceType
    ("serviceType-lower", _set("serviceType", "dynamic"), "serviceType"),
    ("serviceType-unknown", _set("serviceType", "EPHEMERAL"), "serviceType"),
    ("serviceType-null", _set("serviceType", None), "serviceType"),
    ("serviceType-int", _set("serviceType", 1), "serviceType"),
    # uriSpec
    ("uriSpec-string", _set("uriSpec", "{scheme}://{address}"), "uriSpec"),
    ("uriSpec-array", _set("uriSpec", []), "uriSpec"),
    ("uriSpec-no-parts", _set("uriSpec", {}), "uriSpec.parts"),
    ("uriSpec-parts-string", _set("uriSpec", {"parts": "x"}), "uriSpec.parts"),
    ("uriSpec-part-int", _set("uriSpec", {"parts": [1]}), "uriSpec.parts[0]"),
    (
        "uriSpec-part-value",
        _set("uriSpec", {"parts": [{"value": 1, "variable": True}]}),
        "uriSpec.parts[0].value",
    ),
    (
        "uriSpec-part-variable",
        _set("uriSpec", {"parts": [{"value": "a", "variable": "yes"}]}),
        "uriSpec.parts[0].variable",
    ),
    # enabled
    ("enabled-int", _set("enabled", 1), "enabled"),
    ("enabled-string", _set("enabled", "true"), "enabled"),
    ("enabled-null", _set("enabled", None), "enabled"),
]


@pytest.mark.parametrize(
    ("mutate", "field_name"),
    [(m, f) for _, m, f in INVALID_DOCS],
    ids=[case_id for case_id, _, _ in INVALID_DOCS],
)
def test_invalid_field_is_rejected_naming_the_field(
    mutate: Callable[[dict[str, Any]], None], field_name: str
) -> None:
    doc = base_doc()
    mutate(doc)
    with pytest.raises(InvalidInstanceError) as from_dict_error:
        ServiceInstance.from_dict(doc)
    assert f" {field_name}: " in str(from_dict_error.value)
    assert not isinstance(from_dict_error.value, PayloadTooLargeError)

    # The same document as bytes (NaN/inf become the non-standard JSON tokens).
    with pytest.raises(InvalidInstanceError):
        ServiceInstance.from_json(json.dumps(doc).encode("utf-8"))


def test_message_is_readable() -> None:
    doc = base_doc()
    doc["port"] = True
    with pytest.raises(
        InvalidInstanceError,
        match=r"^invalid ServiceInstance: port: must be an integer, got boolean True$",
    ):
        ServiceInstance.from_dict(doc)


def test_message_truncates_huge_values() -> None:
    doc = base_doc()
    doc["port"] = "9" * 10_000
    with pytest.raises(InvalidInstanceError) as error:
        ServiceInstance.from_dict(doc)
    assert len(str(error.value)) < 200


@pytest.mark.parametrize("instance_id", ["ds-007", "10.0.0.7:9001", "a@b_c", "...", "A" * 128])
def test_valid_instance_ids(instance_id: str) -> None:
    assert validate_instance_id(instance_id) == instance_id
    assert base_instance(id=instance_id).id == instance_id


def test_every_curator_service_type_is_accepted() -> None:
    assert {"DYNAMIC", "STATIC", "PERMANENT", "DYNAMIC_SEQUENTIAL"} == SERVICE_TYPES
    for service_type in SERVICE_TYPES:
        assert base_instance(service_type=service_type).service_type == service_type


# --- document-level errors ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"", "empty"),
        (b"  \n", "empty"),
        (b"{", "not valid JSON"),
        (b"{'name': 1}", "not valid JSON"),
        (b"[]", "top level must be an object"),
        (b'"data_servers"', "top level must be an object"),
        (b"42", "top level must be an object"),
        (b"null", "top level must be an object"),
        (b"\xff\xfe{}", "not valid UTF-8"),
        (b"\xc3\x28", "not valid UTF-8"),
        ('{"name":"x"}'.encode("utf-16"), "not valid UTF-8"),
        (b"\xef\xbb\xbf{}", "not valid JSON"),  # a UTF-8 BOM is not JSON
        (b'{"port":NaN}', "NaN"),
        (b'{"port":Infinity}', "Infinity"),
        (b'{"port":-Infinity}', "-Infinity"),
        (b'{"id":"a","id":"b"}', "id: appears more than once"),
        (b'{"payload":{"shard":1,"shard":2}}', "shard: appears more than once"),
        (b"[" * 20_000 + b"]" * 20_000, "nested too deeply"),
        (b'{"port":' + b"9" * 5000 + b"}", "not usable JSON"),
    ],
    ids=lambda v: repr(v)[:40] if isinstance(v, bytes) else None,
)
def test_bad_documents_are_rejected(raw: bytes, expected: str) -> None:
    with pytest.raises(InvalidInstanceError) as error:
        ServiceInstance.from_json(raw)
    assert expected in str(error.value)


def test_lone_surrogate_is_rejected_naming_the_field() -> None:
    raw = golden_bytes("curator_service_instance.json").replace(b'"10.0.0.7"', b'"10.0.0.7\\ud800"')
    with pytest.raises(InvalidInstanceError, match="address: must be an IP address"):
        ServiceInstance.from_json(raw)
    with pytest.raises(InvalidInstanceError, match="lone surrogate"):
        ServiceInstance.from_json('{"name":"\ud800"}')


@pytest.mark.parametrize("data", [None, 42, ["x"]])
def test_non_document_inputs_are_rejected(data: Any) -> None:
    with pytest.raises(InvalidInstanceError, match="document"):
        ServiceInstance.from_json(data)


def test_bytearray_and_memoryview_are_accepted() -> None:
    raw = golden_bytes("curator_service_instance.json")
    expected = ServiceInstance.from_json(raw)
    assert ServiceInstance.from_json(bytearray(raw)) == expected  # type: ignore[arg-type]
    assert ServiceInstance.from_json(memoryview(raw)) == expected  # type: ignore[arg-type]


# --- size bound --------------------------------------------------------------------------


def _padded_doc(total_bytes: int) -> bytes:
    doc = base_doc()
    doc["payload"]["pad"] = ""
    overhead = len(json.dumps(doc, separators=(",", ":")).encode("utf-8"))
    doc["payload"]["pad"] = "x" * (total_bytes - overhead)
    raw = json.dumps(doc, separators=(",", ":")).encode("utf-8")
    assert len(raw) == total_bytes
    return raw


def test_document_at_the_bound_is_accepted() -> None:
    raw = _padded_doc(MAX_INSTANCE_BYTES)
    instance = ServiceInstance.from_json(raw)
    assert instance.to_json() == raw


def test_oversized_document_raises_payload_too_large() -> None:
    raw = _padded_doc(MAX_INSTANCE_BYTES + 1)
    with pytest.raises(PayloadTooLargeError, match=str(MAX_INSTANCE_BYTES)):
        ServiceInstance.from_json(raw)
    with pytest.raises(PayloadTooLargeError):
        ServiceInstance.from_json(raw.decode("utf-8"))


def test_size_is_checked_before_parsing() -> None:
    garbage = b"\xff" + b"{" * MAX_INSTANCE_BYTES
    with pytest.raises(PayloadTooLargeError):
        ServiceInstance.from_json(garbage)
    with pytest.raises(PayloadTooLargeError):
        ServiceInstance.from_json("[" * (MAX_INSTANCE_BYTES + 1))


def test_size_counts_utf8_bytes_not_characters() -> None:
    # 40,000 characters but 80,000 bytes once encoded.
    doc = base_doc()
    doc["payload"]["pad"] = "é" * 40_000
    text = json.dumps(doc, ensure_ascii=False)
    assert len(text) < MAX_INSTANCE_BYTES < len(text.encode("utf-8"))
    with pytest.raises(PayloadTooLargeError):
        ServiceInstance.from_json(text)


def test_custom_max_bytes() -> None:
    raw = golden_bytes("curator_service_instance.json")
    assert ServiceInstance.from_json(raw, max_bytes=len(raw)).id == "ds-007"
    with pytest.raises(PayloadTooLargeError):
        ServiceInstance.from_json(raw, max_bytes=len(raw) - 1)
    with pytest.raises(ValueError, match="max_bytes"):
        ServiceInstance.from_json(raw, max_bytes=0)


def test_encoding_a_too_large_instance_raises() -> None:
    instance = base_instance(payload=base_payload(extra={"pad": "x" * MAX_INSTANCE_BYTES}))
    with pytest.raises(PayloadTooLargeError, match="ds-007"):
        instance.to_json()
    with pytest.raises(PayloadTooLargeError):
        base_instance().to_json(max_bytes=10)


def test_payload_too_large_is_an_invalid_instance_error() -> None:
    assert issubclass(PayloadTooLargeError, InvalidInstanceError)


# --- drain contract, routability, create ---------------------------------------------------


def test_with_state_draining_disables_and_serving_enables() -> None:
    serving = base_instance()
    assert serving.routable

    draining = serving.with_state(InstanceState.DRAINING, reason="operator drain")
    assert draining.payload.state is InstanceState.DRAINING
    assert draining.payload.reason == "operator drain"
    assert draining.enabled is False
    assert not draining.routable
    assert dataclasses.replace(draining, payload=serving.payload, enabled=True) == serving

    back = draining.with_state("serving")
    assert back.payload.state is InstanceState.SERVING
    assert back.payload.reason is None
    assert back.enabled is True
    assert back == serving

    encoded = json.loads(draining.to_json())
    assert encoded["enabled"] is False
    assert encoded["payload"]["state"] == "draining"
    assert encoded["payload"]["reason"] == "operator drain"


def test_with_state_keeps_payload_extras() -> None:
    instance = base_instance(payload=base_payload(extra={"rack": "a"}))
    assert instance.with_state(InstanceState.DRAINING).payload.extra == {"rack": "a"}


def test_with_state_keeps_zone_and_weight() -> None:
    instance = base_instance(payload=base_payload(zone="a", weight=7))
    for state in InstanceState:
        changed = instance.with_state(state, reason="why")
        assert (changed.zone, changed.weight) == ("a", 7)


def test_with_state_rejects_unknown_state_and_bad_reason() -> None:
    with pytest.raises(InvalidInstanceError, match=r"payload\.state"):
        base_instance().with_state("offline")
    with pytest.raises(InvalidInstanceError, match=r"payload\.reason"):
        base_instance().with_state(InstanceState.DRAINING, reason=5)  # type: ignore[arg-type]


def test_disabled_serving_instance_is_not_routable() -> None:
    assert not base_instance(enabled=False).routable


def test_create_uses_clock_in_milliseconds() -> None:
    instance = ServiceInstance.create(
        "data_servers", "ds-1", "127.0.0.1", 9001, base_payload(), clock=lambda: 1_718_000_000.1239
    )
    assert instance.registration_time_utc == 1_718_000_000_123
    assert instance.ssl_port is None
    assert instance.service_type == "DYNAMIC"
    assert instance.enabled is True
    assert instance.routable


def test_create_defaults_enabled_from_state() -> None:
    draining = base_payload(state=InstanceState.DRAINING, reason="warming up")
    instance = ServiceInstance.create("d", "ds-1", "h", 1, draining, clock=lambda: 0.0)
    assert instance.enabled is False
    forced = ServiceInstance.create("d", "ds-1", "h", 1, draining, enabled=True, clock=lambda: 0.0)
    assert forced.enabled is True


def test_create_with_real_clock_is_recent() -> None:
    import time

    before = int(time.time() * 1000)
    instance = ServiceInstance.create("d", "ds-1", "h", 1, base_payload())
    assert before <= instance.registration_time_utc <= int(time.time() * 1000)


@pytest.mark.parametrize("now", [math.nan, math.inf, -1.0, True, "now"])
def test_create_rejects_a_bad_clock(now: Any) -> None:
    with pytest.raises(InvalidInstanceError, match="registrationTimeUTC"):
        ServiceInstance.create("d", "ds-1", "h", 1, base_payload(), clock=lambda: now)


def test_create_validates_fields() -> None:
    with pytest.raises(InvalidInstanceError, match="port"):
        ServiceInstance.create("d", "ds-1", "h", 0, base_payload(), clock=lambda: 0.0)


# --- Python-side construction ----------------------------------------------------------------


def test_state_string_is_coerced_to_enum() -> None:
    payload = InstancePayload(shard=1, replica=0, docs=0, version="v", state="draining")  # type: ignore[arg-type]
    assert payload.state is InstanceState.DRAINING
    assert InstanceState.SERVING.value == str(InstanceState.SERVING) == "serving"


def test_payload_must_be_an_instance_payload() -> None:
    with pytest.raises(InvalidInstanceError, match="payload: must be an InstancePayload"):
        base_instance(payload={"shard": 1})


@pytest.mark.parametrize(
    ("extra", "field_name"),
    [
        ({"shard": 4}, "payload.shard"),
        ({"reason": "x"}, "payload.reason"),
        ({1: "x"}, "payload"),
        ({"obj": object()}, "payload.obj"),
        ({"deep": json.loads("[" * 100 + "]" * 100)}, "payload.deep"),
        ({"s": "\ud800"}, "payload.s"),
    ],
    ids=["named-shard", "named-reason", "non-str-key", "non-json", "too-deep", "surrogate"],
)
def test_bad_extra_is_rejected(extra: dict[Any, Any], field_name: str) -> None:
    with pytest.raises(InvalidInstanceError) as error:
        base_payload(extra=extra)
    assert f" {field_name}" in str(error.value)


def test_instances_are_immutable_and_isolated_from_inputs() -> None:
    extra: dict[str, Any] = {"tags": ["a"]}
    spec = copy.deepcopy(URI_SPEC)
    instance = base_instance(payload=base_payload(extra=extra), uri_spec=spec)
    extra["tags"].append("b")
    extra["new"] = 1
    spec["parts"].clear()
    assert instance.payload.extra == {"tags": ["a"]}
    assert instance.uri_spec == URI_SPEC

    with pytest.raises(dataclasses.FrozenInstanceError):
        instance.port = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        instance.payload.extra["x"] = 1  # type: ignore[index]

    out = instance.to_dict()
    out["payload"]["tags"].append("c")
    out["uriSpec"]["parts"].clear()
    assert instance.payload.extra == {"tags": ["a"]}
    assert instance.uri_spec == URI_SPEC


def test_instances_hash_pickle_and_copy() -> None:
    instance = ROUND_TRIP_CASES["extras"]
    assert hash(instance) == hash(ServiceInstance.from_json(instance.to_json()))
    assert len({instance, ServiceInstance.from_json(instance.to_json())}) == 1
    assert pickle.loads(pickle.dumps(instance)) == instance
    assert copy.deepcopy(instance) == instance
    assert "ds-007" in repr(instance)


# --- zone and weight -------------------------------------------------------------------------


def test_zone_and_weight_default_to_none_and_100_and_are_not_written() -> None:
    instance = base_instance()
    assert instance.payload.zone is None
    assert instance.payload.weight == DEFAULT_WEIGHT == 100
    assert (instance.zone, instance.weight) == (None, 100)
    payload = instance.to_dict()["payload"]
    assert "zone" not in payload
    assert "weight" not in payload


def test_zone_and_weight_are_written_after_reason_before_extras() -> None:
    payload = base_payload(
        state=InstanceState.DRAINING, reason="r", zone="eu-1", weight=300, extra={"rack": 2}
    )
    assert list(payload.to_dict()) == [
        "shard",
        "replica",
        "docs",
        "version",
        "state",
        "reason",
        "zone",
        "weight",
        "rack",
    ]
    assert payload.to_dict()["weight"] == 300
    # A weight other than the default is written even without a zone, and back.
    alone = base_instance(payload=base_payload(weight=50))
    assert json.loads(alone.to_json())["payload"]["weight"] == 50
    assert "zone" not in json.loads(alone.to_json())["payload"]
    assert ServiceInstance.from_json(alone.to_json()).weight == 50


def test_java_payload_without_zone_or_weight_reads_with_defaults_and_reencodes_identically() -> (
    None
):
    # What a Curator ServiceDiscovery registers from a payload class that has none of
    # zone, weight and group.
    raw = golden_bytes("curator_service_instance.json")
    assert b"zone" not in raw
    assert b"weight" not in raw
    assert b"group" not in raw
    instance = ServiceInstance.from_json(raw)
    assert (instance.zone, instance.weight, instance.group) == (None, DEFAULT_WEIGHT, None)
    assert instance.to_json() == raw


def test_java_nulls_read_as_unset() -> None:
    # Jackson writes an unset String / Integer field of a payload class as null.
    doc = base_doc()
    doc["payload"].update(zone=None, weight=None, group=None)
    instance = ServiceInstance.from_dict(doc)
    assert (instance.zone, instance.weight, instance.group) == (None, DEFAULT_WEIGHT, None)
    assert instance == ServiceInstance.from_dict(base_doc())
    assert instance.to_json() == golden_bytes("curator_service_instance.json")


def test_explicit_default_weight_reads_the_same_and_reencodes_without_it() -> None:
    doc = base_doc()
    doc["payload"]["weight"] = 100
    instance = ServiceInstance.from_dict(doc)
    assert instance == ServiceInstance.from_dict(base_doc())
    assert "weight" not in instance.to_dict()["payload"]
    # From then on the encoding is stable.
    assert ServiceInstance.from_json(instance.to_json()).to_json() == instance.to_json()


def test_java_payload_with_zone_and_weight() -> None:
    doc = base_doc()
    doc["payload"].update(zone="us-east-1a", weight=400)
    raw = json.dumps(doc, separators=(",", ":")).encode()
    instance = ServiceInstance.from_json(raw)
    assert (instance.zone, instance.weight) == ("us-east-1a", 400)
    assert instance.payload.extra == {"@class": "com.example.search.DataServerPayload"}
    assert instance.to_json() == raw


def test_java_payload_with_a_group_added_last() -> None:
    # A Java payload class that gained a `group` field after the others: Jackson writes
    # it last, and so do we, so the document re-encodes byte for byte.
    doc = base_doc()
    doc["payload"].update(zone="us-east-1a", weight=400, group="g2")
    raw = json.dumps(doc, separators=(",", ":")).encode()
    instance = ServiceInstance.from_json(raw)
    assert (instance.zone, instance.weight, instance.group) == ("us-east-1a", 400, "g2")
    assert instance.payload.group == "g2"
    assert "group" not in instance.payload.extra
    assert instance.to_json() == raw


def test_group_is_written_only_when_set_after_weight_before_extras() -> None:
    assert "group" not in base_instance().to_dict()["payload"]
    assert base_instance().group is None
    payload = base_payload(zone="z", weight=3, group="g", extra={"rack": 1})
    assert list(payload.to_dict())[-4:] == ["zone", "weight", "group", "rack"]
    alone = base_instance(payload=base_payload(group="g"))
    assert list(alone.to_dict()["payload"])[-1] == "group"
    assert ServiceInstance.from_json(alone.to_json()).group == "g"


def test_group_takes_part_in_equality_and_survives_a_change_of_state() -> None:
    grouped = base_instance(payload=base_payload(group="g1"))
    assert grouped != base_instance()
    assert grouped != base_instance(payload=base_payload(group="g2"))
    assert grouped.with_state(InstanceState.DRAINING, "drain").group == "g1"


@pytest.mark.parametrize("group", ["a", "g1", "copy-a", "dc1:g.2_x", "g" * 64])
def test_valid_groups(group: str) -> None:
    assert validate_group(group) == group
    assert base_payload(group=group).group == group


@pytest.mark.parametrize("group", ["", " ", "a b", "a/b", "a\n", "gé", "g" * 65, 3, ["g"], True])
def test_invalid_groups_are_rejected_naming_the_field(group: Any) -> None:
    with pytest.raises(InvalidInstanceError, match=r"^invalid ServiceInstance: payload\.group: "):
        base_payload(group=group)
    with pytest.raises(InvalidInstanceError, match=r" --group: "):
        validate_group(group, "--group")


@pytest.mark.parametrize(
    "zone", ["a", "eu-west-1b", "us-central1-a", "dc1:rack-7", "Z_9.x", "z" * 64, "-", "..."]
)
def test_valid_zones(zone: str) -> None:
    assert validate_zone(zone) == zone
    assert base_payload(zone=zone).zone == zone


@pytest.mark.parametrize(
    "zone", ["", " ", "a b", "a/b", "a\n", "\ta", "zoné", "a@b", "z" * 65, "\ud800", 3, b"a"]
)
def test_invalid_zones_are_rejected_naming_the_field(zone: Any) -> None:
    with pytest.raises(InvalidInstanceError, match=r"^invalid ServiceInstance: payload\.zone: "):
        base_payload(zone=zone)
    with pytest.raises(InvalidInstanceError, match=r" --zone: "):
        validate_zone(zone, "--zone")


@pytest.mark.parametrize("weight", [1, 2, 100, 999, 1000])
def test_valid_weights(weight: int) -> None:
    assert validate_weight(weight) == weight
    assert base_payload(weight=weight).weight == weight


@pytest.mark.parametrize("weight", [0, -1, 1001, 2**70, True, False, 1.0, "5", None])
def test_invalid_weights_are_rejected_naming_the_field(weight: Any) -> None:
    with pytest.raises(InvalidInstanceError, match=r"^invalid ServiceInstance: payload\.weight: "):
        base_payload(weight=weight)


@pytest.mark.parametrize("key", ["zone", "weight", "group"])
def test_zone_weight_and_group_cannot_hide_in_extra(key: str) -> None:
    with pytest.raises(InvalidInstanceError, match=rf"payload\.{key}: is a named payload field"):
        base_payload(extra={key: "a" if key == "zone" else 5})


def test_zone_and_weight_take_part_in_equality_and_hash() -> None:
    plain = base_instance()
    zoned = base_instance(payload=base_payload(zone="a"))
    weighted = base_instance(payload=base_payload(weight=5))
    assert len({plain, zoned, weighted}) == 3
    assert zoned == base_instance(payload=base_payload(zone="a", weight=100))


@pytest.mark.parametrize(
    ("changes", "field_name"),
    [
        ({"zone": "no spaces"}, "payload.zone"),
        ({"zone": ""}, "payload.zone"),
        ({"weight": 0}, "payload.weight"),
        ({"weight": True}, "payload.weight"),
        ({"weight": "heavy"}, "payload.weight"),
        ({"group": "no spaces"}, "payload.group"),
        ({"group": 2}, "payload.group"),
    ],
)
def test_a_znode_with_a_bad_zone_or_weight_is_skipped_as_malformed(
    changes: dict[str, Any], field_name: str
) -> None:
    # The membership watcher's decoding of one child (the ZooKeeper side is covered
    # by tests/integration/test_membership.py): an InvalidInstanceError, reported as malformed.
    doc = base_doc()
    doc["payload"].update(changes)
    reader = ChildReader(None, DATA_SERVERS_PATH)  # type: ignore[arg-type]
    instance, problem, _ = reader.decode("ds-007", json.dumps(doc).encode(), None)  # type: ignore[arg-type]
    assert instance is None
    assert problem is not None
    assert problem.startswith(f"malformed: invalid ServiceInstance: {field_name}: ")
