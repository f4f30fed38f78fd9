"""The fan-out's HTTP/1.1 client against raw asyncio servers that answer as told:
keep-alive reuse, the framings of a response, and every way a connection can end."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import re
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from data_server.corpus import sample_queries
from discovery.address import NetworkPolicy, parse_networks
from search_server.fanout import FanOut, FanOutConfig
from search_server.httpclient import (
    MAX_HEAD_BYTES,
    MAX_HEADERS,
    MAX_LINE_BYTES,
    AnswerTooLarge,
    Endpoint,
    HttpClient,
    Response,
    SubrequestClient,
    SubrequestError,
)
from tests.support import (
    DataServerFactory,
    eventually,
    instance_of,
    make_instance,
    shard_counts,
    waited,
)

Answer = Callable[[bytes], bytes | None]


class _Peer(asyncio.Protocol):
    def __init__(self, server: RawServer) -> None:
        self._server = server
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self._server.accepted += 1
        self._server.open.add(self)

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        self._server.requests.append(data)
        reply = self._server.answer(data)
        if reply is None:
            return  # hang
        self.transport.write(reply)
        if self._server.close_after:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.open.discard(self)
        self._server.closed += 1


class RawServer:
    """A TCP server answering every request with ``answer(request)`` (None: never)."""

    def __init__(self, answer: Answer, *, close_after: bool = False) -> None:
        self.answer = answer
        self.close_after = close_after
        self.accepted = 0
        self.closed = 0
        self.requests: list[bytes] = []
        self.open: set[_Peer] = set()
        self.server: asyncio.Server | None = None

    async def start(self) -> Endpoint:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(lambda: _Peer(self), "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return Endpoint.of("127.0.0.1", port)

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        for peer in list(self.open):
            if peer.transport is not None:
                peer.transport.close()
        await self.server.wait_closed()


def ok(body: bytes, *extra: str) -> bytes:
    headers = "".join(f"{h}\r\n" for h in extra)
    return f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n{headers}\r\n".encode() + body


@pytest.fixture
async def client() -> AsyncIterator[HttpClient]:
    async with HttpClient() as sub_client:
        yield sub_client


@pytest.fixture
async def servers() -> AsyncIterator[list[RawServer]]:
    started: list[RawServer] = []
    yield started
    for server in started:
        await server.stop()


async def serve(
    servers: list[RawServer], answer: Answer, **options: bool
) -> tuple[RawServer, Endpoint]:
    server = RawServer(answer, **options)
    servers.append(server)
    return server, await server.start()


def test_the_client_implements_the_seam() -> None:
    assert isinstance(HttpClient(), SubrequestClient)


def test_an_endpoint_pre_encodes_the_request_tail() -> None:
    assert Endpoint.of("10.0.0.7", 9001).suffix == b" HTTP/1.1\r\nHost: 10.0.0.7:9001\r\n\r\n"
    assert Endpoint.of("::1", 9001).suffix == b" HTTP/1.1\r\nHost: [::1]:9001\r\n\r\n"


async def test_requests_reuse_one_keep_alive_connection(
    client: HttpClient, servers: list[RawServer]
) -> None:
    server, endpoint = await serve(servers, lambda request: ok(b'{"n":1}'))
    for _ in range(5):
        status, body = await client.get(endpoint, b"/search?q=a&k=3")
        assert (status, body) == (200, b'{"n":1}')
    assert server.accepted == 1
    assert server.requests[0].startswith(b"GET /search?q=a&k=3 HTTP/1.1\r\nHost: 127.0.0.1:")
    assert client.idle_connections == 1


async def test_concurrent_requests_open_connections_and_keep_at_most_max_idle(
    servers: list[RawServer],
) -> None:
    server, endpoint = await serve(servers, lambda request: ok(b"x"))
    async with HttpClient(max_idle=2) as client:
        answers = await asyncio.gather(*(client.get(endpoint, b"/") for _ in range(4)))
        assert answers == [(200, b"x")] * 4
        assert server.accepted == 4
        assert client.idle_connections == 2
        await eventually(lambda: server.closed == 2, message="the extra connections closed")


async def test_a_chunked_response_is_reassembled(
    client: HttpClient, servers: list[RawServer]
) -> None:
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    )
    server, endpoint = await serve(servers, lambda request: chunked)
    assert await client.get(endpoint, b"/") == (200, b"abcde")
    assert await client.get(endpoint, b"/") == (200, b"abcde")
    assert server.accepted == 1  # still keep-alive


async def test_a_response_ending_at_eof_and_connection_close(
    client: HttpClient, servers: list[RawServer]
) -> None:
    # No length, no chunking: the body runs until the server closes.
    until_eof = b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\n\r\nbusy, try later"
    server, endpoint = await serve(servers, lambda request: until_eof, close_after=True)
    assert await client.get(endpoint, b"/") == (503, b"busy, try later")
    assert await client.get(endpoint, b"/") == (503, b"busy, try later")
    assert server.accepted == 2
    assert client.idle_connections == 0


async def test_connection_close_with_a_length_is_not_kept(
    client: HttpClient, servers: list[RawServer]
) -> None:
    server, endpoint = await serve(servers, lambda request: ok(b"bye", "Connection: close"))
    assert await client.get(endpoint, b"/") == (200, b"bye")
    assert await client.get(endpoint, b"/") == (200, b"bye")
    assert server.accepted == 2


async def test_a_cancelled_request_closes_its_connection(
    client: HttpClient, servers: list[RawServer]
) -> None:
    hang = True
    server, endpoint = await serve(servers, lambda request: None if hang else ok(b"late"))
    future = client.get(endpoint, b"/")
    await eventually(lambda: len(server.requests) == 1, message="the request arrived")
    future.cancel()
    # Its answer could still come and be read as the next request's: the connection goes.
    await eventually(lambda: server.closed == 1, message="the connection closed")
    hang = False
    assert await client.get(endpoint, b"/") == (200, b"late")
    assert server.accepted == 2


async def test_refused_connection_fails_the_request(client: HttpClient) -> None:
    from discovery.testing.ports import free_port

    with pytest.raises(SubrequestError, match="cannot connect"):
        await client.get(Endpoint.of("127.0.0.1", free_port()), b"/")


async def test_garbage_and_early_close_fail_the_request(
    client: HttpClient, servers: list[RawServer]
) -> None:
    _, garbage = await serve(servers, lambda request: b"SSH-2.0-OpenSSH_9.2\r\n\r\n")
    with pytest.raises(SubrequestError, match="unparseable"):
        await client.get(garbage, b"/")
    half = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly a part"
    _, truncated = await serve(servers, lambda request: half, close_after=True)
    with pytest.raises(SubrequestError, match="closed the connection"):
        await client.get(truncated, b"/")
    assert client.idle_connections == 0


async def test_a_connection_the_server_closed_while_idle_is_not_used(
    client: HttpClient, servers: list[RawServer]
) -> None:
    server, endpoint = await serve(servers, lambda request: ok(b"x"))
    assert await client.get(endpoint, b"/") == (200, b"x")
    for peer in list(server.open):
        assert peer.transport is not None
        peer.transport.close()
    await eventually(lambda: client.idle_connections == 0, message="the client noticed")
    assert await client.get(endpoint, b"/") == (200, b"x")
    assert server.accepted == 2


async def test_idle_connections_expire(servers: list[RawServer]) -> None:
    server, endpoint = await serve(servers, lambda request: ok(b"x"))
    async with HttpClient(idle_timeout=1e-9) as client:
        assert await client.get(endpoint, b"/") == (200, b"x")
        assert await client.get(endpoint, b"/") == (200, b"x")
    assert server.accepted == 2


async def test_aclose_fails_requests_in_flight_and_refuses_new_ones(
    servers: list[RawServer],
) -> None:
    server, endpoint = await serve(servers, lambda request: None)
    client = HttpClient()
    future = client.get(endpoint, b"/")
    await eventually(lambda: len(server.requests) == 1, message="the request arrived")
    await client.aclose()
    with pytest.raises(SubrequestError, match="closed"):
        await future
    with pytest.raises(SubrequestError, match="closed"):
        await client.get(endpoint, b"/")
    await eventually(lambda: server.closed == 1, message="the connection closed")


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="max_idle"):
        HttpClient(max_idle=-1)
    with pytest.raises(ValueError, match="idle_timeout"):
        HttpClient(idle_timeout=0)


# -- hostile data servers (issue 21) --------------------------------------------------
#
# Each peer below is a real TCP server on loopback playing a data server that breaks
# the rules; the client must fail that request only, bound what it holds, and never
# pool a connection that carried anything but one final response per request.

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class StreamPeer:
    """``asyncio.start_server`` running ``handler`` per connection, counting them."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.accepted = 0
        self.finished = 0  # connections whose handler returned (the client closed, or it did)
        self.sent = 0  # bytes written by handlers that count them
        self.server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self._writers.add(writer)
        try:
            await self.handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client broke the connection: what these tests expect of it
        finally:
            self._writers.discard(writer)
            writer.close()
            # How the connection ended, retrieved (see tests/unit/test_httpclient_fuzz.py).
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            self.finished += 1

    async def start(self) -> Endpoint:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return Endpoint.of("127.0.0.1", self.server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        for writer in list(self._writers):
            writer.close()
        await self.server.wait_closed()


@pytest.fixture
async def peers() -> AsyncIterator[list[StreamPeer]]:
    started: list[StreamPeer] = []
    yield started
    for peer in started:
        await peer.stop()


async def peer(peers: list[StreamPeer], handler: Handler) -> tuple[StreamPeer, Endpoint]:
    started = StreamPeer(handler)
    peers.append(started)
    return started, await started.start()


def answering(*responses: bytes) -> Handler:
    """A handler that reads each request and writes ``responses`` at once, in one write."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"".join(responses))
            await writer.drain()

    return handle


@pytest.fixture(autouse=True)
async def loop_errors() -> AsyncIterator[list[dict[str, Any]]]:
    """What reaches the loop's exception handler during a test (an exception escaping
    a protocol callback, "Task exception was never retrieved"): nothing may."""
    loop = asyncio.get_running_loop()
    seen: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: seen.append(context))
    yield seen
    gc.collect()  # an unretrieved task exception is reported when the task is collected
    await asyncio.sleep(0)  # ok-sleep: one turn of the loop for the reports just queued
    loop.set_exception_handler(None)
    assert seen == []


async def fails(future: asyncio.Future[Response], match: str, timeout: float = 10.0) -> str:
    """Await ``future``, which must fail with SubrequestError matching ``match`` by itself
    well within ``timeout``; return the message."""
    with pytest.raises(SubrequestError, match=match) as caught:
        await waited(future, f"the request to fail with {match!r}", timeout=timeout)
    return str(caught.value)


UNUSABLE = [
    ("dätä.example", 9001, "not ASCII"),
    ("bad host", 9001, "whitespace or control"),
    ("evil.example\r\nX-Injected: 1", 9001, "whitespace or control"),
    ("10.0.0.1\x00", 9001, "whitespace or control"),
    ("", 9001, "empty"),
    ("10.0.0.1/admin", 9001, "'/'"),
    ("[::1]", 9001, r"'\['"),
    ("a" * 300, 9001, "300 characters"),
    ("10.0.0.1", 0, "1-65535"),
    ("10.0.0.1", 70000, "1-65535"),
    ("10.0.0.1", -1, "1-65535"),
]


@pytest.mark.parametrize(("host", "port", "why"), UNUSABLE)
async def test_an_unusable_address_fails_its_requests_not_the_caller(
    client: HttpClient, host: str, port: int, why: str
) -> None:
    endpoint = Endpoint.of(host, port)  # never raises: the routing table is built anyway
    assert endpoint.problem is not None
    assert endpoint.suffix == b""
    message = await fails(client.get(endpoint, b"/search?q=a"), why)
    assert "cannot send to" in message
    assert len(message) < 500
    assert client.idle_connections == 0


def test_an_address_is_quoted_in_a_bounded_excerpt() -> None:
    endpoint = Endpoint.of("\r\n" * 50_000, 9001)
    assert endpoint.problem is not None
    assert len(endpoint.problem) < 300
    assert len(endpoint.where) < 300
    assert "\n" not in endpoint.problem + endpoint.where


@pytest.mark.parametrize(
    ("endpoint", "kind"),
    [
        # The IDNA codec refuses a label over 63 characters: UnicodeError, not OSError
        # (its subclass UnicodeEncodeError since Python 3.13).
        (Endpoint.of("a" * 70 + ".example", 9001), "Unicode(Encode)?Error"),
        (Endpoint.of("a..example", 9001), "Unicode(Encode)?Error"),
        # Built without Endpoint.of: what the loop raises for them reaches the client.
        (Endpoint("127.0.0.1", 70000, b" HTTP/1.1\r\nHost: x\r\n\r\n"), "OverflowError"),
        (Endpoint("127.0.0.1\x00", 9001, b" HTTP/1.1\r\nHost: x\r\n\r\n"), "ValueError"),
    ],
)
async def test_any_exception_while_connecting_fails_that_request_only(
    client: HttpClient, endpoint: Endpoint, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="search_server.httpclient")
    for _ in range(3):
        await fails(client.get(endpoint, b"/"), f"cannot connect to .*{kind}")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1  # once per exception type, not once per request
    assert re.search(kind, warnings[0].getMessage())


async def test_a_name_is_connected_to_only_at_an_address_the_networks_admit(
    peers: list[StreamPeer],
) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()

    peer = StreamPeer(answer)
    peers.append(peer)
    port = (await peer.start()).port
    # "localhost" resolves to loopback: outside 10.0.0.0/8, so never connected to.
    async with HttpClient(networks=NetworkPolicy.of(parse_networks("10.0.0.0/8"))) as narrow:
        message = await fails(
            narrow.get(Endpoint.of("localhost", port), b"/"), "resolves to no allowed address"
        )
        assert "outside the allowed networks" in message
    assert peer.accepted == 0
    async with HttpClient(networks=NetworkPolicy.of(parse_networks("127.0.0.0/8,::1/128"))) as ok:
        assert await ok.get(Endpoint.of("localhost", port), b"/") == (200, b"ok")
    assert peer.accepted == 1


@pytest.mark.parametrize("framing", ["chunked", "length", "eof"])
async def test_an_endless_body_is_cut_at_max_body(peers: list[StreamPeer], framing: str) -> None:
    total, block = 100 * 2**20, b"x" * 65536
    head = {
        "chunked": b"Transfer-Encoding: chunked\r\n",
        "length": f"Content-Length: {total}\r\n".encode(),
        "eof": b"Connection: close\r\n",
    }[framing]

    async def stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\n" + head + b"\r\n")
        piece = b"%x\r\n%s\r\n" % (len(block), block) if framing == "chunked" else block
        while server.sent < total:
            writer.write(piece)
            server.sent += len(block)
            await writer.drain()  # only as fast as the client reads
        writer.write(b"0\r\n\r\n" if framing == "chunked" else b"")

    server, endpoint = await peer(peers, stream)
    cap = 2 * 2**20
    tracemalloc.start()
    try:
        async with HttpClient(max_body=cap) as client:
            await fails(client.get(endpoint, b"/"), f"a body over {cap} bytes", timeout=30)
            _, peak = tracemalloc.get_traced_memory()
            assert client.idle_connections == 0
    finally:
        tracemalloc.stop()
    # The client held at most the cap and a few reads, not the 100 MiB on offer.
    assert peak < cap + 4 * 2**20, peak
    await eventually(lambda: server.finished == 1, message="the connection closed")
    assert server.sent < total / 4


async def test_a_request_s_own_cap_bounds_its_body_never_above_the_client_s(
    servers: list[RawServer],
) -> None:
    _, endpoint = await serve(servers, lambda _: ok(b"x" * 5000))
    async with HttpClient(max_body=8000) as client:
        assert await client.get(endpoint, b"/", 5000) == (200, b"x" * 5000)
        # The same keep-alive connection, a lower cap: this request's is the one held.
        with pytest.raises(AnswerTooLarge, match="a body over 4999 bytes"):
            await waited(client.get(endpoint, b"/", 4999), "the request to fail")
        assert await client.get(endpoint, b"/", 10**9) == (200, b"x" * 5000)
    async with HttpClient(max_body=4096) as client:
        with pytest.raises(AnswerTooLarge, match="a body over 4096 bytes"):
            await waited(client.get(endpoint, b"/", 10**9), "the request to fail")


async def test_a_body_over_the_request_s_cap_is_refused_as_it_arrives(
    peers: list[StreamPeer],
) -> None:
    total, block = 100 * 2**20, b"x" * 65536

    async def stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % total)
        while server.sent < total:
            writer.write(block)
            server.sent += len(block)
            await writer.drain()  # only as fast as the client reads

    server, endpoint = await peer(peers, stream)
    cap = 64 * 1024
    tracemalloc.start()
    try:
        async with HttpClient() as client:  # its own cap: 8 MiB
            await fails(client.get(endpoint, b"/", cap), f"a body over {cap} bytes", timeout=30)
            _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Held at most the request's cap and a few reads: not the client's 8 MiB.
    assert peak < cap + 4 * 2**20, peak
    await eventually(lambda: server.finished == 1, message="the connection closed")
    assert server.sent < total / 4


async def test_too_many_headers_fail_the_request_and_the_connection(
    client: HttpClient, peers: list[StreamPeer]
) -> None:
    def with_headers(n: int) -> bytes:
        headers = b"".join(b"X-H%d: v\r\n" % i for i in range(n))
        return b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n" + headers + b"\r\nok"

    _, fine = await peer(peers, answering(with_headers(MAX_HEADERS - 1)))
    assert await client.get(fine, b"/") == (200, b"ok")
    server, endpoint = await peer(peers, answering(with_headers(MAX_HEADERS)))
    await fails(client.get(endpoint, b"/"), f"over {MAX_HEADERS} headers")
    await fails(client.get(endpoint, b"/"), f"over {MAX_HEADERS} headers")
    assert server.accepted == 2  # the first connection was not reused
    await eventually(lambda: server.finished == 2, message="both connections closed")
    assert client.pool_problems() == []


@pytest.mark.parametrize(
    ("response", "why"),
    [
        (
            b"HTTP/1.1 200 OK\r\nX-Big: "
            + b"v" * MAX_LINE_BYTES
            + b"\r\nContent-Length: 0\r\n\r\n",
            "a header over",
        ),
        (
            b"HTTP/1.1 200 " + b"R" * (MAX_LINE_BYTES + 1) + b"\r\nContent-Length: 0\r\n\r\n",
            "a status line over",
        ),
        (
            b"HTTP/1.1 200 OK\r\n"
            + b"".join(b"X-%d: %s\r\n" % (i, b"v" * 4000) for i in range(17))
            + b"Content-Length: 0\r\n\r\n",
            f"a response head over {MAX_HEAD_BYTES} bytes",
        ),
    ],
    ids=["header", "status-line", "head"],
)
async def test_a_huge_head_fails_the_request_and_the_connection(
    client: HttpClient, peers: list[StreamPeer], response: bytes, why: str
) -> None:
    server, endpoint = await peer(peers, answering(response))
    await fails(client.get(endpoint, b"/"), why)
    await eventually(lambda: server.finished == 1, message="the connection closed")
    assert client.idle_connections == 0


async def test_an_endless_header_is_cut_at_the_head_limit(
    client: HttpClient, peers: list[StreamPeer]
) -> None:
    # One header value that never ends: httptools keeps an unfinished header in memory,
    # so the client must count the reads themselves.
    async def stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nX-Endless: ")
        while server.sent < 100 * 2**20:
            writer.write(b"v" * 4096)
            server.sent += 4096
            await writer.drain()

    server, endpoint = await peer(peers, stream)
    tracemalloc.start()
    try:
        await fails(client.get(endpoint, b"/"), f"head over {MAX_HEAD_BYTES} bytes", timeout=30)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * 2**20, peak
    await eventually(lambda: server.finished == 1, message="the connection closed")
    # What the kernel's loopback buffers took, not the 100 MiB on offer.
    assert server.sent < 25 * 2**20


def with_headers(n: int, *, line: int = 8) -> bytes:
    """A 200 answer ``ok`` with ``n`` headers, the last of ``line`` bytes (CRLF not counted)."""
    headers = [b"Content-Length: 2"] + [b"X-H%03d: v" % i for i in range(n - 2)]
    headers.append(b"X-Last: " + b"v" * (line - len(b"X-Last: ")))
    return b"HTTP/1.1 200 OK\r\n" + b"".join(h + b"\r\n" for h in headers) + b"\r\nok"


def big_head(n: int) -> bytes:
    """A 200 answer ``ok`` with ``n`` headers of 7,000 bytes: 9 fit in MAX_HEAD_BYTES."""
    headers = b"".join(b"X-%d: %s\r\n" % (i, b"v" * 6994) for i in range(n))
    return b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n" + headers + b"\r\nok"


def paced(response: bytes, size: int) -> Handler:
    """A handler writing ``response`` in pieces of ``size`` bytes, each in a read of its
    own most of the time."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await reader.readuntil(b"\r\n\r\n")
            for at in range(0, len(response), size):
                writer.write(response[at : at + size])
                await writer.drain()
                await asyncio.sleep(0.001)  # ok-sleep: the peer's pace is what is under test

    return handle


@pytest.mark.parametrize("size", [97, 4000, 1 << 20], ids=["97B", "4000B", "whole"])
async def test_the_head_limits_hold_however_the_head_is_split(
    client: HttpClient, peers: list[StreamPeer], size: int
) -> None:
    cases = [
        (with_headers(MAX_HEADERS), None),
        (with_headers(MAX_HEADERS + 1), f"over {MAX_HEADERS} headers"),
        (with_headers(3, line=MAX_LINE_BYTES), None),
        (with_headers(3, line=MAX_LINE_BYTES + 1), f"a header over {MAX_LINE_BYTES} bytes"),
        (big_head(9), None),
        (big_head(10), f"a response head over {MAX_HEAD_BYTES} bytes"),
    ]
    for response, why in cases:
        server, endpoint = await peer(peers, paced(response, size))
        if why is None:
            assert await client.get(endpoint, b"/") == (200, b"ok")
            assert await client.get(endpoint, b"/") == (200, b"ok")
            assert server.accepted == 1
        else:
            await fails(client.get(endpoint, b"/"), why)
            await eventually(
                lambda peer=server: peer.finished == 1, message="the connection closed"
            )
    assert client.pool_problems() == []


INFORMATIONAL = {
    "100-alone": b"HTTP/1.1 100 Continue\r\n\r\n",
    "100-then-200": b"HTTP/1.1 100 Continue\r\n\r\n" + ok(b"late"),
    "103-then-200": b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n"
    + ok(b"late"),
    "101-upgrade": b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
    b"Connection: Upgrade\r\n\r\n\x81\x05hello",
}


@pytest.mark.parametrize("response", INFORMATIONAL.values(), ids=INFORMATIONAL.keys())
async def test_an_informational_response_breaks_the_connection(
    client: HttpClient, peers: list[StreamPeer], response: bytes
) -> None:
    server, endpoint = await peer(peers, answering(response))
    await fails(client.get(endpoint, b"/"), "unexpected informational response 1")
    await fails(client.get(endpoint, b"/"), "unexpected informational response 1")
    assert server.accepted == 2
    assert client.pool_problems() == []
    assert client.idle_connections == 0
    await eventually(lambda: server.finished == 2, message="both connections closed")


@pytest.mark.parametrize(
    "extra",
    [ok(b"two"), b"HTTP/1.1 200 OK\r\nContent-Le", b"\x00garbage after the answer"],
    ids=["second-response", "partial-second", "garbage"],
)
async def test_bytes_after_a_response_break_the_connection(
    client: HttpClient, peers: list[StreamPeer], extra: bytes
) -> None:
    # In the same write: the answer is whole and stands, its connection does not.
    server, endpoint = await peer(peers, answering(ok(b"one"), extra))
    assert await client.get(endpoint, b"/") == (200, b"one")
    assert client.idle_connections == 0
    assert client.pool_problems() == []
    assert await client.get(endpoint, b"/") == (200, b"one")
    assert server.accepted == 2
    await eventually(lambda: server.finished == 2, message="both connections closed")


async def test_bytes_on_an_idle_connection_take_it_out_of_the_pool(
    client: HttpClient, peers: list[StreamPeer]
) -> None:
    later = asyncio.Event()

    async def late_second(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(ok(b"one"))
        await later.wait()
        writer.write(ok(b"two"))  # an answer to nothing, while the connection is idle
        await reader.read()  # until the client closes

    server, endpoint = await peer(peers, late_second)
    assert await client.get(endpoint, b"/") == (200, b"one")
    assert client.idle_connections == 1
    later.set()
    await eventually(lambda: server.finished == 1, message="the client closed it")
    assert client.idle_connections == 0
    assert client.pool_problems() == []


async def test_a_framed_body_cut_by_the_server_closing_is_no_answer(
    client: HttpClient, servers: list[RawServer]
) -> None:
    # Connection: close makes httptools report no keep-alive, but the length still
    # says where the body ends: ending before it is a failure, not a short answer.
    cut = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 100\r\n\r\nonly a part"
    _, endpoint = await serve(servers, lambda request: cut, close_after=True)
    await fails(client.get(endpoint, b"/"), "closed the connection")
    chunked = b"HTTP/1.1 200 OK\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab"
    _, endpoint = await serve(servers, lambda request: chunked, close_after=True)
    await fails(client.get(endpoint, b"/"), "closed the connection")


async def test_a_trickling_server_is_bounded_by_the_callers_deadline(
    client: HttpClient, peers: list[StreamPeer]
) -> None:
    trickled = asyncio.Event()

    async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        for byte in ok(b"x" * 1000):
            writer.write(bytes([byte]))
            await writer.drain()
            trickled.set()
            await asyncio.sleep(0.005)  # ok-sleep: the peer's pace is what is under test
        await reader.read()

    server, endpoint = await peer(peers, trickle)
    future = client.get(endpoint, b"/")
    await trickled.wait()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.2):  # the caller's deadline
            await asyncio.shield(future)
    future.cancel()  # what the fan-out does at its deadline
    assert future.done()
    await eventually(lambda: server.finished == 1, message="the connection closed")
    assert client.idle_connections == 0
    assert client.pool_problems() == []


async def test_pool_problems_sees_a_connection_pooled_twice(
    client: HttpClient, servers: list[RawServer]
) -> None:
    _, endpoint = await serve(servers, lambda request: ok(b"x"))
    assert await client.get(endpoint, b"/") == (200, b"x")
    assert client.pool_problems() == []
    pool = client._idle[endpoint.suffix]
    pool.append(pool[0])  # what a double release would do
    assert any("pooled twice" in problem for problem in client.pool_problems())
    pool.pop()


# -- through the fan-out -----------------------------------------------------------------


@pytest.mark.parametrize("address", ["dätä.example", "a" * 70 + ".example", "evil\r\nX: 1"])
async def test_a_replica_at_an_unusable_address_costs_only_its_own_requests(
    make_data_server: DataServerFactory, client: HttpClient, address: str
) -> None:
    # Issue 21: one such registration made every query answer 500, as the routing table
    # could not be built. Now its requests fail like a refused connection's: its shard
    # is retried on its partner, a shard it alone serves fails, the others answer.
    # Registrations are validated now (discovery/address.py), so no such instance can
    # be decoded; the client must not depend on that (a store of another kind, an
    # instance built before the rule): the address is set past the validation.
    healthy = await make_data_server(shard=0, replica=0, instance_id="ds-healthy")
    bad = [
        make_instance("ds-bad-0", 9001, shard=0, replica=1),
        make_instance("ds-bad-1", 9001, shard=1),
    ]
    for instance in bad:
        object.__setattr__(instance, "address", address)
    servers = [instance_of(healthy), *bad]
    fanout = FanOut(client, config=FanOutConfig(eject_after=1000), registry=CollectorRegistry())
    for query in sample_queries(5, variant=3):
        result = await fanout.search(servers, query, 10, 5000)
        assert result.shards == shard_counts(2, 1, failed=1)
        assert result.hits
        assert all(hit["shard"] == 0 for hit in result.hits)
