"""Data servers as real processes: drain on SIGTERM, kill -9, a blocked loop, a fleet."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiohttp
import pytest

from data_server.corpus import sample_queries
from discovery.adminauth import admin_headers
from discovery.errors import ZkNoNodeError
from discovery.instance import InstanceState, ServiceInstance
from discovery.zk.membership import MembershipWatcher
from discovery.zk.paths import DATA_SERVERS_PATH
from tests.support import SessionFactory, absent, eventually, next_change, reap, waited

# Probe every 0.1 s, offline after 2 failures; a short drain grace.
FAST_FLAGS = (
    *("--probe-interval", "0.1", "--probe-timeout", "0.5", "--probe-max-latency", "0.25"),
    *("--fall", "2", "--rise", "2", "--drain-grace", "1", "--session-timeout", "2"),
    *("--docs", "300", "--log-level", "WARNING"),
)


@contextlib.asynccontextmanager
async def spawned(*command: str, **kwargs: Any) -> AsyncIterator[asyncio.subprocess.Process]:
    """``command`` as a child process, killed if it still runs and reaped on the way out."""
    process = await asyncio.create_subprocess_exec(*command, **kwargs)
    try:
        yield process
    finally:
        await reap(process)


def data_server_process(
    zk_hosts: str, *args: str
) -> contextlib.AbstractAsyncContextManager[asyncio.subprocess.Process]:
    return spawned(sys.executable, "-m", "data_server.cli", "--zk", zk_hosts, *FAST_FLAGS, *args)


def fleet_process(
    zk_hosts: str,
    count: int,
    procs: int,
    *flags: str,
    entry: Sequence[str] = ("-m", "data_server.cli"),
    **kwargs: Any,
) -> contextlib.AbstractAsyncContextManager[asyncio.subprocess.Process]:
    """``data-server fleet`` of ``count`` servers in ``procs`` processes, on free ports;
    ``entry`` is how Python is told to run the ``data-server`` command."""
    fleet = ("fleet", "--zk", zk_hosts, "--count", str(count), "--procs", str(procs))
    return spawned(sys.executable, *entry, *fleet, "--base-port", "0", *flags, **kwargs)


async def _instance(session: Any, instance_id: str) -> ServiceInstance | None:
    try:
        data, _ = await session.get(f"{DATA_SERVERS_PATH}/{instance_id}")
    except ZkNoNodeError:
        return None
    return ServiceInstance.from_json(data)


@pytest.mark.smoke
async def test_sigterm_drains_without_failing_a_request(
    zk_hosts: str, make_session: SessionFactory
) -> None:
    observer = await make_session()
    async with (
        MembershipWatcher(observer, coalesce_window=0) as watcher,
        data_server_process(zk_hosts, "--port", "0", "--id", "ds-drain") as process,
    ):
        members = await waited(
            watcher.wait_until(lambda m: "ds-drain" in m, timeout=30), "ds-drain registered"
        )
        instance = members["ds-drain"]
        url = f"http://{instance.address}:{instance.port}"
        queries = sample_queries(50, variant=5)
        statuses: list[int] = []

        def routable() -> bool:
            # What a search server does: route only to serving members.
            current = watcher.members.get("ds-drain")
            return current is not None and current.routable

        async def client(worker: int) -> None:
            async with aiohttp.ClientSession() as session:
                n = worker
                while routable():
                    query = queries[n % len(queries)]
                    n += 1
                    async with session.get(f"{url}/search", params={"q": query}) as response:
                        statuses.append(response.status)

        clients = [asyncio.create_task(client(i)) for i in range(4)]
        await eventually(lambda: len(statuses) >= 20, message="load running")
        # Requests still in flight when the server stops accepting must complete too.
        async with aiohttp.ClientSession() as session:
            slow = await session.post(
                f"{url}/admin/fault",
                json={"mode": "slow", "delay_ms": 200},
                headers=admin_headers(),
            )
            assert slow.status == 200

        process.send_signal(signal.SIGTERM)

        draining = await waited(
            watcher.wait_until(
                lambda m: (
                    "ds-drain" not in m or m["ds-drain"].payload.state is InstanceState.DRAINING
                ),
                timeout=10,
            ),
            "ds-drain marked draining (or gone) after SIGTERM",
        )
        assert draining["ds-drain"].payload.state is InstanceState.DRAINING
        assert draining["ds-drain"].enabled is False
        await waited(
            watcher.wait_until(lambda m: "ds-drain" not in m, timeout=15), "ds-drain deregistered"
        )
        await waited(asyncio.gather(*clients), "the load clients to stop", timeout=15)
        assert await waited(process.wait(), "ds-drain to exit after SIGTERM", timeout=20) == 0
    assert len(statuses) >= 20
    assert set(statuses) == {200}


async def test_kill_9_removes_the_node_after_the_session_timeout(
    zk_hosts: str, make_session: SessionFactory
) -> None:
    observer = await make_session()
    async with data_server_process(zk_hosts, "--port", "0", "--id", "ds-kill") as process:
        await eventually(lambda: _instance(observer, "ds-kill"), timeout=30, message="registered")
        loop = asyncio.get_running_loop()
        killed_at = loop.time()
        process.kill()
        await waited(process.wait(), "ds-kill to exit on SIGKILL", timeout=10)
        await eventually(
            lambda: absent(observer, f"{DATA_SERVERS_PATH}/ds-kill"),
            timeout=20,
            message="node removed by expiry",
        )
        # Gone because ZooKeeper expired the session: not before it could have.
        assert loop.time() - killed_at < 20


async def test_blocked_event_loop_is_taken_offline_while_the_session_lives(
    zk_hosts: str, make_session: SessionFactory
) -> None:
    observer = await make_session()
    path = f"{DATA_SERVERS_PATH}/ds-blocked"
    async with (
        MembershipWatcher(observer, coalesce_window=0) as watcher,
        data_server_process(zk_hosts, "--port", "0", "--id", "ds-blocked") as process,
    ):
        members = await waited(
            watcher.wait_until(lambda m: "ds-blocked" in m, timeout=30), "ds-blocked registered"
        )
        instance = members["ds-blocked"]
        _, before = await observer.get(path)
        changes = watcher.subscribe()
        async with aiohttp.ClientSession() as session:
            answer = await session.post(
                f"http://{instance.address}:{instance.port}/admin/fault",
                json={"mode": "hang", "block_loop": True, "duration_ms": 4000},
                headers=admin_headers(),
            )
            assert answer.status == 200
        # The next search (a probe) blocks the server's loop for 4 s: far longer than
        # the probe budget, far shorter than nothing-at-all from a dead process.
        await next_change(
            changes, lambda c: "ds-blocked" in c.removed, "ds-blocked taken offline (loop blocked)"
        )
        # Once the loop is free the server is healthy again and comes back in the SAME
        # session: it was alive all along, only its agent took it offline.
        await next_change(
            changes, lambda c: "ds-blocked" in c.added, "ds-blocked back (loop free again)"
        )
        _, after = await observer.get(path)
        assert after.ephemeral_owner == before.ephemeral_owner
        assert after.czxid != before.czxid
        changes.close()
        process.send_signal(signal.SIGTERM)
        assert await waited(process.wait(), "ds-blocked to exit after SIGTERM", timeout=20) == 0


async def test_fleet_of_20_in_2_processes_registers_all_and_deregisters_on_stop(
    zk_hosts: str, make_session: SessionFactory
) -> None:
    observer = await make_session()
    flags = (
        *("--docs", "200", "--drain-grace", "0.5", "--probe-interval", "0.2"),
        *("--log-level", "WARNING"),
    )
    async with (
        MembershipWatcher(observer, coalesce_window=0.05) as watcher,
        fleet_process(zk_hosts, 20, 2, *flags) as process,
    ):
        members = await waited(
            watcher.wait_until(lambda m: len(m) == 20, timeout=90), "all 20 registered"
        )
        assert sorted(members) == [f"ds-{i:04d}" for i in range(20)]
        assert len({(m.address, m.port) for m in members.values()}) == 20
        assert {m.payload.shard for m in members.values()} == set(range(20))
        process.send_signal(signal.SIGTERM)
        assert await waited(process.wait(), "the fleet to exit after SIGTERM", timeout=60) == 0
        await waited(watcher.wait_until(lambda m: not m, timeout=15), "all 20 deregistered")


# `data-server fleet --worker 0`, with an atexit hook that says so if the interpreter's
# teardown runs.
_WORKER_WITH_TEARDOWN_HOOK = (
    "import atexit, sys\n"
    "atexit.register(lambda: print('interpreter teardown', file=sys.stderr, flush=True))\n"
    "from data_server.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


async def test_a_fleet_worker_skips_the_interpreters_teardown_and_flushes_its_logs(
    zk_hosts: str, make_session: SessionFactory
) -> None:
    # Its heap is its servers' indexes, freed object by object by the teardown: a burst
    # of CPU beside the fleet still answering (see exit_worker). The logs of its drain
    # still come out whole.
    observer = await make_session()
    # The last --log-level is the one taken.
    flags = (*FAST_FLAGS, "--log-level", "INFO", "--worker", "0")
    async with (
        MembershipWatcher(observer, coalesce_window=0.01) as watcher,
        fleet_process(
            zk_hosts,
            2,
            1,
            *flags,
            entry=("-c", _WORKER_WITH_TEARDOWN_HOOK),
            stderr=asyncio.subprocess.PIPE,
        ) as process,
    ):
        assert process.stderr is not None
        errors = asyncio.create_task(process.stderr.read())
        await waited(watcher.wait_until(lambda m: len(m) == 2, timeout=60), "both registered")
        process.send_signal(signal.SIGTERM)
        assert await waited(process.wait(), "the worker to exit after SIGTERM", timeout=60) == 0
        log = (await waited(errors, "the worker's stderr", timeout=10)).decode()
    assert "data server ds-0000 stopped" in log
    assert "data server ds-0001 stopped" in log
    assert "interpreter teardown" not in log


async def test_a_fleet_spreads_its_starts_over_start_spread(
    zk_hosts: str, make_session: SessionFactory
) -> None:
    # Four servers over 4 s start at 0, 1, 2 and 3 s: the last registers about 3 s
    # after the first (without the spread, within a few hundred milliseconds). The
    # bound is loose: a cold first start, or a late watch, eats into it.
    observer = await make_session()
    flags = ("--start-spread", "4", *FAST_FLAGS)
    loop = asyncio.get_running_loop()
    async with (
        MembershipWatcher(observer, coalesce_window=0.01) as watcher,
        fleet_process(zk_hosts, 4, 1, *flags) as process,
    ):
        await waited(watcher.wait_until(lambda m: len(m) >= 1, timeout=60), "a first server")
        first = loop.time()
        members = await waited(
            watcher.wait_until(lambda m: len(m) == 4, timeout=60), "all 4 registered"
        )
        assert loop.time() - first >= 1.5
        assert sorted(members) == [f"ds-{i:04d}" for i in range(4)]
        process.send_signal(signal.SIGTERM)
        assert await waited(process.wait(), "the fleet to exit after SIGTERM", timeout=60) == 0
