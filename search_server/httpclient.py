"""The fan-out's HTTP/1.1 client: keep-alive connections per data server, parsed by httptools.

A 100-shard query is 100 sub-requests, so what one costs the search server's CPU is what
bounds its queries per second. aiohttp's client is general (cookies, redirects, a
``ClientResponse`` and a task per request, URL objects) and spent about 140 µs of CPU per
sub-request here; a sub-request only needs "write these bytes on an idle connection, give
me the status and the body". :class:`HttpClient` does that on
:class:`asyncio.Protocol` connections with httptools (the parser uvicorn and aiohttp's own
C speedups are built on), and hands back a plain future, so the fan-out needs no task
per sub-request.

The seam is :class:`SubrequestClient`; :class:`HttpClient` is its default. The public
HTTP API of the search server stays aiohttp's server; only the outgoing sub-requests use
this.

Failure behaviour: a request's future fails with :class:`SubrequestError` (refused or
broken connection, a response httptools cannot parse, a closed client) and never hangs
by itself once its connection is gone; the caller bounds it with its deadline and
cancels it, which closes that connection (its response may still arrive, so it cannot
carry another request). Idle connections are dropped after ``idle_timeout`` (shorter
than aiohttp servers' 75 s keep-alive, so a request is rarely written on a connection the
server is closing) and when the server closes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from dataclasses import dataclass
from typing import Protocol, cast, runtime_checkable

import httptools

from discovery.errors import DiscoveryError

__all__ = ["Endpoint", "HttpClient", "Response", "SubrequestClient", "SubrequestError"]

log = logging.getLogger(__name__)

#: (status, body) of one answered sub-request.
Response = tuple[int, bytes]


class SubrequestError(DiscoveryError):
    """A sub-request got no HTTP response: connection refused, reset or closed early, or
    an answer that is not HTTP/1.1."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where a data server listens, with the request tail pre-encoded once.

    ``suffix`` ends every request line sent there (version, ``Host`` header, blank line).
    """

    host: str
    port: int
    suffix: bytes

    @classmethod
    def of(cls, host: str, port: int) -> Endpoint:
        authority = (
            f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
        )
        return cls(host, port, f" HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode("ascii"))


@runtime_checkable
class SubrequestClient(Protocol):
    """Sends ``GET`` requests to data servers; one default implementation, :class:`HttpClient`."""

    def get(self, endpoint: Endpoint, target: bytes) -> asyncio.Future[Response]:
        """Send ``GET <target>`` (``target`` is the encoded path and query) to ``endpoint``.

        Returns at once with a future of ``(status, body)`` that fails with
        :class:`SubrequestError` when no response can come; cancelling it abandons the
        request. Never raises itself.
        """
        ...

    async def aclose(self) -> None:
        """Close every connection; requests still in flight fail."""
        ...


class _Connection(asyncio.Protocol):
    """One keep-alive connection: at most one request in flight (no pipelining)."""

    __slots__ = (
        "_body",
        "_client",
        "_endpoint",
        "_eof_body",
        "_parser",
        "_waiter",
        "idle_since",
        "transport",
    )

    def __init__(self, client: HttpClient, endpoint: Endpoint) -> None:
        self._client = client
        self._endpoint = endpoint
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._body: list[bytes] = []
        self._waiter: asyncio.Future[Response] | None = None
        # A response without Content-Length or chunking ends at EOF: httptools has no
        # feed_eof, so the body read so far is the answer when the server closes.
        self._eof_body = False
        self.idle_since = 0.0

    # -- asyncio.Protocol ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not subclasses of asyncio.Transport, only alike.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self._waiter is None:
            # Bytes nobody asked for: the connection is out of step; drop it.
            self.close()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(SubrequestError(f"unparseable response from {self._where()}: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._client._forget(self._endpoint, self)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            if self._eof_body:
                self._complete(keep_alive=False)
            else:
                reason = f": {exc}" if exc is not None else ""
                self._fail(SubrequestError(f"{self._where()} closed the connection{reason}"))

    # -- httptools callbacks ---------------------------------------------------------

    def on_headers_complete(self) -> None:
        # No length and not chunked: the body runs to EOF (httptools then keeps
        # feeding on_body and never calls on_message_complete).
        self._eof_body = not self._parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._complete(keep_alive=self._parser.should_keep_alive())

    # -- requests --------------------------------------------------------------------

    def send(self, request: bytes, waiter: asyncio.Future[Response]) -> None:
        assert self.transport is not None
        self._waiter = waiter
        self._body = []
        self._eof_body = False
        waiter.add_done_callback(self._on_waiter_done)
        self.transport.write(request)

    def _on_waiter_done(self, waiter: asyncio.Future[Response]) -> None:
        if waiter.cancelled() and self._waiter is waiter:
            # Abandoned mid-response: what is still to come would be read as the next
            # request's answer, so this connection is done.
            self._waiter = None
            self.close()

    def _complete(self, *, keep_alive: bool) -> None:
        waiter, self._waiter = self._waiter, None
        body = b"".join(self._body) if len(self._body) != 1 else self._body[0]
        self._body = []
        status = self._parser.get_status_code()
        if keep_alive and self.transport is not None and not self.transport.is_closing():
            self._client._release(self._endpoint, self)
        else:
            self.close()
        if waiter is not None and not waiter.done():
            waiter.set_result((status, body))

    def _fail(self, exc: SubrequestError) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def _where(self) -> str:
        return f"{self._endpoint.host}:{self._endpoint.port}"

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class HttpClient:
    """Keep-alive HTTP/1.1 ``GET`` client for many small requests to many servers.

    One request per connection at a time; an idle connection is reused (most recent
    first), a new one opened when none is idle. At most ``max_idle`` idle connections
    are kept per endpoint, each for at most ``idle_timeout`` seconds. Runs on the loop
    it is used from and is not thread-safe. ``connect_timeout`` bounds opening a
    connection on top of the caller's own deadline. Close with :meth:`aclose` (or use
    ``async with``).
    """

    def __init__(
        self,
        *,
        max_idle: int = 32,
        idle_timeout: float = 30.0,
        connect_timeout: float = 5.0,
    ) -> None:
        if max_idle < 0:
            raise ValueError(f"max_idle must be >= 0, got {max_idle}")
        if not idle_timeout > 0:
            raise ValueError(f"idle_timeout must be > 0 seconds, got {idle_timeout}")
        self._max_idle = max_idle
        self._idle_timeout = idle_timeout
        self._connect_timeout = connect_timeout
        # Keyed by the endpoint's suffix: bytes cache their hash, a dataclass does not.
        self._idle: dict[bytes, deque[_Connection]] = {}
        self._busy: set[_Connection] = set()
        self._connecting: set[asyncio.Task[None]] = set()
        self._closed = False

    async def __aenter__(self) -> HttpClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    @property
    def idle_connections(self) -> int:
        """Connections open and waiting for a request."""
        return sum(len(pool) for pool in self._idle.values())

    def get(self, endpoint: Endpoint, target: bytes) -> asyncio.Future[Response]:
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[Response] = loop.create_future()
        if self._closed:
            waiter.set_exception(SubrequestError("the client is closed"))
            return waiter
        request = b"GET " + target + endpoint.suffix
        connection = self._checkout(endpoint, loop.time())
        if connection is not None:
            self._busy.add(connection)
            connection.send(request, waiter)
            return waiter
        task = loop.create_task(self._connect_and_send(endpoint, request, waiter))
        self._connecting.add(task)
        task.add_done_callback(self._connecting.discard)
        return waiter

    def _checkout(self, endpoint: Endpoint, now: float) -> _Connection | None:
        pool = self._idle.get(endpoint.suffix)
        while pool:
            connection = pool.pop()  # the most recently used: least likely to be timed out
            transport = connection.transport
            if transport is None or transport.is_closing():
                continue
            if now - connection.idle_since > self._idle_timeout:
                connection.close()
                continue
            return connection
        return None

    async def _connect_and_send(
        self, endpoint: Endpoint, request: bytes, waiter: asyncio.Future[Response]
    ) -> None:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout):
                # The waiter's cancellation (the query's deadline) also ends the connect.
                connect = loop.create_task(
                    loop.create_connection(
                        lambda: _Connection(self, endpoint), endpoint.host, endpoint.port
                    )
                )
                waiter.add_done_callback(lambda _: connect.cancel())
                _, connection = await connect
        except asyncio.CancelledError:
            if not waiter.done():
                waiter.set_exception(
                    SubrequestError(f"connecting to {endpoint.host}:{endpoint.port} was cancelled")
                )
            return
        except (OSError, TimeoutError) as exc:
            if not waiter.done():
                why = str(exc) or type(exc).__name__
                where = f"{endpoint.host}:{endpoint.port}"
                waiter.set_exception(SubrequestError(f"cannot connect to {where}: {why}"))
            return
        if waiter.done() or self._closed:
            # Nobody waits any more; keep the fresh connection for the next request.
            self._release(endpoint, connection)
            return
        self._busy.add(connection)
        connection.send(request, waiter)

    def _release(self, endpoint: Endpoint, connection: _Connection) -> None:
        self._busy.discard(connection)
        if self._closed:
            connection.close()
            return
        pool = self._idle.get(endpoint.suffix)
        if pool is None:
            pool = self._idle[endpoint.suffix] = deque()
        if len(pool) >= self._max_idle:
            connection.close()
            return
        connection.idle_since = asyncio.get_running_loop().time()
        pool.append(connection)

    def _forget(self, endpoint: Endpoint, connection: _Connection) -> None:
        self._busy.discard(connection)
        pool = self._idle.get(endpoint.suffix)
        if pool is not None:
            with contextlib.suppress(ValueError):
                pool.remove(connection)
            if not pool:
                del self._idle[endpoint.suffix]

    async def aclose(self) -> None:
        """Close all connections and cancel connects in progress; idempotent."""
        self._closed = True
        for task in list(self._connecting):
            task.cancel()
        if self._connecting:
            await asyncio.gather(*self._connecting, return_exceptions=True)
        for pool in list(self._idle.values()):
            for connection in list(pool):
                connection.close()
        for connection in list(self._busy):
            connection._fail(SubrequestError("the client is closed"))
            connection.close()
        self._idle.clear()
        self._busy.clear()
