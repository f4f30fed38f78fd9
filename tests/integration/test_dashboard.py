"""The search server's live dashboard: ``GET /``, its event stream ``GET /events``, and
the page itself in a real headless Chromium (Debian's ``chromium``, driven by Playwright).

The browser test keeps a screenshot of the page as an artefact in ``bench/results/``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest

from data_server.corpus import sample_queries
from data_server.server import DataServer
from discovery.adminauth import admin_headers
from discovery.testing.simfleet import SimulatedFleet
from search_server.dashboard import QueryStats
from search_server.server import SearchServer
from tests.browser import CHROMIUM, CHROMIUM_ARGS, UI_TIMEOUT_MS, playwright_api
from tests.support import REPO_ROOT, DataServerFactory, SearchServerFactory, eventually, within

SCREENSHOT = REPO_ROOT / "bench" / "results" / "dashboard.png"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


async def _live_count(search: SearchServer, count: int) -> None:
    await eventually(
        lambda: search.reader is not None and len(search.reader.current.servers) == count,
        timeout=30,
        message=f"{count} data servers in the live list",
    )


async def _first_event(response: aiohttp.ClientResponse) -> dict[str, Any]:
    """The data of the first ``data:`` event of a server-sent event stream."""
    async with within(10, "the first data: event of the stream"):
        while True:
            line = await response.content.readline()
            assert line, "the stream ended before its first event"
            if line.startswith(b"data: "):
                document: dict[str, Any] = json.loads(line[len(b"data: ") :])
                return document


@contextlib.asynccontextmanager
async def _stream(url: str) -> AsyncIterator[aiohttp.ClientResponse]:
    timeout = aiohttp.ClientTimeout(total=None, sock_read=15)
    async with (
        aiohttp.ClientSession(timeout=timeout) as client,
        client.get(f"{url}/events") as response,
    ):
        yield response


async def _post(server: DataServer, path: str) -> int:
    async with (
        aiohttp.ClientSession(headers=admin_headers()) as client,
        client.post(f"{server.url}{path}") as response,
    ):
        return response.status


async def _search(search: SearchServer, queries: list[str]) -> None:
    async with aiohttp.ClientSession() as client:
        for query in queries:
            async with client.get(f"{search.url}/search", params={"q": query}) as response:
                assert response.status == 200


# -- the rolling window ----------------------------------------------------------------


def test_query_stats_rolling_window() -> None:
    now = [1000.0]
    stats = QueryStats(window=10, clock=lambda: now[0])
    empty = stats.snapshot()
    assert empty["rate"] == 0
    assert empty["p50_ms"] is None
    assert empty["partial_rate"] == 0
    for i in range(100):  # 1..100 ms over 5 s, every 4th partial
        now[0] += 0.05
        stats.record(float(i + 1), partial=i % 4 == 0)
    stats.record_overloaded()
    snap = stats.snapshot()
    assert snap["queries"] == 100
    assert snap["rate"] == pytest.approx(100 / 5, rel=0.01)  # since creation, < window
    assert snap["p50_ms"] == 50
    assert snap["p99_ms"] == 99
    assert snap["partial_rate"] == 0.25
    assert snap["overloaded"] == 1
    now[0] += 30  # all of it leaves the window; the total stays
    later = stats.snapshot()
    assert later["queries"] == 0
    assert later["p99_ms"] is None
    assert later["total"] == 100
    with pytest.raises(ValueError, match="window"):
        QueryStats(window=0)


# -- HTTP ------------------------------------------------------------------------------


async def test_page_is_self_contained(
    make_search_server: SearchServerFactory, make_data_server: DataServerFactory
) -> None:
    search = await make_search_server(server_id="ss-page")
    async with aiohttp.ClientSession() as client, client.get(f"{search.url}/") as response:
        assert response.status == 200
        assert response.content_type == "text/html"
        page = await response.text()
    assert "EventSource('/events')" in page or 'EventSource("/events")' in page
    # Works with no internet: nothing is loaded from anywhere else.
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "@import" not in page
    assert "innerHTML" not in page


async def test_events_stream_snapshots_and_ends_with_its_client_and_on_shutdown(
    make_search_server: SearchServerFactory, make_data_server: DataServerFactory
) -> None:
    await make_data_server(shard=0, docs=100, instance_id="ds-ev")
    search = await make_search_server(server_id="ss-events")
    await _live_count(search, 1)
    await eventually(lambda: search.is_leader, message="leader")
    await _search(search, sample_queries(3, variant=1))

    async with _stream(search.url) as response:
        assert response.status == 200
        assert response.content_type == "text/event-stream"
        event = await _first_event(response)
    assert {
        "self", "is_leader", "leader", "epoch", "version", "age_ms", "redis_connected",
        "source", "servers", "cluster", "stale_after_ms", "search_servers", "stats",
    } <= event.keys()  # fmt: skip
    assert event["self"] == event["leader"] == "ss-events"
    assert event["version"] > 0
    assert event["epoch"] > 0
    assert [s["id"] for s in event["servers"]] == ["ds-ev"]
    assert event["servers"][0]["state"] == "serving"
    # The bounded parts the page shows at any size: summary, problems, one row per shard.
    assert event["summary"]["servers"] == 1
    assert event["summary"]["shards"]["all_live"] == 1
    assert event["problems"] == []
    assert event["shard_grid"] == [[0, 1, 1]]
    assert event["search_servers"] == [
        {
            "id": "ss-events",
            "address": search.config.advertise,
            "port": search.port,
            "leader": True,
            "self": True,
        }
    ]
    stats = event["stats"]
    assert stats["queries"] == 3
    assert stats["rate"] > 0
    assert stats["p50_ms"] > 0
    assert stats["p99_ms"] >= stats["p50_ms"]
    assert stats["partial_rate"] == 0

    # The client went away: the server notices at its next write and ends the stream.
    await eventually(lambda: search._events.open_streams == 0, message="stream closed")

    # A stream left open does not hold up the shutdown, and it ends for the client.
    async with _stream(search.url) as response:
        await _first_event(response)
        assert search._events.open_streams == 1
        # aiohttp alone would wait 60 s for the handler.
        async with within(15, "the shutdown, and the open stream to end with it"):
            await search.shutdown()
            rest = await response.content.read()
        assert not rest.strip() or rest.startswith(b"data: ")
        assert response.content.at_eof()
    assert search._events.open_streams == 0


# -- the page in a real browser ----------------------------------------------------------


@pytest.mark.browser
async def test_dashboard_in_chromium_shows_a_server_going_offline_without_reload(
    make_search_server: SearchServerFactory, make_data_server: DataServerFactory
) -> None:
    async_playwright = playwright_api()
    from playwright.async_api import TimeoutError as PlaywrightTimeoutError
    from playwright.async_api import expect

    data = await asyncio.gather(
        *(make_data_server(shard=i, docs=100, instance_id=f"ds-{i:02d}") for i in range(20))
    )
    search = await make_search_server(server_id="ss-dash")
    await _live_count(search, 20)
    await eventually(lambda: search.is_leader, message="leader")
    victim = next(server for server in data if server.instance_id == "ds-07")

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = await browser.new_context(viewport={"width": 1440, "height": 900})
            page = await context.new_page()
            loads: list[str] = []
            page.on("load", lambda _page: loads.append(page.url))
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))

            await page.goto(f"{search.url}/", wait_until="load")
            # A reload would lose this.
            await page.evaluate("window.__testMarker = 'first-load'")

            serving = page.locator('.tile[data-state="serving"]')
            await expect(serving).to_have_count(20, timeout=UI_TIMEOUT_MS)
            for i in range(20):
                tile = page.locator(f'[data-id="ds-{i:02d}"][data-state="serving"]')
                await expect(tile).to_have_count(1)
            await expect(page.locator(".shard")).to_have_count(20)

            # Header: the leader, a published version, and the search servers.
            await expect(page.locator("#leader")).to_have_text("ss-dash")
            version = await page.locator("#version").text_content()
            assert version is not None
            assert int(version) > 0
            leader_chip = page.locator('#search-servers [data-leader="true"]')
            await expect(leader_chip).to_have_attribute("data-id", "ss-dash", timeout=UI_TIMEOUT_MS)
            await expect(page.locator("body")).to_have_attribute("data-connected", "true")

            # Statistics appear once queries go through /search.
            await _search(search, sample_queries(30, variant=3))
            try:
                await page.wait_for_function(
                    "() => Number(document.getElementById('rate').textContent) > 0"
                    " && Number(document.getElementById('p99').textContent) > 0",
                    timeout=UI_TIMEOUT_MS,
                )
            except PlaywrightTimeoutError as exc:
                raise AssertionError(
                    f"timed out after {UI_TIMEOUT_MS} ms waiting for the page to show a query "
                    "rate and a p99 above 0"
                ) from exc
            await expect(page.locator("#partial")).to_have_text("0.0")

            # One data server is forced offline: its tile turns offline, no reload.
            assert await _post(victim, "/admin/offline") == 200
            offline = page.locator('[data-id="ds-07"][data-state="offline"]')
            await expect(offline).to_have_count(1, timeout=UI_TIMEOUT_MS)
            await expect(serving).to_have_count(19)
            await expect(page.locator("#n-offline")).to_have_text("1")
            await expect(page.locator("#n-serving")).to_have_text("19")

            assert loads == [f"{search.url}/"], f"the page was reloaded: {loads}"
            assert await page.evaluate("window.__testMarker") == "first-load"
            navigations = await page.evaluate("performance.getEntriesByType('navigation').length")
            assert navigations == 1
            assert await page.evaluate("window.__dashboard.events") >= 2
            assert errors == [], f"JavaScript errors on the page: {errors}"

            SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
            await page.screenshot(path=str(SCREENSHOT), full_page=True)
            await context.close()
        finally:
            await browser.close()

    image = SCREENSHOT.read_bytes()
    assert image.startswith(PNG_SIGNATURE), "the screenshot is not a PNG"
    assert len(image) > 10_000, f"the screenshot is suspiciously small ({len(image)} bytes)"


@pytest.mark.browser
async def test_dashboard_in_chromium_shows_a_large_cluster_as_a_grid_of_shards(
    make_search_server: SearchServerFactory, fleet_of: Callable[..., SimulatedFleet]
) -> None:
    """Above 200 data servers the page shows one cell per shard, a shard's replicas a
    click away, and a shard that lost every replica in red among the problems."""
    async_playwright = playwright_api()
    from playwright.async_api import expect

    shards, replicas = 30, 8
    fleet = fleet_of(size=shards * replicas, shards=shards, docs=100, sessions=2)
    await fleet.start()
    search = await make_search_server(server_id="ss-grid", shards=shards)
    await _live_count(search, shards * replicas)

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page(viewport={"width": 1440, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            await page.goto(f"{search.url}/", wait_until="load")

            await expect(page.locator("#grid .cell")).to_have_count(shards, timeout=UI_TIMEOUT_MS)
            await expect(page.locator('#grid .cell[data-health="all"]')).to_have_count(shards)
            await expect(page.locator("#shards")).to_be_hidden()
            await expect(page.locator(".tile")).to_have_count(0)  # no tile per server
            await expect(page.locator("#summary")).to_contain_text("240 data servers, 240 live")
            await expect(page.locator("#problems-section")).to_be_hidden()

            # A click shows the shard's replicas.
            await page.locator('#grid .cell[data-shard="3"]').click()
            await expect(page.locator("#detail .tile")).to_have_count(replicas)
            await expect(page.locator('#detail .tile[data-state="serving"]')).to_have_count(
                replicas
            )

            # Shard 5 loses every replica: its cell turns red and it is listed.
            for replica in range(replicas):
                await fleet.deregister(5 + replica * shards)
            gone = page.locator('#grid .cell[data-shard="5"][data-health="none"]')
            await expect(gone).to_have_count(1, timeout=UI_TIMEOUT_MS)
            await expect(page.locator("#problems")).to_contain_text(
                "shard 5: no live replica (0 listed)"
            )
            await expect(page.locator("#grid .cell")).to_have_count(shards)  # never dropped
            assert errors == [], f"JavaScript errors on the page: {errors}"
        finally:
            await browser.close()


@pytest.mark.browser
async def test_dashboard_in_chromium_shows_the_replica_groups(
    make_search_server: SearchServerFactory, make_data_server: DataServerFactory
) -> None:
    """Each server's tile names its group; the groups' table shows each group's
    replicas, coverage, rotation and queries, and a group that falls short of coverage
    turns out of rotation without a reload."""
    async_playwright = playwright_api()
    from playwright.async_api import expect

    data = {
        f"ds-{group}{shard}": await make_data_server(
            shard=shard, replica=replica, group=group, docs=100, instance_id=f"ds-{group}{shard}"
        )
        for replica, group in enumerate(("g1", "g2"))
        for shard in range(2)
    }
    search = await make_search_server(server_id="ss-groups", hedge_percent=0.0)
    await _live_count(search, 4)
    await _search(search, sample_queries(4, variant=5))

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page(viewport={"width": 1440, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            await page.goto(f"{search.url}/", wait_until="load")

            await expect(page.locator(".tile")).to_have_count(4, timeout=UI_TIMEOUT_MS)
            await expect(page.locator('.tile[data-id="ds-g10"]')).to_have_attribute(
                "data-group", "g1"
            )
            await expect(page.locator('.tile[data-id="ds-g21"] .addr')).to_contain_text("· g2")
            await expect(page.locator("#groups-section")).to_be_visible()
            rows = page.locator("#groups tbody tr")
            await expect(rows).to_have_count(2)
            await expect(page.locator('#groups tr[data-rotation="true"]')).to_have_count(2)
            # Four queries, one at a time: two for each group.
            await expect(page.locator('#groups tr[data-group="g1"]')).to_contain_text("100.00")
            cells = page.locator('#groups tr[data-group="g1"] td')
            await expect(cells.nth(5)).to_have_text("2")
            await expect(page.locator("#groups-count")).to_contain_text("2 of 2 in rotation")

            # g1 loses shard 1: 50 % of the corpus, below 97 %: out of rotation.
            await data["ds-g11"].shutdown(grace=0)
            out = page.locator('#groups tr[data-group="g1"][data-rotation="false"]')
            await expect(out).to_have_count(1, timeout=UI_TIMEOUT_MS)
            await expect(out).to_contain_text("50.00")
            await expect(page.locator("#groups-count")).to_contain_text("1 of 2 in rotation")
            assert errors == [], f"JavaScript errors on the page: {errors}"
        finally:
            await browser.close()


async def test_a_cluster_without_groups_shows_no_groups_table(
    make_search_server: SearchServerFactory, make_data_server: DataServerFactory
) -> None:
    await make_data_server(shard=0, docs=50, instance_id="ds-plain")
    search = await make_search_server(server_id="ss-plain")
    await _live_count(search, 1)
    async with _stream(search.url) as response:
        event = await _first_event(response)
    assert event["groups"] == {
        "min_coverage_percent": 97.0,
        "total": 0,
        "in_rotation": 0,
        "listed": [],
    }
    assert event["servers"][0]["group"] is None
