"""Overload without cascade (issue 40): goodput from half to three times the knee, with
an HTTP load generator outside the project, and the same on a machine short of CPU.

Starts a real local ZooKeeper and Redis (``DevCluster``) and the demo's topology (3
search servers, 100 data servers, 50 shards x 2 replicas, as ``bench_throughput.py``
starts it: a 2-process fleet and 7 data servers of their own), then drives it with
Debian's ``hey`` (``apt-get install hey``; installed here when missing and run as root):
up to 16 ``hey`` processes per search server started in even phases of a worker's
interval (one ``hey``'s workers send in lockstep, see ``Hey``), each worker sending at
most ``q`` queries a second (``-q``) with keep-alive, so that the offered load is
``workers x q`` whatever the answers do, as long as an answer takes less than a
worker's interval (``q`` is kept at 2 or less, and every answer, refused or not, comes
within the 500 ms deadline): an open loop, arrivals spread evenly. Each query is
``GET /search?q=..&k=10&timeout_ms=500``, one of three queries per search server.

Per level of offered load (``--seconds`` each) it reports, from ``hey``'s per-request
CSV: answers by status and the p50 / p99 of the admitted ones (200); from the search
servers' metrics: complete and partial answers a second (**goodput** is complete
answers a second), queries refused with 503, ejections, hedges, timeouts not blamed,
panic decisions; from the 100 data servers' metrics: 429s and servers their agents took
offline; and the cores each role used on average (search servers, data servers,
ZooKeeper and Redis, ``hey``): on one machine the load generator and the refusals take
their CPU from the cluster.

Sequence, per system:

1. warm-up at a low rate; then the **knee**: offered load from ``--start-rate`` up by
   ``--factor`` until goodput falls below 90 % of what was offered (or a step gets a
   partial answer); the knee is the highest goodput seen.
2. the **sweep**: 0.5, 1, 1.5, 2 and 3 times the knee (of the first system measured, so
   that both systems see the same loads). The figure: goodput at 3x as a share of the
   peak goodput of the sweep; p99 of admitted answers against the deadline; ejections
   and forced offline, which must be 0.
3. **a machine short of CPU**: ``--hog-load`` (0.8) times the knee's load for
   ``--hog-seconds`` x 3: the middle third with two ``yes > /dev/null`` beside the
   cluster. Reported: goodput and partial share before, during and after, and how long
   after the hogs stop until no query comes back partial for the rest of the run (every
   0.5 s, from the search servers' counters). Not at the knee itself: there the cluster
   is at its capacity (the knee is the most it answered, with up to a tenth refused),
   answers the odd query partial before the hogs start (r7: 0.14 %), and "no partial
   answer after" measured that floor rather than the recovery.

Systems: ``after`` (this working tree) and ``before`` (``--baseline-rev``, default
``19d0721``: the commit issue 40 was measured on), each in turn with its own ZooKeeper
chroot and Redis prefix (the baseline checked out with ``git worktree``), the same
offered loads. Prints tables, writes ``bench/results/overload.json`` and a PNG of the
goodput curves (``bench/results/overload.png``).

    .venv/bin/python bench/bench_overload.py [--systems after,before] [--seconds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import io
import math
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
from bench_throughput import SESSION_TIMEOUT, System, ensure_chroot, git
from common import descendants, process_cpu_seconds, process_tree, write_results
from prometheus_client.parser import text_string_to_metric_families

from data_server.corpus import sample_queries
from discovery.testing import DevCluster

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
TIMEOUT_MS = 500
MULTIPLES = (0.5, 1.0, 1.5, 2.0, 3.0)
# Most queries a second one hey worker sends: an answer (at most the deadline) must come
# within its interval, or the worker falls behind and the loop closes.
PER_WORKER = 2.0
#: At most this many hey processes per search server, started in even phases (see Hey).
PHASES = 16

SEARCH_COUNTERS = {
    "complete": ("search_server_fanout_queries_total", {"outcome": "complete"}),
    "partial": ("search_server_fanout_queries_total", {"outcome": "partial"}),
    "refused": ("search_server_fanout_queries_total", {"outcome": "overloaded"}),
    "ejections": ("search_server_fanout_ejections_total", {}),
    "hedges": ("search_server_fanout_hedges_total", {"result": "sent"}),
    "unblamed": ("search_server_fanout_unblamed_timeouts_total", {}),
    "panic": ("search_server_fanout_panic_total", {}),
    "timeouts": ("search_server_fanout_shard_requests_total", {"result": "timeout"}),
    "overload_answers": ("search_server_fanout_shard_requests_total", {"result": "overload"}),
    # Gauges (summed over the search servers), for the timeline.
    "limit": ("search_server_admission_limit", {}),
    "in_flight": ("search_server_fanout_in_flight", {}),
}
#: What a step's timeline records every 0.5 s.
TIMELINE = ("complete", "refused", "partial", "limit", "in_flight")
DATA_COUNTERS = {
    "forced_offline": ("discovery_agent_forced_offline_total", {}),
    "429": ("data_server_search_requests_total", {"status": "429"}),
    "busy_probes": ("discovery_agent_probes_total", {"result": "busy"}),
}


def sum_counters(text: str, wanted: dict[str, tuple[str, dict[str, str]]]) -> dict[str, float]:
    """The sums of the ``wanted`` samples (name, labels they must have) in ``text``."""
    out = dict.fromkeys(wanted, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            for key, (name, labels) in wanted.items():
                if sample.name == name and all(
                    sample.labels.get(k) == v for k, v in labels.items()
                ):
                    out[key] += sample.value
    return out


async def scrape(
    http: aiohttp.ClientSession, ports: list[int], wanted: dict[str, tuple[str, dict[str, str]]]
) -> dict[str, float]:
    async def one(port: int) -> dict[str, float]:
        try:
            async with http.get(f"http://127.0.0.1:{port}/metrics") as response:
                return sum_counters(await response.text(), wanted)
        except (aiohttp.ClientError, TimeoutError):
            return dict.fromkeys(wanted, 0.0)

    totals = dict.fromkeys(wanted, 0.0)
    for part in await asyncio.gather(*(one(p) for p in ports)):
        for key, value in part.items():
            totals[key] += value
    return totals


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before.get(k, 0.0) for k in after}


def nearest_rank(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


class Hey:
    """``hey`` processes at ``rate`` queries a second in all, in even phases.

    One ``hey``'s workers all start their ``-q`` tickers at once, so they send in
    lockstep: ten workers at 2 q/s each are a burst of ten every 500 ms (measured:
    within 2 ms), not 20 queries a second spread over it. A burst that size is not the
    open loop this benchmark means, and an in-flight limit admits at most its limit of
    each burst whatever the cluster could do between them (goodput came out as twice
    the summed limits at 3x). So each search server gets up to ``PHASES`` ``hey``
    processes, the workers shared among them, the n-th started n / (its number of
    processes) of a worker's interval after the first, each search server's set offset
    a little from the others': arrivals in small groups, evenly spread.
    """

    def __init__(self, ports: list[int], rate: float, seconds: float) -> None:
        per_server = rate / len(ports)
        workers = max(1, math.ceil(per_server / PER_WORKER))
        per_worker = per_server / workers
        self.offered = workers * per_worker * len(ports)
        queries = sample_queries(len(ports), variant=40)
        phases = min(workers, PHASES)
        interval = 1 / per_worker
        self.procs: list[subprocess.Popen[str]] = []
        for i, port in enumerate(ports):
            url = (
                f"http://127.0.0.1:{port}/search?q={quote(queries[i])}&k=10&timeout_ms={TIMEOUT_MS}"
            )
            for phase in range(phases):
                count = workers // phases + (phase < workers % phases)
                # sh sleeps, then becomes hey (exec: the same pid, so kill() reaches it).
                delay = (phase + i / len(ports)) * interval / phases
                self.procs.append(
                    subprocess.Popen(
                        [
                            "sh", "-c", 'sleep "$0"; exec "$@"', f"{delay:.4f}",
                            "hey", "-z", f"{seconds}s", "-c", str(count),
                            "-q", f"{per_worker:.4f}", "-t", "5", "-o", "csv", url,
                        ],
                        stdout=subprocess.PIPE,
                        stderr=subprocess.DEVNULL,
                        text=True,
                    )
                )  # fmt: skip

    def results(self) -> tuple[dict[str, int], list[float]]:
        """Answers by status code, and the latencies (seconds) of the 200s."""
        statuses: dict[str, int] = {}
        admitted: list[float] = []
        for proc in self.procs:
            out, _ = proc.communicate()
            for row in csv.DictReader(io.StringIO(out)):
                code = row.get("status-code") or "error"
                statuses[code] = statuses.get(code, 0) + 1
                if code == "200":
                    admitted.append(float(row["response-time"]))
        return statuses, admitted

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


class Bench:
    def __init__(self, system: System, http: aiohttp.ClientSession, seconds: float) -> None:
        self.system = system
        self.http = http
        self.seconds = seconds
        self.data_ports: list[int] = []

    async def find_data_ports(self) -> None:
        views = await self.system.views(self.http)
        view = next(v for v in views if v is not None)
        self.data_ports = sorted({s["port"] for s in view["servers"]})

    async def counters(self) -> tuple[dict[str, float], dict[str, float]]:
        search, data = await asyncio.gather(
            scrape(self.http, self.system.search_ports, SEARCH_COUNTERS),
            scrape(self.http, self.data_ports, DATA_COUNTERS),
        )
        return search, data

    def cpu(self) -> dict[str, float]:
        """CPU seconds used so far: by the search servers, by the data servers (with
        the fleets' workers, their children), by ZooKeeper and Redis, and by the
        ``hey`` processes that have ended (children waited for: ``RUSAGE_CHILDREN``;
        the cluster's own processes are children not yet waited for, so they are not
        in it)."""
        system, tree = self.system, process_tree()

        def used(roots: list[int]) -> float:
            pids = (pid for root in roots for pid in descendants(root, tree))
            return sum(process_cpu_seconds(pid) or 0.0 for pid in pids)

        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        return {
            "search": used([p.pid for p in system.search]),
            "data": used([p.pid for p in system.data]),
            "services": used(list(system.services.values())),
            "hey": children.ru_utime + children.ru_stime,
        }

    async def level(self, rate: float, label: str = "") -> dict[str, Any]:
        s0, d0 = await self.counters()
        c0 = await asyncio.to_thread(self.cpu)  # a scan of /proc, off the loop
        hey = Hey(self.system.search_ports, rate, self.seconds)
        started = time.monotonic()
        try:
            # The limits and what is in flight every 0.5 s, to see how the limit moves
            # within a step (a step's goodput is its mean).
            async with self.sampling(started, TIMELINE) as samples:
                statuses, admitted = await asyncio.to_thread(hey.results)
        finally:
            hey.kill()
        elapsed = time.monotonic() - started
        c1 = await asyncio.to_thread(self.cpu)
        s1, d1 = await self.counters()
        search, data = delta(s1, s0), delta(d1, d0)
        answered = sum(statuses.values())
        row = {
            "label": label,
            "offered_qps": round(hey.offered, 1),
            "sent_qps": round(answered / elapsed, 1),
            "goodput_qps": round(search["complete"] / elapsed, 1),
            "partial_qps": round(search["partial"] / elapsed, 1),
            "refused_qps": round(search["refused"] / elapsed, 1),
            "statuses": statuses,
            "admitted_p50_ms": _ms(nearest_rank(admitted, 0.5)),
            "admitted_p99_ms": _ms(nearest_rank(admitted, 0.99)),
            "search": {k: round(v) for k, v in search.items()},
            "data": {k: round(v) for k, v in data.items()},
            "seconds": round(elapsed, 1),
            # Cores used on average over the step, by role (the machine has 2): what
            # the load generator and the refusals take from the cluster.
            "cores": {k: round((c1[k] - c0[k]) / elapsed, 2) for k in c0},
            "timeline": samples,
        }
        print(_line(row), flush=True)
        return row

    @contextlib.asynccontextmanager
    async def sampling(
        self, started: float, keys: tuple[str, ...]
    ) -> AsyncIterator[list[dict[str, float]]]:
        """The search servers' ``keys`` counters every 0.5 s while inside, each sample
        with its time ``t`` from ``started``."""
        samples: list[dict[str, float]] = []

        async def sample() -> None:
            while True:
                counters = await scrape(self.http, self.system.search_ports, SEARCH_COUNTERS)
                t = round(time.monotonic() - started, 2)
                samples.append({"t": t, **{k: counters[k] for k in keys}})
                await asyncio.sleep(0.5)

        task = asyncio.create_task(sample())
        try:
            yield samples
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def timeline(
        self, rate: float, hog_seconds: float
    ) -> tuple[list[dict[str, float]], dict[str, Any]]:
        """``rate`` for 3 x ``hog_seconds``, two CPU hogs in the middle third; the search
        servers' counters every 0.5 s."""
        total = 3 * hog_seconds
        s0, d0 = await self.counters()
        hey = Hey(self.system.search_ports, rate, total)
        started = time.monotonic()
        hogs: list[subprocess.Popen[bytes]] = []
        try:
            async with self.sampling(started, tuple(SEARCH_COUNTERS)) as samples:
                await asyncio.sleep(hog_seconds)
                hogs_from = time.monotonic() - started
                hogs = start_hogs(2)
                await asyncio.sleep(hog_seconds)
                stop_hogs(hogs)
                hogs_until = time.monotonic() - started
                statuses, admitted = await asyncio.to_thread(hey.results)
        finally:
            stop_hogs(hogs)
            hey.kill()
        s1, d1 = await self.counters()
        summary = {
            "offered_qps": round(hey.offered, 1),
            "hogs_from_s": round(hogs_from, 1),
            "hogs_until_s": round(hogs_until, 1),
            "statuses": statuses,
            "admitted_p99_ms": _ms(nearest_rank(admitted, 0.99)),
            "search": {k: round(v) for k, v in delta(s1, s0).items()},
            "data": {k: round(v) for k, v in delta(d1, d0).items()},
        }
        return samples, summary


def start_hogs(count: int) -> list[subprocess.Popen[bytes]]:
    """``count`` processes that keep a CPU busy (``yes > /dev/null``); started at once,
    killed by the caller."""
    return [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(count)]


def stop_hogs(hogs: list[subprocess.Popen[bytes]]) -> None:
    """Kill and reap what :func:`start_hogs` started (again: a no-op)."""
    for hog in hogs:
        if hog.poll() is None:
            hog.kill()
        hog.wait()


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


HEADER = (
    f"{'':10} {'offered':>8} {'goodput':>8} {'partial':>8} {'503/s':>7} {'p50 ms':>7} "
    f"{'p99 ms':>7} {'eject':>6} {'offline':>7} {'429':>6} {'unblamed':>8} {'panic':>6} "
    f"{'cores search/data/hey':>21}"
)


def _line(row: dict[str, Any]) -> str:
    cores = row["cores"]
    return (
        f"{row['label']:10} {row['offered_qps']:8.1f} {row['goodput_qps']:8.1f} "
        f"{row['partial_qps']:8.1f} {row['refused_qps']:7.1f} "
        f"{_num(row['admitted_p50_ms']):>7} {_num(row['admitted_p99_ms']):>7} "
        f"{row['search']['ejections']:6d} {row['data']['forced_offline']:7d} "
        f"{row['data']['429']:6d} {row['search']['unblamed']:8d} {row['search']['panic']:6d} "
        f"{cores['search']:>9.2f}/{cores['data']:.2f}/{cores['hey']:.2f}"
    )


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


#: Seconds without a partial answer that count as recovered (``partial_free_after_s``).
QUIET_S = 10.0


def phases(samples: list[dict[str, float]], summary: dict[str, Any]) -> dict[str, Any]:
    """Goodput and partial share before, during and after the hogs, and two measures of
    the recovery from their end: until the first ``QUIET_S`` seconds with no partial
    answer begin (``partial_free_after_s``), and until no query came back partial for
    the rest of the run (``partial_free_rest_s``). They differ when the load alone
    gets the odd partial answer (a stall at a load near the run's capacity, seen before
    the hogs too: ``before.partial_share``), which the second counts as not recovered."""
    start, end = summary["hogs_from_s"], summary["hogs_until_s"]
    out: dict[str, Any] = {}
    for name, lo, hi in (("before", 0, start), ("hogs", start, end), ("after", end, math.inf)):
        inside = [s for s in samples if lo <= s["t"] <= hi]
        if len(inside) < 2:
            continue
        first, last = inside[0], inside[-1]
        span = last["t"] - first["t"]
        complete = last["complete"] - first["complete"]
        partial = last["partial"] - first["partial"]
        refused = last["refused"] - first["refused"]
        answered = complete + partial
        out[name] = {
            "goodput_qps": round(complete / span, 1),
            "partial_share": round(partial / answered, 4) if answered else None,
            "refused_qps": round(refused / span, 1),
        }
    after = [s for s in samples if s["t"] >= end]
    quiet = rest = None
    for i, sample in enumerate(after):
        later = after[i:]
        if later[-1]["t"] < sample["t"] + QUIET_S:
            break  # too little of the run left to tell
        window = [b for b in later if b["t"] <= sample["t"] + QUIET_S]
        if quiet is None and all(b["partial"] == sample["partial"] for b in window):
            quiet = round(sample["t"] - end, 1)
        if all(b["partial"] == sample["partial"] for b in later):
            rest = round(sample["t"] - end, 1)
            break
    out["partial_free_after_s"] = quiet
    out["partial_free_rest_s"] = rest
    if "before" in out and "hogs" in out:
        lost = 1 - out["hogs"]["goodput_qps"] / max(out["before"]["goodput_qps"], 1e-9)
        out["capacity_lost_share"] = round(lost, 3)
    return out


async def run_system(
    name: str,
    root: Path,
    info: dict[str, Any],
    args: argparse.Namespace,
    knee: float | None,
) -> dict[str, Any]:
    zk, redis = str(info["zk"]), str(info["redis"])
    services = {"zookeeper": info["pids"]["zk1"], "redis": info["pids"]["redis"]}
    chroot = await asyncio.to_thread(ensure_chroot, zk, f"/overload-{name}")
    system = System(name, root, chroot, redis, services)
    out: dict[str, Any] = {"root": str(root), "imports": system.check_imports()}
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        try:
            print(f"\n[{name}] starting the demo topology from {root}", flush=True)
            await system.start()
            if await system.wait_healthy(http, 300, "start") is None:
                raise RuntimeError(f"{name}: the search servers never routed to every server")
            bench = Bench(system, http, args.seconds)
            await bench.find_data_ports()
            await asyncio.sleep(args.settle)
            bench.seconds = args.warmup
            out["warmup"] = await bench.level(args.start_rate / 2, "warm-up")
            bench.seconds = args.seconds
            print(HEADER, flush=True)
            if knee is None:
                steps = []
                rate = args.start_rate
                while True:
                    row = await bench.level(rate, "knee")
                    steps.append(row)
                    # Not at the first 503: a limit refuses the odd burst below
                    # capacity, and a knee found there made "3x" twice the capacity
                    # at most, with the hogs' phase run well below it.
                    saturated = (
                        row["goodput_qps"] < 0.9 * row["offered_qps"] or row["partial_qps"] > 0
                    )
                    if saturated or rate > args.max_rate:
                        break
                    rate *= args.factor
                    await system.wait_healthy(http, 60, "between steps")
                knee = max(r["goodput_qps"] for r in steps)
                out["knee_steps"] = steps
                print(f"  knee: {knee} complete answers a second", flush=True)
            out["knee_qps"] = knee
            sweep = []
            for multiple in MULTIPLES:
                await system.wait_healthy(http, 60, "between steps")
                row = await bench.level(multiple * knee, f"{multiple:g}x")
                row["multiple"] = multiple
                sweep.append(row)
            out["sweep"] = sweep
            peak = max(r["goodput_qps"] for r in sweep)
            at3 = sweep[-1]["goodput_qps"]
            out["peak_goodput_qps"] = peak
            out["goodput_at_3x_share_of_peak"] = round(at3 / peak, 3) if peak else None
            out["load_ejections"] = sum(r["search"]["ejections"] for r in sweep)
            out["load_forced_offline"] = sum(r["data"]["forced_offline"] for r in sweep)
            if args.hog_seconds > 0:
                await system.wait_healthy(http, 60, "before the hogs")
                rate = round(args.hog_load * knee, 1)
                print(
                    f"  {rate:g} q/s ({args.hog_load:g} x the knee) for "
                    f"{3 * args.hog_seconds:g} s, two CPU hogs in the middle third",
                    flush=True,
                )
                samples, summary = await bench.timeline(rate, args.hog_seconds)
                summary["load_share_of_knee"] = args.hog_load
                summary["phases"] = phases(samples, summary)
                out["hogs"] = summary
                out["hogs_timeline"] = samples
                print(f"  {summary['phases']}", flush=True)
                print(
                    f"  ejections {summary['search']['ejections']}, forced offline "
                    f"{summary['data']['forced_offline']}, busy probes "
                    f"{summary['data']['busy_probes']}",
                    flush=True,
                )
            return out
        finally:
            await system.stop()


def plot(systems: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    styles = {"after": "-", "before": "--"}
    for name, s in systems.items():
        rows = s.get("sweep", [])
        offered = [r["offered_qps"] for r in rows]
        style = styles.get(name, ":")
        ax.plot(offered, [r["goodput_qps"] for r in rows], "o" + style, label=f"{name}: complete")
        ax.plot(offered, [r["partial_qps"] for r in rows], "x" + style, label=f"{name}: partial")
        ax.plot(offered, [r["refused_qps"] for r in rows], "s" + style, label=f"{name}: 503")
    ax.set_xlabel("offered load (queries/s, open loop, hey)")
    ax.set_ylabel("answers/s")
    ax.set_title("Goodput past the knee (demo topology, 2 cores, deadline 500 ms)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"wrote {path}", flush=True)


def ensure_hey() -> None:
    if shutil.which("hey"):
        return
    if os.geteuid() != 0:
        sys.exit("hey is missing: apt-get install hey")
    subprocess.run(["apt-get", "update", "-qq"], check=True)
    subprocess.run(["apt-get", "install", "-y", "-qq", "hey"], check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--systems", default="after,before")
    parser.add_argument("--baseline-rev", default="19d0721")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--settle", type=float, default=10.0)
    parser.add_argument("--start-rate", type=float, default=20.0)
    parser.add_argument("--factor", type=float, default=1.3)
    parser.add_argument("--max-rate", type=float, default=2000.0)
    parser.add_argument("--knee", type=float, help="skip the search: this many q/s")
    parser.add_argument("--hog-seconds", type=float, default=20.0)
    parser.add_argument(
        "--hog-load", type=float, default=0.8, help="the hogs' phase's load, a share of the knee"
    )
    parser.add_argument("--label", default="", help="suffix of the result files")
    args = parser.parse_args()
    systems_wanted = [s for s in args.systems.split(",") if s]
    ensure_hey()
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    head = git("rev-parse", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no")
    tmp = Path(tempfile.mkdtemp(prefix="bench-overload-"))
    tree = tmp / "tree"
    roots = {"after": ROOT, "before": tree}
    systems: dict[str, Any] = {}
    started = time.monotonic()
    try:
        if "before" in systems_wanted:
            git("worktree", "add", "--detach", str(tree), args.baseline_rev)
        with DevCluster(zk_nodes=1, tick_time_ms=500) as cluster:
            knee = args.knee
            for name in systems_wanted:
                systems[name] = asyncio.run(
                    run_system(name, roots[name], cluster.info(), args, knee)
                )
                knee = systems[name]["knee_qps"]
    except KeyboardInterrupt:
        print("interrupted: processes stopped; no results written")
        return 130
    finally:
        if tree.exists():
            with contextlib.suppress(subprocess.CalledProcessError):
                git("worktree", "remove", "--force", str(tree))
        shutil.rmtree(tmp, ignore_errors=True)
        with contextlib.suppress(subprocess.CalledProcessError):
            git("worktree", "prune")
    print("\n=== summary")
    for name, s in systems.items():
        hogs = s.get("hogs", {}).get("phases", {})
        print(
            f"{name}: knee {s['knee_qps']} q/s; goodput at 3x = "
            f"{s['goodput_at_3x_share_of_peak']} of the peak ({s['peak_goodput_qps']}); "
            f"p99 admitted at 3x {s['sweep'][-1]['admitted_p99_ms']} ms; ejections "
            f"{s['load_ejections']}, forced offline {s['load_forced_offline']}; hogs: "
            f"capacity lost {hogs.get('capacity_lost_share')}, partial share before "
            f"{hogs.get('before', {}).get('partial_share')}, with the hogs "
            f"{hogs.get('hogs', {}).get('partial_share')}, partial-free "
            f"{hogs.get('partial_free_after_s')} s after ({QUIET_S:g} s with none; none "
            f"for the rest of the run: {hogs.get('partial_free_rest_s')} s)",
            flush=True,
        )
    suffix = f"-{args.label}" if args.label else ""
    write_results(
        RESULTS / f"overload{suffix}.json",
        "overload",
        vars(args),
        setup={
            "topology": "the demo's: 3 search servers, 100 data servers (50 shards x 2), "
            "ZooKeeper of one node, Redis",
            "session_timeout_s": SESSION_TIMEOUT,
            "load": f"hey (Debian), <= {PHASES} per search server in even phases, "
            f"<= {PER_WORKER} q/s per worker, "
            f"keep-alive; timeout_ms {TIMEOUT_MS}",
            "after": {"commit": head, "uncommitted_changes": dirty.splitlines()},
            "before": {"rev": args.baseline_rev},
        },
        systems=systems,
        wall_s=round(time.monotonic() - started, 1),
    )
    if systems:
        plot(systems, RESULTS / f"overload{suffix}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
