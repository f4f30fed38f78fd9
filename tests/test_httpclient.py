"""The fan-out's HTTP/1.1 client against raw asyncio servers that answer as told:
keep-alive reuse, the framings of a response, and every way a connection can end."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from search_server.httpclient import Endpoint, HttpClient, SubrequestClient, SubrequestError
from tests.support import eventually

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
