"""Which addresses a registration may name, and which a search server will send to.

:func:`validate_address` is the contract: an IP literal or an ASCII DNS name, never
link-local, multicast or unspecified in any spelling, nor a name the C resolver reads as a
number. :class:`NetworkPolicy` is a deployment's narrowing (``--allowed-networks``, and
loopback addresses for a search server that does not listen on loopback,
:func:`is_loopback_host`). Nothing here does I/O or logs.

Contract: docs/contracts.md, "The registration document"; why: docs/design/security.md,
"Input hardening".
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from discovery.errors import ConfigError, InvalidInstanceError

__all__ = [
    "MAX_NAME_LENGTH",
    "NetworkPolicy",
    "address_problem",
    "is_loopback_host",
    "parse_networks",
    "validate_address",
]

MAX_NAME_LENGTH: Final = 253
"""Longest DNS name, in characters, without a trailing dot (RFC 1035's 255 octets on
the wire)."""

_NAME: Final = re.compile(
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)*"
    r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
)
# A dotted quad as ipaddress reads one (no leading zeros): every registration the
# leader decodes has an address, so the common case must not cost a parse.
_OCTET: Final = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_DOTTED_QUAD: Final = re.compile(rf"({_OCTET})\.({_OCTET})\.{_OCTET}\.{_OCTET}")
# Messages end up in logs: a 60 KiB address must not.
_MAX_SHOWN: Final = 60

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def _shown(value: str) -> str:
    text = repr(value)
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."


def _literal(value: str) -> IPAddress | None:
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        return None
    return address


def _refused_kind(address: IPAddress) -> str | None:
    """Why the contract refuses ``address`` whatever the deployment, or None."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.scope_id is not None:
            return "an IPv6 address with a zone index"
        mapped = address.ipv4_mapped
        if mapped is not None:
            kind = _refused_kind(mapped)
            return None if kind is None else f"{kind} (IPv4-mapped)"
    if address.is_unspecified:
        return "the unspecified address"
    if address.is_link_local:
        return "a link-local address"
    if address.is_multicast:
        return "a multicast address"
    if isinstance(address, ipaddress.IPv4Address) and address == ipaddress.IPv4Address(
        "255.255.255.255"
    ):
        return "the broadcast address"
    return None


def _numeric_spelling(value: str) -> bool:
    # glibc's getaddrinfo reads any inet_aton form as a number before it asks DNS:
    # "2130706433" is 127.0.0.1, "0251.0376.1.1" is 169.254.1.1.
    try:
        socket.inet_aton(value)
    except (OSError, ValueError):
        return False
    return True


def address_problem(value: object) -> str | None:
    """Why ``value`` is not a usable registration address, or None if it is.

    See the module docstring for the rules. Never raises.
    """
    if not isinstance(value, str):
        return f"must be a string, got {type(value).__name__}"
    if not value:
        return "must not be empty"
    quad = _DOTTED_QUAD.fullmatch(value)
    if quad is not None:
        first, second = int(quad[1]), int(quad[2])
        if not (first == 0 or (first == 169 and second == 254) or first >= 224):
            return None  # neither unspecified, link-local, multicast nor broadcast
    # Only a dotted quad or a text with a colon can be an IP literal; anything else is
    # judged as a name (a non-canonical IPv4 spelling is refused there).
    literal = _literal(value) if quad is not None or ":" in value else None
    if literal is not None:
        kind = _refused_kind(literal)
        if kind is not None:
            return f"{_shown(value)} is {kind}, which a registration may not name"
        return None
    if not value.isascii():
        return (
            f"must be an IP address or an ASCII DNS name (use the punycode form of an "
            f"internationalised name), got {_shown(value)}"
        )
    if len(value) > MAX_NAME_LENGTH:
        return f"a DNS name must be at most {MAX_NAME_LENGTH} characters, got {len(value)}"
    if _NAME.fullmatch(value) is None:
        return (
            "must be an IP address or a DNS name of labels of 1-63 letters, digits "
            f"and hyphens (not at a label's start or end), got {_shown(value)}"
        )
    if _numeric_spelling(value):
        return (
            f"{_shown(value)} is a numeric address in a non-standard spelling; write it "
            "as a dotted quad"
        )
    return None


def validate_address(value: object, field_name: str = "address") -> str:
    """Return ``value`` if it is a usable registration address, else raise.

    Raises:
        InvalidInstanceError: naming ``field_name`` (the document's ``address``, or
            the flag a configuration was given).
    """
    problem = address_problem(value)
    if problem is not None:
        raise InvalidInstanceError(f"invalid ServiceInstance: {field_name}: {problem}")
    assert isinstance(value, str)
    return value


def parse_networks(text: str | None, flag: str = "--allowed-networks") -> tuple[IPNetwork, ...]:
    """``CIDR,CIDR,...`` as networks; empty or None: no narrowing (an empty tuple).

    Raises:
        ConfigError: a part that is not a network, naming ``flag``.
    """
    if text is None or not text.strip():
        return ()
    networks: list[IPNetwork] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            networks.append(ipaddress.ip_network(part, strict=False))
        except ValueError as exc:
            raise ConfigError(f"{flag}: {_shown(part)} is not a network ({exc})") from None
    return tuple(networks)


# Why loopback is refused, and how to admit it: the end of a refusal's message.
_LOOPBACK_REFUSED: Final = (
    ", refused because this search server does not listen on loopback (--host); "
    "--allowed-networks with a loopback network admits it"
)


def _is_localhost_name(value: str) -> bool:
    # RFC 6761: "localhost" and every name under it resolve to the loopback interface.
    name = value.rstrip(".").lower()
    return name == "localhost" or name.endswith(".localhost")


def is_loopback_host(host: str) -> bool:
    """Whether a server told to listen on ``host`` (its ``--host``) listens on the
    loopback interface only: a loopback IP literal (``127.0.0.0/8``, ``::1``, their
    IPv4-mapped form) or ``localhost``. Any other address, the wildcards (``0.0.0.0``,
    ``::``, empty) and any other name (what it resolves to is not known here) are not.
    Never raises.
    """
    literal = _literal(host.strip("[]"))
    if literal is None:
        return _is_localhost_name(host)
    if isinstance(literal, ipaddress.IPv6Address) and literal.ipv4_mapped is not None:
        literal = literal.ipv4_mapped
    return literal.is_loopback


@dataclass(frozen=True, slots=True)
class NetworkPolicy:
    """The networks a deployment admits data servers in; no networks: any (the
    contract's own refusals, :func:`validate_address`, always apply).

    ``loopback`` False refuses loopback addresses (``127.0.0.0/8``, ``::1``, and the
    name ``localhost``) while no ``networks`` are given: a search server that listens
    on another interface serves other machines, and a registration naming its own
    loopback interface aims its queries at whatever listens there. ``networks`` given,
    they alone decide: a loopback network among them admits loopback addresses.
    """

    networks: tuple[IPNetwork, ...] = ()
    loopback: bool = True

    @classmethod
    def of(cls, networks: Iterable[IPNetwork], *, loopback: bool = True) -> NetworkPolicy:
        return cls(tuple(networks), loopback)

    def with_loopback(self, loopback: bool) -> NetworkPolicy:
        """This policy, admitting loopback addresses or not (see the class docstring)."""
        return self if loopback == self.loopback else dataclasses.replace(self, loopback=loopback)

    @property
    def narrows(self) -> bool:
        """Whether this policy refuses anything beyond the contract."""
        return bool(self.networks) or not self.loopback

    def problem(self, address: str) -> str | None:
        """Why ``address`` is outside the admitted networks, or None.

        A DNS name is not judged here (None), except ``localhost`` while loopback is
        refused: only what a name resolves to can be, by :meth:`resolved_problem` when
        a connection is made.
        """
        if not self.narrows:
            return None
        literal = _literal(address)
        if literal is None:
            if not self.loopback and not self.networks and _is_localhost_name(address):
                return f"{_shown(address)} names the loopback interface{_LOOPBACK_REFUSED}"
            return None
        return self.resolved_problem(literal)

    def resolved_problem(self, address: IPAddress | str) -> str | None:
        """Why a resolved address is refused (contract or policy), or None."""
        literal = _literal(address) if isinstance(address, str) else address
        if literal is None:
            return f"{_shown(str(address))} is not an IP address"
        kind = _refused_kind(literal)
        if kind is not None:
            return f"{literal} is {kind}"
        if isinstance(literal, ipaddress.IPv6Address) and literal.ipv4_mapped is not None:
            literal = literal.ipv4_mapped
        if self.networks:
            if not any(
                literal.version == network.version and literal in network
                for network in self.networks
            ):
                allowed = ",".join(str(network) for network in self.networks)
                return f"{literal} is outside the allowed networks ({allowed})"
        elif not self.loopback and literal.is_loopback:
            return f"{literal} is a loopback address{_LOOPBACK_REFUSED}"
        return None

    def __str__(self) -> str:
        listed = ",".join(str(network) for network in self.networks)
        return listed or ("any" if self.loopback else "any but loopback")
