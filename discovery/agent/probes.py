"""Health probes: how the agent decides that its server can answer queries.

A probe is any object whose ``async check()`` returns when the server is healthy and
raises otherwise. :class:`HttpProbe` and :class:`SearchProbe` send :data:`PROBE_HEADER`
(HTTP contract: serve such a request the ordinary way, never refuse it for load).

Design: docs/design/data-server.md, "The agent"; the header: docs/design/overload.md,
"Probes do not queue behind searches".
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Final, Protocol, runtime_checkable

import aiohttp
from yarl import URL

from discovery.errors import ProbeFailed

__all__ = [
    "PROBE_HEADER",
    "PROBE_HEADER_VALUE",
    "CallableProbe",
    "HttpProbe",
    "Probe",
    "SearchProbe",
]

log = logging.getLogger(__name__)

#: The header that marks an agent's health probe (see the module doc: part of the HTTP
#: contract between agents and the servers they probe).
PROBE_HEADER: Final = "X-Discovery-Probe"
#: Its value.
PROBE_HEADER_VALUE: Final = "1"


@runtime_checkable
class Probe(Protocol):
    """Returns if healthy, raises if not. Runs on the agent's loop thread."""

    async def check(self) -> None: ...


class HttpProbe:
    """GET ``url`` and expect ``expect_status``.

    Every request carries :data:`PROBE_HEADER` (see the module doc). The aiohttp
    session is created on first use on the agent's loop (sessions belong to one loop)
    and closed by :meth:`aclose`.
    """

    def __init__(self, url: str, *, expect_status: int = 200) -> None:
        self.url = url
        self._expect_status = expect_status
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # No pooled keep-alive: a probe must see a server that stopped accepting
            # new connections, not ride an old one.
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(force_close=True),
                timeout=aiohttp.ClientTimeout(total=None),
                headers={PROBE_HEADER: PROBE_HEADER_VALUE},
            )
        return self._session

    def _next_url(self) -> str:
        return self.url

    async def _verify(self, response: aiohttp.ClientResponse) -> None:
        if response.status != self._expect_status:
            raise ProbeFailed(f"HTTP {response.status} from {response.url}")

    async def check(self) -> None:
        try:
            async with self._client().get(self._next_url()) as response:
                await self._verify(response)
        except aiohttp.ClientError as exc:
            raise ProbeFailed(f"{type(exc).__name__}: {exc}") from exc

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"


class SearchProbe(HttpProbe):
    """A real search query against the server's own ``/search`` endpoint.

    Cycles through ``queries`` so that no single cached answer hides a slow index,
    and checks that the answer is a JSON object with a ``hits`` list.
    """

    def __init__(self, base_url: str, queries: Sequence[str], *, k: int = 10) -> None:
        if not queries:
            raise ValueError("SearchProbe needs at least one query")
        super().__init__(base_url.rstrip("/") + "/search")
        self._queries = itertools.cycle(list(queries))
        self._k = k

    def _next_url(self) -> str:
        query = next(self._queries)
        return str(URL(self.url).with_query(q=query, k=str(self._k)))

    async def _verify(self, response: aiohttp.ClientResponse) -> None:
        await super()._verify(response)
        try:
            body = await response.json()
        except (aiohttp.ContentTypeError, ValueError) as exc:
            raise ProbeFailed(f"search answer is not JSON: {exc}") from exc
        if not isinstance(body, dict) or not isinstance(body.get("hits"), list):
            raise ProbeFailed("search answer has no 'hits' list")


class CallableProbe:
    """Wrap a function: healthy if it returns a truthy value (or None) without raising.

    A coroutine function runs on the agent's loop; a plain function runs in a worker
    thread so that it cannot block the agent (a timed-out call keeps its thread until
    it returns: Python cannot kill a thread).
    """

    def __init__(self, func: Callable[[], object] | Callable[[], Awaitable[object]]) -> None:
        self._func = func

    async def check(self) -> None:
        if inspect.iscoroutinefunction(self._func):
            result = await self._func()
        else:
            result = await asyncio.to_thread(self._func)
            if inspect.isawaitable(result):
                result = await result
        if result is False:
            raise ProbeFailed(f"{getattr(self._func, '__name__', 'probe')} returned False")

    def __repr__(self) -> str:
        return f"CallableProbe({self._func!r})"
