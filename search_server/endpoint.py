"""Where a data server listens (:class:`Endpoint`), judged once, and how a peer's bytes
are quoted in messages (:func:`excerpt`).

An endpoint is made from an untrusted registration: :meth:`Endpoint.of` never raises,
and one that cannot be used carries the reason, failing only its own requests. Pure:
no I/O. Re-exported by :mod:`search_server.httpclient`, whose requests go to them.

Design: docs/design/search-server.md, "One data server's problem is its own, in the client too".
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["EXCERPT_CHARS", "Endpoint", "excerpt"]

#: Most characters of a peer's bytes quoted in an error message or a log line.
EXCERPT_CHARS = 200

# What a host may hold to be written in a Host header and given to the resolver: DNS
# names (underscores too, as some internal names have them), IPv4 and IPv6 literals
# (with a %zone). Anything else (non-ASCII, whitespace, CR/LF, '/', '@'...) could
# not be encoded, would end or inject a header, or is no host at all.
_HOST = re.compile(r"[A-Za-z0-9._:%-]{1,255}")


def excerpt(data: bytes | str, limit: int = EXCERPT_CHARS) -> str:
    """``repr`` of ``data`` cut to at most ``limit`` characters (``...`` marks a cut):
    safe to put in a log line or an error whatever a peer sent."""
    text = repr(data[:limit])
    if len(text) > limit or len(data) > limit:
        return text[: max(limit - 3, 0)] + "..."
    return text


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where a data server listens, with the request tail pre-encoded once.

    ``suffix`` ends every request line sent there (version, ``Host`` header, blank line).
    ``problem`` says why no request can be sent there (then ``suffix`` is empty and
    every request to it fails with
    :class:`~search_server.httpclient.SubrequestError`); ``None`` when usable.
    """

    host: str
    port: int
    suffix: bytes
    problem: str | None = None

    @classmethod
    def of(cls, host: str, port: int) -> Endpoint:
        """The endpoint of ``host``/``port``; never raises (a registration is untrusted:
        one that cannot be used fails its own requests, not the routing table)."""
        problem = _unusable(host, port)
        if problem is not None:
            return cls(host, port, b"", problem)
        authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        return cls(host, port, f" HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode("ascii"))

    @property
    def where(self) -> str:
        """``host:port`` for messages, the host quoted and cut if it is not a plain one."""
        if self.problem is None:
            return f"{self.host}:{self.port}"
        return f"{excerpt(self.host)}:{excerpt(str(self.port), 20)}"


def _unusable(host: object, port: object) -> str | None:
    """Why no request can go to ``host``/``port``, or ``None``."""
    if type(port) is not int or not 0 < port < 65536:
        # uvloop would wrap 70000 round to 4464: refuse rather than reach another server.
        return f"port {excerpt(repr(port), 40)} is not an integer in 1-65535"
    if not isinstance(host, str):
        return f"host {excerpt(repr(host), 60)} is not a string"
    if _HOST.fullmatch(host) is not None:
        return None
    if not host:
        return "the host is empty"
    if len(host) > 255:
        return f"the host is {len(host)} characters long (at most 255)"
    if not host.isascii():
        return (
            f"host {excerpt(host)} is not ASCII (register an internationalised name in "
            "its xn-- form)"
        )
    bad = next(c for c in host if _HOST.fullmatch(c) is None)
    if not bad.isprintable() or bad.isspace():
        return f"host {excerpt(host)} holds whitespace or control characters"
    return f"host {excerpt(host)} holds {bad!r}, not allowed in a host name or address"
