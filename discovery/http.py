"""HTTP input handling shared by the data and search servers: parsers, JSON errors, counts.

Handlers parse input with the pure functions here, which raise :class:`BadRequestError`
naming the parameter; :func:`json_app`'s middleware answers it with a 400 and counts it.
Both servers share the search parameters' parser, so whatever a search server accepts,
every data server accepts.

Design: docs/design/security.md, "Input hardening".
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, NoReturn

from aiohttp import web
from prometheus_client import CollectorRegistry

from discovery.errors import BadRequestError
from discovery.metrics import HttpMetrics

__all__ = [
    "HTTP_METRICS",
    "MAX_BODY_BYTES",
    "MAX_QUERY_BYTES",
    "MAX_QUERY_LENGTH",
    "SearchParams",
    "json_app",
    "json_error",
    "json_errors",
    "parse_float",
    "parse_int",
    "parse_json_body",
    "parse_query_text",
    "parse_search_params",
    "read_json_body",
]

#: Longest query text the servers accept, in characters.
MAX_QUERY_LENGTH: Final = 1024
#: Longest query text in bytes of UTF-8. The search server forwards ``q`` percent-encoded
#: (3 URL characters per byte) to every data server, whose HTTP parser refuses a request
#: target over 8190 bytes; 2048 bytes keep the forwarded target under 6.2 KB.
MAX_QUERY_BYTES: Final = 2048
#: Largest JSON request body (admin requests) the servers read.
MAX_BODY_BYTES: Final = 64 * 1024

#: Where :func:`json_app` keeps the application's :class:`HttpMetrics`.
HTTP_METRICS: Final = web.AppKey("discovery_http_metrics", HttpMetrics)

# Python's int() also takes "1_000", " 7 " and non-ASCII digits ("٣"); a parameter is
# a plain ASCII decimal here. 18 digits always fit a signed 64-bit integer, so no
# client can make us convert a huge number.
_INTEGER: Final = re.compile(r"[+-]?[0-9]{1,18}")
_INTEGER_LIKE: Final = re.compile(r"[+-]?[0-9]+")
# Likewise for a number with a fraction: plain ASCII decimals ("0.95", ".5", "7"), no
# exponent, "inf" or "nan" (float() takes all three, and "1e999" is infinite); 18 digits
# each side of the point are more precision than a double holds.
_DECIMAL: Final = re.compile(r"[+-]?(?:[0-9]{1,18}(?:\.[0-9]{0,18})?|\.[0-9]{1,18})")
_DECIMAL_LIKE: Final = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)")
# Nesting beyond this is refused before json.loads could recurse into it.
_MAX_BODY_NESTING: Final = 32

_STATUS_REASONS: Final = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "too_large",
    414: "too_large",
    415: "unsupported_media_type",
}


def _short(value: object, limit: int = 40) -> str:
    # Error messages are echoed to clients and logged; a 1 KiB parameter must not be.
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _reject(parameter: str, reason: str, message: str) -> NoReturn:
    raise BadRequestError(parameter, reason, message)


# -- answers and the middleware -----------------------------------------------------


def json_error(status: int, message: str, *, parameter: str | None = None) -> web.Response:
    """An error answer: ``{"error": message}`` (and ``"parameter"`` if given) with ``status``."""
    body: dict[str, Any] = {"error": message}
    if parameter is not None:
        body["parameter"] = parameter
    return web.json_response(body, status=status)


def json_app(registry: CollectorRegistry, **kwargs: Any) -> web.Application:
    """A ``web.Application`` with :func:`json_errors` and rejection metrics on ``registry``.

    Call once per registry (a registry refuses a second set of the same metrics).
    ``kwargs`` are passed to ``web.Application`` (middlewares are added after ours).
    """
    middlewares = [json_errors, *kwargs.pop("middlewares", ())]
    app = web.Application(middlewares=middlewares, **kwargs)
    app[HTTP_METRICS] = HttpMetrics(registry)
    return app


def _endpoint(request: web.Request) -> str:
    # The route's pattern, never the raw path: a label per scanned URL would grow
    # the registry without bound.
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else "unmatched"


def _count(request: web.Request, parameter: str, reason: str) -> None:
    metrics = request.app.get(HTTP_METRICS)
    if metrics is not None:
        metrics.rejected.labels(
            endpoint=_endpoint(request), parameter=parameter, reason=reason
        ).inc()


def _status_reason(status: int) -> str:
    return _STATUS_REASONS.get(status, f"http_{status}")


@web.middleware
async def json_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Answer every error as JSON and count every 4xx answer.

    :class:`BadRequestError` becomes 400 naming the parameter; aiohttp's HTTP errors
    (unknown path, wrong method, body too large) keep their status, as JSON. 4xx
    answers a handler returns itself (such as an admin refusal) are counted by their
    status. Other exceptions are left to aiohttp (logged, 500): a streaming handler
    may already have sent its headers, so no answer can be substituted here.
    """
    try:
        response = await handler(request)
    except BadRequestError as exc:
        _count(request, exc.parameter, exc.reason)
        return json_error(400, str(exc), parameter=exc.parameter)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        if exc.status < 500:
            _count(request, "-", _status_reason(exc.status))
        return json_error(exc.status, exc.reason)
    if 400 <= response.status < 500:
        _count(request, "-", _status_reason(response.status))
    return response


# -- parameters ---------------------------------------------------------------------


def parse_int(name: str, raw: str | None, default: int, low: int, high: int) -> int:
    """Parameter ``name`` as an integer in ``low..high``; ``default`` if ``raw`` is None.

    Only an optional sign and ASCII digits are accepted.

    Raises:
        BadRequestError: not an integer (``not_integer``) or out of range
            (``out_of_range``); the message names the parameter.
    """
    if raw is None:
        return default
    if _INTEGER.fullmatch(raw) is None:
        if _INTEGER_LIKE.fullmatch(raw) is not None:
            _reject(
                name,
                "out_of_range",
                f"'{name}' must be in {low}..{high}, got a {len(raw.lstrip('+-'))}-digit number",
            )
        _reject(name, "not_integer", f"'{name}' must be an integer, got {_short(raw)}")
    value = int(raw)
    if not low <= value <= high:
        _reject(name, "out_of_range", f"'{name}' must be in {low}..{high}, got {value}")
    return value


def parse_float(name: str, raw: str | None, default: float, low: float, high: float) -> float:
    """Parameter ``name`` as a number in ``low..high``; ``default`` if ``raw`` is None.

    Only an optional sign, ASCII digits and one decimal point are accepted (at most 18
    digits each side of it): no exponent, ``inf`` or ``nan``.

    Raises:
        BadRequestError: not such a number (``not_number``) or out of range
            (``out_of_range``); the message names the parameter.
    """
    if raw is None:
        return default
    if _DECIMAL.fullmatch(raw) is None:
        if _DECIMAL_LIKE.fullmatch(raw) is not None:
            _reject(
                name,
                "not_number",
                f"'{name}' must be a number with at most 18 digits each side of the point, "
                f"got {_short(raw)}",
            )
        _reject(name, "not_number", f"'{name}' must be a number, got {_short(raw)}")
    value = float(raw)
    if not low <= value <= high:
        _reject(name, "out_of_range", f"'{name}' must be in {low:g}..{high:g}, got {value:g}")
    return value


def parse_query_text(
    raw: str | None, *, max_length: int = MAX_QUERY_LENGTH, max_bytes: int = MAX_QUERY_BYTES
) -> str:
    """The ``q`` parameter: present, not blank, at most ``max_length`` characters and
    ``max_bytes`` bytes of UTF-8.

    Raises:
        BadRequestError: ``missing``, ``blank``, ``too_long`` or ``not_unicode``.
    """
    if raw is None:
        _reject("q", "missing", "missing query parameter 'q'")
    if not raw.strip():
        _reject("q", "blank", "missing query parameter 'q' (it is blank)")
    if len(raw) > max_length:
        _reject("q", "too_long", f"'q': query longer than {max_length} characters ({len(raw)})")
    try:
        size = len(raw.encode("utf-8"))
    except UnicodeEncodeError:
        # Not reachable over HTTP (the URL decoder replaces bad bytes), but the
        # function is also used directly.
        _reject("q", "not_unicode", "'q' contains a lone surrogate, which is not valid text")
    if size > max_bytes:
        _reject("q", "too_long", f"'q': query longer than {max_bytes} bytes of UTF-8 ({size})")
    return raw


@dataclass(frozen=True, slots=True)
class SearchParams:
    """The validated parameters of ``GET /search``.

    ``timeout_ms`` is None where the endpoint takes no deadline (the data server).
    """

    q: str
    k: int
    timeout_ms: int | None = None


def parse_search_params(
    params: Mapping[str, str],
    *,
    max_k: int,
    default_k: int = 10,
    default_timeout_ms: int | None = None,
    max_timeout_ms: int | None = None,
) -> SearchParams:
    """Validate ``q``, ``k`` and (when ``max_timeout_ms`` is given) ``timeout_ms``.

    ``params`` is the request's query (``request.query``; its first value counts for
    a repeated name). Unknown parameters are ignored, so that a newer client still
    works. Checked in the order q, k, timeout_ms; the first problem is reported.

    Raises:
        BadRequestError: naming ``q``, ``k`` or ``timeout_ms``.
    """
    q = parse_query_text(params.get("q"))
    k = parse_int("k", params.get("k"), default_k, 1, max_k)
    timeout_ms = None
    if max_timeout_ms is not None:
        default = max_timeout_ms if default_timeout_ms is None else default_timeout_ms
        timeout_ms = parse_int("timeout_ms", params.get("timeout_ms"), default, 1, max_timeout_ms)
    return SearchParams(q, k, timeout_ms)


# -- JSON bodies --------------------------------------------------------------------


def _nesting_depth(text: str, limit: int) -> int:
    """Deepest bracket nesting outside strings, scanning no further than ``limit``."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    break
        elif char in "]}":
            depth -= 1
    return deepest


def _no_constants(token: str) -> NoReturn:
    raise ValueError(f"{token} is not valid JSON")


def parse_json_body(
    raw: bytes, *, max_bytes: int = MAX_BODY_BYTES, max_nesting: int = _MAX_BODY_NESTING
) -> Any:
    """Decode a request body as standard JSON (no ``NaN``/``Infinity``).

    Raises:
        BadRequestError: parameter ``body``; reason ``too_large``, ``not_utf8``,
            ``too_deep`` or ``invalid_json``.
    """
    if len(raw) > max_bytes:
        _reject("body", "too_large", f"body must be at most {max_bytes} bytes, got {len(raw)}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        _reject(
            "body", "not_utf8", f"body must be JSON in UTF-8 ({exc.reason} at byte {exc.start})"
        )
    # Checked before parsing: json.loads recurses per level, and a RecursionError is
    # no way to find out.
    if _nesting_depth(text, max_nesting) > max_nesting:
        _reject("body", "too_deep", f"body must be JSON nested at most {max_nesting} levels")
    try:
        return json.loads(text, parse_constant=_no_constants)
    except json.JSONDecodeError as exc:
        _reject("body", "invalid_json", f"body must be JSON: {exc.msg} (column {exc.colno})")
    except (ValueError, RecursionError) as exc:
        # e.g. an integer longer than Python's digit limit, or NaN
        _reject("body", "invalid_json", f"body must be JSON: {_short(str(exc), 80)}")


async def read_json_body(request: web.Request, *, max_bytes: int = MAX_BODY_BYTES) -> Any:
    """Read and decode ``request``'s body with :func:`parse_json_body`.

    A declared ``Content-Length`` over ``max_bytes`` is refused before reading.

    Raises:
        BadRequestError: see :func:`parse_json_body`.
    """
    declared = request.content_length
    if declared is not None and declared > max_bytes:
        _reject("body", "too_large", f"body must be at most {max_bytes} bytes, got {declared}")
    return parse_json_body(await request.read(), max_bytes=max_bytes)
