"""The fan-out's HTTP/1.1 client: keep-alive connections per data server, parsed by httptools.

:class:`SubrequestClient` is the seam, :class:`HttpClient` its default. A request is a
future that fails with :class:`SubrequestError` (a bad address, connection or answer, a
closed client), costing only that data server's requests, and never hangs once its
connection is gone; the caller bounds it by its deadline, and cancelling it closes that
connection.

Design: docs/design/search-server.md, "One data server's problem is its own, in the client too".
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, cast, runtime_checkable

import httptools

from discovery.address import NetworkPolicy
from discovery.errors import DiscoveryError

from .endpoint import EXCERPT_CHARS, Endpoint, excerpt
from .resolver import CachingResolver, Resolver

__all__ = [
    "DEFAULT_MAX_BODY",
    "EXCERPT_CHARS",
    "MAX_HEADERS",
    "MAX_HEAD_BYTES",
    "MAX_LINE_BYTES",
    "AnswerTooLarge",
    "Endpoint",
    "HttpClient",
    "Response",
    "SubrequestClient",
    "SubrequestError",
    "excerpt",
]

log = logging.getLogger(__name__)

#: (status, body) of one answered sub-request.
Response = tuple[int, bytes]

#: Default cap of a response body (bytes): a data server's answer is k hits, kilobytes.
#: A request may ask for a lower one (the fan-out's follows ``k``), never a higher.
DEFAULT_MAX_BODY = 8 * 1024 * 1024
#: Most headers one response may have.
MAX_HEADERS = 100
#: Most bytes of a response's head: status line and headers, with their CRLFs.
MAX_HEAD_BYTES = 64 * 1024
#: Most bytes of the status line or of one header line (CRLF not counted).
MAX_LINE_BYTES = 8 * 1024

# The longest head that cannot break a limit, whatever it holds: 101 headers need at
# least 4 bytes each ("a:" and CRLF) after a status line of 12 ("HTTP/1.1 200") and its
# CRLF, and a blank line. Heads this short (most) need no search of the bytes.
_SMALL_HEAD = 16 + 4 * MAX_HEADERS
assert _SMALL_HEAD < MAX_LINE_BYTES
# A header that frames the body (so that it does not run to EOF).
_FRAMED = re.compile(rb"\r\n(?:content-length|transfer-encoding)[ \t]*:", re.IGNORECASE)


class SubrequestError(DiscoveryError):
    """A sub-request got no usable HTTP response: an address that cannot be used,
    connection refused, reset or closed early, an answer that is not HTTP/1.1 or is over
    a limit."""


class AnswerTooLarge(SubrequestError):
    """A response body over the request's cap: refused as it arrived, never parsed."""


class _Violation(Exception):
    """Raised from a parser callback to stop parsing: the response breaks a limit or the
    one-response-per-request rule. Its text is the reason given to the request."""


class _TooLarge(_Violation):
    """The body broke the request's cap: the request fails with :class:`AnswerTooLarge`."""


@runtime_checkable
class SubrequestClient(Protocol):
    """Sends ``GET`` requests to data servers; one default implementation, :class:`HttpClient`."""

    def get(
        self, endpoint: Endpoint, target: bytes, max_body: int | None = None
    ) -> asyncio.Future[Response]:
        """Send ``GET <target>`` (``target`` is the encoded path and query) to ``endpoint``.

        Returns at once with a future of ``(status, body)`` that fails with
        :class:`SubrequestError` when no response can come (with :class:`AnswerTooLarge`
        for a body over ``max_body`` bytes, or over the client's own cap if lower or
        ``max_body`` is None); cancelling it abandons the request. Never raises itself.
        """
        ...

    async def aclose(self) -> None:
        """Close every connection; requests still in flight fail."""
        ...


@dataclass(frozen=True, slots=True)
class _Owner:
    """What a connection tells the client that opened it (its pool and its log)."""

    #: A whole answer on a connection that may carry another request: pool it.
    release: Callable[[Endpoint, _Connection], None]
    #: The connection is closed or closing: out of the idle pool and the busy set.
    forget: Callable[[_Connection], None]
    #: An exception nothing expected, with ``host:port``: log it (once per type).
    unexpected: Callable[[BaseException, str], None]


class _Connection(asyncio.Protocol):
    """One keep-alive connection: at most one request in flight (no pipelining).

    A response is handled when ``feed_data`` returns, not in ``on_message_complete``:
    bytes after it in the same read (a second response) must break the connection
    before it can be pooled.
    """

    __slots__ = (
        "_body",
        "_endpoint",
        "_eof_body",
        "_head_buf",
        "_head_seen",
        "_in_head",
        "_keep_alive",
        "_max_body",
        "_owner",
        "_parser",
        "_room",
        "_status",
        "_waiter",
        "idle_since",
        "pooled",
        "transport",
    )

    def __init__(self, owner: _Owner, endpoint: Endpoint) -> None:
        self._owner = owner
        self._endpoint = endpoint
        self._max_body = 0  # the cap of the request in flight's body (see send)
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[Response] | None = None
        self._body: list[bytes] = []
        self._room = self._max_body  # body bytes still allowed
        # The head (status line and headers) is checked against the limits from the
        # bytes read once its end is in (_check_head): with no on_header callback
        # httptools keeps none of it, and per-header callbacks would cost the request
        # path more than one search of the read. _in_head: httptools has not reached
        # its end; _head_seen: its bytes in earlier reads, -1 once checked; _head_buf:
        # those bytes, kept (at most MAX_HEAD_BYTES) only while a head spans reads.
        self._in_head = False
        self._head_seen = -1
        self._head_buf: bytearray | None = None
        # Set by on_message_complete; -1 while the response is incomplete.
        self._status = -1
        self._keep_alive = False
        # A response without Content-Length or chunking ends at EOF: httptools has no
        # feed_eof, so the body read so far is the answer when the server closes.
        self._eof_body = False
        self.idle_since = 0.0
        self.pooled = False  # in the client's idle pool

    # -- asyncio.Protocol ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not subclasses of asyncio.Transport, only alike.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self._waiter is None:
            # Bytes nobody asked for (after an answer, or on an idle connection): the
            # connection is out of step; drop it.
            self._break(f"{len(data)} bytes nobody asked for: {excerpt(data)}")
            return
        unchecked = self._head_seen >= 0
        try:
            self._parser.feed_data(data)
        except Exception as exc:  # HttpParserError, HttpParserUpgrade, our _Violation
            # A head over a limit is the reason even if what follows it is broken too.
            if unchecked and not self._in_head and not self._check_head(data):
                return
            self._parser_failed(exc, data)
            return
        if unchecked:
            if (
                self._in_head
                or self._head_seen
                or self._eof_body
                # This read less its body bytes: the head's size or more.
                or len(data) - self._max_body + self._room > _SMALL_HEAD
            ):
                if not self._check_head(data):
                    return
            else:
                self._head_seen = -1  # too short to break a limit
        if self._status >= 0:
            self._finish()

    def eof_received(self) -> bool | None:
        # Out of the pool at once, not when connection_lost comes a callback later.
        self._owner.forget(self)
        return None  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._owner.forget(self)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            if self._eof_body:
                self._status = self._parser.get_status_code()
                self._keep_alive = False
                self._finish()
            else:
                reason = f": {excerpt(str(exc))}" if exc is not None else ""
                self._fail(SubrequestError(f"{self.where} closed the connection{reason}"))

    # -- httptools callbacks (raising stops the parser: see _parser_failed) ----------

    def on_message_begin(self) -> None:
        if self._status >= 0:
            raise _Violation("a second response after the one asked for")

    def on_headers_complete(self) -> None:
        self._in_head = False
        # No length and not chunked: the body runs to EOF (httptools then keeps
        # feeding on_body and never calls on_message_complete). Connection: close
        # says the same; _check_head tells them apart.
        self._eof_body = not self._parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        self._room -= len(body)
        if self._room < 0:
            raise _TooLarge(f"a body over {self._max_body} bytes")
        self._body.append(body)

    def on_message_complete(self) -> None:
        # Read both now: llhttp clears the message's flags once it is complete.
        self._keep_alive = self._parser.should_keep_alive()
        self._status = self._parser.get_status_code()

    # -- requests --------------------------------------------------------------------

    def send(self, request: bytes, waiter: asyncio.Future[Response], max_body: int) -> None:
        assert self.transport is not None
        self._waiter = waiter
        self._body = []
        self._room = self._max_body = max_body
        self._head_seen = 0
        self._head_buf = None
        self._status = -1
        self._in_head = True
        self._eof_body = False
        waiter.add_done_callback(self._on_waiter_done)
        self.transport.write(request)

    def _on_waiter_done(self, waiter: asyncio.Future[Response]) -> None:
        if waiter.cancelled() and self._waiter is waiter:
            # Abandoned mid-response: what is still to come would be read as the next
            # request's answer, so this connection is done.
            self._waiter = None
            self.close()

    def _finish(self) -> None:
        """A whole response arrived (or ended at EOF): answer it, pool or close."""
        waiter, self._waiter = self._waiter, None
        status = self._status
        body = b"".join(self._body) if len(self._body) != 1 else self._body[0]
        self._body = []
        if status < 200:
            self._waiter = waiter
            self._break(f"an unexpected informational response {status} (no Expect was sent)")
            return
        transport = self.transport
        if self._keep_alive and transport is not None and not transport.is_closing():
            self._owner.release(self._endpoint, self)
        else:
            self.close()
        if waiter is not None and not waiter.done():
            waiter.set_result((status, body))

    def _check_head(self, data: bytes) -> bool:
        """Check this response's head against the limits once its end is read (until
        then keep what was read of it, up to MAX_HEAD_BYTES); tell a body cut by EOF
        from one that runs to EOF. False when the head broke a limit: the request
        failed and the connection is closed."""
        seen = self._head_seen
        if self._in_head:
            seen += len(data)
            if seen > MAX_HEAD_BYTES:
                self._break(f"a response head over {MAX_HEAD_BYTES} bytes")
                return False
            if self._head_buf is None:
                self._head_buf = bytearray(data)
            else:
                self._head_buf += data
            self._head_seen = seen
            return True
        self._head_seen = -1
        head = data
        if self._head_buf is not None:
            head = bytes(self._head_buf) + data
            self._head_buf = None
        start = 0
        if head[0] <= 13:  # httptools skips CR and LF before a status line
            start = len(head) - len(head.lstrip(b"\r\n"))
        # httptools wants CRLF line ends: the head ends at the first blank line.
        end = head.find(b"\r\n\r\n", start)
        if end < 0:
            end = len(head)
        if end - start > MAX_LINE_BYTES:
            # Rare: only a head this long can hold a line over the limit.
            if not self._check_lines(head[start:end]):
                return False
        elif head.count(b"\n", start, end) > MAX_HEADERS:  # one LF ends each but the last
            self._break(f"over {MAX_HEADERS} headers")
            return False
        if self._eof_body and _FRAMED.search(head, start, end) is not None:
            # Connection: close with a length or chunking: a body cut short is no answer.
            self._eof_body = False
        return True

    def _check_lines(self, head: bytes) -> bool:
        """The limits on a head of more than MAX_LINE_BYTES, line by line."""
        if len(head) > MAX_HEAD_BYTES:
            self._break(f"a response head over {MAX_HEAD_BYTES} bytes")
            return False
        lines = head.split(b"\r\n")
        if len(lines) - 1 > MAX_HEADERS:
            self._break(f"over {MAX_HEADERS} headers")
            return False
        if len(lines[0]) > MAX_LINE_BYTES:
            self._break(f"a status line over {MAX_LINE_BYTES} bytes")
            return False
        for line in lines:
            if len(line) > MAX_LINE_BYTES:
                name = excerpt(line.partition(b":")[0], 60)
                self._break(f"a header over {MAX_LINE_BYTES} bytes: {name}")
                return False
        return True

    def _parser_failed(self, exc: Exception, data: bytes) -> None:
        error = SubrequestError
        if isinstance(exc, httptools.HttpParserCallbackError):
            cause = exc.__context__
            if isinstance(cause, _Violation):
                reason = str(cause)
                error = AnswerTooLarge if isinstance(cause, _TooLarge) else error
            else:  # a bug of ours in a callback: still only this request's problem
                self._owner.unexpected(cause or exc, self.where)
                reason = f"a response our parser failed on ({type(cause or exc).__name__})"
        elif isinstance(exc, httptools.HttpParserUpgrade):
            reason = "a protocol upgrade"
        elif isinstance(exc, httptools.HttpParserError):
            reason = f"an unparseable response ({excerpt(str(exc), 80)}) in {excerpt(data)}"
        else:
            self._owner.unexpected(exc, self.where)
            reason = f"a response our parser failed on ({type(exc).__name__})"
        if 0 <= self._status < 200:
            reason = f"an unexpected informational response {self._status} (no Expect was sent)"
        elif self._status >= 200:
            # The answer was whole before the bytes that broke the parser: it stands,
            # the connection does not.
            log.debug("%s sent %s after a response; closing", self.where, reason)
            self._keep_alive = False
            self._finish()
            return
        self._break(reason, error)

    def _break(self, reason: str, error: type[SubrequestError] = SubrequestError) -> None:
        """Close the connection, failing its request with ``error`` for ``reason``."""
        self.close()
        self._fail(error(f"{self.where} sent {reason}"))

    def _fail(self, exc: SubrequestError) -> None:
        # What was read of a refused answer (up to max_body) is not kept meanwhile.
        self._body = []
        self._head_buf = None
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    @property
    def endpoint(self) -> Endpoint:
        return self._endpoint

    @property
    def where(self) -> str:
        """``host:port`` of the data server, for messages."""
        return self._endpoint.where

    @property
    def in_flight(self) -> bool:
        """A request was sent and its answer has not come yet."""
        return self._waiter is not None

    def abort(self, exc: SubrequestError) -> None:
        """Fail the request in flight (if any) with ``exc`` and close the connection."""
        self._fail(exc)
        self.close()

    def close(self) -> None:
        self._owner.forget(self)
        if self.transport is not None:
            self.transport.close()


class HttpClient:
    """Keep-alive HTTP/1.1 ``GET`` client for many small requests to many servers.

    One request per connection at a time; an idle connection is reused (most recent
    first), a new one opened when none is idle. At most ``max_idle`` idle connections
    are kept per endpoint, each for at most ``idle_timeout`` seconds. A response body
    over ``max_body`` bytes (or the lower cap a request gives) fails its request with
    :class:`AnswerTooLarge` as it arrives. Runs on the loop it is used from and is
    not thread-safe. ``connect_timeout`` bounds opening a connection on top of the
    caller's own deadline. Close with :meth:`aclose` (or use ``async with``).

    A host that is a name is resolved here, not by the loop's connect, and only an
    address ``networks`` admits is connected to (by default: any but link-local,
    multicast and unspecified ones, which a registration may not name either): a name
    is the one kind of address the routing table cannot judge before it is resolved,
    and one pointing at, say, a cloud's metadata service must not be sent queries.
    Names are looked up through ``resolver`` (default: a :class:`~search_server.
    resolver.CachingResolver`, answers kept 10 s; a failed connect forgets the name);
    the policy judges every address each time, cached or not. The client owns its
    resolver: :meth:`aclose` closes it too.

    Raises ``ValueError`` for a negative ``max_idle``, a ``max_body`` below 1 or a
    timeout that is not positive.
    """

    def __init__(
        self,
        *,
        max_idle: int = 32,
        idle_timeout: float = 30.0,
        connect_timeout: float = 5.0,
        max_body: int = DEFAULT_MAX_BODY,
        networks: NetworkPolicy | None = None,
        resolver: Resolver | None = None,
    ) -> None:
        if max_idle < 0:
            raise ValueError(f"max_idle must be >= 0, got {max_idle}")
        if not idle_timeout > 0:
            raise ValueError(f"idle_timeout must be > 0 seconds, got {idle_timeout}")
        if not connect_timeout > 0:
            raise ValueError(f"connect_timeout must be > 0 seconds, got {connect_timeout}")
        if max_body < 1:
            raise ValueError(f"max_body must be >= 1 byte, got {max_body}")
        self.max_body = max_body
        self._networks = networks if networks is not None else NetworkPolicy()
        self._resolver: Resolver = resolver if resolver is not None else CachingResolver()
        self._max_idle = max_idle
        self._idle_timeout = idle_timeout
        self._connect_timeout = connect_timeout
        # Keyed by the endpoint's suffix: bytes cache their hash, a dataclass does not.
        self._idle: dict[bytes, deque[_Connection]] = {}
        self._busy: set[_Connection] = set()
        self._connecting: set[asyncio.Task[None]] = set()
        self._closed = False
        # Exception types met where none was expected, each logged once at warning.
        self._unexpected_types: set[type[BaseException]] = set()
        # What this client's connections call back: no connection reaches into it.
        self._owner = _Owner(self._release, self._forget, self._unexpected)

    async def __aenter__(self) -> HttpClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    @property
    def idle_connections(self) -> int:
        """Connections open and waiting for a request."""
        return sum(len(pool) for pool in self._idle.values())

    def pool_problems(self) -> list[str]:
        """What breaks the idle pool's invariants, for tests and debugging (empty when
        sound): a connection pooled twice, a pooled connection that is closed or closing,
        has a request or is also busy, or sits under another endpoint. Walks every
        connection; not for the request path."""
        problems: list[str] = []
        seen: set[int] = set()
        for key, pool in self._idle.items():
            if not pool:
                problems.append(f"an empty pool is kept for {key!r}")
            for connection in pool:
                name = f"connection {id(connection):#x} to {connection.where}"
                if id(connection) in seen:
                    problems.append(f"{name} is pooled twice")
                seen.add(id(connection))
                transport = connection.transport
                if transport is None or transport.is_closing():
                    problems.append(f"{name} is pooled but closed")
                if connection.in_flight:
                    problems.append(f"{name} is pooled with a request in flight")
                if connection in self._busy:
                    problems.append(f"{name} is pooled and busy")
                if not connection.pooled:
                    problems.append(f"{name} is pooled but not marked so")
                if connection.endpoint.suffix != key:
                    problems.append(f"{name} is pooled under another endpoint")
        for connection in self._busy:
            if connection.pooled:
                problems.append(f"connection {id(connection):#x} is busy but marked pooled")
        return problems

    def get(
        self, endpoint: Endpoint, target: bytes, max_body: int | None = None
    ) -> asyncio.Future[Response]:
        loop = asyncio.get_running_loop()
        cap = self.max_body if max_body is None else min(max_body, self.max_body)
        waiter: asyncio.Future[Response] = loop.create_future()
        if self._closed:
            waiter.set_exception(SubrequestError("the client is closed"))
            return waiter
        if endpoint.problem is not None:
            waiter.set_exception(
                SubrequestError(f"cannot send to {endpoint.where}: {endpoint.problem}")
            )
            return waiter
        try:
            request = b"GET " + target + endpoint.suffix
            connection = self._checkout(endpoint, loop.time())
            if connection is not None:
                self._busy.add(connection)
                connection.send(request, waiter, cap)
                return waiter
            task = loop.create_task(self._connect_and_send(endpoint, request, waiter, cap))
            self._connecting.add(task)
            task.add_done_callback(self._connecting.discard)
        except Exception as exc:  # the contract: never raise, fail this request only
            self._unexpected(exc, endpoint.where)
            if not waiter.done():
                waiter.set_exception(
                    SubrequestError(f"cannot send to {endpoint.where}: {_describe(exc)}")
                )
        return waiter

    def _checkout(self, endpoint: Endpoint, now: float) -> _Connection | None:
        pool = self._idle.get(endpoint.suffix)
        if pool is None:
            return None
        found: _Connection | None = None
        while pool:
            connection = pool.pop()  # the most recently used: least likely to be timed out
            connection.pooled = False
            transport = connection.transport
            if transport is None or transport.is_closing():
                continue
            if now - connection.idle_since > self._idle_timeout:
                connection.close()
                continue
            found = connection
            break
        if not pool:
            # No empty pool is kept: at 50,000 endpoints they would add up, and _forget
            # (which drops emptied pools) never sees a connection taken out here.
            del self._idle[endpoint.suffix]
        return found

    async def _connect_and_send(
        self, endpoint: Endpoint, request: bytes, waiter: asyncio.Future[Response], cap: int
    ) -> None:
        loop = asyncio.get_running_loop()
        where = endpoint.where
        try:
            async with asyncio.timeout(self._connect_timeout):
                # The waiter's cancellation (the query's deadline) also ends the connect.
                connect = loop.create_task(self._open(endpoint))
                waiter.add_done_callback(lambda _: connect.cancel())
                connection = await connect
        except SubrequestError as exc:
            if not waiter.done():
                waiter.set_exception(exc)
            return
        except asyncio.CancelledError:
            if not waiter.done():
                waiter.set_exception(SubrequestError(f"connecting to {where} was cancelled"))
            return
        except (OSError, TimeoutError) as exc:
            if not waiter.done():
                why = excerpt(str(exc)) if str(exc) else type(exc).__name__
                waiter.set_exception(SubrequestError(f"cannot connect to {where}: {why}"))
            return
        except Exception as exc:
            # UnicodeError from the IDNA codec (a label over 63), OverflowError for a
            # port out of range, ValueError, a resolver's or loop's own: all the same to
            # the caller, a replica that cannot be reached.
            self._unexpected(exc, where)
            if not waiter.done():
                waiter.set_exception(
                    SubrequestError(f"cannot connect to {where}: {_describe(exc)}")
                )
            return
        except BaseException:
            if not waiter.done():
                waiter.set_exception(SubrequestError(f"connecting to {where} was interrupted"))
            raise
        try:
            if waiter.done() or self._closed:
                # Nobody waits any more; keep the fresh connection for the next request.
                self._release(endpoint, connection)
                return
            self._busy.add(connection)
            connection.send(request, waiter, cap)
        except Exception as exc:
            self._unexpected(exc, where)
            connection.close()
            if not waiter.done():
                waiter.set_exception(SubrequestError(f"cannot send to {where}: {_describe(exc)}"))

    async def _open(self, endpoint: Endpoint) -> _Connection:
        """A new connection to ``endpoint``; a name is resolved first and connected to
        at the first of its addresses the network policy admits that accepts.

        Raises:
            SubrequestError: the name resolves only to refused addresses.
            OSError, and whatever the resolver or the loop raises (the caller turns it
            into a failed request).
        """
        loop = asyncio.get_running_loop()
        host, port = endpoint.host, endpoint.port

        def protocol() -> _Connection:
            return _Connection(self._owner, endpoint)

        if _is_ip_literal(host):
            # Judged by the routing table before it got here (and by the registration's
            # validation): no resolution, no second look.
            _, connection = await loop.create_connection(protocol, host, port)
            return connection
        if "\x00" in host:
            # The C resolver stops at a NUL ("127.0.0.1\x00.evil" would be 127.0.0.1);
            # the stdlib's own socket functions refuse it the same way.
            raise ValueError(f"embedded null character in host {excerpt(host)}")
        infos = await self._resolver.resolve(host)
        refused: list[str] = []
        failed: OSError | None = None
        for family, _, proto, _, sockaddr in infos:
            address = str(sockaddr[0])
            problem = self._networks.resolved_problem(address)
            if problem is not None:
                refused.append(problem)
                continue
            try:
                _, connection = await loop.create_connection(
                    protocol, address, port, family=family, proto=proto
                )
            except OSError as exc:
                # The name may have moved (a container started again elsewhere): the
                # next connection looks it up again rather than trust the cache. This
                # one tries the next address, as the loop's own connect does.
                self._resolver.forget(host)
                failed = exc
                continue
            return connection
        if failed is not None:
            raise failed
        why = "; ".join(refused) if refused else "no address"
        raise SubrequestError(f"{endpoint.where} resolves to no allowed address: {excerpt(why)}")

    def _release(self, endpoint: Endpoint, connection: _Connection) -> None:
        self._busy.discard(connection)
        if self._closed or connection.pooled:
            # pooled: a second release of one connection would hand it to two requests.
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
        connection.pooled = True
        pool.append(connection)

    def _forget(self, connection: _Connection) -> None:
        self._busy.discard(connection)
        if not connection.pooled:
            return
        connection.pooled = False
        key = connection.endpoint.suffix
        pool = self._idle.get(key)
        if pool is not None:
            # Pooled at most once (see _release), so one remove takes it out.
            pool.remove(connection)
            if not pool:
                del self._idle[key]

    def _unexpected(self, exc: BaseException, where: str) -> None:
        """Log an exception type met where none was expected: once per type at warning
        (one bad address must not flood the log), later ones at debug."""
        kind = type(exc)
        if kind in self._unexpected_types:
            log.debug("sub-request to %s: %s", where, _describe(exc))
            return
        self._unexpected_types.add(kind)
        log.warning(
            "sub-request to %s failed with an unexpected %s.%s (later ones at debug): %s",
            where,
            kind.__module__,
            kind.__qualname__,
            excerpt(str(exc)),
        )

    async def aclose(self) -> None:
        """Close all connections and cancel connects in progress; idempotent."""
        self._closed = True
        for task in list(self._connecting):
            task.cancel()
        if self._connecting:
            await asyncio.gather(*self._connecting, return_exceptions=True)
        await self._resolver.aclose()
        for pool in list(self._idle.values()):
            for connection in list(pool):
                connection.close()
        for connection in list(self._busy):
            connection.abort(SubrequestError("the client is closed"))
        self._idle.clear()
        self._busy.clear()


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {excerpt(text)}" if text else type(exc).__name__


def _is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
