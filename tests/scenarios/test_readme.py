"""The README: its one code block, the shortest embedding of the agent, executed as
written against a real ZooKeeper; and its links, which must lead somewhere.

The block is exec'd unchanged (not as ``__main__``, so nothing runs on its own); only
its deployment constants (``ZK_HOSTS``, ``ADVERTISE``, ``PORT``) are replaced in the
resulting namespace, which ``main()`` reads when it runs, and ``Agent`` by a subclass
that records the agent made, to check its state at the end. The complete programs are
in ``examples/`` (``tests/scenarios/test_examples.py``).
"""

from __future__ import annotations

import ast
import asyncio
import re
import signal
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
import pytest

import discovery
from discovery import Agent, AgentState, InstanceState, MembershipWatcher, ServiceInstance
from discovery.testing import free_port
from tests.support import REPO_ROOT, SessionFactory, eventually, waited, within

ROOT = REPO_ROOT
README = ROOT / "README.md"
SECTION = "## Embedding the agent"
WAIT = 20.0  # seconds for any one thing to be observed
#: The watcher's session timeout: a draining node exists only for the drain grace, and
#: a watcher that lost its connection to a stall of a loaded machine could re-read
#: after the node has gone.
WATCHER_SESSION_TIMEOUT = 10.0

Members = Mapping[str, ServiceInstance]


def readme_example() -> tuple[str, int]:
    """The README's one ``python`` block (in :data:`SECTION`) and the line it starts on."""
    text = README.read_text(encoding="utf-8")
    blocks = list(re.finditer(r"^```python\n(.*?)^```$", text, re.S | re.M))
    assert len(blocks) == 1, f"expected one ```python block in README.md, found {len(blocks)}"
    section = re.search(rf"^{re.escape(SECTION)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert section, f"README.md has no {SECTION!r} section"
    assert section.start(1) <= blocks[0].start() < section.end(1), f"the block is not in {SECTION}"
    return blocks[0].group(1), text.count("\n", 0, blocks[0].start(1)) + 1


def load_example(**constants: object) -> tuple[dict[str, Any], list[Agent]]:
    """Exec the example unchanged (not as ``__main__``), then override ``constants``;
    the namespace, and the list its ``main()`` will add the agent it makes to."""
    source, first_line = readme_example()
    # Padded so that a traceback names the README's own line numbers.
    code = compile("\n" * (first_line - 1) + source, str(README), "exec")
    namespace: dict[str, Any] = {"__name__": "readme_example"}
    exec(code, namespace)
    for name, value in constants.items():
        assert name in namespace, f"the README example has no constant {name}"
        namespace[name] = value
    made: list[Agent] = []

    class RecordedAgent(Agent):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    assert namespace["Agent"] is Agent
    namespace["Agent"] = RecordedAgent
    return namespace, made


def test_the_example_imports_only_the_public_discovery_package() -> None:
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


def test_the_readme_links_lead_to_files_of_the_repository() -> None:
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text(encoding="utf-8"))
    local = [link for link in links if "://" not in link]
    for required in ("examples/README.md", "docs/index.md", "docs/embedding.md"):
        assert required in local, f"README.md does not link {required}"
    missing = [link for link in local if not (ROOT / link).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


async def observe(
    watcher: MembershipWatcher,
    predicate: Callable[[Members], bool],
    what: str,
    task: asyncio.Task[Any],
) -> Members:
    """Wait (with a deadline) until the watched membership satisfies ``predicate``; on a
    timeout, fail naming ``what``, the members seen and what ``main()`` failed with."""
    try:
        return await watcher.wait_until(predicate, timeout=WAIT)
    except TimeoutError:
        failed = task.done() and not task.cancelled()
        cause = task.exception() if failed else None
        raise AssertionError(
            f"{what} not observed within {WAIT}s (members: {dict(watcher.members)}"
            + (f"; main() failed: {cause!r})" if cause else ")")
        ) from cause


async def search_status(port: int) -> int:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http,
        http.get(f"http://127.0.0.1:{port}/search", params={"q": "x"}) as response,
    ):
        assert isinstance((await response.json())["hits"], list)
        return response.status


async def test_the_example_registers_then_drains_on_sigterm_while_answering(
    make_session: SessionFactory, zk_hosts: str
) -> None:
    port = free_port()
    example, agents = load_example(ZK_HOSTS=zk_hosts, ADVERTISE="127.0.0.1", PORT=port)
    loop = asyncio.get_running_loop()
    default_sigterm = signal.getsignal(signal.SIGTERM)
    session = await make_session(session_timeout=WATCHER_SESSION_TIMEOUT)
    async with MembershipWatcher(session, coalesce_window=0) as watcher:
        main = asyncio.create_task(example["main"]())
        try:
            members = await observe(watcher, lambda m: "ds-7" in m, "ds-7 registered", main)
            node = members["ds-7"]
            assert (node.address, node.port, node.payload.shard) == ("127.0.0.1", port, 7)
            assert node.routable
            assert await search_status(port) == 200

            # main() installs its handler right after the agent started; a SIGTERM before
            # that would end the test run, so wait for the handler to be there.
            await eventually(
                lambda: signal.getsignal(signal.SIGTERM) is not default_sigterm,
                message="main()'s SIGTERM handler",
            )
            signal.raise_signal(signal.SIGTERM)

            def draining(m: Members) -> bool:
                return "ds-7" in m and m["ds-7"].payload.state is InstanceState.DRAINING

            members = await observe(watcher, draining, "ds-7 draining after SIGTERM", main)
            assert not members["ds-7"].routable
            # The point of draining first: search servers stop routing here while we
            # still answer.
            try:
                status = await search_status(port)
            except aiohttp.ClientConnectionError as exc:
                raise AssertionError(f"stopped answering while draining: {exc}") from exc
            assert status == 200, f"/search answered HTTP {status} while draining"
            await observe(watcher, lambda m: "ds-7" not in m, "ds-7 removed", main)

            async with within(WAIT, "main() to return after the drain"):
                await main
            assert [agent.status().state for agent in agents] == [AgentState.STOPPED]
            with pytest.raises(aiohttp.ClientConnectionError):
                await search_status(port)
        finally:
            if not main.done():
                main.cancel()
                await waited(
                    asyncio.gather(main, return_exceptions=True), "main() cancelled", timeout=30
                )
            loop.remove_signal_handler(signal.SIGTERM)
            if default_sigterm is not None:
                signal.signal(signal.SIGTERM, default_sigterm)
