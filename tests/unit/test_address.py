"""Registration addresses: what the contract admits, and a deployment's narrowing."""

from __future__ import annotations

import ipaddress
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from discovery.address import (
    NetworkPolicy,
    address_problem,
    is_loopback_host,
    parse_networks,
    validate_address,
)
from discovery.errors import ConfigError, InvalidInstanceError

ACCEPTED = [
    "10.0.0.7",
    "127.0.0.1",
    "192.0.2.1",
    "::1",
    "2001:db8::7",
    "localhost",
    "ds-7.search.example",
    "xn--dt-via5a.example",  # the punycode spelling of an internationalised name
    "a" * 63 + ".example",
    ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 61]),  # 253 characters
    "123abc.example",
    "1e100.net",
]

REFUSED = [
    ("", "must not be empty"),
    ("dätä.example", "ASCII DNS name"),
    ("a" * 64 + ".example", "labels of 1-63"),
    (".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 62]), "at most 253"),
    ("-lead.example", "labels of 1-63"),
    ("trail-.example", "labels of 1-63"),
    ("two..dots", "labels of 1-63"),
    ("trailing.dot.", "labels of 1-63"),
    ("under_score.example", "labels of 1-63"),
    ("host:9001", "labels of 1-63"),
    ("[::1]", "labels of 1-63"),
    ("10.0.0.7\r\nX-Injected: 1", "labels of 1-63"),
    ("0.0.0.0", "unspecified"),
    ("::", "unspecified"),
    ("169.254.169.254", "link-local"),
    ("fe80::1", "link-local"),
    ("fe80::1%eth0", "zone index"),
    ("224.0.0.1", "multicast"),
    ("ff02::1", "multicast"),
    ("255.255.255.255", "broadcast"),
    ("::ffff:169.254.169.254", "link-local address (IPv4-mapped)"),
    # inet_aton spellings the resolver reads as numbers before asking DNS.
    ("2130706433", "non-standard spelling"),
    ("0251.0376.1.1", "non-standard spelling"),
    ("0x7f.1", "non-standard spelling"),
    ("10.1", "non-standard spelling"),
    ("0", "non-standard spelling"),
]


@pytest.mark.parametrize("address", ACCEPTED)
def test_the_contract_admits(address: str) -> None:
    assert address_problem(address) is None
    assert validate_address(address) == address


@pytest.mark.parametrize(("address", "why"), REFUSED)
def test_the_contract_refuses(address: str, why: str) -> None:
    problem = address_problem(address)
    assert problem is not None
    assert why in problem
    with pytest.raises(
        InvalidInstanceError, match=f"invalid ServiceInstance: --advertise: .*{re.escape(why)}"
    ):
        validate_address(address, "--advertise")


def test_a_non_string_is_refused_not_raised() -> None:
    assert address_problem(10) == "must be a string, got int"
    assert address_problem(None) == "must be a string, got NoneType"


def test_messages_show_a_bounded_excerpt() -> None:
    problem = address_problem("ü" * 60_000)
    assert problem is not None
    assert len(problem) < 300


@given(st.text(max_size=300))
def test_any_text_is_judged_without_raising_and_what_passes_is_plain_ascii(text: str) -> None:
    problem = address_problem(text)
    if problem is None:
        # What a search server will encode into a request and hand to the resolver.
        assert text.isascii()
        assert not any(c in text for c in " \t\r\n/[]@?#%")


@given(st.ip_addresses())
def test_every_ip_literal_is_judged_by_its_kind(address: ipaddress.IPv4Address) -> None:
    problem = address_problem(str(address))
    refused = address.is_link_local or address.is_multicast or address.is_unspecified
    if refused:
        assert problem is not None
    elif str(address) != "255.255.255.255" and not (
        isinstance(address, ipaddress.IPv6Address)
        and address.ipv4_mapped is not None
        and address_problem(str(address.ipv4_mapped)) is not None
    ):
        assert problem is None


def test_parse_networks_names_its_flag() -> None:
    assert parse_networks(None) == ()
    assert parse_networks(" ") == ()
    assert parse_networks("10.0.0.0/8, 2001:db8::/32") == (
        ipaddress.ip_network("10.0.0.0/8"),
        ipaddress.ip_network("2001:db8::/32"),
    )
    with pytest.raises(ConfigError, match="--allowed-networks: 'ten' is not a network"):
        parse_networks("10.0.0.0/8,ten")


def test_the_policy_narrows_literals_and_leaves_names_to_their_resolution() -> None:
    policy = NetworkPolicy.of(parse_networks("10.0.0.0/8,2001:db8::/32"))
    assert policy.narrows
    assert policy.problem("10.1.2.3") is None
    assert policy.problem("2001:db8::1") is None
    assert policy.problem("::ffff:10.1.2.3") is None
    assert "outside the allowed networks" in (policy.problem("192.168.1.1") or "")
    assert "outside the allowed networks" in (policy.problem("::1") or "")
    assert policy.problem("ds-7.example") is None  # judged when resolved
    assert "outside" in (policy.resolved_problem("172.16.0.1") or "")
    assert "link-local" in (policy.resolved_problem("169.254.169.254") or "")
    assert policy.resolved_problem("10.0.0.1") is None


def test_no_networks_admit_every_address_the_contract_admits() -> None:
    policy = NetworkPolicy()
    assert not policy.narrows
    assert policy.problem("192.168.1.1") is None
    assert "link-local" in (policy.resolved_problem("fe80::1") or "")
    assert str(policy) == "any"


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.3.2.1", True),
        ("::1", True),
        ("[::1]", True),
        ("::ffff:127.0.0.1", True),
        ("localhost", True),
        ("LOCALHOST.", True),
        ("0.0.0.0", False),
        ("::", False),
        ("", False),
        ("10.0.1.5", False),
        ("2001:db8::7", False),
        ("search-1", False),  # a name: what it resolves to is not known here
    ],
)
def test_a_search_server_listens_on_loopback_only_at_a_loopback_host(
    host: str, loopback: bool
) -> None:
    assert is_loopback_host(host) is loopback


def test_loopback_refused_without_networks_names_the_way_to_admit_it() -> None:
    policy = NetworkPolicy(loopback=False)
    assert policy.narrows
    assert str(policy) == "any but loopback"
    for address in (
        "127.0.0.1",
        "127.8.9.10",
        "::1",
        "::ffff:127.0.0.1",
        "localhost",
        "a.localhost",
    ):
        problem = policy.problem(address) or ""
        assert "loopback" in problem, address
        assert "--allowed-networks" in problem, address
    # Checked again after resolution (a name that resolves to loopback).
    assert "loopback" in (policy.resolved_problem("127.0.0.1") or "")
    assert "loopback" in (policy.resolved_problem("::1") or "")
    for address in ("10.1.2.3", "192.0.2.1", "2001:db8::1", "ds-7.example"):
        assert policy.problem(address) is None, address
    assert policy.resolved_problem("10.1.2.3") is None
    # The contract's own refusals stay.
    assert "link-local" in (policy.resolved_problem("169.254.169.254") or "")


def test_networks_given_decide_loopback_alone() -> None:
    listed = NetworkPolicy.of(parse_networks("10.0.0.0/8,127.0.0.0/8"), loopback=False)
    assert listed.problem("127.0.0.1") is None
    assert listed.resolved_problem("127.0.0.1") is None
    assert listed.problem("localhost") is None  # a name: judged when resolved
    unlisted = NetworkPolicy.of(parse_networks("10.0.0.0/8"), loopback=False)
    assert "outside the allowed networks" in (unlisted.problem("127.0.0.1") or "")
    assert NetworkPolicy().with_loopback(False) == NetworkPolicy(loopback=False)
