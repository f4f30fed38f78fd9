"""The dev cluster runs real ZooKeeper and redis-server processes and never leaves one behind.

Every test starts its own servers in ``tmp_path`` and checks, by pid, that they are gone
afterwards. Waiting is always a poll of a condition with a deadline. The tests that start
ZooKeeper or Redis are marked ``integration``; the others (arguments, ports, a stand-in
process) are in ``make test-fast``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis
from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError

from discovery.errors import DevClusterError
from discovery.testing import (
    DevCluster,
    RedisServer,
    ZooKeeperEnsemble,
    ZooKeeperServer,
    free_ports,
)
from discovery.testing.process import ManagedProcess
from discovery.testing.redis import redis_ping
from discovery.testing.zookeeper import four_letter_word
from tests.support import REPO_ROOT

T = TypeVar("T")

REPO_ROOT = REPO_ROOT
# Reconnect quickly after a server goes away instead of kazoo's exponential back-off.
FAST_RECONNECT: dict[str, Any] = {"max_tries": -1, "delay": 0.1, "backoff": 1, "max_delay": 0.5}


def wait_until(
    probe: Callable[[], T], *, timeout: float = 30.0, interval: float = 0.05, what: str
) -> T:
    """Poll ``probe`` until it returns a truthy value, and return it; fail at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached within {timeout} s (last: {value!r})")
        time.sleep(interval)  # ok-sleep: the polling interval of a deadline-bounded wait


def pid_alive(pid: int) -> bool:
    """True if ``pid`` exists, zombies included (an unreaped child is a leak too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def assert_gone(pids: list[int]) -> None:
    assert pids, "no pids to check"
    wait_until(
        lambda: not any(pid_alive(pid) for pid in pids),
        timeout=10.0,
        what=f"processes {pids} are gone",
    )


@contextlib.contextmanager
def kazoo_client(hosts: str) -> Iterator[KazooClient]:
    # A short session timeout also bounds kazoo's connect timeout, which a connection
    # accepted by a server still starting up would otherwise wait out for 10 s.
    client = KazooClient(hosts=hosts, timeout=4.0, connection_retry=FAST_RECONNECT)
    client.start(timeout=30.0)
    try:
        yield client
    finally:
        client.stop()
        client.close()


def try_create(client: KazooClient, path: str, value: bytes) -> bool:
    """Create ``path``; True if it exists afterwards, False on a transient ZooKeeper error."""
    try:
        client.create(path, value, makepath=True)
    except NodeExistsError:
        return True  # an earlier attempt succeeded but its reply was lost
    except KazooException:
        return False
    return True


def try_get(client: KazooClient, path: str) -> bytes | None:
    try:
        value: bytes = client.get(path)[0]
    except NoNodeError:
        return None
    except KazooException:
        return None
    return value


def test_free_ports_are_distinct() -> None:
    ports = free_ports(20)
    assert len(set(ports)) == 20
    assert all(1024 <= port <= 65535 for port in ports)


class StubbornProcess(ManagedProcess):
    """A process that says "ready" (or "busy") and then waits, maybe ignoring SIGTERM."""

    def __init__(self, workdir: Path, *, ready: bool, ignore_sigterm: bool) -> None:
        super().__init__("stubborn", workdir, workdir / "stubborn.log")
        self._ready = ready
        self._ignore_sigterm = ignore_sigterm

    def _command(self) -> list[str]:
        script = (
            f"import signal; ignore = {self._ignore_sigterm}; "
            "ignore and signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            f"print({'ready' if self._ready else 'busy'!r}, flush=True); signal.pause()"
        )
        return [sys.executable, "-c", script]

    def _probe(self) -> bool:
        # Whole lines only: the log also starts with the command line, which says "ready".
        return self.log_path.is_file() and "ready" in self.log_path.read_text().splitlines()


def test_stop_kills_a_process_that_ignores_sigterm(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    process = StubbornProcess(tmp_path, ready=True, ignore_sigterm=True)
    process.start(timeout=30.0)
    pid = process.pid
    assert pid is not None
    with caplog.at_level(logging.WARNING, logger="discovery.testing.ports"):
        process.stop(timeout=0.5)
    assert "ignored SIGTERM" in caplog.text
    assert not process.running
    assert_gone([pid])


def test_start_that_times_out_stops_the_process(tmp_path: Path) -> None:
    process = StubbornProcess(tmp_path, ready=False, ignore_sigterm=False)
    with pytest.raises(DevClusterError, match=r"not ready within 0\.5 s(.|\n)*\nbusy"):
        process.start(timeout=0.5)
    assert not process.running
    assert process.pid is None


@pytest.mark.integration
def test_standalone_server_serves_a_kazoo_client(tmp_path: Path) -> None:
    server = ZooKeeperServer(tmp_path / "zk")
    try:
        server.start()
        assert server.running
        assert server.mode() == "standalone"
        assert server.address == f"127.0.0.1:{server.client_port}"
        assert "imok" in four_letter_word(server.client_port, "ruok")
        with kazoo_client(server.address) as client:
            client.create("/hello", b"world")
            assert client.get("/hello")[0] == b"world"
        pid = server.pid
        assert pid is not None
    finally:
        server.stop()
    assert not server.running
    assert server.pid is None
    assert_gone([pid])
    server.stop()  # idempotent


@pytest.mark.integration
def test_restart_keeps_data_and_address(tmp_path: Path) -> None:
    server = ZooKeeperServer(tmp_path / "zk")
    try:
        server.start()
        address, first_pid = server.address, server.pid
        with kazoo_client(server.address) as client:
            client.create("/kept", b"before restart")
            server.restart()
            assert server.address == address
            assert server.pid != first_pid
            # The same client reconnects to the same address and finds the node.
            assert wait_until(
                lambda: try_get(client, "/kept"), what="node readable after restart"
            ) == (b"before restart")
        with kazoo_client(server.address) as fresh:
            assert fresh.get("/kept")[0] == b"before restart"
        second_pid = server.pid
    finally:
        server.stop()
    assert first_pid is not None
    assert second_pid is not None
    assert_gone([first_pid, second_pid])


@pytest.mark.integration
def test_ensemble_keeps_serving_with_one_server_down(tmp_path: Path) -> None:
    ensemble = ZooKeeperEnsemble(3, tmp_path / "ensemble")
    pids: list[int] = []
    try:
        ensemble.start()
        assert ensemble.hosts == ",".join(s.address for s in ensemble.servers)
        assert len(ensemble.hosts.split(",")) == 3
        pids += [pid for s in ensemble.servers if (pid := s.pid) is not None]
        modes = sorted(str(s.mode()) for s in ensemble.servers)
        assert modes == ["follower", "follower", "leader"]
        leader = next(i for i, s in enumerate(ensemble.servers) if s.mode() == "leader")

        with kazoo_client(ensemble.hosts) as client:
            client.create("/quorum/before", b"1", makepath=True)
            # Losing the leader is the harder case: the other two must elect a new one.
            ensemble.stop_server(leader)
            assert not ensemble.servers[leader].running
            wait_until(
                lambda: try_create(client, "/quorum/during", b"2"),
                what="write with one server down",
            )
            survivors = [s for i, s in enumerate(ensemble.servers) if i != leader]
            assert sorted(str(s.mode()) for s in survivors) == ["follower", "leader"]

            ensemble.start_server(leader)
            restarted = ensemble.servers[leader]
            assert restarted.running
            assert restarted.mode() in {"follower", "leader"}
            pids += [pid for pid in [restarted.pid] if pid is not None]

        # The restarted server caught up with what was written while it was down.
        with kazoo_client(restarted.address) as direct:
            assert wait_until(
                lambda: try_get(direct, "/quorum/during"), what="restarted server has the write"
            ) == (b"2")
    finally:
        ensemble.stop()
    assert not any(s.running for s in ensemble.servers)
    assert_gone(pids)


def test_ensemble_rejects_two_servers(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="3 or more"):
        ZooKeeperEnsemble(2, tmp_path)
    with pytest.raises(ValueError, match="data directory per server"):
        ZooKeeperEnsemble(3, tmp_path, data_dirs=[tmp_path / "one"])
    with pytest.raises(ValueError, match="pre_alloc_kb"):
        ZooKeeperServer(tmp_path / "zk", pre_alloc_kb=0)


@pytest.mark.integration
def test_a_server_keeps_its_data_where_it_is_told(tmp_path: Path) -> None:
    # The chaos run's disk fault puts each server's data on a small filesystem of its own
    # and makes the log grow in small steps, so that a full disk refuses the next write.
    disk = tmp_path / "disk"
    server = ZooKeeperServer(tmp_path / "zk", data_dir=disk, pre_alloc_kb=4)
    try:
        server.start()
        config = server.config_path.read_text(encoding="utf-8").splitlines()
        assert f"dataDir={disk}" in config
        assert "preAllocSize=4" in config
        assert "autopurge.purgeInterval=1" in config
        with kazoo_client(server.address) as client:
            client.create("/kept", b"x" * 1000)
        logs = list(disk.rglob("log.*"))
        assert logs, "no transaction log in the given data directory"
        assert all(log.stat().st_size < 64 * 1024 for log in logs)  # not 4 MiB, nor 64
        assert not (tmp_path / "zk" / "data").exists()
    finally:
        server.stop()


@pytest.mark.integration
def test_server_that_cannot_run_reports_its_log_and_is_reaped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ZOOKEEPER_CLASSPATH", str(tmp_path / "missing.jar"))
    server = ZooKeeperServer(tmp_path / "zk")
    with pytest.raises(DevClusterError, match="exited with code") as excinfo:
        server.start(timeout=30.0)
    # The JVM's own complaint is in the message, from the server's log.
    assert "ZooKeeperServerMain" in str(excinfo.value)
    assert not server.running
    assert server.pid is None


def test_missing_java_names_make_setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAVA", str(tmp_path / "no-such-java"))
    with pytest.raises(DevClusterError, match="make setup"):
        ZooKeeperServer(tmp_path / "zk").start()


@pytest.mark.integration
def test_redis_server_ping_and_restart(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis")
    try:
        server.start()
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        assert redis_ping(server.port)
        first_pid = server.pid
        client = redis.Redis.from_url(server.url, socket_timeout=5.0)
        try:
            client.set("key", "value")
            assert client.get("key") == b"value"
            server.restart()
            assert server.pid != first_pid
            assert server.url == f"redis://127.0.0.1:{server.port}/0"
            assert wait_until(lambda: _ping(client), what="redis-py reconnects")
            assert client.get("key") is None  # persistence is off by design
        finally:
            client.close()
        second_pid = server.pid
    finally:
        server.stop()
    server.stop()  # idempotent
    assert not server.running
    assert not redis_ping(server.port)
    assert first_pid is not None
    assert second_pid is not None
    assert_gone([first_pid, second_pid])


def _ping(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


@pytest.mark.integration
def test_dev_cluster_context_manager_cleans_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The scratch directory goes under tmp_path, so a failure leaves nothing in /tmp.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with DevCluster(tick_time_ms=200) as cluster:
        info = cluster.info()
        workdir = Path(info["workdir"])
        assert workdir.is_dir()
        assert workdir.parent == tmp_path
        assert info["zk"] == cluster.zk.hosts
        assert info["redis"] == cluster.redis.url
        assert info["zk_nodes"] == 1
        assert info["tick_time_ms"] == 200
        assert set(info["pids"]) == {"zk1", "redis"}
        json.dumps(info)  # must be JSON-serialisable for `devcluster --json`
        with kazoo_client(info["zk"]) as client:
            client.create("/dev", b"ok")
        assert redis_ping(cluster.redis.port)
    assert not workdir.exists()
    assert_gone(list(info["pids"].values()))
    cluster.stop()  # idempotent


@pytest.mark.integration
def test_dev_cluster_keeps_a_given_workdir(tmp_path: Path) -> None:
    workdir = tmp_path / "kept"
    with DevCluster(workdir) as cluster:
        pids = list(cluster.info()["pids"].values())
    assert (workdir / "zookeeper" / "zk1" / "zookeeper.log").is_file()
    assert (workdir / "redis" / "redis.log").is_file()
    assert_gone(pids)


@pytest.mark.integration
def test_dev_cluster_failed_start_stops_what_had_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Redis is launched first, then ZooKeeper fails: Redis must not be left running.
    monkeypatch.setenv("ZOOKEEPER_CLASSPATH", str(tmp_path / "missing.jar"))
    cluster = DevCluster(tmp_path / "cluster")
    with pytest.raises(DevClusterError):
        cluster.start()
    assert not cluster.running
    redis_log = (tmp_path / "cluster" / "redis" / "redis.log").read_text()
    redis_pid = int(redis_log.split("pid=", 1)[1].split(",", 1)[0])
    assert_gone([redis_pid])
    with pytest.raises(DevClusterError, match="not started"):
        cluster.info()


# -- the `discovery devcluster` command ----------------------------------------------------


def cli_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env["TMPDIR"] = str(tmp_path)  # the command's scratch directory lands here
    env.pop("DISCOVERY_DEV_ZK_NODES", None)
    env.pop("DISCOVERY_DEV_TICK_MS", None)
    env.pop("DISCOVERY_DEV_DIR", None)
    env.update(extra)
    return env


@contextlib.contextmanager
def devcluster_process(tmp_path: Path, *args: str, **env: str) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "discovery.tools.main", "devcluster", *args],
        cwd=tmp_path,
        env=cli_env(tmp_path, **env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=(tmp_path / "cli.stderr").open("w"),
        text=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            # Only reached when the test failed: give the command a chance to clean up.
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()


def read_line(proc: subprocess.Popen[str], tmp_path: Path, timeout: float = 60.0) -> str:
    assert proc.stdout is not None
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        line = pool.submit(proc.stdout.readline).result(timeout)
    except TimeoutError:
        stderr = (tmp_path / "cli.stderr").read_text()
        raise AssertionError(
            f"timed out after {timeout:g}s waiting for a line from devcluster; stderr:\n{stderr}"
        ) from None
    finally:
        # Not waiting for a readline that hangs: ending the process ends it.
        pool.shutdown(wait=False)
    stderr = (tmp_path / "cli.stderr").read_text()
    assert line, f"no output; exit code {proc.poll()}; stderr:\n{stderr}"
    return line


@pytest.mark.integration
def test_cli_json_serves_until_sigterm(tmp_path: Path) -> None:
    with devcluster_process(tmp_path, "--json") as proc:
        info = json.loads(read_line(proc, tmp_path))
        zk_port = int(info["zk"].rsplit(":", 1)[1])
        redis_port = int(info["redis"].rsplit(":", 1)[1].split("/")[0])
        workdir = Path(info["workdir"])
        assert workdir.parent == tmp_path
        assert info["zk_nodes"] == 1
        assert info["tick_time_ms"] == 500
        assert "Mode: standalone" in four_letter_word(zk_port, "srvr")
        assert redis_ping(redis_port)

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert proc.stdout is not None
        assert proc.stdout.read() == ""  # one JSON line, nothing else on stdout
    assert_gone(list(info["pids"].values()))
    assert not workdir.exists()
    assert not redis_ping(redis_port)


@pytest.mark.integration
def test_cli_human_output_and_sigint_keep_given_dir(tmp_path: Path) -> None:
    workdir = tmp_path / "dev"
    # A relative --dir (the command runs in tmp_path) must work despite the servers' own cwd.
    with devcluster_process(tmp_path, "--dir", "dev", "--tick-time", "200") as proc:
        lines: list[str] = []
        while not lines or not lines[-1].startswith("Press Ctrl+C"):
            lines.append(read_line(proc, tmp_path).rstrip("\n"))
        exports = dict(
            line.removeprefix("export ").split("=", 1)
            for line in lines
            if line.startswith("export ")
        )
        assert set(exports) == {"DISCOVERY_ZK_HOSTS", "DISCOVERY_REDIS_URL"}
        zk_port = int(exports["DISCOVERY_ZK_HOSTS"].rsplit(":", 1)[1])
        assert "Mode: standalone" in four_letter_word(zk_port, "srvr")
        pids = [
            int(line.split("pid=", 1)[1].split(",", 1)[0])
            for line in (workdir / "redis" / "redis.log").read_text().splitlines()
            if "pid=" in line
        ]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    assert workdir.is_dir()  # a directory given with --dir is kept
    assert_gone(pids)


@pytest.mark.parametrize(
    ("args", "env", "flag"),
    [
        (["--zk-nodes", "2"], {}, "--zk-nodes"),
        (["--zk-nodes", "three"], {}, "--zk-nodes"),
        (["--tick-time", "0"], {}, "--tick-time"),
        ([], {"DISCOVERY_DEV_ZK_NODES": "4"}, "DISCOVERY_DEV_ZK_NODES"),
        ([], {"DISCOVERY_DEV_TICK_MS": "fast"}, "DISCOVERY_DEV_TICK_MS"),
    ],
)
def test_cli_rejects_bad_values(
    args: list[str],
    env: dict[str, str],
    flag: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from discovery.tools.main import main

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as excinfo:
        main(["devcluster", *args])
    assert excinfo.value.code == 2
    assert flag in capsys.readouterr().err


@pytest.mark.integration
def test_cli_startup_failure_exits_1_and_cleans_up(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "discovery.tools.main", "devcluster", "--json"],
        cwd=tmp_path,
        env=cli_env(tmp_path, ZOOKEEPER_CLASSPATH=str(tmp_path / "missing.jar")),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert result.stdout == ""
    assert "discovery devcluster: error:" in result.stderr
    assert "exited with code" in result.stderr
    assert not list(tmp_path.glob("discovery-devcluster-*"))  # scratch dir removed
