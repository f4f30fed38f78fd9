"""Fan-out: cost, tail, skew and deadlines of our search server, each against a baseline.

Starts a real local ZooKeeper (one node, for speed) and Redis (``DevCluster``), then
runs the sections chosen with ``--sections`` (default all, in this order), each on a
cluster of data servers of its own (its own ZooKeeper chroot and Redis prefix) that is
stopped before the next one starts. Every search server below runs alone in its
cluster, so adaptive replica selection's concurrency compensation counts one client.

**cpu** and **deadline** share cluster A: ``--servers`` data servers (default 100: all
but ``--faulty`` in a ``data-server fleet`` over two processes, the ``--faulty`` ones
that will be killed as ``data-server`` processes of their own, so that they can be
SIGKILLed), one shard per server, one replica each, and one ``search-server`` with
``--timeout-ms`` as its query deadline D. Load is closed-loop (``--concurrency``
clients, each sending its next query as soon as the previous one answered).

* ``cpu``, phase ``healthy``: latency of our search server (``GET /search?timeout_ms=D``)
  against the baseline, the original design of the background document, implemented in
  this script and run as its own process (``--baseline-worker``) while our search
  server is idle: a static list of all data servers, no discovery, no deadline logic;
  each query is sent to every server and waits for all of them, each request with the
  same HTTP timeout as our deadline (``aiohttp.ClientTimeout(total=D)``); a request that
  fails or times out is an error for that shard, and a query with any such shard is an
  error. **CPU per sub-request**: the search server's CPU time (``/proc/<pid>/stat``)
  over the healthy phase divided by the shard answers it merged, against a bare aiohttp
  loop (the baseline worker without faults) doing the same fan-out to the same servers
  for the same number of queries, measured with ``time.process_time()`` in its own
  process. Targets (issue 14): <= 50 µs and <= 0.35x the bare loop.
* ``deadline`` (issue 6's targets: no query past D + 10 ms with ``--faulty`` hung data
  servers, once the search server has a core to itself). With ``--pin`` (the default
  on a machine of two CPUs or more) the search server gets CPU 1 to itself and every
  other process of this benchmark (this script and its load clients, the data servers,
  ZooKeeper, Redis) CPU 0: ``os.sched_setaffinity`` on every thread
  (``/proc/<pid>/task``) of each process, as ``taskset -a -p`` does; the baseline worker
  pins itself to CPU 1 as well, in the search server's place. Processes that are not
  this benchmark's can still run on CPU 1. Two fault phases, each against the baseline:
  ``hung`` (``POST /admin/fault {"mode":"hang"}`` on ``--faulty`` fleet servers) and
  ``killed`` (SIGKILL of the ``--faulty`` separate data servers). Ours is measured in
  two windows per phase: ``transition`` from the fault until its ``GET /cluster`` no
  longer lists the faulty servers (the agents take hung servers offline; ZooKeeper drops
  killed ones after the session timeout; the fan-out ejects both locally meanwhile), and
  ``after``, ``--phase-seconds`` after that convergence.

**tail** (hedged requests) and **skew** (replica choice) share cluster B: ``--tail-shards``
shards x 2 replicas in one fleet of two processes (replica r of shard s is fleet server
``r * shards + s``, so a shard's two replicas live in different processes), deadline
``--tail-timeout-ms``. Each configuration gets a search server of its own, started with
its flags, warmed up (``--warmup-seconds``), measured, and stopped before the next.

* ``tail``: ``--slow-percent`` of the replicas (at least one, each of another shard) get
  ``{"mode":"slow","delay_ms":--slow-ms}``. For each picker of ``--tail-pickers``, a
  search server with ``--hedge-percent`` (hedging on) against one with
  ``--hedge-percent 0`` (the baseline), ``--tail-seconds`` each, split over
  ``--tail-rounds`` interleaved rounds. Figures: p50 / p99 / p99.9, partial rate,
  queries past the deadline + 10 ms; from the search server's ``/metrics`` the hedges
  sent, won and not sent for want of budget, and the extra load ``hedges sent / shard
  requests`` (target <= 5 %); from the data servers' ``/metrics`` the slowed replicas'
  share of their shards' requests. Hedging off under P2C isolates the hedges' effect
  from ARS's own avoidance of slow replicas.
* ``skew``: the normal response time R is the median of direct requests from this
  script to a healthy replica while the load runs; one replica of a shard then gets
  ``{"mode":"slow","delay_ms":(--skew-factor - 1) x R}`` (or ``--skew-delay-ms``), so
  that it answers about ``--skew-factor`` times slower than its peer. Under
  ``--picker ars`` and ``--picker p2c`` in turn (both with hedging at
  ``--hedge-percent``): the slow replica's share of its shard's requests (each data
  server's ``data_server_search_requests_total`` minus its own agent's probes,
  ``discovery_agent_probes_total``; hedges included), against each other and an even
  split, and the queries' p50 / p99 (the search server exposes no per-shard latency, so
  the shard's own p99 cannot be isolated in a fan-out). Then, fault cleared and load
  running, a third replica of shard 0 joins: a spare fleet server kept offline until
  then (``POST /admin/offline``, then ``/admin/online``: a new registration), so that
  it runs in a process as busy as its peers'. Its share of that shard's requests in
  each of its first ``--newcomer-seconds`` seconds after the search server first lists
  it, against the fair share of one third.

Prints a table per section and a targets block, writes ``bench/results/fanout.json``.

    .venv/bin/python bench/bench_fanout.py [--quick] [--sections cpu,deadline,tail,skew]
        [--servers 100] [--faulty 10] [--timeout-ms 200] [--concurrency 2]
        [--phase-seconds 20] [--tail-shards 100] [--tail-seconds 120] [--skew-seconds 20]

Child processes log at ``BENCH_LOG`` (default ERROR).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from common import (
    descendants,
    free_port_block,
    machine,
    process_cpu_seconds,
    process_tree,
    quick_defaults,
    spawn_python,
)
from kazoo.client import KazooClient
from prometheus_client.parser import text_string_to_metric_families

from data_server.corpus import sample_queries
from discovery.adminauth import admin_headers
from discovery.testing import DevCluster
from discovery.testing.process import terminate_all

SCRIPT = Path(__file__).resolve()
ROOT = SCRIPT.parent.parent
RESULTS = ROOT / "bench" / "results" / "fanout.json"
SESSION_TIMEOUT = "4"
SLACK_MS = 10.0  # the target: p99 and max within the deadline + this
SECTIONS = ("cpu", "deadline", "tail", "skew")
SEARCH_CPU = 1  # --pin: the search server's CPU; everything else of ours runs on 0
OTHERS_CPU = 0
CPU_TARGET_US = 50.0
CPU_RATIO_TARGET = 0.35
HEDGE_LOAD_TARGET = 0.05
SLOW_QUERY_SHARE = 0.75  # tail: a query this share of --slow-ms or longer hit a slowed replica


# --------------------------------------------------------------------------- helpers


def _percentile(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


def _cpu_seconds(pid: int) -> float:
    seconds = process_cpu_seconds(pid)
    assert seconds is not None, f"process {pid} is gone"
    return seconds


@dataclass
class Query:
    start: float  # time.monotonic()
    ms: float
    outcome: str  # ok | partial | error
    total: int = 0  # shards the answer covers
    answered: int = 0  # shards that answered
    took_ms: float = 0.0  # ours: the search server's own fan-out time


def summarize(queries: list[Query], seconds: float, deadline_ms: float) -> dict[str, Any]:
    lat = [q.ms for q in queries]
    n = len(queries)
    count = {o: sum(q.outcome == o for q in queries) for o in ("ok", "partial", "error")}
    return {
        "queries": n,
        "seconds": round(seconds, 2),
        "throughput_qps": round(n / seconds, 1) if seconds > 0 else 0.0,
        "p50_ms": round(_percentile(lat, 0.5), 1),
        "p99_ms": round(_percentile(lat, 0.99), 1),
        "p999_ms": round(_percentile(lat, 0.999), 1),
        "max_ms": round(max(lat, default=0.0), 1),
        "error_rate": round(count["error"] / n, 4) if n else 0.0,
        "partial_rate": round(count["partial"] / n, 4) if n else 0.0,
        "over_deadline": sum(ms > deadline_ms + SLACK_MS for ms in lat),
        "shards_total_min": min((q.total for q in queries), default=0),
        "shards_answered_sum": sum(q.answered for q in queries),
        "server_took_max_ms": round(max((q.took_ms for q in queries), default=0.0), 1),
    }


async def closed_loop(
    concurrency: int,
    one_query: Any,
    queries: list[str],
    *,
    seconds: float | None = None,
    count: int | None = None,
) -> tuple[list[Query], float]:
    """``concurrency`` clients sending ``one_query(q)`` back to back; (records, wall s)."""
    records: list[Query] = []
    started = time.monotonic()
    stop_at = started + seconds if seconds is not None else float("inf")
    issued = 0

    async def client(offset: int) -> None:
        nonlocal issued
        i = offset
        while time.monotonic() < stop_at and (count is None or issued < count):
            issued += 1
            t0 = time.monotonic()
            answer = await one_query(queries[i % len(queries)])
            records.append(Query(t0, (time.monotonic() - t0) * 1000, *answer))
            i += concurrency

    await asyncio.gather(*(client(c) for c in range(concurrency)))
    return records, time.monotonic() - started


# ------------------------------------------------------------- metrics, affinity


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(http: aiohttp.ClientSession, port: int) -> Samples:
    """Every sample of ``GET /metrics`` on ``port``, by (name, sorted labels)."""
    async with http.get(f"http://127.0.0.1:{port}/metrics") as response:
        response.raise_for_status()
        text = await response.text()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def metric(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    return sum(
        value
        for (n, have), value in samples.items()
        if n == name and all((k, v) in have for k, v in labels.items())
    )


async def fanout_counters(http: aiohttp.ClientSession, port: int) -> dict[str, float]:
    """The search server's hedge, retry and shard-request counters."""
    s = await scrape(http, port)
    hedges = "search_server_fanout_hedges_total"
    shard = "search_server_fanout_shard_requests_total"
    return {
        "hedges_sent": metric(s, hedges, result="sent"),
        "hedges_won": metric(s, hedges, result="won"),
        "hedges_over_budget": metric(s, hedges, result="over_budget"),
        "retries": metric(s, "search_server_fanout_retries_total"),
        "shard_requests": metric(s, shard),
        "shard_timeouts": metric(s, shard, result="timeout"),
        "shard_errors": metric(s, shard, result="error"),
    }


def _diff(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before.get(k, 0.0) for k in after}


async def routed_requests(http: aiohttp.ClientSession, ports: list[int]) -> list[float]:
    """Search requests each data server got from search servers: all of its
    ``data_server_search_requests_total`` minus its own agent's probes."""

    async def one(port: int) -> float:
        s = await scrape(http, port)
        probes = metric(s, "discovery_agent_probes_total")
        return metric(s, "data_server_search_requests_total") - probes

    return list(await asyncio.gather(*(one(p) for p in ports)))


def _set_affinity(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` (``taskset -a -p``); a thread or process gone is skipped."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return
    for tid in tids:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(int(tid), cpus)


def pin(search_pid: int) -> dict[str, Any]:
    """The search server (and its children) on ``SEARCH_CPU``, every other process of
    this benchmark, this one included, on ``OTHERS_CPU``."""
    tree = process_tree()
    own = set(descendants(search_pid, tree))
    others = [p for p in descendants(os.getpid(), tree) if p not in own]
    for pid in own:
        _set_affinity(pid, {SEARCH_CPU})
    for pid in others:
        _set_affinity(pid, {OTHERS_CPU})
    return {
        "search_server_affinity_read_back": sorted(os.sched_getaffinity(search_pid)),
        "how": "os.sched_setaffinity on every thread (/proc/<pid>/task) of each process, "
        "as taskset -a -p does; the baseline worker pins itself",
        "search_server_cpus": [SEARCH_CPU],
        "baseline_worker_cpus": [SEARCH_CPU],
        "other_processes_cpus": [OTHERS_CPU],
        "other_processes": len(others),
    }


def unpin() -> None:
    everything = set(range(os.cpu_count() or 1))
    for pid in descendants(os.getpid(), process_tree()):
        _set_affinity(pid, everything)


def ensure_chroot(hosts: str, path: str) -> str:
    """Create ``path`` on ZooKeeper; the hosts string with it as the chroot."""
    client = KazooClient(hosts=hosts)
    client.start(timeout=30)
    try:
        client.ensure_path(path)
    finally:
        client.stop()
        client.close()
    return hosts + path


async def serving_ids(http: aiohttp.ClientSession, port: int) -> set[str] | None:
    """The ids a search server routes to (state ``serving``); None if it does not answer."""
    try:
        async with http.get(f"http://127.0.0.1:{port}/cluster") as response:
            view = await response.json()
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    return {s["id"] for s in view["servers"] if s["state"] == "serving"}


async def wait_routes(
    http: aiohttp.ClientSession, port: int, expected: set[str], timeout: float, label: str
) -> float | None:
    """Seconds until the search server on ``port`` routes to exactly ``expected``."""
    started = time.monotonic()
    last = 0.0
    while time.monotonic() - started < timeout:
        ids = await serving_ids(http, port)
        if ids == expected:
            return time.monotonic() - started
        if time.monotonic() - last > 5:
            last = time.monotonic()
            n = "-" if ids is None else len(ids)
            print(f"  [{label}] search server routes with {n}/{len(expected)}", flush=True)
        await asyncio.sleep(0.1)
    return None


async def set_fault(http: aiohttp.ClientSession, port: int, body: dict[str, Any]) -> None:
    url = f"http://127.0.0.1:{port}/admin/fault"
    async with http.post(url, json=body, headers=admin_headers()) as response:
        response.raise_for_status()


# --------------------------------------------------------------- baseline worker


async def _baseline(args: argparse.Namespace) -> dict[str, Any]:
    """The original design: static list, fan out to all, wait for all, HTTP timeout."""
    urls = [f"http://127.0.0.1:{p}/search" for p in json.loads(args.ports)]
    queries = sample_queries(500, variant=1)
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=64, keepalive_timeout=60)
    timeout = aiohttp.ClientTimeout(total=args.timeout_ms / 1000)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:

        async def one_server(url: str, q: str) -> bool:
            try:
                async with http.get(url, params={"q": q, "k": "10"}) as response:
                    if response.status != 200:
                        return False
                    body = await response.json(content_type=None)
                    return isinstance(body.get("hits"), list)
            except (aiohttp.ClientError, TimeoutError, ValueError, OSError):
                return False

        async def one_query(q: str) -> tuple[str, int, int]:
            answers = await asyncio.gather(*(one_server(url, q) for url in urls))
            ok = sum(answers)
            return ("ok" if ok == len(urls) else "error"), len(urls), ok

        await closed_loop(args.concurrency, one_query, queries, count=args.concurrency * 2)
        cpu0 = time.process_time()
        seconds = args.seconds if args.seconds > 0 else None
        count = args.count if args.count > 0 else None
        records, wall = await closed_loop(
            args.concurrency, one_query, queries, seconds=seconds, count=count
        )
        cpu = time.process_time() - cpu0
    return {
        "records": [[r.start, r.ms, r.outcome, r.total, r.answered] for r in records],
        "wall": wall,
        "cpu_s": cpu,
    }


def baseline_worker(args: argparse.Namespace) -> int:
    if args.cpus:
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    result = asyncio.run(_baseline(args))
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


# ------------------------------------------------- cluster A: cpu and deadline


@dataclass
class Bench:
    """Cluster A: one replica per shard, ``--faulty`` of them separate processes."""

    args: argparse.Namespace
    zk: str
    redis: str
    procs: list[asyncio.subprocess.Process] = field(default_factory=list)
    search: asyncio.subprocess.Process | None = None
    search_port: int = 0
    fleet_base: int = 0
    singles_base: int = 0
    singles: dict[str, asyncio.subprocess.Process] = field(default_factory=dict)
    pinned: bool = False

    @property
    def timeout_ms(self) -> int:
        return int(self.args.timeout_ms)

    @property
    def fleet_count(self) -> int:
        return self.args.servers - self.args.faulty

    def all_ports(self) -> list[int]:
        fleet = [self.fleet_base + i for i in range(self.fleet_count)]
        return fleet + [self.singles_base + j for j in range(self.args.faulty)]

    def hung_fleet_indexes(self) -> list[int]:
        step = max(1, self.fleet_count // self.args.faulty)
        return [i * step for i in range(self.args.faulty)]

    def common(self) -> list[str]:
        return [
            *("--zk", self.zk, "--redis", self.redis, "--cluster", "fanout-single"),
            *("--session-timeout", SESSION_TIMEOUT),
            *("--log-level", os.environ.get("BENCH_LOG", "ERROR")),
        ]

    def agent(self) -> list[str]:
        return [
            *("--docs", str(self.args.docs), "--probe-interval", "0.5"),
            *("--fall", "3", "--rise", "2", "--drain-grace", "1"),
        ]

    async def spawn(self, *argv: str) -> asyncio.subprocess.Process:
        return await spawn_python(self.procs, *argv)

    async def start_single(self, j: int) -> None:
        self.singles[f"ds-kill-{j:02d}"] = await self.spawn(
            *("-m", "data_server.cli", *self.common(), *self.agent()),
            *("--id", f"ds-kill-{j:02d}", "--port", str(self.singles_base + j)),
            *("--shard", str(self.fleet_count + j), "--replica", "0"),
        )

    async def start(self) -> None:
        taken: set[int] = set()
        self.search_port = free_port_block(1, taken)
        self.fleet_base = free_port_block(self.fleet_count, taken)
        self.singles_base = free_port_block(self.args.faulty, taken)
        self.search = await self.spawn(
            *("-m", "search_server.cli", *self.common(), "--id", "search-bench"),
            *("--port", str(self.search_port), "--timeout-ms", str(self.args.timeout_ms)),
            *("--heartbeat-interval", "0.5", "--heartbeat-ttl", "3"),
            *("--reconcile-interval", "5"),
        )
        await self.spawn(
            *("-m", "data_server.cli", "fleet", *self.common(), *self.agent()),
            *("--count", str(self.fleet_count), "--procs", "2"),
            *("--shards", str(self.args.servers), "--base-port", str(self.fleet_base)),
        )
        for j in range(self.args.faulty):
            await self.start_single(j)

    def fleet_id(self, i: int) -> str:
        return f"ds-{i:04d}"

    def all_ids(self) -> set[str]:
        return {self.fleet_id(i) for i in range(self.fleet_count)} | set(self.singles)

    async def wait_list(
        self, http: aiohttp.ClientSession, expected: set[str], timeout: float, label: str
    ) -> float | None:
        return await wait_routes(http, self.search_port, expected, timeout, label)

    async def stop_all(self) -> None:
        await terminate_all(self.procs, timeout=15)


async def run_ours(
    target: Any,
    http: aiohttp.ClientSession,
    queries: list[str],
    *,
    seconds: float | None = None,
    until: asyncio.Future[Any] | None = None,
    concurrency: int | None = None,
) -> tuple[list[Query], float]:
    """Closed-loop load through ``target``'s search server (a :class:`Bench` or a
    :class:`Replicated`: its ``search_port``, ``timeout_ms`` and ``args.concurrency``)
    for ``seconds`` or until ``until`` is done."""
    url = f"http://127.0.0.1:{target.search_port}/search"
    d = str(target.timeout_ms)
    clients = concurrency or target.args.concurrency

    async def one_query(q: str) -> tuple[str, int, int, float]:
        try:
            async with http.get(url, params={"q": q, "k": "10", "timeout_ms": d}) as response:
                if response.status != 200:
                    return "error", 0, 0, 0.0
                body = await response.json()
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return "error", 0, 0, 0.0
        shards = body["shards"]
        outcome = "partial" if body["partial"] else "ok"
        return outcome, shards["total"], shards["ok"], float(body["took_ms"])

    if until is None:
        return await closed_loop(clients, one_query, queries, seconds=seconds)
    # Run until the future is done: a long horizon, cut by cancelling the clients.
    records: list[Query] = []
    started = time.monotonic()
    stop = asyncio.Event()

    async def client(offset: int) -> None:
        i = offset
        while not stop.is_set():
            t0 = time.monotonic()
            answer = await one_query(queries[i % len(queries)])
            records.append(Query(t0, (time.monotonic() - t0) * 1000, *answer))
            i += clients

    tasks = [asyncio.create_task(client(c)) for c in range(clients)]
    try:
        await until
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    return records, time.monotonic() - started


async def run_baseline(
    bench: Bench, *, seconds: float = 0, count: int = 0
) -> tuple[list[Query], float, float]:
    argv = [
        *(str(SCRIPT), "--baseline-worker"),
        *("--ports", json.dumps(bench.all_ports()), "--timeout-ms", str(bench.args.timeout_ms)),
        *("--concurrency", str(bench.args.concurrency)),
        *("--seconds", str(seconds), "--count", str(count)),
    ]
    if bench.pinned:
        argv += ["--cpus", str(SEARCH_CPU)]
    process = await asyncio.create_subprocess_exec(
        sys.executable, *argv, stdout=asyncio.subprocess.PIPE, cwd=ROOT
    )
    bench.procs.append(process)
    out, _ = await process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"baseline worker exited with {process.returncode}")
    result = json.loads(out)
    records = [Query(*r) for r in result["records"]]
    return records, result["wall"], result["cpu_s"]


def _line(system: str, phase: str, s: dict[str, Any]) -> str:
    return (
        f"{system:<9}{phase:<20}{s['queries']:>7}{s['throughput_qps']:>8.1f}"
        f"{s['p50_ms']:>8.1f}{s['p99_ms']:>8.1f}{s['max_ms']:>8.1f}"
        f"{s['error_rate']:>8.1%}{s['partial_rate']:>9.1%}{s['over_deadline']:>7}"
    )


HEADER = (
    f"{'system':<9}{'phase':<20}{'queries':>7}{'q/s':>8}{'p50 ms':>8}{'p99 ms':>8}"
    f"{'max ms':>8}{'errors':>8}{'partial':>9}{'>D+10':>7}"
)


async def cluster_a(
    args: argparse.Namespace,
    zk: str,
    redis: str,
    http: aiohttp.ClientSession,
    sections: set[str],
    results: dict[str, Any],
) -> None:
    """Sections ``cpu`` and ``deadline`` on cluster A (started and stopped here)."""
    bench = Bench(args, await asyncio.to_thread(ensure_chroot, zk, "/fanout-single"), redis)
    queries = sample_queries(500, variant=1)
    results.update({"ours": {}, "baseline": {}})
    try:
        await bench.start()
        print(f"waiting for the search server to route with all {args.servers}…", flush=True)
        startup = await bench.wait_list(http, bench.all_ids(), 300, "start")
        if startup is None:
            raise RuntimeError("the search server never listed every data server")
        print(f"  all {args.servers} routed after {startup:.1f} s", flush=True)
        results["startup_s"] = round(startup, 1)

        def show(system: str, phase: str, s: dict[str, Any]) -> None:
            results[system][phase] = s
            print(_line(system, phase, s), flush=True)

        print("\n" + HEADER, flush=True)
        # Warm-up, gently: a cold burst (every connection opened at once) can time out
        # on every shard and get the whole cluster ejected for --eject-cooldown.
        await run_ours(bench, http, queries, seconds=2, concurrency=1)
        await wait_complete(bench, http, queries, args.servers)
        if "cpu" in sections:
            await section_cpu(bench, http, queries, results, show)
        if "deadline" in sections:
            await section_deadline(bench, http, queries, results, show)
    finally:
        await bench.stop_all()
        if bench.pinned:
            unpin()


async def section_cpu(
    bench: Bench,
    http: aiohttp.ClientSession,
    queries: list[str],
    results: dict[str, Any],
    show: Any,
) -> None:
    """Healthy phase, ours vs the baseline; CPU per sub-request vs the bare aiohttp loop."""
    d = bench.timeout_ms
    assert bench.search is not None
    cpu0 = _cpu_seconds(bench.search.pid)
    recs, wall = await run_ours(bench, http, queries, seconds=bench.args.phase_seconds)
    cpu = _cpu_seconds(bench.search.pid) - cpu0
    healthy = summarize(recs, wall, d)
    show("ours", "healthy", healthy)
    recs, wall, _ = await run_baseline(bench, seconds=bench.args.phase_seconds)
    show("baseline", "healthy", summarize(recs, wall, d))
    bare_recs, bare_wall, bare_cpu = await run_baseline(bench, count=healthy["queries"])
    bare = summarize(bare_recs, bare_wall, d)
    ours_us = cpu / max(1, healthy["shards_answered_sum"]) * 1e6
    bare_us = bare_cpu / max(1, bare["shards_answered_sum"]) * 1e6
    results["cpu_per_subrequest"] = {
        "search_server_cpu_s": round(cpu, 3),
        "search_server_subrequests": healthy["shards_answered_sum"],
        "search_server_us": round(ours_us, 1),
        "bare_aiohttp_queries": bare["queries"],
        "bare_aiohttp_cpu_s": round(bare_cpu, 3),
        "bare_aiohttp_subrequests": bare["shards_answered_sum"],
        "bare_aiohttp_us": round(bare_us, 1),
        "ratio_ours_over_bare": round(ours_us / bare_us, 2) if bare_us else None,
        "pinned": False,
    }


async def section_deadline(
    bench: Bench,
    http: aiohttp.ClientSession,
    queries: list[str],
    results: dict[str, Any],
    show: Any,
) -> None:
    """Hung and killed data servers, ours vs the baseline, the search server pinned."""
    args = bench.args
    d = bench.timeout_ms
    assert bench.search is not None
    if args.pin:
        results["pinning"] = pin(bench.search.pid)
        bench.pinned = True
        print(
            f"pinned: search server on CPU {SEARCH_CPU}, the other "
            f"{results['pinning']['other_processes']} processes of this benchmark on CPU "
            f"{OTHERS_CPU} (sched_setaffinity on every thread)",
            flush=True,
        )
        await wait_complete(bench, http, queries, args.servers)
    else:
        results["pinning"] = {"how": "not pinned (--no-pin or a single CPU)"}

    # ---- hung
    hung_ids = {bench.fleet_id(i) for i in bench.hung_fleet_indexes()}
    hung_ports = [bench.fleet_base + i for i in bench.hung_fleet_indexes()]
    expected = bench.all_ids() - hung_ids
    await fault_phase(bench, http, queries, results, "hung", expected, hung_ports, show)
    recs, wall, _ = await run_baseline(bench, seconds=args.phase_seconds)
    show("baseline", "hung", summarize(recs, wall, d))
    for port in hung_ports:
        await set_fault(http, port, {"mode": "none"})
    recovered = await bench.wait_list(http, bench.all_ids(), 120, "recover")
    results["recover_after_hung_s"] = None if recovered is None else round(recovered, 1)
    # Let the local ejections (--eject-cooldown, 10 s by default) run out.
    await wait_complete(bench, http, queries, args.servers)

    # ---- killed
    killed = set(bench.singles)
    await fault_phase(bench, http, queries, results, "killed", bench.all_ids() - killed, [], show)
    recs, wall, _ = await run_baseline(bench, seconds=args.phase_seconds)
    show("baseline", "killed", summarize(recs, wall, d))


async def wait_complete(
    bench: Bench, http: aiohttp.ClientSession, queries: list[str], total: int
) -> None:
    started = time.monotonic()
    while time.monotonic() - started < 30:
        recs, _ = await run_ours(bench, http, queries, seconds=0.5, concurrency=1)
        if recs and all(q.outcome == "ok" and q.total == total for q in recs):
            return
    print("  warning: answers not complete again within 30 s of recovery", flush=True)


async def fault_phase(
    bench: Bench,
    http: aiohttp.ClientSession,
    queries: list[str],
    results: dict[str, Any],
    phase: str,
    expected: set[str],
    hang_ports: list[int],
    show: Any,
) -> None:
    args = bench.args
    d = bench.timeout_ms
    converged: asyncio.Future[float | None] = asyncio.get_running_loop().create_future()
    t0 = time.monotonic()

    async def inject_and_wait() -> None:
        if hang_ports:
            for port in hang_ports:
                await set_fault(http, port, {"mode": "hang"})
        else:
            for process in bench.singles.values():
                process.kill()
            for process in bench.singles.values():
                await process.wait()
        converged.set_result(await bench.wait_list(http, expected, 90, phase))

    watcher = asyncio.create_task(inject_and_wait())
    # Load is already running when the fault hits.
    load = asyncio.create_task(run_ours(bench, http, queries, until=converged))
    await asyncio.sleep(0)
    transition, wall = await load
    await watcher
    list_s = converged.result()
    show("ours", f"{phase}:transition", summarize(transition, wall, d))
    after, wall = await run_ours(bench, http, queries, seconds=args.phase_seconds)
    s_after = summarize(after, wall, d)
    show("ours", f"{phase}:after", s_after)
    everything = transition + after
    not_complete = [q for q in everything if q.outcome != "ok"]
    last_bad = max((q.start + q.ms / 1000 for q in not_complete), default=t0)
    results["ours"][f"{phase}:convergence"] = {
        "list_converged_s": None if list_s is None else round(list_s, 2),
        "complete_again_s": round(last_bad - t0, 2),
        "incomplete_queries": len(not_complete),
        "after_all_complete": s_after["partial_rate"] == 0 and s_after["error_rate"] == 0,
        "after_shards_total": s_after["shards_total_min"],
    }
    s = summarize(
        everything,
        sum(results["ours"][f"{phase}:{w}"]["seconds"] for w in ("transition", "after")),
        d,
    )
    results["ours"][f"{phase}:all"] = s


# --------------------------------------------- clusters B and C: tail and skew


@dataclass
class Replicated:
    """``shards`` x ``replicas`` data servers in one fleet of two processes, plus one
    spare, in a ZooKeeper chroot and Redis prefix of their own (``name``), routed by one
    search server at a time, started with the flags of the configuration under test.

    Replica ``r`` of shard ``s`` is fleet server ``r * shards + s`` (``data-server fleet
    --shards``), id ``ds-<that number>``; the fleet's first process runs replica 0 of
    every shard, the second the other replicas. The spare, the fleet's last server, is
    a third replica of shard 0 in the second process; it is taken offline
    (``POST /admin/offline``) as soon as it answers, and brought online
    (``/admin/online``: a new registration) to play a replica that has just joined,
    in a process as busy as its peers'.
    """

    args: argparse.Namespace
    zk: str  # hosts string, with the chroot
    redis: str
    name: str
    shards: int
    timeout_ms: int
    replicas: int = 2
    procs: list[asyncio.subprocess.Process] = field(default_factory=list)
    taken: set[int] = field(default_factory=set)
    search: asyncio.subprocess.Process | None = None
    search_port: int = 0
    fleet_base: int = 0
    spare_online: bool = False
    started_searches: int = 0

    def common(self) -> list[str]:
        return [
            *("--zk", self.zk, "--redis", self.redis, "--cluster", self.name),
            *("--session-timeout", SESSION_TIMEOUT),
            *("--log-level", os.environ.get("BENCH_LOG", "ERROR")),
        ]

    def agent(self) -> list[str]:
        return [
            *("--docs", str(self.args.docs), "--probe-interval", "1"),
            *("--fall", "3", "--rise", "2", "--drain-grace", "1"),
        ]

    def number(self, shard: int, replica: int) -> int:
        return replica * self.shards + shard

    def port(self, shard: int, replica: int) -> int:
        return self.fleet_base + self.number(shard, replica)

    def instance_id(self, shard: int, replica: int) -> str:
        return f"ds-{self.number(shard, replica):04d}"

    @property
    def spare(self) -> tuple[int, int]:
        """(shard, replica) of the spare."""
        return 0, self.replicas

    def ids(self) -> set[str]:
        """The data servers a search server must route to."""
        ids = {f"ds-{i:04d}" for i in range(self.shards * self.replicas)}
        return ids | {self.instance_id(*self.spare)} if self.spare_online else ids

    async def start_fleet(self, http: aiohttp.ClientSession) -> None:
        count = self.shards * self.replicas + 1
        self.fleet_base = free_port_block(count, self.taken)
        await spawn_python(
            self.procs,
            *("-m", "data_server.cli", "fleet", *self.common(), *self.agent()),
            *("--count", str(count), "--procs", "2"),
            *("--shards", str(self.shards), "--base-port", str(self.fleet_base)),
        )
        await self.admin_spare(http, "offline", timeout=300)

    async def admin_spare(self, http: aiohttp.ClientSession, what: str, timeout: float) -> None:
        """``POST /admin/<what>`` (offline, online) to the spare, retried until it answers."""
        url = f"http://127.0.0.1:{self.port(*self.spare)}/admin/{what}"
        started = time.monotonic()
        while True:
            try:
                async with http.post(url, headers=admin_headers()) as response:
                    if response.status == 200:
                        break
            except aiohttp.ClientError:
                pass
            if time.monotonic() - started > timeout:
                raise RuntimeError(f"the spare data server never took POST /admin/{what}")
            await asyncio.sleep(0.2)
        self.spare_online = what == "online"

    async def start_search(
        self, http: aiohttp.ClientSession, picker: str, hedge_percent: float
    ) -> None:
        """A search server with these flags, alone in the cluster, once it routes to all."""
        assert self.search is None
        self.started_searches += 1
        self.search_port = free_port_block(1, self.taken)
        label = f"{picker}-h{hedge_percent:g}-{self.started_searches}"
        self.search = await spawn_python(
            self.procs,
            *("-m", "search_server.cli", *self.common(), "--id", f"search-{label}"),
            *("--port", str(self.search_port), "--timeout-ms", str(self.timeout_ms)),
            *("--picker", picker, "--hedge-percent", f"{hedge_percent:g}"),
            *("--heartbeat-interval", "0.5", "--heartbeat-ttl", "3"),
            *("--reconcile-interval", "5"),
        )
        if await wait_routes(http, self.search_port, self.ids(), 300, label) is None:
            raise RuntimeError(f"{self.name}: search server {label} never listed every server")

    async def stop_search(self) -> None:
        if self.search is not None:
            await terminate_all([self.search], timeout=15)
            self.search = None

    async def warm_up(self, http: aiohttp.ClientSession, queries: list[str]) -> None:
        """Open the connections gently, then fill the p95 windows and the ARS statistics
        (a shard's p95 needs 20 answers) at full load."""
        await run_ours(self, http, queries, seconds=1, concurrency=1)
        await run_ours(self, http, queries, seconds=self.args.warmup_seconds)

    async def stop(self) -> None:
        await terminate_all(self.procs, timeout=15)


async def cluster_b(
    args: argparse.Namespace,
    zk: str,
    redis: str,
    http: aiohttp.ClientSession,
    sections: set[str],
    results: dict[str, Any],
) -> None:
    """Sections ``tail`` and ``skew`` on cluster B (started and stopped here)."""
    cluster = Replicated(
        args,
        await asyncio.to_thread(ensure_chroot, zk, "/fanout-replicated"),
        redis,
        "fanout-replicated",
        args.tail_shards,
        args.tail_timeout_ms,
    )
    started = time.monotonic()
    print(
        f"\ncluster B: {args.tail_shards} shards x 2 replicas = {2 * args.tail_shards} data "
        f"servers (a fleet of 2 processes), deadline {args.tail_timeout_ms} ms",
        flush=True,
    )
    try:
        await cluster.start_fleet(http)
        if "tail" in sections:
            results["tail"] = await section_tail(cluster, http, started)
        if "skew" in sections:
            results["skew"] = await section_skew(cluster, http)
    finally:
        await cluster.stop()


TAIL_HEADER = (
    f"{'picker':<7}{'hedging':<9}{'queries':>8}{'q/s':>7}{'p50 ms':>8}{'p99 ms':>8}"
    f"{'p99.9 ms':>9}{'max ms':>8}{'slow q':>7}{'partial':>8}{'>D+10':>6}{'hedges':>7}"
    f"{'won':>6}{'no budget':>10}{'load':>7}{'slow share':>11}"
)


def _tail_line(picker: str, hedge: float, s: dict[str, Any]) -> str:
    hedging = f"{hedge:g} %" if hedge else "off"
    return (
        f"{picker:<7}{hedging:<9}{s['queries']:>8}{s['throughput_qps']:>7.1f}"
        f"{s['p50_ms']:>8.1f}{s['p99_ms']:>8.1f}{s['p999_ms']:>9.1f}{s['max_ms']:>8.1f}"
        f"{s['slow_queries']:>7}{s['partial_rate']:>8.2%}{s['over_deadline']:>6}"
        f"{s['hedges_sent']:>7}{s['hedges_won']:>6}{s['hedges_over_budget']:>10}"
        f"{s['hedge_load']:>7.2%}{s['slow_share']:>11.2%}"
    )


async def section_tail(
    cluster: Replicated, http: aiohttp.ClientSession, started: float
) -> dict[str, Any]:
    """Hedging on vs off, ``--slow-percent`` of the replicas slowed, for each picker."""
    args = cluster.args
    shards = cluster.shards
    n_slow = max(1, round(args.slow_percent / 100 * shards * 2))
    if n_slow > shards:
        raise ValueError("--slow-percent: at most one slowed replica per shard (50 %)")
    # Spread over the shards, alternating replicas (so over both fleet processes).
    slow = [(i * shards // n_slow, i % 2) for i in range(n_slow)]
    slow_ports = [cluster.port(s, r) for s, r in slow]
    peer_ports = [cluster.port(s, 1 - r) for s, r in slow]
    slow_ids = {cluster.instance_id(s, r) for s, r in slow}
    configs = [(p, h) for p in args.tail_pickers for h in (args.hedge_percent, 0.0)]
    per_block = args.tail_seconds / args.tail_rounds
    queries = sample_queries(500, variant=2)
    acc: dict[tuple[str, float], dict[str, Any]] = {
        c: {"records": [], "seconds": 0.0, "counters": {}, "slow": 0.0, "peers": 0.0}
        for c in configs
    }
    listed_min = len(slow_ids)
    print(
        f"[tail] {n_slow} replicas slowed to {args.slow_ms} ms; {len(configs)} "
        f"configurations x {args.tail_rounds} rounds of {per_block:g} s",
        flush=True,
    )
    for round_ in range(args.tail_rounds):
        for picker, hedge in configs:
            await cluster.start_search(http, picker, hedge)
            if round_ == 0 and (picker, hedge) == configs[0]:
                print(f"  cluster up after {time.monotonic() - started:.1f} s", flush=True)
                for port in slow_ports:
                    await set_fault(http, port, {"mode": "slow", "delay_ms": args.slow_ms})
            await cluster.warm_up(http, queries)
            m0 = await fanout_counters(http, cluster.search_port)
            r0 = await routed_requests(http, slow_ports + peer_ports)
            records, wall = await run_ours(cluster, http, queries, seconds=per_block)
            m1 = await fanout_counters(http, cluster.search_port)
            r1 = await routed_requests(http, slow_ports + peer_ports)
            # The agents must not have taken the slowed replicas offline (probes < 500 ms).
            ids = await serving_ids(http, cluster.search_port) or set()
            listed_min = min(listed_min, len(ids & slow_ids))
            await cluster.stop_search()
            a = acc[(picker, hedge)]
            a["records"] += records
            a["seconds"] += wall
            for k, v in _diff(m1, m0).items():
                a["counters"][k] = a["counters"].get(k, 0.0) + v
            deltas = [after - before for after, before in zip(r1, r0, strict=True)]
            a["slow"] += sum(deltas[:n_slow])
            a["peers"] += sum(deltas[n_slow:])
    for port in slow_ports:
        await set_fault(http, port, {"mode": "none"})

    out: dict[str, Any] = {
        "setup": {
            "shards": shards,
            "replicas_per_shard": 2,
            "data_servers": 2 * shards,
            "fleet_processes": 2,
            "slowed_replicas": sorted(slow_ids),
            "slow_ms": args.slow_ms,
            "deadline_ms": args.tail_timeout_ms,
            "hedge_percent": args.hedge_percent,
            "rounds": args.tail_rounds,
            "seconds_per_configuration": args.tail_seconds,
            "slowed_replicas_still_listed_min": listed_min,
            "note": "one search server at a time, started with the configuration's flags "
            "for each round and warmed up (--warmup-seconds) before it is measured; "
            "hedge load = hedges sent / shard requests (search server /metrics); slow "
            "share = the slowed replicas' share of their shards' requests (data servers' "
            "/metrics, probes excluded, hedges included)",
        },
        "configurations": {},
    }
    print("\n" + TAIL_HEADER, flush=True)
    for picker, hedge in configs:
        a = acc[(picker, hedge)]
        c = a["counters"]
        s = summarize(a["records"], a["seconds"], args.tail_timeout_ms)
        # Queries that waited out a slowed replica: well resolved where p99.9 is not.
        s["slow_queries"] = sum(q.ms >= SLOW_QUERY_SHARE * args.slow_ms for q in a["records"])
        s["slow_query_rate"] = round(s["slow_queries"] / max(1, s["queries"]), 5)
        s.update({k: int(v) for k, v in c.items()})
        s["hedge_load"] = round(c["hedges_sent"] / max(1.0, c["shard_requests"]), 4)
        both = a["slow"] + a["peers"]
        s["slow_replica_requests"] = int(a["slow"])
        s["slow_share"] = round(a["slow"] / both, 4) if both else 0.0
        out["configurations"][f"{picker}, hedge {hedge:g}%"] = {
            "picker": picker,
            "hedge_percent": hedge,
            **s,
        }
        print(_tail_line(picker, hedge, s), flush=True)
    print(
        f"  slow q = queries of {SLOW_QUERY_SHARE * args.slow_ms:g} ms or more (that waited "
        "out a slowed replica); no budget = hedges not sent, budget spent; load = hedges "
        "sent / shard requests; slow share = the slowed replicas' share of their shards' "
        "requests",
        flush=True,
    )
    if listed_min < len(slow_ids):
        print("  warning: a slowed replica was taken offline by its agent", flush=True)
    return out


async def direct_latency_ms(
    http: aiohttp.ClientSession, port: int, queries: list[str], n: int = 60
) -> float:
    """Median response time of ``n`` sequential searches sent straight to a data server."""
    url = f"http://127.0.0.1:{port}/search"
    times = []
    for i in range(n):
        t0 = time.monotonic()
        async with http.get(url, params={"q": queries[i % len(queries)], "k": "10"}) as response:
            await response.read()
        times.append((time.monotonic() - t0) * 1000)
    return statistics.median(times)


SKEW_SHARD = 1  # its replica 1 is slowed (shard 0 gets the newcomer)

SKEW_HEADER = (
    f"{'picker':<7}{'queries':>8}{'q/s':>8}{'p50 ms':>8}{'p99 ms':>8}{'p99.9 ms':>9}"
    f"{'slow share':>11}{'slow reqs':>10}{'hedge load':>11}"
)


async def section_skew(cluster: Replicated, http: aiohttp.ClientSession) -> dict[str, Any]:
    """ARS vs P2C: one replica ``--skew-factor`` times slower than its peer; a newcomer."""
    args = cluster.args
    queries = sample_queries(500, variant=3)
    fast_port, slow_port = cluster.port(SKEW_SHARD, 0), cluster.port(SKEW_SHARD, 1)
    delay_ms = args.skew_delay_ms
    normal_ms = None
    out: dict[str, Any] = {"pickers": {}, "newcomer": {}}
    print(
        f"\n[skew] shard {SKEW_SHARD}'s replica 1 slowed; pickers "
        f"{', '.join(args.skew_pickers)}, hedging {args.hedge_percent:g} %",
        flush=True,
    )
    for picker in args.skew_pickers:
        await cluster.start_search(http, picker, args.hedge_percent)
        await cluster.warm_up(http, queries)
        if delay_ms is None:
            # R under load: the load runs while this script times the healthy replica.
            done = asyncio.get_running_loop().create_future()
            load = asyncio.create_task(run_ours(cluster, http, queries, until=done))
            await asyncio.sleep(0.5)
            normal_ms = await direct_latency_ms(http, fast_port, queries)
            done.set_result(None)
            await load
            delay_ms = max(1, round((args.skew_factor - 1) * normal_ms))
            print(
                f"  normal response time R under load {normal_ms:.2f} ms -> slow replica "
                f"delayed by {delay_ms} ms ({args.skew_factor - 1:g} R)",
                flush=True,
            )
        await set_fault(http, slow_port, {"mode": "slow", "delay_ms": delay_ms})
        await run_ours(cluster, http, queries, seconds=args.warmup_seconds)
        m0 = await fanout_counters(http, cluster.search_port)
        r0 = await routed_requests(http, [slow_port, fast_port])
        records, wall = await run_ours(cluster, http, queries, seconds=args.skew_seconds)
        m1 = await fanout_counters(http, cluster.search_port)
        r1 = await routed_requests(http, [slow_port, fast_port])
        slow_n, fast_n = (after - before for after, before in zip(r1, r0, strict=True))
        c = _diff(m1, m0)
        s = summarize(records, wall, cluster.timeout_ms)
        s.update(
            {
                "slow_replica_requests": int(slow_n),
                "fast_replica_requests": int(fast_n),
                "slow_share": round(slow_n / max(1.0, slow_n + fast_n), 4),
                "hedges_sent": int(c["hedges_sent"]),
                "hedges_won": int(c["hedges_won"]),
                "hedge_load": round(c["hedges_sent"] / max(1.0, c["shard_requests"]), 4),
            }
        )
        out["pickers"][picker] = s
        await set_fault(http, slow_port, {"mode": "none"})
        out["newcomer"][picker] = await newcomer(cluster, http, queries)
        await cluster.stop_search()
    out["setup"] = {
        "cluster": "cluster B (the tail section's)",
        "slowed_replica": cluster.instance_id(SKEW_SHARD, 1),
        "peer": cluster.instance_id(SKEW_SHARD, 0),
        "normal_response_ms": None if normal_ms is None else round(normal_ms, 2),
        "normal_response_how": "median of 60 sequential searches from this script "
        "straight to the healthy peer while the closed-loop load runs",
        "slow_delay_ms": delay_ms,
        "skew_factor": args.skew_factor,
        "hedge_percent": args.hedge_percent,
        "seconds": args.skew_seconds,
        "p99_note": "query latency (the whole fan-out): the search server exposes no "
        "per-shard or per-replica latency",
        "newcomer": f"{cluster.instance_id(*cluster.spare)}, a third replica of shard 0 in "
        "the fleet's second process, offline until POST /admin/online (a new "
        "registration) while the load runs, fault cleared; seconds counted from the "
        "first GET /cluster that lists it; its share of shard 0's requests",
        "newcomer_fair_share": round(1 / 3, 4),
    }
    print("\n" + SKEW_HEADER, flush=True)
    for picker, s in out["pickers"].items():
        print(
            f"{picker:<7}{s['queries']:>8}{s['throughput_qps']:>8.1f}{s['p50_ms']:>8.1f}"
            f"{s['p99_ms']:>8.1f}{s['p999_ms']:>9.1f}{s['slow_share']:>11.1%}"
            f"{s['slow_replica_requests']:>10}{s['hedge_load']:>11.2%}",
            flush=True,
        )
    print(
        f"  slow share: of its shard's requests (an even split: 50 %); the slow replica is "
        f"delayed by {delay_ms} ms; p50 / p99: whole queries",
        flush=True,
    )
    print(
        f"newcomer's share of its shard's requests, per second after it is listed "
        f"(fair share {1 / 3:.0%}):",
        flush=True,
    )
    for picker, n in out["newcomer"].items():
        shares = "  ".join(
            f"{b['share']:.0%} ({b['requests']}/{b['shard_requests']})" for b in n["seconds"]
        )
        print(f"  {picker:<5} {shares}", flush=True)
    return out


async def newcomer(
    cluster: Replicated, http: aiohttp.ClientSession, queries: list[str]
) -> dict[str, Any]:
    """While load runs, the spare joins shard 0 as its third replica: its share of the
    shard's requests in each second after the search server first lists it."""
    args = cluster.args
    shard, _ = cluster.spare
    ports = [cluster.port(*cluster.spare), cluster.port(shard, 0), cluster.port(shard, 1)]
    spare_id = cluster.instance_id(*cluster.spare)
    done = asyncio.get_running_loop().create_future()
    load = asyncio.create_task(run_ours(cluster, http, queries, until=done))
    bins: list[dict[str, Any]] = []
    try:
        await asyncio.sleep(1.0)
        # What it gets before we see it listed counts in its first second.
        spare_before = (await routed_requests(http, ports[:1]))[0]
        asked = time.monotonic()
        await cluster.admin_spare(http, "online", timeout=10)
        while spare_id not in (await serving_ids(http, cluster.search_port) or set()):
            if time.monotonic() - asked > 60:
                raise RuntimeError(f"{spare_id} never listed")
            await asyncio.sleep(0.02)
        t0 = time.monotonic()
        before = await routed_requests(http, ports)
        before[0] = spare_before
        for i in range(args.newcomer_seconds):
            await asyncio.sleep(max(0.0, t0 + i + 1 - time.monotonic()))
            now = await routed_requests(http, ports)
            deltas = [a - b for a, b in zip(now, before, strict=True)]
            total = sum(deltas)
            bins.append(
                {
                    "second": i + 1,
                    "requests": int(deltas[0]),
                    "shard_requests": int(total),
                    "share": round(deltas[0] / total, 4) if total else 0.0,
                }
            )
            before = now
    finally:
        done.set_result(None)
        await load
    await cluster.admin_spare(http, "offline", timeout=10)
    await wait_routes(http, cluster.search_port, cluster.ids(), 60, f"{spare_id} gone")
    return {"listed_after_online_s": round(t0 - asked, 2), "seconds": bins}


# ------------------------------------------------------------- targets, main


def _met(ok: bool) -> str:
    return "met" if ok else "MISSED"


def targets(results: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Each section's targets, with its baseline's figure beside ours."""
    goals: dict[str, Any] = {}
    d = args.timeout_ms
    if "cpu_per_subrequest" in results:
        cpu = results["cpu_per_subrequest"]
        goals["cpu"] = {
            "search_server_us": cpu["search_server_us"],
            "bare_aiohttp_us": cpu["bare_aiohttp_us"],
            "ratio_ours_over_bare": cpu["ratio_ours_over_bare"],
            "us_within_50": cpu["search_server_us"] <= CPU_TARGET_US,
            "ratio_within_0_35": (cpu["ratio_ours_over_bare"] or 99) <= CPU_RATIO_TARGET,
        }
    if "hung:all" in results.get("ours", {}):
        hung = results["ours"]["hung:all"]
        killed = results["ours"]["killed:all"]
        base = results["baseline"]["hung"]
        goals["deadline"] = {
            "pinned": bool(results.get("pinning", {}).get("search_server_cpus")),
            "hung_p99_ms": hung["p99_ms"],
            "hung_p99_within_deadline_plus_10ms": hung["p99_ms"] <= d + SLACK_MS,
            "hung_queries_over_deadline_plus_10ms": hung["over_deadline"],
            "hung_no_query_over_deadline_plus_10ms": hung["over_deadline"] == 0,
            "killed_queries_over_deadline_plus_10ms": killed["over_deadline"],
            "hung_complete_again_after_convergence": results["ours"]["hung:convergence"][
                "after_all_complete"
            ],
            "killed_complete_again_after_convergence": results["ours"]["killed:convergence"][
                "after_all_complete"
            ],
            "baseline_hung_p50_ms": base["p50_ms"],
            "baseline_hung_error_rate": base["error_rate"],
        }
    if "tail" in results:
        configs = results["tail"]["configurations"]
        tail: dict[str, Any] = {}
        for picker in args.tail_pickers:
            on = configs[f"{picker}, hedge {args.hedge_percent:g}%"]
            off = configs[f"{picker}, hedge 0%"]
            tail[picker] = {
                "p99_ms_hedging_vs_off": [on["p99_ms"], off["p99_ms"]],
                "p999_ms_hedging_vs_off": [on["p999_ms"], off["p999_ms"]],
                "partial_rate_hedging_vs_off": [on["partial_rate"], off["partial_rate"]],
                "slow_query_rate_hedging_vs_off": [on["slow_query_rate"], off["slow_query_rate"]],
                "hedge_load": on["hedge_load"],
                "hedge_load_within_5_percent": on["hedge_load"] <= HEDGE_LOAD_TARGET,
                "hedging_lowers_p99": on["p99_ms"] < off["p99_ms"],
            }
        goals["tail"] = tail
    if "skew" in results:
        skew = results["skew"]
        p = skew["pickers"]
        goals["skew"] = {
            picker: {
                "slow_share": s["slow_share"],
                "query_p99_ms": s["p99_ms"],
                "newcomer_share_per_second": [
                    b["share"] for b in skew["newcomer"][picker]["seconds"]
                ],
            }
            for picker, s in p.items()
        }
        if "ars" in p and "p2c" in p:
            goals["skew"]["ars_lower_slow_share"] = p["ars"]["slow_share"] < p["p2c"]["slow_share"]
            goals["skew"]["ars_lower_p99"] = p["ars"]["p99_ms"] < p["p2c"]["p99_ms"]
    return goals


def print_targets(goals: dict[str, Any], args: argparse.Namespace) -> None:
    print("\n=== targets (ours against the baseline of the same run)", flush=True)
    if "cpu" in goals:
        c = goals["cpu"]
        print(
            f"CPU per sub-request: {c['search_server_us']:.1f} µs (target <= "
            f"{CPU_TARGET_US:g}: {_met(c['us_within_50'])}); bare aiohttp loop "
            f"{c['bare_aiohttp_us']:.1f} µs; ratio {c['ratio_ours_over_bare']}x (target <= "
            f"{CPU_RATIO_TARGET}x: {_met(c['ratio_within_0_35'])})"
        )
    if "deadline" in goals:
        g = goals["deadline"]
        print(
            f"deadline, {args.faulty} hung, search server "
            f"{'on a CPU of its own' if g['pinned'] else 'NOT pinned'}: queries over "
            f"D+{SLACK_MS:g} ms {g['hung_queries_over_deadline_plus_10ms']} "
            f"({_met(g['hung_no_query_over_deadline_plus_10ms'])}), p99 {g['hung_p99_ms']} ms "
            f"({_met(g['hung_p99_within_deadline_plus_10ms'])}); killed: "
            f"{g['killed_queries_over_deadline_plus_10ms']} over; complete again: hung "
            f"{_met(g['hung_complete_again_after_convergence'])}, killed "
            f"{_met(g['killed_complete_again_after_convergence'])}; baseline with hung "
            f"servers: p50 {g['baseline_hung_p50_ms']} ms, errors "
            f"{g['baseline_hung_error_rate']:.0%}"
        )
    for picker, t in goals.get("tail", {}).items():
        (p99, p99_off), (p999, p999_off) = t["p99_ms_hedging_vs_off"], t["p999_ms_hedging_vs_off"]
        partial, partial_off = t["partial_rate_hedging_vs_off"]
        slow, slow_off = t["slow_query_rate_hedging_vs_off"]
        print(
            f"tail ({picker}): p99 {p99} ms with hedging vs {p99_off} ms without; p99.9 "
            f"{p999} vs {p999_off} ms; queries that waited out a slowed replica {slow:.2%} "
            f"vs {slow_off:.2%}; partial {partial:.2%} vs {partial_off:.2%}; hedge load "
            f"{t['hedge_load']:.2%} (target <= {HEDGE_LOAD_TARGET:.0%}: "
            f"{_met(t['hedge_load_within_5_percent'])})"
        )
    skew = goals.get("skew", {})
    for picker in ("ars", "p2c"):
        if picker in skew:
            s = skew[picker]
            shares = " ".join(f"{x:.0%}" for x in s["newcomer_share_per_second"])
            print(
                f"skew ({picker}): slow replica's share {s['slow_share']:.1%} (even split "
                f"50 %), query p99 {s['query_p99_ms']} ms; newcomer's share per second "
                f"{shares} (fair {1 / 3:.0%})"
            )
    if "ars_lower_slow_share" in skew:
        print(
            f"skew: ARS sends the slow replica less than P2C: "
            f"{skew['ars_lower_slow_share']}; lower query p99: {skew['ars_lower_p99']}",
            flush=True,
        )


async def main_async(
    args: argparse.Namespace, zk: str, redis: str, sections: list[str]
) -> dict[str, Any]:
    results: dict[str, Any] = {}
    timeout = aiohttp.ClientTimeout(total=30)
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
        if {"cpu", "deadline"} & set(sections):
            await cluster_a(args, zk, redis, http, set(sections), results)
        if {"tail", "skew"} & set(sections):
            await cluster_b(args, zk, redis, http, set(sections), results)
    return results


def _names(text: str, allowed: tuple[str, ...]) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names or any(n not in allowed for n in names):
        raise argparse.ArgumentTypeError(f"comma-separated names among {','.join(allowed)}")
    return names


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--quick", action="store_true", help="small and short, for development")
    add(
        "--sections",
        type=lambda text: _names(text, SECTIONS),
        default=list(SECTIONS),
        help=f"which sections to run [{','.join(SECTIONS)}]",
    )
    add("--output", type=Path, default=RESULTS)
    add("--concurrency", type=int, default=2, help="closed-loop clients [2]")
    add("--docs", type=int, default=500, help="documents per data server [500]")
    add("--warmup-seconds", type=float, default=None, help="per search server [3; quick 2]")
    add("--hedge-percent", type=float, default=5.0, help="hedging on: this budget [5]")
    a = parser.add_argument_group("cpu and deadline (cluster A)")
    a.add_argument("--servers", type=int, default=None, help="data servers [100; quick 40]")
    a.add_argument("--faulty", type=int, default=None, help="hung / killed [10; quick 4]")
    a.add_argument("--timeout-ms", type=int, default=200, help="query deadline D [200]")
    a.add_argument("--phase-seconds", type=float, default=None, help="per phase [20; quick 6]")
    a.add_argument(
        "--pin",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=f"deadline: search server on CPU {SEARCH_CPU}, the rest on CPU {OTHERS_CPU} "
        "[on with 2 CPUs or more]",
    )
    t = parser.add_argument_group("tail (cluster B)")
    t.add_argument("--tail-shards", type=int, default=None, help="x 2 replicas [100; quick 20]")
    t.add_argument("--slow-percent", type=float, default=1.0, help="replicas slowed [1]")
    t.add_argument("--slow-ms", type=int, default=200, help="their delay [200]")
    t.add_argument("--tail-timeout-ms", type=int, default=300, help="deadline [300]")
    t.add_argument(
        "--tail-seconds", type=float, default=None, help="per configuration [120; quick 8]"
    )
    t.add_argument("--tail-rounds", type=int, default=None, help="interleaved [2; quick 1]")
    t.add_argument(
        "--tail-pickers",
        type=lambda text: _names(text, ("ars", "p2c")),
        default=["ars", "p2c"],
        help="pickers compared with and without hedging [ars,p2c]",
    )
    s = parser.add_argument_group("skew (cluster B)")
    s.add_argument("--skew-factor", type=float, default=5.0, help="slow replica x [5]")
    s.add_argument("--skew-delay-ms", type=int, default=None, help="instead of measuring")
    s.add_argument("--skew-seconds", type=float, default=None, help="per picker [20; quick 6]")
    s.add_argument(
        "--skew-pickers",
        type=lambda text: _names(text, ("ars", "p2c")),
        default=["ars", "p2c"],
        help="[ars,p2c]",
    )
    s.add_argument("--newcomer-seconds", type=int, default=5, help="seconds reported [5]")
    # Internal: the baseline / bare-aiohttp load in its own process.
    add("--baseline-worker", action="store_true", help=argparse.SUPPRESS)
    add("--ports", help=argparse.SUPPRESS)
    add("--seconds", type=float, default=0, help=argparse.SUPPRESS)
    add("--count", type=int, default=0, help=argparse.SUPPRESS)
    add("--cpus", help=argparse.SUPPRESS)
    return parser


def main() -> int:
    parser = build_parser()
    args = parser.parse_args()
    if args.baseline_worker:
        return baseline_worker(args)
    quick_defaults(
        args,
        args.quick,
        servers=(100, 40),
        faulty=(10, 4),
        phase_seconds=(20.0, 6.0),
        warmup_seconds=(3.0, 2.0),
        tail_shards=(100, 20),
        tail_seconds=(120.0, 8.0),
        tail_rounds=(2, 1),
        skew_seconds=(20.0, 6.0),
    )
    if args.pin is None:
        args.pin = (os.cpu_count() or 1) >= 2
    if not 1 <= args.faulty < args.servers:
        parser.error("need 1 <= --faulty < --servers")
    if args.tail_rounds < 1 or args.tail_shards < 1:
        parser.error("need --tail-rounds >= 1 and --tail-shards >= 1")
    if not 0 < args.hedge_percent <= 100:
        parser.error("--hedge-percent (hedging on) must be in (0, 100]")
    if args.skew_factor <= 1 and args.skew_delay_ms is None:
        parser.error("--skew-factor must be above 1")
    sections = [s for s in SECTIONS if s in args.sections]

    started = time.monotonic()
    print(
        f"sections {','.join(sections)}; cluster A: {args.servers} data servers "
        f"({args.faulty} hung / killed), deadline {args.timeout_ms} ms; cluster B: "
        f"{args.tail_shards} shards x 2; {args.concurrency} clients; ZooKeeper: 1 node",
        flush=True,
    )
    with DevCluster(zk_nodes=1, tick_time_ms=500) as cluster:
        info = cluster.info()
        results = asyncio.run(main_async(args, str(info["zk"]), str(info["redis"]), sections))
    if "hung:all" in results.get("ours", {}):
        took = results["ours"]["hung:all"]["server_took_max_ms"]
        print(f"\nlargest fan-out time reported by the search server (took_ms), hung: {took} ms")
        for phase in ("hung", "killed"):
            c = results["ours"][f"{phase}:convergence"]
            print(
                f"{phase}: list converged after {c['list_converged_s']} s, answers complete "
                f"again {c['complete_again_s']} s after the fault ({c['incomplete_queries']} "
                f"incomplete queries); after convergence all complete: "
                f"{c['after_all_complete']} (over {c['after_shards_total']} shards)",
                flush=True,
            )
    if "cpu_per_subrequest" in results:
        cpu = results["cpu_per_subrequest"]
        print(
            f"\nCPU per sub-request: search server {cpu['search_server_us']:.0f} µs "
            f"({cpu['search_server_subrequests']} sub-requests), bare aiohttp loop "
            f"{cpu['bare_aiohttp_us']:.0f} µs ({cpu['bare_aiohttp_subrequests']}): "
            f"{cpu['ratio_ours_over_bare']}x",
            flush=True,
        )
    goals = targets(results, args)
    print_targets(goals, args)
    d = args.timeout_ms
    out = {
        "benchmark": "fanout",
        "command": shlex.join([sys.executable, *sys.argv]),
        "parameters": {
            k: (str(v) if isinstance(v, Path) else v)
            for k, v in vars(args).items()
            if k not in ("baseline_worker", "ports", "seconds", "count", "cpus")
        },
        "setup": {
            "zookeeper_nodes": 1,
            "session_timeout_s": float(SESSION_TIMEOUT),
            "search_servers": 1,
            "sections": sections,
            "baseline": "static list of all servers, fan out to all, wait for all, "
            f"aiohttp.ClientTimeout(total={d / 1000}) per request, own process",
            "bare_aiohttp": "the baseline worker on the healthy cluster, same query count",
            "tail_baseline": "the same picker with --hedge-percent 0",
            "skew_baseline": "the other picker; an even split",
        },
        "machine": machine(),
        "results": results,
        "targets": goals,
        "wall_s": round(time.monotonic() - started, 1),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.output} ({out['wall_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
