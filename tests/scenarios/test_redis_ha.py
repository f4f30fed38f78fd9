"""Redis high availability as the fixtures run it: Sentinel groups and a Redis Cluster.

Every test starts real ``redis-server`` processes (primaries, replicas, sentinels, cluster
nodes) in ``tmp_path``, drives them with redis-py's own Sentinel and Cluster clients, and
checks by pid that nothing is left running. Waiting is always a poll of a condition with
a deadline; blocking fixture calls run in a thread so the event loop stays free.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import ExponentialBackoff
from redis.exceptions import RedisClusterException

from discovery.config import RedisConfig
from discovery.errors import DevClusterError
from discovery.testing import DevCluster, RedisClusterServers, RedisSentinelGroup
from discovery.testing.redis import RedisServer, redis_ping
from discovery.testing.rediscluster import CLUSTER_SLOTS, cluster_ports
from discovery.testing.sentinel import DEFAULT_DOWN_AFTER_MS
from tests.support import REPO_ROOT, eventually

REPO_ROOT = REPO_ROOT
DOWN_AFTER_MS = DEFAULT_DOWN_AFTER_MS


# -- helpers -------------------------------------------------------------------------------


def pid_alive(pid: int) -> bool:
    """True if ``pid`` exists, zombies included (an unreaped child is a leak too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def assert_gone(pids: Sequence[int | None]) -> None:
    alive = [pid for pid in pids if pid is not None]
    assert alive, "no pids to check"
    deadline = time.monotonic() + 10.0
    while any(pid_alive(pid) for pid in alive):
        assert time.monotonic() < deadline, f"processes {alive} still exist"
        time.sleep(0.05)  # ok-sleep: the period of a deadline-bounded poll


def sync_client(address: tuple[str, int], *, decode: bool = False) -> redis.Redis:
    return redis.Redis(
        host=address[0], port=address[1], socket_timeout=5.0, decode_responses=decode
    )


def get(address: tuple[str, int], key: str) -> bytes | None:
    """GET on one server (a replica serves reads too); None if it does not answer."""
    client = sync_client(address)
    try:
        value = client.get(key)
        assert value is None or isinstance(value, bytes)
        return value
    except redis.RedisError:
        return None
    finally:
        client.close()


def has(address: tuple[str, int], key: str, value: bytes) -> Callable[[], bool]:
    """A probe: ``key`` holds ``value`` on that server."""
    return lambda: get(address, key) == value


def role(address: tuple[str, int]) -> dict[str, Any]:
    client = sync_client(address)
    try:
        info: dict[str, Any] = client.info("replication")
        return info
    finally:
        client.close()


def sentinel_views(group: RedisSentinelGroup) -> set[tuple[str, int]]:
    """The primary's address as each sentinel reports it."""
    views = set()
    for address in group.sentinel_addresses:
        client = sync_client(address, decode=True)
        try:
            reply = client.sentinel_get_master_addr_by_name(group.master_name)
        finally:
            client.close()
        assert isinstance(reply, tuple | list), reply
        views.add((str(reply[0]), int(reply[1])))
    return views


def sentinel_client(group: RedisSentinelGroup) -> tuple[Sentinel, aioredis.Redis]:
    """redis-py's asyncio Sentinel client and a primary client that retries a command on
    a new connection (resolved anew through the sentinels) when its link breaks."""
    sentinel = Sentinel(group.sentinel_addresses, socket_timeout=2.0)  # type: ignore[no-untyped-call]
    client = sentinel.master_for(
        group.master_name,
        socket_timeout=2.0,
        retry=Retry(ExponentialBackoff(cap=0.2, base=0.02), 5),
    )
    return sentinel, client


async def close_sentinel(sentinel: Sentinel, client: aioredis.Redis) -> None:
    await client.aclose()
    for connection in sentinel.sentinels:
        await connection.aclose()


def try_set(client: aioredis.Redis, key: str, value: str) -> Callable[[], Any]:
    async def attempt() -> bool:
        try:
            return bool(await client.set(key, value))
        except redis.RedisError:
            return False

    return attempt


# -- Sentinel ------------------------------------------------------------------------------


def test_sentinel_group_rejects_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="sentinels"):
        RedisSentinelGroup(tmp_path, sentinels=0)
    with pytest.raises(ValueError, match="replicas"):
        RedisSentinelGroup(tmp_path, replicas=-1)
    with pytest.raises(ValueError, match="quorum"):
        RedisSentinelGroup(tmp_path, sentinels=3, quorum=4)
    with pytest.raises(ValueError, match="master_name"):
        RedisSentinelGroup(tmp_path, master_name="my/master")
    with pytest.raises(ValueError, match="configuration directive"):
        RedisServer(tmp_path, config=["save ''\nappendonly yes"])


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_failed_start_stops_the_data_servers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The data servers are up when the sentinels cannot start: none may be left running.
    monkeypatch.setenv("REDIS_SENTINEL", str(tmp_path / "no-such-sentinel"))
    group = RedisSentinelGroup(tmp_path / "ha", replicas=1, sentinels=1)
    with pytest.raises(DevClusterError, match="REDIS_SENTINEL"):
        group.start()
    assert not group.running
    assert set(group.pids.values()) == {None}
    pids = [
        int(line.split("pid=", 1)[1].split(",", 1)[0])
        for server in group.servers
        for line in server.log_path.read_text().splitlines()
        if "pid=" in line
    ]
    assert len(pids) == 2
    assert_gone(pids)


@pytest.mark.integration
@pytest.mark.timeout(90)
@pytest.mark.smoke
async def test_sentinel_group_replicates_and_fails_over(tmp_path: Path) -> None:
    group = RedisSentinelGroup(tmp_path / "ha", down_after_ms=DOWN_AFTER_MS)
    hosts = ",".join(f"{h}:{p}" for h, p in group.sentinel_addresses)
    assert group.sentinel_url() == f"redis+sentinel://{hosts}/mymaster/0"
    assert group.sentinel_url(db=3).endswith("/mymaster/3")
    await asyncio.to_thread(group.start)
    pids = list(group.pids.values())
    sentinel, client = sentinel_client(group)
    try:
        assert group.running
        assert len(group.servers) == 3
        assert len(group.sentinel_addresses) == 3
        first = group.primary
        assert first is group.servers[0]
        old = (first.host, first.port)
        assert sentinel_views(group) == {old}

        # A write to the primary reaches every replica.
        assert await client.set("before", "1")
        for replica in group.replicas:
            address = (replica.host, replica.port)
            assert role(address)["role"] == "slave"
            await eventually(has(address, "before", b"1"), message="replicated")

        new = await asyncio.to_thread(group.failover)
        assert new != old
        assert sentinel_views(group) == {new}
        assert role(new)["role"] == "master"
        assert (group.primary.host, group.primary.port) == new
        assert await sentinel.discover_master(group.master_name) == new

        # The sentinels turn the old primary into a replica a few seconds later and
        # disconnect its clients; redis-py's Sentinel client then reconnects to the new one.
        await asyncio.to_thread(group.wait_replicated)
        assert role(old)["role"] == "slave"
        await eventually(try_set(client, "after", "2"), message="SET through the sentinels")
        assert get(new, "after") == b"2"
        assert get(new, "before") == b"1"
    finally:
        await close_sentinel(sentinel, client)
        group.stop()
    assert not group.running
    group.stop()  # idempotent
    assert_gone(pids)


@pytest.mark.integration
@pytest.mark.timeout(90)
async def test_killed_primary_is_replaced_and_rejoins_as_a_replica(tmp_path: Path) -> None:
    group = RedisSentinelGroup(tmp_path / "ha", down_after_ms=DOWN_AFTER_MS)
    await asyncio.to_thread(group.start)
    pids = list(group.pids.values())
    sentinel, client = sentinel_client(group)
    try:
        assert await client.set("kept", "yes")
        await asyncio.to_thread(group.wait_replicated)
        for replica in group.replicas:
            address = (replica.host, replica.port)
            await eventually(has(address, "kept", b"yes"), message="replicated")

        killed = await asyncio.to_thread(group.kill_primary)
        assert not killed.running
        assert killed.pid is None
        assert not redis_ping(killed.port)
        old = (killed.host, killed.port)

        # Raises if no new primary comes within the bound: one exists.
        new = await asyncio.to_thread(group.wait_for_new_primary, old, DOWN_AFTER_MS / 1000 + 10)
        assert new != old
        assert sentinel_views(group) == {new}

        # The client's connection died with the old primary; it finds the new one.
        await eventually(try_set(client, "after", "kill"), message="SET through the sentinels")
        assert get(new, "after") == b"kill"
        assert get(new, "kept") == b"yes"  # replicated before the crash, so not lost

        await asyncio.to_thread(group.restart, killed)
        assert killed.running
        info = role(old)
        assert info["role"] == "slave"
        assert (info["master_host"], info["master_port"]) == new
        assert info["master_link_status"] == "up"
        await eventually(has(old, "after", b"kill"), message="rejoined and synced")
        pids.append(killed.pid)
    finally:
        await close_sentinel(sentinel, client)
        group.stop()
    assert_gone(pids)


@pytest.mark.integration
@pytest.mark.timeout(60)
async def test_sentinel_group_with_a_password(tmp_path: Path) -> None:
    # Replicas authenticate to the primary and sentinels to every data server.
    secret = 'pass word "quoted" \\ back'
    group = RedisSentinelGroup(tmp_path / "ha", replicas=1, sentinels=1, password=secret)
    await asyncio.to_thread(group.start)
    pids = list(group.pids.values())
    try:
        old = (group.primary.host, group.primary.port)
        assert not redis_ping(old[1])  # no password, no answer
        assert redis_ping(old[1], password=secret)
        conf = group.sentinels[0].config_path.read_text()
        assert "sentinel auth-pass mymaster" in conf
        new = await asyncio.to_thread(group.failover)
        assert new != old
        client = redis.Redis(host=new[0], port=new[1], password=secret, socket_timeout=5.0)
        try:
            assert client.info("replication")["role"] == "master"
        finally:
            client.close()
    finally:
        group.stop()
    assert_gone(pids)


# -- Redis Cluster -------------------------------------------------------------------------


def test_cluster_ports_have_free_bus_ports() -> None:
    ports = cluster_ports(6)
    assert len(set(ports)) == 6
    assert all(port + 10000 <= 65535 for port in ports)
    assert not set(ports) & {port + 10000 for port in ports}
    with pytest.raises(ValueError, match="primaries"):
        RedisClusterServers(Path("unused"), primaries=2)


@pytest.mark.integration
@pytest.mark.timeout(90)
async def test_redis_cluster_forms_and_serves_keys_in_every_slot_range(tmp_path: Path) -> None:
    cluster = RedisClusterServers(tmp_path / "cluster", primaries=3)
    hosts = ",".join(f"{h}:{p}" for h, p in cluster.nodes)
    assert cluster.url == f"redis+cluster://{hosts}"
    await asyncio.to_thread(cluster.start)
    pids = list(cluster.pids.values())
    client = RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in cluster.nodes])
    try:
        assert cluster.running
        for server in cluster.servers:
            assert (server.workdir / "nodes.conf").is_file()
            node = sync_client((server.host, server.port))
            try:
                info = node.cluster("info")
            finally:
                node.close()
            assert info["cluster_state"] == "ok"
            assert int(info["cluster_slots_assigned"]) == CLUSTER_SLOTS

        # Keys spread over the three primaries.
        await client.initialize()
        keys = [f"key-{i}" for i in range(30)]
        owners = {client.get_node_from_key(key) for key in keys}
        assert {node.port for node in owners if node is not None} == {
            port for _, port in cluster.nodes
        }
        for key in keys:
            assert await client.set(key, key.upper())
        assert [await client.get(key) for key in keys] == [k.upper().encode() for k in keys]

        # A script may touch several keys when a hash tag puts them in one slot.
        script = "redis.call('SET', KEYS[1], ARGV[1]); return redis.call('INCR', KEYS[2])"
        assert await client.eval(script, 2, "{x}name", "{x}count", "first") == 1
        assert await client.eval(script, 2, "{x}name", "{x}count", "second") == 2
        assert await client.get("{x}name") == b"second"
        with pytest.raises(RedisClusterException, match="same"):
            await client.eval(script, 2, "key-1", "key-2", "crosses slots")
    finally:
        await client.aclose()
        cluster.stop()
    cluster.stop()  # idempotent
    assert_gone(pids)


# -- DevCluster and `discovery devcluster` ---------------------------------------------------


def test_dev_cluster_rejects_replicas_without_sentinels(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="sentinels"):
        DevCluster(tmp_path, redis_replicas=1)
    with pytest.raises(ValueError, match="redis_port"):
        DevCluster(tmp_path, sentinels=1, redis_port=6379)
    with pytest.raises(DevClusterError, match="no sentinels"):
        _ = DevCluster(tmp_path).redis_group


@pytest.mark.integration
@pytest.mark.timeout(90)
def test_dev_cluster_with_sentinels_starts_and_stops_everything(tmp_path: Path) -> None:
    with DevCluster(tmp_path / "dev", tick_time_ms=200, sentinels=3, redis_replicas=2) as cluster:
        info = cluster.info()
        group = cluster.redis_group
        assert info["redis"] == group.sentinel_url() == cluster.redis_url
        assert info["redis"].startswith("redis+sentinel://")
        assert info["redis"].endswith("/mymaster/0")
        assert info["redis_servers"] == [s.address for s in group.servers]
        assert info["sentinels"] == [f"{h}:{p}" for h, p in group.sentinel_addresses]
        assert info["redis_primary"] == group.servers[0].address
        assert set(info["pids"]) == {
            "zk1",
            *(f"redis-{i}" for i in (1, 2, 3)),
            *(f"sentinel-{i}" for i in (1, 2, 3)),
        }
        json.dumps(info)  # must be JSON-serialisable for `devcluster --json`
        assert cluster.running
        assert cluster.redis is group.servers[0]  # the primary, as the sentinels say
        assert redis_ping(cluster.redis.port)
        pids = list(info["pids"].values())
    assert not cluster.running
    assert (tmp_path / "dev" / "redis" / "sentinel-1" / "sentinel.log").is_file()
    assert_gone(pids)
    with pytest.raises(DevClusterError, match="not started"):
        _ = cluster.redis


def read_line(proc: subprocess.Popen[str], stderr: Path, timeout: float = 60.0) -> str:
    assert proc.stdout is not None
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        line = pool.submit(proc.stdout.readline).result(timeout)
    except TimeoutError:
        raise AssertionError(
            f"no line from devcluster within {timeout:g} s; stderr:\n{stderr.read_text()}"
        ) from None
    finally:
        pool.shutdown(wait=False)  # ending the process ends a readline that hangs
    assert line, f"no output; exit code {proc.poll()}; stderr:\n{stderr.read_text()}"
    return line


def cli_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISCOVERY_DEV_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env["TMPDIR"] = str(tmp_path)  # the command's scratch directory lands here
    return env


@pytest.mark.integration
@pytest.mark.timeout(90)
def test_cli_prints_a_sentinel_url_that_redis_accepts(tmp_path: Path) -> None:
    stderr = tmp_path / "cli.stderr"
    with stderr.open("w") as err:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "discovery.tools.main", "devcluster", "--json"),
                *("--sentinels", "3", "--redis-replicas", "1"),
            ],
            cwd=tmp_path,
            env=cli_env(tmp_path),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    try:
        info = json.loads(read_line(proc, stderr))
        url = info["redis"]
        assert url == f"redis+sentinel://{','.join(info['sentinels'])}/mymaster/0"
        RedisConfig().check_url(url)  # what `--redis` / DISCOVERY_REDIS_URL accepts
        assert len(info["redis_servers"]) == 2
        host, port = info["sentinels"][0].rsplit(":", 1)
        client = sync_client((host, int(port)), decode=True)
        try:
            primary = client.sentinel_get_master_addr_by_name("mymaster")
        finally:
            client.close()
        assert isinstance(primary, tuple | list), primary
        assert f"{primary[0]!s}:{primary[1]}" == info["redis_primary"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:  # only when the test failed: let the command clean up
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
    assert_gone(list(info["pids"].values()))
    assert not Path(info["workdir"]).exists()


def test_cli_refuses_replicas_without_sentinels(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "discovery.tools.main", "devcluster", "--redis-replicas", "2"],
        cwd=tmp_path,
        env=cli_env(tmp_path),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert "needs sentinels" in result.stderr
