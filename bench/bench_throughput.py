"""Throughput of the whole demo cluster: the queries/s at which p99 stays <= 100 ms,
before and after issue 14's data plane, in one run.

Starts a real local ZooKeeper (one node: the demo runs three, but a query never
touches ZooKeeper, so the ensemble's size does not change the figure) and Redis
(``DevCluster``), then, one system after the other, the demo's topology
(``discovery demo``'s flags): 3 search servers and 100 data servers, 50 shards x 2
replicas, 93 of them in a ``data-server fleet`` of two processes (replica r of shard s
is fleet server ``r * 50 + s``) and the other 7 (replica 1 of shards 43..49) as
processes of their own, 1,000 documents each. Each system gets a ZooKeeper chroot and
a ``--cluster`` (Redis prefix) of its own and is stopped before the next one starts.

The systems, in this order:

* ``before``: ``--baseline-rev`` (default ``4e47d66``, the code before issue 14's
  data-plane work), checked out with ``git worktree add --detach`` in a temporary
  directory (removed at the end, also on failure); every process of that system runs
  with that directory as its working directory and ``PYTHONPATH``, so that its
  packages are the ones imported (checked before it starts), with this same Python.
* ``after``: this working tree, as it is (uncommitted changes included), search
  servers with their default ``--picker``, ``--hedge-percent`` and ``--event-loop``.

Load is open-loop, from a client in a process of its own (this script with
``--loadgen-worker``, asyncio on uvloop, aiohttp with keep-alive connections): Poisson
arrivals (``--arrivals fixed``: evenly spaced) at a target rate, the same seeded
arrival times for both systems, round-robin over the 3 search servers, each query
``GET /search?q=..&k=10&timeout_ms=--timeout-ms`` (1,000 ms, so that the search server
cuts nothing) with real queries (``data_server.corpus.sample_queries``). A query's
latency runs from the time it was scheduled to be sent to its answer's last byte (the
client's own lateness included: no coordinated omission); that lateness is reported
per step (``late p99``), so that a client that could not keep up shows. Outcomes:
``ok``, ``partial`` (``"partial": true``) and errors (not 200, or no answer).

Each step: ``--warmup`` seconds of load not counted, then ``--seconds`` measured (at
least ``--min-queries`` queries: longer at low rates), counting the queries scheduled
in that window. A step passes when its p99 <= ``--p99-ms`` with no error and no
partial answer. The search starts at ``--start-rate`` and multiplies the rate by
``--factor`` while steps pass, then bisects ``--bisect`` times between the last rate
that passed and the first that failed (or until they are within ``--resolution``).
After a failed step it waits until every search server routes to every data server
again with none ejected. Figures per step: queries sent per second (``sent``: Poisson
arrivals scatter around the rate), achieved q/s (answers completed in the window / its
length), p50 / p99 / max, errors, partial answers, the CPU that each kind of process
used (``/proc/<pid>/stat``: search servers, data servers, ZooKeeper, Redis, the load
client, this script; ``others``: the rest of the machine's user and system time, from
``/proc/stat``, i.e. work that is not this benchmark's: a warning is printed when it is
not negligible) and the busiest single process (one Python process uses one core at
most: a fleet worker serves 46 or 47 data servers).

CPU per query: the first step runs at ``--common-rate`` (default the start rate),
which both systems are expected to sustain: each kind's CPU seconds over that window
per query measured, gross and net of the idle cost (probes, heartbeats, ZooKeeper
pings), measured with no load for ``--idle-seconds`` before the first step.

Prints a table per system and a summary line, writes ``bench/results/throughput.json``.

    .venv/bin/python bench/bench_throughput.py [--quick] [--output PATH]
        [--baseline-rev 4e47d66] [--systems before,after] [--start-rate 20]
        [--factor 1.5] [--bisect 4] [--warmup 2] [--seconds 10] [--p99-ms 100]

Child processes log at ``BENCH_LOG`` (default ERROR).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
from common import (
    CLK_TCK,
    descendants,
    free_port_block,
    process_cpu_seconds,
    process_tree,
    quick_defaults,
    write_results,
)
from kazoo.client import KazooClient

from data_server.corpus import sample_queries
from discovery.testing import DevCluster
from discovery.testing.process import terminate_all

SCRIPT = Path(__file__).resolve()
ROOT = SCRIPT.parent.parent
RESULTS = ROOT / "bench" / "results" / "throughput.json"


# The demo's topology and flags (discovery/tools/demo.py).
NODES = 100
SHARDS = 50
SOLO = 7  # the demo's crashed + drained data servers: processes of their own
FLEET = NODES - SOLO
SEARCH_SERVERS = 3
SESSION_TIMEOUT = "4"
DOCS = "1000"
QUERY_VARIANT = 14  # a set of queries of this benchmark's own
KINDS = ("search", "data", "zookeeper", "redis", "loadgen", "bench")
SYSTEMS = ("before", "after")
OTHERS_WARN = 0.1  # cores of other work during the steps worth a warning


# --------------------------------------------------------------------------- /proc


def _machine_jiffies() -> dict[str, int]:
    """Machine-wide user+nice+system, irq+softirq, steal and total jiffies."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = values
    return {
        "busy": user + nice + system,
        "irq": irq + softirq,
        "steal": steal,
        "total": sum(values),
    }


@dataclass
class CpuSnapshot:
    at: float
    pids: dict[int, tuple[str, str, float]]  # pid -> (kind, process name, CPU seconds)
    jiffies: dict[str, int]


@dataclass
class CpuWindow:
    seconds: float
    by_kind: dict[str, float]  # CPU seconds
    by_process: dict[str, float]  # CPU seconds
    others: float  # CPU seconds of processes not this benchmark's (user + system)
    irq: float  # CPU seconds in interrupts and softirqs (loopback traffic among them)
    steal_share: float


def cpu_window(a: CpuSnapshot, b: CpuSnapshot) -> CpuWindow:
    by_kind = dict.fromkeys(KINDS, 0.0)
    by_process: dict[str, float] = {}
    for pid, (kind, name, cpu) in a.pids.items():
        if pid in b.pids:
            used = max(0.0, b.pids[pid][2] - cpu)
            by_kind[kind] += used
            by_process[name] = by_process.get(name, 0.0) + used
    d = {k: b.jiffies[k] - a.jiffies[k] for k in a.jiffies}
    ours = sum(by_kind.values())
    return CpuWindow(
        seconds=b.at - a.at,
        by_kind=by_kind,
        by_process=by_process,
        others=max(0.0, d["busy"] / CLK_TCK - ours),
        irq=d["irq"] / CLK_TCK,
        steal_share=round(d["steal"] / d["total"], 4) if d["total"] else 0.0,
    )


# --------------------------------------------------------------------- load client


async def _loadgen_main(args: argparse.Namespace) -> None:
    """The open-loop client: one command per stdin line, events on stdout."""
    targets: list[str] = json.loads(args.targets)
    queries = sample_queries(500, variant=QUERY_VARIANT)
    # Pre-encoded URLs: the client's CPU per query stays small and constant.
    urls = [
        [f"{t}/search?q={quote(q)}&k={args.k}&timeout_ms={args.timeout_ms}" for q in queries]
        for t in targets
    ]
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    def emit(record: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(record, separators=(",", ":")) + "\n")
        sys.stdout.flush()

    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
    timeout = aiohttp.ClientTimeout(total=args.timeout_ms / 1000 + 5)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        serial = 0
        while line := await reader.readline():
            command = json.loads(line)
            if command.get("quit"):
                break
            records = await _open_loop(session, urls, command, serial, emit)
            serial += len(records)
            emit({"event": "result", "records": records})


async def _open_loop(
    session: aiohttp.ClientSession,
    urls: list[list[str]],
    command: dict[str, Any],
    serial: int,
    emit: Any,
) -> list[list[Any]]:
    """Send queries at the arrival times of ``command``; every query's record
    ``[scheduled s, late ms, latency ms, outcome, done s]`` (seconds from the start)."""
    loop = asyncio.get_running_loop()
    rate, warmup, seconds = command["rate"], command["warmup"], command["seconds"]
    rng = random.Random(str(command["seed"]))
    offsets, t = [], 0.0
    while True:
        t += rng.expovariate(rate) if command["arrivals"] == "poisson" else 1 / rate
        if t >= warmup + seconds:
            break
        offsets.append(t)
    start = loop.time() + 0.05
    records: list[list[Any]] = []
    tasks: set[asyncio.Task[None]] = set()
    loop.call_at(start + warmup, emit, {"event": "measure_start"})
    loop.call_at(start + warmup + seconds, emit, {"event": "measure_end"})

    async def one(i: int, scheduled: float) -> None:
        sent = loop.time()
        n = serial + i
        url = urls[n % len(urls)][n % len(urls[0])]
        outcome = "error"
        try:
            async with session.get(url) as response:
                if response.status == 200:
                    body = await response.json()
                    outcome = "partial" if body.get("partial") else "ok"
                else:
                    await response.read()
                    outcome = f"http {response.status}"
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            outcome = type(exc).__name__
        done = loop.time()
        records.append(
            [
                round(scheduled - start, 6),
                round((sent - scheduled) * 1000, 3),
                round((done - scheduled) * 1000, 3),
                outcome,
                round(done - start, 6),
            ]
        )

    for i, offset in enumerate(offsets):
        scheduled = start + offset
        delay = scheduled - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(one(i, scheduled))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    await asyncio.sleep(max(0.0, start + warmup + seconds - loop.time()) + 0.01)
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)
    return records


def loadgen_worker(args: argparse.Namespace) -> int:
    try:
        import uvloop

        uvloop.run(_loadgen_main(args))
    except ImportError:
        asyncio.run(_loadgen_main(args))
    return 0


class LoadClient:
    """The load client's process, driven one step at a time."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    async def start(cls, targets: list[str], args: argparse.Namespace) -> LoadClient:
        process = await asyncio.create_subprocess_exec(
            *(sys.executable, str(SCRIPT), "--loadgen-worker"),
            *("--targets", json.dumps(targets), "--timeout-ms", str(args.timeout_ms)),
            *("--k", str(args.k)),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            cwd=ROOT,
            limit=1 << 26,
        )
        return cls(process)

    async def run(
        self,
        command: dict[str, Any],
        on_start: Any = None,
        on_end: Any = None,
    ) -> list[list[Any]]:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write((json.dumps(command) + "\n").encode())
        await self.process.stdin.drain()
        while True:
            line = await self.process.stdout.readline()
            if not line:
                raise RuntimeError(f"the load client exited ({self.process.returncode})")
            event = json.loads(line)
            if event["event"] == "measure_start" and on_start is not None:
                on_start()
            elif event["event"] == "measure_end" and on_end is not None:
                on_end()
            elif event["event"] == "result":
                records: list[list[Any]] = event["records"]
                return records

    async def stop(self) -> None:
        if self.process.returncode is None and self.process.stdin is not None:
            with contextlib.suppress(OSError, RuntimeError):
                self.process.stdin.write(b'{"quit": true}\n')
                await self.process.stdin.drain()
                self.process.stdin.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.process.wait(), 10)
        await terminate_all([self.process], timeout=5)


# ------------------------------------------------------------------ the system


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


def git(*argv: str) -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), *argv], check=True, capture_output=True, text=True
    ).stdout.strip()


@dataclass
class System:
    """The demo's topology, run from the source tree ``root``."""

    name: str
    root: Path
    zk: str  # hosts with the chroot
    redis: str
    services: dict[str, int]  # DevCluster pids: zookeeper, redis
    procs: list[asyncio.subprocess.Process] = field(default_factory=list)
    search: list[asyncio.subprocess.Process] = field(default_factory=list)
    search_ports: list[int] = field(default_factory=list)
    data: list[asyncio.subprocess.Process] = field(default_factory=list)
    seen_data_pids: set[int] = field(default_factory=set)

    def env(self) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": str(self.root)}

    def check_imports(self) -> dict[str, str]:
        """Where this system's processes import our packages from (must be ``root``)."""
        code = (
            "import json, data_server, discovery, search_server;"
            "print(json.dumps({m.__name__: m.__file__ for m in "
            "(data_server, discovery, search_server)}))"
        )
        out = subprocess.run(
            [sys.executable, "-c", code],
            cwd=self.root,
            env=self.env(),
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        files: dict[str, str] = json.loads(out)
        for name, path in files.items():
            if not Path(path).resolve().is_relative_to(self.root.resolve()):
                raise RuntimeError(f"{self.name}: {name} imported from {path}, not {self.root}")
        return files

    async def spawn(self, *argv: str) -> asyncio.subprocess.Process:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            cwd=self.root,
            env=self.env(),
        )
        self.procs.append(process)
        return process

    def common(self) -> list[str]:
        return [
            *("--zk", self.zk, "--redis", self.redis, "--cluster", f"throughput-{self.name}"),
            *("--session-timeout", SESSION_TIMEOUT),
            *("--log-level", os.environ.get("BENCH_LOG", "ERROR")),
        ]

    @staticmethod
    def agent() -> list[str]:
        return [
            *("--docs", DOCS, "--probe-interval", "0.5", "--fall", "3", "--rise", "2"),
            *("--drain-grace", "2"),
        ]

    def all_ids(self) -> set[str]:
        return {f"ds-{i:04d}" for i in range(FLEET)} | {f"ds-solo-{j}" for j in range(SOLO)}

    async def start(self) -> None:
        taken: set[int] = set()
        search_base = free_port_block(SEARCH_SERVERS, taken)
        fleet_base = free_port_block(FLEET, taken)
        solo_base = free_port_block(SOLO, taken)
        self.search_ports = [search_base + i for i in range(SEARCH_SERVERS)]
        for i, port in enumerate(self.search_ports):
            self.search.append(
                await self.spawn(
                    *("-m", "search_server.cli", *self.common(), "--id", f"search-{i + 1}"),
                    *("--port", str(port), "--heartbeat-interval", "0.5"),
                    *("--heartbeat-ttl", "3", "--reconcile-interval", "5"),
                )
            )
        self.data.append(
            await self.spawn(
                *("-m", "data_server.cli", "fleet", *self.common(), *self.agent()),
                *("--count", str(FLEET), "--procs", "2"),
                *("--shards", str(SHARDS), "--base-port", str(fleet_base)),
            )
        )
        for j in range(SOLO):
            shard = (SHARDS - SOLO + j) % SHARDS
            self.data.append(
                await self.spawn(
                    *("-m", "data_server.cli", *self.common(), *self.agent()),
                    *("--id", f"ds-solo-{j}", "--port", str(solo_base + j)),
                    *("--shard", str(shard), "--replica", "1"),
                )
            )

    async def views(self, http: aiohttp.ClientSession) -> list[dict[str, Any] | None]:
        async def one(port: int) -> dict[str, Any] | None:
            try:
                async with http.get(f"http://127.0.0.1:{port}/cluster") as response:
                    view: dict[str, Any] = await response.json()
                    return view
            except (aiohttp.ClientError, TimeoutError, ValueError):
                return None

        return list(await asyncio.gather(*(one(p) for p in self.search_ports)))

    async def wait_healthy(
        self, http: aiohttp.ClientSession, timeout: float, label: str
    ) -> float | None:
        """Seconds until every search server routes to every data server (state
        ``serving``, none ejected locally); None after ``timeout``."""
        expected = self.all_ids()
        started = time.monotonic()
        last = started
        while time.monotonic() - started < timeout:
            for p in self.procs:
                if p.returncode is not None:
                    raise RuntimeError(f"{self.name}: a process exited ({p.returncode})")
            views = await self.views(http)
            counts: list[str] = []
            for view in views:
                if view is None:
                    counts.append("-")
                    continue
                good = {
                    s["id"]
                    for s in view["servers"]
                    if s["state"] == "serving" and not s.get("ejected")
                }
                counts.append(str(len(good & expected)) if good <= expected else "?")
            if counts == [str(len(expected))] * len(views):
                return time.monotonic() - started
            if time.monotonic() - last > 10:
                last = time.monotonic()
                print(
                    f"  [{self.name} {label}] routed to: {', '.join(counts)} of {len(expected)}",
                    flush=True,
                )
            await asyncio.sleep(0.25)
        return None

    def snapshot(self, loadgen_pid: int | None) -> CpuSnapshot:
        """CPU seconds of every process of this benchmark, by kind and by name
        (``search-1``, ``fleet-worker-0``, ``ds-solo-3``, ...)."""
        tree = process_tree()
        names: dict[int, tuple[str, str]] = {os.getpid(): ("bench", "bench")}
        for i, p in enumerate(self.search):
            for pid in descendants(p.pid, tree):
                names[pid] = ("search", f"search-{i + 1}")
        for i, p in enumerate(self.data):
            if i == 0:  # the fleet: its parent and its workers (in order of their pids)
                names[p.pid] = ("data", "fleet-parent")
                workers = sorted(set(descendants(p.pid, tree)) - {p.pid})
                for w, pid in enumerate(workers):
                    names[pid] = ("data", f"fleet-worker-{w}")
            else:
                for pid in descendants(p.pid, tree):
                    names[pid] = ("data", f"ds-solo-{i - 1}")
        self.seen_data_pids.update(pid for pid, (kind, _) in names.items() if kind == "data")
        for kind, pid in self.services.items():
            names[pid] = (kind, kind)
        if loadgen_pid is not None:
            names[loadgen_pid] = ("loadgen", "loadgen")
        pids = {}
        for pid, (kind, name) in names.items():
            cpu = process_cpu_seconds(pid)
            if cpu is not None:
                pids[pid] = (kind, name, cpu)
        return CpuSnapshot(time.monotonic(), pids, _machine_jiffies())

    async def stop(self) -> None:
        for p in self.data:
            with contextlib.suppress(OSError):
                self.seen_data_pids.update(descendants(p.pid, process_tree()))
        await terminate_all(self.procs, timeout=20)
        # The fleet's workers, should their parent have been killed before them.
        for pid in self.seen_data_pids:
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/cwd") == str(self.root):
                    os.kill(pid, signal.SIGKILL)


# ---------------------------------------------------------------------- steps


def _pct(ordered: list[float], q: float) -> float:
    """Nearest-rank percentile of sorted values."""
    if not ordered:
        return 0.0
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@dataclass
class Step:
    rate: float
    row: dict[str, Any]
    passed: bool


def summarize_step(
    rate: float,
    records: list[list[Any]],
    warmup: float,
    seconds: float,
    cpu: CpuWindow | None,
    args: argparse.Namespace,
) -> dict[str, Any]:
    window = [r for r in records if warmup <= r[0] < warmup + seconds]
    latency = sorted(r[2] for r in window)
    late = sorted(r[1] for r in window)
    outcomes: dict[str, int] = {}
    for r in window:
        outcomes[r[3]] = outcomes.get(r[3], 0) + 1
    errors = sum(n for o, n in outcomes.items() if o not in ("ok", "partial"))
    answered = sum(
        1 for r in records if r[3] in ("ok", "partial") and warmup <= r[4] < warmup + seconds
    )
    n = len(window)
    row: dict[str, Any] = {
        "rate": rate,
        "seconds": seconds,
        "queries": n,
        "offered_qps": round(n / seconds, 1),
        "achieved_qps": round(answered / seconds, 1),
        "p50_ms": round(_pct(latency, 0.5), 1),
        "p90_ms": round(_pct(latency, 0.9), 1),
        "p99_ms": round(_pct(latency, 0.99), 1),
        "max_ms": round(latency[-1], 1) if latency else 0.0,
        "mean_ms": round(statistics.fmean(latency), 1) if latency else 0.0,
        "errors": errors,
        "partial": outcomes.get("partial", 0),
        "outcomes": outcomes,
        "late_p50_ms": round(_pct(late, 0.5), 2),
        "late_p99_ms": round(_pct(late, 0.99), 2),
        "late_max_ms": round(late[-1], 2) if late else 0.0,
    }
    if cpu is not None:
        row["cpu_window_s"] = round(cpu.seconds, 3)
        row["cores"] = {k: round(v / cpu.seconds, 3) for k, v in cpu.by_kind.items()}
        row["cores"]["others"] = round(cpu.others / cpu.seconds, 3)
        row["cores"]["irq"] = round(cpu.irq / cpu.seconds, 3)
        busiest = max(cpu.by_process, key=lambda k: cpu.by_process[k])
        row["busiest_process"] = {
            "name": busiest,
            "cores": round(cpu.by_process[busiest] / cpu.seconds, 3),
        }
        row["cores_by_process"] = {
            k: round(v / cpu.seconds, 3) for k, v in sorted(cpu.by_process.items())
        }
        row["cpu_ms_per_query"] = {
            k: round(v / n * 1000, 3) if n else None for k, v in cpu.by_kind.items()
        }
        row["steal_share"] = cpu.steal_share
    row["passed"] = n > 0 and errors == 0 and row["partial"] == 0 and row["p99_ms"] <= args.p99_ms
    return row


HEADER = (
    f"{'system':<7}{'rate':>7}{'sent':>7}{'q/s':>7}{'p50 ms':>8}{'p99 ms':>8}{'max ms':>8}"
    f"{'errors':>7}{'partial':>8}{'late99':>7} | cores:{'search':>7}{'data':>6}{'zk':>5}"
    f"{'redis':>6}{'client':>7}{'others':>7} | {'busiest process':<21}"
)


def _line(system: str, r: dict[str, Any]) -> str:
    c = r.get("cores", {})
    b = r.get("busiest_process", {"name": "-", "cores": 0.0})
    return (
        f"{system:<7}{r['rate']:>7g}{r['offered_qps']:>7.1f}{r['achieved_qps']:>7.1f}"
        f"{r['p50_ms']:>8.1f}{r['p99_ms']:>8.1f}{r['max_ms']:>8.1f}{r['errors']:>7}"
        f"{r['partial']:>8}{r['late_p99_ms']:>7.1f} |       {c.get('search', 0):>7.2f}"
        f"{c.get('data', 0):>6.2f}{c.get('zookeeper', 0):>5.2f}{c.get('redis', 0):>6.2f}"
        f"{c.get('loadgen', 0):>7.2f}{c.get('others', 0):>7.2f} | {b['name']:<15}"
        f"{b['cores']:>5.2f}  {'ok' if r['passed'] else 'FAIL'}"
    )


class Runner:
    """One system's measurements: idle, warm-up, the common rate and the step search."""

    def __init__(
        self,
        system: System,
        client: LoadClient,
        http: aiohttp.ClientSession,
        args: argparse.Namespace,
    ) -> None:
        self.system = system
        self.client = client
        self.http = http
        self.args = args
        self.steps: list[dict[str, Any]] = []

    async def load(
        self, rate: float, warmup: float, seconds: float
    ) -> tuple[list[list[Any]], CpuWindow | None]:
        marks: dict[str, CpuSnapshot] = {}
        pid = self.client.process.pid
        command = {
            "rate": rate,
            "warmup": warmup,
            "seconds": seconds,
            # The same arrival times at the same rate in both systems.
            "seed": f"{rate:g}:{warmup:g}:{seconds:g}",
            "arrivals": self.args.arrivals,
        }
        records = await self.client.run(
            command,
            on_start=lambda: marks.__setitem__("a", self.system.snapshot(pid)),
            on_end=lambda: marks.__setitem__("b", self.system.snapshot(pid)),
        )
        cpu = cpu_window(marks["a"], marks["b"]) if len(marks) == 2 else None
        return records, cpu

    async def idle(self) -> dict[str, Any]:
        pid = self.client.process.pid
        a = self.system.snapshot(pid)
        await asyncio.sleep(self.args.idle_seconds)
        w = cpu_window(a, self.system.snapshot(pid))
        out = {k: round(v / w.seconds, 4) for k, v in w.by_kind.items()}
        out["others"] = round(w.others / w.seconds, 4)
        out["irq"] = round(w.irq / w.seconds, 4)
        return out

    async def step(self, rate: float, *, common: bool = False) -> Step:
        args = self.args
        seconds = min(max(args.seconds, args.min_queries / rate), args.max_step_seconds)
        records, cpu = await self.load(rate, args.warmup, seconds)
        row = summarize_step(rate, records, args.warmup, seconds, cpu, args)
        row["common_rate_step"] = common
        self.steps.append(row)
        print(_line(self.system.name, row), flush=True)
        if not row["passed"]:
            healthy = await self.system.wait_healthy(self.http, 60, f"after {rate:g} q/s")
            row["healthy_again_s"] = None if healthy is None else round(healthy, 1)
            if healthy is None:
                print(f"  warning: {self.system.name} not healthy 60 s after a step", flush=True)
        await asyncio.sleep(args.settle)
        return Step(rate, row, row["passed"])

    async def search(self, first: Step) -> tuple[Step | None, Step | None]:
        """Up by ``--factor`` from ``first`` while steps pass, then bisect."""
        args = self.args
        good: Step | None = None
        bad: Step | None = None
        current = first
        while True:
            if current.passed:
                good = current
                if current.rate >= args.max_rate:
                    break
                current = await self.step(
                    _round_rate(min(args.max_rate, current.rate * args.factor))
                )
            else:
                bad = current
                break
        while good is None and bad is not None and bad.rate > args.min_rate:
            current = await self.step(_round_rate(max(args.min_rate, bad.rate / args.factor)))
            if current.passed:
                good = current
            else:
                bad = current
        for _ in range(args.bisect):
            if good is None or bad is None:
                break
            lo, hi = good.rate, bad.rate
            if hi - lo <= max(1.0, args.resolution * lo):
                break
            mid = _round_rate((lo + hi) / 2)
            if mid in (lo, hi):
                break
            current = await self.step(mid)
            if current.passed:
                good = current
            else:
                bad = current
        return good, bad


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _round_rate(rate: float) -> float:
    return float(round(rate)) if rate >= 10 else round(rate, 1)


# ------------------------------------------------------------------------ main


async def run_system(
    name: str,
    root: Path,
    zk: str,
    redis: str,
    services: dict[str, int],
    args: argparse.Namespace,
    http: aiohttp.ClientSession,
) -> dict[str, Any]:
    chroot = await asyncio.to_thread(ensure_chroot, zk, f"/throughput-{name}")
    system = System(name, root, chroot, redis, services)
    imports = await asyncio.to_thread(system.check_imports)
    out: dict[str, Any] = {"root": str(root), "imports": imports}
    print(f"\n[{name}] our packages import from {Path(imports['search_server']).parent.parent}")
    client: LoadClient | None = None
    t0 = time.monotonic()
    try:
        print(
            f"\n[{name}] starting {NODES} data servers and 3 search servers from {root}", flush=True
        )
        await system.start()
        up = await system.wait_healthy(http, 300, "start")
        if up is None:
            raise RuntimeError(f"{name}: the search servers never routed to all {NODES}")
        out["startup_s"] = round(time.monotonic() - t0, 1)
        print(
            f"  all {NODES} routed by the 3 search servers after {out['startup_s']} s", flush=True
        )
        targets = [f"http://127.0.0.1:{p}" for p in system.search_ports]
        client = await LoadClient.start(targets, args)
        runner = Runner(system, client, http, args)
        # Let the start-up's indexing and registrations settle, then the idle cost.
        await asyncio.sleep(args.settle + 1)
        out["idle_cores"] = await runner.idle()
        # Warm-up: connections opened gently, then the fan-out's statistics filled.
        records, _ = await runner.load(min(5.0, args.common_rate), 0, args.warmup_total / 2)
        records += (await runner.load(args.common_rate, 0, args.warmup_total / 2))[0]
        out["warmup"] = {
            "queries": len(records),
            "errors": sum(r[3] not in ("ok", "partial") for r in records),
            "partial": sum(r[3] == "partial" for r in records),
        }
        healthy = await system.wait_healthy(http, 60, "warm-up")
        if healthy is None:
            print(f"  warning: {name} not healthy after the warm-up", flush=True)
        print("\n" + HEADER, flush=True)
        common = await runner.step(args.common_rate, common=True)
        first = common
        if args.start_rate != args.common_rate:
            first = await runner.step(args.start_rate)
        good, bad = await runner.search(first)
        out["steps"] = runner.steps
        others = [r["cores"]["others"] for r in runner.steps if "cores" in r]
        out["others_cores_mean"] = round(statistics.fmean(others), 3) if others else None
        out["common"] = _per_query(common.row, out["idle_cores"])
        out["max_good"] = good.row if good else None
        out["first_bad"] = bad.row if bad else None
        out["max_qps_p99_within"] = good.rate if good else None
        out["first_failing_rate"] = bad.rate if bad else None
        out["searched_s"] = round(time.monotonic() - t0, 1)
        return out
    finally:
        if client is not None:
            await client.stop()
        await system.stop()


def _per_query(row: dict[str, Any], idle: dict[str, float]) -> dict[str, Any]:
    """CPU ms per query of each kind at the common rate, gross and net of idle."""
    n = row["queries"]
    seconds = row.get("cpu_window_s", 0.0)
    cores = row.get("cores", {})
    gross = {k: cores[k] * seconds / n * 1000 for k in KINDS} if n and cores else {}
    net = {k: (cores[k] - idle.get(k, 0.0)) * seconds / n * 1000 for k in gross}
    return {
        "rate": row["rate"],
        "queries": n,
        "passed": row["passed"],
        "p50_ms": row["p50_ms"],
        "p99_ms": row["p99_ms"],
        "cpu_ms_per_query": {k: round(v, 3) for k, v in gross.items()},
        "cpu_ms_per_query_net_of_idle": {k: round(v, 3) for k, v in net.items()},
        "cpu_us_per_shard_request_net_of_idle": {
            k: round(net[k] / SHARDS * 1000, 1) for k in ("search", "data") if k in net
        },
    }


async def main_async(
    args: argparse.Namespace, roots: dict[str, Path], info: dict[str, Any]
) -> dict[str, Any]:
    services = {"zookeeper": info["pids"]["zk1"], "redis": info["pids"]["redis"]}
    systems: dict[str, Any] = {}
    main_task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    assert main_task is not None
    loop.add_signal_handler(signal.SIGTERM, main_task.cancel)
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        for name in args.systems:
            systems[name] = await run_system(
                name, roots[name], str(info["zk"]), str(info["redis"]), services, args, http
            )
    return systems


def print_summary(systems: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    print(f"\n=== per system (p99 target {args.p99_ms:g} ms, no errors, no partial answers)")
    print(HEADER)
    for name, s in systems.items():
        for row in sorted(s["steps"], key=lambda r: r["rate"]):
            print(_line(name, row))
    summary: dict[str, Any] = {}
    for name, s in systems.items():
        good, bad = s["max_good"], s["first_bad"]
        summary[name] = {
            "max_qps": s["max_qps_p99_within"],
            "p50_ms": good["p50_ms"] if good else None,
            "p99_ms": good["p99_ms"] if good else None,
            "cores": good.get("cores") if good else None,
            "first_failing_rate": s["first_failing_rate"],
            "first_failing_p99_ms": bad["p99_ms"] if bad else None,
        }
        g = (
            f"{good['rate']:g} q/s (p50 {good['p50_ms']} ms, p99 {good['p99_ms']} ms)"
            if good
            else "none"
        )
        b = (
            f"{bad['rate']:g} q/s (p99 {bad['p99_ms']} ms, {bad['errors']} errors, "
            f"{bad['partial']} partial)"
            if bad
            else f"none up to --max-rate {args.max_rate:g}"
        )
        print(f"{name}: highest passing rate {g}; first failing {b}")
        if good:
            c = good["cores"]
            print(
                "  cores at that rate: "
                + ", ".join(f"{k} {c[k]:.2f}" for k in (*KINDS, "others", "irq"))
            )
        if (s.get("others_cores_mean") or 0) > OTHERS_WARN:
            print(
                f"  warning: other work used {s['others_cores_mean']:.2f} cores on average "
                f"during {name}'s steps: its figures are not those of a quiet machine"
            )
    before, after = summary.get("before", {}), summary.get("after", {})
    ratio = None
    if before.get("max_qps") and after.get("max_qps"):
        ratio = round(after["max_qps"] / before["max_qps"], 2)
    summary["ratio_after_over_before"] = ratio
    print(
        f"\nmax q/s at p99 <= {args.p99_ms:g} ms: before {before.get('max_qps')}, after "
        f"{after.get('max_qps')} ({'x' + str(ratio) if ratio else 'no ratio'})"
    )
    if all(n in systems for n in SYSTEMS):
        print(
            f"\nCPU per query at the common rate {args.common_rate:g} q/s "
            "(ms; net of idle in brackets)"
        )
        print(f"{'kind':<10}{'before':>18}{'after':>18}{'after/before':>14}")
        per_kind: dict[str, Any] = {}
        for kind in KINDS:
            b = systems["before"]["common"]
            a = systems["after"]["common"]
            bg, ag = b["cpu_ms_per_query"].get(kind), a["cpu_ms_per_query"].get(kind)
            bn = b["cpu_ms_per_query_net_of_idle"].get(kind)
            an = a["cpu_ms_per_query_net_of_idle"].get(kind)
            r = round(an / bn, 2) if an is not None and bn else None
            per_kind[kind] = {
                "before": bg,
                "after": ag,
                "before_net": bn,
                "after_net": an,
                "ratio_net": r,
            }
            print(
                f"{kind:<10}{_num(bg):>9} [{_num(bn):>6}]{_num(ag):>9} [{_num(an):>6}]{_num(r):>14}"
            )
        summary["cpu_per_query_at_common_rate"] = per_kind
        for kind in ("search", "data"):
            bu = systems["before"]["common"]["cpu_us_per_shard_request_net_of_idle"].get(kind)
            au = systems["after"]["common"]["cpu_us_per_shard_request_net_of_idle"].get(kind)
            print(f"  {kind}: {bu} -> {au} µs per shard request (net of idle, {SHARDS} per query)")
        for name in SYSTEMS:
            if not systems[name]["common"]["passed"]:
                print(f"  note: {name} did not pass at the common rate {args.common_rate:g} q/s")
    return summary


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--quick", action="store_true", help="fewer and shorter steps, for development")
    add("--output", type=Path, default=RESULTS)
    add("--baseline-rev", default="4e47d66", help="the 'before' system's revision [4e47d66]")
    add(
        "--systems",
        type=lambda text: [s for s in SYSTEMS if s in text.split(",")],
        default=list(SYSTEMS),
        help="which to run [before,after]",
    )
    add("--p99-ms", type=float, default=100.0, help="a step passes with p99 <= this [100]")
    add("--timeout-ms", type=int, default=1000, help="timeout_ms of each query [1000]")
    add("--k", type=int, default=10, help="hits per query [10]")
    add("--arrivals", choices=("poisson", "fixed"), default="poisson")
    add("--start-rate", type=float, default=20.0, help="q/s of the first step [20]")
    add("--common-rate", type=float, default=None, help="CPU per query at [--start-rate]")
    add("--factor", type=float, default=None, help="rate x this while passing [1.5; quick 2]")
    add("--bisect", type=int, default=None, help="bisection steps at most [4; quick 1]")
    add("--resolution", type=float, default=0.05, help="bisect until within this share [0.05]")
    add("--max-rate", type=float, default=2000.0)
    add("--min-rate", type=float, default=2.0)
    add("--warmup", type=float, default=None, help="seconds per step not counted [2; quick 1]")
    add("--seconds", type=float, default=None, help="seconds measured per step [10; quick 4]")
    add("--min-queries", type=int, default=None, help="per measured step [300; quick 0]")
    add(
        "--max-step-seconds",
        type=float,
        default=30.0,
        help="--min-queries lengthens a step up to this [30]",
    )
    add("--idle-seconds", type=float, default=None, help="idle CPU measured [5; quick 2]")
    add("--settle", type=float, default=1.0, help="pause after each step [1]")
    # Internal: the load client.
    add("--loadgen-worker", action="store_true", help=argparse.SUPPRESS)
    add("--targets", help=argparse.SUPPRESS)
    return parser


def main() -> int:
    parser = build_parser()
    args = parser.parse_args()
    if args.loadgen_worker:
        return loadgen_worker(args)
    quick = args.quick
    quick_defaults(
        args,
        quick,
        factor=(1.5, 2.0),
        bisect=(4, 1),
        warmup=(2.0, 1.0),
        seconds=(10.0, 4.0),
        min_queries=(300, 0),
        idle_seconds=(5.0, 2.0),
        common_rate=(args.start_rate, args.start_rate),
    )
    args.warmup_total = 4.0 if quick else 6.0
    if not args.systems:
        parser.error("--systems: before, after or both")
    if args.factor <= 1:
        parser.error("--factor must be above 1")

    # SIGTERM as Ctrl-C: whatever runs stops its processes and removes the worktree.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    started = time.monotonic()
    head = git("rev-parse", "HEAD")
    base = git("rev-parse", args.baseline_rev)
    dirty = git("status", "--porcelain", "--untracked-files=no")
    tmp = Path(tempfile.mkdtemp(prefix="bench-throughput-"))
    tree = tmp / "tree"
    roots = {"before": tree, "after": ROOT}
    print(
        f"demo topology: {NODES} data servers ({FLEET} in a 2-process fleet + {SOLO} "
        f"single), {SHARDS} shards x 2, {SEARCH_SERVERS} search servers; ZooKeeper: 1 node; "
        f"before = {base[:7]}, after = working tree (HEAD {head[:7]}"
        f"{', with uncommitted changes' if dirty else ''}); open loop, {args.arrivals} "
        f"arrivals, timeout_ms {args.timeout_ms}, k {args.k}",
        flush=True,
    )
    systems: dict[str, Any] = {}
    try:
        if "before" in args.systems:
            git("worktree", "add", "--detach", str(tree), base)
        with DevCluster(zk_nodes=1, tick_time_ms=500) as cluster:
            systems = asyncio.run(main_async(args, roots, cluster.info()))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted: processes stopped, worktree removed; no results written")
        return 130
    finally:
        if tree.exists():
            with contextlib.suppress(subprocess.CalledProcessError):
                git("worktree", "remove", "--force", str(tree))
        shutil.rmtree(tmp, ignore_errors=True)
        with contextlib.suppress(subprocess.CalledProcessError):
            git("worktree", "prune")
    summary = print_summary(systems, args)
    parameters = {
        k: (str(v) if isinstance(v, Path) else v)
        for k, v in vars(args).items()
        if k not in ("loadgen_worker", "targets")
    }
    write_results(
        args.output,
        "throughput",
        parameters,
        setup={
            "data_servers": NODES,
            "shards": SHARDS,
            "replicas_per_shard": 2,
            "fleet": f"{FLEET} data servers in one `data-server fleet --procs 2`",
            "single_processes": SOLO,
            "docs_per_data_server": int(DOCS),
            "search_servers": SEARCH_SERVERS,
            "search_server_flags": "the demo's; the after system's --picker, "
            "--hedge-percent and --event-loop at their defaults",
            "zookeeper_nodes": 1,
            "zookeeper_note": "one node instead of the demo's three: queries never touch it",
            "before": {"rev": args.baseline_rev, "commit": base},
            "after": {"commit": head, "uncommitted_changes": dirty.splitlines()},
            "load": f"open loop, {args.arrivals} arrivals, one client process (uvloop + "
            "aiohttp, keep-alive), round-robin over the search servers; latency from the "
            "scheduled send time",
            "pass": f"p99 <= {args.p99_ms:g} ms, no error, no partial answer",
            "cpu": "utime + stime from /proc/<pid>/stat over each step's measured window; "
            "others = the machine's user + system time (/proc/stat) not ours",
        },
        systems=systems,
        summary=summary,
        wall_s=round(time.monotonic() - started, 1),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
