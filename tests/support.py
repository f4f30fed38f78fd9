"""Helpers for tests: wait for a condition with a deadline, never sleep blindly."""

from __future__ import annotations

import asyncio
import faulthandler
import inspect
import io
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from data_server.server import DataServer
from discovery.config import AgentConfig
from discovery.instance import InstancePayload, ServiceInstance
from discovery.zk import ZkSession
from search_server.server import SearchServer

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
#: ``await make_search_server(*, redis_url=None, zk=None, session_timeout=..., **fields)``
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
    """Await ``closers`` together; if they hang, print every asyncio task's stack and
    every thread's, then fail, so that a hung shutdown names the coroutine that hangs
    (a thread dump alone shows only the event loop's ``select``)."""
    try:
        async with asyncio.timeout(timeout):
            await asyncio.gather(*closers)
    except TimeoutError:
        out = io.StringIO()
        out.write(f"=== {what}: teardown hung for {timeout:g}s; asyncio tasks:\n")
        for task in asyncio.all_tasks():
            task.print_stack(limit=12, file=out)
        sys.stderr.write(out.getvalue())
        sys.stderr.write(f"=== {what}: threads:\n")
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        raise AssertionError(f"{what}: teardown hung for {timeout:g}s (stacks on stderr)") from None
