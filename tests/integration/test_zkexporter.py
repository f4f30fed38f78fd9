"""``discovery zk-exporter`` against real ZooKeeper servers, and its parser's edges."""

from __future__ import annotations

import asyncio
import sys

import aiohttp
import pytest
from kazoo.client import KazooClient
from prometheus_client import CollectorRegistry

from discovery.testing import ZooKeeperEnsemble
from discovery.testing.ports import free_port
from discovery.tools.zkexporter import ZkExporter, parse_mntr, split_servers
from tests.support import eventually, reap, sample, waited

ANSWER = (
    "zk_version\t3.8.0-debian--1, built on 2023-01-17 10:31 UTC\n"
    "zk_server_state\tleader\n"
    "zk_avg_latency\t0.5\n"
    "zk_znode_count\t42\n"
    "zk_followers\t2\n"
)


def test_an_mntr_answer_becomes_numbers_and_words() -> None:
    reading = parse_mntr("zk1:2181", ANSWER)
    assert reading.up
    assert reading.numbers == {"avg_latency": 0.5, "znode_count": 42.0, "followers": 2.0}
    assert reading.words["server_state"] == "leader"
    assert reading.malformed == 0


def test_per_namespace_figures_get_the_namespace_as_a_label() -> None:
    # As ZooKeeper 3.8 prints them: any znode name, so not always a metric name.
    lines = [
        "zk_avg_test-a.b_write_per_namespace\t14.0",
        "zk_cnt_test-a.b_write_per_namespace\t2",
        "zk_max_x y_read_per_namespace\t82",
        "zk_sum_my_read_write_per_namespace\t28",
        "zk_cnt_plain_read_per_namespace\tnot-a-number",
    ]
    reading = parse_mntr("zk1:2181", ANSWER + "\n".join(lines) + "\n")
    assert reading.sets == {
        ("write_per_namespace", "test-a.b", "avg"): 14.0,
        ("write_per_namespace", "test-a.b", "cnt"): 2.0,
        ("read_per_namespace", "x y", "max"): 82.0,
        ("write_per_namespace", "my_read", "sum"): 28.0,
    }
    assert reading.malformed == 1
    # None of them becomes a metric name of its own.
    assert not any("namespace" in key for key in reading.numbers)


@pytest.mark.parametrize(
    "line",
    ["zk_no_tab 3", "zk_bad-name\t3", "not_zk\t3", "zk_nan\tnan", "zk_\t1"],
)
def test_a_malformed_line_is_skipped_and_counted(line: str) -> None:
    reading = parse_mntr("zk1:2181", ANSWER + line + "\n")
    assert reading.up
    assert reading.malformed == 1
    assert reading.numbers["znode_count"] == 42.0


@pytest.mark.parametrize(
    "answer",
    ["mntr is not executed because it is not in the whitelist.\n", "", "\n\n"],
)
def test_an_answer_that_is_not_mntr_is_an_error_not_an_empty_server(answer: str) -> None:
    reading = parse_mntr("zk1:2181", answer)
    assert not reading.up
    assert reading.error is not None
    assert "not an mntr answer" in reading.error


def test_hosts_are_split_like_kazoo_with_the_chroot_ignored() -> None:
    assert split_servers("a:1,b,[::1]:3/chroot/x") == [("a", 1), ("b", 2181), ("::1", 3)]
    for bad in ("", "/chroot", "a:port", "a:0", "a:70000", ":5"):
        with pytest.raises(ValueError, match=r"port|host|server"):
            split_servers(bad)


def _figure(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def _touch(hosts: str) -> None:
    """A write and a read under ``hosts`` (a chroot whose name has ``-``): ZooKeeper then
    reports figures for that top-level namespace."""
    client = KazooClient(hosts=hosts, timeout=10)
    client.start(timeout=15)
    try:
        client.ensure_path("/exporter")
        client.get("/exporter")
    finally:
        client.stop()
        client.close()


async def test_a_live_server_and_a_dead_port(zk_server: ZooKeeperEnsemble, zk_hosts: str) -> None:
    await asyncio.to_thread(_touch, zk_hosts)
    namespace = zk_hosts.split("/")[1]
    live = zk_server.servers[0]
    live_name = f"127.0.0.1:{live.client_port}"
    dead_port = free_port()
    dead_name = f"127.0.0.1:{dead_port}"
    registry = CollectorRegistry()
    async with ZkExporter(
        [("127.0.0.1", live.client_port), ("127.0.0.1", dead_port)],
        registry,
        interval=0.2,
        timeout=1.0,
    ):
        # Read once on entry: the first scrape already has figures.
        assert _figure(registry, "zookeeper_up", server=live_name) == 1.0
        assert _figure(registry, "zookeeper_up", server=dead_name) == 0.0
        state = _figure(registry, "zookeeper_server_state", server=live_name, state="standalone")
        assert state == 1.0
        assert (_figure(registry, "zookeeper_znode_count", server=live_name) or 0) > 0
        # The parser understands every line of a real server's answer, the per-namespace
        # ones included, whatever the shared server's other tests named their chroots.
        malformed = "zookeeper_exporter_malformed_lines_total"
        assert sample(registry, malformed, server=live_name) == 0
        writes = _figure(
            registry,
            "zookeeper_write_per_namespace",
            server=live_name,
            namespace=namespace,
            stat="cnt",
        )
        assert (writes or 0) >= 1
        # A dead server exports no stale figure, only that it is down, counted per poll.
        assert _figure(registry, "zookeeper_znode_count", server=dead_name) is None
        failures = "zookeeper_exporter_mntr_failures_total"
        await eventually(
            lambda: sample(registry, failures, server=dead_name) >= 2,
            message="the dead port polled again",
        )
        assert sample(registry, failures, server=live_name) == 0


async def test_a_stopped_ensemble_member_goes_down_and_comes_back(
    zk_ensemble: ZooKeeperEnsemble,
) -> None:
    ports = [s.client_port for s in zk_ensemble.servers]
    names = [f"127.0.0.1:{p}" for p in ports]
    registry = CollectorRegistry()

    def states() -> dict[str, str]:
        found = {}
        for metric in registry.collect():
            if metric.name == "zookeeper_server_state":
                for s in metric.samples:
                    found[s.labels["server"]] = s.labels["state"]
        return found

    async with ZkExporter([("127.0.0.1", p) for p in ports], registry, interval=0.2):
        await eventually(
            lambda: sorted(states().values()) == ["follower", "follower", "leader"],
            message="one leader and two followers",
        )
        leader = next(i for i, name in enumerate(names) if states()[name] == "leader")
        follower = (leader + 1) % 3
        await asyncio.to_thread(zk_ensemble.stop_server, follower)
        await eventually(
            lambda: _figure(registry, "zookeeper_up", server=names[follower]) == 0.0,
            message="the stopped member down",
        )
        assert names[follower] not in states()
        assert _figure(registry, "zookeeper_up", server=names[leader]) == 1.0
        assert _figure(registry, "zookeeper_znode_count", server=names[leader]) is not None
        await asyncio.to_thread(zk_ensemble.start_server, follower)
        await eventually(
            lambda: (
                _figure(registry, "zookeeper_up", server=names[follower]) == 1.0
                and states().get(names[follower]) == "follower"
            ),
            message="the member back as a follower",
        )


async def test_the_command_serves_metrics_and_names_a_bad_flag(
    zk_server: ZooKeeperEnsemble,
) -> None:
    bad = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "discovery.tools.main",
        "zk-exporter",
        "--zk",
        "host:notaport",
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await bad.communicate()
    assert bad.returncode == 2
    assert b"--zk" in err
    assert b"notaport" in err

    port = free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "discovery.tools.main",
        "zk-exporter",
        "--zk",
        zk_server.hosts + "/some/chroot",
        "--port",
        str(port),
        "--interval",
        "0.5",
        stdin=asyncio.subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}/metrics"

        async def scraped() -> str | None:
            try:
                async with aiohttp.ClientSession() as http, http.get(url) as response:
                    return await response.text() if response.status == 200 else None
            except aiohttp.ClientError:
                return None

        text = await eventually(scraped, timeout=30, message="/metrics answering")
        server = zk_server.servers[0]
        assert f'zookeeper_up{{server="127.0.0.1:{server.client_port}"}} 1.0' in text
        assert "zookeeper_znode_count" in text
        process.terminate()
        await waited(process.wait(), "the exporter to stop on SIGTERM", timeout=30)
        assert process.returncode == 0
    finally:
        if process.returncode is None:
            process.kill()
            await reap(process)
