"""The HTTP edge of both servers (:mod:`discovery.httpedge`) and the dashboard's stream cap.

Slow clients are played with raw sockets: a client trickling its request headers is cut
off after ``--header-timeout``; connections waiting for a request head are capped, the
longest-waiting closed first, so that a flood of them cannot keep a normal client out,
even of a data server whose file descriptors they would otherwise use up; and
``GET /events`` streams are capped (``--max-event-streams``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from data_server.server import DataServer
from discovery.adminauth import admin_headers
from discovery.config import HttpEdgeConfig
from discovery.testing.ports import free_port
from search_server.server import SearchServer
from tests.support import (
    DataServerFactory,
    SearchServerFactory,
    eventually,
    get_json,
    reap,
    sample,
    waited,
)

Server = DataServer | SearchServer
ServerFactory = Callable[[HttpEdgeConfig], Awaitable[Server]]

#: A short header timeout keeps the tests quick; only "not before it" is asserted.
TIMEOUT = 0.5


@pytest.fixture(params=["data-server", "search-server"])
def make_server(
    request: pytest.FixtureRequest,
    make_data_server: DataServerFactory,
    make_search_server: SearchServerFactory,
) -> ServerFactory:
    """Either kind of server, with the given edge settings."""

    async def make(http: HttpEdgeConfig) -> Server:
        if request.param == "data-server":
            return await make_data_server(http=http)
        return await make_search_server(http=http)

    return make


def _port(server: Server) -> int:
    assert server.port is not None
    return server.port


async def _read_to_eof(reader: asyncio.StreamReader) -> bytes:
    """What the server sends until it closes the connection (a reset counts as closed)."""
    chunks = []
    with contextlib.suppress(ConnectionError):
        while chunk := await reader.read(65536):
            chunks.append(chunk)
    return b"".join(chunks)


async def _trickle(writer: asyncio.StreamWriter, pause: float, limit: float) -> None:
    """Send one header byte every ``pause`` seconds, for at most ``limit`` seconds."""
    deadline = time.monotonic() + limit
    with contextlib.suppress(ConnectionError):
        while time.monotonic() < deadline:
            writer.write(b"x")
            await writer.drain()
            await asyncio.sleep(pause)  # ok-sleep: the slow client's pace is the test


async def _response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One HTTP/1.1 response with a Content-Length: its status and body."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = next(
        int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:")
    )
    return int(lines[0].split()[1]), await reader.readexactly(length)


@contextlib.asynccontextmanager
async def _connection(
    port: int,
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


def _closed(server: Server, reason: str) -> float:
    return sample(server.registry, "discovery_http_slow_connections_closed_total", reason=reason)


# -- the header timeout -----------------------------------------------------------------


async def test_a_client_trickling_its_headers_is_cut_off_after_the_header_timeout(
    make_server: ServerFactory,
) -> None:
    server = await make_server(HttpEdgeConfig(header_timeout=TIMEOUT))
    # Before the connection: the server's clock for it cannot start earlier.
    started = time.monotonic()
    async with _connection(_port(server)) as (reader, writer):
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        # A byte every 50 ms until cancelled: without the bound, the connection lives on.
        trickle = asyncio.create_task(_trickle(writer, 0.05, 60.0))
        # The server answers 408 and closes; the 408 may be lost to the reset that the
        # next trickled byte provokes, so only the close is certain.
        await waited(_read_to_eof(reader), "the server to cut the slow client", timeout=30)
        elapsed = time.monotonic() - started
        trickle.cancel()
    # Cut by the server's header timeout (counted below), never before it ran out. How
    # soon after depends on the machine's load, so it is not asserted.
    assert elapsed >= TIMEOUT, elapsed
    assert _closed(server, "header_timeout") == 1
    # The server still serves.
    assert (await get_json(f"{server.url}/healthz"))[0] == 200


async def test_a_request_head_that_stalls_is_answered_408(make_server: ServerFactory) -> None:
    server = await make_server(HttpEdgeConfig(header_timeout=TIMEOUT))
    started = time.monotonic()
    async with _connection(_port(server)) as (reader, writer):
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        answer = await waited(_read_to_eof(reader), "the server to answer 408", timeout=30)
        elapsed = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert b"did not arrive in time" in answer
    assert elapsed >= TIMEOUT, elapsed
    assert _closed(server, "header_timeout") == 1


async def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout(
    make_server: ServerFactory,
) -> None:
    server = await make_server(HttpEdgeConfig(header_timeout=TIMEOUT))
    started = time.monotonic()
    async with _connection(_port(server)) as (reader, _):
        answer = await waited(_read_to_eof(reader), "the server to close it", timeout=30)
        elapsed = time.monotonic() - started
    assert answer == b""  # nothing was asked, so nothing is answered
    assert elapsed >= TIMEOUT, elapsed
    assert _closed(server, "header_timeout") == 1


async def test_the_header_timeout_spares_idle_kept_alive_connections_and_slow_requests(
    make_data_server: DataServerFactory,
) -> None:
    """Only a request head is timed: an idle kept-alive connection waits for nothing (the
    fan-out keeps such connections for 30 s), and a request in the application is never
    cut, however long it takes."""
    server = await make_data_server(http=HttpEdgeConfig(header_timeout=TIMEOUT))
    request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    async with _connection(_port(server)) as (reader, writer):
        writer.write(request)
        assert (await waited(_response(reader), "the first answer", timeout=5))[0] == 200
        # Idle for three header timeouts: the connection must still carry a request.
        await asyncio.sleep(3 * TIMEOUT)  # ok-sleep: the idle time is what is tested
        writer.write(request)
        assert (await waited(_response(reader), "the second answer", timeout=5))[0] == 200
    # A search slower than the header timeout.
    async with (
        aiohttp.ClientSession(headers=admin_headers()) as client,
        client.post(
            f"{server.url}/admin/fault", json={"mode": "slow", "delay_ms": int(TIMEOUT * 3000)}
        ) as response,
    ):
        assert response.status == 200
    # A budget longer than the injected delay: the search answers, late.
    search = b"GET /search?q=a&timeout_ms=10000 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    async with _connection(_port(server)) as (reader, writer):
        # Pipelined: the second head is complete while the first request is still in
        # the application, longer than the timeout; neither is cut.
        writer.write(search + request)
        status, body = await waited(_response(reader), "the slow search", timeout=10)
        assert status == 200, body
        assert (await waited(_response(reader), "the pipelined request", timeout=5))[0] == 200
    # A body may take its time: the head is complete, the request in the application.
    fault = b'{"mode": "none"}'
    async with _connection(_port(server)) as (reader, writer):
        writer.write(
            b"POST /admin/fault HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Discovery-Admin: 1\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(fault)
        )
        await writer.drain()
        await asyncio.sleep(3 * TIMEOUT)  # ok-sleep: the body's lateness is what is tested
        writer.write(fault)
        status, body = await waited(_response(reader), "the late body's answer", timeout=5)
        assert status == 200, body
    assert _closed(server, "header_timeout") == 0


async def test_a_head_sent_behind_a_slow_request_is_timed_once_that_request_ends(
    make_data_server: DataServerFactory,
) -> None:
    server = await make_data_server(http=HttpEdgeConfig(header_timeout=TIMEOUT))
    slow_ms = int(TIMEOUT * 3000)
    async with (
        aiohttp.ClientSession(headers=admin_headers()) as client,
        client.post(
            f"{server.url}/admin/fault", json={"mode": "slow", "delay_ms": slow_ms}
        ) as response,
    ):
        assert response.status == 200
    async with _connection(_port(server)) as (reader, writer):
        writer.write(b"GET /search?q=a&timeout_ms=10000 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        await writer.drain()
        # While the search runs, the next request's head starts, and then stalls: no
        # byte arrives after the search ends to start its clock.
        await eventually(lambda: server.searches_in_progress == 1, message="the search running")
        writer.write(b"GET /healthz HTTP/1.1\r\nX-Slow: ")
        await writer.drain()
        status, _ = await waited(_response(reader), "the slow search", timeout=10)
        assert status == 200
        # The head stalls for good: the 408 can only come from its own timer.
        rest = await waited(_read_to_eof(reader), "the stalled head to be cut", timeout=30)
    assert rest.startswith(b"HTTP/1.1 408 "), rest
    assert _closed(server, "header_timeout") == 1


# -- the cap on connections waiting for a head -------------------------------------------


async def test_connections_waiting_for_headers_are_capped_oldest_closed_first(
    make_server: ServerFactory,
) -> None:
    cap = 4
    # A long timeout: only the cap closes connections here.
    server = await make_server(HttpEdgeConfig(header_timeout=60, max_pending_headers=cap))
    async with contextlib.AsyncExitStack() as stack:
        slow = []
        for _ in range(10):
            reader, writer = await stack.enter_async_context(_connection(_port(server)))
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            await writer.drain()
            slow.append(reader)
            # Each connection's first bytes reach the server before the next connects,
            # so "oldest" is well defined.
            await eventually(
                lambda: sample(server.registry, "discovery_http_pending_headers") >= 1,
                message="the slow connection seen",
            )
        # The six oldest were closed, with a 408; the four newest still wait.
        for reader in slow[:6]:
            answer = await waited(_read_to_eof(reader), "an evicted connection closed", timeout=5)
            assert answer.startswith(b"HTTP/1.1 408 "), answer
        # At least six: any new connection makes room the same way, and a data server's
        # agent opens one for each probe (seen under load: a seventh before the poll).
        await eventually(
            lambda: _closed(server, "evicted") >= 6, message="six evictions counted", timeout=5
        )
        assert sample(server.registry, "discovery_http_pending_headers") == cap
        for reader in slow[6:]:
            assert not reader.at_eof()
        # A normal client gets in and is answered (its head arrives at once).
        for _ in range(5):
            assert (await get_json(f"{server.url}/healthz"))[0] == 200
        # Each of those connections pushed out one more of the slow ones at most.
        assert _closed(server, "evicted") <= 6 + 5
    assert _closed(server, "header_timeout") == 0


@pytest.fixture
def fd_limited() -> Callable[[], None]:
    """A preexec_fn for a child process with at most 128 open files."""

    def limit() -> None:
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (128, hard))

    return limit


async def test_slow_clients_cannot_use_up_a_data_servers_connections(
    zk_hosts: str, fd_limited: Callable[[], None]
) -> None:
    """A data server process allowed 128 open files, and 400 connections that trickle
    their headers: without the cap they take every descriptor and a normal client is
    turned away; with it (32 waiting at most) normal clients are all served, while the
    slow clients keep connecting."""
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "data_server.cli", "--zk", zk_hosts, "--port", str(port)),
        *("--docs", "200", "--log-level", "ERROR", "--session-timeout", "4"),
        *("--header-timeout", "60", "--max-pending-headers", "32"),
        preexec_fn=fd_limited,
    )
    url = f"http://127.0.0.1:{port}"

    async def ready() -> bool:
        with contextlib.suppress(aiohttp.ClientError):
            return (await get_json(f"{url}/healthz"))[0] == 200
        return False

    writers: list[asyncio.StreamWriter] = []

    async def flood(count: int) -> None:
        for _ in range(count):
            try:
                async with asyncio.timeout(2):
                    _, writer = await asyncio.open_connection("127.0.0.1", port)
                    writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
                    await writer.drain()
            except (OSError, TimeoutError):
                continue  # refused or not accepted: the slow client just tries again
            writers.append(writer)

    try:
        await eventually(ready, timeout=30, message="the data server listening")
        await flood(400)
        attack = asyncio.create_task(flood(400))  # and it keeps coming
        answered = 0
        timeout = aiohttp.ClientTimeout(total=5)
        async with aiohttp.ClientSession(timeout=timeout) as client:
            for _ in range(20):
                try:
                    async with client.get(f"{url}/healthz") as response:
                        answered += response.status == 200
                except (aiohttp.ClientError, TimeoutError):
                    pass
        attack.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await attack
        assert answered == 20, f"{answered} of 20 normal requests answered"
    finally:
        for writer in writers:
            writer.close()
        await reap(process)


# -- the dashboard's event streams -------------------------------------------------------


async def _first_event(response: aiohttp.ClientResponse) -> dict[str, Any]:
    async for line in response.content:
        if line.startswith(b"data: "):
            document: dict[str, Any] = json.loads(line[len(b"data: ") :])
            return document
    raise AssertionError("the stream ended before its first event")


async def test_event_streams_beyond_the_cap_are_refused_at_once_and_counted(
    make_search_server: SearchServerFactory,
) -> None:
    search = await make_search_server(server_id="ss-streams", max_event_streams=2)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=15)
    async with contextlib.AsyncExitStack() as stack:
        client = await stack.enter_async_context(aiohttp.ClientSession(timeout=timeout))
        streams = []
        for _ in range(2):
            response = await stack.enter_async_context(client.get(f"{search.url}/events"))
            assert response.status == 200
            await waited(_first_event(response), "a stream's first event", timeout=10)
            streams.append(response)
        async with client.get(f"{search.url}/events") as refused:
            assert refused.status == 503
            body = await waited(refused.json(), "the refusal", timeout=5)
        assert "--max-event-streams" in body["error"]
        assert search._events.refused == 1
        assert sample(search.registry, "search_server_dashboard_streams_refused_total") == 1
        assert sample(search.registry, "search_server_dashboard_streams") == 2
        # A stream that ends makes room (the server sees it gone at its next write).
        streams[0].close()
        await eventually(
            lambda: search._events.open_streams == 1, message="the closed stream noticed"
        )
        async with client.get(f"{search.url}/events") as again:
            assert again.status == 200
            await waited(_first_event(again), "the new stream's first event", timeout=10)
