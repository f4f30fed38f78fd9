"""Overload on a real data server: a full server answers 429 at once, its probes still
pass, and no search works longer than ``--max-timeout-ms``.

Searches are held in progress deterministically by the server's own fault injection
(``hang`` until cleared, or a long ``slow`` delay), and the tests wait for the in-progress
gauge rather than for time to pass. The probe header's sending is checked against a tiny
aiohttp server that records what it receives.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from multidict import CIMultiDictProxy

from data_server.config import (
    DEFAULT_MAX_CONCURRENT_SEARCHES,
    DEFAULT_MAX_TIMEOUT_MS,
    DataServerConfig,
    build_parser,
)
from data_server.corpus import sample_queries
from data_server.server import DataServer
from discovery.adminauth import admin_headers
from discovery.agent.agent import AgentState
from discovery.agent.probes import PROBE_HEADER, PROBE_HEADER_VALUE, HttpProbe, SearchProbe
from discovery.config import AgentConfig, ClusterConfig, ZkConfig
from discovery.errors import ConfigError
from tests.support import (
    DataServerFactory,
    eventually,
    frequent_terms,
    loop_settled,
    more_probes,
    sample,
    waited,
)

PROBE = {PROBE_HEADER: PROBE_HEADER_VALUE}


async def _search(
    server: DataServer, headers: dict[str, str] | None = None, **params: str
) -> tuple[int, CIMultiDictProxy[str], Any]:
    """``GET /search`` in a session of its own: (status, headers, decoded JSON body)."""
    async with (
        aiohttp.ClientSession() as client,
        client.get(f"{server.url}/search", params=params, headers=headers) as response,
    ):
        return response.status, response.headers, await response.json()


async def _set_fault(server: DataServer, **fault: Any) -> None:
    async with (
        aiohttp.ClientSession(headers=admin_headers()) as client,
        client.post(f"{server.url}/admin/fault", json=fault) as response,
    ):
        assert response.status == 200, await response.text()


def _in_progress(server: DataServer) -> float:
    return sample(server.registry, "data_server_searches_in_progress")


def _requests(server: DataServer, status: str) -> float:
    return sample(server.registry, "data_server_search_requests_total", status=status)


async def _hold(server: DataServer, count: int) -> list[asyncio.Task[Any]]:
    """Start ``count`` searches (the fault set holds them) and wait until the in-progress
    gauge shows them all."""
    held = [asyncio.create_task(_search(server, q="a", timeout_ms="60000")) for _ in range(count)]
    await eventually(lambda: _in_progress(server) == count, message=f"{count} searches held")
    return held


async def _drop(tasks: list[asyncio.Task[Any]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_full_data_server_answers_429_at_once_before_any_search_work(
    make_data_server: DataServerFactory,
) -> None:
    server = await make_data_server(max_concurrent_searches=2)
    assert sample(server.registry, "data_server_max_concurrent_searches") == 2
    await _set_fault(server, mode="hang")
    held = await _hold(server, 2)
    try:
        # Every search that gets as far as the fault hangs: an answer at all shows
        # that the refusal comes before it.
        status, headers, body = await waited(
            _search(server, q="a", k="5"), "the refusal of a search at a full server", timeout=10
        )
        assert status == 429
        assert headers["Retry-After"] == "1"
        assert headers["Content-Type"].startswith("application/json")
        assert body == {
            "error": "this data server is full: 2 searches in progress, its limit is 2; "
            "retry later or elsewhere",
            "in_progress": 2,
            "limit": 2,
        }
        assert _requests(server, "429") == 1
        # Bad parameters are still answered 400 first, full or not.
        status, _, body = await _search(server, q="a", k="0")
        assert (status, body["parameter"]) == (400, "k")
        assert _requests(server, "429") == 1
        assert _requests(server, "400") == 1
        assert not any(task.done() for task in held)
        assert _in_progress(server) == 2  # the refused ones never counted
    finally:
        await _set_fault(server, mode="none")
    # Released: the held searches end, their places free, a search is served again.
    for task in held:
        status, _, _ = await waited(task, "a released search", timeout=10)
        assert status == 200
    await eventually(lambda: _in_progress(server) == 0, message="no search in progress")
    status, _, body = await _search(server, q="a")
    assert status == 200
    assert isinstance(body["hits"], list)


async def test_a_full_data_server_still_answers_probes_and_stays_registered(
    make_data_server: DataServerFactory,
) -> None:
    # The held searches sleep out a long delay; the shutdown cuts them short.
    server = await make_data_server(max_concurrent_searches=2, shutdown_timeout=0.5)
    agent = server.agent
    assert agent is not None
    await _set_fault(server, mode="slow", delay_ms=60_000)
    held = await _hold(server, 2)
    try:
        # Cleared for the searches to come; the two held ones sleep on, keeping it full.
        await _set_fault(server, mode="none")
        status, headers, _ = await _search(server, q="a")
        assert (status, headers["Retry-After"]) == (429, "1")

        query = sample_queries(1, variant=2)[0]
        status, _, body = await _search(server, headers=PROBE, q=query, k="3")
        assert status == 200, body
        assert isinstance(body["hits"], list)
        assert body["cut"] is False
        assert _in_progress(server) == 2  # the probe was not counted

        # The agent's own probes (which carry the header) pass while the server is full:
        # it stays in, or comes back if the held probes of the slow moment took it out.
        await eventually(lambda: agent.status().state is AgentState.SERVING, message="serving")
        await more_probes(agent, 3)
        assert agent.status().registered
        assert _in_progress(server) == 2  # ...all the while full
        assert _requests(server, "429") == 1  # and none of those probes was refused
    finally:
        await _drop(held)


async def test_timeout_ms_beyond_the_maximum_is_clamped_to_it(
    make_data_server: DataServerFactory,
) -> None:
    server = await make_data_server(docs=20_000, max_timeout_ms=20, search_timeout_ms=20)
    assert server.index is not None
    worst = frequent_terms(server.index, 150)  # about 100 ms of work, far more than 20
    await loop_settled(server)

    # Asked for ten minutes, worked for 20 ms: cut, as with a budget of 20 ms (without the
    # clamp it would run to its end).
    status, _, body = await _search(server, q=worst, k="10", timeout_ms="600000")
    assert (status, body["cut"]) == (200, True)
    assert 0 < len(body["hits"]) <= 10
    assert sample(server.registry, "data_server_search_timeout_clamped_total") == 1

    # Held past the clamped budget: the answer names the budget it worked with.
    await _set_fault(server, mode="slow", delay_ms=100)
    status, _, body = await _search(server, q="a", timeout_ms="600000")
    assert status == 504
    assert body == {
        "error": "the search's budget of 20 ms ran out before it could start",
        "timeout_ms": 20,
    }
    # A budget within the maximum is kept as asked.
    status, _, body = await _search(server, q="a", timeout_ms="15")
    assert (status, body["timeout_ms"]) == (504, 15)
    assert sample(server.registry, "data_server_search_timeout_clamped_total") == 2

    # Not a positive integer, or beyond what any search server may send: 400 as before.
    await _set_fault(server, mode="none")
    for value in ("0", "-5", "soon", "600001"):
        status, _, body = await _search(server, q="a", timeout_ms=value)
        assert (status, body["parameter"]) == (400, "timeout_ms"), value


# -- configuration ------------------------------------------------------------------------


def _config(**fields: Any) -> DataServerConfig:
    return DataServerConfig(
        zk=ZkConfig(hosts="127.0.0.1:1"), cluster=ClusterConfig(), agent=AgentConfig(), **fields
    )


def test_overload_settings_have_flags_variables_and_defaults(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("DISCOVERY_MAX_TIMEOUT_MS", "DISCOVERY_MAX_CONCURRENT_SEARCHES"):
        monkeypatch.delenv(name, raising=False)
    config = DataServerConfig.from_args(build_parser().parse_args([]))
    assert (config.max_timeout_ms, config.max_concurrent_searches) == (10_000, 8)
    assert (DEFAULT_MAX_TIMEOUT_MS, DEFAULT_MAX_CONCURRENT_SEARCHES) == (10_000, 8)

    args = build_parser().parse_args(["--max-timeout-ms", "2500", "--max-concurrent-searches", "3"])
    config = DataServerConfig.from_args(args)
    assert (config.max_timeout_ms, config.max_concurrent_searches) == (2500, 3)

    monkeypatch.setenv("DISCOVERY_MAX_TIMEOUT_MS", "4000")
    monkeypatch.setenv("DISCOVERY_MAX_CONCURRENT_SEARCHES", "20")
    config = DataServerConfig.from_args(build_parser().parse_args([]))
    assert (config.max_timeout_ms, config.max_concurrent_searches) == (4000, 20)

    for flag, bad in [
        ("--max-timeout-ms", "0"),
        ("--max-timeout-ms", "600001"),
        ("--max-timeout-ms", "soon"),
        ("--max-concurrent-searches", "0"),
        ("--max-concurrent-searches", "-2"),
        ("--max-concurrent-searches", "many"),
    ]:
        with pytest.raises(SystemExit):
            build_parser().parse_args([flag, bad])
        assert f"argument {flag}:" in capsys.readouterr().err

    text = build_parser().format_help()
    for name in (
        "--max-timeout-ms",
        "DISCOVERY_MAX_TIMEOUT_MS",
        "--max-concurrent-searches",
        "DISCOVERY_MAX_CONCURRENT_SEARCHES",
        "X-Discovery-Probe",
    ):
        assert name in text, name


def test_the_default_budget_may_not_exceed_the_maximum(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    both = (
        r"^--search-timeout-ms / DISCOVERY_SEARCH_TIMEOUT_MS \(3000\) must not exceed "
        r"--max-timeout-ms / DISCOVERY_MAX_TIMEOUT_MS \(2000\)$"
    )
    with pytest.raises(ConfigError, match=both):
        _config(search_timeout_ms=3000, max_timeout_ms=2000)
    monkeypatch.setenv("DISCOVERY_SEARCH_TIMEOUT_MS", "3000")
    monkeypatch.setenv("DISCOVERY_MAX_TIMEOUT_MS", "2000")
    with pytest.raises(ConfigError, match=both):
        DataServerConfig.from_args(build_parser().parse_args([]))
    # Equal is fine.
    assert _config(search_timeout_ms=2000, max_timeout_ms=2000).max_timeout_ms == 2000
    # An old setting past the new default maximum must now raise the maximum too.
    with pytest.raises(ConfigError, match="must not exceed --max-timeout-ms"):
        _config(search_timeout_ms=20_000)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"max_timeout_ms": 0}, r"^--max-timeout-ms / DISCOVERY_MAX_TIMEOUT_MS must be in"),
        ({"max_timeout_ms": 600_001}, r"^--max-timeout-ms / DISCOVERY_MAX_TIMEOUT_MS must be"),
        (
            {"max_concurrent_searches": 0},
            r"^--max-concurrent-searches / DISCOVERY_MAX_CONCURRENT_SEARCHES must be at least 1",
        ),
    ],
)
def test_bad_overload_settings_are_refused_naming_the_flag(
    fields: dict[str, int], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        _config(**fields)


# -- the probe header -------------------------------------------------------------------


@pytest.fixture
async def recorder() -> AsyncIterator[tuple[TestServer, list[tuple[str, str | None]]]]:
    """A tiny HTTP server that records each request's path and probe header."""
    seen: list[tuple[str, str | None]] = []

    async def record(request: web.Request) -> web.Response:
        seen.append((request.path, request.headers.get(PROBE_HEADER)))
        return web.json_response({"hits": []})

    app = web.Application()
    app.router.add_get("/search", record)
    app.router.add_get("/healthz", record)
    server = TestServer(app)
    await server.start_server()
    try:
        yield server, seen
    finally:
        await server.close()


async def test_probes_send_the_probe_header(
    recorder: tuple[TestServer, list[tuple[str, str | None]]],
) -> None:
    server, seen = recorder
    base = str(server.make_url("/")).rstrip("/")
    search = SearchProbe(base, ["alpha", "beta"], k=3)
    plain = HttpProbe(f"{base}/healthz")
    try:
        await search.check()
        await search.check()
        await plain.check()
    finally:
        await search.aclose()
        await plain.aclose()
    assert seen == [("/search", "1"), ("/search", "1"), ("/healthz", "1")]
    assert (PROBE_HEADER, PROBE_HEADER_VALUE) == ("X-Discovery-Probe", "1")


async def test_the_time_a_request_waited_in_the_loop_is_spent_from_its_budget(
    make_data_server: DataServerFactory,
) -> None:
    """A request that queued in an overloaded loop past its deadline is answered at once
    with 504, not searched for a search server that has given up on it."""
    server = await make_data_server()
    status, _, _ = await _search(server, q="a", timeout_ms="200")
    assert status == 200
    # The loop running 0.3 s behind (its monitor stopped, so the figure stays).
    await server.loop_lag.aclose()
    server.loop_lag.observe(due=0.0, now=0.3)
    timeouts = sample(server.registry, "data_server_search_cut_total", answer="timeout")
    status, _, body = await _search(server, q="a", timeout_ms="200")
    assert status == 504
    assert body["timeout_ms"] == 200
    assert sample(server.registry, "data_server_search_cut_total", answer="timeout") == timeouts + 1
    # A budget longer than the wait is still searched.
    status, _, _ = await _search(server, q="a", timeout_ms="1000")
    assert status == 200
