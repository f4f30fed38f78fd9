"""The HTTP servers' edge: bounds on how long a request head may take, and on how many wait.

:class:`HeaderGuard` answers ``408`` and closes a connection whose head takes longer than
``header_timeout``, and closes the longest waiting when more than ``max_pending_headers``
wait; a request in the application is never cut. On the server's loop; not thread-safe.

Design: docs/design/security.md, "HTTP edge".
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections.abc import Awaitable, Callable
from typing import Final, cast

from aiohttp import StreamReader, web
from prometheus_client import CollectorRegistry

from discovery.config import HttpEdgeConfig
from discovery.metrics import HttpEdgeMetrics

__all__ = ["KEEPALIVE_TIMEOUT", "HeaderGuard"]

log = logging.getLogger(__name__)

#: Seconds our servers keep an idle kept-alive connection (aiohttp's ``web.run_app``
#: default; its ``AppRunner`` would keep one an hour). Longer than the fan-out client's
#: 30 s idle pool (:mod:`search_server.httpclient`), so that a request is rarely written
#: on a connection the server is closing.
KEEPALIVE_TIMEOUT: Final = 75.0

_TIMEOUT_BODY: Final = b'{"error": "the request headers did not arrive in time"}'
_REQUEST_TIMEOUT: Final = (
    b"HTTP/1.1 408 Request Timeout\r\n"
    b"Content-Type: application/json\r\n"
    b"Content-Length: %d\r\n"
    b"Connection: close\r\n\r\n%s" % (len(_TIMEOUT_BODY), _TIMEOUT_BODY)
)


class _Connection(asyncio.Protocol):
    """One connection: forwards every event to aiohttp's protocol and keeps the clock.

    ``_busy`` is True while a request of this connection is in the application;
    ``_body`` is the body stream of the last request (its end tells a further
    request's first byte from a body's); ``_pipelined`` records bytes of a further
    request that arrived while one was in the application.
    """

    __slots__ = (
        "_body",
        "_busy",
        "_heard",
        "_inner",
        "_ledger",
        "_pipelined",
        "_waiting",
        "transport",
    )

    def __init__(self, ledger: _Ledger, inner: asyncio.Protocol) -> None:
        self._ledger = ledger
        self._inner = inner
        self.transport: asyncio.Transport | None = None
        self._waiting = False
        self._busy = False
        self._body: StreamReader | None = None
        self._pipelined = False
        self._heard = False

    # -- asyncio.Protocol, forwarded ---------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's is one without subclassing asyncio's).
        self.transport = cast(asyncio.Transport, transport)
        self._ledger.opened(self)
        self._wait()
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if data:
            if self._waiting:
                self._heard = True
            elif not self._body_pending():
                if not self._busy:
                    self._heard = True
                    self._wait()
                else:
                    # A further request while one is in the application (pipelining):
                    # its head may be complete and queued, so its clock starts only
                    # once the application is done with this one.
                    self._pipelined = True
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_waiting()
        self._ledger.lost(self)
        self.transport = None
        self._busy = False
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    # -- the clock ---------------------------------------------------------------------

    def _body_pending(self) -> bool:
        # is_eof: the parser has seen the body's end (whether or not the handler read it).
        body = self._body
        return body is not None and not body.is_eof()

    def _wait(self) -> None:
        """Start waiting for a request head (the guard may close another connection)."""
        transport = self.transport
        if not self._waiting and transport is not None and not transport.is_closing():
            self._waiting = True
            self._ledger.start_waiting(self)

    def _stop_waiting(self) -> None:
        if self._waiting:
            self._waiting = False
            self._heard = False
            self._ledger.stop_waiting(self)

    def request_started(self, body: StreamReader) -> None:
        """A request of this connection reached the application: its head is complete."""
        self._stop_waiting()
        self._busy = True
        self._body = body
        self._pipelined = False

    def request_done(self) -> None:
        self._busy = False
        if self._pipelined:
            self._pipelined = False
            self._wait()
            self._heard = True

    def expire(self, reason: str) -> None:
        """Close the connection: its head took too long, or it made room for another."""
        heard = self._heard
        self._stop_waiting()
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if heard:
            transport.write(_REQUEST_TIMEOUT)
        if transport.get_write_buffer_size():
            # The client does not read: freeing the socket now matters more than the 408.
            transport.abort()
        else:
            transport.close()
        self._ledger.closed(reason)


class _Ledger:
    """A guard's connections: each by transport, and those waiting for a request head.

    Starting a wait with ``max_pending_headers`` already waiting closes the one that has
    waited longest; one timer closes each whose ``header_timeout`` is over. Closes are
    counted (not those of a shutdown).
    """

    def __init__(self, config: HttpEdgeConfig, metrics: HttpEdgeMetrics) -> None:
        self._config = config
        self._metrics = metrics
        # Connections by transport, for the middleware to find a request's connection.
        self._connections: dict[asyncio.BaseTransport, _Connection] = {}
        # Those waiting for a request head, by deadline. Every wait is as long, so the
        # insertion order (a dict's) is the deadlines' order: the first entry is both the
        # longest waiting and the next to expire, and one timer for it serves them all
        # (no timer per request to arm and cancel).
        self._waiting: dict[_Connection, float] = {}
        self._sweeper: asyncio.TimerHandle | None = None
        self.closed_slow = 0
        self.evicted = 0

    @property
    def waiting(self) -> int:
        """Connections waiting for a request head now."""
        return len(self._waiting)

    def connection(self, transport: asyncio.BaseTransport) -> _Connection | None:
        """The open connection of ``transport``, if it is one of ours."""
        return self._connections.get(transport)

    def opened(self, connection: _Connection) -> None:
        assert connection.transport is not None
        self._connections[connection.transport] = connection

    def lost(self, connection: _Connection) -> None:
        if connection.transport is not None:
            self._connections.pop(connection.transport, None)

    def start_waiting(self, connection: _Connection) -> None:
        config = self._config
        while len(self._waiting) >= config.max_pending_headers:
            oldest = next(iter(self._waiting))
            log.debug("closing a connection waiting for its request headers to make room")
            oldest.expire("evicted")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + config.header_timeout
        self._waiting[connection] = deadline
        if self._sweeper is None:
            self._sweeper = loop.call_at(deadline, self._sweep)

    def stop_waiting(self, connection: _Connection) -> None:
        self._waiting.pop(connection, None)

    def _sweep(self) -> None:
        """Close the connections whose wait is over; come back for the next one."""
        self._sweeper = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        while self._waiting:
            connection, deadline = next(iter(self._waiting.items()))
            if deadline > now:
                self._sweeper = loop.call_at(deadline, self._sweep)
                return
            connection.expire("header_timeout")  # which removes it from _waiting

    def closed(self, reason: str) -> None:
        """Count a connection closed for ``reason`` (``evicted``, ``header_timeout``)."""
        if reason == "shutdown":
            return
        self._metrics.closed.labels(reason=reason).inc()
        if reason == "evicted":
            self.evicted += 1
        else:
            self.closed_slow += 1

    def close(self) -> None:
        """Close every connection waiting for a head (a shutdown), and stop the timer."""
        for connection in list(self._waiting):
            connection.expire("shutdown")
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None


class HeaderGuard:
    """Bounds the time request heads take and the connections waiting for one.

    Use: build the application with :meth:`middleware` among its middlewares, set
    the runner up, then :meth:`listen`; :meth:`close` before the runner's
    ``cleanup()`` (it stops listening, as a site's ``stop()`` would). Metrics
    (:class:`~discovery.metrics.HttpEdgeMetrics`) go to ``registry``.
    """

    def __init__(self, config: HttpEdgeConfig, *, registry: CollectorRegistry) -> None:
        self.config = config
        self._metrics = HttpEdgeMetrics(registry)
        self._server: asyncio.Server | None = None
        self._ledger = _Ledger(config, self._metrics)
        self._metrics.pending.set_function(lambda: self._ledger.waiting)

    @property
    def closed_slow(self) -> int:
        """Connections closed because their request head took too long."""
        return self._ledger.closed_slow

    @property
    def evicted(self) -> int:
        """Connections closed to make room for a newer one waiting for its head."""
        return self._ledger.evicted

    @property
    def waiting(self) -> int:
        """Connections waiting for a request head now."""
        return self._ledger.waiting

    @property
    def port(self) -> int:
        """The port :meth:`listen` bound (0 before)."""
        if self._server is None or not self._server.sockets:
            return 0
        return int(self._server.sockets[0].getsockname()[1])

    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """Marks the request's connection busy while the application has its request."""
        transport = request.transport
        connection = self._ledger.connection(transport) if transport is not None else None
        if connection is None:
            return await handler(request)
        connection.request_started(request.content)
        try:
            return await handler(request)
        finally:
            connection.request_done()

    async def listen(self, runner: web.BaseRunner, host: str, port: int) -> int:
        """Serve ``runner`` (set up) on ``host``:``port``; return the port bound.

        Raises:
            OSError: the address cannot be bound.
        """
        server = runner.server
        if server is None:
            raise RuntimeError("HeaderGuard.listen: call runner.setup() first")
        self._check_file_limit()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Connection(self._ledger, server()), host, port
        )
        return self.port

    def _check_file_limit(self) -> None:
        # The cap protects only while it leaves descriptors for everyone else.
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        cap = self.config.max_pending_headers
        if soft != resource.RLIM_INFINITY and cap > soft // 2:
            log.warning(
                "--max-pending-headers %d is more than half this process's open-file limit "
                "(%d): slow clients could use up the descriptors before the cap applies; "
                "lower it or raise the limit (ulimit -n, LimitNOFILE=)",
                cap,
                soft,
            )

    def close(self) -> None:
        """Stop listening; connections still waiting for a head are closed.

        Connections with a request in the application are the runner's to finish.
        """
        if self._server is not None:
            self._server.close()
        self._ledger.close()
