"""Name resolution for the fan-out's new connections, cached for a few seconds.

:class:`CachingResolver` (the default :class:`Resolver`) serves a stale answer while it
refreshes it, so no lookup stands in front of a connection to a name once resolved.
Not thread-safe. :meth:`CachingResolver.aclose` cancels the lookups in progress.

Design: docs/design/search-server.md, "No lookup in front of a connection".
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, runtime_checkable

__all__ = ["AddrInfo", "CachingResolver", "Lookup", "Resolver"]

log = logging.getLogger(__name__)

#: One entry of :func:`socket.getaddrinfo`'s answer: family, type, proto, canonname,
#: sockaddr.
AddrInfo = tuple[socket.AddressFamily, socket.SocketKind, int, str, tuple[Any, ...]]
#: How a name is looked up: ``host -> its getaddrinfo entries`` (for SOCK_STREAM).
Lookup = Callable[[str], Awaitable[Sequence[AddrInfo]]]

#: How long an answer is fresh by default (seconds): aiohttp's ``ttl_dns_cache``.
DEFAULT_TTL = 10.0
#: How long past its freshness an answer may still be used by default (seconds).
DEFAULT_MAX_STALE = 300.0
#: Most names kept by default.
DEFAULT_MAX_NAMES = 65_536


@runtime_checkable
class Resolver(Protocol):
    """Addresses for a host name, for a new connection."""

    async def resolve(self, host: str) -> Sequence[AddrInfo]:
        """``host``'s getaddrinfo entries (SOCK_STREAM). Raises whatever the lookup
        raises (``OSError``/``socket.gaierror``, ``UnicodeError`` for a bad label)."""
        ...

    def forget(self, host: str) -> None:
        """Drop what is known of ``host``: a connection to its address failed."""
        ...

    async def aclose(self) -> None:
        """Cancel lookups in progress; idempotent."""
        ...


class CachingResolver:
    """:class:`Resolver` keeping each answer fresh ``ttl`` seconds and usable
    ``max_stale`` more while it is refreshed (docs/design/search-server.md, "No lookup in
    front of a connection").

    ``lookup`` defaults to the running loop's ``getaddrinfo`` (the default executor);
    ``clock`` (monotonic seconds) times the answers. Raises ``ValueError`` for a
    negative ``ttl`` or ``max_stale``, or a ``max_names`` below 1; ``ttl=0`` keeps
    nothing (one lookup per connection, shared only while in flight).
    """

    def __init__(
        self,
        *,
        ttl: float = DEFAULT_TTL,
        max_stale: float = DEFAULT_MAX_STALE,
        max_names: int = DEFAULT_MAX_NAMES,
        lookup: Lookup | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not ttl >= 0:
            raise ValueError(f"ttl must be >= 0 seconds, got {ttl}")
        if not max_stale >= 0:
            raise ValueError(f"max_stale must be >= 0 seconds, got {max_stale}")
        if max_names < 1:
            raise ValueError(f"max_names must be >= 1, got {max_names}")
        self._ttl = ttl
        self._max_stale = max_stale
        self._max_names = max_names
        self._lookup = lookup if lookup is not None else _getaddrinfo
        self._clock = clock
        # host -> (until when the answer is fresh, the answer); insertion order is age order.
        self._answers: dict[str, tuple[float, Sequence[AddrInfo]]] = {}
        self._pending: dict[str, asyncio.Task[Sequence[AddrInfo]]] = {}
        self._closed = False
        self.lookups = 0
        """Lookups started (not answered from the cache): for metrics and tests."""

    def __len__(self) -> int:
        """Names with a kept answer (expired ones included until they are asked for)."""
        return len(self._answers)

    async def resolve(self, host: str) -> Sequence[AddrInfo]:
        kept = self._answers.get(host)
        if kept is not None:
            fresh_until, infos = kept
            now = self._clock()
            if now < fresh_until:
                return infos
            if now < fresh_until + self._max_stale and not self._closed:
                self._refresh(host)
                return infos
            del self._answers[host]
        if self._closed:
            raise RuntimeError("the resolver is closed")
        # shield: a caller cancelled at its deadline leaves the lookup to the others.
        return await asyncio.shield(self._refresh(host))

    def _refresh(self, host: str) -> asyncio.Task[Sequence[AddrInfo]]:
        """The lookup of ``host`` in progress, started if there is none."""
        task = self._pending.get(host)
        if task is None:
            self.lookups += 1
            task = asyncio.get_running_loop().create_task(self._look_up(host))
            task.add_done_callback(_retrieve)
            self._pending[host] = task
        return task

    async def _look_up(self, host: str) -> Sequence[AddrInfo]:
        try:
            infos = await self._lookup(host)
        finally:
            self._pending.pop(host, None)
        if self._ttl > 0 and infos and not self._closed:
            self._answers.pop(host, None)
            self._answers[host] = (self._clock() + self._ttl, infos)
            while len(self._answers) > self._max_names:
                del self._answers[next(iter(self._answers))]
        return infos

    def forget(self, host: str) -> None:
        self._answers.pop(host, None)

    async def aclose(self) -> None:
        self._closed = True
        self._answers.clear()
        pending = list(self._pending.values())
        for task in pending:
            task.cancel()
        if pending:
            # A lookup's own failure was its callers' to see; here only its end matters.
            await asyncio.gather(*pending, return_exceptions=True)


def _retrieve(task: asyncio.Task[Sequence[AddrInfo]]) -> None:
    # A refresh nobody awaits: its failure is read here (asyncio would otherwise warn
    # that it was never retrieved) and the stale answer stays.
    if not task.cancelled() and task.exception() is not None:
        log.debug("looking a name up failed: %s", task.exception())


async def _getaddrinfo(host: str) -> Sequence[AddrInfo]:
    loop = asyncio.get_running_loop()
    return await loop.getaddrinfo(host, None, type=socket.SOCK_STREAM)
