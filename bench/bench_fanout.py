"""Fan-out under failure: our search server against the original static-list design.

Starts a real local ZooKeeper (one node, for speed) and Redis (``DevCluster``),
``--servers`` data servers (default 100: all but ``--faulty`` in a ``data-server fleet``
over two processes, the ``--faulty`` ones that will be killed as ``data-server``
processes of their own, so that they can be SIGKILLed), one shard per server and one
``search-server`` process with ``--timeout-ms`` as its query deadline. Then drives
closed-loop load (``--concurrency`` clients, each sending its next query as soon as
the previous one answered) through three phases per system:

* ``healthy``;
* ``hung``: ``POST /admin/fault {"mode":"hang"}`` on ``--faulty`` fleet servers;
* ``killed``: SIGKILL of the ``--faulty`` separate data servers.

For our search server (``GET /search?timeout_ms=D``) a fault phase is measured in
two windows: ``transition`` from the fault until its ``GET /cluster`` no longer lists
the faulty servers (the agents take hung servers offline; ZooKeeper drops killed
ones after the session timeout; the fan-out ejects both locally meanwhile), and
``after``, ``--phase-seconds`` after that convergence.

The baseline is the original design of the background document, implemented in this
script and run as its own process (``--baseline-worker``) while our search server is
idle: a static list of all data servers, no discovery, no deadline logic; each query
is sent to every server and waits for all of them, each request with the same HTTP
timeout as our deadline (``aiohttp.ClientTimeout(total=D)``); a request that fails or
times out is an error for that shard, and a query with any such shard is an error.

CPU per sub-request: the search server's CPU time (``/proc/<pid>/stat``) over the
healthy phase divided by the shard answers it merged, against a bare aiohttp loop (the
baseline worker without faults) doing the same fan-out to the same servers for the
same number of queries, measured with ``time.process_time()`` in its own process.

Prints a table and the targets, writes ``bench/results/fanout.json``.

    .venv/bin/python bench/bench_fanout.py [--quick] [--servers 100] [--faulty 10]
        [--timeout-ms 200] [--concurrency 8] [--phase-seconds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from common import free_port_block, machine, spawn_python

from data_server.corpus import sample_queries
from discovery.testing import DevCluster
from discovery.testing.process import terminate_all

SCRIPT = Path(__file__).resolve()
ROOT = SCRIPT.parent.parent
RESULTS = ROOT / "bench" / "results" / "fanout.json"
SESSION_TIMEOUT = "4"
SLACK_MS = 10.0  # the target: p99 and max within the deadline + this
CLK_TCK = os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------- helpers


def _percentile(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime


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
    result = asyncio.run(_baseline(args))
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


# --------------------------------------------------------------------- the bench


@dataclass
class Bench:
    args: argparse.Namespace
    zk: str
    redis: str
    procs: list[asyncio.subprocess.Process] = field(default_factory=list)
    search: asyncio.subprocess.Process | None = None
    search_port: int = 0
    fleet_base: int = 0
    singles_base: int = 0
    singles: dict[str, asyncio.subprocess.Process] = field(default_factory=dict)

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
            *("--zk", self.zk, "--redis", self.redis, "--session-timeout", SESSION_TIMEOUT),
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

    async def serving(self, http: aiohttp.ClientSession) -> set[str] | None:
        try:
            async with http.get(f"http://127.0.0.1:{self.search_port}/cluster") as response:
                view = await response.json()
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None
        return {s["id"] for s in view["servers"] if s["state"] == "serving"}

    async def wait_list(
        self, http: aiohttp.ClientSession, expected: set[str], timeout: float, label: str
    ) -> float | None:
        started = time.monotonic()
        last = 0.0
        while time.monotonic() - started < timeout:
            ids = await self.serving(http)
            if ids == expected:
                return time.monotonic() - started
            if time.monotonic() - last > 5:
                last = time.monotonic()
                n = "-" if ids is None else len(ids)
                print(f"  [{label}] search server routes with {n}/{len(expected)}", flush=True)
            await asyncio.sleep(0.1)
        return None

    async def fault(self, http: aiohttp.ClientSession, port: int, body: dict[str, Any]) -> None:
        async with http.post(f"http://127.0.0.1:{port}/admin/fault", json=body) as response:
            response.raise_for_status()

    async def stop_all(self) -> None:
        await terminate_all(self.procs, timeout=15)


async def run_ours(
    bench: Bench,
    http: aiohttp.ClientSession,
    queries: list[str],
    *,
    seconds: float | None = None,
    until: asyncio.Future[Any] | None = None,
    concurrency: int | None = None,
) -> tuple[list[Query], float]:
    """Closed-loop load through our search server for ``seconds`` or until ``until``."""
    url = f"http://127.0.0.1:{bench.search_port}/search"
    d = str(bench.args.timeout_ms)

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
        clients = concurrency or bench.args.concurrency
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
            i += bench.args.concurrency

    clients = [asyncio.create_task(client(c)) for c in range(bench.args.concurrency)]
    try:
        await until
    finally:
        stop.set()
        await asyncio.gather(*clients)
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


async def scenario(bench: Bench) -> dict[str, Any]:
    args = bench.args
    d = args.timeout_ms
    queries = sample_queries(500, variant=1)
    results: dict[str, Any] = {"ours": {}, "baseline": {}}
    timeout = aiohttp.ClientTimeout(total=30)
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
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

        # ---- healthy
        assert bench.search is not None
        cpu0 = _cpu_seconds(bench.search.pid)
        recs, wall = await run_ours(bench, http, queries, seconds=args.phase_seconds)
        cpu = _cpu_seconds(bench.search.pid) - cpu0
        healthy = summarize(recs, wall, d)
        show("ours", "healthy", healthy)
        recs, wall, _ = await run_baseline(bench, seconds=args.phase_seconds)
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
        }

        # ---- hung
        hung_ids = {bench.fleet_id(i) for i in bench.hung_fleet_indexes()}
        hung_ports = [bench.fleet_base + i for i in bench.hung_fleet_indexes()]
        expected = bench.all_ids() - hung_ids
        await fault_phase(bench, http, queries, results, "hung", expected, hung_ports, show)
        recs, wall, _ = await run_baseline(bench, seconds=args.phase_seconds)
        show("baseline", "hung", summarize(recs, wall, d))
        for port in hung_ports:
            await bench.fault(http, port, {"mode": "none"})
        recovered = await bench.wait_list(http, bench.all_ids(), 120, "recover")
        results["recover_after_hung_s"] = None if recovered is None else round(recovered, 1)
        # Let the local ejections (--eject-cooldown, 10 s by default) run out.
        await wait_complete(bench, http, queries, args.servers)

        # ---- killed
        killed = set(bench.singles)
        await fault_phase(
            bench, http, queries, results, "killed", bench.all_ids() - killed, [], show
        )
        recs, wall, _ = await run_baseline(bench, seconds=args.phase_seconds)
        show("baseline", "killed", summarize(recs, wall, d))
    return results


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
    d = args.timeout_ms
    converged: asyncio.Future[float | None] = asyncio.get_running_loop().create_future()
    t0 = time.monotonic()

    async def inject_and_wait() -> None:
        if hang_ports:
            for port in hang_ports:
                await bench.fault(http, port, {"mode": "hang"})
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


def targets(results: dict[str, Any], d: int) -> dict[str, Any]:
    hung = results["ours"]["hung:all"]
    conv = results["ours"]["hung:convergence"]
    base = results["baseline"]["hung"]
    return {
        "hung_p99_within_deadline_plus_10ms": hung["p99_ms"] <= d + SLACK_MS,
        "hung_queries_over_deadline_plus_10ms": hung["over_deadline"],
        "hung_no_query_over_deadline_plus_10ms": hung["over_deadline"] == 0,
        "hung_complete_again_after_convergence": conv["after_all_complete"],
        "killed_complete_again_after_convergence": results["ours"]["killed:convergence"][
            "after_all_complete"
        ],
        "baseline_hung_p50_ms": base["p50_ms"],
        "baseline_hung_error_rate": base["error_rate"],
    }


async def main_async(args: argparse.Namespace, zk: str, redis: str) -> dict[str, Any]:
    bench = Bench(args, zk, redis)
    try:
        await bench.start()
        return await scenario(bench)
    finally:
        await bench.stop_all()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="40 servers, 4 faulty, 6 s phases")
    parser.add_argument("--servers", type=int, default=None, help="data servers [100]")
    parser.add_argument("--faulty", type=int, default=None, help="hung / killed servers [10]")
    parser.add_argument("--timeout-ms", type=int, default=200, help="query deadline D [200]")
    parser.add_argument("--concurrency", type=int, default=2, help="closed-loop clients [2]")
    parser.add_argument("--phase-seconds", type=float, default=None, help="per phase [20]")
    parser.add_argument("--docs", type=int, default=500, help="documents per data server")
    parser.add_argument("--output", type=Path, default=RESULTS)
    # Internal: the baseline / bare-aiohttp load in its own process.
    parser.add_argument("--baseline-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ports", help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.baseline_worker:
        return baseline_worker(args)
    args.servers = args.servers or (40 if args.quick else 100)
    args.faulty = args.faulty or (4 if args.quick else 10)
    args.phase_seconds = args.phase_seconds or (6.0 if args.quick else 20.0)
    if not 1 <= args.faulty < args.servers:
        parser.error("need 1 <= --faulty < --servers")

    started = time.monotonic()
    print(
        f"{args.servers} data servers ({args.faulty} hung / killed), deadline "
        f"{args.timeout_ms} ms, {args.concurrency} clients, {args.phase_seconds:g} s phases; "
        "ZooKeeper: 1 node",
        flush=True,
    )
    with DevCluster(zk_nodes=1, tick_time_ms=500) as cluster:
        info = cluster.info()
        results = asyncio.run(main_async(args, str(info["zk"]), str(info["redis"])))
    d = args.timeout_ms
    goals = targets(results, d)
    cpu = results["cpu_per_subrequest"]
    took = results["ours"]["hung:all"]["server_took_max_ms"]
    print(f"largest fan-out time reported by the search server (took_ms), hung: {took} ms")
    print(
        f"\nCPU per sub-request: search server {cpu['search_server_us']:.0f} µs "
        f"({cpu['search_server_subrequests']} sub-requests), bare aiohttp loop "
        f"{cpu['bare_aiohttp_us']:.0f} µs ({cpu['bare_aiohttp_subrequests']}): "
        f"{cpu['ratio_ours_over_bare']}x",
        flush=True,
    )
    for phase in ("hung", "killed"):
        c = results["ours"][f"{phase}:convergence"]
        print(
            f"{phase}: list converged after {c['list_converged_s']} s, answers complete "
            f"again {c['complete_again_s']} s after the fault ({c['incomplete_queries']} "
            f"incomplete queries); after convergence all complete: {c['after_all_complete']} "
            f"(over {c['after_shards_total']} shards)",
            flush=True,
        )
    h = results["ours"]["hung:all"]
    print(
        f"target p99 <= D+{SLACK_MS:g} ms with hung servers: {h['p99_ms']} ms -> "
        f"{'met' if goals['hung_p99_within_deadline_plus_10ms'] else 'MISSED'}; "
        f"queries over D+{SLACK_MS:g} ms: {h['over_deadline']} -> "
        f"{'met' if goals['hung_no_query_over_deadline_plus_10ms'] else 'MISSED'}; "
        f"complete again: {'met' if goals['hung_complete_again_after_convergence'] else 'MISSED'}"
        f"; baseline with hung servers: p50 {goals['baseline_hung_p50_ms']} ms, "
        f"errors {goals['baseline_hung_error_rate']:.0%}",
        flush=True,
    )
    out = {
        "benchmark": "fanout",
        "command": shlex.join([sys.executable, *sys.argv]),
        "parameters": {
            k: (str(v) if isinstance(v, Path) else v)
            for k, v in vars(args).items()
            if k not in ("baseline_worker", "ports", "seconds", "count")
        },
        "setup": {
            "zookeeper_nodes": 1,
            "session_timeout_s": float(SESSION_TIMEOUT),
            "search_servers": 1,
            "baseline": "static list of all servers, fan out to all, wait for all, "
            f"aiohttp.ClientTimeout(total={d / 1000}) per request, own process",
            "bare_aiohttp": "the baseline worker on the healthy cluster, same query count",
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
