"""Who may call a server's admin endpoints (``POST /admin/...`` on the data servers).

Never a browser's cross-site request; with an admin token, only a request bearing it;
without one, only a loopback request that names a loopback ``Host`` and carries
``X-Discovery-Admin: 1``. Clients send :func:`admin_headers`.

Design: docs/design/security.md, "Admin endpoints".
"""

from __future__ import annotations

import hmac
import ipaddress
from typing import Final

from aiohttp import web

__all__ = ["ADMIN_HEADER", "admin_headers", "refuse_admin"]

#: The header an admin request carries when no token is set (browsers cannot send it
#: cross-site without a preflight).
ADMIN_HEADER: Final = "X-Discovery-Admin"

_BROWSER_CROSS_SITE: Final = frozenset({"cross-site", "same-site"})


def admin_headers(token: str | None = None) -> dict[str, str]:
    """The headers of an admin request: :data:`ADMIN_HEADER`, and the bearer ``token``."""
    headers = {ADMIN_HEADER: "1"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return headers


def _refusal(status: int, message: str) -> web.Response:
    response = web.json_response({"error": message}, status=status)
    if status == 401:
        response.headers["WWW-Authenticate"] = 'Bearer realm="admin"'
    return response


def _cross_site(request: web.BaseRequest) -> str | None:
    """Why ``request`` is a browser's cross-site request, or None."""
    fetch_site = request.headers.get("Sec-Fetch-Site")
    if fetch_site is not None and fetch_site.strip().lower() in _BROWSER_CROSS_SITE:
        return f"Sec-Fetch-Site: {fetch_site.strip().lower()}"
    origin = request.headers.get("Origin")
    if origin is not None:
        own = f"{request.scheme}://{request.host}"
        if origin.strip().lower() != own.lower():
            return "its Origin is another site"
    return None


def _loopback_host(host: str | None) -> bool:
    """True if a ``Host`` header names this machine's loopback (or is absent)."""
    if host is None:
        return True  # HTTP/1.0 without Host: no browser sends that
    name = host.strip().lower()
    if name.startswith("["):
        name = name[1:].partition("]")[0]
    elif name.count(":") == 1:
        name = name.partition(":")[0]
    name = name.rstrip(".")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _loopback_peer(request: web.BaseRequest) -> bool:
    try:
        return ipaddress.ip_address(request.remote or "").is_loopback
    except ValueError:
        return False


def refuse_admin(request: web.BaseRequest, token: str | None) -> web.Response | None:
    """None if ``request`` may use the admin endpoints; else the JSON answer refusing it.

    ``token`` is the server's admin token (None: loopback with the admin header). Never
    raises: any header, whatever bytes it holds, gets an answer.
    """
    why = _cross_site(request)
    if why is not None:
        return _refusal(403, f"admin refuses a browser's cross-site request ({why})")
    if token is not None:
        header = request.headers.get("Authorization")
        scheme, _, presented = (header or "").partition(" ")
        if scheme.lower() != "bearer" or not presented:
            return _refusal(401, "admin requires 'Authorization: Bearer <token>'")
        # aiohttp hands over undecodable bytes as lone surrogates, which neither encode
        # nor can match an ASCII token: the header is malformed, not a wrong token.
        if not presented.isascii():
            return _refusal(401, "malformed Authorization header: the token is not ASCII")
        if not hmac.compare_digest(presented.encode("ascii"), token.encode("ascii")):
            return _refusal(403, "wrong admin token")
        return None
    if not _loopback_peer(request):
        return _refusal(403, "admin is only allowed from loopback unless --admin-token is set")
    if not _loopback_host(request.headers.get("Host")):
        return _refusal(
            403, "admin without --admin-token requires a loopback name in the Host header"
        )
    if request.headers.get(ADMIN_HEADER, "").strip() != "1":
        return _refusal(403, f"admin without --admin-token requires the header '{ADMIN_HEADER}: 1'")
    return None
