"""Real network partitions: processes in network namespaces, links cut with iptables.

ZooKeeper and Redis run in the root namespace, bound to the lab's gateway address; the
process under test runs in a namespace of its own (a :class:`NetworkLab` host), so a
cut affects it alone and only on the link named. Everything the lab creates is
removed afterwards, and by its reaper if the test process dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from data_server.corpus import sample_queries
from discovery.config import ZkConfig
from discovery.layout import DATA_SERVERS_PATH
from discovery.redislayout import Heartbeat, RedisKeys, parse_heartbeat
from discovery.testing import RedisServer, ZooKeeperEnsemble, free_port
from discovery.testing.netns import Host, NetworkLab, netns_available, remove_tagged
from discovery.zk import ZkSession
from tests.conftest import SESSION_TIMEOUT, TICK_TIME_MS
from tests.support import SearchServerFactory, eventually, get_json, live_ids

pytestmark = pytest.mark.skipif(netns_available() is not None, reason=str(netns_available()))


@pytest.fixture
def lab() -> Iterator[NetworkLab]:
    with NetworkLab() as network:
        yield network


@pytest.fixture
def lab_zk(lab: NetworkLab, tmp_path: Path) -> Iterator[ZooKeeperEnsemble]:
    """A standalone ZooKeeper on the lab's gateway, reachable from every host."""
    ensemble = ZooKeeperEnsemble(1, tmp_path / "zk", tick_time_ms=TICK_TIME_MS, host=lab.gateway)
    ensemble.start()
    yield ensemble
    ensemble.stop()


@pytest.fixture
def lab_redis(lab: NetworkLab, tmp_path: Path) -> Iterator[RedisServer]:
    redis = RedisServer(tmp_path / "redis", host=lab.gateway)
    redis.start()
    yield redis
    redis.stop()


@pytest.fixture
async def observer(lab_zk: ZooKeeperEnsemble) -> AsyncIterator[ZkSession]:
    session = ZkSession.from_config(ZkConfig(hosts=lab_zk.hosts, session_timeout=10.0))
    await session.start()
    yield session
    await session.aclose()


def _port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


class _DataServerProcess:
    """``python -m data_server.cli`` on a lab host (or in the root namespace)."""

    def __init__(self, instance_id: str, zk: str, host: Host | None, workdir: Path) -> None:
        self.instance_id = instance_id
        self.port = free_port()
        address = host.address if host is not None else "127.0.0.1"
        argv = [
            *(sys.executable, "-m", "data_server.cli", "--zk", zk),
            *("--session-timeout", str(SESSION_TIMEOUT), "--log-level", "WARNING"),
            *("--id", instance_id, "--host", address, "--advertise", address),
            *("--port", str(self.port), "--shard", "0", "--docs", "300"),
            *("--probe-interval", "0.1", "--verify-interval", "1"),
        ]
        log = (workdir / f"{instance_id}.log").open("wb")
        self.process = (
            host.popen(argv, stdout=log, stderr=subprocess.STDOUT)
            if host is not None
            else subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        )
        log.close()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture
def data_servers(tmp_path: Path) -> Iterator[list[_DataServerProcess]]:
    servers: list[_DataServerProcess] = []
    yield servers
    for server in servers:
        server.stop()


def test_a_lab_leaves_nothing_behind_even_when_its_process_is_killed(tmp_path: Path) -> None:
    script = (
        "import sys, time\n"
        "from discovery.testing.netns import NetworkLab\n"
        "lab = NetworkLab().start()\n"
        "lab.add_host('victim')\n"
        "print(lab.tag, flush=True)\n"
        "time.sleep(600)\n"
    )
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    tag = ""
    try:
        assert process.stdout is not None
        tag = process.stdout.readline().strip()
        assert tag.startswith("dl")
        assert f"{tag}-victim" in _namespaces()
        process.send_signal(signal.SIGKILL)
        process.wait()
        deadline = time.monotonic() + 20
        while _leftovers(tag) and time.monotonic() < deadline:
            time.sleep(0.1)  # ok-sleep: the polling interval of a deadline-bounded wait
        assert not _leftovers(tag), _leftovers(tag)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if tag:
            remove_tagged(tag)  # whatever the reaper missed, so the machine stays clean


def _namespaces() -> list[str]:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()


def _leftovers(tag: str) -> list[str]:
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    names = [n for n in _namespaces() if n.startswith(tag)]
    names += [line.split(":")[1].strip().split("@")[0] for line in links.splitlines()]
    return [n for n in names if n.startswith(tag)]


def test_a_cut_drops_one_link_both_ways_and_heals(lab: NetworkLab) -> None:
    host = lab.add_host("probe")
    listener = socket.create_server((lab.gateway, 0))
    port = listener.getsockname()[1]
    other = socket.create_server((lab.gateway, 0))
    other_port = other.getsockname()[1]
    try:
        assert _connects(host, lab.gateway, port)
        cut = lab.cut(host, address=lab.gateway, port=port)
        assert not _connects(host, lab.gateway, port)
        assert _connects(host, lab.gateway, other_port)  # only that service is cut
        cut.heal()
        assert _connects(host, lab.gateway, port)
    finally:
        listener.close()
        other.close()


def _connects(host: Host, address: str, port: int) -> bool:
    probe = (
        "import socket, sys\n"
        f"try:\n    socket.create_connection(({address!r}, {port}), timeout=1).close()\n"
        "except OSError:\n    sys.exit(1)\n"
    )
    return host.popen([sys.executable, "-c", probe]).wait(10) == 0


async def test_a_data_server_cut_from_zookeeper_only_leaves_the_lists_and_comes_back(
    lab: NetworkLab,
    lab_zk: ZooKeeperEnsemble,
    lab_redis: RedisServer,
    observer: ZkSession,
    data_servers: list[_DataServerProcess],
    make_search_server: SearchServerFactory,
    tmp_path: Path,
) -> None:
    victim_host = lab.add_host("ds-cut")
    victim = _DataServerProcess("ds-cut", lab_zk.hosts, victim_host, tmp_path)
    twin = _DataServerProcess("ds-twin", lab_zk.hosts, None, tmp_path)
    data_servers += [victim, twin]
    search = await make_search_server(server_id="ss-lab", zk=lab_zk.hosts, redis_url=lab_redis.url)
    await eventually(lambda: live_ids(search) == {"ds-cut", "ds-twin"}, timeout=60, message="both")

    outcomes: list[tuple[int, bool]] = []  # (HTTP status, partial answer)
    stop = asyncio.Event()

    async def query_all_along() -> None:
        queries = sample_queries(200, variant=3)
        index = 0
        while not stop.is_set():
            status, body = await get_json(f"{search.url}/search", q=queries[index % len(queries)])
            outcomes.append((status, bool(body.get("partial", True)) if status == 200 else True))
            index += 1
            await asyncio.sleep(0.05)  # ok-sleep: the pace of the query load, not a wait

    load = asyncio.create_task(query_all_along())
    try:
        cut = lab.cut(victim_host, address=lab.gateway, port=_port_of(lab_zk.hosts))
        cut_at = time.monotonic()
        # Its session expires on the server: gone from ZooKeeper and from the list...
        await eventually(
            lambda: "ds-cut" not in live_ids(search),
            timeout=4 * SESSION_TIMEOUT,
            message="ds-cut out of the live list",
        )
        removed_after = time.monotonic() - cut_at
        assert await observer.exists(f"{DATA_SERVERS_PATH}/ds-cut") is None
        # ...while it still answers queries itself (only its ZooKeeper link is cut).
        status, _ = await get_json(f"http://{victim_host.address}:{victim.port}/healthz")
        assert status == 200
        cut.heal()
        await eventually(
            lambda: "ds-cut" in live_ids(search), timeout=30, message="ds-cut back after the heal"
        )
    finally:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await load
    assert outcomes, "no query ran"
    assert all(status == 200 for status, _ in outcomes), outcomes
    assert not any(partial for _, partial in outcomes), outcomes
    print(f"removed {removed_after:.2f}s after the cut; {len(outcomes)} queries, all complete")


class _SearchServerProcess:
    """``python -m search_server.cli`` on a lab host."""

    def __init__(
        self, server_id: str, zk: str, redis: str, cluster: str, host: Host, workdir: Path
    ) -> None:
        self.port = free_port()
        self.url = f"http://{host.address}:{self.port}"
        argv = [
            *(sys.executable, "-m", "search_server.cli", "--zk", zk, "--redis", redis),
            *("--cluster", cluster, "--id", server_id, "--log-level", "WARNING"),
            *("--session-timeout", str(SESSION_TIMEOUT), "--host", host.address),
            *("--port", str(self.port), "--heartbeat-interval", "0.2", "--heartbeat-ttl", "2"),
            *("--reconcile-interval", "1"),
        ]
        log = (workdir / f"{server_id}.log").open("wb")
        self.process = host.popen(argv, stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


async def test_a_leader_cut_from_zookeeper_stops_publishing_before_its_session_expires(
    lab: NetworkLab,
    lab_zk: ZooKeeperEnsemble,
    lab_redis: RedisServer,
    redis_prefix: str,
    make_search_server: SearchServerFactory,
    tmp_path: Path,
) -> None:
    cluster = redis_prefix.removeprefix("discovery:")
    keys = RedisKeys(redis_prefix)
    host = lab.add_host("leader")
    old = _SearchServerProcess("ss-old", lab_zk.hosts, lab_redis.url, cluster, host, tmp_path)
    redis = aioredis.Redis.from_url(lab_redis.url)
    try:

        async def heartbeat() -> Heartbeat | None:
            raw = await redis.get(keys.leader)
            return None if raw is None else parse_heartbeat(raw, -1)

        async def led_by(leader: str) -> Heartbeat | None:
            beat = await heartbeat()
            return beat if beat is not None and beat.leader == leader else None

        first = await eventually(lambda: led_by("ss-old"), timeout=60, message="ss-old leads")
        successor = await make_search_server(
            server_id="ss-new", zk=lab_zk.hosts, redis_url=lab_redis.url
        )
        cut_at_ms = time.time() * 1000
        lab.cut(host, address=lab.gateway, port=_port_of(lab_zk.hosts))

        last_old_beat = first.at or 0
        deadline = time.monotonic() + 6 * SESSION_TIMEOUT
        new: Heartbeat | None = None
        while time.monotonic() < deadline:
            beat = await heartbeat()
            if beat is not None and beat.leader == "ss-old" and beat.epoch == first.epoch:
                last_old_beat = max(last_old_beat, beat.at or 0)
            if beat is not None and beat.leader == "ss-new":
                new = beat
                break
            await asyncio.sleep(0.02)  # ok-sleep: the sampling interval of a bounded watch
        assert new is not None, "no successor within the bound"
        assert (new.epoch or 0) > (first.epoch or 0)
        # Its lease (half a session timeout from the last answer it had, which came
        # before the cut) ran out: its last heartbeat came well before ZooKeeper could
        # expire its session. The 100 ms are for stamping the write after the check.
        assert last_old_beat - cut_at_ms < SESSION_TIMEOUT * 1000 / 2 + 100, (
            last_old_beat - cut_at_ms
        )
        print(
            f"old leader's last heartbeat {last_old_beat - cut_at_ms:.0f} ms after the cut; "
            f"successor epoch {new.epoch} > {first.epoch}"
        )

        lab.heal_all()

        # Back on the network, the old leader follows the new one and writes nothing.
        async def follows_new() -> bool:
            status, view = await get_json(f"{old.url}/cluster")
            return status == 200 and view["leader"] == "ss-new" and not view["is_leader"]

        await eventually(follows_new, timeout=30, message="ss-old follows ss-new")
        assert await led_by("ss-new") is not None
        assert successor.is_leader
    finally:
        await redis.aclose()
        old.stop()
