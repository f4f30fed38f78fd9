"""Helpers for tests: wait for a condition with a deadline, never sleep blindly."""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import functools
import heapq
import inspect
import io
import itertools
import json
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import jsonschema
from prometheus_client import CollectorRegistry

from data_server.index import InvertedIndex
from data_server.server import DataServer
from discovery.agent.agent import Agent
from discovery.agent.loopthread import LoopThread
from discovery.config import AgentConfig, ZkConfig
from discovery.instance import InstancePayload, ServiceInstance
from discovery.zk.election import Leadership
from discovery.zk.session import ZkSession
from search_server.server import SearchServer

#: The repository's root (the tests live in tiers below ``tests/``).
REPO_ROOT = Path(__file__).resolve().parents[1]

#: Agent settings that make tests quick: a probe every 0.1 s, offline after two failures.
FAST_AGENT = AgentConfig(
    probe_interval=0.1,
    probe_timeout=0.5,
    max_latency=0.25,
    fall=2,
    rise=2,
    flap_max=3,
    flap_window=60,
    flap_cooldown=2,
    drain_grace=0.5,
)

#: A ServiceInstance document's top-level fields, in the order Curator writes them.
CURATOR_FIELD_ORDER = [
    "name",
    "id",
    "address",
    "port",
    "sslPort",
    "payload",
    "registrationTimeUTC",
    "serviceType",
    "uriSpec",
    "enabled",
]

#: ``await make_data_server(*, agent=FAST_AGENT, admin_token=None, **DataServerConfig fields)``
DataServerFactory = Callable[..., Awaitable[DataServer]]
#: ``await make_search_server(*, redis_url=None, zk=None, store=None, picker=None, **fields)``
SearchServerFactory = Callable[..., Awaitable[SearchServer]]


#: ``await make_session(hosts=None, *, session_timeout=..., registry=None, auth=None)``
SessionFactory = Callable[..., Awaitable[ZkSession]]

T = TypeVar("T")


async def eventually(
    probe: Callable[[], T | Awaitable[T]],
    *,
    timeout: float = 15.0,
    interval: float = 0.02,
    message: str = "condition",
) -> T:
    """Poll ``probe`` until it returns a truthy value; return that value.

    Raises AssertionError naming ``message`` (and the last value) at the deadline.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        value = probe()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value  # type: ignore[return-value]
        last = value
        if time.monotonic() > deadline:
            raise AssertionError(f"{message} not reached within {timeout}s (last: {last!r})")
        await asyncio.sleep(interval)  # ok-sleep: the polling interval of a deadline-bounded wait


async def waited(awaitable: Awaitable[T], what: str, *, timeout: float | None = None) -> T:
    """Await ``awaitable`` and return its result; a timeout fails naming ``what``.

    For waits with a deadline of their own that end in a bare ``TimeoutError``
    (``watcher.wait_until(..., timeout=10)``, ``reader.wait_until(...)``), and, given
    ``timeout``, for any other awaitable (``process.wait()``, ``anext(events)``, a task).
    Without ``timeout`` the awaitable must bound itself.
    """
    started = time.monotonic()
    try:
        if timeout is None:
            return await awaitable
        async with asyncio.timeout(timeout):
            return await awaitable
    except TimeoutError as exc:
        elapsed = time.monotonic() - started
        raise AssertionError(f"timed out after {elapsed:.1f}s waiting for {what}") from exc


@contextlib.asynccontextmanager
async def within(timeout: float, what: str) -> AsyncIterator[None]:
    """Run the ``async with`` block with a deadline; past it, fail naming ``what``.

    For waits that are a block rather than one awaitable, such as reading a stream of
    changes (``async for``) until the one expected arrives.
    """
    started = time.monotonic()
    try:
        async with asyncio.timeout(timeout):
            yield
    except TimeoutError as exc:
        elapsed = time.monotonic() - started
        raise AssertionError(f"timed out after {elapsed:.1f}s waiting for {what}") from exc


async def next_change(
    changes: AsyncIterator[T], matches: Callable[[T], bool], what: str, *, timeout: float = 30.0
) -> T:
    """Read ``changes`` (a subscription) up to the first item that ``matches``; return it.

    Fails naming ``what`` if none arrives within ``timeout`` or the stream ends first.
    """
    async with within(timeout, what):
        async for change in changes:
            if matches(change):
                return change
    raise AssertionError(f"the stream ended before {what}")


async def reap(process: asyncio.subprocess.Process, *, timeout: float = 30.0) -> None:
    """Kill ``process`` if it still runs and wait for it to exit (at most ``timeout``)."""
    if process.returncode is None:
        process.kill()
        await waited(process.wait(), f"process {process.pid} to exit on SIGKILL", timeout=timeout)


class FakeClock:
    """A clock that stands still: tests move it by setting ``now`` or with :meth:`advance`
    (standing for waiting out a window or a cool-down)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class _Alarm:
    __slots__ = ("args", "callback", "cancelled")

    def __init__(self, callback: Callable[..., object], args: tuple[object, ...]) -> None:
        self.callback = callback
        self.args = args
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualTimer:
    """A fan-out's timer (``FanOut(timer=...)``: a loop's ``time`` and ``call_at``) that
    the test moves with :meth:`advance`: what fell due by then runs, in order of time;
    nothing runs by itself."""

    def __init__(self) -> None:
        self.now = 0.0
        self._due: list[tuple[float, int, _Alarm]] = []
        self._order = itertools.count()

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[..., object], *args: object) -> _Alarm:
        alarm = _Alarm(callback, args)
        heapq.heappush(self._due, (when, next(self._order), alarm))
        return alarm

    def advance(self, seconds: float) -> None:
        self.now += seconds
        while self._due and self._due[0][0] <= self.now:
            _, _, alarm = heapq.heappop(self._due)
            if not alarm.cancelled:
                alarm.callback(*alarm.args)


def cluster_of(prefix: str) -> str:
    """The cluster name whose layout-2 Redis prefix is ``prefix`` (``discovery:{<name>}``)."""
    return prefix.removeprefix("discovery:{").removesuffix("}")


def view(*instances: ServiceInstance) -> dict[str, ServiceInstance]:
    """A membership view of ``instances``: each under its id (what a watcher, a live list
    or a publisher holds)."""
    return {instance.id: instance for instance in instances}


def instance_of(server: DataServer) -> ServiceInstance:
    """The ServiceInstance an in-process data server's agent registers."""
    assert server.agent is not None
    return server.agent.instance


def live_ids(server: SearchServer) -> set[str]:
    """The ids in a search server's current live list (as its reader last applied it)."""
    assert server.reader is not None
    return set(server.reader.current.servers)


async def all_see(servers: list[SearchServer], ids: set[str], *, timeout: float = 15.0) -> None:
    """Wait until every one of ``servers`` has exactly ``ids`` in its live list."""
    await eventually(
        lambda: all(live_ids(s) == ids for s in servers), timeout=timeout, message=f"all see {ids}"
    )


async def absent(session: ZkSession, path: str) -> bool:
    """True if ``path`` does not exist in ZooKeeper (a probe for :func:`eventually`)."""
    return await session.exists(path) is None


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    """A metric's current value in ``registry``; 0 if it has no sample yet."""
    return registry.get_sample_value(name, labels) or 0.0


async def more_probes(agent: Agent, count: int) -> None:
    """Wait until ``agent`` has made ``count`` more successful probes than it had made on
    entry (it must have made at least one by then)."""

    def ok_probes() -> float | None:
        return agent.registry.get_sample_value("discovery_agent_probes_total", {"result": "ok"})

    start = ok_probes()
    assert start is not None, "no successful probe yet"
    await eventually(
        lambda: (ok_probes() or 0) >= start + count, message=f"{count} more successful probes"
    )


def frequent_terms(index: InvertedIndex, count: int) -> str:
    """The worst-case query of a shard: its ``count`` most frequent terms (by document
    frequency), most frequent first."""
    terms = sorted(index._terms, key=lambda term: (-index.document_frequency(term), term))
    return " ".join(terms[:count])


async def loop_settled(server: DataServer) -> None:
    """Stop ``server`` counting its loop's lag against requests' budgets: a test that
    holds the loop it shares with the server (building a worst-case query, an exhaustive
    search) and sends budgets of a few milliseconds would otherwise see them spent on
    its own work, or on the other test workers' (the data server counts that wait)."""
    await server.loop_lag.aclose()
    server.loop_lag.last_lag = 0.0


async def get_json(url: str, **params: str) -> tuple[int, Any]:
    """``GET url?params`` in a session of its own: (status, decoded JSON body)."""
    async with aiohttp.ClientSession() as client, client.get(url, params=params) as response:
        return response.status, await response.json()


def shard_counts(
    total: int, ok: int, *, failed: int = 0, timed_out: int = 0, cut: int = 0, missing: int = 0
) -> dict[str, int]:
    """An answer's ``shards`` counts as the search server gives them (``/search``)."""
    return {
        "total": total,
        "ok": ok,
        "failed": failed,
        "timed_out": timed_out,
        "cut": cut,
        "missing": missing,
    }


def make_instance(
    instance_id: str,
    port: int = 9001,
    *,
    address: str = "127.0.0.1",
    shard: int = 0,
    **payload: object,
) -> ServiceInstance:
    """A data server's ServiceInstance for tests."""
    fields: dict[str, object] = {
        "shard": shard,
        "replica": 0,
        "docs": 1000,
        "version": "test",
        "state": "serving",
    }
    fields.update(payload)
    return ServiceInstance.create(
        "data_servers", instance_id, address, port, InstancePayload.from_dict(fields)
    )


def repeat_host(address: str, times: int = 4) -> str:
    """A kazoo hosts string that names one server ``times`` times.

    kazoo gives a connection handshake ``session_timeout / len(hosts)`` seconds. With a
    single host, one handshake that a restarting server accepts but never answers uses up
    the whole session timeout and the session expires; naming the host several times
    bounds that wait to a fraction, as the host list of an ensemble does.
    """
    return ",".join([address] * times)


async def bounded_teardown(what: str, *closers: Awaitable[object], timeout: float = 60.0) -> None:
    """Await ``closers`` together; if they hang, print the stacks of the ones still
    running and every thread's, then cancel them and fail, so that a hung shutdown
    names the coroutine that hangs (a thread dump alone shows only the event loop's
    ``select``). The stacks are taken before the cancellation, which would unwind them.
    """
    tasks = [asyncio.ensure_future(closer) for closer in closers]
    if not tasks:
        return
    _, pending = await asyncio.wait(tasks, timeout=timeout)
    if pending:
        out = io.StringIO()
        out.write(f"=== {what}: teardown hung for {timeout:g}s; pending closers:\n")
        for task in pending:
            task.print_stack(limit=30, file=out)
        out.write(f"=== {what}: every other asyncio task:\n")
        for task in asyncio.all_tasks():
            if task not in pending and not task.done():
                task.print_stack(limit=12, file=out)
        sys.stderr.write(out.getvalue())
        sys.stderr.write(f"=== {what}: threads:\n")
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        for task in pending:
            task.cancel()
        await asyncio.wait(pending, timeout=5)
        raise AssertionError(f"{what}: teardown hung for {timeout:g}s (stacks on stderr)")
    for task in tasks:
        task.result()  # a closer's own error fails the teardown


class Healthy:
    """A probe that always passes: for tests of registration, not of health."""

    async def check(self) -> None:
        return None


@contextlib.asynccontextmanager
async def agent_fleet(
    count: int,
    zk: ZkConfig,
    *,
    config: AgentConfig = FAST_AGENT,
    name: str = "fleet",
    base_port: int = 9400,
) -> AsyncIterator[list[Agent]]:
    """``count`` always-healthy agents (``ds-00``, ``ds-01``...) on one shared
    ``LoopThread``, as a fleet process runs them: started and ready; stopped afterwards."""
    loop_thread = LoopThread(name)
    loop_thread.start()
    agents: list[Agent] = []
    try:
        for i in range(count):
            agent = Agent(
                make_instance(f"ds-{i:02d}", base_port + i),
                Healthy(),
                zk=zk,
                config=config,
                loop_thread=loop_thread,
            )
            await agent.astart()
            agents.append(agent)
            agent.set_ready()
        yield agents
    finally:
        for agent in agents:
            await agent.astop()
        loop_thread.stop()


async def published_term(leader: SearchServer) -> Leadership:
    """Wait until ``leader`` has published a list; its term (fails if it does not lead)."""
    assert leader.reader is not None
    await waited(
        leader.reader.wait_until(lambda live: live.version > 0, timeout=10), "a published list"
    )
    assert leader.election is not None
    term = leader.election.leadership
    assert term is not None, f"{leader.server_id} does not lead"
    return term


SCHEMAS = REPO_ROOT / "docs" / "schemas"


@functools.cache
def _validator(name: str) -> jsonschema.Draft202012Validator:
    schema = json.loads((SCHEMAS / f"{name}.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def schema_errors(document: Any, schema: str) -> list[str]:
    """Where ``document`` departs from ``docs/schemas/<schema>.schema.json``, one line each."""
    errors = sorted(_validator(schema).iter_errors(document), key=lambda e: list(e.path))
    return [f"{list(e.path)}: {e.message}" for e in errors]


def conforming(document: Any, schema: str) -> Any:
    """``document``, after checking it against ``docs/schemas/<schema>.schema.json``: the
    ``--json`` output scripts rely on is the one documented, key for key."""
    errors = schema_errors(document, schema)
    assert not errors, "\n".join(errors[:10])
    return document


#: An operation timeout for tests that issue thousands of ZooKeeper operations at once:
#: on a loaded 2-core machine the last waits behind the others far longer than the 2 s
#: the fixtures' sessions allow, which those tests do not measure.
BULK_OPERATION_TIMEOUT = 60.0
