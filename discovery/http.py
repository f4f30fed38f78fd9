"""Small aiohttp helpers shared by the data and search servers."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

__all__ = ["MAX_QUERY_LENGTH", "int_param", "json_error", "json_errors", "query_text"]


def json_error(status: int, message: str) -> web.Response:
    """An error answer: ``{"error": message}`` with ``status``."""
    return web.json_response({"error": message}, status=status)


@web.middleware
async def json_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Make unknown paths and wrong methods answer JSON like every other error."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return json_error(exc.status, exc.reason)


def int_param(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    """Query parameter ``name`` as an integer in ``low..high`` (``default`` if absent).

    Raises:
        ValueError: not an integer or out of range; the message names the parameter.
    """
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"'{name}' must be an integer, got {raw!r}") from None
    if not low <= value <= high:
        raise ValueError(f"'{name}' must be in {low}..{high}, got {value}")
    return value


#: Longest query text the servers accept.
MAX_QUERY_LENGTH = 1024


def query_text(request: web.Request, max_length: int = MAX_QUERY_LENGTH) -> str:
    """The ``q`` parameter: present, not blank, at most ``max_length`` characters.

    Raises:
        ValueError: missing, blank or too long; the message says which.
    """
    query = request.query.get("q")
    if query is None or not query.strip():
        raise ValueError("missing query parameter 'q'")
    if len(query) > max_length:
        raise ValueError(f"query longer than {max_length} characters ({len(query)})")
    return query
