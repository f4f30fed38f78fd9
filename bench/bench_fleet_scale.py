"""Search at fleet scale: one search server routing 50,000 data servers, against the
same search server routing 100 (the baseline), in one run.

Each case runs on a fresh local ZooKeeper and Redis (``DevCluster``) and a simulated
fleet in processes of its own (``python -m discovery.testing.simfleet``, 12,500 data
servers a process: every data server a registration and a loopback address of its
own, see that module):

* **fleet**: 50,000 data servers in 500 shards of 100 replicas (``--quick``: 10,000 in
  100 shards of 100);
* **baseline**: 100 data servers in 50 shards of 2 replicas.

For each case:

1. **One search server**, in this process, as one of 100: the leader runs in a
   process of its own, and 98 other members are registered under
   ``/search_servers/members`` (names only), so its subsets are those of a fleet of
   100 search servers (``--subset-size`` 8), and it holds what any search server
   holds (not the leader's own view of ZooKeeper).
   * *memory per replica*: its process's RSS once it routes with every data server
     and a warm-up has sent to its subsets, less its RSS before the fleet registered,
     over the data servers;
   * *CPU per sub-request*: this process's CPU time (``time.process_time``: every
     thread) over the sub-requests sent, while a load generator in another process
     sends queries at a fixed rate of sub-requests (``--subrequests-per-second``
     divided by the shards: the same sub-request rate in both cases);
   * *query p50/p99 and coverage* at that rate, from the load generator;
   * *sockets*: the connections the fleet has open (only this search server connects)
     and the replicas they go to, against shards x subset size;
   * *a change → the routing table updated*: ``--changes`` times, a data server's node
     is deleted (then created again) by a ZooKeeper session of this benchmark, timed
     from the write's return to the search server's routing table having followed it
     (``SearchServer.routed``), polled every half millisecond. The path is the whole
     of it: the leader's watch, its 50 ms window that coalesces changes, its write to
     Redis, the search server's follower and its routing table; the window is most of
     it in both cases, so the ratio is what the size adds.
2. **Three search servers**, each in a process of its own (``search-server``: the
   three hold some 51,000 sockets, more than one process may here), with no other
   members: each takes a third of each shard's ring (34 replicas, two of them cut by
   its arc's edges). The load generator spreads queries over them; the fleet counts
   each replica's
   requests. Every shard has the same ring (ids in order), so a place on it has the
   same share in every shard: reported is the highest place's count, summed over the
   shards, over the mean (its fair share), and, for what it is worth, the same for
   single replicas (a few requests each at 50,000: mostly sampling noise).

3. **Views**, of the one search server: ``/cluster`` (summary and first page), one
   shard's page, a state filter's page (a pass over every server), the dashboard's
   first event, ``discovery status`` in a process of its own, and the dashboard in
   headless Chromium (time until every shard's cell is drawn, element count, JS heap,
   a screenshot ``bench/results/dashboard-<shards>-shards.png``).

Bounds (the issue's): sockets ≤ shards x subset size; memory per replica ≤ 2 KB;
CPU per sub-request ≤ 1.2x the baseline's; routing update p99 ≤ 1.5x the baseline's;
highest share ≤ 1.3x fair; each ``/cluster`` view ≤ 100 ms. Prints tables and writes
``bench/results/fleet_scale.json``.

    .venv/bin/python bench/bench_fleet_scale.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import random
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
from common import ROOT, write_results
from prometheus_client import CollectorRegistry

from discovery.config import ClusterConfig, ZkConfig
from discovery.testing import DevCluster
from discovery.testing.simfleet import address_of, raise_open_files_limit
from discovery.zk.paths import DATA_SERVERS_PATH, SEARCH_MEMBERS_PATH
from discovery.zk.session import ZkSession
from search_server.config import SearchServerConfig
from search_server.server import SearchServer

log = logging.getLogger("bench_fleet_scale")
RESULTS = Path(__file__).resolve().parent / "results" / "fleet_scale.json"
SCRIPT = str(Path(__file__).resolve())
SESSION_TIMEOUT = 30.0
CHROMIUM = "/usr/bin/chromium"
SUBSET = 8
FLEET_SEARCH_SERVERS = 100
#: Most simulated servers in one fleet process (see Fleet).
FLEET_PART = 12_500
BOUNDS = {
    "memory_per_replica_bytes": 2048,
    "cpu_ratio": 1.2,
    "routing_p99_ratio": 1.5,
    "share_over_fair": 1.3,
    "view_ms": 100.0,
}


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else 0.0


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


# -- the load generator (its own process) --------------------------------------------


async def _loadgen(
    targets: list[str], rate: float, seconds: float, timeout_ms: int
) -> dict[str, Any]:
    """Open loop: a query every 1/rate seconds, round-robin over ``targets``."""
    latencies: list[float] = []
    coverage: list[float] = []
    outcomes = {"complete": 0, "partial": 0, "error": 0}
    loop = asyncio.get_running_loop()
    pending: set[asyncio.Task[None]] = set()

    async def one(session: aiohttp.ClientSession, target: str, n: int) -> None:
        started = loop.time()
        try:
            async with session.get(
                f"{target}/search",
                params={"q": f"term{n % 97}", "k": "10", "timeout_ms": str(timeout_ms)},
            ) as response:
                body = await response.json()
            if response.status != 200:
                outcomes["error"] += 1
                return
        except (aiohttp.ClientError, TimeoutError, ValueError):
            outcomes["error"] += 1
            return
        latencies.append((loop.time() - started) * 1000)
        outcomes["partial" if body["partial"] else "complete"] += 1
        coverage.append(body["coverage"]["percent"])

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        start = loop.time()
        n = 0
        while loop.time() - start < seconds:
            task = asyncio.create_task(one(session, targets[n % len(targets)], n))
            pending.add(task)
            task.add_done_callback(pending.discard)
            n += 1
            await asyncio.sleep(max(0.0, start + n / rate - loop.time()))
        if pending:
            await asyncio.gather(*pending)
    return {
        "queries": n,
        **outcomes,
        "p50_ms": round(_pct(latencies, 0.5), 2),
        "p99_ms": round(_pct(latencies, 0.99), 2),
        "coverage_mean_percent": round(statistics.fmean(coverage), 3) if coverage else None,
        "coverage_min_percent": min(coverage) if coverage else None,
    }


async def _run_loadgen(
    targets: list[str], rate: float, seconds: float, timeout_ms: int
) -> dict[str, Any]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        SCRIPT,
        "--loadgen",
        *[arg for target in targets for arg in ("--target", target)],
        "--rate",
        str(rate),
        "--seconds",
        str(seconds),
        "--timeout-ms",
        str(timeout_ms),
        stdout=asyncio.subprocess.PIPE,
        cwd=ROOT,
    )
    out, _ = await process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"the load generator failed ({process.returncode})")
    result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return result


# -- the fleet (its own process) -------------------------------------------------------


class Fleet:
    """The simulated fleet's processes, and their counts over HTTP.

    Split into parts of at most :data:`FLEET_PART` servers, a process each (``--first``):
    a process may hold only so many sockets (20,000 here, and no raising it without
    ``CAP_SYS_RESOURCE``), and three search servers keep some 51,000 connections into
    a fleet of 50,000."""

    def __init__(self, zk: str, size: int, shards: int) -> None:
        self.zk, self.size, self.shards = zk, size, shards
        self.parts = [
            (first, min(FLEET_PART, size - first)) for first in range(0, size, FLEET_PART)
        ]
        self.ports: list[int] = []
        self.processes: list[asyncio.subprocess.Process] = []

    async def start(self) -> float:
        started = time.monotonic()
        for first, count in self.parts:
            self.processes.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    *("-m", "discovery.testing.simfleet", "--zk", self.zk),
                    *("--size", str(count), "--first", str(first), "--shards", str(self.shards)),
                    stdout=asyncio.subprocess.PIPE,
                    cwd=ROOT,
                )
            )
        for process in self.processes:
            assert process.stdout is not None
            line = await asyncio.wait_for(process.stdout.readline(), 600)
            if not line.startswith(b"ready "):
                raise RuntimeError(f"the simulated fleet did not start: {line!r}")
            self.ports.append(int(line.split()[1]))
        return time.monotonic() - started

    async def stop(self) -> None:
        for process in self.processes:
            if process.returncode is None:
                process.terminate()
        for process in self.processes:
            await process.wait()

    def _urls(self, path: str) -> list[str]:
        return [
            f"http://{address_of(first)}:{port}{path}"
            for (first, _), port in zip(self.parts, self.ports, strict=True)
        ]

    async def stats(self, http: aiohttp.ClientSession) -> dict[str, list[int]]:
        """Every server's counts, in the fleet's order (the parts' concatenated)."""
        stats: dict[str, list[int]] = {"served": [], "connections": []}
        for url in self._urls("/_fleet/stats"):
            async with http.get(url) as response:
                part = await response.json()
            for key, values in stats.items():
                values.extend(part[key])
        return stats

    async def reset(self, http: aiohttp.ClientSession) -> None:
        for url in self._urls("/_fleet/reset"):
            async with http.get(url) as response:
                await response.read()


# -- one case --------------------------------------------------------------------------


def _config(
    zk: str, redis: str, server_id: str, cluster: str, *, leader_eligible: bool = True
) -> SearchServerConfig:
    return SearchServerConfig(
        leader_eligible=leader_eligible,
        zk=ZkConfig(hosts=zk, session_timeout=SESSION_TIMEOUT, connect_timeout=30),
        cluster=ClusterConfig(cluster=cluster, redis_url=redis),
        port=0,
        server_id=server_id,
        subset_size=SUBSET,
        max_in_flight=1024,
        default_timeout_ms=2000,
        max_timeout_ms=10_000,
    )


async def _until(predicate: Any, timeout: float, what: str, interval: float = 0.1) -> float:
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise RuntimeError(f"{what}: not within {timeout} s")
        await asyncio.sleep(interval)
    return time.monotonic() - started


def _subrequests(server: SearchServer) -> float:
    registry: CollectorRegistry = server.registry
    return sum(
        registry.get_sample_value("search_server_fanout_shard_requests_total", {"result": r}) or 0.0
        for r in ("ok", "error", "timeout")
    )


async def _timed_get(http: aiohttp.ClientSession, url: str) -> tuple[float, int]:
    started = time.perf_counter()
    async with http.get(url) as response:
        body = await response.read()
        if response.status != 200:
            raise RuntimeError(f"GET {url}: {response.status} {body[:200]!r}")
    return (time.perf_counter() - started) * 1000, len(body)


async def _first_event(http: aiohttp.ClientSession, url: str) -> tuple[float, int]:
    started = time.perf_counter()
    async with http.get(f"{url}/events") as response:
        async for line in response.content:
            if line.startswith(b"data: "):
                return (time.perf_counter() - started) * 1000, len(line)
    raise RuntimeError("the event stream ended without an event")


async def _views(
    server: SearchServer,
    http: aiohttp.ClientSession,
    zk: str,
    redis: str,
    cluster: str,
    shards: int,
    repeats: int,
) -> dict[str, Any]:
    """What an operator's views cost at this size: ``/cluster`` (summary and first
    page; one shard; a state filter, which passes over every server), the dashboard's
    first event, ``discovery status`` (a process reading every registration), and the
    dashboard in Chromium when Playwright and Chromium are there."""
    result: dict[str, Any] = {}
    for name, query in (
        ("cluster", ""),
        ("cluster_shard", f"?shard={shards // 2}"),
        ("cluster_state_filter", "?state=live&limit=1000"),
    ):
        times, sizes = [], []
        for _ in range(repeats):
            elapsed, size = await _timed_get(http, f"{server.url}/cluster{query}")
            times.append(elapsed)
            sizes.append(size)
        result[name] = {
            "p50_ms": round(_pct(times, 0.5), 2),
            "max_ms": round(max(times), 2),
            "body_bytes": max(sizes),
        }
    elapsed, size = await _first_event(http, server.url)
    result["dashboard_event"] = {"ms": round(elapsed, 2), "bytes": size}
    started = time.perf_counter()
    status = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "discovery.tools.main", "--log-level", "ERROR", "status"),
        *("--zk", zk, "--redis", redis, "--cluster", cluster),
        stdout=asyncio.subprocess.PIPE,
        cwd=ROOT,
    )
    out, _ = await status.communicate()
    result["status_command"] = {
        "exit": status.returncode,
        "wall_s": round(time.perf_counter() - started, 2),
        "lines": len(out.splitlines()),
        "bytes": len(out),
    }
    result["chromium"] = await _chromium(server.url, shards)
    return result


async def _chromium(url: str, shards: int) -> dict[str, Any] | None:
    """The dashboard in headless Chromium: time until every shard's cell is drawn,
    the page's element count and JS heap; a screenshot in ``bench/results``."""
    if not os.path.isfile(CHROMIUM):  # noqa: ASYNC240 (one stat)
        return None
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        return None
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"]
        )
        try:
            page = await browser.new_page(viewport={"width": 1440, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            started = time.perf_counter()
            await page.goto(f"{url}/", wait_until="load")
            await page.wait_for_function(
                f"() => document.querySelectorAll('#grid .cell').length === {shards}"
                " || document.querySelectorAll('.tile').length > 0",
                timeout=60_000,
            )
            drawn_ms = (time.perf_counter() - started) * 1000
            # Ten more events: the page keeps up with one a second.
            events = await page.evaluate("window.__dashboard.events")
            await page.wait_for_function(
                f"() => window.__dashboard.events >= {events + 10}", timeout=60_000
            )
            # A shard's replicas, a click away (grid mode only).
            shard_ms = None
            cell = page.locator(f'#grid .cell[data-shard="{shards // 2}"]')
            if await cell.count():
                clicked = time.perf_counter()
                await cell.click()
                await page.wait_for_function(
                    "() => document.querySelectorAll('#detail .tile').length > 0",
                    timeout=60_000,
                )
                shard_ms = round((time.perf_counter() - clicked) * 1000, 1)
            elements = await page.evaluate("document.getElementsByTagName('*').length")
            heap = await page.evaluate(
                "performance.memory ? performance.memory.usedJSHeapSize : null"
            )
            shot = RESULTS.parent / f"dashboard-{shards}-shards.png"
            await page.screenshot(path=str(shot), full_page=False)
            return {
                "drawn_ms": round(drawn_ms, 1),
                "shard_detail_ms": shard_ms,
                "elements": elements,
                "js_heap_mib": round(heap / 2**20, 1) if heap else None,
                "errors": errors,
                "screenshot": shot.name,
            }
        finally:
            await browser.close()


async def _one_server(
    zk: str,
    redis: str,
    size: int,
    shards: int,
    args: argparse.Namespace,
    http: aiohttp.ClientSession,
) -> dict[str, Any]:
    rate = args.subrequests_per_second / shards
    session = ZkSession.from_config(ZkConfig(hosts=zk, session_timeout=SESSION_TIMEOUT))
    await session.start()
    await session.ensure_path(SEARCH_MEMBERS_PATH)
    await session.ensure_path(DATA_SERVERS_PATH)
    # The leader, in a process of its own: the one measured here holds what any search
    # server holds, not the leader's view of ZooKeeper too.
    leader = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "search_server.cli", "--zk", zk, "--redis", redis, "--cluster", f"one{size}"),
        *("--session-timeout", str(SESSION_TIMEOUT), "--log-level", "ERROR"),
        *("--id", "ss-leader", "--port", "0"),
        stdin=asyncio.subprocess.DEVNULL,
        cwd=ROOT,
    )
    # The other 98 search servers of a fleet of 100: names only, sorted after ours.
    for i in range(1, FLEET_SEARCH_SERVERS - 1):
        await session.create(f"{SEARCH_MEMBERS_PATH}/ss-{i:03d}", b"{}", ephemeral=True)
    server = SearchServer(_config(zk, redis, "ss-000", f"one{size}", leader_eligible=False))
    fleet = Fleet(zk, size, shards)
    try:
        await server.start()
        reader = server.reader
        assert reader is not None
        await _until(lambda: reader.current.version > 0, 60, "a first list from the leader")
        gc.collect()
        rss_before = _rss_bytes()
        registered_s = await fleet.start()
        listed_s = await _until(lambda: len(server.routed.servers) == size, 600, "all routed")
        assert server.fanout is not None
        print(
            f"  {size}: registered in {registered_s:.1f} s, routed {listed_s:.1f} s later; "
            f"position {server.fanout.position}",
            flush=True,
        )
        warm = await _run_loadgen([server.url], rate, args.warmup_seconds, 2000)
        gc.collect()
        rss_after = _rss_bytes()

        await fleet.reset(http)
        cpu0, sub0 = time.process_time(), _subrequests(server)
        load = await _run_loadgen([server.url], rate, args.seconds, 2000)
        cpu, sub = time.process_time() - cpu0, _subrequests(server) - sub0
        stats = await fleet.stats(http)
        connections = stats["connections"]

        changes: list[float] = []
        rng = random.Random(size)
        for _ in range(args.changes):
            index = rng.randrange(size)
            node = f"{DATA_SERVERS_PATH}/sim-{index:05d}"
            data, _ = await session.get(node)
            await session.delete(node)
            t0 = time.perf_counter()
            name = f"sim-{index:05d}"
            await _until(lambda n=name: n not in server.routed.servers, 30, "removal", 0.0005)
            changes.append(time.perf_counter() - t0)
            await session.create(node, data, ephemeral=True)
            t0 = time.perf_counter()
            await _until(lambda n=name: n in server.routed.servers, 30, "addition", 0.0005)
            changes.append(time.perf_counter() - t0)
        views = await _views(server, http, zk, redis, f"one{size}", shards, args.view_repeats)
        return {
            "data_servers": size,
            "shards": shards,
            "replicas_per_shard": size // shards,
            "views": views,
            "position": [server.fanout.position.rank, server.fanout.position.count],
            "registered_s": round(registered_s, 1),
            "routed_after_s": round(listed_s, 1),
            "rate_qps": round(rate, 2),
            "warmup": warm,
            "load": load,
            "memory_per_replica_bytes": round((rss_after - rss_before) / size),
            "rss_before_mib": round(rss_before / 2**20, 1),
            "rss_after_mib": round(rss_after / 2**20, 1),
            "cpu_s": round(cpu, 3),
            "subrequests": int(sub),
            "cpu_per_subrequest_us": round(cpu / sub * 1e6, 2) if sub else None,
            "sockets": sum(connections),
            "replicas_connected": sum(1 for c in connections if c),
            "socket_bound": shards * min(SUBSET, size // shards),
            "routing_update_p50_ms": round(_pct(changes, 0.5) * 1000, 3),
            "routing_update_p99_ms": round(_pct(changes, 0.99) * 1000, 3),
            "routing_update_max_ms": round(max(changes) * 1000, 3),
            "changes": len(changes),
        }
    finally:
        # The leader first: a fleet leaving under a leader's eyes engages its mass-loss
        # brake (and logs it), which says nothing here.
        leader.terminate()
        await leader.wait()
        await server.shutdown()
        await fleet.stop()
        await session.aclose()


async def _three_servers(
    zk: str,
    redis: str,
    size: int,
    shards: int,
    args: argparse.Namespace,
    http: aiohttp.ClientSession,
) -> dict[str, Any]:
    rate = args.spread_subrequests_per_second / shards
    fleet = Fleet(zk, size, shards)
    # A process each: together they hold a connection per replica of their subsets,
    # some 51,000 sockets at 50,000 (more than one process may, see Fleet).
    ports = [_free_port() for _ in range(3)]
    servers = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", "search_server.cli", "--zk", zk, "--redis", redis),
            *("--cluster", f"three{size}", "--id", f"ss-{c}", "--port", str(port)),
            *("--session-timeout", str(SESSION_TIMEOUT), "--log-level", "WARNING"),
            *("--subset-size", str(SUBSET), "--max-in-flight", "1024", "--timeout-ms", "2000"),
            stdin=asyncio.subprocess.DEVNULL,
            cwd=ROOT,
        )
        for c, port in zip("abc", ports, strict=True)
    ]
    targets = [f"http://127.0.0.1:{port}" for port in ports]
    try:
        await fleet.start()

        async def ready() -> bool:
            for url in targets:
                try:
                    async with http.get(f"{url}/cluster", params={"limit": "0"}) as response:
                        view = await response.json()
                except (aiohttp.ClientError, ValueError):
                    return False
                if view["summary"]["live"] != size or view["subsets"]["count"] != 3:
                    return False
            return True

        deadline = time.monotonic() + 600
        while not await ready():
            if time.monotonic() > deadline:
                raise RuntimeError("three search servers routing every data server: not in 600 s")
            await asyncio.sleep(1.0)
        await _run_loadgen(targets, rate, args.warmup_seconds, 2000)
        await fleet.reset(http)
        load = await _run_loadgen(targets, rate, args.seconds, 2000)
        served = (await fleet.stats(http))["served"]
        # Simulated server i is replica i // shards of shard i % shards, and its place
        # in its shard's ring (ids in order) is its replica number: every shard has the
        # same ring, so the same place has the same share in every shard. Summed over
        # the shards, a place's count has the samples to tell its share; one replica's
        # alone (a few requests each at 50,000) mostly shows sampling noise.
        replicas = size // shards
        by_place = [sum(served[p * shards : (p + 1) * shards]) for p in range(replicas)]
        fair = sum(by_place) / replicas
        noisy: list[float] = []
        for shard in range(shards):
            counts = served[shard::shards]
            mean = sum(counts) / len(counts)
            if mean:
                noisy.extend(c / mean for c in counts)
        return {
            "data_servers": size,
            "rate_qps": round(rate, 2),
            "load": load,
            "requests": sum(served),
            "requests_per_replica": round(sum(served) / size, 1),
            "highest_share_over_fair": round(max(by_place) / fair, 3) if fair else None,
            "least_share_over_fair": round(min(by_place) / fair, 3) if fair else None,
            "requests_per_place": round(fair),
            "one_replica_share_over_fair_p99": round(_pct(noisy, 0.99), 3),
            "one_replica_share_over_fair_max": round(max(noisy), 3) if noisy else None,
        }
    finally:
        for server in servers:
            if server.returncode is None:
                server.terminate()
        for server in servers:
            await server.wait()
        await fleet.stop()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def _case(name: str, size: int, shards: int, args: argparse.Namespace) -> dict[str, Any]:
    print(f"{name}: {size} data servers in {shards} shards", flush=True)
    with DevCluster(tick_time_ms=500) as cluster:
        zk, redis = cluster.info()["zk"], cluster.info()["redis"]
        # A chroot per phase: each its own members and data servers.
        root = ZkSession.from_config(ZkConfig(hosts=zk))
        await root.start()
        try:
            await root.ensure_path("/one")
            await root.ensure_path("/three")
        finally:
            await root.aclose()
        async with aiohttp.ClientSession() as http:
            one = await _one_server(zk + "/one", redis, size, shards, args, http)
            three = await _three_servers(zk + "/three", redis, size, shards, args, http)
    return {"case": name, "one_search_server": one, "three_search_servers": three}


def _table(rows: list[dict[str, Any]]) -> None:
    header = (
        "| case | data servers | sockets / bound | memory per replica | CPU per sub-request "
        "| change → routed p50 / p99 | query p50 / p99 (rate) | coverage | highest share / fair |"
    )
    print(header)
    print("|" + "---|" * 9)
    for row in rows:
        one, three = row["one_search_server"], row["three_search_servers"]
        load = one["load"]
        print(
            f"| {row['case']} | {one['data_servers']:,} "
            f"| {one['sockets']:,} / {one['socket_bound']:,} "
            f"| {one['memory_per_replica_bytes']:,} B | {one['cpu_per_subrequest_us']} µs "
            f"| {one['routing_update_p50_ms']} / {one['routing_update_p99_ms']} ms "
            f"| {load['p50_ms']} / {load['p99_ms']} ms ({one['rate_qps']} q/s) "
            f"| {load['coverage_mean_percent']} % | {three['highest_share_over_fair']} |",
            flush=True,
        )


def _views_table(rows: list[dict[str, Any]]) -> None:
    print(
        "| case | /cluster p50 / max (body) | ?shard= p50 / max | ?state= p50 / max "
        "| dashboard event | `discovery status` | Chromium: drawn, elements, heap, a click |"
    )
    print("|" + "---|" * 7)
    for row in rows:
        v = row["one_search_server"]["views"]
        c, sh, st = v["cluster"], v["cluster_shard"], v["cluster_state_filter"]
        ev, status, chrome = v["dashboard_event"], v["status_command"], v["chromium"]
        browser = (
            "not run"
            if chrome is None
            else f"{chrome['drawn_ms']} ms, {chrome['elements']:,}, {chrome['js_heap_mib']} MiB, "
            f"a shard's replicas {chrome['shard_detail_ms']} ms"
        )
        print(
            f"| {row['case']} | {c['p50_ms']} / {c['max_ms']} ms ({c['body_bytes']:,} B) "
            f"| {sh['p50_ms']} / {sh['max_ms']} ms | {st['p50_ms']} / {st['max_ms']} ms "
            f"| {ev['ms']} ms, {ev['bytes']:,} B | {status['wall_s']} s, {status['lines']} lines "
            f"| {browser} |",
            flush=True,
        )


def _targets(fleet: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    one, one_base = fleet["one_search_server"], base["one_search_server"]
    cpu_ratio = one["cpu_per_subrequest_us"] / one_base["cpu_per_subrequest_us"]
    p99_ratio = one["routing_update_p99_ms"] / one_base["routing_update_p99_ms"]
    share = fleet["three_search_servers"]["highest_share_over_fair"]
    return {
        "sockets_within_bound": one["sockets"] <= one["socket_bound"],
        "memory_per_replica_within_2kb": one["memory_per_replica_bytes"]
        <= BOUNDS["memory_per_replica_bytes"],
        "cpu_ratio": round(cpu_ratio, 3),
        "cpu_ratio_within_1_2": cpu_ratio <= BOUNDS["cpu_ratio"],
        "routing_p99_ratio": round(p99_ratio, 3),
        "routing_p99_ratio_within_1_5": p99_ratio <= BOUNDS["routing_p99_ratio"],
        "highest_share_over_fair": share,
        "share_within_1_3": share <= BOUNDS["share_over_fair"],
        "views_within_100_ms": all(
            one["views"][name]["max_ms"] <= BOUNDS["view_ms"]
            for name in ("cluster", "cluster_shard", "cluster_state_filter")
        ),
    }


async def _main_async(args: argparse.Namespace) -> dict[str, Any]:
    size, shards = (10_000, 100) if args.quick else (50_000, 500)
    rows = [
        await _case("baseline", 100, 50, args),
        await _case("fleet", size, shards, args),
    ]
    return {"rows": rows, "targets": _targets(rows[1], rows[0])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10,000 data servers, shorter phases")
    parser.add_argument("--seconds", type=float, default=30.0, help="load phase, seconds")
    parser.add_argument("--warmup-seconds", type=float, default=8.0)
    parser.add_argument(
        "--subrequests-per-second",
        type=float,
        default=1500.0,
        help="one search server's load (queries a second = this / shards)",
    )
    parser.add_argument(
        "--spread-subrequests-per-second",
        type=float,
        default=4500.0,
        help="three search servers' load together",
    )
    parser.add_argument("--changes", type=int, default=50, help="data servers removed and re-added")
    parser.add_argument("--view-repeats", type=int, default=20, help="requests per /cluster view")
    # The load generator's own mode (run by the benchmark in a process of its own).
    parser.add_argument("--loadgen", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--target", action="append", default=[], help=argparse.SUPPRESS)
    parser.add_argument("--rate", type=float, default=1.0, help=argparse.SUPPRESS)
    parser.add_argument("--timeout-ms", type=int, default=2000, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.loadgen:
        print(
            json.dumps(asyncio.run(_loadgen(args.target, args.rate, args.seconds, args.timeout_ms)))
        )
        return 0
    if args.quick:
        args.seconds, args.warmup_seconds, args.changes = 12.0, 4.0, 20
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # Three search servers in this process hold a connection per replica of their
    # subsets: some 50,000 sockets.
    raise_open_files_limit()
    started = time.monotonic()
    result = asyncio.run(_main_async(args))
    _table(result["rows"])
    _views_table(result["rows"])
    for name, value in result["targets"].items():
        print(f"  {name}: {value}")
    write_results(
        RESULTS,
        "fleet_scale",
        {
            k: v
            for k, v in vars(args).items()
            if k not in ("loadgen", "target", "rate", "timeout_ms")
        },
        subset_size=SUBSET,
        fleet_search_servers=FLEET_SEARCH_SERVERS,
        bounds=BOUNDS,
        rows=result["rows"],
        targets=result["targets"],
        wall_s=round(time.monotonic() - started, 1),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
