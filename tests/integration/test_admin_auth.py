"""Who may call a data server's admin endpoints (:mod:`discovery.adminauth`), over HTTP.

A web page a user opens on the data server's machine must not be able to drain it or
take it offline: without a token, admin needs the ``X-Discovery-Admin`` header (which a
page cannot send cross-site without a preflight we never grant) and a loopback
``Host``; a browser's cross-site request is refused even with the token. A malformed
``Authorization`` header (bytes that are not UTF-8) is a 401, never a 500.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import aiohttp
import pytest

from data_server.server import DataServer
from discovery.adminauth import ADMIN_HEADER, admin_headers
from discovery.agent.agent import AgentState
from tests.support import DataServerFactory, eventually, sample

TOKEN = "s3cret-token"


def _state(server: DataServer) -> AgentState:
    assert server.agent is not None
    return server.agent.status().state


async def _serving(make: DataServerFactory, admin_token: str | None = None) -> DataServer:
    """A data server whose agent has passed its first probes: registered is not yet
    serving (on a loaded machine the agent may still be STARTING), and every test here
    asserts that a refused request left it SERVING."""
    server = await make(admin_token=admin_token)
    await eventually(lambda: _state(server) is AgentState.SERVING, message="agent serving")
    return server


async def _post(server: DataServer, path: str, **kwargs: Any) -> tuple[int, dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as client,
        client.post(f"{server.url}{path}", **kwargs) as response,
    ):
        return response.status, await response.json()


async def _raw_post(server: DataServer, path: str, headers: bytes) -> bytes:
    """POST with header bytes as given (any bytes, as a hostile client may send)."""
    assert server.port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(
            b"POST " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Length: 0\r\nConnection: close\r\n" + headers + b"\r\n"
        )
        async with asyncio.timeout(10):
            return await reader.read()
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


def _refused(server: DataServer, reason: str) -> float:
    return sample(
        server.registry,
        "discovery_http_rejected_total",
        endpoint="/admin/offline",
        parameter="-",
        reason=reason,
    )


@pytest.mark.parametrize(
    "value",
    [
        b"Bearer \xff\xfe\xfd",  # not UTF-8 at all
        b"Bearer s3cr\xc3\xa9t-token",  # UTF-8, but not ASCII
        b"\xff\xfe",  # not even a scheme
    ],
    ids=["latin1-bytes", "utf8-non-ascii", "no-scheme"],
)
async def test_a_non_ascii_authorization_header_gets_401_not_500(
    make_data_server: DataServerFactory, value: bytes
) -> None:
    server = await _serving(make_data_server, TOKEN)
    answer = await _raw_post(server, "/admin/offline", b"Authorization: " + value + b"\r\n")
    assert answer.startswith(b"HTTP/1.1 401 "), answer
    assert b"WWW-Authenticate: Bearer" in answer
    assert _state(server) is AgentState.SERVING
    assert _refused(server, "unauthorized") == 1
    # The right token still works.
    status, _ = await _post(server, "/admin/offline", headers=admin_headers(TOKEN))
    assert status == 200
    assert _state(server) is AgentState.ADMIN_OFFLINE


async def test_without_a_token_admin_needs_the_admin_header_even_from_loopback(
    make_data_server: DataServerFactory,
) -> None:
    server = await _serving(make_data_server)
    port = server.port
    # What a web page can send to http://127.0.0.1:<port> without a preflight: a form.
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    for headers, why in [
        ({}, "no admin header"),
        ({**form, "Origin": "null"}, "a form posted from a sandboxed page"),
        (
            {**form, "Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"},
            "a form posted from another site",
        ),
        # A page can send the custom header to its own origin without a preflight: one
        # whose name resolves to 127.0.0.1 (DNS rebinding) is refused by its Host.
        ({**admin_headers(), "Host": f"evil.example:{port}"}, "a rebound name"),
        ({**admin_headers(), "Origin": "http://evil.example"}, "another Origin"),
        ({**admin_headers(), "Sec-Fetch-Site": "same-site"}, "another port's page"),
        ({ADMIN_HEADER: "yes"}, "a wrong header value"),
    ]:
        status, body = await _post(server, "/admin/offline", data="a=b", headers=headers)
        assert status == 403, (why, body)
        assert _state(server) is AgentState.SERVING, why
    assert _refused(server, "forbidden") == 7
    # An operator's client (curl -H 'X-Discovery-Admin: 1') is served, with any
    # loopback name, and with the request's own Origin.
    own = {"Origin": f"http://127.0.0.1:{port}", "Sec-Fetch-Site": "same-origin"}
    status, body = await _post(server, "/admin/offline", headers={**admin_headers(), **own})
    assert status == 200, body
    assert _state(server) is AgentState.ADMIN_OFFLINE
    status, body = await _post(
        server, "/admin/online", headers={**admin_headers(), "Host": f"localhost:{port}"}
    )
    assert status == 200, body


async def test_with_a_token_a_browsers_cross_site_request_is_refused_all_the_same(
    make_data_server: DataServerFactory,
) -> None:
    server = await _serving(make_data_server, TOKEN)
    for extra in ({"Sec-Fetch-Site": "cross-site"}, {"Origin": "http://evil.example"}):
        status, body = await _post(
            server, "/admin/offline", headers={**admin_headers(TOKEN), **extra}
        )
        assert status == 403, body
        assert "cross-site" in body["error"]
    assert _state(server) is AgentState.SERVING
    # The token alone is enough: a client need not send the admin header as well.
    status, _ = await _post(server, "/admin/offline", headers={"Authorization": f"Bearer {TOKEN}"})
    assert status == 200
    assert _state(server) is AgentState.ADMIN_OFFLINE
