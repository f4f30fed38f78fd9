"""The cap on both servers' open connections (:mod:`discovery.httpconns`), on real servers.

Clients are raw sockets holding kept-alive connections idle after one request each: at
``--max-connections`` a new client still gets in, the longest idle making room (with
none idle, the longest waiting for its head); a request in progress (a dashboard stream,
a request whose body is late) is never cut; with every connection busy a new one is
answered 503 at once; and near the cap idle
connections are closed after ``--pressure-keepalive``. A search server has no other
clients, so which connections close is exact there; a data server's agent opens a
connection for each probe, so only what holds whatever the probes do is asserted.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from discovery.config import HttpEdgeConfig
from search_server.server import SearchServer
from tests.support import (
    DataServerFactory,
    SearchServerFactory,
    eventually,
    get_json,
    sample,
    waited,
)

Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]

HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
#: Long enough that nothing but the rule under test closes a connection.
LONG = 600.0


async def _read_to_eof(reader: asyncio.StreamReader) -> bytes:
    """What the server sends until it closes the connection (a reset counts as closed)."""
    chunks = []
    with contextlib.suppress(ConnectionError):
        while chunk := await reader.read(65536):
            chunks.append(chunk)
    return b"".join(chunks)


async def _response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One HTTP/1.1 response with a Content-Length: its status and body."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = next(
        int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:")
    )
    return int(lines[0].split()[1]), await reader.readexactly(length)


async def _event(reader: asyncio.StreamReader) -> bytes:
    """The next ``data:`` line of a dashboard stream."""
    while True:
        line = await reader.readline()
        if not line:
            raise AssertionError("the stream ended")
        if line.startswith(b"data: "):
            return line


@contextlib.asynccontextmanager
async def _connections() -> AsyncIterator[list[Stream]]:
    """Raw connections opened in the block (append them), all closed after it."""
    opened: list[Stream] = []
    try:
        yield opened
    finally:
        for _, writer in opened:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()


async def _open(port: int, opened: list[Stream]) -> Stream:
    stream = await asyncio.open_connection("127.0.0.1", port)
    opened.append(stream)
    return stream


async def _idle(port: int, opened: list[Stream]) -> Stream:
    """A connection that made one request, answered: kept alive, idle."""
    reader, writer = await _open(port, opened)
    writer.write(HEALTHZ)
    status, _ = await waited(_response(reader), "an answer", timeout=10)
    assert status == 200
    return reader, writer


async def _stream(port: int, opened: list[Stream]) -> Stream:
    """A connection with a request in the application: a dashboard stream, running."""
    reader, writer = await _open(port, opened)
    writer.write(b"GET /events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    await waited(_event(reader), "the stream's first event", timeout=10)
    return reader, writer


def _idle_closed(server: object, reason: str) -> float:
    registry = server.registry  # type: ignore[attr-defined]
    return sample(registry, "discovery_http_idle_connections_closed_total", reason=reason)


def _port(server: SearchServer) -> int:
    assert server.port is not None
    return server.port


async def test_at_the_cap_a_new_client_gets_in_the_longest_idle_making_room(
    make_search_server: SearchServerFactory,
) -> None:
    cap = 8
    search = await make_search_server(
        http=HttpEdgeConfig(header_timeout=LONG, max_connections=cap, pressure_keepalive=LONG)
    )
    edge = search._edge
    port = _port(search)
    async with _connections() as opened:
        stream = await _stream(port, opened)
        idle = [await _idle(port, opened) for _ in range(cap - 1)]
        await eventually(lambda: edge.idle_connections == cap - 1, message="the connections idle")
        assert edge.connections == cap
        # One more client: answered, the longest idle closed to make room.
        assert (await get_json(f"{search.url}/healthz"))[0] == 200
        rest = await waited(_read_to_eof(idle[0][0]), "the longest idle closed", timeout=10)
        assert rest == b""  # closed between requests: nothing to answer
        assert _idle_closed(search, "cap") == 1
        # The others were left alone: each carries a further request.
        for reader, writer in idle[1:]:
            writer.write(HEALTHZ)
            assert (await waited(_response(reader), "a further answer", timeout=10))[0] == 200
        # And the request in the application was never cut: the stream goes on.
        await waited(_event(stream[0]), "the stream's next event", timeout=10)
    assert _idle_closed(search, "cap") == 1
    assert edge.refused == 0
    assert sample(search.registry, "discovery_http_max_connections") == cap


async def test_at_the_cap_with_every_connection_busy_a_new_one_is_refused_at_once(
    make_search_server: SearchServerFactory,
) -> None:
    cap = 3
    search = await make_search_server(
        http=HttpEdgeConfig(header_timeout=LONG, max_connections=cap, pressure_keepalive=LONG)
    )
    port = _port(search)
    async with _connections() as opened:
        streams = [await _stream(port, opened) for _ in range(cap)]
        # Answered 503 and closed at once, not left waiting for a place.
        reader, _ = await _open(port, opened)
        answer = await waited(_read_to_eof(reader), "the refusal", timeout=10)
        assert answer.startswith(b"HTTP/1.1 503 "), answer
        assert b"too many connections" in answer
        assert search._edge.refused == 1
        assert sample(search.registry, "discovery_http_connections_refused_total") == 1
        for stream in streams:
            await waited(_event(stream[0]), "a stream's next event", timeout=10)
        # A stream that ends makes room.
        streams[0][1].close()
        await eventually(lambda: search._edge.connections < cap, message="the stream gone")
        assert (await get_json(f"{search.url}/healthz"))[0] == 200
    assert _idle_closed(search, "cap") == 0


async def test_at_the_cap_with_none_idle_the_longest_waiting_head_makes_room(
    make_search_server: SearchServerFactory,
) -> None:
    cap = 4
    search = await make_search_server(
        http=HttpEdgeConfig(header_timeout=LONG, max_connections=cap, pressure_keepalive=LONG)
    )
    port = _port(search)
    async with _connections() as opened:
        streams = [await _stream(port, opened) for _ in range(cap - 2)]
        slow = []
        for _ in range(2):
            reader, writer = await _open(port, opened)
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            await writer.drain()
            slow.append(reader)
        await eventually(lambda: search._edge.waiting == 2, message="the slow heads seen")
        # No connection idle: the head that has waited longest is closed (with a 408),
        # the other left, and the new client is answered.
        assert (await get_json(f"{search.url}/healthz"))[0] == 200
        answer = await waited(_read_to_eof(slow[0]), "the longest waiting closed", timeout=10)
        assert answer.startswith(b"HTTP/1.1 408 "), answer
        assert search._edge.waiting == 1
        assert search._edge.refused == 0
        for stream in streams:
            await waited(_event(stream[0]), "a stream's next event", timeout=10)
    assert (
        sample(search.registry, "discovery_http_slow_connections_closed_total", reason="evicted")
        == 1
    )


async def test_near_the_cap_idle_connections_are_closed_after_the_pressure_keepalive(
    make_search_server: SearchServerFactory,
) -> None:
    cap, keepalive = 8, 0.5
    search = await make_search_server(
        http=HttpEdgeConfig(header_timeout=LONG, max_connections=cap, pressure_keepalive=keepalive)
    )
    port = _port(search)
    async with _connections() as opened:
        # Before the first request: the server's idle clock cannot start earlier.
        started = time.monotonic()
        idle = [await _idle(port, opened) for _ in range(cap)]
        # Above 6 of 8 open: the two longest idle go, once idle the short keep-alive.
        for reader, _ in idle[:2]:
            rest = await waited(_read_to_eof(reader), "a pressure close", timeout=30)
            assert rest == b""
        assert time.monotonic() - started >= keepalive
        await eventually(
            lambda: _idle_closed(search, "pressure") == 2, message="two pressure closes"
        )
        assert search._edge.connections == 6
        # Back at three quarters of the cap: the rest stay, and carry requests.
        for reader, writer in idle[2:]:
            writer.write(HEALTHZ)
            assert (await waited(_response(reader), "a further answer", timeout=10))[0] == 200
    assert _idle_closed(search, "pressure") == 2
    assert _idle_closed(search, "cap") == 0


async def test_a_data_server_at_the_cap_lets_a_client_in_and_never_cuts_a_slow_request(
    make_data_server: DataServerFactory,
) -> None:
    cap = 8
    server = await make_data_server(
        http=HttpEdgeConfig(header_timeout=LONG, max_connections=cap, pressure_keepalive=LONG)
    )
    assert server.port is not None
    port = server.port
    fault = b'{"mode": "none"}'
    async with _connections() as opened:
        # A request in the application until its body comes, at the end of the test.
        slow_reader, slow_writer = await _open(port, opened)
        slow_writer.write(
            b"POST /admin/fault HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Discovery-Admin: 1\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(fault)
        )
        await slow_writer.drain()
        idle = [await _idle(port, opened) for _ in range(cap - 1)]
        # The agent's probes connect too (each makes room the same way): a client gets
        # in whatever they do, and the first to go is the longest idle.
        assert (await get_json(f"{server.url}/healthz"))[0] == 200
        rest = await waited(_read_to_eof(idle[0][0]), "the longest idle closed", timeout=10)
        assert rest == b""
        assert _idle_closed(server, "cap") >= 1
        slow_writer.write(fault)
        status, body = await waited(_response(slow_reader), "the slow request's answer", timeout=10)
        assert status == 200, body
    assert server._edge.refused == 0
