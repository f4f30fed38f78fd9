"""The programs in ``examples/``, each run as a user runs it: ``python examples/x.py`` with
flags naming this test's ZooKeeper chroot and Redis key prefix, its behaviour checked
from outside (the registrations in ZooKeeper, what it prints, HTTP).

The examples are what a user copies, so they are held to it here: a docstring saying how
to run them, ``--help``, only public imports, and each one listed in examples/README.md.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import importlib
import importlib.util
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import aiohttp
import pytest
from aiohttp import web

import discovery
from data_server.server import DataServer
from discovery import AgentState, InstanceState, MembershipWatcher, ServiceInstance
from discovery.livelist.redis.publisher import LivePublisher
from discovery.testing import RedisServer, free_port
from tests.support import (
    REPO_ROOT,
    DataServerFactory,
    SessionFactory,
    cluster_of,
    eventually,
    make_instance,
    reap,
    view,
    waited,
    within,
)

ROOT = REPO_ROOT
EXAMPLES = ROOT / "examples"
NAMES = sorted(path.name for path in EXAMPLES.glob("*.py"))
WAIT = 20.0  # seconds for any one thing to be observed
#: The watchers' session timeout. A draining node exists only for the drain grace; with
#: 2 s sessions, a stall of a loaded machine (parallel test workers) can cost a watcher
#: its connection, and its re-read after the reconnect come after the node has gone.
WATCHER_SESSION_TIMEOUT = 10.0

Members = Mapping[str, ServiceInstance]

#: What an example may import from this project: the public names only.
PUBLIC = {
    "discovery": set(discovery.__all__),
    # The picker seam: a search server process with a picker of one's own.
    "search_server.cli": {"main"},
    "search_server.picking": set(importlib.import_module("search_server.picking").__all__),
}
PROJECT_PACKAGES = {"discovery", "search_server", "data_server", "tests"}


# -- what every example is held to -------------------------------------------------


def test_the_examples_are_the_ones_the_docs_include() -> None:
    assert NAMES == [
        "aiohttp_data_server.py",
        "custom_picker.py",
        "custom_probe.py",
        "live_list_follower.py",
        "threaded_data_server.py",
    ]


def test_the_examples_readme_lists_each_example_and_the_readme_points_to_it() -> None:
    listed = set(re.findall(r"\[`(\w+\.py)`\]\(\1\)", (EXAMPLES / "README.md").read_text()))
    assert listed == set(NAMES)
    assert "](examples/README.md)" in (ROOT / "README.md").read_text()


@pytest.mark.parametrize("name", NAMES)
def test_an_example_imports_only_public_names(name: str) -> None:
    tree = ast.parse((EXAMPLES / name).read_text())
    imported: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                root = alias.name.split(".")[0]
                assert root not in PROJECT_PACKAGES, f"import {alias.name}: use from-imports"
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.split(".")[0] not in PROJECT_PACKAGES:
                continue
            assert node.module in PUBLIC, f"from {node.module} import ... (not public)"
            names = {alias.name for alias in node.names}
            assert names <= PUBLIC[node.module], (
                f"from {node.module}: not public: {sorted(names - PUBLIC[node.module])}"
            )
            imported += names
    assert imported, f"{name} imports nothing of this project"


@pytest.mark.parametrize("name", NAMES)
def test_an_example_says_what_it_shows_and_how_to_run_it(name: str) -> None:
    docstring = ast.get_docstring(ast.parse((EXAMPLES / name).read_text()))
    assert docstring, f"{name} has no module docstring"
    assert "What it shows" in docstring
    assert f"python examples/{name}" in docstring
    assert "discovery devcluster" in docstring
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / name), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: "), result.stdout


# -- running them ---------------------------------------------------------------------


@dataclass
class Example:
    """An example running as a process; its output goes to files, read at any time."""

    process: asyncio.subprocess.Process
    out: Path
    err: Path

    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    async def exited(self, what: str) -> int:
        return await waited(self.process.wait(), f"{what} to exit", timeout=WAIT)


@contextlib.asynccontextmanager
async def run_example(name: str, *args: str, workdir: Path) -> AsyncIterator[Example]:
    """``python examples/<name> args...``: killed afterwards if still running. Its stderr
    is copied to ours, which pytest shows when the test fails."""
    # The environment of a developer who pasted devcluster's exports must not leak in.
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISCOVERY_")}
    out, err = workdir / f"{name}.out", workdir / f"{name}.err"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        process = await asyncio.create_subprocess_exec(
            *(sys.executable, str(EXAMPLES / name), *args),
            stdout=stdout,
            stderr=stderr,
            env=env,
            cwd=ROOT,
        )
    example = Example(process, out, err)
    try:
        yield example
    finally:
        await reap(process)
        sys.stderr.write(f"--- {name} {' '.join(args)}: stderr\n{example.stderr()}")


@contextlib.asynccontextmanager
async def watching(make_session: SessionFactory) -> AsyncIterator[MembershipWatcher]:
    session = await make_session(session_timeout=WATCHER_SESSION_TIMEOUT)
    async with MembershipWatcher(session, coalesce_window=0) as watcher:
        yield watcher


async def observe(
    watcher: MembershipWatcher, predicate: Callable[[Members], bool], what: str
) -> Members:
    return await waited(watcher.wait_until(predicate, timeout=WAIT), what)


def draining(instance_id: str) -> Callable[[Members], bool]:
    return lambda m: instance_id in m and m[instance_id].payload.state is InstanceState.DRAINING


async def get(url: str) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http,
        http.get(url) as response,
    ):
        return response.status, await response.json()


async def answers_search(port: int) -> None:
    status, body = await get(f"http://127.0.0.1:{port}/search?q=x")
    assert (status, body) == (200, {"hits": []})


async def drains_on_sigterm_while_answering(
    example: Example, watcher: MembershipWatcher, instance_id: str, port: int
) -> None:
    """SIGTERM: marked draining (not routable), still answering; then removed, exit 0,
    no longer listening."""
    example.process.send_signal(signal.SIGTERM)
    members = await observe(watcher, draining(instance_id), f"{instance_id} draining")
    assert not members[instance_id].routable
    # The point of draining first: search servers stop routing here while we answer.
    try:
        await answers_search(port)
    except aiohttp.ClientConnectionError as exc:
        raise AssertionError(f"the server stopped answering while draining: {exc}") from exc
    await observe(watcher, lambda m: instance_id not in m, f"{instance_id} removed")
    assert await example.exited(f"{instance_id} after the drain") == 0
    with pytest.raises(aiohttp.ClientConnectionError):
        await answers_search(port)


async def test_aiohttp_data_server_registers_answers_and_drains_on_sigterm(
    zk_hosts: str, make_session: SessionFactory, tmp_path: Path
) -> None:
    port = free_port()
    async with (
        watching(make_session) as watcher,
        run_example(
            "aiohttp_data_server.py",
            *("--zk", zk_hosts, "--port", str(port), "--advertise", "127.0.0.1"),
            # A grace long enough to query the server while it drains, and for the
            # watcher to read the draining node before it goes.
            *("--id", "ex-aiohttp", "--shard", "3", "--drain-grace", "5"),
            workdir=tmp_path,
        ) as example,
    ):
        members = await observe(watcher, lambda m: "ex-aiohttp" in m, "ex-aiohttp registered")
        node = members["ex-aiohttp"]
        assert (node.name, node.address, node.port) == ("data_servers", "127.0.0.1", port)
        assert (node.payload.shard, node.payload.state) == (3, InstanceState.SERVING)
        assert node.routable
        await answers_search(port)
        await drains_on_sigterm_while_answering(example, watcher, "ex-aiohttp", port)


def load_example(name: str) -> ModuleType:
    """Import an example file as a module (not as ``__main__``: nothing runs)."""
    spec = importlib.util.spec_from_file_location(name.removesuffix(".py"), EXAMPLES / name)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_aiohttp_data_server_cleanup_ctx_alone_drains_and_removes(
    zk_hosts: str, make_session: SessionFactory
) -> None:
    """Without serve()'s early drain (as under ``web.run_app``), ``runner.cleanup()``
    still announces the departure (draining), then removes the node."""
    example = load_example("aiohttp_data_server.py")
    port = free_port()
    args = example.parse_args(
        [
            *("--zk", zk_hosts, "--port", str(port), "--id", "ex-cleanup", "--shard", "5"),
            *("--drain-grace", "5"),  # the watcher must read the draining node before it goes
        ]
    )
    app = example.make_app(args)
    runner = web.AppRunner(app)
    cleanup: asyncio.Task[None] | None = None
    async with watching(make_session) as watcher:
        await runner.setup()
        try:
            await web.TCPSite(runner, "127.0.0.1", port).start()
            members = await observe(watcher, lambda m: "ex-cleanup" in m, "ex-cleanup registered")
            node = members["ex-cleanup"]
            assert (node.address, node.port, node.payload.shard) == ("127.0.0.1", port, 5)
            assert node.routable
            await answers_search(port)

            cleanup = asyncio.create_task(runner.cleanup())
            await observe(watcher, draining("ex-cleanup"), "ex-cleanup draining in cleanup()")
            await observe(watcher, lambda m: "ex-cleanup" not in m, "ex-cleanup removed")
            async with within(WAIT, "runner.cleanup() to return"):
                await cleanup
            assert app[example.AGENT].status().state is AgentState.STOPPED
        finally:
            if cleanup is None:
                await runner.cleanup()
            elif not cleanup.done():
                # A failed wait above: let the cleanup finish (bounded) before the
                # fixtures remove the chroot.
                async with within(WAIT, "the interrupted runner.cleanup() to finish"):
                    await asyncio.gather(cleanup, return_exceptions=True)


async def test_threaded_data_server_registers_answers_and_drains_on_sigterm(
    zk_hosts: str, make_session: SessionFactory, tmp_path: Path
) -> None:
    async with (
        watching(make_session) as watcher,
        run_example(
            "threaded_data_server.py",
            *("--zk", zk_hosts, "--port", "0", "--id", "ex-threaded", "--shard", "4"),
            *("--drain-grace", "5"),
            workdir=tmp_path,
        ) as example,
    ):
        members = await observe(watcher, lambda m: "ex-threaded" in m, "ex-threaded registered")
        node = members["ex-threaded"]
        port = node.port  # --port 0: the port it bound, as registered
        assert port > 0
        assert (node.address, node.payload.shard, node.routable) == ("127.0.0.1", 4, True)
        assert await get(f"http://127.0.0.1:{port}/healthz") == (200, {"status": "ok"})
        await answers_search(port)
        await drains_on_sigterm_while_answering(example, watcher, "ex-threaded", port)


async def test_custom_probe_takes_the_server_offline_while_the_index_is_missing(
    zk_hosts: str, make_session: SessionFactory, tmp_path: Path
) -> None:
    index = tmp_path / "shard-0.idx"
    index.write_text("docs\n")
    port = free_port()
    async with (
        watching(make_session) as watcher,
        run_example(
            "custom_probe.py",
            *("--zk", zk_hosts, "--port", str(port), "--id", "ex-probe"),
            *("--index", str(index), "--min-free-mb", "1"),
            workdir=tmp_path,
        ) as example,
    ):
        members = await observe(watcher, lambda m: "ex-probe" in m, "ex-probe registered")
        registered_at = members["ex-probe"].registration_time_utc
        await answers_search(port)

        index.unlink()  # the server still answers: only the probe's own check fails
        await observe(watcher, lambda m: "ex-probe" not in m, "ex-probe offline, index missing")
        # The agent says why, in the probe's words.
        await eventually(
            lambda: re.search(
                r"taking ex-probe offline: .*index .*shard-0\.idx: No such file",
                example.stderr(),
            ),
            message="the probe's reason logged",
        )
        await answers_search(port)

        index.write_text("docs\n")
        members = await observe(watcher, lambda m: "ex-probe" in m, "ex-probe back, index back")
        assert members["ex-probe"].routable
        assert members["ex-probe"].registration_time_utc > registered_at  # a new admission

        index.write_text("")  # an empty index is no index either
        await observe(watcher, lambda m: "ex-probe" not in m, "ex-probe offline, index empty")
        await eventually(
            lambda: "shard-0.idx is empty" in example.stderr(), message="the empty index logged"
        )

        example.process.send_signal(signal.SIGTERM)
        assert await example.exited("custom_probe.py after SIGTERM") == 0


async def test_live_list_follower_prints_the_changes_the_leader_publishes(
    redis_server: RedisServer, redis_prefix: str, client: Any, tmp_path: Path
) -> None:
    publisher = LivePublisher(client, redis_prefix, leader_id="ss-1", epoch=1)
    a, b, c = (make_instance(f"ds-{n}", 9000 + i) for i, n in enumerate("abc", 1))
    await publisher.publish_full(view(a, b))
    async with run_example(
        "live_list_follower.py",
        *("--redis", redis_server.url, "--cluster", cluster_of(redis_prefix)),
        workdir=tmp_path,
    ) as example:

        async def printed(line: str) -> None:
            await eventually(
                lambda: line in example.stdout().splitlines(),
                timeout=WAIT,
                message=f"{line!r} printed (so far: {example.stdout()!r})",
            )

        await printed("list 1.1 (leader ss-1)")
        await printed("added ds-a 127.0.0.1 9001")
        await printed("added ds-b 127.0.0.1 9002")
        await printed("  2 routable")

        leaving = a.with_state(InstanceState.DRAINING, reason="rolling restart")
        await publisher.publish_change(
            view(leaving, b), added={}, changed={"ds-a": leaving}, removed={}
        )
        await printed("changed ds-a draining rolling restart")
        await printed("  1 routable")

        await publisher.publish_change(
            view(leaving, c), added={"ds-c": c}, changed={}, removed={"ds-b": "session expired"}
        )
        await printed("added ds-c 127.0.0.1 9003")
        await printed("removed ds-b - session expired")
        assert example.process.returncode is None  # it keeps following


async def cluster_view(port: int) -> dict[str, Any] | None:
    """The search server's ``/cluster``; None while it does not answer yet."""
    try:
        status, body = await get(f"http://127.0.0.1:{port}/cluster")
    except aiohttp.ClientError:
        return None
    return body if status == 200 else None


async def sent(port: int) -> dict[str, int]:
    """Requests the search server sent, by data server (``/cluster``'s ``sent``)."""
    view = await cluster_view(port)
    assert view is not None
    return {server["id"]: server.get("sent", 0) for server in view["servers"]}


async def test_custom_picker_sends_each_shards_requests_to_its_replica_0_first(
    zk_hosts: str,
    redis_server: RedisServer,
    redis_prefix: str,
    make_data_server: DataServerFactory,
    tmp_path: Path,
) -> None:
    primary: DataServer = await make_data_server(instance_id="ds-r0", shard=0, replica=0)
    await make_data_server(instance_id="ds-r1", shard=0, replica=1)
    port = free_port()
    async with run_example(
        "custom_picker.py",
        *("--zk", zk_hosts, "--redis", redis_server.url, "--cluster", cluster_of(redis_prefix)),
        *("--id", "ss-picker", "--port", str(port), "--session-timeout", "2"),
        *("--heartbeat-interval", "0.2", "--heartbeat-ttl", "2", "--reconcile-interval", "1"),
        # No hedges: a hedge goes to another replica by design, and would make the
        # count below depend on the machine's load.
        *("--hedge-percent", "0", "--drain-grace", "0", "--log-level", "WARNING"),
        # A deadline no stall of a loaded machine reaches: a timeout is no choice of the picker.
        *("--timeout-ms", "10000"),
        workdir=tmp_path,
    ) as example:

        async def routes_to(*ids: str) -> bool:
            """The search server leads, and routes to the serving ``ids``, no others."""
            view = await cluster_view(port)
            if view is None or not view["is_leader"]:
                return False
            return {s["id"] for s in view["servers"] if s["state"] == "serving"} == set(ids)

        await eventually(lambda: routes_to("ds-r0", "ds-r1"), timeout=WAIT, message="both routed")

        async def query(count: int) -> None:
            for n in range(count):
                status, body = await get(f"http://127.0.0.1:{port}/search?q=query{n}")
                assert status == 200, body
                assert (body["shards"]["ok"], body["partial"]) == (1, False), body

        # Adaptive selection (the default) would try the replica it knows nothing of,
        # ds-r1, at once: this picker leaves it alone while replica 0 is there.
        await query(30)
        assert await sent(port) == {"ds-r0": 30, "ds-r1": 0}

        # Replica 0 leaves: replica 1 takes its requests.
        assert primary.agent is not None
        await primary.agent.atake_offline("test")
        await eventually(lambda: routes_to("ds-r1"), timeout=WAIT, message="ds-r1 alone routed")
        await query(10)
        assert (await sent(port))["ds-r1"] == 10

        example.process.send_signal(signal.SIGTERM)
        assert await example.exited("custom_picker.py after SIGTERM") == 0
