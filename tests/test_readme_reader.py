"""The README's "read the live list from another Python service" example, executed as
written against a real redis-server while a publisher changes the list.

The example's ``python`` block is exec'd unchanged but for its last line (it would run
forever); ``ClusterConfig`` in the resulting namespace is replaced by one that names
this test's Redis and cluster, which ``follow()`` reads when it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from pathlib import Path
from typing import Any

import pytest

from discovery.config import ClusterConfig
from discovery.livelist.redis.publisher import LivePublisher
from discovery.testing import RedisServer
from tests.support import cluster_of, eventually, make_instance, view

README = Path(__file__).resolve().parents[1] / "README.md"
SECTION = "## Read the live list from another Python service"


def example() -> str:
    text = README.read_text(encoding="utf-8")
    section = re.search(rf"^{re.escape(SECTION)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert section, f"README.md has no {SECTION!r} section"
    block = re.search(r"```python\n(.*?)```", section.group(1), re.S)
    assert block, "the section has no python block"
    source = block.group(1)
    assert source.rstrip().endswith("asyncio.run(follow())")
    return source.rstrip().removesuffix("asyncio.run(follow())")


async def test_the_readme_reader_example_prints_what_changed(
    redis_server: RedisServer,
    redis_prefix: str,
    client: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    namespace: dict[str, Any] = {"__name__": "readme_reader"}
    exec(compile(example(), str(README), "exec"), namespace)
    cluster = ClusterConfig(cluster=cluster_of(redis_prefix), redis_url=redis_server.url)
    namespace["ClusterConfig"] = lambda **_: cluster

    publisher = LivePublisher(client, redis_prefix, leader_id="ss-1", epoch=1)
    a, b = make_instance("ds-a", 9001), make_instance("ds-b", 9002)
    await publisher.publish_full(view(a, b))
    printed: list[str] = []

    def output() -> str:
        printed.append(capsys.readouterr().out)
        return "".join(printed)

    follower = asyncio.create_task(namespace["follow"]())
    try:
        await eventually(
            lambda: "added ds-a 127.0.0.1 9001" in output() and "added ds-b" in output(),
            message="the whole list printed as added",
        )
        await publisher.publish_change(
            view(a), added={}, changed={}, removed={"ds-b": "session expired"}
        )
        await eventually(
            lambda: "removed ds-b - session expired" in output(), message="the removal and why"
        )
    finally:
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower
