"""The HTTP servers' edge: bounds on how long a request head may take, on how many wait,
and on how many connections are open.

:class:`HeaderGuard` answers ``408`` and closes a connection whose head takes longer than
``header_timeout``, and closes the longest waiting when more than ``max_pending_headers``
wait. At ``max_connections`` open, a new connection closes the longest idle kept-alive
one, else the longest waiting for a head, else it is answered ``503`` and closed (the
rule and the shorter keep-alive near the cap: :mod:`discovery.httpconns`). A request in
the application, or whose answer is being written, is never cut. On the server's loop;
not thread-safe.

Design: docs/design/security.md, "HTTP edge".
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Final, cast

from aiohttp import StreamReader, web
from prometheus_client import CollectorRegistry

from discovery.config import HttpEdgeConfig
from discovery.httpconns import ConnectionCap, default_max_connections, file_limit
from discovery.httpheads import HeadWaits
from discovery.metrics import HttpEdgeMetrics

__all__ = ["KEEPALIVE_TIMEOUT", "HeaderGuard"]

log = logging.getLogger(__name__)

#: Seconds our servers keep an idle kept-alive connection (aiohttp's ``web.run_app``
#: default; its ``AppRunner`` would keep one an hour). Longer than the fan-out client's
#: 30 s idle pool (:mod:`search_server.httpclient`), so that a request is rarely written
#: on a connection the server is closing (near the connection cap an idle connection is
#: kept only ``--pressure-keepalive``: :mod:`discovery.httpconns`).
KEEPALIVE_TIMEOUT: Final = 75.0

_TIMEOUT_BODY: Final = b'{"error": "the request headers did not arrive in time"}'
_REQUEST_TIMEOUT: Final = (
    b"HTTP/1.1 408 Request Timeout\r\n"
    b"Content-Type: application/json\r\n"
    b"Content-Length: %d\r\n"
    b"Connection: close\r\n\r\n%s" % (len(_TIMEOUT_BODY), _TIMEOUT_BODY)
)
_FULL_BODY: Final = b'{"error": "too many connections are open; try again shortly"}'
_SERVICE_UNAVAILABLE: Final = (
    b"HTTP/1.1 503 Service Unavailable\r\n"
    b"Content-Type: application/json\r\n"
    b"Content-Length: %d\r\n"
    b"Retry-After: 1\r\n"
    b"Connection: close\r\n\r\n%s" % (len(_FULL_BODY), _FULL_BODY)
)


class _Connection(asyncio.Protocol):
    """One connection: forwards every event to aiohttp's protocol and keeps the clock.

    ``_busy`` is True while a request of this connection is in the application;
    ``_task`` is that request's task until it ends, its answer written (aiohttp runs
    each request in a task of its own); ``_body`` is the body stream of the last request
    (its end tells a further request's first byte from a body's); ``_pipelined`` records
    bytes of a further request that arrived while one was in the application. Idle (see
    :meth:`_settle`): none of these, and not waiting for a head. A ``_refused``
    connection was never shown to aiohttp.
    """

    __slots__ = (
        "_body",
        "_busy",
        "_heard",
        "_inner",
        "_ledger",
        "_pipelined",
        "_refused",
        "_task",
        "_waiting",
        "transport",
    )

    def __init__(self, ledger: _Ledger, inner: asyncio.Protocol) -> None:
        self._ledger = ledger
        self._inner = inner
        self.transport: asyncio.Transport | None = None
        self._waiting = False
        self._busy = False
        self._task: asyncio.Task[object] | None = None
        self._body: StreamReader | None = None
        self._pipelined = False
        self._heard = False
        self._refused = False

    # -- asyncio.Protocol, forwarded ---------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's is one without subclassing asyncio's).
        self.transport = cast(asyncio.Transport, transport)
        if not self._ledger.admit(self):
            # At the cap, every other connection busy: a prompt answer, not a hang.
            self._refused = True
            self.transport.write(_SERVICE_UNAVAILABLE)
            self.transport.close()
            return
        self._ledger.opened(self)
        self._wait()
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
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
        if self._task is None and not self._waiting:
            self._settle()  # the end of a body aiohttp read after its request's answer

    def eof_received(self) -> bool | None:
        if self._refused:
            return None
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused:
            self.transport = None
            return
        self._stop_waiting()
        self._ledger.lost(self)
        self.transport = None
        self._busy = False
        self._task = None
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if not self._refused:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if not self._refused:
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
            self._ledger.cap.active(self)
            self._ledger.heads.start_waiting(self)

    def _stop_waiting(self) -> None:
        if self._waiting:
            self._waiting = False
            self._heard = False
            self._ledger.heads.stop_waiting(self)

    def request_started(self, body: StreamReader, task: asyncio.Task[object] | None) -> None:
        """A request of this connection reached the application: its head is complete.

        ``task`` runs the request and ends once its answer is written: until then the
        connection is not idle (None: never idle again, so never closed as idle).
        """
        self._stop_waiting()
        self._ledger.cap.active(self)
        self._busy = True
        self._body = body
        self._pipelined = False
        self._task = task
        if task is not None:
            task.add_done_callback(self._request_ended)

    def request_done(self) -> None:
        self._busy = False
        if self._pipelined:
            self._pipelined = False
            self._wait()
            self._heard = True

    def _request_ended(self, task: asyncio.Task[object]) -> None:
        # A later request of the connection may have started already (eager tasks).
        if self._task is task:
            self._task = None
            self._settle()

    def _settle(self) -> None:
        """Tell the cap the connection is idle, if it is: its last answer written, no
        request in the application, no body or head arriving."""
        transport = self.transport
        if (
            transport is not None
            and not transport.is_closing()
            and not self._waiting
            and not self._busy
            and self._task is None
            and not self._body_pending()
        ):
            self._ledger.cap.idle(self)

    def _close(self) -> None:
        transport = self.transport
        assert transport is not None
        self._ledger.cap.lost(self)  # now: the cap counts it closed before connection_lost
        if transport.get_write_buffer_size():
            # The client does not read: freeing the socket now matters more than the
            # rest of what it was sent.
            transport.abort()
        else:
            transport.close()

    def expire(self, reason: str) -> None:
        """Close the connection: its head took too long, or it made room for another."""
        heard = self._heard
        self._stop_waiting()
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if heard:
            transport.write(_REQUEST_TIMEOUT)
        self._close()
        self._ledger.heads.closed(reason)

    def close_idle(self, reason: str) -> None:
        """Close the connection, idle (the cap's :class:`~discovery.httpconns.IdleConnection`)."""
        transport = self.transport
        if transport is not None and not transport.is_closing():
            self._close()


class _Ledger:
    """A guard's connections: each by transport, those waiting for a request head
    (``heads``), and the cap on those open (``cap``)."""

    def __init__(self, heads: HeadWaits, cap: ConnectionCap) -> None:
        self.heads = heads
        self.cap = cap
        # Connections by transport, for the middleware to find a request's connection.
        self._connections: dict[asyncio.BaseTransport, _Connection] = {}

    def connection(self, transport: asyncio.BaseTransport) -> _Connection | None:
        """The open connection of ``transport``, if it is one of ours."""
        return self._connections.get(transport)

    def admit(self, connection: _Connection) -> bool:
        """Count a new connection open, making room at the cap: the longest idle is
        closed, else the longest waiting for a head (slow heads only displace each
        other). False, counted: every other connection has a request in progress."""
        while not self.cap.admit(connection):
            # One closing already frees no place: the next waiting one goes then.
            if not self.heads.evict_oldest():
                log.debug("refusing a connection: %d open, each with a request", self.cap.open)
                self.cap.refuse()
                return False
            log.debug("closed a connection waiting for its request headers to make room")
        return True

    def opened(self, connection: _Connection) -> None:
        assert connection.transport is not None
        self._connections[connection.transport] = connection

    def lost(self, connection: _Connection) -> None:
        self.cap.lost(connection)
        if connection.transport is not None:
            self._connections.pop(connection.transport, None)

    def close(self) -> None:
        """Close every connection waiting for a head (a shutdown), and stop the timers."""
        self.heads.close()
        self.cap.close()


class HeaderGuard:
    """Bounds the time request heads take, the connections waiting for one, and the
    connections open.

    Use: build the application with :meth:`middleware` among its middlewares, set
    the runner up, then :meth:`listen`; :meth:`close` before the runner's
    ``cleanup()`` (it stops listening, as a site's ``stop()`` would). Metrics
    (:class:`~discovery.metrics.HttpEdgeMetrics`) go to ``registry``. The cap on
    connections is ``config.max_connections``, or derived from this process's open-file
    limit now (:func:`~discovery.httpconns.default_max_connections`).
    """

    def __init__(self, config: HttpEdgeConfig, *, registry: CollectorRegistry) -> None:
        self.config = config
        self._metrics = HttpEdgeMetrics(registry)
        self._server: asyncio.Server | None = None
        limit = config.max_connections
        if limit is None:
            limit = default_max_connections(file_limit())
        self._cap = ConnectionCap(limit, config.pressure_keepalive, self._metrics)
        self._heads = HeadWaits(config, self._metrics)
        self._ledger = _Ledger(self._heads, self._cap)
        self._metrics.pending.set_function(lambda: self._heads.waiting)

    @property
    def closed_slow(self) -> int:
        """Connections closed because their request head took too long."""
        return self._heads.closed_slow

    @property
    def evicted(self) -> int:
        """Connections closed to make room for a newer one waiting for its head."""
        return self._heads.evicted

    @property
    def waiting(self) -> int:
        """Connections waiting for a request head now."""
        return self._heads.waiting

    @property
    def max_connections(self) -> int:
        """The cap on connections open."""
        return self._cap.limit

    @property
    def connections(self) -> int:
        """Connections open now."""
        return self._cap.open

    @property
    def idle_connections(self) -> int:
        """Open connections idle now (kept alive between requests)."""
        return self._cap.idle_count

    @property
    def refused(self) -> int:
        """Connections answered 503 at the cap."""
        return self._cap.refused

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
        """Marks the request's connection busy while the application has its request,
        and not idle until its answer is written (its task's end)."""
        transport = request.transport
        connection = self._ledger.connection(transport) if transport is not None else None
        if connection is None:
            return await handler(request)
        connection.request_started(request.content, asyncio.current_task())
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
        soft = file_limit()
        cap = self._cap.limit
        if cap > default_max_connections(soft):
            log.warning(
                "--max-connections %d leaves fewer than %d of this process's %d open files "
                "to ZooKeeper, Redis, outgoing connections and files: clients could use up "
                "the descriptors before the cap applies; lower it or raise the limit "
                "(ulimit -n, LimitNOFILE=)",
                cap,
                soft - default_max_connections(soft),
                soft,
            )

    def close(self) -> None:
        """Stop listening; connections still waiting for a head are closed.

        Connections with a request in the application are the runner's to finish.
        """
        if self._server is not None:
            self._server.close()
        self._ledger.close()
