"""The README's aiohttp embedding example, executed as written against a real ZooKeeper.

The example's ``python`` block (the one with ``cleanup_ctx``) is exec'd unchanged;
only its deployment constants (``ZK_HOSTS``, ``ADVERTISE``, ``PORT``, ``INSTANCE_ID``,
``SHARD``, ``AGENT_CONFIG``) are replaced in the resulting namespace, which its
functions read when they run.
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import re
import signal
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

import discovery
from discovery import AgentState, InstanceState, MembershipWatcher, ServiceInstance
from discovery.testing import free_port
from tests.support import FAST_AGENT, SessionFactory, eventually, within

README = Path(__file__).resolve().parents[1] / "README.md"
SECTION = "## Embedding the agent"
WAIT = 15.0  # seconds for any one thing to be observed
#: The watchers' session timeout. A draining node exists only for the drain grace; with
#: the fixtures' 2 s sessions, a stall of a loaded machine (parallel test workers) can
#: cost the watcher its connection (kazoo gives up after 2/3 of the timeout), and a
#: re-read after the reconnect may come after the node has gone. "Draining not observed"
#: failed that way, most likely, on a loaded machine.
WATCHER_SESSION_TIMEOUT = 10.0

Members = Mapping[str, ServiceInstance]


def readme_example() -> tuple[str, int]:
    """The aiohttp example's source and the README line its code starts on."""
    text = README.read_text(encoding="utf-8")
    section = re.search(rf"^{re.escape(SECTION)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert section, f"README.md has no {SECTION!r} section"
    blocks = [
        block
        for block in re.finditer(r"^```python\n(.*?)^```$", section.group(1), re.S | re.M)
        if "cleanup_ctx" in block.group(1)
    ]
    assert len(blocks) == 1, (
        f"expected one ```python block with cleanup_ctx in {SECTION!r}, found {len(blocks)}"
    )
    offset = section.start(1) + blocks[0].start(1)
    return blocks[0].group(1), text.count("\n", 0, offset) + 1


def load_example(**constants: object) -> dict[str, Any]:
    """Exec the example unchanged (not as ``__main__``), then override ``constants``."""
    source, first_line = readme_example()
    # Padded so that a traceback names the README's own line numbers.
    code = compile("\n" * (first_line - 1) + source, str(README), "exec")
    namespace: dict[str, Any] = {"__name__": "readme_example"}
    exec(code, namespace)
    for name, value in constants.items():
        assert name in namespace, f"the README example has no constant {name}"
        namespace[name] = value
    return namespace


async def observe(
    watcher: MembershipWatcher,
    predicate: Callable[[Members], bool],
    what: str,
    *,
    task: asyncio.Task[Any] | None = None,
) -> Members:
    """Wait (with a deadline) until the watched membership satisfies ``predicate``.

    On a timeout, the failure names ``what``, the members seen, and the exception
    ``task`` (the example's ``main()``) ended with, if it did.
    """
    try:
        return await watcher.wait_until(predicate, timeout=WAIT)
    except TimeoutError:
        failed = task is not None and task.done() and not task.cancelled()
        cause = task.exception() if failed and task is not None else None
        raise AssertionError(
            f"{what} not observed within {WAIT}s (members: {dict(watcher.members)}"
            + (f"; main() failed: {cause!r})" if cause else ")")
        ) from cause


def draining(instance_id: str) -> Callable[[Members], bool]:
    return lambda m: instance_id in m and m[instance_id].payload.state is InstanceState.DRAINING


async def search_status(port: int) -> int:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http,
        http.get(f"http://127.0.0.1:{port}/search", params={"q": "x"}) as response,
    ):
        assert isinstance((await response.json())["hits"], list)
        return response.status


def test_example_imports_only_the_public_discovery_package() -> None:
    tree = ast.parse(readme_example()[0])
    from_discovery: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                assert not alias.name.startswith("discovery"), f"import {alias.name}"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("discovery"):
            assert node.module == "discovery", f"from {node.module} import ... (not public)"
            from_discovery += [alias.name for alias in node.names]
    assert from_discovery, "the example imports nothing from discovery"
    assert set(from_discovery) <= set(discovery.__all__), (
        f"not in discovery.__all__: {sorted(set(from_discovery) - set(discovery.__all__))}"
    )


async def test_example_main_registers_then_drains_on_sigterm_while_answering(
    zk_hosts: str, make_session: SessionFactory
) -> None:
    port = free_port()
    example = load_example(
        ZK_HOSTS=zk_hosts,
        ADVERTISE="127.0.0.1",
        PORT=port,
        INSTANCE_ID="readme-main",
        SHARD=3,
        # Quick probes; a grace long enough to query the server while it drains, and
        # for the watcher to read the draining node before it goes: on a machine
        # loaded by parallel test workers, 3 s was once not enough for that read.
        AGENT_CONFIG=dataclasses.replace(FAST_AGENT, drain_grace=5.0),
    )
    loop = asyncio.get_running_loop()
    default_sigterm = signal.getsignal(signal.SIGTERM)
    watcher = MembershipWatcher(
        await make_session(session_timeout=WATCHER_SESSION_TIMEOUT), coalesce_window=0
    )
    await watcher.start()
    main = asyncio.create_task(example["main"]())
    try:
        members = await observe(
            watcher, lambda m: "readme-main" in m, "readme-main registered", task=main
        )
        node = members["readme-main"]
        assert (node.address, node.port, node.payload.shard) == ("127.0.0.1", port, 3)
        assert node.routable

        # main() installs its handler right after it starts listening; a SIGTERM
        # before that would end the test run, so wait for the handler to be there.
        await eventually(
            lambda: signal.getsignal(signal.SIGTERM) is not default_sigterm,
            message="main()'s SIGTERM handler",
        )
        signal.raise_signal(signal.SIGTERM)
        members = await observe(
            watcher, draining("readme-main"), "readme-main draining after SIGTERM", task=main
        )
        assert not members["readme-main"].routable
        # The point of draining first: search servers stop routing here while we answer.
        try:
            status = await search_status(port)
        except aiohttp.ClientConnectionError as exc:
            raise AssertionError(f"the server stopped answering while draining: {exc}") from exc
        assert status == 200, f"/search answered HTTP {status} while draining"
        await observe(watcher, lambda m: "readme-main" not in m, "readme-main removed", task=main)

        async with within(WAIT, "main() to return after the drain"):
            await main
        assert example["app"][example["AGENT"]].status().state is AgentState.STOPPED
        with pytest.raises(aiohttp.ClientConnectionError):
            await search_status(port)
    finally:
        if not main.done():
            main.cancel()
            await asyncio.gather(main, return_exceptions=True)
        loop.remove_signal_handler(signal.SIGTERM)
        if default_sigterm is not None:
            signal.signal(signal.SIGTERM, default_sigterm)
        await watcher.aclose()


async def test_example_cleanup_ctx_alone_drains_and_removes(
    zk_hosts: str, make_session: SessionFactory
) -> None:
    """Without main()'s early drain (as under ``web.run_app``), ``runner.cleanup()``
    still announces the departure (draining), then removes the node."""
    port = free_port()
    example = load_example(
        ZK_HOSTS=zk_hosts,
        ADVERTISE="127.0.0.1",
        PORT=port,
        INSTANCE_ID="readme-cleanup",
        SHARD=5,
        # The draining node lives for the grace: the watcher must read it before it goes
        # (a data-change event carries no data). 1 s was once too short for that read
        # with three test workers loading the machine (CI run H).
        AGENT_CONFIG=dataclasses.replace(FAST_AGENT, drain_grace=5.0),
    )
    app = example["app"]
    runner = web.AppRunner(app)
    cleanup: asyncio.Task[None] | None = None
    async with MembershipWatcher(
        await make_session(session_timeout=WATCHER_SESSION_TIMEOUT), coalesce_window=0
    ) as watcher:
        await runner.setup()
        try:
            await web.TCPSite(runner, "127.0.0.1", port).start()
            members = await observe(
                watcher, lambda m: "readme-cleanup" in m, "readme-cleanup registered"
            )
            node = members["readme-cleanup"]
            assert (node.address, node.port, node.payload.shard) == ("127.0.0.1", port, 5)
            assert node.routable
            assert await search_status(port) == 200

            cleanup = asyncio.create_task(runner.cleanup())
            await observe(
                watcher, draining("readme-cleanup"), "readme-cleanup draining in runner.cleanup()"
            )
            await observe(watcher, lambda m: "readme-cleanup" not in m, "readme-cleanup removed")
            async with within(WAIT, "runner.cleanup() to return"):
                await cleanup
            assert app[example["AGENT"]].status().state is AgentState.STOPPED
        finally:
            if cleanup is None:
                await runner.cleanup()
            elif not cleanup.done():
                # A failed wait above: let the cleanup finish (bounded) before the
                # fixtures remove the chroot.
                async with within(WAIT, "the interrupted runner.cleanup() to finish"):
                    await asyncio.gather(cleanup, return_exceptions=True)
