"""``data-server loadgen --json``: one line per query; a partial answer says which
search server gave it and which shards it missed (what `make compose-check` reports)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from data_server.loadgen import LoadConfig, run_loadgen


@pytest.fixture
async def search_server() -> AsyncIterator[str]:
    answers = iter(range(1_000_000))

    async def search(request: web.Request) -> web.Response:
        if next(answers) % 2:
            shards = {"total": 4, "ok": 2, "failed": 1, "timed_out": 1, "cut": 0}
            return web.json_response({"partial": True, "shards": shards, "hits": []})
        return web.json_response({"partial": False, "hits": []})

    app = web.Application()
    app.router.add_get("/search", search)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def test_a_partial_line_names_its_target_and_missing_shards(
    search_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    config = LoadConfig(targets=(search_server,), rate=200, duration=0.1, json_lines=True)
    totals = await asyncio.wait_for(run_loadgen(config, asyncio.Event()), 10)
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert totals["ok"] > 0
    assert totals["partial"] > 0
    assert len(lines) == totals["ok"] + totals["partial"]
    for line in lines:
        if line["outcome"] == "ok":
            assert set(line) == {"t", "outcome", "ms"}
        else:
            assert line["target"] == search_server
            assert line["shards"] == {"total": 4, "ok": 2, "failed": 1, "timed_out": 1, "cut": 0}
