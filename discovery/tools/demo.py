"""``discovery demo``: the whole system on one machine, with a scripted failure scenario.

Each server is a process of its own, driven only from outside (signals, admin calls,
``GET /cluster``); exit status 0 only if every phase reached its expected state.

Operating: docs/operating.md, "``discovery demo``".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from discovery.adminauth import admin_headers
from discovery.cli.entrypoint import stop_on_signals
from discovery.cli.options import int_range, positive_float
from discovery.errors import DevClusterError
from discovery.safetext import escape_controls
from discovery.testing import DevCluster
from discovery.testing.process import terminate_all

__all__ = ["add_parser", "run"]

log = logging.getLogger(__name__)

# Short enough that the demo's phases take seconds; the session timeout is the bound
# on how long a crashed server stays listed.
SESSION_TIMEOUT = "4"
DOCS_PER_SERVER = "1000"
CRASHED, SLOWED, DRAINED = 5, 3, 2

View = dict[str, Any]


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="run ZooKeeper, Redis, search servers, a fleet of data servers and a failure scenario",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument(
        "--nodes", type=int_range(12, 1000), default=100, help="data servers [default 100]"
    )
    parser.add_argument(
        "--search-servers", type=int_range(2, 9), default=3, help="search servers [default 3]"
    )
    parser.add_argument(
        "--rate",
        type=positive_float,
        default=20.0,
        help="queries per second from the load generator [default 20]",
    )
    parser.add_argument(
        "--duration",
        type=positive_float,
        default=30.0,
        metavar="SECONDS",
        help="with --no-chaos: how long to run [default 30]",
    )
    parser.add_argument(
        "--no-chaos", action="store_true", help="start everything, run for --duration, no failures"
    )
    parser.add_argument(
        "--keep-running",
        action="store_true",
        help="leave everything up at the end until Ctrl-C (prints the dashboard URL)",
    )
    parser.set_defaults(func=run)


@dataclass
class PhaseResult:
    name: str
    expected: str
    ok: bool
    converge_s: float | None
    outcomes: dict[str, int]
    p50_ms: float
    p99_ms: float


@dataclass
class _Query:
    t: float
    outcome: str
    ms: float


@dataclass
class _Cluster:
    """The processes of the demo and how to reach them."""

    zk: str
    redis: str
    workdir: str
    nodes: int
    search_ports: list[int] = field(default_factory=list)
    search: dict[int, asyncio.subprocess.Process] = field(default_factory=dict)
    singles: dict[str, tuple[int, int, asyncio.subprocess.Process | None]] = field(
        default_factory=dict
    )  # id -> (port, shard, process)
    fleet: asyncio.subprocess.Process | None = None
    fleet_base_port: int = 0
    loadgen: asyncio.subprocess.Process | None = None
    queries: list[_Query] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def shards(self) -> int:
        return max(1, self.nodes // 2)

    @property
    def fleet_count(self) -> int:
        return self.nodes - CRASHED - DRAINED

    def fleet_id(self, index: int) -> str:
        return f"ds-{index:04d}"

    def all_ids(self) -> set[str]:
        return {self.fleet_id(i) for i in range(self.fleet_count)} | set(self.singles)


# Niceness of processes (re)started while the cluster runs. On one machine a process
# that starts (imports, builds its index: about a CPU-second each) competes for the
# CPU with every running server; in production it has a machine of its own. Eight of
# them at once on two cores starved the fleet's agents of the CPU to answer their
# ZooKeeper pings: a third of the fleet lost its sessions during a planned restart
# and the mass-loss brake engaged. Niced, newcomers take only the CPU left over.
_NEWCOMER_NICENESS = 10


async def _spawn(
    *argv: str, stdout: int | None = None, newcomer: bool = False
) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        *argv,
        stdout=stdout,
        stdin=asyncio.subprocess.DEVNULL,
        preexec_fn=(lambda: os.nice(_NEWCOMER_NICENESS)) if newcomer else None,
    )


def _common(cluster: _Cluster) -> list[str]:
    return [
        *("--zk", cluster.zk, "--redis", cluster.redis, "--session-timeout", SESSION_TIMEOUT),
        # The narration is the demo's output; the components speak only of errors.
        *("--log-level", "ERROR"),
    ]


def _agent_flags() -> list[str]:
    return [
        *("--docs", DOCS_PER_SERVER, "--probe-interval", "0.5", "--fall", "3", "--rise", "2"),
        *("--drain-grace", "2"),
    ]


async def _start_search(cluster: _Cluster, index: int, *, newcomer: bool = False) -> None:
    port = cluster.search_ports[index]
    cluster.search[index] = await _spawn(
        *("-m", "search_server.cli", *_common(cluster), "--id", f"search-{index + 1}"),
        *("--port", str(port), "--heartbeat-interval", "0.5", "--heartbeat-ttl", "3"),
        # The fleet's shards: one that loses every replica is missing from answers.
        *("--reconcile-interval", "5", "--shards", str(cluster.shards)),
        newcomer=newcomer,
    )


async def _start_single(cluster: _Cluster, instance_id: str, *, newcomer: bool = False) -> None:
    port, shard, _ = cluster.singles[instance_id]
    process = await _spawn(
        *("-m", "data_server.cli", *_common(cluster), *_agent_flags()),
        *("--id", instance_id, "--port", str(port), "--shard", str(shard), "--replica", "1"),
        newcomer=newcomer,
    )
    cluster.singles[instance_id] = (port, shard, process)


async def _views(cluster: _Cluster, http: aiohttp.ClientSession) -> list[View]:
    async def one(port: int) -> View | None:
        try:
            async with http.get(f"http://127.0.0.1:{port}/cluster") as response:
                view: View = await response.json()
                return view
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None

    alive = [i for i, p in cluster.search.items() if p.returncode is None]
    views = await asyncio.gather(*(one(cluster.search_ports[i]) for i in alive))
    return [v for v in views if v is not None]


def _serving_ids(view: View) -> set[str]:
    return {s["id"] for s in view["servers"] if s["state"] == "serving"}


def _listed_ids(view: View) -> set[str]:
    return {s["id"] for s in view["servers"]}


def _leaders(views: list[View]) -> set[str]:
    return {v["self"] for v in views if v["is_leader"]}


def _percentile(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


async def _read_queries(cluster: _Cluster) -> None:
    assert cluster.loadgen is not None
    assert cluster.loadgen.stdout is not None
    async for line in cluster.loadgen.stdout:
        with contextlib.suppress(ValueError, KeyError):
            record = json.loads(line)
            cluster.queries.append(_Query(record["t"], record["outcome"], record["ms"]))


def _outcomes_since(cluster: _Cluster, since: float) -> tuple[dict[str, int], list[float]]:
    outcomes = {"ok": 0, "partial": 0, "overloaded": 0, "error": 0}
    latencies = []
    for query in cluster.queries:
        if query.t >= since:
            outcomes[query.outcome] = outcomes.get(query.outcome, 0) + 1
            latencies.append(query.ms)
    return outcomes, latencies


async def _wait(
    cluster: _Cluster,
    http: aiohttp.ClientSession,
    label: str,
    predicate: Callable[[list[View]], bool],
    timeout: float,
) -> float | None:
    """Poll the search servers until ``predicate(views)``; seconds taken, or None."""
    started = time.monotonic()
    last_line = 0.0
    while True:
        views = await _views(cluster, http)
        elapsed = time.monotonic() - started
        if views and predicate(views):
            return elapsed
        if elapsed > timeout or cluster.stop.is_set():
            return None
        if time.monotonic() - last_line >= 2:
            last_line = time.monotonic()
            # The leaders' names come from the servers' /cluster answers: escaped.
            print(f"  [{label}] {escape_controls(_status_line(cluster, views))}", flush=True)
        # The polling interval of a deadline-bounded wait.
        await asyncio.sleep(0.25)


def _status_line(cluster: _Cluster, views: list[View]) -> str:
    if not views:
        return "no search server answers yet"
    live = sorted(len(_serving_ids(v)) for v in views)
    leaders = ",".join(sorted(_leaders(views))) or "none"
    epoch = max(v["epoch"] for v in views)
    recent, _ = _outcomes_since(cluster, time.time() - 2)
    return (
        f"live {live[0]}..{live[-1]}/{cluster.nodes} on {len(views)} search servers, "
        f"leader {leaders} epoch {epoch} | last 2 s: {recent['ok']} ok, "
        f"{recent['partial']} partial, {recent['error'] + recent['overloaded']} failed"
    )


async def _post(http: aiohttp.ClientSession, url: str, body: Any = None) -> None:
    """An admin request (``url`` is a data server's ``/admin/...``); failures ignored."""
    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
        async with http.post(url, json=body, headers=admin_headers()) as response:
            await response.read()


class _Scenario:
    def __init__(self, cluster: _Cluster, http: aiohttp.ClientSession) -> None:
        self.cluster = cluster
        self.http = http
        self.results: list[PhaseResult] = []

    async def phase(
        self,
        name: str,
        expected: str,
        action: Callable[[], Awaitable[None]],
        predicate: Callable[[list[View]], bool],
        timeout: float,
        *,
        no_failures: bool = False,
    ) -> bool:
        if self.cluster.stop.is_set():
            return False  # interrupted: the remaining phases are skipped
        print(f"\n== {name}: {expected}", flush=True)
        since = time.time()
        await action()
        converge = await _wait(self.cluster, self.http, name, predicate, timeout)
        outcomes, latencies = _outcomes_since(self.cluster, since)
        ok = converge is not None
        if no_failures and outcomes["error"] + outcomes["overloaded"]:
            ok = False
        result = PhaseResult(
            name,
            expected,
            ok,
            converge,
            outcomes,
            _percentile(latencies, 0.5),
            _percentile(latencies, 0.99),
        )
        self.results.append(result)
        status = "reached" if converge is not None else "NOT reached"
        took = f" in {converge:.1f} s" if converge is not None else f" within {timeout:g} s"
        print(
            f"   {status}{took}; queries: {_fmt_outcomes(outcomes)}, "
            f"p50 {result.p50_ms:.1f} ms, p99 {result.p99_ms:.1f} ms",
            flush=True,
        )
        return ok


def _fmt_outcomes(outcomes: dict[str, int]) -> str:
    return ", ".join(f"{v} {k}" for k, v in outcomes.items())


def _print_summary(results: Sequence[PhaseResult]) -> None:
    print(
        "\nphase                         result   converged   ok  partial  failed  p50 ms  p99 ms"
    )
    for r in results:
        failed = r.outcomes["error"] + r.outcomes["overloaded"]
        converged = f"{r.converge_s:.1f} s" if r.converge_s is not None else "-"
        print(
            f"{r.name:<29} {'ok' if r.ok else 'FAILED':<8} {converged:>9} "
            f"{r.outcomes['ok']:>4} {r.outcomes['partial']:>8} {failed:>7} "
            f"{r.p50_ms:>7.1f} {r.p99_ms:>7.1f}",
            flush=True,
        )


async def _scenario(cluster: _Cluster, args: argparse.Namespace, stop: asyncio.Event) -> bool:
    nodes = cluster.nodes
    every = cluster.all_ids()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:
        scenario = _Scenario(cluster, http)

        def converged(expected_ids: set[str]) -> Callable[[list[View]], bool]:
            def check(views: list[View]) -> bool:
                return (
                    len(views) == sum(p.returncode is None for p in cluster.search.values())
                    # Gone from the list, not merely draining: the phase is over.
                    and all(_listed_ids(v) == _serving_ids(v) == expected_ids for v in views)
                    and len(_leaders(views)) == 1
                    and len({(v["epoch"], v["version"]) for v in views}) == 1
                )

            return check

        async def nothing() -> None:
            return None

        ok = await scenario.phase(
            "1. start",
            # --shards tells the search servers the fleet's shards: until a shard's
            # servers have registered it is missing from answers, which say so.
            f"{nodes} registered, one leader, list published (answers before that miss "
            "the shards not registered yet: partial)",
            nothing,
            converged(every),
            timeout=300,
        )
        if not ok or args.no_chaos:
            if ok:
                print(f"\nrunning for {args.duration:g} s without failures", flush=True)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(args.duration):
                        while not stop.is_set():
                            await _wait(cluster, http, "steady", lambda v: False, 5)
                outcomes, _latencies = _outcomes_since(cluster, 0)
                print(f"queries: {_fmt_outcomes(outcomes)}", flush=True)
            _print_summary(scenario.results)
            return ok

        singles = sorted(cluster.singles)
        crashed, drained = singles[:CRASHED], singles[CRASHED : CRASHED + DRAINED]
        slowed = [cluster.fleet_id(i) for i in range(1, cluster.fleet_count, 7)][:SLOWED]
        remaining = every - set(crashed)

        async def crash() -> None:
            for instance_id in crashed:
                process = cluster.singles[instance_id][2]
                assert process is not None
                process.kill()
                await process.wait()

        await scenario.phase(
            f"2. crash {CRASHED} data servers",
            f"removed after the {SESSION_TIMEOUT} s session timeout",
            crash,
            converged(remaining),
            timeout=60,
        )

        remaining -= set(slowed)

        async def slow_down() -> None:
            for instance_id in slowed:
                port = cluster.fleet_base_port + int(instance_id.removeprefix("ds-"))
                await _post(
                    http, f"http://127.0.0.1:{port}/admin/fault", {"mode": "slow", "delay_ms": 1500}
                )

        await scenario.phase(
            f"3. slow down {SLOWED} data servers",
            "their probes take them offline",
            slow_down,
            converged(remaining),
            timeout=60,
        )

        remaining -= set(drained)

        async def drain() -> None:
            for instance_id in drained:
                process = cluster.singles[instance_id][2]
                assert process is not None
                process.send_signal(signal.SIGTERM)

        await scenario.phase(
            f"4. drain {DRAINED} data servers",
            "removed with no failed query",
            drain,
            converged(remaining),
            timeout=60,
            no_failures=True,
        )

        views = await _views(cluster, http)
        old_leader = next(iter(_leaders(views)), None)
        old_epoch = max((v["epoch"] for v in views), default=0)
        killed = next(i for i in cluster.search if f"search-{i + 1}" == old_leader)

        async def kill_leader() -> None:
            process = cluster.search[killed]
            process.kill()
            await process.wait()

        def new_leader(views: list[View]) -> bool:
            return converged(remaining)(views) and all(
                v["epoch"] > old_epoch and v["leader"] != old_leader for v in views
            )

        await scenario.phase(
            "5. kill the leader",
            f"{old_leader} replaced, higher epoch",
            kill_leader,
            new_leader,
            timeout=60,
        )

        async def recover() -> None:
            for instance_id in slowed:
                port = cluster.fleet_base_port + int(instance_id.removeprefix("ds-"))
                await _post(http, f"http://127.0.0.1:{port}/admin/fault", {"mode": "none"})
            for instance_id in crashed + drained:
                await _start_single(cluster, instance_id, newcomer=True)
            await _start_search(cluster, killed, newcomer=True)

        await scenario.phase(
            "6. recover", f"back to {nodes}", recover, converged(every), timeout=120
        )
        _print_summary(scenario.results)
        return all(r.ok for r in scenario.results)


async def _run(args: argparse.Namespace, zk: str, redis: str, workdir: str) -> bool:
    cluster = _Cluster(zk=zk, redis=redis, workdir=workdir, nodes=args.nodes)
    taken: set[int] = set()
    search_base = _free_block(args.search_servers, taken)
    cluster.search_ports = list(range(search_base, search_base + args.search_servers))
    cluster.fleet_base_port = _free_block(cluster.fleet_count, taken)
    singles_base = _free_block(CRASHED + DRAINED, taken)
    for j in range(CRASHED + DRAINED):
        shard = (cluster.shards - CRASHED - DRAINED + j) % cluster.shards
        cluster.singles[f"ds-solo-{j}"] = (singles_base + j, shard, None)
    stop = stop_on_signals(cluster.stop)
    reader: asyncio.Task[None] | None = None
    try:
        print(f"ZooKeeper {zk}\nRedis     {redis}", flush=True)
        for index in range(args.search_servers):
            await _start_search(cluster, index)
        cluster.fleet = await _spawn(
            *("-m", "data_server.cli", "fleet", *_common(cluster), *_agent_flags()),
            *("--count", str(cluster.fleet_count), "--procs", "2"),
            *("--shards", str(cluster.shards), "--base-port", str(cluster.fleet_base_port)),
        )
        for instance_id in cluster.singles:
            await _start_single(cluster, instance_id)
        targets = [f"http://127.0.0.1:{port}" for port in cluster.search_ports]
        cluster.loadgen = await _spawn(
            *("-m", "data_server.cli", "loadgen", "--json", "--rate", str(args.rate)),
            *(arg for url in targets for arg in ("--target", url)),
            stdout=asyncio.subprocess.PIPE,
        )
        reader = asyncio.create_task(_read_queries(cluster))
        print(f"dashboard: http://127.0.0.1:{cluster.search_ports[0]}/", flush=True)
        ok = await _scenario(cluster, args, stop)
        if args.keep_running and not stop.is_set():
            print(
                f"\nstill running; dashboard http://127.0.0.1:{cluster.search_ports[0]}/ "
                "— Ctrl-C to stop",
                flush=True,
            )
            await stop.wait()
        return ok
    finally:
        await _stop_all(cluster)
        if reader is not None:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader


def _free_block(count: int, taken: set[int]) -> int:
    """A free block of ``count`` ports below the kernel's ephemeral range.

    Ports picked inside the ephemeral range can be taken by an outgoing connection
    (ours: hundreds of them) between the pick and the bind, which a fleet does only
    after indexing its shards.
    """
    low, high = 20_000, _ephemeral_low() - count
    for _ in range(200):
        base = random.randrange(low, max(low + 1, high))
        block = set(range(base, base + count))
        if not block & taken and _range_free(base, count):
            taken |= block
            return base
    raise DevClusterError(f"no block of {count} free ports between {low} and {high}")


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as ranges:
            return int(ranges.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def _range_free(base: int, count: int) -> bool:
    for port in range(base, base + count):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


async def _stop_all(cluster: _Cluster) -> None:
    processes = [cluster.loadgen, *cluster.search.values(), cluster.fleet]
    processes += [entry[2] for entry in cluster.singles.values()]
    await terminate_all(processes, timeout=20)


def run(args: argparse.Namespace) -> int:
    zk = os.environ.get("DISCOVERY_ZK_HOSTS")
    redis = os.environ.get("DISCOVERY_REDIS_URL")
    try:
        with contextlib.ExitStack() as stack:
            if not (zk and redis):
                print("starting a 3-server ZooKeeper ensemble and Redis…", flush=True)
                cluster = stack.enter_context(DevCluster(zk_nodes=3, tick_time_ms=500))
                info = cluster.info()
                zk = zk or str(info["zk"])
                redis = redis or str(info["redis"])
                workdir = str(info["workdir"])
            else:
                workdir = ""
            ok = asyncio.run(_run(args, zk, redis, workdir))
    except DevClusterError as exc:
        print(f"discovery demo: {exc}", file=sys.stderr)
        return 1
    return 0 if ok else 1
