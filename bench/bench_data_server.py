"""A data server's own CPU per search request: this tree against an earlier commit.

The fan-out's cost is half of a sub-request; the data server answering it is the other
half, and on a machine of many data servers it is what their CPU goes to. This starts
one ``data-server`` process of each version on the same local ZooKeeper and Redis
(``DevCluster``), ``--docs`` documents each, waits until each is registered, and sends
each the same ``--requests`` searches (``GET /search?q=&k=10``, the search server's
request) over ``--connections`` keep-alive connections from a client process of the
bench, one version after the other. It reads each server's CPU time from
``/proc/<pid>/stat`` around the run, so the figure is the server's CPU per request,
the client's excluded.

The baseline is ``--baseline-rev`` (default ``4e47d66``, before issue 14's data-plane
work: aiohttp's ``json_response`` on asyncio's loop), checked out with ``git worktree``
into a temporary directory and run from there with the same Python; the worktree is
removed at the end.

    .venv/bin/python bench/bench_data_server.py [--quick] [--requests 20000]
        [--connections 8] [--docs 1000] [--rounds 3] [--baseline-rev 4e47d66]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from common import free_port_block, process_cpu_seconds, write_results

from data_server.corpus import sample_queries
from discovery.testing import DevCluster
from discovery.testing.process import terminate_all

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "data_server.json"


def _cpu_seconds(pid: int) -> float:
    seconds = process_cpu_seconds(pid)
    assert seconds is not None, f"process {pid} is gone"
    return seconds


async def _start(
    tree: Path, zk: str, redis: str, port: int, instance_id: str, docs: int
) -> asyncio.subprocess.Process:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "data_server.cli", "--zk", zk, "--redis", redis, "--log-level", "WARNING"),
        *("--id", instance_id, "--port", str(port), "--shard", "0", "--docs", str(docs)),
        stdin=asyncio.subprocess.DEVNULL,
        cwd=tree,
        env=env,
    )


async def _wait_ready(http: aiohttp.ClientSession, url: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            async with http.get(f"{url}/readyz") as response:
                if response.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.2)  # ok-sleep: polling a process's readiness
    raise RuntimeError(f"{url} never became ready")


async def _drive(url: str, queries: list[str], requests: int, connections: int) -> float:
    """Send ``requests`` searches over ``connections`` keep-alive connections; wall s."""
    connector = aiohttp.TCPConnector(limit=connections)
    async with aiohttp.ClientSession(connector=connector) as http:
        counter = iter(range(requests))

        async def worker() -> None:
            for i in counter:
                params = {"q": queries[i % len(queries)], "k": "10"}
                async with http.get(f"{url}/search", params=params) as response:
                    assert response.status == 200, response.status
                    await response.read()

        started = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(connections)))
        return time.monotonic() - started


async def measure(args: argparse.Namespace, zk: str, redis: str, baseline: Path) -> dict[str, Any]:
    queries = sample_queries(500, variant=3)
    base_port = free_port_block(2, set())
    trees = {"baseline": baseline, "ours": ROOT}
    procs: dict[str, asyncio.subprocess.Process] = {}
    results: dict[str, Any] = {name: [] for name in trees}
    try:
        async with aiohttp.ClientSession() as http:
            for j, (name, tree) in enumerate(trees.items()):
                procs[name] = await _start(
                    tree, zk, redis, base_port + j, f"ds-bench-{name}", args.docs
                )
            for j in range(len(trees)):
                await _wait_ready(http, f"http://127.0.0.1:{base_port + j}")
        # Warm both, then alternate rounds so that drifts of the machine hit both alike.
        for j in range(len(trees)):
            await _drive(f"http://127.0.0.1:{base_port + j}", queries, 500, args.connections)
        for round_ in range(args.rounds):
            for j, name in enumerate(trees):
                pid = procs[name].pid
                cpu0 = _cpu_seconds(pid)
                wall = await _drive(
                    f"http://127.0.0.1:{base_port + j}", queries, args.requests, args.connections
                )
                cpu = _cpu_seconds(pid) - cpu0
                row = {
                    "round": round_ + 1,
                    "requests": args.requests,
                    "cpu_s": round(cpu, 3),
                    "cpu_us_per_request": round(cpu / args.requests * 1e6, 1),
                    "wall_s": round(wall, 2),
                    "requests_per_s": round(args.requests / wall, 1),
                }
                results[name].append(row)
                print(
                    f"{name:9} round {round_ + 1}: {row['cpu_us_per_request']:7.1f} µs CPU per "
                    f"request, {row['requests_per_s']:8.1f} requests/s",
                    flush=True,
                )
    finally:
        await terminate_all(list(procs.values()))
    summary: dict[str, Any] = {}
    for name, rows in results.items():
        per = sorted(r["cpu_us_per_request"] for r in rows)
        summary[name] = {"cpu_us_per_request_median": per[len(per) // 2]}
    ours = summary["ours"]["cpu_us_per_request_median"]
    base = summary["baseline"]["cpu_us_per_request_median"]
    summary["ratio_ours_over_baseline"] = round(ours / base, 2) if base else None
    print(
        f"\ndata server CPU per search request (median of {args.rounds} rounds): "
        f"ours {ours} µs, baseline ({args.baseline_rev}) {base} µs: "
        f"{summary['ratio_ours_over_baseline']}x",
        flush=True,
    )
    return {"rounds": results, "summary": summary}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2,000 requests, 1 round")
    parser.add_argument("--requests", type=int, default=None, help="per round [20000]")
    parser.add_argument("--connections", type=int, default=8, help="keep-alive connections")
    parser.add_argument("--docs", type=int, default=1000, help="documents per data server")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per version [3]")
    parser.add_argument("--baseline-rev", default="4e47d66", help="the commit to compare with")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    args.requests = args.requests or (2000 if args.quick else 20000)
    args.rounds = args.rounds or (1 if args.quick else 3)
    workdir = Path(tempfile.mkdtemp(prefix="bench-data-server-"))
    baseline = workdir / "baseline"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(baseline), args.baseline_rev],
        check=True,
        capture_output=True,
    )
    try:
        with DevCluster(workdir / "cluster") as cluster:
            info = cluster.info()
            result = asyncio.run(measure(args, info["zk"], info["redis"], baseline))
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(baseline)],
            check=False,
            capture_output=True,
        )
        shutil.rmtree(workdir, ignore_errors=True)
    write_results(
        args.output,
        "data_server",
        {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        setup={
            "baseline": f"data-server of commit {args.baseline_rev}, same Python, same flags",
            "client": "aiohttp, keep-alive, in the bench process",
        },
        **result,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
