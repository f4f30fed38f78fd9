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
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
import redis.asyncio as aioredis

from data_server.corpus import sample_queries
from discovery.config import ZkConfig
from discovery.livelist.redis.layout import Heartbeat, RedisKeys, parse_heartbeat
from discovery.testing import RedisServer, ZooKeeperEnsemble, ZooKeeperServer, free_port
from discovery.testing.netns import Host, NetworkLab, netns_available, remove_tagged
from discovery.testing.zookeeper import four_letter_word
from discovery.zk.paths import DATA_SERVERS_PATH
from discovery.zk.session import ZkSession
from search_server.server import SearchServer
from tests.conftest import SESSION_TIMEOUT, TICK_TIME_MS
from tests.support import (
    SearchServerFactory,
    agent_fleet,
    cluster_of,
    eventually,
    get_json,
    live_ids,
    repeat_host,
)

# Every test here makes network namespaces (root, iptables), some without the ``lab`` fixture.
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(netns_available() is not None, reason=str(netns_available())),
]


@pytest.fixture
async def observer(lab_zk: ZooKeeperEnsemble) -> AsyncIterator[ZkSession]:
    session = ZkSession.from_config(ZkConfig(hosts=lab_zk.hosts, session_timeout=10.0))
    await session.start()
    yield session
    await session.aclose()


def _port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


class _ServerProcess:
    """A server's entry point run on a lab host (None: the root namespace), its output
    in ``<log_base>.log``; :meth:`stop` ends it (SIGTERM, then SIGKILL)."""

    def __init__(self, argv: list[str], host: Host | None, log_base: Path) -> None:
        with log_base.with_suffix(".log").open("wb") as log:
            self.process = (
                host.popen(argv, stdout=log, stderr=subprocess.STDOUT)
                if host is not None
                else subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
            )

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class _DataServerProcess(_ServerProcess):
    """``python -m data_server.cli`` on a lab host (or in the root namespace)."""

    def __init__(self, instance_id: str, zk: str, host: Host | NetworkLab, workdir: Path) -> None:
        self.instance_id = instance_id
        self.port = free_port()
        # In the root namespace: on the lab's gateway, so that every host reaches it.
        address = host.address if isinstance(host, Host) else host.gateway
        argv = [
            *(sys.executable, "-m", "data_server.cli", "--zk", zk),
            *("--session-timeout", str(SESSION_TIMEOUT), "--log-level", "WARNING"),
            *("--id", instance_id, "--host", address, "--advertise", address),
            *("--port", str(self.port), "--shard", "0", "--docs", "300"),
            *("--probe-interval", "0.1", "--verify-interval", "1"),
            # Stopped only at the end of a test: the default 5 s of draining each would
            # be most of the test's time.
            *("--drain-grace", "0.5"),
        ]
        super().__init__(argv, host if isinstance(host, Host) else None, workdir / instance_id)


@pytest.fixture
def data_servers(tmp_path: Path) -> Iterator[list[_DataServerProcess]]:
    servers: list[_DataServerProcess] = []
    yield servers
    for server in servers:
        server.stop()


def _victim_and_twin(
    name: str,
    lab: NetworkLab,
    zk: ZooKeeperEnsemble,
    workdir: Path,
    data_servers: list[_DataServerProcess],
) -> tuple[Host, _DataServerProcess]:
    """Two replicas of shard 0: ``name`` on a lab host of its own (the one to cut) and
    ``ds-twin`` in the root namespace, so that every query can stay complete."""
    host = lab.add_host(name)
    victim = _DataServerProcess(name, zk.hosts, host, workdir)
    data_servers += [victim, _DataServerProcess("ds-twin", zk.hosts, lab, workdir)]
    return host, victim


def test_a_lab_leaves_nothing_behind_even_when_its_process_is_killed(tmp_path: Path) -> None:
    script = (
        "import sys\n"
        "from discovery.testing.netns import NetworkLab\n"
        "lab = NetworkLab().start()\n"
        "lab.add_host('victim')\n"
        "print(lab.tag, flush=True)\n"
        "sys.stdin.read()\n"  # holds the lab until it is killed
    )
    process = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    tag = ""
    try:
        assert process.stdout is not None
        tag = process.stdout.readline().strip()
        assert tag.startswith("dl")
        assert f"{tag}-victim" in _namespaces()
        assert _forward_rules(tag), "no FORWARD rule for the lab's bridge"
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
        for pipe in (process.stdin, process.stdout):
            if pipe is not None:
                pipe.close()
        if tag:
            remove_tagged(tag)  # whatever the reaper missed, so the machine stays clean


def _namespaces() -> list[str]:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()


def _leftovers(tag: str) -> list[str]:
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    names = [n for n in _namespaces() if n.startswith(tag)]
    names += [line.split(":")[1].strip().split("@")[0] for line in links.splitlines()]
    return [n for n in names if n.startswith(tag)] + _forward_rules(tag)


def _forward_rules(tag: str) -> list[str]:
    """The root namespace's FORWARD rules the lab tagged (its bridge's ACCEPT)."""
    rules = subprocess.run(
        ["iptables", "-w", "-S", "FORWARD"], capture_output=True, text=True
    ).stdout.splitlines()
    return [rule for rule in rules if f"--comment {tag} " in rule]


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
    victim_host, victim = _victim_and_twin("ds-cut", lab, lab_zk, tmp_path, data_servers)
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


class _SearchServerProcess(_ServerProcess):
    """``python -m search_server.cli`` on a lab host."""

    def __init__(
        self,
        server_id: str,
        zk: str,
        redis: str,
        cluster: str,
        host: Host,
        workdir: Path,
        *extra: str,
    ) -> None:
        self.port = free_port()
        self.url = f"http://{host.address}:{self.port}"
        argv = [
            *(sys.executable, "-m", "search_server.cli", "--zk", zk, "--redis", redis),
            *("--cluster", cluster, "--id", server_id, "--log-level", "WARNING"),
            *("--session-timeout", str(SESSION_TIMEOUT), "--host", host.address),
            *("--port", str(self.port), "--heartbeat-interval", "0.2", "--heartbeat-ttl", "2"),
            *("--reconcile-interval", "1"),
            *extra,
        ]
        super().__init__(argv, host, workdir / server_id)


class _Heartbeats:
    """The leader's heartbeat key, read from Redis as readers see it."""

    def __init__(self, url: str, prefix: str) -> None:
        self._redis = aioredis.Redis.from_url(url)
        self._key = RedisKeys(prefix).leader

    async def current(self) -> Heartbeat | None:
        raw = await self._redis.get(self._key)
        return None if raw is None else parse_heartbeat(raw, -1)

    async def of(self, leader: str) -> Heartbeat | None:
        beat = await self.current()
        return beat if beat is not None and beat.leader == leader else None

    async def aclose(self) -> None:
        await self._redis.aclose()


@dataclass
class _Handover:
    """``ss-old`` leading from a lab host of its own, ``ss-new`` (in-process) waiting."""

    host: Host
    old: _SearchServerProcess
    first: Heartbeat
    successor: SearchServer
    beats: _Heartbeats


@pytest.fixture
async def handover(
    lab: NetworkLab,
    lab_zk: ZooKeeperEnsemble,
    lab_redis: RedisServer,
    redis_prefix: str,
    make_search_server: SearchServerFactory,
    tmp_path: Path,
) -> AsyncIterator[_Handover]:
    cluster = cluster_of(redis_prefix)
    host = lab.add_host("leader")
    old = _SearchServerProcess("ss-old", lab_zk.hosts, lab_redis.url, cluster, host, tmp_path)
    beats = _Heartbeats(lab_redis.url, redis_prefix)
    try:
        first = await eventually(lambda: beats.of("ss-old"), timeout=60, message="ss-old leads")
        successor = await make_search_server(
            server_id="ss-new", zk=lab_zk.hosts, redis_url=lab_redis.url
        )
        yield _Handover(host, old, first, successor, beats)
    finally:
        await beats.aclose()
        old.stop()


async def test_a_leader_cut_from_zookeeper_stops_publishing_before_its_session_expires(
    lab: NetworkLab, lab_zk: ZooKeeperEnsemble, handover: _Handover
) -> None:
    first, beats = handover.first, handover.beats
    cut_at_ms = time.time() * 1000
    lab.cut(handover.host, address=lab.gateway, port=_port_of(lab_zk.hosts))

    last_old_beat = first.at or 0
    deadline = time.monotonic() + 6 * SESSION_TIMEOUT
    new: Heartbeat | None = None
    while time.monotonic() < deadline:
        beat = await beats.current()
        if beat is not None and beat.leader == "ss-old" and beat.epoch == first.epoch:
            last_old_beat = max(last_old_beat, beat.at or 0)
        if beat is not None and beat.leader == "ss-new":
            new = beat
            break
        await asyncio.sleep(0.02)  # ok-sleep: the sampling interval of a bounded watch
    assert new is not None, "no successor within the bound"
    assert (new.epoch or 0) > (first.epoch or 0)
    # Its lease (half a session timeout from the last answer it had, which came before
    # the cut) ran out: its last heartbeat came well before ZooKeeper could expire its
    # session. The 100 ms are for stamping the write after the check.
    assert last_old_beat - cut_at_ms < SESSION_TIMEOUT * 1000 / 2 + 100, last_old_beat - cut_at_ms
    print(
        f"old leader's last heartbeat {last_old_beat - cut_at_ms:.0f} ms after the cut; "
        f"successor epoch {new.epoch} > {first.epoch}"
    )

    lab.heal_all()

    # Back on the network, the old leader follows the new one and writes nothing.
    async def follows_new() -> bool:
        status, view = await get_json(f"{handover.old.url}/cluster")
        return status == 200 and view["leader"] == "ss-new" and not view["is_leader"]

    await eventually(follows_new, timeout=30, message="ss-old follows ss-new")
    assert await beats.of("ss-new") is not None
    assert handover.successor.is_leader


async def test_search_servers_cut_from_one_data_server_eject_it_and_never_wait_past_deadlines(
    lab: NetworkLab,
    lab_zk: ZooKeeperEnsemble,
    lab_redis: RedisServer,
    data_servers: list[_DataServerProcess],
    make_search_server: SearchServerFactory,
    tmp_path: Path,
) -> None:
    victim_host, victim = _victim_and_twin("ds-unreachable", lab, lab_zk, tmp_path, data_servers)
    deadline_ms = 300
    search = await make_search_server(
        server_id="ss-lab",
        zk=lab_zk.hosts,
        redis_url=lab_redis.url,
        default_timeout_ms=deadline_ms,
        eject_after=2,
    )
    both = {"ds-unreachable", "ds-twin"}
    await eventually(lambda: live_ids(search) == both, timeout=60, message="both listed")

    # Only the search servers' traffic to its port: it still reaches ZooKeeper, and its
    # own health probe (over its loopback) still passes, so it stays registered.
    lab.cut(victim_host, address=lab.gateway, port=victim.port, served=True)
    queries = sample_queries(100, variant=4)
    answers: list[tuple[bool, float]] = []  # (partial, seconds)
    for query in queries:
        started = time.monotonic()
        status, body = await get_json(f"{search.url}/search", q=query)
        answers.append((bool(body.get("partial", True)), time.monotonic() - started))
        assert status == 200
    slowest = max(seconds for _, seconds in answers)
    partial = [i for i, (is_partial, _) in enumerate(answers) if is_partial]
    # No query waited much past its deadline (the slack: a loaded 2-core machine).
    assert slowest < deadline_ms / 1000 + 0.5, slowest
    # Once ejected, every answer is complete: the partial ones all came first.
    assert len(partial) <= 5, partial
    assert all(not is_partial for is_partial, _ in answers[-50:])
    assert live_ids(search) == both  # ejected locally, not removed from the list
    print(f"{len(partial)} partial answers before the ejection; slowest {slowest * 1000:.0f} ms")


async def test_a_search_server_cut_from_redis_serves_its_last_list_and_catches_up(
    lab: NetworkLab,
    lab_zk: ZooKeeperEnsemble,
    lab_redis: RedisServer,
    redis_prefix: str,
    data_servers: list[_DataServerProcess],
    make_search_server: SearchServerFactory,
    tmp_path: Path,
) -> None:
    cluster = cluster_of(redis_prefix)
    data_servers.append(_DataServerProcess("ds-a", lab_zk.hosts, lab, tmp_path))
    leader = await make_search_server(
        server_id="ss-leader", zk=lab_zk.hosts, redis_url=lab_redis.url
    )
    host = lab.add_host("ss-cut")
    cut_off = _SearchServerProcess(
        "ss-cut",
        lab_zk.hosts,
        lab_redis.url,
        cluster,
        host,
        tmp_path,
        *("--no-leader-eligible", "--zk-fallback-after", "0.5"),
    )
    try:

        async def view() -> dict[str, object] | None:
            with contextlib.suppress(OSError, aiohttp.ClientError):
                status, body = await get_json(f"{cut_off.url}/cluster")
                if status == 200:
                    return body  # type: ignore[no-any-return]
            return None

        async def sees(ids: set[str], source: str) -> bool:
            current = await view()
            return (
                current is not None
                and current["source"] == source
                and {s["id"] for s in current["servers"]} == ids  # type: ignore[attr-defined]
            )

        await eventually(lambda: sees({"ds-a"}, "redis"), timeout=60, message="ss-cut follows")
        lab.cut(host, address=lab.gateway, port=_port_of(lab_redis.url.rsplit("/", 1)[0]))

        # It keeps answering from the list it has...
        for query in sample_queries(20, variant=5):
            status, body = await get_json(f"{cut_off.url}/search", q=query)
            assert status == 200
            assert body["partial"] is False
        # ...and with the fallback on, a server that joins meanwhile reaches it anyway.
        data_servers.append(_DataServerProcess("ds-b", lab_zk.hosts, lab, tmp_path))
        await eventually(lambda: live_ids(leader) == {"ds-a", "ds-b"}, timeout=60, message="ds-b")
        await eventually(
            lambda: sees({"ds-a", "ds-b"}, "zookeeper"), timeout=30, message="fallback sees ds-b"
        )

        lab.heal_all()
        await eventually(
            lambda: sees({"ds-a", "ds-b"}, "redis"), timeout=30, message="back on the live list"
        )
        caught_up = await view()
        assert caught_up is not None
        assert leader.reader is not None
        assert caught_up["version"] == leader.reader.current.version
    finally:
        cut_off.stop()


async def test_a_leader_cut_from_redis_only_hands_over_to_one_that_reaches_it(
    lab: NetworkLab, lab_redis: RedisServer, handover: _Handover
) -> None:
    heartbeat_ttl = 2.0  # what _SearchServerProcess and make_search_server use
    cut_at = time.monotonic()
    lab.cut(handover.host, address=lab.gateway, port=_port_of(lab_redis.url.rsplit("/", 1)[0]))
    # ZooKeeper is fine for ss-old: only its own resignation lets ss-new lead.
    new = await eventually(
        lambda: handover.beats.of("ss-new"), timeout=6 * heartbeat_ttl, message="ss-new leads"
    )
    handed_over = time.monotonic() - cut_at
    assert (new.epoch or 0) > (handover.first.epoch or 0)
    assert handover.successor.is_leader
    print(f"ss-new publishes {handed_over:.2f}s after ss-old was cut from Redis")


async def test_a_zookeeper_server_cut_from_its_peers_loses_its_clients_to_the_quorum(
    lab: NetworkLab, tmp_path: Path
) -> None:
    hosts = [lab.add_host(f"zk{i + 1}") for i in range(3)]
    ensemble = ZooKeeperEnsemble(
        3,
        tmp_path / "zk",
        tick_time_ms=TICK_TIME_MS,
        server_hosts=[h.address for h in hosts],
        launchers=[h.wrap([]) for h in hosts],
    )
    ensemble.start()
    isolated = ensemble.servers[0]
    others = ",".join(s.address for s in ensemble.servers[1:])
    # Several times the isolated server, so that most clients start on it (kazoo
    # shuffles the list); the others are listed too, for the clients to move to.
    connect = f"{repeat_host(isolated.address)},{others}"
    # Longer than a follower needs to notice it lost the quorum (syncLimit, 5 s here):
    # until then it holds its clients, and their sessions must outlive that.
    zk = ZkConfig(hosts=connect, session_timeout=10.0, connect_timeout=30)
    try:
        async with agent_fleet(8, zk, name="zk-peers-fleet", base_port=9500) as agents:
            for agent in agents:
                await eventually(lambda a=agent: a.status().registered, message="registered")
            sessions = {a.instance.id: a.session.session_id for a in agents if a.session}
            on_isolated = _client_count(isolated)
            assert on_isolated > 0, "no client started on the server to isolate"

            for peer in hosts[1:]:
                lab.cut(hosts[0], address=peer.address)
            # It stops serving, its clients reconnect to the quorum side in their sessions.
            await eventually(lambda: isolated.mode() is None, timeout=30, message="isolated")
            await eventually(
                lambda: all(a.session is not None and a.session.connected for a in agents),
                timeout=30,
                message="every client connected again",
            )
            assert {a.instance.id: a.session.session_id for a in agents if a.session} == sessions
            assert all(a.status().registered for a in agents)
            assert _client_count(isolated) == 0
            print(f"{on_isolated} clients moved from the isolated server, no session lost")
    finally:
        ensemble.stop()


def _client_count(server: ZooKeeperServer) -> int:
    try:
        answer = four_letter_word(server.client_port, "cons", server.address.rsplit(":", 1)[0])
    except OSError:
        return 0
    return sum(1 for line in answer.splitlines() if "sid=" in line)
